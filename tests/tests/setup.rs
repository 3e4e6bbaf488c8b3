//! Where the daemon puts things, and refusing unsafe temp-dir paths.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::json;
use std::process::{Command, Stdio};
use std::time::Duration;
use subagentd_e2e::{bin, session, unsafe_kill, wait_until, Conn, Daemon};

#[test]
fn xdg_defaults_place_the_socket_and_the_state_dir() {
    let dir = tempfile::Builder::new()
        .prefix("sa-xdg-")
        .tempdir_in("/tmp")
        .unwrap();
    let runtime = dir.path().join("runtime");
    let state_home = dir.path().join("state-home");
    std::fs::create_dir(&runtime).unwrap();
    let stderr = std::fs::File::create(dir.path().join("daemon.log")).unwrap();
    let mut child = Command::new(bin("subagentd"))
        .env_remove("SUBAGENTD_SOCKET")
        .env_remove("SUBAGENTD_STATE_DIR")
        .env("XDG_RUNTIME_DIR", &runtime)
        .env("XDG_STATE_HOME", &state_home)
        .args(["--log-format", "json"])
        .stdin(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let socket = runtime.join("subagentd").join("subagentd.sock");
    wait_until(Duration::from_secs(20), "the default socket", || {
        Conn::try_connect(&socket).is_some_and(|mut c| c.call("ping", json!({})).is_ok())
    });
    let mut c = Conn::connect(&socket);
    let run = c.spawn(&session("xdg"), &["true"], json!({}));
    let st = c.wait(&run);
    assert!(
        st["log_path"]
            .as_str()
            .unwrap()
            .starts_with(state_home.join("subagentd").to_str().unwrap()),
        "{st}"
    );
    unsafe_kill(child.id() as i32, libc::SIGTERM);
    assert!(child.wait().unwrap().success());
    // --log-format json: every line on stderr is a JSON object.
    let log = std::fs::read_to_string(dir.path().join("daemon.log")).unwrap();
    assert!(log.lines().count() >= 3, "{log}");
    for line in log.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}"));
        assert!(
            v.get("level").is_some() && v.get("fields").is_some(),
            "{line}"
        );
    }
}

#[test]
fn a_symlink_on_the_temp_dir_path_makes_the_spawn_fail() {
    let d = Daemon::start();
    let mut c = d.conn();
    let s = session("link");
    // SAFETY: geteuid cannot fail.
    let base = std::path::PathBuf::from(format!("/tmp/subagentd-{}", unsafe { libc::geteuid() }));
    // Make sure the base exists (another spawn creates it), then plant a
    // symlink where this session's directory would go.
    let warm = c.spawn(&session("warm"), &["true"], json!({}));
    c.wait(&warm);
    let target = tempfile::tempdir().unwrap();
    let link = base.join(&s);
    std::os::unix::fs::symlink(target.path(), &link).unwrap();
    let m = c.request(
        "spawn_agent",
        json!({"session": {"id": s, "audience": "team", "project_dir": "/tmp"}, "task": "t", "command": ["true"]}),
    );
    std::fs::remove_file(&link).unwrap();
    let e = &m["error"];
    assert_eq!(e["code"], -32003, "{m}");
    assert!(
        e["message"].as_str().unwrap().contains("is a symlink"),
        "{m}"
    );
    assert_eq!(
        std::fs::read_dir(target.path()).unwrap().count(),
        0,
        "nothing was created through the link"
    );
    // No half-made run was left behind.
    let runs = d.state.join("sessions").join(&s).join("runs");
    assert_eq!(std::fs::read_dir(&runs).map(|r| r.count()).unwrap_or(0), 0);
    assert!(c.call("ping", json!({})).is_ok());
}
