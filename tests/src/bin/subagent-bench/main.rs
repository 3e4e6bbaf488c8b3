//! `subagent-bench [--quick]`: the benchmark harness (run by scripts/bench
//! in release mode). Prints a markdown table and writes JSON under
//! target/bench/. Measurements only: nothing here fails a build.
//!
//! - [`paced`]: one spawn every 100 ms, as a parent agent spawns, against
//!   bubblewrap at the same pace: reported first.
//! - [`spawn`]: spawn latency back to back (to the workload's first
//!   instruction and to the notice) against a plain fork/exec and
//!   bubblewrap.
//! - [`load`]: throughput, and memory with many sleepers.
//! - [`logs`]: log capture speed and `logs -f` latency.
//! - [`git`]: the git snapshot against `git status`.
//! - [`egress`]: the egress proxy's CONNECT throughput and the time it
//!   adds to a connection's first byte.
//! - [`history`]: what finished runs cost as they pile up (memory, disk,
//!   lists, restart, retention); `--runs N` makes N the last size.
//! - [`slurm`]: the Slurm backend against `sbatch --wait` on a
//!   single-node cluster, and the daemon's CPU with 50 jobs live.
//!
//! The same binary is the workload: `--stamp FILE`, `--emit`, `--tick`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod egress;
mod git;
mod history;
mod load;
mod logs;
mod paced;
mod slurm;
mod spawn;
mod workload;

use serde_json::{json, Value};
use std::path::Path;
use std::time::Instant;

/// What the parts leave behind (stopped daemons with their state dirs,
/// scratch repositories), deleted when the whole run is over.
static RETIRED: std::sync::Mutex<Vec<Box<dyn Send>>> = std::sync::Mutex::new(Vec::new());

/// Where the parts' daemons make their folders (socket, state dir, log).
const WORK: &str = "target/bench/work";

/// Options for a part's daemon: its folder under [`WORK`].
pub fn daemon_opts() -> subagentd_e2e::DaemonOpts {
    subagentd_e2e::DaemonOpts {
        base_dir: Some(std::env::current_dir().unwrap().join(WORK)),
        ..Default::default()
    }
}

/// Keeps `x` (and its files) until the run is over.
pub fn retire<T: Send + 'static>(x: T) {
    RETIRED.lock().unwrap().push(Box::new(x));
}

/// Stops a part's daemon and keeps its folder until the run is over.
pub fn retire_daemon(mut d: subagentd_e2e::Daemon) {
    let _ = d.stop();
    retire(d);
}

/// Percentile (0–100) of sorted-or-not samples, in ms.
pub fn pct(samples: &[f64], p: f64) -> f64 {
    let mut v = samples.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return 0.0;
    }
    let i = ((p / 100.0) * (v.len() - 1) as f64).round() as usize;
    v[i.min(v.len() - 1)]
}

pub fn row(name: &str, ours: String, reference: String, ratio: String, target: &str) {
    println!("| {name} | {ours} | {reference} | {ratio} | {target} |");
}

/// The bubblewrap reference's options, as the issue gives them (the
/// workload follows, with any bind it needs before it).
pub const BWRAP_ARGS: [&str; 9] = [
    "--unshare-all",
    "--die-with-parent",
    "--ro-bind",
    "/",
    "/",
    "--dev",
    "/dev",
    "--proc",
    "/proc",
];

/// Flushes every file system's dirty data, so that a part is not measured
/// while the kernel writes back an earlier part's files (the log part
/// leaves 600 MB to write back).
fn settle() {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
}

fn main() {
    if workload::dispatch() {
        return;
    }
    let quick = std::env::args().any(|a| a == "--quick");
    // The daemon and the runner are the ones built beside this binary.
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        std::env::set_var("SUBAGENT_BIN_DIR", dir);
    }
    // `--only NAME` (paced, spawn, load, logs, git, egress, history, slurm) runs
    // one part.
    let args: Vec<String> = std::env::args().collect();
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .cloned();
    let want = |name: &str| only.as_deref().is_none_or(|o| o == name);
    std::fs::create_dir_all(WORK).unwrap();
    let started = Instant::now();
    let part = |name: &str, run: fn(bool) -> Value| {
        if want(name) {
            settle();
            run(quick)
        } else {
            Value::Null
        }
    };
    let paced = part("paced", paced::bench);
    let spawn = part("spawn", spawn::bench);
    let load = part("load", load::bench);
    let logs = part("logs", logs::bench);
    let git = part("git", git::bench_git);
    let egress = part("egress", egress::bench);
    let history = part("history", history::bench);
    let slurm = part("slurm", slurm::bench);
    let results = json!({
        "mode": if quick { "quick" } else { "full" },
        "machine": machine(),
        "paced": paced,
        "spawn": spawn,
        "load": load,
        "logs": logs,
        "git_snapshot": git,
        "egress": egress,
        "history": history,
        "slurm": slurm,
        "elapsed_s": started.elapsed().as_secs_f64(),
        "runner_linking": runner_linking(),
    });
    eprintln!("subagent-runner: linked {}", results["runner_linking"]);
    println!("| benchmark | ours | reference | ratio | target |");
    println!("|---|---|---|---|---|");
    // A part that did not run (`--only`) prints no rows.
    if !paced.is_null() {
        paced_rows(&paced);
    }
    if !spawn.is_null() {
        spawn_rows(&spawn);
    }
    if !load.is_null() {
        load_rows(&load);
    }
    if !logs.is_null() {
        logs_rows(&logs);
    }
    if !git.is_null() {
        git_rows(&git);
    }
    if !egress.is_null() {
        egress::rows(&egress);
    }
    if !history.is_null() {
        history::rows(&history);
    }
    if !slurm.is_null() {
        slurm::rows(&slurm);
    }
    let out = Path::new("target/bench");
    std::fs::create_dir_all(out).unwrap();
    let mode = if quick { "quick" } else { "full" };
    // A partial run (`--only`) does not overwrite the complete results.
    let file = out.join(match &only {
        Some(part) => format!("{mode}-{part}.json"),
        None => format!("{mode}.json"),
    });
    std::fs::write(&file, serde_json::to_vec_pretty(&results).unwrap()).unwrap();
    eprintln!(
        "wrote {} in {:.0} s",
        file.display(),
        started.elapsed().as_secs_f64()
    );
    RETIRED.lock().unwrap().clear();
}

/// The back-to-back part's rows.
fn spawn_rows(spawn: &Value) {
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    let plain = &spawn["plain"];
    let ours = &spawn["ours_exec"];
    row(
        &format!("spawn → exec, p50/p90/p99 ({} spawns)", spawn["n"]),
        format!(
            "{:.2}/{:.2}/{:.2} ms",
            f(ours, "p50"),
            f(ours, "p90"),
            f(ours, "p99")
        ),
        format!(
            "plain {:.2} ms; bwrap {}",
            f(plain, "p50"),
            spawn["bwrap"]
                .get("p50")
                .and_then(Value::as_f64)
                .map_or("not installed".into(), |b| format!("{b:.2} ms"))
        ),
        format!(
            "{:.1}x plain; {} bwrap",
            f(spawn, "ratio_plain"),
            spawn
                .get("ratio_bwrap")
                .and_then(Value::as_f64)
                .map_or("-".into(), |r| format!("{r:.2}x"))
        ),
        "-",
    );
    for (step, v) in spawn["setup_p50_ms"].as_object().into_iter().flatten() {
        row(
            &format!("  sandbox step: {step} (p50)"),
            format!("{:.3} ms", v.as_f64().unwrap_or(0.0)),
            "-".into(),
            "-".into(),
            "-",
        );
    }
    let notice = &spawn["ours_notice"];
    row(
        "spawn → notice, p50/p90/p99",
        format!(
            "{:.2}/{:.2}/{:.2} ms",
            f(notice, "p50"),
            f(notice, "p90"),
            f(notice, "p99")
        ),
        "-".into(),
        "-".into(),
        "-",
    );
}

/// The throughput and memory rows.
fn load_rows(load: &Value) {
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    row(
        &format!("throughput ({} runs, max_concurrent 32)", load["runs"]),
        format!("{:.0} runs/s", f(load, "runs_per_s")),
        format!(
            "plain fork/exec {:.0} runs/s; bwrap {}",
            f(load, "plain_runs_per_s"),
            load["bwrap_runs_per_s"]
                .as_f64()
                .map_or("not installed".into(), |b| format!("{b:.0} runs/s"))
        ),
        load["ratio_bwrap"]
            .as_f64()
            .map_or("-".into(), |r| format!("{r:.2}x bwrap")),
        "-",
    );
    row(
        "  host CPU per run (all processes)",
        format!("{:.2} ms", f(load, "cpu_ms_per_run")),
        format!(
            "plain {:.2} ms; bwrap {}",
            f(load, "plain_cpu_ms_per_run"),
            load["bwrap_cpu_ms_per_run"]
                .as_f64()
                .map_or("not installed".into(), |b| format!("{b:.2} ms"))
        ),
        load["bwrap_cpu_ms_per_run"]
            .as_f64()
            .map_or("-".into(), |b| {
                format!("{:.2}x bwrap", f(load, "cpu_ms_per_run") / b)
            }),
        "-",
    );
    row(
        &format!("daemon RSS idle / with {} sleepers", load["sleepers"]),
        format!(
            "{:.1} / {:.1} MiB",
            f(load, "daemon_idle_mib"),
            f(load, "daemon_sleepers_mib")
        ),
        "-".into(),
        "-".into(),
        "<= 100 MiB",
    );
    row(
        "runner RSS (mean)",
        format!("{:.2} MiB", f(load, "runner_mean_mib")),
        "-".into(),
        "-".into(),
        "<= 4 MiB",
    );
}

/// The log capture rows.
fn logs_rows(logs: &Value) {
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    row(
        &format!("log capture, {} MB in 64 KiB chunks", logs["mb"]),
        format!("{:.0} MB/s", f(logs, "chunks_mb_s")),
        format!("direct {:.0} MB/s", f(logs, "direct_mb_s")),
        format!("{:.2}x", f(logs, "chunks_mb_s") / f(logs, "direct_mb_s")),
        ">= 500 MB/s",
    );
    row(
        &format!("log capture, {} MB in 64-byte lines", logs["lines_mb"]),
        format!("{:.0} MB/s", f(logs, "lines_mb_s")),
        "-".into(),
        "-".into(),
        "-",
    );
    row(
        "logs -f latency, p50/max",
        format!(
            "{:.1}/{:.1} ms",
            f(&logs["follow"], "p50"),
            f(&logs["follow"], "max")
        ),
        "-".into(),
        "-".into(),
        "-",
    );
}

/// The git snapshot's row.
fn git_rows(git: &Value) {
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    row(
        &format!(
            "git snapshot ({} files, {} modified)",
            git["files"], git["modified"]
        ),
        format!("{:.1} ms", f(git, "snapshot_ms")),
        format!("git status {:.1} ms", f(git, "git_status_ms")),
        format!("{:.2}x", f(git, "ratio")),
        &format!("<= {}x", git::TARGET_RATIO),
    );
}

/// The paced part's rows.
fn paced_rows(paced: &Value) {
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    let ms = |v: &Value| format!("{:.2}/{:.2} ms", f(v, "p50"), f(v, "p90"));
    let bw = |k: &str| {
        paced
            .get(k)
            .map_or("bwrap not installed".into(), |v| format!("bwrap {}", ms(v)))
    };
    let ratio = |k: &str| {
        paced[k]
            .as_f64()
            .map_or("-".into(), |r| format!("{r:.2}x bwrap"))
    };
    row(
        &format!(
            "paced spawn → notice, p50/p90 (one every {} ms, {} spawns)",
            paced["pause_ms"], paced["n"]
        ),
        ms(&paced["ours_notice"]),
        format!("{} (start → exit)", bw("bwrap_exit")),
        ratio("ratio_notice"),
        "<= 1.0x bwrap",
    );
    row(
        "paced spawn → exec, p50/p90",
        ms(&paced["ours_exec"]),
        bw("bwrap_exec"),
        ratio("ratio_exec"),
        "-",
    );
    row(
        "paced exec → notice, p50/p90 (each spawn's notice less its exec)",
        ms(&paced["ours_exec_to_notice"]),
        format!("{} (exec → exit)", bw("bwrap_exec_to_exit")),
        "-".into(),
        "-",
    );
}

/// "static" or "dynamic": whether the runner beside this binary has an
/// ELF interpreter (`PT_INTERP`); `scripts/build-release` links it
/// statically, a plain `cargo build` does not.
fn runner_linking() -> &'static str {
    let Some(bytes) = std::env::current_exe()
        .ok()
        .and_then(|e| std::fs::read(e.with_file_name("subagent-runner")).ok())
    else {
        return "missing";
    };
    let u = |at: usize, n: usize| -> Option<u64> {
        let b = bytes.get(at..at + n)?;
        Some(b.iter().rev().fold(0, |v, &x| (v << 8) | u64::from(x)))
    };
    let headers = || -> Option<bool> {
        let (off, size, num) = (u(0x20, 8)? as usize, u(0x36, 2)? as usize, u(0x38, 2)?);
        Some((0..num as usize).any(|i| u(off + i * size, 4) == Some(3)))
    };
    match headers() {
        Some(true) => "dynamic",
        Some(false) => "static",
        None => "unreadable",
    }
}

fn machine() -> Value {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let model = read("/proc/cpuinfo")
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_default();
    json!({
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "cpu": model,
        "kernel": read("/proc/sys/kernel/osrelease").trim(),
        "mem_total": read("/proc/meminfo").lines().next().unwrap_or("").to_owned(),
    })
}
