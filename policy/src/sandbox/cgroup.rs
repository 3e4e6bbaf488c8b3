//! Where a run's cgroups go and which limits they carry, decided from the
//! host's mount table and the daemon's own cgroup (given as text).
//!
//! cgroup v2 is used where it has the controller; on hybrid hosts (a v2
//! tree without memory or pids, v1 controllers mounted beside it) the v1
//! controllers carry the limits, and the v2 tree still gives `cgroup.kill`.
//! Run cgroups nest under the daemon's own cgroup, so limits the daemon
//! runs under still apply to its children.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Where one limit is enforced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "via", content = "base")]
pub enum Via {
    /// A cgroup v2 directory (the parent of the run cgroups).
    V2(PathBuf),
    /// A cgroup v1 hierarchy directory (the parent of the run cgroups).
    V1(PathBuf),
    /// No cgroup controller: a per-process rlimit stands in (memory) or
    /// nothing does (pids).
    Rlimit,
}

/// The cgroup layout for runs on this host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupPlan {
    /// The v2 directory under which run cgroups are made (for
    /// `cgroup.kill` and v2 limits), when a v2 tree is mounted.
    pub v2: Option<PathBuf>,
    /// Where the memory limit lives.
    pub memory: Via,
    /// Where the process limit lives.
    pub pids: Via,
}

struct Mount {
    point: PathBuf,
    fstype: String,
    options: Vec<String>,
}

fn mounts(mountinfo: &str) -> Vec<Mount> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let point = left.split_whitespace().nth(4)?;
            let mut r = right.split_whitespace();
            let fstype = r.next()?.to_owned();
            let _source = r.next()?;
            let options = r
                .next()
                .unwrap_or("")
                .split(',')
                .map(str::to_owned)
                .collect();
            Some(Mount {
                point: PathBuf::from(point.replace("\\040", " ")),
                fstype,
                options,
            })
        })
        .collect()
}

/// The daemon's own cgroup path per hierarchy, from /proc/self/cgroup:
/// (controllers, path); controllers is empty for v2.
fn own_paths(self_cgroup: &str) -> Vec<(Vec<String>, String)> {
    self_cgroup
        .lines()
        .filter_map(|l| {
            let mut f = l.splitn(3, ':');
            let _id = f.next()?;
            let ctrl = f.next()?;
            let path = f.next()?;
            let ctrls = ctrl
                .split(',')
                .filter(|c| !c.is_empty())
                .map(str::to_owned)
                .collect();
            Some((ctrls, path.to_owned()))
        })
        .collect()
}

fn under(mount: &Path, own: &str) -> PathBuf {
    mount.join(own.trim_start_matches('/')).join("subagentd")
}

/// Plans the run cgroups from /proc/self/mountinfo, /proc/self/cgroup and
/// the v2 tree's `cgroup.controllers` at the daemon's cgroup (None when
/// unreadable).
pub fn plan(mountinfo: &str, self_cgroup: &str, v2_controllers: Option<&str>) -> CgroupPlan {
    let ms = mounts(mountinfo);
    let own = own_paths(self_cgroup);
    let v2 = ms.iter().find(|m| m.fstype == "cgroup2").map(|m| {
        let path = own
            .iter()
            .find(|(c, _)| c.is_empty())
            .map_or("/", |(_, p)| p.as_str());
        under(&m.point, path)
    });
    let v2_has = |c: &str| v2_controllers.is_some_and(|t| t.split_whitespace().any(|x| x == c));
    let v1 = |ctrl: &str| {
        ms.iter()
            .find(|m| m.fstype == "cgroup" && m.options.iter().any(|o| o == ctrl))
            .map(|m| {
                let path = own
                    .iter()
                    .find(|(c, _)| c.iter().any(|x| x == ctrl))
                    .map_or("/", |(_, p)| p.as_str());
                under(&m.point, path)
            })
    };
    let pick = |ctrl: &str| match (&v2, v2_has(ctrl), v1(ctrl)) {
        (Some(base), true, _) => Via::V2(base.clone()),
        (_, _, Some(base)) => Via::V1(base),
        _ => Via::Rlimit,
    };
    let (memory, pids) = (pick("memory"), pick("pids"));
    // Hybrid hosts (both limits on v1, whose pids cgroup lists the run for the kill) get no v2
    // cgroup, since joining one waits for an RCU grace period.
    let v2 = if matches!(memory, Via::V1(_)) && matches!(pids, Via::V1(_)) {
        None
    } else {
        v2
    };
    CgroupPlan { memory, pids, v2 }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    const HYBRID_SELF: &str = "8:pids:/\n4:memory:/job/42\n1:cpu:/\n0::/\n";

    #[test]
    fn hybrid_host_uses_v1_for_limits_and_kill_and_makes_no_v2_cgroup() {
        let p = plan(HYBRID, HYBRID_SELF, Some("hugetlb"));
        assert_eq!(p.v2, None);
        assert_eq!(
            p.memory,
            Via::V1("/sys/fs/cgroup/memory/job/42/subagentd".into())
        );
        assert_eq!(p.pids, Via::V1("/sys/fs/cgroup/pids/subagentd".into()));
    }

    #[test]
    fn hybrid_host_without_a_v1_pids_controller_keeps_v2_for_the_kill() {
        let mi: String = HYBRID
            .lines()
            .filter(|l| !l.contains("pids"))
            .map(|l| format!("{l}\n"))
            .collect();
        let p = plan(&mi, HYBRID_SELF, Some("hugetlb"));
        assert_eq!(
            p.v2,
            Some(PathBuf::from("/sys/fs/cgroup/unified/subagentd"))
        );
        assert_eq!(p.pids, Via::Rlimit);
    }

    #[test]
    fn pure_v2_with_controllers_uses_v2() {
        let mi = "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        let p = plan(
            mi,
            "0::/system.slice/subagentd.service\n",
            Some("cpu memory pids io"),
        );
        let base = PathBuf::from("/sys/fs/cgroup/system.slice/subagentd.service/subagentd");
        assert_eq!(p.v2, Some(base.clone()));
        assert_eq!(p.memory, Via::V2(base.clone()));
        assert_eq!(p.pids, Via::V2(base));
    }

    #[test]
    fn no_cgroups_falls_back_to_rlimits() {
        let p = plan("22 1 0:5 / /proc rw - proc proc rw\n", "", None);
        assert_eq!(
            p,
            CgroupPlan {
                v2: None,
                memory: Via::Rlimit,
                pids: Via::Rlimit
            }
        );
    }
}
