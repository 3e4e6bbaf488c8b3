//! Load (run by scripts/stress; ignored in the normal suite because each
//! takes over a minute on 2 cores): 2,000 spawns at max_concurrent 32 from
//! 16 connections, and 500 children sleeping at once. Correctness is
//! asserted; the timings and RSS are printed (targets are checked by
//! scripts/bench, never by a test).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::json;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use subagentd_e2e::sleepers::{rss_kib, Sleepers};
use subagentd_e2e::{session, wait_until, Conn, Daemon, DaemonOpts};

fn count(pid: i32, what: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/{what}"))
        .map(|d| d.count())
        .unwrap_or(0)
}

#[test]
#[ignore = "load: run by scripts/stress"]
fn two_thousand_spawns_from_sixteen_connections() {
    let d = Daemon::start_with(DaemonOpts {
        max_concurrent: Some(32),
        ..Default::default()
    });
    let (fds0, threads0) = (count(d.pid(), "fd"), count(d.pid(), "task"));
    let socket = d.socket.clone();
    let started = Instant::now();
    let workers: Vec<_> = (0..16)
        .map(|w| {
            let socket = socket.clone();
            std::thread::spawn(move || {
                let s = session(&format!("load{w}"));
                let mut c = Conn::connect(&socket);
                let runs: Vec<String> = (0..125)
                    .map(|_| c.spawn(&s, &["true"], json!({})))
                    .collect();
                for r in &runs {
                    assert_eq!(c.wait(r)["state"], "succeeded");
                }
                let n = c.call("take_notices", json!({"session_id": s})).unwrap();
                let got: BTreeSet<String> = n["notices"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x["run_id"].as_str().unwrap().to_owned())
                    .collect();
                assert_eq!(
                    got,
                    runs.iter().cloned().collect::<BTreeSet<_>>(),
                    "every notice, once"
                );
                runs.len()
            })
        })
        .collect();
    let total: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
    let secs = started.elapsed().as_secs_f64();
    assert_eq!(total, 2000);
    println!(
        "2000 runs in {secs:.1} s: {:.0} runs/s; daemon RSS {} KiB",
        2000.0 / secs,
        rss_kib(d.pid())
    );
    wait_until(
        Duration::from_secs(30),
        "fds and threads back to their baseline",
        || count(d.pid(), "fd") <= fds0 + 2 && count(d.pid(), "task") <= threads0 + 8,
    );
}

#[test]
#[ignore = "load: run by scripts/stress"]
fn five_hundred_sleepers() {
    let d = Daemon::start_with(DaemonOpts {
        max_concurrent: Some(500),
        ..Default::default()
    });
    let s = session("sleepers");
    let mut c = d.conn();
    let sleepers = Sleepers::start(&mut c, &s, 500, Duration::from_secs(120));
    let mut worst = Duration::ZERO;
    for _ in 0..20 {
        let t = Instant::now();
        assert!(c.call("ping", json!({})).is_ok());
        worst = worst.max(t.elapsed());
    }
    println!(
        "500 sleepers: daemon RSS {} KiB; slowest of 20 pings {worst:?}",
        rss_kib(d.pid())
    );
    for st in sleepers.release(&mut c) {
        assert_eq!(st["state"], "succeeded", "{st}");
    }
}
