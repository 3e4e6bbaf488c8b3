//! Applying a run's [`SandboxSpec`] to the agent process.
//!
//! [`prepare`] runs in the runner before fork: it probes the kernel,
//! compiles the seccomp filters, makes the cgroups, and refuses the run
//! when a required mechanism cannot be enforced. [`Prepared::apply`] runs in
//! the child between fork and exec, in a fixed order: rlimits → cgroup →
//! namespaces → capabilities → no_new_privs → Landlock → seccomp. (The
//! runner is single-threaded, so the child may allocate.)
//!
//! - [`landlock`], [`seccomp`], [`caps`], [`rlimits`], [`cgroup`]: one file
//!   per kernel concern.
//! - [`report`]: what was enforced, recorded with every run.

pub mod caps;
pub mod cgroup;
pub mod landlock;
pub mod report;
pub mod rlimits;
pub mod seccomp;

use policy::sandbox::cgroup::{CgroupPlan, Via};
use policy::sandbox::{Mechanism, RlimitSpec, SandboxSpec};
use report::{Enforcement, IsolationReport};

/// The sandbox cannot be set up as required.
#[derive(Debug, thiserror::Error)]
#[error("required mechanism {mechanism} cannot be enforced: {why}")]
pub struct SandboxError {
    /// The mechanism.
    pub mechanism: &'static str,
    /// Why.
    pub why: String,
}

/// Everything decided before fork.
pub struct Prepared {
    spec: SandboxSpec,
    rlimits: Vec<RlimitSpec>,
    cgroups: cgroup::RunCgroups,
    seccomp: Option<seccomp::Compiled>,
    landlock_abi: i32,
    privileged: bool,
    last_cap: u32,
    netns: bool,
    run_as: Option<(u32, u32)>,
    /// What will be enforced once [`Prepared::apply`] succeeds.
    pub report: IsolationReport,
}

fn required(spec: &SandboxSpec, m: Mechanism) -> bool {
    spec.require.contains(&m)
}

fn via_text(via: &Via) -> String {
    match via {
        Via::V2(b) => format!("cgroup v2 ({})", b.display()),
        Via::V1(b) => format!("cgroup v1 ({})", b.display()),
        Via::Rlimit => "rlimit".to_owned(),
    }
}

/// Probes, compiles and creates what the child will apply; fails when a
/// required mechanism is unavailable.
pub fn prepare(
    spec: &SandboxSpec,
    plan: &CgroupPlan,
    run_id: &str,
    run_as: Option<(u32, u32)>,
) -> Result<Prepared, SandboxError> {
    let fail = |m: Mechanism, why: String| SandboxError {
        mechanism: m.as_str(),
        why,
    };
    let mut report = IsolationReport::default();
    // Decided by capabilities, not by uid: a root process in a container
    // may lack CAP_SYS_ADMIN or CAP_SETPCAP.
    let privileged = caps::effective_has(caps::CAP_SETPCAP);
    let can_netns = caps::effective_has(caps::CAP_SYS_ADMIN);
    let can_switch = caps::effective_has(caps::CAP_SETUID) && caps::effective_has(caps::CAP_SETGID);

    let landlock_abi = landlock::kernel_abi();
    if landlock_abi <= 0 && required(spec, Mechanism::Landlock) {
        return Err(fail(
            Mechanism::Landlock,
            "the kernel has no Landlock".into(),
        ));
    }
    report.landlock = if landlock_abi > 0 {
        let known = landlock::NEWEST_KNOWN_ABI;
        let mut parts = vec![if landlock_abi >= known {
            format!("ABI {landlock_abi}, fully enforced: every file-system right")
        } else {
            format!(
                "ABI {landlock_abi}, fully enforced: every file-system right of ABI {landlock_abi} (rights added in ABI {}..={known} are not available on this kernel)",
                landlock_abi + 1
            )
        }];
        if !spec.network && landlock_abi >= 4 {
            parts.push("TCP bind and connect denied".into());
        }
        if landlock_abi >= 6 {
            parts.push("abstract Unix sockets and signals scoped to the run".into());
        }
        Enforcement::on(parts.join("; "))
    } else {
        Enforcement::off("the kernel has no Landlock")
    };

    let seccomp = match seccomp::compile(&spec.seccomp) {
        Ok(c) => Some(c),
        Err(e) if required(spec, Mechanism::Seccomp) => {
            return Err(fail(Mechanism::Seccomp, e.to_string()))
        }
        Err(_) => None,
    };
    report.seccomp = match &seccomp {
        Some(c) => Enforcement::on(c.describe(&spec.seccomp)),
        None => Enforcement::off("the filter could not be built"),
    };

    let netns = can_netns && !spec.network;
    report.network = if spec.network {
        Enforcement::off("granted to this run")
    } else {
        let mut how = Vec::new();
        if netns {
            how.push("a network namespace with no interfaces up");
        }
        if seccomp.is_some() {
            how.push("seccomp (AF_UNIX sockets only)");
        }
        if landlock_abi >= 4 {
            how.push("Landlock (TCP)");
        }
        if how.is_empty() && required(spec, Mechanism::NetworkIsolation) {
            return Err(fail(
                Mechanism::NetworkIsolation,
                "no namespace, seccomp or Landlock network support".into(),
            ));
        }
        Enforcement::on(format!("isolated by {}", how.join(", ")))
    };

    let cgroups = match cgroup::RunCgroups::create(plan, run_id, spec.memory_bytes, spec.pids_max) {
        Ok(c) => c,
        Err(e) if required(spec, Mechanism::Cgroup) => {
            return Err(fail(Mechanism::Cgroup, e.to_string()))
        }
        Err(e) => {
            report.notes.push(format!(
                "cgroups unavailable ({e}); memory limited by RLIMIT_AS"
            ));
            cgroup::RunCgroups::default()
        }
    };
    let mut rlimits = spec.rlimits.clone();
    let memory_via = if cgroups.memory.is_some() {
        via_text(&plan.memory)
    } else {
        "rlimit".into()
    };
    if cgroups.memory.is_none() {
        rlimits.push(RlimitSpec {
            resource: "as".into(),
            value: spec.memory_bytes,
            reason: "memory limit without a memory cgroup".into(),
        });
    }
    let pids_via = if cgroups.pids.is_some() {
        via_text(&plan.pids)
    } else {
        "not limited (no pids cgroup)".into()
    };
    report.cgroup = Enforcement {
        enforced: cgroups.memory.is_some() || cgroups.pids.is_some(),
        detail: format!(
            "memory {} MiB via {memory_via}; pids {} via {pids_via}; whole-tree kill via {}",
            spec.memory_bytes >> 20,
            spec.pids_max,
            match (
                &cgroups.v2,
                cgroups
                    .pids
                    .as_ref()
                    .or(cgroups.memory.as_ref().map(|(d, _)| d))
            ) {
                (Some(d), _) => format!("cgroup.kill ({})", d.display()),
                (None, Some(d)) => format!(
                    "the cgroup's process list ({}) and a /proc walk",
                    d.display()
                ),
                (None, None) => "a /proc walk (no cgroup)".to_owned(),
            }
        ),
    };
    report.rlimits = rlimits
        .iter()
        .map(|r| format!("{}={}", r.resource, r.value))
        .collect();
    report.capabilities = if privileged {
        Enforcement::on(
            "effective, permitted, inheritable, ambient and bounding sets empty; securebits locked",
        )
    } else {
        Enforcement::on("effective, permitted, inheritable and ambient sets empty; bounding set kept (no CAP_SETPCAP), no_new_privs stops any gain")
    };
    report.no_new_privs = true;
    report.user = match run_as {
        Some((uid, gid)) if can_switch => {
            format!("uid {uid}, gid {gid} (run_as), no supplementary groups")
        }
        Some(_) => {
            return Err(fail(
                Mechanism::CapabilityDrop,
                "run_as needs CAP_SETUID and CAP_SETGID".into(),
            ))
        }
        None => {
            let uid = nix::unistd::geteuid().as_raw();
            if uid == 0 {
                "uid 0 without capabilities (no run_as; chmod refused by seccomp)".to_owned()
            } else {
                format!("uid {uid} (the daemon's)")
            }
        }
    };
    Ok(Prepared {
        spec: spec.clone(),
        rlimits,
        cgroups,
        seccomp,
        landlock_abi,
        privileged,
        last_cap: caps::last_cap(),
        netns,
        run_as,
        report,
    })
}

impl Prepared {
    /// Applies the sandbox to the calling process, in order. Runs in the
    /// child between fork and exec; the error names the step.
    pub fn apply(&self) -> Result<String, String> {
        // Each step's duration, reported as "name=µs ..." (the isolation
        // cost the benchmark harness shows).
        let mut times = String::new();
        let mut t = std::time::Instant::now();
        let mut lap = |name: &str, times: &mut String| {
            times.push_str(&format!("{name}={} ", t.elapsed().as_micros()));
            t = std::time::Instant::now();
        };
        rlimits::apply(&self.rlimits).map_err(|e| e.to_string())?;
        lap("rlimits", &mut times);
        self.cgroups.join_self().map_err(|e| e.to_string())?;
        lap("cgroup_join", &mut times);
        if self.netns {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|e| format!("network namespace: unshare: {e}"))?;
        }
        lap("namespaces", &mut times);
        // Landlock's rule paths are opened now, while the process may still
        // reach them; the rules are enforced after the user switch.
        let ruleset = if self.landlock_abi > 0 {
            Some(
                landlock::build(&self.spec.fs, !self.spec.network, self.landlock_abi)
                    .map_err(|e| e.to_string())?,
            )
        } else {
            None
        };
        lap("landlock_build", &mut times);
        caps::drop_bounding(self.privileged, self.last_cap).map_err(|e| e.to_string())?;
        if let Some((uid, gid)) = self.run_as {
            caps::switch_user(uid, gid).map_err(|e| e.to_string())?;
        }
        caps::clear_sets().map_err(|e| e.to_string())?;
        lap("capabilities", &mut times);
        caps::no_new_privs().map_err(|e| e.to_string())?;
        lap("no_new_privs", &mut times);
        if let Some(r) = ruleset {
            landlock::enforce(r).map_err(|e| e.to_string())?;
        }
        lap("landlock_enforce", &mut times);
        if let Some(s) = &self.seccomp {
            seccomp::install(s).map_err(|e| e.to_string())?;
        }
        lap("seccomp", &mut times);
        Ok(times)
    }

    /// The run's cgroups.
    pub fn cgroups(&self) -> &cgroup::RunCgroups {
        &self.cgroups
    }
}
