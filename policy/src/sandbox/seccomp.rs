//! The seccomp deny-list: syscalls an agent never needs, each refused with
//! EPERM and kept here with the reason. Everything else is allowed (a
//! deny-list: agents run arbitrary programs, so an allow-list would break
//! them); Landlock, the capability drop and namespaces do the rest.

use serde::{Deserialize, Serialize};

/// One refused syscall.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DenyRule {
    /// The syscall's name (as in `man 2`).
    pub syscall: String,
    /// Why no agent needs it.
    pub reason: String,
}

/// The filter the runner installs last, just before exec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeccompSpec {
    /// Syscalls refused outright.
    pub deny: Vec<DenyRule>,
    /// clone() with any CLONE_NEW* flag is refused, and clone3() answers
    /// ENOSYS (its flags sit in memory a filter cannot read) so libc falls
    /// back to clone().
    pub deny_new_namespaces: bool,
    /// socket() and socketpair() are refused for every family but AF_UNIX
    /// (for runs without network).
    pub only_unix_sockets: bool,
    /// Setting the set-user-ID or set-group-ID bit is refused (chmod and
    /// friends, and creating a file with those bits): a child running as
    /// the owner of system files could otherwise plant a setuid binary for
    /// processes outside the sandbox. (syscall, index of its mode argument.)
    pub deny_setid_modes: Vec<(String, u8)>,
    /// Syscalls that answer ENOSYS, so libc falls back to one this filter
    /// can read the arguments of.
    pub enosys: Vec<DenyRule>,
    /// Refuse changing file modes at all (chmod and friends): set when the
    /// child runs as the daemon's uid, so it owns the daemon's files (and
    /// the system's, for a root daemon) and chmod would reach files outside
    /// the writable roots (Landlock has no right for it).
    pub deny_chmod: Vec<DenyRule>,
}

/// The chmod family.
pub const CHMOD: &[&str] = &["chmod", "fchmod", "fchmodat", "fchmodat2"];

/// Syscalls that take a file mode, and which argument it is.
pub const MODE_ARGS: &[(&str, u8)] = &[
    ("chmod", 1),
    ("fchmod", 1),
    ("fchmodat", 2),
    ("fchmodat2", 2),
    ("open", 2),
    ("openat", 3),
    ("creat", 1),
    ("mkdir", 1),
    ("mkdirat", 2),
    ("mknod", 1),
    ("mknodat", 2),
];

/// The deny-list: (syscall, reason).
pub const DENY: &[(&str, &str)] = &[
    ("ptrace", "inspecting or controlling other processes"),
    ("process_vm_readv", "reading another process's memory"),
    ("process_vm_writev", "writing another process's memory"),
    ("pidfd_getfd", "stealing another process's descriptors"),
    ("kcmp", "probing other processes' kernel objects"),
    ("mount", "changing the mount table"),
    ("umount2", "changing the mount table"),
    ("pivot_root", "changing the root"),
    ("chroot", "changing the root"),
    ("open_tree", "the new mount API"),
    ("move_mount", "the new mount API"),
    ("fsopen", "the new mount API"),
    ("fsconfig", "the new mount API"),
    ("fsmount", "the new mount API"),
    ("fspick", "the new mount API"),
    ("mount_setattr", "the new mount API"),
    ("unshare", "entering new namespaces"),
    ("setns", "joining other namespaces"),
    ("kexec_load", "replacing the kernel"),
    ("kexec_file_load", "replacing the kernel"),
    ("init_module", "loading kernel modules"),
    ("finit_module", "loading kernel modules"),
    ("delete_module", "unloading kernel modules"),
    ("bpf", "loading programs into the kernel"),
    (
        "perf_event_open",
        "profiling other processes and the kernel",
    ),
    ("keyctl", "the kernel keyring"),
    ("add_key", "the kernel keyring"),
    ("request_key", "the kernel keyring"),
    ("io_uring_setup", "io_uring bypasses this filter"),
    ("io_uring_enter", "io_uring bypasses this filter"),
    ("io_uring_register", "io_uring bypasses this filter"),
    ("reboot", "rebooting the host"),
    ("swapon", "host swap configuration"),
    ("swapoff", "host swap configuration"),
    ("acct", "process accounting"),
    ("quotactl", "disk quotas"),
    ("userfaultfd", "a common exploitation primitive"),
    (
        "open_by_handle_at",
        "opening files by handle, outside any path check",
    ),
    ("name_to_handle_at", "file handles, outside any path check"),
    ("syslog", "the kernel log"),
    ("settimeofday", "setting the host clock"),
    ("clock_settime", "setting the host clock"),
    ("clock_adjtime", "setting the host clock"),
    ("adjtimex", "setting the host clock"),
    ("iopl", "raw I/O port access"),
    ("ioperm", "raw I/O port access"),
    ("fanotify_init", "watching the whole file system"),
    ("vhangup", "hanging up terminals"),
    ("lookup_dcookie", "kernel profiling internals"),
    ("uselib", "an obsolete loader interface"),
    ("personality", "changing the execution domain (ASLR)"),
];

/// The seccomp spec; `network` lifts the socket-family restriction;
/// `shares_daemon_uid` (no run_as: the child owns the daemon's files, the
/// system's too when that is root) refuses chmod outright.
pub fn spec(network: bool, shares_daemon_uid: bool) -> SeccompSpec {
    SeccompSpec {
        deny: DENY
            .iter()
            .map(|(s, r)| DenyRule {
                syscall: (*s).to_owned(),
                reason: (*r).to_owned(),
            })
            .collect(),
        deny_new_namespaces: true,
        only_unix_sockets: !network,
        deny_setid_modes: MODE_ARGS
            .iter()
            .map(|(s, i)| ((*s).to_owned(), *i))
            .collect(),
        deny_chmod: if shares_daemon_uid {
            CHMOD
                .iter()
                .map(|s| DenyRule {
                    syscall: (*s).to_owned(),
                    reason: "a uid-0 child owns the system's files; Landlock cannot stop chmod"
                        .into(),
                })
                .collect()
        } else {
            Vec::new()
        },
        enosys: vec![
            DenyRule {
                syscall: "clone3".into(),
                reason: "its flags sit in memory a filter cannot read; libc falls back to clone"
                    .into(),
            },
            DenyRule {
                syscall: "openat2".into(),
                reason: "its mode sits in memory a filter cannot read; libc falls back to openat"
                    .into(),
            },
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_issue_list_is_covered_with_reasons() {
        let s = spec(false, false);
        for must in [
            "ptrace",
            "process_vm_readv",
            "process_vm_writev",
            "mount",
            "umount2",
            "pivot_root",
            "chroot",
            "unshare",
            "setns",
            "kexec_load",
            "kexec_file_load",
            "init_module",
            "finit_module",
            "delete_module",
            "bpf",
            "perf_event_open",
            "keyctl",
            "add_key",
            "request_key",
            "io_uring_setup",
            "io_uring_enter",
            "io_uring_register",
            "reboot",
            "swapon",
            "swapoff",
            "acct",
            "quotactl",
            "userfaultfd",
        ] {
            assert!(s.deny.iter().any(|d| d.syscall == must), "{must} missing");
        }
        assert!(s.deny.iter().all(|d| !d.reason.is_empty()));
        let mut names: Vec<_> = s.deny.iter().map(|d| &d.syscall).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), s.deny.len(), "no duplicates");
    }

    #[test]
    fn network_only_changes_the_socket_rule() {
        let (off, on) = (spec(false, false), spec(true, false));
        assert!(off.deny_chmod.is_empty());
        assert_eq!(spec(false, true).deny_chmod.len(), CHMOD.len());
        assert!(off.only_unix_sockets && !on.only_unix_sockets);
        assert_eq!(off.deny, on.deny);
    }
}
