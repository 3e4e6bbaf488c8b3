//! Paced spawns: what a parent agent meets. A parent spawns, thinks and
//! spawns again; the kernel's caches and locks are then cold in a way a
//! back-to-back loop never sees. One spawn every [`PAUSE`], from
//! `spawn_agent` to the workload's first instruction and to the finished
//! notice; bubblewrap started at the same pace, to the workload's first
//! instruction and to its exit.

use crate::pct;
use crate::workload::now_ns;
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use subagentd_e2e::{session, Daemon};

/// The pause between two spawns.
pub const PAUSE: Duration = Duration::from_millis(100);

fn stats(v: &[f64]) -> Value {
    json!({"p50": pct(v, 50.0), "p90": pct(v, 90.0), "n": v.len()})
}

pub fn read_ns(p: &Path) -> u128 {
    std::fs::read_to_string(p).unwrap().trim().parse().unwrap()
}

/// One spawn of ours: spawn → exec and spawn → notice in ms, and the
/// run's exit.json (null when the run folder no longer has one).
pub struct Spawned {
    pub exec: f64,
    pub notice: f64,
    pub exit: Value,
}

/// Spawns the stamp workload on `c` and waits for its notice on `sub`.
pub fn ours(c: &mut subagentd_e2e::Conn, sub: &mut subagentd_e2e::Conn, s: &str) -> Spawned {
    let me = std::env::current_exe().unwrap();
    let t0 = now_ns();
    let r = c
        .call(
            "spawn_agent",
            json!({"session": {"id": s, "audience": "personal", "project_dir": "/tmp"}, "task": "bench",
                   "command": [me, "--stamp", "-"]}),
        )
        .unwrap();
    let run = r["run_id"].as_str().unwrap().to_owned();
    loop {
        let m = sub.read_msg().unwrap();
        if m["params"]["run_id"] == run.as_str() {
            break;
        }
    }
    let notice = (now_ns() - t0) as f64 / 1e6;
    let st = c.call("check_agent_run", json!({"run_id": run})).unwrap();
    let stamp = read_ns(&Path::new(st["artifact_dir"].as_str().unwrap()).join("stamp"));
    let log = Path::new(st["log_path"].as_str().unwrap());
    // exit.json is the runner's; a daemon may remove it once the run is
    // recorded, and then its setup times are not shown.
    let exit = std::fs::read(log.with_file_name("exit.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null);
    Spawned {
        exec: (stamp - t0) as f64 / 1e6,
        notice,
        exit,
    }
}

/// bubblewrap: (start → exec, start → exit) in ms, or None when it is
/// missing or failed.
pub fn bwrap(scratch: &Path) -> Option<(f64, f64)> {
    let me = std::env::current_exe().unwrap();
    let f = scratch.join("bwrap");
    let t0 = now_ns();
    let ok = Command::new("bwrap")
        .args(crate::BWRAP_ARGS)
        .arg("--bind")
        .arg(scratch)
        .arg(scratch)
        .arg(&me)
        .arg("--stamp")
        .arg(&f)
        .status()
        .ok()?
        .success();
    let end = (now_ns() - t0) as f64 / 1e6;
    ok.then(|| ((read_ns(&f) - t0) as f64 / 1e6, end))
}

pub fn bench(quick: bool) -> Value {
    let n = if quick { 10 } else { 60 };
    let d = Daemon::start_with(crate::daemon_opts());
    let mut sub = d.conn();
    sub.call("subscribe", json!({})).unwrap();
    let mut c = d.conn();
    let s = session("bench-paced");
    let scratch = tempfile::Builder::new()
        .prefix("sa-bench-")
        .tempdir_in("/tmp")
        .unwrap();
    let (mut exec, mut notice, mut bw_exec, mut bw_end) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    // Alternating, each at the pace, so that both meet the same host.
    for _ in 0..n {
        let o = ours(&mut c, &mut sub, &s);
        exec.push(o.exec);
        notice.push(o.notice);
        std::thread::sleep(PAUSE);
        if let Some((e, end)) = bwrap(scratch.path()) {
            bw_exec.push(e);
            bw_end.push(end);
        }
        std::thread::sleep(PAUSE);
    }
    // The two steps of each spawn: to the agent's exec, and from it to
    // the notice (the run's end and its records) or to bwrap's exit.
    let after = |end: &[f64], exec: &[f64]| -> Vec<f64> {
        end.iter().zip(exec).map(|(e, x)| e - x).collect()
    };
    let mut out = json!({
        "n": n,
        "pause_ms": PAUSE.as_millis() as u64,
        "ours_exec": stats(&exec),
        "ours_notice": stats(&notice),
        "ours_exec_to_notice": stats(&after(&notice, &exec)),
    });
    if !bw_end.is_empty() {
        out["bwrap_exec"] = stats(&bw_exec);
        out["bwrap_exit"] = stats(&bw_end);
        out["bwrap_exec_to_exit"] = stats(&after(&bw_end, &bw_exec));
        out["ratio_notice"] = json!(pct(&notice, 50.0) / pct(&bw_end, 50.0));
        out["ratio_exec"] = json!(pct(&exec, 50.0) / pct(&bw_exec, 50.0));
    }
    drop((c, sub));
    crate::retire_daemon(d);
    crate::retire(scratch);
    out
}
