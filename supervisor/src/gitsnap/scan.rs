//! The work tree checked against the index, one directory at a time, on a
//! few threads: each directory holding tracked files is read once (or,
//! when it has not changed since an earlier scan, its listing is taken
//! from [`super::listing`]), each tracked name is `fstatat`ed relative to
//! its directory, and the names the index does not hold are returned as
//! untracked *candidates* (directories among them are not walked) for
//! libgit2 to judge against the ignore rules.
//!
//! The decisions follow libgit2's `maybe_modified` so that the counts are
//! the same as `git_status_list_new`'s: a different mode or size is
//! modified; a different time, inode or owner, or a file as new as the
//! index itself ("racily clean"), is *uncertain* and left for the caller to
//! settle by content; files that are neither regular, symlink nor directory
//! are not there; `.git` (any case) is never looked at. Directories are
//! opened with `RESOLVE_NO_SYMLINKS`, so a symlink in place of a tracked
//! directory is never followed.

use super::listing::{self, Listings};
use nix::dir::{Dir, Type};
use nix::errno::Errno;
use nix::fcntl::{openat2, AtFlags, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fstat, fstatat, FileStat, SFlag};
use std::ffi::{CStr, OsStr};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::SystemTime;

/// A failure of the scan; the caller falls back to libgit2's status.
#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    /// A system call on a work tree path failed.
    #[error("{op} {path}: {errno}")]
    Io {
        op: &'static str,
        path: String,
        errno: Errno,
    },
    /// A scan thread panicked.
    #[error("a work tree scan thread panicked")]
    Panicked,
}

fn io(op: &'static str, path: &[u8], errno: Errno) -> ScanError {
    ScanError::Io {
        op,
        path: String::from_utf8_lossy(path).into_owned(),
        errno,
    }
}

/// One stage-0 index entry: its path and the stat data recorded for it.
#[derive(Debug, Clone)]
pub struct Tracked {
    /// Relative to the work tree, `/`-separated, as in the index.
    pub path: Vec<u8>,
    /// The git mode (0o100644, 0o100755, 0o120000).
    pub mode: u32,
    /// The size, truncated to 32 bits as the index stores it.
    pub size: u32,
    /// Seconds and nanoseconds.
    pub mtime: (i32, u32),
    /// Seconds and nanoseconds.
    pub ctime: (i32, u32),
    /// The inode number, truncated to 32 bits.
    pub ino: u32,
    /// The owner.
    pub uid: u32,
    /// The group.
    pub gid: u32,
}

/// What the scan found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Found {
    /// Tracked paths certainly changed: deleted, another type or mode, or
    /// another size.
    pub modified: usize,
    /// Names the index does not hold, relative to the work tree, files and
    /// directories (not walked). Ignored ones are among them.
    pub candidates: Vec<Vec<u8>>,
    /// Tracked paths whose stat data differs but whose size does not: only
    /// their content can tell.
    pub uncertain: Vec<Vec<u8>>,
}

/// The scan's inputs.
pub struct Scan<'a> {
    /// The work tree.
    pub workdir: &'a Path,
    /// The stage-0 index entries, sorted by path as the index is.
    pub entries: &'a [Tracked],
    /// The index file's mtime (seconds, nanoseconds), taken before it was
    /// read: an entry at least this new is racily clean.
    pub index_mtime: (i64, i64),
    /// How many threads read directories.
    pub threads: usize,
    /// Directory listings kept between scans ([`listing`]); `None` reads
    /// every directory.
    pub listings: Option<&'a Listings>,
}

/// One directory to read.
struct Job {
    /// Relative to the work tree, without a trailing `/`; empty for the root.
    rel: Vec<u8>,
    /// The index entries under it.
    range: (usize, usize),
}

/// The directories left to read and how many are being read.
struct Queue {
    state: Mutex<(Vec<Job>, usize, bool)>,
    ready: Condvar,
}

impl Queue {
    fn pop(&self) -> Option<Job> {
        let mut g = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if g.2 {
                return None;
            }
            if let Some(j) = g.0.pop() {
                g.1 += 1;
                return Some(j);
            }
            if g.1 == 0 {
                return None;
            }
            g = self.ready.wait(g).unwrap_or_else(PoisonError::into_inner);
        }
    }

    fn finish(&self, more: Vec<Job>, failed: bool) {
        let mut g = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        g.0.extend(more);
        g.1 -= 1;
        g.2 |= failed;
        self.ready.notify_all();
    }
}

/// A tracked name in one directory.
#[derive(Clone, Copy)]
enum Child {
    File(usize),
    Dir(usize, usize),
}

fn join(rel: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(rel.len() + name.len() + 1);
    if !rel.is_empty() {
        p.extend_from_slice(rel);
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

/// The git mode of what `st` describes; `None` for what libgit2 skips.
fn git_mode(st: &FileStat) -> Option<u32> {
    match SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) {
        SFlag::S_IFREG if st.st_mode & 0o100 != 0 => Some(0o100_755),
        SFlag::S_IFREG => Some(0o100_644),
        SFlag::S_IFLNK => Some(0o120_000),
        SFlag::S_IFDIR => Some(0o040_000),
        _ => None,
    }
}

/// How a tracked file compares with its index entry.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Clean,
    Modified,
    Uncertain,
}

fn compare(e: &Tracked, st: &FileStat, mode: u32, index_mtime: (i64, i64)) -> Verdict {
    // As libgit2 stores them: seconds as i32, sizes and inodes as u32.
    let size = st.st_size as u32;
    if e.mode != mode || e.size != size {
        return if e.size == 0 && size > 0 {
            Verdict::Uncertain
        } else {
            Verdict::Modified
        };
    }
    let mtime = (st.st_mtime as i32, st.st_mtime_nsec as u32);
    let ctime = (st.st_ctime as i32, st.st_ctime_nsec as u32);
    let racy = {
        let (s, ns) = (index_mtime.0 as i32, index_mtime.1 as u32);
        s < mtime.0 || (s == mtime.0 && ns <= mtime.1)
    };
    if e.mtime != mtime
        || e.ctime != ctime
        || e.ino != st.st_ino as u32
        || e.uid != st.st_uid
        || e.gid != st.st_gid
        || racy
    {
        Verdict::Uncertain
    } else {
        Verdict::Clean
    }
}

/// One thread's state: what it found.
struct Worker<'a> {
    scan: &'a Scan<'a>,
    root: &'a OwnedFd,
    /// The listings cache, unless off or the file system's clock is not
    /// this kernel's.
    listings: Option<&'a Listings>,
    /// The work tree root's device.
    root_dev: u64,
    /// When the scan started: a listing is kept only if its stamp is older
    /// than this by the clock's margin.
    started: SystemTime,
    found: Found,
}

/// The directory being read: its job, its tracked names (marked as they
/// are seen) and the subdirectories to read next.
struct Visit<'v, 'e> {
    job: &'v Job,
    children: &'v mut Vec<(&'e [u8], Child, bool)>,
    next: &'v mut Vec<Job>,
}

fn open_dir(root: &OwnedFd, rel: &[u8]) -> Result<OwnedFd, Errno> {
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
        .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_BENEATH);
    let p: &[u8] = if rel.is_empty() { b"." } else { rel };
    openat2(root.as_fd(), OsStr::from_bytes(p), how)
}

impl Worker<'_> {
    /// The tracked names directly in the directory at `prefix` (the length
    /// of its path plus the `/`), from the entries in `range`, sorted by
    /// name for [`find`], each with a "seen" mark.
    fn children(
        entries: &[Tracked],
        prefix: usize,
        range: (usize, usize),
    ) -> Vec<(&[u8], Child, bool)> {
        let mut out = Vec::new();
        let mut i = range.0;
        while i < range.1 {
            let rest = &entries[i].path[prefix..];
            match rest.iter().position(|&b| b == b'/') {
                Some(k) => {
                    let name = &rest[..k];
                    let mut j = i + 1;
                    while j < range.1 {
                        let r = &entries[j].path[prefix..];
                        if r.len() > k && r[k] == b'/' && &r[..k] == name {
                            j += 1;
                        } else {
                            break;
                        }
                    }
                    out.push((name, Child::Dir(i, j), false));
                    i = j;
                }
                None => {
                    out.push((rest, Child::File(i), false));
                    i += 1;
                }
            }
        }
        // Index order is not name order ("a-b" < "a/c" but "a" < "a-b").
        out.sort_unstable_by(|x, y| x.0.cmp(y.0));
        out
    }

    /// Reads one directory (or takes its listing from the cache); returns
    /// the directories to read next.
    fn run(&mut self, job: Job) -> Result<Vec<Job>, ScanError> {
        let mut next = Vec::new();
        let fd = match open_dir(self.root, &job.rel) {
            Ok(fd) => fd,
            // Gone or replaced since its parent was read: all of it deleted.
            Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) => {
                self.found.modified += job.range.1 - job.range.0;
                return Ok(next);
            }
            Err(e) => return Err(io("open", &job.rel, e)),
        };
        let prefix = if job.rel.is_empty() {
            0
        } else {
            job.rel.len() + 1
        };
        let mut children = Self::children(self.scan.entries, prefix, job.range);
        let mut visit = Visit {
            job: &job,
            children: &mut children,
            next: &mut next,
        };
        match self.listings {
            Some(listings) => {
                // The stamp is taken before the read: a change made while
                // reading moves it on, so the listing is never reused.
                let stamp = fstat(fd.as_fd())
                    .map(|st| listing::Stamp::of(&st))
                    .map_err(|e| io("stat", &job.rel, e))?;
                if let Some(names) = listings.get(&stamp) {
                    for e in names.iter() {
                        self.visit(&mut visit, &fd, &e.name, e.kind)?;
                    }
                } else {
                    // Only on the work tree's own file system (whose clock
                    // was checked): not under a mount point inside it.
                    let keep =
                        stamp.dev() == self.root_dev && listing::keepable(&stamp, self.started);
                    let read = self.read(&mut visit, fd, keep)?;
                    if keep {
                        listings.keep(stamp, read);
                    }
                }
            }
            None => {
                self.read(&mut visit, fd, false)?;
            }
        }
        for (_, child, seen) in &children {
            if !seen {
                self.found.modified += match child {
                    Child::File(_) => 1,
                    Child::Dir(lo, hi) => hi - lo,
                };
            }
        }
        Ok(next)
    }

    /// Reads the directory `fd` and visits each name; returns the names
    /// read when `collect`, for the cache.
    fn read(
        &mut self,
        visit: &mut Visit<'_, '_>,
        fd: OwnedFd,
        collect: bool,
    ) -> Result<Vec<listing::Entry>, ScanError> {
        let rel = visit.job.rel.as_slice();
        // A second descriptor for fstatat while the first one is being read.
        let stat_fd = fd.try_clone().map_err(|e| ScanError::Io {
            op: "dup",
            path: String::from_utf8_lossy(rel).into_owned(),
            errno: Errno::from_raw(e.raw_os_error().unwrap_or(0)),
        })?;
        let mut dir = Dir::from_fd(fd).map_err(|e| io("fdopendir", rel, e))?;
        let mut read = Vec::new();
        for ent in dir.iter() {
            let ent = ent.map_err(|e| io("readdir", rel, e))?;
            let name = ent.file_name();
            self.visit(visit, &stat_fd, name, ent.file_type())?;
            if collect {
                read.push(listing::Entry {
                    name: name.to_owned(),
                    kind: ent.file_type(),
                });
            }
        }
        Ok(read)
    }

    /// Judges one name of the directory `dir` against the index.
    fn visit(
        &mut self,
        visit: &mut Visit<'_, '_>,
        dir: &OwnedFd,
        cname: &CStr,
        kind: Option<Type>,
    ) -> Result<(), ScanError> {
        let rel = visit.job.rel.as_slice();
        let name = cname.to_bytes();
        if name == b"." || name == b".." || name.eq_ignore_ascii_case(b".git") {
            return Ok(());
        }
        let entries = self.scan.entries;
        let stat = || lstat_at(dir, rel, cname);
        let children = &mut *visit.children;
        let child = children.binary_search_by(|c| c.0.cmp(name)).ok().map(|at| {
            children[at].2 = true;
            children[at].1
        });
        match child {
            Some(Child::File(i)) => {
                let Some(st) = stat()? else {
                    self.found.modified += 1;
                    return Ok(());
                };
                match git_mode(&st) {
                    Some(0o040_000) => {
                        self.found.modified += 1;
                        self.untracked(rel, name);
                    }
                    Some(mode) => match compare(&entries[i], &st, mode, self.scan.index_mtime) {
                        Verdict::Clean => {}
                        Verdict::Modified => self.found.modified += 1,
                        Verdict::Uncertain => self.found.uncertain.push(join(rel, name)),
                    },
                    None => self.found.modified += 1,
                }
            }
            Some(Child::Dir(lo, hi)) => {
                let is_dir = match kind {
                    Some(Type::Directory) => true,
                    Some(_) => false,
                    None => stat()?.and_then(|st| git_mode(&st)) == Some(0o040_000),
                };
                if is_dir {
                    visit.next.push(Job {
                        rel: join(rel, name),
                        range: (lo, hi),
                    });
                } else {
                    self.found.modified += hi - lo;
                    self.untracked(rel, name);
                }
            }
            None => self.untracked(rel, name),
        }
        Ok(())
    }

    /// A name the index does not hold (or holds as another kind).
    fn untracked(&mut self, rel: &[u8], name: &[u8]) {
        self.found.candidates.push(join(rel, name));
    }
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`; `None` when it is gone.
fn lstat_at(dir: &OwnedFd, rel: &[u8], name: &CStr) -> Result<Option<FileStat>, ScanError> {
    match fstatat(dir.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(st)),
        Err(Errno::ENOENT) => Ok(None),
        Err(e) => Err(io("stat", &join(rel, name.to_bytes()), e)),
    }
}

impl Scan<'_> {
    /// Runs the scan.
    pub fn run(&self) -> Result<Found, ScanError> {
        let root = nix::fcntl::open(
            self.workdir,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
        .map_err(|e| io("open", self.workdir.as_os_str().as_bytes(), e))?;
        let started = SystemTime::now();
        let listings = self.listings.filter(|_| listing::local_clock(&root));
        let root_dev = fstat(root.as_fd())
            .map_err(|e| io("stat", self.workdir.as_os_str().as_bytes(), e))?
            .st_dev;
        let queue = Queue {
            state: Mutex::new((
                vec![Job {
                    rel: Vec::new(),
                    range: (0, self.entries.len()),
                }],
                0,
                false,
            )),
            ready: Condvar::new(),
        };
        let work = |root: &OwnedFd| -> Result<Found, ScanError> {
            let mut w = Worker {
                scan: self,
                root,
                listings,
                root_dev,
                started,
                found: Found::default(),
            };
            while let Some(job) = queue.pop() {
                match w.run(job) {
                    Ok(more) => queue.finish(more, false),
                    Err(e) => {
                        queue.finish(Vec::new(), true);
                        return Err(e);
                    }
                }
            }
            Ok(w.found)
        };
        let results: Vec<Result<Found, ScanError>> = std::thread::scope(|s| {
            // A thread that cannot start leaves its share to the others.
            let handles: Vec<_> = (1..self.threads.max(1))
                .filter_map(|_| {
                    std::thread::Builder::new()
                        .name("git-scan".into())
                        .spawn_scoped(s, || work(&root))
                        .ok()
                })
                .collect();
            let mut out = vec![work(&root)];
            out.extend(
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap_or(Err(ScanError::Panicked))),
            );
            out
        });
        let mut total = Found::default();
        for r in results {
            let f = r?;
            total.modified += f.modified;
            total.candidates.extend(f.candidates);
            total.uncertain.extend(f.uncertain);
        }
        total.uncertain.sort();
        Ok(total)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn entry_for(st: &FileStat) -> Tracked {
        Tracked {
            path: b"f".to_vec(),
            mode: git_mode(st).unwrap(),
            size: st.st_size as u32,
            mtime: (st.st_mtime as i32, st.st_mtime_nsec as u32),
            ctime: (st.st_ctime as i32, st.st_ctime_nsec as u32),
            ino: st.st_ino as u32,
            uid: st.st_uid,
            gid: st.st_gid,
        }
    }

    #[test]
    fn compare_follows_libgit2s_rules() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("f");
        std::fs::write(&f, "12345").unwrap();
        let st = nix::sys::stat::lstat(&f).unwrap();
        let mode = git_mode(&st).unwrap();
        assert_eq!(mode, 0o100_644);
        let e = entry_for(&st);
        let later = (st.st_mtime + 10, 0);
        assert_eq!(compare(&e, &st, mode, later), Verdict::Clean);
        // As new as the index: racily clean, content must decide.
        let same = (st.st_mtime, st.st_mtime_nsec);
        assert_eq!(compare(&e, &st, mode, same), Verdict::Uncertain);
        let older = (st.st_mtime - 1, 0);
        assert_eq!(compare(&e, &st, mode, older), Verdict::Uncertain);
        // Another size or mode: modified without reading.
        let e2 = Tracked {
            size: 4,
            ..e.clone()
        };
        assert_eq!(compare(&e2, &st, mode, later), Verdict::Modified);
        let e3 = Tracked {
            mode: 0o100_755,
            ..e.clone()
        };
        assert_eq!(compare(&e3, &st, mode, later), Verdict::Modified);
        // An index size of 0 proves nothing (libgit2 hashes then).
        let e4 = Tracked {
            size: 0,
            ..e.clone()
        };
        assert_eq!(compare(&e4, &st, mode, later), Verdict::Uncertain);
        // Another time, inode, owner: content must decide.
        for t in [
            Tracked {
                mtime: (1, 0),
                ..e.clone()
            },
            Tracked {
                ctime: (1, 0),
                ..e.clone()
            },
            Tracked {
                ino: e.ino ^ 1,
                ..e.clone()
            },
            Tracked {
                uid: e.uid ^ 1,
                ..e.clone()
            },
            Tracked {
                gid: e.gid ^ 1,
                ..e.clone()
            },
        ] {
            assert_eq!(compare(&t, &st, mode, later), Verdict::Uncertain, "{t:?}");
        }
    }

    #[test]
    fn git_modes_of_each_kind() {
        let d = tempfile::tempdir().unwrap();
        let x = d.path().join("x");
        std::fs::write(&x, "").unwrap();
        std::fs::set_permissions(&x, std::os::unix::fs::PermissionsExt::from_mode(0o750)).unwrap();
        std::os::unix::fs::symlink("x", d.path().join("l")).unwrap();
        nix::unistd::mkfifo(
            &d.path().join("p"),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        let m = |n: &str| git_mode(&nix::sys::stat::lstat(&d.path().join(n)).unwrap());
        assert_eq!(m("x"), Some(0o100_755));
        assert_eq!(m("l"), Some(0o120_000));
        assert_eq!(m("."), Some(0o040_000));
        assert_eq!(m("p"), None, "a FIFO is skipped, as libgit2 does");
    }
}
