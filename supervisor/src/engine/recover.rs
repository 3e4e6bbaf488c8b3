//! Picking up where a previous engine left off. The store's live runs
//! (not ended, or ended and not finalized) are loaded, their folders put
//! in place from `<state>/drafts/` when a crash came between the commit
//! and the rename, and reconciled:
//! - a runner still alive (its pid and start time match) is watched again;
//! - a runner that is gone is finished from its exit.json, or `lost`;
//! - a run accepted but never started is queued again, in FIFO order;
//! - a run that ended but was not finalized is finalized.

use super::error::EngineError;
use super::error::StorageError;
use super::state::{blocking, Inner, Slot, StateLocks};
use super::{finish, launch, pidfd};
use crate::lockfile;
use crate::paths::StateLayout;
use crate::run::record::{EndState, RunRecord, RunState};
use std::os::unix::fs::DirBuilderExt;
use std::sync::Arc;
use subagent_runner::ioerr::at;

/// Creates the state dir (0700) and takes its lock; when run folders live
/// elsewhere (a Slurm backend's shared dir), that dir too, and its lock:
/// a second daemon there would sweep this one's drafts. Blocking.
pub(crate) fn open_state_dir(layout: &StateLayout) -> Result<StateLocks, EngineError> {
    let dirs = [
        layout.root.clone(),
        layout.runs_root.clone(),
        layout.sessions(),
    ];
    for d in &dirs {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(d)
            .map_err(at("create", d))
            .map_err(StorageError::from)?;
        std::fs::set_permissions(d, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .map_err(at("chmod", d))
            .map_err(StorageError::from)?;
    }
    let state = lock_dir(&layout.root)?;
    let runs = match layout.runs_root != layout.root {
        true => Some(lock_dir(&layout.runs_root)?),
        false => None,
    };
    Ok(StateLocks {
        _state: state,
        _runs: runs,
    })
}

/// Takes `<dir>/daemon.lock`.
fn lock_dir(dir: &std::path::Path) -> Result<std::fs::File, EngineError> {
    lockfile::acquire(&dir.join("daemon.lock")).map_err(|e| {
        EngineError::StateDir(match e {
            lockfile::LockError::Held { .. } => StorageError::InUse {
                root: dir.to_path_buf(),
                source: e,
            },
            other => StorageError::Lock(other),
        })
    })
}

/// Sweeps `<state>/drafts/`: a draft whose run was recorded (`live`) but
/// whose folder was not yet renamed (a crash between the two) is put in
/// place; any other was never answered, so nobody knows it: removed. The
/// folders it changed are fsynced once each, so a crash after the start
/// does not bring a swept draft back.
fn sweep_drafts(layout: &StateLayout, live: &[RunRecord]) {
    let Ok(drafts) = std::fs::read_dir(layout.drafts()) else {
        return;
    };
    let mut changed = std::collections::BTreeSet::new();
    for d in drafts.flatten() {
        changed.insert(layout.drafts());
        let id = super::draft::draft_run_id(&d.file_name().to_string_lossy());
        let rec = id.and_then(|id| live.iter().find(|r| r.run_id == id));
        if let Some(rec) = rec.filter(|r| !r.run_dir.exists()) {
            match std::fs::rename(d.path(), &rec.run_dir) {
                Ok(()) => {
                    tracing::info!(run_id = %rec.run_id, "its run folder was put in place");
                    changed.extend(rec.run_dir.parent().map(std::path::Path::to_path_buf));
                    continue;
                }
                Err(e) => {
                    tracing::error!(run_id = %rec.run_id, "putting its run folder in place: {e}")
                }
            }
        }
        tracing::warn!(dir = %d.path().display(), "removing a half-made run folder");
        let _ = std::fs::remove_dir_all(d.path());
    }
    for dir in changed {
        if let Err(e) = subagent_runner::atomic::fsync_dir(&dir) {
            tracing::warn!("after sweeping the drafts: {e}");
        }
    }
}

/// The runs not settled when the last engine stopped (the store's live
/// runs), their folders put in place. Blocking. An unreadable live set
/// stops the start: without it the drafts of accepted runs would be
/// swept and their runners never watched.
fn load_live(inner: &Inner) -> Result<Vec<RunRecord>, EngineError> {
    let live = inner.store.live_runs()?;
    sweep_drafts(&inner.layout, &live);
    Ok(live)
}

/// Whether the runner recorded in `rec` is alive (pid and start time match).
fn runner_alive(pid: i32, start_ticks: Option<u64>) -> bool {
    match subagent_runner::procstat::read_stat(pid) {
        Some(st) => st.state != 'Z' && start_ticks.is_none_or(|t| t == st.start_ticks),
        None => false,
    }
}

/// Whether no runner ever got going for this run: no runner.lock, or one
/// that nobody holds and no runner wrote its pid into (the previous engine
/// stopped between creating it and starting the runner). Such a run is
/// safely started again; any other unrecorded start is `lost`, so that an
/// agent never runs twice.
fn never_started(files: &crate::paths::RunFiles) -> bool {
    match lockfile::is_held(&files.runner_lock()) {
        None => true,
        Some(true) => false,
        Some(false) => {
            !files.exit().exists()
                && lockfile::open(&files.runner_lock())
                    .ok()
                    .and_then(|mut f| lockfile::read_pid(&mut f))
                    .is_none()
        }
    }
}

/// What recovery did with one run.
enum Recovered {
    /// Its runner is alive and watched again.
    Watched,
    /// It ended while no engine watched: it is being finished.
    Ended,
    /// It never started: it is queued again.
    Queued,
    /// Nothing to count (already ended, or not a run).
    Settled,
}

/// Reconciles every loaded run with reality; fails when the live runs
/// cannot be read.
pub(crate) async fn recover(inner: &Arc<Inner>) -> Result<(), EngineError> {
    let inner2 = inner.clone();
    let recs = blocking(move || load_live(&inner2)).await?;
    let (mut alive, mut ended, mut queued) = (0, 0, 0);
    for rec in recs {
        match reconcile(inner, rec).await {
            Recovered::Watched => alive += 1,
            Recovered::Ended => ended += 1,
            Recovered::Queued => queued += 1,
            Recovered::Settled => {}
        }
    }
    inner.metrics.recovered(alive, ended, queued);
    if alive + ended + queued > 0 {
        tracing::info!(
            still_running = alive,
            ended_while_away = ended,
            requeued = queued,
            "recovered runs from the state dir"
        );
    }
    Ok(())
}

/// Reconciles one loaded run with reality.
async fn reconcile(inner: &Arc<Inner>, rec: RunRecord) -> Recovered {
    let state = rec.state();
    let files = rec.files();
    let Some(slot) = inner.insert(rec.clone()) else {
        return Recovered::Settled;
    };
    if state.is_terminal() {
        if !rec.finalized() {
            let (inner, slot) = (inner.clone(), slot.clone());
            tokio::spawn(async move { finish::finalize(&inner, &slot).await });
        }
        return Recovered::Settled;
    }
    if super::slurm::is_slurm(&rec) {
        match super::slurm::resume(inner, &slot, &rec).await {
            super::slurm::Resumed::Watched => return Recovered::Watched,
            // Its job was never submitted: queued again below, as any run.
            super::slurm::Resumed::NotSubmitted => {}
        }
    }
    let live = {
        let (r, f) = (rec.clone(), files.clone());
        tokio::task::spawn_blocking(move || live_runner(&r, &f))
            .await
            .unwrap_or(None)
    };
    match (state, live) {
        (_, Some(pid)) => match pidfd::open(pid) {
            Ok(fd) => {
                watch_again(inner, &slot, pid, fd).await;
                Recovered::Watched
            }
            Err(e) => {
                tracing::warn!("{e}");
                finish_later(inner, &slot);
                Recovered::Ended
            }
        },
        (RunState::Accepted, None) if never_started(&files) => {
            let id = rec.run_id.clone();
            // A queued run keeps the uid it was given, or gets another
            // when a run of another supervisor took it meanwhile.
            if let (Some(pool), Some(uid)) = (&inner.uids, rec.uid) {
                let lease = match pool.relock(uid) {
                    Err(crate::uids::UidError::Taken(_)) => reassign_uid(inner, &slot).await,
                    other => other.map_err(ReuidError::from),
                };
                match lease {
                    Ok(lease) => inner.hold_lease(&id, lease),
                    Err(why) => {
                        fail_queued(inner, &slot, why.to_string()).await;
                        return Recovered::Ended;
                    }
                }
            }
            let _ = inner.enqueue(id);
            Recovered::Queued
        }
        _ => {
            finish_later(inner, &slot);
            Recovered::Ended
        }
    }
}

/// The pid of the run's runner, when one is alive.
fn live_runner(rec: &RunRecord, files: &crate::paths::RunFiles) -> Option<i32> {
    let pid = rec
        .runner_pid()
        .filter(|&p| runner_alive(p, rec.runner_start_ticks()));
    if pid.is_some() || lockfile::is_held(&files.runner_lock()) != Some(true) {
        return pid;
    }
    // Started but not yet recorded as running when the last engine
    // stopped: the runner writes its pid into its lock as it starts, so a
    // lock held without a pid is a runner about to write it (or to let go
    // of the lock at its gate). Wait for one or the other.
    let deadline = std::time::Instant::now() + RUNNER_PID_WAIT;
    loop {
        let pid = lockfile::open(&files.runner_lock())
            .ok()
            .and_then(|mut f| lockfile::read_pid(&mut f));
        if let Some(p) = pid {
            return Some(p).filter(|&p| runner_alive(p, None));
        }
        if lockfile::is_held(&files.runner_lock()) != Some(true)
            || std::time::Instant::now() >= deadline
        {
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// How long recovery waits for a runner that holds its lock to write its
/// pid there.
const RUNNER_PID_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Records the run as running with runner `pid` and watches it again.
async fn watch_again(inner: &Arc<Inner>, slot: &Arc<Slot>, pid: i32, fd: std::os::fd::OwnedFd) {
    slot.adopted
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let fd = Arc::new(fd);
    {
        let mut r = slot.rec.lock().await;
        let mut next = r.clone();
        next.adopted(pid, crate::timefmt::now_ms());
        if let Err(e) = inner.persist(slot, &mut r, next).await {
            tracing::error!("{e}");
        }
    }
    *slot.runner.lock().unwrap_or_else(|p| p.into_inner()) = Some((fd.clone(), pid));
    let permit = inner.slots.clone().try_acquire_owned().ok();
    let (inner, slot) = (inner.clone(), slot.clone());
    tokio::spawn(async move {
        launch::watch(inner, slot, fd).await;
        drop(permit);
    });
}

/// Finishes, in a task of its own, a run whose runner nobody saw end.
fn finish_later(inner: &Arc<Inner>, slot: &Arc<Slot>) {
    let (inner, slot) = (inner.clone(), slot.clone());
    tokio::spawn(
        async move { finish::finish_run(&inner, &slot, pidfd::RunnerExit::Unknown).await },
    );
}

/// Why a queued run could not get its uid back, or another.
#[derive(Debug, thiserror::Error)]
enum ReuidError {
    /// The daemon hands out no per-run uids.
    #[error("no per-run uids")]
    NoPool,
    /// Leasing or relocking a uid failed.
    #[error(transparent)]
    Lease(#[from] crate::uids::UidError),
    /// The runner spec could not be read from the store.
    #[error("reading the runner spec from state.db: {0}")]
    SpecRead(#[from] crate::store::StoreError),
    /// The store holds no runner spec for the run.
    #[error("state.db holds no runner spec for the run")]
    NoSpec,
    /// The stored runner spec could not be parsed.
    #[error("the runner spec in state.db: {0}")]
    Spec(#[from] subagent_runner::spec::SpecError),
    /// The runner spec with its new uid could not be encoded.
    #[error("encoding the runner spec: {0}")]
    Encode(#[from] serde_json::Error),
    /// The blocking task did not finish.
    #[error("rewriting the runner spec: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// The new uid could not be recorded.
    #[error(transparent)]
    Record(#[from] EngineError),
}

/// Gives a queued run, which never started and so owns nothing, a new uid
/// of its own: leased, written into its runner spec (the store's copy) and
/// committed with it to the store.
async fn reassign_uid(
    inner: &Arc<Inner>,
    slot: &Arc<Slot>,
) -> Result<crate::uids::UidLease, ReuidError> {
    let pool = inner.uids.as_ref().ok_or(ReuidError::NoPool)?;
    let lease = pool.lease()?;
    let mut r = slot.rec.lock().await;
    let uid = lease.uid;
    let (store, id) = (inner.store.clone(), r.run_id.clone());
    let rewrite = move || -> Result<Vec<u8>, ReuidError> {
        let bytes = store.spec(&id)?.ok_or(ReuidError::NoSpec)?;
        let mut spec = subagent_runner::spec::RunnerSpec::parse(&bytes)?;
        spec.run_as = Some((uid, uid));
        Ok(serde_json::to_vec(&spec)?)
    };
    let spec = tokio::task::spawn_blocking(rewrite).await??;
    let reuid = crate::store::Op::Reuid {
        id: r.run_id.clone(),
        uid,
        spec: spec.clone(),
    };
    inner
        .store
        .commit(vec![reuid])
        .await
        .map_err(EngineError::from)?;
    r.uid = Some(uid);
    slot.set_spec(spec);
    slot.published.send_replace(r.clone());
    tracing::info!(run_id = %r.run_id, uid, "its uid was taken while it was queued; it has another");
    Ok(lease)
}

/// Ends a queued run that cannot start again after a restart.
async fn fail_queued(inner: &Arc<Inner>, slot: &Arc<Slot>, why: String) {
    let mut r = slot.rec.lock().await;
    let mut next = r.clone();
    let why = format!("{}: {why}", crate::metrics::reason::RESTART_FAILED);
    next.ended(EndState::Failed, why, crate::timefmt::now_ms());
    if let Err(e) = inner.persist(slot, &mut r, next).await {
        tracing::error!("{e}");
    }
    drop(r);
    finish::finalize(inner, slot).await;
}
