//! Red team: attacks on the clients. Another local user plants a socket
//! where a client looks for the daemon (`/tmp/subagentd-<uid>` when
//! `XDG_RUNTIME_DIR` is unset) and waits for task text; a model asks
//! `subagent mcp` for tools its operator never gave. Each test judges
//! from outside: what the planted listener received, the exit code and
//! the reason the client gave, the rights a run was recorded with.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use subagentd_e2e::mcpstdio::LineChild;
use subagentd_e2e::otheruser;
use subagentd_e2e::{bin, is_root, runnable, wait_until, Daemon};

/// The task text every attack tries to steal.
const TASK: &str = "TASK-SECRET-7f3a: deploy the release";
/// What a planted listener answers to anything: a run that "succeeded".
const FAKE: &str = r#"{"run_id":"20261130T055552.123456Z-a1b2c3d4","state":"succeeded","reason":"succeeded: deploy now","pid":1,"version":"fake","log_path":"/etc/shadow","result_path":"/etc/shadow","artifact_dir":"/","session_id":"x","exit_code":0}"#;
/// The user a listener of another uid runs as.
const OTHER_USER: &str = otheruser::USER;

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// A listener this test plants in a directory, recording what it is sent.
struct Planted {
    sock: PathBuf,
    got: Arc<Mutex<Vec<u8>>>,
    conns: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl Planted {
    /// Listens at `dir/d.sock`, answering each request line with [`FAKE`].
    fn at(dir: &Path) -> Planted {
        let sock = dir.join("d.sock");
        let l = UnixListener::bind(&sock).unwrap();
        l.set_nonblocking(true).unwrap();
        let p = Planted {
            sock,
            got: Arc::default(),
            conns: Arc::default(),
            stop: Arc::default(),
        };
        let (got, conns, stop) = (p.got.clone(), p.conns.clone(), p.stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                match l.accept() {
                    Ok((s, _)) => {
                        conns.fetch_add(1, Ordering::SeqCst);
                        serve_fake(s, &got);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        p
    }

    fn received(&self) -> String {
        String::from_utf8_lossy(&self.got.lock().unwrap()).into_owned()
    }

    fn connections(&self) -> usize {
        self.conns.load(Ordering::SeqCst)
    }
}

impl Drop for Planted {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Records each line of one connection and answers it as a daemon would.
fn serve_fake(s: UnixStream, got: &Mutex<Vec<u8>>) {
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut w = s.try_clone().unwrap();
    for line in BufReader::new(s).lines().map_while(Result::ok) {
        got.lock().unwrap().extend_from_slice(line.as_bytes());
        let id = serde_json::from_str::<Value>(&line).map_or(Value::Null, |v| v["id"].clone());
        let reply = format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{FAKE}}}"#);
        if writeln!(w, "{reply}").is_err() {
            return;
        }
    }
}

/// A directory for the test's sockets that other users can enter (0755).
fn public_dir() -> tempfile::TempDir {
    let d = tempfile::Builder::new()
        .prefix("sa-rtc-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

/// Runs `subagent ARGS` with no socket or uid from the environment.
fn subagent(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(bin("subagent"));
    cmd.args(args)
        .env_remove("SUBAGENTD_SOCKET")
        .env_remove("SUBAGENT_EXPECT_UID")
        .env_remove("SUBAGENTD_CONFIG")
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `subagent spawn` and `subagent run` at `sock`: each must be refused,
/// naming `why`, with a non-zero exit and no in-process fallback.
fn cli_refuses(sock: &Path, why: &[&str]) {
    let s = sock.to_str().unwrap();
    let spawn = subagent(&["--socket", s, "spawn", "--task", TASK, "--", "true"], &[]);
    let run = subagent(&["--socket", s, "run", "--task", TASK, "--", "true"], &[]);
    for (name, o, code) in [("spawn", &spawn, 1), ("run", &run, 125)] {
        let e = stderr(o);
        assert_eq!(o.status.code(), Some(code), "{name}: {e}");
        assert!(e.contains("not talking to the daemon"), "{name}: {e}");
        for w in why {
            assert!(e.contains(w), "{name} should name {w:?}: {e}");
        }
        assert!(!e.contains("running in-process with"), "{name}: {e}");
        assert!(
            !String::from_utf8_lossy(&o.stdout).contains("a1b2c3d4"),
            "{name} believed the planted answer: {o:?}"
        );
    }
}

/// Makes sure the other user exists; its uid and gid.
fn other_user() -> (u32, u32) {
    otheruser::ids()
}

/// What a planted listener received: its own READY, never the task.
fn assert_nothing_sent(got: &str) {
    assert!(
        !got.contains("TASK-SECRET"),
        "the planted listener got the task: {got}"
    );
    assert_eq!(got.trim(), "READY", "nothing was sent: {got}");
}

/// A fake daemon run as another uid: python3 listening at `dir/d.sock`,
/// recording what it is sent in `dir/got`.
struct Foreign {
    child: Child,
    sock: PathBuf,
    got: PathBuf,
}

const FOREIGN_PY: &str = r#"
import json, socket, sys
sock, got, fake = sys.argv[1], sys.argv[2], sys.argv[3]
out = open(got, "ab", buffering=0)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(sock)
s.listen(16)
out.write(b"READY\n")
while True:
    c, _ = s.accept()
    for line in c.makefile("rb"):
        out.write(line)
        try:
            i = json.loads(line).get("id")
        except Exception:
            i = None
        c.sendall((json.dumps({"jsonrpc": "2.0", "id": i, "result": json.loads(fake)}) + "\n").encode())
    c.close()
"#;

impl Foreign {
    /// Starts the listener as `uid:gid` in `dir` (made theirs, 0700).
    fn start(dir: &Path, uid: u32, gid: u32) -> Foreign {
        use std::os::unix::process::CommandExt;
        std::fs::create_dir(dir).unwrap();
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(dir, Some(uid), Some(gid)).unwrap();
        let (sock, got) = (dir.join("d.sock"), dir.join("got"));
        let child = Command::new("/usr/bin/python3")
            .args(["-c", FOREIGN_PY])
            .arg(&sock)
            .arg(&got)
            .arg(FAKE)
            .uid(uid)
            .gid(gid)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let f = Foreign { child, sock, got };
        wait_until(Duration::from_secs(20), "the foreign listener", || {
            f.received().contains("READY")
        });
        f
    }

    fn received(&self) -> String {
        std::fs::read_to_string(&self.got).unwrap_or_default()
    }
}

impl Drop for Foreign {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether this test may plant a listener of another uid (root only).
fn may_switch_users() -> bool {
    runnable(
        is_root(),
        "root",
        "a listener of another uid needs root to make and switch to that user",
    ) && runnable(
        Path::new("/usr/bin/python3").is_file(),
        "python3",
        "the foreign listener is a python3 script",
    )
}

// ---------------------------------------------------------------------------
// An MCP client: the reference Python client when it can be run, else
// newline-delimited JSON-RPC on the server's stdio (the unprivileged pass
// cannot reach a venv under root's home).
// ---------------------------------------------------------------------------

/// The repository's root.
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The venv's python, if this user can run it.
fn venv_python() -> Option<PathBuf> {
    let py = std::env::var_os("SUBAGENT_MCP_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target/mcp-venv/bin/python"));
    let runs = Command::new(&py)
        .args(["-c", "import mcp"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    runs.then_some(py)
}

/// One `subagent mcp` and the client talking to it.
struct Mcp {
    io: LineChild,
    /// The Python client (its driver's line protocol), else raw JSON-RPC.
    python: bool,
    next_id: u64,
    errlog: PathBuf,
    _dir: tempfile::TempDir,
}

impl Mcp {
    /// Starts `subagent ARGS` as an MCP server with `env` besides a
    /// minimal environment, and initializes it.
    fn start(args: &[&str], env: &[(&str, &str)]) -> Mcp {
        let dir = tempfile::tempdir().unwrap();
        let errlog = dir.path().join("server.log");
        let envs: serde_json::Map<String, Value> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), json!(v)))
            .collect();
        let py = venv_python();
        let mut cmd = match &py {
            Some(py) => {
                let cfg = json!({
                    "command": bin("subagent"), "args": args, "env": envs, "cwd": "/tmp",
                    "errlog": errlog, "client_name": "redteam",
                });
                let mut c = Command::new(py);
                c.arg(repo().join("tests/mcp/driver.py"))
                    .arg(cfg.to_string());
                c
            }
            None => {
                let mut c = Command::new(bin("subagent"));
                c.args(args)
                    .env_clear()
                    .env("PATH", "/usr/local/bin:/usr/bin:/bin")
                    .env("HOME", "/tmp")
                    .envs(env.iter().copied())
                    .current_dir("/tmp")
                    .stderr(std::fs::File::create(&errlog).unwrap());
                c
            }
        };
        let io = LineChild::spawn(&mut cmd);
        let mut m = Mcp {
            io,
            python: py.is_some(),
            next_id: 1,
            errlog,
            _dir: dir,
        };
        m.initialize();
        m
    }

    fn initialize(&mut self) {
        if self.python {
            let init = self.read();
            assert!(
                init["initialize"].is_object(),
                "{init}; log:\n{}",
                self.log()
            );
            return;
        }
        let params = json!({"protocolVersion": "2025-06-18", "capabilities": {},
                            "clientInfo": {"name": "redteam", "version": "0"}});
        let r = self.request("initialize", params);
        assert!(r["result"].is_object(), "{r}; log:\n{}", self.log());
        self.write(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.errlog).unwrap_or_default()
    }

    fn read(&self) -> Value {
        let line = self.io.recv(Duration::from_secs(120)).unwrap_or_else(|e| {
            panic!("no answer from the MCP server ({e}); log:\n{}", self.log())
        });
        serde_json::from_str(&line).unwrap()
    }

    fn write(&mut self, v: Value) {
        self.io.write(&v);
    }

    /// A raw JSON-RPC request; notifications meanwhile are skipped.
    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.write(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        loop {
            let v = self.read();
            if v["id"] == json!(id) {
                return v;
            }
        }
    }

    /// Calls a tool; returns its CallToolResult.
    fn call(&mut self, name: &str, args: Value) -> Value {
        if self.python {
            self.write(json!({"op": "call", "name": name, "args": args}));
            let v = self.read();
            assert!(v.get("error").is_none(), "{v}; log:\n{}", self.log());
            return v["result"].clone();
        }
        let v = self.request("tools/call", json!({"name": name, "arguments": args}));
        assert!(v.get("error").is_none(), "{v}; log:\n{}", self.log());
        v["result"].clone()
    }

    /// A tool call that must fail; its text.
    fn refused(&mut self, name: &str, args: Value) -> String {
        let r = self.call(name, args.clone());
        assert_eq!(r["isError"], true, "{name} {args} -> {r}");
        r["content"][0]["text"].as_str().unwrap().to_owned()
    }

    /// A tool call that must succeed; its structured content.
    fn ok(&mut self, name: &str, args: Value) -> Value {
        let r = self.call(name, args.clone());
        assert_eq!(r["isError"], false, "{name} {args} -> {r}");
        r["structuredContent"].clone()
    }
}

/// `subagent mcp`'s spawn_agent at `sock` must be refused naming `why`.
fn mcp_refuses(sock: &Path, why: &[&str]) {
    let s = sock.to_str().unwrap();
    let mut m = Mcp::start(
        &["mcp", "--project-dir", "/tmp"],
        &[("SUBAGENTD_SOCKET", s)],
    );
    let e = m.refused("spawn_agent", json!({"task": TASK, "command": ["true"]}));
    assert!(e.contains("not talking to the daemon"), "{e}");
    for w in why {
        assert!(e.contains(w), "spawn_agent should name {w:?}: {e}");
    }
    assert!(!e.contains("a1b2c3d4") && !e.contains("deploy now"), "{e}");
}

// ---------------------------------------------------------------------------
// A planted socket
// ---------------------------------------------------------------------------

#[test]
fn a_socket_dir_of_another_uid_gets_no_task() {
    if !may_switch_users() {
        return;
    }
    let (uid, gid) = other_user();
    let base = public_dir();
    let dir = base.path().join("subagentd-0");
    let f = Foreign::start(&dir, uid, gid);
    let owner = format!("owned by uid {uid}");
    cli_refuses(&f.sock, &[dir.to_str().unwrap(), &owner]);
    mcp_refuses(&f.sock, &[dir.to_str().unwrap(), &owner]);
    assert_nothing_sent(&f.received());
}

#[test]
fn a_listener_of_another_uid_in_a_trusted_dir_gets_no_task() {
    if !may_switch_users() {
        return;
    }
    let (uid, gid) = other_user();
    let base = public_dir();
    let dir = base.path().join("subagentd-0");
    let f = Foreign::start(&dir, uid, gid);
    // The directory is root's again: only SO_PEERCRED tells the listener.
    std::os::unix::fs::chown(&dir, Some(0), Some(0)).unwrap();
    let runs_as = format!("runs as uid {uid}");
    cli_refuses(&f.sock, &[&runs_as]);
    mcp_refuses(&f.sock, &[&runs_as]);
    assert_nothing_sent(&f.received());
}

#[test]
fn expect_uid_trusts_the_uid_it_names() {
    if !may_switch_users() {
        return;
    }
    let (uid, gid) = other_user();
    let base = public_dir();
    let f = Foreign::start(&base.path().join("theirs"), uid, gid);
    let s = f.sock.to_str().unwrap();
    let ping = subagent(&["--socket", s, "--expect-uid", OTHER_USER, "ping"], &[]);
    assert!(ping.status.success(), "{}", stderr(&ping));
    assert!(
        String::from_utf8_lossy(&ping.stdout).contains("subagentd fake"),
        "{ping:?}"
    );
    let uid_text = uid.to_string();
    let env = [("SUBAGENT_EXPECT_UID", uid_text.as_str())];
    let spawn = subagent(
        &["--socket", s, "spawn", "--task", TASK, "--", "true"],
        &env,
    );
    assert!(spawn.status.success(), "{}", stderr(&spawn));
    assert!(
        f.received().contains("TASK-SECRET"),
        "the expected daemon was told the task"
    );
    // The config may name it instead; the flag and the env win over it.
    let cfg = base.path().join("config.toml");
    std::fs::write(&cfg, format!("expect_uid = {uid}\n")).unwrap();
    let cfg = cfg.to_str().unwrap();
    let ping = subagent(&["--socket", s, "ping"], &[("SUBAGENTD_CONFIG", cfg)]);
    assert!(ping.status.success(), "{}", stderr(&ping));
    let ping = subagent(&["--socket", s, "ping"], &[]);
    assert!(!ping.status.success(), "not trusted without it");
    let bad = subagent(
        &["--socket", s, "--expect-uid", "no-such-user-x", "ping"],
        &[],
    );
    assert_eq!(bad.status.code(), Some(1));
    assert!(stderr(&bad).contains("--expect-uid"), "{}", stderr(&bad));
}

#[test]
fn a_socket_dir_others_can_write_gets_no_task() {
    let base = public_dir();
    let dir = base.path().join("open");
    std::fs::create_dir(&dir).unwrap();
    let p = Planted::at(&dir);
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    cli_refuses(&p.sock, &[dir.to_str().unwrap(), "mode 777"]);
    mcp_refuses(&p.sock, &[dir.to_str().unwrap(), "mode 777"]);
    assert_eq!(p.connections(), 0, "nothing connected: {}", p.received());
    assert!(p.received().is_empty());
}

#[test]
fn a_symlink_on_the_socket_path_gets_no_task() {
    let base = public_dir();
    let real = base.path().join("real");
    std::fs::create_dir(&real).unwrap();
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o700)).unwrap();
    let p = Planted::at(&real);
    let link = base.path().join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let via = link.join("d.sock");
    cli_refuses(&via, &[link.to_str().unwrap(), "symbolic link"]);
    mcp_refuses(&via, &[link.to_str().unwrap(), "symbolic link"]);
    // The socket itself a link to a listener: refused too.
    let sock_link = real.join("l.sock");
    std::os::unix::fs::symlink(&p.sock, &sock_link).unwrap();
    cli_refuses(&sock_link, &["symbolic link"]);
    assert_eq!(p.connections(), 0, "nothing connected: {}", p.received());
}

/// Whether this host can enforce a run's default requirements (else
/// SKIPPED, as the other hostile suites do).
fn enforceable() -> bool {
    subagentd_e2e::missing_mechanisms()
        .iter()
        .all(|m| runnable(false, m, &format!("this host cannot enforce {m}")))
}

#[test]
fn the_real_daemon_still_answers_every_client() {
    if !enforceable() {
        return;
    }
    let d = Daemon::start();
    let s = d.socket.to_str().unwrap();
    let ping = subagent(&["--socket", s, "ping"], &[]);
    assert!(ping.status.success(), "{}", stderr(&ping));
    let state = d.state.to_str().unwrap();
    let run = subagent(
        &[
            "--socket",
            s,
            "--state-dir",
            state,
            "run",
            "--task",
            "t",
            "--",
            "true",
        ],
        &[],
    );
    let e = stderr(&run);
    assert_eq!(run.status.code(), Some(0), "{e}");
    assert!(
        e.contains("accepted") && !e.contains("running in-process"),
        "{e}"
    );
    let mut m = Mcp::start(
        &["mcp", "--project-dir", "/tmp"],
        &[("SUBAGENTD_SOCKET", s)],
    );
    let l = m.ok("list_agent_runs", json!({"session": "*"}));
    assert!(!l["runs"].as_array().unwrap().is_empty(), "{l}");
}

#[test]
fn run_without_a_daemon_still_runs_in_process() {
    if !enforceable() {
        return;
    }
    let base = public_dir();
    let state = base.path().join("state");
    let none = base.path().join("no-daemon/d.sock");
    let run = subagent(
        &[
            "--socket",
            none.to_str().unwrap(),
            "--state-dir",
            state.to_str().unwrap(),
            "run",
            "--task",
            "t",
            "--",
            "true",
        ],
        &[],
    );
    let e = stderr(&run);
    assert_eq!(run.status.code(), Some(0), "{e}");
    assert!(e.contains("running in-process"), "{e}");
    assert!(!e.contains("not talking to the daemon"), "{e}");
}

// ---------------------------------------------------------------------------
// The MCP server's rights come from its command line
// ---------------------------------------------------------------------------

/// The recorded run `run` as the daemon has it.
fn recorded(d: &Daemon, run: &str) -> Value {
    let mut c = d.conn();
    c.call("wait_agent_run", json!({"run_id": run})).unwrap()
}

#[test]
fn without_tools_the_model_cannot_ask_for_the_network_or_a_shell() {
    let d = Daemon::start();
    let s = d.socket.to_str().unwrap();
    let mut m = Mcp::start(
        &["mcp", "--project-dir", "/tmp"],
        &[("SUBAGENTD_SOCKET", s)],
    );
    let e = m.refused(
        "spawn_agent",
        json!({"task": "t", "command": ["true"], "tools": ["web_fetch", "shell"]}),
    );
    assert!(e.contains("not held: web_fetch, shell"), "{e}");
    let l = m.ok("list_agent_runs", json!({}));
    assert_eq!(l["runs"], json!([]), "no run was started: {l}");
    // What a run gets without a list: the read-only default.
    let r = m.ok("spawn_agent", json!({"task": "t", "command": ["true"]}));
    let st = recorded(&d, r["run_id"].as_str().unwrap());
    assert_eq!(st["tools"], json!(["file_read", "glob", "grep"]), "{st}");
    assert_eq!(st["network"], "none", "{st}");
    assert_eq!(st["rights"]["exec"], false, "{st}");
    assert_eq!(st["rights"]["network"], false, "{st}");
    // A list narrows it.
    let r = m.ok(
        "spawn_agent",
        json!({"task": "t", "command": ["true"], "tools": ["grep"], "write_project": true}),
    );
    let st = recorded(&d, r["run_id"].as_str().unwrap());
    assert_eq!(st["tools"], json!(["grep"]), "{st}");
    assert_eq!(st["rights"]["write_project"], false, "{st}");
}

#[test]
fn with_tools_file_read_asking_for_shell_does_not_give_it() {
    let d = Daemon::start();
    let s = d.socket.to_str().unwrap();
    let args = ["mcp", "--project-dir", "/tmp", "--tools", "file_read"];
    let mut m = Mcp::start(&args, &[("SUBAGENTD_SOCKET", s)]);
    let e = m.refused(
        "spawn_agent",
        json!({"task": "t", "command": ["true"], "tools": ["file_read", "shell"]}),
    );
    assert!(e.contains("not held: shell"), "{e}");
    let r = m.ok("spawn_agent", json!({"task": "t", "command": ["true"]}));
    let st = recorded(&d, r["run_id"].as_str().unwrap());
    assert_eq!(st["tools"], json!(["file_read"]), "{st}");
    assert_eq!(st["rights"]["exec"], false, "{st}");
    assert_eq!(st["network"], "none", "{st}");
}

#[test]
fn the_model_lists_only_hosts_the_server_was_given() {
    let d = Daemon::start();
    let s = d.socket.to_str().unwrap();
    let mut m = Mcp::start(
        &["mcp", "--project-dir", "/tmp"],
        &[("SUBAGENTD_SOCKET", s)],
    );
    let e = m.refused(
        "spawn_agent",
        json!({"task": "t", "command": ["true"], "network_allow": ["127.0.0.1:22"]}),
    );
    assert!(
        e.contains("not held: 127.0.0.1:22") && e.contains("--network-allow"),
        "{e}"
    );
    let l = m.ok("list_agent_runs", json!({}));
    assert_eq!(l["runs"], json!([]), "no run was started: {l}");
    drop(m);
    let args = [
        "mcp",
        "--project-dir",
        "/tmp",
        "--network-allow",
        "*.example.com:443",
    ];
    let mut m = Mcp::start(&args, &[("SUBAGENTD_SOCKET", s)]);
    let e = m.refused(
        "spawn_agent",
        json!({"task": "t", "command": ["true"], "network_allow": ["api.example.com:443", "169.254.169.254:80"]}),
    );
    assert!(e.contains("not held: 169.254.169.254:80;"), "{e}");
    let r = m.ok(
        "spawn_agent",
        json!({"task": "t", "command": ["true"], "network_allow": ["api.example.com:443"]}),
    );
    let st = recorded(&d, r["run_id"].as_str().unwrap());
    assert_eq!(st["network"], "allowlist", "{st}");
    assert_eq!(st["network_allow"], json!(["api.example.com:443"]), "{st}");
}
