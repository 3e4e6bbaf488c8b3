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

/// Held by each test while it uses [`ROOT`]: the fixture has one place.
static FIXTURE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Unpacks the fixture at [`ROOT`]; held until the test ends.
fn unpack() -> std::sync::MutexGuard<'static, ()> {
    let held = FIXTURE.lock().unwrap_or_else(|p| p.into_inner());
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
    held
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
    let _fixture = unpack();
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

/// The per-file format's damaged states, imported: a corrupt run.json
/// makes its run `lost` (the file kept as run.json.corrupt); a run.json
/// still `running` beside its exit.json, result.md and pending notice (a
/// crash before its last save) is finished again, its notice handed out
/// once; a draft folder is removed, a folder without a record is left as
/// it is and not listed.
#[test]
fn a_corrupt_or_unfinished_format_1_record_is_imported_lost_or_finished_once() {
    if !runnable(
        is_root(),
        "root",
        "the fixture's sessions are root's (made by a root daemon)",
    ) {
        return;
    }
    let _fixture = unpack();
    let runs = Path::new(ROOT).join("state/sessions/fx-a/runs");
    let read = |id: &str| -> Value {
        serde_json::from_slice(&std::fs::read(runs.join(id).join("run.json")).unwrap()).unwrap()
    };
    let ids: Vec<String> = std::fs::read_dir(&runs)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    let ok = ids
        .iter()
        .find(|i| read(i)["state"] == "succeeded")
        .unwrap()
        .clone();
    let bad = ids.iter().find(|i| **i != ok).unwrap().clone();
    std::fs::write(
        runs.join(&bad).join("run.json"),
        "{\"format\": 1, \"run_id\": \"trunc",
    )
    .unwrap();
    let mut rec = read(&ok);
    rec["state"] = json!("running");
    rec["finalized"] = json!(false);
    rec["exit_code"] = Value::Null;
    rec["ended_at_ms"] = Value::Null;
    rec["delta"] = Value::Null;
    std::fs::write(
        runs.join(&ok).join("run.json"),
        serde_json::to_vec(&rec).unwrap(),
    )
    .unwrap();
    let half = runs.join("20200101T000000.000000Z-00000000");
    std::fs::create_dir_all(half.join("artifacts")).unwrap();
    let draft = runs.join("20200101T000000.000001Z-00000001.tmp-0123abcd");
    std::fs::create_dir_all(draft.join("artifacts")).unwrap();

    let root = Path::new(ROOT);
    let socket = root.join("sock");
    let mut child =
        Daemon::spawn_process(&socket, &root.join("state"), root, &DaemonOpts::default());
    wait_until(Duration::from_secs(20), "the daemon to answer", || {
        Conn::try_connect(&socket).is_some_and(|mut c| c.call("ping", json!({})).is_ok())
    });
    let mut c = Conn::connect(&socket);
    let st = c.wait(&ok);
    assert_eq!(
        (&st["state"], &st["exit_code"]),
        (&json!("succeeded"), &json!(0)),
        "{st}"
    );
    // Rendered again from the record finished again (this run wrote its
    // project, so the observation is made again too).
    let md = std::fs::read_to_string(runs.join(&ok).join("result.md")).unwrap();
    assert!(
        md.contains("- state: **succeeded**\n- exit code: 0\n"),
        "{md}"
    );
    assert_eq!(md.matches("- state:").count(), 1, "{md}");
    let st = c.call("check_agent_run", json!({"run_id": bad})).unwrap();
    assert_eq!(st["state"], "lost", "{st}");
    assert!(
        st["reason"]
            .as_str()
            .unwrap()
            .contains("run.json was corrupt"),
        "{st}"
    );
    assert!(
        runs.join(&bad).join("run.json.corrupt").exists(),
        "kept for inspection"
    );
    assert!(!draft.exists(), "a draft was never answered: removed");
    assert!(half.exists(), "a folder without a record is never removed");
    let e = c
        .call(
            "check_agent_run",
            json!({"run_id": "20200101T000000.000000Z-00000000"}),
        )
        .unwrap_err();
    assert_eq!(e["code"], -32000, "{e}");
    let taken = c
        .call("take_notices", json!({"session_id": "fx-a"}))
        .unwrap();
    let taken: Vec<&str> = taken["notices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["run_id"].as_str().unwrap())
        .collect();
    assert_eq!(taken.iter().filter(|i| **i == ok).count(), 1, "{taken:?}");
    let unique: std::collections::BTreeSet<&&str> = taken.iter().collect();
    assert_eq!(unique.len(), taken.len(), "no notice twice: {taken:?}");
    let again = c
        .call("take_notices", json!({"session_id": "fx-a"}))
        .unwrap();
    assert_eq!(again["notices"], json!([]));
    let _ = child.kill();
    let _ = child.wait();
}

/// A state dir of this format whose state.db was moved away (what the
/// corrupt-database message tells an operator to do): the new, empty
/// database's import of the per-file format removes no run folder.
#[test]
fn a_database_moved_away_leaves_every_run_folder_in_place() {
    let mut d = Daemon::start();
    let mut c = d.conn();
    let s = subagentd_e2e::session("moved-away");
    let runs: Vec<String> = (0..3).map(|_| c.spawn(&s, &["true"], json!({}))).collect();
    let mut folders = Vec::new();
    for r in &runs {
        let st = c.wait(r);
        assert_eq!(st["state"], "succeeded", "{st}");
        folders.push(
            Path::new(st["log_path"].as_str().unwrap())
                .parent()
                .unwrap()
                .to_owned(),
        );
    }
    drop(c);
    d.stop();
    let state = folders[0].ancestors().nth(4).unwrap().to_owned();
    for f in ["state.db", "state.db-wal", "state.db-shm"] {
        let from = state.join(f);
        if from.exists() {
            std::fs::rename(&from, state.join(format!("{f}.moved"))).unwrap();
        }
    }
    d.restart();
    for f in &folders {
        assert!(f.join("result.md").exists(), "kept: {}", f.display());
    }
}
