//! Private directories under shared parents (/tmp) without following
//! symlinks: every component is created or opened relative to its parent's
//! descriptor with O_NOFOLLOW and checked (a directory, owned by us, not
//! writable by group or others) before the next one is made inside it.

use nix::errno::Errno;
use nix::fcntl::AtFlags;
use nix::fcntl::{open, openat, OFlag};
use nix::sys::stat::{fstat, fstatat, mkdirat, Mode};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

/// Why a private directory could not be made or trusted.
#[derive(Debug, thiserror::Error)]
pub enum SecureDirError {
    /// A component is a symlink; it is never followed.
    #[error("{0}: is a symlink; refusing to follow it")]
    Symlink(PathBuf),
    /// A component exists but is not a directory.
    #[error("{0}: exists and is not a directory")]
    NotDir(PathBuf),
    /// A component belongs to someone else.
    #[error("{path}: owned by uid {owner}, expected uid {expected}")]
    WrongOwner {
        /// The component.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// Our uid.
        expected: u32,
    },
    /// A component is writable by group or others.
    #[error("{path}: mode {mode:o} is writable by group or others")]
    Writable {
        /// The component.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// A system call failed.
    #[error("{op} {path}: {errno}")]
    Sys {
        /// The operation.
        op: &'static str,
        /// The component.
        path: PathBuf,
        /// The errno.
        errno: Errno,
    },
    /// A name is empty, "." or "..", or holds a slash.
    #[error("{0:?}: not a single path component")]
    BadName(String),
}

/// An open, verified private directory.
pub struct PrivateDir {
    fd: OwnedFd,
    path: PathBuf,
}

fn sys<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(Errno) -> SecureDirError + 'a {
    move |errno| SecureDirError::Sys {
        op,
        path: path.to_path_buf(),
        errno,
    }
}

fn check_name(name: &str) -> Result<(), SecureDirError> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(SecureDirError::BadName(name.to_owned()));
    }
    Ok(())
}

impl PrivateDir {
    /// Opens `dir` (an existing directory the caller trusts, e.g. /tmp).
    pub fn open_trusted(dir: &Path) -> Result<PrivateDir, SecureDirError> {
        let fd = open(
            dir,
            OFlag::O_DIRECTORY | OFlag::O_CLOEXEC | OFlag::O_RDONLY,
            Mode::empty(),
        )
        .map_err(sys("open", dir))?;
        Ok(PrivateDir {
            fd,
            path: dir.to_path_buf(),
        })
    }

    /// The directory's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Creates `name` (mode 0700) inside this directory unless it exists,
    /// then opens it without following symlinks and verifies it.
    pub fn ensure_child(&self, name: &str, owner: u32) -> Result<PrivateDir, SecureDirError> {
        check_name(name)?;
        let path = self.path.join(name);
        match mkdirat(self.fd.as_fd(), name, Mode::S_IRWXU) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(sys("mkdir", &path)(e)),
        }
        self.open_verified(name, path, owner)
    }

    /// Creates `name` (mode 0700) inside this directory; fails with EEXIST
    /// when it exists already.
    pub fn create_child(&self, name: &str, owner: u32) -> Result<PrivateDir, SecureDirError> {
        check_name(name)?;
        let path = self.path.join(name);
        mkdirat(self.fd.as_fd(), name, Mode::S_IRWXU).map_err(sys("mkdir", &path))?;
        self.open_verified(name, path, owner)
    }

    fn open_verified(
        &self,
        name: &str,
        path: PathBuf,
        owner: u32,
    ) -> Result<PrivateDir, SecureDirError> {
        let fd = match openat(
            self.fd.as_fd(),
            name,
            OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_RDONLY,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::ELOOP | Errno::ENOTDIR) => {
                // O_DIRECTORY may win over O_NOFOLLOW: look at the entry itself.
                let st = fstatat(self.fd.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW)
                    .map_err(sys("stat", &path))?;
                return Err(if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
                    SecureDirError::Symlink(path)
                } else {
                    SecureDirError::NotDir(path)
                });
            }
            Err(e) => return Err(sys("open", &path)(e)),
        };
        let st = fstat(&fd).map_err(sys("stat", &path))?;
        if st.st_uid != owner {
            return Err(SecureDirError::WrongOwner {
                path,
                owner: st.st_uid,
                expected: owner,
            });
        }
        let mode = st.st_mode & 0o7777;
        if mode & 0o022 != 0 {
            return Err(SecureDirError::Writable { path, mode });
        }
        Ok(PrivateDir { fd, path })
    }
}

impl PrivateDir {
    /// Sets the directory's mode (through its descriptor, no path lookup).
    pub fn set_mode(&self, mode: u32) -> Result<(), SecureDirError> {
        nix::sys::stat::fchmod(&self.fd, Mode::from_bits_truncate(mode))
            .map_err(sys("chmod", &self.path))
    }

    /// Gives the directory to `uid:gid` (through its descriptor).
    pub fn set_owner(&self, uid: u32, gid: u32) -> Result<(), SecureDirError> {
        nix::unistd::fchown(
            &self.fd,
            Some(nix::unistd::Uid::from_raw(uid)),
            Some(nix::unistd::Gid::from_raw(gid)),
        )
        .map_err(sys("chown", &self.path))
    }
}

impl PrivateDir {
    /// The open directory.
    pub fn into_fd(self) -> OwnedFd {
        self.fd
    }
}

/// Opens the absolute `path` as a private directory of ours: its first
/// component (a system directory such as `/run`) is trusted, every one
/// below it is made if missing (0700) and verified. Returns the opened
/// directory.
pub fn open_private_dir(path: &Path) -> Result<OwnedFd, SecureDirError> {
    let owner = crate::paths::uid();
    let mut names = path
        .components()
        .filter_map(|c| match c {
            std::path::Component::Normal(n) => n.to_str().map(str::to_owned),
            _ => None,
        })
        .collect::<Vec<_>>()
        .into_iter();
    let top = names
        .next()
        .ok_or_else(|| SecureDirError::BadName(path.display().to_string()))?;
    let mut dir = PrivateDir::open_trusted(&Path::new("/").join(top))?;
    for n in names {
        dir = dir.ensure_child(&n, owner)?;
    }
    Ok(dir.into_fd())
}

/// Makes `<parent>/<name>` a private directory, creating it if needed,
/// where `parent` itself is trusted. Returns its path.
pub fn ensure_private_dir(parent: &Path, name: &str) -> Result<PathBuf, SecureDirError> {
    let owner = crate::paths::uid();
    let dir = PrivateDir::open_trusted(parent)?.ensure_child(name, owner)?;
    Ok(dir.path)
}

fn open_base(base: &Path, owner: u32) -> Result<PrivateDir, SecureDirError> {
    let (parent, name) = split(base)?;
    PrivateDir::open_trusted(&parent)?.ensure_child(&name, owner)
}

/// Creates a child's temp dir `<base>/<session>/c<8 hex>` (base =
/// `/tmp/subagentd-<uid>`), verifying each component. Returns its path.
pub fn make_temp_dir(base: &Path, session: &str) -> Result<PathBuf, SecureDirError> {
    let owner = crate::paths::uid();
    let base_dir = open_base(base, owner)?;
    // An empty session dir is removed when a run of it ends (by any daemon
    // of this uid, at any time); if that happens between making the session
    // dir and opening it, or between opening it and making the leaf, the
    // call fails with ENOENT and the session dir is made again.
    let mut retries = 5;
    loop {
        // Swept away (it was empty) between its mkdir and its open: again.
        let session_dir = match base_dir.ensure_child(session, owner) {
            Ok(d) => d,
            Err(SecureDirError::Sys {
                errno: Errno::ENOENT,
                ..
            }) if retries > 0 => {
                retries -= 1;
                continue;
            }
            Err(e) => return Err(e),
        };
        let leaf = format!("c{}", crate::ids::random_hex8());
        match session_dir.create_child(&leaf, owner) {
            Ok(dir) => return Ok(dir.path),
            Err(SecureDirError::Sys {
                errno: Errno::EEXIST,
                ..
            }) => continue,
            Err(SecureDirError::Sys {
                errno: Errno::ENOENT,
                ..
            }) if retries > 0 => retries -= 1,
            Err(e) => return Err(e),
        }
    }
}

/// The first component of the absolute `path` that is a symbolic link,
/// with where it points, if any. A root is bound only as it is named: a
/// link on the way may have been put there by a child that could write
/// its directory, and would choose what the next run gets.
pub fn link_on_the_way(path: &Path) -> Option<(PathBuf, PathBuf)> {
    let mut at = PathBuf::new();
    for c in path.components() {
        at.push(c);
        if std::fs::symlink_metadata(&at).is_ok_and(|m| m.file_type().is_symlink()) {
            let to = std::fs::read_link(&at).unwrap_or_default();
            return Some((at, to));
        }
    }
    None
}

/// Removes a run's session dir (the parent of its temp dir) if it is empty,
/// so `/tmp/subagentd-<uid>` does not fill with empty session dirs. A
/// non-empty dir (another run of the session is alive) is left alone.
pub fn remove_empty_session_dir(temp_dir: &Path) {
    if let Some(session_dir) = temp_dir.parent() {
        // rmdir only removes an empty directory; ENOTEMPTY and ENOENT are the
        // expected outcomes when another run still uses it.
        let _ = std::fs::remove_dir(session_dir);
    }
}

/// Removes every empty session dir under `base` (a file, a symlink or a
/// non-empty dir is left alone); returns how many went. The engine runs it
/// at start, for what a crash left.
pub fn sweep_empty_session_dirs(base: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(base) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        // rmdir only removes an empty directory.
        .filter(|e| std::fs::remove_dir(e.path()).is_ok())
        .count()
}

fn split(path: &Path) -> Result<(PathBuf, String), SecureDirError> {
    let bad = || SecureDirError::BadName(path.display().to_string());
    let parent = path.parent().ok_or_else(bad)?.to_path_buf();
    let name = path.file_name().and_then(|n| n.to_str()).ok_or_else(bad)?;
    Ok((parent, name.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn creates_private_dirs_and_refuses_symlinks() {
        let root = tempfile::tempdir().unwrap();
        let base = root.path().join("subagentd-test");
        let t = make_temp_dir(&base, "sess").unwrap();
        assert!(t.starts_with(base.join("sess")));
        let name = t.file_name().unwrap().to_str().unwrap();
        assert!(name.starts_with('c') && name.len() == 9, "{name}");
        let mode = std::fs::metadata(&t).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);

        // A symlink in place of the session dir is refused.
        let elsewhere = root.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, base.join("evil")).unwrap();
        let err = make_temp_dir(&base, "evil").unwrap_err();
        assert!(matches!(err, SecureDirError::Symlink(_)), "{err}");
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);

        // A symlink in place of the base is refused too.
        let base2 = root.path().join("subagentd-link");
        std::os::unix::fs::symlink(&elsewhere, &base2).unwrap();
        assert!(matches!(
            make_temp_dir(&base2, "s").unwrap_err(),
            SecureDirError::Symlink(_)
        ));
    }

    #[test]
    fn the_first_link_on_a_path_is_named() {
        let root = tempfile::tempdir().unwrap();
        let real = root.path().canonicalize().unwrap();
        std::fs::create_dir_all(real.join("a/b")).unwrap();
        std::os::unix::fs::symlink("/etc", real.join("a/l")).unwrap();
        assert_eq!(link_on_the_way(&real.join("a/b")), None);
        assert_eq!(
            link_on_the_way(&real.join("a/l/ssl")),
            Some((real.join("a/l"), PathBuf::from("/etc")))
        );
        assert_eq!(
            link_on_the_way(&real.join("a/l")),
            Some((real.join("a/l"), PathBuf::from("/etc")))
        );
    }

    #[test]
    fn an_empty_session_dir_is_removed_and_made_again() {
        let root = tempfile::tempdir().unwrap();
        let base = root.path().join("b");
        let a = make_temp_dir(&base, "s").unwrap();
        let b = make_temp_dir(&base, "s").unwrap();
        std::fs::remove_dir(&a).unwrap();
        remove_empty_session_dir(&a);
        assert!(base.join("s").is_dir(), "b still lives there");
        std::fs::remove_dir(&b).unwrap();
        remove_empty_session_dir(&b);
        assert!(!base.join("s").exists());
        let c = make_temp_dir(&base, "s").unwrap();
        assert!(c.is_dir() && c.starts_with(base.join("s")));
    }

    #[test]
    fn a_sweep_removes_only_empty_session_dirs() {
        let root = tempfile::tempdir().unwrap();
        let base = root.path().join("b");
        let live = make_temp_dir(&base, "busy").unwrap();
        let done = make_temp_dir(&base, "idle").unwrap();
        std::fs::remove_dir(&done).unwrap();
        std::fs::write(base.join("subagentd.sock.lock"), b"").unwrap();
        std::os::unix::fs::symlink(root.path(), base.join("link")).unwrap();
        assert_eq!(sweep_empty_session_dirs(&base), 1);
        assert!(live.is_dir());
        assert!(!base.join("idle").exists());
        assert!(base.join("subagentd.sock.lock").is_file());
        assert!(base.join("link").is_symlink());
        assert_eq!(sweep_empty_session_dirs(&root.path().join("none")), 0);
    }

    #[test]
    fn group_writable_component_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let base = root.path().join("b");
        std::fs::create_dir(&base).unwrap();
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = make_temp_dir(&base, "s").unwrap_err();
        assert!(matches!(err, SecureDirError::Writable { .. }), "{err}");
    }

    #[test]
    fn bad_names_are_refused() {
        let root = tempfile::tempdir().unwrap();
        for bad in ["..", ".", "a/b", ""] {
            assert!(matches!(
                make_temp_dir(root.path(), bad).unwrap_err(),
                SecureDirError::BadName(_)
            ));
        }
    }
}
