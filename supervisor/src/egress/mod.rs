//! The egress proxy of runs in allowlist mode. A run's runner holds one
//! end of a Unix socket pair the daemon made at its start; each attempt's
//! init sends over it the listener of the run's proxy port (127.0.0.1
//! inside the run's network namespace). The daemon accepts the run's
//! connections on that listener and serves each one ([`proxy`]): HTTP
//! CONNECT or a plain HTTP request, let through only to the run's list,
//! recorded in the run's egress.log ([`log`]).
//!
//! The run's identity is the socket pair itself: nothing a child sends
//! names a run, and no path to the proxy exists in its view.

pub mod budget;
pub mod log;
pub mod proxy;
pub mod resolve;

use policy::sandbox::network::AllowEntry;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// Connections of one run served at once (each holds two of the daemon's
/// descriptors: the run's and the destination's); more are refused.
pub const MAX_CONNECTIONS: usize = 128;

/// Everything the proxy knows of one run.
pub struct RunProxy {
    /// The run (for the daemon's log only).
    pub run_id: String,
    /// Where it may connect.
    pub allow: Vec<AllowEntry>,
    /// Its egress.log.
    pub log: log::EgressLog,
    /// Its share of connections.
    pub slots: Arc<tokio::sync::Semaphore>,
    /// The connections of every run together ([`budget::global`]).
    pub global: Arc<tokio::sync::Semaphore>,
    /// How names are resolved.
    pub resolver: resolve::Resolver,
}

impl RunProxy {
    /// The proxy of run `run_id` with `allow`, logging to `log_path` within
    /// `log_cap` bytes.
    pub fn new(
        run_id: String,
        allow: Vec<AllowEntry>,
        log_path: std::path::PathBuf,
        log_cap: u64,
    ) -> RunProxy {
        RunProxy {
            run_id,
            allow,
            log: log::EgressLog::new(log_path, log_cap),
            slots: Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS)),
            global: budget::global(),
            resolver: resolve::Resolver::system(),
        }
    }
}

/// The socket pair of a run's runner: the daemon's end and the runner's.
pub fn channel() -> nix::Result<(OwnedFd, OwnedFd)> {
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
    socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
    )
}

/// Receives one descriptor from `channel`; `None` at end of file (the
/// runner is gone).
pub(crate) async fn recv_fd(channel: &AsyncFd<OwnedFd>) -> std::io::Result<Option<OwnedFd>> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    loop {
        let mut guard = channel.readable().await?;
        let got = guard.try_io(|inner| {
            let mut byte = [0u8; 1];
            let mut iov = [std::io::IoSliceMut::new(&mut byte)];
            let mut space = nix::cmsg_space!([RawFd; 1]);
            let msg = recvmsg::<()>(
                inner.get_ref().as_raw_fd(),
                &mut iov,
                Some(&mut space),
                MsgFlags::MSG_CMSG_CLOEXEC,
            )
            .map_err(std::io::Error::from)?;
            let mut fds = Vec::new();
            for c in msg.cmsgs().map_err(std::io::Error::from)? {
                if let ControlMessageOwned::ScmRights(f) = c {
                    fds.extend(f);
                }
            }
            Ok((msg.bytes, fds))
        });
        let (bytes, fds) = match got {
            Ok(r) => r?,
            Err(_would_block) => continue,
        };
        // SAFETY: each descriptor was just received and is owned here alone.
        let mut owned: Vec<OwnedFd> = fds
            .into_iter()
            .map(|f| unsafe { OwnedFd::from_raw_fd(f) })
            .collect();
        if bytes == 0 && owned.is_empty() {
            return Ok(None);
        }
        if let Some(fd) = owned.pop() {
            return Ok(Some(fd));
        }
    }
}

/// [`recv_fd`] on a channel, if there is one; pending forever without.
pub(crate) async fn recv_fd_from(
    channel: Option<&AsyncFd<OwnedFd>>,
) -> std::io::Result<Option<OwnedFd>> {
    match channel {
        Some(c) => recv_fd(c).await,
        None => std::future::pending().await,
    }
}

/// A received descriptor as a listening TCP socket; anything else is
/// refused.
pub(crate) fn as_listener(fd: OwnedFd) -> std::io::Result<tokio::net::TcpListener> {
    let listening = nix::sys::socket::getsockopt(&fd, nix::sys::socket::sockopt::AcceptConn)
        .map_err(std::io::Error::from)?;
    let l = std::net::TcpListener::from(fd);
    // A Unix socket has no IP address: local_addr fails for it.
    if !listening || !l.local_addr()?.ip().is_loopback() {
        return Err(std::io::Error::other("not a loopback TCP listener"));
    }
    l.set_nonblocking(true)?;
    tokio::net::TcpListener::from_std(l)
}

pub use crate::runservice::Handle;
use crate::runservice::{accept, relayed, Source, STOP_GRACE};

/// Worker threads of the proxy's own runtime.
const WORKERS: usize = 2;

/// The proxy's own runtime: every run's connections, lookups and log lines
/// run on threads of their own, so that however busy egress is, the
/// control socket's tasks never queue behind it. `None` when it cannot be
/// made (the proxy then shares the daemon's, said once in its log).
fn runtime() -> Option<&'static tokio::runtime::Runtime> {
    static RUNTIME: std::sync::OnceLock<Option<tokio::runtime::Runtime>> =
        std::sync::OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(WORKERS)
                // The proxy blocks on nothing: a pool of one is for tokio.
                .max_blocking_threads(1)
                .thread_name("egress")
                .enable_all()
                .build()
                .map_err(|e| {
                    tracing::error!("egress runtime: {e}; the proxy shares the daemon's threads")
                })
                .ok()
        })
        .as_ref()
}

/// Makes the proxy's runtime now (the daemon's start), so that its
/// threads and descriptors are there before any run and a failure is
/// logged at once.
pub fn start_runtime() {
    let _ = runtime();
}

/// Serves run `run`'s channel on a task of its own, on the proxy's
/// runtime, until its runner is gone or [`Handle::stop`].
pub fn start(source: Source, run: Arc<RunProxy>) -> Handle {
    Handle::start(|stopped| {
        let task = serve(source, run, stopped);
        match runtime() {
            Some(rt) => rt.spawn(task),
            None => tokio::spawn(task),
        }
    })
}

/// Serves run `run`'s channel: each listener it sends (one per attempt)
/// replaces the one before and ends that attempt's connections. At its
/// end of file (the runner is gone) or at `stop`, every connection of the
/// run is ended.
async fn serve(source: Source, run: Arc<RunProxy>, mut stop: tokio::sync::watch::Receiver<bool>) {
    let (channel, mut relay) = match source {
        Source::Channel(fd) => (Some(fd), None),
        Source::Relayed(rx) => (None, Some(rx)),
    };
    // SAFETY: the AsyncFd owns the descriptor: it stays open, and the same
    // one, for as long as it is registered.
    let channel =
        match channel.map(|c| unsafe { AsyncFd::register_with_interest(c, Interest::READABLE) }) {
            Some(Err(e)) => {
                tracing::error!(run_id = %run.run_id, "egress channel: {e}; the run has no proxy");
                return;
            }
            other => other.and_then(Result::ok),
        };
    let mut listener: Option<tokio::net::TcpListener> = None;
    let (mut attempt, _) = tokio::sync::watch::channel(false);
    let mut conns = tokio::task::JoinSet::new();
    let mut flush = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tokio::select! {
            fd = recv_fd_from(channel.as_ref()) => {
                let fd = match fd {
                    Ok(Some(fd)) => fd,
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!(run_id = %run.run_id, "egress channel: {e}");
                        break;
                    }
                };
                let _ = attempt.send(true);
                attempt = tokio::sync::watch::channel(false).0;
                listener = as_listener(fd)
                    .map_err(|e| tracing::warn!(run_id = %run.run_id, "egress channel: {e}"))
                    .ok();
            }
            _ = stop.changed() => break,
            c = relayed(relay.as_mut()) => match c {
                Some(c) => proxy::admit(&run, c, attempt.subscribe(), &mut conns),
                None => break,
            },
            c = accept(listener.as_ref()) => match c {
                Ok(c) => proxy::admit(&run, c, attempt.subscribe(), &mut conns),
                Err(e) => {
                    // Out of descriptors or memory: let the pressure pass.
                    tracing::warn!(run_id = %run.run_id, "egress accept: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            _ = flush.tick() => write_held(&run),
        }
    }
    drop(listener);
    let _ = attempt.send(true);
    let drain = async { while conns.join_next().await.is_some() {} };
    if tokio::time::timeout(STOP_GRACE, drain).await.is_err() {
        tracing::warn!(run_id = %run.run_id, "egress: connections still open at the run's end are dropped");
    }
    conns.shutdown().await;
    write_held(&run);
}

/// Writes the line of the run's refusals counted but not written yet.
fn write_held(run: &RunProxy) {
    if let Err(e) = run.log.flush() {
        tracing::warn!(run_id = %run.run_id, "egress.log: {e}");
    }
}
