//! What this host can enforce, probed once when the engine starts.

use policy::sandbox::cgroup::{self, CgroupPlan, Via};
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

fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Probes the host.
pub fn probe() -> HostProbe {
    let mountinfo = read("/proc/self/mountinfo");
    let self_cgroup = read("/proc/self/cgroup");
    let first = cgroup::plan(&mountinfo, &self_cgroup, None);
    // The v2 controllers available where run cgroups would be made.
    let controllers = first
        .v2
        .as_ref()
        .and_then(|base| base.parent())
        .and_then(|d| std::fs::read_to_string(d.join("cgroup.controllers")).ok());
    HostProbe {
        landlock_abi: subagent_runner::sandbox::landlock::kernel_abi(),
        seccomp: seccomp_available(),
        root: nix::unistd::geteuid().is_root(),
        net_namespace: caps::effective_has(caps::CAP_SYS_ADMIN),
        full_cap_drop: caps::effective_has(caps::CAP_SETPCAP),
        cgroups: cgroup::plan(&mountinfo, &self_cgroup, controllers.as_deref()),
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
            _ => None,
        }
    }

    /// A one-line summary for the log and `subagentd --check`.
    pub fn summary(&self) -> String {
        let via = |v: &Via| match v {
            Via::V2(_) => "cgroup v2",
            Via::V1(_) => "cgroup v1",
            Via::Rlimit => "rlimit only",
        };
        format!(
            "landlock {}; seccomp {}; network namespace {}; capability drop {}; memory limits via {}; pids limits via {}; whole-run kill via the run's PID namespace",
            if self.landlock_abi > 0 { format!("ABI {}", self.landlock_abi) } else { "unavailable".into() },
            if self.seccomp { "on" } else { "unavailable" },
            if self.net_namespace { "yes" } else { "no (no CAP_SYS_ADMIN)" },
            if self.full_cap_drop { "full (bounding set too)" } else { "effective/permitted/ambient (the bounding set needs CAP_SETPCAP)" },
            via(&self.cgroups.memory),
            via(&self.cgroups.pids),
        )
    }
}
