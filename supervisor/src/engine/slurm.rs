//! Runs placed as Slurm jobs (`[backend] kind = "slurm"`). The run folder
//! is made as for a local run, under the shared dir; when the run gets a
//! slot its spec is written there (runner.spec) and its job submitted
//! (sbatch), and the job's id is committed before the run counts as
//! started (for a run that starts at once, before its spawn is answered).
//! From then on the run follows what the poll ([`super::jobs`]) says of
//! its job: pending (Slurm's reason becomes the run's), running, or ended
//! (the runner's exit.json, else Slurm's own end of the job). A cancel is
//! `scancel`. After a restart each live job is watched again by its id; a
//! run whose job was submitted but whose id was not committed is found by
//! its job's name, the run id, so no run is ever submitted twice.

use super::error::EngineError;
use super::finish;
use super::jobs::Seen;
use super::state::{Inner, Slot};
use crate::run::placement::Placement;
use crate::run::record::{EndState, RunRecord, RunState};
use policy::backend::{BackendKind, JobEnd, JobPhase};
use std::sync::Arc;
use tokio::sync::OwnedSemaphorePermit;

/// Polls in a row that must miss a job before it counts as gone.
const ABSENT_POLLS: u32 = 2;

/// A run's job could not be submitted.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// The uid that asked for the run no longer holds a right it needs.
    #[error("the run's requester: {0}")]
    Rights(#[from] crate::rights::RightsError),
    /// The run's spec could not be read from the store.
    #[error("reading the runner spec from state.db: {0}")]
    SpecRead(#[source] crate::store::StoreError),
    /// The store holds no spec for the run.
    #[error("state.db holds no runner spec for the run")]
    NoSpec,
    /// runner.spec could not be written into the run folder.
    #[error("writing the runner spec for the job: {0}")]
    WriteSpec(#[from] subagent_runner::atomic::AtomicError),
    /// sbatch failed.
    #[error(transparent)]
    Slurm(#[from] crate::slurm::SlurmError),
    /// The blocking task writing the spec ended without an answer.
    #[error("writing the runner spec: {0}")]
    Task(#[source] tokio::task::JoinError),
}

/// The Slurm job of a run placed there, once submitted.
pub(crate) fn job_of(rec: &RunRecord) -> Option<u64> {
    rec.backend.and_then(|b| b.slurm_job())
}

/// Whether `rec` is a run of the Slurm backend.
pub(crate) fn is_slurm(rec: &RunRecord) -> bool {
    rec.backend.is_some_and(|b| b.kind == BackendKind::Slurm)
}

/// Submits a queued run's job, then follows it; holds `permit` until the
/// run has ended.
pub(crate) async fn run_lifecycle(
    inner: Arc<Inner>,
    slot: Arc<Slot>,
    permit: OwnedSemaphorePermit,
) {
    if let Some(job) = submit(&inner, &slot).await {
        follow(inner, slot, job, Some(permit)).await;
    }
}

/// Submits the run's job now and returns once its id is committed (or the
/// run has failed); follows the job in a task of its own.
pub(crate) async fn start_now(inner: &Arc<Inner>, slot: Arc<Slot>, permit: OwnedSemaphorePermit) {
    if let Some(job) = submit(inner, &slot).await {
        tokio::spawn(follow(inner.clone(), slot, job, Some(permit)));
    }
}

/// Writes the run's spec into its folder, submits its job and commits the
/// job's id. A failure ends the run `failed`, saying why.
async fn submit(inner: &Arc<Inner>, slot: &Arc<Slot>) -> Option<u64> {
    let mut rec = slot.rec.lock().await;
    if rec.state() != RunState::Accepted {
        return None;
    }
    match submit_job(inner, slot, &rec).await {
        Ok(job) => {
            let mut next = rec.clone();
            next.backend = Some(Placement {
                kind: BackendKind::Slurm,
                job_id: Some(job),
            });
            next.reason = Some(policy::backend::pending_reason(job, "submitted", ""));
            if let Err(e) = inner.persist(slot, &mut rec, next).await {
                // The job goes on; a restart finds it again by its name.
                tracing::error!(run_id = %rec.run_id, job, "recording the run's Slurm job: {e}");
            }
            tracing::info!(run_id = %rec.run_id, job, "run submitted to Slurm");
            Some(job)
        }
        Err(e) => {
            let why = format!("could not submit the Slurm job: {e}");
            tracing::error!(run_id = %rec.run_id, "{why}");
            let mut next = rec.clone();
            next.ended(EndState::Failed, why, crate::timefmt::now_ms());
            if let Err(e) = inner.persist(slot, &mut rec, next).await {
                tracing::error!("{e}");
            }
            let id = rec.run_id.clone();
            drop(rec);
            finish::finalize(inner, slot).await;
            drop(inner.take_lease(&id));
            None
        }
    }
}

/// Writes runner.spec and runs sbatch; the job's id.
async fn submit_job(inner: &Arc<Inner>, slot: &Slot, rec: &RunRecord) -> Result<u64, SubmitError> {
    let jobs = inner.jobs.clone();
    let on_behalf = rec.on_behalf.clone();
    let (store, id, kept) = (inner.store.clone(), rec.run_id.clone(), slot.take_spec());
    let path = rec.files().dir.join(subagent_runner::jobdir::SPEC_FILE);
    let write = move || -> Result<(), SubmitError> {
        // Queued since its spawn, or since a restart: what its requester
        // may reach can have changed meanwhile.
        if let Some(ob) = &on_behalf {
            crate::rights::check(&ob.requester, &ob.needs)?;
        }
        let spec = match kept {
            Some(s) => s,
            None => store
                .spec(&id)
                .map_err(SubmitError::SpecRead)?
                .ok_or(SubmitError::NoSpec)?,
        };
        Ok(subagent_runner::atomic::write_atomic(&path, &spec)?)
    };
    tokio::task::spawn_blocking(write)
        .await
        .map_err(SubmitError::Task)??;
    let runner = jobs
        .settings
        .runner
        .clone()
        .unwrap_or_else(|| inner.cfg.runner.clone());
    let job = policy::backend::job(
        &jobs.settings,
        &policy::backend::JobInputs {
            run_id: rec.run_id.as_str(),
            run_dir: &rec.run_dir,
            runner: &runner,
            wall_time_s: rec.limits.wall_time_s(),
            memory_mb: rec
                .limits
                .memory_mb
                .unwrap_or(policy::sandbox::DEFAULT_MEMORY_MB),
            disk_mb: rec.limits.disk_bytes() >> 20,
        },
    );
    Ok(jobs.slurm.submit(&job).await?)
}

/// Follows job `job` of the run to its end, then finishes the run and lets
/// its uid and `permit` go.
pub(crate) async fn follow(
    inner: Arc<Inner>,
    slot: Arc<Slot>,
    job: u64,
    permit: Option<OwnedSemaphorePermit>,
) {
    let jobs = inner.jobs.clone();
    let mut rx = jobs.watch(job);
    loop {
        let seen = rx.borrow_and_update().clone();
        if let Some((end, reason)) = observe(&inner, &slot, job, seen).await {
            finish::finish_job(&inner, &slot, end, reason).await;
            break;
        }
        if rx.changed().await.is_err() {
            // The engine is gone; the next start watches the job again.
            return;
        }
    }
    jobs.unwatch(job);
    let id = slot.snapshot().run_id;
    drop(inner.take_lease(&id));
    drop(permit);
}

/// Acts on one word of the poll's on the run's job; the job's end and its
/// reason once it is over.
async fn observe(
    inner: &Arc<Inner>,
    slot: &Arc<Slot>,
    job: u64,
    seen: Seen,
) -> Option<(JobEnd, String)> {
    match seen {
        Seen::NotYet => None,
        Seen::Absent(n) if n < ABSENT_POLLS => None,
        Seen::Absent(_) => Some((
            JobEnd::Lost,
            format!("its Slurm job {job} is no longer known to Slurm"),
        )),
        Seen::Listed(info) => match policy::backend::phase(&info.state) {
            JobPhase::Pending => {
                let why = policy::backend::pending_reason(job, &info.reason, &info.description);
                note(inner, slot, |r| {
                    (r.state() == RunState::Accepted && r.reason.as_deref() != Some(&why))
                        .then(|| r.reason = Some(why.clone()))
                        .is_some()
                })
                .await;
                None
            }
            JobPhase::Running => {
                let at = match info.start_time {
                    0 => crate::timefmt::now_ms(),
                    s => s.saturating_mul(1000),
                };
                let started = note(inner, slot, |r| {
                    let now = r.state() == RunState::Accepted;
                    if now {
                        r.reason = None;
                        // The runner runs on a node: no pid of this host.
                        r.started(0, 0, at);
                    }
                    now
                })
                .await;
                if started {
                    inner.metrics.started();
                }
                None
            }
            JobPhase::Ended(end) => {
                let requested = slot.snapshot().cancel_requested;
                Some((end, end_reason(job, &info, end, requested)))
            }
        },
    }
}

/// Changes the run's record by `change` (which says whether it changed
/// anything) and commits it; whether it did.
async fn note(
    inner: &Arc<Inner>,
    slot: &Arc<Slot>,
    change: impl FnOnce(&mut RunRecord) -> bool,
) -> bool {
    let mut rec = slot.rec.lock().await;
    let mut next = rec.clone();
    if !change(&mut next) {
        return false;
    }
    match inner.persist(slot, &mut rec, next).await {
        Ok(()) => true,
        Err(e) => {
            tracing::error!(run_id = %rec.run_id, "recording its Slurm job's state: {e}");
            false
        }
    }
}

/// Why a run ended, in Slurm's terms, for when its runner's exit.json
/// does not say (or says only that it was stopped).
fn end_reason(job: u64, info: &crate::slurm::JobInfo, end: JobEnd, requested: bool) -> String {
    let slurm_reason = match info.reason.as_str() {
        "" | "None" => String::new(),
        r => format!(", reason {r}"),
    };
    match end {
        JobEnd::Cancelled if requested => format!("cancelled: its Slurm job {job} was cancelled"),
        JobEnd::Cancelled => format!(
            "its Slurm job {job} was cancelled outside subagentd ({}{slurm_reason})",
            info.state
        ),
        JobEnd::TimedOut => format!(
            "its Slurm job {job} reached its time limit ({}{slurm_reason})",
            info.state
        ),
        JobEnd::Lost | JobEnd::OutOfMemory => {
            policy::backend::end_without_record(job, &info.state, &info.reason, info.exit_status)
        }
    }
}

/// Cancels a Slurm run that has a job: the cancel recorded, then scancel
/// (Slurm signals the runner, which stops the run and writes exit.json).
/// The run ends when the poll sees its job end.
pub(crate) async fn cancel(
    inner: &Arc<Inner>,
    slot: &Arc<Slot>,
    job: u64,
) -> Result<(), EngineError> {
    {
        let mut rec = slot.rec.lock().await;
        if rec.state().is_terminal() || rec.cancel_requested {
            return Ok(());
        }
        let mut next = rec.clone();
        next.cancel_requested = true;
        inner.persist(slot, &mut rec, next).await?;
    }
    match inner.jobs.slurm.cancel(job).await {
        Ok(()) => tracing::info!(job, "cancel requested: scancel"),
        Err(e) => tracing::warn!(job, "cancel: {e}"),
    }
    Ok(())
}

/// What a restart found of a Slurm run.
pub(crate) enum Resumed {
    /// Its job is watched again.
    Watched,
    /// It was never submitted: it waits for a slot as any queued run.
    NotSubmitted,
    /// It cannot go on: it ended, saying why.
    Ended,
}

/// Picks up a Slurm run after a restart: its job watched again (found by
/// its name when its id was never committed), with the run's uid and a
/// slot when one is free.
pub(crate) async fn resume(inner: &Arc<Inner>, slot: &Arc<Slot>, rec: &RunRecord) -> Resumed {
    let job = match job_of(rec) {
        Some(job) => job,
        None => match find_submitted(inner, rec).await {
            Ok(Some(job)) => {
                note(inner, slot, |r| {
                    r.backend = Some(Placement {
                        kind: BackendKind::Slurm,
                        job_id: Some(job),
                    });
                    true
                })
                .await;
                job
            }
            Ok(None) => return Resumed::NotSubmitted,
            Err(why) => {
                let why = format!("could not be resumed after a restart: {why}");
                finish::finish_job(inner, slot, JobEnd::Lost, why).await;
                return Resumed::Ended;
            }
        },
    };
    if let (Some(pool), Some(uid)) = (&inner.uids, rec.uid) {
        match pool.relock(uid) {
            Ok(lease) => inner.hold_lease(&rec.run_id, lease),
            Err(e) => tracing::warn!(run_id = %rec.run_id, job, "its uid: {e}"),
        }
    }
    let permit = inner.slots.clone().try_acquire_owned().ok();
    tokio::spawn(follow(inner.clone(), slot.clone(), job, permit));
    Resumed::Watched
}

/// The job of a run that may have been submitted without its id being
/// committed (its runner.spec was written): Slurm's job of its name.
async fn find_submitted(inner: &Arc<Inner>, rec: &RunRecord) -> Result<Option<u64>, String> {
    let spec = rec.files().dir.join(subagent_runner::jobdir::SPEC_FILE);
    let written = tokio::task::spawn_blocking(move || spec.symlink_metadata().is_ok())
        .await
        .unwrap_or(true);
    if !written {
        return Ok(None);
    }
    let listed = inner.jobs.slurm.jobs().await.map_err(|e| e.to_string())?;
    let mine = listed
        .values()
        .filter(|j| j.name == rec.run_id.as_str())
        .map(|j| j.job_id)
        .max();
    match mine {
        Some(job) => Ok(Some(job)),
        // Submitted and gone, or never submitted: exit.json or a runner's
        // pid in runner.lock tells a job that ran from one that did not.
        None if started(rec).await => {
            Err("its Slurm job ran and is no longer known to Slurm".into())
        }
        None => Ok(None),
    }
}

/// Whether a runner ever started for the run (its exit.json, or its pid
/// in runner.lock).
async fn started(rec: &RunRecord) -> bool {
    let files = rec.files();
    tokio::task::spawn_blocking(move || {
        files.exit().exists() || crate::lockfile::runner_pid_in_lock(&files.runner_lock()).is_some()
    })
    .await
    .unwrap_or(true)
}
