//! A run's end reduced to one of a few fixed reason classes, for the
//! `reason` label: the reason itself holds exit codes, paths and the
//! agent's own words, which a label must never carry. The classes follow
//! what the runner's exit.json and the engine write: the end state first,
//! then the record's facts (resources, isolation, the agent's report),
//! then the engine's own fixed reasons, which use the prefixes below.

use crate::run::record::{EndState, RunRecord};

/// The engine's reason for a run whose runner could not be started.
pub const START_FAILED: &str = "could not start the runner";
/// The engine's reason for a queued run that could not be started again
/// after a daemon restart.
pub const RESTART_FAILED: &str = "could not be started after a restart";
/// How the runner's reason begins when it could not set up the sandbox
/// and so never started the agent.
const SANDBOX: &str = "sandbox:";

/// Why a run ended, as a label value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReasonClass {
    /// The agent exited by itself with its own code (0 for a run that
    /// succeeded).
    ExitCode,
    /// A signal the runner did not send ended the agent (or its init).
    Signal,
    /// The wall time passed (`timed_out`).
    WallTime,
    /// The memory limit: the OOM killer ended a process of the run.
    Memory,
    /// The process limit refused forks, and the agent failed.
    Pids,
    /// Cancelled on request, before or after it started.
    Cancelled,
    /// The runner died without an exit.json (`lost`).
    RunnerLost,
    /// Its runner could not be started (`could not start the runner`).
    StartFailed,
    /// Queued at a restart and could not be started again.
    RestartFailed,
    /// The runner could not set up the sandbox; the agent never started.
    Sandbox,
    /// The agent's program could not be executed (exit 126 or 127 from
    /// the runner, before exec).
    ExecFailed,
    /// A driver's agent reported an error of its own.
    AgentError,
    /// A driver's agent tried only writes, and every one failed.
    WritesFailed,
    /// None of the above (a record without the facts to tell).
    Other,
}

impl ReasonClass {
    /// Every class, in the documented order.
    pub const ALL: [ReasonClass; 14] = [
        ReasonClass::ExitCode,
        ReasonClass::Signal,
        ReasonClass::WallTime,
        ReasonClass::Memory,
        ReasonClass::Pids,
        ReasonClass::Cancelled,
        ReasonClass::RunnerLost,
        ReasonClass::StartFailed,
        ReasonClass::RestartFailed,
        ReasonClass::Sandbox,
        ReasonClass::ExecFailed,
        ReasonClass::AgentError,
        ReasonClass::WritesFailed,
        ReasonClass::Other,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ReasonClass::ExitCode => "exit_code",
            ReasonClass::Signal => "signal",
            ReasonClass::WallTime => "wall_time",
            ReasonClass::Memory => "memory",
            ReasonClass::Pids => "pids",
            ReasonClass::Cancelled => "cancelled",
            ReasonClass::RunnerLost => "runner_lost",
            ReasonClass::StartFailed => "start_failed",
            ReasonClass::RestartFailed => "restart_failed",
            ReasonClass::Sandbox => "sandbox",
            ReasonClass::ExecFailed => "exec_failed",
            ReasonClass::AgentError => "agent_error",
            ReasonClass::WritesFailed => "writes_failed",
            ReasonClass::Other => "other",
        }
    }
}

/// The class of an ended run's reason; [`ReasonClass::Other`] for a run
/// that has not ended.
pub fn classify(rec: &RunRecord) -> ReasonClass {
    let Some(end) = rec.end() else {
        return ReasonClass::Other;
    };
    match end.state {
        EndState::Cancelled => ReasonClass::Cancelled,
        EndState::TimedOut => ReasonClass::WallTime,
        EndState::Lost => ReasonClass::RunnerLost,
        EndState::Succeeded => ReasonClass::ExitCode,
        EndState::Failed => failed(rec),
    }
}

/// The class of a failed run, most specific first.
fn failed(rec: &RunRecord) -> ReasonClass {
    let reason = rec.reason.as_deref().unwrap_or("");
    if reason.starts_with(START_FAILED) {
        return ReasonClass::StartFailed;
    }
    if reason.starts_with(RESTART_FAILED) {
        return ReasonClass::RestartFailed;
    }
    // The agent's own verdict is put first in the reason when it failed
    // the run (engine/finish/report.rs).
    let report = rec.driver_run.as_ref().and_then(|d| d.report.as_ref());
    if let Some(r) = report {
        if r.failure().is_some_and(|why| reason.starts_with(&why)) {
            return match r.is_error {
                true => ReasonClass::AgentError,
                false => ReasonClass::WritesFailed,
            };
        }
    }
    let Some(end) = rec.end() else {
        return ReasonClass::Other;
    };
    let failed_exit = end.exit_code != Some(0);
    if let Some(res) = &end.resources {
        if res.oom_killed && failed_exit {
            return ReasonClass::Memory;
        }
        let refused = res.pids_refused.unwrap_or(0) > 0 || res.pids_limit_reached;
        if refused && end.exit_code.is_some() && failed_exit {
            return ReasonClass::Pids;
        }
    }
    // The runner reports what the sandbox enforced only for an agent it
    // started.
    if end.isolation.is_none() && end.signal.is_none() && end.resources.is_some() {
        return match reason.starts_with(SANDBOX) {
            true => ReasonClass::Sandbox,
            false => ReasonClass::ExecFailed,
        };
    }
    match (end.signal, end.exit_code) {
        (Some(_), _) => ReasonClass::Signal,
        (None, Some(_)) => ReasonClass::ExitCode,
        (None, None) => ReasonClass::Other,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::engine::finish::apply_exit;
    use crate::engine::pidfd::RunnerExit;
    use subagent_runner::exit_record::{ExitRecord, Outcome, Resources};

    fn running() -> RunRecord {
        serde_json::from_value(serde_json::json!({
            "format": 1, "run_id": "20261130T055552.123456Z-a1b2c3d4", "session_id": "s",
            "audience": "team", "project_dir": "/", "task": "t", "context": null,
            "command": ["x"], "env": {}, "limits": {}, "keep_temp": false,
            "state": "running", "exit_code": null, "signal": null, "reason": null,
            "cancel_requested": false, "created_at_ms": 1, "started_at_ms": 2,
            "ended_at_ms": null, "temp_dir": "/tmp/x", "run_dir": "/state/r",
            "runner_pid": 10, "runner_start_ticks": 5, "log_truncated": false,
            "finalized": false, "finalize_error": null
        }))
        .unwrap()
    }

    fn exit(outcome: Outcome, code: Option<i32>, signal: Option<i32>, why: &str) -> ExitRecord {
        ExitRecord {
            outcome,
            exit_code: code,
            signal,
            reason: why.into(),
            child_pid: 3,
            started_at_ms: 5,
            ended_at_ms: 9,
            log_bytes: 0,
            log_truncated: false,
            log_error: None,
            leftover_killed: 0,
            isolation: Some(Default::default()),
            resources: Resources::default(),
            attempts: 1,
            kept: None,
            setup_us: Default::default(),
            exec_at_us: None,
        }
    }

    fn ended_by(x: ExitRecord) -> RunRecord {
        let mut r = running();
        apply_exit(&mut r, Ok(Some(x)), RunnerExit::Exited(0), "");
        r
    }

    #[test]
    fn the_runners_ends_have_their_classes() {
        let mut oom = exit(
            Outcome::Signaled,
            None,
            Some(9),
            "memory limit (64 MiB) exceeded",
        );
        oom.resources.oom_killed = true;
        let mut pids = exit(Outcome::Exited, Some(1), None, "exited with code 1; …");
        pids.resources.pids_refused = Some(3);
        let mut no_sandbox = exit(Outcome::SpawnFailed, None, None, "sandbox: x; not started");
        no_sandbox.isolation = None;
        let mut no_exec = exit(Outcome::SpawnFailed, Some(127), None, "not found");
        no_exec.isolation = None;
        let cases = [
            (
                exit(Outcome::Exited, Some(0), None, "exited with code 0"),
                "exit_code",
            ),
            (
                exit(Outcome::Exited, Some(3), None, "exited with code 3"),
                "exit_code",
            ),
            (
                exit(Outcome::Exited, Some(127), None, "exited with code 127"),
                "exit_code",
            ),
            (
                exit(Outcome::Signaled, None, Some(11), "killed by signal 11"),
                "signal",
            ),
            (
                exit(Outcome::TimedOut, None, Some(9), "wall time limit"),
                "wall_time",
            ),
            (
                exit(Outcome::Cancelled, None, Some(15), "cancelled on request"),
                "cancelled",
            ),
            (oom, "memory"),
            (pids, "pids"),
            (no_sandbox, "sandbox"),
            (no_exec, "exec_failed"),
        ];
        for (x, want) in cases {
            let why = x.reason.clone();
            assert_eq!(classify(&ended_by(x)).as_str(), want, "{why}");
        }
    }

    #[test]
    fn the_engines_own_ends_have_their_classes() {
        let mut lost = running();
        apply_exit(&mut lost, Ok(None), RunnerExit::Killed(9), "");
        assert_eq!(classify(&lost), ReasonClass::RunnerLost);
        let now = 10;
        let cases = [
            (
                EndState::Cancelled,
                "cancelled before it started".to_owned(),
                "cancelled",
            ),
            (
                EndState::Failed,
                format!("{START_FAILED}: no key"),
                "start_failed",
            ),
            (
                EndState::Failed,
                format!("{RESTART_FAILED}: gone"),
                "restart_failed",
            ),
        ];
        for (state, why, want) in cases {
            let mut r = running();
            r.ended(state, why.clone(), now);
            assert_eq!(classify(&r).as_str(), want, "{why}");
        }
        assert_eq!(classify(&running()), ReasonClass::Other, "not ended");
    }

    #[test]
    fn an_agents_own_failure_is_its_class_whatever_its_exit() {
        use crate::run::driver::{Delivery, DriverRun};
        use policy::agentstream::AgentReport;
        let error = AgentReport {
            is_error: true,
            error: Some("API Error: 400 /home/u/secret".into()),
            ..Default::default()
        };
        let writes = AgentReport {
            writes_failed: 2,
            ..Default::default()
        };
        for (report, code, want) in [
            (error.clone(), 0, ReasonClass::AgentError),
            (error, 1, ReasonClass::AgentError),
            (writes, 0, ReasonClass::WritesFailed),
        ] {
            let mut r = ended_by(exit(Outcome::Exited, Some(code), None, "exited"));
            let why = report.failure().unwrap();
            r.reason = Some(format!("{why} (exited with code {code})"));
            r.end_as(EndState::Failed);
            r.driver_run = Some(DriverRun {
                driver: policy::driver::Driver::ClaudeCode,
                delivered: Delivery::default(),
                report: Some(report),
                reported_files: None,
                writes_project: None,
                budget: None,
            });
            assert_eq!(classify(&r), want);
        }
    }

    #[test]
    fn class_names_are_distinct_label_values() {
        let mut names: Vec<&str> = ReasonClass::ALL.iter().map(|c| c.as_str()).collect();
        assert!(names
            .iter()
            .all(|n| n.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')));
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ReasonClass::ALL.len());
    }
}
