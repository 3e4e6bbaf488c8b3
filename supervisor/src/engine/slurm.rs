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
    /// The run's spec could not be read back or encoded.
    #[error("the runner spec: {0}")]
    Spec(#[from] subagent_runner::spec::SpecError),
    /// The run's spec could not be encoded.
    #[error("encoding the runner spec: {0}")]
    Encode(#[source] serde_json::Error),
    /// The run needs the job services port, and the config sets none.
    #[error("the run needs the daemon's egress proxy or model gateway, and [backend] services_listen is not set")]
    NoServices,
    /// The driver's key is not in the daemon's environment.
    #[error(transparent)]
    NoKey(#[from] super::drivers::KeyUnset),
    /// The driver's gateway could not be set up.
    #[error("the run's model gateway could not be set up (see the daemon's log)")]
    NoGateway,
    /// The blocking task writing the spec ended without an answer.
    #[error("writing the runner spec: {0}")]
    Task(#[source] tokio::task::JoinError),
}

/// The Slurm job of a run placed there, once submitted.
pub(crate) fn job_of(rec: &RunRecord) -> Option<u64> {
    rec.backend.and_then(|b| b.slurm_job())
}

/// Whether a cancel of `rec` is Slurm's to carry out: its job was
/// submitted (or may have been, and is being looked for by its name).
pub(crate) fn cancels_by_scancel(inner: &Inner, rec: &RunRecord) -> bool {
    job_of(rec).is_some() || (is_slurm(rec) && inner.jobs.watching(rec.run_id.as_str()))
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
        follow(inner, slot, Some(job), Some(permit)).await;
    }
}

/// Submits the run's job now and returns once its id is committed (or the
/// run has failed); follows the job in a task of its own.
pub(crate) async fn start_now(inner: &Arc<Inner>, slot: Arc<Slot>, permit: OwnedSemaphorePermit) {
    if let Some(job) = submit(inner, &slot).await {
        tokio::spawn(follow(inner.clone(), slot, Some(job), Some(permit)));
    }
}

/// Tries a commit this many times before a job is called off.
const COMMIT_TRIES: u32 = 3;

/// Writes the run's spec into its folder, submits its job and commits the
/// job's id. A failure ends the run `failed`, saying why, and cancels a
/// job that may have been made anyway (sbatch killed at its deadline) or
/// whose id could not be committed.
async fn submit(inner: &Arc<Inner>, slot: &Arc<Slot>) -> Option<u64> {
    let mut rec = slot.rec.lock().await;
    if rec.state() != RunState::Accepted {
        return None;
    }
    let why = match submit_job(inner, slot, &rec).await {
        Ok(job) => {
            let mut next = rec.clone();
            next.backend = Some(Placement {
                kind: BackendKind::Slurm,
                job_id: Some(job),
            });
            next.reason = Some(policy::backend::pending_reason(job, "submitted", ""));
            let mut last = None;
            for i in 0..COMMIT_TRIES {
                match inner.persist(slot, &mut rec, next.clone()).await {
                    Ok(()) => {
                        tracing::info!(run_id = %rec.run_id, job, "run submitted to Slurm");
                        return Some(job);
                    }
                    Err(e) => last = Some(e),
                }
                tokio::time::sleep(std::time::Duration::from_millis(200 << i)).await;
            }
            let e = last.map_or_else(String::new, |e| e.to_string());
            format!("its Slurm job {job} was cancelled: its id could not be recorded: {e}")
        }
        Err(e) => format!("could not submit the Slurm job: {e}"),
    };
    tracing::error!(run_id = %rec.run_id, "{why}");
    end_services(inner, slot, rec.run_id.as_str()).await;
    // Whatever sbatch made of it goes: nothing may run for a failed run.
    if let Err(e) = inner.jobs.slurm.cancel_named(rec.run_id.as_str()).await {
        tracing::warn!(run_id = %rec.run_id, "cancelling its job by name: {e}");
    }
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

/// Writes runner.spec (with the run's way to its services, when it needs
/// them) and runs sbatch; the job's id.
async fn submit_job(inner: &Arc<Inner>, slot: &Slot, rec: &RunRecord) -> Result<u64, SubmitError> {
    let jobs = inner.jobs.clone();
    let on_behalf = rec.on_behalf.clone();
    let (store, id, kept) = (inner.store.clone(), rec.run_id.clone(), slot.take_spec());
    let read = move || -> Result<Vec<u8>, SubmitError> {
        // Queued since its spawn, or since a restart: what its requester
        // may reach can have changed meanwhile.
        if let Some(ob) = &on_behalf {
            crate::rights::check(&ob.requester, &ob.needs)?;
        }
        match kept {
            Some(s) => Ok(s),
            None => store
                .spec(&id)
                .map_err(SubmitError::SpecRead)?
                .ok_or(SubmitError::NoSpec),
        }
    };
    let bytes = tokio::task::spawn_blocking(read)
        .await
        .map_err(SubmitError::Task)??;
    let mut spec = subagent_runner::spec::RunnerSpec::parse(&bytes)?;
    spec.remote_services = serve_services(inner, slot, rec, &spec)?;
    let bytes = serde_json::to_vec(&spec).map_err(SubmitError::Encode)?;
    let path = rec.files().dir.join(subagent_runner::jobdir::SPEC_FILE);
    let write = move || subagent_runner::atomic::write_atomic(&path, &bytes);
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

/// Starts the run's egress proxy and model gateway, when its sandbox uses
/// them, fed by the job services port (registered there for this run);
/// where the job's runner reaches them, with the run's token.
fn serve_services(
    inner: &Arc<Inner>,
    slot: &Slot,
    rec: &RunRecord,
    spec: &subagent_runner::spec::RunnerSpec,
) -> Result<Option<subagent_runner::spec::RemoteServices>, SubmitError> {
    use crate::runservice::Source;
    use subagent_runner::jobbridge::Service;
    let (egress, gateway) = (
        spec.sandbox.egress.is_some(),
        spec.sandbox.gateway.is_some(),
    );
    if !egress && !gateway {
        return Ok(None);
    }
    let services = inner.services.clone().ok_or(SubmitError::NoServices)?;
    let run = rec.run_id.as_str();
    if gateway {
        let driver = rec
            .driver_run
            .as_ref()
            .map(|d| d.driver)
            .unwrap_or_default();
        let setup = super::drivers::gateway_setup(&inner.cfg.settings, &inner.daemon_env, driver)?
            .ok_or(SubmitError::NoGateway)?;
        let rx = services.register(run, Service::Gateway);
        let handle = super::launch::gateway_for(rec, setup, Source::Relayed(rx))
            .ok_or(SubmitError::NoGateway)?;
        slot.set_gateway(Some(handle));
    }
    if egress {
        let rx = services.register(run, Service::Egress);
        slot.set_egress(Some(super::launch::egress_for(rec, Source::Relayed(rx))));
    }
    Ok(Some(subagent_runner::spec::RemoteServices {
        addr: services.addr.to_string(),
        token: services.token(run),
    }))
}

/// Ends the run's services at the job services port and their handles.
async fn end_services(inner: &Arc<Inner>, slot: &Slot, run: &str) {
    if let Some(s) = &inner.services {
        s.forget(run);
    }
    slot.stop_egress().await;
    slot.stop_gateway().await;
}

/// How often a run with a job checks on what no answer of Slurm's brings:
/// a cancel to send again, Slurm silent for too long.
const TICK: std::time::Duration = std::time::Duration::from_secs(15);

/// How long Slurm may give no answer, past a run's wall time and margin,
/// before the run ends `lost` (and its job is cancelled).
const SILENCE_GRACE_S: u64 = 600;

/// What following a run's job came to.
enum Followed {
    /// The run ended.
    Ended,
    /// Its job was never made: the run waits for a slot again.
    NeverSubmitted,
}

/// Follows the run's job (`job`, or the job of the run's name when its id
/// was never committed) to its end, then lets its uid and `permit` go; or,
/// when Slurm has no job of its name and none ever started, queues the run
/// again (with its uid).
pub(crate) async fn follow(
    inner: Arc<Inner>,
    slot: Arc<Slot>,
    job: Option<u64>,
    permit: Option<OwnedSemaphorePermit>,
) {
    let id = slot.snapshot().run_id;
    let jobs = inner.jobs.clone();
    let mut rx = jobs.watch(id.as_str(), job);
    let mut job = job;
    let mut scancelled: Option<std::time::Instant> = None;
    let followed = loop {
        let seen = rx.borrow_and_update().clone();
        if let Some(f) = observe(&inner, &slot, &mut job, seen, &mut scancelled).await {
            break f;
        }
        match tokio::time::timeout(TICK, rx.changed()).await {
            Ok(Ok(())) => {}
            // The engine is gone; the next start watches the job again.
            Ok(Err(_)) => return,
            Err(_) => {
                if let Some(f) = silent(&inner, &slot, job).await {
                    break f;
                }
            }
        }
    };
    jobs.unwatch(id.as_str());
    end_services(&inner, &slot, id.as_str()).await;
    match followed {
        Followed::Ended => drop(inner.take_lease(&id)),
        Followed::NeverSubmitted => {
            tracing::info!(run_id = %id, "its job was never submitted: queued again");
            if let Err(e) = inner.enqueue(id) {
                tracing::error!("{e}");
            }
        }
    }
    drop(permit);
}

/// Acts on one word of the poll's on the run's job; what following came
/// to once it is over.
async fn observe(
    inner: &Arc<Inner>,
    slot: &Arc<Slot>,
    job: &mut Option<u64>,
    seen: Seen,
    scancelled: &mut Option<std::time::Instant>,
) -> Option<Followed> {
    let info = match seen {
        Seen::NotYet => return None,
        Seen::Absent(n) if n < ABSENT_POLLS => return None,
        Seen::Absent(_) => return Some(absent(inner, slot, *job).await),
        Seen::Listed(info) => info,
    };
    if job.is_none() {
        // Found by its name: the id the last engine could not commit.
        *job = Some(info.job_id);
        inner
            .jobs
            .found(slot.snapshot().run_id.as_str(), info.job_id);
        let found = info.job_id;
        note(inner, slot, |r| {
            r.backend = Some(Placement {
                kind: BackendKind::Slurm,
                job_id: Some(found),
            });
            true
        })
        .await;
    }
    let job = info.job_id;
    let phase = policy::backend::phase(&info.state);
    if !matches!(phase, JobPhase::Ended(_)) {
        cancel_again(inner, slot, job, scancelled).await;
    }
    match phase {
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
            let why = end_reason(job, &info, end, requested);
            finish::finish_job(inner, slot, end, why).await;
            Some(Followed::Ended)
        }
    }
}

/// The run's job is not (or no longer) known to Slurm, which answered.
async fn absent(inner: &Arc<Inner>, slot: &Arc<Slot>, job: Option<u64>) -> Followed {
    let rec = slot.snapshot();
    let why = match job {
        Some(job) => format!("its Slurm job {job} is no longer known to Slurm"),
        // Submitted and gone, or never submitted: exit.json or a runner's
        // pid in runner.lock tells a job that ran from one that did not.
        None if started(&rec).await => {
            "its Slurm job ran and is no longer known to Slurm".to_owned()
        }
        None => return Followed::NeverSubmitted,
    };
    finish::finish_job(inner, slot, JobEnd::Lost, why).await;
    Followed::Ended
}

/// Sends a run's cancel to Slurm again while its job goes on: a scancel
/// that failed, or one a crash cut off, is not lost.
async fn cancel_again(
    inner: &Arc<Inner>,
    slot: &Arc<Slot>,
    job: u64,
    last: &mut Option<std::time::Instant>,
) {
    if !slot.snapshot().cancel_requested || last.is_some_and(|t| t.elapsed() < TICK) {
        return;
    }
    *last = Some(std::time::Instant::now());
    if let Err(e) = inner.jobs.slurm.cancel(job).await {
        tracing::warn!(job, "cancel (again): {e}");
    }
}

/// Slurm has given no answer for a while: past the run's wall time, its
/// margin and a grace, the run ends `lost` and its job is cancelled
/// (nothing may go on unwatched).
async fn silent(inner: &Arc<Inner>, slot: &Arc<Slot>, job: Option<u64>) -> Option<Followed> {
    let quiet = inner.jobs.failing_for()?;
    let rec = slot.snapshot();
    let margin = inner
        .jobs
        .settings
        .time_margin_s
        .unwrap_or(policy::backend::DEFAULT_TIME_MARGIN_S);
    let limit = rec
        .limits
        .wall_time_s()
        .saturating_add(margin)
        .saturating_add(SILENCE_GRACE_S);
    if quiet.as_secs() < limit {
        return None;
    }
    let _ = inner.jobs.slurm.cancel_named(rec.run_id.as_str()).await;
    let why = match job {
        Some(job) => format!(
            "Slurm has not answered about its job {job} for {} s",
            quiet.as_secs()
        ),
        None => format!(
            "Slurm has not answered about its job for {} s",
            quiet.as_secs()
        ),
    };
    finish::finish_job(inner, slot, JobEnd::Lost, why).await;
    Some(Followed::Ended)
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
/// The run ends when the poll sees its job end; a scancel that fails is
/// sent again while the job goes on.
pub(crate) async fn cancel(inner: &Arc<Inner>, slot: &Arc<Slot>) -> Result<(), EngineError> {
    let run = slot.snapshot();
    let job = job_of(&run);
    {
        let mut rec = slot.rec.lock().await;
        if rec.state().is_terminal() {
            return Ok(());
        }
        if !rec.cancel_requested {
            let mut next = rec.clone();
            next.cancel_requested = true;
            inner.persist(slot, &mut rec, next).await?;
        }
    }
    let sent = match job {
        Some(job) => inner.jobs.slurm.cancel(job).await,
        // Its id is not known yet: the job of its name, if there is one.
        None => inner.jobs.slurm.cancel_named(run.run_id.as_str()).await,
    };
    match sent {
        Ok(()) => tracing::info!(run_id = %run.run_id, ?job, "cancel requested: scancel"),
        Err(e) => tracing::warn!(run_id = %run.run_id, ?job, "cancel: {e}"),
    }
    Ok(())
}

/// What a restart found of a Slurm run.
pub(crate) enum Resumed {
    /// Its job is watched again (by id, or by name).
    Watched,
    /// It was never submitted: it waits for a slot as any queued run.
    NotSubmitted,
}

/// Picks up a Slurm run after a restart: its job watched again, by its id,
/// or by its name when the id was never committed (its spec was written,
/// so sbatch may have made it); with the run's uid, and a slot when one is
/// free.
pub(crate) async fn resume(inner: &Arc<Inner>, slot: &Arc<Slot>, rec: &RunRecord) -> Resumed {
    let job = job_of(rec);
    if job.is_none() && !spec_written(rec).await {
        return Resumed::NotSubmitted;
    }
    if let (Some(pool), Some(uid)) = (&inner.uids, rec.uid) {
        match pool.relock(uid) {
            Ok(lease) => inner.hold_lease(&rec.run_id, lease),
            Err(e) => tracing::warn!(run_id = %rec.run_id, "its uid: {e}"),
        }
    }
    // Its job's bridge connects again with the same token.
    if let Err(e) = serve_services_again(inner, slot, rec).await {
        tracing::error!(run_id = %rec.run_id, "its services: {e}");
    }
    let permit = inner.slots.clone().try_acquire_owned().ok();
    tokio::spawn(follow(inner.clone(), slot.clone(), job, permit));
    Resumed::Watched
}

/// [`serve_services`] for a run whose job may be running already, from
/// its spec in state.db.
async fn serve_services_again(
    inner: &Arc<Inner>,
    slot: &Slot,
    rec: &RunRecord,
) -> Result<(), SubmitError> {
    let (store, id) = (inner.store.clone(), rec.run_id.clone());
    let read = move || {
        store
            .spec(&id)
            .map_err(SubmitError::SpecRead)?
            .ok_or(SubmitError::NoSpec)
    };
    let bytes = tokio::task::spawn_blocking(read)
        .await
        .map_err(SubmitError::Task)??;
    let spec = subagent_runner::spec::RunnerSpec::parse(&bytes)?;
    serve_services(inner, slot, rec, &spec).map(drop)
}

/// Whether the run's spec was written for a job (sbatch may have run).
async fn spec_written(rec: &RunRecord) -> bool {
    let spec = rec.files().dir.join(subagent_runner::jobdir::SPEC_FILE);
    tokio::task::spawn_blocking(move || spec.symlink_metadata().is_ok())
        .await
        .unwrap_or(true)
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
