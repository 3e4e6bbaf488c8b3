//! runner.json: everything the runner needs, computed by the daemon.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::os::fd::{FromRawFd, RawFd};
use std::path::PathBuf;

/// Grace between SIGTERM and SIGKILL when a run is cancelled.
pub const DEFAULT_KILL_GRACE_MS: u64 = 5000;

/// The runner's input, written by the daemon into the run folder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunnerSpec {
    /// The run this runner serves (for messages only).
    pub run_id: String,
    /// The agent program and its arguments; `argv[0]` is looked up in the
    /// child's PATH when it holds no slash.
    pub argv: Vec<String>,
    /// The child's complete environment.
    pub env: BTreeMap<String, String>,
    /// The child's working directory.
    pub cwd: PathBuf,
    /// child.log: the child's stdout and stderr, appended.
    pub log_path: PathBuf,
    /// exit.json: written atomically when the run has ended.
    pub exit_path: PathBuf,
    /// Wall-clock limit in seconds.
    pub wall_time_s: u64,
    /// Cap on what is written to child.log, in bytes.
    pub output_bytes: u64,
    /// Milliseconds between SIGTERM and SIGKILL on cancel.
    #[serde(default = "default_grace")]
    pub kill_grace_ms: u64,
    /// The sandbox the agent runs in.
    pub sandbox: policy::sandbox::SandboxSpec,
    /// Where the run's cgroups go on this host.
    pub cgroup_plan: policy::sandbox::cgroup::CgroupPlan,
    /// Run the agent as this uid and gid (a root runner only).
    #[serde(default)]
    pub run_as: Option<(u32, u32)>,
    /// Restarts after exit 75, with a freshly composed context.
    #[serde(default)]
    pub restart: Option<RestartSpec>,
    /// Copy the temp dir to its place on disk at the end (it lives in the
    /// run's scratch file system).
    #[serde(default)]
    pub keep_temp: bool,
    /// egress.log, which the daemon's proxy writes for a run in allowlist
    /// mode: its size counts toward the run's disk budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_log: Option<PathBuf>,
    /// The file the agent reads on stdin (first_message.md of the run's
    /// context dir, opened anew for each attempt); absent: /dev/null.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<PathBuf>,
}

/// How to restart a child that exits 75.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestartSpec {
    /// Attempts allowed in all (1 + max_restarts).
    pub max_attempts: u32,
    /// The composition's recorded inputs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compose: Option<policy::compose::ComposeInput>,
    /// A compose.json holding them instead; read only when `compose` is absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compose_input: Option<PathBuf>,
    /// The context dir the composed files go to.
    pub context_dir: PathBuf,
    /// Where the child leaves handoff.md.
    pub artifact_dir: PathBuf,
    /// attempt.json: the attempt in progress, for the status.
    pub attempt_file: PathBuf,
    /// The group the composed files are shared with (run_as).
    #[serde(default)]
    pub share_gid: Option<u32>,
}

fn default_grace() -> u64 {
    DEFAULT_KILL_GRACE_MS
}

/// runner.json could not be used.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// It could not be read from its descriptor.
    #[error("read runner.json from fd {fd}: {source}")]
    Read {
        /// The descriptor the daemon handed over.
        fd: RawFd,
        /// The underlying error.
        source: std::io::Error,
    },
    /// It is not a valid spec.
    #[error("parse runner.json: {0}")]
    Parse(#[from] serde_json::Error),
    /// It names no program.
    #[error("runner.json: argv is empty")]
    EmptyArgv,
}

/// The largest runner.json read (the daemon writes a few tens of KiB).
const MAX_SPEC_BYTES: u64 = 16 << 20;

impl RunnerSpec {
    /// Reads and checks runner.json from `fd`, which the daemon opened on
    /// it and handed over; takes ownership of `fd` and closes it.
    pub fn read_fd(fd: RawFd) -> Result<Self, SpecError> {
        use std::io::Read;
        // SAFETY: the daemon handed this descriptor to this process alone;
        // nothing else in the runner owns it.
        let file = unsafe { std::fs::File::from_raw_fd(fd) };
        let mut bytes = Vec::new();
        file.take(MAX_SPEC_BYTES)
            .read_to_end(&mut bytes)
            .map_err(|source| SpecError::Read { fd, source })?;
        Self::parse(&bytes)
    }

    /// Parses and checks runner.json's bytes.
    pub fn parse(bytes: &[u8]) -> Result<Self, SpecError> {
        let spec: RunnerSpec = serde_json::from_slice(bytes)?;
        if spec.argv.is_empty() {
            return Err(SpecError::EmptyArgv);
        }
        Ok(spec)
    }
}
