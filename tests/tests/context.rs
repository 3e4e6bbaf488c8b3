//! The composed context of a run, `subagent context`, and restart with
//! handoff.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use subagentd_e2e::{session, Daemon};

fn ctx_dir(st: &Value) -> PathBuf {
    Path::new(st["log_path"].as_str().unwrap())
        .parent()
        .unwrap()
        .join("context")
}

const RESTARTING: &str = r#"
n=$(cat "$TMPDIR/n" 2>/dev/null || echo 0); n=$((n+1)); echo $n > "$TMPDIR/n"
echo "attempt $n"
grep -q "note from attempt 2" "$SUBAGENT_CONTEXT_DIR/first_message.md" && echo SAW-NOTE-2
grep -q "attempt: $n of" "$SUBAGENT_CONTEXT_DIR/first_message.md" && echo CONTRACT-KNOWS-$n
if [ $n -lt 3 ]; then echo "note from attempt $n" > "$SUBAGENT_ARTIFACT_DIR/handoff.md"; exit 75; fi
exit 0
"#;

#[test]
fn a_child_that_asks_twice_to_be_continued_runs_three_attempts() {
    let d = Daemon::start();
    let mut c = d.conn();
    let run = c.spawn(&session("restart"), &["sh", "-c", RESTARTING], json!({}));
    let st = c.wait(&run);
    assert_eq!(st["state"], "succeeded", "{st}");
    assert_eq!(st["attempt"], 3);
    assert_eq!(st["max_attempts"], 4, "1 + the default 3 restarts");
    let log = std::fs::read_to_string(st["log_path"].as_str().unwrap()).unwrap();
    for want in [
        "attempt 1",
        "[subagentd: attempt 2 of 4]",
        "[subagentd: attempt 3 of 4]",
        "attempt 3",
        "SAW-NOTE-2",
        "CONTRACT-KNOWS-3",
    ] {
        assert!(log.contains(want), "{want} missing:\n{log}");
    }
    let ctx = ctx_dir(&st);
    for n in 1..=3 {
        let plan: Value =
            serde_json::from_slice(&std::fs::read(ctx.join(format!("plan-{n}.json"))).unwrap())
                .unwrap();
        assert_eq!(plan["attempt"], n);
    }
    let first = std::fs::read_to_string(ctx.join("first_message.md")).unwrap();
    assert!(
        first.contains("[handoff]\nAn earlier attempt (2 of 4) was cut off"),
        "{first}"
    );
}

#[test]
fn a_child_that_always_asks_ends_failed_after_max_restarts() {
    let d = Daemon::start();
    let mut c = d.conn();
    let run = c.spawn(
        &session("always"),
        &[
            "sh",
            "-c",
            "echo again > \"$SUBAGENT_ARTIFACT_DIR/handoff.md\"; exit 75",
        ],
        json!({"max_restarts": 2}),
    );
    let st = c.wait(&run);
    assert_eq!(st["state"], "failed", "{st}");
    assert_eq!(st["exit_code"], 75);
    assert_eq!(st["attempt"], 3);
    assert_eq!(
        st["reason"],
        "asked to be continued (exit 75) after the last of 3 attempts"
    );
    // Without restarts, 75 is just a failure.
    let run = c.spawn(
        &session("always"),
        &["sh", "-c", "exit 75"],
        json!({"max_restarts": 0}),
    );
    let st = c.wait(&run);
    assert_eq!(
        (st["state"].as_str(), st["attempt"].as_u64()),
        (Some("failed"), Some(1))
    );
}

#[test]
fn a_handoff_symlink_is_not_followed() {
    let d = Daemon::start();
    let mut c = d.conn();
    let script = r#"
        if [ -e "$TMPDIR/second" ]; then cat "$SUBAGENT_CONTEXT_DIR/first_message.md"; exit 0; fi
        touch "$TMPDIR/second"; ln -s /etc/shadow "$SUBAGENT_ARTIFACT_DIR/handoff.md"; exit 75
    "#;
    let run = c.spawn(&session("link"), &["sh", "-c", script], json!({}));
    let st = c.wait(&run);
    assert_eq!(st["state"], "succeeded");
    let log = std::fs::read_to_string(st["log_path"].as_str().unwrap()).unwrap();
    assert!(!log.contains("root:"), "{log}");
    let plan: Value =
        serde_json::from_slice(&std::fs::read(ctx_dir(&st).join("plan.json")).unwrap()).unwrap();
    assert!(
        plan["omitted"]
            .as_array()
            .unwrap()
            .iter()
            .any(|o| o["reason"] == "the earlier attempt left no handoff.md"),
        "{plan}"
    );
}

#[test]
fn the_composed_files_and_subagent_context() {
    let d = Daemon::start();
    let project = tempfile::Builder::new()
        .prefix("sa-ctx-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::write(
        project.path().join("AGENTS.md"),
        "Run the tests before you finish.\n",
    )
    .unwrap();
    let mut c = d.conn();
    let r = c
        .call(
            "spawn_agent",
            json!({"session": {"id": session("ctx"), "audience": "team", "project_dir": project.path(), "tools": ["file_read", "shell"]},
                   "task": "Look around.", "context": "First visit.", "command": ["true"]}),
        )
        .unwrap();
    let run = r["run_id"].as_str().unwrap().to_owned();
    let st = c.wait(&run);
    let ctx = ctx_dir(&st);
    let system = std::fs::read_to_string(ctx.join("system.md")).unwrap();
    let order = [
        "## Operating rules",
        "## Project instructions",
        "## Tools",
        "## Execution contract",
    ];
    let pos: Vec<usize> = order
        .iter()
        .map(|h| system.find(h).unwrap_or_else(|| panic!("{h}:\n{system}")))
        .collect();
    assert!(pos.windows(2).all(|w| w[0] < w[1]), "{system}");
    assert!(system.contains("Run the tests before you finish."));
    assert!(
        system.contains("- file_read: Read a file of the project.\n- shell: Run a shell command")
    );
    assert!(
        !system.contains("Your role"),
        "no definition: the layer is left out"
    );
    let out = d.cli(&["context", &run, "--detail"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("project_instructions")
            && text.contains("AGENTS.md")
            && text.contains("stable_prefix: "),
        "{text}"
    );
    assert!(
        text.contains("omitted: agent (no agent definition given)"),
        "{text}"
    );
    assert!(text.contains("tool schemas (largest first):"), "{text}");
    let out = d.cli(&["--json", "context", &run]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["stable_prefix"].as_str().unwrap().len(), 64);
    let out = d.cli(&["context", &run, "--show"]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("===== system.md =====\n## Operating rules")
    );
    // Same inputs, same system.md: a second run with another task keeps
    // the stable prefix only if its paths match, so compare the layers'
    // hashes that do not depend on the run.
    let plan: Value =
        serde_json::from_slice(&std::fs::read(ctx.join("plan.json")).unwrap()).unwrap();
    let rules = plan["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == "operating_rules")
        .unwrap();
    assert_eq!(rules["source"], "built-in");
    assert_eq!(
        rules["sha256"].as_str().unwrap(),
        policy::compose::sha256_hex(policy::compose::CORE_RULES.as_bytes())
    );
}
