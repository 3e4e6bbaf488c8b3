//! A run's git worktree (`isolation: worktree`): made from HEAD on a
//! branch of its own at spawn, given to the run's user, removed with the
//! run or on `subagent worktree rm`. May use the engine's errors,
//! gitsnap, securedir and the run's data.

use super::error::{EngineError, StorageError, WorktreeError};
use crate::run::worktree::Worktree;
use std::path::{Path, PathBuf};
use subagent_runner::ioerr::at as io;

/// How long creating a worktree may take (a checkout of a large tree).
pub const WORKTREE_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Creates the worktree of run `run_id` for the repository holding
/// `project_dir`, on a new branch from HEAD. The repository is checked
/// first (a child may have written it: see [`crate::gitsnap::precheck`]);
/// libgit2 then works on a thread of its own, under [`WORKTREE_LIMIT`]
/// (what it makes after that is removed). Blocking.
pub fn create_worktree(
    project_dir: &Path,
    session_dir: &Path,
    run_id: &str,
) -> Result<Worktree, EngineError> {
    let found = crate::gitsnap::precheck::check(project_dir).map_err(|e| {
        EngineError::invalid(
            "isolation",
            format!("worktree needs project_dir in a git repository: {e}"),
        )
    })?;
    let parent = session_dir.join("worktrees");
    std::fs::create_dir_all(&parent)
        .map_err(io("create", &parent))
        .map_err(StorageError::from)?;
    let repo = found.common_dir.clone();
    let (project, id) = (project_dir.to_path_buf(), run_id.to_owned());
    let late_id = id.clone();
    let work = move || add_worktree(&found, &parent, &id);
    let undo = move |made: Result<Worktree, EngineError>| {
        if let Ok(w) = made {
            let _ = remove_worktree(&project, &w, &late_id);
        }
    };
    use crate::gitsnap::guard::{bounded, GuardError};
    let failed = match bounded(repo, WORKTREE_LIMIT, "git-worktree", work, undo) {
        Ok(made) => return made,
        Err(GuardError::Busy) => WorktreeError::Busy,
        Err(GuardError::TimedOut) => WorktreeError::TimedOut {
            secs: WORKTREE_LIMIT.as_secs(),
        },
        Err(GuardError::Spawn(why)) => WorktreeError::Thread(why),
    };
    Err(EngineError::RunDirs(failed.into()))
}

/// The libgit2 part of [`create_worktree`].
fn add_worktree(
    found: &crate::gitsnap::precheck::Found,
    parent: &Path,
    run_id: &str,
) -> Result<Worktree, EngineError> {
    let invalid = |why: String| EngineError::invalid("isolation", why);
    let repo = crate::gitsnap::open_found(found).map_err(|why| {
        invalid(format!(
            "worktree needs project_dir in a git repository: {why}"
        ))
    })?;
    let head = repo
        .head()
        .and_then(|h| h.peel_to_commit())
        .map_err(|e| invalid(format!("worktree needs a commit at HEAD: {}", e.message())))?;
    let branch = format!("subagent/{run_id}");
    let b = match repo.branch(&branch, &head, false) {
        Ok(b) => b,
        Err(source) => {
            let e = WorktreeError::Branch { branch, source };
            return Err(EngineError::RunDirs(e.into()));
        }
    };
    let dir = parent.join(run_id);
    let mut opts = git2::WorktreeAddOptions::new();
    opts.reference(Some(b.get()));
    let name = run_id.replace('.', "-");
    if let Err(source) = repo.worktree(&name, &dir, Some(&opts)) {
        let e = WorktreeError::Add { dir, source };
        return Err(EngineError::RunDirs(e.into()));
    }
    Ok(Worktree { dir, branch })
}

/// Gives a worktree to the `run_as` user (every entry, without following
/// symlinks), so the child can write it.
pub fn give_to(dir: &Path, uid: u32, gid: u32) -> Result<(), EngineError> {
    let mut stack = vec![dir.to_path_buf()];
    let give = |d: &Path| -> Result<Vec<PathBuf>, WorktreeError> {
        std::os::unix::fs::lchown(d, Some(uid), Some(gid)).map_err(io("chown", d))?;
        if !d.is_dir() || d.is_symlink() {
            return Ok(Vec::new());
        }
        let rd = std::fs::read_dir(d).map_err(io("list", d))?;
        Ok(rd.flatten().map(|e| e.path()).collect())
    };
    while let Some(d) = stack.pop() {
        stack.extend(give(&d).map_err(|e| EngineError::RunDirs(e.into()))?);
    }
    Ok(())
}

/// Removes a run's worktree and its branch. Blocking.
pub fn remove_worktree(
    project_dir: &Path,
    wt: &Worktree,
    run_id: &str,
) -> Result<(), WorktreeError> {
    let found = crate::gitsnap::precheck::check(project_dir)?;
    // gitsnap gives its reason as text.
    let repo = crate::gitsnap::open_found(&found).map_err(WorktreeError::Open)?;
    let name = run_id.replace('.', "-");
    // The checkout is removed as the record names it (in the state dir),
    // never as the repository's files (which a child may write) name it.
    if wt.dir.exists() {
        std::fs::remove_dir_all(&wt.dir).map_err(io("remove", &wt.dir))?;
    }
    remove_admin_dir(&found.common_dir, &name)?;
    if let Ok(mut b) = repo.find_branch(&wt.branch, git2::BranchType::Local) {
        b.delete().map_err(|source| WorktreeError::DeleteBranch {
            branch: wt.branch.clone(),
            source,
        })?;
    }
    Ok(())
}

/// Removes the repository's record of worktree `name`,
/// `<common dir>/worktrees/<name>`, without following a link on the way
/// or in it (a child with the write right may have planted one).
fn remove_admin_dir(common_dir: &Path, name: &str) -> Result<(), WorktreeError> {
    use std::os::fd::{AsFd, AsRawFd};
    if let Some((link, _)) = crate::securedir::link_on_the_way(common_dir) {
        return Err(WorktreeError::Linked(link));
    }
    let Ok(common) = subagent_runner::safefile::open_dir(common_dir) else {
        return Ok(());
    };
    let Ok(dir) =
        subagent_runner::safefile::open_dir_beneath(common.as_fd(), Path::new("worktrees"))
    else {
        return Ok(());
    };
    // The entry is named through the opened directory: remove_dir_all
    // follows no link beneath it.
    let at = PathBuf::from(format!("/proc/self/fd/{}/{name}", dir.as_raw_fd()));
    let removed = match std::fs::symlink_metadata(&at) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(&at),
        Ok(_) => std::fs::remove_file(&at),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    };
    removed
        .map_err(io("remove", &common_dir.join("worktrees").join(name)))
        .map_err(WorktreeError::from)
}
