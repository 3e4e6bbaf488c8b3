//! `subagent mcp` driven by real MCP clients: the reference Python client
//! (PyPI `mcp`, in target/mcp-venv from scripts/install-mcp-client) through
//! tests/mcp/driver.py, and the Claude Code CLI.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;
use subagentd_e2e::mcpstdio::LineChild;
use subagentd_e2e::{
    alive, bin, runnable, sleep_marker, sleeping, unsafe_kill, wait_until, Conn, Daemon,
};

/// The repository's root.
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The venv's python, or `None` (having said SKIPPED) when it is missing.
fn python() -> Option<PathBuf> {
    let py = std::env::var_os("SUBAGENT_MCP_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target/mcp-venv/bin/python"));
    let ok = py.is_file();
    runnable(
        ok,
        "mcp-client",
        &format!(
            "the Python MCP client is not installed at {} (run scripts/install-mcp-client)",
            py.display()
        ),
    )
    .then_some(py)
}

/// A Python MCP client connected to one `subagent mcp`.
struct Client {
    io: LineChild,
    /// What `initialize` returned.
    init: Value,
    /// The server's stderr (and the driver's).
    errlog: PathBuf,
    _dir: tempfile::TempDir,
}

impl Client {
    /// Starts `subagent <args>` under the driver with `env` (the client
    /// passes only a minimal environment on, plus this).
    fn start(py: &Path, args: &[&str], env: Value) -> Client {
        let dir = tempfile::tempdir().unwrap();
        let errlog = dir.path().join("server.log");
        let cfg = json!({
            "command": bin("subagent"), "args": args, "env": env, "cwd": "/tmp",
            "errlog": errlog, "client_name": "py test",
        });
        let io = LineChild::spawn(
            Command::new(py)
                .arg(repo().join("tests/mcp/driver.py"))
                .arg(cfg.to_string()),
        );
        let mut c = Client {
            io,
            init: Value::Null,
            errlog,
            _dir: dir,
        };
        c.init = c.read()["initialize"].clone();
        assert!(
            c.init.is_object(),
            "no initialize result; log:\n{}",
            c.log()
        );
        c
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.errlog).unwrap_or_default()
    }

    fn read(&self) -> Value {
        let line = self
            .io
            .recv(Duration::from_secs(120))
            .unwrap_or_else(|e| panic!("no answer from the driver ({e}); log:\n{}", self.log()));
        serde_json::from_str(&line).unwrap()
    }

    fn send(&mut self, cmd: Value) -> Value {
        self.io.write(&cmd);
        let v = self.read();
        assert!(
            v.get("error").is_none(),
            "{cmd} -> {v}; log:\n{}",
            self.log()
        );
        v
    }

    /// Calls a tool; returns `{result, progress}`.
    fn call_with(&mut self, name: &str, args: Value, progress: bool) -> Value {
        self.send(json!({"op": "call", "name": name, "args": args, "progress": progress}))
    }

    /// Calls a tool that must succeed; returns its result.
    fn ok(&mut self, name: &str, args: Value) -> Value {
        let r = self.call_with(name, args.clone(), false)["result"].clone();
        assert_eq!(r["isError"], false, "{name} {args} -> {r}");
        r
    }

    /// Calls a tool that must fail as a tool error; returns its text.
    fn tool_error(&mut self, op: &str, name: &str, args: Value) -> String {
        let r = self.send(json!({"op": op, "name": name, "args": args}))["result"].clone();
        assert_eq!(r["isError"], true, "{name} {args} -> {r}");
        r["content"][0]["text"].as_str().unwrap().to_owned()
    }
}

/// The text of a tool result.
fn text(r: &Value) -> &str {
    r["content"][0]["text"].as_str().unwrap_or("")
}

/// `subagent mcp` options against the test daemon `d`.
fn against(d: &Daemon) -> Vec<String> {
    [
        "--state-dir",
        d.state.to_str().unwrap(),
        "mcp",
        "--project-dir",
        "/tmp",
    ]
    .map(String::from)
    .to_vec()
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn initialize_lists_every_tool_with_a_schema() {
    let Some(py) = python() else { return };
    let d = Daemon::start();
    let c_args = against(&d);
    let mut c = Client::start(&py, &strs(&c_args), json!({"SUBAGENTD_SOCKET": d.socket}));
    assert_eq!(c.init["serverInfo"]["name"], "subagent");
    assert!(c.init["capabilities"]["tools"].is_object(), "{}", c.init);
    let tools = c.send(json!({"op": "list_tools"}))["tools"].clone();
    let mut names: Vec<&str> = tools
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "agent_usage",
            "cancel_agent_run",
            "check_agent_run",
            "list_agent_runs",
            "list_agents",
            "read_agent_log",
            "spawn_agent",
            "take_notices",
            "wait_agent_run",
            "working_context"
        ]
    );
    for t in tools.as_array().unwrap() {
        assert_eq!(t["inputSchema"]["type"], "object", "{t}");
        assert!(t["description"].as_str().unwrap().len() > 40, "{t}");
    }
    let spawn = tools
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "spawn_agent")
        .unwrap();
    let props = spawn["inputSchema"]["properties"].as_object().unwrap();
    for p in [
        "task",
        "context",
        "agent",
        "driver",
        "command",
        "tools",
        "write_project",
        "network_allow",
        "wall_time_s",
        "worktree",
    ] {
        assert!(props.contains_key(p), "spawn_agent lacks {p}: {spawn}");
    }
    assert_eq!(spawn["inputSchema"]["required"], json!(["task"]));
}

#[test]
fn spawn_then_wait_with_progress_then_read_the_log() {
    let Some(py) = python() else { return };
    let d = Daemon::start();
    let mut args = against(&d);
    args.extend(["--tools".into(), "file_read,shell,spawn_agent".into()]);
    let env = json!({"SUBAGENTD_SOCKET": d.socket, "SUBAGENT_MCP_PROGRESS_MS": "300"});
    let mut c = Client::start(&py, &strs(&args), env);
    // The child looks for the socket the server was told of, and writes an
    // escape sequence a terminal would act on.
    let script = "echo started; echo sock=${SUBAGENTD_SOCKET:-none}; \
                  if [ -S \"$1\" ]; then echo reach; else echo noreach; fi; \
                  sleep 1.5; printf 'done \\033]0;pwned\\007\\n'";
    let sock = d.socket.to_str().unwrap();
    let r = c.ok(
        "spawn_agent",
        json!({"task": "print and sleep", "command": ["sh", "-c", script, "sh", sock]}),
    );
    let s = &r["structuredContent"];
    let run = s["run_id"].as_str().unwrap().to_owned();
    assert!(
        s["session_id"].as_str().unwrap().starts_with("py-test-"),
        "{s}"
    );
    assert!(
        matches!(s["state"].as_str(), Some("accepted" | "running")),
        "{s}"
    );
    assert!(
        s["log_path"].as_str().unwrap().ends_with("/child.log"),
        "{s}"
    );
    assert!(
        s["result_path"].as_str().unwrap().ends_with("/result.md"),
        "{s}"
    );
    assert!(text(&r).contains(&run), "{r}");

    let w = c.call_with(
        "wait_agent_run",
        json!({"run_id": run, "timeout_s": 30}),
        true,
    );
    let res = &w["result"];
    assert_eq!(res["isError"], false, "{w}");
    let st = &res["structuredContent"];
    assert_eq!(st["state"], "succeeded", "{w}");
    assert_eq!(res["structuredContent"]["still_running"], false);
    assert_eq!(
        st["tools"],
        json!(["file_read", "shell"]),
        "the parent's tools, never spawn_agent: {st}"
    );
    assert!(st["isolation"]["root"] == true, "a sandboxed child: {st}");
    let progress = w["progress"].as_array().unwrap();
    assert!(
        progress.len() >= 2,
        "a 1.5 s run, progress every 0.3 s: {w}"
    );
    let p: Vec<f64> = progress
        .iter()
        .map(|p| p["progress"].as_f64().unwrap())
        .collect();
    assert!(
        p.windows(2).all(|w| w[0] < w[1]),
        "progress increases: {p:?}"
    );
    assert!(
        progress[0]["message"].as_str().unwrap().contains("running"),
        "{w}"
    );

    check_log_reads(&mut c, &run);
    check_session_views(&mut c, &run);
}

/// The log of the run of the test above, read whole, from an offset and
/// by its last line, with the child's escape sequence shown escaped.
fn check_log_reads(c: &mut Client, run: &str) {
    let log = c.ok("read_agent_log", json!({"run_id": run}));
    let all = log.to_string();
    assert!(text(&log).contains("started"), "{log}");
    assert!(
        text(&log).contains("sock=none") && text(&log).contains("noreach"),
        "{log}"
    );
    assert!(
        text(&log).contains("done \\x1b]0;pwned\\x07"),
        "escaped: {log}"
    );
    assert!(
        !all.contains('\u{1b}') && !all.contains("\\u001b"),
        "no raw ESC: {all}"
    );
    let from = c.ok("read_agent_log", json!({"run_id": run, "offset": 8}));
    assert_eq!(from["structuredContent"]["offset"], 8);
    assert!(
        from["structuredContent"]["text"]
            .as_str()
            .unwrap()
            .starts_with("sock=none"),
        "{from}"
    );
    let tail = c.ok("read_agent_log", json!({"run_id": run, "tail": 1}));
    assert_eq!(
        tail["structuredContent"]["text"], "done \\x1b]0;pwned\\x07\n",
        "{tail}"
    );
}

/// This session's notices, runs and working context after that run.
fn check_session_views(c: &mut Client, run: &str) {
    let n = c.ok("take_notices", json!({}));
    assert_eq!(n["structuredContent"]["notices"][0]["run_id"], run, "{n}");
    let l = c.ok("list_agent_runs", json!({}));
    assert_eq!(
        l["structuredContent"]["runs"].as_array().unwrap().len(),
        1,
        "{l}"
    );
    let wc = c.ok("working_context", json!({}));
    assert!(text(&wc).contains("project_dir: /tmp"), "{wc}");
    // A plain command reports no usage: counted, nothing summed.
    let u = c.ok("agent_usage", json!({}));
    let sum = &u["structuredContent"];
    assert_eq!(
        (sum["runs"].as_u64(), sum["reported"].as_u64()),
        (Some(1), Some(0)),
        "{u}"
    );
    assert_eq!(sum["by_driver"]["command"]["runs"], 1, "{u}");
    assert!(sum["cost_usd"].is_null(), "{u}");
    assert!(text(&u).contains("runs of session py-test-"), "{u}");
}

#[test]
fn a_wait_that_times_out_says_still_running_and_cancel_ends_the_run() {
    let Some(py) = python() else { return };
    let d = Daemon::start();
    let c_args = against(&d);
    let mut c = Client::start(&py, &strs(&c_args), json!({"SUBAGENTD_SOCKET": d.socket}));
    let marker = sleep_marker();
    let r = c.ok(
        "spawn_agent",
        json!({"task": "sleep", "command": ["sleep", marker]}),
    );
    let run = r["structuredContent"]["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    wait_until(Duration::from_secs(20), "the child to sleep", || {
        !sleeping(&marker).is_empty()
    });
    let w = c.ok("wait_agent_run", json!({"run_id": run, "timeout_s": 1}));
    assert_eq!(w["structuredContent"]["still_running"], true, "{w}");
    assert!(text(&w).contains("still running"), "{w}");
    assert!(
        w["structuredContent"]["elapsed_ms"].as_u64().is_some(),
        "{w}"
    );
    let c1 = c.ok("check_agent_run", json!({"run_id": run}));
    assert_eq!(c1["structuredContent"]["state"], "running", "{c1}");
    let x = c.ok("cancel_agent_run", json!({"run_id": run}));
    assert_eq!(x["structuredContent"]["cancel_requested"], true, "{x}");
    let w = c.ok("wait_agent_run", json!({"run_id": run, "timeout_s": 30}));
    assert_eq!(w["structuredContent"]["state"], "cancelled", "{w}");
    assert!(sleeping(&marker).is_empty(), "the child is gone");
    let l = c.ok("list_agent_runs", json!({"state": "cancelled"}));
    assert_eq!(
        l["structuredContent"]["runs"][0]["run_id"],
        run.as_str(),
        "{l}"
    );
    let all = c.ok("list_agent_runs", json!({"session": "*"}));
    assert!(!all["structuredContent"]["runs"]
        .as_array()
        .unwrap()
        .is_empty());
}

#[test]
fn malformed_calls_are_tool_errors_and_the_session_goes_on() {
    let Some(py) = python() else { return };
    let d = Daemon::start();
    let mut c_args = against(&d);
    c_args.extend(["--tools".into(), "file_read".into()]);
    let mut c = Client::start(&py, &strs(&c_args), json!({"SUBAGENTD_SOCKET": d.socket}));
    let e = c.tool_error("raw_call", "spawn_agent", json!({"task": 5}));
    assert!(
        e.contains("bad arguments for spawn_agent") && e.contains("task"),
        "{e}"
    );
    let e = c.tool_error(
        "raw_call",
        "spawn_agent",
        json!({"task": "x", "timeout": 5}),
    );
    assert!(e.contains("timeout"), "{e}");
    let e = c.tool_error("raw_call", "spawn_agent", json!({}));
    assert!(e.contains("task"), "{e}");
    let e = c.tool_error("raw_call", "no_such_tool", json!({}));
    assert!(
        e.contains("no tool named") && e.contains("spawn_agent"),
        "{e}"
    );
    let e = c.tool_error("call", "check_agent_run", json!({"run_id": "../../etc"}));
    assert!(
        e.contains("is not a run id") && e.contains("code -32602"),
        "{e}"
    );
    let e = c.tool_error(
        "call",
        "wait_agent_run",
        json!({"run_id": "20261130T055552.123456Z-a1b2c3d4"}),
    );
    assert!(
        e.contains("run not found") && e.contains("list_agent_runs"),
        "{e}"
    );
    let e = c.tool_error(
        "call",
        "spawn_agent",
        json!({"task": "x", "command": ["true"], "tools": ["shell"]}),
    );
    assert!(e.contains("not held: shell"), "{e}");
    let e = c.tool_error(
        "call",
        "spawn_agent",
        json!({"task": "  ", "command": ["true"]}),
    );
    assert!(e.contains("task: must not be empty"), "{e}");
    let e = c.tool_error("call", "list_agent_runs", json!({"state": "done"}));
    assert!(e.contains("state"), "{e}");
    // The session is still usable.
    let r = c.ok("spawn_agent", json!({"task": "t", "command": ["true"]}));
    let run = r["structuredContent"]["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let w = c.ok("wait_agent_run", json!({"run_id": run}));
    assert_eq!(w["structuredContent"]["state"], "succeeded", "{w}");
    assert_eq!(w["structuredContent"]["tools"], json!(["file_read"]), "{w}");
}

#[test]
fn a_driver_is_passed_on_to_the_daemon() {
    let Some(py) = python() else { return };
    let d = Daemon::start();
    let c_args = against(&d);
    let mut c = Client::start(&py, &strs(&c_args), json!({"SUBAGENTD_SOCKET": d.socket}));
    let r = c.call_with(
        "spawn_agent",
        json!({"task": "t", "command": ["true"], "driver": "no-such-driver"}),
        false,
    )["result"]
        .clone();
    // A daemon that knows drivers refuses this one; one that does not
    // refuses the field. Either way it saw `driver`.
    assert_eq!(r["isError"], true, "{r}");
    assert!(
        text(&r).contains("driver") && text(&r).contains("-32602"),
        "{r}"
    );
}

#[test]
fn starts_a_daemon_when_none_answers() {
    let Some(py) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (run, state) = (dir.path().join("run"), dir.path().join("state"));
    std::fs::create_dir(&run).unwrap();
    let env = json!({"XDG_RUNTIME_DIR": run, "XDG_STATE_HOME": state});
    let socket = run.join("subagentd/subagentd.sock");
    let daemon_pid = || {
        let mut conn = Conn::connect(&socket);
        conn.call("ping", json!({})).unwrap()["pid"]
            .as_i64()
            .unwrap() as i32
    };
    let mut c = Client::start(&py, &["mcp"], env);
    let first = daemon_pid();
    assert!(c.log().contains("no subagentd answered"), "{}", c.log());
    assert!(c.log().contains(&format!("pid {first}")), "{}", c.log());
    // A daemon it started that ends is reaped, not left a zombie.
    unsafe_kill(first, libc::SIGTERM);
    wait_until(
        Duration::from_secs(20),
        "the first daemon to be reaped",
        || !Path::new(&format!("/proc/{first}")).exists(),
    );
    c.ok("list_agent_runs", json!({}));
    let pid = daemon_pid();
    let _stop = KillOnDrop(pid);
    assert_ne!(pid, first, "a second daemon was started");
    let r = c.ok(
        "spawn_agent",
        json!({"task": "t", "command": ["echo", "hello"]}),
    );
    let run_id = r["structuredContent"]["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        r["structuredContent"]["log_path"]
            .as_str()
            .unwrap()
            .starts_with(state.join("subagentd").to_str().unwrap()),
        "default state dir: {r}"
    );
    let w = c.ok("wait_agent_run", json!({"run_id": run_id}));
    assert_eq!(w["structuredContent"]["state"], "succeeded", "{w}");
    assert!(
        w["structuredContent"]["log_tail"]
            .as_str()
            .unwrap()
            .contains("hello"),
        "{w}"
    );
    drop(c);
    assert!(
        alive(pid),
        "the daemon outlives the MCP server that started it"
    );
    // A second server finds the running daemon and starts none.
    let c2 = Client::start(
        &py,
        &["mcp"],
        json!({"XDG_RUNTIME_DIR": run, "XDG_STATE_HOME": state}),
    );
    assert!(!c2.log().contains("no subagentd answered"), "{}", c2.log());
}

#[test]
fn a_planted_socket_dir_starts_no_daemon() {
    let Some(py) = python() else { return };
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let (run, state) = (dir.path().join("run"), dir.path().join("state"));
    let planted = run.join("subagentd");
    std::fs::create_dir_all(&planted).unwrap();
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "keep\n").unwrap();
    std::os::unix::fs::symlink(&victim, planted.join("subagentd.log")).unwrap();
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o777)).unwrap();
    if subagentd_e2e::is_root() {
        std::os::unix::fs::chown(&planted, Some(65534), Some(65534)).unwrap();
    }
    let env = json!({"XDG_RUNTIME_DIR": run, "XDG_STATE_HOME": state});
    let mut c = Client::start(&py, &["mcp"], env);
    let e = c.tool_error("call", "list_agent_runs", json!({}));
    assert!(e.contains("refusing its socket directory"), "{e}");
    assert!(e.contains(planted.to_str().unwrap()), "{e}");
    assert!(e.contains("remove or fix that directory"), "{e}");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep\n");
    assert!(
        !planted.join("subagentd.sock").exists(),
        "no daemon bound there"
    );
}

/// SIGTERMs a daemon the test did not start itself, and waits for it.
struct KillOnDrop(i32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        unsafe_kill(self.0, libc::SIGTERM);
        wait_until(
            Duration::from_secs(20),
            "the started daemon to exit",
            || !alive(self.0),
        );
    }
}

/// Runs Claude Code in `cwd` with a private HOME and only `env` besides,
/// killed after two minutes; returns its stdout and stderr.
fn claude(
    claude: &Path,
    home: &Path,
    cwd: &Path,
    args: &[&str],
    env: &[(&str, String)],
) -> (String, String) {
    let out = cwd.join("claude.out");
    let err = cwd.join("claude.err");
    let mut cmd = Command::new(claude);
    cmd.args(args)
        .current_dir(cwd)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("CLAUDE_CODE_MAX_RETRIES", "0")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "claude {args:?} ran over two minutes; stderr:\n{}",
                std::fs::read_to_string(&err).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    (
        std::fs::read_to_string(&out).unwrap(),
        std::fs::read_to_string(&err).unwrap(),
    )
}

#[test]
fn claude_mcp_add_then_list_reports_it_connected() {
    let Some(cc) = subagentd_e2e::agents::require(subagentd_e2e::agents::claude, "claude-code")
    else {
        return;
    };
    let d = Daemon::start();
    let home = tempfile::tempdir().unwrap();
    let project = tempfile::tempdir().unwrap();
    let subagent = bin("subagent");
    let sock = d.socket.to_str().unwrap();
    let add = [
        "mcp",
        "add",
        "--scope",
        "local",
        "subagent",
        "--",
        subagent.to_str().unwrap(),
        "--socket",
        sock,
        "mcp",
        "--no-start-daemon",
    ];
    let (out, err) = claude(&cc, home.path(), project.path(), &add, &[]);
    assert!(
        out.contains("Added stdio MCP server subagent"),
        "{out}\n{err}"
    );
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(home.path().join(".claude.json")).unwrap())
            .unwrap();
    let projects = config["projects"].as_object().unwrap();
    assert!(
        projects
            .values()
            .any(|p| p["mcpServers"]["subagent"]["command"] == subagent.to_str().unwrap()),
        "the server is in the private HOME's config: {config}"
    );
    let (out, err) = claude(&cc, home.path(), project.path(), &["mcp", "list"], &[]);
    let line = out
        .lines()
        .find(|l| l.starts_with("subagent:"))
        .unwrap_or_else(|| panic!("{out}\n{err}"));
    assert!(
        line.contains("Connected") && !line.contains("Failed"),
        "{out}\n{err}"
    );
}

/// The events of Claude Code's `--output-format stream-json` output.
fn events(out: &str) -> Vec<Value> {
    out.lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The `result` event's text, checked not to be an error.
fn final_text(out: &str, err: &str) -> String {
    let ev = events(out);
    let r = ev
        .iter()
        .find(|e| e["type"] == "result")
        .unwrap_or_else(|| panic!("no result event:\n{out}\n{err}"));
    assert_eq!(r["is_error"], false, "{r}");
    r["result"].as_str().unwrap().to_owned()
}

/// The text of the last tool result of a model request.
fn last_tool_result(req: &subagentd_e2e::modelserver::Request) -> String {
    let results: Vec<&Value> = req.body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["content"].as_array())
        .flatten()
        .filter(|b| b["type"] == "tool_result")
        .collect();
    results
        .last()
        .map(|b| b["content"].to_string())
        .unwrap_or_default()
}

/// Claude Code in -p mode with `subagent mcp` as its only MCP server.
struct Parent {
    cc: PathBuf,
    home: tempfile::TempDir,
    project: tempfile::TempDir,
    mcp_file: PathBuf,
}

impl Parent {
    fn new(cc: PathBuf, d: &Daemon, session: &str) -> Parent {
        let home = tempfile::tempdir().unwrap();
        let project = tempfile::tempdir().unwrap();
        let mcp = json!({"mcpServers": {"subagent": {"command": bin("subagent"),
            "args": ["--socket", d.socket, "mcp", "--session", session, "--no-start-daemon",
                     "--tools", "file_read,shell"]}}});
        let mcp_file = home.path().join("mcp.json");
        std::fs::write(&mcp_file, mcp.to_string()).unwrap();
        Parent {
            cc,
            home,
            project,
            mcp_file,
        }
    }

    /// One `claude -p` against a model following `script`; returns the
    /// model server (with the requests it got) and Claude's final text.
    fn turn(
        &self,
        script: Vec<subagentd_e2e::modelserver::Turn>,
        prompt: &str,
        more: &[&str],
    ) -> (subagentd_e2e::modelserver::ModelServer, String, String) {
        let model = subagentd_e2e::modelserver::ModelServer::start(script).unwrap();
        let env = [
            ("ANTHROPIC_BASE_URL", model.base_url()),
            ("ANTHROPIC_API_KEY", "k".to_owned()),
        ];
        let mut args = vec![
            "-p",
            prompt,
            "--mcp-config",
            self.mcp_file.to_str().unwrap(),
            "--strict-mcp-config",
            "--allowedTools",
            "mcp__subagent__spawn_agent,mcp__subagent__wait_agent_run",
            "--output-format",
            "stream-json",
            "--verbose",
        ];
        args.extend_from_slice(more);
        let (out, err) = claude(&self.cc, self.home.path(), self.project.path(), &args, &env);
        let text = final_text(&out, &err);
        (model, out, text)
    }
}

/// The run ended well, in `project`, sandboxed, without the socket, as a
/// uid of its own under a root daemon, and left its marker.
fn assert_ran_sandboxed(st: &Value, project: &Path) {
    assert_eq!(st["state"], "succeeded", "{st}");
    assert_eq!(
        st["project_dir"],
        project.to_str().unwrap(),
        "the parent's cwd: {st}"
    );
    for m in ["namespaces", "root", "landlock", "seccomp", "capabilities"] {
        assert_eq!(st["isolation"][m]["enforced"], true, "{m}: {st}");
    }
    let log = std::fs::read_to_string(st["log_path"].as_str().unwrap()).unwrap();
    assert!(
        log.contains("noreach"),
        "the child cannot reach the socket: {log}"
    );
    if subagentd_e2e::is_root() {
        assert!(
            !log.contains("uid=0"),
            "a root daemon's child runs as a uid of its own: {log}"
        );
    }
    let marker = Path::new(st["artifact_dir"].as_str().unwrap()).join("marker.txt");
    assert_eq!(std::fs::read_to_string(marker).unwrap(), "ran\n");
}

#[test]
fn claude_code_as_parent_spawns_a_sandboxed_child_and_gets_its_result() {
    use subagentd_e2e::modelserver::Turn;
    let Some(cc) = subagentd_e2e::agents::require(subagentd_e2e::agents::claude, "claude-code")
    else {
        return;
    };
    let d = Daemon::start();
    let session = subagentd_e2e::session("cc-parent");
    let parent = Parent::new(cc, &d, &session);
    // The child says who it runs as, whether it sees the socket, and
    // leaves a marker among its artifacts.
    let script = "echo hello-from-child uid=$(id -u); \
                  if [ -S \"$1\" ]; then echo reach; else echo noreach; fi; \
                  echo ran > \"$SUBAGENT_ARTIFACT_DIR/marker.txt\"";
    let spawn = json!({"task": "write a marker", "command": ["sh", "-c", script, "sh", d.socket]});

    // The parent's first turn spawns the child.
    let script = vec![
        Turn::tool("mcp__subagent__spawn_agent", spawn),
        Turn::text("spawned it"),
    ];
    let (model, out, text) = parent.turn(script, "delegate the marker task", &[]);
    assert_eq!(text, "spawned it");
    let init = events(&out)
        .into_iter()
        .find(|e| e["subtype"] == "init")
        .unwrap();
    assert_eq!(init["mcp_servers"][0]["status"], "connected", "{init}");
    let reqs = model.model_requests();
    assert_eq!(reqs.len(), 2, "{reqs:?}");
    let runs = d
        .conn()
        .call("list_agent_runs", json!({"session_id": session}))
        .unwrap();
    let run = runs["runs"][0]["run_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no run: {runs}"))
        .to_owned();
    let spawned = last_tool_result(&reqs[1]);
    assert!(
        spawned.contains(&run),
        "the parent got the run id: {spawned}"
    );

    // Its next turn, in the same conversation, waits for it.
    let wait = json!({"run_id": run, "timeout_s": 30});
    let script = vec![
        Turn::text("unused"),
        Turn::tool("mcp__subagent__wait_agent_run", wait),
        Turn::text("the child is done"),
    ];
    let (model, _, text) = parent.turn(script, "wait for it", &["--continue"]);
    assert_eq!(text, "the child is done");
    let waited = last_tool_result(model.model_requests().last().unwrap());
    assert!(
        waited.contains("succeeded") && waited.contains("hello-from-child"),
        "the parent got the result: {waited}"
    );
    let st = d
        .conn()
        .call("check_agent_run", json!({"run_id": run}))
        .unwrap();
    assert_ran_sandboxed(&st, parent.project.path());
}

#[test]
fn codex_mcp_add_writes_the_server_into_its_config() {
    let Some(codex) = subagentd_e2e::agents::require(subagentd_e2e::agents::codex, "codex") else {
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let codex_home = home.path().join(".codex");
    std::fs::create_dir(&codex_home).unwrap();
    let subagent = bin("subagent");
    let run = |args: &[&str]| {
        let out = Command::new(&codex)
            .args(args)
            .current_dir(home.path())
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", home.path())
            .env("CODEX_HOME", &codex_home)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "codex {args:?}: {text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    };
    run(&[
        "mcp",
        "add",
        "subagent",
        "--",
        subagent.to_str().unwrap(),
        "mcp",
        "--tools",
        "file_read,shell",
    ]);
    let config = std::fs::read_to_string(codex_home.join("config.toml")).unwrap();
    assert!(config.contains("[mcp_servers.subagent]"), "{config}");
    assert!(
        config.contains(&format!("command = {:?}", subagent.to_str().unwrap())),
        "{config}"
    );
    assert!(
        config.contains(r#"args = ["mcp", "--tools", "file_read,shell"]"#),
        "{config}"
    );
    let list = run(&["mcp", "list"]);
    let line = list
        .lines()
        .find(|l| l.starts_with("subagent "))
        .unwrap_or_else(|| panic!("{list}"));
    assert!(line.contains("enabled"), "{list}");
}

/// How many sockets the process `pid` holds: `subagent mcp` holds one
/// more than at rest while a call to the daemon is in flight.
fn sockets(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|fds| {
            fds.flatten()
                .filter(|fd| {
                    std::fs::read_link(fd.path())
                        .is_ok_and(|l| l.to_string_lossy().starts_with("socket:"))
                })
                .count()
        })
        .unwrap_or(0)
}

#[test]
fn a_daemon_restart_during_a_wait_is_a_tool_error_and_the_session_goes_on() {
    let Some(py) = python() else { return };
    let mut d = Daemon::start();
    let mut c_args = against(&d);
    c_args.push("--no-start-daemon".into());
    let mut c = Client::start(&py, &strs(&c_args), json!({"SUBAGENTD_SOCKET": d.socket}));
    let server = subagentd_e2e::pids_with(&format!("{} mcp --project-dir", d.state.display()));
    assert_eq!(server.len(), 1, "one subagent mcp: {server:?}");
    let marker = sleep_marker();
    let r = c.ok(
        "spawn_agent",
        json!({"task": "sleep", "command": ["sleep", marker]}),
    );
    let run = r["structuredContent"]["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    wait_until(Duration::from_secs(20), "the child to sleep", || {
        !sleeping(&marker).is_empty()
    });
    let wait = json!({"op": "call", "name": "wait_agent_run",
                      "args": {"run_id": run, "timeout_s": 40}});
    let at_rest = sockets(server[0]);
    c.io.write(&wait);
    wait_until(
        Duration::from_secs(20),
        "the wait to reach the daemon",
        || sockets(server[0]) > at_rest,
    );
    assert!(d.stop().success());
    // Answered by the daemon as it stops (-32004), or, when it had not
    // read the request yet, cut off by it.
    let answer = c.read()["result"].clone();
    assert_eq!(answer["isError"], true, "{answer}");
    assert!(text(&answer).contains("again"), "says what to do: {answer}");
    assert!(
        !text(&answer).contains("cannot reach"),
        "the wait was sent: {answer}"
    );
    d.restart();
    assert!(
        !sleeping(&marker).is_empty(),
        "the run went on without the daemon"
    );
    let c1 = c.ok("check_agent_run", json!({"run_id": run}));
    assert_eq!(c1["structuredContent"]["state"], "running", "{c1}");
    c.ok("cancel_agent_run", json!({"run_id": run}));
    let w = c.ok("wait_agent_run", json!({"run_id": run, "timeout_s": 30}));
    assert_eq!(w["structuredContent"]["state"], "cancelled", "{w}");
}
