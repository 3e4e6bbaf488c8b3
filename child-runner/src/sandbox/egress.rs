//! The allowlist relay: in the run's init, inside the run's own network
//! namespace, loopback is brought up and a TCP listener made on
//! 127.0.0.1 at the proxy port; the listener goes to the daemon's proxy
//! as a descriptor over the Unix socket the daemon handed the runner
//! (`--egress-fd`). The daemon accepts the run's connections on it: no
//! path to the daemon exists in the run's view, and the runner copies no
//! bytes. A driver run's model gateway is relayed the same way, from its
//! own loopback address (127.0.0.2) over a channel of its own
//! (`--gateway-fd`), with or without an allowlist.

use nix::sys::socket::{self, AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType};
use std::io::IoSlice;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

/// The relay could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    /// The runner was given no channel to the daemon's proxy.
    #[error(
        "egress: the run has an allowlist but the runner has no channel to the daemon's proxy"
    )]
    NoChannel,
    /// The runner was given no channel to the daemon's model gateway.
    #[error(
        "gateway: the run has a driver but the runner has no channel to the daemon's model gateway"
    )]
    NoGatewayChannel,
    /// A socket call failed.
    #[error("egress: {op}: {source}")]
    Sys {
        /// The step.
        op: &'static str,
        /// The errno.
        source: nix::Error,
    },
}

fn sys(op: &'static str) -> impl FnOnce(nix::Error) -> EgressError {
    move |source| EgressError::Sys { op, source }
}

/// Brings the network namespace's loopback interface up (which also
/// gives it 127.0.0.1 and ::1).
fn loopback_up() -> Result<(), EgressError> {
    let s = socket::socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(sys("socket for the loopback ioctl"))?;
    // SAFETY: ifreq is plain old data; all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    req.ifr_ifru.ifru_flags = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    // SAFETY: SIOCSIFFLAGS reads one ifreq we own and initialised.
    let rc = unsafe { libc::ioctl(s.as_raw_fd(), libc::SIOCSIFFLAGS, &req) };
    if rc < 0 {
        return Err(EgressError::Sys {
            op: "bring loopback up (SIOCSIFFLAGS)",
            source: nix::Error::last(),
        });
    }
    Ok(())
}

/// A TCP listener on `addr`:`port` in the calling process's network
/// namespace.
fn listener(addr: Ipv4Addr, port: u16) -> Result<OwnedFd, EgressError> {
    let io = |op| {
        move |e: std::io::Error| EgressError::Sys {
            op,
            source: nix::Error::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
        }
    };
    let l = std::net::TcpListener::bind(SocketAddrV4::new(addr, port))
        .map_err(io("bind the proxy port"))?;
    l.set_nonblocking(true)
        .map_err(io("make the proxy port non-blocking"))?;
    let fd = OwnedFd::from(l);
    // A longer queue than the standard library's, for bursts of connections.
    socket::listen(&fd, socket::Backlog::MAXCONN).map_err(sys("listen on the proxy port"))?;
    Ok(fd)
}

/// Sends `fd` over `channel` (one byte, the descriptor attached).
pub fn send_fd(channel: RawFd, fd: RawFd) -> Result<(), nix::Error> {
    let byte = [1u8];
    let iov = [IoSlice::new(&byte)];
    let fds = [fd];
    let cmsg = [ControlMessage::ScmRights(&fds)];
    socket::sendmsg::<()>(channel, &iov, &cmsg, MsgFlags::MSG_NOSIGNAL, None)?;
    Ok(())
}

/// In the run's init: loopback up, the listener made, and handed to the
/// daemon over `channel`. Init keeps no copy.
pub fn open_relay(port: u16, channel: Option<RawFd>) -> Result<(), EgressError> {
    let channel = channel.ok_or(EgressError::NoChannel)?;
    loopback_up()?;
    let l = listener(Ipv4Addr::LOCALHOST, port)?;
    send_fd(channel, l.as_raw_fd()).map_err(sys("hand the listener to the daemon's proxy"))
}

/// In a driver run's init: loopback up, the gateway's listener made on
/// its own loopback address, and handed to the daemon over `channel`.
pub fn open_gateway(port: u16, channel: Option<RawFd>) -> Result<(), EgressError> {
    let channel = channel.ok_or(EgressError::NoGatewayChannel)?;
    loopback_up()?;
    let addr: Ipv4Addr = policy::sandbox::network::GATEWAY_HOST
        .parse()
        .map_err(|_| EgressError::Sys {
            op: "parse the gateway's address",
            source: nix::Error::EINVAL,
        })?;
    let l = listener(addr, port)?;
    send_fd(channel, l.as_raw_fd()).map_err(sys("hand the listener to the daemon's gateway"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use nix::sys::socket::{recvmsg, ControlMessageOwned};
    use std::io::IoSliceMut;
    use std::os::fd::FromRawFd;

    #[test]
    fn the_listener_reaches_the_other_end_of_the_channel() {
        let (a, b) = socket::socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        send_fd(a.as_raw_fd(), l.as_raw_fd()).unwrap();
        drop(l);
        let mut byte = [0u8; 1];
        let mut iov = [IoSliceMut::new(&mut byte)];
        let mut space = nix::cmsg_space!([RawFd; 1]);
        let msg =
            recvmsg::<()>(b.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::empty()).unwrap();
        let fd = match msg.cmsgs().unwrap().next() {
            Some(ControlMessageOwned::ScmRights(fds)) => fds[0],
            other => panic!("{other:?}"),
        };
        // SAFETY: the descriptor was just received and is owned here alone.
        let got = unsafe { std::net::TcpListener::from_raw_fd(fd) };
        let _c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        assert!(got.accept().is_ok());
    }

    #[test]
    fn without_a_channel_nothing_is_opened() {
        assert!(matches!(
            open_relay(3128, None),
            Err(EgressError::NoChannel)
        ));
        assert!(matches!(
            open_gateway(3129, None),
            Err(EgressError::NoGatewayChannel)
        ));
    }
}
