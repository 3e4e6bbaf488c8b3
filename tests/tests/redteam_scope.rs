//! Red team: a uid listed in `allow_uids` goes after what root made on the
//! same daemon: it lists root's runs, checks, waits for and cancels them,
//! takes the notices of root's session, reads and changes its working
//! context, and spawns into it. A caller acts only on what is its own:
//! someone else's run answers as an unknown one, someone else's session is
//! refused, and root's run and notices stay root's. Its own session and
//! runs work fully.
//!
//! Root only (a user is made, the daemon is root's); as an ordinary user
//! every test prints `SKIPPED`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;
use subagentd_e2e::{session, wait_until, Daemon, DaemonOpts};

// The ordinary user the attacks are made as is otheruser::USER.
use subagentd_e2e::otheruser;

/// `session_not_owned`: another user's session.
const NOT_OWNED: i64 = -32008;
/// `run_not_found`.
const NOT_FOUND: i64 = -32000;

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// The test user's uid and gid, made when missing; `None` (after
/// `SKIPPED: …`) when not root or the host cannot enforce the sandbox.
fn user() -> Option<(u32, u32)> {
    otheruser::ids_or_skip("these attacks need root to make a user and a root daemon it may use")
}

/// Stops the daemon and starts it again with the same config (the
/// helper's restart would drop `allow_uids`).
fn restart(d: &mut Daemon, cfg: &tempfile::TempDir) {
    d.stop();
    let opts = DaemonOpts {
        args: vec![
            "--config".into(),
            cfg.path().join("c.toml").display().to_string(),
        ],
        ..Default::default()
    };
    d.child = Daemon::spawn_process(&d.socket, &d.state, d.dir.path(), &opts);
    d.wait_ready();
    std::fs::set_permissions(&d.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
}

/// A directory under /tmp with `mode`, owned by `owner` (root when None).
fn dir(prefix: &str, mode: u32, owner: Option<(u32, u32)>) -> tempfile::TempDir {
    let d = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/tmp")
        .unwrap();
    if let Some((u, g)) = owner {
        std::os::unix::fs::chown(d.path(), Some(u), Some(g)).unwrap();
    }
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(mode)).unwrap();
    d
}

/// A connection to the daemon made by a process of another uid: a relay
/// that sends the lines it is given and prints the lines it reads.
struct Other {
    child: Child,
    stdin: ChildStdin,
    lines: BufReader<ChildStdout>,
    next_id: u64,
    /// Notifications read while waiting for responses.
    notifications: Vec<Value>,
}

impl Other {
    fn connect(ids: (u32, u32), socket: &Path) -> Other {
        let py = r#"import socket, sys, threading
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
def pump():
    for line in s.makefile('rb'):
        sys.stdout.buffer.write(line)
        sys.stdout.flush()
    sys.stdout.close()
threading.Thread(target=pump, daemon=True).start()
for line in sys.stdin.buffer:
    s.sendall(line)
"#;
        let mut child = Command::new("/usr/bin/python3")
            .args(["-c", py])
            .arg(socket)
            .current_dir("/")
            .uid(ids.0)
            .gid(ids.1)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        Other {
            stdin: child.stdin.take().unwrap(),
            lines: BufReader::new(child.stdout.take().unwrap()),
            child,
            next_id: 1,
            notifications: Vec::new(),
        }
    }

    /// Reads one message; panics at EOF.
    fn read_msg(&mut self) -> Value {
        let mut line = String::new();
        let n = self.lines.read_line(&mut line).unwrap();
        assert!(n > 0, "the daemon closed the other uid's connection");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("bad line {line:?}: {e}"))
    }

    /// One request: its whole response message.
    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
        loop {
            let msg = self.read_msg();
            if msg.get("id") == Some(&json!(id)) {
                return msg;
            }
            assert!(msg.get("method").is_some(), "unexpected message {msg}");
            self.notifications.push(msg);
        }
    }

    /// Ok(result) or Err(error object).
    fn call(&mut self, method: &str, params: Value) -> Result<Value, Value> {
        let msg = self.request(method, params);
        match msg.get("error") {
            Some(e) => Err(e.clone()),
            None => Ok(msg["result"].clone()),
        }
    }
}

impl Drop for Other {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// spawn_agent's params: `sh -c script` in `project`, in `session`.
fn spawn_params(session: &str, project: &Path, script: &str) -> Value {
    json!({
        "session": {"id": session, "audience": "personal", "project_dir": project},
        "task": "scope",
        "command": ["/bin/sh", "-c", script],
    })
}

/// A run of root's in a new session that holds until `go` exists: its
/// session and run id.
fn roots_run(d: &Daemon, go: &Path) -> (String, String) {
    let s = session("root");
    let hold = format!("while [ ! -e {} ]; do sleep 0.05; done", go.display());
    let run = d.conn().spawn(&s, &["/bin/sh", "-c", &hold], json!({}));
    (s, run)
}

/// The error of an answer, asserting it failed with `code`.
fn refused(r: Result<Value, Value>, code: i64, what: &str) -> String {
    let e = r.expect_err(&format!("{what} was answered"));
    assert_eq!(e["code"], code, "{what}: {e}");
    e["message"].as_str().unwrap().to_owned()
}

/// Whether any run of `list` (a list_agent_runs result) is `run` or in
/// `session`.
fn lists(list: &Value, run: &str, session: &str) -> bool {
    list["runs"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["run_id"] == run || r["session_id"] == session)
}

// ---------------------------------------------------------------------------
// Attacks
// ---------------------------------------------------------------------------

#[test]
fn roots_runs_are_not_listed_to_another_uid() {
    let Some(ids) = user() else { return };
    let (d, _cfg) = otheruser::daemon_allowing(ids.0, "");
    let gate = dir("sa-scope-gate-", 0o755, None);
    let go = gate.path().join("go");
    let (s, run) = roots_run(&d, &go);
    let mut x = Other::connect(ids, &d.socket);
    for params in [
        json!({}),
        json!({"session_id": s}),
        json!({"state": "running"}),
    ] {
        let list = x.call("list_agent_runs", params.clone()).unwrap();
        assert!(!lists(&list, &run, &s), "{params}: {list}");
    }
    // Nor summed in its usage, by session or in all.
    for params in [json!({}), json!({"session_id": s})] {
        let sum = x.call("usage", params.clone()).unwrap();
        assert_eq!(sum["runs"], 0, "{params}: {sum}");
    }
    // Root still sees its run.
    let list = d.conn().call("list_agent_runs", json!({})).unwrap();
    assert!(lists(&list, &run, &s), "{list}");
    let sum = d.conn().call("usage", json!({"session_id": s})).unwrap();
    assert_eq!(sum["runs"], 1, "{sum}");
    std::fs::write(&go, "").unwrap();
    assert_eq!(d.conn().wait(&run)["state"], "succeeded");
}

#[test]
fn roots_run_answers_another_uid_like_an_unknown_id_and_is_not_cancelled() {
    let Some(ids) = user() else { return };
    let (d, _cfg) = otheruser::daemon_allowing(ids.0, "");
    let gate = dir("sa-scope-gate-", 0o755, None);
    let go = gate.path().join("go");
    let (_s, run) = roots_run(&d, &go);
    wait_until(Duration::from_secs(20), "root's run to start", || {
        d.conn()
            .call("check_agent_run", json!({"run_id": run}))
            .unwrap()["state"]
            == "running"
    });
    // A well-formed id no run has, for the answer to compare with.
    let unknown = "20261130T055552.123456Z-a1b2c3d4";
    let mut x = Other::connect(ids, &d.socket);
    for (method, extra) in [
        ("check_agent_run", json!({})),
        ("check_agent_run", json!({"cancel": true})),
        ("wait_agent_run", json!({"timeout_ms": 30_000})),
        ("cancel_agent_run", json!({})),
    ] {
        let ask = |x: &mut Other, id: &str| {
            let mut p = extra.clone();
            p["run_id"] = json!(id);
            refused(x.call(method, p), NOT_FOUND, method).replace(id, "ID")
        };
        assert_eq!(ask(&mut x, &run), ask(&mut x, unknown), "{method} {extra}");
    }
    let s = d
        .conn()
        .call("check_agent_run", json!({"run_id": run}))
        .unwrap();
    assert_eq!(s["state"], "running", "{s}");
    assert_eq!(s["cancel_requested"], false, "{s}");
    std::fs::write(&go, "").unwrap();
    assert_eq!(d.conn().wait(&run)["state"], "succeeded");
}

#[test]
fn roots_notices_stay_roots() {
    let Some(ids) = user() else { return };
    let (d, _cfg) = otheruser::daemon_allowing(ids.0, "");
    let s = session("root");
    let run = d.conn().spawn(&s, &["/bin/true"], json!({}));
    assert_eq!(d.conn().wait(&run)["state"], "succeeded");
    let mut x = Other::connect(ids, &d.socket);
    let msg = refused(
        x.call("take_notices", json!({"session_id": s})),
        NOT_OWNED,
        "take_notices",
    );
    assert!(msg.contains("belongs to another user"), "{msg}");
    refused(
        x.call("subscribe", json!({"session_id": s})),
        NOT_OWNED,
        "subscribe",
    );
    let taken = d
        .conn()
        .call("take_notices", json!({"session_id": s}))
        .unwrap();
    let notices = taken["notices"].as_array().unwrap();
    assert_eq!(notices.len(), 1, "{taken}");
    assert_eq!(notices[0]["run_id"], run.as_str());
}

#[test]
fn another_uid_may_not_spawn_into_or_touch_roots_session() {
    let Some(ids) = user() else { return };
    let (d, _cfg) = otheruser::daemon_allowing(ids.0, "");
    let s = session("root");
    let recent = json!({"recent_files": ["/tmp/roots-file"]});
    let mut p = spawn_params(&s, Path::new("/tmp"), "true");
    p["session"]["recent_files"] = recent["recent_files"].clone();
    let run = d.conn().call("spawn_agent", p).unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    d.conn().wait(&run);
    let mine = dir("sa-scope-own-", 0o700, Some(ids));
    let mut x = Other::connect(ids, &d.socket);
    let msg = refused(
        x.call("spawn_agent", spawn_params(&s, mine.path(), "true")),
        NOT_OWNED,
        "spawn_agent",
    );
    assert!(msg.contains("belongs to another user"), "{msg}");
    refused(
        x.call(
            "touch_files",
            json!({"session_id": s, "files": ["/tmp/planted"]}),
        ),
        NOT_OWNED,
        "touch_files",
    );
    refused(
        x.call("working_context", json!({"session_id": s})),
        NOT_OWNED,
        "working_context",
    );
    // Root's session holds root's run alone, and root's context.
    let list = d
        .conn()
        .call("list_agent_runs", json!({"session_id": s}))
        .unwrap();
    assert_eq!(list["runs"].as_array().unwrap().len(), 1, "{list}");
    let ctx = d
        .conn()
        .call("working_context", json!({"session_id": s}))
        .unwrap();
    assert_eq!(ctx["project_dir"], "/tmp", "{ctx}");
    assert_eq!(ctx["recent_files"], recent["recent_files"], "{ctx}");
}

#[test]
fn another_uid_hears_only_of_its_own_runs() {
    let Some(ids) = user() else { return };
    let (d, _cfg) = otheruser::daemon_allowing(ids.0, "");
    let mine = dir("sa-scope-own-", 0o700, Some(ids));
    let mut x = Other::connect(ids, &d.socket);
    x.call("subscribe", json!({})).unwrap();
    // Root's run ends, and its notice is sent, before the other uid's.
    let mut root = d.conn();
    root.call("subscribe", json!({})).unwrap();
    let theirs = root.spawn(&session("root"), &["/bin/true"], json!({}));
    while !root
        .notifications
        .iter()
        .any(|n| n["params"]["run_id"] == theirs.as_str())
    {
        let n = root.read_msg().expect("root's notification");
        root.notifications.push(n);
    }
    let own = x
        .call(
            "spawn_agent",
            spawn_params(&session("own"), mine.path(), "true"),
        )
        .unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    while !x
        .notifications
        .iter()
        .any(|n| n["params"]["run_id"] == own.as_str())
    {
        let n = x.read_msg();
        x.notifications.push(n);
    }
    assert!(
        x.notifications
            .iter()
            .all(|n| n["params"]["run_id"] == own.as_str()),
        "heard of root's run: {:?}",
        x.notifications
    );
}

#[test]
fn the_other_uids_own_session_and_runs_work_fully() {
    let Some(ids) = user() else { return };
    let (d, _cfg) = otheruser::daemon_allowing(ids.0, "");
    let mine = dir("sa-scope-own-", 0o700, Some(ids));
    let s = session("own");
    let mut x = Other::connect(ids, &d.socket);
    let run = x
        .call("spawn_agent", spawn_params(&s, mine.path(), "true"))
        .unwrap_or_else(|e| panic!("refused: {e}"))["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let waited = x
        .call(
            "wait_agent_run",
            json!({"run_id": run, "timeout_ms": 60_000}),
        )
        .unwrap();
    assert_eq!(waited["state"], "succeeded", "{waited}");
    let checked = x.call("check_agent_run", json!({"run_id": run})).unwrap();
    assert_eq!(checked["run_id"], run.as_str());
    let list = x.call("list_agent_runs", json!({})).unwrap();
    assert!(lists(&list, &run, &s), "{list}");
    let sum = x.call("usage", json!({})).unwrap();
    assert_eq!(sum["by_driver"]["command"]["runs"], 1, "{sum}");
    let taken = x.call("take_notices", json!({"session_id": s})).unwrap();
    let notices = taken["notices"].as_array().unwrap();
    assert_eq!(notices.len(), 1, "{taken}");
    assert_eq!(notices[0]["run_id"], run.as_str());
    let touched = x
        .call("touch_files", json!({"session_id": s, "files": ["a.rs"]}))
        .unwrap();
    let a = mine.path().join("a.rs");
    assert_eq!(touched["recent_files"], json!([a]), "{touched}");
    let ctx = x.call("working_context", json!({"session_id": s})).unwrap();
    assert_eq!(ctx["project_dir"], json!(mine.path()), "{ctx}");
    x.call("subscribe", json!({"session_id": s})).unwrap();
    // A second run joins the session it made.
    let again = x.call("spawn_agent", spawn_params(&s, mine.path(), "true"));
    assert!(again.is_ok(), "{again:?}");
    // Root sees the other uid's run too.
    let list = d.conn().call("list_agent_runs", json!({})).unwrap();
    assert!(lists(&list, &run, &s), "{list}");
}

#[test]
fn owners_are_kept_across_a_daemon_restart() {
    let Some(ids) = user() else { return };
    let (mut d, cfg) = otheruser::daemon_allowing(ids.0, "");
    let roots = session("root");
    let theirs = d.conn().spawn(&roots, &["/bin/true"], json!({}));
    d.conn().wait(&theirs);
    let mine = dir("sa-scope-own-", 0o700, Some(ids));
    let own_s = session("own");
    let own = {
        let mut x = Other::connect(ids, &d.socket);
        let r = x.call("spawn_agent", spawn_params(&own_s, mine.path(), "true"));
        let own = r.unwrap()["run_id"].as_str().unwrap().to_owned();
        x.call(
            "wait_agent_run",
            json!({"run_id": own, "timeout_ms": 60_000}),
        )
        .unwrap();
        own
    };
    restart(&mut d, &cfg);
    let mut x = Other::connect(ids, &d.socket);
    let list = x.call("list_agent_runs", json!({})).unwrap();
    assert!(lists(&list, &own, &own_s), "{list}");
    assert!(!lists(&list, &theirs, &roots), "{list}");
    refused(
        x.call("check_agent_run", json!({"run_id": theirs})),
        NOT_FOUND,
        "check_agent_run",
    );
    refused(
        x.call("take_notices", json!({"session_id": roots})),
        NOT_OWNED,
        "take_notices",
    );
    let taken = x
        .call("take_notices", json!({"session_id": own_s}))
        .unwrap();
    assert_eq!(taken["notices"][0]["run_id"], own.as_str(), "{taken}");
    // The session is still the other uid's: root's run may not join it.
    let e = d.conn().call(
        "spawn_agent",
        spawn_params(&own_s, Path::new("/tmp"), "true"),
    );
    refused(e, NOT_OWNED, "root's spawn into the other uid's session");
}

#[test]
fn another_uids_prune_removes_and_shows_only_its_own_runs() {
    let Some(ids) = user() else { return };
    let (d, _cfg) = otheruser::daemon_allowing(ids.0, "[retention]\ninterval = 0\n");
    let mine = dir("sa-scope-prune-", 0o700, Some(ids));
    let (rs, xs) = (session("root-prune"), session("own-prune"));
    let mut root = d.conn();
    let roots: Vec<String> = (0..2)
        .map(|_| {
            let r = root.spawn(&rs, &["true"], json!({}));
            root.wait(&r);
            r
        })
        .collect();
    root.call("take_notices", json!({"session_id": rs}))
        .unwrap();
    let mut x = Other::connect(ids, &d.socket);
    let own: Vec<String> = (0..2)
        .map(|_| {
            let r = x.call("spawn_agent", spawn_params(&xs, mine.path(), "true"));
            let r = r.unwrap_or_else(|e| panic!("refused: {e}"))["run_id"]
                .as_str()
                .unwrap()
                .to_owned();
            x.call("wait_agent_run", json!({"run_id": r, "timeout_ms": 60_000}))
                .unwrap();
            r
        })
        .collect();
    x.call("take_notices", json!({"session_id": xs})).unwrap();
    // Root's own session named: nothing of root's is removed or shown.
    let named = x
        .call("prune_runs", json!({"session_id": rs, "older_than": "0s"}))
        .unwrap();
    assert_eq!(named, json!({"dry_run": false, "kept": [], "removed": []}));
    let all = x.call("prune_runs", json!({"older_than": "0s"})).unwrap();
    let removed: Vec<&str> = all["removed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run_id"].as_str().unwrap())
        .collect();
    assert_eq!(removed, [own[0].as_str()], "{all}");
    assert_eq!(
        all["kept"],
        json!([{"run_id": own[1], "why": "the newest run of its session"}])
    );
    let list = root.call("list_agent_runs", json!({})).unwrap();
    for r in &roots {
        assert!(lists(&list, r, "-"), "root's run {r} is gone: {list}");
    }
}
