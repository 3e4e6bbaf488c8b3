//! The working context at spawn (the session's recent files, the git
//! snapshot, an optional worktree) and the delta a successful child hands
//! back, verified on disk and merged exactly once, with what the
//! supervisor observed the run change.

use super::error::StorageError;
use super::{EngineError, Inner};
use crate::record::RunRecord;
use policy::observed::ObservedReport;
use policy::workctx::{
    claims, judge, parse_delta, FileFacts, GitSnapshot, Outcome, Verdict, DELTA_MAX_BYTES,
};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// A child's git worktree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Worktree {
    /// Its directory (`<session>/worktrees/<run_id>`).
    pub dir: PathBuf,
    /// Its branch (`subagent/<run_id>`).
    pub branch: String,
}

/// A run's worktree could not be made, given away or removed.
#[derive(Debug, thiserror::Error)]
pub enum WorktreeError {
    /// Earlier git work on the repository has not ended.
    #[error("git worktree add: earlier git work on the repository is still running")]
    Busy,
    /// The checkout passed [`WORKTREE_LIMIT`].
    #[error("git worktree add: not done after {secs} s")]
    TimedOut {
        /// The limit, in seconds.
        secs: u64,
    },
    /// No thread could be started for the checkout.
    #[error("git worktree add: could not start a thread: {0}")]
    Thread(#[source] std::io::Error),
    /// The run's branch could not be made.
    #[error("create branch {branch}: {}", source.message())]
    Branch {
        /// The branch.
        branch: String,
        /// The underlying error.
        source: git2::Error,
    },
    /// The worktree could not be checked out.
    #[error("git worktree add {}: {}", dir.display(), source.message())]
    Add {
        /// Its directory.
        dir: PathBuf,
        /// The underlying error.
        source: git2::Error,
    },
    /// A file-system step on the worktree failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// The step (`chown`, `list`, `remove`).
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The repository no longer passes the check.
    #[error(transparent)]
    Check(#[from] crate::gitsnap::precheck::PrecheckError),
    /// The repository could not be opened.
    #[error(transparent)]
    Open(#[from] crate::gitsnap::OpenError),
    /// The repository's git dir is reached through a symbolic link now.
    #[error("{} is a symbolic link; the worktree's record is left alone", .0.display())]
    Linked(PathBuf),
    /// The run's branch could not be deleted.
    #[error("delete branch {branch}: {}", source.message())]
    DeleteBranch {
        /// The branch.
        branch: String,
        /// The underlying error.
        source: git2::Error,
    },
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> WorktreeError + 'a {
    move |source| WorktreeError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

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
    std::fs::create_dir_all(&parent).map_err(StorageError::io("create", &parent))?;
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
    removed.map_err(io("remove", &common_dir.join("worktrees").join(name)))
}

/// What became of a run's delta.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeltaReport {
    /// Paths merged into the session's recent files, in merge order.
    pub accepted: Vec<Verdict>,
    /// Paths not merged, each with the reason.
    pub rejected: Vec<Verdict>,
    /// Why nothing was merged, when nothing was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

fn facts(claimed: &str, base: &Path) -> FileFacts {
    let p = Path::new(claimed);
    let full = if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    };
    let resolved = full.canonicalize().ok();
    let meta = resolved.as_ref().and_then(|r| std::fs::metadata(r).ok());
    FileFacts {
        claimed: claimed.to_owned(),
        resolved,
        regular: meta.as_ref().is_some_and(|m| m.is_file()),
        mtime_ms: meta
            .and_then(|m| m.modified().ok())
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_millis() as u64),
    }
}

/// Why delta.json was not read, named as the child knows it.
fn delta_error(e: &subagent_runner::safefile::SafeFileError) -> String {
    use subagent_runner::safefile::SafeFileError as E;
    match e {
        E::Symlink { .. } => "delta.json is a symbolic link, not a regular file".into(),
        E::NotRegular { kind, .. } => format!("delta.json is {kind}, not a regular file"),
        E::TooLarge { limit, .. } => {
            format!("delta.json is over the limit of {limit} bytes")
        }
        other => other.to_string(),
    }
}

/// Verifies the delta of a run that succeeded and merges what holds into
/// its session's recent files. Blocking.
pub(crate) fn merge_delta(inner: &Inner, rec: &RunRecord) -> DeltaReport {
    let mut report = DeltaReport::default();
    // The child wrote it: a regular file (no link, no FIFO), bounded.
    let path = rec.files().delta();
    let bytes = match subagent_runner::safefile::read(&path, DELTA_MAX_BYTES as u64) {
        Ok(b) => b,
        Err(e) if e.is_missing() => {
            // The runner keeps a delta only when it is a file within bounds.
            let left = rec.end().and_then(|e| e.kept.as_ref()).and_then(|k| {
                k.skipped
                    .iter()
                    .find(|s| s.dir == policy::sandbox::mounts::SCRATCH_DELTA)
            });
            report.note = Some(match left {
                Some(s) => format!("nothing merged: delta.json is {}", s.why),
                None => "no delta was written".into(),
            });
            return report;
        }
        Err(e) => {
            report.note = Some(format!("nothing merged: {}", delta_error(&e)));
            return report;
        }
    };
    let delta = match parse_delta(&bytes) {
        Ok(d) => d,
        Err(why) => {
            report.note = Some(format!("nothing merged: {why}"));
            return report;
        }
    };
    judge_and_merge(inner, rec, claims(&delta))
}

/// Judges each of `claimed` (in merge order) on disk against the run's
/// work dir (inside it, a regular file, changed during the run) and merges
/// those that hold into its session's recent files. Blocking.
pub(crate) fn judge_and_merge(
    inner: &Inner,
    rec: &RunRecord,
    claimed: impl IntoIterator<Item = String>,
) -> DeltaReport {
    let mut report = DeltaReport::default();
    let base = rec
        .worktree
        .as_ref()
        .map_or(rec.project_dir.clone(), |w| w.dir.clone());
    let root = base.canonicalize().unwrap_or(base.clone());
    let since = rec.started_at_ms().unwrap_or(rec.created_at_ms);
    let mut accepted = Vec::new();
    for c in claimed {
        let v = judge(&facts(&c, &base), std::slice::from_ref(&root), since);
        match &v.outcome {
            Outcome::Accepted(p) => {
                accepted.push(p.clone());
                report.accepted.push(v);
            }
            Outcome::Rejected(_) => report.rejected.push(v),
        }
    }
    if let Err(e) = merge_into_recent(inner, &rec.session_id, &accepted) {
        report.note = Some(format!("merging failed: {e}"));
    }
    report
}

/// Puts `files` at the front of the session's recent files.
fn merge_into_recent(
    inner: &Inner,
    session: &str,
    files: &[PathBuf],
) -> Result<(), crate::sessions::SessionError> {
    if !files.is_empty() {
        inner.sessions.update(session, |s| {
            s.recent_files = policy::workctx::touch(&s.recent_files, files);
        })?;
    }
    Ok(())
}

/// The first picture of what a run's `workdir` holds (see
/// [`crate::observe`]), taken with the spawn's git snapshot; none when the
/// run cannot write there. Blocking.
pub(crate) fn observe_before(
    inner: &Inner,
    workdir: &Path,
    writable: bool,
    git: (&GitSnapshot, crate::gitsnap::counts::Listing),
) -> crate::observe::Before {
    if !writable {
        return crate::observe::Before::No {
            why: "not observed: the run could not write its project".into(),
        };
    }
    crate::observe::before(
        workdir,
        git,
        &daemon_skip(inner, workdir),
        inner.cfg.git_budget,
    )
}

fn daemon_skip(inner: &Inner, root: &Path) -> crate::observe::Skip {
    crate::observe::Skip::within(root, &[&inner.cfg.state_dir, &inner.cfg.temp_base])
}

/// Reads the first picture back: the daemon wrote it, in the run folder.
fn read_before(rec: &RunRecord) -> crate::observe::Before {
    let path = rec.files().observed_before();
    let bytes = match subagent_runner::safefile::read(&path, crate::observe::BEFORE_MAX_BYTES) {
        Ok(b) => b,
        Err(e) if e.is_missing() => {
            return crate::observe::Before::No {
                why: "not observed: no picture was taken at spawn".into(),
            }
        }
        Err(e) => {
            return crate::observe::Before::No {
                why: format!("not observed: the picture taken at spawn is unreadable: {e}"),
            }
        }
    };
    serde_json::from_slice(&bytes).unwrap_or_else(|e| crate::observe::Before::No {
        why: format!("not observed: the picture taken at spawn is unreadable: {e}"),
    })
}

/// What the run changed in its project, as the supervisor sees it; on
/// success the files it created or changed that still hold a regular file
/// inside the project merge into the session's recent files. Blocking.
pub(crate) fn observe_and_merge(inner: &Inner, rec: &RunRecord, merge: bool) -> ObservedReport {
    let (root, first) = match read_before(rec) {
        crate::observe::Before::Yes { root, picture } => (root, picture),
        crate::observe::Before::No { why } => return ObservedReport::none(why),
    };
    let skip = daemon_skip(inner, &root);
    let (second, note) = match crate::observe::after(&first, &root, &skip, inner.cfg.git_budget) {
        Ok(p) => p,
        Err(e) => return ObservedReport::none(format!("not observed at the end: {e}")),
    };
    let changes = policy::observed::diff(&first, &second);
    let mut report = ObservedReport::of(first.source, &changes);
    for list in [
        &mut report.created,
        &mut report.modified,
        &mut report.deleted,
    ] {
        for p in list.iter_mut() {
            *p = crate::observe::shown(p);
        }
    }
    report.note = note;
    if !merge {
        return report;
    }
    let canonical = root.canonicalize().unwrap_or(root.clone());
    let merged: Vec<PathBuf> = changes
        .written_newest_first(&second)
        .iter()
        .filter(|rel| crate::observe::mergeable(rel) && !rel.starts_with(".git/"))
        .filter_map(|rel| {
            let v = judge(&facts(rel, &root), std::slice::from_ref(&canonical), 0);
            match v.outcome {
                Outcome::Accepted(p) => Some(p),
                Outcome::Rejected(_) => None,
            }
        })
        .take(policy::workctx::RECENT_CAP)
        .collect();
    match merge_into_recent(inner, &rec.session_id, &merged) {
        Ok(()) => report.merged = merged,
        Err(e) => report.note = Some(format!("merging failed: {e}")),
    }
    report
}

/// The snapshot and the block for a session right now, for `who`
/// (refused when the session is another uid's). Blocking.
pub(crate) fn current(
    inner: &Inner,
    session: &str,
    who: Option<&policy::rights::Requester>,
) -> Result<(crate::sessions::SessionState, GitSnapshot), crate::sessions::SessionError> {
    let state = inner.sessions.get_for(session, who)?;
    let git = match &state.project_dir {
        Some(d) => crate::gitsnap::snapshot(d, inner.cfg.git_budget),
        None => GitSnapshot::Unavailable {
            reason: "the session has no project dir yet".into(),
        },
    };
    Ok((state, git))
}
