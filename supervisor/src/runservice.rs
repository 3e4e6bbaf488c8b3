//! What a run's egress proxy and its model gateway share: a task serving
//! the run's channel, stopped through a handle, and the accept on the
//! listener of its current attempt; or, for a run that is a Slurm job on
//! another host, the connections the daemon's job services port hands
//! over once they have shown the run's token.

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

/// Where a run's service gets its connections.
pub enum Source {
    /// The run's runner on this host: each attempt's init sends the
    /// listener of the run's address over this socket pair.
    Channel(std::os::fd::OwnedFd),
    /// A Slurm job's: its connections, relayed by its runner to the
    /// daemon's job services port, each authenticated there.
    Relayed(tokio::sync::mpsc::Receiver<tokio::net::TcpStream>),
}

/// The next relayed connection, if the source is relayed; `None` once its
/// sender is gone. Pending forever for a channel.
pub async fn relayed(
    rx: Option<&mut tokio::sync::mpsc::Receiver<tokio::net::TcpStream>>,
) -> Option<tokio::net::TcpStream> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}
