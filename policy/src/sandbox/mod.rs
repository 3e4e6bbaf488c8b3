//! The sandbox spec of a run: plain data computed from the request, the
//! run's directories and what the host offers. `subagent-runner` applies it
//! in a fixed order (rlimits → cgroup → namespaces → capabilities →
//! no_new_privs → Landlock → seccomp → exec); nothing here touches the
//! system.
//!
//! - [`grants`]: the request's switches and the rights a run gets.
//! - [`fs`]: which paths the child may read, execute and write (Landlock).
//! - [`seccomp`]: the syscalls an agent never needs, each with its reason.
//! - [`mounts`]: the child's own root file system, what exists at all;
//!   [`places`]: the daemon's own places, hidden in it.
//! - [`network`]: the run's network mode, and what its proxy lets
//!   through.
//! - [`cgroup`]: where memory and process limits come from on this host.
//! - [`program`]: what the agent program needs to start (`#!`, `env`,
//!   the ELF loader), read from its first bytes.

pub mod cgroup;
pub mod fs;
pub mod grants;
pub mod mounts;
pub mod network;
pub mod places;
pub mod program;
pub mod seccomp;

pub use grants::{grants, Grants, SandboxRequest};
use serde::{Deserialize, Serialize};

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
    /// The run's own PID, mount, IPC and cgroup namespaces and root file
    /// system (always required: there is no run without them).
    Namespaces,
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
            Mechanism::Namespaces => "namespaces",
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
    /// The child's root file system (a runner spec without one is refused).
    #[serde(default)]
    pub mounts: mounts::MountPlan,
    /// Whether the child may use the host's network (full mode).
    pub network: bool,
    /// Allowlist mode: the proxy port inside the run and its list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<network::EgressSpec>,
    /// A driver run's model gateway (never with full network).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<network::GatewaySpec>,
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
    /// The rights the run gets.
    pub grants: Grants,
    /// The request (for its extra roots).
    pub request: SandboxRequest,
    /// The run's paths.
    pub paths: fs::RunPaths,
    /// The daemon's own places, never in the child's view.
    pub places: places::Places,
    /// Memory limit in MiB.
    pub memory_mb: u64,
    /// Process limit.
    pub pids: u64,
    /// Largest file the child may write, in bytes.
    pub fsize_bytes: u64,
    /// Size of the run's scratch file system, in bytes.
    pub disk_bytes: u64,
    /// Mechanisms required (from config, else [`default_require`]).
    pub require: Option<Vec<Mechanism>>,
    /// The child runs as a uid no other process has (a root daemon's
    /// per-run uid): RLIMIT_NPROC then counts the run's processes alone.
    pub own_uid: bool,
    /// The run's allowlist, when it is in allowlist mode (its grants then
    /// hold no network).
    pub network_allow: Option<Vec<String>>,
    /// The run's driver talks to the daemon's model gateway.
    pub gateway: bool,
}

impl SandboxSpec {
    /// The run's network mode.
    pub fn network_mode(&self) -> network::NetworkMode {
        if self.network {
            network::NetworkMode::Full
        } else if self.egress.is_some() {
            network::NetworkMode::Allowlist
        } else {
            network::NetworkMode::None
        }
    }
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
    let network = input.grants.network;
    let mut rlimits = vec![
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
    if input.own_uid {
        rlimits.push(RlimitSpec {
            resource: "nproc".into(),
            value: input.pids,
            reason: "the process limit, counted for the run's own uid".into(),
        });
    }
    let fs = fs::rules(&input.paths, &input.grants, &input.request);
    let p = &input.paths;
    let mounts = mounts::plan(
        &fs,
        &mounts::RootPaths {
            temp: &p.temp_dir,
            artifacts: &p.artifact_dir,
            delta: &p.delta_dir,
            context: &p.context_dir,
            project: &p.project_dir,
            programs: &p.programs,
            places: &input.places,
        },
        &input.grants,
        input.disk_bytes,
    );
    let egress = match &input.network_allow {
        Some(allow) if !network => Some(network::EgressSpec {
            proxy_port: network::PROXY_PORT,
            allow: allow.clone(),
        }),
        _ => None,
    };
    let mode = if network {
        network::NetworkMode::Full
    } else if egress.is_some() {
        network::NetworkMode::Allowlist
    } else {
        network::NetworkMode::None
    };
    let gateway = (input.gateway && !network).then_some(network::GatewaySpec {
        port: network::GATEWAY_PORT,
    });
    // The gateway is reached by TCP on loopback: IP sockets stay open.
    let sockets = match mode {
        network::NetworkMode::None if gateway.is_some() => network::NetworkMode::Allowlist,
        m => m,
    };
    SandboxSpec {
        fs,
        mounts,
        network,
        egress,
        gateway,
        seccomp: seccomp::for_mode(sockets, input.grants.exec),
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
            grants: grants(None, &request),
            request,
            paths: paths(),
            places: Default::default(),
            memory_mb: 64,
            pids: 32,
            fsize_bytes: 1 << 20,
            disk_bytes: 8 << 20,
            require: None,
            own_uid: true,
            network_allow: None,
            gateway: false,
        }
    }

    #[test]
    fn a_gateway_run_without_network_keeps_ip_sockets_for_loopback() {
        let mut input = inputs(SandboxRequest::default());
        input.gateway = true;
        let spec = sandbox_spec(&input);
        assert_eq!(spec.network_mode(), network::NetworkMode::None);
        assert_eq!(
            spec.gateway,
            Some(network::GatewaySpec {
                port: network::GATEWAY_PORT
            })
        );
        assert!(spec.seccomp.only_unix_and_inet_sockets);
        assert!(spec.require.contains(&Mechanism::NetworkIsolation));
        assert_eq!(serde_json_roundtrip(&spec), spec);
        // The host's network has no namespace of the run's own to hold it.
        input.grants.network = true;
        assert_eq!(sandbox_spec(&input).gateway, None);
    }

    #[test]
    fn an_allowlist_run_gets_the_proxy_port_and_the_ip_families() {
        let mut input = inputs(SandboxRequest::default());
        input.network_allow = Some(vec!["api.example.com:443".into()]);
        let spec = sandbox_spec(&input);
        assert_eq!(spec.network_mode(), network::NetworkMode::Allowlist);
        let egress = spec.egress.as_ref().unwrap();
        assert_eq!(egress.proxy_port, network::PROXY_PORT);
        assert_eq!(egress.allow, ["api.example.com:443"]);
        assert!(!spec.network);
        assert!(spec.seccomp.only_unix_and_inet_sockets);
        assert!(spec.require.contains(&Mechanism::NetworkIsolation));
        // Full network wins over a list; no list, no proxy.
        input.grants.network = true;
        assert_eq!(
            sandbox_spec(&input).network_mode(),
            network::NetworkMode::Full
        );
        assert!(sandbox_spec(&input).egress.is_none());
        let none = sandbox_spec(&inputs(SandboxRequest::default()));
        assert_eq!(none.network_mode(), network::NetworkMode::None);
        assert!(none.egress.is_none());
        assert_eq!(serde_json_roundtrip(&spec), spec);
    }

    #[test]
    fn defaults_require_network_isolation_only_without_network() {
        let off = sandbox_spec(&inputs(SandboxRequest::default()));
        assert!(!off.network);
        assert!(off.require.contains(&Mechanism::NetworkIsolation));
        assert!(off.seccomp.only_unix_sockets);
        let on = sandbox_spec(&inputs(SandboxRequest {
            network: Some(true),
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
