//! Retention: `subagent prune` removes finished runs by the limits (and
//! `--older-than`), keeps the newest run of each session and the runs
//! whose notice is not taken, and prints what it did.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;
use subagentd_e2e::{session, wait_until, Conn, Daemon, DaemonOpts};

/// A daemon with `[retention]` set to `text` (and no periodic prune).
fn daemon_with(text: &str) -> (Daemon, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, format!("[retention]\ninterval = 0\n{text}")).unwrap();
    let d = Daemon::start_with(DaemonOpts {
        args: vec!["--config".into(), cfg.to_str().unwrap().into()],
        ..DaemonOpts::default()
    });
    (d, dir)
}

/// Runs `true` in `session` to its end; returns its id.
fn finished(c: &mut Conn, session: &str) -> String {
    let run = c.spawn(session, &["true"], json!({}));
    assert_eq!(c.wait(&run)["state"], "succeeded");
    run
}

/// The run ids of every listed run, oldest first.
fn listed(c: &mut Conn) -> Vec<String> {
    let v = c.call("list_agent_runs", json!({"limit": 1000})).unwrap();
    let runs = v["runs"].as_array().unwrap().iter();
    runs.map(|r| r["run_id"].as_str().unwrap().to_owned())
        .collect()
}

fn statuses(c: &mut Conn) -> BTreeMap<String, Value> {
    let v = c.call("list_agent_runs", json!({"limit": 1000})).unwrap();
    let runs = v["runs"].as_array().unwrap().iter();
    runs.map(|r| (r["run_id"].as_str().unwrap().to_owned(), r.clone()))
        .collect()
}

fn take(c: &mut Conn, session: &str) -> Vec<String> {
    let v = c
        .call("take_notices", json!({ "session_id": session }))
        .unwrap();
    let notices = v["notices"].as_array().unwrap().iter();
    notices
        .map(|n| n["run_id"].as_str().unwrap().to_owned())
        .collect()
}

/// `subagent prune ARGS`: its stdout, after checking it exited 0.
fn prune(d: &Daemon, args: &[&str]) -> String {
    let mut all = vec!["prune"];
    all.extend_from_slice(args);
    let out = d.cli(&all);
    let text = String::from_utf8(out.stdout).unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "prune {args:?}: {text}{err}");
    text
}

/// The run ids on the removed lines and on the kept lines of `text`.
fn removed_and_kept(text: &str) -> (Vec<&str>, Vec<(&str, &str)>) {
    let mut removed = Vec::new();
    let mut kept = Vec::new();
    for line in text.lines() {
        let Some((id, rest)) = line.split_once("  ") else {
            continue;
        };
        match rest.strip_prefix("kept: ") {
            Some(why) => kept.push((id, why)),
            None if id.len() == 32 => removed.push(id),
            None => {}
        }
    }
    (removed, kept)
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn prune_on_demand_keeps_the_newest_of_each_session_and_untaken_notices() {
    let (d, _cfg) = daemon_with("");
    let (a, b) = (session("keep-a"), session("keep-b"));
    let mut c = d.conn();
    let runs_a: Vec<String> = (0..7).map(|_| finished(&mut c, &a)).collect();
    assert_eq!(take(&mut c, &a), runs_a);
    let mut runs_b: Vec<String> = (0..3).map(|_| finished(&mut c, &b)).collect();
    assert_eq!(take(&mut c, &b), runs_b);
    // The last two of b are not taken: their notices protect them.
    runs_b.extend((0..2).map(|_| finished(&mut c, &b)));
    let before = statuses(&mut c);
    assert_eq!(before.len(), 12);

    // The default limits want nothing of 12 runs.
    let text = prune(&d, &["--dry-run"]);
    assert_eq!(
        text,
        "dry run: would remove 0 runs (0 B); nothing removed\n"
    );

    let mut want_removed: Vec<&str> = strs(&runs_a[..6]);
    want_removed.extend(strs(&runs_b[..3]));
    want_removed.sort();
    let want_kept = vec![
        (runs_a[6].as_str(), "the newest run of its session"),
        (
            runs_b[3].as_str(),
            "its notice is not taken yet (kept until max_age)",
        ),
        (runs_b[4].as_str(), "the newest run of its session"),
    ];
    let dry = prune(&d, &["--dry-run", "--older-than", "0s"]);
    let (removed, kept) = removed_and_kept(&dry);
    assert_eq!(removed, want_removed, "{dry}");
    assert_eq!(kept, want_kept, "{dry}");
    assert!(
        dry.ends_with("nothing removed\n") && dry.contains("would remove 9 runs"),
        "{dry}"
    );
    assert_eq!(listed(&mut c).len(), 12, "a dry run removes nothing");
    for s in before.values() {
        assert!(std::path::Path::new(s["log_path"].as_str().unwrap()).exists());
    }

    let text = prune(&d, &["--older-than", "0s"]);
    let (removed, kept) = removed_and_kept(&text);
    assert_eq!(removed, want_removed, "{text}");
    assert_eq!(kept, want_kept, "{text}");
    assert!(
        text.ends_with("\n") && text.contains("removed 9 runs ("),
        "{text}"
    );
    // Each removed line: id, session, ended, size, reason.
    for line in text.lines().filter(|l| l.ends_with("on_demand")) {
        let cells: Vec<&str> = line.split("  ").map(str::trim).collect();
        let s = &before[cells[0]];
        assert_eq!(cells[1], s["session_id"], "{line}");
        assert_eq!(cells[2], s["ended_at"], "{line}");
        assert!(cells[3].ends_with("B"), "a size: {line}");
        assert_eq!(cells.len(), 5, "{line}");
    }

    let mut left = vec![runs_a[6].clone(), runs_b[3].clone(), runs_b[4].clone()];
    left.sort();
    assert_eq!(listed(&mut c), left);
    for (id, s) in &before {
        let folder = std::path::Path::new(s["log_path"].as_str().unwrap())
            .parent()
            .unwrap()
            .to_owned();
        assert_eq!(folder.exists(), left.contains(id), "{}", folder.display());
    }
    assert_eq!(take(&mut c, &b), strs(&runs_b[3..]));
    // Nothing is left to remove but what is protected.
    let again = prune(&d, &["--older-than", "0s", "--session", &a]);
    assert_eq!(
        again,
        format!(
            "{}  kept: the newest run of its session\nremoved 0 runs (0 B)\n",
            runs_a[6]
        )
    );
}

#[test]
fn max_runs_keeps_the_newest_and_the_runs_with_untaken_notices() {
    let (d, _cfg) = daemon_with("max_runs = 5\n");
    let (a, b) = (session("limit-a"), session("limit-b"));
    let mut c = d.conn();
    // r1 in a, r2 in b, r3 in a, ...: b's notices stay untaken.
    let runs: Vec<String> = (0..12)
        .map(|i| finished(&mut c, if i % 2 == 0 { &a } else { &b }))
        .collect();
    assert_eq!(take(&mut c, &a).len(), 6);
    let out = d.cli(&["--json", "prune"]);
    assert!(out.status.success(), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["dry_run"], false);
    let removed: Vec<&str> = v["removed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            assert_eq!(r["reason"], "max_runs", "{r}");
            assert_eq!(r["session_id"], a.as_str(), "{r}");
            r["run_id"].as_str().unwrap()
        })
        .collect();
    // Beyond the newest five: a's go, b's stay for their notices.
    assert_eq!(removed, [0, 2, 4, 6].map(|i| runs[i].as_str()), "{v}");
    let mut survivors: Vec<String> = runs[7..].to_vec();
    survivors.extend([1, 3, 5].map(|i| runs[i].clone()));
    survivors.sort();
    assert_eq!(listed(&mut c), survivors, "the newest 5 and b's untaken");

    // Once b's notices are taken, the limit holds.
    assert_eq!(take(&mut c, &b).len(), 6);
    let text = prune(&d, &[]);
    let (removed, _) = removed_and_kept(&text);
    assert_eq!(removed, [1, 3, 5].map(|i| runs[i].as_str()), "{text}");
    assert_eq!(listed(&mut c), strs(&runs[7..]), "the newest 5");
}

#[test]
fn a_crossed_max_runs_prunes_without_waiting_for_the_interval() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    // A day's interval: only a crossed limit can prune within the test.
    std::fs::write(&cfg, "[retention]\ninterval = \"1d\"\nmax_runs = 5\n").unwrap();
    let d = Daemon::start_with(DaemonOpts {
        args: vec!["--config".into(), cfg.to_str().unwrap().into()],
        ..DaemonOpts::default()
    });
    let s = session("crossed");
    let mut c = d.conn();
    let mut runs = Vec::new();
    let mut sessions_dir = None;
    for _ in 0..12 {
        let run = finished(&mut c, &s);
        // Taken at once: no notice keeps a run past the limit.
        assert_eq!(take(&mut c, &s), std::slice::from_ref(&run));
        let st = c.call("check_agent_run", json!({ "run_id": run })).unwrap();
        sessions_dir.get_or_insert_with(|| folder(&st).parent().unwrap().to_owned());
        runs.push(run);
    }
    let sessions_dir = sessions_dir.unwrap();
    let folders = || {
        std::fs::read_dir(&sessions_dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| runs.iter().any(|r| e.file_name() == r.as_str()))
            .count()
    };
    let code = |c: &mut Conn, run: &str| {
        let e = c
            .call("check_agent_run", json!({ "run_id": run }))
            .unwrap_err();
        e["code"].as_i64().unwrap()
    };
    // The pass that removes the last folder also forgets the oldest
    // tombstones: at most max_runs of them stay.
    wait_until(
        Duration::from_secs(30),
        "the folders down to max_runs",
        || folders() == 5 && code(&mut c, &runs[1]) == -32000,
    );
    assert_eq!(listed(&mut c), strs(&runs[7..]), "the newest 5");
    for (i, run) in runs[..7].iter().enumerate() {
        let want = if i < 2 { -32000 } else { -32009 };
        assert_eq!(code(&mut c, run), want, "run {i}");
    }
}

#[test]
fn a_crossed_max_bytes_prunes_without_waiting_for_the_interval() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    // Each run's folder holds a 256 KiB log: about three fit in 1 MiB.
    std::fs::write(
        &cfg,
        "[retention]\ninterval = \"1d\"\nmax_bytes = \"1MiB\"\n",
    )
    .unwrap();
    let d = Daemon::start_with(DaemonOpts {
        args: vec!["--config".into(), cfg.to_str().unwrap().into()],
        ..DaemonOpts::default()
    });
    let s = session("bytes");
    let mut c = d.conn();
    let mut runs = Vec::new();
    for _ in 0..8 {
        let script = "i=0; while [ $i -lt 4096 ]; do printf '%063d\\n' $i; i=$((i+1)); done";
        let run = c.spawn(&s, &["sh", "-c", script], json!({}));
        assert_eq!(c.wait(&run)["state"], "succeeded");
        assert_eq!(take(&mut c, &s), std::slice::from_ref(&run));
        runs.push(run);
    }
    let log = |c: &mut Conn, run: &str| {
        let st = c.call("check_agent_run", json!({ "run_id": run })).unwrap();
        std::fs::metadata(st["log_path"].as_str().unwrap())
            .unwrap()
            .len()
    };
    assert_eq!(
        log(&mut c, &runs[7]),
        256 * 1024,
        "the log is what it wrote"
    );
    // About 300 KiB a folder: at most three stay under 1 MiB (passes come
    // at most every 2 s, so this may take two).
    wait_until(
        Duration::from_secs(30),
        "the oldest runs pruned by max_bytes",
        || listed(&mut c).len() <= 3,
    );
    let kept = listed(&mut c);
    assert!(!kept.is_empty(), "the newest run of a session stays");
    assert_eq!(kept, strs(&runs[runs.len() - kept.len()..]), "the newest");
    let e = c
        .call("check_agent_run", json!({ "run_id": runs[0] }))
        .unwrap_err();
    assert_eq!(e["code"], -32009, "{e}");
    assert!(e["message"].as_str().unwrap().contains("max_bytes"), "{e}");
}

#[test]
fn a_bad_older_than_is_refused_naming_it() {
    let (d, _cfg) = daemon_with("");
    let mut c = d.conn();
    let e = c
        .call("prune_runs", json!({"older_than": "7 days"}))
        .unwrap_err();
    assert_eq!(e["code"], -32602, "{e}");
    assert_eq!(
        e["message"],
        "invalid params: older_than: \"7 days\" is not a duration: a whole number with s, m, h or d (\"30d\"), or 0"
    );
    let e = c
        .call("prune_runs", json!({"session_id": "../x"}))
        .unwrap_err();
    assert_eq!(e["code"], -32602, "{e}");
    let out = d.cli(&["prune", "--older-than", "soon"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("older_than"),
        "{out:?}"
    );
}

/// The run folder of a listed run.
fn folder(s: &Value) -> std::path::PathBuf {
    std::path::Path::new(s["log_path"].as_str().unwrap())
        .parent()
        .unwrap()
        .to_owned()
}

#[test]
fn a_pruned_run_says_it_was_pruned_and_when_even_after_a_restart() {
    let (mut d, _cfg) = daemon_with("max_runs = 2\n");
    let s = session("pruned-check");
    let mut c = d.conn();
    let runs: Vec<String> = (0..4).map(|_| finished(&mut c, &s)).collect();
    assert_eq!(take(&mut c, &s).len(), 4);
    prune(&d, &[]);
    let check = |c: &mut Conn, run: &str| {
        c.call("check_agent_run", json!({ "run_id": run }))
            .unwrap_err()
    };
    for gone in &runs[..2] {
        for e in [
            check(&mut c, gone),
            c.call("wait_agent_run", json!({ "run_id": gone }))
                .unwrap_err(),
            c.call("cancel_agent_run", json!({ "run_id": gone }))
                .unwrap_err(),
        ] {
            assert_eq!(e["code"], -32009, "{e}");
            let m = e["message"].as_str().unwrap();
            assert!(
                m.starts_with(&format!("run {gone} was pruned at 20"))
                    && m.ends_with("(retention: max_runs)"),
                "{m}"
            );
            assert_eq!(e["data"]["reason"], "max_runs", "{e}");
        }
    }
    assert_eq!(listed(&mut c), strs(&runs[2..]));
    let out = d.cli(&["logs", &runs[0]]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("was pruned at"),
        "{out:?}"
    );
    drop(c);
    assert!(d.stop().success(), "{}", d.log());
    d.restart();
    let mut c = d.conn();
    assert_eq!(check(&mut c, &runs[1])["code"], -32009);
    assert_eq!(
        check(&mut c, "20261201T070317.792757Z-5fe54002")["code"],
        -32000,
        "an unknown run is still not found"
    );
}

#[test]
fn a_kill_9_in_the_middle_of_a_prune_leaves_nothing_half_removed() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, "[retention]\ninterval = 0\n").unwrap();
    let mut d = Daemon::start_with(DaemonOpts {
        args: vec!["--config".into(), cfg.to_str().unwrap().into()],
        env: vec![("SUBAGENTD_TEST_PRUNE_PAUSE_MS".into(), "20".into())],
        max_concurrent: Some(16),
        ..DaemonOpts::default()
    });
    let (a, b) = (session("crash-a"), session("crash-b"));
    let mut c = d.conn();
    let runs: Vec<String> = (0..200)
        .map(|_| c.spawn(&a, &["true"], json!({})))
        .collect();
    for r in &runs {
        assert_eq!(c.wait(r)["state"], "succeeded");
    }
    assert_eq!(take(&mut c, &a).len(), 200);
    let untaken = finished(&mut c, &b);
    let before = statuses(&mut c);
    assert_eq!(before.len(), 201);
    let folders: Vec<std::path::PathBuf> = runs.iter().map(|r| folder(&before[r])).collect();

    let mut pruner = d.conn();
    let call = std::thread::spawn(move || {
        pruner
            .call("prune_runs", json!({ "older_than": "0s" }))
            .ok();
    });
    subagentd_e2e::wait_until(
        std::time::Duration::from_secs(60),
        "the prune to have removed a folder",
        || folders.iter().any(|f| !f.exists()),
    );
    subagentd_e2e::unsafe_kill(d.pid(), libc::SIGKILL);
    d.child.wait().unwrap();
    // The call's connection closed with the daemon: its thread panicked.
    assert!(call.join().is_err());
    let half = folders.iter().filter(|f| f.exists()).count();
    assert!(half > 0, "killed before the prune ended");

    d.restart();
    let mut c = d.conn();
    let after = statuses(&mut c);
    for (id, s) in &after {
        let f = folder(s);
        assert!(f.join("result.md").exists(), "a listed run is whole: {id}");
    }
    for (id, s) in &before {
        if !after.contains_key(id) {
            assert!(
                !folder(s).exists(),
                "an unlisted run's folder is gone: {id}"
            );
            assert_eq!(
                c.call("check_agent_run", json!({ "run_id": id }))
                    .unwrap_err()["code"],
                -32009
            );
        }
    }
    assert!(
        after.contains_key(&runs[199]),
        "the newest of its session stays"
    );
    assert!(after.contains_key(&untaken), "an untaken notice stays");
    assert!(after.len() < 201, "the marked runs were pruned");
    assert_eq!(take(&mut c, &b), std::slice::from_ref(&untaken));
}
