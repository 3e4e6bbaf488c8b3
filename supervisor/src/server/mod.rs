//! The daemon's socket server: a listener, one handler per connection, a
//! cap on connections, and shutdown through a broadcast.

pub mod activation;
pub mod connection;
pub mod dispatch;
pub mod metrics_http;
pub mod notify;
pub mod peer;
pub mod socket;

use crate::engine::Supervisor;
use socket::BoundSocket;
use std::sync::Arc;
use tokio::net::UnixListener;
use tokio::sync::{watch, Semaphore};

/// At most this many connections served at once by default.
pub const MAX_CONNECTIONS: usize = 256;
/// A connection idle this long is closed by default.
pub const IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// The server's limits.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Connections served at once.
    pub max_connections: usize,
    /// Idle connections are closed after this long.
    pub idle_timeout: std::time::Duration,
    /// Uids allowed besides the daemon's own and root.
    pub allow_uids: Vec<u32>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_connections: MAX_CONNECTIONS,
            idle_timeout: IDLE_TIMEOUT,
            allow_uids: Vec::new(),
        }
    }
}

impl ServerConfig {
    /// From the config file's keys.
    pub fn from_settings(s: &policy::config::Config) -> ServerConfig {
        ServerConfig {
            max_connections: s.max_connections.unwrap_or(MAX_CONNECTIONS),
            idle_timeout: s
                .idle_timeout_s
                .map_or(IDLE_TIMEOUT, std::time::Duration::from_secs),
            allow_uids: s.allow_uids.clone(),
        }
    }

    /// Whether `uid` may use the socket.
    pub fn uid_allowed(&self, uid: u32) -> bool {
        uid == 0 || uid == crate::paths::uid() || self.allow_uids.contains(&uid)
    }
}

/// How long a shutdown waits for connections to flush their answers.
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Serves `bound` until `shutdown` resolves; then stops accepting spawns,
/// closes every connection and returns. Runs are not touched.
pub async fn serve(
    sup: Supervisor,
    bound: &BoundSocket,
    cfg: ServerConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let listener = UnixListener::from_std(bound.listener.try_clone()?)?;
    // A watch, not a broadcast: a receiver made after the signal sees it.
    let (stop_tx, _) = watch::channel(false);
    // Every connection task holds a sender; when all are gone, all are done.
    let (done_tx, mut done_rx) = tokio::sync::mpsc::channel::<()>(1);
    let limit = Arc::new(Semaphore::new(cfg.max_connections.max(1)));
    let cfg = Arc::new(cfg);
    let judge = peer::Judge::start()?;
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!("accept: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let (sup, stop, done, limit, cfg, judge) = (
            sup.clone(),
            stop_tx.subscribe(),
            done_tx.clone(),
            limit.clone(),
            cfg.clone(),
            judge.clone(),
        );
        tokio::spawn(async move {
            admit(sup, stream, stop, limit, &cfg, &judge).await;
            drop(done);
        });
    }
    sup.stop_accepting();
    let _ = stop_tx.send(true);
    drop(done_tx);
    // Let connections answer what they hold (waits get -32004), briefly.
    if tokio::time::timeout(SHUTDOWN_GRACE, done_rx.recv())
        .await
        .is_err()
    {
        tracing::warn!("some connections did not close within {SHUTDOWN_GRACE:?}");
    }
    Ok(())
}

/// Serves one accepted connection: who is calling is settled first, then
/// it waits for a slot under the cap.
async fn admit(
    sup: Supervisor,
    stream: tokio::net::UnixStream,
    stop: watch::Receiver<bool>,
    limit: Arc<Semaphore>,
    cfg: &ServerConfig,
    judge: &peer::Judge,
) {
    // Who is calling is settled before the connection may take a
    // slot: a process inside a run is answered and dropped, and can
    // never fill the connection cap.
    let cred = stream.peer_cred().ok();
    let peer_uid = cred.map(|c| c.uid());
    if !peer_uid.is_some_and(|u| cfg.uid_allowed(u)) {
        tracing::warn!(
            ?peer_uid,
            "refusing a connection from a uid that is not allowed"
        );
        connection::refuse_uid(stream, peer_uid).await;
        return;
    }
    let peer_pid = cred.and_then(|c| c.pid());
    // Runs it asks for reach only what it may reach itself.
    let requester = cred.and_then(|c| {
        peer::requester(c.uid(), c.gid(), || {
            peer::peer_groups(std::os::fd::AsFd::as_fd(&stream))
        })
    });
    // The judge's own thread: never the blocking pool, which a
    // busy daemon may have filled.
    let from_run = match judge.inside_run(peer_pid).await {
        Ok(inside) => inside,
        Err(e) => {
            // Out of descriptors or memory: nothing is granted, and
            // the caller is not told it is a subagent.
            tracing::warn!(peer_pid, "cannot tell who is calling: {e}");
            connection::refuse_busy(stream, &e).await;
            return;
        }
    };
    if from_run {
        tracing::warn!(
            peer_pid,
            "refusing control requests from a process inside a run"
        );
        connection::refuse(stream).await;
    } else if let Ok(permit) = limit.acquire_owned().await {
        connection::serve(sup, stream, stop, cfg.idle_timeout, requester).await;
        drop(permit);
    }
}
