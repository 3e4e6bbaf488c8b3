//! Tool policy end to end: the child gets exactly the tools its parent may
//! delegate, its OS rights follow from them, and definitions narrow them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use subagentd_e2e::{session, Daemon};

struct Env {
    d: Daemon,
    project: tempfile::TempDir,
}

fn env() -> Env {
    let project = tempfile::Builder::new()
        .prefix("sa-tools-")
        .tempdir_in("/tmp")
        .unwrap();
    Env {
        d: Daemon::start(),
        project,
    }
}

impl Env {
    fn spawn(&self, tools: Option<&[&str]>, extra: Value) -> Result<Value, Value> {
        let mut c = self.d.conn();
        let mut params = json!({
            "session": {"id": session("tools"), "audience": "team", "project_dir": self.project.path()},
            "task": "t",
        });
        if let Some(t) = tools {
            params["session"]["tools"] = json!(t);
        }
        if let Value::Object(m) = extra {
            for (k, v) in m {
                params[k] = v;
            }
        }
        let r = c.call("spawn_agent", params)?;
        Ok(c.wait(r["run_id"].as_str().unwrap()))
    }

    fn run(&self, tools: Option<&[&str]>, script: &str, extra: Value) -> (Value, String) {
        let mut extra = extra;
        extra["command"] = json!(["sh", "-c", script]);
        let st = self
            .spawn(tools, extra)
            .unwrap_or_else(|e| panic!("spawn refused: {e}"));
        let log = std::fs::read_to_string(st["log_path"].as_str().unwrap()).unwrap();
        (st, log)
    }
}

fn tools_json(st: &Value) -> Vec<String> {
    let dir = Path::new(st["log_path"].as_str().unwrap())
        .parent()
        .unwrap()
        .join("context");
    let v: Value = serde_json::from_slice(&std::fs::read(dir.join("tools.json")).unwrap()).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn a_child_never_gets_delegation_or_attach_tools() {
    let e = env();
    let parent = [
        "file_read",
        "file_write",
        "shell",
        "web_fetch",
        "spawn_agent",
        "attach_file",
    ];
    let (st, _) = e.run(Some(&parent), "true", json!({}));
    assert_eq!(st["state"], "succeeded", "{st}");
    assert_eq!(
        tools_json(&st),
        ["file_read", "file_write", "shell", "web_fetch"]
    );
    assert_eq!(
        st["tools"],
        json!(["file_read", "file_write", "shell", "web_fetch"])
    );
    assert_eq!(
        st["rights"],
        json!({"read_project": true, "write_project": true, "exec": true, "network": true})
    );
    let result = std::fs::read_to_string(st["result_path"].as_str().unwrap()).unwrap();
    assert!(
        result.contains("- tools: file_read, file_write, shell, web_fetch"),
        "{result}"
    );
    assert!(result.contains(
        "- rights: read project yes, write project yes, run other programs yes, network yes"
    ));
}

#[test]
fn the_project_is_writable_only_with_a_write_tool() {
    let e = env();
    let script = "echo new > ./made && echo WROTE || echo refused";
    let (_, log) = e.run(Some(&["file_read", "shell"]), script, json!({}));
    assert!(log.contains("refused") && !log.contains("WROTE"), "{log}");
    assert!(!e.project.path().join("made").exists());
    let (_, log) = e.run(Some(&["file_read", "file_edit"]), script, json!({}));
    assert!(log.contains("WROTE"), "{log}");
    assert!(e.project.path().join("made").exists());
    // An explicit switch narrows, never widens.
    std::fs::remove_file(e.project.path().join("made")).unwrap();
    let (st, log) = e.run(
        Some(&["file_write"]),
        script,
        json!({"sandbox": {"write_project": false}}),
    );
    assert!(log.contains("refused"), "{log}");
    assert_eq!(st["rights"]["write_project"], false);
    let (st, _) = e.run(
        Some(&["file_read"]),
        script,
        json!({"sandbox": {"write_project": true}}),
    );
    assert_eq!(
        st["rights"]["write_project"], false,
        "a switch cannot widen beyond the tools"
    );
}

#[test]
fn the_network_needs_a_network_tool() {
    let e = env();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let py = format!("import socket\ntry:\n\tsocket.create_connection(('127.0.0.1', {port}), timeout=5); print('CONNECTED')\nexcept OSError as e:\n\tprint('refused', e.errno)\n");
    let command = json!(["/usr/bin/python3", "-c", py]);
    let st = e
        .spawn(Some(&["file_read", "shell"]), json!({"command": command}))
        .unwrap();
    let log = std::fs::read_to_string(st["log_path"].as_str().unwrap()).unwrap();
    assert!(
        log.contains("refused") && !log.contains("CONNECTED"),
        "{log}"
    );
    let st = e
        .spawn(Some(&["web_fetch"]), json!({"command": command}))
        .unwrap();
    let log = std::fs::read_to_string(st["log_path"].as_str().unwrap()).unwrap();
    assert!(log.contains("CONNECTED"), "{log}");
}

#[test]
fn other_programs_run_only_with_an_exec_tool() {
    let e = env();
    let script = "cat /etc/hostname >/dev/null && echo RAN || echo refused";
    let (_, log) = e.run(Some(&["file_read"]), script, json!({}));
    assert!(log.contains("refused") && !log.contains("RAN"), "{log}");
    let (_, log) = e.run(Some(&["file_read", "shell"]), script, json!({}));
    assert!(log.contains("RAN"), "{log}");
}

#[test]
fn unknown_tools_are_refused_by_name() {
    let e = env();
    let err = e
        .spawn(
            Some(&["file_read", "teleport", "blink"]),
            json!({"command": ["true"]}),
        )
        .unwrap_err();
    assert_eq!(err["code"], -32602);
    assert_eq!(
        err["message"],
        "invalid params: session.tools: unknown tools: blink, teleport"
    );
}

fn write_def(project: &Path, dir: &str, name: &str, text: &str) -> PathBuf {
    let d = project.join(dir);
    std::fs::create_dir_all(&d).unwrap();
    let p = d.join(format!("{name}.md"));
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn a_definition_narrows_the_tools_and_gives_the_command() {
    let e = env();
    write_def(
        e.project.path(),
        ".subagents",
        "reader",
        "---\nname: reader\ndescription: Reads only.\ntools: [file_read, grep]\ncommand: [sh, -c, 'echo from-definition; echo x > ./w || echo refused']\nlimits:\n  memory_mb: 64\n  pids: 16\n---\nYou read.\n",
    );
    let st = e
        .spawn(
            Some(&["file_read", "file_write", "shell"]),
            json!({"agent": "reader"}),
        )
        .unwrap();
    assert_eq!(st["state"], "succeeded", "{st}");
    assert_eq!(st["agent"], "reader");
    assert_eq!(st["tools"], json!(["file_read"]));
    let log = std::fs::read_to_string(st["log_path"].as_str().unwrap()).unwrap();
    assert!(
        log.contains("from-definition") && log.contains("refused"),
        "{log}"
    );
    // A definition that lists tools needs the parent's tools to filter.
    let err = e.spawn(None, json!({"agent": "reader"})).unwrap_err();
    assert!(
        err["message"].as_str().unwrap().contains("session.tools"),
        "{err}"
    );
}

#[test]
fn claude_code_agent_files_work_unchanged() {
    let e = env();
    write_def(
        e.project.path(),
        ".claude/agents",
        "code-reviewer",
        "---\nname: code-reviewer\ndescription: Expert reviewer\ntools: Read, Grep, Glob\nmodel: sonnet\n---\nReview.\n",
    );
    let st = e
        .spawn(
            Some(&["file_read", "grep", "glob", "shell"]),
            json!({"agent": "code-reviewer", "command": ["true"]}),
        )
        .unwrap();
    assert_eq!(st["tools"], json!(["file_read", "glob", "grep"]));
}

#[test]
fn malformed_and_unknown_definitions_are_named() {
    let e = env();
    let bad = write_def(
        e.project.path(),
        ".subagents",
        "broken",
        "---\nname: broken\ndescription: d\ntools: 5\n---\n",
    );
    write_def(
        e.project.path(),
        ".subagents",
        "good",
        "---\nname: good\ndescription: fine\n---\n",
    );
    let err = e
        .spawn(
            Some(&["file_read"]),
            json!({"agent": "broken", "command": ["true"]}),
        )
        .unwrap_err();
    let msg = err["message"].as_str().unwrap();
    assert!(
        msg.contains(&format!("{}:4: tools:", bad.display())),
        "{msg}"
    );
    let err = e
        .spawn(
            Some(&["file_read"]),
            json!({"agent": "missing", "command": ["true"]}),
        )
        .unwrap_err();
    assert_eq!(
        err["message"],
        "invalid params: agent: no agent named \"missing\"; available: good"
    );
    // The broken file does not hide the good one.
    let st = e
        .spawn(
            Some(&["file_read"]),
            json!({"agent": "good", "command": ["true"]}),
        )
        .unwrap();
    assert_eq!(st["state"], "succeeded");
    // `subagent agents` lists both, and exits 1 for the broken one.
    let out = e.d.cli(&[
        "agents",
        "--project-dir",
        e.project.path().to_str().unwrap(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text.contains("good\n  source:")
            && text.contains("error: ")
            && text.contains("broken.md:4"),
        "{text}"
    );
}

#[test]
fn the_command_can_come_from_the_config() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, "command = [\"sh\", \"-c\", \"echo from-config\"]\n[audiences.team]\ntools = [\"file_read\"]\n").unwrap();
    let d = Daemon::start_with(subagentd_e2e::DaemonOpts {
        args: vec!["--config".into(), cfg.display().to_string()],
        ..Default::default()
    });
    let project = tempfile::tempdir().unwrap();
    let mut c = d.conn();
    let r = c
        .call(
            "spawn_agent",
            json!({"session": {"id": session("cfgcmd"), "audience": "team", "project_dir": project.path(), "tools": ["file_read", "shell"]}, "task": "t"}),
        )
        .unwrap();
    let st = c.wait(r["run_id"].as_str().unwrap());
    assert_eq!(
        std::fs::read_to_string(st["log_path"].as_str().unwrap()).unwrap(),
        "from-config\n"
    );
    assert_eq!(
        st["tools"],
        json!(["file_read"]),
        "the team audience holds file_read only"
    );
}
