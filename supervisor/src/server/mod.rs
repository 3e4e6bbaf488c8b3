//! The daemon's socket server: a listener, one handler per connection, a
//! cap on connections, and shutdown through a broadcast.

pub mod connection;
pub mod dispatch;
pub mod socket;

use crate::engine::Supervisor;
use socket::BoundSocket;
use std::sync::Arc;
use tokio::net::UnixListener;
use tokio::sync::{broadcast, Semaphore};

/// At most this many connections at once; more wait in the backlog.
pub const MAX_CONNECTIONS: usize = 256;

/// Serves `bound` until `shutdown` resolves; then stops accepting spawns,
/// closes every connection and returns. Runs are not touched.
pub async fn serve(
    sup: Supervisor,
    bound: &BoundSocket,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let listener = UnixListener::from_std(bound.listener.try_clone()?)?;
    let (stop_tx, _) = broadcast::channel::<()>(1);
    let limit = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = limit.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            _ = &mut shutdown => break,
        };
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
        let (sup, stop) = (sup.clone(), stop_tx.subscribe());
        tokio::spawn(async move {
            connection::serve(sup, stream, stop).await;
            drop(permit);
        });
    }
    sup.stop_accepting();
    let _ = stop_tx.send(());
    Ok(())
}
