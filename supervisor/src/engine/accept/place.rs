//! Where a new run lives and works, fixed before anything is composed.
//! May use ids, paths and the run's data.

use crate::ids::RunId;
use crate::paths::RunFiles;
use crate::run::worktree::Worktree;
use std::path::PathBuf;

/// Where a new run lives and works, fixed before anything is composed.
pub(super) struct RunPlace {
    pub(super) id: RunId,
    /// Its folder where it will live (the paths its records hold).
    pub(super) files: RunFiles,
    pub(super) temp_dir: PathBuf,
    pub(super) worktree: Option<Worktree>,
    /// Where the child works: its worktree, else the project.
    pub(super) workdir: PathBuf,
}
