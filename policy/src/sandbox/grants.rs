//! The `sandbox` switches of a request and the OS rights ([`Grants`]) a
//! run gets from its tools and those switches. Uses only `crate::tools`;
//! the rest of `sandbox` builds on it.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The `sandbox` param of spawn_agent. With `session.tools`, the switches
/// can only narrow what the tools grant; without, they grant (default
/// false).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxRequest {
    /// Let the child write its project_dir.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_project: Option<bool>,
    /// Let the child use the network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<bool>,
    /// Destinations the child may reach through the daemon's proxy
    /// (`host:port`, host exact or `*.domain`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub network_allow: Vec<String>,
    /// Extra read-only roots (absolute, existing).
    #[serde(default)]
    pub read_paths: Vec<PathBuf>,
    /// Extra writable roots (absolute, existing).
    #[serde(default)]
    pub write_paths: Vec<PathBuf>,
}

/// The OS rights a run gets, from its tools and switches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Grants {
    /// Read the project.
    pub read_project: bool,
    /// Write the project.
    pub write_project: bool,
    /// Run other programs (else only the agent program and what it needs).
    pub exec: bool,
    /// Use the network.
    pub network: bool,
}

impl Grants {
    /// Whether every right of `self` is also in `other`.
    pub fn within(&self, other: &Grants) -> bool {
        (!self.read_project || other.read_project)
            && (!self.write_project || other.write_project)
            && (!self.exec || other.exec)
            && (!self.network || other.network)
    }
}

/// The rights of a run. With the child's tools (`Some`), each right needs
/// a tool of its class (a write tool also reads), and the request's
/// switches can only take rights away. Without tools (a client that sends
/// no `session.tools`), the project is readable, programs run, and the
/// switches grant writing and network (default off).
pub fn grants(
    tools: Option<&std::collections::BTreeSet<crate::tools::Capability>>,
    request: &SandboxRequest,
) -> Grants {
    use crate::tools::Capability as C;
    match tools {
        None => Grants {
            read_project: true,
            write_project: request.write_project.unwrap_or(false),
            exec: true,
            network: request.network.unwrap_or(false),
        },
        Some(classes) => Grants {
            read_project: classes.contains(&C::ReadProject) || classes.contains(&C::WriteProject),
            write_project: classes.contains(&C::WriteProject)
                && request.write_project.unwrap_or(true),
            exec: classes.contains(&C::Exec),
            network: classes.contains(&C::Network) && request.network.unwrap_or(true),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tools_grant_rights_and_switches_only_narrow() {
        use crate::tools::Capability as C;
        let classes = |c: &[C]| c.iter().copied().collect::<std::collections::BTreeSet<_>>();
        let none = SandboxRequest::default();
        let g = grants(Some(&classes(&[C::ReadProject])), &none);
        assert_eq!(
            g,
            Grants {
                read_project: true,
                ..Default::default()
            }
        );
        let all = classes(&[C::WriteProject, C::Exec, C::Network]);
        assert_eq!(
            grants(Some(&all), &none),
            Grants {
                read_project: true,
                write_project: true,
                exec: true,
                network: true
            }
        );
        let narrowed = SandboxRequest {
            write_project: Some(false),
            network: Some(false),
            ..Default::default()
        };
        assert_eq!(
            grants(Some(&all), &narrowed),
            Grants {
                read_project: true,
                exec: true,
                ..Default::default()
            }
        );
        let widen = SandboxRequest {
            write_project: Some(true),
            network: Some(true),
            ..Default::default()
        };
        assert_eq!(
            grants(Some(&classes(&[C::ReadProject])), &widen),
            Grants {
                read_project: true,
                ..Default::default()
            }
        );
        // Without tools the switches grant, defaulting to off.
        assert_eq!(
            grants(None, &none),
            Grants {
                read_project: true,
                exec: true,
                ..Default::default()
            }
        );
        assert!(grants(None, &widen).network);
    }
}
