//! A run's phase and the data that belongs to it: a queued run has
//! nothing of its own, a running one its runner and start time, an ended
//! one how it ended and what the end produced. Uses the run's states and
//! the types those fields hold.

use super::state::{EndState, RunState};

/// Where a run is in its lifecycle, with that phase's data.
#[derive(Debug, Clone, PartialEq)]
pub enum Phase {
    /// Durably recorded, waiting for a slot.
    Accepted,
    /// Its runner is alive.
    Running(Started),
    /// It ended (boxed: the end's reports are large).
    Ended(Box<Ended>),
}

impl Phase {
    /// The state this phase is in.
    pub fn state(&self) -> RunState {
        match self {
            Phase::Accepted => RunState::Accepted,
            Phase::Running(_) => RunState::Running,
            Phase::Ended(e) => e.state.into(),
        }
    }
}

/// The process that runs (or ran) a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Runner {
    /// The runner's pid.
    pub pid: i32,
    /// Its start time in clock ticks, to tell pid reuse apart (unknown for
    /// a runner adopted from its lock).
    pub start_ticks: Option<u64>,
}

/// A running run's data.
#[derive(Debug, Clone, PartialEq)]
pub struct Started {
    /// When the agent started (ms since the epoch).
    pub at_ms: u64,
    /// Its runner.
    pub runner: Runner,
}

/// An ended run's data: how it ended, then what its end produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Ended {
    /// Its terminal state.
    pub state: EndState,
    /// The exit code, when the agent exited.
    pub exit_code: Option<i32>,
    /// The signal that ended the agent, when one did.
    pub signal: Option<i32>,
    /// When the agent started, when it did.
    pub started_at_ms: Option<u64>,
    /// When the run ended (ms since the epoch).
    pub at_ms: u64,
    /// The runner it had, when it had one.
    pub runner: Option<Runner>,
    /// What the sandbox enforced (from exit.json).
    pub isolation: Option<subagent_runner::sandbox::report::IsolationReport>,
    /// What the run used (from exit.json).
    pub resources: Option<subagent_runner::exit_record::Resources>,
    /// What was kept of the run's scratch file system, and what not.
    pub kept: Option<subagent_runner::exit_record::Kept>,
    /// Attempts made.
    pub attempts: Option<u32>,
    /// What its egress.log holds.
    pub egress: Option<crate::run::egress::EgressSummary>,
    /// What became of the child's delta; set exactly once, at finalizing
    /// (merged only when it succeeded).
    pub delta: Option<crate::run::delta::DeltaReport>,
    /// What the supervisor saw the run change in its project; set with
    /// `delta`.
    pub observed: Option<policy::observed::ObservedReport>,
    /// The end has been fully handled: result.md written, notice stored,
    /// temp_dir removed. Done exactly once.
    pub finalized: bool,
    /// Why finalizing failed, when it did; retried at the next start.
    pub finalize_error: Option<String>,
}

impl Ended {
    /// An end with nothing from an exit.json (cancelled before it started,
    /// never started, lost).
    pub fn bare(
        state: EndState,
        started_at_ms: Option<u64>,
        at_ms: u64,
        runner: Option<Runner>,
    ) -> Ended {
        Ended {
            state,
            exit_code: None,
            signal: None,
            started_at_ms,
            at_ms,
            runner,
            isolation: None,
            resources: None,
            kept: None,
            attempts: None,
            egress: None,
            delta: None,
            observed: None,
            finalized: false,
            finalize_error: None,
        }
    }
}
