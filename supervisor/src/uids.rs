//! Per-run uids: a root daemon runs each child as a uid (and gid of the
//! same number) of its own, leased from a reserved range, as systemd's
//! DynamicUser does. Runs then share no uid with the daemon, the host's
//! users or each other: per-uid kernel limits (processes, inotify
//! instances), file ownership and the signal and ptrace rules of the uid
//! separate them.
//!
//! A lease is an `flock` on `<lock dir>/<uid>`, a directory shared by every
//! supervisor on the host (`/run/subagentd/uids`), so two daemons, or a
//! daemon and `subagent run`, never hand out the same uid at once. The
//! daemon takes the lease when it accepts a run and hands the locked file
//! to the run's runner, which holds it until it exits: a uid is free again
//! exactly when nothing of its run is left.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// The default range: 65,536 ids from 0x7F000000, far above any user a
/// host's user database holds and below systemd's reserved ranges.
pub const DEFAULT_FIRST: u32 = 0x7F00_0000;
/// The default range's size.
pub const DEFAULT_COUNT: u32 = 65_536;
/// Where leases are taken, for every supervisor on the host.
pub const LOCK_DIR: &str = "/run/subagentd/uids";

/// A uid could not be leased, or the range cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum UidError {
    /// The range is not `FIRST-LAST` with FIRST <= LAST, above 0.
    #[error("uid_range {0:?}: expected FIRST-LAST, e.g. \"2130706432-2130771967\"")]
    BadRange(String),
    /// The host's user database already uses an id of the range.
    #[error(
        "uid_range {first}-{last} holds {what} {name:?} ({id}) of {file}; choose another range"
    )]
    Overlap {
        first: u32,
        last: u32,
        /// "uid" or "gid".
        what: &'static str,
        /// The user's or group's name.
        name: String,
        id: u32,
        /// `/etc/passwd` or `/etc/group`.
        file: &'static str,
    },
    /// The lock directory cannot be used.
    #[error("uid leases: {path}: {why}")]
    LockDir { path: PathBuf, why: String },
    /// Every uid of the range is leased.
    #[error("every uid of the range {first}-{last} is in use by a run")]
    Exhausted { first: u32, last: u32 },
    /// A run's recorded uid is leased by another run.
    #[error("uid {0} is in use by another run")]
    Taken(u32),
    /// A lock file could not be opened or locked.
    #[error("uid lease {path}: {source}")]
    Io {
        /// The lock file.
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Parses `FIRST-LAST` into (first, count).
pub fn parse_range(s: &str) -> Result<(u32, u32), UidError> {
    let bad = || UidError::BadRange(s.to_owned());
    let (a, b) = s.split_once('-').ok_or_else(bad)?;
    let first: u32 = a.trim().parse().map_err(|_| bad())?;
    let last: u32 = b.trim().parse().map_err(|_| bad())?;
    // Never root, never the overflow or the invalid ids.
    if first == 0 || last < first || last >= u32::MAX - 1 {
        return Err(bad());
    }
    Ok((first, last - first + 1))
}

/// Fails when `/etc/passwd` or `/etc/group` text (`passwd`, `group`)
/// names an id of the range.
pub fn check_unused(first: u32, count: u32, passwd: &str, group: &str) -> Result<(), UidError> {
    let last = first + (count - 1);
    for (text, what, file) in [(passwd, "uid", "/etc/passwd"), (group, "gid", "/etc/group")] {
        for line in text.lines() {
            let mut f = line.split(':');
            let (Some(name), Some(_), Some(id)) = (f.next(), f.next(), f.next()) else {
                continue;
            };
            if let Ok(id) = id.parse::<u32>() {
                if (first..=last).contains(&id) {
                    return Err(UidError::Overlap {
                        first,
                        last,
                        what,
                        name: name.to_owned(),
                        id,
                        file,
                    });
                }
            }
        }
    }
    Ok(())
}

/// The range and where its leases are taken.
#[derive(Debug)]
pub struct UidPool {
    first: u32,
    count: u32,
    dir: OwnedFd,
    dir_path: PathBuf,
    next: AtomicU32,
}

/// One leased uid; the lease lasts as long as its lock file is open here
/// or in the runner it was handed to.
#[derive(Debug)]
pub struct UidLease {
    /// The uid (and gid).
    pub uid: u32,
    lock: OwnedFd,
}

impl UidLease {
    /// The locked file, to hand to the runner.
    pub fn lock(&self) -> BorrowedFd<'_> {
        self.lock.as_fd()
    }
}

impl UidPool {
    /// Opens the pool: checks the range against the user database and
    /// makes the lock directory (root's, 0700, no symlink on the way).
    pub fn open(first: u32, count: u32, lock_dir: &Path) -> Result<UidPool, UidError> {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        check_unused(first, count, &read("/etc/passwd"), &read("/etc/group"))?;
        let dir = crate::securedir::open_private_dir(lock_dir).map_err(|e| UidError::LockDir {
            path: lock_dir.to_path_buf(),
            why: e.to_string(),
        })?;
        Ok(UidPool {
            first,
            count,
            dir,
            dir_path: lock_dir.to_path_buf(),
            next: AtomicU32::new(0),
        })
    }

    /// The range, as `FIRST-LAST`.
    pub fn describe(&self) -> String {
        format!("{}-{}", self.first, self.first + (self.count - 1))
    }

    /// Leases a free uid (the next free one after the last leased, so that
    /// a uid is not reused at once).
    pub fn lease(&self) -> Result<UidLease, UidError> {
        for _ in 0..self.count {
            let i = self.next.fetch_add(1, Ordering::Relaxed) % self.count;
            if let Some(l) = self.try_lock(self.first + i)? {
                return Ok(l);
            }
        }
        Err(UidError::Exhausted {
            first: self.first,
            last: self.first + (self.count - 1),
        })
    }

    /// Leases `uid` again (a queued run's, after a daemon restart).
    pub fn relock(&self, uid: u32) -> Result<UidLease, UidError> {
        if !(self.first..self.first.saturating_add(self.count)).contains(&uid) {
            return self.lease();
        }
        self.try_lock(uid)?.ok_or(UidError::Taken(uid))
    }

    fn try_lock(&self, uid: u32) -> Result<Option<UidLease>, UidError> {
        use nix::fcntl::OFlag;
        let name = uid.to_string();
        let io = |source: std::io::Error| UidError::Io {
            path: self.dir_path.join(&name),
            source,
        };
        let fd = nix::fcntl::openat(
            &self.dir,
            name.as_str(),
            OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .map_err(|e| io(e.into()))?;
        let file = std::fs::File::from(fd);
        // The lock lives as long as the open file description, wherever
        // its descriptors are (ours, then the runner's).
        match crate::lockfile::try_lock(&file) {
            Ok(true) => Ok(Some(UidLease {
                uid,
                lock: OwnedFd::from(file),
            })),
            Ok(false) => Ok(None),
            Err(e) => Err(io(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_and_refuse_root_and_the_invalid_ids() {
        assert_eq!(parse_range("100-199").unwrap(), (100, 100));
        assert_eq!(parse_range(" 7 - 7 ").unwrap(), (7, 1));
        for bad in [
            "",
            "5",
            "0-10",
            "10-5",
            "a-b",
            "1-4294967295",
            "1-4294967294",
        ] {
            assert!(parse_range(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_range_that_holds_a_host_user_or_group_is_refused() {
        let passwd = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n";
        let group = "root:x:0:\nweird:x:150:\n";
        assert!(check_unused(100, 50, passwd, group).is_ok());
        let e = check_unused(65530, 10, passwd, group).unwrap_err();
        assert!(e.to_string().contains("\"nobody\""), "{e}");
        let e = check_unused(150, 1, passwd, group).unwrap_err();
        assert!(e.to_string().contains("/etc/group"), "{e}");
    }

    fn pool(dir: &Path, first: u32, count: u32) -> UidPool {
        UidPool {
            first,
            count,
            dir: std::fs::File::open(dir).unwrap().into(),
            dir_path: dir.to_path_buf(),
            next: AtomicU32::new(0),
        }
    }

    #[test]
    fn a_leased_uid_is_not_leased_again_until_its_lock_is_closed() {
        let d = tempfile::tempdir().unwrap();
        // Two pools on one directory: two supervisors on one host.
        let (a, b) = (pool(d.path(), 1000, 2), pool(d.path(), 1000, 2));
        let first = a.lease().unwrap();
        let second = b.lease().unwrap();
        assert_ne!(first.uid, second.uid);
        assert!(matches!(a.lease(), Err(UidError::Exhausted { .. })));
        assert!(matches!(b.relock(first.uid), Err(UidError::Taken(_))));
        // The lock is the open file: a copy (the runner's) keeps it.
        let handed = first.lock().try_clone_to_owned().unwrap();
        let uid = first.uid;
        drop(first);
        assert!(matches!(b.relock(uid), Err(UidError::Taken(_))));
        drop(handed);
        assert_eq!(b.relock(uid).unwrap().uid, uid);
    }
}
