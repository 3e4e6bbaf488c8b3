//! What the store is asked to do and what it answers: the ops a commit
//! applies, a list's query and page, what a run id holds.

use crate::ids::RunId;
use crate::run::record::{RunRecord, RunState};
use crate::sessions::SessionState;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// One change, applied in its request's savepoint.
#[derive(Debug)]
pub enum Op {
    /// A new run: its row, details, runner spec, first picture, and its
    /// session (inserted whole when new; else only `project_dir` is set).
    /// Refused ([`StoreError::NotOwned`]) when the session is another
    /// owner's than the run's, as it may have become since the spawn was
    /// checked.
    ///
    /// [`StoreError::NotOwned`]: super::StoreError::NotOwned
    Accept {
        rec: Box<RunRecord>,
        spec: Vec<u8>,
        before: Option<Vec<u8>>,
        session: SessionState,
    },
    /// Its runner started.
    Started {
        id: RunId,
        pid: i32,
        ticks: u64,
        at_ms: u64,
    },
    /// The record changed (cancel asked, requeued, adopted, uid, an end
    /// before finalizing). An ended record's state goes to `end_state`; the
    /// published `state` becomes terminal only with [`Op::Finalize`].
    Update(Box<RunRecord>),
    /// What finalizing found, recorded before it is acted on (the same
    /// write as [`Op::Update`]).
    Reported(Box<RunRecord>),
    /// The end handled (or failed, with `finalize_error`): publishes the
    /// terminal state; when finalized, makes its notice pending (once),
    /// drops the spec and first picture and keeps `context`.
    Finalize {
        rec: Box<RunRecord>,
        context: Option<BTreeMap<String, String>>,
    },
    /// The run folder's size, measured after its cleanup.
    DirBytes { id: RunId, bytes: u64 },
    /// A new per-run uid and the runner spec that names it.
    Reuid { id: RunId, uid: u32, spec: Vec<u8> },
    /// Takes the session's pending notices, oldest first (in [`Out::notices`]).
    TakeNotices { session: String },
    /// Puts `files` (relative ones against the session's project dir) at
    /// the front of its recent files; a new session is `owner_uid`'s. The
    /// state is in [`Out::session`]. Refused ([`StoreError::NotOwned`])
    /// when the session is not `requester`'s (`None`: the daemon's uid or
    /// root, who may touch any).
    ///
    /// [`StoreError::NotOwned`]: super::StoreError::NotOwned
    Touch {
        session: String,
        files: Vec<PathBuf>,
        owner_uid: u32,
        requester: Option<u32>,
    },
    /// Retention chose these runs: left out of lists from now on.
    PruneMark { ids: Vec<RunId>, reason: String },
    /// Their folders are gone: tombstones from now on.
    PruneDone { ids: Vec<RunId> },
    /// Tombstones pruned before `before_ms` are forgotten, then all but
    /// the newest `keep` (by the time they were pruned): their rows go, and
    /// their ids are not found from then on.
    ForgetPruned { before_ms: u64, keep: u64 },
    /// Sets (or with `None` removes) one of the store's marks.
    SetMeta { key: String, value: Option<String> },
    /// Sets the clean-stop mark to `at`, unless the store has met an I/O
    /// failure or damage (then refused: [`StoreError::Tainted`]). Decided
    /// by the writer, after every request before it.
    ///
    /// [`StoreError::Tainted`]: super::StoreError::Tainted
    MarkClean { at: String },
}

/// What the store holds for a run id.
#[derive(Debug, Clone, PartialEq)]
pub enum Stored {
    /// The run's record.
    Live(Box<RunRecord>),
    /// Pruned (or being pruned) at `at_ms`, for `reason`; `owner_uid`'s.
    Pruned {
        at_ms: u64,
        reason: String,
        owner_uid: u32,
    },
}

/// Which runs a list returns, in run id order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ListQuery {
    /// Only this session's.
    pub session: Option<String>,
    /// Only runs in this published state.
    pub state: Option<RunState>,
    /// Only runs of this owner.
    pub owner_uid: Option<u32>,
    /// Created at or after (ms since the epoch; the time in the run id).
    pub since_ms: Option<u64>,
    /// Created at or before (ms since the epoch; the time in the run id).
    pub until_ms: Option<u64>,
    /// After this id in the list's order (the cursor).
    pub after: Option<RunId>,
    /// Newest first.
    pub desc: bool,
    /// At most this many.
    pub limit: usize,
}

/// Which runs' usage is summed (all of them, tombstones included).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UsageQuery {
    /// Only this session's.
    pub session: Option<String>,
    /// Only runs of this owner.
    pub owner_uid: Option<u32>,
    /// Created at or after (ms since the epoch; the time in the run id).
    pub since_ms: Option<u64>,
    /// Created at or before (ms since the epoch; the time in the run id).
    pub until_ms: Option<u64>,
}

/// One page of a list.
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    /// The runs, in the list's order.
    pub runs: Vec<RunRecord>,
    /// The cursor of the next page, when there are more.
    pub next: Option<RunId>,
}
