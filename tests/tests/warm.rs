//! Warm runners: runs are handed to runners started before them; a dead
//! warm runner is replaced without the spawn noticing; warm runners go
//! with the daemon.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::json;
use std::time::Duration;
use subagentd_e2e::{alive, session, unsafe_kill, wait_until, Daemon};

/// The daemon's children that are waiting warm runners.
fn warm_pids(daemon: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{daemon}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        let children = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
        for pid in children
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
        {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if cmdline.ends_with(b"--warm\0") && alive(pid) {
                out.push(pid);
            }
        }
    }
    out.sort();
    out
}

fn runner_pid(d: &Daemon, run: &str) -> i32 {
    let st = d
        .conn()
        .call("check_agent_run", json!({"run_id": run}))
        .unwrap();
    let dir = std::path::Path::new(st["log_path"].as_str().unwrap())
        .parent()
        .unwrap()
        .to_path_buf();
    let rec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("run.json")).unwrap()).unwrap();
    rec["runner_pid"].as_i64().unwrap() as i32
}

#[test]
fn a_run_is_handed_to_a_waiting_warm_runner() {
    let d = Daemon::start();
    wait_until(Duration::from_secs(20), "two warm runners", || {
        warm_pids(d.pid()).len() == 2
    });
    let before = warm_pids(d.pid());
    let mut c = d.conn();
    let run = c.spawn(&session("warm"), &["sh", "-c", "echo warm-ok"], json!({}));
    let st = c.wait(&run);
    assert_eq!(st["state"], "succeeded", "{st}");
    let log = std::fs::read_to_string(st["log_path"].as_str().unwrap()).unwrap();
    assert_eq!(log, "warm-ok\n");
    let pid = runner_pid(&d, &run);
    assert!(
        before.contains(&pid),
        "runner {pid} was not one of the warm runners {before:?}"
    );
    // Its place is taken by a new warm runner once the run has ended.
    wait_until(Duration::from_secs(20), "the pool refilled", || {
        let now = warm_pids(d.pid());
        now.len() == 2 && !now.contains(&pid)
    });
}

#[test]
fn dead_warm_runners_are_skipped_and_the_spawn_still_runs() {
    let d = Daemon::start();
    wait_until(Duration::from_secs(20), "two warm runners", || {
        warm_pids(d.pid()).len() == 2
    });
    let dead = warm_pids(d.pid());
    for &pid in &dead {
        unsafe_kill(pid, libc::SIGKILL);
    }
    wait_until(Duration::from_secs(20), "the warm runners to die", || {
        dead.iter().all(|&p| !alive(p))
    });
    let mut c = d.conn();
    let run = c.spawn(
        &session("warm-dead"),
        &["sh", "-c", "echo still-ok"],
        json!({}),
    );
    let st = c.wait(&run);
    assert_eq!(st["state"], "succeeded", "{st}");
    assert!(!dead.contains(&runner_pid(&d, &run)));
    assert!(
        d.log().contains("a warm runner could not take a run"),
        "{}",
        d.log()
    );
}

#[test]
fn warm_runners_go_with_the_daemon() {
    // A clean stop lets them go and reaps them.
    let mut d = Daemon::start();
    wait_until(Duration::from_secs(20), "two warm runners", || {
        warm_pids(d.pid()).len() == 2
    });
    let pids = warm_pids(d.pid());
    d.stop();
    wait_until(Duration::from_secs(20), "the warm runners to exit", || {
        pids.iter().all(|&p| !alive(p))
    });
    // A killed daemon: they read end of file and exit on their own.
    let d = Daemon::start();
    wait_until(Duration::from_secs(20), "two warm runners", || {
        warm_pids(d.pid()).len() == 2
    });
    let pids = warm_pids(d.pid());
    unsafe_kill(d.pid(), libc::SIGKILL);
    wait_until(
        Duration::from_secs(20),
        "the orphaned warm runners to exit",
        || pids.iter().all(|&p| !alive(p)),
    );
}

/// The network namespace of the run's child, as `readlink /proc/self/ns/net`
/// prints it inside the sandbox.
fn child_netns(c: &mut subagentd_e2e::Conn, s: &str, network: bool) -> String {
    let run = c.spawn(
        s,
        &["sh", "-c", "readlink /proc/self/ns/net"],
        json!({"sandbox": {"network": network}}),
    );
    let st = c.wait(&run);
    assert_eq!(st["state"], "succeeded", "{st}");
    std::fs::read_to_string(st["log_path"].as_str().unwrap())
        .unwrap()
        .trim()
        .to_owned()
}

#[test]
fn each_run_gets_its_own_network_namespace_or_the_hosts_when_granted() {
    if !subagentd_e2e::runnable(
        subagentd_e2e::is_root(),
        "network",
        "a network namespace without a user namespace needs root",
    ) {
        return;
    }
    // Four runs at once, whatever the host's core count.
    let d = Daemon::start_with(subagentd_e2e::DaemonOpts {
        max_concurrent: Some(4),
        ..Default::default()
    });
    wait_until(Duration::from_secs(20), "two warm runners", || {
        warm_pids(d.pid()).len() == 2
    });
    let host = std::fs::read_link("/proc/self/ns/net")
        .unwrap()
        .display()
        .to_string();
    let mut c = d.conn();
    let s = session("warm-netns");
    // Runs handed to warm runners and to fresh ones: isolated runs alive
    // at the same time are in namespaces of their own. (A namespace's inode number is reused once
    // it is gone, so only live ones can be compared.)
    let gate = tempfile::Builder::new()
        .prefix("sa-netns-")
        .tempdir_in("/tmp")
        .unwrap();
    let release = gate.path().join("release");
    let script = format!(
        "readlink /proc/self/ns/net; while [ ! -e {} ]; do sleep 0.02; done",
        release.display()
    );
    let runs: Vec<String> = (0..4)
        .map(|_| {
            c.spawn(
                &s,
                &["sh", "-c", &script],
                json!({"sandbox": {"network": false}}),
            )
        })
        .collect();
    let logs: Vec<std::path::PathBuf> = runs
        .iter()
        .map(|r| {
            let st = c.call("check_agent_run", json!({"run_id": r})).unwrap();
            std::path::PathBuf::from(st["log_path"].as_str().unwrap())
        })
        .collect();
    let read = |p: &std::path::Path| {
        std::fs::read_to_string(p)
            .unwrap_or_default()
            .trim()
            .to_owned()
    };
    wait_until(
        Duration::from_secs(20),
        "every run to print its namespace",
        || logs.iter().all(|l| read(l).starts_with("net:[")),
    );
    let mut seen: Vec<String> = logs.iter().map(|l| read(l)).collect();
    std::fs::write(&release, b"").unwrap();
    for r in &runs {
        assert_eq!(c.wait(r)["state"], "succeeded");
    }
    assert!(
        !seen.contains(&host),
        "an isolated run shares the host's namespace: {seen:?}"
    );
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 4, "runs alive together shared a namespace");
    // A run granted the network is in the host's namespace.
    for _ in 0..3 {
        assert_eq!(child_netns(&mut c, &s, true), host);
    }
}
