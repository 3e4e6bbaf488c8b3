//! Golden files for the composed context (tests/golden/<case>/): Personal
//! and Team, with and without project instructions, with and without a
//! definition body, in and out of a git repository. `UPDATE_GOLDEN=1`
//! rewrites them; otherwise any byte of difference fails.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use policy::compose::{compose, Caps, ComposeInput, SessionPaths, Sourced};
use policy::toolpolicy::ToolPolicy;
use policy::workctx::{render_block, GitSnapshot};
use policy::Audience;
use std::path::{Path, PathBuf};

fn input(audience: Audience, instructions: bool, body: bool, git: bool) -> ComposeInput {
    let policy = ToolPolicy::builtin();
    let parent: Vec<String> = [
        "file_read",
        "file_write",
        "file_edit",
        "grep",
        "shell",
        "web_fetch",
        "spawn_agent",
        "attach_file",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let def: Option<Vec<String>> = (audience == Audience::Team)
        .then(|| vec!["file_read".into(), "grep".into(), "shell".into()]);
    let tools = policy
        .child_tools(audience, &parent, def.as_deref())
        .unwrap();
    let snapshot = if git {
        GitSnapshot::Available {
            worktree: "/work/app".into(),
            common_dir: "/work/app/.git".into(),
            branch: "main".into(),
            head: "1a2b3c4".into(),
            upstream: Some("origin/main".into()),
            ahead: Some(1),
            behind: Some(0),
            staged: 0,
            modified: 2,
            untracked: 1,
        }
    } else {
        GitSnapshot::Unavailable {
            reason: "not a git repository".into(),
        }
    };
    ComposeInput {
        playbook: None,
        project_instructions: instructions.then(|| Sourced {
            path: "/work/app/AGENTS.md".into(),
            text: "Run `cargo test` before you finish.\nKeep changes small.\n".into(),
        }),
        agent: body.then(|| Sourced {
            path: "/work/app/.subagents/fixer.md".into(),
            text: "You fix failing tests, one at a time.\n".into(),
        }),
        tools: tools
            .iter()
            .map(|n| (n.clone(), policy.tool(n).unwrap().description.clone()))
            .collect(),
        tools_json: policy.tools_json(&tools),
        paths: SessionPaths {
            session_id: "parent-1".into(),
            temp_dir: "/tmp/subagentd-1000/parent-1/c0123abcd".into(),
            artifact_dir: "/state/sessions/parent-1/runs/R/artifacts".into(),
            worktree_dir: None,
            log_path: "/state/sessions/parent-1/runs/R/child.log".into(),
            delta_path: "/state/sessions/parent-1/runs/R/delta/delta.json".into(),
        },
        task: "Make the flaky test in tests/net.rs pass reliably.".into(),
        context: Some("It fails about one run in ten on CI.".into()),
        working_context: render_block(
            Path::new("/work/app"),
            &[PathBuf::from("/work/app/tests/net.rs")],
            &snapshot,
        ),
        caps: Caps::default(),
        max_attempts: 4,
    }
}

fn check(case: &str, input: &ComposeInput) {
    let c = compose(input, 1, None);
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("golden")
        .join(case);
    let files = [
        ("system.md", &c.system_md),
        ("first_message.md", &c.first_message_md),
        ("plan.json", &c.plan_json),
    ];
    if std::env::var("UPDATE_GOLDEN").is_ok_and(|v| v == "1") {
        std::fs::create_dir_all(&dir).unwrap();
        for (name, text) in files {
            std::fs::write(dir.join(name), text).unwrap();
        }
    }
    for (name, text) in files {
        let want = std::fs::read_to_string(dir.join(name))
            .unwrap_or_else(|e| panic!("{case}/{name}: {e} (run with UPDATE_GOLDEN=1 once)"));
        assert_eq!(text, &want, "{case}/{name} differs from its golden file");
    }
    // Composing again gives the same bytes.
    assert_eq!(compose(input, 1, None), c);
}

#[test]
fn personal_with_instructions_and_body_in_git() {
    check(
        "personal-instructions-body-git",
        &input(Audience::Personal, true, true, true),
    );
}

#[test]
fn personal_without_instructions_with_body_outside_git() {
    check(
        "personal-body-nogit",
        &input(Audience::Personal, false, true, false),
    );
}

#[test]
fn team_with_instructions_without_body_in_git() {
    check(
        "team-instructions-git",
        &input(Audience::Team, true, false, true),
    );
}

#[test]
fn team_bare_outside_git() {
    check(
        "team-bare-nogit",
        &input(Audience::Team, false, false, false),
    );
}
