//! History: what finished runs cost the daemon as they pile up. Real
//! `/bin/true` runs over five sessions, from a few clients at once, on one
//! daemon; at each size (100, 1,000 and 5,000 finished runs; `--runs N`
//! makes N the last size) the daemon's RSS once they have settled, the
//! state dir's blocks and inodes per run, a list of one session, of an
//! empty session and of all (a page of 100 where the daemon pages, the
//! whole list where it does not), and a restart to `ping` on the same
//! state dir. Then, where the daemon has `[retention] max_runs`, 5,000
//! more runs on a daemon with it at 1,000: the run folders and the state
//! dir's size as they go, each sampled right after the notices are taken
//! and once retention has caught up (at most 10 s later).

use crate::pct;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use subagentd_e2e::sleepers::rss_kib;
use subagentd_e2e::{session, Conn, Daemon, DaemonOpts};

/// The sessions the runs are spread over, round robin.
const SESSIONS: usize = 5;
/// Connections spawning at once.
const CLIENTS: usize = 4;
/// The daemon's `--max-concurrent`: above [`CLIENTS`], so that spawning,
/// not the queue, sets the pace.
const MAX_CONCURRENT: usize = 16;
/// The page asked for where the daemon pages.
const PAGE: u64 = 100;
/// Runs between two samples of the retention part.
const BATCH: usize = 500;

/// How much of it a run does.
struct Plan {
    sizes: Vec<usize>,
    calls: usize,
    restarts: usize,
    retention_runs: usize,
    max_runs: usize,
}

fn plan(quick: bool) -> Plan {
    let args: Vec<String> = std::env::args().collect();
    let asked = args
        .iter()
        .position(|a| a == "--runs")
        .and_then(|i| args.get(i + 1))
        .map(|n| n.parse::<usize>().expect("--runs takes a number of runs"));
    let mut sizes = if quick {
        vec![100, 1_000]
    } else {
        vec![100, 1_000, 5_000]
    };
    if let Some(n) = asked {
        sizes.retain(|&s| s < n);
        sizes.push(n);
    }
    Plan {
        sizes,
        calls: if quick { 5 } else { 20 },
        restarts: if quick { 1 } else { 3 },
        retention_runs: if quick { 1_000 } else { 5_000 },
        max_runs: if quick { 200 } else { 1_000 },
    }
}

fn opts() -> DaemonOpts {
    DaemonOpts {
        max_concurrent: Some(MAX_CONCURRENT),
        ..crate::daemon_opts()
    }
}

/// Spawns runs `from..to` (`/bin/true`, session `k % SESSIONS`) from
/// [`CLIENTS`] connections and waits for all their notices; returns the
/// seconds it took and how many did not succeed.
fn fill(socket: &Path, sessions: &[String], from: usize, to: usize) -> (f64, usize) {
    let mut sub = Conn::connect(socket);
    sub.call("subscribe", json!({})).unwrap();
    let next = AtomicUsize::new(from);
    let t0 = Instant::now();
    let mut failed = 0;
    std::thread::scope(|s| {
        for _ in 0..CLIENTS {
            s.spawn(|| {
                let mut c = Conn::connect(socket);
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    if k >= to {
                        break;
                    }
                    c.spawn(&sessions[k % SESSIONS], &["/bin/true"], json!({}));
                }
            });
        }
        let mut seen = 0;
        while seen < to - from {
            let m = sub.read_msg().expect("the subscription closed");
            if m["method"] == "agent_run_finished" {
                seen += 1;
                failed += usize::from(m["params"]["state"] != "succeeded");
            }
        }
    });
    (t0.elapsed().as_secs_f64(), failed)
}

/// Takes every session's notices, as a parent does: a notice not taken
/// is kept (and, with retention, keeps its run).
fn take_all(socket: &Path, sessions: &[String]) -> usize {
    let mut c = Conn::connect(socket);
    sessions
        .iter()
        .map(|s| {
            c.call("take_notices", json!({"session_id": s})).unwrap()["notices"]
                .as_array()
                .map_or(0, Vec::len)
        })
        .sum()
}

/// The daemon's RSS in KiB once it has been idle 1.5 s and stops moving
/// (two reads 100 ms apart within 64 KiB, at most 3 s more): what it
/// keeps, not what it is freeing.
fn settled_rss_kib(pid: i32) -> u64 {
    // The daemon gives free heap back once no run has ended for 1 s.
    std::thread::sleep(Duration::from_millis(1500));
    let mut last = rss_kib(pid);
    for _ in 0..30 {
        std::thread::sleep(Duration::from_millis(100));
        let now = rss_kib(pid);
        if now.abs_diff(last) < 64 {
            return now;
        }
        last = now;
    }
    last
}

/// A field of /proc/PID/status in KiB (0 when missing).
fn status_kib(pid: i32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix(field)
                    .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
            })
        })
        .unwrap_or(0)
}

/// Resets the process's peak RSS (VmHWM) to its current RSS; false when
/// the kernel refuses.
fn reset_peak(pid: i32) -> bool {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok()
}

/// Blocks and inodes under `root` (each inode once), not following links.
#[derive(Default, Clone, Copy)]
struct Usage {
    bytes: u64,
    inodes: u64,
}

fn usage(root: &Path) -> Usage {
    let mut seen = std::collections::HashSet::new();
    let mut u = Usage::default();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if !seen.insert((m.dev(), m.ino())) {
            continue;
        }
        u.bytes += m.blocks() * 512;
        u.inodes += 1;
        if m.is_dir() {
            stack.extend(
                std::fs::read_dir(&p)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .map(|e| e.path()),
            );
        }
    }
    u
}

/// Run folders: the directories in `sessions/*/runs/`.
fn run_folders(state: &Path) -> usize {
    let dirs = |p: &Path| -> Vec<std::path::PathBuf> {
        std::fs::read_dir(p)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.path())
            .collect()
    };
    dirs(&state.join("sessions"))
        .iter()
        .map(|s| dirs(&s.join("runs")).len())
        .sum()
}

/// A connection that times a call to its whole reply line, without
/// parsing it: the client's JSON parsing is not the daemon's time.
struct Raw {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    id: u64,
}

impl Raw {
    fn connect(socket: &Path) -> Raw {
        let s = UnixStream::connect(socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
        Raw {
            writer: s.try_clone().unwrap(),
            reader: BufReader::new(s),
            id: 0,
        }
    }

    /// (ms from the request's write to the reply's last byte, the reply).
    fn call(&mut self, method: &str, params: &Value) -> (f64, String) {
        self.id += 1;
        let req = json!({"jsonrpc": "2.0", "id": self.id, "method": method, "params": params});
        let mut line = String::new();
        let t0 = Instant::now();
        self.writer
            .write_all(format!("{req}\n").as_bytes())
            .unwrap();
        self.reader.read_line(&mut line).unwrap();
        (t0.elapsed().as_secs_f64() * 1e3, line)
    }
}

/// Whether `list_agent_runs` takes a `limit` (the daemon pages), and what
/// it said when it did not.
fn paging(raw: &mut Raw) -> (bool, Option<String>) {
    let (_, line) = raw.call("list_agent_runs", &json!({"limit": 1}));
    let v: Value = serde_json::from_str(&line).unwrap();
    match v.get("error") {
        Some(e) => (false, e["message"].as_str().map(str::to_owned)),
        None => (true, None),
    }
}

/// `calls` lists with `params`: p50/p90 ms, the reply's bytes and runs.
fn list(raw: &mut Raw, params: Value, calls: usize) -> Value {
    let mut ms = Vec::new();
    let (mut bytes, mut runs) = (0, Value::Null);
    for i in 0..calls {
        let (t, line) = raw.call("list_agent_runs", &params);
        ms.push(t);
        bytes = line.len();
        if i == 0 {
            let v: Value = serde_json::from_str(&line).unwrap();
            assert!(v.get("error").is_none(), "list_agent_runs {params}: {v}");
            runs = json!(v["result"]["runs"].as_array().map_or(0, Vec::len));
        }
    }
    json!({"p50": pct(&ms, 50.0), "p90": pct(&ms, 90.0), "calls": calls,
           "bytes": bytes, "runs": runs})
}

/// Stops the daemon and starts it again on the same state dir: (ms from
/// the start to its first `ping` answer, ms the stop took).
fn restart(d: &mut Daemon, opts: &DaemonOpts) -> (f64, f64) {
    let t0 = Instant::now();
    d.stop();
    let stop = t0.elapsed().as_secs_f64() * 1e3;
    let t0 = Instant::now();
    d.child = Daemon::spawn_process(&d.socket, &d.state, d.dir.path(), opts);
    loop {
        if Conn::try_connect(&d.socket).is_some_and(|mut c| c.call("ping", json!({})).is_ok()) {
            break;
        }
        assert!(
            d.child.try_wait().unwrap().is_none(),
            "the daemon exited on restart: {}",
            d.log()
        );
        assert!(t0.elapsed() < Duration::from_secs(300), "no ping in 300 s");
        std::thread::sleep(Duration::from_millis(1));
    }
    (t0.elapsed().as_secs_f64() * 1e3, stop)
}

/// Everything measured at one size, `n` runs finished.
fn measure(d: &mut Daemon, p: &Plan, sessions: &[String], n: usize, base: Usage) -> Value {
    let rss = settled_rss_kib(d.pid());
    let disk = usage(&d.state);
    let log_bytes = std::fs::metadata(d.dir.path().join("daemon.log")).map_or(0, |m| m.len());
    let mut raw = Raw::connect(&d.socket);
    let (paged, refusal) = paging(&mut raw);
    let page = |mut q: Value| {
        if paged {
            q["limit"] = json!(PAGE);
        }
        q
    };
    let one = list(&mut raw, page(json!({"session_id": sessions[0]})), p.calls);
    let empty = list(
        &mut raw,
        page(json!({"session_id": session("bench-hist-empty")})),
        p.calls,
    );
    let peak_reset = reset_peak(d.pid());
    let all = list(&mut raw, page(json!({})), p.calls);
    let peak = status_kib(d.pid(), "VmHWM:");
    drop(raw);
    let opts = opts();
    let (mut starts, mut stops) = (Vec::new(), Vec::new());
    let mut rss_restarted = 0;
    for _ in 0..p.restarts {
        let (start, stop) = restart(d, &opts);
        starts.push(start);
        stops.push(stop);
        rss_restarted = settled_rss_kib(d.pid());
    }
    json!({
        "runs": n,
        "rss_kib": rss,
        "rss_after_restart_kib": rss_restarted,
        "state_bytes": disk.bytes,
        "state_inodes": disk.inodes,
        "bytes_per_run": (disk.bytes as f64 - base.bytes as f64) / n as f64,
        "inodes_per_run": (disk.inodes as f64 - base.inodes as f64) / n as f64,
        "daemon_log_bytes_per_run": log_bytes as f64 / n as f64,
        "paged": paged,
        "paging_refused": refusal,
        "list_session": one,
        "list_empty_session": empty,
        "list_all": all,
        "list_all_peak_rss_kib": peak_reset.then_some(peak),
        "restart_to_ping_ms": starts,
        "restart_to_ping_p50_ms": pct(&starts, 50.0),
        "stop_ms": stops,
    })
}

/// A daemon started with `opts`, or what it said when it refused to start.
fn try_start(opts: &DaemonOpts) -> Result<Daemon, String> {
    let dir = tempfile::Builder::new()
        .prefix("sa-bench-")
        .tempdir_in(opts.base_dir.as_deref().unwrap_or(Path::new("/tmp")))
        .unwrap();
    let (socket, state) = (dir.path().join("d.sock"), dir.path().join("state"));
    let child = Daemon::spawn_process(&socket, &state, dir.path(), opts);
    let mut d = Daemon {
        child,
        dir,
        socket,
        state,
    };
    let t0 = Instant::now();
    loop {
        if d.child.try_wait().unwrap().is_some() {
            let log = d.log();
            let said = log.lines().rev().find(|l| !l.trim().is_empty());
            let said = said.unwrap_or("(nothing)").trim().to_owned();
            crate::retire(d);
            return Err(said);
        }
        if Conn::try_connect(&d.socket).is_some_and(|mut c| c.call("ping", json!({})).is_ok()) {
            return Ok(d);
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "no ping in 20 s");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `retention_runs` runs on a daemon with `[retention] max_runs`: the run
/// folders and the state dir after each [`BATCH`], notices taken.
fn retention(p: &Plan) -> Value {
    let conf = tempfile::Builder::new()
        .prefix("sa-bench-conf-")
        .tempdir_in(crate::WORK)
        .unwrap();
    let path = std::fs::canonicalize(conf.path())
        .unwrap()
        .join("subagentd.toml");
    std::fs::write(&path, format!("[retention]\nmax_runs = {}\n", p.max_runs)).unwrap();
    let mut opts = opts();
    opts.args = vec!["--config".into(), path.display().to_string()];
    let d = match try_start(&opts) {
        Ok(d) => d,
        Err(said) => {
            crate::retire(conf);
            return json!({"supported": false, "max_runs": p.max_runs,
                          "runs": p.retention_runs, "refusal": said});
        }
    };
    let sessions: Vec<String> = (0..SESSIONS)
        .map(|i| session(&format!("bench-ret{i}")))
        .collect();
    let mut samples = Vec::new();
    let mut done = 0;
    while done < p.retention_runs {
        let to = (done + BATCH).min(p.retention_runs);
        fill(&d.socket, &sessions, done, to);
        take_all(&d.socket, &sessions);
        done = to;
        let taken = run_folders(&d.state);
        let (folders, settle_ms) = settled_folders(&d.state, p.max_runs);
        let u = usage(&d.state);
        samples.push(
            json!({"runs": done, "folders_at_take": taken, "folders": folders,
                            "settle_ms": settle_ms,
                            "state_bytes": u.bytes, "state_inodes": u.inodes}),
        );
    }
    crate::retire_daemon(d);
    crate::retire(conf);
    json!({"supported": true, "max_runs": p.max_runs, "runs": p.retention_runs,
           "samples": samples})
}

/// The run folders once retention has caught up with the take: polled
/// until at most `max_runs` or unchanged for 3 s (longer than the 2 s
/// between two passes a crossed limit starts), for at most 10 s; with how
/// long that took.
fn settled_folders(state: &Path, max_runs: usize) -> (usize, u128) {
    let t0 = Instant::now();
    let (mut last, mut since) = (run_folders(state), Instant::now());
    loop {
        if last <= max_runs || since.elapsed() >= Duration::from_secs(3) {
            return (last, t0.elapsed().as_millis());
        }
        if t0.elapsed() >= Duration::from_secs(10) {
            return (last, t0.elapsed().as_millis());
        }
        std::thread::sleep(Duration::from_millis(50));
        let now = run_folders(state);
        if now != last {
            (last, since) = (now, Instant::now());
        }
    }
}

pub fn bench(quick: bool) -> Value {
    let p = plan(quick);
    let opts = opts();
    let mut d = Daemon::start_with(opts.clone());
    let base = usage(&d.state);
    let idle_kib = settled_rss_kib(d.pid());
    let sessions: Vec<String> = (0..SESSIONS)
        .map(|i| session(&format!("bench-hist{i}")))
        .collect();
    let (mut made, mut fill_s, mut failed) = (0, 0.0, 0);
    let mut at = Vec::new();
    for &n in &p.sizes {
        let (secs, bad) = fill(&d.socket, &sessions, made, n);
        fill_s += secs;
        failed += bad;
        take_all(&d.socket, &sessions);
        made = n;
        eprintln!("history: {n} runs finished");
        at.push(measure(&mut d, &p, &sessions, n, base));
    }
    crate::retire_daemon(d);
    let retention = retention(&p);
    json!({
        "sessions": SESSIONS,
        "clients": CLIENTS,
        "max_concurrent": MAX_CONCURRENT,
        "idle_rss_kib": idle_kib,
        "empty_state_bytes": base.bytes,
        "empty_state_inodes": base.inodes,
        "runs_per_s": made as f64 / fill_s,
        "not_succeeded": failed,
        "at": at,
        "retention": retention,
    })
}

/// The history part's rows.
pub fn rows(h: &Value) {
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    let mib = |kib: f64| format!("{:.1} MiB", kib / 1024.0);
    let dash = || "-".to_owned();
    crate::row(
        &format!(
            "history: fill ({} sessions, {} clients, max_concurrent {}; {} not succeeded)",
            h["sessions"], h["clients"], h["max_concurrent"], h["not_succeeded"]
        ),
        format!("{:.0} runs/s", f(h, "runs_per_s")),
        dash(),
        dash(),
        "-",
    );
    let at = h["at"].as_array().cloned().unwrap_or_default();
    let rss100 = at.first().map_or(f64::NAN, |a| f(a, "rss_kib"));
    for a in &at {
        let n = a["runs"].as_u64().unwrap_or(0);
        let rss = f(a, "rss_kib");
        crate::row(
            &format!("daemon RSS after {n} finished runs (after a restart)"),
            format!("{} ({})", mib(rss), mib(f(a, "rss_after_restart_kib"))),
            format!("idle {}", mib(f(h, "idle_rss_kib"))),
            if n > 100 {
                format!("+{} over 100 runs", mib(rss - rss100))
            } else {
                dash()
            },
            if n == 5_000 {
                "<= RSS at 100 + 2 MiB"
            } else {
                "-"
            },
        );
        crate::row(
            "  disk per run (state dir: blocks, inodes; daemon log)",
            format!(
                "{:.1} KiB, {:.1} inodes; log {:.0} B",
                f(a, "bytes_per_run") / 1024.0,
                f(a, "inodes_per_run"),
                f(a, "daemon_log_bytes_per_run")
            ),
            format!(
                "state dir {:.1} MB, {} inodes",
                f(a, "state_bytes") / 1e6,
                a["state_inodes"]
            ),
            dash(),
            "<= 16 KiB, <= 6 inodes",
        );
        list_rows(a, n);
        let starts = a["restart_to_ping_ms"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        crate::row(
            &format!("  restart → ping, p50 of {}", starts.len()),
            format!("{:.0} ms", f(a, "restart_to_ping_p50_ms")),
            format!(
                "each {}",
                starts
                    .iter()
                    .map(|s| format!("{:.0}", s.as_f64().unwrap_or(f64::NAN)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            dash(),
            if n >= 20_000 { "<= 100 ms" } else { "-" },
        );
    }
    retention_row(&h["retention"]);
}

/// The list rows of one size.
fn list_rows(a: &Value, n: u64) {
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    let what = if a["paged"] == true {
        format!("a page of {PAGE}")
    } else {
        "no paging: the whole list".to_owned()
    };
    let target = if n >= 5_000 { "<= 5 ms" } else { "-" };
    for (key, name, target) in [
        ("list_session", "one session", target),
        ("list_empty_session", "an empty session", "-"),
        ("list_all", "all", target),
    ] {
        let l = &a[key];
        let peak = match (key, a["list_all_peak_rss_kib"].as_f64()) {
            ("list_all", Some(kib)) => format!("; peak RSS {:.0} MiB", kib / 1024.0),
            _ => String::new(),
        };
        crate::row(
            &format!("  list {name} ({what}), p50/p90 of {}", l["calls"]),
            format!("{:.2}/{:.2} ms", f(l, "p50"), f(l, "p90")),
            format!(
                "{} runs, {:.2} MB reply{peak}",
                l["runs"],
                f(l, "bytes") / 1e6
            ),
            "-".into(),
            target,
        );
    }
}

/// The retention row: the folders and state dir size at the end, and
/// the most folders seen.
fn retention_row(r: &Value) {
    let name = format!(
        "retention: max_runs = {}, {} runs",
        r["max_runs"], r["runs"]
    );
    let target = "<= max_runs folders, flat size";
    if r["supported"] != true {
        crate::row(
            &name,
            "not supported by this daemon".into(),
            format!("it said: {}", short(r["refusal"].as_str().unwrap_or(""))),
            "-".into(),
            target,
        );
        return;
    }
    let samples = r["samples"].as_array().cloned().unwrap_or_default();
    let series = |k: &str, scale: f64| {
        samples
            .iter()
            .map(|s| format!("{:.0}", s[k].as_f64().unwrap_or(f64::NAN) / scale))
            .collect::<Vec<_>>()
            .join(" ")
    };
    crate::row(
        &name,
        format!(
            "folders every {BATCH} runs, at the take: {}; settled: {}",
            series("folders_at_take", 1.0),
            series("folders", 1.0)
        ),
        format!("state dir MB: {}", series("state_bytes", 1e6)),
        "-".into(),
        target,
    );
}

/// A refusal without its list of the fields there are, at most 160
/// characters: the row says why, the JSON has it whole.
fn short(said: &str) -> String {
    let said = said.split(", expected one of").next().unwrap_or(said);
    said.chars().take(160).collect()
}
