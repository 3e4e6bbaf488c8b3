//! Socket activation: when systemd (or `systemd-socket-activate`) started
//! the daemon with a listening socket in `LISTEN_FDS`, serve that one
//! instead of binding the path. It must be one listening Unix stream
//! socket bound to a path; anything else refuses the start, naming it.

use super::socket::{BoundSocket, SocketError};
use nix::sys::socket::{getsockname, getsockopt, sockopt, SockType, UnixAddr};
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::path::PathBuf;

/// The socket passed by the service manager, if one was: served at the
/// path it is bound to. The `LISTEN_*` variables are removed either way.
pub fn take_activated() -> Result<Option<BoundSocket>, SocketError> {
    let fds = sd_notify::listen_fds();
    // Called before any other thread starts, so no one reads them meanwhile.
    for var in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
        std::env::remove_var(var);
    }
    let fds: Vec<_> = fds
        .map_err(|e| SocketError::Activation(e.to_string()))?
        .collect();
    let fd = match fds.as_slice() {
        [] => return Ok(None),
        [fd] => *fd,
        more => {
            return Err(SocketError::Activation(format!(
                "{} sockets were passed; subagentd serves one",
                more.len()
            )))
        }
    };
    // SAFETY: LISTEN_FDS names fd 3 as passed to this process and owned by
    // it; nothing else in the process has taken it.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let path = check_listener(&owned)?;
    let listener = std::os::unix::net::UnixListener::from(owned);
    listener
        .set_nonblocking(true)
        .map_err(|e| SocketError::Activation(format!("set non-blocking: {e}")))?;
    BoundSocket::activated(listener, &path).map(Some)
}

/// The path a passed fd listens on, when it is a listening Unix stream
/// socket bound to one.
fn check_listener(fd: &OwnedFd) -> Result<PathBuf, SocketError> {
    let bad = |what: String| SocketError::Activation(what);
    let ty = getsockopt(&fd.as_fd(), sockopt::SockType)
        .map_err(|e| bad(format!("not a socket: {e}")))?;
    if ty != SockType::Stream {
        return Err(bad(format!("a {ty:?} socket, not a stream one")));
    }
    let listening = getsockopt(&fd.as_fd(), sockopt::AcceptConn).map_err(|e| bad(e.to_string()))?;
    if !listening {
        return Err(bad("the socket is not listening".into()));
    }
    let addr: UnixAddr = getsockname(std::os::fd::AsRawFd::as_raw_fd(fd))
        .map_err(|e| bad(format!("not a Unix socket: {e}")))?;
    match addr.path() {
        Some(p) => Ok(p.to_path_buf()),
        None => Err(bad(
            "a Unix socket with no path (abstract or unnamed)".into()
        )),
    }
}
