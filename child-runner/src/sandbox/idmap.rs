//! User namespaces that describe an idmapped mount: one host owner (uid
//! and gid) seen as the run's uid and gid. A helper process makes the
//! namespace and waits; the runner writes its maps, keeps a descriptor on
//! it and lets the helper go. Nothing ever runs inside the namespace.

use nix::sys::wait::waitpid;
use nix::unistd::{fork, ForkResult};
use std::io::Write;
use std::os::fd::OwnedFd;

/// The namespace could not be made.
#[derive(Debug, thiserror::Error)]
#[error("idmap {owner}->{uid}: {op}: {source}")]
pub struct IdmapError {
    /// The host uid mapped.
    pub owner: u32,
    /// The run's uid.
    pub uid: u32,
    /// The step.
    pub op: &'static str,
    /// The errno.
    pub source: std::io::Error,
}

/// One mapping: the owner of some host files and the ids the run sees
/// them as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Mapping {
    /// The files' owner uid.
    pub owner_uid: u32,
    /// The files' owner gid.
    pub owner_gid: u32,
    /// The run's uid.
    pub uid: u32,
    /// The run's gid.
    pub gid: u32,
}

/// A descriptor on a new user namespace mapping `m.owner_uid` (inside) to
/// `m.uid` (outside), the same for gids: the shape `mount_setattr` wants
/// for an idmapped mount on which the owner's files belong to the run.
/// Blocking (a helper process lives for the call).
pub fn userns(m: Mapping) -> Result<OwnedFd, IdmapError> {
    let err = |op: &'static str, source: std::io::Error| IdmapError {
        owner: m.owner_uid,
        uid: m.uid,
        op,
        source,
    };
    let (ready_r, ready_w) = nix::unistd::pipe().map_err(|e| err("pipe", e.into()))?;
    let (go_r, go_w) = nix::unistd::pipe().map_err(|e| err("pipe", e.into()))?;
    // SAFETY: the runner is single-threaded, so the child may run Rust code
    // until it exits; it only unshares, writes one byte and waits.
    match unsafe { fork() }.map_err(|e| err("fork", e.into()))? {
        ForkResult::Child => {
            drop(ready_r);
            drop(go_w);
            let ok = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER).is_ok();
            let _ = nix::unistd::write(&ready_w, &[u8::from(ok)]);
            let mut b = [0u8; 1];
            let _ = nix::unistd::read(&go_r, &mut b);
            // SAFETY: _exit ends the helper without running the parent's
            // destructors or atexit handlers twice.
            unsafe { libc::_exit(0) }
        }
        ForkResult::Parent { child } => {
            drop(ready_w);
            drop(go_r);
            let result = (|| {
                let mut b = [0u8; 1];
                match nix::unistd::read(&ready_r, &mut b) {
                    Ok(1) if b[0] == 1 => {}
                    _ => {
                        return Err(err(
                            "unshare(CLONE_NEWUSER)",
                            std::io::Error::from_raw_os_error(libc::EPERM),
                        ))
                    }
                }
                let proc = format!("/proc/{child}");
                write_map(&format!("{proc}/uid_map"), m.owner_uid, m.uid)
                    .map_err(|e| err("uid_map", e))?;
                write_map(&format!("{proc}/gid_map"), m.owner_gid, m.gid)
                    .map_err(|e| err("gid_map", e))?;
                std::fs::File::open(format!("{proc}/ns/user"))
                    .map(OwnedFd::from)
                    .map_err(|e| err("open ns/user", e))
            })();
            drop(go_w);
            let _ = waitpid(child, None);
            result
        }
    }
}

fn write_map(path: &str, inside: u32, outside: u32) -> std::io::Result<()> {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)?
        .write_all(format!("{inside} {outside} 1\n").as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn the_namespace_maps_the_owner_to_the_run() {
        if !crate::sandbox::caps::effective_has(crate::sandbox::caps::CAP_SETUID) {
            crate::testsupport::skip("idmap", "mapping another uid needs CAP_SETUID");
            return;
        }
        let fd = userns(Mapping {
            owner_uid: 0,
            owner_gid: 0,
            uid: 1_600_000_123,
            gid: 1_600_000_124,
        })
        .unwrap();
        // The namespace outlives its helper; its maps read back through
        // a process that joins it would show them. Here: it is a user
        // namespace, and not ours.
        let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
        assert!(
            link.display().to_string().starts_with("user:["),
            "{}",
            link.display()
        );
        assert_ne!(link, std::fs::read_link("/proc/self/ns/user").unwrap());
    }
}
