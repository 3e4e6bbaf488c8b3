//! `[backend]`: where runs are placed: on this host (`local`, the daemon
//! starts each run's runner) or as jobs of an existing Slurm cluster
//! (`slurm`, the job's command is the runner with its run folder). For
//! Slurm, the job a run becomes ([`job`]: its sbatch options and batch
//! script) and what Slurm's job states mean for the run ([`phase`],
//! [`end_without_record`]) are plain data from pure functions.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Where runs are placed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// The daemon starts each run's runner on this host.
    #[default]
    Local,
    /// Each run is a job of a Slurm cluster.
    Slurm,
}

impl BackendKind {
    /// The name in the config and on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Local => "local",
            BackendKind::Slurm => "slurm",
        }
    }
}

/// The poll interval of Slurm's job states when the config sets none.
pub const DEFAULT_POLL_INTERVAL_MS: u64 = 1000;
/// The time a job gets beyond the run's wall time (sandbox setup, the
/// kill grace, copying the run's files out) when the config sets none.
pub const DEFAULT_TIME_MARGIN_S: u64 = 120;
/// Where sbatch, squeue and scancel are when the config says nothing.
pub const DEFAULT_BIN_DIR: &str = "/usr/bin";
/// Memory for the runner itself, added to a job's `--mem`.
pub const RUNNER_MEMORY_MB: u64 = 64;

/// The options the daemon sets on every job; `extra_args` may not set them.
const RESERVED: &[&str] = &[
    "--parsable",
    "--job-name",
    "--output",
    "--error",
    "--open-mode",
    "--chdir",
    "--export",
    "--export-file",
    "--requeue",
    "--no-requeue",
    "--time",
    "--mem",
    "--mem-per-cpu",
    "--mem-per-gpu",
    "--cpus-per-task",
    "--ntasks",
    "--wrap",
    "--wait",
    "--hold",
    "--array",
    "--uid",
    "--gid",
    "--get-user-env",
    "--input",
    "--partition",
    "--account",
    "--qos",
    "--clusters",
    "--cluster-constraint",
    "--signal",
    "--propagate",
    "--wckey",
];

/// `[backend]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Backend {
    /// `local` (default) or `slurm`.
    #[serde(default)]
    pub kind: BackendKind,
    /// Slurm: the partition jobs go to (sbatch's default when absent).
    #[serde(default)]
    pub partition: Option<String>,
    /// Slurm: the account jobs are charged to.
    #[serde(default)]
    pub account: Option<String>,
    /// Slurm: the quality of service.
    #[serde(default)]
    pub qos: Option<String>,
    /// Slurm: more sbatch options, each `--name=value` or `--flag`.
    #[serde(default)]
    pub extra_args: Vec<String>,
    /// Slurm: where run folders (and the runs' temp dirs and worktrees)
    /// live, on storage every node mounts at the same path.
    #[serde(default)]
    pub shared_dir: Option<PathBuf>,
    /// Slurm: the runner's path on the nodes (default: the daemon's own).
    #[serde(default)]
    pub runner: Option<PathBuf>,
    /// Slurm: the directory holding sbatch, squeue and scancel.
    #[serde(default)]
    pub bin_dir: Option<PathBuf>,
    /// Slurm: how often the live jobs' states are read, in ms.
    #[serde(default)]
    pub poll_interval_ms: Option<u64>,
    /// Slurm: seconds a job gets beyond its run's wall time.
    #[serde(default)]
    pub time_margin_s: Option<u64>,
    /// Slurm: `IP:PORT` of the daemon's job services port, where jobs reach
    /// their runs' egress proxy and model gateway (none: runs needing
    /// either are refused).
    #[serde(default)]
    pub services_listen: Option<String>,
}

/// `[backend]` holds a value its rules refuse: the key and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("backend.{key}: {why}")]
pub struct BackendError {
    /// The key.
    pub key: &'static str,
    /// What is wrong.
    pub why: String,
}

fn refused(key: &'static str, why: impl Into<String>) -> BackendError {
    BackendError {
        key,
        why: why.into(),
    }
}

/// A Slurm name (partition, account, qos): 1 to 128 of `A-Z a-z 0-9 . _ -`.
fn check_name(key: &'static str, v: &Option<String>) -> Result<(), BackendError> {
    let Some(v) = v else { return Ok(()) };
    let ok = !v.is_empty()
        && v.len() <= 128
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    match ok {
        true => Ok(()),
        false => Err(refused(
            key,
            format!("{v:?}: 1 to 128 of A-Z a-z 0-9 . _ -"),
        )),
    }
}

fn check_absolute(key: &'static str, p: &Option<PathBuf>) -> Result<(), BackendError> {
    match p {
        Some(p) if !p.is_absolute() => Err(refused(
            key,
            format!("{} is not an absolute path", p.display()),
        )),
        _ => Ok(()),
    }
}

impl Backend {
    /// The rules the types cannot say.
    pub fn check(&self) -> Result<(), BackendError> {
        check_name("partition", &self.partition)?;
        check_name("account", &self.account)?;
        check_name("qos", &self.qos)?;
        check_absolute("shared_dir", &self.shared_dir)?;
        check_absolute("runner", &self.runner)?;
        check_absolute("bin_dir", &self.bin_dir)?;
        for a in &self.extra_args {
            check_extra_arg(a)?;
        }
        if let Some(ms) = self.poll_interval_ms {
            if !(100..=60_000).contains(&ms) {
                return Err(refused("poll_interval_ms", "must be 100 to 60000"));
            }
        }
        if self.time_margin_s.is_some_and(|s| s > 86_400) {
            return Err(refused("time_margin_s", "must be at most 86400"));
        }
        if let Some(a) = &self.services_listen {
            self.services_addr()
                .ok_or_else(|| refused("services_listen", format!("{a:?} is not the IP:PORT jobs connect to (a port other than 0, an address other than 0.0.0.0 or ::)")))?;
        }
        if self.kind == BackendKind::Slurm && self.shared_dir.is_none() {
            return Err(refused(
                "shared_dir",
                "kind = \"slurm\" needs shared_dir: the run folders the nodes write",
            ));
        }
        Ok(())
    }

    /// The job services port's address, when one is set (a fixed port:
    /// jobs carry it across daemon restarts).
    pub fn services_addr(&self) -> Option<std::net::SocketAddr> {
        let a: std::net::SocketAddr = self.services_listen.as_deref()?.parse().ok()?;
        // Jobs are told this address: it must be one they can connect to.
        (a.port() != 0 && !a.ip().is_unspecified()).then_some(a)
    }

    /// The poll interval, in ms.
    pub fn poll_interval_ms(&self) -> u64 {
        self.poll_interval_ms.unwrap_or(DEFAULT_POLL_INTERVAL_MS)
    }

    /// Where sbatch, squeue and scancel are.
    pub fn bin_dir(&self) -> PathBuf {
        self.bin_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_BIN_DIR))
    }
}

/// An `extra_args` entry: `--name` or `--name=value`, printable, and no
/// option the daemon sets itself.
fn check_extra_arg(a: &str) -> Result<(), BackendError> {
    let name = a.split('=').next().unwrap_or(a);
    let well_formed = a.starts_with("--")
        && name.len() > 2
        && name[2..]
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !a.chars().any(char::is_control);
    if !well_formed {
        return Err(refused(
            "extra_args",
            format!("{a:?}: each entry is --name or --name=value"),
        ));
    }
    // sbatch takes an unambiguous abbreviation of an option (`--outp`).
    if RESERVED.iter().any(|r| r.starts_with(name)) {
        let why = format!("{a:?}: {name} is set by the daemon (or by partition, account, qos)");
        return Err(refused("extra_args", why));
    }
    Ok(())
}

/// What a run's job is made from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobInputs<'a> {
    /// The run's id: the job's name.
    pub run_id: &'a str,
    /// The run folder on the shared storage.
    pub run_dir: &'a Path,
    /// The runner's path on the nodes.
    pub runner: &'a Path,
    /// The run's wall time.
    pub wall_time_s: u64,
    /// The run's memory limit.
    pub memory_mb: u64,
    /// The run's scratch file system (a tmpfs: memory on the node).
    pub disk_mb: u64,
}

/// A run's job: sbatch's arguments and the batch script it reads on stdin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// sbatch's arguments (without the program).
    pub args: Vec<String>,
    /// The batch script.
    pub script: String,
}

/// `s` quoted for sh: in single quotes, each `'` as `'\''`.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The job of a run: one task, one CPU, the run's memory and scratch plus
/// the runner's, its wall time plus the margin in whole minutes (Slurm's
/// unit), never requeued (a second start would run the agent twice), the
/// daemon's environment not exported (it may hold the operator's keys),
/// and the runner's stderr appended to the run folder's runner.log.
pub fn job(cfg: &Backend, i: &JobInputs) -> Job {
    let margin = cfg.time_margin_s.unwrap_or(DEFAULT_TIME_MARGIN_S);
    let minutes = i.wall_time_s.saturating_add(margin).div_ceil(60).max(1);
    let mem = i
        .memory_mb
        .saturating_add(i.disk_mb)
        .saturating_add(RUNNER_MEMORY_MB);
    let log = i.run_dir.join("runner.log");
    let mut args: Vec<String> = cfg.extra_args.clone();
    for (flag, v) in [
        ("--partition", &cfg.partition),
        ("--account", &cfg.account),
        ("--qos", &cfg.qos),
    ] {
        if let Some(v) = v {
            args.push(format!("{flag}={v}"));
        }
    }
    args.extend([
        "--parsable".to_owned(),
        format!("--job-name={}", i.run_id),
        format!("--output={}", log.display()),
        "--open-mode=append".to_owned(),
        "--chdir=/".to_owned(),
        "--export=NONE".to_owned(),
        "--no-requeue".to_owned(),
        "--ntasks=1".to_owned(),
        "--cpus-per-task=1".to_owned(),
        format!("--mem={mem}M"),
        format!("--time={minutes}"),
    ]);
    let script = format!(
        "#!/bin/sh\n# subagentd run {}\nexec {} --job-dir {}\n",
        i.run_id,
        sh_quote(&i.runner.to_string_lossy()),
        sh_quote(&i.run_dir.to_string_lossy()),
    );
    Job { args, script }
}

/// sbatch --parsable's answer: the job id (before a `;cluster`).
pub fn parse_job_id(stdout: &str) -> Option<u64> {
    let first = stdout.trim().split(';').next()?;
    first.parse().ok().filter(|&n| n > 0)
}

/// How a job's run ended, when the runner left no exit.json.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobEnd {
    /// It ran to completion, or failed, without the runner's record.
    Lost,
    /// Slurm stopped it at its time limit.
    TimedOut,
    /// It was cancelled (by the daemon or from outside).
    Cancelled,
    /// It was killed for memory.
    OutOfMemory,
}

/// Where a job is, from Slurm's `job_state`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobPhase {
    /// Waiting in Slurm's queue.
    Pending,
    /// Running (or between states that keep it going: suspended,
    /// completing, configuring).
    Running,
    /// Over: Slurm's final state.
    Ended(JobEnd),
}

/// The phase a `job_state` names. A state this code does not know counts
/// as still running: the next poll sees it again.
pub fn phase(job_state: &str) -> JobPhase {
    match job_state {
        "PENDING" | "REQUEUED" | "REQUEUE_HOLD" | "REQUEUE_FED" => JobPhase::Pending,
        "COMPLETED" | "FAILED" | "NODE_FAIL" | "BOOT_FAIL" | "PREEMPTED" => {
            JobPhase::Ended(JobEnd::Lost)
        }
        "TIMEOUT" | "DEADLINE" => JobPhase::Ended(JobEnd::TimedOut),
        "CANCELLED" => JobPhase::Ended(JobEnd::Cancelled),
        "OUT_OF_MEMORY" => JobPhase::Ended(JobEnd::OutOfMemory),
        _ => JobPhase::Running,
    }
}

/// Slurm's raw wait status (`exit_code` in squeue's JSON) as words.
pub fn wait_status(raw: i64) -> String {
    let signal = raw & 0x7f;
    if signal != 0 {
        format!("signal {signal}")
    } else {
        format!("exit code {}", (raw >> 8) & 0xff)
    }
}

/// The reason a run whose job ended without the runner's exit.json ends
/// with: Slurm's own state and reason, and its exit status.
pub fn end_without_record(job_id: u64, state: &str, reason: &str, exit_code: i64) -> String {
    let reason = match reason {
        "" | "None" => String::new(),
        r => format!(", reason {r}"),
    };
    format!(
        "the Slurm job {job_id} ended {state}{reason} ({}) and its runner left no exit.json",
        wait_status(exit_code)
    )
}

/// Why a pending job waits, in words: Slurm's description when it has
/// one, else its reason code.
pub fn pending_reason(job_id: u64, reason: &str, description: &str) -> String {
    let why = match (description.trim(), reason) {
        ("", "" | "None") => "no reason given".to_owned(),
        ("", r) => r.to_owned(),
        (d, _) => d.to_owned(),
    };
    format!("waiting in Slurm's queue as job {job_id}: {why}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slurm() -> Backend {
        Backend {
            kind: BackendKind::Slurm,
            shared_dir: Some("/shared/subagentd".into()),
            ..Default::default()
        }
    }

    fn inputs<'a>(dir: &'a Path, runner: &'a Path) -> JobInputs<'a> {
        JobInputs {
            run_id: "20261206T101010.123456Z-0a1b2c3d",
            run_dir: dir,
            runner,
            wall_time_s: 3600,
            memory_mb: 2048,
            disk_mb: 1024,
        }
    }

    #[test]
    fn a_job_carries_the_runs_limits_and_never_the_daemons_environment() {
        let dir = Path::new("/shared/subagentd/sessions/s/runs/r");
        let runner = Path::new("/opt/subagent/bin/subagent-runner");
        let mut cfg = slurm();
        cfg.partition = Some("agents".into());
        cfg.extra_args = vec!["--constraint=avx2".into()];
        let j = job(&cfg, &inputs(dir, runner));
        assert_eq!(
            j.args,
            [
                "--constraint=avx2",
                "--partition=agents",
                "--parsable",
                "--job-name=20261206T101010.123456Z-0a1b2c3d",
                "--output=/shared/subagentd/sessions/s/runs/r/runner.log",
                "--open-mode=append",
                "--chdir=/",
                "--export=NONE",
                "--no-requeue",
                "--ntasks=1",
                "--cpus-per-task=1",
                "--mem=3136M",
                "--time=62",
            ]
        );
        assert_eq!(
            j.script,
            "#!/bin/sh\n# subagentd run 20261206T101010.123456Z-0a1b2c3d\n\
             exec '/opt/subagent/bin/subagent-runner' --job-dir '/shared/subagentd/sessions/s/runs/r'\n"
        );
    }

    #[test]
    fn the_time_limit_is_whole_minutes_at_least_one() {
        let (dir, runner) = (Path::new("/d"), Path::new("/r"));
        let mut cfg = slurm();
        cfg.time_margin_s = Some(0);
        let mut i = inputs(dir, runner);
        i.wall_time_s = 1;
        assert!(job(&cfg, &i).args.contains(&"--time=1".to_owned()));
        i.wall_time_s = 61;
        assert!(job(&cfg, &i).args.contains(&"--time=2".to_owned()));
        i.wall_time_s = 0;
        assert!(job(&cfg, &i).args.contains(&"--time=1".to_owned()));
    }

    #[test]
    fn quotes_in_paths_stay_inside_the_quotes() {
        let j = job(
            &slurm(),
            &inputs(Path::new("/a'b; rm -rf /"), Path::new("/r")),
        );
        assert!(
            j.script.ends_with("--job-dir '/a'\\''b; rm -rf /'\n"),
            "{}",
            j.script
        );
    }

    #[test]
    fn slurm_needs_a_shared_dir_and_checks_its_values() {
        assert!(slurm().check().is_ok());
        assert!(Backend::default().check().is_ok());
        let mut b = slurm();
        b.shared_dir = None;
        assert_eq!(b.check().unwrap_err().key, "shared_dir");
        let mut b = slurm();
        b.shared_dir = Some("rel".into());
        assert_eq!(b.check().unwrap_err().key, "shared_dir");
        let mut b = slurm();
        b.partition = Some("a b".into());
        assert_eq!(b.check().unwrap_err().key, "partition");
        let mut b = slurm();
        b.poll_interval_ms = Some(10);
        assert_eq!(b.check().unwrap_err().key, "poll_interval_ms");
        for bad in [
            "localhost:9000",
            "10.0.0.1",
            "10.0.0.1:0",
            "0.0.0.0:7777",
            "[::]:7777",
        ] {
            let mut b = slurm();
            b.services_listen = Some(bad.into());
            assert_eq!(b.check().unwrap_err().key, "services_listen", "{bad}");
        }
        let mut b = slurm();
        b.services_listen = Some("10.0.0.1:7777".into());
        assert_eq!(b.services_addr(), Some("10.0.0.1:7777".parse().unwrap()));
    }

    #[test]
    fn extra_args_cannot_undo_what_the_daemon_sets() {
        for bad in [
            "--export=ALL",
            "--requeue",
            "--output=/tmp/x",
            "--time=99",
            "-p debug",
            "--gres gpu:1",
            "--comment=a\nb",
            "constraint=x",
            "--partition=other",
            "--outp=/tmp/x",
            "--requ",
            "--ui=0",
            "--clusters=other",
            "--propagate=ALL",
            "--signal=B:USR1@30",
        ] {
            let mut b = slurm();
            b.extra_args = vec![bad.into()];
            assert_eq!(b.check().unwrap_err().key, "extra_args", "{bad}");
        }
        let mut b = slurm();
        b.extra_args = vec!["--gres=gpu:1".into(), "--exclusive".into()];
        assert!(b.check().is_ok());
    }

    #[test]
    fn sbatch_answers_an_id_with_or_without_a_cluster() {
        assert_eq!(parse_job_id("42\n"), Some(42));
        assert_eq!(parse_job_id("42;subagent\n"), Some(42));
        assert_eq!(parse_job_id("Submitted batch job 42"), None);
        assert_eq!(parse_job_id("0"), None);
        assert_eq!(parse_job_id(""), None);
    }

    #[test]
    fn slurms_states_map_to_phases() {
        assert_eq!(phase("PENDING"), JobPhase::Pending);
        assert_eq!(phase("RUNNING"), JobPhase::Running);
        assert_eq!(phase("COMPLETING"), JobPhase::Running);
        assert_eq!(phase("SUSPENDED"), JobPhase::Running);
        assert_eq!(phase("SOMETHING_NEW"), JobPhase::Running);
        assert_eq!(phase("COMPLETED"), JobPhase::Ended(JobEnd::Lost));
        assert_eq!(phase("NODE_FAIL"), JobPhase::Ended(JobEnd::Lost));
        assert_eq!(phase("TIMEOUT"), JobPhase::Ended(JobEnd::TimedOut));
        assert_eq!(phase("CANCELLED"), JobPhase::Ended(JobEnd::Cancelled));
        assert_eq!(phase("OUT_OF_MEMORY"), JobPhase::Ended(JobEnd::OutOfMemory));
    }

    #[test]
    fn reasons_name_slurms_state_reason_and_status() {
        assert_eq!(wait_status(768), "exit code 3");
        assert_eq!(wait_status(9), "signal 9");
        assert_eq!(
            end_without_record(7, "NODE_FAIL", "NodeDown", 0),
            "the Slurm job 7 ended NODE_FAIL, reason NodeDown (exit code 0) and its runner left no exit.json"
        );
        assert_eq!(
            end_without_record(7, "TIMEOUT", "None", 9),
            "the Slurm job 7 ended TIMEOUT (signal 9) and its runner left no exit.json"
        );
        assert_eq!(
            pending_reason(7, "Resources", ""),
            "waiting in Slurm's queue as job 7: Resources"
        );
        assert_eq!(
            pending_reason(7, "Resources", "Nodes required for job are DOWN"),
            "waiting in Slurm's queue as job 7: Nodes required for job are DOWN"
        );
    }
}
