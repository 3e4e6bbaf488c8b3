//! The run's cgroups: made before fork with their limits, joined by the
//! child before exec, killed as a whole when the run ends, read for peak
//! memory and OOM kills, then removed.

use policy::sandbox::cgroup::{CgroupPlan, Via};
use std::path::{Path, PathBuf};

/// A cgroup step failed.
#[derive(Debug, thiserror::Error)]
#[error("cgroup: {op} {path}: {source}")]
pub struct CgroupError {
    /// The step.
    pub op: &'static str,
    /// The file or directory.
    pub path: PathBuf,
    /// The underlying error.
    pub source: std::io::Error,
}

fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    std::fs::write(path, value).map_err(|source| CgroupError {
        op: "write",
        path: path.to_path_buf(),
        source,
    })
}

/// Where this process's run cgroups go: planned from its own mount table
/// and cgroup, with the v2 controllers found where they would be made.
pub fn host_plan() -> CgroupPlan {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let (mountinfo, self_cgroup) = (read("/proc/self/mountinfo"), read("/proc/self/cgroup"));
    let first = policy::sandbox::cgroup::plan(&mountinfo, &self_cgroup, None);
    let controllers = first
        .v2
        .as_ref()
        .and_then(|base| base.parent())
        .and_then(|d| std::fs::read_to_string(d.join("cgroup.controllers")).ok());
    policy::sandbox::cgroup::plan(&mountinfo, &self_cgroup, controllers.as_deref())
}

fn mkdir(path: &Path) -> Result<(), CgroupError> {
    std::fs::create_dir_all(path).map_err(|source| CgroupError {
        op: "create",
        path: path.to_path_buf(),
        source,
    })
}

/// The run's cgroup directories.
#[derive(Debug, Clone, Default)]
pub struct RunCgroups {
    /// The v2 cgroup (for cgroup.kill, and limits when v2 has them).
    pub v2: Option<PathBuf>,
    /// The cgroup holding the memory limit.
    pub memory: Option<(PathBuf, bool)>,
    /// The cgroup holding the process limit.
    pub pids: Option<PathBuf>,
}

impl RunCgroups {
    /// Makes the run's cgroups and writes their limits; on failure removes
    /// whatever it made, so nothing is left behind.
    pub fn create(
        plan: &CgroupPlan,
        run_id: &str,
        memory_bytes: u64,
        pids_max: u64,
    ) -> Result<RunCgroups, CgroupError> {
        let mut cg = RunCgroups::default();
        let made = Self::fill(&mut cg, plan, run_id, memory_bytes, pids_max);
        if made.is_err() {
            // Whatever exists of the run's cgroups goes, made or half-made.
            RunCgroups::existing(plan, run_id).remove();
        }
        made.map(|()| cg)
    }

    fn fill(
        cg: &mut RunCgroups,
        plan: &CgroupPlan,
        run_id: &str,
        memory_bytes: u64,
        pids_max: u64,
    ) -> Result<(), CgroupError> {
        if let Some(base) = &plan.v2 {
            let dir = base.join(run_id);
            mkdir(&dir)?;
            cg.v2 = Some(dir);
        }
        match &plan.memory {
            Via::V2(base) => {
                let dir = base.join(run_id);
                write(&dir.join("memory.max"), &memory_bytes.to_string())?;
                let _ = write(&dir.join("memory.swap.max"), "0");
                cg.memory = Some((dir, true));
            }
            Via::V1(base) => {
                let dir = base.join(run_id);
                mkdir(&dir)?;
                write(
                    &dir.join("memory.limit_in_bytes"),
                    &memory_bytes.to_string(),
                )?;
                // Swap must not stretch the limit (absent without swap accounting).
                let memsw = dir.join("memory.memsw.limit_in_bytes");
                if memsw.exists() {
                    write(&memsw, &memory_bytes.to_string())?;
                }
                cg.memory = Some((dir, false));
            }
            Via::Rlimit => {}
        }
        match &plan.pids {
            Via::V2(base) => {
                let dir = base.join(run_id);
                write(&dir.join("pids.max"), &pids_max.to_string())?;
                cg.pids = Some(dir);
            }
            Via::V1(base) => {
                let dir = base.join(run_id);
                mkdir(&dir)?;
                write(&dir.join("pids.max"), &pids_max.to_string())?;
                cg.pids = Some(dir);
            }
            Via::Rlimit => {}
        }
        Ok(())
    }

    /// The run's cgroups as `create` would have made them, without making
    /// anything: for cleaning up after a runner that died.
    pub fn existing(plan: &CgroupPlan, run_id: &str) -> RunCgroups {
        let pick = |via: &Via| match via {
            Via::V2(b) | Via::V1(b) => Some(b.join(run_id)).filter(|d| d.is_dir()),
            Via::Rlimit => None,
        };
        RunCgroups {
            v2: plan
                .v2
                .as_ref()
                .map(|b| b.join(run_id))
                .filter(|d| d.is_dir()),
            memory: pick(&plan.memory).map(|d| (d, matches!(plan.memory, Via::V2(_)))),
            pids: pick(&plan.pids),
        }
    }

    /// Whether any process is still in the run's cgroups.
    pub fn populated(&self) -> bool {
        self.dirs().iter().any(|d| {
            std::fs::read_to_string(d.join("cgroup.procs")).is_ok_and(|s| !s.trim().is_empty())
        })
    }

    /// SIGKILLs every process listed in the run's cgroups (for hosts whose
    /// cgroup v2 tree cannot do it at once).
    pub fn kill_listed(&self) {
        for d in self.dirs() {
            if let Ok(s) = std::fs::read_to_string(d.join("cgroup.procs")) {
                for pid in s.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            }
        }
    }

    fn dirs(&self) -> Vec<&Path> {
        let mut d: Vec<&Path> = Vec::new();
        for p in [
            self.v2.as_deref(),
            self.memory.as_ref().map(|(p, _)| p.as_path()),
            self.pids.as_deref(),
        ]
        .into_iter()
        .flatten()
        {
            if !d.contains(&p) {
                d.push(p);
            }
        }
        d
    }

    /// Moves the calling process into every run cgroup (in the run's init).
    ///
    /// A v1 cgroup is joined through `tasks` (the calling thread; init is
    /// single-threaded, so that is the process): a `cgroup.procs` write
    /// takes the kernel's global threadgroup lock for writing, which waits
    /// for an RCU grace period unless a migration came just before, as it
    /// rarely does for a parent that spawns now and then.
    pub fn join_self(&self) -> Result<(), CgroupError> {
        for d in self.dirs() {
            let tasks = d.join("tasks");
            let file = if tasks.exists() {
                tasks
            } else {
                d.join("cgroup.procs")
            };
            write(&file, "0")?;
        }
        Ok(())
    }

    /// Kills every process of the run: at once through the v2 cgroup's
    /// cgroup.kill, else each process the cgroups list. False when there is
    /// no cgroup to ask (the caller kills the tree itself too).
    pub fn kill_all(&self) -> bool {
        if self
            .v2
            .as_ref()
            .is_some_and(|d| write(&d.join("cgroup.kill"), "1").is_ok())
        {
            return true;
        }
        if self.pids.is_some() || self.memory.is_some() {
            self.kill_listed();
            return true;
        }
        false
    }

    /// How many forks the pids limit refused, where a pids cgroup counts
    /// them (`pids.events`).
    pub fn pids_refused(&self) -> Option<u64> {
        let text = std::fs::read_to_string(self.pids.as_ref()?.join("pids.events")).ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix("max ").and_then(|v| v.trim().parse().ok()))
    }

    /// Peak memory in bytes and the number of OOM kills, where known.
    pub fn memory_stats(&self) -> (Option<u64>, Option<u64>) {
        let Some((dir, v2)) = &self.memory else {
            return (None, None);
        };
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok();
        let peak_file = if *v2 {
            "memory.peak"
        } else {
            "memory.max_usage_in_bytes"
        };
        let peak = read(peak_file).and_then(|s| s.trim().parse().ok());
        let events = if *v2 {
            "memory.events"
        } else {
            "memory.oom_control"
        };
        let ooms = read(events).and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("oom_kill ")
                    .and_then(|v| v.trim().parse().ok())
            })
        });
        (peak, ooms)
    }

    /// Removes the run's cgroups (they must be empty); retries briefly
    /// while the last processes are being torn down.
    pub fn remove(&self) {
        for d in self.dirs() {
            for _ in 0..100 {
                if std::fs::remove_dir(d).is_ok() || !d.exists() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
    }
}
