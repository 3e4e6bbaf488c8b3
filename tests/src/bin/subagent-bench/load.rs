//! Throughput (trivial children from 16 connections at max_concurrent 32,
//! spawn to notice) and memory (the daemon idle and with many sleepers; each
//! runner).

use serde_json::{json, Value};
use std::time::Instant;
use subagentd_e2e::{session, wait_until, Conn, Daemon, DaemonOpts};

fn rss_kib(pid: i32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("VmRSS:")
                    .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
            })
        })
        .unwrap_or(0.0)
}

fn throughput(runs: usize) -> f64 {
    let d = Daemon::start_with(DaemonOpts {
        max_concurrent: Some(32),
        ..Default::default()
    });
    let mut sub = d.conn();
    sub.call("subscribe", json!({})).unwrap();
    let socket = d.socket.clone();
    let per = runs / 16;
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
    for w in workers {
        w.join().unwrap();
    }
    (per * 16) as f64 / secs
}

fn memory(sleepers: usize) -> (f64, f64, f64) {
    let d = Daemon::start_with(DaemonOpts {
        max_concurrent: Some(sleepers),
        ..Default::default()
    });
    let idle = rss_kib(d.pid()) / 1024.0;
    let release = tempfile::tempdir().unwrap();
    let flag = release.path().join("go");
    let mut c = d.conn();
    let s = session("bench-mem");
    let script = format!("while [ ! -e {} ]; do sleep 0.2; done", flag.display());
    let runs: Vec<String> = (0..sleepers)
        .map(|_| {
            c.spawn(
                &s,
                &["sh", "-c", &script],
                json!({"sandbox": {"read_paths": [release.path()]}}),
            )
        })
        .collect();
    wait_until(std::time::Duration::from_secs(300), "the sleepers", || {
        c.call(
            "list_agent_runs",
            json!({"session_id": s, "state": "running"}),
        )
        .unwrap()["runs"]
            .as_array()
            .unwrap()
            .len()
            == sleepers
    });
    let with = rss_kib(d.pid()) / 1024.0;
    let mut runner_kib = Vec::new();
    for r in &runs {
        let st = c.call("check_agent_run", json!({"run_id": r})).unwrap();
        let rec: Value = serde_json::from_slice(
            &std::fs::read(
                std::path::Path::new(st["log_path"].as_str().unwrap())
                    .parent()
                    .unwrap()
                    .join("run.json"),
            )
            .unwrap(),
        )
        .unwrap();
        if let Some(pid) = rec["runner_pid"].as_i64() {
            runner_kib.push(rss_kib(pid as i32));
        }
    }
    std::fs::write(&flag, "").unwrap();
    for r in &runs {
        c.wait(r);
    }
    let mean = runner_kib.iter().sum::<f64>() / runner_kib.len().max(1) as f64 / 1024.0;
    (idle, with, mean)
}

pub fn bench(quick: bool) -> Value {
    let (runs, sleepers) = if quick { (320, 50) } else { (2000, 500) };
    let rps = throughput(runs);
    let (idle, with, runner) = memory(sleepers);
    json!({"runs": runs, "runs_per_s": rps, "sleepers": sleepers, "daemon_idle_mib": idle, "daemon_sleepers_mib": with, "runner_mean_mib": runner})
}
