//! Thin wrappers over the few raw syscalls nix does not cover, each with a
//! `// SAFETY:` note and a typed error.

use std::os::fd::RawFd;

/// A syscall failed.
#[derive(Debug, thiserror::Error)]
#[error("{op}: {source}")]
pub struct SysError {
    /// The operation, e.g. "close_range".
    pub op: &'static str,
    /// The errno it failed with.
    pub source: std::io::Error,
}

const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;

/// Marks every descriptor from `first` up as close-on-exec.
///
/// Used between fork and exec: the descriptors stay usable until exec (the
/// standard library's own error pipe among them) and none reaches the
/// program. Async-signal-safe: one syscall, no allocation.
pub fn cloexec_from(first: RawFd) -> Result<(), SysError> {
    // SAFETY: close_range takes plain integers and only changes descriptor
    // flags; it cannot touch memory.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first as libc::c_uint,
            libc::c_uint::MAX,
            CLOSE_RANGE_CLOEXEC,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(SysError {
            op: "close_range",
            source: std::io::Error::last_os_error(),
        })
    }
}

/// Closes every descriptor from 3 up but `keep`.
pub fn close_all_except(keep: RawFd) -> Result<(), SysError> {
    let close = |first: RawFd, last: libc::c_uint| {
        // SAFETY: close_range takes plain integers; the descriptors it
        // closes are not used again by this process.
        let rc = unsafe { libc::syscall(libc::SYS_close_range, first as libc::c_uint, last, 0) };
        if rc == 0 {
            Ok(())
        } else {
            Err(SysError {
                op: "close_range",
                source: std::io::Error::last_os_error(),
            })
        }
    };
    if keep > 3 {
        close(3, (keep - 1) as libc::c_uint)?;
    }
    close(keep.max(2) + 1, libc::c_uint::MAX)
}

/// Sets a pipe's capacity (F_SETPIPE_SZ); returns the capacity granted.
pub fn set_pipe_size(fd: RawFd, bytes: i32) -> Result<i32, SysError> {
    // SAFETY: fcntl(F_SETPIPE_SZ) takes an int argument and touches no memory.
    let rc = unsafe { libc::fcntl(fd, libc::F_SETPIPE_SZ, bytes) };
    if rc >= 0 {
        Ok(rc)
    } else {
        Err(SysError {
            op: "fcntl(F_SETPIPE_SZ)",
            source: std::io::Error::last_os_error(),
        })
    }
}
