//! The run's scratch file system: one tmpfs of the run's disk budget that
//! holds its temp, artifact and delta dirs (and its `/dev/shm`). The runner
//! makes it before the first attempt and keeps a descriptor on it, so it
//! lasts across attempts; the run sees its directories bound at their
//! paths. When the run has ended (no process of it is left), what it leaves
//! in its artifact and delta dirs is copied to the run folder on disk,
//! reading nothing but regular files and directories, within bounds.

use super::mountapi::{self, MountError};
use std::ffi::{CStr, CString, OsStr};
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// A copy-out step failed.
#[derive(Debug, thiserror::Error)]
#[error("scratch: {op} {path}: {source}")]
pub struct ScratchError {
    /// The step.
    pub op: &'static str,
    /// The path, relative to the scratch or run folder.
    pub path: String,
    /// The errno.
    pub source: std::io::Error,
}

fn serr<'a>(op: &'static str, path: &'a str) -> impl FnOnce(nix::Error) -> ScratchError + 'a {
    move |e| ScratchError {
        op,
        path: path.to_owned(),
        source: e.into(),
    }
}

/// At most this many entries are copied out of one scratch directory.
pub const MAX_ENTRIES: usize = 100_000;
/// Directories deeper than this are not copied out.
pub const MAX_DEPTH: usize = 64;

/// The run's scratch file system.
#[derive(Debug)]
pub struct Scratch {
    root: OwnedFd,
    /// Its size in bytes.
    pub bytes: u64,
}

impl Scratch {
    /// A new scratch file system of `bytes`, with `dirs` made in it owned
    /// by `owner` (uid, gid) and mode 0700; the root stays the runner's.
    pub fn create(bytes: u64, dirs: &[String], owner: (u32, u32)) -> Result<Scratch, MountError> {
        // One inode per 4 KiB of budget, at least 16 Ki: a flood of empty
        // files runs out of inodes, not of the host's memory.
        let inodes = (bytes / 4096).max(16 * 1024);
        let attrs = libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV | libc::MOUNT_ATTR_NOEXEC;
        let root = mountapi::new_tmpfs(
            &[
                ("size", bytes.to_string()),
                ("nr_inodes", inodes.to_string()),
                ("mode", "0755".to_owned()),
            ],
            attrs,
        )?;
        for d in dirs {
            let p = Path::new(d);
            let err = |e: nix::Error| MountError {
                op: "scratch dir",
                path: d.clone(),
                source: e.into(),
            };
            nix::sys::stat::mkdirat(&root, p, nix::sys::stat::Mode::from_bits_truncate(0o700))
                .map_err(err)?;
            nix::unistd::fchownat(
                &root,
                p,
                Some(owner.0.into()),
                Some(owner.1.into()),
                nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
            )
            .map_err(err)?;
        }
        Ok(Scratch { root, bytes })
    }

    /// The detached mount of the whole scratch file system.
    pub fn root(&self) -> BorrowedFd<'_> {
        self.root.as_fd()
    }

    /// A regular file `dir/name` of the scratch, read whole if it is at
    /// most `max` bytes; None when absent, not a regular file or larger.
    /// Never follows a link and never blocks (a FIFO is refused).
    pub fn read_file(&self, dir: &str, name: &str, max: u64) -> Option<Vec<u8>> {
        self.file(dir, name, max).ok()
    }

    /// As [`Scratch::read_file`], saying why a file was not read.
    pub fn file(&self, dir: &str, name: &str, max: u64) -> Result<Vec<u8>, NotRead> {
        let f = self.open_regular(dir, name)?;
        let size = f.metadata().len();
        if size > max {
            return Err(NotRead::TooLarge(size));
        }
        f.read_head(max).map_err(|_| NotRead::Absent)
    }

    /// At most the first `max` bytes of the regular file `dir/name`.
    pub fn head(&self, dir: &str, name: &str, max: u64) -> Result<Vec<u8>, NotRead> {
        let f = self.open_regular(dir, name)?;
        f.read_head(max).map_err(|_| NotRead::Absent)
    }

    /// Opens the regular file `dir/name` the child left (see
    /// [`crate::safefile::open_beneath`]: no link, no blocking).
    fn open_regular(&self, dir: &str, name: &str) -> Result<crate::safefile::Opened, NotRead> {
        use crate::safefile::SafeFileError as E;
        let rel = std::path::Path::new(dir).join(name);
        crate::safefile::open_beneath(self.root.as_fd(), &rel).map_err(|e| match e {
            E::Missing { .. } => NotRead::Absent,
            _ => NotRead::NotRegular,
        })
    }

    /// Copies the scratch directory `dir` into `dest` (an existing
    /// directory of the run folder): regular files and directories only,
    /// at most [`MAX_ENTRIES`] entries, [`MAX_DEPTH`] deep, and at most
    /// `budget` bytes in all (a sparse file counts its full size). Call
    /// only when no process of the run is left. Returns what was copied
    /// and skipped.
    pub fn copy_out(
        &self,
        dir: &str,
        dest: &Path,
        budget: u64,
    ) -> Result<CopyReport, ScratchError> {
        let src = open_dir_at(self.root.as_fd(), OsStr::new(dir)).map_err(serr("open", dir))?;
        let dst = nix::fcntl::open(
            dest,
            nix::fcntl::OFlag::O_DIRECTORY
                | nix::fcntl::OFlag::O_NOFOLLOW
                | nix::fcntl::OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
        .map_err(|e| ScratchError {
            op: "open",
            path: dest.display().to_string(),
            source: e.into(),
        })?;
        let mut report = CopyReport {
            budget,
            ..CopyReport::default()
        };
        copy_dir(src, dst, "", 0, &mut report)?;
        Ok(report)
    }
}

/// Why a file of the scratch was not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotRead {
    /// There is none.
    Absent,
    /// It is a link, a FIFO, a directory, ...
    NotRegular,
    /// It holds more bytes (this many) than asked for.
    TooLarge(u64),
}

/// What a copy-out did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CopyReport {
    /// Regular files copied.
    pub files: u64,
    /// Bytes copied.
    pub bytes: u64,
    /// Entries left out (links, FIFOs, sockets, devices, past a bound),
    /// each as its path and why; at most 20 are named.
    pub skipped: Vec<(String, &'static str)>,
    /// How many were left out in all.
    pub skipped_count: u64,
    /// Bytes that may still be copied.
    pub budget: u64,
}

impl CopyReport {
    fn skip(&mut self, path: &str, why: &'static str) {
        self.skipped_count += 1;
        if self.skipped.len() < 20 {
            self.skipped.push((path.to_owned(), why));
        }
    }
}

fn open_dir_at(dir: BorrowedFd<'_>, name: &OsStr) -> nix::Result<OwnedFd> {
    use nix::fcntl::OFlag;
    nix::fcntl::openat(
        dir,
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
}

fn open_file_at(dir: BorrowedFd<'_>, name: &OsStr) -> nix::Result<OwnedFd> {
    use nix::fcntl::OFlag;
    nix::fcntl::openat(
        dir,
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
}

/// The names in a directory (without `.` and `..`), read through `fd`.
fn names(fd: &OwnedFd) -> nix::Result<Vec<CString>> {
    let dup = nix::unistd::dup(fd)?;
    let mut d = nix::dir::Dir::from_fd(dup)?;
    Ok(d.iter()
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_owned())
        .filter(|n| n.as_bytes() != b"." && n.as_bytes() != b"..")
        .collect())
}

fn copy_dir(
    src: OwnedFd,
    dst: OwnedFd,
    rel: &str,
    depth: usize,
    report: &mut CopyReport,
) -> Result<(), ScratchError> {
    let list = names(&src).map_err(serr("read dir", rel))?;
    for name in list {
        let os = OsStr::from_bytes(name.to_bytes());
        let path = format!("{rel}{}", os.to_string_lossy());
        if report.files + report.skipped_count >= MAX_ENTRIES as u64 {
            report.skip(&path, "over the entry bound");
            continue;
        }
        let st = match nix::sys::stat::fstatat(&src, os, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(_) => continue,
        };
        let kind = st.st_mode & libc::S_IFMT;
        let mode = nix::sys::stat::Mode::from_bits_truncate(st.st_mode & 0o777);
        if kind == libc::S_IFDIR {
            if depth >= MAX_DEPTH {
                report.skip(&path, "deeper than the bound");
                continue;
            }
            let sub = open_dir_at(src.as_fd(), os).map_err(serr("open dir", &path))?;
            nix::sys::stat::mkdirat(&dst, os, mode | nix::sys::stat::Mode::S_IRWXU)
                .map_err(serr("create dir", &path))?;
            let sub_dst = open_dir_at(dst.as_fd(), os).map_err(serr("open dir", &path))?;
            copy_dir(sub, sub_dst, &format!("{path}/"), depth + 1, report)?;
        } else if kind == libc::S_IFREG {
            if st.st_size as u64 > report.budget {
                report.skip(&path, "larger than what is left of the run's disk budget");
                continue;
            }
            let copied = copy_file(src.as_fd(), dst.as_fd(), &name, mode, &path)?;
            report.files += 1;
            report.bytes += copied;
            report.budget = report.budget.saturating_sub(copied);
        } else {
            let what = match kind {
                libc::S_IFLNK => "a symbolic link",
                libc::S_IFIFO => "a FIFO",
                libc::S_IFSOCK => "a socket",
                _ => "a device",
            };
            report.skip(&path, what);
        }
    }
    Ok(())
}

fn copy_file(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    name: &CStr,
    mode: nix::sys::stat::Mode,
    path: &str,
) -> Result<u64, ScratchError> {
    use nix::fcntl::OFlag;
    let os = OsStr::from_bytes(name.to_bytes());
    let from = open_file_at(src, os).map_err(serr("open", path))?;
    let st = nix::sys::stat::fstat(&from).map_err(serr("stat", path))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Ok(0);
    }
    let to = nix::fcntl::openat(
        dst,
        os,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        mode | nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR,
    )
    .map_err(serr("create", path))?;
    let mut from = std::fs::File::from(from);
    let mut to = std::fs::File::from(to);
    // The file cannot grow: no process of the run is left.
    let n = std::io::copy(&mut (&mut from).take(st.st_size as u64), &mut to).map_err(|e| {
        ScratchError {
            op: "copy",
            path: path.to_owned(),
            source: e,
        }
    })?;
    to.flush().map_err(|e| ScratchError {
        op: "write",
        path: path.to_owned(),
        source: e,
    })?;
    let times = [
        nix::sys::time::TimeSpec::new(st.st_atime, st.st_atime_nsec),
        nix::sys::time::TimeSpec::new(st.st_mtime, st.st_mtime_nsec),
    ];
    let _ = nix::sys::stat::futimens(&to, &times[0], &times[1]);
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A scratch with an `artifacts` dir, or None (after SKIPPED) where a
    /// tmpfs cannot be made.
    fn scratch(bytes: u64) -> Option<Scratch> {
        if !crate::sandbox::caps::effective_has(crate::sandbox::caps::CAP_SYS_ADMIN) {
            crate::testsupport::skip("namespaces", "making a tmpfs needs CAP_SYS_ADMIN");
            return None;
        }
        let me = (
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        );
        Some(Scratch::create(bytes, &["artifacts".to_owned()], me).unwrap())
    }

    fn at(s: &Scratch, rel: &str) -> std::path::PathBuf {
        // The detached mount is reachable through its descriptor.
        std::path::PathBuf::from(format!(
            "/proc/self/fd/{}/artifacts/{rel}",
            std::os::fd::AsRawFd::as_raw_fd(&s.root)
        ))
    }

    #[test]
    fn files_and_directories_are_kept_and_nothing_else() {
        let Some(s) = scratch(8 << 20) else { return };
        std::fs::create_dir_all(at(&s, "sub/deeper")).unwrap();
        std::fs::write(at(&s, "a.txt"), "alpha").unwrap();
        std::fs::write(at(&s, "sub/deeper/b.bin"), vec![7u8; 1000]).unwrap();
        std::fs::set_permissions(at(&s, "a.txt"), std::fs::Permissions::from_mode(0o640)).unwrap();
        std::os::unix::fs::symlink("/etc/shadow", at(&s, "link")).unwrap();
        nix::unistd::mkfifo(&at(&s, "fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let dest = tempfile::tempdir().unwrap();
        let r = s.copy_out("artifacts", dest.path(), 1 << 30).unwrap();
        assert_eq!((r.files, r.bytes), (2, 1005));
        assert_eq!(
            std::fs::read_to_string(dest.path().join("a.txt")).unwrap(),
            "alpha"
        );
        let mode = std::fs::metadata(dest.path().join("a.txt"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o640);
        assert_eq!(
            std::fs::read(dest.path().join("sub/deeper/b.bin"))
                .unwrap()
                .len(),
            1000
        );
        assert!(std::fs::symlink_metadata(dest.path().join("link")).is_err());
        assert!(std::fs::symlink_metadata(dest.path().join("fifo")).is_err());
        let mut skipped: Vec<_> = r.skipped.iter().map(|(p, w)| (p.as_str(), *w)).collect();
        skipped.sort();
        assert_eq!(skipped, [("fifo", "a FIFO"), ("link", "a symbolic link")]);
    }

    #[test]
    fn a_sparse_file_past_the_budget_is_left_out() {
        let Some(s) = scratch(8 << 20) else { return };
        let f = std::fs::File::create(at(&s, "sparse")).unwrap();
        f.set_len(1 << 40).unwrap();
        std::fs::write(at(&s, "small"), "x").unwrap();
        let dest = tempfile::tempdir().unwrap();
        let r = s.copy_out("artifacts", dest.path(), 1 << 20).unwrap();
        assert_eq!(r.files, 1);
        assert!(!dest.path().join("sparse").exists());
        assert_eq!(r.skipped_count, 1);
    }

    #[test]
    fn the_scratch_holds_no_more_than_its_size() {
        let Some(s) = scratch(1 << 20) else { return };
        let big = vec![0u8; 2 << 20];
        let e = std::fs::write(at(&s, "big"), &big).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
        assert!(
            s.read_file("artifacts", "big", 4 << 20)
                .map_or(0, |b| b.len())
                <= 1 << 20
        );
        // A FIFO is never waited on; a long file's head is read.
        nix::unistd::mkfifo(&at(&s, "handoff.md"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert!(s.read_file("artifacts", "handoff.md", 1024).is_none());
        assert_eq!(
            s.head("artifacts", "handoff.md", 1024),
            Err(NotRead::NotRegular)
        );
        std::fs::remove_file(at(&s, "big")).unwrap();
        std::fs::write(at(&s, "long"), vec![b'x'; 5000]).unwrap();
        assert_eq!(s.head("artifacts", "long", 1024).map(|b| b.len()), Ok(1024));
        assert_eq!(
            s.file("artifacts", "long", 1024),
            Err(NotRead::TooLarge(5000))
        );
    }
}
