//! The engine's shared state: [`Inner`] (what every phase reads, and the
//! run table, queue, slots and leases) and [`Slot`] (one run in memory),
//! each field with its locking rule. Phases take `Inner` (by reference,
//! or an `Arc` of it for what outlives a call); only the engine's API
//! (`engine/mod.rs`) holds the `Supervisor` handle. May use
//! the engine's config, errors and probe, the record, and the store.

use super::config::Config;
use super::error::{EngineError, InternalError};
use super::probe;
use crate::ids::RunId;
use crate::paths::StateLayout;
use crate::protocol::Notice;
use crate::run::record::RunRecord;
use crate::store::{Op, Store};
use std::collections::{BTreeMap, HashMap};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{broadcast, mpsc, watch, Semaphore};

/// One run in memory: its record (the lock serialises its changes) and
/// the last published snapshot, which waiters watch.
pub(crate) struct Slot {
    /// The record. A tokio lock, held across the awaits of a change (its
    /// save on the blocking pool); taken before any other lock of the
    /// slot, never while `Inner::runs` is held.
    pub(super) rec: tokio::sync::Mutex<RunRecord>,
    /// The last published snapshot. Lock-free; sent while `rec` is held,
    /// so snapshots follow the record's order.
    pub(super) published: watch::Sender<RunRecord>,
    /// Its runner's pidfd and pid, for cancels. Held only to copy or
    /// replace the pair (may be taken while `rec` is held).
    pub(super) runner: Mutex<Option<(Arc<OwnedFd>, i32)>>,
    /// Its runner was started by an engine that is gone (recovery watches
    /// it): if it ends called off at its gate, its run is queued again.
    /// Atomic: set before the watch starts, swapped off once by the end.
    pub(super) adopted: AtomicBool,
    /// Its egress proxy, while it runs in allowlist mode. Held only to
    /// set or take the handle; the handle is stopped after release.
    pub(super) egress: Mutex<Option<crate::egress::Handle>>,
    /// Its model gateway, while a driver run runs. As `egress`.
    pub(super) gateway: Mutex<Option<crate::gateway::Handle>>,
    /// Its runner spec as committed, while it waits for a slot (none after
    /// a restart: the store's copy is read then). Held only to set or take.
    pub(super) spec: Mutex<Option<Vec<u8>>>,
    /// A driver run's usage so far and how far its log was read, made at
    /// the first look. Held for one bounded read of the log.
    usage: Mutex<Option<crate::usage::LogUsage>>,
}

impl Slot {
    pub(super) fn new(rec: RunRecord) -> Arc<Slot> {
        let (published, _) = watch::channel(rec.clone());
        Arc::new(Slot {
            rec: tokio::sync::Mutex::new(rec),
            published,
            runner: Mutex::new(None),
            adopted: AtomicBool::new(false),
            egress: Mutex::new(None),
            gateway: Mutex::new(None),
            spec: Mutex::new(None),
            usage: Mutex::new(None),
        })
    }

    /// A driver run's usage so far, until its report holds the final
    /// figures: what its log gained since the last look is read
    /// ([`crate::usage::LogUsage`]). `None` for a plain command or a run
    /// with its report. Blocking (one bounded read).
    pub(super) fn usage_so_far(&self, rec: &RunRecord) -> Option<policy::usage::Usage> {
        let d = rec.driver_run.as_ref()?;
        if !d.driver.streams() || d.report.is_some() {
            return None;
        }
        let mut held = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        let live = held.get_or_insert_with(|| crate::usage::LogUsage::new(d.driver));
        Some(live.update(&rec.files().log()))
    }

    pub(super) fn set_spec(&self, spec: Vec<u8>) {
        *self.spec.lock().unwrap_or_else(|p| p.into_inner()) = Some(spec);
    }

    /// Takes the runner spec kept for the run's launch.
    pub(super) fn take_spec(&self) -> Option<Vec<u8>> {
        self.spec.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    pub(super) fn set_gateway(&self, h: Option<crate::gateway::Handle>) {
        *self.gateway.lock().unwrap_or_else(|p| p.into_inner()) = h;
    }

    /// Ends the run's model gateway and its connections.
    pub(super) async fn stop_gateway(&self) {
        let h = self
            .gateway
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(h) = h {
            h.stop().await;
        }
    }

    pub(super) fn set_egress(&self, h: Option<crate::egress::Handle>) {
        *self.egress.lock().unwrap_or_else(|p| p.into_inner()) = h;
    }

    /// Ends the run's egress proxy and its connections, their lines in
    /// egress.log written.
    pub(super) async fn stop_egress(&self) {
        let h = self.egress.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = h {
            h.stop().await;
        }
    }

    pub(super) fn snapshot(&self) -> RunRecord {
        self.published.borrow().clone()
    }
}

/// What retention's limits count, kept between passes so that a run's end
/// can tell whether it crossed one without reading the history: set at
/// start from one query, raised by each run finalized, set again by each
/// pass from what it kept. A count a race leaves off by one is set right
/// by the next pass.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    pub(super) total: u64,
    pub(super) sessions: HashMap<String, u64>,
    pub(super) bytes: u64,
}

impl Tally {
    fn over(&self, limits: &policy::retention::Limits, session: &str) -> bool {
        let in_session = self.sessions.get(session).copied().unwrap_or(0);
        limits.max_runs.is_some_and(|m| self.total > m)
            || limits.max_runs_per_session.is_some_and(|m| in_session > m)
            || limits.max_bytes.is_some_and(|m| self.bytes > m)
    }
}

/// Prunes soon after a limit is crossed: the counts, the wake-up of the
/// task that prunes (`prune::when_crossed`), and the lock that keeps
/// passes one at a time.
#[derive(Debug, Default)]
pub(crate) struct RetentionTrigger {
    tally: Mutex<Tally>,
    soon: Arc<tokio::sync::Notify>,
    pass: tokio::sync::Mutex<()>,
}

impl RetentionTrigger {
    /// A run of `session` was finalized, its folder `bytes` on disk:
    /// counted, and the pruning task woken when that crossed one of
    /// `limits`.
    pub(super) fn finalized(&self, session: &str, bytes: u64, limits: &policy::retention::Limits) {
        let over = {
            let mut t = self.tally.lock().unwrap_or_else(|p| p.into_inner());
            t.total = t.total.saturating_add(1);
            t.bytes = t.bytes.saturating_add(bytes);
            let n = t.sessions.entry(session.to_owned()).or_default();
            *n = n.saturating_add(1);
            t.over(limits, session)
        };
        if over {
            self.soon.notify_one();
        }
    }

    /// Notices of `session` were taken: the runs they kept may be pruned
    /// now, so the pruning task is woken when a limit is still crossed.
    pub(super) fn notices_taken(&self, session: &str, limits: &policy::retention::Limits) {
        let over = self
            .tally
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .over(limits, session);
        if over {
            self.soon.notify_one();
        }
    }

    /// The counts the start found, the pruning task woken when the
    /// history is past a limit already. Runs finalized while they were
    /// counted may be off by one until the next pass.
    pub(super) fn counted(&self, t: Tally, limits: &policy::retention::Limits) {
        let over = limits.max_runs.is_some_and(|m| t.total > m)
            || limits.max_bytes.is_some_and(|m| t.bytes > m)
            || limits
                .max_runs_per_session
                .is_some_and(|m| t.sessions.values().any(|&n| n > m));
        self.set(t);
        if over {
            self.soon.notify_one();
        }
    }

    /// The counts as a pass (or the start) found them.
    pub(super) fn set(&self, t: Tally) {
        *self.tally.lock().unwrap_or_else(|p| p.into_inner()) = t;
    }

    /// What the pruning task waits on.
    pub(super) fn soon(&self) -> Arc<tokio::sync::Notify> {
        self.soon.clone()
    }

    /// Held for one pass, so passes never overlap: awaited before the
    /// pass takes a blocking thread, so callers waiting for it hold none.
    pub(super) async fn one_pass(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.pass.lock().await
    }
}

/// The state dir's lock, and the shared dir's when run folders live there;
/// held for the engine's life.
pub(crate) struct StateLocks {
    pub(super) _state: std::fs::File,
    pub(super) _runs: Option<std::fs::File>,
}

/// The engine's shared state: what every phase reads, and the few
/// things that change, each with its own lock or atomic.
pub(crate) struct Inner {
    /// The configuration, resolved at start. Immutable.
    pub(super) cfg: Config,
    /// Where the state dir's files live. Immutable.
    pub(super) layout: StateLayout,
    /// The runs not settled yet (accepted, running, or ended and not
    /// finalized), by id; a settled run is read from the store. A std lock
    /// held only to look up, insert, remove or copy out slots: never across
    /// an await, never while taking a slot's `rec`.
    pub(super) runs: Mutex<BTreeMap<RunId, Arc<Slot>>>,
    /// Accepted runs for the dispatcher, in FIFO order. Lock-free.
    pub(super) queue: mpsc::UnboundedSender<RunId>,
    /// At most `max_concurrent` runs at once: one permit per running run
    /// (runners adopted at recovery take one only when one is free).
    pub(super) slots: Arc<Semaphore>,
    /// The durable records: runs, sessions, notices. Its writer thread
    /// serialises commits; its reads never wait for it, and its reads are
    /// blocking (short: one indexed query).
    pub(super) store: Arc<Store>,
    /// Every finished run's notice, for subscribers. Lock-free.
    pub(super) finished: broadcast::Sender<Notice>,
    /// What retention counts between passes, and its wake-up when a run's
    /// end crosses a limit. Its locks are held only to count, or (the pass
    /// lock) on a blocking thread for one pass.
    pub(super) retention: RetentionTrigger,
    /// The daemon's environment at start. Immutable.
    pub(super) daemon_env: Vec<(String, String)>,
    /// Whether spawns are taken (cleared at shutdown). Atomic: read by
    /// every spawn without a lock.
    pub(super) accepting: AtomicBool,
    /// What this host can enforce, probed at start. Immutable.
    pub(super) probe: probe::HostProbe,
    /// The config's tool policy. Immutable.
    pub(super) tools: policy::toolpolicy::ToolPolicy,
    /// Runs queued and not yet handed a slot by the dispatcher. Atomic:
    /// spawns and the dispatcher count it without a lock, so a spawn never
    /// starts before a run already waiting.
    pub(super) waiting: AtomicUsize,
    /// Per-run uids (a root daemon without `run_as`). Its own file locks.
    pub(super) uids: Option<crate::uids::UidPool>,
    /// Held by the blocking work that may wait on git (an accept, which
    /// may make a worktree, and a working context's snapshot), so that
    /// slow repositories hold at most half of the daemon's blocking pool.
    pub(super) git_work: Semaphore,
    /// The uid leases of runs not started yet. A std lock held only to
    /// insert or remove one; never across an await.
    pub(super) leases: Mutex<BTreeMap<RunId, crate::uids::UidLease>>,
    /// The engine's counters and histograms. Lock-free (atomics).
    pub(super) metrics: crate::metrics::Metrics,
    /// The runs whose slots were let go lately, with when: a live view
    /// shows a run's end for a while after. A std lock held only to push
    /// or copy; bounded in age and count ([`RecentEnds`]).
    pub(super) recent_ends: Mutex<RecentEnds>,
    /// The live Slurm jobs and their poll (idle without any).
    pub(super) jobs: Arc<super::jobs::Jobs>,
    /// The job services port, when the config sets one.
    pub(super) services: Option<Arc<super::services::Services>>,
    /// The state dir's lock, held for the engine's life.
    pub(super) _state_lock: StateLocks,
}

/// The runs that ended lately (their slot let go), oldest first: at most
/// [`RecentEnds::MAX`] of them, none older than [`RecentEnds::KEEP_MS`].
#[derive(Debug, Default)]
pub(crate) struct RecentEnds(std::collections::VecDeque<(RunId, u64)>);

impl RecentEnds {
    /// How long an end is remembered.
    pub(crate) const KEEP_MS: u64 = 60_000;
    /// The most ends remembered.
    pub(crate) const MAX: usize = 256;

    fn expire(&mut self, now_ms: u64) {
        let since = now_ms.saturating_sub(Self::KEEP_MS);
        while self.0.front().is_some_and(|(_, at)| *at < since) || self.0.len() > Self::MAX {
            self.0.pop_front();
        }
    }

    /// Remembers that `id`'s slot was let go at `now_ms`.
    pub(crate) fn push(&mut self, id: RunId, now_ms: u64) {
        self.0.push_back((id, now_ms));
        self.expire(now_ms);
    }

    /// The runs let go within [`RecentEnds::KEEP_MS`] of `now_ms`.
    pub(crate) fn since(&mut self, now_ms: u64) -> Vec<RunId> {
        self.expire(now_ms);
        self.0.iter().map(|(id, _)| id.clone()).collect()
    }
}

impl Inner {
    pub(super) fn slot(&self, id: &RunId) -> Result<Arc<Slot>, EngineError> {
        self.runs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
            .ok_or_else(|| EngineError::RunNotFound(id.to_string()))
    }

    /// A permit of [`Inner::git_work`], for blocking work that may wait on
    /// git; the semaphore is never closed.
    pub(super) async fn git_permit(&self) -> Result<tokio::sync::SemaphorePermit<'_>, EngineError> {
        self.git_work
            .acquire()
            .await
            .map_err(|_| EngineError::ShuttingDown)
    }

    /// The run's slot, when it is not settled yet.
    pub(super) fn live_slot(&self, id: &RunId) -> Option<Arc<Slot>> {
        self.runs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    /// Lets a settled run's slot go: from now on it is read from the store
    /// (and shown by a live view for a while).
    pub(super) fn forget(&self, id: &RunId) {
        self.runs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
        self.recent_ends
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(id.clone(), crate::timefmt::now_ms());
    }

    pub(super) fn insert(&self, rec: RunRecord) -> Option<Arc<Slot>> {
        let id = rec.run_id.clone();
        let slot = Slot::new(rec);
        self.runs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, slot.clone());
        Some(slot)
    }

    /// A slot for a run to start at once: only when none is queued, so
    /// that runs start in the order they were accepted.
    pub(super) fn free_slot(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        if self.waiting.load(Ordering::SeqCst) > 0 {
            return None;
        }
        self.slots.clone().try_acquire_owned().ok()
    }

    /// Queues an accepted run for the dispatcher.
    pub(super) fn enqueue(&self, id: RunId) -> Result<(), EngineError> {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        self.queue(id)
    }

    /// Queues a run already counted as waiting.
    pub(super) fn queue(&self, id: RunId) -> Result<(), EngineError> {
        self.queue.send(id).map_err(|_| {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            EngineError::ShuttingDown
        })
    }

    /// Keeps a run's uid lease until its runner has it.
    pub(super) fn hold_lease(&self, id: &RunId, lease: crate::uids::UidLease) {
        self.leases().insert(id.clone(), lease);
    }

    /// Takes a run's uid lease (to hand to its runner, or to let it go).
    pub(super) fn take_lease(&self, id: &RunId) -> Option<crate::uids::UidLease> {
        self.leases().remove(id)
    }

    fn leases(&self) -> std::sync::MutexGuard<'_, BTreeMap<RunId, crate::uids::UidLease>> {
        self.leases.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Replaces the record with `next`, durably, and publishes it to
    /// status readers and waiters, except for a terminal state that is not
    /// finalized yet: nobody sees a run as ended before its result.md and
    /// notice exist.
    pub(super) async fn persist(
        &self,
        slot: &Slot,
        current: &mut RunRecord,
        next: RunRecord,
    ) -> Result<(), EngineError> {
        let op = Op::Update(Box::new(next.clone()));
        let saved = self
            .store
            .commit(vec![op])
            .await
            .map(drop)
            .map_err(EngineError::from);
        if saved.is_ok() {
            *current = next;
            if !current.state().is_terminal() || current.settled() {
                slot.published.send_replace(current.clone());
            }
        }
        saved
    }
}

/// Whose a run is: its requester's when another uid asked for it, else
/// the daemon's.
pub(crate) fn run_owner(rec: &RunRecord) -> u32 {
    let recorded = rec.on_behalf.as_ref().map(|ob| ob.requester.uid);
    policy::rights::recorded_owner(recorded, crate::paths::uid())
}

/// Runs `f` on the blocking pool.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, EngineError> + Send + 'static,
) -> Result<T, EngineError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| EngineError::Unexpected(InternalError::Join(e)))?
}
