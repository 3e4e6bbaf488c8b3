//! The staged, modified and untracked counts of a snapshot.
//!
//! The fast way ([`by_scan`]) gives the same counts as libgit2's status
//! ([`by_libgit2`]) in less time on large work trees:
//! - the index file is read by [`super::index`] (libgit2's reader spends
//!   most of its time in its collision-detecting SHA-1 and its path map);
//! - staged: when the index's cached tree (the `TREE` extension git keeps
//!   valid after a commit) is HEAD's tree, nothing is staged and no tree is
//!   read; otherwise libgit2 diffs HEAD's tree against the index;
//! - modified and untracked: [`super::scan`] reads the directories holding
//!   tracked files on a few threads; the tracked paths whose stat data
//!   alone cannot decide, and the names the index does not hold, are
//!   settled by one libgit2 status limited to them (content with the
//!   filters, ignore rules, nested repositories: libgit2's own answers).
//!
//! Repositories the scan does not model fall back to libgit2 whole, with
//! the reason: unmerged entries, submodules, assume-unchanged,
//! skip-worktree or intent-to-add entries, split or sparse indexes, SHA-256
//! repositories, `core.ignorecase`, `core.symlinks=false`,
//! `core.filemode=false`, or any error of the scan.

use super::index::{self, IndexFile};
use super::scan::{self, Scan};
use git2::{Repository, Status, StatusOptions};
use std::collections::HashSet;

/// Paths with changes, by kind (one path counts once per kind).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Index differs from HEAD.
    pub staged: usize,
    /// Work tree differs from the index (modified, deleted, type change).
    pub modified: usize,
    /// Untracked, not ignored files.
    pub untracked: usize,
}

/// How [`counts`] took them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Method {
    /// The threaded scan.
    Scan,
    /// libgit2's status, for this reason.
    Libgit2(String),
}

/// Below this many index entries the scan runs on one thread.
const THREADED_FROM: usize = 1_000;

/// The counts, by the scan when the repository allows it.
pub fn counts(repo: &Repository) -> Result<(Counts, Method), git2::Error> {
    match by_scan(repo) {
        Ok(c) => Ok((c, Method::Scan)),
        Err(why) => Ok((by_libgit2(repo)?, Method::Libgit2(why))),
    }
}

/// A status that counts as modified: the work tree differs from the index.
fn wt_changed() -> Status {
    Status::WT_MODIFIED | Status::WT_DELETED | Status::WT_RENAMED | Status::WT_TYPECHANGE
}

/// The status options of every count: untracked files one by one, ignored
/// ones left out.
fn status_options() -> StatusOptions {
    let mut opts = StatusOptions::new();
    opts.include_untracked(true)
        .recurse_untracked_dirs(true)
        .include_ignored(false);
    opts
}

/// The counts from `git_status_list_new`.
pub fn by_libgit2(repo: &Repository) -> Result<Counts, git2::Error> {
    let statuses = repo.statuses(Some(&mut status_options()))?;
    let staged_bits = Status::INDEX_NEW
        | Status::INDEX_MODIFIED
        | Status::INDEX_DELETED
        | Status::INDEX_RENAMED
        | Status::INDEX_TYPECHANGE;
    let mut c = Counts::default();
    for e in statuses.iter() {
        let s = e.status();
        c.staged += usize::from(s.intersects(staged_bits));
        c.modified += usize::from(s.intersects(wt_changed()));
        c.untracked += usize::from(s.contains(Status::WT_NEW));
    }
    Ok(c)
}

/// Why the scan cannot model this repository's configuration, if it
/// cannot.
fn unmodelled_config(repo: &Repository) -> Option<&'static str> {
    let cfg = repo.config().ok()?;
    let says = |key: &str, default: bool| cfg.get_bool(key).unwrap_or(default);
    if says("core.ignorecase", false) {
        return Some("core.ignorecase is set");
    }
    if !says("core.symlinks", true) || !says("core.filemode", true) {
        return Some("core.symlinks or core.filemode is false");
    }
    let format = cfg.get_string("extensions.objectformat").ok();
    format
        .is_some_and(|f| !f.eq_ignore_ascii_case("sha1"))
        .then_some("the repository does not use SHA-1")
}

/// The number of distinct paths in `diff`.
fn paths_in(diff: &git2::Diff<'_>) -> usize {
    let mut seen = HashSet::new();
    for d in diff.deltas() {
        let f = if d.status() == git2::Delta::Deleted {
            d.old_file()
        } else {
            d.new_file()
        };
        seen.insert(f.path_bytes().map(<[u8]>::to_vec));
    }
    seen.len()
}

/// The staged count: none when the index's cached root tree is HEAD's
/// tree, else libgit2's diff of HEAD's tree against the index.
fn staged(repo: &Repository, cached_root: Option<[u8; 20]>) -> Result<usize, String> {
    let msg = |e: git2::Error| e.message().to_owned();
    let head = match repo.head() {
        Ok(h) => Some(h.peel_to_tree().map_err(msg)?),
        Err(e) if e.code() == git2::ErrorCode::UnbornBranch => None,
        Err(e) => return Err(msg(e)),
    };
    if let (Some(h), Some(t)) = (&head, cached_root) {
        if h.id().as_bytes() == t {
            return Ok(0);
        }
    }
    let index = repo.index().map_err(msg)?;
    let diff = repo
        .diff_tree_to_index(head.as_ref(), Some(&index), None)
        .map_err(msg)?;
    Ok(paths_in(&diff))
}

/// The largest index file read (an index of some millions of entries);
/// a larger one falls back to libgit2.
pub const INDEX_MAX: u64 = 512 << 20;

/// The index file's content and its mtime, taken from the same open file
/// before reading it (an entry at least this new is racily clean). The
/// file is the child's to write: a regular file, not a link, at most
/// [`INDEX_MAX`] bytes.
fn read_index(path: &std::path::Path) -> Result<(Vec<u8>, (i64, i64)), String> {
    let f = subagent_runner::safefile::open(path).map_err(|e| format!("reading the index: {e}"))?;
    let m = f.metadata();
    let mtime = (
        std::os::unix::fs::MetadataExt::mtime(m),
        std::os::unix::fs::MetadataExt::mtime_nsec(m),
    );
    let buf = f
        .read_all(INDEX_MAX)
        .map_err(|e| format!("reading the index: {e}"))?;
    Ok((buf, mtime))
}

/// The counts by the scan with the process's listings cache, or why not.
pub fn by_scan(repo: &Repository) -> Result<Counts, String> {
    by_scan_with(repo, Some(super::listing::shared()))
}

/// The counts by the scan with the given listings cache (`None`: every
/// directory read), or why not.
pub fn by_scan_with(
    repo: &Repository,
    listings: Option<&super::listing::Listings>,
) -> Result<Counts, String> {
    let workdir = repo.workdir().ok_or("no work tree")?;
    if let Some(why) = unmodelled_config(repo) {
        return Err(why.into());
    }
    let (buf, index_mtime) = read_index(&repo.path().join("index"))?;
    let IndexFile { entries, root_tree } = index::parse(&buf).map_err(|e| e.to_string())?;
    let threads = if entries.len() < THREADED_FROM {
        1
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get().min(4))
    };
    let found = Scan {
        workdir,
        entries: &entries,
        index_mtime,
        threads,
        listings,
    }
    .run()
    .map_err(|e| e.to_string())?;
    let staged = staged(repo, root_tree)?;
    let (modified, untracked) = settle(repo, &found).map_err(|e| e.message().to_owned())?;
    Ok(Counts {
        staged,
        modified: found.modified + modified,
        untracked,
    })
}

/// The modified count among the scan's uncertain paths and the untracked
/// count among its candidates, from one libgit2 status limited to those
/// paths (content checks with the filters; ignore rules, nested
/// repositories and all). Nothing to settle costs nothing.
fn settle(repo: &Repository, found: &scan::Found) -> Result<(usize, usize), git2::Error> {
    if found.uncertain.is_empty() && found.candidates.is_empty() {
        return Ok((0, 0));
    }
    let mut opts = status_options();
    opts.disable_pathspec_match(true);
    for p in found.uncertain.iter().chain(&found.candidates) {
        opts.pathspec(p.as_slice());
    }
    let uncertain: HashSet<&[u8]> = found.uncertain.iter().map(Vec::as_slice).collect();
    let (mut modified, mut untracked) = (0, 0);
    for e in repo.statuses(Some(&mut opts))?.iter() {
        let s = e.status();
        // Only the uncertain paths: a candidate's pathspec may also take in
        // index entries the scan already counted (a file now a directory).
        if s.intersects(wt_changed()) && uncertain.contains(e.path_bytes()) {
            modified += 1;
        }
        untracked += usize::from(s.contains(Status::WT_NEW));
    }
    Ok((modified, untracked))
}
