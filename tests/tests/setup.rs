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

/// A daemon installed apart from its runner, started with `path` on PATH.
fn daemon_apart_from_its_runner(dir: &std::path::Path, path_mode: u32) -> std::process::Child {
    use std::os::unix::fs::PermissionsExt;
    let own = dir.join("bin");
    let path_bin = dir.join("path-bin");
    for d in [&own, &path_bin] {
        std::fs::create_dir(d).unwrap();
    }
    std::fs::copy(bin("subagentd"), own.join("subagentd")).unwrap();
    std::fs::copy(bin("subagent-runner"), path_bin.join("subagent-runner")).unwrap();
    std::fs::set_permissions(&path_bin, std::fs::Permissions::from_mode(path_mode)).unwrap();
    let runtime = dir.join("runtime");
    std::fs::create_dir(&runtime).unwrap();
    Command::new(own.join("subagentd"))
        .env_remove("SUBAGENTD_SOCKET")
        .env_remove("SUBAGENTD_STATE_DIR")
        .env_remove("SUBAGENTD_RUNNER")
        .env(
            "PATH",
            format!("/nonexistent:{}:/usr/bin:/bin", path_bin.display()),
        )
        .env("XDG_RUNTIME_DIR", &runtime)
        .env("XDG_STATE_HOME", dir.join("state-home"))
        .stdin(Stdio::null())
        .stderr(std::fs::File::create(dir.join("daemon.log")).unwrap())
        .spawn()
        .unwrap()
}

#[test]
fn a_daemon_without_a_runner_beside_it_takes_a_trusted_one_on_path() {
    let dir = tempfile::Builder::new()
        .prefix("sa-path-")
        .tempdir_in("/tmp")
        .unwrap();
    let mut child = daemon_apart_from_its_runner(dir.path(), 0o755);
    let socket = dir.path().join("runtime/subagentd/subagentd.sock");
    wait_until(Duration::from_secs(20), "the daemon's socket", || {
        Conn::try_connect(&socket).is_some_and(|mut c| c.call("ping", json!({})).is_ok())
    });
    let mut c = Conn::connect(&socket);
    let run = c.spawn(&session("path"), &["true"], json!({}));
    let st = c.wait(&run);
    assert_eq!(st["state"], "succeeded", "{st}");
    unsafe_kill(child.id() as i32, libc::SIGTERM);
    assert!(child.wait().unwrap().success());
}

#[test]
fn a_runner_on_path_in_a_dir_others_can_write_is_refused() {
    let dir = tempfile::Builder::new()
        .prefix("sa-path-")
        .tempdir_in("/tmp")
        .unwrap();
    let mut child = daemon_apart_from_its_runner(dir.path(), 0o777);
    let status = child.wait().unwrap();
    let log = std::fs::read_to_string(dir.path().join("daemon.log")).unwrap();
    assert!(!status.success(), "{log}");
    assert!(log.contains("writable by others"), "{log}");
    assert!(log.contains("path-bin"), "{log}");
    assert!(
        !dir.path().join("runtime/subagentd/subagentd.sock").exists(),
        "{log}"
    );
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
