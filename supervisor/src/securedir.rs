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

/// The effective uid of this process.
pub fn uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

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
    /// A file that should be a regular file is something else.
    #[error("{0}: is not a regular file (a FIFO, device or directory?); refusing it")]
    NotRegular(PathBuf),
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
        let (dir, st) = self.open_dir(name, path)?;
        check_private(&dir.path, &st, owner)?;
        Ok(dir)
    }

    /// Opens the directory `name` inside this one without following a
    /// symlink; returns it with its status.
    fn open_dir(
        &self,
        name: &str,
        path: PathBuf,
    ) -> Result<(PrivateDir, nix::sys::stat::FileStat), SecureDirError> {
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
        Ok((PrivateDir { fd, path }, st))
    }
}

/// `st` (of `path`) is owned by `owner` and writable by no one else.
fn check_private(
    path: &Path,
    st: &nix::sys::stat::FileStat,
    owner: u32,
) -> Result<(), SecureDirError> {
    if st.st_uid != owner {
        return Err(SecureDirError::WrongOwner {
            path: path.to_path_buf(),
            owner: st.st_uid,
            expected: owner,
        });
    }
    let mode = st.st_mode & 0o7777;
    if mode & 0o022 != 0 {
        return Err(SecureDirError::Writable {
            path: path.to_path_buf(),
            mode,
        });
    }
    Ok(())
}

/// An ancestor (`st`, of `path`) that only root or `owner` can change: owned
/// by one of them, and writable by others only when sticky (as /tmp is).
fn check_ancestor(
    path: &Path,
    st: &nix::sys::stat::FileStat,
    owner: u32,
) -> Result<(), SecureDirError> {
    if st.st_uid != 0 && st.st_uid != owner {
        return Err(SecureDirError::WrongOwner {
            path: path.to_path_buf(),
            owner: st.st_uid,
            expected: owner,
        });
    }
    let mode = st.st_mode & 0o7777;
    if mode & 0o022 != 0 && mode & libc::S_ISVTX == 0 {
        return Err(SecureDirError::Writable {
            path: path.to_path_buf(),
            mode,
        });
    }
    Ok(())
}

impl PrivateDir {
    /// Opens (creating it 0600) the log file `name` in this directory for
    /// appending: never through a symlink, never blocking on a FIFO, and
    /// only if it is a regular file of `owner` that no one else can write.
    pub fn open_log(&self, name: &str, owner: u32) -> Result<std::fs::File, SecureDirError> {
        check_name(name)?;
        let path = self.path.join(name);
        let flags = OFlag::O_WRONLY
            | OFlag::O_APPEND
            | OFlag::O_CREAT
            | OFlag::O_NOFOLLOW
            | OFlag::O_NONBLOCK
            | OFlag::O_CLOEXEC;
        let fd = match openat(self.fd.as_fd(), name, flags, Mode::S_IRUSR | Mode::S_IWUSR) {
            Ok(fd) => fd,
            Err(Errno::ELOOP) => return Err(SecureDirError::Symlink(path)),
            // ENXIO: a FIFO nobody reads; EISDIR, ENODEV: not a file either.
            Err(Errno::ENXIO | Errno::EISDIR | Errno::ENODEV) => {
                return Err(SecureDirError::NotRegular(path))
            }
            Err(e) => return Err(sys("open", &path)(e)),
        };
        let st = fstat(&fd).map_err(sys("stat", &path))?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(SecureDirError::NotRegular(path));
        }
        check_private(&path, &st, owner)?;
        // O_NONBLOCK was only for the open; writes to the log may block.
        nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_SETFL(OFlag::O_APPEND))
            .map_err(sys("fcntl", &path))?;
        Ok(std::fs::File::from(fd))
    }
}

/// The size at which a daemon log is moved to `<name>.1`: 10 MiB.
pub const LOG_CAP: u64 = 10 << 20;

impl PrivateDir {
    /// [`PrivateDir::open_log`], but once the log has reached `cap` bytes
    /// it is first moved to `<name>.1` (replacing the older one) and a new
    /// one opened; true then. With `writing`, only when that descriptor is
    /// the file at `name`: never moves a log someone else put there.
    pub fn open_capped_log(
        &self,
        name: &str,
        owner: u32,
        cap: u64,
        writing: Option<std::os::fd::BorrowedFd<'_>>,
    ) -> Result<(std::fs::File, bool), SecureDirError> {
        let path = self.path.join(name);
        let file = self.open_log(name, owner)?;
        let st = fstat(&file).map_err(sys("stat", &path))?;
        let ours = match writing {
            Some(fd) => {
                let w = fstat(fd).map_err(sys("stat", &path))?;
                (w.st_dev, w.st_ino) == (st.st_dev, st.st_ino)
            }
            None => true,
        };
        if !ours || u64::try_from(st.st_size).unwrap_or(0) < cap {
            return Ok((file, false));
        }
        let old = format!("{name}.1");
        nix::fcntl::renameat(&self.fd, name, &self.fd, old.as_str())
            .map_err(sys("rename", &path))?;
        Ok((self.open_log(name, owner)?, true))
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
    let owner = uid();
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

/// Opens the directory at the absolute `path`, made (0700) with any missing
/// parents, walking from `/` without following a symlink: each ancestor
/// must be one only root or we can change ([`check_ancestor`]), and `path`
/// itself ours and writable by us alone, whether it was there or not.
pub fn open_owned_dir(path: &Path) -> Result<PrivateDir, SecureDirError> {
    let owner = uid();
    let mut names = Vec::new();
    for c in path.components() {
        match c {
            std::path::Component::RootDir => {}
            std::path::Component::Normal(n) => names.push(
                n.to_str()
                    .ok_or_else(|| SecureDirError::BadName(path.display().to_string()))?,
            ),
            _ => return Err(SecureDirError::BadName(path.display().to_string())),
        }
    }
    if !path.is_absolute() {
        return Err(SecureDirError::BadName(path.display().to_string()));
    }
    let mut dir = PrivateDir::open_trusted(Path::new("/"))?;
    let root = fstat(&dir.fd).map_err(sys("stat", Path::new("/")))?;
    check_ancestor(Path::new("/"), &root, owner)?;
    let last = names.len().saturating_sub(1);
    for (i, name) in names.into_iter().enumerate() {
        let child = dir.path.join(name);
        let (next, st) = match dir.open_dir(name, child.clone()) {
            Err(SecureDirError::Sys {
                errno: Errno::ENOENT,
                ..
            }) => {
                match mkdirat(dir.fd.as_fd(), name, Mode::S_IRWXU) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(e) => return Err(sys("mkdir", &child)(e)),
                }
                dir.open_dir(name, child)?
            }
            other => other?,
        };
        if i == last {
            check_private(&next.path, &st, owner)?;
        } else {
            check_ancestor(&next.path, &st, owner)?;
        }
        dir = next;
    }
    Ok(dir)
}

fn open_base(base: &Path, owner: u32) -> Result<PrivateDir, SecureDirError> {
    let (parent, name) = split(base)?;
    PrivateDir::open_trusted(&parent)?.ensure_child(&name, owner)
}

/// Creates a child's temp dir `<base>/<session>/c<8 hex>` (base =
/// `/tmp/subagentd-<uid>`), verifying each component. Returns its path.
pub fn make_temp_dir(base: &Path, session: &str) -> Result<PathBuf, SecureDirError> {
    let owner = uid();
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

    /// Whether this test runs as root, so it can give a file to nobody.
    fn root() -> bool {
        uid() == 0
    }

    #[test]
    fn an_owned_dir_is_made_private_and_an_existing_one_checked() {
        let root = tempfile::tempdir().unwrap();
        let made = root.path().join("a/b/sock");
        let dir = open_owned_dir(&made).unwrap();
        assert_eq!(dir.path(), made);
        let mode = std::fs::metadata(&made).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        assert!(open_owned_dir(&made).is_ok(), "ours, 0700: accepted again");

        std::fs::set_permissions(&made, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = open_owned_dir(&made).err().unwrap();
        assert!(matches!(err, SecureDirError::Writable { .. }), "{err}");

        let link = root.path().join("link");
        std::os::unix::fs::symlink(root.path().join("a"), &link).unwrap();
        let err = open_owned_dir(&link).err().unwrap();
        assert!(matches!(err, SecureDirError::Symlink(_)), "{err}");
        let err = open_owned_dir(&link.join("b")).err().unwrap();
        assert!(
            matches!(err, SecureDirError::Symlink(_)),
            "a link above: {err}"
        );

        let open = root.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = open_owned_dir(&open.join("sub")).err().unwrap();
        assert!(matches!(err, SecureDirError::Writable { .. }), "{err}");
        assert!(!open.join("sub").exists(), "nothing made below it");
        assert!(matches!(
            open_owned_dir(Path::new("relative/dir")).err().unwrap(),
            SecureDirError::BadName(_)
        ));
    }

    #[test]
    fn a_dir_of_another_uid_is_refused() {
        if !root() {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let theirs = tmp.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
        let err = open_owned_dir(&theirs).err().unwrap();
        assert!(
            matches!(err, SecureDirError::WrongOwner { owner: 65534, .. }),
            "{err}"
        );
        let err = open_owned_dir(&theirs.join("sub")).err().unwrap();
        assert!(
            matches!(err, SecureDirError::WrongOwner { .. }),
            "above: {err}"
        );
    }

    #[test]
    fn a_log_is_opened_only_as_a_regular_file_of_ours() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = open_owned_dir(&tmp.path().join("d")).unwrap();
        let owner = uid();
        let mut f = dir.open_log("ok.log", owner).unwrap();
        std::io::Write::write_all(&mut f, b"line\n").unwrap();
        let p = dir.path().join("ok.log");
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );

        let victim = tmp.path().join("victim");
        std::fs::write(&victim, b"keep\n").unwrap();
        std::os::unix::fs::symlink(&victim, dir.path().join("link.log")).unwrap();
        let err = dir.open_log("link.log", owner).unwrap_err();
        assert!(matches!(err, SecureDirError::Symlink(_)), "{err}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep\n");

        let fifo = dir.path().join("fifo.log");
        nix::unistd::mkfifo(&fifo, Mode::S_IRWXU).unwrap();
        let err = dir.open_log("fifo.log", owner).unwrap_err();
        assert!(
            matches!(err, SecureDirError::NotRegular(_)),
            "no reader: {err}"
        );
        // With a reader the open succeeds, and the file type refuses it.
        let _reader = open(&fifo, OFlag::O_RDONLY | OFlag::O_NONBLOCK, Mode::empty()).unwrap();
        let err = dir.open_log("fifo.log", owner).unwrap_err();
        assert!(
            matches!(err, SecureDirError::NotRegular(_)),
            "a reader: {err}"
        );

        std::fs::create_dir(dir.path().join("dir.log")).unwrap();
        let err = dir.open_log("dir.log", owner).unwrap_err();
        assert!(matches!(err, SecureDirError::NotRegular(_)), "{err}");

        if root() {
            let theirs = dir.path().join("theirs.log");
            std::fs::write(&theirs, b"").unwrap();
            std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
            let err = dir.open_log("theirs.log", owner).unwrap_err();
            assert!(matches!(err, SecureDirError::WrongOwner { .. }), "{err}");
        }
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
