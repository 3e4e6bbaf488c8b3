//! Spawn latency: from sending spawn_agent to the workload's first
//! instruction inside the fully applied sandbox, and to the finished
//! notice; against a plain fork/exec and bubblewrap of the same workload,
//! in the same loop.

use crate::pct;
use crate::workload::now_ns;
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use subagentd_e2e::{session, Daemon, DaemonOpts};

fn stats(v: &[f64]) -> Value {
    json!({"p50": pct(v, 50.0), "p90": pct(v, 90.0), "p99": pct(v, 99.0), "n": v.len()})
}

fn read_ns(p: &Path) -> u128 {
    std::fs::read_to_string(p).unwrap().trim().parse().unwrap()
}

pub fn bench(quick: bool) -> Value {
    let n = if quick { 40 } else { 500 };
    let me = std::env::current_exe().unwrap();
    let d = Daemon::start_with(DaemonOpts {
        max_concurrent: Some(4),
        ..crate::daemon_opts()
    });
    let mut sub = d.conn();
    sub.call("subscribe", json!({})).unwrap();
    let mut c = d.conn();
    let s = session("bench-spawn");
    let scratch = tempfile::Builder::new()
        .prefix("sa-bench-")
        .tempdir_in("/tmp")
        .unwrap();
    let bwrap = Command::new("bwrap")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let (mut exec, mut notice, mut plain, mut bw) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut steps: std::collections::BTreeMap<String, Vec<f64>> = Default::default();
    for _ in 0..n {
        // Ours: spawn_agent → the workload's stamp, → the notice.
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
        let t_notice = now_ns();
        let st = c.call("check_agent_run", json!({"run_id": run})).unwrap();
        let stamp = read_ns(&Path::new(st["artifact_dir"].as_str().unwrap()).join("stamp"));
        exec.push((stamp - t0) as f64 / 1e6);
        let exit: Value = serde_json::from_slice(
            &std::fs::read(
                Path::new(st["log_path"].as_str().unwrap())
                    .parent()
                    .unwrap()
                    .join("exit.json"),
            )
            .unwrap(),
        )
        .unwrap();
        for (k, v) in exit["setup_us"].as_object().into_iter().flatten() {
            steps
                .entry(k.clone())
                .or_default()
                .push(v.as_f64().unwrap_or(0.0) / 1000.0);
        }
        notice.push((t_notice - t0) as f64 / 1e6);
        // Plain fork/exec.
        let f = scratch.path().join("plain");
        let t0 = now_ns();
        assert!(Command::new(&me)
            .arg("--stamp")
            .arg(&f)
            .status()
            .unwrap()
            .success());
        plain.push((read_ns(&f) - t0) as f64 / 1e6);
        // bubblewrap.
        if bwrap {
            let f = scratch.path().join("bwrap");
            let t0 = now_ns();
            let ok = Command::new("bwrap")
                .args(crate::BWRAP_ARGS)
                .arg("--bind")
                .arg(scratch.path())
                .arg(scratch.path())
                .arg(&me)
                .arg("--stamp")
                .arg(&f)
                .status()
                .unwrap()
                .success();
            if ok {
                bw.push((read_ns(&f) - t0) as f64 / 1e6);
            }
        }
    }
    let ours = stats(&exec);
    let p = stats(&plain);
    let setup: serde_json::Map<String, Value> = steps
        .iter()
        .map(|(k, v)| (k.clone(), json!(pct(v, 50.0))))
        .collect();
    let mut out = json!({
        "n": n,
        "setup_p50_ms": setup,
        "ours_exec": ours,
        "ours_notice": stats(&notice),
        "plain": p,
        "ratio_plain": pct(&exec, 50.0) / pct(&plain, 50.0),
        "bwrap": if bw.is_empty() { json!({"note": "bwrap is not installed or failed"}) } else { stats(&bw) },
    });
    if !bw.is_empty() {
        out["ratio_bwrap"] = json!(pct(&exec, 50.0) / pct(&bw, 50.0));
    }
    drop((c, sub));
    crate::retire_daemon(d);
    crate::retire(scratch);
    out
}
