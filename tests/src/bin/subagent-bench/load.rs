//! Throughput (trivial children from 16 connections at max_concurrent 32,
//! spawn to notice) and memory (the daemon idle and with many sleepers; each
//! runner).

use serde_json::{json, Value};
use std::time::Instant;
use subagentd_e2e::sleepers::{rss_kib, Sleepers};
use subagentd_e2e::{session, Conn, Daemon, DaemonOpts};

fn rss_mib(pid: i32) -> f64 {
    rss_kib(pid) as f64 / 1024.0
}

/// CPU time the whole host has spent busy (user, nice, system, irq,
/// softirq) since boot, in ms, from /proc/stat: divided by the runs of a
/// throughput test, it is what one run costs on all processes together
/// (supervisor, runner, child, kernel threads and the harness's clients).
fn busy_ms() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let jiffies: Vec<f64> = stat
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq ...
    let busy: f64 = [0, 1, 2, 5, 6].iter().filter_map(|&i| jiffies.get(i)).sum();
    // SAFETY: sysconf only reads a constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    busy * 1000.0 / hz
}

/// Runs per second and host CPU ms per run.
struct Rate {
    per_s: f64,
    cpu_ms: f64,
}

fn throughput(runs: usize) -> Rate {
    let d = Daemon::start_with(DaemonOpts {
        max_concurrent: Some(32),
        ..crate::daemon_opts()
    });
    let mut sub = d.conn();
    sub.call("subscribe", json!({})).unwrap();
    let socket = d.socket.clone();
    let per = runs / 16;
    let cpu0 = busy_ms();
    let t0 = Instant::now();
    let workers: Vec<_> = (0..16)
        .map(|w| {
            let socket = socket.clone();
            std::thread::spawn(move || {
                let mut c = Conn::connect(&socket);
                let s = session(&format!("bench-tp{w}"));
                for _ in 0..per {
                    c.spawn(&s, &["/bin/true"], json!({}));
                }
            })
        })
        .collect();
    let mut seen = 0;
    while seen < per * 16 {
        if sub.read_msg().unwrap()["method"] == "agent_run_finished" {
            seen += 1;
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let cpu = busy_ms() - cpu0;
    for w in workers {
        w.join().unwrap();
    }
    drop(sub);
    crate::retire_daemon(d);
    Rate {
        per_s: (per * 16) as f64 / secs,
        cpu_ms: cpu / (per * 16) as f64,
    }
}

fn memory(sleepers: usize) -> (f64, f64, f64) {
    let d = Daemon::start_with(DaemonOpts {
        max_concurrent: Some(sleepers),
        ..crate::daemon_opts()
    });
    let idle = rss_mib(d.pid());
    let mut c = d.conn();
    let sl = Sleepers::start(
        &mut c,
        &session("bench-mem"),
        sleepers,
        std::time::Duration::from_secs(300),
    );
    let with = rss_mib(d.pid());
    let runner_kib: Vec<f64> = runner_pids(&mut c, &sl.runs, d.pid())
        .into_iter()
        .map(|pid| rss_kib(pid) as f64)
        .collect();
    sl.release(&mut c);
    let mean = runner_kib.iter().sum::<f64>() / runner_kib.len().max(1) as f64 / 1024.0;
    drop(c);
    crate::retire_daemon(d);
    (idle, with, mean)
}

/// The runners' pids: from each run's run.json where the run folder has
/// one, else the daemon's children that are runners (a runner is
/// started by the daemon itself, and the run's init is the runner's).
fn runner_pids(c: &mut Conn, runs: &[String], daemon: i32) -> Vec<i32> {
    let from_records: Vec<i32> = runs
        .iter()
        .filter_map(|r| {
            let st = c.call("check_agent_run", json!({"run_id": r})).unwrap();
            let dir = std::path::Path::new(st["log_path"].as_str()?).parent()?;
            let rec: Value = subagentd_e2e::stored_run(dir)?;
            rec["runner_pid"].as_i64().map(|p| p as i32)
        })
        .collect();
    if !from_records.is_empty() {
        return from_records;
    }
    let stat = |pid: i32| std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| {
            let s = stat(pid);
            let Some((name, rest)) = s.split_once(" (").and_then(|(_, r)| r.rsplit_once(") "))
            else {
                return false;
            };
            name == "subagent-runner"
                && rest.split_whitespace().nth(1) == Some(daemon.to_string().as_str())
        })
        .collect()
}

/// The same number of `argv` runs from 32 threads, in runs per second
/// (the references for throughput: a plain fork/exec and bubblewrap);
/// `None` when the program cannot be run.
fn fork_exec_throughput(runs: usize, argv: &[&str]) -> Option<Rate> {
    let run = || {
        std::process::Command::new(argv[0])
            .args(&argv[1..])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !run() {
        return None;
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let cpu0 = busy_ms();
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..32 {
            s.spawn(|| {
                while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < runs {
                    assert!(run(), "{argv:?} failed");
                }
            });
        }
    });
    Some(Rate {
        per_s: runs as f64 / t0.elapsed().as_secs_f64(),
        cpu_ms: (busy_ms() - cpu0) / runs as f64,
    })
}

pub fn bench(quick: bool) -> Value {
    let (runs, sleepers) = if quick { (320, 50) } else { (2000, 500) };
    let ours = throughput(runs);
    let plain = fork_exec_throughput(runs, &["/bin/true"]);
    let mut bwrap_argv = vec!["bwrap"];
    bwrap_argv.extend(crate::BWRAP_ARGS);
    bwrap_argv.push("/bin/true");
    let bwrap = fork_exec_throughput(runs, &bwrap_argv);
    let (idle, with, runner) = memory(sleepers);
    json!({"runs": runs, "runs_per_s": ours.per_s, "cpu_ms_per_run": ours.cpu_ms,
           "plain_runs_per_s": plain.as_ref().map(|r| r.per_s),
           "plain_cpu_ms_per_run": plain.as_ref().map(|r| r.cpu_ms),
           "bwrap_runs_per_s": bwrap.as_ref().map(|r| r.per_s),
           "bwrap_cpu_ms_per_run": bwrap.as_ref().map(|r| r.cpu_ms),
           "ratio_bwrap": bwrap.as_ref().map(|b| ours.per_s / b.per_s),
           "sleepers": sleepers, "daemon_idle_mib": idle, "daemon_sleepers_mib": with, "runner_mean_mib": runner})
}
