//! The live view: the `sample_agent_runs` method (a busy child's CPU
//! rising, its memory, its last line, its end, the runs another uid may
//! see).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{json, Value};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use subagentd_e2e::{channel, otheruser, session, wait_until, Daemon};

/// Spawn params that end a run this test leaves behind (one that failed
/// before it let the run go).
fn bounded() -> Value {
    json!({"limits": {"wall_time_s": 120}})
}

/// A run's state over the socket.
fn state_of(d: &Daemon, run: &str) -> String {
    d.conn()
        .call("check_agent_run", json!({ "run_id": run }))
        .unwrap()["state"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// The entry of `run` in a `sample_agent_runs` result.
fn entry<'a>(result: &'a Value, run: &str) -> Option<&'a Value> {
    result["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["run_id"] == run)
}

#[test]
fn samples_show_a_busy_childs_cpu_rising_its_memory_and_its_end() {
    let d = Daemon::start();
    let s = session("sample");
    let busy = "echo busy-start; while :; do :; done";
    let run = d.conn().spawn(&s, &["/bin/sh", "-c", busy], bounded());
    let sample = |params: Value| d.conn().call("sample_agent_runs", params).unwrap();
    let mut first: Option<Value> = None;
    wait_until(
        Duration::from_secs(30),
        "a first sample with CPU time",
        || {
            let r = sample(json!({ "session_id": s }));
            first = entry(&r, &run).cloned();
            first
                .as_ref()
                .is_some_and(|e| e["sample"]["cpu_ms"].as_u64().unwrap_or(0) > 0)
        },
    );
    let first = first.unwrap();
    assert_eq!(first["state"], "running");
    assert_eq!(first["last_line"], "busy-start", "{first}");
    assert!(
        first["sample"]["memory_bytes"].as_u64().unwrap() > 0,
        "{first}"
    );
    assert!(
        first["sample"]["processes"].as_u64().unwrap() >= 1,
        "{first}"
    );
    let cpu0 = first["sample"]["cpu_ms"].as_u64().unwrap();
    wait_until(Duration::from_secs(30), "the CPU time to rise", || {
        let r = sample(json!({}));
        entry(&r, &run).is_some_and(|e| e["sample"]["cpu_ms"].as_u64().unwrap() > cpu0)
    });
    // The filters: another session, another state.
    let other = sample(json!({ "session_id": session("other") }));
    assert!(entry(&other, &run).is_none(), "{other}");
    let accepted = sample(json!({ "state": "accepted" }));
    assert!(entry(&accepted, &run).is_none(), "{accepted}");
    for bad in [json!({"session_id": "../x"}), json!({"limit": 3})] {
        let e = d.conn().call("sample_agent_runs", bad).unwrap_err();
        assert_eq!(e["code"], -32602, "{e}");
    }
    // An end stays in the samples for a while, without a sample.
    d.conn()
        .call("cancel_agent_run", json!({ "run_id": run }))
        .unwrap();
    assert_eq!(d.conn().wait(&run)["state"], "cancelled");
    let after = sample(json!({ "session_id": s }));
    let e = entry(&after, &run).unwrap_or_else(|| panic!("the end is not shown: {after}"));
    assert_eq!(e["state"], "cancelled");
    assert_eq!(e["sample"], Value::Null);
    assert_eq!(e["last_line"], "busy-start");
    assert!(after["sampled_at"].as_str().unwrap().ends_with('Z'));
}

/// One call on `socket` made by a process of `ids`: the whole response.
fn call_as(ids: (u32, u32), socket: &Path, method: &str, params: &Value) -> Value {
    let py = "import json, socket, sys\n\
s = socket.socket(socket.AF_UNIX)\n\
s.connect(sys.argv[1])\n\
req = {'jsonrpc': '2.0', 'id': 1, 'method': sys.argv[2], 'params': json.loads(sys.argv[3])}\n\
s.sendall((json.dumps(req) + '\\n').encode())\n\
print(s.makefile().readline())\n";
    let out = Command::new("/usr/bin/python3")
        .args(["-c", py])
        .arg(socket)
        .arg(method)
        .arg(params.to_string())
        .current_dir("/")
        .uid(ids.0)
        .gid(ids.1)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("{e}: {text} {}", String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn another_uid_samples_only_its_own_runs() {
    let Some(ids) = otheruser::ids_or_skip("another uid's view needs root to make a user") else {
        return;
    };
    let (d, _cfg) = otheruser::daemon_allowing(ids.0, "");
    let chan = channel();
    let go = chan.path().join("go");
    let s = session("roots");
    let wait = format!(
        "echo roots-line; until [ -e {} ]; do sleep 0.05; done",
        go.display()
    );
    let run = d.conn().spawn(&s, &["/bin/sh", "-c", &wait], bounded());
    wait_until(Duration::from_secs(20), "root's run to start", || {
        state_of(&d, &run) == "running"
    });
    let mine = d.conn().call("sample_agent_runs", json!({})).unwrap();
    assert!(entry(&mine, &run).is_some(), "root sees its run: {mine}");
    for params in [
        json!({}),
        json!({ "session_id": s }),
        json!({"state": "running"}),
    ] {
        let theirs = call_as(ids, &d.socket, "sample_agent_runs", &params);
        let runs = theirs["result"]["runs"]
            .as_array()
            .unwrap_or_else(|| panic!("{theirs}"));
        assert!(
            runs.iter()
                .all(|r| r["run_id"] != run.as_str() && r["session_id"] != s.as_str()),
            "{params}: {theirs}"
        );
    }
    std::fs::write(&go, "").unwrap();
    assert_eq!(d.conn().wait(&run)["state"], "succeeded");
}
