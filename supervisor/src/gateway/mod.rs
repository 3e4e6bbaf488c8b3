//! The model gateway of driver runs. A driver's agent holds no API key:
//! its base URL is `http://127.0.0.2:3129` inside the run's own network
//! namespace, with a placeholder key. As for the egress proxy, each
//! attempt's init sends the listener of that address over a Unix socket
//! pair the daemon made at the run's start (`--gateway-fd`); the daemon
//! accepts on it and forwards each HTTP request to the configured endpoint
//! only ([`forward`]), the agent's auth replaced by the daemon's key
//! ([`rewrite`]), the answer streamed back, each request logged in the
//! run's gateway.log ([`log`]); what a run's gateway holds is in [`run`].

pub mod forward;
pub mod log;
pub mod rewrite;
pub mod run;

pub use run::{RunGateway, Setup, MAX_CONNECTIONS};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// The most a request head may take (hyper's read buffer).
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// The longest a connection may take to send a request head, and may
/// stay idle between requests.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(60);

pub use crate::runservice::Handle;
use crate::runservice::{accept, relayed, Source, STOP_GRACE};

/// Serves run `run`'s gateway channel on a task of its own until its
/// runner is gone or [`Handle::stop`].
pub fn start(source: Source, run: Arc<RunGateway>) -> Handle {
    Handle::start(|stopped| tokio::spawn(serve(source, run, stopped)))
}

/// Serves the channel: each listener it sends (one per attempt) replaces
/// the one before and ends that attempt's connections.
async fn serve(source: Source, run: Arc<RunGateway>, mut stop: tokio::sync::watch::Receiver<bool>) {
    let (channel, mut relay) = match source {
        Source::Channel(fd) => (Some(fd), None),
        Source::Relayed(rx) => (None, Some(rx)),
    };
    // SAFETY: the AsyncFd owns the descriptor: it stays open, and the same
    // one, for as long as it is registered.
    let channel = match channel
        .map(|c| unsafe { AsyncFd::register_with_interest(c, Interest::READABLE) })
    {
        Some(Err(e)) => {
            tracing::error!(run_id = %run.run_id, "gateway channel: {e}; the run has no gateway");
            return;
        }
        other => other.and_then(Result::ok),
    };
    let mut listener: Option<tokio::net::TcpListener> = None;
    let (mut attempt, _) = tokio::sync::watch::channel(false);
    let mut conns = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            fd = crate::egress::recv_fd_from(channel.as_ref()) => {
                let fd = match fd {
                    Ok(Some(fd)) => fd,
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!(run_id = %run.run_id, "gateway channel: {e}");
                        break;
                    }
                };
                let _ = attempt.send(true);
                attempt = tokio::sync::watch::channel(false).0;
                listener = crate::egress::as_listener(fd)
                    .map_err(|e| tracing::warn!(run_id = %run.run_id, "gateway channel: {e}"))
                    .ok();
            }
            _ = stop.changed() => break,
            c = relayed(relay.as_mut()) => match c {
                Some(c) => admit(&run, c, attempt.subscribe(), &mut conns),
                None => break,
            },
            c = accept(listener.as_ref()) => match c {
                Ok(c) => admit(&run, c, attempt.subscribe(), &mut conns),
                Err(e) => {
                    tracing::warn!(run_id = %run.run_id, "gateway accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    let _ = attempt.send(true);
    let drain = async { while conns.join_next().await.is_some() {} };
    if tokio::time::timeout(STOP_GRACE, drain).await.is_err() {
        tracing::warn!(run_id = %run.run_id, "gateway: connections still open at the run's end are dropped");
    }
    conns.shutdown().await;
    if run.log.dropped() > 0 {
        tracing::warn!(run_id = %run.run_id, "gateway.log was full: {} lines not written", run.log.dropped());
    }
}

/// Serves one connection of the run's agent as HTTP/1.1, within its
/// share of connections, until it closes or its attempt ends.
fn admit(
    run: &Arc<RunGateway>,
    stream: tokio::net::TcpStream,
    mut ended: tokio::sync::watch::Receiver<bool>,
    conns: &mut tokio::task::JoinSet<()>,
) {
    let permits = (
        run.slots.clone().try_acquire_owned(),
        run.global.clone().try_acquire_owned(),
    );
    let (Ok(mine), Ok(all)) = permits else {
        let mut line = log::Line::new("", "");
        line.reason = Some(format!(
            "connection refused: the run has {MAX_CONNECTIONS} open (or the daemon is at its limit)"
        ));
        run.log_line(line, Instant::now());
        return;
    };
    let run = run.clone();
    conns.spawn(async move {
        let _held = (mine, all);
        let svc_run = run.clone();
        let svc = hyper::service::service_fn(move |req| {
            let run = svc_run.clone();
            async move { Ok::<_, std::convert::Infallible>(forward::handle(run, req).await) }
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(HEADER_TIMEOUT)
            .max_buf_size(MAX_HEAD_BYTES)
            .serve_connection(hyper_util::rt::TokioIo::new(stream), svc);
        tokio::select! {
            r = conn => if let Err(e) = r {
                tracing::debug!(run_id = %run.run_id, "gateway connection: {e}");
            },
            _ = ended.changed() => {}
        }
    });
}
