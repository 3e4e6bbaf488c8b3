//! The MCP server's link to subagentd: one socket connection per call, and
//! a daemon started for the user (detached, same uid) when none answers.

use crate::protocol::RpcError;
use crate::trust::{Trust, TrustError};
use serde_json::{json, Value};
use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

/// How long a daemon that was just started gets to answer `ping`.
const READY_LIMIT: Duration = Duration::from_secs(20);

/// A call to the daemon failed.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// Nothing answers on the socket.
    #[error("cannot reach subagentd at {path}: {source}")]
    Connect {
        /// The socket.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The connection broke mid-call.
    #[error("the connection to subagentd broke: {0}")]
    Io(#[from] std::io::Error),
    /// The daemon closed the connection before its answer (it stopped).
    #[error("subagentd closed the connection before answering (it may be stopping or restarting)")]
    Closed,
    /// The daemon answered with a JSON-RPC error.
    #[error("subagentd refused the call: {} (code {})", .0.message, .0.code)]
    Rpc(RpcError),
    /// The daemon's answer was not a JSON-RPC response.
    #[error("subagentd answered something unexpected: {0}")]
    Protocol(String),
    /// The daemon binary could not be started.
    #[error("cannot start subagentd ({bin}): {source}")]
    Start {
        /// The binary tried.
        bin: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The socket's path or its listener is not to be trusted.
    #[error("{0}")]
    Untrusted(crate::trust::TrustError),
    /// The socket's directory, where the daemon's log would go, is unsafe.
    #[error("not starting subagentd: refusing its socket directory {dir}: {source}")]
    SocketDir {
        /// The directory.
        dir: PathBuf,
        /// What is wrong with it, or with its log.
        source: crate::securedir::SecureDirError,
    },
    /// A daemon was started but ended, or never answered.
    #[error("subagentd was started (pid {pid}) but {what}; its log: {log}")]
    NotReady {
        /// The started daemon's pid.
        pid: u32,
        /// What went wrong.
        what: String,
        /// Where its stderr went.
        log: PathBuf,
    },
}

impl DaemonError {
    /// Whether this says no daemon listens (so starting one may help).
    fn nobody_listens(&self) -> bool {
        use std::io::ErrorKind::{ConnectionRefused, NotFound};
        matches!(self, DaemonError::Connect { source, .. }
            if matches!(source.kind(), NotFound | ConnectionRefused))
    }
}

/// Where the daemon is, and whether to start one.
#[derive(Debug)]
pub struct Link {
    /// The daemon's socket.
    pub socket: PathBuf,
    /// A state dir to start a daemon with (else its default).
    pub state_dir: Option<PathBuf>,
    /// Start a daemon when none answers.
    pub autostart: bool,
    /// Whom it takes for the daemon.
    pub trust: Trust,
    /// One start at a time.
    starting: tokio::sync::Mutex<()>,
}

impl Link {
    /// A link to the daemon at `socket`.
    pub fn new(socket: PathBuf, state_dir: Option<PathBuf>, autostart: bool) -> Link {
        Link {
            socket,
            state_dir,
            autostart,
            trust: Trust::new(None),
            starting: tokio::sync::Mutex::new(()),
        }
    }

    /// The same link, trusting `trust`'s uids.
    pub fn with_trust(self, trust: Trust) -> Link {
        Link { trust, ..self }
    }

    /// Calls `method`; when no daemon listens and autostart is on, starts
    /// one first. Nothing was sent when the connect failed, so retrying is
    /// safe for every method.
    pub async fn call(&self, method: &str, params: Value) -> Result<Value, DaemonError> {
        match call_once(&self.socket, &self.trust, method, &params).await {
            Err(e) if self.autostart && e.nobody_listens() => {
                self.ensure().await?;
                call_once(&self.socket, &self.trust, method, &params).await
            }
            other => other,
        }
    }

    /// Makes sure a daemon answers: returns the pid of one started here,
    /// or `None` when one was already answering.
    pub async fn ensure(&self) -> Result<Option<u32>, DaemonError> {
        let _one = self.starting.lock().await;
        match call_once(&self.socket, &self.trust, "ping", &json!({})).await {
            Ok(_) => return Ok(None),
            Err(e) if !(self.autostart && e.nobody_listens()) => return Err(e),
            Err(_) => {}
        }
        let mut started = start(&self.socket, self.state_dir.as_deref())?;
        tracing::info!(
            "no subagentd answered on {}; started one (pid {}, {}), its log: {}",
            self.socket.display(),
            started.pid,
            started.bin.display(),
            started.log.display()
        );
        let pid = started.pid;
        let ready = started.wait_ready(&self.socket, &self.trust).await;
        started.reap();
        ready?;
        Ok(Some(pid))
    }
}

/// Connects once the socket's path and its listener pass the checks of
/// [`crate::trust`]; nothing is sent before.
async fn connect(socket: &Path, trust: &Trust) -> Result<UnixStream, DaemonError> {
    let untrusted = |e: TrustError| match e {
        TrustError::Connect { path, source } => DaemonError::Connect { path, source },
        other => DaemonError::Untrusted(other),
    };
    let path = crate::trust::check_path(socket, trust).map_err(untrusted)?;
    let stream = UnixStream::connect(&path)
        .await
        .map_err(|source| DaemonError::Connect {
            path: socket.to_path_buf(),
            source,
        })?;
    crate::trust::check_peer(stream.as_fd(), socket, trust).map_err(untrusted)?;
    Ok(stream)
}

/// One request on a fresh connection; notifications are skipped.
async fn call_once(
    socket: &Path,
    trust: &Trust,
    method: &str,
    params: &Value,
) -> Result<Value, DaemonError> {
    let stream = connect(socket, trust).await?;
    let (read, mut write) = stream.into_split();
    let mut line = serde_json::to_vec(&json!({
        "jsonrpc": "2.0", "id": 1, "method": method, "params": params,
    }))
    .map_err(|e| DaemonError::Protocol(e.to_string()))?;
    line.push(b'\n');
    write.write_all(&line).await?;
    let mut lines = BufReader::new(read).lines();
    while let Some(text) = lines.next_line().await? {
        let msg: Value = serde_json::from_str(&text)
            .map_err(|e| DaemonError::Protocol(format!("bad response: {e}")))?;
        if msg.get("id") != Some(&json!(1)) {
            continue;
        }
        if let Some(err) = msg.get("error") {
            let err: RpcError = serde_json::from_value(err.clone())
                .map_err(|e| DaemonError::Protocol(format!("bad error object: {e}")))?;
            return Err(DaemonError::Rpc(err));
        }
        return msg
            .get("result")
            .cloned()
            .ok_or_else(|| DaemonError::Protocol("a response without result".into()));
    }
    Err(DaemonError::Closed)
}

/// A daemon this process started.
struct Started {
    child: std::process::Child,
    pid: u32,
    bin: PathBuf,
    log: PathBuf,
}

/// The daemon binary: `subagentd` beside this executable, else from PATH.
fn daemon_binary() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("subagentd")))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("subagentd"))
}

/// Opens `subagentd.log` beside `socket` for appending, in a directory
/// that must be ours alone (the daemon would refuse any other); one of
/// 10 MiB or more is first moved to `subagentd.log.1`.
fn open_log(socket: &Path) -> Result<(std::fs::File, PathBuf), DaemonError> {
    let dir = socket
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let dir = std::path::absolute(dir).map_err(|source| DaemonError::Start {
        bin: daemon_binary(),
        source,
    })?;
    let refuse = |source| DaemonError::SocketDir {
        dir: dir.clone(),
        source,
    };
    let private = crate::securedir::open_owned_dir(&dir).map_err(refuse)?;
    let uid = crate::paths::uid();
    let (file, _) = private
        .open_capped_log("subagentd.log", uid, crate::securedir::LOG_CAP, None)
        .map_err(refuse)?;
    Ok((file, dir.join("subagentd.log")))
}

/// Starts `subagentd` on `socket` in a process group of its own, its
/// stderr appended to `subagentd.log` beside the socket.
fn start(socket: &Path, state_dir: Option<&Path>) -> Result<Started, DaemonError> {
    let bin = daemon_binary();
    let fail = |source| DaemonError::Start {
        bin: bin.clone(),
        source,
    };
    let (file, log) = open_log(socket)?;
    let mut cmd = std::process::Command::new(&bin);
    // The daemon keeps the log it writes to capped while it runs.
    cmd.arg("--socket").arg(socket).arg("--log-file").arg(&log);
    if let Some(s) = state_dir {
        cmd.arg("--state-dir").arg(s);
    }
    // Its own group: a signal to the MCP client's group leaves it running;
    // and no hold on the project dir it was started from.
    cmd.current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(file)
        .process_group(0);
    let child = cmd.spawn().map_err(fail)?;
    Ok(Started {
        pid: child.id(),
        child,
        bin,
        log,
    })
}

impl Started {
    /// Leaves the daemon running, and has a thread wait for its exit so it
    /// does not stay a zombie of this process.
    fn reap(self) {
        let mut child = self.child;
        let spawned = std::thread::Builder::new()
            .name("subagentd-reaper".into())
            .spawn(move || child.wait());
        if let Err(e) = spawned {
            tracing::warn!("cannot watch the started subagentd (pid {}): {e}", self.pid);
        }
    }

    /// Polls `ping` until the daemon answers, it exits, or the limit passes.
    async fn wait_ready(&mut self, socket: &Path, trust: &Trust) -> Result<(), DaemonError> {
        let deadline = Instant::now() + READY_LIMIT;
        let mut pause = Duration::from_millis(5);
        loop {
            if call_once(socket, trust, "ping", &json!({})).await.is_ok() {
                return Ok(());
            }
            // Another client's daemon may have won the socket: ping decides.
            let what = match self.child.try_wait() {
                Ok(Some(status)) => Some(format!("exited ({status})")),
                Ok(None) if Instant::now() >= deadline => {
                    Some(format!("did not answer within {} s", READY_LIMIT.as_secs()))
                }
                Ok(None) => None,
                Err(e) => Some(format!("could not be watched: {e}")),
            };
            if let Some(what) = what {
                if call_once(socket, trust, "ping", &json!({})).await.is_ok() {
                    return Ok(());
                }
                return Err(DaemonError::NotReady {
                    pid: self.pid,
                    what,
                    log: self.log.clone(),
                });
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn private_dir() -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("sock.d");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        (tmp, dir)
    }

    #[test]
    fn a_log_at_its_cap_is_moved_to_dot_1_at_start() {
        let (_tmp, dir) = private_dir();
        let log = dir.join("subagentd.log");
        let cap = crate::securedir::LOG_CAP;
        std::fs::write(dir.join("subagentd.log.1"), b"oldest\n").unwrap();
        std::fs::write(&log, vec![b'x'; usize::try_from(cap).unwrap() + 1]).unwrap();
        std::fs::set_permissions(&log, std::fs::Permissions::from_mode(0o600)).unwrap();
        let (mut file, path) = open_log(&dir.join("sock")).unwrap();
        assert_eq!(path, log);
        std::io::Write::write_all(&mut file, b"new\n").unwrap();
        assert_eq!(std::fs::read(&log).unwrap(), b"new\n");
        let old = std::fs::metadata(dir.join("subagentd.log.1")).unwrap();
        assert_eq!(old.len(), cap + 1, "the full log replaced the older one");
        assert_eq!(
            std::fs::metadata(&log).unwrap().permissions().mode() & 0o777,
            0o600
        );

        // Under the cap it is appended to, not moved.
        let (mut file, _) = open_log(&dir.join("sock")).unwrap();
        std::io::Write::write_all(&mut file, b"more\n").unwrap();
        assert_eq!(std::fs::read(&log).unwrap(), b"new\nmore\n");
        assert_eq!(
            std::fs::metadata(dir.join("subagentd.log.1"))
                .unwrap()
                .len(),
            cap + 1
        );
    }

    #[test]
    fn a_running_log_is_moved_only_when_it_is_the_one_written() {
        let (_tmp, dir) = private_dir();
        let private = crate::securedir::open_owned_dir(&dir).unwrap();
        let uid = crate::paths::uid();
        let (mut writing, _) = private.open_capped_log("d.log", uid, 8, None).unwrap();
        std::io::Write::write_all(&mut writing, b"0123456789").unwrap();
        use std::os::fd::AsFd;
        // Another file at the cap is not the one being written: left alone.
        let stranger = tempfile::tempfile().unwrap();
        let (_, moved) = private
            .open_capped_log("d.log", uid, 8, Some(stranger.as_fd()))
            .unwrap();
        assert!(!moved);
        assert!(!dir.join("d.log.1").exists());
        let (mut fresh, moved) = private
            .open_capped_log("d.log", uid, 8, Some(writing.as_fd()))
            .unwrap();
        assert!(moved);
        std::io::Write::write_all(&mut fresh, b"a").unwrap();
        assert_eq!(std::fs::read(dir.join("d.log.1")).unwrap(), b"0123456789");
        assert_eq!(std::fs::read(dir.join("d.log")).unwrap(), b"a");
    }

    #[test]
    fn the_log_is_not_opened_in_a_dir_that_is_not_ours_alone() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("planted");
        std::fs::create_dir(&dir).unwrap();
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, b"keep\n").unwrap();
        std::os::unix::fs::symlink(&victim, dir.join("subagentd.log")).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        if crate::paths::uid() == 0 {
            std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
        }
        let err = open_log(&dir.join("sock")).unwrap_err();
        assert!(matches!(err, DaemonError::SocketDir { .. }), "{err}");
        assert!(err.to_string().contains(dir.to_str().unwrap()), "{err}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep\n");

        // Ours and private, the symlinked log is still refused.
        if crate::paths::uid() == 0 {
            std::os::unix::fs::chown(&dir, Some(0), Some(0)).unwrap();
        }
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let err = open_log(&dir.join("sock")).unwrap_err();
        assert!(err.to_string().contains("symlink"), "{err}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep\n");

        std::fs::remove_file(dir.join("subagentd.log")).unwrap();
        nix::unistd::mkfifo(&dir.join("subagentd.log"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let err = open_log(&dir.join("sock")).unwrap_err();
        assert!(
            err.to_string().contains("not a regular file"),
            "a FIFO: {err}"
        );
    }
}
