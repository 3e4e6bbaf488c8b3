//! The supervisor engine: accepts runs, queues them (FIFO, at most
//! `max_concurrent` at once), launches one runner per run, watches it
//! through a pidfd and finishes the run exactly once. The daemon serves it
//! over the socket; `subagent run` embeds it in-process.
//!
//! This module is the engine's API ([`Supervisor`], [`Config`]; its reads
//! that change nothing are in `reads`); it calls
//! the phases, which share `state` and never name what is defined here.
//! In layers, each using only those below it:
//! - the phases: [`accept`] (validate, plan, place, context, delivery,
//!   sandbox, run folder), [`recover`] (picking up the state dir's runs
//!   at start), `prune` (retention) and `sample` (the live runs for a
//!   live view), over [`launch`] (starting a runner; [`spawn`]: the
//!   `posix_spawn` that does it), over [`finish`] (exit.json to the
//!   terminal state, the delta, the observation, the agent's report,
//!   result.md and the notice);
//! - what they share: `state` (the daemon's state and its locking rules)
//!   and [`program`] (the agent program's chain, for its execute rules)
//!   over `config`; [`draft`] (a run folder being made, undone unless
//!   published) over [`worktree`]; [`drivers`]; [`instructions`] (the
//!   project's instructions file);
//! - at the bottom: [`error`] (every error, each with its protocol code),
//!   [`pidfd`], [`probe`]; and `crate::run`, the run's data.

pub mod accept;
mod config;
pub mod draft;
pub mod drivers;
pub mod error;
pub mod finish;
pub mod instructions;
mod jobs;
pub mod launch;
pub mod pidfd;
pub mod probe;
pub mod program;
mod prune;
mod reads;
pub mod recover;
mod sample;
mod services;
pub mod slurm;
pub mod spawn;
mod state;
pub mod worktree;

pub use config::{default_max_concurrent, Config};
pub use error::EngineError;

use crate::ids::RunId;
use crate::protocol::{Notice, SpawnParams};
use crate::run::record::{EndState, RunRecord, RunState};
use crate::status::RunStatus;
use crate::store::{Op, Store, Stored};
use error::InternalError;
use state::{blocking, run_owner, Inner, Slot};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{broadcast, mpsc, Semaphore};

/// A handle on the engine; cheap to clone.
#[derive(Clone)]
pub struct Supervisor {
    inner: Arc<Inner>,
}

/// Capacity of the finished-run broadcast; a subscriber further behind is
/// told it lagged.
const FINISHED_CAPACITY: usize = 4096;

/// Blocking tasks at once that may wait on git: half of the blocking pool
/// subagentd runs with (8 threads).
const GIT_WORK: usize = 4;

impl Supervisor {
    /// Opens the state dir (taking its lock), recovers its runs and starts
    /// the dispatcher. Must be called inside a tokio runtime.
    pub async fn start(cfg: Config) -> Result<Supervisor, EngineError> {
        let layout = cfg.layout();
        if let Some(r) = &cfg.run_as {
            crate::runas::check(r).map_err(|why| EngineError::Sandbox {
                mechanism: "run_as",
                why: why.into(),
            })?;
        }
        let lock = {
            let layout = layout.clone();
            blocking(move || recover::open_state_dir(&layout)).await?
        };
        let cfg = config::resolved(cfg)?;
        let layout = cfg.layout();
        // Opened once the state dir's lock is held: one writer ever.
        let store = {
            let layout = layout.clone();
            blocking(move || Store::open(&layout).map_err(EngineError::from)).await?
        };
        let tools = cfg
            .settings
            .tool_policy()
            .map_err(|e| EngineError::Unexpected(InternalError::ToolPolicy(e)))?;
        let uids = if cfg.run_as.is_none() && nix::unistd::geteuid().is_root() {
            let sandbox = |why: crate::uids::UidError| EngineError::Sandbox {
                mechanism: "per_run_uid",
                why: why.into(),
            };
            let (first, count) = match &cfg.settings.uid_range {
                Some(r) => crate::uids::parse_range(r).map_err(sandbox)?,
                None => (crate::uids::DEFAULT_FIRST, crate::uids::DEFAULT_COUNT),
            };
            let dir = cfg.uid_lock_dir.clone();
            let pool = blocking(move || {
                crate::uids::UidPool::open(first, count, &dir).map_err(|e| EngineError::Sandbox {
                    mechanism: "per_run_uid",
                    why: e.into(),
                })
            })
            .await?;
            Some(pool)
        } else {
            None
        };
        let probe = probe::probe();
        // Also for a local backend: Slurm runs an earlier config placed are
        // followed to their end.
        let jobs = Arc::new(jobs::Jobs::new(cfg.backend()));
        let services = match cfg.backend().services_addr() {
            Some(addr) => {
                let dir = cfg.state_dir.clone();
                let (s, l) = blocking(move || {
                    services::Services::open(addr, &dir)
                        .map_err(|e| EngineError::Unexpected(InternalError::Services(e)))
                })
                .await?;
                Some((Arc::new(s), l))
            }
            None => None,
        };
        let (queue, rx) = mpsc::unbounded_channel();
        let (finished, _) = broadcast::channel(FINISHED_CAPACITY);
        let metrics = crate::metrics::Metrics::new(store.starts());
        let inner = Arc::new(Inner {
            slots: Arc::new(Semaphore::new(cfg.max_concurrent.max(1))),
            store: Arc::new(store),
            cfg,
            layout,
            runs: Mutex::new(BTreeMap::new()),
            queue,
            finished,
            retention: state::RetentionTrigger::default(),
            daemon_env: std::env::vars().collect(),
            accepting: AtomicBool::new(true),
            probe,
            tools,
            waiting: AtomicUsize::new(0),
            uids,
            leases: Mutex::new(BTreeMap::new()),
            git_work: Semaphore::new(GIT_WORK),
            metrics,
            recent_ends: Mutex::new(state::RecentEnds::default()),
            jobs,
            services: services.as_ref().map(|(s, _)| s.clone()),
            _state_lock: lock,
        });
        // Empty session dirs a crash left behind (a run's end removes its own).
        let base = inner.cfg.temp_base.clone();
        blocking(move || Ok(crate::securedir::sweep_empty_session_dirs(&base))).await?;
        let sup = Supervisor { inner };
        recover::recover(&sup.inner).await?;
        prune::finish_at_start(&sup.inner).await;
        // Off the start path (tens of ms at 20,000 runs): until it is done
        // a crossed limit waits for the count or the interval.
        tokio::spawn(prune::count_at_start(Arc::downgrade(&sup.inner)));
        tokio::spawn(dispatch(sup.clone(), rx));
        tokio::spawn(jobs::poll_every(Arc::downgrade(&sup.inner.jobs)));
        if let Some((s, l)) = services {
            let l = tokio::net::TcpListener::from_std(l).map_err(|e| {
                EngineError::Unexpected(InternalError::Services(services::ServicesError::Bind {
                    addr: s.addr,
                    source: e,
                }))
            })?;
            tracing::info!(addr = %s.addr, "job services port");
            tokio::spawn(services::serve(l, Arc::downgrade(&s)));
        }
        tokio::spawn(prune::every_interval(Arc::downgrade(&sup.inner)));
        tokio::spawn(prune::when_crossed(Arc::downgrade(&sup.inner)));
        Ok(sup)
    }

    /// What this host can enforce.
    pub fn probe(&self) -> &probe::HostProbe {
        &self.inner.probe
    }

    /// The engine's configuration.
    pub fn config(&self) -> &Config {
        &self.inner.cfg
    }

    /// Runs holding a slot now, and runs queued for one.
    pub fn load(&self) -> (usize, usize) {
        let held = self
            .inner
            .cfg
            .max_concurrent
            .saturating_sub(self.inner.slots.available_permits());
        (held, self.inner.waiting.load(Ordering::Relaxed))
    }

    /// Records a new run durably and starts it when a slot is free and no
    /// run waits for one, else queues it; returns its id. The agent has not
    /// necessarily started when this returns. Runs to its end on a task of
    /// its own: a caller that goes away (a closed connection) cannot cut a
    /// spawn short between recording the run and watching it.
    pub async fn spawn(&self, params: SpawnParams) -> Result<RunId, EngineError> {
        self.spawn_for(params, None).await
    }

    /// [`Supervisor::spawn`] for `requester`, a uid other than the
    /// daemon's: the run may reach only what that uid may (checked with its
    /// credentials now and again before its runner starts).
    pub async fn spawn_for(
        &self,
        params: SpawnParams,
        requester: Option<policy::rights::Requester>,
    ) -> Result<RunId, EngineError> {
        let sup = self.clone();
        let done = tokio::spawn(async move { sup.spawn_to_end(params, requester).await })
            .await
            .map_err(|e| EngineError::Unexpected(InternalError::Join(e)))?;
        match &done {
            Ok(_) => self.inner.metrics.accepted(),
            Err(EngineError::Sandbox { mechanism, .. }) => {
                self.inner.metrics.sandbox_refused(mechanism)
            }
            Err(_) => {}
        }
        done
    }

    async fn spawn_to_end(
        &self,
        params: SpawnParams,
        requester: Option<policy::rights::Requester>,
    ) -> Result<RunId, EngineError> {
        if !self.inner.accepting.load(Ordering::SeqCst) {
            return Err(EngineError::ShuttingDown);
        }
        self.may_join(&params.session.id, requester.as_ref())
            .await?;
        if let Some(who) = requester.clone() {
            let p = params.clone();
            blocking(move || accept::validate::check_paths_for(&who, &p)).await?;
        }
        accept::validate::validate(&params)?;
        let permit = self.inner.free_slot();
        // A spawn that found no slot counts as waiting from now on, so that
        // a later one cannot start before it.
        let waiting = Waiting::new(&self.inner.waiting, permit.is_none());
        // A Slurm run's runner is the job's: none starts here.
        let local = self.inner.cfg.backend().kind == policy::backend::BackendKind::Local;
        let start_now = permit.is_some() && local;
        let inner = self.inner.clone();
        let git = self.inner.git_permit().await?;
        let created =
            blocking(move || accept::accept(&inner, &params, requester, start_now)).await?;
        drop(git);
        let id = created.rec.run_id.clone();
        tracing::info!(run_id = %id, "run accepted");
        if let Some(l) = created.lease {
            self.inner.hold_lease(&id, l);
        }
        match (created.runner, permit) {
            (Some(mut l), Some(permit)) => {
                let rec = launch::running(created.rec, &l);
                let egress = l.serve_egress(&rec);
                let gateway = l.serve_gateway(&rec);
                let slot = Slot::new(rec);
                slot.set_egress(egress);
                slot.set_gateway(gateway);
                let fd = slot.set_runner(l);
                self.inner
                    .runs
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(id.clone(), slot.clone());
                tokio::spawn(launch::run_started(self.inner.clone(), slot, permit, fd));
            }
            (None, Some(permit)) if slurm::is_slurm(&created.rec) => {
                if let Some(slot) = self.inner.insert(created.rec) {
                    slot.set_spec(created.spec);
                    slurm::start_now(&self.inner, slot, permit).await;
                }
            }
            _ => {
                if let Some(slot) = self.inner.insert(created.rec) {
                    slot.set_spec(created.spec);
                }
                // Counted already when no slot was free; else (its runner
                // could not be started at once) counted now.
                if waiting.keep() {
                    self.inner.queue(id.clone())?;
                } else {
                    self.inner.enqueue(id.clone())?;
                }
            }
        }
        Ok(id)
    }

    /// Refuses a run `who` may not see (another uid's) as if it did not
    /// exist: the same error as an unknown run id.
    pub fn check_visible(
        &self,
        id: &RunId,
        who: Option<&policy::rights::Requester>,
    ) -> Result<(), EngineError> {
        let owner = match self.record(id) {
            Ok(rec) => run_owner(&rec),
            Err(EngineError::RunPruned { owner_uid, .. }) => owner_uid,
            Err(e) => return Err(e),
        };
        if policy::rights::may_act_on(who, owner) {
            return Ok(());
        }
        Err(EngineError::RunNotFound(id.to_string()))
    }

    /// Whether `who` may see the run `run_id` (an unknown one: no).
    pub fn run_visible(&self, run_id: &str, who: Option<&policy::rights::Requester>) -> bool {
        RunId::parse(run_id).is_some_and(|id| self.check_visible(&id, who).is_ok())
    }

    /// Refuses a session `who` may not join with a run (another uid's).
    async fn may_join(
        &self,
        session: &str,
        who: Option<&policy::rights::Requester>,
    ) -> Result<(), EngineError> {
        crate::ids::check_session_id(session).map_err(|p| EngineError::invalid("session.id", p))?;
        let (inner, session, who) = (self.inner.clone(), session.to_owned(), who.cloned());
        blocking(move || Ok(inner.store.may_join(&session, who.as_ref())?)).await
    }

    /// Refuses a session `who` may not use (another uid's).
    pub async fn may_use_session(
        &self,
        session: &str,
        who: Option<&policy::rights::Requester>,
    ) -> Result<(), EngineError> {
        crate::ids::check_session_id(session).map_err(|p| EngineError::invalid("session_id", p))?;
        let (inner, session, who) = (self.inner.clone(), session.to_owned(), who.cloned());
        blocking(move || Ok(inner.store.may_use(&session, who.as_ref())?)).await
    }

    /// The run's record now: its slot's snapshot while it is not settled,
    /// else its row in the store (a short indexed read: WAL readers never
    /// wait for the writer). A pruned run is its own error.
    fn record(&self, id: &RunId) -> Result<RunRecord, EngineError> {
        if let Some(slot) = self.inner.live_slot(id) {
            return Ok(slot.snapshot());
        }
        match self.inner.store.get(id)? {
            Some(Stored::Live(rec)) => Ok(*rec),
            Some(Stored::Pruned {
                at_ms,
                reason,
                owner_uid,
            }) => Err(EngineError::RunPruned {
                run_id: id.to_string(),
                at_ms,
                reason,
                owner_uid,
            }),
            None => Err(EngineError::RunNotFound(id.to_string())),
        }
    }

    /// A run's current status.
    pub fn status(&self, id: &RunId) -> Result<RunStatus, EngineError> {
        if let Some(slot) = self.inner.live_slot(id) {
            return Ok(live_status(&slot));
        }
        Ok(RunStatus::from(&self.record(id)?))
    }

    /// Waits until the run has ended (and its result.md and notice exist),
    /// or `timeout` passes; returns the status then.
    pub async fn wait(
        &self,
        id: &RunId,
        timeout: Option<Duration>,
    ) -> Result<RunStatus, EngineError> {
        // A run without a slot is settled (recovery is done before anyone
        // asks): its row is the answer.
        let Some(slot) = self.inner.live_slot(id) else {
            return self.status(id);
        };
        let mut rx = slot.published.subscribe();
        let wait = rx.wait_for(RunRecord::settled);
        match timeout {
            Some(t) => {
                let _ = tokio::time::timeout(t, wait).await;
            }
            None => {
                let _ = wait.await;
            }
        }
        Ok(live_status(&slot))
    }

    /// Asks a run to stop: a queued run is cancelled at once; a running one
    /// gets SIGTERM on its whole tree and SIGKILL after the grace; an ended
    /// one is left as it is. Returns the status after the request.
    pub async fn cancel(&self, id: &RunId) -> Result<RunStatus, EngineError> {
        let Some(slot) = self.inner.live_slot(id) else {
            return self.status(id);
        };
        let mut rec = slot.rec.lock().await;
        if slurm::cancels_by_scancel(&self.inner, &rec) {
            drop(rec);
            slurm::cancel(&self.inner, &slot).await?;
            return Ok(live_status(&slot));
        }
        match rec.state() {
            RunState::Accepted => {
                let mut next = rec.clone();
                next.cancel_requested = true;
                let why = "cancelled before it started".into();
                next.ended(EndState::Cancelled, why, crate::timefmt::now_ms());
                self.inner.persist(&slot, &mut rec, next).await?;
                drop(rec);
                finish::finalize(&self.inner, &slot).await;
            }
            RunState::Running if !rec.cancel_requested => {
                let mut next = rec.clone();
                next.cancel_requested = true;
                self.inner.persist(&slot, &mut rec, next).await?;
                let runner = slot
                    .runner
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone();
                if let Some((fd, pid)) = runner {
                    if let Err(e) = pidfd::send_signal(&fd, pid, libc::SIGTERM) {
                        tracing::warn!(run_id = %id, "cancel: {e}");
                    }
                }
                tracing::info!(run_id = %id, "cancel requested");
            }
            _ => {}
        }
        Ok(live_status(&slot))
    }

    /// Removes finished runs by the retention limits (and `older_than`),
    /// only runs `who` may act on and, with a session, only its runs; with
    /// `dry_run`, says what it would remove.
    pub async fn prune_runs(
        &self,
        params: crate::protocol::PruneParams,
        who: Option<policy::rights::Requester>,
    ) -> Result<crate::protocol::PruneResult, EngineError> {
        prune::prune_runs(&self.inner, params, who).await
    }

    /// Takes the session's pending notices, oldest first; each is returned
    /// by exactly one call. Refused when the session is not `who`'s.
    pub async fn take_notices(
        &self,
        session: &str,
        who: Option<&policy::rights::Requester>,
    ) -> Result<Vec<Notice>, EngineError> {
        crate::ids::check_session_id(session).map_err(|p| EngineError::invalid("session_id", p))?;
        let inner = self.inner.clone();
        let (session, who) = (session.to_owned(), who.cloned());
        {
            let (inner, session, who) = (inner.clone(), session.clone(), who.clone());
            blocking(move || Ok(inner.store.may_use(&session, who.as_ref())?)).await?;
        }
        let out = inner
            .store
            .commit(vec![Op::TakeNotices {
                session: session.clone(),
            }])
            .await?;
        if !out.notices.is_empty() {
            // Runs a pending notice kept may go now, if a limit wants them.
            let limits = inner.cfg.settings.retention.limits();
            inner.retention.notices_taken(&session, &limits);
        }
        Ok(out.notices)
    }

    /// Puts `files` at the front of the session's recent files. Refused
    /// when the session is not `who`'s.
    pub async fn touch_files(
        &self,
        session: &str,
        files: Vec<std::path::PathBuf>,
        who: Option<&policy::rights::Requester>,
    ) -> Result<crate::sessions::SessionState, EngineError> {
        crate::ids::check_session_id(session).map_err(|p| EngineError::invalid("session_id", p))?;
        let inner = self.inner.clone();
        let (session, who) = (session.to_owned(), who.cloned());
        {
            let (inner, session, who) = (inner.clone(), session.clone(), who.clone());
            blocking(move || Ok(inner.store.may_use(&session, who.as_ref())?)).await?;
        }
        let owner_uid = policy::rights::owner_for(who.as_ref(), crate::paths::uid());
        let touch = Op::Touch {
            session,
            files,
            owner_uid,
            requester: who.as_ref().map(|w| w.uid),
        };
        let out = inner.store.commit(vec![touch]).await?;
        Ok(out.session.unwrap_or_default())
    }

    /// The session's working context now: its state, a fresh git snapshot,
    /// and the rendered block. Refused when the session is not `who`'s.
    pub async fn working_context(
        &self,
        session: &str,
        who: Option<&policy::rights::Requester>,
    ) -> Result<serde_json::Value, EngineError> {
        crate::ids::check_session_id(session).map_err(|p| EngineError::invalid("session_id", p))?;
        let inner = self.inner.clone();
        let (session, who) = (session.to_owned(), who.cloned());
        let _git = self.inner.git_permit().await?;
        blocking(move || {
            let (state, git) = current(&inner, &session, who.as_ref())?;
            let dir = state.project_dir.clone().unwrap_or_default();
            let block = policy::workctx::render_block(&dir, &state.recent_files, &git);
            Ok(serde_json::json!({
                "project_dir": state.project_dir,
                "recent_files": state.recent_files,
                "git": git,
                "block": block,
            }))
        })
        .await
    }

    /// A receiver of every finished-run notice from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Notice> {
        self.inner.finished.subscribe()
    }

    /// Refuses new spawns from now on (shutdown).
    pub fn stop_accepting(&self) {
        self.inner.accepting.store(false, Ordering::SeqCst);
    }

    /// Marks the state database as cleanly stopped, as its last write
    /// (later commits are refused): the next start skips its integrity
    /// check. Called once the socket is closed. False: the store met an
    /// I/O failure or damage and left no mark.
    pub async fn close_store(&self) -> Result<bool, EngineError> {
        self.stop_accepting();
        let store = self.inner.store.clone();
        blocking(move || store.close_clean().map_err(EngineError::from)).await
    }
}

/// A run in memory's status now, with its usage so far while its agent
/// has not given its final figures.
fn live_status(slot: &Slot) -> RunStatus {
    let rec = slot.snapshot();
    let mut st = RunStatus::from(&rec);
    if let Some(u) = slot.usage_so_far(&rec) {
        st.usage = Some(u);
    }
    st
}

/// The snapshot and the block for a session right now, for `who`
/// (refused when the session is another uid's). Blocking.
fn current(
    inner: &Inner,
    session: &str,
    who: Option<&policy::rights::Requester>,
) -> Result<(crate::sessions::SessionState, policy::workctx::GitSnapshot), EngineError> {
    let existing = inner.store.session(session)?;
    crate::sessions::check_use(session, existing.as_ref(), who)?;
    let state = existing.unwrap_or_default();
    let git = match &state.project_dir {
        Some(d) => crate::gitsnap::snapshot(d, inner.cfg.git_budget),
        None => policy::workctx::GitSnapshot::Unavailable {
            reason: "the session has no project dir yet".into(),
        },
    };
    Ok((state, git))
}

/// One page of a list.
#[derive(Debug, Clone, PartialEq)]
pub struct ListPage {
    /// The runs, in the list's order.
    pub runs: Vec<RunStatus>,
    /// The cursor of the next page (its last run), when there are more.
    pub next: Option<RunId>,
}

/// One count in the engine's `waiting` for a spawn that found no free
/// slot, taken back unless the run is queued ([`Waiting::keep`]).
struct Waiting<'a> {
    count: &'a AtomicUsize,
    held: bool,
}

impl<'a> Waiting<'a> {
    fn new(count: &'a AtomicUsize, wait: bool) -> Waiting<'a> {
        if wait {
            count.fetch_add(1, Ordering::SeqCst);
        }
        Waiting { count, held: wait }
    }

    /// The run is queued: the dispatcher takes the count back. Returns
    /// whether there was one.
    fn keep(mut self) -> bool {
        std::mem::replace(&mut self.held, false)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.held {
            self.count.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Starts queued runs in FIFO order as slots free up.
async fn dispatch(sup: Supervisor, mut rx: mpsc::UnboundedReceiver<RunId>) {
    while let Some(id) = rx.recv().await {
        let Ok(permit) = sup.inner.slots.clone().acquire_owned().await else {
            return;
        };
        sup.inner.waiting.fetch_sub(1, Ordering::SeqCst);
        let Ok(slot) = sup.inner.slot(&id) else {
            continue;
        };
        if slurm::is_slurm(&slot.snapshot()) {
            tokio::spawn(slurm::run_lifecycle(sup.inner.clone(), slot, permit));
        } else {
            tokio::spawn(launch::run_lifecycle(sup.inner.clone(), slot, permit));
        }
    }
}
