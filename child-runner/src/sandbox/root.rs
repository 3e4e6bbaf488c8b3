//! Building the run's root file system from its [`MountPlan`], in the
//! run's own mount namespace (by its init, before the agent is started).
//!
//! Every source is cloned first (`open_tree`), while the host's tree is
//! still in view, and given its attributes (read-only, `noexec`, `nodev`,
//! `nosuid`, idmapped). Then a small tmpfs gets every mount point, made
//! before anything is attached, so that no directory is ever created on a
//! host file system; then the clones are attached in plan order (parents
//! first), the daemon's places inside them are masked, `/proc` is mounted,
//! the tmpfs becomes `/` (`pivot_root`; the host's tree is detached) and is
//! made read-only.

use super::mountapi::{self, Attrs, MountError};
use crate::ioerr;
use policy::sandbox::mounts::{MountPlan, Source};
use std::collections::BTreeMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

/// What stands at one target before the root is put together.
enum Piece {
    Tree { fd: OwnedFd, dir: bool },
    Link(PathBuf),
    Proc,
    Empty,
    Mask,
}

/// A detached source and where it goes.
struct Part {
    target: PathBuf,
    what: Piece,
}

fn not_found(path: &Path) -> MountError {
    MountError {
        op: "the host path is missing",
        path: path.display().to_string(),
        source: std::io::Error::from_raw_os_error(libc::ENOENT),
    }
}

fn host_attrs(writable: bool, exec: bool, device: bool) -> u64 {
    let mut set = libc::MOUNT_ATTR_NOSUID;
    if !writable {
        set |= libc::MOUNT_ATTR_RDONLY;
    }
    if !exec {
        set |= libc::MOUNT_ATTR_NOEXEC;
    }
    if !device {
        set |= libc::MOUNT_ATTR_NODEV;
    }
    set
}

/// Clones every source of `plan`. `owners` holds, per target, the user
/// namespace of its idmapped mount.
fn prepare(
    plan: &MountPlan,
    scratch: BorrowedFd<'_>,
    owners: &BTreeMap<PathBuf, RawFd>,
) -> Result<Vec<Part>, MountError> {
    let mut parts = Vec::new();
    for m in &plan.mounts {
        let what = match &m.source {
            Source::Host {
                writable,
                exec,
                device,
                must_exist,
                keep_link,
                ..
            } => {
                let Ok(meta) = std::fs::symlink_metadata(&m.target) else {
                    if *must_exist {
                        return Err(not_found(&m.target));
                    }
                    continue;
                };
                if *keep_link && meta.file_type().is_symlink() {
                    let to = std::fs::read_link(&m.target).map_err(|source| MountError {
                        op: "readlink",
                        path: m.target.display().to_string(),
                        source,
                    })?;
                    Piece::Link(to)
                } else {
                    let dir = meta.is_dir();
                    // The system's own paths may be links (merged /usr);
                    // any other root is bound only as it was named.
                    let fd = if *keep_link {
                        mountapi::clone_tree(None, &m.target)?
                    } else {
                        mountapi::clone_tree_unlinked(&m.target)?
                    };
                    let attrs = Attrs {
                        set: host_attrs(*writable, *exec, *device),
                        userns: owners.get(&m.target).copied(),
                    };
                    mountapi::set_attrs(fd.as_fd(), attrs, &m.target)?;
                    Piece::Tree { fd, dir }
                }
            }
            Source::Scratch { dir } => Piece::Tree {
                fd: mountapi::clone_tree(Some(scratch), Path::new(dir))?,
                dir: true,
            },
            Source::Proc => Piece::Proc,
            Source::Empty => Piece::Empty,
            Source::Symlink { to } => Piece::Link(to.clone()),
            Source::Mask => match mask_target(&m.target)? {
                Some(piece) => piece,
                None => continue,
            },
        };
        parts.push(Part {
            target: m.target.clone(),
            what,
        });
    }
    Ok(parts)
}

/// What stands at a daemon place to hide: a directory gets a mask, a
/// missing path needs none, anything else (a link put there, which the
/// mount would follow) fails the run.
fn mask_target(target: &Path) -> Result<Option<Piece>, MountError> {
    match std::fs::symlink_metadata(target) {
        Ok(meta) if meta.is_dir() => Ok(Some(Piece::Mask)),
        Ok(_) => Err(MountError {
            op: "a daemon place to hide is not a directory",
            path: target.display().to_string(),
            source: std::io::Error::from_raw_os_error(libc::ENOTDIR),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(MountError {
            op: "lstat of a daemon place to hide",
            path: target.display().to_string(),
            source,
        }),
    }
}

/// `base` joined with the absolute `target`.
fn under(base: &Path, target: &Path) -> PathBuf {
    base.join(target.strip_prefix("/").unwrap_or(target))
}

/// Makes the mount point (or link) of each part inside the fresh tmpfs
/// at `base` (or inside a mask, for the parts beneath it).
fn skeleton<'a>(base: &Path, parts: impl IntoIterator<Item = &'a Part>) -> Result<(), MountError> {
    use std::os::unix::fs::DirBuilderExt;
    for p in parts {
        let at = under(base, &p.target);
        if at == base || std::fs::symlink_metadata(&at).is_ok() {
            continue;
        }
        if let Some(parent) = at.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(parent)
                .map_err(ioerr::at("mkdir", parent))?;
        }
        match &p.what {
            Piece::Tree { dir: false, .. } => {
                std::fs::File::create(&at).map_err(ioerr::at("create", &at))?;
            }
            Piece::Link(to) => {
                std::os::unix::fs::symlink(to, &at).map_err(ioerr::at("symlink", &at))?
            }
            _ => std::fs::DirBuilder::new()
                .mode(0o755)
                .create(&at)
                .map_err(ioerr::at("mkdir", &at))?,
        }
    }
    Ok(())
}

/// The directory the new root is put together in, before it becomes `/`.
const BASES: &[&str] = &["/tmp", "/mnt", "/run"];

/// A mask's tmpfs: room for the mount points beneath it, nothing more.
const MASK_OPTIONS: &str = "mode=0755,size=1m,nr_inodes=4096";

/// Hides what the host holds at `at` under an empty tmpfs that gets the
/// mount points of `beneath` (the parts bound inside it later) and is then
/// made read-only.
fn mask<'a>(
    base: &Path,
    at: &Path,
    beneath: impl IntoIterator<Item = &'a Part>,
) -> Result<(), MountError> {
    let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    mountapi::mount(Some("tmpfs"), at, Some("tmpfs"), flags, Some(MASK_OPTIONS))?;
    skeleton(base, beneath)?;
    let ro = libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | flags;
    mountapi::mount(None, at, None, ro, None)
}

/// Attaches every part at its place under `base`, in order.
fn attach_all(base: &Path, parts: &[Part]) -> Result<(), MountError> {
    for (i, p) in parts.iter().enumerate() {
        let at = under(base, &p.target);
        match &p.what {
            Piece::Tree { fd, .. } => mountapi::attach(fd.as_fd(), &at)?,
            Piece::Proc => mountapi::mount(
                Some("proc"),
                &at,
                Some("proc"),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                None,
            )?,
            Piece::Mask => {
                let later = parts.get(i + 1..).unwrap_or_default();
                let beneath = later
                    .iter()
                    .filter(|q| q.target != p.target && q.target.starts_with(&p.target));
                mask(base, &at, beneath)?;
            }
            Piece::Link(_) | Piece::Empty => {}
        }
    }
    Ok(())
}

/// Builds the run's root from `plan` and makes it the calling process's
/// `/`. Runs in the run's init, in its own mount namespace.
pub fn build(
    plan: &MountPlan,
    scratch: BorrowedFd<'_>,
    owners: &BTreeMap<PathBuf, RawFd>,
) -> Result<(), MountError> {
    if plan.mounts.is_empty() {
        return Err(MountError {
            op: "the run's runner spec has no mount plan",
            path: String::new(),
            source: std::io::Error::from_raw_os_error(libc::EINVAL),
        });
    }
    // Nothing done here reaches the host's mount table.
    mountapi::mount(
        None,
        Path::new("/"),
        None,
        libc::MS_REC | libc::MS_PRIVATE,
        None,
    )?;
    let parts = prepare(plan, scratch, owners)?;
    let base = BASES
        .iter()
        .map(Path::new)
        .find(|b| b.is_dir())
        .ok_or_else(|| not_found(Path::new(BASES[0])))?;
    mountapi::mount(
        Some("tmpfs"),
        base,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some("mode=0755,size=4m,nr_inodes=4096"),
    )?;
    skeleton(base, &parts)?;
    attach_all(base, &parts)?;
    drop(parts);
    mountapi::pivot_into(base)?;
    // A host `/` granted as a root of its own stays as granted.
    if plan.mounts.iter().any(|m| m.target == Path::new("/")) {
        return Ok(());
    }
    mountapi::mount(
        None,
        Path::new("/"),
        None,
        libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV,
        None,
    )
}
