//! A state dir written in run.json format 1 (tests/fixtures/state-v1.tar.gz,
//! made by tests/fixtures/make-state-v1 with the binaries of that format)
//! is read whole by this daemon: every run listed with its state and
//! exit, its log readable, each pending notice delivered once and a
//! taken one not again, the session's recent files kept.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use subagentd_e2e::{is_root, runnable, wait_until, Conn, Daemon, DaemonOpts};

/// Where the fixture was made: its records name absolute paths there.
const ROOT: &str = "/tmp/subagentd-state-v1";

fn unpack() {
    let root = Path::new(ROOT);
    let _ = std::fs::remove_dir_all(root);
    std::fs::create_dir_all(root).unwrap();
    let tarball = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/state-v1.tar.gz");
    let st = Command::new("tar")
        .arg("-C")
        .arg(root)
        .arg("-xzf")
        .arg(&tarball)
        .status()
        .unwrap();
    assert!(st.success(), "unpacking {}", tarball.display());
}

fn by_state(runs: &[Value], state: &str) -> Value {
    runs.iter()
        .find(|r| r["state"] == state)
        .cloned()
        .unwrap_or_else(|| panic!("no {state} run in {runs:?}"))
}

#[test]
fn a_format_1_state_dir_is_read_whole() {
    if !runnable(
        is_root(),
        "root",
        "the fixture's sessions are root's (made by a root daemon)",
    ) {
        return;
    }
    unpack();
    let root = Path::new(ROOT);
    let socket = root.join("sock");
    let mut child =
        Daemon::spawn_process(&socket, &root.join("state"), root, &DaemonOpts::default());
    wait_until(Duration::from_secs(20), "the daemon to answer", || {
        Conn::try_connect(&socket).is_some_and(|mut c| c.call("ping", json!({})).is_ok())
    });
    let mut c = Conn::connect(&socket);

    let a = c
        .call("list_agent_runs", json!({"session_id": "fx-a"}))
        .unwrap();
    let runs = a["runs"].as_array().unwrap().clone();
    assert_eq!(runs.len(), 4, "{a}");
    let ok = by_state(&runs, "succeeded");
    assert_eq!(ok["exit_code"], 0);
    assert_eq!(by_state(&runs, "failed")["exit_code"], 3);
    assert_eq!(by_state(&runs, "timed_out")["signal"], 9);
    assert_eq!(
        by_state(&runs, "cancelled")["reason"],
        "cancelled on request"
    );
    let log = std::fs::read_to_string(ok["log_path"].as_str().unwrap()).unwrap();
    assert!(log.contains("hello"), "{log}");
    let artifact = Path::new(ok["artifact_dir"].as_str().unwrap()).join("out.txt");
    assert_eq!(std::fs::read_to_string(artifact).unwrap(), "made\n");
    assert!(Path::new(ok["result_path"].as_str().unwrap()).is_file());

    let b = c
        .call("list_agent_runs", json!({"session_id": "fx-b"}))
        .unwrap();
    assert_eq!(b["runs"].as_array().unwrap().len(), 1, "{b}");

    let taken = c
        .call("take_notices", json!({"session_id": "fx-a"}))
        .unwrap();
    assert_eq!(taken["notices"].as_array().unwrap().len(), 4, "{taken}");
    let again = c
        .call("take_notices", json!({"session_id": "fx-a"}))
        .unwrap();
    assert_eq!(again["notices"], json!([]));
    let b_notices = c
        .call("take_notices", json!({"session_id": "fx-b"}))
        .unwrap();
    assert_eq!(
        b_notices["notices"],
        json!([]),
        "fx-b's notice was taken before"
    );

    let wc = c
        .call("working_context", json!({"session_id": "fx-a"}))
        .unwrap();
    assert!(
        wc.to_string()
            .contains("/tmp/subagentd-state-v1/project/notes.md"),
        "the recent files are kept: {wc}"
    );
    let _ = child.kill();
    let _ = child.wait();
}
