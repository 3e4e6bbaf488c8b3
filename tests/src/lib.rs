//! Helpers for the end-to-end tests: the real binaries (built by
//! `cargo build --workspace --bins`, which scripts/test runs first), a
//! daemon on a socket in a temp dir, a line-oriented JSON-RPC connection,
//! and polling with deadlines (never fixed sleeps).

#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod agents;
pub mod mcpstdio;
pub mod modelserver;
pub mod modgraph;
pub mod otheruser;
pub mod sleepers;
pub mod tmux;

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The directory holding the workspace's binaries (target/debug).
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("SUBAGENT_BIN_DIR") {
        return PathBuf::from(dir);
    }
    let exe = std::env::current_exe().unwrap();
    // target/debug/deps/<test> -> target/debug
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

/// The path of one of the workspace's binaries; panics with a hint when
/// it has not been built.
pub fn bin(name: &str) -> PathBuf {
    let p = bin_dir().join(name);
    assert!(
        p.is_file(),
        "{} is missing: run `cargo build --workspace --bins` first (scripts/test does)",
        p.display()
    );
    p
}

/// Polls `cond` every few ms until it holds or `limit` passes.
pub fn wait_until(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    let mut pause = Duration::from_millis(1);
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// A session id no other test uses.
pub fn session(prefix: &str) -> String {
    let mut buf = [0u8; 4];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut buf)
        .unwrap();
    format!(
        "{prefix}-{}",
        buf.iter().map(|b| format!("{b:02x}")).collect::<String>()
    )
}

/// A daemon under test.
pub struct Daemon {
    /// The daemon process.
    pub child: Child,
    /// Holds the socket, the state dir and the daemon's stderr.
    pub dir: tempfile::TempDir,
    /// The socket.
    pub socket: PathBuf,
    /// The state dir.
    pub state: PathBuf,
}

/// How to start a daemon.
#[derive(Default, Clone)]
pub struct DaemonOpts {
    /// --max-concurrent.
    pub max_concurrent: Option<usize>,
    /// Extra environment for the daemon.
    pub env: Vec<(String, String)>,
    /// Extra arguments for the daemon.
    pub args: Vec<String>,
    /// Where the daemon's folder (socket, state dir, log) is made; `/tmp`
    /// when `None`.
    pub base_dir: Option<PathBuf>,
    /// A command the daemon is started through (its path and arguments
    /// follow), e.g. to give it a mount namespace of its own.
    pub wrap: Vec<String>,
}

/// Whether a test may run: when `available` is false it prints
/// `SKIPPED: <why>` and returns false, except under CI (`CI=true`), where
/// a missing mechanism fails the test unless it is listed in
/// `SUBAGENT_ALLOW_MISSING` (comma-separated mechanism names).
pub fn runnable(available: bool, mechanism: &str, why: &str) -> bool {
    if available {
        return true;
    }
    subagent_runner::testsupport::skip(mechanism, why);
    false
}

/// What `subagentd --check` says is missing on this host (mechanism names).
pub fn missing_mechanisms() -> Vec<String> {
    let out = Command::new(bin("subagentd"))
        .arg("--check")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("MISSING "))
        .map(|l| l.split(':').next().unwrap_or("").to_owned())
        .collect()
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() == 0 }
}

impl Daemon {
    /// Starts a daemon with default options.
    pub fn start() -> Daemon {
        Daemon::start_with(DaemonOpts::default())
    }

    /// Starts a daemon and waits until it answers ping.
    pub fn start_with(opts: DaemonOpts) -> Daemon {
        let dir = tempfile::Builder::new()
            .prefix("sa-e2e-")
            .tempdir_in(opts.base_dir.as_deref().unwrap_or(Path::new("/tmp")))
            .unwrap();
        let socket = dir.path().join("d.sock");
        let state = dir.path().join("state");
        let child = Self::spawn_process(&socket, &state, dir.path(), &opts);
        let d = Daemon {
            child,
            dir,
            socket,
            state,
        };
        d.wait_ready();
        d
    }

    /// Starts the daemon process (without waiting for it).
    pub fn spawn_process(socket: &Path, state: &Path, dir: &Path, opts: &DaemonOpts) -> Child {
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("daemon.log"))
            .unwrap();
        let mut cmd = match opts.wrap.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(bin("subagentd"));
                c
            }
            None => Command::new(bin("subagentd")),
        };
        cmd.arg("--socket")
            .arg(socket)
            .arg("--state-dir")
            .arg(state)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        if let Some(n) = opts.max_concurrent {
            cmd.arg("--max-concurrent").arg(n.to_string());
        }
        cmd.args(&opts.args);
        for (k, v) in &opts.env {
            cmd.env(k, v);
        }
        cmd.spawn().unwrap()
    }

    /// Waits until the daemon answers ping.
    pub fn wait_ready(&self) {
        wait_until(Duration::from_secs(20), "the daemon to answer", || {
            Conn::try_connect(&self.socket).is_some_and(|mut c| c.call("ping", json!({})).is_ok())
        });
    }

    /// A new connection.
    pub fn conn(&self) -> Conn {
        Conn::connect(&self.socket)
    }

    /// The daemon's pid.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// The daemon's stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("daemon.log")).unwrap_or_default()
    }

    /// Runs `subagent` against this daemon.
    pub fn cli(&self, args: &[&str]) -> Output {
        Command::new(bin("subagent"))
            .arg("--socket")
            .arg(&self.socket)
            .arg("--state-dir")
            .arg(&self.state)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// Starts the daemon again on the same socket and state dir (after it
    /// stopped or was killed) and waits until it answers. A daemon still
    /// running is a test's mistake: the new one would be refused and the
    /// old one answer in its place, so that fails here.
    pub fn restart(&mut self) {
        self.restart_with(&DaemonOpts::default());
    }

    /// [`Daemon::restart`] with `opts` (its config, its environment).
    pub fn restart_with(&mut self, opts: &DaemonOpts) {
        let pid = self.pid();
        wait_until(
            Duration::from_secs(10),
            &format!("the daemon (pid {pid}) to have exited before its restart"),
            || self.child.try_wait().ok().flatten().is_some(),
        );
        self.child = Self::spawn_process(&self.socket, &self.state, self.dir.path(), opts);
        self.wait_ready();
    }

    /// Sends SIGTERM and waits for the daemon to exit.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        unsafe_kill(self.pid(), libc::SIGTERM);
        self.child.wait().unwrap()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            unsafe_kill(self.pid(), libc::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

/// Sends a signal (test helper around libc::kill).
pub fn unsafe_kill(pid: i32, sig: i32) -> bool {
    // SAFETY: kill only sends a signal; it touches no memory.
    unsafe { libc::kill(pid, sig) == 0 }
}

/// Whether a process exists and is not a zombie.
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => {
            let state = s
                .rsplit_once(')')
                .map(|(_, r)| r.trim_start().chars().next());
            state != Some(Some('Z'))
        }
        Err(_) => false,
    }
}

/// A JSON-RPC connection to the daemon.
pub struct Conn {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    next_id: u64,
    /// Notifications read while waiting for responses.
    pub notifications: Vec<Value>,
}

impl Conn {
    /// Connects, or panics.
    pub fn connect(socket: &Path) -> Conn {
        Self::try_connect(socket)
            .unwrap_or_else(|| panic!("cannot connect to {}", socket.display()))
    }

    /// Connects, or `None`.
    pub fn try_connect(socket: &Path) -> Option<Conn> {
        let s = UnixStream::connect(socket).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(60))).ok()?;
        Some(Conn {
            writer: s.try_clone().ok()?,
            reader: BufReader::new(s),
            next_id: 1,
            notifications: Vec::new(),
        })
    }

    /// Sends raw bytes.
    pub fn send_raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.writer.write_all(bytes)
    }

    /// Reads one message (a response or a notification); `None` on EOF.
    pub fn read_msg(&mut self) -> Option<Value> {
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) | Err(_) => None,
            Ok(_) => Some(
                serde_json::from_str(&line).unwrap_or_else(|e| panic!("bad line {line:?}: {e}")),
            ),
        }
    }

    /// Sends a request and returns its whole response message.
    pub fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.send_raw(format!("{line}\n").as_bytes()).unwrap();
        loop {
            let msg = self
                .read_msg()
                .expect("connection closed before the response");
            if msg.get("id") == Some(&json!(id)) {
                return msg;
            }
            assert!(msg.get("method").is_some(), "unexpected message {msg}");
            self.notifications.push(msg);
        }
    }

    /// Calls a method: Ok(result) or Err(error object).
    pub fn call(&mut self, method: &str, params: Value) -> Result<Value, Value> {
        let msg = self.request(method, params);
        match msg.get("error") {
            Some(e) => Err(e.clone()),
            None => Ok(msg["result"].clone()),
        }
    }

    /// Every run `list_agent_runs` with `params` lists, following its
    /// pages to the end.
    pub fn list_all(&mut self, params: Value) -> Vec<Value> {
        let (mut runs, mut p) = (Vec::new(), params);
        loop {
            let v = self
                .call("list_agent_runs", p.clone())
                .unwrap_or_else(|e| panic!("list_agent_runs: {e}"));
            runs.extend(v["runs"].as_array().into_iter().flatten().cloned());
            match v["next_cursor"].as_str() {
                Some(c) => p["cursor"] = json!(c),
                None => return runs,
            }
        }
    }

    /// Spawns `command` in `session` (project_dir /tmp unless given) and
    /// returns the run id.
    pub fn spawn(&mut self, session: &str, command: &[&str], extra: Value) -> String {
        let mut params = json!({
            "session": {"id": session, "audience": "personal", "project_dir": "/tmp"},
            "task": "test task",
            "command": command,
        });
        if let Value::Object(m) = extra {
            for (k, v) in m {
                params[k] = v;
            }
        }
        let r = self
            .call("spawn_agent", params)
            .unwrap_or_else(|e| panic!("spawn failed: {e}"));
        assert_eq!(r["state"], "accepted");
        assert_eq!(
            r.as_object().unwrap().len(),
            2,
            "exactly run_id and state: {r}"
        );
        r["run_id"].as_str().unwrap().to_owned()
    }

    /// Waits for a run to end and returns its status.
    pub fn wait(&mut self, run: &str) -> Value {
        let s = self
            .call(
                "wait_agent_run",
                json!({"run_id": run, "timeout_ms": 60_000}),
            )
            .unwrap();
        assert!(
            !matches!(s["state"].as_str(), Some("accepted" | "running")),
            "run {run} still {} after 60 s",
            s["state"]
        );
        s
    }
}

/// Writes an executable shell script into `dir` and returns its path.
pub fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

/// Host pids of the live processes whose command line contains `marker`.
/// A run's processes have pids of their own inside the run (its PID
/// namespace); from outside they are found by what they run.
pub fn pids_with(marker: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != me && alive(pid))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                String::from_utf8_lossy(&c)
                    .replace('\0', " ")
                    .contains(marker)
            })
        })
        .collect()
}

/// Host pids of the live `sleep <marker>` processes (exactly that argv).
pub fn sleeping(marker: &str) -> Vec<i32> {
    let argv = format!("sleep\0{marker}\0");
    pids_with(marker)
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == argv.as_bytes())
        })
        .collect()
}

/// A `sleep` duration no other process uses (300 s and a random fraction),
/// to find that sleep from outside with [`pids_with`].
pub fn sleep_marker() -> String {
    let mut buf = [0u8; 4];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut buf)
        .unwrap();
    format!("300.{:09}", u32::from_le_bytes(buf) % 1_000_000_000)
}

/// Waits until the file at `path` (a run's child.log, say) contains
/// `needle`.
pub fn wait_for_text(path: &Path, needle: &str, what: &str) {
    wait_until(Duration::from_secs(20), what, || {
        std::fs::read_to_string(path).is_ok_and(|t| t.contains(needle))
    });
}

/// A directory under /tmp the test and a run's child can both see while
/// the run is alive (the child sees it read-only when its project is
/// /tmp, as [`Conn::spawn`]'s default project is).
pub fn channel() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::Builder::new()
        .prefix("sa-chan-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

/// The record of the run whose folder is `run_dir`, as its state dir's
/// state.db holds it (opened read-only), in the flat form the protocol's
/// records have always had; `None` when the database has no such run.
pub fn stored_run(run_dir: &Path) -> Option<serde_json::Value> {
    let layout = subagentd::paths::StateLayout::of_run_dir(run_dir)?;
    let id = subagentd::ids::RunId::parse(run_dir.file_name()?.to_str()?)?;
    let store = subagentd::store::Store::open_read_only(&layout.db()).unwrap();
    match store.get(&id).unwrap()? {
        subagentd::store::Stored::Live(rec) => Some(serde_json::to_value(*rec).unwrap()),
        subagentd::store::Stored::Pruned { .. } => None,
    }
}

/// The runner spec that state dir `state`'s state.db holds for run `run`
/// (opened read-only): the only copy, kept while the run is live; `None`
/// once the run is finalized, or for no such run.
pub fn stored_spec(state: &Path, run: &str) -> Option<Vec<u8>> {
    let id = subagentd::ids::RunId::parse(run)?;
    let store = subagentd::store::Store::open_read_only(&state.join("state.db")).unwrap();
    store.spec(&id).unwrap()
}
