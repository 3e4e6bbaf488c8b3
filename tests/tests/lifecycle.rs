//! A run's life through the real daemon: success, failure, signals,
//! timeouts, cancel, FIFO queueing, the child's environment and files.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;
use subagentd::paths::RunFiles;
use subagentd_e2e::{
    alive, bin, pids_with, session, sleep_marker, sleeping, wait_for_text, wait_until, Conn,
    Daemon, DaemonOpts,
};

fn path(v: &Value) -> PathBuf {
    PathBuf::from(v.as_str().unwrap())
}

#[test]
fn success_writes_log_artifacts_and_result() {
    let d = Daemon::start();
    let mut c = d.conn();
    let s = session("ok");
    let run = c.spawn(
        &s,
        &[
            "sh",
            "-c",
            "echo hello from child; echo data > \"$SUBAGENT_ARTIFACT_DIR/out.txt\"; echo oops >&2",
        ],
        json!({"context": "some background"}),
    );
    let st = c.wait(&run);
    assert_eq!(st["state"], "succeeded", "{st}");
    assert_eq!(st["exit_code"], 0);
    assert_eq!(st["signal"], Value::Null);
    assert_eq!(st["session_id"], s.as_str());
    for k in ["created_at", "started_at", "ended_at"] {
        let t = st[k].as_str().unwrap();
        assert!(t.ends_with('Z') && t.len() == 24, "{k}: {t}");
    }
    let log = std::fs::read_to_string(path(&st["log_path"])).unwrap();
    assert_eq!(log, "hello from child\noops\n");
    let art = path(&st["artifact_dir"]);
    assert_eq!(
        std::fs::read_to_string(art.join("out.txt")).unwrap(),
        "data\n"
    );
    let result = std::fs::read_to_string(path(&st["result_path"])).unwrap();
    for needle in [
        run.as_str(),
        "**succeeded**",
        "exit code: 0",
        st["log_path"].as_str().unwrap(),
        st["artifact_dir"].as_str().unwrap(),
        "`out.txt` (5 bytes)",
        "hello from child",
    ] {
        assert!(
            result.contains(needle),
            "result.md lacks {needle:?}:\n{result}"
        );
    }
    let run_dir = path(&st["log_path"]).parent().unwrap().to_path_buf();
    let first = std::fs::read_to_string(run_dir.join("context/first_message.md")).unwrap();
    // Context and Task, then the [working-context] block (/tmp is not a
    // git repository), then the [session] block.
    let want = format!(
        "Context: some background\nTask: test task\n\n[working-context]\nproject_dir: /tmp\nrecent_files: (none)\ngit: unavailable (not a git repository)\n\n[session]\nsession_id: {s}\ntemp_dir: {}\nartifact_dir: {}\nworktree_dir: (none)\nlog_path: {}\ndelta_path: {}\nattempt: 1 of 4\n",
        st["temp_dir"].as_str().unwrap(),
        st["artifact_dir"].as_str().unwrap(),
        st["log_path"].as_str().unwrap(),
        run_dir.join("delta/delta.json").display()
    );
    assert_eq!(first, want);
    let rec = subagentd_e2e::stored_run(&run_dir).expect("the run is in state.db");
    assert_eq!(rec["state"], "succeeded");
    assert_eq!(rec["finalized"], true);
    // The temp files of the run's atomic writes (result.md, exit.json's
    // reserve) were renamed into place: the folder holds the documented
    // files only, and no record of its own.
    let names = || -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&run_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    };
    let want_names = [
        "artifacts",
        "child.log",
        "child.log.times",
        "context",
        "exit.json",
        "result.md",
    ];
    wait_until(Duration::from_secs(10), "only the documented files", || {
        names() == want_names
    });
    // The runner spec was never a file here: state.db held it, and the
    // runner got it in a sealed memfd.
    assert!(!run_dir.join("runner.json").exists());
    assert_eq!(
        subagentd_e2e::stored_spec(&d.state, &run),
        None,
        "finalized"
    );
    // The temp dir is removed when the run ends.
    assert!(!path(&st["temp_dir"]).exists());
    let temp = path(&st["temp_dir"]);
    let name = temp.file_name().unwrap().to_str().unwrap();
    assert!(name.starts_with('c') && name.len() == 9, "{name}");
    assert_eq!(
        temp.parent().unwrap(),
        PathBuf::from(format!("/tmp/subagentd-{}/{s}", unsafe_uid()))
    );
    // The session's dir stays for its next run (it is not made and removed
    // once per run); empty session dirs are swept when a daemon starts.
    // (Another test's daemon may sweep it first, so only the sweep is
    // checked.)
    let session_dir = temp.parent().unwrap().to_path_buf();
    let _other = Daemon::start();
    wait_until(
        Duration::from_secs(20),
        "a starting daemon to sweep the empty session dir",
        || !session_dir.exists(),
    );
}

/// exit.json times the span from the clone of the run's init to the
/// agent's exec (the benchmark reads it).
#[test]
fn exit_json_times_the_clone_to_exec() {
    let d = Daemon::start();
    let mut c = d.conn();
    let run = c.spawn(&session("steps"), &["true"], json!({}));
    let st = c.wait(&run);
    assert_eq!(st["state"], "succeeded", "{st}");
    let exit: Value = serde_json::from_slice(
        &std::fs::read(path(&st["log_path"]).parent().unwrap().join("exit.json")).unwrap(),
    )
    .unwrap();
    let steps = exit["setup_us"].as_object().expect("setup_us");
    assert!(steps["fork_to_exec"].as_u64().unwrap() > 0, "{steps:?}");
}

fn unsafe_uid() -> u32 {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() }
}

#[test]
fn failure_keeps_the_exit_code() {
    let d = Daemon::start();
    let mut c = d.conn();
    let run = c.spawn(
        &session("fail"),
        &["sh", "-c", "echo failing; exit 7"],
        json!({}),
    );
    let st = c.wait(&run);
    assert_eq!(st["state"], "failed");
    assert_eq!(st["exit_code"], 7);
    assert!(st["reason"].as_str().unwrap().contains("code 7"), "{st}");
}

#[test]
fn death_by_signal_is_failed_with_the_signal() {
    let d = Daemon::start();
    let mut c = d.conn();
    let run = c.spawn(&session("sig"), &["sh", "-c", "kill -KILL $$"], json!({}));
    let st = c.wait(&run);
    assert_eq!(st["state"], "failed");
    assert_eq!(st["exit_code"], Value::Null);
    assert_eq!(st["signal"], 9);
    assert!(st["reason"].as_str().unwrap().contains("SIGKILL"), "{st}");
}

#[test]
fn a_program_that_cannot_start_fails_with_127() {
    let d = Daemon::start();
    let mut c = d.conn();
    let run = c.spawn(&session("nf"), &["/nonexistent/agent-program"], json!({}));
    let st = c.wait(&run);
    assert_eq!(st["state"], "failed");
    assert_eq!(st["exit_code"], 127);
    assert!(
        st["reason"].as_str().unwrap().contains("cannot execute"),
        "{st}"
    );
}

/// A child that leaves a double-forked, setsid'ed grandchild behind
/// (`sleep <marker>`, found from outside by its marker), then sleeps.
fn leaves_grandchild(marker: &str) -> String {
    format!("( setsid sh -c 'touch \"$TMPDIR/gc\"; exec sleep {marker}' & ); sleep 300")
}

/// The grandchild's host pid, once it runs.
fn grandchild_pid(marker: &str) -> i32 {
    wait_until(Duration::from_secs(20), "the grandchild to start", || {
        sleeping(marker).len() == 1
    });
    let pid = sleeping(marker)[0];
    assert!(alive(pid));
    pid
}

#[test]
fn timeout_kills_the_whole_tree() {
    let d = Daemon::start();
    let mut c = d.conn();
    let marker = sleep_marker();
    let run = c.spawn(
        &session("to"),
        &["sh", "-c", &leaves_grandchild(&marker)],
        json!({"limits": {"wall_time_s": 2}}),
    );
    let gc = grandchild_pid(&marker);
    let st = c.wait(&run);
    assert_eq!(st["state"], "timed_out", "{st}");
    assert!(
        st["reason"]
            .as_str()
            .unwrap()
            .contains("wall time limit (2 s)"),
        "{st}"
    );
    // The runner kills the tree before it records the end.
    assert!(!alive(gc), "the setsid grandchild {gc} outlived the run");
}

#[test]
fn a_normal_exit_kills_what_the_child_left_behind() {
    let d = Daemon::start();
    let mut c = d.conn();
    let marker = sleep_marker();
    let script = leaves_grandchild(&marker).replace(
        "; sleep 300",
        "; while [ ! -e \"$TMPDIR/gc\" ]; do sleep 0.01; done; exit 0",
    );
    let run = c.spawn(&session("left"), &["sh", "-c", &script], json!({}));
    let st = c.wait(&run);
    assert_eq!(st["state"], "succeeded", "{st}");
    // The grandchild was alive when the agent ended: the run's init
    // counted it among the processes it left.
    let exit: Value = serde_json::from_slice(
        &std::fs::read(path(&st["log_path"]).parent().unwrap().join("exit.json")).unwrap(),
    )
    .unwrap();
    assert!(exit["leftover_killed"].as_u64().unwrap() >= 1, "{exit}");
    assert!(
        pids_with(&marker).is_empty(),
        "the setsid grandchild outlived the run"
    );
}

fn wait_running(c: &mut Conn, run: &str) {
    wait_until(Duration::from_secs(20), "the run to start", || {
        c.call("check_agent_run", json!({"run_id": run})).unwrap()["state"] == "running"
    });
}

#[test]
fn cancel_terminates_the_tree() {
    let d = Daemon::start();
    let mut c = d.conn();
    let marker = sleep_marker();
    let run = c.spawn(
        &session("cancel"),
        &["sh", "-c", &leaves_grandchild(&marker)],
        json!({}),
    );
    let gc = grandchild_pid(&marker);
    wait_running(&mut c, &run);
    let st = c.call("cancel_agent_run", json!({"run_id": run})).unwrap();
    assert_eq!(st["cancel_requested"], true);
    let st = c.wait(&run);
    assert_eq!(st["state"], "cancelled", "{st}");
    // A cooperative tree dies of the SIGTERM itself.
    assert_eq!(st["signal"], 15, "{st}");
    assert!(!alive(gc));
    // Cancelling an ended run changes nothing.
    let again = c.call("cancel_agent_run", json!({"run_id": run})).unwrap();
    assert_eq!(again["state"], "cancelled");
}

#[test]
fn cancel_kills_a_child_that_ignores_sigterm_after_the_grace() {
    let d = Daemon::start();
    let mut c = d.conn();
    let run = c.spawn(
        &session("stubborn"),
        &[
            "sh",
            "-c",
            "trap '' TERM; echo ready; while :; do sleep 0.1; done",
        ],
        json!({}),
    );
    let st = c.call("check_agent_run", json!({"run_id": run})).unwrap();
    wait_for_text(&path(&st["log_path"]), "ready", "the trap to be set");
    let st = c
        .call("check_agent_run", json!({"run_id": run, "cancel": true}))
        .unwrap();
    assert_eq!(st["cancel_requested"], true);
    let st = c.wait(&run);
    assert_eq!(st["state"], "cancelled", "{st}");
    assert_eq!(
        st["signal"], 9,
        "the SIGKILL after the grace ended it: {st}"
    );
}

#[test]
fn queued_runs_start_in_fifo_order_and_can_be_cancelled_before_starting() {
    let d = Daemon::start_with(DaemonOpts {
        max_concurrent: Some(1),
        ..Default::default()
    });
    let mut c = d.conn();
    let s = session("fifo");
    let blocker = c.spawn(&s, &["sh", "-c", "sleep 300"], json!({}));
    wait_running(&mut c, &blocker);
    let runs: Vec<String> = (0..4)
        .map(|i| c.spawn(&s, &["sh", "-c", &format!("echo {i}")], json!({})))
        .collect();
    let dropped = c.spawn(&s, &["sh", "-c", "echo never"], json!({}));
    for r in runs.iter().chain([&dropped]) {
        let st = c.call("check_agent_run", json!({"run_id": r})).unwrap();
        assert_eq!(st["state"], "accepted", "only one may run at once: {st}");
    }
    let st = c
        .call("cancel_agent_run", json!({"run_id": dropped}))
        .unwrap();
    assert_eq!(st["state"], "cancelled");
    assert_eq!(st["reason"], "cancelled before it started");
    assert_eq!(st["started_at"], Value::Null);
    c.call("cancel_agent_run", json!({"run_id": blocker}))
        .unwrap();
    let statuses: Vec<Value> = runs.iter().map(|r| c.wait(r)).collect();
    for w in statuses.windows(2) {
        assert_eq!(w[1]["state"], "succeeded");
        let (end0, start1) = (
            w[0]["ended_at"].as_str().unwrap(),
            w[1]["started_at"].as_str().unwrap(),
        );
        assert!(
            start1 >= end0,
            "FIFO and one at a time: {end0} then {start1}"
        );
    }
    let log = std::fs::read_to_string(path(&c.wait(&dropped)["log_path"])).unwrap_or_default();
    assert_eq!(log, "", "a run cancelled before it started never ran");
}

#[test]
fn the_child_gets_only_the_allowlisted_environment() {
    let d = Daemon::start_with(DaemonOpts {
        env: vec![
            ("SECRET_TOKEN".into(), "hunter2-do-not-leak".into()),
            ("LANG".into(), "C.UTF-8".into()),
            ("LC_TIME".into(), "C".into()),
        ],
        ..Default::default()
    });
    let mut c = d.conn();
    let marker = sleep_marker();
    let run = c.spawn(
        &session("env"),
        &["sh", "-c", &format!("exec sleep {marker}")],
        json!({"env": {"MODEL": "m-1"}, "keep_temp": true}),
    );
    wait_until(Duration::from_secs(20), "the child to start", || {
        sleeping(&marker).len() == 1
    });
    let pid = sleeping(&marker)[0];
    // Read the agent once sh has exec'd into sleep and sleep is sleeping:
    // cmdline shows "sleep" a moment before the exec has closed sh's
    // close-on-exec descriptors, so wait for sleep's own syscall
    // (clock_nanosleep or nanosleep).
    wait_until(Duration::from_secs(20), "the exec into sleep", || {
        std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.starts_with(b"sleep"))
            && std::fs::read_to_string(format!("/proc/{pid}/syscall")).is_ok_and(|s| {
                let nr = s.split(' ').next().unwrap_or("");
                nr == libc::SYS_clock_nanosleep.to_string() || nr == libc::SYS_nanosleep.to_string()
            })
    });
    // Read the live agent process's environment and descriptors.
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let env: Vec<String> = environ
        .split(|&b| b == 0)
        .filter(|v| !v.is_empty())
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .collect();
    let mut fds: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_str().unwrap().parse().unwrap())
        .collect();
    fds.sort();
    let stdin = std::fs::read_link(format!("/proc/{pid}/fd/0")).unwrap();
    c.call("cancel_agent_run", json!({"run_id": run})).unwrap();
    let st = c.wait(&run);
    assert_eq!(st["state"], "cancelled", "{st}");

    let joined = env.join("\n");
    assert!(
        !joined.contains("hunter2"),
        "a daemon secret leaked:\n{joined}"
    );
    // PWD is exported by sh itself before its exec.
    let allowed = [
        "PATH",
        "LANG",
        "TZ",
        "TERM",
        "HOME",
        "TMPDIR",
        "MODEL",
        "PWD",
        "SUBAGENT_RUN_ID",
        "SUBAGENT_SESSION_ID",
        "SUBAGENT_TEMP_DIR",
        "SUBAGENT_ARTIFACT_DIR",
        "SUBAGENT_LOG_PATH",
        "SUBAGENT_CONTEXT_DIR",
        "SUBAGENT_DELTA_PATH",
    ];
    for kv in &env {
        let name = kv.split_once('=').map_or(kv.as_str(), |(k, _)| k);
        assert!(
            allowed.contains(&name) || name.starts_with("LC_"),
            "unexpected variable {name}:\n{joined}"
        );
    }
    let temp = st["temp_dir"].as_str().unwrap();
    for want in [
        format!("HOME={temp}"),
        format!("TMPDIR={temp}"),
        format!("SUBAGENT_TEMP_DIR={temp}"),
        format!("SUBAGENT_RUN_ID={run}"),
        "MODEL=m-1".to_owned(),
        "LANG=C.UTF-8".to_owned(),
        "LC_TIME=C".to_owned(),
        format!("SUBAGENT_LOG_PATH={}", st["log_path"].as_str().unwrap()),
    ] {
        assert!(env.contains(&want), "missing {want}:\n{joined}");
    }
    // keep_temp kept it.
    assert!(PathBuf::from(temp).is_dir());
    std::fs::remove_dir_all(temp).unwrap();
    assert_eq!(fds, [0, 1, 2], "descriptors the agent inherited");
    assert_eq!(stdin, PathBuf::from("/dev/null"));
}

#[test]
fn a_script_agent_outside_the_system_roots_runs_with_its_interpreter() {
    let d = Daemon::start();
    let dir = tempfile::Builder::new()
        .prefix("sa-agent-")
        .tempdir_in("/tmp")
        .unwrap();
    let agent = subagentd_e2e::script(dir.path(), "agent.sh", "echo \"agent ran: $1\"");
    let env_agent = dir.path().join("env-agent");
    std::fs::write(&env_agent, "#!/usr/bin/env sh\necho env agent ran\n").unwrap();
    std::fs::set_permissions(
        &env_agent,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let mut c = d.conn();
    for (prog, want) in [
        (agent.to_str().unwrap(), "agent ran: x\n"),
        (env_agent.to_str().unwrap(), "env agent ran\n"),
    ] {
        let run = c.spawn(&session("script"), &[prog, "x"], json!({}));
        let st = c.wait(&run);
        assert_eq!(st["state"], "succeeded", "{st}");
        assert_eq!(
            std::fs::read_to_string(path(&st["log_path"])).unwrap(),
            want
        );
    }
    // Only the program itself: a sibling in its directory cannot be run.
    let sibling = subagentd_e2e::script(dir.path(), "other.sh", "echo SIBLING RAN");
    let run = c.spawn(
        &session("script"),
        &[
            "sh",
            "-c",
            &format!("{} || echo refused", sibling.display()),
        ],
        json!({}),
    );
    let st = c.wait(&run);
    let log = std::fs::read_to_string(path(&st["log_path"])).unwrap();
    assert!(
        !log.contains("SIBLING RAN") && log.contains("refused"),
        "{log}"
    );
}

/// A copy of finished run `st`'s folder in `dest`, and its runner `spec`
/// (taken from state.db while the run was live) with every path into the
/// old folder pointing into the copy; the old run's results are left out
/// and what the end tidied away is made again.
fn copy_run(st: &Value, spec: &[u8], dest: &Path) -> (RunFiles, Vec<u8>) {
    let dir = path(&st["log_path"]).parent().unwrap().to_path_buf();
    let copy = dest.join("run");
    let ok = std::process::Command::new("cp")
        .arg("-a")
        .arg(&dir)
        .arg(&copy)
        .status()
        .unwrap()
        .success();
    assert!(ok);
    for f in ["exit.json", "child.log", "result.md", "runner.lock"] {
        let _ = std::fs::remove_file(copy.join(f));
    }
    // A finished folder is tidied: its empty delta/ is made again, as at spawn.
    std::fs::create_dir_all(copy.join("delta")).unwrap();
    let spec = std::str::from_utf8(spec).unwrap();
    let (from, to) = (dir.to_str().unwrap(), copy.to_str().unwrap());
    let spec = spec.replace(from, to).into_bytes();
    (RunFiles { dir: copy }, spec)
}

/// A runner waits at its gate until the daemon has recorded the run: called
/// off there, it starts no agent, writes nothing into the run folder,
/// takes its pid out of runner.lock (so a restarted daemon starts the run
/// afresh) and exits 3; let through, the same runner runs the agent.
#[test]
fn a_runner_called_off_at_its_gate_starts_nothing() {
    use subagentd::engine::launch::{start_runner, RunnerFiles};
    use subagentd::engine::pidfd::{reap, RunnerExit};
    let d = Daemon::start();
    let mut c = d.conn();
    let marker = tempfile::tempdir().unwrap();
    let (m, go) = (marker.path().join("ran"), marker.path().join("go"));
    // It waits for `go`, so that its spec is read while the run is live.
    let script = format!(
        "while [ ! -e {} ]; do sleep 0.05; done; echo x >> {}",
        go.display(),
        m.display()
    );
    let run = c.spawn(
        &session("gate"),
        &["/bin/sh", "-c", &script],
        json!({"sandbox": {"write_paths": [marker.path()]}}),
    );
    let spec = subagentd_e2e::stored_spec(&d.state, &run).expect("a live run's spec");
    std::fs::write(&go, "").unwrap();
    let st = c.wait(&run);
    assert_eq!(st["state"], "succeeded", "{st}");
    std::fs::remove_file(&m).unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let (files, spec) = copy_run(&st, &spec, scratch.path());
    // The run's own temp dir went with it; the copy binds it again.
    std::fs::create_dir_all(path(&st["temp_dir"])).unwrap();
    let runner = bin("subagent-runner");
    let l = start_runner(
        &runner,
        &RunnerFiles::open(&files, &spec).unwrap(),
        None,
        true,
        false,
        None,
    )
    .unwrap();
    assert_eq!(l.call_off(), RunnerExit::Exited(3));
    assert!(!m.exists(), "the agent ran");
    assert!(!files.exit().exists() && !files.log().exists());
    assert_eq!(std::fs::read(files.runner_lock()).unwrap(), b"");
    let handed = RunnerFiles::open(&files, &spec).unwrap();
    let mut l = start_runner(&runner, &handed, None, true, false, None).unwrap();
    l.open_gate();
    assert_eq!(reap(&l.pidfd), RunnerExit::Exited(0));
    let log = std::fs::read_to_string(files.log()).unwrap_or_default();
    let exit = std::fs::read_to_string(files.exit()).unwrap_or_default();
    assert!(m.exists(), "let through, the agent runs: {log}\n{exit}");
    assert!(files.exit().exists());
    let temp = path(&st["temp_dir"]);
    std::fs::remove_dir_all(&temp).unwrap();
    let _ = std::fs::remove_dir(temp.parent().unwrap());
}

/// The agent reads its composed context from `$SUBAGENT_CONTEXT_DIR` in
/// its first attempt, as the daemon wrote it (root's files, reached as
/// their owner), whether or not its runner was started before the run
/// folder had its name.
#[test]
fn the_agent_reads_its_context_in_the_first_attempt() {
    let d = Daemon::start();
    let mut c = d.conn();
    let script = "cat \"$SUBAGENT_CONTEXT_DIR/system.md\" > /dev/null && \
                  cat \"$SUBAGENT_CONTEXT_DIR/first_message.md\"";
    let run = c.spawn(
        &session("ctxread"),
        &["/bin/sh", "-c", script],
        json!({"task": "read me back"}),
    );
    let st = c.wait(&run);
    let log = std::fs::read_to_string(path(&st["log_path"])).unwrap();
    assert_eq!(st["state"], "succeeded", "{st}\n{log}");
    assert!(log.contains("Task: read me back"), "{log}");
}
