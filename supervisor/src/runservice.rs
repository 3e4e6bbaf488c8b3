//! What a run's egress proxy and its model gateway share: a task serving
//! the run's channel, stopped through a handle, and the accept on the
//! listener of its current attempt.

use std::time::Duration;

/// The longest the end of a run's service waits for its connections to
/// finish (and write their lines) before it drops them.
pub const STOP_GRACE: Duration = Duration::from_secs(2);

/// A run's service, served on a task of its own.
pub struct Handle {
    stop: tokio::sync::watch::Sender<bool>,
    done: tokio::task::JoinHandle<()>,
}

impl Handle {
    /// Starts the task `spawn` makes of the stop signal it is given.
    pub fn start(
        spawn: impl FnOnce(tokio::sync::watch::Receiver<bool>) -> tokio::task::JoinHandle<()>,
    ) -> Handle {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let done = spawn(stopped);
        Handle { stop, done }
    }

    /// Ends the service and every connection it serves (the run has
    /// ended); returns once they are done, or after [`STOP_GRACE`] twice.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = tokio::time::timeout(STOP_GRACE * 2, self.done).await;
    }
}

/// Accepts on the attempt's listener, if there is one yet.
pub async fn accept(l: Option<&tokio::net::TcpListener>) -> std::io::Result<tokio::net::TcpStream> {
    match l {
        Some(l) => l.accept().await.map(|(s, _)| s),
        None => std::future::pending().await,
    }
}
