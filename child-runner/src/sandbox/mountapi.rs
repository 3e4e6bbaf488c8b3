//! The kernel's mount calls used to build a run's root: the new mount API
//! (`open_tree`, `move_mount`, `mount_setattr`, `fsopen`/`fsconfig`/
//! `fsmount`) and the few classic ones it does not replace (`mount` for
//! propagation and procfs, `pivot_root`, `umount2`). One small wrapper per
//! call, each with its `// SAFETY:` note and a typed error.

use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// A mount call failed.
#[derive(Debug, thiserror::Error)]
#[error("{op} {path}: {source}")]
pub struct MountError {
    /// The call.
    pub op: &'static str,
    /// The path it was given.
    pub path: String,
    /// The errno.
    pub source: std::io::Error,
}

impl From<crate::ioerr::IoAt> for MountError {
    fn from(e: crate::ioerr::IoAt) -> MountError {
        MountError {
            op: e.op,
            path: e.path.display().to_string(),
            source: e.source,
        }
    }
}

impl MountError {
    /// `op` on `path` refused before any call: `what` holds a NUL byte.
    fn nul(op: &'static str, what: &str) -> MountError {
        MountError {
            op,
            path: what.to_owned(),
            source: std::io::Error::from_raw_os_error(libc::EINVAL),
        }
    }

    /// The error of `op` on `path` from errno.
    pub fn last(op: &'static str, path: impl std::fmt::Display) -> MountError {
        MountError {
            op,
            path: path.to_string(),
            source: std::io::Error::last_os_error(),
        }
    }
}

/// A path as a C string.
pub fn cpath(path: &Path) -> Result<CString, MountError> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| MountError::nul("path", &path.display().to_string()))
}

const EMPTY: &CStr = c"";

fn fd_or_err(rc: libc::c_long, op: &'static str, path: &Path) -> Result<OwnedFd, MountError> {
    if rc < 0 {
        return Err(MountError::last(op, path.display()));
    }
    // SAFETY: the kernel just returned this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(rc as RawFd) })
}

fn ok_or_err(rc: libc::c_long, op: &'static str, path: &Path) -> Result<(), MountError> {
    if rc < 0 {
        Err(MountError::last(op, path.display()))
    } else {
        Ok(())
    }
}

/// A detached copy of the mount tree at `path` (relative to `dir`, or
/// absolute), recursive for a directory: `open_tree(OPEN_TREE_CLONE)`.
/// Symbolic links in `path` are followed.
pub fn clone_tree(dir: Option<BorrowedFd<'_>>, path: &Path) -> Result<OwnedFd, MountError> {
    let c = cpath(path)?;
    let dirfd = dir.map_or(libc::AT_FDCWD, |d| d.as_raw_fd());
    let flags = libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC | libc::AT_RECURSIVE as u32;
    // SAFETY: open_tree reads the NUL-terminated path and returns a new
    // descriptor or -1; no other memory is touched.
    let rc = unsafe { libc::syscall(libc::SYS_open_tree, dirfd, c.as_ptr(), flags) };
    fd_or_err(rc, "open_tree", path)
}

/// As [`clone_tree`] of the absolute `path`, which must contain no
/// symbolic link at all: a host root is bound exactly where it was named
/// when the run was accepted, never where a link put there since leads
/// (`openat2` with `RESOLVE_NO_SYMLINKS`, then `open_tree` of that
/// descriptor). ELOOP when a component is a link.
pub fn clone_tree_unlinked(path: &Path) -> Result<OwnedFd, MountError> {
    use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
    let how = OpenHow::new()
        // No O_NOFOLLOW: with O_PATH it would open a trailing link itself.
        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    let at = nix::fcntl::openat2(nix::fcntl::AT_FDCWD, path, how).map_err(|e| MountError {
        op: "bind (a symbolic link on the way is never followed)",
        path: path.display().to_string(),
        source: e.into(),
    })?;
    let flags = libc::OPEN_TREE_CLONE
        | libc::OPEN_TREE_CLOEXEC
        | libc::AT_RECURSIVE as u32
        | libc::AT_EMPTY_PATH as u32;
    // SAFETY: open_tree of a descriptor we own with the empty path; it
    // returns a new descriptor or -1 and touches no other memory.
    let rc = unsafe { libc::syscall(libc::SYS_open_tree, at.as_raw_fd(), EMPTY.as_ptr(), flags) };
    fd_or_err(rc, "open_tree", path)
}

/// Mount attributes to set on a detached tree.
#[derive(Debug, Clone, Copy, Default)]
pub struct Attrs {
    /// `MOUNT_ATTR_*` flags to set.
    pub set: u64,
    /// The user namespace of an idmapped mount (`MOUNT_ATTR_IDMAP`).
    pub userns: Option<RawFd>,
}

/// Sets `attrs` on every mount of the detached tree `tree`:
/// `mount_setattr(AT_EMPTY_PATH | AT_RECURSIVE)`.
pub fn set_attrs(tree: BorrowedFd<'_>, attrs: Attrs, what: &Path) -> Result<(), MountError> {
    let mut a: libc::mount_attr = libc::mount_attr {
        attr_set: attrs.set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    if let Some(ns) = attrs.userns {
        a.attr_set |= libc::MOUNT_ATTR_IDMAP;
        a.userns_fd = ns as u64;
    }
    let flags = libc::AT_EMPTY_PATH | libc::AT_RECURSIVE;
    // SAFETY: mount_setattr reads the empty path and `a` (its size given),
    // both alive for the call; it changes only the tree's mounts.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            EMPTY.as_ptr(),
            flags,
            &a as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    ok_or_err(rc, "mount_setattr", what)
}

/// Attaches the detached tree `tree` at `target` (absolute):
/// `move_mount(MOVE_MOUNT_F_EMPTY_PATH)`.
pub fn attach(tree: BorrowedFd<'_>, target: &Path) -> Result<(), MountError> {
    let c = cpath(target)?;
    // SAFETY: move_mount reads two NUL-terminated paths alive for the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            EMPTY.as_ptr(),
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    ok_or_err(rc, "move_mount", target)
}

fn fsconfig(
    fs: &OwnedFd,
    cmd: libc::c_uint,
    key: Option<&CStr>,
    value: Option<&CStr>,
) -> libc::c_long {
    // SAFETY: fsconfig reads the optional NUL-terminated key and value,
    // alive for the call; the aux argument is unused by these commands.
    unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            cmd,
            key.map_or(std::ptr::null(), CStr::as_ptr),
            value.map_or(std::ptr::null(), CStr::as_ptr),
            0,
        )
    }
}

/// A new, detached tmpfs with `options` (key, value) and mount attributes
/// `attrs`: `fsopen` + `fsconfig` + `fsmount`.
pub fn new_tmpfs(options: &[(&str, String)], attrs: u64) -> Result<OwnedFd, MountError> {
    let what = Path::new("tmpfs");
    // SAFETY: fsopen reads the NUL-terminated file system name.
    let rc = unsafe { libc::syscall(libc::SYS_fsopen, c"tmpfs".as_ptr(), libc::FSOPEN_CLOEXEC) };
    let fs = fd_or_err(rc, "fsopen", what)?;
    for (k, v) in options {
        let key = CString::new(*k).map_err(|_| MountError::nul("fsconfig", k))?;
        let value = CString::new(v.as_str()).map_err(|_| MountError::nul("fsconfig", v))?;
        let rc = fsconfig(&fs, libc::FSCONFIG_SET_STRING, Some(&key), Some(&value));
        ok_or_err(rc, "fsconfig", Path::new(k))?;
    }
    ok_or_err(
        fsconfig(&fs, libc::FSCONFIG_CMD_CREATE, None, None),
        "fsconfig create",
        what,
    )?;
    // SAFETY: fsmount takes the configured context and plain flags and
    // returns a new descriptor or -1.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_fsmount,
            fs.as_raw_fd(),
            libc::FSMOUNT_CLOEXEC,
            attrs as libc::c_uint,
        )
    };
    fd_or_err(rc, "fsmount", what)
}

/// `mount(2)` with optional source, file system type and data.
pub fn mount(
    source: Option<&str>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> Result<(), MountError> {
    let t = cpath(target)?;
    let cs = |s: Option<&str>| {
        s.map(|s| CString::new(s).map_err(|_| MountError::nul("mount", s)))
            .transpose()
    };
    let (src, ty, d) = (cs(source)?, cs(fstype)?, cs(data)?);
    let p = |c: &Option<CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: every pointer is null or a NUL-terminated string alive for
    // the call.
    let rc = unsafe { libc::mount(p(&src), t.as_ptr(), p(&ty), flags, p(&d).cast()) };
    ok_or_err(rc as libc::c_long, "mount", target)
}

/// Makes `dir` the root: `pivot_root(".", ".")` from inside it, then the old
/// root (stacked beneath) is detached.
pub fn pivot_into(dir: &Path) -> Result<(), MountError> {
    nix::unistd::chdir(dir).map_err(|e| MountError {
        op: "chdir",
        path: dir.display().to_string(),
        source: e.into(),
    })?;
    // SAFETY: pivot_root reads two NUL-terminated paths alive for the call.
    let rc = unsafe { libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) };
    ok_or_err(rc, "pivot_root", dir)?;
    // SAFETY: umount2 reads a NUL-terminated path alive for the call.
    let rc = unsafe { libc::umount2(c".".as_ptr(), libc::MNT_DETACH) };
    ok_or_err(rc as libc::c_long, "umount2 the old root", dir)?;
    nix::unistd::chdir("/").map_err(|e| MountError {
        op: "chdir",
        path: "/".into(),
        source: e.into(),
    })
}
