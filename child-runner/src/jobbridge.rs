//! A cluster job's way to the daemon's services. A runner on the daemon's
//! host gets a socket pair to the egress proxy and one to the model
//! gateway, over which each attempt's init hands the daemon the listener
//! of the run's address. A job's runner, on another host, gets none: it
//! makes the pairs itself and forks a bridge process (before anything
//! runs threads), which takes each attempt's listeners as the daemon
//! would, accepts the run's connections on them, and relays each over TCP
//! to the daemon's job services port, first naming the service and the run
//! and showing the run's token (`SUBAGENT/1 <service> <run> <token>`). The
//! bridge dies with the runner.

use crate::spec::{RemoteServices, RunnerSpec};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The first word of a relayed connection.
pub const HANDSHAKE: &str = "SUBAGENT/1";
/// The most connections relayed at once, per service.
pub const MAX_CONNECTIONS: usize = 64;
/// How long a connection to the daemon's port may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A service of the daemon's a run may need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    /// The egress proxy (allowlist mode).
    Egress,
    /// The model gateway (a driver run).
    Gateway,
}

impl Service {
    /// Its name in the handshake.
    pub fn name(self) -> &'static str {
        match self {
            Service::Egress => "egress",
            Service::Gateway => "gateway",
        }
    }

    /// The service of a handshake's name.
    pub fn parse(name: &str) -> Option<Service> {
        match name {
            "egress" => Some(Service::Egress),
            "gateway" => Some(Service::Gateway),
            _ => None,
        }
    }
}

/// The line a relayed connection starts with.
pub fn handshake(service: Service, run_id: &str, token: &str) -> String {
    format!("{HANDSHAKE} {} {run_id} {token}\n", service.name())
}

/// The bridge could not be started.
#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    /// The daemon's address in the spec is not `IP:PORT`.
    #[error("the job services address {0:?} is not IP:PORT")]
    Address(String),
    /// A socket pair or the fork failed.
    #[error("{op}: {source}")]
    Sys {
        /// The step.
        op: &'static str,
        /// The error.
        source: nix::Error,
    },
}

/// The ends a job's run's init gets, as a daemon would have handed them.
#[derive(Debug, Default)]
pub struct Bridged {
    /// To the egress proxy (allowlist mode).
    pub egress: Option<RawFd>,
    /// To the model gateway (a driver run).
    pub gateway: Option<RawFd>,
}

/// Makes the channels `spec`'s sandbox needs and forks the bridge that
/// serves them; none when the spec names no job services port.
pub fn start(spec: &RunnerSpec) -> Result<Bridged, BridgeError> {
    let Some(remote) = &spec.remote_services else {
        return Ok(Bridged::default());
    };
    let addr: SocketAddr = remote
        .addr
        .parse()
        .map_err(|_| BridgeError::Address(remote.addr.clone()))?;
    let wanted = [
        (Service::Egress, spec.sandbox.egress.is_some()),
        (Service::Gateway, spec.sandbox.gateway.is_some()),
    ];
    let mut ours = Vec::new();
    let mut bridged = Bridged::default();
    for (service, _) in wanted.iter().filter(|(_, w)| *w) {
        let (init_end, bridge_end) = pair()?;
        match service {
            Service::Egress => bridged.egress = Some(init_end.into_raw_fd()),
            Service::Gateway => bridged.gateway = Some(init_end.into_raw_fd()),
        }
        ours.push((*service, bridge_end));
    }
    if ours.is_empty() {
        return Ok(bridged);
    }
    fork_bridge(ours, addr, &spec.run_id, remote)?;
    Ok(bridged)
}

fn pair() -> Result<(OwnedFd, OwnedFd), BridgeError> {
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
    socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|source| BridgeError::Sys {
        op: "socketpair for a job's service",
        source,
    })
}

/// Forks the bridge process; the parent keeps none of `ours`.
fn fork_bridge(
    ours: Vec<(Service, OwnedFd)>,
    addr: SocketAddr,
    run_id: &str,
    remote: &RemoteServices,
) -> Result<(), BridgeError> {
    let parent = nix::unistd::getpid();
    // SAFETY: the runner has started no thread yet (the bridge is made
    // first in a job's runner), so the child may do anything after fork.
    match unsafe { nix::unistd::fork() }.map_err(|source| BridgeError::Sys {
        op: "fork the job's bridge",
        source,
    })? {
        nix::unistd::ForkResult::Parent { .. } => Ok(()),
        nix::unistd::ForkResult::Child => {
            die_with(parent);
            let keep: Vec<RawFd> = ours.iter().map(|(_, fd)| fd.as_raw_fd()).collect();
            close_all_but(&keep);
            serve(ours, addr, run_id.to_owned(), remote.token.clone());
            std::process::exit(0)
        }
    }
}

/// Ends this process when `parent` (the runner) does.
fn die_with(parent: nix::unistd::Pid) {
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes integers only.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) };
    if nix::unistd::getppid() != parent {
        std::process::exit(0);
    }
}

/// Closes every descriptor above stderr but `keep`: the bridge must hold
/// nothing of the runner's (runner.lock above all).
fn close_all_but(keep: &[RawFd]) {
    let open: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    for fd in open.into_iter().filter(|fd| *fd > 2 && !keep.contains(fd)) {
        // SAFETY: closing a descriptor this process no longer uses; the
        // read_dir's own one is already closed.
        unsafe { libc::close(fd) };
    }
}

/// The bridge: a thread per service, each taking its channel's listeners.
fn serve(ours: Vec<(Service, OwnedFd)>, addr: SocketAddr, run_id: String, token: String) {
    let threads: Vec<_> = ours
        .into_iter()
        .map(|(service, channel)| {
            let hello = handshake(service, &run_id, &token);
            std::thread::spawn(move || take_listeners(&channel, addr, &hello))
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
}

/// One attempt's listener and the connections relayed from it.
struct Attempt {
    listener: Arc<TcpListener>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
}

impl Attempt {
    /// Ends the attempt's listener and its connections.
    fn end(&self) {
        let _ =
            nix::sys::socket::shutdown(self.listener.as_raw_fd(), nix::sys::socket::Shutdown::Both);
        for c in self.conns.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}

/// Takes each listener init sends over `channel`; a new one (the next
/// attempt) ends the one before.
fn take_listeners(channel: &OwnedFd, addr: SocketAddr, hello: &str) {
    let active = Arc::new(AtomicUsize::new(0));
    let mut current: Option<Attempt> = None;
    while let Some(fd) = recv_fd(channel) {
        if let Some(old) = current.take() {
            old.end();
        }
        // SAFETY: the descriptor was just received and is owned here alone.
        let listener = unsafe { TcpListener::from_raw_fd(fd) };
        if listener.set_nonblocking(false).is_err() {
            continue;
        }
        let a = Attempt {
            listener: Arc::new(listener),
            conns: Arc::new(Mutex::new(Vec::new())),
        };
        let (l, conns, active, hello) = (
            a.listener.clone(),
            a.conns.clone(),
            active.clone(),
            hello.to_owned(),
        );
        std::thread::spawn(move || accept_all(&l, &conns, &active, addr, &hello));
        current = Some(a);
    }
    if let Some(a) = current {
        a.end();
    }
}

/// Receives one descriptor from `channel`; `None` when it is closed.
fn recv_fd(channel: &OwnedFd) -> Option<RawFd> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    loop {
        let mut byte = [0u8; 1];
        let mut iov = [std::io::IoSliceMut::new(&mut byte)];
        let mut space = nix::cmsg_space!([RawFd; 1]);
        let msg = match recvmsg::<()>(
            channel.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(m) => m,
            Err(nix::Error::EINTR) => continue,
            Err(_) => return None,
        };
        let fd = msg.cmsgs().ok()?.find_map(|c| match c {
            ControlMessageOwned::ScmRights(f) => f.first().copied(),
            _ => None,
        });
        match (msg.bytes, fd) {
            (0, None) => return None,
            (_, Some(fd)) => return Some(fd),
            _ => continue,
        }
    }
}

/// Accepts the attempt's connections until its listener is shut down.
fn accept_all(
    l: &TcpListener,
    conns: &Arc<Mutex<Vec<TcpStream>>>,
    active: &Arc<AtomicUsize>,
    addr: SocketAddr,
    hello: &str,
) {
    while let Ok((client, _)) = l.accept() {
        if active.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            active.fetch_sub(1, Ordering::SeqCst);
            continue;
        }
        if let Ok(c) = client.try_clone() {
            conns.lock().unwrap_or_else(|p| p.into_inner()).push(c);
        }
        let (active, hello) = (active.clone(), hello.to_owned());
        std::thread::spawn(move || {
            relay(client, addr, &hello);
            active.fetch_sub(1, Ordering::SeqCst);
        });
    }
}

/// Relays `client` to the daemon's port: the handshake, then both ways.
fn relay(client: TcpStream, addr: SocketAddr, hello: &str) {
    let Ok(mut up) = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) else {
        return;
    };
    if up.write_all(hello.as_bytes()).is_err() {
        return;
    }
    let (Ok(mut client_r), Ok(mut up_w)) = (client.try_clone(), up.try_clone()) else {
        return;
    };
    let there = std::thread::spawn(move || {
        let _ = std::io::copy(&mut client_r, &mut up_w);
        let _ = up_w.shutdown(Shutdown::Write);
    });
    let mut client_w = client;
    let _ = copy_back(&mut up, &mut client_w);
    let _ = client_w.shutdown(Shutdown::Write);
    let _ = there.join();
}

fn copy_back(from: &mut TcpStream, to: &mut TcpStream) -> std::io::Result<u64> {
    let mut buf = [0u8; 16 * 1024];
    let mut total = 0;
    loop {
        let n = from.read(&mut buf)?;
        if n == 0 {
            return Ok(total);
        }
        to.write_all(&buf[..n])?;
        total += n as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_handshake_names_the_service_the_run_and_the_token() {
        assert_eq!(
            handshake(Service::Gateway, "r1", "abc"),
            "SUBAGENT/1 gateway r1 abc\n"
        );
        assert_eq!(Service::parse("egress"), Some(Service::Egress));
        assert_eq!(Service::parse("shell"), None);
    }

    #[test]
    fn a_relayed_connection_reaches_the_port_after_its_handshake() {
        let port = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = port.local_addr().unwrap();
        let (ours, theirs) = pair().unwrap();
        let hello = handshake(Service::Egress, "r", "t");
        let h = hello.clone();
        std::thread::spawn(move || take_listeners(&theirs, addr, &h));
        let run_side = TcpListener::bind("127.0.0.1:0").unwrap();
        let run_addr = run_side.local_addr().unwrap();
        crate::sandbox::egress::send_fd(ours.as_raw_fd(), run_side.as_raw_fd()).unwrap();
        let mut agent = TcpStream::connect(run_addr).unwrap();
        agent.write_all(b"ping").unwrap();
        let (mut daemon, _) = port.accept().unwrap();
        let mut got = vec![0u8; hello.len() + 4];
        daemon.read_exact(&mut got).unwrap();
        assert_eq!(got, format!("{hello}ping").as_bytes());
        daemon.write_all(b"pong").unwrap();
        drop(daemon);
        let mut back = String::new();
        agent.read_to_string(&mut back).unwrap();
        assert_eq!(back, "pong");
    }
}
