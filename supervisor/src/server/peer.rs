//! Who is calling: a process inside a run may not use the control socket.
//! Decided from the peer's credentials (its pid, then its cgroups and its
//! ancestry), never from anything the caller says.

use crate::ids::RunId;

/// The name the kernel shows for a runner (`comm`, 15 bytes at most).
const RUNNER_COMM: &str = "subagent-runner";

/// Whether `/proc/<pid>/cgroup` text puts the process in a run's cgroup
/// (`…/subagentd/<run id>`).
pub fn in_run_cgroup(cgroup_text: &str) -> bool {
    cgroup_text.lines().any(|line| {
        let path = line.splitn(3, ':').nth(2).unwrap_or("");
        let segs: Vec<&str> = path.split('/').collect();
        segs.windows(2)
            .any(|w| w[0] == "subagentd" && RunId::parse(w[1]).is_some())
    })
}

fn parent_of(pid: i32) -> Option<i32> {
    subagent_runner::procstat::read_stat(pid).map(|s| s.ppid)
}

fn comm(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// Whether process `pid` belongs to a run: it sits in a run's cgroup, or a
/// runner is among its ancestors. A pid that is unknown, or gone by the
/// time it is looked at (a process that connected, handed the connection
/// on and exited), counts as inside: fail closed.
pub fn inside_run(pid: Option<i32>) -> bool {
    let Some(pid) = pid.filter(|&p| p > 0) else {
        return true;
    };
    match std::fs::read_to_string(format!("/proc/{pid}/cgroup")) {
        Ok(text) if in_run_cgroup(&text) => return true,
        Ok(_) => {}
        Err(_) => return true,
    }
    let mut p = pid;
    for _ in 0..256 {
        if comm(p) == RUNNER_COMM {
            return true;
        }
        match parent_of(p) {
            Some(pp) if pp > 1 && pp != p => p = pp,
            _ => return false,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_cgroups_are_recognised() {
        let inside = "4:memory:/job/subagentd/20261130T055552.123456Z-a1b2c3d4\n0::/\n";
        assert!(in_run_cgroup(inside));
        for outside in [
            "0::/system.slice/subagentd.service\n",
            "4:memory:/job/subagentd\n",
            "4:memory:/subagentd/not-a-run-id\n",
            "",
        ] {
            assert!(!in_run_cgroup(outside), "{outside}");
        }
    }

    #[test]
    fn this_test_process_is_not_inside_a_run() {
        assert!(!inside_run(Some(std::process::id() as i32)));
        assert!(inside_run(None));
        // A pid that is gone counts as inside.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        child.wait().unwrap();
        assert!(inside_run(Some(pid)));
    }
}
