//! Whom a client takes for the daemon. Before the CLI, `subagent run` or
//! the MCP server sends anything on the socket, every directory on the
//! socket's path is checked (no symbolic link; owned by the user, root or
//! the expected uid; writable by no one else, an ancestor only when sticky)
//! and so is the uid of the process listening on it (`SO_PEERCRED`): a
//! socket another local user planted at the default path gets no task.

use nix::errno::Errno;
use nix::fcntl::{open, openat, AtFlags, OFlag};
use nix::sys::stat::{fstat, fstatat, FileStat, Mode};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Component, Path, PathBuf};

/// Why a client will not talk to what listens at the socket path.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    /// Connecting failed (nothing listens, or no socket is there).
    #[error("cannot connect to {path}: {source} (is subagentd running?)")]
    Connect {
        /// The socket.
        path: PathBuf,
        /// The underlying error (NotFound or ConnectionRefused: no daemon).
        source: std::io::Error,
    },
    /// A directory on the socket's path cannot be trusted.
    #[error("not talking to the daemon at {socket}: refusing its socket directory {dir}: {why}")]
    Dir {
        /// The socket.
        socket: PathBuf,
        /// The component at fault.
        dir: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// The socket itself is a symbolic link or not a socket.
    #[error("not talking to the daemon at {socket}: {why}")]
    Socket {
        /// The socket.
        socket: PathBuf,
        /// What it is instead.
        why: String,
    },
    /// The process listening on the socket runs as a uid not trusted.
    #[error("not talking to the daemon at {socket}: it runs as uid {uid}, and only {trusted} are trusted (name the daemon's uid with --expect-uid if it is meant to be another user's)")]
    Peer {
        /// The socket.
        socket: PathBuf,
        /// The listener's uid.
        uid: u32,
        /// The trusted uids, said for a person.
        trusted: String,
    },
    /// A system call of the check itself failed.
    #[error("checking the daemon's socket {socket}: {op} {path}: {errno}")]
    Sys {
        /// The socket.
        socket: PathBuf,
        /// The operation.
        op: &'static str,
        /// Its path.
        path: PathBuf,
        /// The errno.
        errno: Errno,
    },
    /// `--expect-uid` names no uid.
    #[error("--expect-uid {0:?}: neither a number nor a known user name")]
    BadUid(String),
}

impl TrustError {
    /// Whether this says no daemon listens there (so one may be started,
    /// or `subagent run` may run the engine in-process).
    pub fn nobody_listens(&self) -> bool {
        use std::io::ErrorKind::{ConnectionRefused, NotFound};
        matches!(self, TrustError::Connect { source, .. }
            if matches!(source.kind(), NotFound | ConnectionRefused))
    }
}

/// The uids a client believes: its own, root's, and the expected one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trust {
    me: u32,
    expected: Option<u32>,
}

impl Trust {
    /// This process's uid and root, plus `expected` (`--expect-uid`).
    pub fn new(expected: Option<u32>) -> Trust {
        Trust {
            me: crate::paths::uid(),
            expected,
        }
    }

    /// Whether `uid` may own the socket's directories and serve on it.
    pub fn trusts(&self, uid: u32) -> bool {
        uid == self.me || uid == 0 || self.expected == Some(uid)
    }

    /// The trusted uids, for a message.
    pub fn describe(&self) -> String {
        let mut s = format!("yours ({})", self.me);
        if self.me != 0 {
            s.push_str(", root's (0)");
        }
        if let Some(u) = self.expected.filter(|u| *u != self.me && *u != 0) {
            s.push_str(&format!(" and the expected uid {u}"));
        }
        s
    }
}

/// The uid `--expect-uid` names: a number, or a user name.
pub fn parse_uid(text: &str) -> Result<u32, TrustError> {
    if let Ok(n) = text.parse::<u32>() {
        return Ok(n);
    }
    match nix::unistd::User::from_name(text) {
        Ok(Some(u)) => Ok(u.uid.as_raw()),
        _ => Err(TrustError::BadUid(text.to_owned())),
    }
}

/// Connects to the daemon at `socket` once its path and its listener's uid
/// pass [`check_path`] and [`check_peer`]; nothing is sent before.
pub fn connect(socket: &Path, trust: &Trust) -> Result<UnixStream, TrustError> {
    let path = check_path(socket, trust)?;
    let stream = UnixStream::connect(&path).map_err(|source| TrustError::Connect {
        path: socket.to_path_buf(),
        source,
    })?;
    check_peer(stream.as_fd(), socket, trust)?;
    Ok(stream)
}

/// Checks the listener of a connected socket: its uid must be trusted.
pub fn check_peer(fd: BorrowedFd<'_>, socket: &Path, trust: &Trust) -> Result<(), TrustError> {
    let cred = nix::sys::socket::getsockopt(&fd, nix::sys::socket::sockopt::PeerCredentials)
        .map_err(|errno| TrustError::Sys {
            socket: socket.to_path_buf(),
            op: "SO_PEERCRED",
            path: socket.to_path_buf(),
            errno,
        })?;
    let uid = cred.uid();
    if trust.trusts(uid) {
        return Ok(());
    }
    Err(TrustError::Peer {
        socket: socket.to_path_buf(),
        uid,
        trusted: trust.describe(),
    })
}

/// Walks the socket's path from `/` without following a link and checks
/// each directory, then the socket's own entry; returns the absolute path.
/// A missing component is [`TrustError::Connect`] with NotFound.
pub fn check_path(socket: &Path, trust: &Trust) -> Result<PathBuf, TrustError> {
    let abs = std::path::absolute(socket).map_err(|source| TrustError::Connect {
        path: socket.to_path_buf(),
        source,
    })?;
    let walk = Walk { socket, trust };
    let (parent, name) = match (abs.parent(), abs.file_name()) {
        (Some(p), Some(n)) => (p.to_path_buf(), n.to_owned()),
        _ => return Err(walk.socket_error("it names no file")),
    };
    let dir = walk.dirs(&parent)?;
    let st = match fstatat(dir.as_fd(), name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::ENOENT) => return Err(walk.absent()),
        Err(errno) => return Err(walk.sys("stat", &abs, errno)),
    };
    match st.st_mode & libc::S_IFMT {
        libc::S_IFSOCK => Ok(abs),
        libc::S_IFLNK => Err(walk.socket_error("it is a symbolic link, which is never followed")),
        _ => Err(walk.socket_error("it is not a socket")),
    }
}

/// One check of one socket path.
struct Walk<'a> {
    socket: &'a Path,
    trust: &'a Trust,
}

impl Walk<'_> {
    fn absent(&self) -> TrustError {
        TrustError::Connect {
            path: self.socket.to_path_buf(),
            source: std::io::Error::from_raw_os_error(libc::ENOENT),
        }
    }

    fn socket_error(&self, why: &str) -> TrustError {
        TrustError::Socket {
            socket: self.socket.to_path_buf(),
            why: why.to_owned(),
        }
    }

    fn dir_error(&self, dir: &Path, why: String) -> TrustError {
        TrustError::Dir {
            socket: self.socket.to_path_buf(),
            dir: dir.to_path_buf(),
            why,
        }
    }

    fn sys(&self, op: &'static str, path: &Path, errno: Errno) -> TrustError {
        TrustError::Sys {
            socket: self.socket.to_path_buf(),
            op,
            path: path.to_path_buf(),
            errno,
        }
    }

    /// Opens each directory of the absolute `dir` in turn, relative to the
    /// one before, and checks it; returns the last one open.
    fn dirs(&self, dir: &Path) -> Result<OwnedFd, TrustError> {
        let flags = OFlag::O_DIRECTORY | OFlag::O_CLOEXEC | OFlag::O_RDONLY;
        let root = Path::new("/");
        let mut fd = open(root, flags, Mode::empty()).map_err(|e| self.sys("open", root, e))?;
        let mut at = PathBuf::from("/");
        let names: Vec<Component<'_>> = dir.components().collect();
        let last = names.len().saturating_sub(1);
        self.check(
            &at,
            &fstat(&fd).map_err(|e| self.sys("stat", &at, e))?,
            last == 0,
        )?;
        for (i, c) in names.into_iter().enumerate() {
            let name = match c {
                Component::RootDir | Component::CurDir => continue,
                Component::ParentDir => std::ffi::OsStr::new(".."),
                Component::Normal(n) => n,
                Component::Prefix(_) => return Err(self.dir_error(dir, "not a unix path".into())),
            };
            at.push(name);
            fd = match openat(fd.as_fd(), name, flags | OFlag::O_NOFOLLOW, Mode::empty()) {
                Ok(next) => next,
                Err(Errno::ENOENT) => return Err(self.absent()),
                Err(Errno::ELOOP | Errno::ENOTDIR) => return Err(self.not_a_dir(&fd, name, &at)),
                Err(e) => return Err(self.sys("open", &at, e)),
            };
            let st = fstat(&fd).map_err(|e| self.sys("stat", &at, e))?;
            self.check(&at, &st, i == last)?;
        }
        Ok(fd)
    }

    /// Why `name` in `parent` did not open as a directory.
    fn not_a_dir(&self, parent: &OwnedFd, name: &std::ffi::OsStr, at: &Path) -> TrustError {
        let link = fstatat(parent.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW)
            .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFLNK);
        let why = if link {
            "it is a symbolic link, which is never followed on the way to the socket"
        } else {
            "it is not a directory"
        };
        self.dir_error(at, why.into())
    }

    /// A directory on the way: owned by a trusted uid, and writable by no
    /// one else (an ancestor may be, when sticky, as /tmp is).
    fn check(&self, path: &Path, st: &FileStat, last: bool) -> Result<(), TrustError> {
        if !self.trust.trusts(st.st_uid) {
            let why = format!(
                "it is owned by uid {}, and only {} are trusted: another user may have made it",
                st.st_uid,
                self.trust.describe()
            );
            return Err(self.dir_error(path, why));
        }
        let mode = st.st_mode & 0o7777;
        let sticky = mode & libc::S_ISVTX != 0 && !last;
        if mode & 0o022 != 0 && !sticky {
            let why =
                format!("its mode {mode:o} lets other users write it, and so replace the socket");
            return Err(self.dir_error(path, why));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn listen(dir: &Path) -> (PathBuf, std::os::unix::net::UnixListener) {
        let sock = dir.join("d.sock");
        let l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        (sock, l)
    }

    #[test]
    fn a_private_dir_of_ours_with_our_listener_is_trusted() {
        let tmp = tempfile::tempdir().unwrap();
        let (sock, _l) = listen(tmp.path());
        assert!(connect(&sock, &Trust::new(None)).is_ok());
    }

    #[test]
    fn a_missing_socket_or_dir_says_nobody_listens() {
        let tmp = tempfile::tempdir().unwrap();
        let t = Trust::new(None);
        let e = connect(&tmp.path().join("none.sock"), &t).unwrap_err();
        assert!(e.nobody_listens(), "{e}");
        let e = connect(&tmp.path().join("no/dir/d.sock"), &t).unwrap_err();
        assert!(e.nobody_listens(), "{e}");
        let (sock, l) = listen(tmp.path());
        drop(l);
        let e = connect(&sock, &t).unwrap_err();
        assert!(e.nobody_listens(), "a stale socket: {e}");
    }

    #[test]
    fn a_dir_others_can_write_is_refused_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        let open = tmp.path().join("open");
        std::fs::create_dir(&open).unwrap();
        let (sock, _l) = listen(&open);
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let e = connect(&sock, &Trust::new(None)).unwrap_err();
        assert!(
            matches!(e, TrustError::Dir { ref dir, .. } if *dir == open),
            "{e}"
        );
        assert!(e.to_string().contains("mode 1777"), "{e}");
        assert!(!e.nobody_listens());
    }

    #[test]
    fn a_link_on_the_way_or_as_the_socket_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let real = tmp.path().join("real");
        std::fs::create_dir(&real).unwrap();
        let (sock, _l) = listen(&real);
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let e = connect(&link.join("d.sock"), &Trust::new(None)).unwrap_err();
        assert!(
            matches!(e, TrustError::Dir { ref dir, .. } if *dir == link),
            "{e}"
        );
        assert!(e.to_string().contains("symbolic link"), "{e}");
        std::os::unix::fs::symlink(&sock, real.join("l.sock")).unwrap();
        let e = connect(&real.join("l.sock"), &Trust::new(None)).unwrap_err();
        assert!(matches!(e, TrustError::Socket { .. }), "{e}");
        std::fs::write(real.join("file"), b"").unwrap();
        let e = connect(&real.join("file"), &Trust::new(None)).unwrap_err();
        assert!(e.to_string().contains("not a socket"), "{e}");
    }

    #[test]
    fn another_uids_dir_is_refused_unless_expected() {
        if crate::paths::uid() != 0 {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let theirs = tmp.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        let (sock, _l) = listen(&theirs);
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
        let e = connect(&sock, &Trust::new(None)).unwrap_err();
        assert!(e.to_string().contains("owned by uid 65534"), "{e}");
        assert!(connect(&sock, &Trust::new(Some(65534))).is_ok());
    }

    #[test]
    fn uids_are_numbers_or_names_and_described() {
        assert_eq!(parse_uid("1234").unwrap(), 1234);
        assert_eq!(parse_uid("root").unwrap(), 0);
        assert!(matches!(
            parse_uid("no such user here"),
            Err(TrustError::BadUid(_))
        ));
        let t = Trust {
            me: 1000,
            expected: Some(2000),
        };
        assert!(t.trusts(0) && t.trusts(1000) && t.trusts(2000) && !t.trusts(3000));
        assert_eq!(
            t.describe(),
            "yours (1000), root's (0) and the expected uid 2000"
        );
    }
}
