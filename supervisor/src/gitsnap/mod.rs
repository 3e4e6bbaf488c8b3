//! The git snapshot taken at spawn (git2, no network), under a hard time
//! budget: a repository too large to finish in time, a missing or broken
//! repository gives an `unavailable` snapshot with the reason, and the
//! spawn goes on.
//!
//! Layout: this file takes the branch, HEAD and upstream; `counts` the
//! staged, modified and untracked counts; `index` the index file
//! reader, `scan` the threaded work tree scan behind them and `listing`
//! the directory listings the scan keeps between snapshots.

pub mod counts;
pub mod index;
pub mod listing;
pub mod scan;

use git2::{BranchType, ErrorCode, Repository};
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
    let (tx, rx) = std::sync::mpsc::channel();
    let dir = dir.to_path_buf();
    let spawned = std::thread::Builder::new()
        .name("git-snapshot".into())
        .spawn(move || {
            let _ = tx.send(compute(&dir));
        });
    if spawned.is_err() {
        return unavailable("could not start the snapshot thread");
    }
    if budget.is_zero() {
        return unavailable(format!("timed out after {}", budget_text(budget)));
    }
    match rx.recv_timeout(budget) {
        Ok(s) => s,
        // The thread finishes on its own; its result is dropped.
        Err(_) => unavailable(format!("timed out after {}", budget_text(budget))),
    }
}

/// Opens the repository that contains `dir`.
pub fn open(dir: &Path) -> Result<Repository, String> {
    Repository::discover(dir).map_err(|e| match e.code() {
        ErrorCode::NotFound => "not a git repository".to_owned(),
        _ => format!("broken repository: {}", e.message()),
    })
}

fn compute(dir: &Path) -> GitSnapshot {
    let repo = match open(dir) {
        Ok(r) => r,
        Err(why) => return unavailable(why),
    };
    let Some(worktree) = repo.workdir().map(clean) else {
        return unavailable("a bare repository has no work tree");
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
        Err(e) => return unavailable(format!("broken repository: {}", e.message())),
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
    let (c, _method) = match counts::counts(&repo) {
        Ok(c) => c,
        Err(e) => return unavailable(format!("git status failed: {}", e.message())),
    };
    let counts::Counts {
        staged,
        modified,
        untracked,
    } = c;
    GitSnapshot::Available {
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
    }
}
