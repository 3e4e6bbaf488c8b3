//! A warm runner: started by the daemon before it has a run for it, so a
//! spawn does not wait for the runner's exec, dynamic loading and start.
//!
//! `subagent-runner --warm` gets a Unix SOCK_SEQPACKET socket on fd 0 and
//! blocks on it. Its run arrives as one message: the path of runner.json as
//! the payload, and runner.lock and runner.log as SCM_RIGHTS descriptors.
//! The runner then puts runner.log on stdout and stderr and `/dev/null` on
//! stdin, and goes on exactly as a runner started for that run. End of file
//! (the daemon went away or let it go) makes it exit quietly.

use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
use std::io::IoSliceMut;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

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
    /// The lease on the run's own uid, when it has one.
    pub uid_lock: Option<OwnedFd>,
}

/// Waits on `sock` for the run; `None` at end of file.
pub fn wait(sock: RawFd) -> Result<Option<Handover>, WarmError> {
    let mut buf = vec![0u8; MAX_MESSAGE];
    let mut cmsg = nix::cmsg_space!([RawFd; 3]);
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
    match (fds.next(), fds.next(), fds.next(), fds.next()) {
        (Some(lock), Some(log), uid_lock, None) => Ok(Some(Handover {
            spec: PathBuf::from(std::ffi::OsStr::from_bytes(path)),
            lock,
            log,
            uid_lock,
        })),
        _ => Err(WarmError::Malformed(
            "expected runner.lock, runner.log and at most a uid lease".into(),
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
    fn a_fourth_descriptor_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let files: Vec<std::fs::File> = (0..4)
            .map(|i| std::fs::File::create(dir.path().join(format!("f{i}"))).unwrap())
            .collect();
        let raw: Vec<RawFd> = files.iter().map(|f| f.as_raw_fd()).collect();
        let (ours, theirs) = pair();
        sendmsg::<()>(
            ours.as_raw_fd(),
            &[IoSlice::new(b"/x/runner.json")],
            &[ControlMessage::ScmRights(&raw)],
            MsgFlags::empty(),
            None,
        )
        .unwrap();
        // Truncated control data (the fourth descriptor) is refused too.
        assert!(wait(theirs.as_raw_fd()).is_err());
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
