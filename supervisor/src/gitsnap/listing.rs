//! Directory listings kept between scans, so that a snapshot of a work
//! tree whose directories did not change since the last one skips their
//! `getdents` (as git's `core.untrackedCache` does, but holding the plain
//! listing: the index and the ignore rules are applied afresh each time).
//!
//! A listing is keyed by the directory's device and inode and stamped with
//! its mtime and ctime, taken by `fstat` *before* it was read. Any change
//! to a directory's names sets both times to the clock's present, so a
//! stamp that still matches means the same names. Two guards make that
//! hold:
//! - **the clock's grain**: a change within the same clock tick as the
//!   stamp would leave it unchanged, so a listing is kept only when the
//!   stamp is older than the read by more than a tick (see [`margin`]);
//!   the same rule makes a reused inode number (a new directory) miss;
//! - **the clock's owner**: only file systems stamped by this kernel's
//!   clock are cached ([`local_clock`]); a network file system's server
//!   clock may run behind ours. The scan checks the work tree's root and
//!   keeps listings only of directories on the root's device (none under
//!   a mount point inside the tree).
//!
//! The cache holds at most [`MAX_NAMES`] names; past that it starts over.

use nix::dir::Type;
use nix::sys::stat::FileStat;
use nix::sys::statfs::{self, FsType};
use std::collections::HashMap;
use std::ffi::CString;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, SystemTime};

/// The most names all listings hold together (about 10 MiB).
pub const MAX_NAMES: usize = 200_000;

/// One name in a directory and its type as `readdir` gave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The name.
    pub name: CString,
    /// The type, when the file system reports it.
    pub kind: Option<Type>,
}

/// What identifies a directory's content: taken by `fstat` before reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    dev: u64,
    ino: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    /// The stamp of the directory `st` describes.
    pub fn of(st: &FileStat) -> Self {
        Stamp {
            dev: st.st_dev,
            ino: st.st_ino,
            mtime: (st.st_mtime, st.st_mtime_nsec),
            ctime: (st.st_ctime, st.st_ctime_nsec),
        }
    }

    /// The device of the directory.
    pub fn dev(&self) -> u64 {
        self.dev
    }

    /// The stamp of the directory `m` describes (`std::fs::metadata`).
    pub fn of_metadata(m: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        Stamp {
            dev: m.dev(),
            ino: m.ino(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }

    /// The later of the two times, as a point in time (`None` if before
    /// the epoch).
    fn latest(&self) -> Option<SystemTime> {
        let (s, ns) = self.mtime.max(self.ctime);
        let s = u64::try_from(s).ok()?;
        let ns = u32::try_from(ns).ok()?;
        SystemTime::UNIX_EPOCH.checked_add(Duration::new(s, ns))
    }
}

/// How much older than the read a stamp must be for its listing to be
/// kept: 100 ms on a file system with sub-second times (the kernel's
/// coarse clock ticks every 10 ms at most), 2 s on one that stores whole
/// seconds (or 2-second steps); a stamp whose nanoseconds are zero is
/// taken as the latter.
pub fn margin(stamp: &Stamp) -> Duration {
    if stamp.mtime.1 == 0 && stamp.ctime.1 == 0 {
        Duration::from_secs(2)
    } else {
        Duration::from_millis(100)
    }
}

/// Whether a listing read at `read_at` with this stamp may be kept.
pub fn keepable(stamp: &Stamp, read_at: SystemTime) -> bool {
    stamp
        .latest()
        .and_then(|t| t.checked_add(margin(stamp)))
        .is_some_and(|t| t < read_at)
}

/// The local file systems whose times come from this kernel's clock.
const LOCAL_CLOCK: [FsType; 6] = [
    statfs::EXT2_SUPER_MAGIC,
    statfs::EXT4_SUPER_MAGIC,
    statfs::XFS_SUPER_MAGIC,
    statfs::BTRFS_SUPER_MAGIC,
    statfs::TMPFS_MAGIC,
    statfs::F2FS_SUPER_MAGIC,
];

/// Whether the file system holding `fd` is stamped by this kernel's clock
/// (ext2/3/4, XFS, Btrfs, tmpfs, F2FS); anything else is never cached.
pub fn local_clock(fd: impl AsFd) -> bool {
    statfs::fstatfs(fd).is_ok_and(|s| LOCAL_CLOCK.contains(&s.filesystem_type()))
}

/// A directory's device and inode.
type DirKey = (u64, u64);

/// A kept listing and the stamp it was read under.
type Kept = (Stamp, Arc<[Entry]>);

/// The listings, with counts of what they saved.
#[derive(Default)]
pub struct Listings {
    map: Mutex<HashMap<DirKey, Kept>>,
    names: AtomicUsize,
    hits: AtomicU64,
    kept: AtomicU64,
}

impl Listings {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// The listing kept for the directory `stamp` describes, if it is
    /// still its content.
    pub fn get(&self, stamp: &Stamp) -> Option<Arc<[Entry]>> {
        let map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        let (kept, names) = map.get(&(stamp.dev, stamp.ino))?;
        if kept != stamp {
            return None;
        }
        self.hits.fetch_add(1, Ordering::Relaxed);
        Some(Arc::clone(names))
    }

    /// Keeps a directory's listing (the caller checked [`keepable`]);
    /// replaces its older one.
    pub fn keep(&self, stamp: Stamp, entries: Vec<Entry>) {
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        let added = entries.len();
        if self.names.load(Ordering::Relaxed) + added > MAX_NAMES {
            map.clear();
            self.names.store(0, Ordering::Relaxed);
            if added > MAX_NAMES {
                return;
            }
        }
        if let Some((_, old)) = map.insert((stamp.dev, stamp.ino), (stamp, entries.into())) {
            self.names.fetch_sub(old.len(), Ordering::Relaxed);
        }
        self.names.fetch_add(added, Ordering::Relaxed);
        self.kept.fetch_add(1, Ordering::Relaxed);
    }

    /// Drops every listing.
    pub fn clear(&self) {
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        map.clear();
        self.names.store(0, Ordering::Relaxed);
    }

    /// Directories answered from the cache so far.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// Listings kept so far.
    pub fn kept(&self) -> u64 {
        self.kept.load(Ordering::Relaxed)
    }

    /// The names held now.
    pub fn names(&self) -> usize {
        self.names.load(Ordering::Relaxed)
    }
}

/// The process's cache, used by every snapshot.
pub fn shared() -> &'static Listings {
    static SHARED: OnceLock<Listings> = OnceLock::new();
    SHARED.get_or_init(Listings::new)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn stamp(ino: u64, m: (i64, i64), c: (i64, i64)) -> Stamp {
        Stamp {
            dev: 1,
            ino,
            mtime: m,
            ctime: c,
        }
    }

    fn entries(n: usize) -> Vec<Entry> {
        (0..n)
            .map(|i| Entry {
                name: CString::new(format!("f{i}")).unwrap(),
                kind: Some(Type::File),
            })
            .collect()
    }

    fn at(s: u64, ms: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(s) + Duration::from_millis(ms)
    }

    #[test]
    fn only_a_stamp_older_than_the_margin_is_keepable() {
        let fine = stamp(1, (100, 5), (100, 5));
        assert_eq!(margin(&fine), Duration::from_millis(100));
        assert!(!keepable(&fine, at(100, 50)), "within the margin");
        assert!(keepable(&fine, at(100, 101)));
        // Whole seconds: the coarse margin.
        let coarse = stamp(1, (100, 0), (100, 0));
        assert_eq!(margin(&coarse), Duration::from_secs(2));
        assert!(!keepable(&coarse, at(101, 900)));
        assert!(keepable(&coarse, at(102, 1)));
        // The later of mtime and ctime counts (a chmod or a utimensat
        // moves ctime to the present).
        let touched = stamp(1, (50, 1), (100, 5));
        assert!(!keepable(&touched, at(100, 50)));
        // Before the epoch: never.
        assert!(!keepable(&stamp(1, (-5, 1), (-5, 1)), at(100, 0)));
    }

    #[test]
    fn a_listing_answers_only_its_exact_stamp() {
        let l = Listings::new();
        let s = stamp(7, (100, 5), (100, 5));
        l.keep(s, entries(3));
        assert_eq!(l.get(&s).unwrap().len(), 3);
        assert_eq!(l.hits(), 1);
        for other in [
            stamp(7, (100, 6), (100, 5)),
            stamp(7, (100, 5), (100, 6)),
            stamp(8, (100, 5), (100, 5)),
            Stamp { dev: 2, ..s },
        ] {
            assert!(l.get(&other).is_none(), "{other:?}");
        }
        // A newer listing replaces the old one and its count.
        let s2 = stamp(7, (200, 5), (200, 5));
        l.keep(s2, entries(5));
        assert!(l.get(&s).is_none());
        assert_eq!(l.names(), 5);
    }

    #[test]
    fn past_the_cap_the_cache_starts_over() {
        let l = Listings::new();
        l.keep(stamp(1, (1, 1), (1, 1)), entries(MAX_NAMES - 10));
        l.keep(stamp(2, (1, 1), (1, 1)), entries(20));
        assert!(l.get(&stamp(1, (1, 1), (1, 1))).is_none());
        assert_eq!(l.names(), 20);
        l.keep(stamp(3, (1, 1), (1, 1)), entries(MAX_NAMES + 1));
        assert_eq!(l.names(), 0, "a listing larger than the cap is not kept");
        l.keep(stamp(4, (1, 1), (1, 1)), entries(2));
        l.clear();
        assert_eq!(l.names(), 0);
        assert!(l.get(&stamp(4, (1, 1), (1, 1))).is_none());
    }

    #[test]
    fn a_directory_on_proc_is_never_cached() {
        let proc = std::fs::File::open("/proc").unwrap();
        assert!(!local_clock(&proc));
    }
}
