//! The daemon process: socket hygiene, shutdown that leaves children
//! running, and picking runs up again after a restart.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::json;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::process::{Command, Stdio};
use std::time::Duration;
use subagentd_e2e::{
    alive, bin, channel, session, sleep_marker, sleeping, wait_for_text, wait_until, Conn, Daemon,
    DaemonOpts,
};

fn mode(p: &std::path::Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn socket_and_its_new_directory_are_private() {
    let dir = tempfile::tempdir().unwrap();
    let sock_dir = dir.path().join("run").join("subagentd");
    let socket = sock_dir.join("s.sock");
    let mut child = Daemon::spawn_process(
        &socket,
        &dir.path().join("state"),
        dir.path(),
        &DaemonOpts::default(),
    );
    // Ready means answering, not just listening (the state dir is opened
    // after the socket is bound).
    wait_until(Duration::from_secs(20), "the daemon to answer", || {
        Conn::try_connect(&socket).is_some_and(|mut c| c.call("ping", json!({})).is_ok())
    });
    assert_eq!(mode(&sock_dir), 0o700);
    assert_eq!(mode(&socket), 0o600);
    assert!(std::fs::symlink_metadata(&socket)
        .unwrap()
        .file_type()
        .is_socket());
    assert_eq!(mode(&dir.path().join("state")), 0o700);
    subagentd_e2e::unsafe_kill(child.id() as i32, libc::SIGINT);
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "{status:?}: {}",
        std::fs::read_to_string(dir.path().join("daemon.log")).unwrap_or_default()
    );
    assert!(!socket.exists(), "removed on SIGINT");
}

#[test]
fn a_stale_socket_is_replaced_and_a_live_one_is_refused() {
    let d0 = tempfile::tempdir().unwrap();
    let socket = d0.path().join("s.sock");
    // A socket file nobody listens on any more.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    assert!(socket.exists());
    let mut first = Daemon::spawn_process(
        &socket,
        &d0.path().join("state"),
        d0.path(),
        &DaemonOpts::default(),
    );
    wait_until(
        Duration::from_secs(20),
        "the daemon to take over the stale socket",
        || Conn::try_connect(&socket).is_some_and(|mut c| c.call("ping", json!({})).is_ok()),
    );
    // A second daemon on the same socket exits non-zero, naming the path.
    let out = Command::new(bin("subagentd"))
        .arg("--socket")
        .arg(&socket)
        .arg("--state-dir")
        .arg(d0.path().join("state2"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(socket.to_str().unwrap()) && err.contains("already listening"),
        "{err}"
    );
    // The first one still serves.
    assert!(Conn::connect(&socket).call("ping", json!({})).is_ok());
    // A second daemon on the same state dir is refused too.
    let out = Command::new(bin("subagentd"))
        .arg("--socket")
        .arg(d0.path().join("other.sock"))
        .arg("--state-dir")
        .arg(d0.path().join("state"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("in use by another supervisor"));
    subagentd_e2e::unsafe_kill(first.id() as i32, libc::SIGTERM);
    first.wait().unwrap();
    // Something that is not a socket is never removed.
    let file = d0.path().join("not-a-socket");
    std::fs::write(&file, "precious").unwrap();
    let out = Command::new(bin("subagentd"))
        .arg("--socket")
        .arg(&file)
        .arg("--state-dir")
        .arg(d0.path().join("state3"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "precious");
}

#[test]
fn shutdown_leaves_children_running_and_a_restart_picks_them_up() {
    let mut d = Daemon::start();
    let s = session("restart");
    let mut c = d.conn();
    let (marker, chan) = (sleep_marker(), channel());
    let go = chan.path().join("go");
    let long = c.spawn(
        &s,
        &["sh", "-c", &format!("exec sleep {marker}")],
        json!({}),
    );
    let short = c.spawn(&s, &["sh", "-c", &format!("echo started; while [ ! -e {} ]; do sleep 0.02; done; echo finished while away; exit 4", go.display())], json!({}));
    let short_log = std::path::PathBuf::from(
        c.call("check_agent_run", json!({"run_id": short})).unwrap()["log_path"]
            .as_str()
            .unwrap(),
    );
    wait_for_text(&short_log, "started", "the short child to start");
    wait_until(Duration::from_secs(20), "the long child to start", || {
        sleeping(&marker).len() == 1
    });
    let pid = sleeping(&marker)[0];
    drop(c);
    assert!(d.stop().success());
    assert!(!d.socket.exists());
    assert!(alive(pid), "a daemon shutdown does not kill children");
    // One run ends while no daemon is up.
    std::fs::write(&go, "").unwrap();
    let short_exit = short_log.parent().unwrap().join("exit.json");
    wait_until(Duration::from_secs(20), "the short run to end", || {
        short_exit.exists()
    });

    d.restart();
    let mut c = d.conn();
    let st = c.wait(&short);
    assert_eq!(st["state"], "failed", "finished from exit.json: {st}");
    assert_eq!(st["exit_code"], 4);
    let st = c.call("check_agent_run", json!({"run_id": long})).unwrap();
    assert_eq!(
        st["state"], "running",
        "the live runner is watched again: {st}"
    );
    c.call("cancel_agent_run", json!({"run_id": long})).unwrap();
    let st = c.wait(&long);
    assert_eq!(st["state"], "cancelled");
    assert!(!alive(pid));
    let notices = c.call("take_notices", json!({"session_id": s})).unwrap();
    assert_eq!(notices["notices"].as_array().unwrap().len(), 2);
}

#[test]
fn a_killed_daemon_loses_nothing() {
    let mut d = Daemon::start();
    let s = session("kill9");
    let mut c = d.conn();
    let chan = channel();
    let go = chan.path().join("go");
    let run = c.spawn(
        &s,
        &[
            "sh",
            "-c",
            &format!(
                "while [ ! -e {} ]; do sleep 0.02; done; echo last line; exit 5",
                go.display()
            ),
        ],
        json!({}),
    );
    wait_until(Duration::from_secs(20), "the run to start", || {
        c.call("check_agent_run", json!({"run_id": run})).unwrap()["state"] == "running"
    });
    drop(c);
    subagentd_e2e::unsafe_kill(d.pid(), libc::SIGKILL);
    d.child.wait().unwrap();
    std::fs::write(&go, "").unwrap();
    // The stale socket left by the killed daemon is replaced on restart.
    d.restart();
    let mut c = d.conn();
    let st = c.wait(&run);
    assert_eq!(st["state"], "failed", "{st}");
    assert_eq!(st["exit_code"], 5);
    assert_eq!(
        std::fs::read_to_string(st["log_path"].as_str().unwrap()).unwrap(),
        "last line\n"
    );
    let n = c.call("take_notices", json!({"session_id": s})).unwrap();
    assert_eq!(n["notices"].as_array().unwrap().len(), 1, "{n}");
}

/// A descriptor the daemon inherited from whoever started it (here, this
/// test) never reaches a runner, nor therefore a run.
#[test]
fn descriptors_the_daemon_inherited_do_not_reach_its_runners() {
    let marker = tempfile::NamedTempFile::new().unwrap();
    let path = std::ffi::CString::new(marker.path().to_str().unwrap()).unwrap();
    // SAFETY: open without O_CLOEXEC on a NUL-terminated path we own, then
    // a copy above the numbers a runner is handed (F_DUPFD keeps no
    // close-on-exec either).
    let fd = unsafe {
        let low = libc::open(path.as_ptr(), libc::O_RDONLY);
        let high = libc::fcntl(low, libc::F_DUPFD, 300);
        libc::close(low);
        high
    };
    assert!(fd >= 300);
    let d = subagentd_e2e::Daemon::start();
    // SAFETY: closes the descriptor opened above, which nothing else uses.
    unsafe { libc::close(fd) };
    let mut c = d.conn();
    let channel = subagentd_e2e::channel();
    let go = channel.path().join("go");
    let run = c.spawn(
        &session("inherit"),
        &[
            "sh",
            "-c",
            &format!("while [ ! -e {} ]; do sleep 0.05; done", go.display()),
        ],
        json!({}),
    );
    let mut pid = 0;
    wait_until(Duration::from_secs(20), "the run to be running", || {
        let st = c.call("check_agent_run", json!({"run_id": run})).unwrap();
        let log = std::path::Path::new(st["log_path"].as_str().unwrap());
        let rec = subagentd_e2e::stored_run(log.parent().unwrap()).unwrap();
        pid = rec["runner_pid"].as_i64().unwrap_or(0);
        pid > 0
    });
    let held: Vec<std::path::PathBuf> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .collect();
    std::fs::write(&go, "").unwrap();
    c.wait(&run);
    assert!(
        !held.iter().any(|p| p == marker.path()),
        "the runner holds the daemon's inherited descriptor: {held:?}"
    );
}

/// A daemon whose hard descriptor limit is below a run's own (4096) still
/// starts runs: the run gets the tighter hard limit instead of failing to
/// set its own.
#[test]
fn a_hard_descriptor_limit_below_the_runs_own_still_starts_runs() {
    let wrap = [
        "sh",
        "-c",
        "ulimit -Sn 1024 && ulimit -Hn 1024 && exec \"$@\"",
        "sh",
    ];
    let d = Daemon::start_with(DaemonOpts {
        wrap: wrap.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    });
    let mut c = d.conn();
    let run = c.spawn(
        &session("hardnofile"),
        &["sh", "-c", "ulimit -Hn"],
        json!({}),
    );
    let st = c.wait(&run);
    let log = std::fs::read_to_string(st["log_path"].as_str().unwrap()).unwrap();
    assert_eq!(st["state"], "succeeded", "{st}\n{log}");
    assert_eq!(
        log.trim(),
        "1024",
        "the run's hard limit is the daemon's: {log}"
    );
}
