//! The Slurm commands the daemon runs, each a process with a deadline and
//! a bound on what it prints: `sbatch --parsable` (the batch script on its
//! stdin) to submit a run's job, one `squeue --json` per poll for every
//! live job at once ([`squeue`] reads its answer), and `scancel`. They are
//! taken from the configured directory only, never from PATH, and get
//! only `SLURM_CONF` of the daemon's environment: `SBATCH_*`, `SQUEUE_*`
//! or `SLURM_CLUSTERS` there would change what is submitted or read, and
//! nothing of the daemon's (its keys) goes into a job, which gets
//! `--export=NONE` besides.

pub mod squeue;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub use squeue::JobInfo;

/// How long a command may take: Slurm's clients retry an unreachable
/// controller for about ten seconds before they give up.
const DEADLINE: Duration = Duration::from_secs(30);
/// The most of squeue's answer read (about 3 KiB a job).
const MAX_SQUEUE_BYTES: u64 = 256 << 20;
/// The most of another command's output read.
const MAX_OUTPUT_BYTES: u64 = 64 << 10;
/// The PATH the commands get.
const CLEAN_PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";

/// A Slurm command failed.
#[derive(Debug, thiserror::Error)]
pub enum SlurmError {
    /// It could not be started.
    #[error("{program}: {source}")]
    Spawn {
        /// The command's path.
        program: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// Talking to it failed.
    #[error("{program}: {source}")]
    Io {
        /// The command's path.
        program: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// It took longer than its deadline (killed).
    #[error("{program} gave no answer within {}s", DEADLINE.as_secs())]
    Timeout {
        /// The command's path.
        program: PathBuf,
    },
    /// It failed, saying why.
    #[error("{program} failed ({status}): {stderr}")]
    Failed {
        /// The command's path.
        program: PathBuf,
        /// Its exit status.
        status: String,
        /// The last line of its stderr.
        stderr: String,
    },
    /// Its answer was not what it should be.
    #[error("{program}: {why}")]
    Answer {
        /// The command's path.
        program: PathBuf,
        /// What was wrong.
        why: String,
    },
}

/// The Slurm client commands in one directory.
#[derive(Debug, Clone)]
pub struct Slurm {
    bin_dir: PathBuf,
}

/// What a command printed.
struct Output {
    stdout: Vec<u8>,
}

/// The last non-empty line of `bytes`, cut to 500 characters.
fn last_line(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let line = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    crate::sanitize::one_line(&line.chars().take(500).collect::<String>())
}

impl Slurm {
    /// The commands in `bin_dir`.
    pub fn new(bin_dir: &Path) -> Slurm {
        Slurm {
            bin_dir: bin_dir.to_path_buf(),
        }
    }

    /// Runs `name args`, writing `stdin` to it, and returns its stdout (at
    /// most `max` bytes) when it exits 0.
    async fn run(
        &self,
        name: &str,
        args: &[String],
        stdin: Option<&[u8]>,
        max: u64,
    ) -> Result<Output, SlurmError> {
        let program = self.bin_dir.join(name);
        let mut cmd = tokio::process::Command::new(&program);
        cmd.env_clear().env("PATH", CLEAN_PATH);
        if let Some(conf) = std::env::var_os("SLURM_CONF") {
            cmd.env("SLURM_CONF", conf);
        }
        let mut child = cmd
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| SlurmError::Spawn {
                program: program.clone(),
                source,
            })?;
        let io = |source| SlurmError::Io {
            program: program.clone(),
            source,
        };
        let (mut out, mut err) = (child.stdout.take(), child.stderr.take());
        let input = child.stdin.take();
        let talk = async {
            if let (Some(mut w), Some(bytes)) = (input, stdin) {
                w.write_all(bytes).await?;
            }
            // Both at once: a full stderr pipe must not stall stdout.
            let (mut o, mut e) = (Vec::new(), Vec::new());
            let read_out = async {
                match out.as_mut() {
                    Some(s) => s.take(max).read_to_end(&mut o).await.map(drop),
                    None => Ok(()),
                }
            };
            let read_err = async {
                match err.as_mut() {
                    Some(s) => s.take(MAX_OUTPUT_BYTES).read_to_end(&mut e).await.map(drop),
                    None => Ok(()),
                }
            };
            let (ro, re) = tokio::join!(read_out, read_err);
            ro?;
            re?;
            let status = child.wait().await?;
            Ok::<_, std::io::Error>((status, o, e))
        };
        let (status, stdout, stderr) = tokio::time::timeout(DEADLINE, talk)
            .await
            .map_err(|_| SlurmError::Timeout {
                program: program.clone(),
            })?
            .map_err(io)?;
        if !status.success() {
            return Err(SlurmError::Failed {
                program,
                status: status.to_string(),
                stderr: last_line(&stderr),
            });
        }
        Ok(Output { stdout })
    }

    /// Submits `job` and returns its id.
    pub async fn submit(&self, job: &policy::backend::Job) -> Result<u64, SlurmError> {
        let out = self
            .run(
                "sbatch",
                &job.args,
                Some(job.script.as_bytes()),
                MAX_OUTPUT_BYTES,
            )
            .await?;
        let text = String::from_utf8_lossy(&out.stdout);
        policy::backend::parse_job_id(&text).ok_or_else(|| SlurmError::Answer {
            program: self.bin_dir.join("sbatch"),
            why: format!("no job id in its answer {:?}", last_line(&out.stdout)),
        })
    }

    /// The daemon's own jobs named `names` (run ids) that Slurm holds now
    /// (pending, running, and ended ones it has not purged yet), by id:
    /// one process for all of them. By name, not by id: with a list of ids
    /// squeue fails when every listed job has been purged, and a poll must
    /// tell "gone" from "no answer". (Slurm 22.05 ignores the filters
    /// with `--json` and answers every job; the caller picks its own.)
    pub async fn jobs(
        &self,
        names: &[String],
    ) -> Result<std::collections::HashMap<u64, JobInfo>, SlurmError> {
        let mut args = ["--json", "--states=all", "--me"]
            .map(str::to_owned)
            .to_vec();
        if !names.is_empty() {
            args.push(format!("--name={}", names.join(",")));
        }
        let out = self.run("squeue", &args, None, MAX_SQUEUE_BYTES).await?;
        squeue::parse(&out.stdout).map_err(|why| SlurmError::Answer {
            program: self.bin_dir.join("squeue"),
            why,
        })
    }

    /// Cancels job `id` (Slurm signals its processes, then kills them).
    pub async fn cancel(&self, id: u64) -> Result<(), SlurmError> {
        self.run("scancel", &[id.to_string()], None, MAX_OUTPUT_BYTES)
            .await
            .map(drop)
    }

    /// Cancels the daemon's jobs named `name` (a run id): a job whose sbatch
    /// did not say its id.
    pub async fn cancel_named(&self, name: &str) -> Result<(), SlurmError> {
        let args = ["--me".to_owned(), format!("--name={name}")];
        self.run("scancel", &args, None, MAX_OUTPUT_BYTES)
            .await
            .map(drop)
    }
}
