//! The control socket's hygiene: a private directory, a lock so two daemons
//! never share a path, a stale socket replaced but a live one never stolen,
//! mode 0600 set before listen, and removal on exit.

use nix::sys::socket::{
    bind, listen, socket, AddressFamily, Backlog, SockFlag, SockType, UnixAddr,
};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use subagent_runner::ioerr::{at, IoAt};

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
    /// The socket's directory could not be made, or is not ours alone.
    #[error("refusing the socket directory {dir}: {source}")]
    Dir {
        /// The directory.
        dir: PathBuf,
        /// What is wrong with it (or with a directory above it).
        source: crate::securedir::SecureDirError,
    },
    /// A step failed.
    #[error(transparent)]
    Io(#[from] IoAt),
    /// The socket systemd passed (LISTEN_FDS) cannot be served.
    #[error("the socket passed by the service manager (LISTEN_FDS): {0}")]
    Activation(String),
}

/// A bound, listening socket; removes its file when dropped.
pub struct BoundSocket {
    /// The listener (non-blocking).
    pub listener: std::os::unix::net::UnixListener,
    path: PathBuf,
    _lock: std::fs::File,
    /// Whether the file is ours to remove (not one systemd made and keeps).
    owned: bool,
}

impl BoundSocket {
    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl BoundSocket {
    /// A listener systemd bound at `path`, with the daemon's lock taken
    /// beside it; its file is left in place at exit.
    pub(super) fn activated(
        listener: std::os::unix::net::UnixListener,
        path: &Path,
    ) -> Result<BoundSocket, SocketError> {
        Ok(BoundSocket {
            listener,
            path: path.to_path_buf(),
            _lock: lock_beside(path)?,
            owned: false,
        })
    }
}

impl Drop for BoundSocket {
    fn drop(&mut self) {
        if self.owned {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// `<path>.lock`, held: no second daemon serves this path.
fn lock_beside(path: &Path) -> Result<std::fs::File, SocketError> {
    let mut lock_name = path.as_os_str().to_owned();
    lock_name.push(".lock");
    crate::lockfile::acquire(Path::new(&lock_name)).map_err(|e| match e {
        crate::lockfile::LockError::Held { pid, .. } => SocketError::InUse {
            path: path.to_path_buf(),
            pid,
        },
        crate::lockfile::LockError::Io(e) => SocketError::Io(e),
    })
}

/// Binds `path`, creating its directory (0700) when missing; an existing
/// one must be ours, not writable by others, and reached through no symlink.
pub fn bind_socket(path: &Path) -> Result<BoundSocket, SocketError> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let dir = std::path::absolute(dir).map_err(at("resolve", dir))?;
    crate::securedir::open_owned_dir(&dir).map_err(|source| SocketError::Dir {
        dir: dir.clone(),
        source,
    })?;
    let lock = lock_beside(path)?;
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
            std::fs::remove_file(path).map_err(at("remove stale socket", path))?;
            tracing::info!(path = %path.display(), "replaced a stale socket");
        }
        Ok(_) => return Err(SocketError::NotASocket(path.to_path_buf())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(at("stat", path)(e).into()),
    }
    let fd = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )
    .map_err(|e| at("socket", path)(e.into()))?;
    let addr = UnixAddr::new(path).map_err(|e| at("socket address", path)(e.into()))?;
    bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &addr).map_err(|e| at("bind", path)(e.into()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(at("chmod", path))?;
    listen(&fd, Backlog::new(1024).unwrap_or(Backlog::MAXCONN))
        .map_err(|e| at("listen", path)(e.into()))?;
    Ok(BoundSocket {
        listener: std::os::unix::net::UnixListener::from(fd),
        path: path.to_path_buf(),
        _lock: lock,
        owned: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_existing_socket_dir_must_be_ours_alone() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        let bound = bind_socket(&dir.join("d.sock")).unwrap();
        assert!(bound.path().exists());
        drop(bound);

        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = bind_socket(&dir.join("d.sock")).err().unwrap();
        assert!(matches!(err, SocketError::Dir { .. }), "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains(dir.to_str().unwrap()) && msg.contains("writable"),
            "{msg}"
        );
        assert!(!dir.join("d.sock").exists(), "nothing bound there");

        if crate::paths::uid() == 0 {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
            std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
            let err = bind_socket(&dir.join("d.sock")).err().unwrap();
            assert!(err.to_string().contains("owned by uid 65534"), "{err}");
        }
    }
}
