//! A run's processes as `/proc` shows them: the runner's descendants,
//! walked through `/proc/<pid>/task/<tid>/children`, each checked to still
//! be the child of the process it was found under, their CPU time and
//! resident memory summed. The walk visits at most a bound of tasks (the
//! run's process limit), so a run cannot make one call expensive.

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::io::Read;
use std::path::Path;

/// The largest `/proc/<pid>/stat` read (a few hundred bytes in practice).
const STAT_MAX: u64 = 4096;
/// The largest `children` file read (one pid per child, space-separated).
const CHILDREN_MAX: u64 = 64 * 1024;
/// The largest cgroup counter read.
const COUNTER_MAX: u64 = 64;
/// Tasks walked at most, whatever the run's process limit says.
pub const WALK_CAP: usize = 4096;

/// A live run's usage now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sample {
    /// CPU time (user and system) of its processes, and of their children
    /// already reaped, in milliseconds.
    pub cpu_ms: u64,
    /// Its memory cgroup's charge where it has one, else the sum of its
    /// processes' resident memory.
    pub memory_bytes: u64,
    /// Its processes found (the runner not counted).
    pub processes: u64,
}

/// One process's share of a sample, from its stat line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Usage {
    ppid: i32,
    start_ticks: u64,
    /// utime + stime + cutime + cstime, in clock ticks.
    ticks: u64,
    /// Resident pages.
    rss_pages: u64,
}

/// Parses `/proc/<pid>/stat`: fields are counted after the last `)`, since
/// the command name (the child's to choose) may hold spaces and `)`.
fn parse_usage(text: &str) -> Option<Usage> {
    let close = text.rfind(')')?;
    let fields: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    // fields[0] is field 3 (state): field N is fields[N - 3].
    let num = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    let ticks = [14, 15, 16, 17]
        .iter()
        .try_fold(0u64, |acc, &n| Some(acc.saturating_add(num(n)?)))?;
    Some(Usage {
        ppid: fields.get(1)?.parse().ok()?,
        start_ticks: num(22)?,
        ticks,
        rss_pages: num(24)?,
    })
}

/// At most `max` bytes of a `/proc` or cgroup file; `None` when it is gone
/// or unreadable.
fn read_bounded(path: &Path, max: u64) -> Option<String> {
    let f = std::fs::File::open(path).ok()?;
    let mut buf = String::new();
    f.take(max).read_to_string(&mut buf).ok()?;
    Some(buf)
}

fn usage_of(pid: i32) -> Option<Usage> {
    parse_usage(&read_bounded(
        Path::new(&format!("/proc/{pid}/stat")),
        STAT_MAX,
    )?)
}

/// The children of every thread of `pid`, each with `pid` as the parent
/// it was found under; `budget` counts the threads read.
fn children(pid: i32, budget: &mut usize, out: &mut VecDeque<(i32, i32)>) {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return;
    };
    for task in tasks.flatten() {
        if *budget == 0 {
            return;
        }
        *budget -= 1;
        let Some(text) = read_bounded(&task.path().join("children"), CHILDREN_MAX) else {
            continue;
        };
        let found = text.split_whitespace().filter_map(|p| p.parse().ok());
        out.extend(found.map(|child| (child, pid)));
    }
}

/// Clock ticks per second and the page size, as the kernel counts them.
fn units() -> (u64, u64) {
    use nix::unistd::{sysconf, SysconfVar};
    let get = |v, default| {
        sysconf(v)
            .ok()
            .flatten()
            .and_then(|n| u64::try_from(n).ok())
            .filter(|&n| n > 0)
            .unwrap_or(default)
    };
    (
        get(SysconfVar::CLK_TCK, 100),
        get(SysconfVar::PAGE_SIZE, 4096),
    )
}

/// The memory charged to a run's memory cgroup (`dir`, v2 or not).
pub fn cgroup_memory(dir: &Path, v2: bool) -> Option<u64> {
    let file = if v2 {
        "memory.current"
    } else {
        "memory.usage_in_bytes"
    };
    read_bounded(&dir.join(file), COUNTER_MAX)?
        .trim()
        .parse()
        .ok()
}

/// A sample of the processes under the runner `runner` (whose start time
/// must be `start_ticks`, so a reused pid is not taken for it), walking at
/// most `max_tasks` tasks (capped at [`WALK_CAP`]). `None` when the runner
/// is gone or is another process now.
pub fn sample(runner: i32, start_ticks: Option<u64>, max_tasks: usize) -> Option<Sample> {
    let root = usage_of(runner)?;
    if start_ticks.is_some_and(|t| t != root.start_ticks) {
        return None;
    }
    let (hz, page) = units();
    let mut budget = max_tasks.min(WALK_CAP);
    let mut queue = VecDeque::new();
    children(runner, &mut budget, &mut queue);
    let (mut ticks, mut pages, mut processes) = (0u64, 0u64, 0u64);
    while let Some((pid, parent)) = queue.pop_front() {
        if budget == 0 {
            break;
        }
        budget -= 1;
        // Gone, or a new process under a reused pid: not the run's.
        let Some(u) = usage_of(pid).filter(|u| u.ppid == parent) else {
            continue;
        };
        ticks = ticks.saturating_add(u.ticks);
        pages = pages.saturating_add(u.rss_pages);
        processes += 1;
        children(pid, &mut budget, &mut queue);
    }
    Some(Sample {
        cpu_ms: ticks.saturating_mul(1000) / hz,
        memory_bytes: pages.saturating_mul(page),
        processes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_with_an_awkward_name_parses() {
        // pid (comm) state ppid ... utime=14 stime=15 cutime=16 cstime=17 ... start=22 vsize=23 rss=24
        let line = "77 (x) S (y)) R 5 77 77 0 -1 0 0 0 0 0 100 20 3 4 20 0 1 0 4242 1000 55 18446744073709551615";
        let u = parse_usage(line).unwrap();
        assert_eq!(
            u,
            Usage {
                ppid: 5,
                start_ticks: 4242,
                ticks: 127,
                rss_pages: 55
            }
        );
        assert_eq!(parse_usage("12 (short) S 1 2"), None);
        assert_eq!(parse_usage("no parenthesis"), None);
    }

    #[test]
    fn samples_this_process_and_its_child() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let me = std::process::id() as i32;
        let start = usage_of(me).unwrap().start_ticks;
        // Until the child has exec'd sleep, it may hold no pages of its own.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let s = loop {
            let s = sample(me, Some(start), 64).unwrap();
            if s.memory_bytes > 0 || std::time::Instant::now() > deadline {
                break s;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        assert!(s.processes >= 1, "{s:?}");
        assert!(s.memory_bytes > 0, "{s:?}");
        assert_eq!(sample(me, Some(start + 1), 64), None, "another start time");
        assert_eq!(
            sample(me, Some(start), 0),
            Some(Sample::default()),
            "nothing walked"
        );
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
