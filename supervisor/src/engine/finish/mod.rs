//! Finishing a run, exactly once: the terminal state from exit.json (or
//! `lost` when there is none), then result.md and the temp dir's removal,
//! and finally one commit of the end: `finalized` and its notice pending
//! together; then the folder is [`tidy`]ed. Each step is idempotent, so a crash part-way is finished
//! again on restart without doubling anything.
//!
//! The end's halves of a run's data live beside: `delta` (the child's
//! delta, judged and merged), `observed` (what the supervisor saw
//! change), `report` (the agent's event stream and the files it
//! reported). May use the engine's state, lockfile and pidfd, the record,
//! result_md, the store, egress's summary, securedir and the run's data;
//! never recover or launch.

mod delta;
mod observed;
mod report;
mod tidy;

pub(super) use tidy::{dir_bytes, tidy_older};

use super::pidfd::RunnerExit;
use super::state::{Inner, Slot};
use crate::protocol::Notice;
use crate::run::record::{EndState, RunRecord, RunState};
use crate::store::Op;
use crate::timefmt::{now_ms, rfc3339_ms};
use std::sync::Arc;
use subagent_runner::exit_record::{ExitRecord, ExitRecordError, Outcome};

/// A step of finishing a run failed.
#[derive(Debug, thiserror::Error)]
pub enum FinishError {
    /// exit.json could not be read.
    #[error(transparent)]
    ExitJson(#[from] ExitRecordError),
    /// The blocking task reading it ended without an answer.
    #[error(transparent)]
    Task(#[from] tokio::task::JoinError),
    /// result.md could not be written.
    #[error(transparent)]
    ResultMd(#[from] subagent_runner::atomic::AtomicError),
}

/// Applies how the run ended to its record. `exit` is exit.json (or the
/// error reading it); `runner` says how the runner itself ended, and
/// `runner_log` is the end of its stderr, both for the `lost` reason.
pub fn apply_exit(
    rec: &mut RunRecord,
    exit: Result<Option<ExitRecord>, FinishError>,
    runner: RunnerExit,
    runner_log: &str,
) {
    match exit {
        Ok(Some(x)) => {
            let egress = (rec.network == Some(policy::sandbox::network::NetworkMode::Allowlist))
                .then(|| {
                    crate::egress::log::summarize(&rec.files().egress_log()).unwrap_or_default()
                });
            let mut reason = x.reason.clone();
            if let Some(e) = &x.log_error {
                reason.push_str(&format!("; {e}"));
            }
            let state = match x.outcome {
                Outcome::Exited if x.exit_code == Some(0) => EndState::Succeeded,
                Outcome::Exited | Outcome::Signaled | Outcome::SpawnFailed => EndState::Failed,
                Outcome::TimedOut => EndState::TimedOut,
                Outcome::Cancelled => EndState::Cancelled,
            };
            rec.exited(&x, state, reason, egress);
        }
        other => {
            let why = match other {
                Err(e) => format!("its exit.json is unreadable ({e})"),
                _ => "left no exit.json".to_owned(),
            };
            let mut reason = format!("the runner {runner} and {why}");
            let last = runner_log.trim().lines().last().unwrap_or("").trim();
            if !last.is_empty() {
                reason.push_str(&format!("; runner.log: {last}"));
            }
            rec.ended(EndState::Lost, reason, now_ms());
        }
    }
}

/// Kills and removes the cgroups of a run whose runner died; returns
/// whether any process was left in them. Blocking.
fn reap_orphans(plan: &policy::sandbox::cgroup::CgroupPlan, run_id: &str) -> bool {
    use subagent_runner::sandbox::cgroup::RunCgroups;
    let cg = RunCgroups::existing(plan, run_id);
    let had = cg.populated();
    for _ in 0..200 {
        if !cg.populated() {
            break;
        }
        if !cg.kill_all() {
            cg.kill_listed();
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    cg.remove();
    had
}

fn runner_log_tail(rec: &RunRecord) -> String {
    let (text, _) = crate::result_md::read_log_tail(&rec.files().runner_log());
    text
}

/// The runner has exited (`runner` says how, when we reaped it):
/// works out the terminal state, then finalizes. The terminal state is
/// committed once, with `finalized` (or a merged delta, or a
/// `finalize_error`), not first on its own: a crash before that commit
/// leaves the run `running` with a dead runner, and the next start
/// finishes it again from exit.json; result.md is rewritten and the notice
/// is made pending only by the commit that finalizes.
pub(crate) async fn finish_run(inner: &Arc<Inner>, slot: &Arc<Slot>, runner: RunnerExit) {
    // The runner is gone: its connections end, and egress.log is whole
    // before it is summed up.
    slot.stop_egress().await;
    slot.stop_gateway().await;
    // An adopted runner is not our child: how it exited is not known, but
    // one called off at its gate took its pid out of runner.lock.
    let called_off = matches!(runner, RunnerExit::Unknown)
        || runner == RunnerExit::Exited(i32::from(subagent_runner::gate::CALLED_OFF));
    if called_off
        && slot
            .adopted
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        && requeue_called_off(inner, slot).await
    {
        return;
    }
    settle(inner, slot, Gone::Runner(runner)).await;
}

/// A run's Slurm job has ended (`end`, and `reason` in Slurm's words for
/// when its runner left no exit.json): as [`finish_run`].
pub(crate) async fn finish_job(
    inner: &Arc<Inner>,
    slot: &Arc<Slot>,
    end: policy::backend::JobEnd,
    reason: String,
) {
    // The job's connections end, and egress.log is whole before it is
    // summed up.
    slot.stop_egress().await;
    slot.stop_gateway().await;
    settle(inner, slot, Gone::Job { end, reason }).await;
}

/// How the daemon learned that a run's runner is gone.
enum Gone {
    /// Its own runner's pidfd, or an adopted runner found gone.
    Runner(RunnerExit),
    /// Slurm's state of the run's job.
    Job {
        end: policy::backend::JobEnd,
        reason: String,
    },
}

/// The terminal state from exit.json, or from how the runner went when
/// it left none, then finalizes.
async fn settle(inner: &Arc<Inner>, slot: &Arc<Slot>, gone: Gone) {
    let mut rec = slot.rec.lock().await;
    if !rec.state().is_terminal() {
        let mut next = rec.clone();
        let exit_path = next.files().exit();
        // A job's node wrote exit.json: another host's file, which a
        // shared file system may show a moment late.
        let patience = match gone {
            Gone::Job { .. } => EXIT_JSON_PATIENCE,
            Gone::Runner(_) => 0,
        };
        let (exit, log, report) = {
            let r = next.clone();
            let load = move || {
                let report = report::read_report(&r);
                (load_exit(&exit_path, patience), runner_log_tail(&r), report)
            };
            match tokio::task::spawn_blocking(load).await {
                Ok((exit, log, report)) => (exit.map_err(FinishError::from), log, report),
                Err(e) => (Err(FinishError::Task(e)), String::new(), None),
            }
        };
        if let Ok(Some(x)) = &exit {
            inner.metrics.runner_exited(&next.run_id, x);
        }
        let no_record = !matches!(exit, Ok(Some(_)));
        match gone {
            Gone::Runner(runner) => {
                apply_exit(&mut next, exit, runner, &log);
                if no_record {
                    end_orphans(inner, &mut next).await;
                }
            }
            // Slurm ends what a job left when the job ends.
            Gone::Job { end, reason } => apply_job_exit(&mut next, exit, end, reason, &log),
        }
        report::apply_report(&mut next, report);
        tracing::info!(
            run_id = %next.run_id,
            state = next.state().as_str(),
            reason = next.reason.as_deref().unwrap_or(""),
            "run ended"
        );
        // Not published either: nobody sees a run as ended before its
        // result.md and notice exist.
        *rec = next;
    }
    drop(rec);
    finalize(inner, slot).await;
}

/// Re-reads of a missing exit.json written on another host.
const EXIT_JSON_PATIENCE: u32 = 5;

/// exit.json at `path`; when it is missing, read again `patience` times,
/// half a second apart, its folder listed first (on NFS a listing
/// revalidates the folder's cached entries). Blocking.
fn load_exit(path: &std::path::Path, patience: u32) -> Result<Option<ExitRecord>, ExitRecordError> {
    let mut exit = ExitRecord::load(path);
    for _ in 0..patience {
        if !matches!(exit, Ok(None)) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
        if let Some(dir) = path.parent() {
            let _ = std::fs::read_dir(dir).map(|d| d.count());
        }
        exit = ExitRecord::load(path);
    }
    exit
}

/// The runner died without cleaning up: whatever the child started is
/// still in the run's cgroups. Ends it, and says so in the reason.
async fn end_orphans(inner: &Arc<Inner>, next: &mut RunRecord) {
    let plan = inner.probe.cgroups.clone();
    let run_id = next.run_id.to_string();
    let killed = tokio::task::spawn_blocking(move || reap_orphans(&plan, &run_id))
        .await
        .unwrap_or(false);
    if killed {
        if let Some(r) = next.reason.as_mut() {
            r.push_str("; the processes it left were killed");
        }
    }
}

/// Applies how a Slurm run ended: its exit.json when the runner wrote
/// one; else Slurm's end of its job (`end`, with `reason`).
pub fn apply_job_exit(
    rec: &mut RunRecord,
    exit: Result<Option<ExitRecord>, FinishError>,
    end: policy::backend::JobEnd,
    reason: String,
    runner_log: &str,
) {
    use policy::backend::JobEnd;
    if let Ok(Some(_)) = &exit {
        let requested = rec.cancel_requested;
        apply_exit(rec, exit, RunnerExit::Unknown, runner_log);
        // Slurm's signal reads to the runner as a cancel (or comes after
        // its own wall time): say whose the end was.
        let state = rec.state();
        let slurms = match end {
            JobEnd::TimedOut => matches!(state, RunState::Cancelled | RunState::TimedOut),
            JobEnd::Cancelled => state == RunState::Cancelled && !requested,
            JobEnd::Lost | JobEnd::OutOfMemory => false,
        };
        if slurms {
            if end == JobEnd::TimedOut {
                rec.end_as(EndState::TimedOut);
            }
            let theirs = rec.reason.take().unwrap_or_default();
            rec.reason = Some(format!("{reason}; the runner: {theirs}"));
        }
        return;
    }
    let state = match end {
        JobEnd::TimedOut => EndState::TimedOut,
        JobEnd::Cancelled => EndState::Cancelled,
        JobEnd::OutOfMemory => EndState::Failed,
        JobEnd::Lost => EndState::Lost,
    };
    let mut reason = match exit {
        Err(e) => format!("{reason}; its exit.json is unreadable ({e})"),
        Ok(_) => reason,
    };
    let last = runner_log.trim().lines().last().unwrap_or("").trim();
    if !last.is_empty() {
        reason.push_str(&format!("; runner.log: {last}"));
    }
    rec.ended(state, reason, now_ms());
}

/// A runner adopted after a restart that exited at its gate started
/// nothing (the engine that was to open it is gone): its run is queued
/// again, with its uid, instead of ending `lost`. Returns whether it was.
async fn requeue_called_off(inner: &Arc<Inner>, slot: &Arc<Slot>) -> bool {
    let mut rec = slot.rec.lock().await;
    let files = rec.files();
    let started = tokio::task::spawn_blocking(move || {
        files.exit().exists() || crate::lockfile::runner_pid_in_lock(&files.runner_lock()).is_some()
    })
    .await
    .unwrap_or(true);
    let id = rec.run_id.clone();
    if rec.state().is_terminal() || rec.cancel_requested || started {
        return false;
    }
    if let (Some(pool), Some(uid)) = (&inner.uids, rec.uid) {
        match pool.relock(uid) {
            Ok(lease) => inner.hold_lease(&id, lease),
            Err(_) => return false,
        }
    }
    let mut next = rec.clone();
    next.requeued();
    if let Err(e) = inner.persist(slot, &mut rec, next).await {
        tracing::error!(run_id = %id, "queueing a run called off at its gate: {e}");
        drop(inner.take_lease(&id));
        return false;
    }
    tracing::info!(run_id = %id, "its runner was called off at its gate; queued again");
    inner.enqueue(id).is_ok()
}

/// The blocking file steps of finalizing: result.md, the temp dir.
fn finalize_files(rec: &RunRecord) -> Result<(), FinishError> {
    subagent_runner::atomic::write_atomic(
        &rec.files().result(),
        crate::result_md::render(rec).as_bytes(),
    )?;
    if !rec.keep_temp {
        remove_tree(&rec.temp_dir);
        crate::securedir::remove_empty_session_dir(&rec.temp_dir);
    }
    Ok(())
}

/// The notice of a finalized run, as the store derives it from its row.
fn notice_of(rec: &RunRecord) -> Notice {
    Notice {
        run_id: rec.run_id.to_string(),
        session_id: rec.session_id.to_string(),
        state: rec.state(),
        result_path: rec.files().result(),
        ended_at: rfc3339_ms(rec.ended_at_ms().unwrap_or_else(now_ms)),
    }
}

/// Removes a directory tree the child may have made awkward (read-only
/// subdirectories); never follows symlinks.
pub fn remove_tree(dir: &std::path::Path) {
    if std::fs::remove_dir_all(dir).is_ok() || !dir.exists() {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let _ = std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700));
        if let Ok(rd) = std::fs::read_dir(&d) {
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(e.path());
                }
            }
        }
    }
    if let Err(e) = std::fs::remove_dir_all(dir) {
        tracing::warn!(path = %dir.display(), "removing the temp dir: {e}");
    }
}

/// Writes result.md and removes the temp dir for a run in a terminal
/// state, then commits it finalized (its notice pending in that same
/// commit), tells waiters and subscribers, and lets its slot go. Does
/// nothing for a run already finalized.
pub(crate) async fn finalize(inner: &Arc<Inner>, slot: &Arc<Slot>) {
    let mut rec = slot.rec.lock().await;
    if rec.finalized() || !rec.state().is_terminal() {
        return;
    }
    // A run that never started lets its uid go here.
    drop(inner.take_lease(&rec.run_id));
    // Every file step of the end in one blocking task (one hand-off to the
    // blocking pool rather than one per step), in this order.
    let (start, inner2) = (rec.clone(), inner.clone());
    let done = tokio::task::spawn_blocking(move || finalize_blocking(&inner2, start)).await;
    let Ok(mut next) = done else {
        // Waiters are released with the reason; the next start tries again.
        let why = "the task finishing the run panicked".to_owned();
        tracing::error!(run_id = %rec.run_id, "{why}");
        rec.finalize_failed(why);
        slot.published.send_replace(rec.clone());
        return;
    };
    if let Some(e) = next.finalize_error() {
        // Left unfinalized: the next start of the engine tries again.
        // Waiters are released with the reason.
        tracing::error!(run_id = %next.run_id, "finishing the run: {e}");
    }
    commit_final(inner, &next).await;
    std::mem::swap(&mut *rec, &mut next);
    slot.published.send_replace(rec.clone());
    if rec.finalized() {
        inner.metrics.finalized(&rec);
        let _ = inner.finished.send(notice_of(&rec));
        after_finalize(inner, &rec);
    }
    inner.forget(&rec.run_id);
}

/// On a blocking thread: tidies the finalized run's folder, records its
/// size where `max_bytes` counts it, and counts the run for retention,
/// which is woken when that crossed a limit.
fn after_finalize(inner: &Arc<Inner>, rec: &RunRecord) {
    let (inner, files) = (inner.clone(), rec.files());
    let (id, session) = (rec.run_id.clone(), rec.session_id.to_string());
    drop(tokio::task::spawn_blocking(move || {
        tidy::tidy(&files);
        let limits = inner.cfg.settings.retention.limits();
        let mut bytes = 0;
        if limits.max_bytes.is_some() {
            bytes = tidy::dir_bytes(&files.dir);
            let op = Op::DirBytes { id, bytes };
            if let Err(e) = inner.store.commit_blocking(vec![op]) {
                // Unrecorded, it is measured again by the next pass.
                tracing::warn!(dir = %files.dir.display(), "recording a run folder's size: {e}");
            }
        }
        inner.retention.finalized(&session, bytes, &limits);
    }));
}

/// How long a failed commit of a run's end waits before it is tried again.
const FINALIZE_RETRY: std::time::Duration = std::time::Duration::from_secs(5);

/// Commits the end of `rec` (its notice made pending when finalized),
/// trying again until the store takes it (a full disk, say): until then
/// the run stays live and unpublished.
async fn commit_final(inner: &Inner, rec: &RunRecord) {
    loop {
        let op = Op::Finalize {
            rec: Box::new(rec.clone()),
            context: None,
        };
        match inner.store.commit(vec![op]).await {
            Ok(_) => return,
            Err(e) => {
                tracing::error!(run_id = %rec.run_id, "recording the run's end (tried again in 5 s): {e}");
                tokio::time::sleep(FINALIZE_RETRY).await;
            }
        }
    }
}

/// Records what finalizing found before it is acted on, so that no
/// restart merges it again. Blocking.
fn record_reported(inner: &Inner, rec: &RunRecord, what: &str) {
    let op = Op::Reported(Box::new(rec.clone()));
    if let Err(e) = inner.store.commit_blocking(vec![op]) {
        tracing::error!(run_id = %rec.run_id, "recording {what}: {e}");
    }
}

/// The observation and the delta report (recorded first when something
/// was merged, so that no restart merges it again), then result.md and
/// the temp dir (tried three times); returns the record with `finalized`
/// or `finalize_error`. Blocking.
fn finalize_blocking(inner: &Inner, mut rec: RunRecord) -> RunRecord {
    if rec.end().is_some_and(|e| e.delta.is_none()) {
        // Exactly once: the reports are recorded before anything else of
        // the end is done, and never computed again.
        let observed = observe_end(inner, &mut rec);
        let succeeded = rec.state() == RunState::Succeeded;
        let report = if succeeded {
            delta::merge_delta(inner, &rec)
        } else {
            crate::run::delta::DeltaReport {
                note: Some(format!("nothing merged: the run {}", rec.state().as_str())),
                ..Default::default()
            }
        };
        let merged = !report.accepted.is_empty() || !observed.merged.is_empty();
        rec.reported(report, observed);
        if merged {
            // Otherwise nothing to repeat: the report is recorded with the
            // end.
            record_reported(inner, &rec, "the delta");
        }
    }
    merge_reported_once(inner, &mut rec);
    let mut failure = None;
    for pause_ms in [0, 200, 1000] {
        std::thread::sleep(std::time::Duration::from_millis(pause_ms));
        match finalize_files(&rec) {
            Ok(()) => {
                failure = None;
                break;
            }
            Err(e) => failure = Some(e),
        }
    }
    rec.finalize_done(failure.map(|e| e.to_string()));
    rec
}

/// What the supervisor saw the run change, merged on success. A run failed
/// only by its agent's failed writes succeeds when the project changed
/// anyway (the agent recovered): both are known only here. Blocking.
fn observe_end(inner: &Inner, rec: &mut RunRecord) -> policy::observed::ObservedReport {
    let succeeded = rec.state() == RunState::Succeeded;
    let observed = observed::observe_and_merge(inner, rec, succeeded);
    let changed = !observed.created.is_empty() || !observed.modified.is_empty();
    if !(changed && report::failed_only_by_writes(rec)) {
        return observed;
    }
    report::rescue(rec);
    observed::observe_and_merge(inner, rec, true)
}

/// The files the agent's event stream reported, checked and merged once
/// (recorded before the rest of the end, as the delta is). Blocking.
fn merge_reported_once(inner: &Inner, rec: &mut RunRecord) {
    let pending = rec
        .driver_run
        .as_ref()
        .is_some_and(|d| d.report.is_some() && d.reported_files.is_none());
    if !pending {
        return;
    }
    let files = report::merge_reported(inner, rec);
    let merged = files.as_ref().is_some_and(|f| !f.accepted.is_empty());
    if let Some(d) = rec.driver_run.as_mut() {
        d.reported_files = files;
    }
    if merged {
        record_reported(inner, rec, "the reported files");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec() -> RunRecord {
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

    fn exit(outcome: Outcome, code: Option<i32>, signal: Option<i32>) -> ExitRecord {
        ExitRecord {
            outcome,
            exit_code: code,
            signal,
            reason: "r".into(),
            child_pid: 3,
            started_at_ms: 5,
            ended_at_ms: 9,
            log_bytes: 0,
            log_truncated: false,
            log_error: None,
            leftover_killed: 0,
            isolation: None,
            resources: Default::default(),
            attempts: 1,
            kept: None,
            setup_us: Default::default(),
            exec_at_us: None,
        }
    }

    #[test]
    fn a_slurm_jobs_end_decides_when_the_runner_could_not() {
        use policy::backend::JobEnd;
        let job = |x: Option<ExitRecord>, end, requested| {
            let mut r = rec();
            r.cancel_requested = requested;
            apply_job_exit(
                &mut r,
                Ok(x),
                end,
                "slurm says".into(),
                "*** JOB 7 CANCELLED ***",
            );
            (r.state(), r.reason.unwrap_or_default())
        };
        // No exit.json: Slurm's end, with runner.log's last line.
        let (st, why) = job(None, JobEnd::TimedOut, false);
        assert_eq!(st, RunState::TimedOut);
        assert_eq!(why, "slurm says; runner.log: *** JOB 7 CANCELLED ***");
        assert_eq!(job(None, JobEnd::Cancelled, true).0, RunState::Cancelled);
        assert_eq!(job(None, JobEnd::Lost, false).0, RunState::Lost);
        assert_eq!(job(None, JobEnd::OutOfMemory, false).0, RunState::Failed);
        // exit.json decides, but Slurm's signal is named as Slurm's.
        let cancelled = || Some(exit(Outcome::Cancelled, None, Some(15)));
        let (st, why) = job(cancelled(), JobEnd::TimedOut, false);
        assert_eq!(
            (st, why.as_str()),
            (RunState::TimedOut, "slurm says; the runner: r")
        );
        let (st, why) = job(cancelled(), JobEnd::Cancelled, false);
        assert_eq!(
            (st, why.as_str()),
            (RunState::Cancelled, "slurm says; the runner: r")
        );
        let (st, why) = job(cancelled(), JobEnd::Cancelled, true);
        assert_eq!((st, why.as_str()), (RunState::Cancelled, "r"));
        let ok = Some(exit(Outcome::Exited, Some(0), None));
        assert_eq!(job(ok, JobEnd::Lost, false).0, RunState::Succeeded);
    }

    #[test]
    fn outcomes_map_to_states() {
        let cases = [
            (exit(Outcome::Exited, Some(0), None), RunState::Succeeded),
            (exit(Outcome::Exited, Some(2), None), RunState::Failed),
            (exit(Outcome::Signaled, None, Some(9)), RunState::Failed),
            (
                exit(Outcome::SpawnFailed, Some(127), None),
                RunState::Failed,
            ),
            (exit(Outcome::TimedOut, None, Some(9)), RunState::TimedOut),
            (
                exit(Outcome::Cancelled, None, Some(15)),
                RunState::Cancelled,
            ),
        ];
        for (x, want) in cases {
            let mut r = rec();
            apply_exit(&mut r, Ok(Some(x.clone())), RunnerExit::Unknown, "");
            assert_eq!(r.state(), want, "{x:?}");
            assert_eq!(r.exit_code(), x.exit_code);
            assert_eq!(r.signal(), x.signal);
            assert_eq!(r.ended_at_ms(), Some(9));
            assert_eq!(r.started_at_ms(), Some(2), "the launch time is kept");
        }
    }

    #[test]
    fn no_exit_record_is_lost_with_the_reason() {
        let mut r = rec();
        apply_exit(
            &mut r,
            Ok(None),
            RunnerExit::Killed(9),
            "subagent-runner: boom\n",
        );
        assert_eq!(r.state(), RunState::Lost);
        let reason = r.reason.unwrap();
        assert_eq!(
            reason,
            "the runner was killed by signal 9 (SIGKILL) and left no exit.json; runner.log: subagent-runner: boom"
        );
    }

    #[test]
    fn lost_reasons_say_how_the_runner_ended_and_what_it_left() {
        let mut r = rec();
        apply_exit(&mut r, Ok(None), RunnerExit::Exited(2), "");
        assert_eq!(
            r.reason.as_deref(),
            Some("the runner exited with status 2 and left no exit.json")
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("exit.json");
        std::fs::write(&path, b"{").unwrap();
        let unreadable = ExitRecord::load(&path).map_err(FinishError::from);
        let mut r = rec();
        apply_exit(&mut r, unreadable, RunnerExit::Unknown, "");
        assert_eq!(r.state(), RunState::Lost);
        let reason = r.reason.unwrap();
        let want = format!(
            "the runner is gone and its exit.json is unreadable (parse {}: ",
            path.display()
        );
        assert!(reason.starts_with(&want), "{reason}");
    }
}
