//! The Slurm backend against plain Slurm, on a single-node cluster
//! (`scripts/slurm-cluster`; skipped, saying why, when none can start):
//! 50 short runs through a 4-job limit, four parents each spawning and
//! waiting in turn, spawn → notice against `sbatch --wait` of the same
//! command by four workers; then the daemon's CPU while 50 jobs are live.

use crate::pct;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use subagentd_e2e::{session, Daemon, DaemonOpts};

/// Jobs and the concurrency both sides run them at.
const JOBS: usize = 50;
const WORKERS: usize = 4;
/// How long the daemon's CPU is watched while its jobs are live.
const WATCH: Duration = Duration::from_secs(10);

/// Starts (or finds) the cluster; its slurm.conf, or why not.
fn cluster() -> Result<PathBuf, String> {
    let dir = std::env::current_dir().unwrap().join("target/bench/slurm");
    let out = Command::new("scripts/slurm-cluster")
        .arg("start")
        .arg(&dir)
        .output()
        .map_err(|e| format!("scripts/slurm-cluster: {e}"))?;
    if !out.status.success() {
        let why = String::from_utf8_lossy(&out.stderr);
        return Err(why.lines().next().unwrap_or("it failed").to_owned());
    }
    Ok(dir.join("slurm.conf"))
}

/// Runs `work(i)` for i in 0..JOBS on WORKERS threads; each one's ms, and
/// the whole time in s.
fn by_workers(work: impl Fn(usize) -> f64 + Sync) -> (Vec<f64>, f64) {
    let (next, times) = (AtomicUsize::new(0), Mutex::new(Vec::new()));
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..WORKERS {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= JOBS {
                    return;
                }
                let ms = work(i);
                times.lock().unwrap().push(ms);
            });
        }
    });
    (times.into_inner().unwrap(), t0.elapsed().as_secs_f64())
}

/// `sbatch --wait` of `echo run N`.
fn plain(conf: &Path) -> (Vec<f64>, f64) {
    by_workers(|i| {
        let t = Instant::now();
        let ok = Command::new("sbatch")
            .env("SLURM_CONF", conf)
            .args(["--wait", "--parsable", "-o", "/dev/null", "--wrap"])
            .arg(format!("echo run {i}"))
            .output()
            .is_ok_and(|o| o.status.success());
        assert!(ok, "sbatch --wait failed");
        t.elapsed().as_secs_f64() * 1e3
    })
}

/// A daemon of the Slurm backend (`max` runs at once, the default poll).
fn daemon(conf: &Path, max: usize) -> Daemon {
    let mut opts = crate::daemon_opts();
    std::fs::create_dir_all(opts.base_dir.as_ref().unwrap()).unwrap();
    let cfg = opts
        .base_dir
        .as_ref()
        .unwrap()
        .join(format!("slurm-{max}.toml"));
    let shared = opts
        .base_dir
        .as_ref()
        .unwrap()
        .join(format!("slurm-shared-{max}"));
    std::fs::write(
        &cfg,
        format!(
            "[backend]\nkind = \"slurm\"\nshared_dir = {:?}\n",
            shared.display().to_string()
        ),
    )
    .unwrap();
    opts = DaemonOpts {
        max_concurrent: Some(max),
        args: vec!["--config".into(), cfg.display().to_string()],
        env: vec![("SLURM_CONF".into(), conf.display().to_string())],
        ..opts
    };
    Daemon::start_with(opts)
}

/// Ours: spawn → wait (the notice is written when the wait returns).
fn ours(d: &Daemon) -> (Vec<f64>, f64) {
    let s = session("bench-slurm");
    by_workers(|i| {
        let mut c = d.conn();
        let t = Instant::now();
        let run = c.spawn(&s, &["sh", "-c", &format!("echo run {i}")], json!({}));
        let st = c.wait(&run);
        assert_eq!(st["state"], "succeeded", "{st}");
        t.elapsed().as_secs_f64() * 1e3
    })
}

/// The CPU time (user + system, with reaped children: squeue) of `pid`.
fn cpu_s(pid: i32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<f64> = after.split(' ').map(|x| x.parse().unwrap_or(0.0)).collect();
    // utime, stime, cutime, cstime are fields 14-17 (11-14 after the name).
    let ticks = 100.0;
    (f[11] + f[12] + f[13] + f[14]) / ticks
}

/// The daemon's CPU, as a share of one core, while JOBS jobs are live.
fn cpu_while_live(conf: &Path) -> f64 {
    let d = daemon(conf, JOBS);
    let mut c = d.conn();
    let s = session("bench-slurm-live");
    let runs: Vec<String> = (0..JOBS)
        .map(|_| c.spawn(&s, &["sleep", "60"], json!({})))
        .collect();
    let (before, t) = (cpu_s(d.pid()), Instant::now());
    std::thread::sleep(WATCH);
    let share = (cpu_s(d.pid()) - before) / t.elapsed().as_secs_f64();
    for r in &runs {
        let _ = c.call("cancel_agent_run", json!({ "run_id": r }));
    }
    for r in &runs {
        c.wait(r);
    }
    crate::retire_daemon(d);
    share
}

pub fn bench(_quick: bool) -> Value {
    let conf = match cluster() {
        Ok(c) => c,
        Err(why) => {
            eprintln!("slurm: skipped: {why}");
            return json!({"skipped": why});
        }
    };
    let (plain_ms, plain_s) = plain(&conf);
    let d = daemon(&conf, WORKERS);
    let (ours_ms, ours_s) = ours(&d);
    crate::retire_daemon(d);
    let cpu = cpu_while_live(&conf);
    let _ = Command::new("scripts/slurm-cluster")
        .arg("stop")
        .arg(conf.parent().unwrap())
        .output();
    json!({
        "jobs": JOBS,
        "workers": WORKERS,
        "plain": {"p50": pct(&plain_ms, 50.0), "p90": pct(&plain_ms, 90.0), "total_s": plain_s},
        "ours": {"p50": pct(&ours_ms, 50.0), "p90": pct(&ours_ms, 90.0), "total_s": ours_s},
        "ratio_p50": pct(&ours_ms, 50.0) / pct(&plain_ms, 50.0),
        "ratio_total": ours_s / plain_s,
        "daemon_cpu_share_50_live": cpu,
    })
}

/// The Slurm part's rows.
pub fn rows(v: &Value) {
    if let Some(why) = v["skipped"].as_str() {
        crate::row(
            "slurm",
            format!("skipped: {why}"),
            "-".into(),
            "-".into(),
            "-",
        );
        return;
    }
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    crate::row(
        &format!(
            "slurm: spawn → notice, p50 ({} runs, {} at once)",
            v["jobs"], v["workers"]
        ),
        format!("{:.0} ms", f(&v["ours"], "p50")),
        format!("sbatch --wait {:.0} ms", f(&v["plain"], "p50")),
        format!("{:.2}x", f(v, "ratio_p50")),
        "≤ 1.2x",
    );
    crate::row(
        "slurm: all runs, total",
        format!("{:.1} s", f(&v["ours"], "total_s")),
        format!("sbatch --wait {:.1} s", f(&v["plain"], "total_s")),
        format!("{:.2}x", f(v, "ratio_total")),
        "≤ 1.2x",
    );
    crate::row(
        &format!("slurm: daemon CPU with {} jobs live", v["jobs"]),
        format!("{:.1}% of a core", f(v, "daemon_cpu_share_50_live") * 100.0),
        "-".into(),
        "-".into(),
        "-",
    );
}
