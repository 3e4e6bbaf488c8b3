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
    // The run's files stay the daemon's.
    let run_dir = std::path::Path::new(st["log_path"].as_str().unwrap())
        .parent()
        .unwrap()
        .to_path_buf();
    let meta = std::fs::metadata(run_dir.join("run.json")).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
}

#[test]
fn run_as_with_an_unreachable_state_dir_refuses_to_start() {
    if !runnable(is_root(), "run_as", "run_as needs a daemon running as root") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let closed = dir.path().join("closed");
    std::fs::create_dir(&closed).unwrap();
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
    let out = std::process::Command::new(subagentd_e2e::bin("subagentd"))
        .args(["--run-as", "65534:65534", "--socket"])
        .arg(dir.path().join("s.sock"))
        .arg("--state-dir")
        .arg(closed.join("state"))
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("cannot be traversed by the run_as user") && err.contains("closed"),
        "{err}"
    );
}
