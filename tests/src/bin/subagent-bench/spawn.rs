//! Spawn latency: from sending spawn_agent to the workload's first
//! instruction inside the fully applied sandbox, and to the finished
//! notice; against a plain fork/exec and bubblewrap of the same workload,
//! in the same loop.

use crate::paced::{bwrap, ours, read_ns};
use crate::pct;
use crate::workload::now_ns;
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use subagentd_e2e::{session, Daemon, DaemonOpts};

fn stats(v: &[f64]) -> Value {
    json!({"p50": pct(v, 50.0), "p90": pct(v, 90.0), "p99": pct(v, 99.0), "n": v.len()})
}

/// A plain fork/exec of the stamp workload: start → its first instruction
/// in ms.
fn plain(scratch: &Path) -> f64 {
    let me = std::env::current_exe().unwrap();
    let f = scratch.join("plain");
    let t0 = now_ns();
    assert!(Command::new(&me)
        .arg("--stamp")
        .arg(&f)
        .status()
        .unwrap()
        .success());
    (read_ns(&f) - t0) as f64 / 1e6
}

pub fn bench(quick: bool) -> Value {
    let n = if quick { 40 } else { 500 };
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
    let (mut exec, mut notice, mut plains, mut bw) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut steps: std::collections::BTreeMap<String, Vec<f64>> = Default::default();
    for _ in 0..n {
        let o = ours(&mut c, &mut sub, &s);
        exec.push(o.exec);
        notice.push(o.notice);
        for (k, v) in o.exit["setup_us"].as_object().into_iter().flatten() {
            steps
                .entry(k.clone())
                .or_default()
                .push(v.as_f64().unwrap_or(0.0) / 1000.0);
        }
        plains.push(plain(scratch.path()));
        if let Some((e, _)) = bwrap(scratch.path()) {
            bw.push(e);
        }
    }
    let setup: serde_json::Map<String, Value> = steps
        .iter()
        .map(|(k, v)| (k.clone(), json!(pct(v, 50.0))))
        .collect();
    let mut out = json!({
        "n": n,
        "setup_p50_ms": setup,
        "ours_exec": stats(&exec),
        "ours_notice": stats(&notice),
        "plain": stats(&plains),
        "ratio_plain": pct(&exec, 50.0) / pct(&plains, 50.0),
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
