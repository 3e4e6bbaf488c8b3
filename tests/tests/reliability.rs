//! Reliability: crash recovery with kill -9 at several points, hostile
//! frames, socket hardening, and a full state dir.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;
use subagentd_e2e::{
    alive, bin, is_root, runnable, session, unsafe_kill, wait_until, Conn, Daemon, DaemonOpts,
};

/// A one-slot daemon busy with a run that waits until `go` exists, and
/// a run queued behind it.
struct Busy {
    d: Daemon,
    c: Conn,
    blocker: String,
    queued: String,
    go: PathBuf,
    _scratch: tempfile::TempDir,
}

/// [`Busy`] in session `name`, the queued run running `queued`.
fn one_slot_busy(name: &str, queued: &[&str]) -> Busy {
    let d = Daemon::start_with(DaemonOpts {
        max_concurrent: Some(1),
        ..Default::default()
    });
    let s = session(name);
    let scratch = subagentd_e2e::channel();
    let go = scratch.path().join("go");
    let mut c = d.conn();
    let wait = format!("while [ ! -e {} ]; do sleep 0.05; done", go.display());
    let blocker = c.spawn(&s, &["sh", "-c", &wait], json!({}));
    let queued = c.spawn(&s, queued, json!({}));
    Busy {
        d,
        c,
        blocker,
        queued,
        go,
        _scratch: scratch,
    }
}

/// A crash while a run was being made leaves its draft in
/// `<state>/drafts/`: with no record it is removed at the next start (its
/// spawn was never answered); with one (the crash came between the commit
/// and the rename) it is put in place and the run goes on.
#[test]
fn a_draft_without_its_record_goes_and_one_with_it_is_put_in_place() {
    let Busy {
        mut d,
        mut c,
        blocker,
        queued,
        go,
        _scratch,
    } = one_slot_busy("drafts", &["echo", "queued-ran"]);
    let st = c
        .call("check_agent_run", json!({"run_id": queued}))
        .unwrap();
    assert_eq!(st["state"], "accepted", "{st}");
    drop(c);
    d.stop();
    let dir = Path::new(st["log_path"].as_str().unwrap())
        .parent()
        .unwrap()
        .to_path_buf();
    let drafts = d.state.join("drafts");
    // The queued run's folder as if the crash came before its rename.
    let recorded = drafts.join(format!("{queued}.tmp-0123abcd"));
    std::fs::rename(&dir, &recorded).unwrap();
    // A draft no record names, even one whose id looks like a run's.
    let stray = drafts.join("20200101T000000.000001Z-00000001.tmp-0123abcd");
    std::fs::create_dir_all(stray.join("artifacts")).unwrap();
    d.restart();
    std::fs::write(&go, "").unwrap();
    let mut c = d.conn();
    assert_eq!(c.wait(&blocker)["state"], "succeeded");
    let st = c.wait(&queued);
    assert_eq!(st["state"], "succeeded", "{st}");
    assert!(dir.is_dir(), "the recorded draft was put in place");
    let log = std::fs::read_to_string(st["log_path"].as_str().unwrap()).unwrap();
    assert!(log.contains("queued-ran"), "{log}");
    assert!(!recorded.exists() && !stray.exists());
    assert_eq!(std::fs::read_dir(&drafts).unwrap().count(), 0);
    assert!(c
        .call(
            "check_agent_run",
            json!({"run_id": "20200101T000000.000001Z-00000001"})
        )
        .is_err());
}

/// A queued run (one slot, a long first run) survives a kill -9 of the
/// daemon: its spec is in state.db alone (no file in its folder, and the
/// daemon's memory is gone), and the restarted daemon starts it from
/// there, running its own command once the first run ends.
#[test]
fn a_queued_run_survives_kill_9_and_runs_its_own_command() {
    let Busy {
        mut d,
        mut c,
        blocker: first,
        queued,
        go,
        _scratch,
    } = one_slot_busy("queuedkill", &["sh", "-c", "echo QUEUED-OWN-COMMAND"]);
    let st = c
        .call("check_agent_run", json!({"run_id": queued}))
        .unwrap();
    assert_eq!(st["state"], "accepted", "{st}");
    let dir = Path::new(st["log_path"].as_str().unwrap())
        .parent()
        .unwrap()
        .to_path_buf();
    assert!(!dir.join("runner.json").exists(), "the spec is not a file");
    assert!(subagentd_e2e::stored_spec(&d.state, &queued).is_some());
    drop(c);
    unsafe_kill(d.pid(), libc::SIGKILL);
    d.child.wait().unwrap();
    d.restart();
    std::fs::write(&go, "").unwrap();
    let mut c = d.conn();
    assert_eq!(c.wait(&first)["state"], "succeeded");
    let st = c.wait(&queued);
    assert_eq!(st["state"], "succeeded", "{st}");
    let log = std::fs::read_to_string(st["log_path"].as_str().unwrap()).unwrap();
    assert_eq!(log, "QUEUED-OWN-COMMAND\n");
    assert!(!dir.join("runner.json").exists());
    assert_eq!(subagentd_e2e::stored_spec(&d.state, &queued), None);
}

/// A queued run whose spec is gone from state.db (the only copy) cannot
/// start: after a restart it fails, saying why, and the daemon goes on.
#[test]
fn a_queued_run_without_its_spec_fails_to_start_and_says_why() {
    let sqlite = Command::new("sqlite3").arg("-version").output();
    if !runnable(
        sqlite.is_ok_and(|o| o.status.success()),
        "sqlite3",
        "the test removes a spec with the sqlite3 shell",
    ) {
        return;
    }
    let Busy {
        mut d,
        c,
        blocker,
        queued,
        go,
        _scratch,
    } = one_slot_busy("nospec", &["sh", "-c", "echo SHOULD-NOT-RUN"]);
    drop(c);
    d.stop();
    let out = Command::new("sqlite3")
        .arg(d.state.join("state.db"))
        .arg(format!("DELETE FROM run_specs WHERE run_id = '{queued}';"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(subagentd_e2e::stored_spec(&d.state, &queued), None);
    d.restart();
    std::fs::write(&go, "").unwrap();
    let mut c = d.conn();
    assert_eq!(c.wait(&blocker)["state"], "succeeded");
    let st = c.wait(&queued);
    assert_eq!(st["state"], "failed", "{st}");
    let reason = st["reason"].as_str().unwrap();
    // When another daemon on the host leased the run's uid while this one
    // was down, the restart finds the spec missing as it gives the run a
    // new uid (protocol.md §1.6); otherwise the launch finds it missing.
    assert!(
        (reason.starts_with("could not start the runner: ")
            || reason.starts_with("could not be started after a restart: "))
            && reason.contains("state.db holds no runner spec"),
        "{reason}"
    );
    let log = std::fs::read_to_string(st["log_path"].as_str().unwrap()).unwrap_or_default();
    assert!(!log.contains("SHOULD-NOT-RUN"), "{log}");
    assert!(c.call("ping", json!({})).is_ok());
}

#[test]
fn a_uid_that_is_not_allowed_is_refused() {
    if !runnable(is_root(), "setuid", "switching to another uid needs root") {
        return;
    }
    let d = Daemon::start();
    // Open the socket's mode so the kernel lets the other uid connect:
    // the daemon's own check must then refuse it.
    std::fs::set_permissions(
        &d.socket,
        std::os::unix::fs::PermissionsExt::from_mode(0o666),
    )
    .unwrap();
    std::fs::set_permissions(
        d.dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    // The daemon answers and closes at once: the send may find the
    // connection closed already, the answer is still there to read.
    let py = "import socket, sys\ns = socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\ntry:\n\ts.sendall(b'{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\\n')\nexcept OSError:\n\tpass\nprint(s.makefile().readline())\n";
    use std::os::unix::process::CommandExt;
    let out = Command::new("/usr/bin/python3")
        .args(["-c", py])
        .arg(&d.socket)
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("{e}: {text} {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(v["error"]["code"], -32007, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("uid 65534"),
        "{v}"
    );
    assert!(d.conn().call("ping", json!({})).is_ok());
}

#[test]
fn an_idle_connection_is_closed_and_a_subscriber_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, "idle_timeout_s = 1\n").unwrap();
    let d = Daemon::start_with(DaemonOpts {
        args: vec!["--config".into(), cfg.display().to_string()],
        ..Default::default()
    });
    let mut idle = d.conn();
    let mut sub = d.conn();
    sub.call("subscribe", json!({})).unwrap();
    assert!(idle.read_msg().is_none(), "the idle connection is closed");
    // The subscriber is still served after the idle one was closed.
    let mut c = d.conn();
    let run = c.spawn(&session("idle"), &["true"], json!({}));
    c.wait(&run);
    let n = sub.read_msg().expect("the subscriber stays open");
    assert_eq!(n["params"]["run_id"], run.as_str());
}

/// A tiny deterministic generator (xorshift), so a failure reproduces.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn hostile_frame(r: &mut Rng) -> Vec<u8> {
    let mut f: Vec<u8> = match r.below(10) {
        0 => (0..r.below(200)).map(|_| r.next() as u8).filter(|&b| b != b'\n').collect(),
        1 => br#"{"jsonrpc":"2.0","id":1,"method":"spawn_agent","params":{"session":{"#.to_vec(),
        2 => format!("{}{}", "[".repeat(2000 + r.below(5000) as usize), "]".repeat(10)).into_bytes(),
        3 => format!(r#"{{"jsonrpc":"2.0","id":2,"method":"ping","params":{{"x":"{}"}}}}"#, "a".repeat(r.below(900_000) as usize)).into_bytes(),
        4 => br#"{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}"#.to_vec(),
        5 => br#"{"jsonrpc":"2.0","id":3,"method":"spawn_agent","params":{"session":{"id":5,"audience":"team","project_dir":"/"},"task":[],"command":{}}}"#.to_vec(),
        6 => format!(r#"{{"jsonrpc":"2.0","id":4,"method":"m{}"}}"#, r.next()).into_bytes(),
        7 => b"{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"ping\x00\"}".to_vec(),
        8 => vec![0xff, 0xfe, b'{', 0xc3, 0x28],
        _ => br#"{"jsonrpc":"2.0","id":6,"method":"check_agent_run","params":{"run_id":"../../../../etc/passwd"}}"#.to_vec(),
    };
    f.push(b'\n');
    f
}

#[test]
fn ten_thousand_hostile_frames_while_a_good_client_keeps_spawning() {
    let d = Daemon::start();
    let socket = d.socket.clone();
    let senders: Vec<_> = (0..6u64)
        .map(|t| {
            let socket = socket.clone();
            std::thread::spawn(move || {
                let mut r = Rng(0x9e37_79b9_7f4a_7c15 ^ (t + 1));
                let mut conn = UnixStream::connect(&socket).unwrap();
                conn.set_read_timeout(Some(Duration::from_secs(30)))
                    .unwrap();
                let (mut answered, mut closed) = (0usize, 0usize);
                for _ in 0..1700 {
                    let frame = hostile_frame(&mut r);
                    let mut reply = [0u8; 4096];
                    let ok = conn.write_all(&frame).is_ok() && {
                        // Every frame is answered with an error (a line), or the
                        // connection is closed.
                        match conn.read(&mut reply) {
                            Ok(0) | Err(_) => false,
                            Ok(_) => true,
                        }
                    };
                    if ok {
                        answered += 1;
                    } else {
                        closed += 1;
                        conn = UnixStream::connect(&socket).unwrap();
                        conn.set_read_timeout(Some(Duration::from_secs(30)))
                            .unwrap();
                    }
                }
                (answered, closed)
            })
        })
        .collect();
    // One client dribbles a valid request a byte at a time.
    let dribbler = {
        let socket = socket.clone();
        std::thread::spawn(move || {
            let mut conn = UnixStream::connect(&socket).unwrap();
            for b in b"{\"jsonrpc\":\"2.0\",\"id\":\"slow\",\"method\":\"ping\"}\n" {
                conn.write_all(&[*b]).unwrap();
                std::thread::sleep(Duration::from_millis(5));
            }
            let mut buf = String::new();
            std::io::BufReader::new(conn).read_line_into(&mut buf);
            buf
        })
    };
    let mut good = d.conn();
    let s = session("good");
    let mut runs = 0;
    while senders.iter().any(|h| !h.is_finished()) || runs < 5 {
        let run = good.spawn(&s, &["sh", "-c", "echo fine"], json!({}));
        assert_eq!(good.wait(&run)["state"], "succeeded");
        runs += 1;
    }
    let mut total = 0;
    for h in senders {
        let (answered, closed) = h.join().unwrap();
        total += answered + closed;
    }
    assert!(total >= 10_000, "{total} frames");
    assert!(dribbler.join().unwrap().contains("\"slow\""));
    assert!(alive(d.pid()));
    assert!(d.conn().call("ping", json!({})).is_ok());
}

trait ReadLineInto {
    fn read_line_into(&mut self, buf: &mut String);
}
impl<R: std::io::BufRead> ReadLineInto for R {
    fn read_line_into(&mut self, buf: &mut String) {
        let _ = self.read_line(buf);
    }
}

/// The script of crash-test child `i`: records each start of its run in
/// the project (a second start would be a duplicate), prints numbered lines, sleeps,
/// writes a delta, exits with its code.
fn crash_child(i: usize) -> (String, i32) {
    let code = if i % 5 == 4 { 3 } else { 0 };
    let sleep = ["0", "0.2", "1", "2", "3"][i % 5];
    let script = format!(
        "echo start >> \"../starts-$SUBAGENT_RUN_ID\"; for n in 1 2 3 4 5; do echo child {i} line $n; done; sleep {sleep}; echo x > f{i}.txt; echo '{{\"written\": [\"f{i}.txt\"]}}' > \"$SUBAGENT_DELTA_PATH\"; exit {code}"
    );
    (script, code)
}

#[test]
fn kill_9_of_the_daemon_at_several_points_loses_nothing() {
    let mut d = Daemon::start_with(DaemonOpts {
        max_concurrent: Some(6),
        ..Default::default()
    });
    let project = tempfile::Builder::new()
        .prefix("sa-crash-")
        .tempdir_in("/tmp")
        .unwrap();
    // Each child works in a project of its own (what it changes there is
    // observed and merged); the start counts go beside them.
    for i in 0..30 {
        std::fs::create_dir(project.path().join(format!("p{i}"))).unwrap();
    }
    let spawn_batch = |d: &Daemon, range: std::ops::Range<usize>| -> Vec<(usize, String, String)> {
        let mut c = d.conn();
        range
            .map(|i| {
                let s = session(&format!("crash{i}"));
                let (script, _) = crash_child(i);
                let r = c
                    .call(
                        "spawn_agent",
                        json!({"session": {"id": s, "audience": "personal", "project_dir": project.path().join(format!("p{i}")), "tools": ["file_write", "shell"]},
                               "task": "t", "command": ["sh", "-c", script], "sandbox": {"write_paths": [project.path()]}}),
                    )
                    .unwrap();
                (i, s, r["run_id"].as_str().unwrap().to_owned())
            })
            .collect()
    };
    // 1. Mid-spawn: kill while a thread is still spawning.
    let mut runs = spawn_batch(&d, 0..10);
    let socket = d.socket.clone();
    let project_path = project.path().to_path_buf();
    let racer = std::thread::spawn(move || {
        let mut got = Vec::new();
        let Some(mut c) = Conn::try_connect(&socket) else {
            return got;
        };
        for i in 10..20 {
            let s = session(&format!("crash{i}"));
            let (script, _) = crash_child(i);
            let params = json!({"session": {"id": s, "audience": "personal", "project_dir": project_path.join(format!("p{i}")), "tools": ["file_write", "shell"]},
                                "task": "t", "command": ["sh", "-c", script], "sandbox": {"write_paths": [&project_path]}});
            let id = 1000 + i;
            let line =
                json!({"jsonrpc": "2.0", "id": id, "method": "spawn_agent", "params": params});
            if c.send_raw(format!("{line}\n").as_bytes()).is_err() {
                break;
            }
            match c.read_msg() {
                Some(m) if m.get("result").is_some() => {
                    got.push((i, s, m["result"]["run_id"].as_str().unwrap().to_owned()))
                }
                _ => break,
            }
        }
        got
    });
    std::thread::sleep(Duration::from_millis(30));
    unsafe_kill(d.pid(), libc::SIGKILL);
    d.child.wait().unwrap();
    runs.extend(racer.join().unwrap());
    d.restart();
    // 2. Mid-run: the rest of the children, then kill while they run.
    let have: BTreeSet<usize> = runs.iter().map(|r| r.0).collect();
    let missing: Vec<usize> = (10..30).filter(|i| !have.contains(i)).collect();
    for i in missing {
        runs.extend(spawn_batch(&d, i..i + 1));
    }
    let mut c = d.conn();
    wait_until(Duration::from_secs(30), "some runs to be running", || {
        let v = c
            .call("list_agent_runs", json!({"state": "running"}))
            .unwrap();
        !v["runs"].as_array().unwrap().is_empty()
    });
    drop(c);
    unsafe_kill(d.pid(), libc::SIGKILL);
    d.child.wait().unwrap();
    d.restart();
    // 3. While runs are finishing.
    let mut c = d.conn();
    wait_until(Duration::from_secs(30), "some runs to have ended", || {
        let v = c.call("list_agent_runs", json!({})).unwrap();
        v["runs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["state"] == "succeeded")
    });
    drop(c);
    unsafe_kill(d.pid(), libc::SIGKILL);
    d.child.wait().unwrap();
    d.restart();

    assert_eq!(
        runs.len(),
        30,
        "every accepted spawn has an id: {}",
        runs.len()
    );
    let mut c = d.conn();
    let root = project.path().canonicalize().unwrap();
    for (i, s, run) in &runs {
        let st = c.wait(run);
        let (_, code) = crash_child(*i);
        let want = if code == 0 { "succeeded" } else { "failed" };
        assert_eq!(st["state"], want, "child {i}: {st}");
        assert_eq!(st["exit_code"], code, "child {i}");
        let starts = std::fs::read_to_string(root.join(format!("starts-{run}"))).unwrap();
        assert_eq!(
            starts.lines().count(),
            1,
            "child {i} started once: {starts}"
        );
        let log = std::fs::read_to_string(st["log_path"].as_str().unwrap()).unwrap();
        for n in 1..=5 {
            assert!(
                log.contains(&format!("child {i} line {n}\n")),
                "child {i}'s log is complete:\n{log}"
            );
        }
        let notices = c.call("take_notices", json!({"session_id": s})).unwrap();
        let got: Vec<&str> = notices["notices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["run_id"].as_str().unwrap())
            .collect();
        assert_eq!(got, [run.as_str()], "child {i}: one notice");
        let wc = c.call("working_context", json!({"session_id": s})).unwrap();
        let recent: Vec<&str> = wc["recent_files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_str().unwrap())
            .collect();
        if code == 0 {
            assert_eq!(
                recent,
                [root.join(format!("p{i}/f{i}.txt")).to_str().unwrap()],
                "child {i}: merged once"
            );
        } else {
            assert!(recent.is_empty(), "child {i} failed: nothing merged");
        }
        assert!(
            subagentd_e2e::pids_with(&format!("child {i} line $n")).is_empty(),
            "child {i} is gone"
        );
    }
    let again: BTreeMap<String, usize> = runs
        .iter()
        .map(|(_, s, _)| {
            (
                s.clone(),
                c.call("take_notices", json!({"session_id": s})).unwrap()["notices"]
                    .as_array()
                    .unwrap()
                    .len(),
            )
        })
        .collect();
    assert!(
        again.values().all(|&n| n == 0),
        "no notice twice: {again:?}"
    );
}

/// A daemon whose state dir is a tmpfs of `size`; `None` (after
/// `SKIPPED: …`) when this host cannot mount one.
struct TmpfsDaemon {
    state: PathBuf,
    child: std::process::Child,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl TmpfsDaemon {
    fn start(size: &str) -> Option<Self> {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir(&state).unwrap();
        let mounted = is_root()
            && Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
                .arg(&state)
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
        if !runnable(
            mounted,
            "tmpfs",
            "mounting a small tmpfs needs root and mount rights",
        ) {
            return None;
        }
        let socket = dir.path().join("s.sock");
        let child = Daemon::spawn_process(&socket, &state, dir.path(), &DaemonOpts::default());
        wait_until(Duration::from_secs(20), "the daemon", || {
            Conn::try_connect(&socket).is_some_and(|mut c| c.call("ping", json!({})).is_ok())
        });
        Some(TmpfsDaemon {
            state,
            child,
            socket,
            _dir: dir,
        })
    }
}

impl Drop for TmpfsDaemon {
    fn drop(&mut self) {
        unsafe_kill(self.child.id() as i32, libc::SIGKILL);
        let _ = self.child.wait();
        let _ = Command::new("umount").arg("-l").arg(&self.state).status();
    }
}

#[test]
fn a_full_state_dir_refuses_spawns_cleanly() {
    let Some(d) = TmpfsDaemon::start("1m") else {
        return;
    };
    let state = &d.state;
    let mut c = Conn::connect(&d.socket);
    let s = session("full");
    let big = "x".repeat(60 * 1024);
    let (mut refused, mut accepted) = (None, Vec::new());
    for _ in 0..40 {
        let r = c.call(
            "spawn_agent",
            json!({"session": {"id": s, "audience": "personal", "project_dir": "/tmp"}, "task": big, "command": ["true"]}),
        );
        match r {
            Ok(r) => accepted.push(r["run_id"].as_str().unwrap().to_owned()),
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    let e = refused.expect("the tmpfs fills up");
    assert_eq!(e["code"], -32002, "{e}");
    assert!(
        e["message"].as_str().unwrap().starts_with("state dir: "),
        "{e}"
    );
    // No half-made run: every run folder is a recorded run, and no draft
    // is left.
    for r in std::fs::read_dir(state.join("sessions").join(&s).join("runs"))
        .unwrap()
        .flatten()
    {
        assert!(
            subagentd_e2e::stored_run(&r.path()).is_some(),
            "half-made run {}",
            r.path().display()
        );
    }
    let drafts = std::fs::read_dir(state.join("drafts")).map_or(0, |d| d.count());
    assert_eq!(drafts, 0, "a draft was left");
    assert!(
        c.call("ping", json!({})).is_ok(),
        "the daemon keeps serving"
    );
    // Nothing accepted before the disk filled is lost: each is listed and
    // answers its status.
    assert!(
        !accepted.is_empty(),
        "no spawn was accepted before the refusal"
    );
    let listed = c
        .call("list_agent_runs", json!({"session_id": s, "limit": 1000}))
        .unwrap();
    let mut ids: Vec<String> = listed["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run_id"].as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    accepted.sort();
    assert_eq!(
        ids, accepted,
        "the accepted runs, and only they, are listed"
    );
    for id in &accepted {
        let st = c.call("check_agent_run", json!({"run_id": id})).unwrap();
        assert!(st["state"].is_string(), "{st}");
    }
}

#[test]
fn a_failing_log_write_is_recorded_and_the_child_runs_on() {
    let Some(d) = TmpfsDaemon::start("1m") else {
        return;
    };
    let mut c = Conn::connect(&d.socket);
    // 3 MB of output into a 1 MiB file system: the log write fails; the
    // child goes on: the run's exit status is tr's, so a writer stopped by
    // the failure (SIGPIPE or EPIPE) would fail the run.
    let run = c.spawn(
        &session("logfail"),
        &["sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' x"],
        json!({"limits": {"output_mb": 10}}),
    );
    let st = c.wait(&run);
    assert!(matches!(st["state"].as_str(), Some("succeeded")), "{st}");
    let reason = st["reason"].as_str().unwrap();
    assert!(
        reason.contains("write child.log"),
        "the log failure is recorded: {reason}"
    );
    assert!(c.call("ping", json!({})).is_ok());
}

#[test]
fn a_runner_still_starting_when_the_daemon_dies_is_watched_again() {
    let scratch = subagentd_e2e::channel();
    let wrapper = subagentd_e2e::script(
        scratch.path(),
        "slow-runner",
        &format!(
            "sleep 1.5\nexec {} \"$@\"\n",
            bin("subagent-runner").display()
        ),
    );
    let mut d = Daemon::start_with(DaemonOpts {
        args: vec!["--runner".into(), wrapper.display().to_string()],
        ..Default::default()
    });
    let ran = scratch.path().join("ran");
    let mut c = d.conn();
    let run = c.spawn(
        &session("slowrunner"),
        &["sh", "-c", &format!("echo once >> {}", ran.display())],
        json!({"sandbox": {"write_paths": [scratch.path()]}}),
    );
    drop(c);
    unsafe_kill(d.pid(), libc::SIGKILL);
    d.child.wait().unwrap();
    d.restart();
    let mut c = d.conn();
    let st = c.wait(&run);
    assert_eq!(st["state"], "succeeded", "{st}");
    assert_eq!(std::fs::read_to_string(&ran).unwrap(), "once\n");
}

/// A runner still waiting at its gate when its daemon dies ends without
/// starting anything (here a stand-in that does what the runner does then:
/// its pid in runner.lock, then cleared, exit 3). Seen alive by the next
/// start, it is watched; when it ends so, its run is queued again and runs
/// once, instead of ending `lost`.
#[test]
fn a_run_whose_runner_was_called_off_at_its_gate_is_queued_again() {
    let scratch = subagentd_e2e::channel();
    let called_off = subagentd_e2e::script(
        scratch.path(),
        "called-off-runner",
        "echo $$ > /proc/self/fd/3\nsleep 1.5\n: > /proc/self/fd/3\nexit 3\n",
    );
    let mut d = Daemon::start_with(DaemonOpts {
        args: vec!["--runner".into(), called_off.display().to_string()],
        ..Default::default()
    });
    let ran = scratch.path().join("ran");
    let mut c = d.conn();
    let run = c.spawn(
        &session("calledoff"),
        &["sh", "-c", &format!("echo once >> {}", ran.display())],
        json!({"sandbox": {"write_paths": [scratch.path()]}}),
    );
    drop(c);
    unsafe_kill(d.pid(), libc::SIGKILL);
    d.child.wait().unwrap();
    // The next daemon has the real runner.
    d.restart();
    let mut c = d.conn();
    let st = c.wait(&run);
    assert_eq!(st["state"], "succeeded", "{st}");
    assert_eq!(std::fs::read_to_string(&ran).unwrap(), "once\n");
}
