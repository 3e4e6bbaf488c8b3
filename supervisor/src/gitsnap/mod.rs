//! The git snapshot taken at spawn (git2, no network), under a hard time
//! budget: a repository too large to finish in time, a missing or broken
//! repository gives an `unavailable` snapshot with the reason, and the
//! spawn goes on. A child may have written the repository: it is checked
//! before libgit2 opens it, and libgit2 works on it on one thread at a
//! time.
//!
//! Layout: this file takes the branch, HEAD and upstream; `counts` the
//! staged, modified and untracked counts from libgit2's status;
//! `precheck` the repository's files before libgit2 reads them, `guard`
//! the one bounded libgit2 thread per repository.

pub mod counts;
pub mod guard;
pub mod precheck;

use git2::{BranchType, ErrorCode, Repository, RepositoryOpenFlags};
use policy::workctx::GitSnapshot;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The budget of a snapshot: 2 seconds.
pub const BUDGET: Duration = Duration::from_secs(2);

fn unavailable(reason: impl Into<String>) -> GitSnapshot {
    GitSnapshot::Unavailable {
        reason: reason.into(),
    }
}

fn clean(p: &Path) -> PathBuf {
    p.components().collect()
}

fn budget_text(b: Duration) -> String {
    if b.subsec_millis() == 0 {
        format!("{} s", b.as_secs())
    } else {
        format!("{:.1} s", b.as_secs_f64())
    }
}

/// Takes the snapshot of the repository containing `dir` within `budget`
/// (a zero budget always times out: it simulates a slow repository).
pub fn snapshot(dir: &Path, budget: Duration) -> GitSnapshot {
    snapshot_with_paths(dir, budget, None).0
}

/// The snapshot, and the status's paths and HEAD when it is available;
/// with `since` (a commit id), the paths that differ from that commit too.
pub fn snapshot_with_paths(
    dir: &Path,
    budget: Duration,
    since: Option<String>,
) -> (GitSnapshot, counts::Listing) {
    let none = counts::Listing::default;
    let timed_out = || unavailable(format!("timed out after {}", budget_text(budget)));
    if budget.is_zero() {
        return (timed_out(), none());
    }
    let found = match precheck::check(dir) {
        Ok(f) => f,
        Err(e) => return (unavailable(e.to_string()), none()),
    };
    let repo = found.common_dir.clone();
    let work = move || compute(&found, since.as_deref());
    match guard::bounded(repo, budget, "git-snapshot", work, drop) {
        Ok(s) => s,
        Err(guard::GuardError::Busy) => {
            (unavailable("a previous snapshot is still running"), none())
        }
        // The thread finishes on its own; its result is dropped.
        Err(guard::GuardError::TimedOut) => (timed_out(), none()),
        Err(guard::GuardError::Spawn(_)) => {
            (unavailable("could not start the snapshot thread"), none())
        }
    }
}

/// Why the repository [`precheck::check`] found could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// libgit2 could not open it.
    #[error("broken repository: {}", .0.message())]
    Broken(#[source] git2::Error),
    /// Its `core.worktree` points elsewhere.
    #[error("the work tree is set elsewhere ({}): not followed", .0.display())]
    WorkTreeElsewhere(PathBuf),
}

/// Opens the repository [`precheck::check`] found, and no other: its work
/// tree must be where its `.git` is (no `core.worktree` elsewhere).
pub fn open_found(found: &precheck::Found) -> Result<Repository, OpenError> {
    let repo = Repository::open_ext(
        &found.root,
        RepositoryOpenFlags::NO_SEARCH,
        std::iter::empty::<&std::ffi::OsStr>(),
    )
    .map_err(OpenError::Broken)?;
    match repo.workdir().map(clean) {
        Some(w) if w != found.root => Err(OpenError::WorkTreeElsewhere(w)),
        _ => Ok(repo),
    }
}

fn compute(found: &precheck::Found, since: Option<&str>) -> (GitSnapshot, counts::Listing) {
    let none = counts::Listing::default;
    let repo = match open_found(found) {
        Ok(r) => r,
        Err(why) => return (unavailable(why.to_string()), none()),
    };
    let Some(worktree) = repo.workdir().map(clean) else {
        return (unavailable("a bare repository has no work tree"), none());
    };
    let common_dir = clean(repo.commondir());
    let detached = repo.head_detached().unwrap_or(false);
    let (branch, head_oid) = match repo.head() {
        Ok(h) => {
            let name = if detached {
                "(detached)".to_owned()
            } else {
                h.shorthand().unwrap_or("(unknown)").to_owned()
            };
            (name, h.target())
        }
        Err(e) if e.code() == ErrorCode::UnbornBranch => {
            let name = repo
                .find_reference("HEAD")
                .ok()
                .and_then(|r| {
                    r.symbolic_target()
                        .ok()
                        .flatten()
                        .map(|t| t.trim_start_matches("refs/heads/").to_owned())
                })
                .unwrap_or_else(|| "(unborn)".into());
            (name, None)
        }
        Err(e) => {
            return (
                unavailable(format!("broken repository: {}", e.message())),
                none(),
            )
        }
    };
    let head = head_oid.map_or("(none)".to_owned(), |o| o.to_string()[..7].to_owned());
    let (mut upstream, mut ahead, mut behind) = (None, None, None);
    if !detached {
        if let Ok(local) = repo.find_branch(&branch, BranchType::Local) {
            if let Ok(up) = local.upstream() {
                if let (Some(l), Some(u)) = (local.get().target(), up.get().target()) {
                    if let Ok((a, b)) = repo.graph_ahead_behind(l, u) {
                        upstream = up.name().ok().flatten().map(str::to_owned);
                        ahead = Some(a);
                        behind = Some(b);
                    }
                }
            }
        }
    }
    let (c, mut paths) = match counts::counts(&repo) {
        Ok(c) => c,
        Err(e) => {
            return (
                unavailable(format!("git status failed: {}", e.message())),
                none(),
            )
        }
    };
    let flagged = match counts::flagged(&repo) {
        Ok(Some(f)) => f,
        Ok(None) => {
            paths = None;
            Vec::new()
        }
        Err(e) => {
            let why = format!("reading the index failed: {}", e.message());
            return (unavailable(why), none());
        }
    };
    let head_full = head_oid.map(|o| o.to_string());
    if let Some(old) = since.filter(|old| head_full.as_deref() != Some(*old)) {
        if let Err(e) = counts::add_since(&repo, old, &mut paths) {
            let why = format!("comparing with commit {old} failed: {}", e.message());
            return (unavailable(why), none());
        }
    }
    let counts::Counts {
        staged,
        modified,
        untracked,
    } = c;
    let snapshot = GitSnapshot::Available {
        worktree,
        common_dir,
        branch,
        head,
        upstream,
        ahead,
        behind,
        staged,
        modified,
        untracked,
    };
    let listing = counts::Listing {
        paths,
        flagged,
        head: head_full,
    };
    (snapshot, listing)
}
