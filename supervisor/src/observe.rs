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

use policy::observed::{differs_from_index, Picture, Seen, Source, Stamp, MAX_PATHS};
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

/// A name as a picture key component: itself when UTF-8; else its lossy
/// form, a NUL (no file name holds one) and its bytes in hex, so that no
/// two names share a key and the name can be found again.
fn component(name: &[u8]) -> String {
    match std::str::from_utf8(name) {
        Ok(text) => text.to_owned(),
        Err(_) => {
            let hex: String = name.iter().map(|b| format!("{b:02x}")).collect();
            format!("{}\0{hex}", String::from_utf8_lossy(name))
        }
    }
}

/// The key of a relative path given as bytes.
fn key_of(rel: &[u8]) -> String {
    rel.split(|&b| b == b'/')
        .map(component)
        .collect::<Vec<_>>()
        .join("/")
}

/// The relative path a key names, as bytes.
fn raw_path(key: &str) -> Vec<u8> {
    let parts: Vec<Vec<u8>> = key
        .split('/')
        .map(|c| match c.split_once('\0') {
            Some((_, hex)) => (0..hex.len() / 2)
                .filter_map(|i| u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok())
                .collect(),
            None => c.as_bytes().to_vec(),
        })
        .collect();
    parts.join(&b'/')
}

/// A key as people read it: a name that is not UTF-8 in its lossy form.
pub fn shown(key: &str) -> String {
    key.split('/')
        .map(|c| c.split_once('\0').map_or(c, |(lossy, _)| lossy))
        .collect::<Vec<_>>()
        .join("/")
}

/// Whether a key names a path that can be merged (UTF-8 throughout).
pub fn mergeable(key: &str) -> bool {
    !key.contains('\0')
}

/// The stamp of the path `key` names beneath `root`: its directory
/// opened with no link on the way. `None` when nothing is there.
fn look_up(root: BorrowedFd<'_>, key: &str) -> Option<Stamp> {
    use std::os::unix::ffi::OsStrExt;
    let raw = raw_path(key);
    let path = Path::new(std::ffi::OsStr::from_bytes(&raw));
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

/// Every file beneath `root` (not `.git`, not `skip`), within `budget`.
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
            use std::os::unix::ffi::OsStrExt;
            let raw = raw_path(&rel_dir);
            safefile::open_dir_beneath(root, Path::new(std::ffi::OsStr::from_bytes(&raw))).ok()
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
            use std::os::unix::ffi::OsStrExt;
            let text = component(name.as_bytes());
            let rel = if rel_dir.is_empty() {
                text.clone()
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
        head: None,
    })
}

/// The picture of git's paths that lie under `root` (the repository's work
/// tree is `worktree`), each looked up on disk.
fn git_picture(
    root_fd: BorrowedFd<'_>,
    root: &Path,
    worktree: &Path,
    listing: &crate::gitsnap::counts::Listing,
    skip: &Skip,
) -> Result<Picture, ObserveError> {
    use std::os::unix::ffi::OsStrExt;
    let status = listing.paths.as_ref().ok_or(ObserveError::TooManyChanges)?;
    let mut prefix = root
        .strip_prefix(worktree)
        .map_or(Vec::new(), |p| p.as_os_str().as_bytes().to_vec());
    if !prefix.is_empty() {
        prefix.push(b'/');
    }
    let mut paths = BTreeMap::new();
    for s in status {
        let Some(rel) = s.path.strip_prefix(prefix.as_slice()) else {
            continue;
        };
        let key = key_of(rel);
        if rel.is_empty() || skip.skips(&key) {
            continue;
        }
        let seen = Seen {
            stamp: look_up(root_fd, &key),
            new_to_git: s.new_to_git,
        };
        paths.insert(key, seen);
    }
    // What git is told to leave alone is compared with its index entry.
    for f in &listing.flagged {
        let Some(rel) = f.path.strip_prefix(prefix.as_slice()) else {
            continue;
        };
        let key = key_of(rel);
        if rel.is_empty() || skip.skips(&key) || paths.contains_key(&key) {
            continue;
        }
        let stamp = look_up(root_fd, &key);
        if differs_from_index(stamp.as_ref(), &f.recorded, f.skip_worktree) {
            let seen = Seen {
                stamp,
                new_to_git: false,
            };
            paths.insert(key, seen);
        }
    }
    if paths.len() > MAX_PATHS {
        return Err(ObserveError::TooManyChanges);
    }
    Ok(Picture {
        source: Source::GitStatus,
        paths,
        head: listing.head.clone(),
    })
}

/// The repository's own control files at the root's `.git` (a child with
/// the write right can plant hooks, change its config, or flag index
/// entries so that status skips them): `HEAD`, `config`, `packed-refs`,
/// `index` and every file of `hooks/` and `info/`.
fn git_control(root: BorrowedFd<'_>) -> Vec<(String, Seen)> {
    let mut out = Vec::new();
    if !look_up(root, ".git").is_some_and(|st| is_dir(&st)) {
        return out;
    }
    let mut keys: Vec<String> = ["HEAD", "config", "packed-refs", "index"]
        .iter()
        .map(|n| format!(".git/{n}"))
        .collect();
    for sub in ["hooks", "info"] {
        let dir = format!(".git/{sub}");
        let Ok(fd) = safefile::open_dir_beneath(root, Path::new(&dir)) else {
            continue;
        };
        let Ok((names, _)) = safefile::names(fd.as_fd(), 256) else {
            continue;
        };
        use std::os::unix::ffi::OsStrExt;
        keys.extend(
            names
                .iter()
                .map(|n| format!("{dir}/{}", component(n.as_bytes()))),
        );
    }
    for key in keys {
        if let Some(stamp) = look_up(root, &key).filter(|st| !is_dir(st)) {
            // Absent from a first picture means it did not exist then.
            let seen = Seen {
                stamp: Some(stamp),
                new_to_git: true,
            };
            out.push((key, seen));
        }
    }
    out
}

/// A picture of `root` now: from git's status when `git` holds one (as
/// taken with the snapshot), else a scan; the `.git` control files in both.
fn picture(
    root: &Path,
    git: (&GitSnapshot, crate::gitsnap::counts::Listing),
    skip: &Skip,
    budget: Duration,
) -> Result<Picture, ObserveError> {
    let fd = safefile::open_root(root).map_err(ObserveError::Root)?;
    let mut picture = match git {
        (GitSnapshot::Available { worktree, .. }, listing) => {
            git_picture(fd.as_fd(), root, worktree, &listing, skip)?
        }
        (GitSnapshot::Unavailable { .. }, _) => scan(fd.as_fd(), skip, budget)?,
    };
    picture.paths.extend(git_control(fd.as_fd()));
    Ok(picture)
}

/// The first picture of a run's work dir `root`, taken with the spawn's
/// git snapshot.
pub fn before(
    root: &Path,
    git: (&GitSnapshot, crate::gitsnap::counts::Listing),
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

/// Says that `n` files flagged for git to leave alone differ from their
/// index entries.
fn flagged_note(n: usize) -> Option<String> {
    (n > 0).then(|| {
        format!(
            "{n} tracked file(s) marked assume-unchanged or skip-worktree in the index differ from it: compared on disk, not by git status"
        )
    })
}

/// The second picture, of the same kind as `first` and holding every path
/// of it; and a note when HEAD moved (what the run committed is compared
/// with the first HEAD) or when it had to fall back to looking up the
/// first picture's paths alone.
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
            let (snap, listing) =
                crate::gitsnap::snapshot_with_paths(root, budget, first.head.clone());
            match &snap {
                GitSnapshot::Available { worktree, .. } => {
                    let now = git_picture(fd.as_fd(), root, worktree, &listing, skip)?;
                    let flagged = flagged_note(listing.flagged.len());
                    let moved = (now.head != first.head).then(|| {
                        let short = |h: &Option<String>| {
                            h.as_deref().map_or("(none)".to_owned(), |h| h.chars().take(7).collect())
                        };
                        format!(
                            "HEAD moved from {} to {} during the run: committed changes are compared with {}",
                            short(&first.head),
                            short(&now.head),
                            short(&first.head)
                        )
                    });
                    let note = match (moved, flagged) {
                        (Some(m), Some(f)) => Some(format!("{m}; {f}")),
                        (m, f) => m.or(f),
                    };
                    (now, note)
                }
                GitSnapshot::Unavailable { reason } => {
                    let why = format!(
                        "git status at the end failed ({reason}): only the paths git listed at spawn were looked at"
                    );
                    let empty = Picture {
                        source: Source::GitStatus,
                        paths: BTreeMap::new(),
                        head: None,
                    };
                    (empty, Some(why))
                }
            }
        }
    };
    now.paths.extend(git_control(fd.as_fd()));
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
        match before(
            dir,
            (&no_git(), Default::default()),
            skip,
            Duration::from_secs(5),
        ) {
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
    fn names_that_are_not_utf8_and_git_control_files_are_seen() {
        use std::os::unix::ffi::OsStrExt;
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join(".git/hooks")).unwrap();
        std::fs::write(d.path().join(".git/config"), "[core]\n").unwrap();
        let odd = d.path().join(std::ffi::OsStr::from_bytes(b"d\xff"));
        std::fs::create_dir(&odd).unwrap();
        std::fs::write(odd.join("keep"), "k").unwrap();
        let skip = Skip::default();
        let one = first(d.path(), &skip);
        std::fs::write(odd.join("payload"), "p").unwrap();
        std::fs::write(d.path().join(".git/hooks/pre-commit"), "#!/bin/sh\n").unwrap();
        std::fs::write(d.path().join(".git/config"), "[core]\nfsmonitor = x\n").unwrap();
        let (two, _) = after(&one, d.path(), &skip, Duration::from_secs(5)).unwrap();
        let c = policy::observed::diff(&one, &two);
        let created: Vec<String> = c.created.iter().map(|k| shown(k)).collect();
        assert_eq!(
            created,
            [".git/hooks/pre-commit", "d\u{fffd}/payload"],
            "{c:?}"
        );
        assert_eq!(c.modified, [".git/config"]);
        assert!(!mergeable(&c.created[1]));
        assert_eq!(raw_path(&c.created[1]), b"d\xff/payload");
    }

    fn git(dir: &Path, args: &[&str]) {
        let out = std::process::Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@t"])
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {out:?}");
    }

    fn git_first(dir: &Path) -> Picture {
        let listing = crate::gitsnap::snapshot_with_paths(dir, Duration::from_secs(5), None);
        match before(
            dir,
            (&listing.0, listing.1),
            &Skip::default(),
            Duration::from_secs(5),
        ) {
            Before::Yes { picture, .. } => picture,
            Before::No { why } => panic!("{why}"),
        }
    }

    #[test]
    fn index_flags_hide_no_edit_and_a_changed_index_is_seen() {
        let d = tempfile::tempdir().unwrap();
        git(d.path(), &["init", "-q"]);
        for f in ["a", "b", "c", "d"] {
            std::fs::write(d.path().join(f), f).unwrap();
        }
        git(d.path(), &["add", "."]);
        git(d.path(), &["commit", "-qm", "one"]);
        git(d.path(), &["update-index", "--assume-unchanged", "a"]);
        git(d.path(), &["update-index", "--skip-worktree", "b"]);
        let one = git_first(d.path());
        // Flagged before the run, or during it: either way edits show.
        std::fs::write(d.path().join("a"), "edited").unwrap();
        std::fs::write(d.path().join("b"), "edited").unwrap();
        git(d.path(), &["update-index", "--assume-unchanged", "c"]);
        std::fs::write(d.path().join("c"), "edited").unwrap();
        git(d.path(), &["update-index", "--skip-worktree", "d"]);
        let (two, note) = after(&one, d.path(), &Skip::default(), Duration::from_secs(5)).unwrap();
        let c = policy::observed::diff(&one, &two);
        assert_eq!(c.modified, [".git/index", "a", "b", "c"], "{c:?}");
        assert!(c.created.is_empty() && c.deleted.is_empty(), "{c:?}");
        assert!(note.is_some_and(|n| n.contains("3 tracked file(s)")));
    }

    #[test]
    fn a_project_over_the_bound_is_not_observed() {
        let d = tempfile::tempdir().unwrap();
        for i in 0..=MAX_PATHS {
            std::fs::write(d.path().join(format!("f{i}")), "").unwrap();
        }
        match before(
            d.path(),
            (&no_git(), Default::default()),
            &Skip::default(),
            Duration::from_secs(30),
        ) {
            Before::No { why } => assert!(why.contains("over 10000 files"), "{why}"),
            Before::Yes { .. } => panic!("observed"),
        }
    }
}
