//! The runner's process tree. The runner is a child subreaper, so every
//! process its child starts, however it detaches (double fork, setsid),
//! stays below the runner and is found here.

use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// One process as /proc/<pid>/stat shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// Its pid.
    pub pid: i32,
    /// Its state letter (R, S, Z, ...).
    pub state: char,
    /// Its parent's pid.
    pub ppid: i32,
    /// Its start time in clock ticks since boot (field 22).
    pub start_ticks: u64,
}

/// Parses the text of /proc/<pid>/stat. The command name may hold spaces
/// and parentheses, so fields are counted after the last ')'.
pub fn parse_stat(text: &str) -> Option<ProcStat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let pid = text[..open].trim().parse().ok()?;
    let mut rest = text.get(close + 1..)?.split_whitespace();
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    // Fields 5..=21 come next; start time is field 22, the 20th after ')'.
    let start_ticks = rest.nth(17)?.parse().ok()?;
    Some(ProcStat {
        pid,
        state,
        ppid,
        start_ticks,
    })
}

/// Reads /proc/<pid>/stat; `None` when the process is gone.
pub fn read_stat(pid: i32) -> Option<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text)
}

/// The direct children of `pid`, from `/proc/<pid>/task/*/children`;
/// `None` when those files cannot be read (a kernel without
/// CONFIG_PROC_CHILDREN, or `pid` gone).
fn children_of(pid: i32) -> Option<Vec<i32>> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut out = Vec::new();
    for t in tasks.flatten() {
        let text = std::fs::read_to_string(t.path().join("children")).ok()?;
        out.extend(
            text.split_whitespace()
                .filter_map(|c| c.parse::<i32>().ok()),
        );
    }
    Some(out)
}

/// Every live (non-zombie) descendant of `root`: walked down through
/// each process's `children` list, so the cost follows the size of the
/// tree, not the number of processes on the host; from one scan of all of
/// /proc when the kernel has no `children` files. (The runner is a child
/// subreaper, so orphaned descendants are its children and are found.)
pub fn descendants(root: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let mut stack = match children_of(root) {
        Some(c) => c,
        None => return descendants_by_scan(root),
    };
    while let Some(p) = stack.pop() {
        if out.contains(&p) {
            continue;
        }
        if read_stat(p).is_some_and(|st| alive(&st)) {
            out.push(p);
        }
        // A process that is gone, or was never ours to read, has no
        // children to add.
        stack.extend(children_of(p).unwrap_or_default());
    }
    out
}

/// Whether the process is alive: not a zombie, or a zombie thread-group
/// leader whose other threads still run (a main thread that called
/// `pthread_exit` shows as `Z` until the last thread ends; a signal to its
/// pid still reaches the group).
fn alive(st: &ProcStat) -> bool {
    st.state != 'Z'
        || std::fs::read_dir(format!("/proc/{}/task", st.pid)).is_ok_and(|d| d.count() > 1)
}

/// [`descendants`] from one scan of every process in /proc.
fn descendants_by_scan(root: i32) -> Vec<i32> {
    let mut children: HashMap<i32, Vec<ProcStat>> = HashMap::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<i32>().ok())
            else {
                continue;
            };
            if let Some(st) = read_stat(pid) {
                children.entry(st.ppid).or_default().push(st);
            }
        }
    }
    let mut out = Vec::new();
    let mut stack = vec![root];
    while let Some(p) = stack.pop() {
        for c in children.get(&p).into_iter().flatten() {
            stack.push(c.pid);
            if alive(c) {
                out.push(c.pid);
            }
        }
    }
    out
}

/// Reaps every exited child of this process without blocking; returns the
/// statuses reaped.
pub fn reap_all() -> Vec<WaitStatus> {
    let mut out = Vec::new();
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(_) => return out,
            Ok(status) => out.push(status),
        }
    }
}

/// Sends `sig` to every live descendant of `root`; returns how many.
pub fn signal_tree(root: i32, sig: Signal) -> u32 {
    let mut n = 0;
    for pid in descendants(root) {
        if kill(Pid::from_raw(pid), sig).is_ok() {
            n += 1;
        }
    }
    n
}

/// SIGKILLs the whole tree below `root` until nothing is left, reaping as
/// it goes; returns the number of processes killed and the statuses reaped
/// along the way (the caller may be waiting for one of them). Gives up
/// after `deadline` (a process in uninterruptible sleep can outlast it).
pub fn kill_tree(root: i32, deadline: Duration) -> (u32, Vec<WaitStatus>) {
    let start = Instant::now();
    let mut killed = std::collections::HashSet::new();
    let mut reaped = Vec::new();
    loop {
        let pids = descendants(root);
        reaped.extend(reap_all());
        if pids.is_empty() || start.elapsed() > deadline {
            return (killed.len() as u32, reaped);
        }
        for pid in pids {
            if kill(Pid::from_raw(pid), Signal::SIGKILL).is_ok() {
                killed.insert(pid);
            }
        }
        std::thread::sleep(Duration::from_millis(1));
        reaped.extend(reap_all());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    extern "C" fn sleep_long(_: *mut libc::c_void) -> *mut libc::c_void {
        // SAFETY: sleep has no memory effects.
        unsafe { libc::sleep(60) };
        std::ptr::null_mut()
    }

    #[test]
    fn a_zombie_leader_whose_threads_still_run_is_a_live_descendant() {
        // SAFETY: the child only calls pthread_create, exit(2) and _exit
        // (no allocation, no lock the parent's threads might hold).
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: a thread running `sleep_long`, then the main thread
            // ends on its own with the raw exit(2) (pthread_exit would
            // unwind through the test harness): the process shows as `Z`
            // while the other thread runs.
            unsafe {
                let mut t: libc::pthread_t = std::mem::zeroed();
                if libc::pthread_create(&mut t, std::ptr::null(), sleep_long, std::ptr::null_mut())
                    != 0
                {
                    libc::_exit(1);
                }
                libc::syscall(libc::SYS_exit, 0);
                libc::_exit(1);
            }
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while read_stat(pid).is_none_or(|st| st.state != 'Z') {
            assert!(
                std::time::Instant::now() < deadline,
                "the leader never exited"
            );
            std::thread::yield_now();
        }
        let me = nix::unistd::getpid().as_raw();
        assert!(
            descendants(me).contains(&pid),
            "counted as gone while its thread runs"
        );
        // A signal to the leader's pid ends the group; then it is gone.
        kill(Pid::from_raw(pid), Signal::SIGKILL).unwrap();
        waitpid(Pid::from_raw(pid), None).unwrap();
        assert!(!descendants(me).contains(&pid));
    }

    #[test]
    fn parses_stat_with_awkward_command_names() {
        let line = "1234 (a) b (c)) S 1 1234 1234 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 987654 1000 10 0";
        let st = parse_stat(line).unwrap();
        assert_eq!(st.pid, 1234);
        assert_eq!(st.state, 'S');
        assert_eq!(st.ppid, 1);
        assert_eq!(st.start_ticks, 987654);
    }

    #[test]
    fn descendants_are_found_down_the_tree_and_match_a_full_scan() {
        // sh → (sleep, sh → sleep): children and a grandchild.
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & sh -c 'sleep 30 & wait' & wait"])
            .spawn()
            .unwrap();
        let root = child.id() as i32;
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut found = descendants(root);
        while found.len() < 3 {
            assert!(Instant::now() < deadline, "tree never grew: {found:?}");
            std::thread::sleep(Duration::from_millis(5));
            found = descendants(root);
        }
        let mut by_walk = found.clone();
        by_walk.sort();
        let mut by_scan = descendants_by_scan(root);
        by_scan.sort();
        assert_eq!(by_walk, by_scan);
        assert_eq!(by_walk.len(), 3, "{by_walk:?}");
        for p in by_walk.iter().chain([&root]) {
            let _ = kill(Pid::from_raw(*p), Signal::SIGKILL);
        }
        let _ = child.wait();
    }

    #[test]
    fn own_stat_is_readable() {
        let me = std::process::id() as i32;
        let st = read_stat(me).unwrap();
        assert_eq!(st.pid, me);
        assert!(st.start_ticks > 0);
    }
}
