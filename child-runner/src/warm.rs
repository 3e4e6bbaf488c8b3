//! A warm runner: started by the daemon before it has a run for it, so a
//! spawn does not wait for the runner's exec, dynamic loading and start.
//!
//! `subagent-runner --warm` gets a Unix SOCK_SEQPACKET socket on fd 0 and
//! blocks on it. Its run arrives as one message: the path of runner.json as
//! the payload, and runner.lock and runner.log as SCM_RIGHTS descriptors.
//! The runner then puts runner.log on stdout and stderr and `/dev/null` on
//! stdin, and goes on exactly as a runner started for that run. End of file
//! (the daemon went away or let it go) makes it exit quietly.
//!
//! While it waits, a warm runner that may (CAP_SYS_ADMIN) also makes the
//! network namespace its run's child will most likely get: it moves itself
//! into a new, empty one and keeps a descriptor on the one it came from.
//! If the run turns out to be granted the network, it moves back before
//! anything else; otherwise the child inherits the new namespace and the
//! sandbox does not make another ([`netns_ready`]). Either way each run
//! has a namespace of its own: a warm runner takes one run.

use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
use std::io::IoSliceMut;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

/// Set once this process sits in a fresh network namespace made for its run.
static NETNS_READY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// How long making the namespace ahead took, in µs.
static NETNS_AHEAD_US: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How long [`enter_fresh_netns`] took, in µs (0 if it did not run).
pub fn netns_ahead_us() -> u64 {
    NETNS_AHEAD_US.load(std::sync::atomic::Ordering::SeqCst)
}

/// Whether this runner already sits in a fresh, empty network namespace
/// made for its run (so the child need not make one).
pub fn netns_ready() -> bool {
    NETNS_READY.load(std::sync::atomic::Ordering::SeqCst)
}

/// Moves this process into a new network namespace; returns a descriptor
/// on the one it left.
pub fn enter_fresh_netns() -> Result<OwnedFd, WarmError> {
    let started = std::time::Instant::now();
    let orig = nix::fcntl::open(
        "/proc/self/ns/net",
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|errno| WarmError::Sys {
        op: "open /proc/self/ns/net",
        errno,
    })?;
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).map_err(|errno| WarmError::Sys {
        op: "unshare(CLONE_NEWNET)",
        errno,
    })?;
    NETNS_AHEAD_US.store(
        started.elapsed().as_micros() as u64,
        std::sync::atomic::Ordering::SeqCst,
    );
    Ok(orig)
}

/// Settles the namespace made by [`enter_fresh_netns`] once the run is
/// known: kept for a run without network ([`netns_ready`] becomes true),
/// left for the original one (`orig`) for a run granted the network.
pub fn settle_netns(orig: OwnedFd, network: bool) -> Result<(), WarmError> {
    if network {
        nix::sched::setns(&orig, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|errno| {
            WarmError::Sys {
                op: "setns(CLONE_NEWNET) back to the host's namespace",
                errno,
            }
        })?;
    } else {
        NETNS_READY.store(true, std::sync::atomic::Ordering::SeqCst);
    }
    Ok(())
}

/// The socket a warm runner waits on.
pub const SOCKET_FD: RawFd = 0;

/// The most bytes a run's message may hold (the runner.json path).
const MAX_MESSAGE: usize = 4096;

/// A warm runner's run could not be received or installed.
#[derive(Debug, thiserror::Error)]
pub enum WarmError {
    /// A system call failed.
    #[error("{op}: {errno}")]
    Sys {
        /// The call.
        op: &'static str,
        /// The errno.
        errno: nix::errno::Errno,
    },
    /// The message is not what the daemon sends.
    #[error("malformed hand-over: {0}")]
    Malformed(String),
}

/// What the daemon hands a warm runner.
pub struct Handover {
    /// runner.json.
    pub spec: PathBuf,
    /// runner.lock, flock'ed by the daemon.
    pub lock: OwnedFd,
    /// runner.log, for stdout and stderr.
    pub log: OwnedFd,
}

/// Waits on `sock` for the run; `None` at end of file.
pub fn wait(sock: RawFd) -> Result<Option<Handover>, WarmError> {
    let mut buf = vec![0u8; MAX_MESSAGE];
    let mut cmsg = nix::cmsg_space!([RawFd; 2]);
    let (bytes, fds) = loop {
        let mut iov = [IoSliceMut::new(&mut buf)];
        match recvmsg::<()>(sock, &mut iov, Some(&mut cmsg), MsgFlags::MSG_CMSG_CLOEXEC) {
            Ok(msg) => {
                let mut fds: Vec<OwnedFd> = Vec::new();
                let cmsgs = msg.cmsgs().map_err(|errno| WarmError::Sys {
                    op: "recvmsg (control data)",
                    errno,
                })?;
                for c in cmsgs {
                    if let ControlMessageOwned::ScmRights(raw) = c {
                        // SAFETY: SCM_RIGHTS descriptors are new in this
                        // process and owned by nobody else.
                        fds.extend(
                            raw.into_iter()
                                .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                        );
                    }
                }
                break (msg.bytes, fds);
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(errno) => {
                return Err(WarmError::Sys {
                    op: "recvmsg",
                    errno,
                })
            }
        }
    };
    if bytes == 0 && fds.is_empty() {
        return Ok(None);
    }
    let path = &buf[..bytes];
    if path.is_empty() || path.contains(&0) {
        return Err(WarmError::Malformed(format!("a path of {bytes} bytes")));
    }
    let mut fds = fds.into_iter();
    match (fds.next(), fds.next(), fds.next()) {
        (Some(lock), Some(log), None) => Ok(Some(Handover {
            spec: PathBuf::from(std::ffi::OsStr::from_bytes(path)),
            lock,
            log,
        })),
        _ => Err(WarmError::Malformed(
            "expected runner.lock and runner.log".into(),
        )),
    }
}

/// Puts `log` on stdout and stderr, `/dev/null` on stdin (which closes the
/// socket).
pub fn install_stdio(log: &OwnedFd) -> Result<(), WarmError> {
    let null = nix::fcntl::open(
        "/dev/null",
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|errno| WarmError::Sys {
        op: "open /dev/null",
        errno,
    })?;
    for (from, to) in [
        (null.as_raw_fd(), 0),
        (log.as_raw_fd(), 1),
        (log.as_raw_fd(), 2),
    ] {
        // SAFETY: dup2 onto the standard descriptors; both are open here
        // and the old 0, 1, 2 (the socket, /dev/null) are ours to replace.
        if unsafe { libc::dup2(from, to) } < 0 {
            return Err(WarmError::Sys {
                op: "dup2",
                errno: nix::errno::Errno::last(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::socket::{
        sendmsg, socketpair, AddressFamily, ControlMessage, SockFlag, SockType,
    };
    use std::io::IoSlice;

    fn pair() -> (OwnedFd, OwnedFd) {
        socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap()
    }

    #[test]
    fn a_run_arrives_with_its_two_descriptors_and_eof_means_none() {
        let (ours, theirs) = pair();
        let dir = tempfile::tempdir().unwrap();
        let lock = std::fs::File::create(dir.path().join("runner.lock")).unwrap();
        let log = std::fs::File::create(dir.path().join("runner.log")).unwrap();
        let fds = [lock.as_raw_fd(), log.as_raw_fd()];
        sendmsg::<()>(
            ours.as_raw_fd(),
            &[IoSlice::new(b"/state/run/runner.json")],
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::empty(),
            None,
        )
        .unwrap();
        let h = wait(theirs.as_raw_fd()).unwrap().unwrap();
        assert_eq!(h.spec, PathBuf::from("/state/run/runner.json"));
        let st = nix::sys::stat::fstat(&h.log).unwrap();
        let want = nix::sys::stat::fstat(&log).unwrap();
        assert_eq!((st.st_dev, st.st_ino), (want.st_dev, want.st_ino));
        drop(ours);
        assert!(wait(theirs.as_raw_fd()).unwrap().is_none());
    }

    #[test]
    fn a_message_without_descriptors_is_refused() {
        let (ours, theirs) = pair();
        sendmsg::<()>(
            ours.as_raw_fd(),
            &[IoSlice::new(b"/x/runner.json")],
            &[],
            MsgFlags::empty(),
            None,
        )
        .unwrap();
        let err = wait(theirs.as_raw_fd()).err().unwrap();
        assert!(err.to_string().contains("runner.lock"), "{err}");
    }
}
