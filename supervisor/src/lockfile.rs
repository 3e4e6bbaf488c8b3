//! Advisory locks (flock) that say "someone is alive here": the daemon's on
//! its state dir, each runner's on its run folder. The kernel drops a lock
//! when its holder dies, however it dies.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use subagent_runner::ioerr::{at, IoAt};

/// A lock file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Opening or locking failed.
    #[error(transparent)]
    Io(#[from] IoAt),
    /// Someone else holds it.
    #[error("{path} is locked by a live process{}", pid.map(|p| format!(" (pid {p})")).unwrap_or_default())]
    Held {
        /// The lock file.
        path: PathBuf,
        /// The holder's pid, when it wrote one.
        pid: Option<i32>,
    },
}

/// Tries flock(LOCK_EX | LOCK_NB); `Ok(false)` when someone else holds it.
pub fn try_lock(file: &File) -> std::io::Result<bool> {
    // SAFETY: flock takes a descriptor we own (borrowed from `file`) and
    // flags; it touches no memory.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(e)
    }
}

/// Opens (creating, 0600, close-on-exec) a lock file.
pub fn open(path: &Path) -> Result<File, LockError> {
    Ok(OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
        .map_err(at("open", path))?)
}

/// Reads the pid a holder wrote into its lock file.
pub fn read_pid(file: &mut File) -> Option<i32> {
    let mut s = String::new();
    file.seek(SeekFrom::Start(0)).ok()?;
    file.read_to_string(&mut s).ok()?;
    s.trim().parse().ok()
}

/// Takes the lock at `path` and writes our pid into it, or says who holds it.
pub fn acquire(path: &Path) -> Result<File, LockError> {
    let mut file = open(path)?;
    let locked = try_lock(&file).map_err(at("flock", path))?;
    if !locked {
        return Err(LockError::Held {
            path: path.to_path_buf(),
            pid: read_pid(&mut file),
        });
    }
    let io = |e| at("write", path)(e);
    file.set_len(0).map_err(io)?;
    file.seek(SeekFrom::Start(0)).map_err(io)?;
    writeln!(file, "{}", std::process::id()).map_err(io)?;
    Ok(file)
}

/// Whether a live process holds the lock at `path` (`None`: no lock file).
pub fn is_held(path: &Path) -> Option<bool> {
    let file = File::open(path).ok()?;
    Some(!try_lock(&file).unwrap_or(false))
}

/// The pid a runner wrote into its runner.lock at `path`, if any.
pub fn runner_pid_in_lock(path: &Path) -> Option<i32> {
    open(path).ok().and_then(|mut f| read_pid(&mut f))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_holder_is_refused_and_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.lock");
        assert_eq!(is_held(&p), None);
        let held = acquire(&p).unwrap();
        // flock locks belong to the open file description: a second open
        // in the same process conflicts, as another process would.
        match acquire(&p) {
            Err(LockError::Held { pid, .. }) => assert_eq!(pid, Some(std::process::id() as i32)),
            other => panic!("{other:?}"),
        }
        assert_eq!(is_held(&p), Some(true));
        drop(held);
        assert_eq!(is_held(&p), Some(false));
    }
}
