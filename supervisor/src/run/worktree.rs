//! A run's git worktree, as run.json records it.
//! Uses serde only.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// A child's git worktree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Worktree {
    /// Its directory (`<session>/worktrees/<run_id>`).
    pub dir: PathBuf,
    /// Its branch (`subagent/<run_id>`).
    pub branch: String,
}
