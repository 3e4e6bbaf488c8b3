//! The `subagent` client: logs -f, wait's exit codes, and `subagent run`
//! for CI, embedded and through a daemon, with each exit code; its shell
//! completions and manual page.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::json;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;
use subagentd_e2e::{
    alive, bin, session, sleep_marker, sleeping, unsafe_kill, wait_for_text, wait_until, Daemon,
};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn logs_follow_sees_every_line_of_a_live_child_and_stops_at_the_end() {
    let d = Daemon::start();
    let mut c = d.conn();
    let run = c.spawn(
        &session("follow"),
        &["sh", "-c", "i=1; while [ $i -le 300 ]; do echo line $i; i=$((i+1)); [ $((i % 50)) -eq 0 ] && sleep 0.05; done; printf 'no newline at the end'"],
        json!({}),
    );
    let out = d.cli(&["logs", "-f", &run]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut want: String = (1..=300).map(|i| format!("line {i}\n")).collect();
    want.push_str("no newline at the end");
    assert_eq!(text(&out.stdout), want);
    assert_eq!(c.wait(&run)["state"], "succeeded");
    // --tail on the ended run.
    let out = d.cli(&["logs", "--tail", "2", &run]);
    assert_eq!(text(&out.stdout), "line 300\nno newline at the end");
}

#[test]
fn logs_work_while_the_daemon_is_down() {
    let mut d = Daemon::start();
    let mut c = d.conn();
    let run = c.spawn(&session("down"), &["sh", "-c", "echo kept"], json!({}));
    c.wait(&run);
    drop(c);
    d.stop();
    let out = d.cli(&["logs", &run]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "kept\n");
    let out = d.cli(&["logs", "../../etc"]);
    assert!(!out.status.success());
}

#[test]
fn wait_exits_with_the_run_code() {
    let d = Daemon::start();
    let s = session("wait");
    for (cmd, code) in [("exit 0", 0), ("exit 3", 3), ("kill -TERM $$", 128 + 15)] {
        let out = d.cli(&[
            "spawn",
            "--session",
            &s,
            "--task",
            "t",
            "--wait",
            "--",
            "sh",
            "-c",
            cmd,
        ]);
        assert_eq!(
            out.status.code(),
            Some(code),
            "{cmd}: {}",
            text(&out.stderr)
        );
    }
    let out = d.cli(&[
        "spawn",
        "--session",
        &s,
        "--task",
        "t",
        "--wall-time",
        "1",
        "--",
        "sleep",
        "30",
    ]);
    let run = text(&out.stdout).trim().to_owned();
    let out = d.cli(&["wait", &run, "--timeout", "0.1"]);
    assert_eq!(out.status.code(), Some(75), "still running");
    let out = d.cli(&["wait", &run]);
    assert_eq!(out.status.code(), Some(124), "timed out");
    assert!(text(&out.stdout).contains("timed_out"));
    let out = d.cli(&["--json", "check", &run]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["state"], "timed_out");
    let out = d.cli(&["ls", "--session", &s]);
    let table = text(&out.stdout);
    assert!(table.starts_with("RUN"), "{table}");
    assert_eq!(table.lines().count(), 5, "{table}");
    assert!(table.contains(&run) && table.contains("timed_out") && table.contains("sleep 30"));
    let out = d.cli(&["notices", "--session", &s]);
    assert_eq!(text(&out.stdout).lines().count(), 4);
    let out = d.cli(&["notices", "--session", &s]);
    assert_eq!(text(&out.stdout), "");
}

/// Runs `subagent run` (embedded when `socket` has no daemon).
fn ci_run(socket: &Path, state: Option<&Path>, args: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(bin("subagent"));
    cmd.arg("--socket").arg(socket);
    if let Some(s) = state {
        cmd.arg("--state-dir").arg(s);
    }
    cmd.arg("run")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

const CASES: &[(&str, &str, i32)] = &[
    ("succeeded", "echo streamed; exit 0", 0),
    ("failed", "echo streamed; exit 3", 3),
    ("signal", "echo streamed; kill -KILL $$", 137),
];

/// The runner pid and run folder of the running run whose task is `task`,
/// from state.db.
fn runner_pid(state: &Path, task: &str) -> Option<(i32, std::path::PathBuf)> {
    for s in std::fs::read_dir(state.join("sessions")).ok()?.flatten() {
        for r in std::fs::read_dir(s.path().join("runs"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let Some(v) = subagentd_e2e::stored_run(&r.path()) else {
                continue;
            };
            if v["task"] == task && v["state"] == "running" {
                return v["runner_pid"].as_i64().map(|p| (p as i32, r.path()));
            }
        }
    }
    None
}

/// A run whose runner is killed ends `lost`, and `subagent run` exits 125.
/// (The child itself cannot kill its runner: it is told the runner's pid
/// and tries.)
fn check_lost(socket: &Path, state_arg: Option<&Path>, state: &Path) {
    let task = format!("lost-{}", session("t"));
    let (marker, chan) = (sleep_marker(), subagentd_e2e::channel());
    let pid_file = chan.path().join("runner.pid");
    let mut cmd = Command::new(bin("subagent"));
    cmd.arg("--socket").arg(socket);
    if let Some(s) = state_arg {
        cmd.arg("--state-dir").arg(s);
    }
    let child = cmd
        .args(["run", "--project-dir"])
        .arg(chan.path())
        .args([
            "--task",
            &task,
            "--",
            "sh",
            "-c",
            &format!(
                "sleep {marker} & while [ ! -s {p} ]; do sleep 0.02; done; kill -KILL $(cat {p}) 2>/dev/null || echo refused; wait",
                p = pid_file.display()
            ),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut found = None;
    wait_until(Duration::from_secs(20), "the run to start", || {
        found = runner_pid(state, &task).filter(|_| sleeping(&marker).len() == 1);
        found.is_some()
    });
    let (pid, dir) = found.unwrap();
    let sleeper = sleeping(&marker)[0];
    std::fs::write(&pid_file, pid.to_string()).unwrap();
    wait_for_text(
        &dir.join("child.log"),
        "refused",
        "the child's try at its runner",
    );
    assert!(alive(pid), "the child killed its runner");
    unsafe_kill(pid, libc::SIGKILL);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains(" lost ") && err.contains("killed by signal 9"),
        "{err}"
    );
    assert!(
        !alive(sleeper),
        "the dead runner's grandchild {sleeper} was killed"
    );
}

fn check_codes(socket: &Path, state: Option<&Path>) {
    let s = session("ci");
    for (name, script, code) in CASES {
        let out = ci_run(
            socket,
            state,
            &["--session", &s, "--task", name, "--", "sh", "-c", script],
        );
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(*code), "{name}: {err}");
        if *name != "lost" {
            // (A killed runner never copied what was still in its pipe.)
            assert_eq!(
                text(&out.stdout),
                "streamed\n",
                "{name}: the log streams to stdout"
            );
        }
        let result = err
            .lines()
            .find_map(|l| l.split_once("result: ").map(|(_, p)| p.to_owned()))
            .unwrap_or_else(|| panic!("no result path on stderr: {err}"));
        assert!(Path::new(&result).is_file(), "{result}");
    }
    let out = ci_run(
        socket,
        state,
        &[
            "--session",
            &s,
            "--task",
            "t",
            "--wall-time",
            "1",
            "--",
            "sleep",
            "30",
        ],
    );
    assert_eq!(out.status.code(), Some(124), "{}", text(&out.stderr));
}

#[test]
fn run_embedded_exits_with_each_code() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nobody-here.sock");
    let state = dir.path().join("state");
    check_codes(&socket, Some(&state));
    check_lost(&socket, Some(&state), &state);
    // Without --state-dir it makes one of its own and says where.
    let out = ci_run(&socket, None, &["--task", "t", "--", "true"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out.stderr).contains("running in-process with state dir"));
}

#[test]
fn run_through_a_daemon_exits_with_each_code() {
    let d = Daemon::start();
    check_codes(&d.socket, None);
    let mut c = d.conn();
    let listed = c.call("list_agent_runs", json!({})).unwrap();
    assert_eq!(
        listed["runs"].as_array().unwrap().len(),
        CASES.len() + 1,
        "the runs went through the daemon"
    );
}

#[test]
fn interrupting_run_cancels_the_run() {
    let d = Daemon::start();
    let s = session("int");
    let child = Command::new(bin("subagent"))
        .arg("--socket")
        .arg(&d.socket)
        .args(["run", "--session", &s, "--task", "t", "--", "sleep", "300"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut c = d.conn();
    wait_until(Duration::from_secs(20), "the run to start", || {
        let v = c
            .call(
                "list_agent_runs",
                json!({"session_id": s, "state": "running"}),
            )
            .unwrap();
        !v["runs"].as_array().unwrap().is_empty()
    });
    unsafe_kill(child.id() as i32, libc::SIGINT);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", text(&out.stderr));
    let v = c.call("list_agent_runs", json!({"session_id": s})).unwrap();
    assert_eq!(v["runs"][0]["state"], "cancelled");
}

#[test]
fn interrupting_an_embedded_run_cancels_it() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let child = Command::new(bin("subagent"))
        .arg("--socket")
        .arg(dir.path().join("none.sock"))
        .arg("--state-dir")
        .arg(&state)
        .args(["run", "--task", "t", "--", "sleep", "300"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let running = || -> bool {
        let Ok(sessions) = std::fs::read_dir(state.join("sessions")) else {
            return false;
        };
        sessions.flatten().any(|s| {
            std::fs::read_dir(s.path().join("runs"))
                .into_iter()
                .flatten()
                .flatten()
                .any(|r| {
                    subagentd_e2e::stored_run(&r.path()).is_some_and(|v| v["state"] == "running")
                })
        })
    };
    wait_until(
        Duration::from_secs(20),
        "the embedded run to start",
        running,
    );
    unsafe_kill(child.id() as i32, libc::SIGINT);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("cancelled"));
}

/// Runs `subagent` against `d` with a stdout whose reader is gone before
/// anything is written (as `subagent ... | head -1` ends up).
fn with_closed_stdout(d: &Daemon, args: &[&str]) -> std::process::Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    Command::new(bin("subagent"))
        .arg("--socket")
        .arg(&d.socket)
        .arg("--state-dir")
        .arg(&d.state)
        .args(args)
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

#[test]
fn every_command_ends_quietly_on_a_closed_stdout() {
    let d = Daemon::start();
    let project = tempfile::tempdir().unwrap();
    let defs = project.path().join(".claude/agents");
    std::fs::create_dir_all(&defs).unwrap();
    std::fs::write(
        defs.join("helper.md"),
        "---\nname: helper\ndescription: Helps.\n---\nHelp.\n",
    )
    .unwrap();
    let mut c = d.conn();
    let run = c.spawn(&session("epipe"), &["sh", "-c", "echo hello"], json!({}));
    c.wait(&run);
    let dir = project.path().to_str().unwrap();
    let commands: [&[&str]; 11] = [
        &["agents", "--project-dir", dir],
        &["--json", "agents", "--project-dir", dir],
        &["ls"],
        &["--json", "ls"],
        &["check", &run],
        &["context", &run],
        &["--json", "context", &run],
        &["context", "--show", &run],
        &["logs", &run],
        &["ping"],
        &["--help"],
    ];
    for args in commands {
        let out = with_closed_stdout(&d, args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
        assert!(err.is_empty(), "{args:?} said: {err}");
    }
}

/// `subagent spawn --network-allow` lists a host:port for the run's proxy:
/// the run is in allowlist mode, reaches that port and is refused another.
#[test]
fn spawn_network_allow_reaches_the_listed_port_only() {
    let d = Daemon::start();
    let listed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (lp, op) = (
        listed.local_addr().unwrap().port(),
        other.local_addr().unwrap().port(),
    );
    std::thread::spawn(move || {
        for s in listed.incoming().flatten() {
            use std::io::{Read, Write};
            let mut s = s;
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf);
            let _ = s.write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 6\r\n\r\nlisted");
        }
    });
    // NO_PROXY names the run's own loopback; these servers are the host's.
    let script = format!(
        "unset NO_PROXY no_proxy; python3 -c \"import urllib.request as u\nfor p in ({lp}, {op}):\n  try: print(p, u.urlopen('http://127.0.0.1:%d/' % p, timeout=10).read().decode())\n  except Exception as e: print(p, 'refused', e)\""
    );
    let out = d.cli(&[
        "spawn",
        "--session",
        &session("allowcli"),
        "--task",
        "t",
        "--network-allow",
        &format!("127.0.0.1:{lp}"),
        "--wait",
        "--json",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    let st: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let log = std::fs::read_to_string(st["log_path"].as_str().unwrap()).unwrap();
    assert_eq!(st["state"], "succeeded", "{st}\n{log}");
    assert_eq!(st["network"], "allowlist", "{st}");
    assert!(log.contains(&format!("{lp} listed")), "{log}");
    assert!(log.contains(&format!("{op} refused")), "{log}");
    drop(other);
}

/// `subagent ls` pages: `--limit` prints one page and says more follow,
/// `--all` streams every page under one header (and `--json` one document),
/// `--desc` turns the order, `--since`/`--until` take ages and times.
#[test]
fn ls_prints_one_page_or_streams_them_all() {
    let d = Daemon::start();
    let mut c = d.conn();
    let s = session("lspage");
    let ids: Vec<String> = (0..5)
        .map(|_| {
            let id = c.spawn(&s, &["true"], json!({}));
            c.wait(&id);
            id
        })
        .collect();
    let rows = |out: &std::process::Output| -> Vec<String> {
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let t = text(&out.stdout);
        assert_eq!(t.lines().filter(|l| l.starts_with("RUN")).count(), 1, "{t}");
        t.lines()
            .skip(1)
            .map(|l| l.split_whitespace().next().unwrap().to_owned())
            .collect()
    };
    let out = d.cli(&["ls", "--session", &s, "--limit", "3"]);
    assert_eq!(rows(&out), ids[..3]);
    assert!(text(&out.stderr).contains("--all"), "{}", text(&out.stderr));
    let out = d.cli(&["ls", "--session", &s, "--limit", "5"]);
    assert_eq!(rows(&out), ids);
    assert_eq!(text(&out.stderr), "", "no more to say");

    let out = d.cli(&["ls", "--session", &s, "--all", "--limit", "2"]);
    assert_eq!(rows(&out), ids, "three pages, one header");
    assert_eq!(rows(&d.cli(&["ls", "--session", &s])), ids);
    let mut newest: Vec<String> = ids.clone();
    newest.reverse();
    let out = d.cli(&["ls", "--session", &s, "--all", "--limit", "2", "--desc"]);
    assert_eq!(rows(&out), newest);

    let out = d.cli(&["--json", "ls", "--session", &s, "--all", "--limit", "2"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let listed: Vec<&str> = v["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run_id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, ids);
    assert!(v["next_cursor"].is_null());
    let out = d.cli(&["--json", "ls", "--session", &s, "--limit", "2"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["runs"].as_array().unwrap().len(), 2);
    assert!(v["next_cursor"].is_string(), "{v}");
    let out = d.cli(&["--json", "ls", "--session", &session("lsnone")]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["runs"], json!([]));

    assert_eq!(rows(&d.cli(&["ls", "--session", &s, "--since", "1h"])), ids);
    assert!(rows(&d.cli(&["ls", "--session", &s, "--until", "1h"])).is_empty());
    let old = ["ls", "--session", &s, "--until", "2000-01-01T00:00:00Z"];
    assert!(rows(&d.cli(&old)).is_empty());
    let out = d.cli(&["ls", "--since", "soon"]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        text(&out.stderr).contains("--since"),
        "{}",
        text(&out.stderr)
    );
}

/// `subagentd --log-file`: a log that has reached 10 MiB when the daemon
/// starts is moved to `.1`, and the daemon goes on in a new one.
#[test]
fn the_daemons_log_file_is_moved_aside_at_its_cap() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("daemon.log");
    let full = vec![b'x'; 10 << 20];
    std::fs::write(&log, &full).unwrap();
    let opts = subagentd_e2e::DaemonOpts {
        args: vec!["--log-file".into(), log.to_str().unwrap().into()],
        ..Default::default()
    };
    let mut child = Daemon::spawn_process(
        &dir.path().join("d.sock"),
        &dir.path().join("state"),
        dir.path(),
        &opts,
    );
    let old = dir.path().join("daemon.log.1");
    wait_until(Duration::from_secs(20), "the log to be moved", || {
        std::fs::read_to_string(&log).is_ok_and(|t| t.contains("log moved to .1"))
    });
    // The old log, and what the daemon wrote before its first check.
    let moved = std::fs::read(&old).unwrap();
    assert!(moved.starts_with(&full), "{} bytes moved", moved.len());
    let now = std::fs::read_to_string(&log).unwrap();
    assert!(now.len() < 1 << 20, "a new log: {now}");
    child.kill().unwrap();
    child.wait().unwrap();
}

/// `subagent completions SHELL` for each shell: bash's script parses
/// (`bash -n`) and completes the subcommands; no daemon is needed.
#[test]
fn completions_are_scripts_the_shells_accept() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = Command::new(bin("subagent"))
            .args(["--socket", "/nonexistent/d.sock", "completions", shell])
            .output()
            .unwrap();
        assert!(out.status.success(), "{shell}: {out:?}");
        let script = text(&out.stdout);
        for sub in ["spawn", "logs", "prune", "completions"] {
            assert!(script.contains(sub), "{shell} lacks {sub}");
        }
        if shell == "bash" {
            let path = std::env::temp_dir().join(format!("subagent-{}.bash", std::process::id()));
            std::fs::write(&path, &out.stdout).unwrap();
            let check = Command::new("bash").arg("-n").arg(&path).output().unwrap();
            let _ = std::fs::remove_file(&path);
            assert!(check.status.success(), "bash -n: {}", text(&check.stderr));
        }
    }
    let bad = Command::new(bin("subagent"))
        .args(["completions", "tcsh"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
}

/// `subagent man` is a page `man -l` renders, naming the subcommands.
#[test]
fn the_manual_page_renders() {
    let out = Command::new(bin("subagent")).arg("man").output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(
        text(&out.stdout).starts_with(".ie"),
        "roff: {}",
        text(&out.stdout)
    );
    if Command::new("man").arg("--version").output().is_err() {
        println!("SKIPPED: man is not installed (the roff was checked, not its rendering)");
        return;
    }
    let page = std::env::temp_dir().join(format!("subagent-{}.1", std::process::id()));
    std::fs::write(&page, &out.stdout).unwrap();
    let shown = Command::new("man")
        .arg("-l")
        .arg(&page)
        .env("MANPAGER", "cat")
        .env("MANWIDTH", "100")
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&page);
    assert!(shown.status.success(), "man -l: {}", text(&shown.stderr));
    let shown = text(&shown.stdout);
    for want in ["NAME", "SYNOPSIS", "subagent", "spawn", "prune", "--socket"] {
        assert!(shown.contains(want), "{want} missing:\n{shown}");
    }
}
