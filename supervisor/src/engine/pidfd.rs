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

/// How a runner ended, as the daemon saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunnerExit {
    /// It exited with this status.
    Exited(i32),
    /// This signal killed it.
    Killed(i32),
    /// Nobody saw it end: it was not our child to reap (a restarted
    /// daemon found it gone).
    Unknown,
}

impl std::fmt::Display for RunnerExit {
    /// The wording of a `lost` reason: `the runner <this> and ...`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            RunnerExit::Exited(status) => write!(f, "exited with status {status}"),
            RunnerExit::Killed(signal) => write!(
                f,
                "was killed by signal {signal} ({})",
                subagent_runner::supervise::signal_name(signal)
            ),
            RunnerExit::Unknown => f.write_str("is gone"),
        }
    }
}

/// Reaps the process behind `fd` and says how it ended;
/// [`RunnerExit::Unknown`] when it is not our child (nothing to reap).
pub fn reap(fd: &OwnedFd) -> RunnerExit {
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
        return RunnerExit::Unknown;
    }
    // SAFETY: after a successful waitid with WEXITED the kernel filled the
    // child fields of the union.
    let (code, status) = unsafe { (info.si_code, info.si_status()) };
    match code {
        libc::CLD_EXITED => RunnerExit::Exited(status),
        // CLD_KILLED or CLD_DUMPED: WEXITED reports nothing else.
        _ => RunnerExit::Killed(status),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exits_read_as_the_lost_reason_words() {
        assert_eq!(RunnerExit::Exited(2).to_string(), "exited with status 2");
        assert_eq!(
            RunnerExit::Killed(9).to_string(),
            "was killed by signal 9 (SIGKILL)"
        );
        assert_eq!(RunnerExit::Unknown.to_string(), "is gone");
    }

    #[test]
    fn reaping_a_child_says_how_it_ended() {
        let spawn = |script: &str| {
            let child = std::process::Command::new("/bin/sh")
                .args(["-c", script])
                .spawn()
                .unwrap();
            let pid = child.id() as i32;
            (open(pid).unwrap(), child)
        };
        let (fd, _child) = spawn("exit 3");
        assert_eq!(reap(&fd), RunnerExit::Exited(3));
        let (fd, _child) = spawn("kill -KILL $$");
        assert_eq!(reap(&fd), RunnerExit::Killed(9));
        // Already reaped: nothing more to learn.
        assert_eq!(reap(&fd), RunnerExit::Unknown);
    }
}
