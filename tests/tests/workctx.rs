//! The working context end to end: recent files, the git snapshot at
//! spawn, verified deltas merged once from successful children, worktrees.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use subagentd_e2e::{session, Daemon};

fn git(dir: &Path, args: &[&str]) -> String {
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
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A git project with two committed files whose mtimes are long past.
fn project() -> tempfile::TempDir {
    let d = tempfile::Builder::new()
        .prefix("sa-wc-")
        .tempdir_in("/tmp")
        .unwrap();
    for f in ["old.txt", "b.txt"] {
        std::fs::write(d.path().join(f), "x\n").unwrap();
        let file = std::fs::File::options()
            .write(true)
            .open(d.path().join(f))
            .unwrap();
        file.set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_600_000_000))
            .unwrap();
    }
    git(d.path(), &["init", "-q"]);
    git(d.path(), &["add", "."]);
    git(d.path(), &["commit", "-qm", "init"]);
    d
}

fn canon(p: &Path) -> PathBuf {
    p.canonicalize().unwrap()
}

fn spawn(d: &Daemon, s: &str, project: &Path, script: &str, extra: Value) -> Value {
    let mut c = d.conn();
    let mut params = json!({
        "session": {"id": s, "audience": "personal", "project_dir": project, "tools": ["file_read", "file_write", "shell"]},
        "task": "t",
        "command": ["sh", "-c", script],
    });
    if let Value::Object(m) = extra {
        for (k, v) in m {
            if k == "session" {
                for (sk, sv) in v.as_object().unwrap() {
                    params["session"][sk] = sv.clone();
                }
            } else {
                params[k] = v;
            }
        }
    }
    let r = c
        .call("spawn_agent", params)
        .unwrap_or_else(|e| panic!("{e}"));
    c.wait(r["run_id"].as_str().unwrap())
}

fn recent(d: &Daemon, s: &str) -> Vec<String> {
    let v = d
        .conn()
        .call("working_context", json!({"session_id": s}))
        .unwrap();
    v["recent_files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn only_verified_written_and_edited_files_are_merged() {
    let d = Daemon::start();
    let p = project();
    let s = session("delta");
    let script = r#"
        echo new > new.txt
        mkdir sub
        echo more >> b.txt
        ln -s /etc/hostname link-out
        echo gone > gone.txt; rm gone.txt
        cat > "$SUBAGENT_DELTA_PATH" <<'JSON'
{"written": ["new.txt", "../outside.txt", "/etc/passwd", "link-out", "gone.txt", "sub/../new.txt"],
 "edited": ["b.txt", "old.txt"],
 "read": ["old.txt"]}
JSON
    "#;
    let st = spawn(&d, &s, p.path(), script, json!({}));
    assert_eq!(st["state"], "succeeded", "{st}");
    let delta = &st["delta"];
    let accepted: Vec<&str> = delta["accepted"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["accepted"].as_str().unwrap())
        .collect();
    let root = canon(p.path());
    let (new, b) = (root.join("new.txt"), root.join("b.txt"));
    assert_eq!(
        accepted,
        [
            new.to_str().unwrap(),
            new.to_str().unwrap(),
            b.to_str().unwrap()
        ],
        "{delta}"
    );
    let rejected: Vec<(&str, &str)> = delta["rejected"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| (v["path"].as_str().unwrap(), v["rejected"].as_str().unwrap()))
        .collect();
    assert_eq!(
        rejected,
        [
            ("../outside.txt", "does not exist"),
            ("/etc/passwd", "outside the project"),
            ("link-out", "outside the project"),
            ("gone.txt", "does not exist"),
            ("old.txt", "not modified during the run"),
        ]
    );
    assert_eq!(
        recent(&d, &s),
        [new.to_str().unwrap(), b.to_str().unwrap()],
        "read paths never merge"
    );
    let result = std::fs::read_to_string(st["result_path"].as_str().unwrap()).unwrap();
    assert!(
        result.contains(&format!("- merged into recent files: `{}`", new.display())),
        "{result}"
    );
    assert!(
        result.contains("- rejected: `/etc/passwd` (outside the project)"),
        "{result}"
    );
    // The git snapshot at spawn was recorded.
    assert_eq!(st["git"]["status"], "available");
    assert_eq!(st["git"]["branch"], "main");
}

#[test]
fn unsuccessful_runs_and_malformed_deltas_merge_nothing() {
    let d = Daemon::start();
    let p = project();
    let s = session("nomerge");
    let write = r#"echo x > f.txt; echo '{"written": ["f.txt"]}' > "$SUBAGENT_DELTA_PATH""#;
    let failed = spawn(&d, &s, p.path(), &format!("{write}; exit 1"), json!({}));
    assert_eq!(failed["state"], "failed");
    assert_eq!(failed["delta"]["note"], "nothing merged: the run failed");
    let timed = spawn(
        &d,
        &s,
        p.path(),
        &format!("{write}; sleep 30"),
        json!({"limits": {"wall_time_s": 1}}),
    );
    assert_eq!(timed["state"], "timed_out");
    assert!(recent(&d, &s).is_empty());
    for (bad, why) in [
        ("not json", "not valid"),
        (r#"{"written": "f.txt"}"#, "not valid"),
        (r#"{"written": [1]}"#, "not valid"),
    ] {
        let script = format!("echo x > f.txt; printf '%s' '{bad}' > \"$SUBAGENT_DELTA_PATH\"");
        let st = spawn(&d, &s, p.path(), &script, json!({}));
        assert_eq!(
            st["state"], "succeeded",
            "a bad delta does not change the state"
        );
        assert!(
            st["delta"]["note"].as_str().unwrap().contains(why),
            "{}",
            st["delta"]
        );
        assert_eq!(st["delta"]["accepted"], json!([]), "{}", st["delta"]);
        // What the child really wrote is still seen, by the supervisor.
        assert_eq!(st["observed"]["modified"], json!(["f.txt"]), "{st}");
    }
    let big = "head -c 1100000 /dev/zero | tr '\\0' ' ' > \"$SUBAGENT_DELTA_PATH\"";
    let st = spawn(&d, &s, p.path(), big, json!({}));
    assert!(
        st["delta"]["note"]
            .as_str()
            .unwrap()
            .contains("over the limit"),
        "{}",
        st["delta"]
    );
    let none = spawn(&d, &s, p.path(), "true", json!({}));
    assert_eq!(none["delta"]["note"], "no delta was written");
    // Only the observation merged anything: the file the successful runs
    // rewrote, not one path of their malformed deltas.
    let f = canon(p.path()).join("f.txt");
    assert_eq!(recent(&d, &s), [f.display().to_string()]);
}

/// A child that writes no delta at all: the supervisor's own pictures
/// before and after tell what it created, changed and deleted, in a
/// repository (ignored files left out) and in a plain directory; on
/// success those files merge into recent files, and result.md shows the
/// sources side by side.
#[test]
fn what_a_child_changed_is_observed_without_a_delta() {
    let d = Daemon::start();
    let s = session("observed");
    let p = project();
    std::fs::write(p.path().join(".gitignore"), "build/\n").unwrap();
    std::fs::write(p.path().join("doomed.txt"), "d\n").unwrap();
    git(p.path(), &["add", "."]);
    git(p.path(), &["commit", "-qm", "more"]);
    let outside = tempfile::tempdir().unwrap();
    let script = format!(
        "echo new > new.txt; echo more >> b.txt; rm doomed.txt; mkdir -p build; echo o > build/out.o; echo host > {}/host.txt",
        outside.path().display()
    );
    let st = spawn(
        &d,
        &s,
        p.path(),
        &script,
        json!({"sandbox": {"write_paths": [outside.path()]}}),
    );
    assert_eq!(st["state"], "succeeded", "{st}");
    let o = &st["observed"];
    assert_eq!(o["source"], "git_status", "{o}");
    assert_eq!(o["created"], json!(["new.txt"]), "{o}");
    assert_eq!(o["modified"], json!(["b.txt"]), "{o}");
    assert_eq!(o["deleted"], json!(["doomed.txt"]), "{o}");
    let root = canon(p.path());
    let mut got = recent(&d, &s);
    got.sort();
    let mut want = [root.join("b.txt"), root.join("new.txt")].map(|p| p.display().to_string());
    want.sort();
    assert_eq!(got, want);
    let result = std::fs::read_to_string(st["result_path"].as_str().unwrap()).unwrap();
    assert!(
        result
            .contains("- observed (git status before and after): 1 created, 1 modified, 1 deleted"),
        "{result}"
    );
    assert!(
        result.contains("| `new.txt` | - | - | created |"),
        "{result}"
    );
    assert!(
        result.contains("| `doomed.txt` | - | - | deleted |"),
        "{result}"
    );

    // Committing what it changed, hiding a file through .git/info/exclude
    // and planting a hook do not hide them: the second picture compares
    // with the first HEAD, and .git's control files are looked at too.
    let script = "echo c > committed.txt && git add committed.txt && git -c user.name=t -c user.email=t@t commit -qm c \
        && mkdir -p .git/info && echo hidden.txt >> .git/info/exclude && echo h > hidden.txt \
        && printf '#!/bin/sh\\n' > .git/hooks/pre-commit";
    let st = spawn(&d, &s, p.path(), script, json!({}));
    assert_eq!(st["state"], "succeeded", "{st}");
    let o = &st["observed"];
    let has = |list: &str, p: &str| o[list].as_array().unwrap().contains(&json!(p));
    assert!(has("created", "committed.txt"), "{o}");
    assert!(has("created", ".git/hooks/pre-commit"), "{o}");
    assert!(
        has("created", ".git/info/exclude") || has("modified", ".git/info/exclude"),
        "{o}"
    );
    assert!(
        o["note"]
            .as_str()
            .unwrap_or_default()
            .starts_with("HEAD moved from "),
        "{o}"
    );
    assert!(
        !recent(&d, &s).iter().any(|f| f.contains("/.git/")),
        "git's own files never merge"
    );

    // A plain directory, scanned; a failed run's changes are seen, not merged.
    let plain = tempfile::Builder::new()
        .prefix("sa-obs-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::create_dir(plain.path().join("src")).unwrap();
    std::fs::write(plain.path().join("src/keep.rs"), "k").unwrap();
    let s2 = session("observed-plain");
    let st = spawn(
        &d,
        &s2,
        plain.path(),
        "echo x > src/made.rs; exit 1",
        json!({}),
    );
    assert_eq!(st["state"], "failed", "{st}");
    assert_eq!(st["observed"]["source"], "scan", "{st}");
    assert_eq!(st["observed"]["created"], json!(["src/made.rs"]));
    assert!(recent(&d, &s2).is_empty());
    let st = spawn(&d, &s2, plain.path(), "echo y >> src/keep.rs", json!({}));
    assert_eq!(st["observed"]["modified"], json!(["src/keep.rs"]), "{st}");
    assert_eq!(
        recent(&d, &s2),
        [canon(plain.path())
            .join("src/keep.rs")
            .display()
            .to_string()]
    );

    // A run that cannot write its project is not observed at all.
    let ro = d
        .conn()
        .call(
            "spawn_agent",
            json!({"session": {"id": s2, "audience": "personal", "project_dir": plain.path(), "tools": ["file_read"]}, "task": "t", "command": ["true"]}),
        )
        .unwrap();
    let st = d.conn().wait(ro["run_id"].as_str().unwrap());
    assert_eq!(
        st["observed"]["note"], "not observed: the run could not write its project",
        "{st}"
    );
}

#[test]
fn recent_files_are_seeded_capped_and_ordered() {
    let d = Daemon::start();
    let p = project();
    let s = session("cap");
    let seed: Vec<String> = (0..8).map(|i| format!("seed{i}.rs")).collect();
    let script = r#"for i in 1 2 3 4 5; do echo $i > w$i.txt; done; echo '{"written": ["w5.txt", "w4.txt", "w3.txt", "w2.txt", "w1.txt"]}' > "$SUBAGENT_DELTA_PATH""#;
    spawn(
        &d,
        &s,
        p.path(),
        script,
        json!({"session": {"recent_files": seed}}),
    );
    let root = canon(p.path());
    let got = recent(&d, &s);
    let mut want: Vec<String> = ["w5", "w4", "w3", "w2", "w1"]
        .iter()
        .map(|w| root.join(format!("{w}.txt")).display().to_string())
        .collect();
    want.extend((0..5).map(|i| p.path().join(format!("seed{i}.rs")).display().to_string()));
    assert_eq!(got, want);
    // touch_files puts the parent's own files first.
    let v = d
        .conn()
        .call(
            "touch_files",
            json!({"session_id": s, "files": ["seed7.rs", "/abs/x.rs"]}),
        )
        .unwrap();
    let list = v["recent_files"].as_array().unwrap();
    assert_eq!(list.len(), 10);
    assert_eq!(list[0], p.path().join("seed7.rs").display().to_string());
    assert_eq!(list[1], "/abs/x.rs");
    // The block, through the CLI.
    let out = d.cli(&["context-of", "--session", &s]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with(&format!(
            "[working-context]\nproject_dir: {}\nrecent_files:\n- {}",
            p.path().display(),
            p.path().join("seed7.rs").display()
        )),
        "{text}"
    );
    assert!(
        text.contains("git: worktree=") && text.contains("branch=main"),
        "{text}"
    );
}

#[test]
fn twenty_concurrent_children_of_one_session_are_all_merged() {
    let d = Daemon::start_with(subagentd_e2e::DaemonOpts {
        max_concurrent: Some(20),
        ..Default::default()
    });
    let p = project();
    let s = session("many");
    let mut c = d.conn();
    let runs: Vec<String> = (0..20)
        .map(|i| {
            let script = format!("echo {i} > c{i}.txt; echo '{{\"written\": [\"c{i}.txt\"]}}' > \"$SUBAGENT_DELTA_PATH\"");
            let r = c
                .call(
                    "spawn_agent",
                    json!({"session": {"id": s, "audience": "personal", "project_dir": p.path(), "tools": ["file_write", "shell"]}, "task": "t", "command": ["sh", "-c", script]}),
                )
                .unwrap();
            r["run_id"].as_str().unwrap().to_owned()
        })
        .collect();
    let mut merged = Vec::new();
    for r in &runs {
        let st = c.wait(r);
        assert_eq!(st["state"], "succeeded", "{st}");
        let acc = st["delta"]["accepted"].as_array().unwrap();
        assert_eq!(acc.len(), 1, "{}", st["delta"]);
        merged.push(acc[0]["accepted"].as_str().unwrap().to_owned());
    }
    let got = recent(&d, &s);
    assert_eq!(got.len(), 10);
    let mut distinct = got.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 10, "no entry lost or doubled: {got:?}");
    assert!(got.iter().all(|g| merged.contains(g)));
}

#[test]
fn worktree_isolation_end_to_end() {
    let d = Daemon::start();
    let p = project();
    let s = session("wt");
    let script =
        r#"pwd; echo change > old.txt; echo '{"edited": ["old.txt"]}' > "$SUBAGENT_DELTA_PATH""#;
    let st = spawn(&d, &s, p.path(), script, json!({"isolation": "worktree"}));
    assert_eq!(st["state"], "succeeded", "{st}");
    let wt = PathBuf::from(st["worktree_dir"].as_str().unwrap());
    let branch = st["worktree_branch"].as_str().unwrap().to_owned();
    assert_eq!(
        branch,
        format!("subagent/{}", st["run_id"].as_str().unwrap())
    );
    let log = std::fs::read_to_string(st["log_path"].as_str().unwrap()).unwrap();
    assert_eq!(
        log.lines().next().unwrap(),
        wt.display().to_string(),
        "the child worked in its worktree"
    );
    assert_eq!(
        std::fs::read_to_string(wt.join("old.txt")).unwrap(),
        "change\n"
    );
    assert_eq!(
        std::fs::read_to_string(p.path().join("old.txt")).unwrap(),
        "x\n",
        "the project is untouched"
    );
    assert_eq!(
        recent(&d, &s),
        [canon(&wt).join("old.txt").display().to_string()]
    );
    assert!(git(p.path(), &["branch", "--list", &branch]).contains(&branch));
    let result = std::fs::read_to_string(st["result_path"].as_str().unwrap()).unwrap();
    assert!(
        result.contains(&format!(
            "- worktree: `{}` (branch `{branch}`)",
            wt.display()
        )),
        "{result}"
    );
    // Kept after the run; removed on request, with its branch.
    let out = d.cli(&["worktree", "rm", st["run_id"].as_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!wt.exists());
    assert!(git(p.path(), &["branch", "--list", &branch]).is_empty());
    // Not in a git repository: an error.
    let plain = tempfile::tempdir().unwrap();
    let err = d
        .conn()
        .call(
            "spawn_agent",
            json!({"session": {"id": s, "audience": "personal", "project_dir": plain.path()}, "task": "t", "command": ["true"], "isolation": "worktree"}),
        )
        .unwrap_err();
    assert_eq!(err["code"], -32602);
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("isolation: worktree needs project_dir in a git repository"),
        "{err}"
    );
}

/// A child with the write right rewrites the repository's record of
/// another run's worktree (`.git/worktrees/<name>/gitdir`) to name a
/// directory outside; removing that worktree must remove its checkout and
/// record only, never what the record names.
#[test]
fn a_forged_worktree_record_does_not_steer_its_removal() {
    let d = Daemon::start();
    let p = project();
    let s = session("wtforge");
    let st = spawn(&d, &s, p.path(), "true", json!({"isolation": "worktree"}));
    assert_eq!(st["state"], "succeeded", "{st}");
    let wt = PathBuf::from(st["worktree_dir"].as_str().unwrap());
    let victim = tempfile::tempdir().unwrap();
    std::fs::write(victim.path().join("keep.txt"), "keep\n").unwrap();
    let admin = std::fs::read_dir(p.path().join(".git/worktrees"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let forge = format!(
        "printf '%s\\n' '{}' > .git/worktrees/{}/gitdir && echo forged",
        victim.path().join("keep.txt").display(),
        admin.file_name().unwrap().to_str().unwrap()
    );
    let f = spawn(&d, &session("wtforge2"), p.path(), &forge, json!({}));
    assert!(
        std::fs::read_to_string(f["log_path"].as_str().unwrap())
            .unwrap()
            .contains("forged"),
        "{f}"
    );
    let out = d.cli(&["worktree", "rm", st["run_id"].as_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        victim.path().join("keep.txt").exists(),
        "the forged record's target was removed"
    );
    assert!(!wt.exists(), "the run's own checkout is removed");
    assert!(!admin.exists(), "the repository's record of it is removed");
}
