//! Warm runners: `subagent-runner --warm` processes started before they
//! have a run, so a spawn hands its run to one that has already exec'd,
//! loaded its libraries and started (see `subagent_runner::warm`) instead
//! of starting a runner on its path.
//!
//! Each waits on a SOCK_SEQPACKET socket whose other end the daemon keeps.
//! A hand-over is one message: runner.json's path, with runner.lock
//! (already flock'ed by the daemon), runner.log and, for a run with a uid
//! of its own, its uid lease as SCM_RIGHTS. A warm runner that died meanwhile is noticed when the message cannot be sent;
//! the spawn then starts a runner as before. A warm runner that is let go
//! (the pool dropped, the daemon gone) reads end of file and exits.
//!
//! A warm runner is started like any runner (posix_spawn, its own session,
//! signals blocked, no environment, cwd `/`), with `/dev/null` as output
//! until its run arrives. Warm runners are refilled when a run ends, not
//! while one is starting.

use super::launch::{LaunchError, Launched};
use nix::sys::socket::{
    sendmsg, socketpair, AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType,
};
use std::io::IoSlice;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// A warm runner could not be started or given its run.
#[derive(Debug, thiserror::Error)]
pub enum WarmError {
    /// The socket pair could not be made.
    #[error("socketpair: {0}")]
    Socketpair(#[source] nix::errno::Errno),
    /// The runner could not be started.
    #[error(transparent)]
    Launch(#[from] LaunchError),
    /// The warm runner's socket was already let go.
    #[error("no socket")]
    NoSocket,
    /// The run could not be sent.
    #[error("sendmsg: {0}")]
    Send(#[source] nix::errno::Errno),
    /// Only part of the run's message went.
    #[error("sendmsg sent {sent} of {len} bytes")]
    Short {
        /// Bytes sent.
        sent: usize,
        /// Bytes in the message.
        len: usize,
    },
}

/// An idle warm runner.
pub struct Idle {
    pid: i32,
    start_ticks: u64,
    pidfd: Option<OwnedFd>,
    sock: Option<OwnedFd>,
}

impl Drop for Idle {
    fn drop(&mut self) {
        // Let it go: end of file makes it exit; then reap it.
        drop(self.sock.take());
        if let Some(fd) = self.pidfd.take() {
            let _ = super::pidfd::send_signal(&fd, self.pid, libc::SIGKILL);
            let _ = super::pidfd::reap(&fd);
        }
    }
}

/// The pool of idle warm runners.
pub struct WarmRunners {
    runner: PathBuf,
    want: usize,
    idle: Mutex<Vec<Idle>>,
    /// One fill at a time (several runs may end together).
    filling: Mutex<()>,
    /// Set by [`WarmRunners::close`]: no more warm runners.
    closed: std::sync::atomic::AtomicBool,
}

impl WarmRunners {
    /// A pool of up to `want` warm runners of `runner`; none is started
    /// until [`WarmRunners::fill`].
    pub fn new(runner: PathBuf, want: usize) -> WarmRunners {
        WarmRunners {
            runner,
            want,
            idle: Mutex::new(Vec::new()),
            filling: Mutex::new(()),
            closed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<Idle>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many warm runners wait.
    pub fn ready(&self) -> usize {
        self.idle().len()
    }

    /// The pids of the waiting warm runners.
    pub fn pids(&self) -> Vec<i32> {
        self.idle().iter().map(|i| i.pid).collect()
    }

    /// Starts warm runners until `want` wait. Blocking.
    pub fn fill(&self) {
        let Ok(_one) = self.filling.try_lock() else {
            return;
        };
        while self.ready() < self.want && !self.closed.load(std::sync::atomic::Ordering::SeqCst) {
            match self.start_one() {
                // Closed meanwhile: this one is let go at once.
                Ok(idle) if self.closed.load(std::sync::atomic::Ordering::SeqCst) => drop(idle),
                Ok(idle) => self.idle().push(idle),
                Err(e) => {
                    tracing::warn!("starting a warm runner: {e}");
                    return;
                }
            }
        }
    }

    /// Lets every waiting warm runner go (and reaps it); no more are
    /// started. Blocking.
    pub fn close(&self) {
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        let idle = std::mem::take(&mut *self.idle());
        drop(idle);
    }

    fn start_one(&self) -> Result<Idle, WarmError> {
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(WarmError::Socketpair)?;
        let args = ["--warm".to_owned()];
        let pid = super::spawn::spawn(&super::spawn::RunnerSpawn {
            program: &self.runner,
            args: &args,
            stdin: Some(theirs.as_fd()),
            output: None,
            lock: None,
            uid_lock: None,
            blocked: subagent_runner::supervise::handled_signals(),
        })
        .map_err(LaunchError::from)?;
        drop(theirs);
        let l = Launched::of(pid)?;
        Ok(Idle {
            pid,
            start_ticks: l.start_ticks,
            pidfd: Some(l.pidfd),
            sock: Some(ours),
        })
    }

    /// Hands the run whose runner.json is `spec` to a waiting warm runner,
    /// with its (locked) runner.lock, its runner.log and its uid lease, if
    /// any. None when no warm runner could take
    /// it (none waits, or those that did were dead). Blocking.
    pub fn hand_over(
        &self,
        spec: &Path,
        lock: BorrowedFd<'_>,
        log: BorrowedFd<'_>,
        uid_lock: Option<BorrowedFd<'_>>,
    ) -> Option<Launched> {
        loop {
            let mut idle = self.idle().pop()?;
            // Taken before the send: once the run is sent, this runner is
            // the run's and must be watched, never let go.
            let Some(pidfd) = idle.pidfd.take() else {
                continue;
            };
            match send(&idle, spec, lock, log, uid_lock) {
                Ok(()) => {
                    // Our end is not needed any more; the runner has its run.
                    drop(idle.sock.take());
                    return Some(Launched {
                        pid: idle.pid,
                        start_ticks: idle.start_ticks,
                        pidfd,
                    });
                }
                Err(e) => {
                    tracing::warn!(
                        pid = idle.pid,
                        "a warm runner could not take a run ({e}); trying the next"
                    );
                    // Let it go and reap it.
                    idle.pidfd = Some(pidfd);
                    drop(idle);
                }
            }
        }
    }
}

fn send(
    idle: &Idle,
    spec: &Path,
    lock: BorrowedFd<'_>,
    log: BorrowedFd<'_>,
    uid_lock: Option<BorrowedFd<'_>>,
) -> Result<(), WarmError> {
    let sock = idle.sock.as_ref().ok_or(WarmError::NoSocket)?;
    let mut fds = vec![lock.as_raw_fd(), log.as_raw_fd()];
    fds.extend(uid_lock.map(|u| u.as_raw_fd()));
    let bytes = spec.as_os_str().as_bytes();
    let sent = sendmsg::<()>(
        sock.as_raw_fd(),
        &[IoSlice::new(bytes)],
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map_err(WarmError::Send)?;
    if sent != bytes.len() {
        return Err(WarmError::Short {
            sent,
            len: bytes.len(),
        });
    }
    Ok(())
}
