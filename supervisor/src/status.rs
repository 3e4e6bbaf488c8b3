//! A run's status as check_agent_run, wait_agent_run and list_agent_runs
//! return it, derived from its record. Uses the record, the run folder's
//! paths and the egress log's summary; never the engine or the protocol.

use crate::run::record::{RunRecord, RunState};
use crate::timefmt::rfc3339_ms;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The largest attempt.json read (it holds one number).
const ATTEMPT_MAX_BYTES: u64 = 4096;

/// A run's status as check_agent_run, wait_agent_run and list_agent_runs
/// return it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunStatus {
    /// The run's id.
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
    pub delta: Option<crate::run::delta::DeltaReport>,
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
    pub egress: Option<crate::run::egress::EgressSummary>,
    /// What the spawn said about its definition.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// The driver, how the context was delivered, and (once the run has
    /// ended) what the agent's event stream reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<crate::run::driver::DriverRun>,
    /// Where the run was placed: `{"kind": "local"}`, or `{"kind":
    /// "slurm", "job_id": N}` once its job was submitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<crate::run::placement::Placement>,
    /// A driver run's turns, tokens and cost as its agent reported them:
    /// the final event's once the run has ended, the figures so far while
    /// it runs (the engine fills those in). Absent for a plain command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<policy::usage::Usage>,
}

impl From<&RunRecord> for RunStatus {
    fn from(rec: &RunRecord) -> RunStatus {
        let files = rec.files();
        let end = rec.end();
        RunStatus {
            run_id: rec.run_id.to_string(),
            session_id: rec.session_id.to_string(),
            state: rec.state(),
            exit_code: rec.exit_code(),
            signal: rec.signal(),
            reason: rec.reason.clone(),
            created_at: rfc3339_ms(rec.created_at_ms),
            started_at: rec.started_at_ms().map(rfc3339_ms),
            ended_at: rec.ended_at_ms().map(rfc3339_ms),
            temp_dir: rec.temp_dir.clone(),
            artifact_dir: files.artifacts(),
            log_path: files.log(),
            result_path: files.result(),
            project_dir: rec.project_dir.clone(),
            command: rec.command.clone(),
            cancel_requested: rec.cancel_requested,
            log_truncated: rec.log_truncated,
            finalize_error: end.and_then(|e| e.finalize_error.clone()),
            isolation: end.and_then(|e| e.isolation.clone()),
            resources: end.and_then(|e| e.resources.clone()),
            kept: end.and_then(|e| e.kept.clone()),
            agent: rec.agent.clone(),
            tools: rec.tools.clone(),
            rights: rec.rights,
            git: rec.git.clone(),
            worktree_dir: rec.worktree.as_ref().map(|w| w.dir.clone()),
            worktree_branch: rec.worktree.as_ref().map(|w| w.branch.clone()),
            delta: end.and_then(|e| e.delta.clone()),
            observed: end.and_then(|e| e.observed.clone()),
            attempt: match end {
                Some(e) => e.attempts,
                None => running_attempt(rec),
            },
            max_attempts: rec.max_attempts,
            network: rec.network,
            network_allow: rec.network_allow.clone(),
            egress: match end {
                Some(e) => e.egress.clone(),
                None => egress_so_far(rec),
            },
            notes: rec.notes.clone(),
            driver: rec.driver_run.clone(),
            backend: rec.backend,
            usage: reported_usage(rec),
        }
    }
}

/// A driver run's usage as its record holds it: its report's, else none
/// known yet.
fn reported_usage(rec: &RunRecord) -> Option<policy::usage::Usage> {
    let d = rec.driver_run.as_ref().filter(|d| d.driver.streams())?;
    Some(d.report.as_ref().map(|r| r.usage()).unwrap_or_default())
}

/// A running run's attempt, as its runner records it from the second
/// attempt on (no file: the first); a regular file, no link, bounded.
fn running_attempt(rec: &RunRecord) -> Option<u32> {
    if rec.state() != RunState::Running {
        return None;
    }
    let path = rec.run_dir.join("attempt.json");
    match subagent_runner::safefile::read(&path, ATTEMPT_MAX_BYTES) {
        Ok(b) => serde_json::from_slice::<serde_json::Value>(&b).ok()?["attempt"]
            .as_u64()
            .map(|a| a as u32),
        Err(e) if e.is_missing() => Some(1),
        Err(_) => None,
    }
}

/// A running run's egress counts so far, from its log.
fn egress_so_far(rec: &RunRecord) -> Option<crate::run::egress::EgressSummary> {
    let listed = rec.network == Some(policy::sandbox::network::NetworkMode::Allowlist);
    (listed && rec.state() == RunState::Running)
        .then(|| crate::egress::log::summarize(&rec.files().egress_log()))
        .flatten()
}

/// A run as `sample_agent_runs` returns it: its status, and what it looks
/// like on the host right now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampledRun {
    /// Its status, as check_agent_run returns it.
    #[serde(flatten)]
    pub status: RunStatus,
    /// Its processes' CPU time, memory and count; null unless it is
    /// running and its runner was found.
    pub sample: Option<crate::livesample::Sample>,
    /// The last line of its child.log that is not blank, escaped and
    /// bounded; null when it has written none.
    pub last_line: Option<String>,
}
