//! The isolation report: what was enforced for a run, recorded in
//! exit.json and shown by check_agent_run and result.md.

use serde::{Deserialize, Serialize};

/// One mechanism's state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Enforcement {
    /// Whether it holds for the run.
    pub enforced: bool,
    /// What exactly, or why not.
    pub detail: String,
}

impl Enforcement {
    /// Enforced, with details.
    pub fn on(detail: impl Into<String>) -> Enforcement {
        Enforcement {
            enforced: true,
            detail: detail.into(),
        }
    }
    /// Not enforced, with the reason.
    pub fn off(detail: impl Into<String>) -> Enforcement {
        Enforcement {
            enforced: false,
            detail: detail.into(),
        }
    }
}

/// What was enforced for one run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IsolationReport {
    /// Landlock: ABI, enforcement, network rules, scopes.
    pub landlock: Enforcement,
    /// seccomp: rule count and socket families.
    pub seccomp: Enforcement,
    /// Network isolation and by what.
    pub network: Enforcement,
    /// cgroup limits and where they come from.
    pub cgroup: Enforcement,
    /// Capability sets.
    pub capabilities: Enforcement,
    /// no_new_privs was set.
    pub no_new_privs: bool,
    /// The user the agent runs as.
    #[serde(default)]
    pub user: String,
    /// rlimits set (resource=value).
    pub rlimits: Vec<String>,
    /// The run's namespaces.
    #[serde(default)]
    pub namespaces: Enforcement,
    /// The run's own root file system.
    #[serde(default)]
    pub root: Enforcement,
    /// The bound on what the run may write to its own dirs.
    #[serde(default)]
    pub disk: Enforcement,
    /// Anything else worth knowing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}
