//! The daemon under systemd's tools, without systemd as PID 1: a socket
//! handed by `systemd-socket-activate` (LISTEN_FDS), READY=1, STATUS= and
//! WATCHDOG=1 on a NOTIFY_SOCKET datagram socket, and the units in
//! contrib/systemd accepted by `systemd-analyze verify`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::json;
use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use subagentd_e2e::{bin, runnable, session, unsafe_kill, wait_until, Conn};

fn tool(name: &str) -> Option<String> {
    let out = Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// `name`'s path; else `SKIPPED` (a failure under CI) and `None`.
fn required_tool(name: &str) -> Option<String> {
    let found = tool(name);
    let why = format!("{name} is not installed");
    if runnable(found.is_some(), "systemd-tools", &why) {
        found
    } else {
        None
    }
}

/// Every datagram the daemon sends within `within`, until `done` holds.
fn notifications(sock: &UnixDatagram, within: Duration, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + within;
    let mut all = String::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline && !done(&all) {
        sock.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        if let Ok(n) = sock.recv(&mut buf) {
            all.push_str(&String::from_utf8_lossy(&buf[..n]));
            all.push('\n');
        }
    }
    all
}

#[test]
fn a_socket_from_systemd_is_served_and_ready_and_the_watchdog_are_sent() {
    let Some(activate) = required_tool("systemd-socket-activate") else {
        return;
    };
    let dir = tempfile::Builder::new()
        .prefix("sa-sd-")
        .tempdir_in("/tmp")
        .unwrap();
    let socket = dir.path().join("activated.sock");
    let notify_path = dir.path().join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    let mut child = Command::new(activate)
        .arg("-l")
        .arg(&socket)
        .arg("-E")
        .arg(format!("NOTIFY_SOCKET={}", notify_path.display()))
        .args([
            "-E",
            "WATCHDOG_USEC=400000",
            "-E",
            "RUST_LOG=info",
            "-E",
            "PATH",
        ])
        .arg(bin("subagentd"))
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .arg("--socket")
        .arg(dir.path().join("ignored.sock"))
        .stdin(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("daemon.log")).unwrap())
        .spawn()
        .unwrap();
    // systemd-socket-activate starts the daemon at the first connection.
    wait_until(Duration::from_secs(20), "the activated socket", || {
        Conn::try_connect(&socket).is_some_and(|mut c| c.call("ping", json!({})).is_ok())
    });
    let mut c = Conn::connect(&socket);
    let run = c.spawn(&session("sd"), &["true"], json!({}));
    assert_eq!(c.wait(&run)["state"], "succeeded");
    let got = notifications(&notify, Duration::from_secs(20), |all| {
        all.contains("READY=1") && all.matches("WATCHDOG=1").count() >= 2
    });
    let log = || std::fs::read_to_string(dir.path().join("daemon.log")).unwrap();
    assert!(got.contains("READY=1"), "{got}\n{}", log());
    assert!(got.matches("WATCHDOG=1").count() >= 2, "{got}\n{}", log());
    assert!(got.contains("STATUS=0 running, 0 queued"), "{got}");
    assert!(
        !dir.path().join("ignored.sock").exists(),
        "--socket was not bound"
    );

    unsafe_kill(child.id() as i32, libc::SIGTERM);
    assert!(child.wait().unwrap().success(), "{}", log());
    let last = notifications(&notify, Duration::from_secs(5), |all| {
        all.contains("STOPPING=1")
    });
    assert!(last.contains("STOPPING=1"), "{last}");
    // The socket is systemd's: it stays for the next activation.
    assert!(socket.exists());
}

/// The units, copied with ExecStart naming the binary built here (verify
/// checks that it exists), and `systemd-analyze verify`'s complaints.
fn verify(analyze: &str, units: &[&str], user: bool) -> Vec<String> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../contrib/systemd");
    let tmp = tempfile::tempdir().unwrap();
    let daemon = bin("subagentd").display().to_string();
    for u in units {
        let text = std::fs::read_to_string(root.join(u)).unwrap();
        let text = text
            .replace("/usr/local/bin/subagentd", &daemon)
            .replace("%h/.cargo/bin/subagentd", &daemon);
        let to = tmp
            .path()
            .join(std::path::Path::new(u).file_name().unwrap());
        std::fs::write(to, text).unwrap();
    }
    let runtime = tempfile::tempdir().unwrap();
    let mut complaints = Vec::new();
    for u in units {
        let mut cmd = Command::new(analyze);
        if user {
            cmd.arg("--user").env("XDG_RUNTIME_DIR", runtime.path());
        }
        let name = std::path::Path::new(u).file_name().unwrap();
        let out = cmd
            .args(["verify", "--man=no"])
            .arg(tmp.path().join(name))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        // verify exits 0 on unknown keys and bad values: its stderr says them.
        if !out.status.success() || !err.trim().is_empty() {
            complaints.push(format!("{u}: {}: {err}", out.status));
        }
    }
    complaints
}

#[test]
fn the_units_pass_systemd_analyze_verify() {
    let Some(analyze) = required_tool("systemd-analyze") else {
        return;
    };
    let system = verify(&analyze, &["subagentd.service", "subagentd.socket"], false);
    assert!(system.is_empty(), "{system:?}");
    let user = verify(
        &analyze,
        &["user/subagentd.service", "user/subagentd.socket"],
        true,
    );
    assert!(user.is_empty(), "{user:?}");
}

#[test]
fn verify_reports_a_misspelt_directive() {
    let Some(analyze) = required_tool("systemd-analyze") else {
        return;
    };
    // The check above is only worth something if verify's complaints reach it.
    let tmp = tempfile::tempdir().unwrap();
    let unit = tmp.path().join("bad.service");
    std::fs::write(&unit, "[Service]\nExecStart=/bin/true\nProtectSystm=full\n").unwrap();
    let out = Command::new(analyze)
        .args(["verify", "--man=no"])
        .arg(&unit)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("ProtectSystm"));
}

#[test]
fn a_passed_fd_that_is_not_a_listening_socket_refuses_the_start() {
    let dir = tempfile::tempdir().unwrap();
    // The shell's pid is the daemon's after exec: LISTEN_PID names it.
    let out = Command::new("sh")
        .arg("-c")
        .arg(r#"LISTEN_PID=$$ LISTEN_FDS=1 exec "$0" --state-dir "$1" --socket "$2" 3</dev/null"#)
        .arg(bin("subagentd"))
        .arg(dir.path().join("state"))
        .arg(dir.path().join("d.sock"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("LISTEN_FDS") && err.contains("not a socket"),
        "{err}"
    );
    assert!(!dir.path().join("d.sock").exists(), "{err}");
}
