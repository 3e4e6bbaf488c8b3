//! The staged, modified and untracked counts of a snapshot: libgit2's
//! status (`git_status_list_new`), counted as `git status --porcelain=v2
//! -uall --no-renames` lists it, one path once per kind; and the paths
//! themselves, for the pictures of what a run changes (`crate::observe`).

use git2::{IndexEntryExtendedFlag, IndexEntryFlag, Repository, Status, StatusOptions};
use policy::observed::{differs_from_index, IndexStat};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Paths with changes, by kind (one path counts once per kind).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Index differs from HEAD (new, modified, deleted, type change).
    pub staged: usize,
    /// Work tree differs from the index (modified, deleted, type change).
    pub modified: usize,
    /// Untracked, not ignored files.
    pub untracked: usize,
}

/// The status bits of a staged path.
fn staged_bits() -> Status {
    Status::INDEX_NEW
        | Status::INDEX_MODIFIED
        | Status::INDEX_DELETED
        | Status::INDEX_RENAMED
        | Status::INDEX_TYPECHANGE
}

/// The status bits of a modified path.
fn modified_bits() -> Status {
    Status::WT_MODIFIED | Status::WT_DELETED | Status::WT_RENAMED | Status::WT_TYPECHANGE
}

/// The options of the status: untracked files one by one as `git status`
/// lists them, ignored ones left out, no rename detection (a staged
/// rename is a deletion and an addition), submodules included; the index
/// is never written back (the repository is the child's).
fn options() -> StatusOptions {
    let mut opts = StatusOptions::new();
    opts.include_untracked(true)
        .recurse_untracked_dirs(true)
        .include_ignored(false)
        .include_unmodified(false)
        .exclude_submodules(false)
        .renames_head_to_index(false)
        .renames_index_to_workdir(false)
        .update_index(false);
    opts
}

/// Counts one status entry's bits into `c`.
fn add(c: &mut Counts, s: Status) {
    c.staged += usize::from(s.intersects(staged_bits()));
    c.modified += usize::from(s.intersects(modified_bits()));
    c.untracked += usize::from(s.contains(Status::WT_NEW));
}

/// Whether `path` is an intent-to-add entry (`git add -N`) of `index`.
fn intent_to_add(index: &git2::Index, path: &[u8]) -> bool {
    let p = Path::new(std::ffi::OsStr::from_bytes(path));
    index.get_path(p, 0).is_some_and(|e| {
        IndexEntryExtendedFlag::from_bits_truncate(e.flags_extended)
            .contains(IndexEntryExtendedFlag::INTENT_TO_ADD)
    })
}

/// One path of the status: a file git sees as changed or untracked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusPath {
    /// Relative to the work tree, `/`-separated, as git names it.
    pub path: Vec<u8>,
    /// Untracked, or new in the index.
    pub new_to_git: bool,
}

/// The status's paths, or `None` when there were more than
/// [`policy::observed::MAX_PATHS`].
pub type Paths = Option<Vec<StatusPath>>;

/// An index entry git is told not to compare with the work tree
/// (`git update-index --assume-unchanged` or `--skip-worktree`): its
/// status never shows, so the pictures compare it on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flagged {
    /// As in [`StatusPath::path`].
    pub path: Vec<u8>,
    /// What the index recorded of the file.
    pub recorded: IndexStat,
    pub skip_worktree: bool,
}

/// What the pictures of a repository take from it: the status's paths and
/// HEAD's commit.
#[derive(Debug, Clone, Default)]
pub struct Listing {
    /// The paths; with a HEAD to compare with, also every path that
    /// differs from that commit's tree (changes the run committed).
    pub paths: Paths,
    /// The index entries with assume-unchanged or skip-worktree set whose
    /// file may have changed (at most [`policy::observed::MAX_PATHS`]:
    /// past it `paths` is `None`).
    pub flagged: Vec<Flagged>,
    /// HEAD's full commit id (none before the first commit).
    pub head: Option<String>,
}

/// Adds to `paths` every path in which the work tree (with the index)
/// differs from commit `since`'s tree; `None` past the bound.
pub fn add_since(repo: &Repository, since: &str, paths: &mut Paths) -> Result<(), git2::Error> {
    let Some(list) = paths.as_mut() else {
        return Ok(());
    };
    let tree = repo.find_commit(git2::Oid::from_str(since)?)?.tree()?;
    let mut opts = git2::DiffOptions::new();
    opts.include_untracked(false).include_ignored(false);
    let diff = repo.diff_tree_to_workdir_with_index(Some(&tree), Some(&mut opts))?;
    for d in diff.deltas() {
        let file = if d.status() == git2::Delta::Deleted {
            d.old_file()
        } else {
            d.new_file()
        };
        let Some(path) = file.path_bytes() else {
            continue;
        };
        if !list.iter().any(|p| p.path == path) {
            list.push(StatusPath {
                path: path.to_vec(),
                new_to_git: d.status() == git2::Delta::Added,
            });
        }
        if list.len() > policy::observed::MAX_PATHS {
            *paths = None;
            return Ok(());
        }
    }
    Ok(())
}

/// What `lstat` says of `path` as a stamp (`None`: nothing there).
fn lstat_stamp(path: &Path) -> Option<policy::observed::Stamp> {
    let st = nix::sys::stat::lstat(path).ok()?;
    Some(policy::observed::Stamp {
        ino: st.st_ino,
        size: st.st_size as u64,
        ctime_ns: st.st_ctime * 1_000_000_000 + st.st_ctime_nsec,
        mtime_ns: st.st_mtime * 1_000_000_000 + st.st_mtime_nsec,
        mode: st.st_mode,
    })
}

/// The index entries of `repo` that git's status does not look at and
/// whose file may differ from what the entry recorded (a sparse
/// checkout's absent files are left out here, within the snapshot's
/// budget; the pictures look again without following links); `None` when
/// there are more than [`policy::observed::MAX_PATHS`].
pub fn flagged(repo: &Repository) -> Result<Option<Vec<Flagged>>, git2::Error> {
    let index = repo.index()?;
    let Some(workdir) = repo.workdir() else {
        return Ok(Some(Vec::new()));
    };
    let mut out = Vec::new();
    for e in index.iter() {
        let assumed = IndexEntryFlag::from_bits_truncate(e.flags).contains(IndexEntryFlag::VALID);
        let skip_worktree = IndexEntryExtendedFlag::from_bits_truncate(e.flags_extended)
            .contains(IndexEntryExtendedFlag::SKIP_WORKTREE);
        if !assumed && !skip_worktree {
            continue;
        }
        let recorded = IndexStat {
            size: e.file_size,
            ino: e.ino,
            mtime: (e.mtime.seconds(), e.mtime.nanoseconds()),
            ctime: (e.ctime.seconds(), e.ctime.nanoseconds()),
        };
        let file = workdir.join(std::ffi::OsStr::from_bytes(&e.path));
        if !differs_from_index(lstat_stamp(&file).as_ref(), &recorded, skip_worktree) {
            continue;
        }
        if out.len() == policy::observed::MAX_PATHS {
            return Ok(None);
        }
        out.push(Flagged {
            path: e.path,
            recorded,
            skip_worktree,
        });
    }
    Ok(Some(out))
}

/// The counts of `repo`'s status, and its paths.
pub fn counts(repo: &Repository) -> Result<(Counts, Paths), git2::Error> {
    let statuses = repo.statuses(Some(&mut options()))?;
    // Loaded once, and only when something is new in the index.
    let mut index = None;
    let mut c = Counts::default();
    let mut paths = (statuses.len() <= policy::observed::MAX_PATHS).then(Vec::new);
    for e in statuses.iter() {
        let mut s = e.status();
        if s.contains(Status::INDEX_NEW) {
            let index = match &mut index {
                Some(i) => i,
                None => index.insert(repo.index()?),
            };
            // libgit2 calls it staged and changed; git, a work tree addition.
            if intent_to_add(index, e.path_bytes()) {
                s = (s - Status::INDEX_NEW) | Status::WT_MODIFIED;
            }
        }
        add(&mut c, s);
        if let Some(p) = &mut paths {
            p.push(StatusPath {
                path: e.path_bytes().to_vec(),
                new_to_git: s.intersects(Status::WT_NEW | Status::INDEX_NEW),
            });
        }
    }
    Ok((c, paths))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_counts_once_per_kind() {
        let mut c = Counts::default();
        add(&mut c, Status::INDEX_MODIFIED | Status::WT_MODIFIED);
        add(&mut c, Status::INDEX_NEW | Status::INDEX_MODIFIED);
        add(&mut c, Status::WT_DELETED | Status::WT_TYPECHANGE);
        add(&mut c, Status::WT_NEW);
        add(&mut c, Status::IGNORED | Status::CURRENT);
        let want = Counts {
            staged: 2,
            modified: 2,
            untracked: 1,
        };
        assert_eq!(c, want);
    }
}
