//! Picking up where a previous engine left off. Every run folder in the
//! state dir is loaded; runs that had not ended are reconciled:
//! - a runner still alive (its pid and start time match) is watched again;
//! - a runner that is gone is finished from its exit.json, or `lost`;
//! - a run accepted but never started is queued again, in FIFO order;
//! - a run that ended but was not finalized is finalized.

use super::error::EngineError;
use super::error::StorageError;
use super::state::{Inner, Slot};
use super::{finish, launch, pidfd};
use crate::lockfile;
use crate::paths::StateLayout;
use crate::run::record::{EndState, Ended, Phase, RunRecord, RunState};
use std::os::unix::fs::DirBuilderExt;
use std::sync::Arc;
use subagent_runner::ioerr::at;

/// Creates the state dir (0700) and takes its lock. Blocking.
pub fn open_state_dir(layout: &StateLayout) -> Result<std::fs::File, EngineError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(layout.sessions())
        .map_err(at("create", &layout.sessions()))
        .map_err(StorageError::from)?;
    for d in [layout.root.clone(), layout.sessions()] {
        std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .map_err(at("chmod", &d))
            .map_err(StorageError::from)?;
    }
    let locked = lockfile::acquire(&layout.root.join("daemon.lock"));
    locked.map_err(|e| {
        EngineError::StateDir(match e {
            lockfile::LockError::Held { .. } => StorageError::InUse {
                root: layout.root.clone(),
                source: e,
            },
            other => StorageError::Lock(other),
        })
    })
}

/// Removes the draft folders a crash left in `<state>/drafts/`: their
/// spawns were never answered, so nobody knows them.
fn sweep_drafts(layout: &StateLayout) {
    let Ok(drafts) = std::fs::read_dir(layout.drafts()) else {
        return;
    };
    for d in drafts.flatten() {
        tracing::warn!(dir = %d.path().display(), "removing a half-made run folder");
        let _ = std::fs::remove_dir_all(d.path());
    }
}

/// Loads every run.json; corrupt ones are logged and left in place.
fn load_all(layout: &StateLayout) -> Vec<RunRecord> {
    sweep_drafts(layout);
    let mut out = Vec::new();
    let Ok(sessions) = std::fs::read_dir(layout.sessions()) else {
        return out;
    };
    for s in sessions.flatten() {
        let Ok(runs) = std::fs::read_dir(s.path().join("runs")) else {
            continue;
        };
        let session = s.file_name().to_string_lossy().into_owned();
        for r in runs.flatten() {
            let path = r.path().join("run.json");
            let draft = super::draft::is_draft_name(&r.file_name().to_string_lossy());
            if draft || !path.exists() {
                // The engine stopped while recording this run (its folder
                // still has its draft name, or no run.json): its spawn was
                // never answered, so nobody knows it. Leave nothing behind.
                tracing::warn!(dir = %r.path().display(), "removing a half-made run folder");
                let _ = std::fs::remove_dir_all(r.path());
                continue;
            }
            match RunRecord::load(&path) {
                Ok(rec) => out.push(rec),
                Err(e) => {
                    tracing::error!("a run.json cannot be loaded; the run is marked lost and the file kept: {e}");
                    if let Some(rec) = lost_placeholder(&session, &r.path(), &e.to_string()) {
                        out.push(rec);
                    }
                }
            }
        }
    }
    out.sort_by(|a, b| a.run_id.cmp(&b.run_id));
    out
}

/// A record for a run whose run.json is corrupt: `lost`, with the reason;
/// the corrupt file is kept as run.json.corrupt for inspection.
fn lost_placeholder(session: &str, dir: &std::path::Path, why: &str) -> Option<RunRecord> {
    let id = crate::ids::RunId::parse(&dir.file_name()?.to_string_lossy())?;
    let session_id = crate::ids::SessionId::parse(session).ok()?;
    let _ = std::fs::rename(dir.join("run.json"), dir.join("run.json.corrupt"));
    let now = crate::timefmt::now_ms();
    let rec = RunRecord {
        format: crate::run::record::RECORD_FORMAT,
        run_id: id,
        session_id,
        audience: policy::Audience::Personal,
        project_dir: "/".into(),
        task: String::new(),
        context: None,
        command: Vec::new(),
        env: Default::default(),
        limits: Default::default(),
        keep_temp: true,
        reason: Some(format!(
            "run.json was corrupt ({why}); kept as run.json.corrupt"
        )),
        cancel_requested: false,
        created_at_ms: now,
        temp_dir: "/nonexistent".into(),
        run_dir: dir.to_path_buf(),
        log_truncated: false,
        sandbox: Default::default(),
        agent: None,
        tools: None,
        rights: None,
        git: None,
        worktree: None,
        max_attempts: 1,
        uid: None,
        on_behalf: None,
        network: None,
        network_allow: Vec::new(),
        notes: Vec::new(),
        driver_run: None,
        phase: Phase::Ended(Box::new(Ended::bare(EndState::Lost, None, now, None))),
    };
    rec.save().ok()?;
    Some(rec)
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

/// Reconciles every loaded run with reality.
pub(crate) async fn recover(inner: &Arc<Inner>) {
    let layout = inner.layout.clone();
    let recs = tokio::task::spawn_blocking(move || load_all(&layout))
        .await
        .unwrap_or_default();
    let (mut alive, mut ended, mut queued) = (0, 0, 0);
    for rec in recs {
        match reconcile(inner, rec).await {
            Recovered::Watched => alive += 1,
            Recovered::Ended => ended += 1,
            Recovered::Queued => queued += 1,
            Recovered::Settled => {}
        }
    }
    if alive + ended + queued > 0 {
        tracing::info!(
            still_running = alive,
            ended_while_away = ended,
            requeued = queued,
            "recovered runs from the state dir"
        );
    }
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
    /// runner.json could not be read, parsed or rewritten.
    #[error("rewriting runner.json: {0}")]
    Spec(String),
    /// The blocking task did not finish.
    #[error("rewriting runner.json: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// run.json could not be saved.
    #[error(transparent)]
    Record(#[from] EngineError),
}

/// Gives a queued run, which never started and so owns nothing, a new uid
/// of its own: leased, written into its runner.json and its record.
async fn reassign_uid(
    inner: &Arc<Inner>,
    slot: &Arc<Slot>,
) -> Result<crate::uids::UidLease, ReuidError> {
    let pool = inner.uids.as_ref().ok_or(ReuidError::NoPool)?;
    let lease = pool.lease()?;
    let mut r = slot.rec.lock().await;
    let spec_path = r.files().runner_spec();
    let uid = lease.uid;
    let rewrite = move || -> Result<(), ReuidError> {
        let spec_err = |e: &dyn std::fmt::Display| ReuidError::Spec(e.to_string());
        let bytes = std::fs::read(&spec_path).map_err(|e| spec_err(&e))?;
        let mut spec =
            subagent_runner::spec::RunnerSpec::parse(&bytes).map_err(|e| spec_err(&e))?;
        spec.run_as = Some((uid, uid));
        let bytes = serde_json::to_vec(&spec).map_err(|e| spec_err(&e))?;
        subagent_runner::atomic::write_atomic(&spec_path, &bytes).map_err(|e| spec_err(&e))
    };
    tokio::task::spawn_blocking(rewrite).await??;
    let mut next = r.clone();
    next.uid = Some(uid);
    inner.persist(slot, &mut r, next).await?;
    tracing::info!(run_id = %r.run_id, uid, "its uid was taken while it was queued; it has another");
    Ok(lease)
}

/// Ends a queued run that cannot start again after a restart.
async fn fail_queued(inner: &Arc<Inner>, slot: &Arc<Slot>, why: String) {
    let mut r = slot.rec.lock().await;
    let mut next = r.clone();
    let why = format!("could not be started after a restart: {why}");
    next.ended(EndState::Failed, why, crate::timefmt::now_ms());
    if let Err(e) = inner.persist(slot, &mut r, next).await {
        tracing::error!("{e}");
    }
    drop(r);
    finish::finalize(inner, slot).await;
}
