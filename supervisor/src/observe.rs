//! What a run changed in its project, seen by the supervisor itself, for
//! every driver and whether or not the child writes a delta: a picture of
//! the project when the run is accepted, another when it ends, and their
//! difference ([`policy::observed`]). A repository's pictures come from
//! libgit2's status (ignored files never show); any other project is
//! scanned, at most [`MAX_PATHS`] files within the git budget.
//!
//! The project is the child's: each directory is opened beneath the root
//! with no link on the way, each entry looked at without following it and
//! never opened. The daemon's own places inside the project are left out.

use crate::gitsnap::counts::StatusPath;
use policy::observed::{Picture, Seen, Source, Stamp, MAX_PATHS};
use policy::workctx::GitSnapshot;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use subagent_runner::safefile;

/// The first picture's file in the run folder (the daemon's, not the
/// child's).
pub const BEFORE_FILE: &str = "observed-before.json";
/// The largest first picture read back.
pub const BEFORE_MAX_BYTES: u64 = 16 << 20;

/// Why a picture was not taken.
#[derive(Debug, thiserror::Error)]
pub enum ObserveError {
    /// A scan met more than [`MAX_PATHS`] files, or directories.
    #[error("the project holds over {MAX_PATHS} files or directories")]
    TooManyFiles,
    /// git listed more than [`MAX_PATHS`] changed paths.
    #[error("git lists over {MAX_PATHS} changed or untracked paths")]
    TooManyChanges,
    /// The scan did not end within the budget.
    #[error("the scan took over {} ms", .0.as_millis())]
    TimedOut(Duration),
    /// The project's root could not be opened.
    #[error("the project could not be opened: {0}")]
    Root(#[source] safefile::SafeFileError),
}

/// The first picture, or why there is none; kept in the run folder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "taken", rename_all = "snake_case")]
pub enum Before {
    /// Taken of `root` (the run's work dir).
    Yes {
        /// The run's work dir; picture paths are relative to it.
        root: PathBuf,
        /// What was there.
        picture: Picture,
    },
    /// Not taken, and why.
    No {
        /// Shown as the observation's note.
        why: String,
    },
}

/// Paths (relative to the root) the pictures leave out: the daemon's own
/// places inside the project.
#[derive(Debug, Clone, Default)]
pub struct Skip(Vec<String>);

impl Skip {
    /// The places of `places` that lie inside `root`.
    pub fn within(root: &Path, places: &[&Path]) -> Skip {
        Skip(
            places
                .iter()
                .filter_map(|p| p.strip_prefix(root).ok())
                .filter_map(|r| r.to_str().map(str::to_owned))
                .filter(|r| !r.is_empty())
                .collect(),
        )
    }

    fn skips(&self, rel: &str) -> bool {
        self.0.iter().any(|s| {
            rel.strip_prefix(s.as_str())
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
        })
    }
}

/// The stamp of `name` in the directory `dir`, not following a link.
fn stamp_at(dir: BorrowedFd<'_>, name: &std::ffi::OsStr) -> Option<Stamp> {
    use nix::fcntl::AtFlags;
    let st = nix::sys::stat::fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW).ok()?;
    Some(Stamp {
        ino: st.st_ino,
        size: st.st_size as u64,
        ctime_ns: st.st_ctime * 1_000_000_000 + st.st_ctime_nsec,
        mtime_ns: st.st_mtime * 1_000_000_000 + st.st_mtime_nsec,
        mode: st.st_mode,
    })
}

/// The stamp of the relative path `rel` beneath `root`: its directory
/// opened with no link on the way. `None` when nothing is there.
fn look_up(root: BorrowedFd<'_>, rel: &str) -> Option<Stamp> {
    let path = Path::new(rel);
    let name = path.file_name()?;
    match path.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(parent) => {
            let dir = safefile::open_dir_beneath(root, parent).ok()?;
            stamp_at(dir.as_fd(), name)
        }
        None => stamp_at(root, name),
    }
}

fn is_dir(st: &Stamp) -> bool {
    st.mode & libc::S_IFMT == libc::S_IFDIR
}

/// Every file beneath `root` (not `.git`, not `skip`), within `deadline`.
fn scan(root: BorrowedFd<'_>, skip: &Skip, budget: Duration) -> Result<Picture, ObserveError> {
    let deadline = Instant::now() + budget;
    let mut paths = BTreeMap::new();
    let mut stack = vec![String::new()];
    let mut dirs = 0usize;
    while let Some(rel_dir) = stack.pop() {
        if Instant::now() > deadline {
            return Err(ObserveError::TimedOut(budget));
        }
        let opened: Option<OwnedFd> = if rel_dir.is_empty() {
            root.try_clone_to_owned().ok()
        } else {
            safefile::open_dir_beneath(root, Path::new(&rel_dir)).ok()
        };
        // A directory replaced or unreadable meanwhile: its files are not seen.
        let Some(dir) = opened else { continue };
        let Ok((names, cut)) = safefile::names(dir.as_fd(), MAX_PATHS + 1) else {
            continue;
        };
        if cut {
            return Err(ObserveError::TooManyFiles);
        }
        for name in names {
            // Names that are not UTF-8 cannot be shown or merged.
            let Some(text) = name.to_str() else { continue };
            let rel = if rel_dir.is_empty() {
                text.to_owned()
            } else {
                format!("{rel_dir}/{text}")
            };
            if text == ".git" || skip.skips(&rel) {
                continue;
            }
            let Some(st) = stamp_at(dir.as_fd(), &name) else {
                continue;
            };
            if is_dir(&st) {
                // Directories count too: a tree of empty ones is no cheaper.
                dirs += 1;
                if dirs > MAX_PATHS {
                    return Err(ObserveError::TooManyFiles);
                }
                stack.push(rel);
                continue;
            }
            paths.insert(
                rel,
                Seen {
                    stamp: Some(st),
                    new_to_git: false,
                },
            );
            if paths.len() > MAX_PATHS {
                return Err(ObserveError::TooManyFiles);
            }
        }
    }
    Ok(Picture {
        source: Source::Scan,
        paths,
    })
}

/// The picture of git's paths that lie under `root` (the repository's work
/// tree is `worktree`), each looked up on disk.
fn git_picture(
    root_fd: BorrowedFd<'_>,
    root: &Path,
    worktree: &Path,
    status: Vec<StatusPath>,
    skip: &Skip,
) -> Picture {
    let prefix = root
        .strip_prefix(worktree)
        .ok()
        .and_then(Path::to_str)
        .map_or(String::new(), |p| {
            if p.is_empty() {
                String::new()
            } else {
                format!("{p}/")
            }
        });
    let mut paths = BTreeMap::new();
    for s in status {
        let Ok(text) = String::from_utf8(s.path) else {
            continue;
        };
        let Some(rel) = text.strip_prefix(&prefix) else {
            continue;
        };
        if rel.is_empty() || skip.skips(rel) {
            continue;
        }
        let seen = Seen {
            stamp: look_up(root_fd, rel),
            new_to_git: s.new_to_git,
        };
        paths.insert(rel.to_owned(), seen);
    }
    Picture {
        source: Source::GitStatus,
        paths,
    }
}

/// A picture of `root` now: from git's status when `git` holds one (as
/// taken with the snapshot), else a scan.
fn picture(
    root: &Path,
    git: (&GitSnapshot, crate::gitsnap::counts::Paths),
    skip: &Skip,
    budget: Duration,
) -> Result<Picture, ObserveError> {
    let fd = safefile::open_root(root).map_err(ObserveError::Root)?;
    match git {
        (GitSnapshot::Available { worktree, .. }, Some(status)) => {
            Ok(git_picture(fd.as_fd(), root, worktree, status, skip))
        }
        (GitSnapshot::Available { .. }, None) => Err(ObserveError::TooManyChanges),
        (GitSnapshot::Unavailable { .. }, _) => scan(fd.as_fd(), skip, budget),
    }
}

/// The first picture of a run's work dir `root`, taken with the spawn's
/// git snapshot.
pub fn before(
    root: &Path,
    git: (&GitSnapshot, crate::gitsnap::counts::Paths),
    skip: &Skip,
    budget: Duration,
) -> Before {
    match picture(root, git, skip, budget) {
        Ok(picture) => Before::Yes {
            root: root.to_path_buf(),
            picture,
        },
        Err(e) => Before::No {
            why: format!("not observed: {e}"),
        },
    }
}

/// The second picture, of the same kind as `first` and holding every path
/// of it; and a note when it had to fall back to looking up the first
/// picture's paths alone.
pub fn after(
    first: &Picture,
    root: &Path,
    skip: &Skip,
    budget: Duration,
) -> Result<(Picture, Option<String>), ObserveError> {
    let fd = safefile::open_root(root).map_err(ObserveError::Root)?;
    let (mut now, note) = match first.source {
        Source::Scan => (scan(fd.as_fd(), skip, budget)?, None),
        Source::GitStatus => {
            let (snap, status) = crate::gitsnap::snapshot_with_paths(root, budget);
            match (&snap, status) {
                (GitSnapshot::Available { worktree, .. }, Some(status)) => {
                    (git_picture(fd.as_fd(), root, worktree, status, skip), None)
                }
                (GitSnapshot::Available { .. }, None) => return Err(ObserveError::TooManyChanges),
                (GitSnapshot::Unavailable { reason }, _) => {
                    let why = format!(
                        "git status at the end failed ({reason}): only the paths git listed at spawn were looked at"
                    );
                    let empty = Picture {
                        source: Source::GitStatus,
                        paths: BTreeMap::new(),
                    };
                    (empty, Some(why))
                }
            }
        }
    };
    for path in first.paths.keys() {
        if !now.paths.contains_key(path) {
            let seen = Seen {
                stamp: look_up(fd.as_fd(), path),
                new_to_git: false,
            };
            now.paths.insert(path.clone(), seen);
        }
    }
    Ok((now, note))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_git() -> GitSnapshot {
        GitSnapshot::Unavailable {
            reason: "not a git repository".into(),
        }
    }

    fn first(dir: &Path, skip: &Skip) -> Picture {
        match before(dir, (&no_git(), None), skip, Duration::from_secs(5)) {
            Before::Yes { picture, .. } => picture,
            Before::No { why } => panic!("{why}"),
        }
    }

    #[test]
    fn a_scan_sees_what_changed_and_not_through_links() {
        let d = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("host"), "h").unwrap();
        std::fs::create_dir_all(d.path().join("src/.git")).unwrap();
        std::fs::write(d.path().join("src/keep"), "k").unwrap();
        std::fs::write(d.path().join("src/edit"), "e").unwrap();
        std::fs::write(d.path().join("src/gone"), "g").unwrap();
        std::fs::write(d.path().join("src/.git/HEAD"), "x").unwrap();
        std::os::unix::fs::symlink(outside.path(), d.path().join("link")).unwrap();
        std::fs::create_dir_all(d.path().join("state/runs")).unwrap();
        let skip = Skip::within(d.path(), &[&d.path().join("state")]);
        let one = first(d.path(), &skip);
        assert!(one.paths.contains_key("link"), "{:?}", one.paths);
        assert!(!one
            .paths
            .keys()
            .any(|k| k.contains("host") || k.contains(".git")));
        std::fs::write(d.path().join("src/edit"), "changed").unwrap();
        std::fs::remove_file(d.path().join("src/gone")).unwrap();
        std::fs::write(d.path().join("src/new"), "n").unwrap();
        std::fs::write(d.path().join("state/runs/x"), "daemon's").unwrap();
        let (two, note) = after(&one, d.path(), &skip, Duration::from_secs(5)).unwrap();
        assert_eq!(note, None);
        let c = policy::observed::diff(&one, &two);
        assert_eq!(c.created, ["src/new"]);
        assert_eq!(c.modified, ["src/edit"]);
        assert_eq!(c.deleted, ["src/gone"]);
    }

    #[test]
    fn a_project_over_the_bound_is_not_observed() {
        let d = tempfile::tempdir().unwrap();
        for i in 0..=MAX_PATHS {
            std::fs::write(d.path().join(format!("f{i}")), "").unwrap();
        }
        match before(
            d.path(),
            (&no_git(), None),
            &Skip::default(),
            Duration::from_secs(30),
        ) {
            Before::No { why } => assert!(why.contains("over 10000 files"), "{why}"),
            Before::Yes { .. } => panic!("observed"),
        }
    }
}
