//! The daemon's metrics through the real binaries: `subagent metrics`
//! (the socket's `metrics` method) and the opt-in HTTP endpoint, each
//! exposition parsed by a grammar-based OpenMetrics/Prometheus parser
//! (the openmetrics-parser crate), with counts that match the runs made.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::time::Duration;
use subagentd_e2e::{session, wait_until, Daemon, DaemonOpts};

/// One sample: its labels and value (a histogram's: its count).
#[derive(Debug, Clone)]
struct Sample {
    labels: BTreeMap<String, String>,
    value: f64,
    /// A histogram's buckets (upper bound, cumulative count).
    buckets: Vec<(f64, f64)>,
}

/// A metric family as both formats give it: its name without a counter's
/// `_total`, its type, its samples.
#[derive(Debug, Clone)]
struct Family {
    kind: String,
    samples: Vec<Sample>,
}

type Exposition = BTreeMap<String, Family>;

fn labels_of(names: &[String], s: &[String]) -> BTreeMap<String, String> {
    names.iter().cloned().zip(s.iter().cloned()).collect()
}

/// Parses OpenMetrics text (it must end with `# EOF`).
fn parse_openmetrics(text: &str) -> Exposition {
    use openmetrics_parser::OpenMetricsValue as V;
    let exp = openmetrics_parser::openmetrics::parse_openmetrics(text)
        .unwrap_or_else(|e| panic!("not OpenMetrics: {e:?}\n{text}"));
    let mut out = Exposition::new();
    for (name, fam) in exp.families {
        let names = fam.get_label_names().to_vec();
        let samples = fam
            .iter_samples()
            .map(|s| {
                let values: Vec<String> =
                    s.get_labelset().unwrap().iter_values().cloned().collect();
                let (value, buckets) = match &s.value {
                    V::Counter(c) => (c.value.as_f64(), vec![]),
                    V::Gauge(n) | V::Unknown(n) => (n.as_f64(), vec![]),
                    V::Histogram(h) => (
                        h.count.unwrap() as f64,
                        h.buckets
                            .iter()
                            .map(|b| (b.upper_bound, b.count.as_f64()))
                            .collect(),
                    ),
                    other => panic!("{name}: unexpected {other:?}"),
                };
                Sample {
                    labels: labels_of(&names, &values),
                    value,
                    buckets,
                }
            })
            .collect();
        let kind = fam.family_type.to_string();
        out.insert(name, Family { kind, samples });
    }
    out
}

/// Parses Prometheus text 0.0.4; a counter's family loses its `_total`.
fn parse_prometheus(text: &str) -> Exposition {
    use openmetrics_parser::PrometheusValue as V;
    let exp = openmetrics_parser::prometheus::parse_prometheus(text)
        .unwrap_or_else(|e| panic!("not Prometheus text: {e:?}\n{text}"));
    let mut out = Exposition::new();
    for (name, fam) in exp.families {
        let names = fam.get_label_names().to_vec();
        let samples = fam
            .iter_samples()
            .map(|s| {
                let values: Vec<String> =
                    s.get_labelset().unwrap().iter_values().cloned().collect();
                let (value, buckets) = match &s.value {
                    V::Counter(c) => (c.value.as_f64(), vec![]),
                    V::Gauge(n) | V::Unknown(n) => (n.as_f64(), vec![]),
                    V::Histogram(h) => (
                        h.count.unwrap() as f64,
                        h.buckets
                            .iter()
                            .map(|b| (b.upper_bound, b.count.as_f64()))
                            .collect(),
                    ),
                    other => panic!("{name}: unexpected {other:?}"),
                };
                Sample {
                    labels: labels_of(&names, &values),
                    value,
                    buckets,
                }
            })
            .collect();
        let kind = fam.family_type.to_string();
        let base = match kind.as_str() {
            "counter" => name.strip_suffix("_total").unwrap_or(&name).to_owned(),
            _ => name,
        };
        out.insert(base, Family { kind, samples });
    }
    out
}

/// The value of `family`'s sample with exactly `labels` (0 when absent).
fn value(exp: &Exposition, family: &str, labels: &[(&str, &str)]) -> f64 {
    let fam = exp
        .get(family)
        .unwrap_or_else(|| panic!("no family {family}: {:?}", exp.keys()));
    let want: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    fam.samples
        .iter()
        .find(|s| s.labels == want)
        .map_or(0.0, |s| s.value)
}

/// The sum of a family's samples.
fn total(exp: &Exposition, family: &str) -> f64 {
    exp[family].samples.iter().map(|s| s.value).sum()
}

/// `subagent metrics` (Prometheus text, or OpenMetrics), parsed.
fn scrape(d: &Daemon, openmetrics: bool) -> Exposition {
    let args: &[&str] = if openmetrics {
        &["metrics", "--openmetrics"]
    } else {
        &["metrics"]
    };
    let out = d.cli(args);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "subagent metrics: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    if openmetrics {
        parse_openmetrics(&text)
    } else {
        parse_prometheus(&text)
    }
}

/// The label names docs/operating.md lists (`le`: a bucket's bound).
const LABELS: &[&str] = &[
    "state",
    "reason",
    "mechanism",
    "verdict",
    "how",
    "driver",
    "direction",
    "le",
];

/// Every label is a documented one, and no value is an id of `runs` or
/// `sessions`, a path or more than a word.
fn labels_are_bounded(exp: &Exposition, runs: &[String], sessions: &[String]) {
    for (name, fam) in exp {
        for s in &fam.samples {
            for (k, v) in &s.labels {
                assert!(LABELS.contains(&k.as_str()), "{name}: label {k}");
                assert!(
                    !runs.contains(v) && !sessions.contains(v),
                    "{name}: {k}={v} is an id"
                );
                let word = v
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_-".contains(&b));
                assert!(word && v.len() <= 32, "{name}: {k}={v:?}");
            }
        }
    }
}

fn histogram_count(exp: &Exposition, family: &str) -> f64 {
    let fam = &exp[family];
    assert_eq!(fam.kind, "histogram", "{family}");
    let s = &fam.samples[0];
    let mut last = 0.0;
    for (_, n) in &s.buckets {
        assert!(
            *n >= last,
            "{family}: buckets are cumulative: {:?}",
            s.buckets
        );
        last = *n;
    }
    let inf = s.buckets.iter().find(|(le, _)| le.is_infinite());
    assert_eq!(
        inf.map(|b| b.1),
        Some(s.value),
        "{family}: +Inf is the count"
    );
    s.value
}

/// The spawn params of a run held until `gate`/go exists: the gate
/// readable, and a wall time that ends it should a failed test never
/// open the gate.
fn held(gate: &std::path::Path) -> Value {
    json!({"sandbox": {"read_paths": [gate]}, "limits": {"wall_time_s": 120}})
}

#[test]
fn the_counts_match_the_runs_made_by_state_and_reason() {
    let d = Daemon::start();
    let s = session("metrics");
    let mut c = d.conn();
    let gate = tempfile::tempdir().unwrap();
    let hold = format!(
        "while [ ! -e {}/go ]; do sleep 0.05; done",
        gate.path().display()
    );
    let read = held(gate.path());
    let mut runs = vec![
        c.spawn(&s, &["/bin/true"], json!({})),
        c.spawn(&s, &["/bin/sh", "-c", "echo twelve bytes"], json!({})),
        c.spawn(&s, &["/bin/sh", "-c", "exit 3"], json!({})),
    ];
    let sleeper = c.spawn(
        &s,
        &["/bin/sh", "-c", "sleep 30"],
        json!({"limits": {"wall_time_s": 1}}),
    );
    let cancelled = c.spawn(&s, &["/bin/sh", "-c", &hold], read);
    wait_until(
        Duration::from_secs(20),
        "the run to cancel to start",
        || {
            c.call("check_agent_run", json!({"run_id": cancelled}))
                .unwrap()["state"]
                == "running"
        },
    );
    c.call("cancel_agent_run", json!({"run_id": cancelled}))
        .unwrap();
    runs.extend([sleeper, cancelled]);
    let states: Vec<Value> = runs.iter().map(|r| c.wait(r)["state"].clone()).collect();
    assert_eq!(
        states,
        ["succeeded", "succeeded", "failed", "timed_out", "cancelled"].map(|s| json!(s))
    );
    let prom = scrape(&d, false);
    let om = scrape(&d, true);
    for exp in [&prom, &om] {
        assert_eq!(value(exp, "subagentd_runs_accepted", &[]), 5.0);
        assert_eq!(value(exp, "subagentd_runs_started", &[]), 5.0);
        for (state, reason, n) in [
            ("succeeded", "exit_code", 2.0),
            ("failed", "exit_code", 1.0),
            ("timed_out", "wall_time", 1.0),
            ("cancelled", "cancelled", 1.0),
            ("lost", "runner_lost", 0.0),
        ] {
            let got = value(
                exp,
                "subagentd_runs_ended",
                &[("state", state), ("reason", reason)],
            );
            assert_eq!(got, n, "{state} {reason}");
        }
        assert_eq!(total(exp, "subagentd_runs_ended"), 5.0);
        assert_eq!(
            histogram_count(exp, "subagentd_spawn_to_notice_seconds"),
            5.0
        );
        assert_eq!(histogram_count(exp, "subagentd_spawn_to_exec_seconds"), 5.0);
        assert!(value(exp, "subagentd_log_captured_bytes", &[]) >= 13.0);
        assert_eq!(value(exp, "subagentd_notices_pending", &[]), 5.0);
        assert_eq!(value(exp, "subagentd_runs_running", &[]), 0.0);
        assert_eq!(value(exp, "subagentd_runs_queued", &[]), 0.0);
        assert_eq!(value(exp, "subagentd_daemon_starts", &[]), 1.0);
        labels_are_bounded(exp, &runs, std::slice::from_ref(&s));
    }
    assert_eq!(
        prom.keys().collect::<BTreeSet<_>>(),
        om.keys().collect::<BTreeSet<_>>(),
        "both formats hold the same families"
    );
    // Notices taken, every run but the newest of the session is pruned.
    let taken = c.call("take_notices", json!({"session_id": s})).unwrap();
    assert_eq!(taken["notices"].as_array().unwrap().len(), 5);
    let pruned = c
        .call("prune_runs", json!({"session_id": s, "older_than": "0s"}))
        .unwrap();
    let removed = pruned["removed"].as_array().unwrap().len();
    assert_eq!(removed, 4, "{pruned}");
    let exp = scrape(&d, false);
    assert_eq!(value(&exp, "subagentd_notices_pending", &[]), 0.0);
    assert_eq!(
        value(&exp, "subagentd_runs_pruned", &[("reason", "on_demand")]),
        4.0
    );
    assert_eq!(total(&exp, "subagentd_runs_pruned"), 4.0);
}

#[test]
fn running_and_queued_follow_a_one_slot_daemon() {
    let d = Daemon::start_with(DaemonOpts {
        max_concurrent: Some(1),
        ..Default::default()
    });
    let s = session("metrics-slot");
    let mut c = d.conn();
    let gate = tempfile::tempdir().unwrap();
    let hold = format!(
        "while [ ! -e {}/go ]; do sleep 0.05; done",
        gate.path().display()
    );
    let read = held(gate.path());
    let first = c.spawn(&s, &["/bin/sh", "-c", &hold], read.clone());
    let second = c.spawn(&s, &["/bin/sh", "-c", &hold], read);
    let gauges = |exp: &Exposition| {
        (
            value(exp, "subagentd_runs_running", &[]),
            value(exp, "subagentd_runs_queued", &[]),
        )
    };
    wait_until(Duration::from_secs(20), "one running, one queued", || {
        gauges(&scrape(&d, false)) == (1.0, 1.0)
    });
    let exp = scrape(&d, true);
    assert_eq!(gauges(&exp), (1.0, 1.0));
    assert_eq!(value(&exp, "subagentd_runs_started", &[]), 1.0);
    std::fs::write(gate.path().join("go"), "").unwrap();
    for r in [&first, &second] {
        assert_eq!(c.wait(r)["state"], "succeeded");
    }
    let exp = scrape(&d, false);
    assert_eq!(gauges(&exp), (0.0, 0.0));
    assert_eq!(value(&exp, "subagentd_runs_started", &[]), 2.0);
}

#[test]
fn starts_are_counted_across_restarts_and_a_live_run_is_recovered() {
    let mut d = Daemon::start();
    let s = session("metrics-restart");
    let gate = tempfile::tempdir().unwrap();
    let hold = format!(
        "while [ ! -e {}/go ]; do sleep 0.05; done",
        gate.path().display()
    );
    let read = held(gate.path());
    let run = d.conn().spawn(&s, &["/bin/sh", "-c", &hold], read);
    wait_until(Duration::from_secs(20), "the run to start", || {
        d.conn()
            .call("check_agent_run", json!({"run_id": run}))
            .unwrap()["state"]
            == "running"
    });
    let exp = scrape(&d, false);
    assert_eq!(value(&exp, "subagentd_daemon_starts", &[]), 1.0);
    assert_eq!(total(&exp, "subagentd_runs_recovered"), 0.0);
    d.stop();
    d.restart();
    let exp = scrape(&d, false);
    assert_eq!(value(&exp, "subagentd_daemon_starts", &[]), 2.0);
    assert_eq!(
        value(&exp, "subagentd_runs_recovered", &[("how", "adopted")]),
        1.0
    );
    assert_eq!(total(&exp, "subagentd_runs_recovered"), 1.0);
    assert_eq!(
        value(&exp, "subagentd_runs_accepted", &[]),
        0.0,
        "from this start on"
    );
    std::fs::write(gate.path().join("go"), "").unwrap();
    assert_eq!(d.conn().wait(&run)["state"], "succeeded");
    kill_and_restart(&mut d);
    let exp = scrape(&d, false);
    assert_eq!(
        value(&exp, "subagentd_daemon_starts", &[]),
        3.0,
        "a crash too"
    );
}

/// Kills the daemon (SIGKILL) and starts it again.
fn kill_and_restart(d: &mut Daemon) {
    subagentd_e2e::unsafe_kill(d.pid(), libc::SIGKILL);
    let _ = d.child.wait();
    d.restart();
}

/// The local ports of the TCP sockets `pid` holds that listen.
fn listening_ports(pid: i32) -> Vec<(String, u16)> {
    let mut inodes = BTreeSet::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
    {
        if let Ok(target) = std::fs::read_link(fd.path()) {
            let t = target.to_string_lossy().into_owned();
            if let Some(n) = t.strip_prefix("socket:[").and_then(|r| r.strip_suffix(']')) {
                inodes.insert(n.to_owned());
            }
        }
    }
    let mut found = Vec::new();
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // local_address, st (0A: LISTEN), inode.
            if f.len() > 9 && f[3] == "0A" && inodes.contains(f[9]) {
                let (addr, port) = f[1].split_once(':').unwrap();
                found.push((addr.to_owned(), u16::from_str_radix(port, 16).unwrap()));
            }
        }
    }
    found
}

/// One HTTP/1.1 request to 127.0.0.1:`port`: the status, the headers and
/// the body.
fn http(port: u16, head: &str) -> (u16, BTreeMap<String, String>, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    let mut bytes = Vec::new();
    let _ = s.read_to_end(&mut bytes);
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut headers);
    let at = match resp.parse(&bytes).unwrap() {
        httparse::Status::Complete(n) => n,
        httparse::Status::Partial => panic!("a partial response: {bytes:?}"),
    };
    let hs = resp
        .headers
        .iter()
        .map(|h| {
            let v = String::from_utf8_lossy(h.value).into_owned();
            (h.name.to_ascii_lowercase(), v)
        })
        .collect();
    (
        resp.code.unwrap(),
        hs,
        String::from_utf8_lossy(&bytes[at..]).into_owned(),
    )
}

fn get(path: &str, extra: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{extra}Connection: close\r\n\r\n")
}

#[test]
fn http_is_off_by_default_and_serves_only_get_metrics_when_asked() {
    let d = Daemon::start();
    assert_eq!(listening_ports(d.pid()), [], "no TCP listener by default");
    let d = Daemon::start_with(DaemonOpts {
        args: vec!["--metrics-listen".into(), "0".into()],
        ..Default::default()
    });
    let ports = listening_ports(d.pid());
    assert_eq!(ports.len(), 1, "{ports:?}");
    let (addr, port) = ports[0].clone();
    assert_eq!(addr, "0100007F", "127.0.0.1, as /proc writes it");
    assert!(
        d.log().contains(&format!(
            "metrics served at http://127.0.0.1:{port}/metrics"
        )),
        "{}",
        d.log()
    );
    let run = d
        .conn()
        .spawn(&session("metrics-http"), &["/bin/true"], json!({}));
    d.conn().wait(&run);
    let (code, headers, body) = http(port, &get("/metrics", ""));
    assert_eq!(code, 200, "{body}");
    assert!(headers["content-type"].starts_with("text/plain; version=0.0.4"));
    let exp = parse_prometheus(&body);
    assert_eq!(value(&exp, "subagentd_runs_accepted", &[]), 1.0);
    let om = "Accept: application/openmetrics-text;version=1.0.0,text/plain;q=0.5\r\n";
    let (code, headers, body) = http(port, &get("/metrics?x=1", om));
    assert_eq!(code, 200);
    assert!(headers["content-type"].starts_with("application/openmetrics-text"));
    let exp = parse_openmetrics(&body);
    labels_are_bounded(&exp, &[run], &[]);
    assert_eq!(http(port, &get("/", "")).0, 404);
    assert_eq!(http(port, &get("/metrics/x", "")).0, 404);
    let (code, headers, _) = http(
        port,
        "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    );
    assert_eq!((code, headers["allow"].as_str()), (405, "GET, HEAD"));
    // A head past the bound is refused, and the daemon serves on.
    let big = format!("X-Big: {}\r\n", "a".repeat(16 * 1024));
    let (code, _, _) = http(port, &get("/metrics", &big));
    assert_eq!(code, 431);
    assert_eq!(http(port, &get("/metrics", "")).0, 200);
}

#[test]
fn a_bad_listen_address_stops_the_daemon_with_why() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(subagentd_e2e::bin("subagentd"))
        .arg("--socket")
        .arg(dir.path().join("s.sock"))
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .args(["--metrics-listen", "example.com:9464"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("metrics listen address \"example.com:9464\""),
        "{err}"
    );
}

#[test]
fn a_spawn_refused_for_a_mechanism_is_counted_by_it() {
    if !subagentd_e2e::runnable(
        subagentd_e2e::is_root(),
        "root",
        "a root daemon leases a uid per run; a range of one uid runs out",
    ) {
        return;
    }
    // One uid, outside the default range other tests lease from.
    let cfg = tempfile::tempdir().unwrap();
    let path = cfg.path().join("c.toml");
    std::fs::write(&path, "uid_range = \"2131000001-2131000001\"\n").unwrap();
    let d = Daemon::start_with(DaemonOpts {
        args: vec!["--config".into(), path.display().to_string()],
        ..Default::default()
    });
    let s = session("metrics-uid");
    let gate = tempfile::tempdir().unwrap();
    let hold = format!(
        "while [ ! -e {}/go ]; do sleep 0.05; done",
        gate.path().display()
    );
    let read = held(gate.path());
    let mut c = d.conn();
    let first = c.spawn(&s, &["/bin/sh", "-c", &hold], read);
    let params = json!({
        "session": {"id": s, "audience": "personal", "project_dir": "/tmp"},
        "task": "t", "command": ["/bin/true"],
    });
    let e = c.call("spawn_agent", params).unwrap_err();
    assert_eq!(e["code"], -32005, "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("per_run_uid"),
        "{e}"
    );
    let exp = scrape(&d, false);
    let refused = |m: &str| value(&exp, "subagentd_sandbox_refusals", &[("mechanism", m)]);
    assert_eq!(refused("per_run_uid"), 1.0);
    assert_eq!(total(&exp, "subagentd_sandbox_refusals"), 1.0);
    assert_eq!(value(&exp, "subagentd_runs_accepted", &[]), 1.0);
    std::fs::write(gate.path().join("go"), "").unwrap();
    assert_eq!(c.wait(&first)["state"], "succeeded");
}

#[test]
fn another_uid_may_not_read_the_metrics() {
    use subagentd_e2e::otheruser;
    let Some(ids) = otheruser::ids_or_skip("another uid needs root to be made and let in") else {
        return;
    };
    let (d, _cfg) = otheruser::daemon_allowing(ids.0, "");
    let py = r#"import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(b'{"jsonrpc":"2.0","id":1,"method":"metrics"}\n')
print(s.makefile('rb').readline().decode())
"#;
    let out = std::process::Command::new("/usr/bin/python3")
        .args(["-c", py])
        .arg(&d.socket)
        .current_dir("/")
        .uid(ids.0)
        .gid(ids.1)
        .output()
        .unwrap();
    let answer: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(answer["error"]["code"], -32006, "{answer}");
    let msg = answer["error"]["message"].as_str().unwrap();
    assert!(msg.contains("only the daemon's uid and root"), "{msg}");
    // The daemon's own uid (root here) reads them.
    let mine = d.conn().call("metrics", json!({})).unwrap();
    assert!(mine["text"]
        .as_str()
        .unwrap()
        .contains("subagentd_runs_accepted_total"));
}
