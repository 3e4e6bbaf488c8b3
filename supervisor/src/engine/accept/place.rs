//! Where a new run lives and works, fixed before anything is composed:
//! its folder, its temp dir and its worktree. May use the engine's state,
//! errors and draft, ids, paths, protocol and the run's data.

use crate::engine::draft::RunDraft;
use crate::engine::error::EngineError;
use crate::engine::state::Inner;
use crate::ids::RunId;
use crate::paths::RunFiles;
use crate::protocol::SpawnParams;
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

/// Makes the run's temp dir (and worktree) in `draft`: where it will
/// work. Blocking.
pub(super) fn make(
    inner: &Inner,
    p: &SpawnParams,
    draft: &mut RunDraft,
) -> Result<RunPlace, EngineError> {
    let session = &p.session.id;
    let temp_dir = draft.make_temp_dir(&inner.cfg.temp_base, session)?;
    let worktree = match p.isolation {
        Some(crate::protocol::Isolation::Worktree) => {
            Some(draft.make_worktree(&p.session.project_dir, &inner.layout.session_dir(session))?)
        }
        _ => None,
    };
    Ok(RunPlace {
        id: draft.id().clone(),
        files: draft.files(),
        temp_dir,
        workdir: worktree
            .as_ref()
            .map_or(p.session.project_dir.clone(), |w| w.dir.clone()),
        worktree,
    })
}
