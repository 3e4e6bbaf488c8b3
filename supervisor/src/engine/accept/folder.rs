//! The run folder: the record as accepted, the run's uid lease, and the
//! draft recorded and published while its runner may start behind its
//! gate. May use the engine's state, errors, draft and launch, the record,
//! the store, the run's data, the gateway's setup, uids, timefmt, protocol
//! and policy.

use super::place::RunPlace;
use super::plan::Plan;
use crate::engine::draft::RunDraft;
use crate::engine::error::EngineError;
use crate::engine::launch::{start_runner, Launched, RunnerFiles};
use crate::engine::state::Inner;
use crate::ids::SessionId;
use crate::protocol::SpawnParams;
use crate::run::driver::DriverRun;
use crate::run::record::{Phase, RunRecord, RECORD_FORMAT};
use crate::store::Op;
use crate::uids::UidLease;
use std::os::fd::AsFd;
use std::path::Path;

/// The record of a run just accepted.
pub(super) fn accepted_record(
    p: &SpawnParams,
    plan: &Plan,
    place: RunPlace,
    git: policy::workctx::GitSnapshot,
    max_attempts: u32,
    uid: Option<u32>,
    driver_run: DriverRun,
) -> Result<RunRecord, EngineError> {
    // Checked by validate already; the record holds it as a checked id.
    let session_id =
        SessionId::parse(&p.session.id).map_err(|e| EngineError::invalid("session.id", e))?;
    Ok(RunRecord {
        format: RECORD_FORMAT,
        run_id: place.id.clone(),
        session_id,
        audience: p.session.audience,
        project_dir: p.session.project_dir.clone(),
        task: p.task.clone(),
        context: p.context.clone(),
        command: plan.command.clone(),
        env: p.env.clone(),
        limits: plan.limits,
        keep_temp: p.keep_temp,
        reason: None,
        cancel_requested: false,
        // The time in its id, which lists' since/until bound.
        created_at_ms: place.id.created_ms(),
        temp_dir: place.temp_dir,
        run_dir: place.files.dir,
        log_truncated: false,
        sandbox: p.sandbox.clone(),
        agent: plan.agent.as_ref().map(|a| a.definition.name.clone()),
        tools: plan.tools.clone(),
        rights: Some(plan.grants),
        git: Some(git),
        worktree: place.worktree,
        max_attempts,
        uid,
        on_behalf: None,
        network: Some(plan.network),
        network_allow: plan.network_allow.clone(),
        notes: plan.notes.clone(),
        driver_run: Some(driver_run),
        backend: None,
        phase: Phase::Accepted,
    })
}

/// A uid of its own for the run (root daemons without `run_as`).
pub(super) fn lease_uid(inner: &Inner) -> Result<Option<UidLease>, EngineError> {
    let Some(pool) = &inner.uids else {
        return Ok(None);
    };
    pool.lease().map(Some).map_err(|e| EngineError::Sandbox {
        mechanism: "per_run_uid",
        why: e.into(),
    })
}

/// Whether the run may write in its work dir: the project with the write
/// right (a worktree is the project), or a write path inside it.
pub(super) fn writes_into(plan: &Plan, p: &SpawnParams, workdir: &Path) -> bool {
    plan.grants.write_project || p.sandbox.write_paths.iter().any(|w| w.starts_with(workdir))
}

/// The files a runner started at once gets, its `spec` among them; `None`
/// (the run is then queued as usual) when they cannot be opened.
pub(super) fn handed_files(draft: &RunDraft, spec: &[u8]) -> Option<RunnerFiles> {
    RunnerFiles::open(&draft.staged(), spec)
        .map_err(
            |e| tracing::warn!(run_id = %draft.id(), "starting the runner: {e}; the run is queued"),
        )
        .ok()
}

/// Whether a recorded run's folder got its run id.
enum Placed {
    Yes,
    /// Recorded, but the rename failed: the draft is kept for recovery.
    No(EngineError),
}

/// Makes the draft's entries durable, commits `accept` and only then
/// renames the folder to its run id: a row never names a folder that a
/// crash could leave half made, and a crash between the two leaves a
/// draft that recovery puts in place. Blocking.
fn record(inner: &Inner, draft: &mut RunDraft, accept: Op) -> Result<Placed, EngineError> {
    draft.sync()?;
    inner.store.commit_blocking(vec![accept])?;
    match draft.publish() {
        Ok(()) => Ok(Placed::Yes),
        Err(e) => {
            draft.keep();
            Ok(Placed::No(e))
        }
    }
}

/// Calls off a gated runner whose run could not be recorded; returns why.
fn called_off(id: &crate::ids::RunId, runner: Option<Launched>, e: EngineError) -> EngineError {
    if let Some(r) = runner {
        let how = r.call_off();
        tracing::warn!(run_id = %id, "recording the run failed ({e}); its runner was called off and {how}");
    }
    e
}

/// Records the run (see [`record`]) while, on another thread, a runner is
/// started with `handed` behind its gate; then opens the gate. The runner
/// holds the uid lease from then on. When recording fails, the runner is
/// called off before the draft is undone. With `egress`, the runner gets a
/// channel to the proxy.
pub(super) fn publish(
    inner: &Inner,
    mut draft: RunDraft,
    accept: Op,
    handed: Option<RunnerFiles>,
    egress: bool,
    gateway: Option<crate::gateway::Setup>,
) -> Result<(Option<UidLease>, Option<Launched>), EngineError> {
    // A runner started at once holds its own copy of the uid lease; without
    // one it is not started here, so a uid is never in use unleased.
    let uid_lock = match draft.lease().map(|l| l.lock().try_clone_to_owned()) {
        Some(Ok(fd)) => Some(fd),
        Some(Err(_)) => return publish(inner, draft, accept, None, egress, gateway),
        None => None,
    };
    let id = draft.id().clone();
    let (published, runner) = std::thread::scope(|s| {
        let start = handed.as_ref().map(|h| {
            s.spawn(|| {
                start_runner(
                    &inner.cfg.runner,
                    h,
                    uid_lock.as_ref().map(|f| f.as_fd()),
                    true,
                    egress,
                    gateway.clone(),
                )
            })
        });
        let published = record(inner, &mut draft, accept);
        let runner = match start.map(|t| t.join()) {
            Some(Ok(Ok(l))) => Some(l),
            Some(Ok(Err(e))) => {
                tracing::warn!(run_id = %id, "starting the runner: {e}; the run is queued");
                None
            }
            _ => None,
        };
        (published, runner)
    });
    let published = match published {
        Ok(p) => p,
        Err(e) => return Err(called_off(&id, runner, e)),
    };
    let lease = draft.take_lease();
    let runner = match (published, runner) {
        (Placed::No(e), r) => {
            // Recorded, but its folder is still a draft: not started now.
            // It is queued and fails for want of its folder; the next start
            // puts the folder in place and finishes it.
            tracing::error!(run_id = %id, "putting the run folder in place: {e}");
            if let Some(r) = r {
                let how = r.call_off();
                tracing::warn!(run_id = %id, "its runner was called off and {how}");
            }
            None
        }
        (Placed::Yes, r) => r,
    };
    match runner {
        Some(mut r) => {
            r.open_gate();
            drop(lease);
            Ok((None, Some(r)))
        }
        None => Ok((lease, None)),
    }
}
