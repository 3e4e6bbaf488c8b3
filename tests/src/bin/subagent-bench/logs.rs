//! Log capture: a child writing to stdout in 64 KiB chunks and in short
//! lines, in MB/s into child.log, against the same child writing a file
//! directly; and `logs -f` latency from a write to its display.

use crate::pct;
use crate::workload::now_ns;
use serde_json::{json, Value};
use std::io::BufRead;
use std::process::{Command, Stdio};
use std::time::Instant;
use subagentd_e2e::{bin, session, Daemon};

fn capture(d: &Daemon, me: &std::path::Path, bytes: usize, chunk: usize) -> f64 {
    let mut c = d.conn();
    let st = {
        let r = c
            .call(
                "spawn_agent",
                json!({"session": {"id": session("bench-log"), "audience": "personal", "project_dir": "/tmp"}, "task": "t",
                       "command": [me, "--emit", bytes.to_string(), chunk.to_string()], "limits": {"output_mb": 2048}}),
            )
            .unwrap();
        c.wait(r["run_id"].as_str().unwrap())
    };
    assert_eq!(st["state"], "succeeded", "{st}");
    let len = std::fs::metadata(st["log_path"].as_str().unwrap())
        .unwrap()
        .len() as usize;
    assert_eq!(len, bytes, "the whole output reached child.log");
    let ms = |k: &str| subagentd::timefmt::parse_rfc3339_ms(st[k].as_str().unwrap()).unwrap();
    let secs = (ms("ended_at") - ms("started_at")) as f64 / 1000.0;
    bytes as f64 / 1e6 / secs.max(0.001)
}

pub fn bench(quick: bool) -> Value {
    let mb = if quick { 64 } else { 500 };
    let lines_mb = if quick { 8 } else { 100 };
    let me = std::env::current_exe().unwrap();
    let d = Daemon::start_with(crate::daemon_opts());
    let chunks = capture(&d, &me, mb * 1_000_000, 64 * 1024);
    let lines = capture(&d, &me, lines_mb * 1_000_000, 64);
    let f = tempfile::NamedTempFile::new_in("/tmp").unwrap();
    let t = Instant::now();
    assert!(Command::new(&me)
        .args(["--emit", &(mb * 1_000_000).to_string(), "65536"])
        .arg(f.path())
        .status()
        .unwrap()
        .success());
    let direct = mb as f64 / t.elapsed().as_secs_f64();
    // logs -f: the delay from a line's write to its display.
    let mut c = d.conn();
    let ticks = if quick { 10 } else { 30 };
    let run = c.spawn(
        &session("bench-follow"),
        &[me.to_str().unwrap(), "--tick", &ticks.to_string()],
        json!({}),
    );
    let mut follow = Command::new(bin("subagent"))
        .arg("--socket")
        .arg(&d.socket)
        .args(["logs", "-f", &run])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lat = Vec::new();
    for line in std::io::BufReader::new(follow.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if let Some(ns) = line
            .strip_prefix("tick ")
            .and_then(|v| v.parse::<u128>().ok())
        {
            lat.push((now_ns() - ns) as f64 / 1e6);
        }
    }
    follow.wait().unwrap();
    crate::retire_daemon(d);
    json!({"mb": mb, "chunks_mb_s": chunks, "lines_mb": lines_mb, "lines_mb_s": lines, "direct_mb_s": direct,
           "follow": {"p50": pct(&lat, 50.0), "max": pct(&lat, 100.0), "n": lat.len()}})
}
