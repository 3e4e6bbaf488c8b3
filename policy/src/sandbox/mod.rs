//! The sandbox spec of a run: plain data computed from the request, the
//! run's directories and what the host offers. `subagent-runner` applies it
//! in a fixed order (rlimits → cgroup → namespaces → capabilities →
//! no_new_privs → Landlock → seccomp → exec); nothing here touches the
//! system.
//!
//! - [`fs`]: which paths the child may read, execute and write (Landlock).
//! - [`seccomp`]: the syscalls an agent never needs, each with its reason.
//! - [`cgroup`]: where memory and process limits come from on this host.

pub mod cgroup;
pub mod fs;
pub mod seccomp;

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The `sandbox` param of spawn_agent: switches that can only narrow or
/// add explicit roots.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxRequest {
    /// Let the child write its project_dir (default false: read only).
    #[serde(default)]
    pub write_project: bool,
    /// Let the child use the network (default false).
    #[serde(default)]
    pub network: bool,
    /// Extra read-only roots (absolute, existing).
    #[serde(default)]
    pub read_paths: Vec<PathBuf>,
    /// Extra writable roots (absolute, existing).
    #[serde(default)]
    pub write_paths: Vec<PathBuf>,
}

/// A mechanism the sandbox is built from; `require` lists those that must
/// hold for a run to start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mechanism {
    /// Landlock file-system (and, where asked, network and scope) rules.
    Landlock,
    /// The seccomp deny-list.
    Seccomp,
    /// Every capability set emptied.
    CapabilityDrop,
    /// No socket of any IP family (for runs without network).
    NetworkIsolation,
    /// Memory and process limits through a cgroup.
    Cgroup,
}

impl Mechanism {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Mechanism::Landlock => "landlock",
            Mechanism::Seccomp => "seccomp",
            Mechanism::CapabilityDrop => "capability_drop",
            Mechanism::NetworkIsolation => "network_isolation",
            Mechanism::Cgroup => "cgroup",
        }
    }
}

/// The mechanisms required by default: Landlock, seccomp, the capability
/// drop, and network isolation for runs without network.
pub fn default_require(network: bool) -> Vec<Mechanism> {
    let mut r = vec![
        Mechanism::Landlock,
        Mechanism::Seccomp,
        Mechanism::CapabilityDrop,
    ];
    if !network {
        r.push(Mechanism::NetworkIsolation);
    }
    r
}

/// A resource limit set with setrlimit before exec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RlimitSpec {
    /// The resource: `core`, `fsize`, `nofile`, `as`, `nproc`.
    pub resource: String,
    /// Soft and hard value.
    pub value: u64,
    /// Why.
    pub reason: String,
}

/// Everything the runner applies to one child.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxSpec {
    /// The file-system rules.
    pub fs: fs::FsRules,
    /// Whether the child may use the network.
    pub network: bool,
    /// The seccomp deny-list.
    pub seccomp: seccomp::SeccompSpec,
    /// Resource limits by setrlimit.
    pub rlimits: Vec<RlimitSpec>,
    /// Memory limit in bytes (cgroup, else RLIMIT_AS).
    pub memory_bytes: u64,
    /// Process limit (cgroup pids, else none).
    pub pids_max: u64,
    /// Mechanisms that must hold, else the run fails before exec.
    pub require: Vec<Mechanism>,
}

/// The inputs of [`sandbox_spec`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxInputs {
    /// The request's switches.
    pub request: SandboxRequest,
    /// The run's paths.
    pub paths: fs::RunPaths,
    /// Memory limit in MiB.
    pub memory_mb: u64,
    /// Process limit.
    pub pids: u64,
    /// Largest file the child may write, in bytes.
    pub fsize_bytes: u64,
    /// Mechanisms required (from config, else [`default_require`]).
    pub require: Option<Vec<Mechanism>>,
    /// The child runs as uid 0 (a root daemon without run_as).
    pub child_is_root: bool,
}

/// Default memory limit in MiB.
pub const DEFAULT_MEMORY_MB: u64 = 2048;
/// Default process limit.
pub const DEFAULT_PIDS: u64 = 512;
/// Largest file a child may write (RLIMIT_FSIZE): 1 GiB.
pub const DEFAULT_FSIZE_BYTES: u64 = 1 << 30;
/// Descriptor limit.
pub const NOFILE: u64 = 4096;

/// Computes the sandbox spec of one run.
pub fn sandbox_spec(input: &SandboxInputs) -> SandboxSpec {
    let network = input.request.network;
    let rlimits = vec![
        RlimitSpec {
            resource: "core".into(),
            value: 0,
            reason: "no core dumps: they would copy the child's memory to disk".into(),
        },
        RlimitSpec {
            resource: "fsize".into(),
            value: input.fsize_bytes,
            reason: "no single file larger than the output cap".into(),
        },
        RlimitSpec {
            resource: "nofile".into(),
            value: NOFILE,
            reason: "bounded descriptors".into(),
        },
    ];
    SandboxSpec {
        fs: fs::rules(&input.paths, &input.request),
        network,
        seccomp: seccomp::spec(network, input.child_is_root),
        rlimits,
        memory_bytes: input.memory_mb.saturating_mul(1024 * 1024),
        pids_max: input.pids,
        require: input
            .require
            .clone()
            .unwrap_or_else(|| default_require(network)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn paths() -> fs::RunPaths {
        fs::RunPaths {
            temp_dir: "/tmp/subagentd-0/s/c1".into(),
            artifact_dir: "/state/sessions/s/runs/r/artifacts".into(),
            context_dir: "/state/sessions/s/runs/r/context".into(),
            delta_dir: "/state/sessions/s/runs/r/delta".into(),
            project_dir: "/work/project".into(),
            programs: vec!["/opt/agent/bin/agent".into()],
        }
    }

    fn inputs(request: SandboxRequest) -> SandboxInputs {
        SandboxInputs {
            request,
            paths: paths(),
            memory_mb: 64,
            pids: 32,
            fsize_bytes: 1 << 20,
            require: None,
            child_is_root: false,
        }
    }

    #[test]
    fn defaults_require_network_isolation_only_without_network() {
        let off = sandbox_spec(&inputs(SandboxRequest::default()));
        assert!(!off.network);
        assert!(off.require.contains(&Mechanism::NetworkIsolation));
        assert!(off.seccomp.only_unix_sockets);
        let on = sandbox_spec(&inputs(SandboxRequest {
            network: true,
            ..Default::default()
        }));
        assert!(on.network);
        assert!(!on.require.contains(&Mechanism::NetworkIsolation));
        assert!(!on.seccomp.only_unix_sockets);
        assert_eq!(off.memory_bytes, 64 << 20);
        assert_eq!(off.pids_max, 32);
        let core = off.rlimits.iter().find(|r| r.resource == "core").unwrap();
        assert_eq!(core.value, 0);
    }

    #[test]
    fn the_spec_is_plain_data_that_round_trips() {
        let spec = sandbox_spec(&inputs(SandboxRequest::default()));
        let text = serde_json_roundtrip(&spec);
        assert_eq!(text, spec);
    }

    fn serde_json_roundtrip(spec: &SandboxSpec) -> SandboxSpec {
        serde_json::from_str(&serde_json::to_string(spec).unwrap()).unwrap()
    }
}
