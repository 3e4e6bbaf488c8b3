//! A run's states: the lifecycle's names and the ends a run can come to.
//! A leaf: uses nothing of the crate.

use serde::{Deserialize, Serialize};

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

/// How a run ended: the terminal states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EndState {
    /// The agent exited with code 0.
    Succeeded,
    /// A non-zero exit, a signal we did not send, or a start failure.
    Failed,
    /// Cancelled on request.
    Cancelled,
    /// Its wall time passed; the whole tree was killed.
    TimedOut,
    /// The supervisor can no longer know the outcome.
    Lost,
}

impl EndState {
    /// The end `state` names; None for `accepted` and `running`.
    pub fn of(state: RunState) -> Option<EndState> {
        match state {
            RunState::Accepted | RunState::Running => None,
            RunState::Succeeded => Some(EndState::Succeeded),
            RunState::Failed => Some(EndState::Failed),
            RunState::Cancelled => Some(EndState::Cancelled),
            RunState::TimedOut => Some(EndState::TimedOut),
            RunState::Lost => Some(EndState::Lost),
        }
    }
}

impl From<EndState> for RunState {
    fn from(e: EndState) -> RunState {
        match e {
            EndState::Succeeded => RunState::Succeeded,
            EndState::Failed => RunState::Failed,
            EndState::Cancelled => RunState::Cancelled,
            EndState::TimedOut => RunState::TimedOut,
            EndState::Lost => RunState::Lost,
        }
    }
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
