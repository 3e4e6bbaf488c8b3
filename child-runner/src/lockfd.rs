//! runner.lock, handed over by the daemon as an open, locked descriptor.

use std::io::Write;
use std::os::fd::{FromRawFd, RawFd};

/// runner.lock, adopted: open and locked until this process dies.
pub struct AdoptedLock(RawFd);

/// Takes ownership of the lock descriptor `fd`: marks it close-on-exec
/// (the agent must not inherit it), writes our pid into it, and leaks it so
/// it stays open (and locked) until this process dies.
pub fn adopt(fd: RawFd) -> Result<AdoptedLock, crate::sys::SysError> {
    // SAFETY: fcntl(F_SETFD) only changes a descriptor flag; an invalid fd
    // is reported as EBADF.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
        return Err(crate::sys::SysError {
            op: "fcntl(lock fd)",
            source: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: fd is open (F_SETFD succeeded) and the daemon handed it to
    // this process alone; nothing else in the runner owns it.
    let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
    let result = file
        .set_len(0)
        .and_then(|_| write!(file, "{}", std::process::id()))
        .map_err(|source| crate::sys::SysError {
            op: "write pid to runner.lock",
            source,
        });
    std::mem::forget(file);
    result.map(|()| AdoptedLock(fd))
}

impl AdoptedLock {
    /// Takes our pid out of runner.lock again: no agent of the run was
    /// started, so a restarted daemon may start the run afresh.
    pub fn clear(&self) {
        // SAFETY: ftruncate on the descriptor this process keeps open for
        // its whole life; it touches no memory of ours.
        unsafe { libc::ftruncate(self.0, 0) };
    }
}

/// Keeps the run's uid lease `fd` open (close-on-exec) until this process
/// dies: the uid is the run's until nothing of it is left.
pub fn hold(fd: RawFd) -> Result<(), crate::sys::SysError> {
    // SAFETY: fcntl(F_SETFD) only changes a descriptor flag; an invalid fd
    // is reported as EBADF.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
        return Err(crate::sys::SysError {
            op: "fcntl(uid lease fd)",
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}
