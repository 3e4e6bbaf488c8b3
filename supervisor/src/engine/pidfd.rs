//! pidfds: a handle on a process that cannot be confused with a later
//! process that reuses its pid.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// A pidfd call failed.
#[derive(Debug, thiserror::Error)]
#[error("{op} (pid {pid}): {source}")]
pub struct PidfdError {
    /// The call.
    pub op: &'static str,
    /// The process.
    pub pid: i32,
    /// The errno.
    pub source: std::io::Error,
}

/// Opens a pidfd for `pid` (also works for a zombie not yet reaped).
pub fn open(pid: i32) -> Result<OwnedFd, PidfdError> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor
    // or -1; it touches no memory of ours.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(PidfdError {
            op: "pidfd_open",
            pid,
            source: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: the kernel just returned this descriptor to us; nothing else
    // owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Sends `sig` to the process behind `fd`.
pub fn send_signal(fd: &OwnedFd, pid: i32, sig: i32) -> Result<(), PidfdError> {
    // SAFETY: pidfd_send_signal with a null siginfo and no flags reads no
    // memory of ours; fd is a live pidfd we own.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if rc < 0 {
        return Err(PidfdError {
            op: "pidfd_send_signal",
            pid,
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// How a reaped process ended, as text ("exited with status 0", "was
/// killed by signal 9 (SIGKILL)").
/// `None` when the process is not our child (nothing to reap).
pub fn reap(fd: &OwnedFd) -> Option<String> {
    // SAFETY: siginfo_t is plain data; all-zero is a valid value.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: waitid writes one siginfo_t into `info`, which we own; P_PIDFD
    // takes the descriptor number as its id.
    let rc = unsafe {
        libc::waitid(
            libc::P_PIDFD,
            fd.as_raw_fd() as libc::id_t,
            &mut info,
            libc::WEXITED,
        )
    };
    if rc != 0 {
        return None;
    }
    // SAFETY: after a successful waitid with WEXITED the kernel filled the
    // child fields of the union.
    let (code, status) = unsafe { (info.si_code, info.si_status()) };
    Some(match code {
        libc::CLD_EXITED => format!("exited with status {status}"),
        _ => format!(
            "was killed by signal {status} ({})",
            subagent_runner::supervise::signal_name(status)
        ),
    })
}
