//! `--run-as`: a root daemon runs children as an unprivileged user.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::json;
use std::os::unix::fs::PermissionsExt;
use subagentd_e2e::{is_root, runnable, session, Daemon, DaemonOpts};

#[test]
fn children_run_as_the_given_user_with_their_dirs() {
    if !runnable(is_root(), "run_as", "run_as needs a daemon running as root") {
        return;
    }
    let d = Daemon::start_with(DaemonOpts {
        args: vec!["--run-as".into(), "65534:65534".into()],
        ..Default::default()
    });
    let project = tempfile::Builder::new()
        .prefix("sa-ra-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(project.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(project.path().join("f"), "project file\n").unwrap();
    let script = r#"
        echo "uid=$(id -u) gid=$(id -g) groups=$(id -G)"
        cat f
        echo a > "$SUBAGENT_ARTIFACT_DIR/a" && echo ARTIFACT-OK
        echo t > "$TMPDIR/t" && chmod 700 "$TMPDIR/t" && echo TEMP-OK
        echo '{"written":[]}' > "$SUBAGENT_DELTA_PATH" && echo DELTA-OK
        grep -q "Task: test task" "$SUBAGENT_CONTEXT_DIR/first_message.md" && echo CONTEXT-OK
        echo x > "$SUBAGENT_CONTEXT_DIR/planted" 2>/dev/null || echo context-read-only
        head -c 4 /etc/shadow 2>/dev/null || echo shadow-denied
        python3 -c "import socket, os; s = socket.socket(socket.AF_UNIX); s.connect(os.environ['SOCK'])" 2>/dev/null || echo socket-denied
    "#;
    let mut c = d.conn();
    let run = c.spawn(
        &session("ra"),
        &["sh", "-c", script],
        json!({"session": {"id": session("ra"), "audience": "personal", "project_dir": project.path()}, "env": {"SOCK": d.socket}}),
    );
    let st = c.wait(&run);
    let log = std::fs::read_to_string(st["log_path"].as_str().unwrap()).unwrap();
    assert_eq!(st["state"], "succeeded", "{st}\n{log}");
    for want in [
        "uid=65534 gid=65534 groups=65534",
        "project file",
        "ARTIFACT-OK",
        "TEMP-OK",
        "DELTA-OK",
        "CONTEXT-OK",
        "context-read-only",
        "shadow-denied",
        "socket-denied",
    ] {
        assert!(log.contains(want), "{want} missing:\n{log}");
    }
    assert!(
        st["isolation"]["user"]
            .as_str()
            .unwrap()
            .contains("uid 65534"),
        "{st}"
    );
    // The run's files stay the daemon's; its spec (with its uid) is in
    // state.db alone, never a file in the run folder.
    let run_dir = std::path::Path::new(st["log_path"].as_str().unwrap())
        .parent()
        .unwrap()
        .to_path_buf();
    assert!(!run_dir.join("runner.json").exists());
    // runner.log goes once the run's end is committed when it is empty:
    // checked while it is there.
    let log = run_dir.join("runner.log");
    for (f, kept) in [
        (run_dir.join("exit.json"), true),
        (run_dir.ancestors().nth(4).unwrap().join("state.db"), true),
        (log, false),
    ] {
        let meta = match std::fs::metadata(&f) {
            Err(e) if !kept && e.kind() == std::io::ErrorKind::NotFound => continue,
            m => m.unwrap(),
        };
        assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{}", f.display());
        assert_eq!(
            std::os::unix::fs::MetadataExt::uid(&meta),
            0,
            "{}",
            f.display()
        );
    }
}

/// The children of a root daemon never walk the host's path to their run
/// folder (their root is their own), so a state dir under a directory
/// only root may enter works.
#[test]
fn a_state_dir_under_a_closed_directory_works() {
    if !runnable(
        is_root(),
        "run_as",
        "a uid of the run's own needs a daemon running as root",
    ) {
        return;
    }
    let base = tempfile::Builder::new()
        .prefix("sa-closed-")
        .tempdir_in("/tmp")
        .unwrap();
    let closed = base.path().join("closed");
    std::fs::create_dir(&closed).unwrap();
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
    let d = Daemon::start_with(DaemonOpts {
        base_dir: Some(closed.clone()),
        ..Default::default()
    });
    let mut c = d.conn();
    let run = c.spawn(
        &session("closed"),
        &["sh", "-c", "cat \"$SUBAGENT_CONTEXT_DIR/first_message.md\" && echo x > \"$SUBAGENT_ARTIFACT_DIR/a\" && id -u"],
        json!({}),
    );
    let st = c.wait(&run);
    let log = std::fs::read_to_string(st["log_path"].as_str().unwrap()).unwrap();
    assert_eq!(st["state"], "succeeded", "{st}\n{log}");
    assert!(log.contains("Task: test task"), "{log}");
    assert!(
        !log.lines().any(|l| l == "0"),
        "the child ran as root:\n{log}"
    );
    let art = std::path::Path::new(st["artifact_dir"].as_str().unwrap());
    assert_eq!(std::fs::read_to_string(art.join("a")).unwrap(), "x\n");
}

/// Without `run_as`, each run of a root daemon has a uid of its own: two
/// runs at once never share one, neither is root, and files a child
/// writes into the project belong to the project's owner on disk.
#[test]
fn each_run_has_a_uid_of_its_own() {
    if !runnable(
        is_root(),
        "run_as",
        "a uid of the run's own needs a daemon running as root",
    ) {
        return;
    }
    let d = Daemon::start();
    let project = tempfile::Builder::new()
        .prefix("sa-uid-")
        .tempdir_in("/tmp")
        .unwrap();
    // The project is in the children's view live: the signal to end.
    let go = project.path().join("go");
    let mut c = d.conn();
    let s = session("uid");
    let script = format!(
        "id -u > \"made-$(id -u)\"; id -u; while [ ! -e {} ]; do sleep 0.02; done",
        go.display()
    );
    let runs: Vec<String> = (0..2)
        .map(|_| {
            c.spawn(
                &s,
                &["sh", "-c", &script],
                json!({"session": {"id": s, "audience": "personal", "project_dir": project.path()},
                       "sandbox": {"write_project": true}}),
            )
        })
        .collect();
    let logs: Vec<std::path::PathBuf> = runs
        .iter()
        .map(|r| {
            let st = c.call("check_agent_run", json!({"run_id": r})).unwrap();
            std::path::PathBuf::from(st["log_path"].as_str().unwrap())
        })
        .collect();
    subagentd_e2e::wait_until(
        std::time::Duration::from_secs(20),
        "both runs to start",
        || {
            logs.iter()
                .all(|l| std::fs::read_to_string(l).is_ok_and(|t| t.ends_with('\n')))
        },
    );
    std::fs::write(&go, "").unwrap();
    let uids: Vec<u32> = runs
        .iter()
        .zip(&logs)
        .map(|(r, l)| {
            assert_eq!(c.wait(r)["state"], "succeeded");
            std::fs::read_to_string(l).unwrap().trim().parse().unwrap()
        })
        .collect();
    assert_ne!(uids[0], uids[1], "two runs at once share a uid");
    for uid in &uids {
        assert!(*uid != 0 && *uid != 65534, "uid {uid}");
        let made = project.path().join(format!("made-{uid}"));
        let meta = std::fs::metadata(&made).unwrap();
        assert_eq!(
            std::os::unix::fs::MetadataExt::uid(&meta),
            0,
            "{} belongs to the project's owner on disk",
            made.display()
        );
    }
}

/// A queued run keeps the uid it was leased across a daemon restart; if a
/// run of another supervisor took that uid meanwhile, it is given another
/// (it never started, so it owns nothing) instead of failing.
#[test]
fn a_queued_run_whose_uid_was_taken_meanwhile_gets_another() {
    if !runnable(is_root(), "root", "per-run uids need a root daemon") {
        return;
    }
    let project = subagentd_e2e::channel();
    let go = project.path().join("go");
    let mut d = Daemon::start_with(DaemonOpts {
        max_concurrent: Some(1),
        ..Default::default()
    });
    let s = session("reuid");
    let mut c = d.conn();
    let params =
        json!({"session": {"id": s, "audience": "personal", "project_dir": project.path()}});
    let blocker = c.spawn(
        &s,
        &["sh", "-c", "while [ ! -e go ]; do sleep 0.05; done"],
        params.clone(),
    );
    let queued = c.spawn(&s, &["id", "-u"], params);
    let st = c
        .call("check_agent_run", json!({"run_id": queued}))
        .unwrap();
    assert_eq!(st["state"], "accepted", "{st}");
    let log = std::path::PathBuf::from(st["log_path"].as_str().unwrap());
    let record =
        || -> serde_json::Value { subagentd_e2e::stored_run(log.parent().unwrap()).unwrap() };
    let first = record()["uid"].as_u64().unwrap();
    drop(c);
    d.stop();
    // Another supervisor's run takes the queued run's uid.
    let lease = std::fs::File::create(format!("/run/subagentd/uids/{first}")).unwrap();
    // SAFETY: flock on a descriptor we own; touches no memory.
    let rc = unsafe {
        libc::flock(
            std::os::fd::AsRawFd::as_raw_fd(&lease),
            libc::LOCK_EX | libc::LOCK_NB,
        )
    };
    assert_eq!(rc, 0, "the uid's lease is free while the daemon is down");
    d.restart();
    std::fs::write(&go, "").unwrap();
    let mut c = d.conn();
    assert_eq!(c.wait(&blocker)["state"], "succeeded");
    let st = c.wait(&queued);
    assert_eq!(st["state"], "succeeded", "{st}");
    let ran_as: u64 = std::fs::read_to_string(&log)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_ne!(ran_as, first, "the run used a uid another run holds");
    assert_eq!(
        record()["uid"].as_u64(),
        Some(ran_as),
        "its record names the uid it ran as"
    );
    drop(lease);
}
