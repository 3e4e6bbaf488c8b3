//! What this host can enforce, probed once when the engine starts.

use policy::sandbox::cgroup::{CgroupPlan, Via};
use policy::sandbox::Mechanism;
use serde::Serialize;
use subagent_runner::sandbox::caps;

/// The host's sandboxing facilities.
#[derive(Debug, Clone, Serialize)]
pub struct HostProbe {
    /// Landlock ABI version (0: none).
    pub landlock_abi: i32,
    /// seccomp filters are available.
    pub seccomp: bool,
    /// Running as root (children then own the system's files unless run_as).
    pub root: bool,
    /// CAP_SYS_ADMIN: network namespaces can be made.
    pub net_namespace: bool,
    /// CAP_SETPCAP: the bounding set can be emptied and securebits locked.
    pub full_cap_drop: bool,
    /// Where run cgroups go.
    pub cgroups: CgroupPlan,
}

fn seccomp_available() -> bool {
    // SAFETY: prctl(PR_GET_SECCOMP) takes no pointers; it returns the mode
    // or fails with EINVAL when the kernel lacks seccomp.
    unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) >= 0 }
}

/// Whether run cgroups can be made where `via` puts them: its base (or,
/// before the first run made it, the base's parent) is writable here.
fn writable(via: &Via) -> bool {
    let (Via::V1(base) | Via::V2(base)) = via else {
        return false;
    };
    let dir = if base.exists() {
        Some(base.as_path())
    } else {
        base.parent()
    };
    dir.is_some_and(|d| nix::unistd::access(d, nix::unistd::AccessFlags::W_OK).is_ok())
}

/// Probes the host.
pub fn probe() -> HostProbe {
    HostProbe {
        landlock_abi: subagent_runner::sandbox::landlock::kernel_abi(),
        seccomp: seccomp_available(),
        root: nix::unistd::geteuid().is_root(),
        net_namespace: caps::effective_has(caps::CAP_SYS_ADMIN),
        full_cap_drop: caps::effective_has(caps::CAP_SETPCAP),
        cgroups: subagent_runner::sandbox::cgroup::host_plan(),
    }
}

impl HostProbe {
    /// Why `m` cannot be enforced here, if it cannot.
    pub fn missing(&self, m: Mechanism) -> Option<String> {
        match m {
            Mechanism::Landlock if self.landlock_abi <= 0 => {
                Some("the kernel has no Landlock".into())
            }
            Mechanism::Seccomp if !self.seccomp => Some("the kernel has no seccomp filters".into()),
            Mechanism::NetworkIsolation if !self.seccomp && !self.net_namespace => {
                Some("neither seccomp nor a network namespace is available".into())
            }
            Mechanism::Cgroup if self.cgroups.memory == Via::Rlimit => {
                Some("no memory cgroup controller is mounted".into())
            }
            Mechanism::Cgroup if !writable(&self.cgroups.memory) => Some(
                "the memory cgroup is not this user's to make cgroups in (not delegated)".into(),
            ),
            _ => None,
        }
    }

    /// A one-line summary of the host's facts, for the log and `subagentd
    /// --check` (which then runs one run to show what runs get).
    pub fn summary(&self) -> String {
        let via = |v: &Via| match v {
            Via::V2(_) if writable(v) => "cgroup v2",
            Via::V1(_) if writable(v) => "cgroup v1",
            Via::V2(_) | Via::V1(_) => "rlimit (the cgroup is not this user's)",
            Via::Rlimit => "rlimit (no cgroup controller)",
        };
        format!(
            "landlock {}; seccomp {}; running as {}; memory limits via {}; pids limits via {}",
            if self.landlock_abi > 0 {
                format!("ABI {}", self.landlock_abi)
            } else {
                "unavailable".into()
            },
            if self.seccomp { "on" } else { "unavailable" },
            if self.root {
                "root (a uid of its own per run)".to_owned()
            } else {
                format!(
                    "uid {} (runs in a user namespace of their own)",
                    nix::unistd::geteuid()
                )
            },
            via(&self.cgroups.memory),
            via(&self.cgroups.pids),
        )
    }
}
