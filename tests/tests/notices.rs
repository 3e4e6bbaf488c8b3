//! Finished-run notices: durable, each taken exactly once, also when the
//! parent was away; subscriptions push them as they happen.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use subagentd_e2e::{session, wait_until, Conn, Daemon};

#[test]
fn take_notices_after_a_disconnect_returns_each_notice_once() {
    let d = Daemon::start();
    let s = session("away");
    let run = {
        let mut c = d.conn();
        c.spawn(&s, &["sh", "-c", "echo done"], json!({}))
        // The parent disconnects before the run ends.
    };
    let mut c = d.conn();
    let st = c.wait(&run);
    assert_eq!(st["state"], "succeeded");
    let taken = c.call("take_notices", json!({"session_id": s})).unwrap();
    let notices = taken["notices"].as_array().unwrap();
    assert_eq!(notices.len(), 1, "{taken}");
    assert_eq!(notices[0]["run_id"], run.as_str());
    assert_eq!(notices[0]["session_id"], s.as_str());
    assert_eq!(notices[0]["state"], "succeeded");
    assert_eq!(notices[0]["result_path"], st["result_path"]);
    let again = c.call("take_notices", json!({"session_id": s})).unwrap();
    assert_eq!(again["notices"], json!([]));
}

#[test]
fn notices_survive_a_daemon_restart() {
    let mut d = Daemon::start();
    let s = session("durable");
    let mut c = d.conn();
    // One after another, so "oldest first" (by end) is spawn order.
    let runs: Vec<String> = (0..3)
        .map(|i| {
            let r = c.spawn(&s, &["sh", "-c", &format!("exit {i}")], json!({}));
            c.wait(&r);
            r
        })
        .collect();
    drop(c);
    assert!(d.stop().success());
    assert!(!d.socket.exists(), "the socket is removed on shutdown");
    d.restart();
    let mut c = d.conn();
    let taken = c.call("take_notices", json!({"session_id": s})).unwrap();
    let got: Vec<&str> = taken["notices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["run_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        got,
        runs.iter().map(String::as_str).collect::<Vec<_>>(),
        "oldest first"
    );
    let states: Vec<&str> = taken["notices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["succeeded", "failed", "failed"]);
    // The runs themselves are still known after the restart.
    let st = c
        .call("check_agent_run", json!({"run_id": runs[1]}))
        .unwrap();
    assert_eq!(st["exit_code"], 1);
    assert_eq!(
        c.call("take_notices", json!({"session_id": s})).unwrap()["notices"],
        json!([])
    );
}

#[test]
fn subscribers_are_told_when_runs_end() {
    let d = Daemon::start();
    let s = session("sub");
    let other = session("other");
    let mut sub = d.conn();
    let r = sub.call("subscribe", json!({"session_id": s})).unwrap();
    assert_eq!(r["subscribed"], true);
    let mut c = d.conn();
    let mine = c.spawn(&s, &["true"], json!({}));
    let theirs = c.spawn(&other, &["true"], json!({}));
    c.wait(&theirs);
    let st = c.wait(&mine);
    let n = sub.read_msg().unwrap();
    assert_eq!(n["method"], "agent_run_finished", "{n}");
    assert_eq!(n.get("id"), None);
    assert_eq!(n["params"]["run_id"], mine.as_str());
    assert_eq!(n["params"]["session_id"], s.as_str());
    assert_eq!(n["params"]["state"], "succeeded");
    assert_eq!(n["params"]["result_path"], st["result_path"]);
    // The other session's run was filtered out: the next message on the
    // subscription is the answer to this ping.
    let m = sub.request("ping", json!({}));
    assert!(m.get("result").is_some());
    assert!(sub.notifications.is_empty(), "{:?}", sub.notifications);
}

fn fd_count(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

fn zombies_of(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = e.file_name().to_str().unwrap_or("x").parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let mut f = rest.split_whitespace();
        let (state, ppid) = (f.next(), f.next().and_then(|x| x.parse::<i32>().ok()));
        if ppid == Some(pid) && state == Some("Z") {
            out.push(p);
        }
    }
    out
}

#[test]
fn a_burst_of_200_spawns_from_20_connections_delivers_every_notice_once() {
    let d = Daemon::start();
    let sessions = [session("burst-a"), session("burst-b")];
    let mut sub = d.conn();
    sub.call("subscribe", json!({})).unwrap();
    // Warm up, then take the daemon's descriptor baseline.
    {
        let mut c = d.conn();
        let r = c.spawn(&sessions[0], &["true"], json!({}));
        c.wait(&r);
        c.call("take_notices", json!({"session_id": sessions[0]}))
            .unwrap();
        assert_eq!(sub.read_msg().unwrap()["params"]["run_id"], r.as_str());
    }
    let baseline = fd_count(d.pid());
    let socket = d.socket.clone();
    let workers: Vec<_> = (0..20)
        .map(|i| {
            let socket = socket.clone();
            let s = sessions[i % 2].clone();
            std::thread::spawn(move || {
                let mut c = Conn::connect(&socket);
                (0..10)
                    .map(|_| c.spawn(&s, &["sh", "-c", "echo $SUBAGENT_RUN_ID"], json!({})))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let runs: Vec<String> = workers
        .into_iter()
        .flat_map(|w| w.join().unwrap())
        .collect();
    assert_eq!(runs.len(), 200);
    assert_eq!(
        runs.iter().collect::<BTreeSet<_>>().len(),
        200,
        "run ids are unique"
    );
    let mut c = d.conn();
    for r in &runs {
        let st = c.wait(r);
        assert_eq!(st["state"], "succeeded", "{st}");
        let log = std::fs::read_to_string(st["log_path"].as_str().unwrap()).unwrap();
        assert_eq!(log.trim(), r.as_str(), "each child logs its own run id");
    }
    // Every notice exactly once, from two takers racing per session.
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let takers: Vec<_> = sessions
        .iter()
        .flat_map(|s| [s.clone(), s.clone()])
        .map(|s| {
            let socket = socket.clone();
            std::thread::spawn(move || {
                let mut c = Conn::connect(&socket);
                let v = c.call("take_notices", json!({"session_id": s})).unwrap();
                v["notices"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|n| n["run_id"].as_str().unwrap().to_owned())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for t in takers {
        for id in t.join().unwrap() {
            *seen.entry(id).or_default() += 1;
        }
    }
    assert_eq!(seen.len(), 200, "every run's notice was taken");
    assert!(seen.values().all(|&n| n == 1), "no notice twice: {seen:?}");
    // The subscriber got each of them once too.
    let mut pushed: BTreeMap<String, usize> = BTreeMap::new();
    while pushed.len() < 200 {
        let n: Value = sub.read_msg().expect("subscriber closed");
        *pushed
            .entry(n["params"]["run_id"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    assert!(pushed.values().all(|&n| n == 1));
    assert_eq!(
        pushed.keys().collect::<BTreeSet<_>>(),
        runs.iter().collect::<BTreeSet<_>>()
    );
    // Nothing leaks in the daemon: descriptors back to the baseline, no zombies.
    drop(c);
    wait_until(
        Duration::from_secs(20),
        "the daemon's fds to return to the baseline",
        || fd_count(d.pid()) <= baseline,
    );
    assert_eq!(zombies_of(d.pid()), Vec::<i32>::new());
}
