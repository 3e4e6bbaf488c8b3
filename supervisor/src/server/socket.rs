//! The control socket's hygiene: a private directory, a lock so two daemons
//! never share a path, a stale socket replaced but a live one never stolen,
//! mode 0600 set before listen, and removal on exit.

use nix::sys::socket::{
    bind, listen, socket, AddressFamily, Backlog, SockFlag, SockType, UnixAddr,
};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The socket could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// Another daemon serves this path.
    #[error("another subagentd is already listening on {path}{}", pid.map(|p| format!(" (pid {p})")).unwrap_or_default())]
    InUse {
        /// The socket path.
        path: PathBuf,
        /// The other daemon's pid, when known.
        pid: Option<i32>,
    },
    /// Something that is not a socket is in the way.
    #[error("{0} exists and is not a socket; not removing it")]
    NotASocket(PathBuf),
    /// The socket's directory could not be made safely.
    #[error("socket directory: {0}")]
    Dir(#[from] crate::securedir::SecureDirError),
    /// A step failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// The step.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
}

/// A bound, listening socket; removes its file when dropped.
pub struct BoundSocket {
    /// The listener (non-blocking).
    pub listener: std::os::unix::net::UnixListener,
    path: PathBuf,
    _lock: std::fs::File,
}

impl BoundSocket {
    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for BoundSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> SocketError + 'a {
    move |source| SocketError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// Binds `path`, creating its directory (0700) when missing.
pub fn bind_socket(path: &Path) -> Result<BoundSocket, SocketError> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !dir.exists() {
        let (Some(grand), Some(name)) = (dir.parent(), dir.file_name().and_then(|n| n.to_str()))
        else {
            return Err(io("create", dir)(std::io::ErrorKind::InvalidInput.into()));
        };
        std::fs::create_dir_all(grand).map_err(io("create", grand))?;
        crate::securedir::ensure_private_dir(grand, name)?;
    }
    let mut lock_name = path.as_os_str().to_owned();
    lock_name.push(".lock");
    let lock_path = PathBuf::from(lock_name);
    let lock = crate::engine::lockfile::acquire(&lock_path).map_err(|e| match e {
        crate::engine::lockfile::LockError::Held { pid, .. } => SocketError::InUse {
            path: path.to_path_buf(),
            pid,
        },
        crate::engine::lockfile::LockError::Io { op, path, source } => {
            SocketError::Io { op, path, source }
        }
    })?;
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            // We hold the lock, so no daemon of ours owns it; still, never
            // take a socket something answers on.
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(SocketError::InUse {
                    path: path.to_path_buf(),
                    pid: None,
                });
            }
            std::fs::remove_file(path).map_err(io("remove stale socket", path))?;
            tracing::info!(path = %path.display(), "replaced a stale socket");
        }
        Ok(_) => return Err(SocketError::NotASocket(path.to_path_buf())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io("stat", path)(e)),
    }
    let fd = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )
    .map_err(|e| io("socket", path)(e.into()))?;
    let addr = UnixAddr::new(path).map_err(|e| io("socket address", path)(e.into()))?;
    bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &addr).map_err(|e| io("bind", path)(e.into()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(io("chmod", path))?;
    listen(&fd, Backlog::new(1024).unwrap_or(Backlog::MAXCONN))
        .map_err(|e| io("listen", path)(e.into()))?;
    Ok(BoundSocket {
        listener: std::os::unix::net::UnixListener::from(fd),
        path: path.to_path_buf(),
        _lock: lock,
    })
}
