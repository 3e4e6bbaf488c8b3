//! Real coding agents as children: the Claude Code and Codex CLIs (as
//! scripts/install-agents installs them) run under the `claude-code` and
//! `codex` drivers against the scripted model server on 127.0.0.1, reached
//! through the daemon's model gateway; and a plain command gets its context
//! on stdin and through argv placeholders.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use subagentd_e2e::agents;
use subagentd_e2e::modelserver::{ModelServer, Turn};
use subagentd_e2e::{session, Daemon, DaemonOpts};

/// A key no file should ever hold.
fn key() -> String {
    format!("sk-test-{}", session("key"))
}

// A daemon for `driver`: agents::daemon.
use subagentd_e2e::agents::daemon;

/// A project dir the run's uid can write (idmapped to its owner).
fn project() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("sa-drv-")
        .tempdir_in("/tmp")
        .unwrap()
}

fn spawn(d: &Daemon, s: &str, project: &Path, tools: &[&str], extra: Value) -> Value {
    let mut params = json!({
        "session": {"id": s, "audience": "personal", "project_dir": project, "tools": tools},
        "task": "Write hello.txt saying hi.",
    });
    for (k, v) in extra.as_object().unwrap() {
        params[k] = v.clone();
    }
    let mut c = d.conn();
    let r = c
        .call("spawn_agent", params)
        .unwrap_or_else(|e| panic!("spawn: {e}"));
    c.wait(r["run_id"].as_str().unwrap())
}

/// Every file under `dir`, recursively (links not followed).
fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let t = e.file_type().unwrap();
        if t.is_dir() {
            files_under(&e.path(), out);
        } else if t.is_file() {
            out.push(e.path());
        }
    }
}

fn assert_nowhere(d: &Daemon, secret: &str) {
    let mut files = Vec::new();
    files_under(&d.state, &mut files);
    assert!(files.len() > 5, "the state dir holds the run: {files:?}");
    for f in files {
        let bytes = std::fs::read(&f).unwrap_or_default();
        let hit = bytes.windows(secret.len()).any(|w| w == secret.as_bytes());
        assert!(!hit, "the API key is in {}", f.display());
    }
    assert!(
        !d.log().contains(secret),
        "the API key is in the daemon's log"
    );
}

fn result_md(st: &Value) -> String {
    std::fs::read_to_string(st["result_path"].as_str().unwrap()).unwrap()
}

/// Claude Code with file_read and file_write only (no shell, no network
/// tool): it gets system.md and the task, is offered Read/Write-class
/// tools only, reaches the model through the daemon's model gateway,
/// which adds the key the daemon holds, writes a file into the project that lands in the
/// session's recent files; the key is nowhere on disk.
#[test]
fn claude_code_writes_a_file_through_the_proxy_with_only_its_tools() {
    let Some(claude) = agents::require(agents::claude, "claude-code") else {
        return;
    };
    let p = project();
    let target = p.path().canonicalize().unwrap().join("hello.txt");
    let server = ModelServer::start(vec![
        Turn::tool(
            "Write",
            json!({"file_path": target, "content": "hi from the model\n"}),
        ),
        Turn::text("Wrote hello.txt."),
    ])
    .unwrap();
    let secret = key();
    let (d, _home) = daemon("claude-code", &claude, &server.base_url(), "", &secret);
    let s = session("cc");
    let started = std::time::Instant::now();
    let st = spawn(
        &d,
        &s,
        p.path(),
        &["file_read", "file_write"],
        json!({"driver": "claude-code"}),
    );
    let wall = started.elapsed();
    let md = result_md(&st);
    assert_eq!(st["state"], "succeeded", "{st}\n{md}");
    eprintln!("claude-code run: {wall:?} from spawn to the end");
    assert_eq!(
        std::fs::read_to_string(&target).unwrap(),
        "hi from the model\n"
    );

    let reqs = server.model_requests();
    assert!(reqs.len() >= 2, "a tool turn and a final turn: {reqs:?}");
    let first = &reqs[0];
    assert!(
        first.system_text().contains("## Execution contract"),
        "system.md reaches the model"
    );
    assert!(
        first
            .user_text()
            .contains("Task: Write hello.txt saying hi."),
        "{}",
        first.user_text()
    );
    assert_eq!(
        first.header("x-api-key"),
        Some(secret.as_str()),
        "the daemon's key reaches the model"
    );
    let offered = first.tool_names();
    assert!(
        offered.contains(&"Write".to_owned()) && offered.contains(&"Read".to_owned()),
        "{offered:?}"
    );
    for denied in ["Bash", "WebFetch", "WebSearch", "Edit", "Task", "Agent"] {
        assert!(
            !offered.contains(&denied.to_owned()),
            "{denied} is offered: {offered:?}"
        );
    }

    let drv = &st["driver"];
    assert_eq!(drv["driver"], "claude-code");
    assert_eq!(drv["delivered"]["stdin"], "first_message.md");
    let report = &drv["report"];
    assert_eq!(report["is_error"], false, "{report}");
    assert_eq!(report["final_text"], "Wrote hello.txt.");
    assert_eq!(report["written"], json!([target]));
    assert_eq!(drv["reported_files"]["accepted"][0]["path"], json!(target));
    assert!(
        md.contains("## Agent") && md.contains("Wrote hello.txt."),
        "{md}"
    );
    // The three sources side by side: no delta, the stream's report, and
    // what the supervisor saw.
    assert!(
        md.contains("| `hello.txt` | - | reported | created |"),
        "{md}"
    );
    assert_eq!(st["observed"]["created"], json!(["hello.txt"]), "{st}");
    let check = d.cli(&["check", st["run_id"].as_str().unwrap()]);
    let text = String::from_utf8_lossy(&check.stdout);
    assert!(text.contains("\ndriver       claude-code\n"), "{text}");
    assert!(
        text.contains("\nanswer       the agent's words: \"Wrote hello.txt.\"\n"),
        "{text}"
    );

    let wc = d
        .conn()
        .call("working_context", json!({"session_id": s}))
        .unwrap();
    assert_eq!(wc["recent_files"][0], json!(target), "{wc}");

    // The endpoint is reached through the daemon's model gateway: the run
    // itself has no network and no allowlist.
    assert_eq!(st["network"], "none");
    assert_eq!(st["network_allow"], Value::Null, "{st}");
    let gateway = std::fs::read_to_string(
        d.state
            .join("sessions")
            .join(&s)
            .join("runs")
            .join(st["run_id"].as_str().unwrap())
            .join("gateway.log"),
    )
    .unwrap();
    let line = format!("\"status\":200,\"upstream\":\"127.0.0.1:{}\"", server.port);
    assert!(
        gateway.contains("\"method\":\"POST\",\"path\":\"/v1/messages") && gateway.contains(&line),
        "{gateway}"
    );
    assert_ne!(
        first.header("x-api-key"),
        Some("subagentd-gateway-placeholder")
    );
    assert_nowhere(&d, &secret);
}

/// Claude Code reads no settings or MCP servers from the project (which a
/// child can write): a project `.claude/settings.json` that redirects its
/// endpoint changes nothing.
#[test]
fn claude_code_ignores_the_projects_settings() {
    let Some(claude) = agents::require(agents::claude, "claude-code") else {
        return;
    };
    let p = project();
    let dot = p.path().join(".claude");
    std::fs::create_dir(&dot).unwrap();
    let redirect = r#"{"env": {"ANTHROPIC_BASE_URL": "http://127.0.0.1:9"}}"#;
    std::fs::write(dot.join("settings.json"), redirect).unwrap();
    std::fs::write(dot.join("settings.local.json"), redirect).unwrap();
    let mcp = r#"{"mcpServers": {"planted": {"command": "/bin/false"}}}"#;
    std::fs::write(p.path().join(".mcp.json"), mcp).unwrap();
    let server = ModelServer::start(vec![Turn::text("Done.")]).unwrap();
    let secret = key();
    let (d, _home) = daemon("claude-code", &claude, &server.base_url(), "", &secret);
    let st = spawn(
        &d,
        &session("cfg"),
        p.path(),
        &["file_read"],
        json!({"driver": "claude-code"}),
    );
    assert_eq!(st["state"], "succeeded", "{st}\n{}", result_md(&st));
    assert!(
        !server.model_requests().is_empty(),
        "the configured endpoint still gets the requests"
    );
    assert_eq!(st["driver"]["report"]["final_text"], "Done.", "{st}");
}

/// An agent that reports an error makes the run `failed` with its
/// message; with file_read alone it is offered no write tool.
#[test]
fn an_agent_error_fails_the_run_and_a_denied_tool_is_never_offered() {
    let Some(claude) = agents::require(agents::claude, "claude-code") else {
        return;
    };
    let server = ModelServer::start(vec![Turn::Error(400, "scripted refusal".into())]).unwrap();
    let secret = key();
    let (d, _home) = daemon("claude-code", &claude, &server.base_url(), "", &secret);
    let p = project();
    let st = spawn(
        &d,
        &session("ccerr"),
        p.path(),
        &["file_read"],
        json!({"driver": "claude-code"}),
    );
    assert_eq!(st["state"], "failed", "{st}");
    let reason = st["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("the agent reported an error"),
        "{reason}"
    );
    assert!(reason.contains("scripted refusal"), "{reason}");
    let offered = server.model_requests()[0].tool_names();
    assert!(offered.contains(&"Read".to_owned()), "{offered:?}");
    for denied in ["Write", "Edit", "MultiEdit", "Bash"] {
        assert!(
            !offered.contains(&denied.to_owned()),
            "{denied} is offered: {offered:?}"
        );
    }
    assert!(
        result_md(&st).contains("- error reported: yes")
            || result_md(&st).contains("error reported: yes")
    );
    assert_nowhere(&d, &secret);
}

/// A driver whose key variable is unset in the daemon is refused at spawn.
#[test]
fn a_driver_without_its_key_is_refused() {
    let Some(claude) = agents::require(agents::claude, "claude-code") else {
        return;
    };
    let home = tempfile::tempdir_in("/tmp").unwrap();
    let cfg = home.path().join("config.toml");
    let text = format!("[drivers.claude-code]\ncommand = {:?}\nbase_url = \"http://127.0.0.1:9\"\napi_key_env = \"SUBAGENT_TEST_UNSET_KEY\"\n", claude.display().to_string());
    std::fs::write(&cfg, text).unwrap();
    let d = Daemon::start_with(DaemonOpts {
        args: vec!["--config".into(), cfg.display().to_string()],
        ..Default::default()
    });
    let p = project();
    let e = d
        .conn()
        .call(
            "spawn_agent",
            json!({"session": {"id": session("nokey"), "audience": "personal", "project_dir": p.path(), "tools": ["file_read"]},
                   "task": "t", "driver": "claude-code"}),
        )
        .unwrap_err();
    assert_eq!(e["code"], -32602, "{e}");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("SUBAGENT_TEST_UNSET_KEY"),
        "{e}"
    );
    let e = d
        .conn()
        .call(
            "spawn_agent",
            json!({"session": {"id": session("nokey"), "audience": "personal", "project_dir": p.path()},
                   "task": "t", "driver": "claude-code", "command": ["true"]}),
        )
        .unwrap_err();
    assert_eq!(e["code"], -32602, "a driver takes no command: {e}");
}

/// A driver run's request may not name a variable that steers its agent
/// (its program's PATH, its endpoint, its config, its loader), and its
/// program is the daemon's: one the daemon cannot find refuses the spawn.
#[test]
fn a_request_never_steers_a_drivers_program_or_endpoint() {
    let p = project();
    let secret = key();
    let (d, _home) = daemon(
        "claude-code",
        Path::new("/bin/sh"),
        "http://127.0.0.1:9",
        "",
        &secret,
    );
    let call = |env: Value| {
        d.conn()
            .call(
                "spawn_agent",
                json!({"session": {"id": session("steer"), "audience": "personal", "project_dir": p.path(), "tools": ["file_read"]},
                       "task": "t", "driver": "claude-code", "env": env}),
            )
            .unwrap_err()
    };
    for name in [
        "PATH",
        "ANTHROPIC_BASE_URL",
        "NODE_OPTIONS",
        "CLAUDE_CONFIG_DIR",
        "OPENAI_BASE_URL",
        "HTTPS_PROXY",
    ] {
        let e = call(json!({ name: "/proj/bin:/usr/bin:/bin" }));
        assert_eq!(e["code"], -32602, "{name}: {e}");
        let m = e["message"].as_str().unwrap();
        assert!(m.contains(&format!("env.{name}")), "{name}: {e}");
    }
    let (d, _home) = daemon(
        "claude-code",
        Path::new("no-such-agent-program"),
        "http://127.0.0.1:9",
        "",
        &secret,
    );
    let e = d
        .conn()
        .call(
            "spawn_agent",
            json!({"session": {"id": session("steer"), "audience": "personal", "project_dir": p.path(), "tools": ["file_read"]},
                   "task": "t", "driver": "claude-code"}),
        )
        .unwrap_err();
    assert_eq!(e["code"], -32602, "{e}");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("\"no-such-agent-program\" is not an executable file in the daemon's PATH"),
        "{e}"
    );
}

/// A driver runs only once the config sets it up, and its endpoint stays
/// within the audience's network cap when the config sets one.
#[test]
fn a_drivers_endpoint_needs_its_table_and_fits_the_audience_cap() {
    let p = project();
    let secret = key();
    let (d, _home) = daemon(
        "claude-code",
        Path::new("/bin/sh"),
        "https://api.anthropic.com",
        "[audiences.team]\nnetwork_allow = []\n[audiences.personal]\nnetwork_allow = [\"api.anthropic.com:443\"]\n\n[]\n",
        &secret,
    );
    let call = |audience: &str, driver: &str| {
        d.conn().call(
            "spawn_agent",
            json!({"session": {"id": session("cap"), "audience": audience, "project_dir": p.path(), "tools": ["file_read"]},
                   "task": "t", "driver": driver}),
        )
    };
    let e = call("team", "claude-code").unwrap_err();
    assert_eq!(e["code"], -32602, "{e}");
    let m = e["message"].as_str().unwrap();
    assert!(
        m.contains("api.anthropic.com:443") && m.contains("[audiences.team] network_allow"),
        "{e}"
    );
    let e = call("personal", "codex").unwrap_err();
    assert_eq!(e["code"], -32602, "{e}");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("the config has no [drivers.codex] table"),
        "{e}"
    );
    let r = call("personal", "claude-code").unwrap();
    let st = d.conn().wait(r["run_id"].as_str().unwrap());
    assert!(st["state"].is_string(), "within the cap it runs: {st}");
}

/// Codex runs a command the model asks for and writes a file; it gets
/// system.md as developer instructions and its prompt on stdin.
#[test]
fn codex_runs_against_the_scripted_provider() {
    let Some(codex) = agents::require(agents::codex, "codex") else {
        return;
    };
    let server = ModelServer::start(vec![
        Turn::tool(
            "exec_command",
            json!({"cmd": "echo made by codex > codex_made.txt"}),
        ),
        Turn::text("codex done"),
    ])
    .unwrap();
    let secret = key();
    let base = format!("{}/v1", server.base_url());
    let (d, _home) = daemon("codex", &codex, &base, "model = \"mock-model\"\n", &secret);
    let p = project();
    let started = std::time::Instant::now();
    let st = spawn(
        &d,
        &session("codex"),
        p.path(),
        &["file_read", "file_write", "shell"],
        json!({"driver": "codex"}),
    );
    eprintln!("codex run: {:?} from spawn to the end", started.elapsed());
    let md = result_md(&st);
    assert_eq!(st["state"], "succeeded", "{st}\n{md}");
    let made = std::fs::read_to_string(p.path().join("codex_made.txt")).unwrap();
    assert_eq!(made, "made by codex\n");
    let reqs = server.model_requests();
    assert!(
        reqs[0].system_text().contains("## Execution contract"),
        "system.md reaches the model"
    );
    assert!(reqs[0]
        .user_text()
        .contains("Task: Write hello.txt saying hi."));
    assert_eq!(
        reqs[0].header("authorization"),
        Some(format!("Bearer {secret}").as_str())
    );
    let report = &st["driver"]["report"];
    assert_eq!(report["final_text"], "codex done", "{report}");
    assert!(
        report["commands"][0]
            .as_str()
            .unwrap()
            .contains("codex_made.txt"),
        "{report}"
    );
    assert!(md.contains("## Agent"), "{md}");
    assert_nowhere(&d, &secret);
}

/// A plain command gets first_message.md on stdin when it asks, and its
/// argv placeholders expanded; `subagent context` says so.
#[test]
fn a_plain_command_gets_its_context_on_stdin_and_in_argv() {
    let d = Daemon::start();
    let script = "cat > \"$SUBAGENT_ARTIFACT_DIR/stdin.txt\"; cp \"$1\" \"$SUBAGENT_ARTIFACT_DIR/system.txt\"; echo \"$2 $3\" > \"$SUBAGENT_ARTIFACT_DIR/args.txt\"";
    let mut c = d.conn();
    let run = c.spawn(
        &session("stdin"),
        &[
            "sh",
            "-c",
            script,
            "sh",
            "{system}",
            "{run_id}",
            "{context_dir}",
        ],
        json!({"stdin": "first_message"}),
    );
    let st = c.wait(&run);
    assert_eq!(st["state"], "succeeded", "{st}");
    let arts = PathBuf::from(st["artifact_dir"].as_str().unwrap());
    let stdin = std::fs::read_to_string(arts.join("stdin.txt")).unwrap();
    assert!(
        stdin.contains("Task: test task") && stdin.contains("[session]"),
        "{stdin}"
    );
    let system = std::fs::read_to_string(arts.join("system.txt")).unwrap();
    assert!(system.starts_with("## Operating rules"), "{system}");
    let args = std::fs::read_to_string(arts.join("args.txt")).unwrap();
    let run_dir = d
        .state
        .join("sessions")
        .join(st["session_id"].as_str().unwrap())
        .join("runs")
        .join(&run);
    assert_eq!(
        args.trim(),
        format!("{run} {}", run_dir.join("context").display())
    );
    let out = d.cli(&["context", &run]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(
            "delivered: first_message.md on stdin; argv: {system}, {run_id}, {context_dir}"
        ),
        "{text}"
    );
    // Without stdin or placeholders, the context is in the files only.
    let plain = c.spawn(&session("files"), &["true"], json!({}));
    c.wait(&plain);
    let text = String::from_utf8_lossy(&d.cli(&["context", &plain]).stdout).into_owned();
    assert!(text.contains("delivered: files only"), "{text}");
}

/// A definition that denies the write and shell tools leaves the model
/// offered none of them; its `model` reaches the request; a project
/// definition's own `driver` is ignored, said in the notes.
#[test]
fn a_definitions_denied_tools_are_never_offered_and_its_model_is_used() {
    let Some(claude) = agents::require(agents::claude, "claude-code") else {
        return;
    };
    let server = ModelServer::start(vec![Turn::text("Read nothing, wrote nothing.")]).unwrap();
    let secret = key();
    let top = "driver = \"claude-code\"\n[]\n";
    let (d, _home) = daemon("claude-code", &claude, &server.base_url(), top, &secret);
    let p = project();
    std::fs::create_dir(p.path().join(".subagents")).unwrap();
    std::fs::write(
        p.path().join(".subagents/reader.md"),
        "---\nname: reader\ndescription: Reads.\ndisallowedTools: Write, Edit, Bash\nmodel: claude-sonnet-4-5\nmaxTurns: 3\ndriver: codex\n---\nYou only read.\n",
    )
    .unwrap();
    let tools = ["file_read", "file_write", "file_edit", "shell"];
    let st = spawn(
        &d,
        &session("def"),
        p.path(),
        &tools,
        json!({"agent": "reader"}),
    );
    assert_eq!(st["state"], "succeeded", "{st}");
    assert_eq!(st["tools"], json!(["file_read"]));
    let req = &server.model_requests()[0];
    let offered = req.tool_names();
    for denied in ["Write", "Edit", "MultiEdit", "Bash"] {
        assert!(
            !offered.contains(&denied.to_owned()),
            "{denied} is offered: {offered:?}"
        );
    }
    assert!(offered.contains(&"Read".to_owned()), "{offered:?}");
    assert_eq!(req.body["model"], "claude-sonnet-4-5");
    assert!(
        req.system_text().contains("You only read."),
        "the definition's body reaches the model"
    );
    let notes = st["notes"].to_string();
    assert!(
        notes.contains("the definition's driver (codex) is ignored"),
        "{st}"
    );
    assert_eq!(
        st["driver"]["report"]["final_text"],
        "Read nothing, wrote nothing."
    );
}

/// An agent whose every write fails (here: outside the project, which the
/// sandbox keeps read-only) exits 0, and the run is `failed` all the same.
#[test]
fn an_agent_whose_every_write_failed_fails_the_run() {
    let Some(claude) = agents::require(agents::claude, "claude-code") else {
        return;
    };
    let server = ModelServer::start(vec![
        Turn::tool(
            "Write",
            json!({"file_path": "/etc/subagent-driver-test.txt", "content": "x"}),
        ),
        Turn::text("I wrote the file."),
    ])
    .unwrap();
    let secret = key();
    let (d, _home) = daemon("claude-code", &claude, &server.base_url(), "", &secret);
    let p = project();
    let st = spawn(
        &d,
        &session("wfail"),
        p.path(),
        &["file_read", "file_write"],
        json!({"driver": "claude-code"}),
    );
    assert_eq!(st["state"], "failed", "{st}");
    assert_eq!(st["exit_code"], 0, "the agent itself exits 0");
    let reason = st["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("every write the agent tried failed"),
        "{reason}"
    );
    assert!(!Path::new("/etc/subagent-driver-test.txt").exists());
    assert_eq!(st["driver"]["report"]["writes_failed"], 1);
    let wc = d
        .conn()
        .call("working_context", json!({"session_id": st["session_id"]}))
        .unwrap();
    assert_eq!(wc["recent_files"], json!([]), "a failed run merges nothing");
}

/// An agent whose every Write failed but which then wrote its file another
/// way (Bash) is not failed: the supervisor saw the project change.
#[test]
fn an_agent_that_recovered_from_failed_writes_succeeds_with_a_note() {
    let Some(claude) = agents::require(agents::claude, "claude-code") else {
        return;
    };
    let p = project();
    let target = p.path().canonicalize().unwrap().join("rescued.txt");
    let server = ModelServer::start(vec![
        Turn::tool(
            "Write",
            json!({"file_path": "/etc/subagent-driver-test.txt", "content": "x"}),
        ),
        Turn::tool(
            "Bash",
            json!({"command": format!("printf hi > {}", target.display()), "description": "write"}),
        ),
        Turn::text("Wrote it with the shell."),
    ])
    .unwrap();
    let secret = key();
    let (d, _home) = daemon("claude-code", &claude, &server.base_url(), "", &secret);
    let st = spawn(
        &d,
        &session("wrescue"),
        p.path(),
        &["file_read", "file_write", "shell"],
        json!({"driver": "claude-code"}),
    );
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "hi", "{st}");
    assert_eq!(st["state"], "succeeded", "{st}");
    assert_eq!(st["driver"]["report"]["writes_failed"], 1);
    assert_eq!(st["observed"]["created"], json!(["rescued.txt"]), "{st}");
    let notes = st["notes"].to_string();
    assert!(
        notes.contains("every write the agent tried failed")
            && notes.contains("saw the project change"),
        "{st}"
    );
}

/// Codex's `turn.failed` (the provider answers 400) makes the run
/// `failed` with its message.
#[test]
fn a_codex_turn_failure_fails_the_run() {
    let Some(codex) = agents::require(agents::codex, "codex") else {
        return;
    };
    let server =
        ModelServer::start(vec![Turn::Error(400, "scripted codex refusal".into())]).unwrap();
    let secret = key();
    let base = format!("{}/v1", server.base_url());
    let (d, _home) = daemon("codex", &codex, &base, "model = \"mock-model\"\n", &secret);
    let p = project();
    let st = spawn(
        &d,
        &session("cxerr"),
        p.path(),
        &["file_read"],
        json!({"driver": "codex"}),
    );
    assert_eq!(st["state"], "failed", "{st}");
    let reason = st["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("the agent reported an error"),
        "{reason}"
    );
    assert_eq!(st["driver"]["report"]["is_error"], true);
    assert_nowhere(&d, &secret);
}

/// A restart (exit 75) reads the newly composed first_message.md, with
/// the earlier attempt's handoff note, on its stdin.
#[test]
fn each_attempt_reads_its_own_first_message_on_stdin() {
    let d = Daemon::start();
    let script = "A=$SUBAGENT_ARTIFACT_DIR; if [ ! -f \"$A/once\" ]; then : > \"$A/once\"; echo 'half done' > \"$A/handoff.md\"; exit 75; fi; cat > \"$A/stdin-2.txt\"";
    let mut c = d.conn();
    let run = c.spawn(
        &session("restart"),
        &["sh", "-c", script],
        json!({"stdin": "first_message", "max_restarts": 1}),
    );
    let st = c.wait(&run);
    assert_eq!(st["state"], "succeeded", "{st}");
    assert_eq!(st["attempt"], 2);
    let arts = PathBuf::from(st["artifact_dir"].as_str().unwrap());
    let stdin = std::fs::read_to_string(arts.join("stdin-2.txt")).unwrap();
    assert!(
        stdin.contains("[handoff]") && stdin.contains("half done"),
        "{stdin}"
    );
    assert!(stdin.contains("attempt: 2 of 2"), "{stdin}");
}
