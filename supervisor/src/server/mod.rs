//! The daemon's socket server: a listener, one handler per connection, a
//! cap on connections, and shutdown through a broadcast.

pub mod connection;
pub mod dispatch;
pub mod peer;
pub mod socket;

use crate::engine::Supervisor;
use socket::BoundSocket;
use std::sync::Arc;
use tokio::net::UnixListener;
use tokio::sync::{watch, Semaphore};

/// At most this many connections at once; more wait in the backlog.
pub const MAX_CONNECTIONS: usize = 256;

/// How long a shutdown waits for connections to flush their answers.
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Serves `bound` until `shutdown` resolves; then stops accepting spawns,
/// closes every connection and returns. Runs are not touched.
pub async fn serve(
    sup: Supervisor,
    bound: &BoundSocket,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let listener = UnixListener::from_std(bound.listener.try_clone()?)?;
    // A watch, not a broadcast: a receiver made after the signal sees it.
    let (stop_tx, _) = watch::channel(false);
    // Every connection task holds a sender; when all are gone, all are done.
    let (done_tx, mut done_rx) = tokio::sync::mpsc::channel::<()>(1);
    let limit = Arc::new(Semaphore::new(MAX_CONNECTIONS));
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
        let (sup, stop, done, limit) = (
            sup.clone(),
            stop_tx.subscribe(),
            done_tx.clone(),
            limit.clone(),
        );
        tokio::spawn(async move {
            // Who is calling is settled before the connection may take a
            // slot: a process inside a run is answered and dropped, and can
            // never fill the connection cap.
            let peer_pid = stream.peer_cred().ok().and_then(|c| c.pid());
            let from_run = tokio::task::spawn_blocking(move || peer::inside_run(peer_pid))
                .await
                .unwrap_or(true);
            if from_run {
                tracing::warn!(
                    peer_pid,
                    "refusing control requests from a process inside a run"
                );
                connection::refuse(stream).await;
            } else if let Ok(permit) = limit.acquire_owned().await {
                connection::serve(sup, stream, stop).await;
                drop(permit);
            }
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
