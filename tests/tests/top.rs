//! The live view: `subagent top` driven under tmux (it shows a running
//! run and its last line, escaped; follows its log; cancels it after a
//! confirmation; quits leaving the terminal as it was), colour only on a
//! terminal without NO_COLOR, `subagent ls --watch` through a pipe, and
//! the `sample_agent_runs` method behind them (a busy child's CPU rising,
//! its memory, the runs another uid may see).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{json, Value};
use std::io::BufRead;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use subagentd_e2e::tmux::Tmux;
use subagentd_e2e::{bin, channel, otheruser, session, wait_until, Daemon};

/// Spawn params that end a run this test leaves behind (one that failed
/// before it let the run go).
fn bounded() -> Value {
    json!({"limits": {"wall_time_s": 120}})
}

/// The short id top shows: the run id's random part.
fn short(run: &str) -> &str {
    run.rsplit('-').next().unwrap()
}

/// Whether any line of `screen` holds every one of `parts`.
fn a_line_with(screen: &str, parts: &[&str]) -> bool {
    screen.lines().any(|l| parts.iter().all(|p| l.contains(p)))
}

/// Whether `screen` has `line` as a line of its own (a command's output,
/// not the command line that printed it).
fn output_line(screen: &str, line: &str) -> bool {
    screen.lines().any(|l| l.trim_end() == line)
}

/// A run's state over the socket.
fn state_of(d: &Daemon, run: &str) -> String {
    d.conn()
        .call("check_agent_run", json!({ "run_id": run }))
        .unwrap()["state"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// A shell script that prints a line, waits for `go1` in `chan`, prints a
/// hostile line (a title change and a screen clear), waits for `go2`,
/// prints another line and then waits for `end`.
fn paced_script(chan: &Path, mark: &str) -> String {
    let c = chan.display();
    format!(
        "echo first-{mark}; until [ -e {c}/go1 ]; do sleep 0.05; done; \
         printf '\\033]0;pwned\\007\\033[2J hostile-%s\\n' {mark}; \
         until [ -e {c}/go2 ]; do sleep 0.05; done; echo later-{mark}; \
         until [ -e {c}/end ]; do sleep 0.05; done"
    )
}

#[test]
fn top_shows_follows_and_cancels_a_run_and_leaves_the_terminal_as_it_was() {
    let Some(t) = Tmux::start(160, 30, &[]) else {
        return;
    };
    let d = Daemon::start();
    let chan = channel();
    let s = session("top");
    let mark = session("m");
    let script = paced_script(chan.path(), &mark);
    let run = d.conn().spawn(&s, &["/bin/sh", "-c", &script], bounded());
    let tty = chan.path().join("stty");
    t.type_line(&format!("stty -g > {}.before", tty.display()));
    t.type_line(&format!(
        "{} top --session {s}",
        Tmux::subagent(&d.socket, &d.state)
    ));
    let first = format!("first-{mark}");
    t.wait_for("top to show the run running with its first line", |sc| {
        sc.contains("LAST LINE") && a_line_with(sc, &[short(&run), &s, "running", &first])
    });
    assert_eq!(
        t.display("#{alternate_on}"),
        "1",
        "top is on the alternate screen"
    );

    // A hostile last line shows escaped, and does nothing to the terminal.
    std::fs::write(chan.path().join("go1"), "").unwrap();
    let hostile = format!("\\x1b]0;pwned\\x07\\x1b[2J hostile-{mark}");
    t.wait_for("the hostile last line, escaped", |sc| {
        a_line_with(sc, &[short(&run), &hostile])
    });
    assert_ne!(t.display("#{pane_title}"), "pwned", "the title was changed");

    // Enter follows the run's log, and the view keeps up with it.
    t.keys(&["Enter"]);
    let head = format!("log of {run}");
    t.wait_for("the log view", |sc| {
        sc.contains(&head) && sc.contains(&first) && sc.contains(&hostile)
    });
    std::fs::write(chan.path().join("go2"), "").unwrap();
    let later = format!("later-{mark}");
    t.wait_for("a line written while the log is followed", |sc| {
        sc.contains(&head) && a_line_with(sc, &[&later])
    });
    t.keys(&["Escape"]);
    t.wait_for("the table again", |sc| {
        sc.contains("LAST LINE") && !sc.contains(&head)
    });

    // c asks first; n leaves the run alone; y cancels it.
    let question = format!("cancel run {run}? (y/n)");
    t.keys(&["c"]);
    t.wait_for("the question", |sc| sc.contains(&question));
    t.keys(&["n"]);
    t.wait_for("the question gone", |sc| !sc.contains(&question));
    assert_eq!(state_of(&d, &run), "running");
    t.keys(&["c"]);
    t.wait_for("the question again", |sc| sc.contains(&question));
    t.keys(&["y"]);
    t.wait_for("the run shown cancelled", |sc| {
        a_line_with(sc, &[short(&run), "cancelled"])
    });
    assert_eq!(state_of(&d, &run), "cancelled");

    // q quits: the main screen, the cursor, and the tty's modes are back.
    t.keys(&["q"]);
    t.wait_display("#{alternate_on}", "0");
    assert_eq!(t.display("#{cursor_flag}"), "1", "the cursor is shown");
    t.type_line(&format!("stty -g > {}.after", tty.display()));
    t.type_line("echo $((6*7))-after-top");
    t.wait_for("a command typed after top, and its output", |sc| {
        output_line(sc, "42-after-top")
    });
    let read = |ext: &str| std::fs::read_to_string(tty.with_extension(ext)).unwrap_or_default();
    wait_until(Duration::from_secs(10), "stty's output", || {
        !read("after").is_empty()
    });
    assert_eq!(read("before"), read("after"), "the tty's modes changed");
    std::fs::write(chan.path().join("end"), "").unwrap();
}

/// Whether `styled` (capture-pane -e) sets a foreground or background
/// colour anywhere.
fn has_colour(styled: &str) -> bool {
    styled.split("\x1b[").skip(1).any(|seq| {
        let params = seq.split('m').next().unwrap_or("");
        params.split(';').any(|p| {
            let n: u32 = p.parse().unwrap_or(0);
            (30..=38).contains(&n) || (40..=48).contains(&n) || (90..=107).contains(&n)
        })
    })
}

#[test]
fn the_state_is_coloured_only_on_a_terminal_without_no_color() {
    let Some(t) = Tmux::start(200, 40, &[]) else {
        return;
    };
    let d = Daemon::start();
    let chan = channel();
    let s = session("colour");
    let go = chan.path().join("go");
    let wait = format!("until [ -e {} ]; do sleep 0.05; done", go.display());
    let run = d.conn().spawn(&s, &["/bin/sh", "-c", &wait], bounded());
    wait_until(Duration::from_secs(20), "the run to start", || {
        state_of(&d, &run) == "running"
    });
    let cli = Tmux::subagent(&d.socket, &d.state);
    t.type_line(&format!("clear; {cli} ls --session {s}; echo ls-done"));
    t.wait_for("ls", |sc| output_line(sc, "ls-done"));
    assert!(
        t.screen_styled(0).contains("\x1b[36mrunning"),
        "running in cyan: {:?}",
        t.screen_styled(0)
    );
    t.type_line(&format!("clear; {cli} check {run}; echo check-done"));
    t.wait_for("check", |sc| output_line(sc, "check-done"));
    assert!(t.screen_styled(0).contains("\x1b[36mrunning"));
    for env in ["NO_COLOR=1", "TERM=dumb"] {
        let done = format!("{}-done", &env[..2]);
        t.type_line(&format!(
            "clear; {env} {cli} ls --session {s}; {env} {cli} check {run}; echo {done}"
        ));
        t.wait_for("ls and check", |sc| {
            output_line(sc, &done) && a_line_with(sc, &["state", "running"])
        });
        assert!(
            !has_colour(&t.screen_styled(0)),
            "{env}: {:?}",
            t.screen_styled(0)
        );
    }
    // Through a pipe: no colour either.
    let out = d.cli(&["ls", "--session", &s]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("running"));
    assert!(!out.stdout.contains(&0x1b), "{out:?}");
    // top under NO_COLOR: still the view, without colours.
    t.type_line(&format!("clear; NO_COLOR=1 {cli} top --session {s}"));
    t.wait_display("#{alternate_on}", "1");
    t.wait_for("top", |sc| {
        sc.contains("LAST LINE") && a_line_with(sc, &[short(&run), "running"])
    });
    assert!(!has_colour(&t.screen_styled(0)), "{:?}", t.screen_styled(0));
    t.keys(&["q"]);
    t.wait_display("#{alternate_on}", "0");
    // And with colour allowed, top colours the state.
    t.type_line(&format!("clear; {cli} top --session {s}"));
    t.wait_display("#{alternate_on}", "1");
    t.wait_for("top", |sc| {
        sc.contains("LAST LINE") && a_line_with(sc, &[short(&run), "running"])
    });
    assert!(has_colour(&t.screen_styled(0)), "{:?}", t.screen_styled(0));
    t.keys(&["C-c"]);
    t.wait_display("#{alternate_on}", "0");
    std::fs::write(&go, "").unwrap();
    assert_eq!(d.conn().wait(&run)["state"], "succeeded");
}

#[test]
fn ls_watch_through_a_pipe_reprints_the_table_and_shows_a_change() {
    let d = Daemon::start();
    let chan = channel();
    let s = session("watch");
    let go = chan.path().join("go");
    let wait = format!("until [ -e {} ]; do sleep 0.05; done", go.display());
    let run = d.conn().spawn(&s, &["/bin/sh", "-c", &wait], bounded());
    let mut watch = Command::new(bin("subagent"))
        .arg("--socket")
        .arg(&d.socket)
        .args(["ls", "--watch", "--interval", "0.2", "--session", &s])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let out = watch.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines() {
            if tx.send(line.unwrap()).is_err() {
                return;
            }
        }
    });
    // Each table: a time line, the header, the run's row.
    let mut lines: Vec<String> = Vec::new();
    let mut read_until = |what: &str, done: &dyn Fn(&[String]) -> bool| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !done(&lines) {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "timed out waiting for {what}: {lines:#?}");
            if let Ok(l) = rx.recv_timeout(left) {
                lines.push(l);
            }
        }
        lines.clone()
    };
    let tables_with = |lines: &[String], state: &str| {
        lines
            .windows(3)
            .filter(|w| {
                w[0].starts_with("=== ")
                    && w[0].ends_with("Z ===")
                    && w[1].starts_with("RUN")
                    && a_line_with(&w[2], &[&run, state])
            })
            .count()
    };
    read_until("two tables with the run running", &|l| {
        tables_with(l, "running") >= 2
    });
    std::fs::write(&go, "").unwrap();
    let all = read_until("a table with the run succeeded", &|l| {
        tables_with(l, "succeeded") >= 1
    });
    watch.kill().unwrap();
    watch.wait().unwrap();
    assert!(
        all.iter().all(|l| !l.contains('\x1b')),
        "no escape sequence through a pipe"
    );
}

/// The entry of `run` in a `sample_agent_runs` result.
fn entry<'a>(result: &'a Value, run: &str) -> Option<&'a Value> {
    result["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["run_id"] == run)
}

#[test]
fn samples_show_a_busy_childs_cpu_rising_its_memory_and_its_end() {
    let d = Daemon::start();
    let s = session("sample");
    let busy = "echo busy-start; while :; do :; done";
    let run = d.conn().spawn(&s, &["/bin/sh", "-c", busy], bounded());
    let sample = |params: Value| d.conn().call("sample_agent_runs", params).unwrap();
    let mut first: Option<Value> = None;
    // The runner copies the line to child.log on its own time.
    let what = "a sample with CPU time and the first line";
    wait_until(Duration::from_secs(30), what, || {
        let r = sample(json!({ "session_id": s }));
        first = entry(&r, &run).cloned();
        first.as_ref().is_some_and(|e| {
            e["sample"]["cpu_ms"].as_u64().unwrap_or(0) > 0 && e["last_line"] == "busy-start"
        })
    });
    let first = first.unwrap();
    assert_eq!(first["state"], "running");
    assert_eq!(first["last_line"], "busy-start", "{first}");
    assert!(
        first["sample"]["memory_bytes"].as_u64().unwrap() > 0,
        "{first}"
    );
    assert!(
        first["sample"]["processes"].as_u64().unwrap() >= 1,
        "{first}"
    );
    let cpu0 = first["sample"]["cpu_ms"].as_u64().unwrap();
    wait_until(Duration::from_secs(30), "the CPU time to rise", || {
        let r = sample(json!({}));
        entry(&r, &run).is_some_and(|e| e["sample"]["cpu_ms"].as_u64().unwrap() > cpu0)
    });
    // The filters: another session, another state.
    let other = sample(json!({ "session_id": session("other") }));
    assert!(entry(&other, &run).is_none(), "{other}");
    let accepted = sample(json!({ "state": "accepted" }));
    assert!(entry(&accepted, &run).is_none(), "{accepted}");
    for bad in [json!({"session_id": "../x"}), json!({"limit": 3})] {
        let e = d.conn().call("sample_agent_runs", bad).unwrap_err();
        assert_eq!(e["code"], -32602, "{e}");
    }
    // An end stays in the samples for a while, without a sample.
    d.conn()
        .call("cancel_agent_run", json!({ "run_id": run }))
        .unwrap();
    assert_eq!(d.conn().wait(&run)["state"], "cancelled");
    let after = sample(json!({ "session_id": s }));
    let e = entry(&after, &run).unwrap_or_else(|| panic!("the end is not shown: {after}"));
    assert_eq!(e["state"], "cancelled");
    assert_eq!(e["sample"], Value::Null);
    assert_eq!(e["last_line"], "busy-start");
    assert!(after["sampled_at"].as_str().unwrap().ends_with('Z'));
}

/// One call on `socket` made by a process of `ids`: the whole response.
fn call_as(ids: (u32, u32), socket: &Path, method: &str, params: &Value) -> Value {
    let py = "import json, socket, sys\n\
s = socket.socket(socket.AF_UNIX)\n\
s.connect(sys.argv[1])\n\
req = {'jsonrpc': '2.0', 'id': 1, 'method': sys.argv[2], 'params': json.loads(sys.argv[3])}\n\
s.sendall((json.dumps(req) + '\\n').encode())\n\
print(s.makefile().readline())\n";
    let out = Command::new("/usr/bin/python3")
        .args(["-c", py])
        .arg(socket)
        .arg(method)
        .arg(params.to_string())
        .current_dir("/")
        .uid(ids.0)
        .gid(ids.1)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("{e}: {text} {}", String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn another_uid_samples_only_its_own_runs() {
    let Some(ids) = otheruser::ids_or_skip("another uid's view needs root to make a user") else {
        return;
    };
    let (d, _cfg) = otheruser::daemon_allowing(ids.0, "");
    let chan = channel();
    let go = chan.path().join("go");
    let s = session("roots");
    let wait = format!(
        "echo roots-line; until [ -e {} ]; do sleep 0.05; done",
        go.display()
    );
    let run = d.conn().spawn(&s, &["/bin/sh", "-c", &wait], bounded());
    wait_until(Duration::from_secs(20), "root's run to start", || {
        state_of(&d, &run) == "running"
    });
    let mine = d.conn().call("sample_agent_runs", json!({})).unwrap();
    assert!(entry(&mine, &run).is_some(), "root sees its run: {mine}");
    for params in [
        json!({}),
        json!({ "session_id": s }),
        json!({"state": "running"}),
    ] {
        let theirs = call_as(ids, &d.socket, "sample_agent_runs", &params);
        let runs = theirs["result"]["runs"]
            .as_array()
            .unwrap_or_else(|| panic!("{theirs}"));
        assert!(
            runs.iter()
                .all(|r| r["run_id"] != run.as_str() && r["session_id"] != s.as_str()),
            "{params}: {theirs}"
        );
    }
    std::fs::write(&go, "").unwrap();
    assert_eq!(d.conn().wait(&run)["state"], "succeeded");
}
