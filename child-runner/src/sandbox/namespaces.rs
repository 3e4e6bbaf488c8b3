//! The run's namespaces: its process is created straight into new PID,
//! mount, IPC and cgroup namespaces (and a network namespace for a run
//! without network) by one `clone(2)`, so it is the init of its PID
//! namespace: when it ends, the kernel ends every other process of the
//! run. Without `CAP_SYS_ADMIN` the runner first enters a user namespace
//! of its own (mapping its uid and gid to themselves), in which it holds
//! the capabilities this needs.

use nix::errno::Errno;
use nix::unistd::Pid;
use std::io::Write;

/// The namespaces a run gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunNamespaces {
    /// A network namespace too (runs without network).
    pub net: bool,
}

impl RunNamespaces {
    /// The `clone(2)` flags.
    pub fn flags(&self) -> libc::c_int {
        let mut f =
            libc::CLONE_NEWPID | libc::CLONE_NEWNS | libc::CLONE_NEWIPC | libc::CLONE_NEWCGROUP;
        if self.net {
            f |= libc::CLONE_NEWNET;
        }
        f
    }

    /// What the report says.
    pub fn describe(&self) -> String {
        let mut parts = vec!["pid", "mount", "ipc", "cgroup"];
        if self.net {
            parts.push("network");
        }
        format!("{} (new for this run)", parts.join(", "))
    }
}

/// Forks into new namespaces: `clone(flags | SIGCHLD)` on the caller's
/// stack, as `fork` does. Returns the child's pid in the parent and `None`
/// in the child (pid 1 of its PID namespace).
///
/// The caller must be single-threaded: the child is a copy of it that runs
/// Rust code before it exits or execs.
pub fn fork_into(ns: RunNamespaces) -> Result<Option<Pid>, Errno> {
    let flags = (ns.flags() | libc::SIGCHLD) as libc::c_ulong;
    // SAFETY: with a null stack pointer the child continues on a copy of
    // the parent's stack, exactly like fork(2); no pointer is passed. The
    // caller is single-threaded, so no lock is held by another thread.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_clone,
            flags,
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_void>(),
            0usize,
        )
    };
    match rc {
        -1 => Err(Errno::last()),
        0 => Ok(None),
        pid => Ok(Some(Pid::from_raw(pid as i32))),
    }
}

/// The inode of the initial user namespace (`PROC_USER_INIT_INO`).
const INIT_USER_NS: &str = "user:[4026531837]";

/// Whether the calling process is in the host's own user namespace.
pub fn in_init_user_ns() -> bool {
    std::fs::read_link("/proc/self/ns/user").is_ok_and(|l| l.as_os_str() == INIT_USER_NS)
}

/// A user namespace could not be entered.
#[derive(Debug, thiserror::Error)]
#[error("user namespace: {op}: {source}")]
pub struct UserNsError {
    /// The step.
    pub op: &'static str,
    /// The errno.
    pub source: std::io::Error,
}

/// Per-user kernel counts a run shares with its user's other processes
/// when it runs as that user: (the user namespace's own limit, the host's
/// per-user limit). A run may take a quarter of each.
const SHARED_COUNTS: &[(&str, &str)] = &[
    (
        "/proc/sys/user/max_inotify_instances",
        "/proc/sys/fs/inotify/max_user_instances",
    ),
    (
        "/proc/sys/user/max_inotify_watches",
        "/proc/sys/fs/inotify/max_user_watches",
    ),
];

/// Moves the calling (single-threaded) process into a new user namespace
/// and a new mount namespace owned by it, mapping its uid and gid to
/// themselves: it then holds every capability inside, enough to make the
/// run's namespaces and mounts; outside it gains nothing. The run shares
/// its user's per-user counts (inotify instances and watches), so the
/// namespace's own limits hold it to a quarter of the host's.
pub fn enter_own_user_ns() -> Result<(), UserNsError> {
    let uid = nix::unistd::geteuid().as_raw();
    let gid = nix::unistd::getegid().as_raw();
    let host: Vec<Option<u64>> = SHARED_COUNTS
        .iter()
        .map(|(_, h)| std::fs::read_to_string(h).ok()?.trim().parse().ok())
        .collect();
    nix::sched::unshare(
        nix::sched::CloneFlags::CLONE_NEWUSER | nix::sched::CloneFlags::CLONE_NEWNS,
    )
    .map_err(|e| UserNsError {
        op: "unshare(CLONE_NEWUSER | CLONE_NEWNS)",
        source: e.into(),
    })?;
    let write = |path: &'static str, text: String| {
        std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .map_err(|source| UserNsError { op: path, source })
    };
    write("/proc/self/setgroups", "deny".into())?;
    write("/proc/self/uid_map", format!("{uid} {uid} 1\n"))?;
    write("/proc/self/gid_map", format!("{gid} {gid} 1\n"))?;
    for ((own, _), max) in SHARED_COUNTS.iter().zip(host) {
        if let Some(max) = max {
            write(own, (max / 4).max(1).to_string())?;
        }
    }
    Ok(())
}
