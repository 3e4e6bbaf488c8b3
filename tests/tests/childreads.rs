//! What the root daemon reads from places a child can write: a child plants
//! a file (a rewritten script, a symlink, a FIFO, an endless device), then
//! the daemon reads it, at the end of that run or at a later spawn. Each
//! test judges from outside: what the next run sees, the daemon's memory
//! and threads, the run's final state within a deadline.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use subagentd_e2e::{alive, session, Conn, Daemon, DaemonOpts};

/// A secret no run may see, in its own 0600 file outside every root.
const SECRET: &str = "CHILDREADS-SECRET-5e1f";
/// A variable only the daemon's environment holds.
const ENV_MARKER: &str = "CHILDREADS-ENVIRON-9c2d";

struct Env {
    d: Daemon,
    project: tempfile::TempDir,
    /// Holds the secret file.
    outside: tempfile::TempDir,
}

/// A daemon (with a marker in its environment), a project and a secret;
/// `None` (after `SKIPPED: …`) when the host cannot enforce the default
/// requirements.
fn env() -> Option<Env> {
    for m in subagentd_e2e::missing_mechanisms() {
        if !subagentd_e2e::runnable(false, &m, &format!("this host cannot enforce {m}")) {
            return None;
        }
    }
    let d = Daemon::start_with(DaemonOpts {
        env: vec![("CHILDREADS_MARKER".into(), ENV_MARKER.into())],
        ..Default::default()
    });
    let project = tempfile::Builder::new()
        .prefix("sa-cr-proj-")
        .tempdir_in("/tmp")
        .unwrap();
    let outside = tempfile::Builder::new()
        .prefix("sa-cr-outside-")
        .tempdir_in("/tmp")
        .unwrap();
    let secret = outside.path().join("secret.txt");
    std::fs::write(&secret, format!("{SECRET}\n")).unwrap();
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    Some(Env {
        d,
        project,
        outside,
    })
}

impl Env {
    fn secret(&self) -> PathBuf {
        self.outside.path().join("secret.txt")
    }

    fn params(&self, command: &[&str], extra: Value) -> Value {
        let mut params = json!({
            "session": {"id": session("cr"), "audience": "personal", "project_dir": self.project.path()},
            "task": "t",
            "command": command,
        });
        if let Value::Object(m) = extra {
            for (k, v) in m {
                params[k] = v;
            }
        }
        params
    }

    /// Spawns `command` and returns its run id.
    fn start(&self, c: &mut Conn, command: &[&str], extra: Value) -> String {
        let r = c
            .call("spawn_agent", self.params(command, extra))
            .unwrap_or_else(|e| panic!("spawn failed: {e}"));
        r["run_id"].as_str().unwrap().to_owned()
    }

    /// Runs `command` to its end; returns its status and its log.
    fn run(&self, command: &[&str], extra: Value) -> (Value, String) {
        let mut c = self.d.conn();
        let run = self.start(&mut c, command, extra);
        let st = c.wait(&run);
        let log = std::fs::read_to_string(st["log_path"].as_str().unwrap()).unwrap_or_default();
        (st, log)
    }

    /// Runs `script` as a child that may write the project: the attack.
    /// Runs `script` with the write right; returns the run's status.
    fn plant(&self, script: &str, env: Value) -> Value {
        let (st, log) = self.run(
            &["sh", "-c", script],
            json!({"sandbox": {"write_project": true}, "env": env}),
        );
        assert_eq!(st["state"], "succeeded", "the planting run: {st}\n{log}");
        st
    }

    fn healthy(&self) {
        assert!(alive(self.d.pid()), "the daemon is alive");
        assert!(self.d.conn().call("ping", json!({})).is_ok());
    }
}

fn ctx_file(st: &Value, name: &str) -> String {
    let dir = Path::new(st["log_path"].as_str().unwrap())
        .parent()
        .unwrap()
        .join("context");
    std::fs::read_to_string(dir.join(name)).unwrap()
}

/// A field of /proc/<pid>/status, in kB.
fn status_kb(pid: i32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The daemon's threads with this name.
fn threads_named(pid: i32, name: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|rd| {
            rd.flatten()
                .filter(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|c| c.trim_end() == name)
                })
                .count()
        })
        .unwrap_or(0)
}

/// Waits for a run to end while watching the daemon's memory: fails as
/// soon as its resident set passes `max_mib`, or when the run is not over
/// by `limit`.
fn wait_watching_memory(e: &Env, run: &str, limit: Duration, max_mib: u64) -> Value {
    let deadline = Instant::now() + limit;
    let mut c = e.d.conn();
    loop {
        let rss = status_kb(e.d.pid(), "VmRSS:") / 1024;
        assert!(rss <= max_mib, "the daemon's RSS reached {rss} MiB");
        let st = c.call("check_agent_run", json!({"run_id": run})).unwrap();
        if !matches!(st["state"].as_str(), Some("accepted" | "running")) {
            return st;
        }
        assert!(
            Instant::now() < deadline,
            "the run is still {} after {limit:?}",
            st["state"]
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "-c",
            "init.defaultBranch=main",
        ])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn git_project(e: &Env) {
    std::fs::write(e.project.path().join("a.txt"), "a\n").unwrap();
    git(e.project.path(), &["init", "-q"]);
    git(e.project.path(), &["add", "."]);
    git(e.project.path(), &["commit", "-qm", "init"]);
}

/// Calls `spawn_agent` on its own thread: the answer, or `None` when none
/// came within `limit` (the connection is left to the daemon's end).
fn call_within(e: &Env, params: Value, limit: Duration) -> Option<Result<Value, Value>> {
    let mut c = e.d.conn();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(c.call("spawn_agent", params));
    });
    rx.recv_timeout(limit).ok()
}

#[test]
fn a_rewritten_project_script_cannot_open_landlock_to_the_root() {
    let Some(e) = env() else { return };
    let agent = subagentd_e2e::script(e.project.path(), "agent.sh", "echo first");
    // The child rewrites the project's agent so that `env`'s options name
    // `/`; the next spawn of that agent must not grant `/`.
    let py = format!(
        "#!/usr/bin/env -S -u / /usr/bin/python3\n\
         import os\n\
         for p in [{secret:?}]:\n\
         \ttry:\n\
         \t\tprint('LEAK', open(p).read())\n\
         \texcept OSError as x:\n\
         \t\tprint('DENIED', x.errno)\n\
         try:\n\
         \tprint('LISTED', os.listdir({state:?}))\n\
         except OSError as x:\n\
         \tprint('DENIED', x.errno)\n",
        secret = e.secret().display().to_string(),
        state = e.d.state.display().to_string(),
    );
    e.plant("printf '%s' \"$BODY\" > agent.sh", json!({"BODY": py}));
    let (st, log) = e.run(&[agent.to_str().unwrap()], json!({}));
    assert_eq!(st["state"], "succeeded", "{st}\n{log}");
    assert!(!log.contains(SECRET), "the secret leaked:\n{log}");
    assert!(!log.contains("LISTED"), "the state dir was listed:\n{log}");
    assert_eq!(log.matches("DENIED").count(), 2, "{log}");
    e.healthy();
}

#[test]
fn planted_instruction_links_and_fifos_leak_nothing_into_the_next_run() {
    let Some(e) = env() else { return };
    // The first names the daemon looks for are a FIFO and links to host
    // files; the last is a real file, which is used.
    e.plant(
        "mkdir .subagents && mkfifo .subagents/AGENTS.md && \
         ln -s /proc/self/environ AGENTS.md && ln -s \"$SECRET\" CLAUDE.md && \
         echo 'CONTEXT-INSTRUCTIONS-OK' > CONTEXT.md",
        json!({"SECRET": e.secret()}),
    );
    let (st, log) = e.run(&["true"], json!({}));
    assert_eq!(st["state"], "succeeded", "{st}\n{log}");
    let system = ctx_file(&st, "system.md");
    assert!(!system.contains(ENV_MARKER), "the daemon's environ leaked");
    assert!(!system.contains(SECRET), "the secret leaked");
    assert!(system.contains("CONTEXT-INSTRUCTIONS-OK"), "{system}");
    e.healthy();
}

#[test]
fn agent_definitions_are_read_without_following_links() {
    let Some(e) = env() else { return };
    let def = e.outside.path().join("spy.md");
    std::fs::write(
        &def,
        format!("---\nname: spy\ndescription: x\n---\n{SECRET} in the body\n"),
    )
    .unwrap();
    e.plant(
        "mkdir -p .subagents && ln -s \"$DEF\" .subagents/spy.md && \
         mkfifo .subagents/slow.md && head -c 2000000 /dev/zero | tr '\\0' x > .subagents/big.md",
        json!({"DEF": def}),
    );
    // Neither blocks the spawn nor takes the linked file.
    let answer = call_within(
        &e,
        e.params(&["true"], json!({"agent": "spy"})),
        Duration::from_secs(20),
    )
    .expect("the spawn was answered");
    let err = answer.expect_err("a linked definition is refused");
    assert_eq!(err["code"], -32602, "{err}");
    assert!(!err.to_string().contains(SECRET), "{err}");
    assert!(err["message"].as_str().unwrap().contains("spy"), "{err}");
    let big =
        e.d.conn()
            .call("spawn_agent", e.params(&["true"], json!({"agent": "big"})))
            .expect_err("an oversized definition is refused");
    assert!(
        big["message"].as_str().unwrap().contains("over the limit"),
        "{big}"
    );
    e.healthy();
}

#[test]
fn a_delta_linked_to_dev_zero_leaves_the_daemons_memory_alone() {
    let Some(e) = env() else { return };
    let mut c = e.d.conn();
    let run = e.start(
        &mut c,
        &["sh", "-c", "ln -s /dev/zero \"$SUBAGENT_DELTA_PATH\""],
        json!({}),
    );
    let st = wait_watching_memory(&e, &run, Duration::from_secs(30), 256);
    assert_eq!(st["state"], "succeeded", "{st}");
    let note = st["delta"]["note"].as_str().unwrap_or_default();
    assert!(note.contains("not a regular file"), "{st}");
    // An oversized regular file is refused whole, with the limit.
    let (st, _) = e.run(
        &[
            "sh",
            "-c",
            "head -c 3000000 /dev/zero > \"$SUBAGENT_DELTA_PATH\"",
        ],
        json!({}),
    );
    let note = st["delta"]["note"].as_str().unwrap_or_default();
    assert!(note.contains("over the limit"), "{st}");
    e.healthy();
}

#[test]
fn a_delta_fifo_does_not_keep_the_run_running() {
    let Some(e) = env() else { return };
    let mut c = e.d.conn();
    let run = e.start(
        &mut c,
        &["sh", "-c", "mkfifo \"$SUBAGENT_DELTA_PATH\""],
        json!({}),
    );
    let st = wait_watching_memory(&e, &run, Duration::from_secs(20), 256);
    assert_eq!(st["state"], "succeeded", "{st}");
    let note = st["delta"]["note"].as_str().unwrap_or_default();
    assert!(note.contains("not a regular file"), "{st}");
    let result = std::fs::read_to_string(st["result_path"].as_str().unwrap()).unwrap();
    assert!(result.contains("not a regular file"), "{result}");
    e.healthy();
}

#[test]
fn a_fifo_in_dot_git_neither_leaks_snapshot_threads_nor_blocks_a_worktree() {
    let Some(e) = env() else { return };
    git_project(&e);
    e.plant("rm .git/config && mkfifo .git/config", json!({}));
    for _ in 0..3 {
        let (st, _) = e.run(&["true"], json!({}));
        assert_eq!(st["state"], "succeeded", "{st}");
        let reason = st["git"]["reason"].as_str().unwrap_or_default();
        assert!(reason.contains("is a FIFO, not a regular file"), "{st}");
    }
    let stuck = threads_named(e.d.pid(), "git-snapshot");
    assert_eq!(stuck, 0, "{stuck} snapshot threads are stuck");
    // A worktree is refused with the reason, promptly.
    let answer = call_within(
        &e,
        e.params(&["true"], json!({"isolation": "worktree"})),
        Duration::from_secs(20),
    )
    .expect("the worktree spawn was answered");
    let err = answer.expect_err("the repository is refused");
    assert_eq!(err["code"], -32602, "{err}");
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("not a regular file"),
        "{err}"
    );
    e.healthy();
}

#[test]
fn a_snapshot_stuck_in_libgit2_is_not_started_again() {
    let Some(e) = env() else { return };
    git_project(&e);
    // HEAD's commit object, which libgit2 opens with a plain open(2).
    let out = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(e.project.path())
        .output()
        .unwrap();
    let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let object = e
        .project
        .path()
        .join(".git/objects")
        .join(&id[..2])
        .join(&id[2..]);
    let planted = e.plant("rm -f \"$OBJ\" && mkfifo \"$OBJ\"", json!({"OBJ": object}));
    // The planting run's own end is the first to meet the FIFO: the status
    // that tells what it changed times out, and stays stuck.
    let note = planted["observed"]["note"].as_str().unwrap_or_default();
    assert!(
        note.contains("git status at the end failed (timed out after 2 s)"),
        "{planted}"
    );
    let mut reasons = Vec::new();
    for _ in 0..4 {
        let (st, _) = e.run(&["true"], json!({}));
        assert_eq!(st["state"], "succeeded", "{st}");
        reasons.push(st["git"]["reason"].as_str().unwrap_or_default().to_owned());
    }
    let stuck = threads_named(e.d.pid(), "git-snapshot");
    assert!(
        stuck <= 1,
        "{stuck} snapshot threads are stuck: {reasons:?}"
    );
    for r in &reasons {
        assert_eq!(r, "a previous snapshot is still running", "{reasons:?}");
    }
    // A worktree spawn is answered, not blocked behind it.
    let answer = call_within(
        &e,
        e.params(&["true"], json!({"isolation": "worktree"})),
        Duration::from_secs(20),
    )
    .expect("the worktree spawn was answered");
    let err = answer.expect_err("the repository is busy");
    assert!(
        err["message"].as_str().unwrap().contains("still running"),
        "{err}"
    );
    e.healthy();
}

#[test]
fn a_linked_git_config_leaks_nothing() {
    let Some(e) = env() else { return };
    git_project(&e);
    // libgit2 quotes the rest of a line with a bad escape in its error.
    std::fs::write(
        e.outside.path().join("cfg"),
        format!("[core]\n\tx = \"a\\q {SECRET}\"\n"),
    )
    .unwrap();
    e.plant(
        "rm .git/config && ln -s \"$CFG\" .git/config",
        json!({"CFG": e.outside.path().join("cfg")}),
    );
    let (st, _) = e.run(&["true"], json!({}));
    assert_eq!(st["state"], "succeeded", "{st}");
    let result = std::fs::read_to_string(st["result_path"].as_str().unwrap()).unwrap();
    for name in ["system.md", "first_message.md"] {
        let text = ctx_file(&st, name);
        assert!(!text.contains(SECRET), "{name}:\n{text}");
    }
    assert!(!result.contains(SECRET), "result.md:\n{result}");
    assert!(!st.to_string().contains(SECRET), "{st}");
    let first = ctx_file(&st, "first_message.md");
    assert!(
        first.contains("is a symbolic link, not a regular file"),
        "{first}"
    );
    let err =
        e.d.conn()
            .call(
                "spawn_agent",
                e.params(&["true"], json!({"isolation": "worktree"})),
            )
            .expect_err("the repository is refused");
    assert!(!err.to_string().contains(SECRET), "{err}");
    e.healthy();
}
