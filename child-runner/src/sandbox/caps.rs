//! Dropping every capability: securebits so root gains nothing at exec,
//! the bounding and ambient sets emptied, then effective, permitted and
//! inheritable zeroed.

/// A capability step failed.
#[derive(Debug, thiserror::Error)]
#[error("capabilities: {op}: {source}")]
pub struct CapsError {
    /// The step.
    pub op: &'static str,
    /// The errno.
    pub source: std::io::Error,
}

fn check(op: &'static str, rc: libc::c_long) -> Result<(), CapsError> {
    if rc < 0 {
        Err(CapsError {
            op,
            source: std::io::Error::last_os_error(),
        })
    } else {
        Ok(())
    }
}

/// CAP_SETGID.
pub const CAP_SETGID: u32 = 6;
/// CAP_SETUID.
pub const CAP_SETUID: u32 = 7;
/// CAP_SETPCAP: needed to lock securebits and empty the bounding set.
pub const CAP_SETPCAP: u32 = 8;
/// CAP_SYS_ADMIN: needed for a network namespace without a user namespace.
pub const CAP_SYS_ADMIN: u32 = 21;
/// `CAP_SYS_RESOURCE`: raise a hard resource limit.
pub const CAP_SYS_RESOURCE: u32 = 24;

/// `struct __user_cap_header_struct`.
#[repr(C)]
struct Header {
    version: u32,
    pid: i32,
}

/// `struct __user_cap_data_struct`; version 3 takes two (capabilities 0–31
/// and 32–63).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Data {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// `_LINUX_CAPABILITY_VERSION_3`.
const VERSION_3: u32 = 0x2008_0522;

/// Whether the calling thread holds `cap` in its effective set (capget(2);
/// a root process in a container may lack some). False when it cannot be
/// read.
pub fn effective_has(cap: u32) -> bool {
    let mut header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: capget writes two data structs, laid out as the kernel's v3
    // ABI, into memory we own for the call's duration, and reads the
    // header.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_capget,
            &mut header as *mut Header,
            data.as_mut_ptr(),
        )
    };
    rc == 0 && cap < 64 && data[(cap / 32) as usize].effective & (1u32 << (cap % 32)) != 0
}

/// The highest capability number the kernel knows.
pub fn last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40)
}

const SECBIT_NOROOT: libc::c_ulong = 1 << 0;
const SECBIT_NOROOT_LOCKED: libc::c_ulong = 1 << 1;
const SECBIT_NO_SETUID_FIXUP: libc::c_ulong = 1 << 2;
const SECBIT_NO_SETUID_FIXUP_LOCKED: libc::c_ulong = 1 << 3;
const SECBIT_KEEP_CAPS_LOCKED: libc::c_ulong = 1 << 5;
const SECBIT_NO_CAP_AMBIENT_RAISE: libc::c_ulong = 1 << 6;
const SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED: libc::c_ulong = 1 << 7;

/// Locks the securebits and empties the bounding set (needs CAP_SETPCAP,
/// so only when `privileged`). The other sets are cleared by
/// [`clear_sets`], after a `run_as` user switch, which still needs
/// CAP_SETUID and CAP_SETGID.
pub fn drop_bounding(privileged: bool, last_cap: u32) -> Result<(), CapsError> {
    if privileged {
        let bits = SECBIT_NOROOT
            | SECBIT_NOROOT_LOCKED
            | SECBIT_NO_SETUID_FIXUP
            | SECBIT_NO_SETUID_FIXUP_LOCKED
            | SECBIT_KEEP_CAPS_LOCKED
            | SECBIT_NO_CAP_AMBIENT_RAISE
            | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED;
        check("PR_SET_SECUREBITS", prctl(libc::PR_SET_SECUREBITS, bits))?;
        for cap in 0..=last_cap {
            check(
                "PR_CAPBSET_DROP",
                prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong),
            )?;
        }
    }
    Ok(())
}

/// Empties the ambient, effective, permitted and inheritable sets.
pub fn clear_sets() -> Result<(), CapsError> {
    check(
        "PR_CAP_AMBIENT_CLEAR_ALL",
        prctl2(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
        ),
    )?;
    let mut header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let data = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: capset reads one header and two data structs, laid out as
    // the kernel's v3 ABI, from memory we own for the call's duration.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &mut header as *mut Header, data.as_ptr()) };
    check("capset", rc)
}

/// Switches to `uid:gid` with no supplementary groups (real, effective
/// and saved ids alike).
pub fn switch_user(uid: u32, gid: u32) -> Result<(), CapsError> {
    let e = |op| {
        move |errno: nix::Error| CapsError {
            op,
            source: errno.into(),
        }
    };
    let gid = nix::unistd::Gid::from_raw(gid);
    let uid = nix::unistd::Uid::from_raw(uid);
    nix::unistd::setgroups(&[]).map_err(e("setgroups"))?;
    nix::unistd::setresgid(gid, gid, gid).map_err(e("setresgid"))?;
    nix::unistd::setresuid(uid, uid, uid).map_err(e("setresuid"))?;
    Ok(())
}

/// Sets no_new_privs: exec can never grant privileges again.
pub fn no_new_privs() -> Result<(), CapsError> {
    check("PR_SET_NO_NEW_PRIVS", prctl(libc::PR_SET_NO_NEW_PRIVS, 1))
}

/// prctl(op, arg, 0, 0, 0).
fn prctl(op: libc::c_int, arg: libc::c_ulong) -> libc::c_long {
    prctl2(op, arg)
}

/// prctl with integer arguments only.
fn prctl2(op: libc::c_int, arg: libc::c_ulong) -> libc::c_long {
    let zero: libc::c_ulong = 0;
    // SAFETY: every prctl used here takes plain integers; no pointer is
    // passed, so no memory of ours is read or written.
    let rc = unsafe { libc::prctl(op, arg, zero, zero, zero) };
    rc as libc::c_long
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn effective_has_agrees_with_the_threads_status_file() {
        let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        let bits = status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .map(|h| u64::from_str_radix(h.trim(), 16).unwrap())
            .unwrap();
        for cap in 0..64 {
            assert_eq!(
                effective_has(cap),
                bits & (1u64 << cap) != 0,
                "capability {cap} (CapEff {bits:x})"
            );
        }
        assert!(!effective_has(64));
    }
}
