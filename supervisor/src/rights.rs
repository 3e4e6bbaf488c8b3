//! Checking what a requester may reach, with its own credentials: a root
//! daemon takes the requester's groups, fsgid and fsuid on a thread made
//! for the one check (the raw syscalls act on the calling thread alone) and
//! asks the kernel, `faccessat2(AT_EACCESS)`, for each path and right. The
//! thread drops every capability and ends with the check: its credentials
//! never serve other work.

use policy::rights::{Need, Requester};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use subagent_runner::sandbox::caps;

/// `CAP_DAC_OVERRIDE`: would pass every permission check.
const CAP_DAC_OVERRIDE: u32 = 1;
/// `CAP_DAC_READ_SEARCH`: would pass every read and search check.
const CAP_DAC_READ_SEARCH: u32 = 2;

/// A right the requester lacks, or a check that could not be made.
#[derive(Debug, thiserror::Error)]
pub enum RightsError {
    /// The kernel refused the right to the requester.
    #[error("uid {uid} (who asked for the run) may not {right} {}: {source}", path.display())]
    Denied {
        /// The spawn field that named the path.
        field: String,
        /// The path.
        path: PathBuf,
        /// The requester's uid.
        uid: u32,
        /// The right (`read`, `write`, `execute`).
        right: &'static str,
        /// What the kernel said.
        source: std::io::Error,
    },
    /// A writable root that is not the requester's own.
    #[error(
        "{} is owned by {owner}:{group}, not by uid {uid} (who asked for the run) with one of its groups; a writable root is bound as its owner's, so only the requester's own directories may be written",
        path.display()
    )]
    NotOwner {
        /// The spawn field that named the path.
        field: String,
        /// The path.
        path: PathBuf,
        /// The requester's uid.
        uid: u32,
        /// The path's owner.
        owner: u32,
        /// The path's group.
        group: u32,
    },
    /// A non-root daemon cannot take another uid's credentials.
    #[error("the daemon runs as uid {daemon}, not root, so it cannot check what uid {uid} may reach; runs asked for by another uid are refused")]
    Unprivileged {
        /// The daemon's uid.
        daemon: u32,
        /// The requester's uid.
        uid: u32,
    },
    /// Taking the requester's credentials failed.
    #[error("taking the credentials of uid {uid}: {op}: {source}")]
    Switch {
        /// The requester's uid.
        uid: u32,
        /// The step.
        op: &'static str,
        /// What the kernel said.
        source: std::io::Error,
    },
    /// The check's thread could not be started, or panicked.
    #[error("the thread that checks a requester's rights: {0}")]
    Thread(std::io::Error),
}

impl RightsError {
    /// The spawn field a refusal is about (`None`: the check itself failed).
    pub fn field(&self) -> Option<&str> {
        match self {
            RightsError::Denied { field, .. } | RightsError::NotOwner { field, .. } => Some(field),
            _ => None,
        }
    }
}

/// Checks every need as `who`; the first one it lacks is the error.
/// Blocking (waits for the check's own thread).
pub fn check(who: &Requester, needs: &[Need]) -> Result<(), RightsError> {
    if needs.is_empty() {
        return Ok(());
    }
    let daemon = nix::unistd::geteuid().as_raw();
    if daemon != 0 {
        return Err(RightsError::Unprivileged {
            daemon,
            uid: who.uid,
        });
    }
    let (who, needs) = (who.clone(), needs.to_vec());
    std::thread::Builder::new()
        .name("rights-check".into())
        .spawn(move || as_requester(&who, &needs))
        .map_err(RightsError::Thread)?
        .join()
        .unwrap_or_else(|_| {
            Err(RightsError::Thread(std::io::Error::other(
                "the check panicked",
            )))
        })
}

/// On a thread of its own: takes `who`'s credentials, then checks.
fn as_requester(who: &Requester, needs: &[Need]) -> Result<(), RightsError> {
    take_credentials(who)?;
    needs.iter().try_for_each(|n| check_one(who, n))
}

fn switch_error(who: &Requester, op: &'static str) -> impl Fn(std::io::Error) -> RightsError {
    let uid = who.uid;
    move |source| RightsError::Switch { uid, op, source }
}

/// This thread's supplementary groups, fsgid and fsuid become `who`'s,
/// then it lets go of every capability (capset acts on the calling thread
/// alone), so no DAC override survives whatever the securebits say.
fn take_credentials(who: &Requester) -> Result<(), RightsError> {
    let mut groups = vec![who.gid];
    groups.extend(who.groups.iter().copied().filter(|g| *g != who.gid));
    thread_setgroups(&groups).map_err(switch_error(who, "setgroups"))?;
    thread_setfs(libc::SYS_setfsgid, who.gid).map_err(switch_error(who, "setfsgid"))?;
    thread_setfs(libc::SYS_setfsuid, who.uid).map_err(switch_error(who, "setfsuid"))?;
    caps::clear_sets().map_err(|e| switch_error(who, "capset")(e.source))?;
    if caps::effective_has(CAP_DAC_OVERRIDE) || caps::effective_has(CAP_DAC_READ_SEARCH) {
        return Err(switch_error(who, "capset")(std::io::Error::other(
            "the DAC capabilities are still held",
        )));
    }
    Ok(())
}

/// `setgroups` for the calling thread only (glibc's wrapper would change
/// every thread of the daemon).
fn thread_setgroups(groups: &[libc::gid_t]) -> std::io::Result<()> {
    // SAFETY: the pointer and length describe a live slice of gid_t that
    // the kernel only reads; the raw syscall touches this thread's
    // credentials alone.
    let rc = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `setfsuid` or `setfsgid` (`nr`) to `id` for the calling thread; they
/// report no error, so the id is read back (`-1` changes nothing).
fn thread_setfs(nr: libc::c_long, id: u32) -> std::io::Result<()> {
    // SAFETY: both take one id by value and touch no memory; the raw
    // syscall changes this thread's credentials alone.
    let now = unsafe {
        libc::syscall(nr, id);
        libc::syscall(nr, u32::MAX)
    };
    if now != libc::c_long::from(id) {
        return Err(std::io::Error::from_raw_os_error(libc::EPERM));
    }
    Ok(())
}

/// `faccessat2(AT_FDCWD, path, mode, AT_EACCESS)`: the calling thread's
/// fsuid, fsgid and groups decide (glibc's fallback would compare modes
/// by hand with the effective ids).
fn access_as_thread(path: &CString, mode: i32) -> std::io::Result<()> {
    // SAFETY: `path` is a live NUL-terminated string the kernel only reads.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_faccessat2,
            libc::AT_FDCWD,
            path.as_ptr(),
            mode,
            libc::AT_EACCESS,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// One need, with this thread's (the requester's) credentials.
fn check_one(who: &Requester, n: &Need) -> Result<(), RightsError> {
    let denied = |source| RightsError::Denied {
        field: n.field.clone(),
        path: n.path.clone(),
        uid: who.uid,
        right: n.right.as_str(),
        source,
    };
    // Reached as the requester: every directory on the way needs its
    // search right.
    let meta = std::fs::metadata(&n.path).map_err(denied)?;
    let Some(mode) = n.right.mode(meta.is_dir()) else {
        if who.owns(meta.uid(), meta.gid()) {
            return Ok(());
        }
        return Err(RightsError::NotOwner {
            field: n.field.clone(),
            path: n.path.clone(),
            uid: who.uid,
            owner: meta.uid(),
            group: meta.gid(),
        });
    };
    let c = CString::new(n.path.as_os_str().as_bytes())
        .map_err(|_| denied(std::io::Error::from_raw_os_error(libc::EINVAL)))?;
    access_as_thread(&c, mode).map_err(denied)
}

#[cfg(test)]
mod tests {
    use super::*;
    use policy::rights::Right;
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;

    fn need(path: &Path, right: Right) -> Need {
        Need {
            field: "sandbox.read_paths[0]".into(),
            path: path.to_path_buf(),
            right,
        }
    }

    fn nobody() -> Requester {
        Requester {
            uid: 65534,
            gid: 65534,
            groups: vec![],
        }
    }

    #[test]
    fn nothing_to_check_needs_no_privilege() {
        assert!(check(&nobody(), &[]).is_ok());
    }

    #[test]
    fn the_requesters_credentials_decide_and_stay_on_their_thread() {
        if !nix::unistd::geteuid().is_root() {
            let e = check(&nobody(), &[need(Path::new("/"), Right::Read)]).unwrap_err();
            assert!(matches!(e, RightsError::Unprivileged { .. }), "{e}");
            assert!(e.field().is_none());
            return;
        }
        let dir = tempfile::tempdir_in("/tmp").unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "x").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        let open = dir.path().join("open");
        std::fs::write(&open, "x").unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(check(&nobody(), &[need(&open, Right::Read)]).is_ok());
        let e = check(&nobody(), &[need(&secret, Right::Read)]).unwrap_err();
        assert!(
            matches!(&e, RightsError::Denied { right: "read", path, .. } if *path == secret),
            "{e}"
        );
        assert_eq!(e.field(), Some("sandbox.read_paths[0]"));
        let e = check(&nobody(), &[need(&open, Right::Write)]).unwrap_err();
        assert!(
            matches!(e, RightsError::Denied { right: "write", .. }),
            "{e}"
        );
        let e = check(&nobody(), &[need(dir.path(), Right::Own)]).unwrap_err();
        assert!(matches!(e, RightsError::NotOwner { owner: 0, .. }), "{e}");
        // This thread kept root's view and its capabilities.
        assert!(std::fs::read(&secret).is_ok());
        assert!(caps::effective_has(CAP_DAC_OVERRIDE));
        assert_eq!(
            // SAFETY: -1 reads the fsuid without changing it.
            unsafe { libc::syscall(libc::SYS_setfsuid, u32::MAX) },
            0
        );
    }
}
