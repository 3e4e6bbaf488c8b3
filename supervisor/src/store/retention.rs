//! What retention reads from the store: the runs it may prune, and the
//! runs whose pruning a crash interrupted.

use crate::ids::RunId;
use std::path::PathBuf;

/// An ended, finalized run that is not pruned: what retention weighs.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub run_id: RunId,
    pub session_id: String,
    pub owner_uid: u32,
    pub ended_at_ms: u64,
    /// The run folder's size after its cleanup (0 when not measured).
    pub dir_bytes: u64,
    /// Its notice has not been taken.
    pub notice_pending: bool,
    /// Its worktree, when it had one.
    pub worktree_dir: Option<PathBuf>,
}

/// A run marked for pruning whose folder may still be there.
#[derive(Debug, Clone, PartialEq)]
pub struct Pruning {
    pub run_id: RunId,
    pub session_id: String,
    pub run_dir: PathBuf,
}
