//! run.json: the durable record of one run, rewritten atomically on every
//! state change.

use crate::ids::RunId;
use crate::timefmt::rfc3339_ms;
use policy::{Audience, Limits};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The version of run.json this code writes.
pub const RECORD_FORMAT: u32 = 1;

/// The largest attempt.json read (it holds one number).
const ATTEMPT_MAX_BYTES: u64 = 4096;

/// A run's lifecycle: `accepted` → `running` → one terminal state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Durably recorded, waiting for a slot.
    Accepted,
    /// Its runner is alive.
    Running,
    /// The agent exited with code 0.
    Succeeded,
    /// A non-zero exit, a signal we did not send, or a start failure.
    Failed,
    /// Cancelled on request.
    Cancelled,
    /// Its wall time passed; the whole tree was killed.
    TimedOut,
    /// The supervisor can no longer know the outcome; `reason` says why.
    Lost,
}

impl RunState {
    /// Whether the run has ended.
    pub fn is_terminal(self) -> bool {
        !matches!(self, RunState::Accepted | RunState::Running)
    }

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Accepted => "accepted",
            RunState::Running => "running",
            RunState::Succeeded => "succeeded",
            RunState::Failed => "failed",
            RunState::Cancelled => "cancelled",
            RunState::TimedOut => "timed_out",
            RunState::Lost => "lost",
        }
    }

    /// Parses a wire name.
    pub fn parse(s: &str) -> Option<RunState> {
        serde_json::from_value(serde_json::Value::String(s.to_owned())).ok()
    }

    /// The exit code `subagent wait` and `subagent run` use for this state.
    pub fn cli_exit_code(self, exit_code: Option<i32>, signal: Option<i32>) -> i32 {
        match self {
            RunState::Succeeded => 0,
            RunState::Failed => match (exit_code, signal) {
                (Some(c), _) if c != 0 => c,
                (_, Some(s)) => 128 + s,
                _ => 1,
            },
            RunState::TimedOut => 124,
            RunState::Cancelled => 130,
            RunState::Lost => 125,
            RunState::Accepted | RunState::Running => 125,
        }
    }
}

/// Everything known about a run; the body of run.json.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// run.json's format version.
    pub format: u32,
    pub run_id: RunIdText,
    /// The parent's session.
    pub session_id: String,
    /// The parent's audience.
    pub audience: Audience,
    /// The child's working directory.
    pub project_dir: PathBuf,
    pub task: String,
    pub context: Option<String>,
    /// The agent program's argv.
    pub command: Vec<String>,
    /// The request's extra environment.
    pub env: BTreeMap<String, String>,
    /// The requested limits.
    pub limits: Limits,
    /// Keep temp_dir after the run.
    pub keep_temp: bool,
    pub state: RunState,
    /// The exit code, when the agent exited.
    pub exit_code: Option<i32>,
    /// The signal that ended the agent, when one did.
    pub signal: Option<i32>,
    /// Why the run is in its state.
    pub reason: Option<String>,
    /// A cancel was asked for.
    pub cancel_requested: bool,
    /// When the run was accepted (ms since the epoch).
    pub created_at_ms: u64,
    /// When the agent started.
    pub started_at_ms: Option<u64>,
    /// When the run ended.
    pub ended_at_ms: Option<u64>,
    /// The child's temp dir (removed at the end unless `keep_temp`).
    pub temp_dir: PathBuf,
    pub run_dir: PathBuf,
    /// The runner's pid while it lives.
    pub runner_pid: Option<i32>,
    /// The runner's start time in clock ticks, to tell pid reuse apart.
    pub runner_start_ticks: Option<u64>,
    /// child.log was cut at the output cap.
    pub log_truncated: bool,
    /// The run's end has been fully handled: result.md written, notice
    /// stored, temp_dir removed. Done exactly once.
    pub finalized: bool,
    /// Why finalizing failed, when it did; retried at the next start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finalize_error: Option<String>,
    /// The sandbox switches asked for.
    #[serde(default)]
    pub sandbox: policy::sandbox::SandboxRequest,
    /// What the sandbox enforced (from exit.json, once the run ended).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<subagent_runner::sandbox::report::IsolationReport>,
    /// What the run used (from exit.json).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<subagent_runner::exit_record::Resources>,
    /// The subagent definition run, by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// The child's tools (None: no tool policy was given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    /// The OS rights the run got (a record may lack them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rights: Option<policy::sandbox::Grants>,
    /// The git snapshot taken at spawn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git: Option<policy::workctx::GitSnapshot>,
    /// The child's worktree, with `isolation: worktree`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worktree: Option<crate::engine::workctx::Worktree>,
    /// What became of the child's delta; set exactly once, when the run
    /// ended (merged only when it succeeded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta: Option<crate::engine::workctx::DeltaReport>,
    /// What the supervisor saw the run change in its project; set with
    /// `delta`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed: Option<policy::observed::ObservedReport>,
    /// Attempts allowed (1 + max_restarts).
    #[serde(default = "one")]
    pub max_attempts: u32,
    /// Attempts made, once the run has ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
    /// What was kept of the run's scratch file system, and what not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept: Option<subagent_runner::exit_record::Kept>,
    /// The uid (and gid) the run's child runs as, leased for it (root
    /// daemons).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// Asked for by a uid other than the daemon's: who, and the rights it
    /// must hold, checked again before a runner starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_behalf: Option<policy::rights::OnBehalf>,
    /// How the run reaches the network (a record may lack it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<policy::sandbox::network::NetworkMode>,
    /// Its allowlist, in allowlist mode.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub network_allow: Vec<String>,
    /// What its egress.log holds, once the run has ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<crate::egress::log::EgressSummary>,
    /// What the spawn said about its definition (a project one over the
    /// user's, a network_allow ignored).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// Its driver, how its context was delivered, and what the agent's
    /// event stream reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_run: Option<crate::engine::driving::DriverRun>,
}

fn one() -> u32 {
    1
}

impl RunRecord {
    /// Whether waiters may stop waiting: the run ended and its end was
    /// handled (or handling it failed and says why).
    pub fn settled(&self) -> bool {
        self.state.is_terminal() && (self.finalized || self.finalize_error.is_some())
    }
}

/// A run id as stored (validated when loaded).
pub type RunIdText = String;

/// run.json could not be used.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// Reading or writing failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// The step (`read`).
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// The atomic write failed.
    #[error(transparent)]
    Atomic(#[from] subagent_runner::atomic::AtomicError),
    /// The file is corrupt or truncated.
    #[error("parse {path}: {source}")]
    Parse {
        path: PathBuf,
        source: serde_json::Error,
    },
    /// The record names a malformed run id.
    #[error("{0}: malformed run id")]
    BadId(PathBuf),
}

impl RunRecord {
    /// The run's id; None when `run_id` is malformed (never in a record
    /// [`RunRecord::load`] returned).
    pub fn id(&self) -> Option<RunId> {
        RunId::parse(&self.run_id)
    }

    /// The run folder's files.
    pub fn files(&self) -> crate::paths::RunFiles {
        crate::paths::RunFiles {
            dir: self.run_dir.clone(),
        }
    }

    /// Writes run.json atomically (temp file, fsync, rename, fsync folder).
    pub fn save(&self) -> Result<(), RecordError> {
        subagent_runner::atomic::write_atomic(&self.files().record(), &self.to_bytes())?;
        Ok(())
    }

    /// run.json's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = serde_json::to_vec_pretty(self).unwrap_or_default();
        bytes.push(b'\n');
        bytes
    }

    /// Reads a run.json.
    pub fn load(path: &Path) -> Result<RunRecord, RecordError> {
        let bytes = std::fs::read(path).map_err(|source| RecordError::Io {
            op: "read",
            path: path.to_path_buf(),
            source,
        })?;
        let rec: RunRecord =
            serde_json::from_slice(&bytes).map_err(|source| RecordError::Parse {
                path: path.to_path_buf(),
                source,
            })?;
        if rec.id().is_none() {
            return Err(RecordError::BadId(path.to_path_buf()));
        }
        Ok(rec)
    }

    /// The status object the protocol returns for this run.
    pub fn status(&self) -> RunStatus {
        let files = self.files();
        RunStatus {
            run_id: self.run_id.clone(),
            session_id: self.session_id.clone(),
            state: self.state,
            exit_code: self.exit_code,
            signal: self.signal,
            reason: self.reason.clone(),
            created_at: rfc3339_ms(self.created_at_ms),
            started_at: self.started_at_ms.map(rfc3339_ms),
            ended_at: self.ended_at_ms.map(rfc3339_ms),
            temp_dir: self.temp_dir.clone(),
            artifact_dir: files.artifacts(),
            log_path: files.log(),
            result_path: files.result(),
            project_dir: self.project_dir.clone(),
            command: self.command.clone(),
            cancel_requested: self.cancel_requested,
            log_truncated: self.log_truncated,
            finalize_error: self.finalize_error.clone(),
            isolation: self.isolation.clone(),
            resources: self.resources.clone(),
            kept: self.kept.clone(),
            agent: self.agent.clone(),
            tools: self.tools.clone(),
            rights: self.rights,
            git: self.git.clone(),
            worktree_dir: self.worktree.as_ref().map(|w| w.dir.clone()),
            worktree_branch: self.worktree.as_ref().map(|w| w.branch.clone()),
            delta: self.delta.clone(),
            observed: self.observed.clone(),
            attempt: self.attempts.or_else(|| {
                if self.state != RunState::Running {
                    return None;
                }
                // A running run's attempt, as its runner records it from
                // the second attempt on (no file: the first); a regular
                // file, no link, bounded.
                let path = self.run_dir.join("attempt.json");
                match subagent_runner::safefile::read(&path, ATTEMPT_MAX_BYTES) {
                    Ok(b) => serde_json::from_slice::<serde_json::Value>(&b).ok()?["attempt"]
                        .as_u64()
                        .map(|a| a as u32),
                    Err(e) if e.is_missing() => Some(1),
                    Err(_) => None,
                }
            }),
            max_attempts: self.max_attempts,
            network: self.network,
            network_allow: self.network_allow.clone(),
            egress: self.egress.clone().or_else(|| {
                // A running run's counts so far, from its log.
                let listed = self.network == Some(policy::sandbox::network::NetworkMode::Allowlist);
                (listed && self.state == RunState::Running)
                    .then(|| crate::egress::log::summarize(&files.egress_log()))
                    .flatten()
            }),
            notes: self.notes.clone(),
            driver: self.driver_run.clone(),
        }
    }
}

/// A run's status as check_agent_run, wait_agent_run and list_agent_runs
/// return it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunStatus {
    pub run_id: String,
    /// The parent's session.
    pub session_id: String,
    pub state: RunState,
    /// The agent's exit code, when it exited.
    pub exit_code: Option<i32>,
    /// The signal that ended the agent, when one did.
    pub signal: Option<i32>,
    /// Why the run is in its state.
    pub reason: Option<String>,
    /// When it was accepted (RFC 3339 UTC).
    pub created_at: String,
    /// When the agent started.
    pub started_at: Option<String>,
    /// When the run ended.
    pub ended_at: Option<String>,
    /// The child's temp dir (removed at the end unless kept).
    pub temp_dir: PathBuf,
    /// The child's artifact dir.
    pub artifact_dir: PathBuf,
    /// child.log.
    pub log_path: PathBuf,
    /// result.md (exists once the run has ended).
    pub result_path: PathBuf,
    /// The child's working directory.
    pub project_dir: PathBuf,
    /// The agent program's argv.
    pub command: Vec<String>,
    /// A cancel was asked for.
    pub cancel_requested: bool,
    /// child.log was cut at the output cap.
    pub log_truncated: bool,
    /// Present only when writing result.md or the notice failed (the run
    /// ended; the supervisor retries at its next start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finalize_error: Option<String>,
    /// What the sandbox enforced, once the run has ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<subagent_runner::sandbox::report::IsolationReport>,
    /// CPU time, peak memory and OOM kills, once the run has ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<subagent_runner::exit_record::Resources>,
    /// What was kept of the run's scratch file system, and what was left
    /// out, once the run has ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept: Option<subagent_runner::exit_record::Kept>,
    /// The subagent definition run, when one was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// The child's tools; null when the parent gave no tool list.
    #[serde(default)]
    pub tools: Option<Vec<String>>,
    /// The OS rights the run got (from its tools and switches); null when
    /// its record has none.
    #[serde(default)]
    pub rights: Option<policy::sandbox::Grants>,
    /// The git snapshot taken at spawn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git: Option<policy::workctx::GitSnapshot>,
    /// The child's worktree, with `isolation: worktree`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worktree_dir: Option<PathBuf>,
    /// The worktree's branch: `subagent/<run_id>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worktree_branch: Option<String>,
    /// The delta's accepted and rejected paths, once the run has ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta: Option<crate::engine::workctx::DeltaReport>,
    /// What the supervisor saw the run change, once it has ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed: Option<policy::observed::ObservedReport>,
    /// The attempt in progress (or the last one made): restarts after
    /// exit 75 count; null before the run starts.
    #[serde(default)]
    pub attempt: Option<u32>,
    /// Attempts allowed (1 + max_restarts).
    #[serde(default)]
    pub max_attempts: u32,
    /// How the run reaches the network: `none`, `allowlist` or `full`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<policy::sandbox::network::NetworkMode>,
    /// Its allowlist, in allowlist mode.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub network_allow: Vec<String>,
    /// Its egress so far (allowlist mode): counts, refused hosts, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<crate::egress::log::EgressSummary>,
    /// What the spawn said about its definition.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// The driver, how the context was delivered, and (once the run has
    /// ended) what the agent's event stream reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<crate::engine::driving::DriverRun>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_exit_codes() {
        assert_eq!(RunState::Succeeded.cli_exit_code(Some(0), None), 0);
        assert_eq!(RunState::Failed.cli_exit_code(Some(3), None), 3);
        assert_eq!(RunState::Failed.cli_exit_code(None, Some(9)), 137);
        assert_eq!(RunState::TimedOut.cli_exit_code(None, Some(9)), 124);
        assert_eq!(RunState::Cancelled.cli_exit_code(None, None), 130);
        assert_eq!(RunState::Lost.cli_exit_code(None, None), 125);
    }

    #[test]
    fn state_names_round_trip() {
        for s in [
            RunState::Accepted,
            RunState::Running,
            RunState::Succeeded,
            RunState::Failed,
            RunState::Cancelled,
            RunState::TimedOut,
            RunState::Lost,
        ] {
            assert_eq!(RunState::parse(s.as_str()), Some(s));
        }
        assert_eq!(RunState::parse("done"), None);
    }
}
