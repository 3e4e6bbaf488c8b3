//! `subagent logs --timestamps` and `--since`: the capture time of each
//! line, kept by the runner in child.log.times beside child.log, on a run
//! that writes in phases the test sets seconds apart; followed live,
//! read while the daemon is down, across a restart (exit 75), and with
//! the index removed or damaged.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::Duration;
use subagentd::paging::parse_time;
use subagentd::timefmt::{now_ms, rfc3339_ms};
use subagentd_e2e::{bin, channel, session, wait_for_text, Daemon};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The lines of `logs --timestamps`: (ms, line).
fn stamped(out: &str) -> Vec<(u64, String)> {
    out.lines()
        .map(|l| {
            let (t, rest) = l.split_once(' ').unwrap_or_else(|| panic!("{l:?}"));
            let ms = parse_time(t).unwrap_or_else(|| panic!("not a time: {l:?}"));
            assert_eq!(rfc3339_ms(ms), t, "RFC 3339 UTC to the ms: {l:?}");
            (ms, rest.to_owned())
        })
        .collect()
}

/// `subagent logs ARGS` as a child whose stdout lines arrive on a channel.
fn follow(d: &Daemon, args: &[&str]) -> (Child, Receiver<String>) {
    let mut child = Command::new(bin("subagent"))
        .arg("--socket")
        .arg(&d.socket)
        .arg("--state-dir")
        .arg(&d.state)
        .arg("logs")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            if tx.send(line.unwrap()).is_err() {
                return;
            }
        }
    });
    (child, rx)
}

/// The next line of a follower, within 20 s.
fn next_line(rx: &Receiver<String>, what: &str) -> String {
    rx.recv_timeout(Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("no line from {what}: {e:?}"))
}

/// The phases must lie seconds apart: that gap is what is measured, so
/// it is waited out on the clock, not polled for.
fn let_time_pass(ms: u64) {
    std::thread::sleep(Duration::from_millis(ms));
}

fn run_dir(st: &Value) -> PathBuf {
    Path::new(st["log_path"].as_str().unwrap())
        .parent()
        .unwrap()
        .to_path_buf()
}

#[test]
fn lines_carry_their_capture_times_and_since_starts_between_phases() {
    let mut d = Daemon::start();
    let mut c = d.conn();
    let chan = channel();
    let (go1, go2) = (chan.path().join("go1"), chan.path().join("go2"));
    let wait_for = |p: &Path| format!("while [ ! -e {} ]; do sleep 0.02; done", p.display());
    let script = format!(
        "echo phase1 a; echo phase1 b; {}; echo phase2 a; echo phase2 b; {}; echo phase3 a",
        wait_for(&go1),
        wait_for(&go2)
    );
    let run = c.spawn(&session("times"), &["sh", "-c", &script], json!({}));
    let status = c.call("check_agent_run", json!({"run_id": run})).unwrap();
    let log = PathBuf::from(status["log_path"].as_str().unwrap());
    wait_for_text(&log, "phase1 b", "the first phase");
    let after_phase1 = now_ms();

    // Followed live, with times: the first phase comes before the second
    // is let go.
    let (live, live_rx) = follow(&d, &["-f", "--timestamps", &run]);
    let mut live_lines = vec![next_line(&live_rx, "logs -f --timestamps")];
    let first = stamped(&live_lines[0]);
    assert_eq!(first[0].1, "phase1 a");
    assert!(first[0].0 <= after_phase1, "{first:?} after {after_phase1}");
    live_lines.push(next_line(&live_rx, "logs -f --timestamps"));
    assert_eq!(stamped(&live_lines[1])[0].1, "phase1 b");

    let_time_pass(1_500);
    let between = after_phase1 + 750;
    // Followed from a time between the phases, started before the second.
    let between_text = rfc3339_ms(between);
    let (mut since_live, since_rx) = follow(&d, &["-f", "--since", &between_text, &run]);
    std::fs::write(&go1, "").unwrap();
    // Nothing of the first phase: the second's first line comes first.
    assert_eq!(next_line(&since_rx, "logs -f --since"), "phase2 a");
    live_lines.push(next_line(&live_rx, "logs -f --timestamps"));
    assert_eq!(stamped(&live_lines[2])[0].1, "phase2 a");
    wait_for_text(&log, "phase2 b", "the second phase");
    let_time_pass(1_500);
    std::fs::write(&go2, "").unwrap();
    let st = c.wait(&run);
    assert_eq!(st["state"], "succeeded", "{st}");

    // Both followers end with the run.
    let live_out = live.wait_with_output().unwrap();
    assert!(live_out.status.success(), "{}", text(&live_out.stderr));
    assert!(live_out.stderr.is_empty(), "{}", text(&live_out.stderr));
    live_lines.extend(live_rx.iter());
    let since_out = since_live.wait().unwrap();
    assert!(since_out.success());
    let since_rest: Vec<String> = since_rx.iter().collect();
    assert_eq!(since_rest, ["phase2 b", "phase3 a"]);

    // The ended run, read whole.
    let out = d.cli(&["logs", "--timestamps", &run]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let all = stamped(&text(&out.stdout));
    let lines: Vec<&str> = all.iter().map(|(_, l)| l.as_str()).collect();
    assert_eq!(
        lines,
        ["phase1 a", "phase1 b", "phase2 a", "phase2 b", "phase3 a"]
    );
    // Followed live, the same lines with the same times.
    assert_eq!(stamped(&live_lines.join("\n")), all);
    // In order, within the run's start and end.
    let ms = |k: &str| parse_time(st[k].as_str().unwrap()).unwrap();
    let (started, ended) = (ms("started_at"), ms("ended_at"));
    assert!(all.windows(2).all(|w| w[0].0 <= w[1].0), "{all:?}");
    assert!(
        all.iter().all(|(t, _)| (started..=ended).contains(t)),
        "{all:?} not within {started}..={ended}"
    );
    // Lines written together are timed together; phases seconds apart.
    assert!(all[1].0 - all[0].0 < 1_000, "{all:?}");
    assert!(all[2].0 - all[1].0 >= 1_000, "{all:?}");
    assert!(all[4].0 - all[3].0 >= 1_000, "{all:?}");

    // --since a time between the phases: exactly the later lines.
    let out = d.cli(&["logs", "--since", &between_text, &run]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "phase2 a\nphase2 b\nphase3 a\n");
    let late = rfc3339_ms(all[3].0 + 1);
    let out = d.cli(&["logs", "--since", &late, "--timestamps", &run]);
    assert_eq!(stamped(&text(&out.stdout)), all[4..]);
    // With --tail: the last N of those since; an age takes them all.
    let out = d.cli(&["logs", "--tail", "1", "--since", &between_text, &run]);
    assert_eq!(text(&out.stdout), "phase3 a\n");
    let out = d.cli(&["logs", "--tail", "4", "--since", &between_text, &run]);
    assert_eq!(text(&out.stdout), "phase2 a\nphase2 b\nphase3 a\n");
    let out = d.cli(&["logs", "--since", "1h", &run]);
    assert_eq!(
        out.stdout.len() as u64,
        std::fs::metadata(&log).unwrap().len()
    );
    let out = d.cli(&["logs", "--since", "yesterday", &run]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--since"),
        "{}",
        text(&out.stderr)
    );

    // While the daemon is down, from the state dir.
    drop(c);
    d.stop();
    let out = d.cli(&["logs", "--timestamps", "--tail", "2", &run]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(stamped(&text(&out.stdout)), all[3..]);
}

#[test]
fn the_index_goes_on_across_a_restart() {
    let d = Daemon::start();
    let mut c = d.conn();
    let chan = channel();
    let go = chan.path().join("go");
    // The first attempt asks to be continued; the second waits for the
    // test, then finishes.
    let script = format!(
        "if [ -e \"$TMPDIR/second\" ]; then while [ ! -e {} ]; do sleep 0.02; done; echo second; exit 0; fi; touch \"$TMPDIR/second\"; echo first; exit 75",
        go.display()
    );
    let run = c.spawn(
        &session("times-restart"),
        &["sh", "-c", &script],
        json!({"max_restarts": 1}),
    );
    let status = c.call("check_agent_run", json!({"run_id": run})).unwrap();
    let log = PathBuf::from(status["log_path"].as_str().unwrap());
    wait_for_text(&log, "[subagentd: attempt 2 of 2]", "the second attempt");
    let_time_pass(500);
    std::fs::write(&go, "").unwrap();
    let st = c.wait(&run);
    assert_eq!(st["state"], "succeeded", "{st}");
    let out = d.cli(&["logs", "--timestamps", &run]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
    let all = stamped(&text(&out.stdout));
    let lines: Vec<&str> = all.iter().map(|(_, l)| l.as_str()).collect();
    assert_eq!(
        lines,
        ["first", "", "[subagentd: attempt 2 of 2]", "second"],
        "{}",
        text(&out.stdout)
    );
    assert!(all.windows(2).all(|w| w[0].0 <= w[1].0), "{all:?}");
    // The second attempt's line has a time of its own, from the same
    // index (one header, whole records).
    assert!(all[3].0 - all[2].0 >= 500, "{all:?}");
    let index = std::fs::read(run_dir(&st).join("child.log.times")).unwrap();
    assert_eq!(&index[..16], b"subagentd.times1");
    assert_eq!(index.len() % 16, 0);
    assert!(
        !index[16..].windows(16).any(|w| w == b"subagentd.times1"),
        "one index for the run"
    );
}

#[test]
fn a_run_folder_whose_index_is_missing_or_damaged_still_prints_its_log() {
    let d = Daemon::start();
    let mut c = d.conn();
    let run = c.spawn(
        &session("times-gone"),
        &["sh", "-c", "echo a; echo b"],
        json!({}),
    );
    let st = c.wait(&run);
    let index = run_dir(&st).join("child.log.times");
    let whole = std::fs::read(&index).unwrap();
    assert_eq!(&whole[..16], b"subagentd.times1");
    let out = d.cli(&["logs", "--timestamps", &run]);
    assert_eq!(stamped(&text(&out.stdout)).len(), 2);

    // Removed, as in a folder an older runner made.
    std::fs::remove_file(&index).unwrap();
    let out = d.cli(&["logs", &run]);
    assert_eq!(text(&out.stdout), "a\nb\n");
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
    let out = d.cli(&["logs", "--timestamps", &run]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "- a\n- b\n");
    let err = text(&out.stderr);
    assert_eq!(err.lines().count(), 1, "said once: {err}");
    assert!(err.contains("child.log.times is missing"), "{err}");
    let out = d.cli(&["logs", "--since", "1h", &run]);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    let err = text(&out.stderr);
    assert!(
        err.contains("--since needs the log's line times") && err.contains("missing"),
        "{err}"
    );

    // Not an index; cut short; a link to one; each still prints the log.
    std::fs::write(&index, [b'x'; 40]).unwrap();
    let out = d.cli(&["logs", "--timestamps", &run]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "- a\n- b\n");
    assert!(
        text(&out.stderr).contains("not a line-time index"),
        "{}",
        text(&out.stderr)
    );
    std::fs::write(&index, &whole[..16 + 7]).unwrap();
    let out = d.cli(&["logs", "--timestamps", &run]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "- a\n- b\n");
    assert!(
        text(&out.stderr).contains("holds no time"),
        "{}",
        text(&out.stderr)
    );
    let outside = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(outside.path(), &whole).unwrap();
    std::fs::remove_file(&index).unwrap();
    std::os::unix::fs::symlink(outside.path(), &index).unwrap();
    let out = d.cli(&["logs", "--timestamps", &run]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "- a\n- b\n");
    assert!(
        text(&out.stderr).contains("symbolic link"),
        "{}",
        text(&out.stderr)
    );
}
