//! run.json's wire form: the flat object today's and earlier daemons
//! write, kept so that every run.json on disk still loads. Uses the run's
//! id and state and the types its fields hold.

use super::state::RunState;
use crate::ids::{RunId, SessionId};
use policy::{Audience, Limits};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// run.json as it has always been written: one flat object, every
/// state's fields optional. The wire form of [`RunRecord`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordV1 {
    /// run.json's format version.
    pub format: u32,
    /// The run's id (a malformed one fails the load).
    pub run_id: RunId,
    /// The parent's session.
    pub session_id: SessionId,
    /// The parent's audience.
    pub audience: Audience,
    /// The child's working directory.
    pub project_dir: PathBuf,
    /// What the child is asked to do.
    pub task: String,
    /// What the parent added to the task.
    pub context: Option<String>,
    /// The agent program's argv.
    pub command: Vec<String>,
    /// The request's extra environment.
    pub env: BTreeMap<String, String>,
    /// The requested limits.
    pub limits: Limits,
    /// Keep temp_dir after the run.
    pub keep_temp: bool,
    /// The run's state.
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
    /// The run folder.
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
    pub worktree: Option<crate::run::worktree::Worktree>,
    /// What became of the child's delta; set exactly once, when the run
    /// ended (merged only when it succeeded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta: Option<crate::run::delta::DeltaReport>,
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
    pub egress: Option<crate::run::egress::EgressSummary>,
    /// What the spawn said about its definition (a project one over the
    /// user's, a network_allow ignored).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// Its driver, how its context was delivered, and what the agent's
    /// event stream reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_run: Option<crate::run::driver::DriverRun>,
    /// Where it was placed (none in records made before it was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<crate::run::placement::Placement>,
}

fn one() -> u32 {
    1
}
