//! At a run's end, its agent's event stream: read from child.log,
//! applied to the record (an agent's own error fails the run), and the
//! files it reported checked on disk and merged. May use the engine's
//! state, the finish's delta, the record, the run's data and policy.

use crate::engine::state::Inner;
use crate::run::driver::ReportedFiles;
use crate::run::record::{EndState, RunRecord, RunState};
use policy::agentstream::AgentReport;

/// The most of child.log read for the event stream (its end).
pub const MAX_STREAM_BYTES: u64 = 32 << 20;

/// The agent's event stream, read from child.log (the runner wrote it
/// with what the child printed: read without following a link, as a
/// regular file, at most its last [`MAX_STREAM_BYTES`]). Blocking.
pub(crate) fn read_report(rec: &RunRecord) -> Option<AgentReport> {
    let run = rec.driver_run.as_ref()?;
    if !run.driver.streams() {
        return None;
    }
    let bytes = subagent_runner::safefile::read_tail(&rec.files().log(), MAX_STREAM_BYTES)
        .unwrap_or_default();
    Some(policy::agentstream::parse(run.driver, &bytes))
}

/// Records the agent's report; a run whose agent reports an error (or
/// only failed writes) is `failed` with that reason, even when it exited
/// 0.
pub(crate) fn apply_report(rec: &mut RunRecord, report: Option<AgentReport>) {
    let (Some(_), Some(report)) = (rec.driver_run.as_ref(), report) else {
        return;
    };
    // An agent's own error says more than its exit code.
    let by_exit = rec.state() == RunState::Failed && rec.exit_code().is_some();
    if rec.state() == RunState::Succeeded || by_exit {
        if let Some(why) = report.failure() {
            rec.reason = Some(match (by_exit, rec.reason.take()) {
                (true, Some(code)) => format!("{why} ({code})"),
                _ => why,
            });
            rec.end_as(EndState::Failed);
        }
    }
    if let Some(run) = rec.driver_run.as_mut() {
        run.report = Some(report);
    }
}

/// Whether the run failed only because every write its agent tried failed:
/// it exited 0 and reported no error of its own.
pub(crate) fn failed_only_by_writes(rec: &RunRecord) -> bool {
    let Some(report) = rec.driver_run.as_ref().and_then(|d| d.report.as_ref()) else {
        return false;
    };
    rec.state() == RunState::Failed
        && rec.exit_code() == Some(0)
        && rec.signal().is_none()
        && !report.is_error
        && report.writes_failed > 0
        && report.writes_ok == 0
}

/// Makes a run [`failed_only_by_writes`] whose project the supervisor saw
/// change `succeeded`: the agent wrote its files another way.
pub(crate) fn rescue(rec: &mut RunRecord) {
    rec.end_as(EndState::Succeeded);
    let why = rec.reason.take().unwrap_or_default();
    rec.notes.push(format!(
        "{why}, yet the supervisor saw the project change (the agent wrote another way): the run succeeded"
    ));
}

/// Checks the files the agent reported written or edited (inside the
/// project, a regular file, changed during the run) and merges those that
/// hold into the session's recent files, for a run that succeeded.
/// Blocking.
pub(crate) fn merge_reported(inner: &Inner, rec: &RunRecord) -> Option<ReportedFiles> {
    let report = rec.driver_run.as_ref()?.report.as_ref()?;
    let note = |why: String| ReportedFiles {
        note: Some(why),
        ..Default::default()
    };
    if let Some(why) = not_merged(rec) {
        return Some(note(why));
    }
    let claimed = report.changed();
    if claimed.is_empty() {
        return Some(note("the agent reported no file written or edited".into()));
    }
    // The stream lists them oldest first; recent files want the newest.
    Some(super::delta::judge_and_merge(
        inner,
        rec,
        claimed.iter().rev().cloned(),
    ))
}

/// Why a run's reported files are not merged at all: it did not succeed,
/// or it could not write its project (a claim then names another's
/// change).
fn not_merged(rec: &RunRecord) -> Option<String> {
    if rec.state() != RunState::Succeeded {
        return Some(format!("nothing merged: the run {}", rec.state().as_str()));
    }
    let writes = rec.driver_run.as_ref().and_then(|d| d.writes_project);
    (writes == Some(false)).then(|| "not merged: the run could not write its project".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::driver::{Delivery, DriverRun};
    use policy::driver::Driver;

    fn rec(state: RunState, exit: Option<i32>) -> RunRecord {
        let mut r: RunRecord = serde_json::from_value(serde_json::json!({
            "format": 1, "run_id": "20261130T055552.123456Z-a1b2c3d4", "session_id": "s",
            "audience": "team", "project_dir": "/", "task": "t", "context": null,
            "command": ["x"], "env": {}, "limits": {}, "keep_temp": false,
            "state": state, "exit_code": exit, "signal": null, "reason": "exited with code 1",
            "cancel_requested": false, "created_at_ms": 1, "started_at_ms": 2,
            "ended_at_ms": 3, "temp_dir": "/tmp/x", "run_dir": "/state/r",
            "runner_pid": null, "runner_start_ticks": null, "log_truncated": false,
            "finalized": false, "finalize_error": null
        }))
        .unwrap();
        r.driver_run = Some(DriverRun {
            driver: Driver::ClaudeCode,
            delivered: Delivery::default(),
            report: None,
            reported_files: None,
            writes_project: None,
            budget: None,
        });
        r
    }

    #[test]
    fn the_agents_own_error_fails_a_run_and_never_rescues_one() {
        let error = AgentReport {
            is_error: true,
            error: Some("API Error: 400".into()),
            ..Default::default()
        };
        let mut ok = rec(RunState::Succeeded, Some(0));
        apply_report(&mut ok, Some(error.clone()));
        assert_eq!(ok.state(), RunState::Failed);
        assert_eq!(
            ok.reason.as_deref(),
            Some("the agent reported an error: \"API Error: 400\"")
        );
        let mut exited = rec(RunState::Failed, Some(1));
        apply_report(&mut exited, Some(error.clone()));
        assert_eq!(
            exited.reason.as_deref(),
            Some("the agent reported an error: \"API Error: 400\" (exited with code 1)")
        );
        let mut cancelled = rec(RunState::Cancelled, None);
        apply_report(&mut cancelled, Some(error));
        assert_eq!(cancelled.state(), RunState::Cancelled);
        let mut failed = rec(RunState::Failed, Some(1));
        apply_report(&mut failed, Some(AgentReport::default()));
        assert_eq!(
            failed.state(),
            RunState::Failed,
            "a clean report never makes a run succeed"
        );
        assert!(failed.driver_run.unwrap().report.is_some());
    }

    #[test]
    fn reported_files_merge_only_for_a_run_that_could_write() {
        let mut r = rec(RunState::Succeeded, Some(0));
        assert_eq!(not_merged(&r), None, "an older record merges as before");
        if let Some(d) = r.driver_run.as_mut() {
            d.writes_project = Some(false);
        }
        assert_eq!(
            not_merged(&r).as_deref(),
            Some("not merged: the run could not write its project")
        );
        if let Some(d) = r.driver_run.as_mut() {
            d.writes_project = Some(true);
        }
        assert_eq!(not_merged(&r), None);
        r.end_as(crate::run::record::EndState::Failed);
        assert_eq!(
            not_merged(&r).as_deref(),
            Some("nothing merged: the run failed")
        );
    }

    #[test]
    fn only_a_run_failed_by_its_writes_alone_can_be_rescued() {
        let writes = AgentReport {
            writes_failed: 2,
            ..Default::default()
        };
        let mut r = rec(RunState::Succeeded, Some(0));
        apply_report(&mut r, Some(writes.clone()));
        assert!(failed_only_by_writes(&r));
        rescue(&mut r);
        assert_eq!(r.state(), RunState::Succeeded);
        assert_eq!(r.reason, None);
        assert!(r.notes[0].starts_with("every write the agent tried failed"));
        let mut exited = rec(RunState::Failed, Some(1));
        apply_report(&mut exited, Some(writes));
        assert!(!failed_only_by_writes(&exited), "its exit code failed it");
        let mut error = rec(RunState::Succeeded, Some(0));
        let report = AgentReport {
            is_error: true,
            writes_failed: 1,
            ..Default::default()
        };
        apply_report(&mut error, Some(report));
        assert!(!failed_only_by_writes(&error));
    }
}
