//! The config file: errors name the line and column; `require` and
//! `run_as` take effect.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::json;
use std::process::{Command, Stdio};
use subagentd_e2e::{bin, is_root, runnable, session, Daemon, DaemonOpts};

#[test]
fn a_bad_config_stops_the_daemon_with_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "max_concurrent = 4\nrun_az = \"x\"\n",
            "line 2, column 1",
            "run_az",
        ),
        (
            "\n\nmax_concurrent = \"lots\"\n",
            "line 3, column 18",
            "invalid type",
        ),
        ("require = [\"landlock\", \"magic\"]\n", "line 1", "magic"),
    ];
    for (text, place, word) in cases {
        let cfg = dir.path().join("c.toml");
        std::fs::write(&cfg, text).unwrap();
        let out = Command::new(bin("subagentd"))
            .arg("--config")
            .arg(&cfg)
            .arg("--socket")
            .arg(dir.path().join("s.sock"))
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{text:?}");
        assert!(
            err.contains(place) && err.contains(word) && err.contains("c.toml"),
            "{text:?}: {err}"
        );
        assert!(
            !dir.path().join("s.sock").exists(),
            "no socket for a daemon that did not start"
        );
    }
    let out = Command::new(bin("subagentd"))
        .arg("--config")
        .arg(dir.path().join("missing.toml"))
        .arg("--check")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "an explicit config must exist");
}

#[test]
fn check_reads_the_required_list_from_the_config() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, "require = [\"landlock\", \"cgroup\"]\n").unwrap();
    let out = Command::new(bin("subagentd"))
        .arg("--check")
        .arg("--config")
        .arg(&cfg)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let listed: Vec<&str> = text
        .lines()
        .skip(1)
        .map(|l| {
            l.split_whitespace()
                .last()
                .unwrap_or("")
                .trim_end_matches(':')
        })
        .collect();
    assert!(
        listed.contains(&"landlock") && listed.contains(&"cgroup"),
        "{text}"
    );
    assert!(
        !listed.contains(&"seccomp"),
        "the list replaces the default: {text}"
    );
}

#[test]
fn run_as_from_the_config() {
    if !runnable(is_root(), "run_as", "run_as needs a daemon running as root") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, "run_as = \"65534:65534\"\nmax_concurrent = 3\n").unwrap();
    let d = Daemon::start_with(DaemonOpts {
        args: vec!["--config".into(), cfg.display().to_string()],
        ..Default::default()
    });
    let mut c = d.conn();
    let run = c.spawn(&session("cfg"), &["sh", "-c", "id -u"], json!({}));
    let st = c.wait(&run);
    assert_eq!(st["state"], "succeeded", "{st}");
    assert_eq!(
        std::fs::read_to_string(st["log_path"].as_str().unwrap()).unwrap(),
        "65534\n"
    );
    assert!(d.log().contains("config loaded"), "{}", d.log());
}
