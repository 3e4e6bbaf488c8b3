//! Reading a file a child controls. Whatever lies in a place a child can
//! write (the project, the run's artifact and delta dirs, a repository's
//! `.git`) may be a symlink to a host file, a FIFO that blocks an open
//! forever, or an endless device. So a file is opened without following a
//! symlink and without blocking (`O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC`),
//! the opened descriptor must be a regular file, and at most the caller's
//! bound is read (more is an error where the caller needs the whole file).
//!
//! [`open_beneath`] goes further for a path of several components: it is
//! resolved from a directory descriptor with `openat2` and
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`, so no
//! component may be a symlink or lead out of that directory.

use nix::errno::Errno;
use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use std::ffi::OsString;
use std::fs::{File, Metadata};
use std::io::Read;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// Why a child-controlled file was not read.
#[derive(Debug, thiserror::Error)]
pub enum SafeFileError {
    /// Nothing is there.
    #[error("{path} does not exist")]
    Missing {
        /// The file.
        path: String,
    },
    /// The file, or a component on the way to it, is a symbolic link.
    #[error(
        "{path} is or passes through a symbolic link, not a regular file (links are not followed)"
    )]
    Symlink {
        /// The file.
        path: String,
    },
    /// The path leads out of the directory it is resolved from.
    #[error("{path} leads out of the directory it is read from")]
    Escapes {
        /// The file.
        path: String,
    },
    /// The file is a directory, a FIFO, a device or a socket.
    #[error("{path} is {kind}, not a regular file")]
    NotRegular {
        /// The file.
        path: String,
        /// What it is instead ("a FIFO", "a directory", ...).
        kind: &'static str,
    },
    /// A directory was expected.
    #[error("{path} is not a directory")]
    NotADirectory {
        /// The path.
        path: String,
    },
    /// The file holds more than the caller's bound.
    #[error("{path} is over the limit of {limit} bytes")]
    TooLarge {
        /// The file.
        path: String,
        /// The bound.
        limit: u64,
    },
    /// Another failure of a system call.
    #[error("{op} {path}: {source}")]
    Io {
        /// The operation.
        op: &'static str,
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
}

impl SafeFileError {
    /// Whether the file is simply not there.
    pub fn is_missing(&self) -> bool {
        matches!(self, SafeFileError::Missing { .. })
    }
}

fn shown(path: &Path) -> String {
    path.display().to_string()
}

/// The error of a failed open of `path`.
fn open_error(path: &Path, e: std::io::Error) -> SafeFileError {
    let path = shown(path);
    match e.raw_os_error().map(Errno::from_raw) {
        Some(Errno::ENOENT) => SafeFileError::Missing { path },
        Some(Errno::ELOOP) => SafeFileError::Symlink { path },
        Some(Errno::EXDEV) => SafeFileError::Escapes { path },
        // A socket cannot be opened: say what it is.
        Some(Errno::ENXIO) => SafeFileError::NotRegular {
            path,
            kind: "a socket",
        },
        _ => SafeFileError::Io {
            op: "open",
            path,
            source: e,
        },
    }
}

/// What a file that is not regular is, for the message.
fn kind_of(m: &Metadata) -> &'static str {
    let t = m.file_type();
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() || t.is_block_device() {
        "a device"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_symlink() {
        "a symbolic link"
    } else {
        "not a regular file"
    }
}

/// A regular file opened for reading, with its metadata from the same
/// descriptor.
#[derive(Debug)]
pub struct Opened {
    file: File,
    meta: Metadata,
    path: String,
}

impl Opened {
    /// Checks that `file` (just opened from `path`) is a regular file.
    fn check(file: File, path: &Path) -> Result<Opened, SafeFileError> {
        let meta = file.metadata().map_err(|source| SafeFileError::Io {
            op: "stat",
            path: shown(path),
            source,
        })?;
        if !meta.is_file() {
            return Err(SafeFileError::NotRegular {
                path: shown(path),
                kind: kind_of(&meta),
            });
        }
        Ok(Opened {
            file,
            meta,
            path: shown(path),
        })
    }

    /// The opened file itself (to hand on, e.g. as a child's stdin).
    pub fn into_file(self) -> File {
        self.file
    }

    /// Its metadata (fstat of the opened descriptor).
    pub fn metadata(&self) -> &Metadata {
        &self.meta
    }

    /// The whole file, or [`SafeFileError::TooLarge`] when it holds more
    /// than `max` bytes (it may have grown since it was opened).
    pub fn read_all(mut self, max: u64) -> Result<Vec<u8>, SafeFileError> {
        let too_large = |path: String| SafeFileError::TooLarge { path, limit: max };
        if self.meta.len() > max {
            return Err(too_large(self.path));
        }
        let buf = self.read_up_to(max.saturating_add(1))?;
        if buf.len() as u64 > max {
            return Err(too_large(self.path));
        }
        Ok(buf)
    }

    /// At most the last `max` bytes (a log's end is what the caller needs).
    pub fn read_end(mut self, max: u64) -> Result<Vec<u8>, SafeFileError> {
        use std::io::{Seek, SeekFrom};
        let start = self.meta.len().saturating_sub(max);
        self.file
            .seek(SeekFrom::Start(start))
            .map_err(|source| SafeFileError::Io {
                op: "seek",
                path: self.path.clone(),
                source,
            })?;
        self.read_up_to(max)
    }

    /// At most the first `max` bytes (a prefix is all the caller needs).
    pub fn read_head(mut self, max: u64) -> Result<Vec<u8>, SafeFileError> {
        self.read_up_to(max)
    }

    fn read_up_to(&mut self, n: u64) -> Result<Vec<u8>, SafeFileError> {
        let cap = usize::try_from(self.meta.len().min(n)).unwrap_or(0);
        let mut buf = Vec::with_capacity(cap);
        (&mut self.file)
            .take(n)
            .read_to_end(&mut buf)
            .map_err(|source| SafeFileError::Io {
                op: "read",
                path: self.path.clone(),
                source,
            })?;
        Ok(buf)
    }
}

/// Opens `path` for reading without following a symlink in its last
/// component and without blocking; it must be a regular file.
pub fn open(path: &Path) -> Result<Opened, SafeFileError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| open_error(path, e))?;
    Opened::check(file, path)
}

/// At most the last `max` bytes of the regular file at `path` (see
/// [`open`]).
pub fn read_tail(path: &Path, max: u64) -> Result<Vec<u8>, SafeFileError> {
    open(path)?.read_end(max)
}

/// The whole of the regular file at `path` (see [`open`]), at most `max`
/// bytes.
pub fn read(path: &Path, max: u64) -> Result<Vec<u8>, SafeFileError> {
    open(path)?.read_all(max)
}

/// `openat2` of `rel` with `flags`, from `dir` (`None`: the working
/// directory), refusing every symlink on the way; beneath `dir` only when
/// `beneath`.
fn openat2_strict(
    dir: Option<BorrowedFd<'_>>,
    rel: &Path,
    flags: OFlag,
    beneath: bool,
) -> Result<OwnedFd, SafeFileError> {
    let mut resolve = ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_MAGICLINKS;
    if beneath {
        resolve |= ResolveFlag::RESOLVE_BENEATH;
    }
    let how = OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC | OFlag::O_NOCTTY)
        .resolve(resolve);
    openat2(dir.unwrap_or(nix::fcntl::AT_FDCWD), rel, how)
        .map_err(|e| open_error(rel, std::io::Error::from(e)))
}

/// Opens `rel` beneath the directory `root` for reading: no component may
/// be a symlink or lead out of `root`, the open does not block, and the
/// file must be regular.
pub fn open_beneath(root: BorrowedFd<'_>, rel: &Path) -> Result<Opened, SafeFileError> {
    let fd = openat2_strict(Some(root), rel, OFlag::O_RDONLY | OFlag::O_NONBLOCK, true)?;
    Opened::check(File::from(fd), rel)
}

/// The whole of the regular file `rel` beneath `root` (see
/// [`open_beneath`]), at most `max` bytes.
pub fn read_beneath(root: BorrowedFd<'_>, rel: &Path, max: u64) -> Result<Vec<u8>, SafeFileError> {
    open_beneath(root, rel)?.read_all(max)
}

/// Opens the absolute `path`, which must contain no symlink at all (a
/// canonical path: a link there now was put there since), for reading
/// without blocking; it must be a regular file.
pub fn open_unlinked(path: &Path) -> Result<Opened, SafeFileError> {
    let fd = openat2_strict(None, path, OFlag::O_RDONLY | OFlag::O_NONBLOCK, false)?;
    Opened::check(File::from(fd), path)
}

/// Opens the directory `path`, not following a symlink in its last
/// component.
pub fn open_dir(path: &Path) -> Result<OwnedFd, SafeFileError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_DIRECTORY)
        .open(path)
        .map_err(|e| dir_error(path, e))?;
    Ok(OwnedFd::from(file))
}

/// Opens the directory `path` the caller chose (a link to it is
/// followed), for the `*_beneath` functions.
pub fn open_root(path: &Path) -> Result<OwnedFd, SafeFileError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(path)
        .map_err(|e| dir_error(path, e))?;
    Ok(OwnedFd::from(file))
}

/// The names in the directory `dir` (neither `.` nor `..`), at most `max`
/// of them, and whether there were more.
pub fn names(dir: BorrowedFd<'_>, max: usize) -> Result<(Vec<OsString>, bool), SafeFileError> {
    // A description of its own: reading moves the offset.
    let fd = openat2_strict(
        Some(dir),
        Path::new("."),
        OFlag::O_RDONLY | OFlag::O_DIRECTORY,
        true,
    )?;
    let io = |e: Errno| SafeFileError::Io {
        op: "list",
        path: ".".into(),
        source: std::io::Error::from(e),
    };
    let mut d = nix::dir::Dir::from_fd(fd).map_err(io)?;
    let mut out = Vec::new();
    for ent in d.iter() {
        let name = ent.map_err(io)?.file_name().to_bytes().to_vec();
        if name == b"." || name == b".." {
            continue;
        }
        if out.len() == max {
            return Ok((out, true));
        }
        out.push(OsString::from_vec(name));
    }
    Ok((out, false))
}

/// Opens the directory `rel` beneath the directory `root` (no symlink on
/// the way, never out of `root`).
pub fn open_dir_beneath(root: BorrowedFd<'_>, rel: &Path) -> Result<OwnedFd, SafeFileError> {
    openat2_strict(Some(root), rel, OFlag::O_RDONLY | OFlag::O_DIRECTORY, true).map_err(|e| match e
    {
        SafeFileError::Io { source, path, .. } if source.raw_os_error() == Some(libc::ENOTDIR) => {
            SafeFileError::NotADirectory { path }
        }
        other => other,
    })
}

fn dir_error(path: &Path, e: std::io::Error) -> SafeFileError {
    if e.raw_os_error() != Some(libc::ENOTDIR) {
        return open_error(path, e);
    }
    // O_NOFOLLOW | O_DIRECTORY on a symlink says ENOTDIR too.
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
        return SafeFileError::Symlink { path: shown(path) };
    }
    SafeFileError::NotADirectory { path: shown(path) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::time::{Duration, Instant};

    fn fifo(p: &Path) {
        nix::unistd::mkfifo(p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    }

    #[test]
    fn a_regular_file_is_read_whole_or_refused_as_too_large() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("f");
        std::fs::write(&f, b"hello").unwrap();
        assert_eq!(read(&f, 5).unwrap(), b"hello");
        let e = read(&f, 4).unwrap_err();
        assert!(matches!(e, SafeFileError::TooLarge { limit: 4, .. }), "{e}");
        assert!(e.to_string().contains("over the limit of 4 bytes"), "{e}");
        assert_eq!(open(&f).unwrap().read_head(2).unwrap(), b"he");
        assert!(read(&d.path().join("none"), 9).unwrap_err().is_missing());
    }

    #[test]
    fn links_fifos_devices_and_directories_are_refused_without_blocking() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path();
        std::os::unix::fs::symlink("/dev/zero", p.join("zero")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", p.join("passwd")).unwrap();
        fifo(&p.join("fifo"));
        std::fs::create_dir(p.join("dir")).unwrap();
        let started = Instant::now();
        for (name, want) in [
            ("zero", "symbolic link"),
            ("passwd", "symbolic link"),
            ("fifo", "is a FIFO, not a regular file"),
            ("dir", "is a directory, not a regular file"),
        ] {
            let e = read(&p.join(name), 1 << 20).unwrap_err();
            assert!(e.to_string().contains(want), "{name}: {e}");
        }
        let e = read(Path::new("/dev/zero"), 1 << 20).unwrap_err();
        assert!(e.to_string().contains("a device"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn beneath_refuses_every_link_and_every_way_out() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path();
        std::fs::create_dir(p.join("sub")).unwrap();
        std::fs::write(p.join("sub/ok.md"), b"fine").unwrap();
        std::os::unix::fs::symlink("sub", p.join("linkdir")).unwrap();
        std::os::unix::fs::symlink("ok.md", p.join("sub/rel-link.md")).unwrap();
        fifo(&p.join("sub/fifo.md"));
        let root = open_dir(p).unwrap();
        let r = root.as_fd();
        assert_eq!(
            read_beneath(r, Path::new("sub/ok.md"), 10).unwrap(),
            b"fine"
        );
        for (rel, want) in [
            ("linkdir/ok.md", "symbolic link"),
            ("sub/rel-link.md", "symbolic link"),
            ("../x", "leads out"),
            ("/etc/passwd", "leads out"),
            ("sub/fifo.md", "a FIFO"),
            ("sub", "a directory"),
        ] {
            let e = read_beneath(r, Path::new(rel), 10).unwrap_err();
            assert!(e.to_string().contains(want), "{rel}: {e}");
        }
        assert!(open_dir_beneath(r, Path::new("sub")).is_ok());
        let e = open_dir_beneath(r, Path::new("linkdir")).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        let e = open_dir_beneath(r, Path::new("sub/ok.md")).unwrap_err();
        assert!(e.to_string().contains("not a directory"), "{e}");
        assert!(open_dir(&p.join("linkdir")).is_err());
        assert!(
            open_root(&p.join("linkdir")).is_ok(),
            "the caller's own link"
        );
        let (mut all, more) = names(r, 10).unwrap();
        all.sort();
        assert_eq!(all, ["linkdir", "sub"].map(OsString::from));
        assert!(!more);
        let (two, more) = names(r, 1).unwrap();
        assert_eq!((two.len(), more), (1, true));
    }

    #[test]
    fn unlinked_refuses_a_link_anywhere_on_the_path() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().canonicalize().unwrap();
        std::fs::create_dir(p.join("real")).unwrap();
        std::fs::write(p.join("real/f"), b"x").unwrap();
        std::os::unix::fs::symlink("real", p.join("link")).unwrap();
        assert!(open_unlinked(&p.join("real/f")).is_ok());
        let e = open_unlinked(&p.join("link/f")).unwrap_err();
        assert!(matches!(e, SafeFileError::Symlink { .. }), "{e}");
    }
}
