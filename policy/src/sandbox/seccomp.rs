//! The seccomp policy: syscalls an agent never needs, and calls it may make
//! only with arguments a filter can check, each rule kept here with its
//! reason. Everything else is allowed (a deny-list: agents run arbitrary
//! programs, so an allow-list would break them); Landlock, the capability
//! drop and namespaces do the rest. The runner compiles these rules and
//! installs them; nothing here knows how.

use super::network::NetworkMode;
use serde::{Deserialize, Serialize};

/// What a refused call returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Errno {
    /// Operation not permitted.
    Eperm,
    /// No such syscall: libc falls back to an older one.
    Enosys,
    /// Address family not supported.
    Eafnosupport,
}

/// How much of an argument a test looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Width {
    /// The low 32 bits: an `int`, `pid_t` or `mode_t`, which the kernel
    /// truncates the register to as well.
    Int,
    /// All 64 bits (a `long`, such as clone's flags).
    Long,
}

/// A comparison of one argument with a constant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ArgOp {
    /// The argument equals the value.
    Eq(u64),
    /// The argument differs from the value.
    Ne(u64),
    /// Every one of these bits is set in the argument.
    HasBits(u64),
}

/// A test on one argument of a syscall.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArgTest {
    /// Which argument, 0 to 5.
    pub arg: u8,
    /// How much of it.
    pub width: Width,
    /// The comparison.
    pub op: ArgOp,
}

/// One refused call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    /// The syscall's name (as in `man 2`).
    pub syscall: String,
    /// Refused when every test holds; always when there is none. Rules of
    /// one syscall are alternatives: any that holds refuses the call.
    pub when: Vec<ArgTest>,
    /// What the call returns.
    pub errno: Errno,
    /// Why no agent needs it.
    pub reason: String,
}

/// The filter the runner installs last, just before exec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeccompSpec {
    /// Every rule. All rules of one syscall give the same errno.
    pub rules: Vec<Rule>,
    /// The rules refuse every socket family but AF_UNIX (a run without
    /// network).
    pub only_unix_sockets: bool,
    /// The rules refuse every socket family but AF_UNIX, AF_INET and
    /// AF_INET6 (a run in allowlist mode: TCP to its proxy port).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub only_unix_and_inet_sockets: bool,
    /// The rules refuse memfd_create and executing a descriptor (the run
    /// has no exec right).
    pub deny_fd_exec: bool,
}

/// Linux ABI constants the rules compare with (the same on every
/// architecture the runner builds for; the runner's tests check them
/// against libc).
pub mod abi {
    /// A new mount namespace.
    pub const CLONE_NEWNS: u64 = 0x0002_0000;
    /// A new cgroup namespace.
    pub const CLONE_NEWCGROUP: u64 = 0x0200_0000;
    /// A new UTS (host and domain name) namespace.
    pub const CLONE_NEWUTS: u64 = 0x0400_0000;
    /// A new IPC namespace.
    pub const CLONE_NEWIPC: u64 = 0x0800_0000;
    /// A new user namespace.
    pub const CLONE_NEWUSER: u64 = 0x1000_0000;
    /// A new PID namespace.
    pub const CLONE_NEWPID: u64 = 0x2000_0000;
    /// A new network namespace.
    pub const CLONE_NEWNET: u64 = 0x4000_0000;
    /// `S_ISUID`.
    pub const S_ISUID: u64 = 0o4000;
    /// `S_ISGID`.
    pub const S_ISGID: u64 = 0o2000;
    /// `AF_UNIX`.
    pub const AF_UNIX: u64 = 1;
    /// `AF_INET`.
    pub const AF_INET: u64 = 2;
    /// `AF_INET6`.
    pub const AF_INET6: u64 = 10;
    /// setpriority's `PRIO_USER`.
    pub const PRIO_USER: u64 = 2;
    /// ioprio_set's `IOPRIO_WHO_USER`.
    pub const IOPRIO_WHO_USER: u64 = 3;
    /// `AT_EMPTY_PATH`.
    pub const AT_EMPTY_PATH: u64 = 0x1000;
}

/// The namespace flags clone() may not carry.
pub const CLONE_NEW_FLAGS: [u64; 7] = [
    abi::CLONE_NEWNS,
    abi::CLONE_NEWCGROUP,
    abi::CLONE_NEWUTS,
    abi::CLONE_NEWIPC,
    abi::CLONE_NEWUSER,
    abi::CLONE_NEWPID,
    abi::CLONE_NEWNET,
];

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

/// The deny-list, refused outright with EPERM: (syscall, reason).
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
    (
        "process_madvise",
        "acting on another process's memory through a pidfd",
    ),
    (
        "process_mrelease",
        "reaping another process's memory through a pidfd",
    ),
    ("chown", CHOWN_REASON),
    ("fchown", CHOWN_REASON),
    ("lchown", CHOWN_REASON),
    ("fchownat", CHOWN_REASON),
];

/// Why the chown family is refused.
const CHOWN_REASON: &str = "any chown, even chown(path, -1, -1), clears the set-user-ID and set-group-ID bits of a file the uid owns (a uid-0 child: the system's); Landlock has no right for it";

/// Calls that act on a process named by an argument, allowed only on the
/// caller itself (that argument 0): (syscall, the argument, reason). The
/// pid is compared as the 32-bit `pid_t` the kernel reads. A thread's own
/// id is not 0, so pthread_setaffinity_np and pthread_setschedparam on a
/// thread get EPERM too.
pub const ONLY_SELF: &[(&str, u8, &str)] = &[
    (
        "prlimit64",
        0,
        "reading or changing another process's resource limits",
    ),
    (
        "setpriority",
        1,
        "changing other processes' scheduling priority",
    ),
    ("sched_setaffinity", 0, "pinning another process to CPUs"),
    (
        "sched_setscheduler",
        0,
        "changing another process's scheduling policy",
    ),
    (
        "sched_setparam",
        0,
        "changing another process's scheduling parameters",
    ),
    (
        "sched_setattr",
        0,
        "changing another process's scheduling attributes",
    ),
    ("ioprio_set", 1, "changing other processes' I/O priority"),
    (
        "migrate_pages",
        0,
        "moving another process's memory between NUMA nodes",
    ),
    (
        "move_pages",
        0,
        "moving another process's memory between NUMA nodes",
    ),
];

/// Targets that mean every process of a uid, refused even with id 0:
/// (syscall, the argument, its value, reason). setpriority reads
/// `PRIO_USER` with id 0 as the caller's uid, which the child shares with
/// the daemon (no run_as) or with every other run (run_as), and nothing
/// confines the kernel's walk to the run (no PID namespace). ioprio_set
/// reads `IOPRIO_WHO_USER` with id 0 as uid 0: every root process of the
/// host, for a child running as uid 0. Process group 0, the caller's own,
/// stays allowed: the child starts its own session, so its groups hold
/// only the run's processes.
pub const WHOLE_UID: &[(&str, u8, u64, &str)] = &[
    (
        "setpriority",
        0,
        abi::PRIO_USER,
        "PRIO_USER reaches every process of a uid the daemon or other runs share",
    ),
    (
        "ioprio_set",
        0,
        abi::IOPRIO_WHO_USER,
        "IOPRIO_WHO_USER reaches every process of a uid (with id 0: every root process)",
    ),
];

/// Syscalls that answer ENOSYS: (syscall, reason).
pub const ENOSYS: &[(&str, &str)] = &[
    (
        "clone3",
        "its flags sit in memory a filter cannot read; libc falls back to clone",
    ),
    (
        "openat2",
        "its mode sits in memory a filter cannot read; libc falls back to openat",
    ),
];

fn rule(syscall: &str, when: Vec<ArgTest>, errno: Errno, reason: &str) -> Rule {
    Rule {
        syscall: syscall.to_owned(),
        when,
        errno,
        reason: reason.to_owned(),
    }
}

fn test(arg: u8, width: Width, op: ArgOp) -> ArgTest {
    ArgTest { arg, width, op }
}

/// clone() with any CLONE_NEW* flag (clone3 answers ENOSYS, so libc
/// falls back to clone).
fn clone_rules() -> Vec<Rule> {
    CLONE_NEW_FLAGS
        .iter()
        .map(|&flag| {
            rule(
                "clone",
                vec![test(0, Width::Long, ArgOp::HasBits(flag))],
                Errno::Eperm,
                "entering new namespaces",
            )
        })
        .collect()
}

/// Setting the set-user-ID or set-group-ID bit (chmod and friends, and
/// creating a file with those bits): a child running as the owner of
/// system files could otherwise plant a setuid binary for processes
/// outside the sandbox. Syscalls in `skip` are refused outright anyway.
fn setid_rules(skip: &[&str]) -> Vec<Rule> {
    let mut out = Vec::new();
    for &(syscall, arg) in MODE_ARGS {
        if skip.contains(&syscall) {
            continue;
        }
        for bit in [abi::S_ISUID, abi::S_ISGID] {
            out.push(rule(
                syscall,
                vec![test(arg, Width::Int, ArgOp::HasBits(bit))],
                Errno::Eperm,
                "a set-user-ID or set-group-ID file would run with its owner's rights outside the sandbox",
            ));
        }
    }
    out
}

/// Process-targeting calls on anyone but the caller, and on a whole uid.
fn only_self_rules() -> Vec<Rule> {
    let mut out: Vec<Rule> = ONLY_SELF
        .iter()
        .map(|&(syscall, arg, reason)| {
            rule(
                syscall,
                vec![test(arg, Width::Int, ArgOp::Ne(0))],
                Errno::Eperm,
                reason,
            )
        })
        .collect();
    out.extend(WHOLE_UID.iter().map(|&(syscall, arg, value, reason)| {
        rule(
            syscall,
            vec![test(arg, Width::Int, ArgOp::Eq(value))],
            Errno::Eperm,
            reason,
        )
    }));
    out
}

/// Without the exec right, Landlock lets the child execute only its
/// program and what that needs. An anonymous file (memfd) lies outside
/// every path Landlock checks, so a child could write a program into one
/// and execute it, by descriptor or through /proc/self/fd.
fn fd_exec_rules() -> Vec<Rule> {
    vec![
        rule(
            "memfd_create",
            Vec::new(),
            Errno::Eperm,
            "no exec right: an anonymous file is executable outside Landlock's paths",
        ),
        rule(
            "execveat",
            vec![test(4, Width::Int, ArgOp::HasBits(abi::AT_EMPTY_PATH))],
            Errno::Eperm,
            "no exec right: executing a descriptor (fexecve) runs a file by no path",
        ),
    ]
}

/// socket() and socketpair() for any family but AF_UNIX.
fn socket_rules() -> Vec<Rule> {
    ["socket", "socketpair"]
        .iter()
        .map(|s| {
            rule(
                s,
                vec![test(0, Width::Int, ArgOp::Ne(abi::AF_UNIX))],
                Errno::Eafnosupport,
                "no network: only Unix sockets",
            )
        })
        .collect()
}

/// socket() and socketpair() for any family but AF_UNIX, AF_INET and
/// AF_INET6: a run in allowlist mode reaches its proxy by TCP on
/// 127.0.0.1; IPv6 sockets stay open so that a client that tries `::1`
/// first is refused at connect (the proxy listens on IPv4 only) and falls
/// back, as it would anywhere; netlink, packet and the rest stay closed.
fn inet_socket_rules() -> Vec<Rule> {
    ["socket", "socketpair"]
        .iter()
        .map(|s| {
            rule(
                s,
                [abi::AF_UNIX, abi::AF_INET, abi::AF_INET6]
                    .iter()
                    .map(|&f| test(0, Width::Int, ArgOp::Ne(f)))
                    .collect(),
                Errno::Eafnosupport,
                "allowlist network: only Unix and IP sockets, for the proxy on loopback",
            )
        })
        .collect()
}

/// The seccomp spec of a run with (`network`) or without the network.
pub fn spec(network: bool, exec: bool) -> SeccompSpec {
    let mode = if network {
        NetworkMode::Full
    } else {
        NetworkMode::None
    };
    for_mode(mode, exec)
}

/// The seccomp spec; the network `mode` sets which socket families stay
/// open (none: AF_UNIX; allowlist: AF_UNIX and IP; full: any); without
/// `exec` (the run's exec right), memfd_create and executing a descriptor
/// are refused. chmod stays allowed (never to a set-id mode): the run's
/// own root holds no file of the daemon's or the system's it could reach
/// writable.
pub fn for_mode(mode: NetworkMode, exec: bool) -> SeccompSpec {
    let always = |list: &[(&str, &str)], errno: Errno| -> Vec<Rule> {
        list.iter()
            .map(|(s, r)| rule(s, Vec::new(), errno, r))
            .collect()
    };
    let mut rules = always(DENY, Errno::Eperm);
    rules.extend(always(ENOSYS, Errno::Enosys));
    rules.extend(clone_rules());
    rules.extend(only_self_rules());
    rules.extend(setid_rules(&[]));
    if !exec {
        rules.extend(fd_exec_rules());
    }
    match mode {
        NetworkMode::None => rules.extend(socket_rules()),
        NetworkMode::Allowlist => rules.extend(inet_socket_rules()),
        NetworkMode::Full => {}
    }
    SeccompSpec {
        rules,
        only_unix_sockets: mode == NetworkMode::None,
        only_unix_and_inet_sockets: mode == NetworkMode::Allowlist,
        deny_fd_exec: !exec,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn rules_of<'a>(s: &'a SeccompSpec, syscall: &str) -> Vec<&'a Rule> {
        s.rules.iter().filter(|r| r.syscall == syscall).collect()
    }

    fn always(s: &SeccompSpec, syscall: &str) -> Option<Errno> {
        let rules = rules_of(s, syscall);
        rules.iter().find(|r| r.when.is_empty()).map(|r| r.errno)
    }

    fn all_specs() -> Vec<SeccompSpec> {
        let mut out = Vec::new();
        for mode in [NetworkMode::None, NetworkMode::Allowlist, NetworkMode::Full] {
            for exec in [false, true] {
                out.push(for_mode(mode, exec));
            }
        }
        out
    }

    #[test]
    fn the_issue_list_is_covered_with_reasons() {
        let s = spec(false, true);
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
            assert_eq!(always(&s, must), Some(Errno::Eperm), "{must} missing");
        }
        let mut names: Vec<_> = DENY.iter().map(|(s, _)| s).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), DENY.len(), "no duplicates");
    }

    #[test]
    fn every_rule_has_a_reason_and_one_errno_per_syscall() {
        for s in all_specs() {
            let mut errno: BTreeMap<&str, Errno> = BTreeMap::new();
            for r in &s.rules {
                assert!(!r.reason.is_empty(), "{} has no reason", r.syscall);
                assert!(r.when.iter().all(|t| t.arg <= 5), "{}", r.syscall);
                let first = *errno.entry(&r.syscall).or_insert(r.errno);
                assert_eq!(first, r.errno, "{} has two errnos", r.syscall);
            }
        }
    }

    #[test]
    fn clone3_and_openat2_answer_enosys() {
        let s = spec(false, true);
        assert_eq!(always(&s, "clone3"), Some(Errno::Enosys));
        assert_eq!(always(&s, "openat2"), Some(Errno::Enosys));
    }

    #[test]
    fn clone_is_refused_with_any_namespace_flag() {
        let s = spec(true, true);
        let rules = rules_of(&s, "clone");
        assert_eq!(rules.len(), CLONE_NEW_FLAGS.len());
        for flag in CLONE_NEW_FLAGS {
            assert!(rules.iter().any(|r| r.errno == Errno::Eperm
                && r.when == [test(0, Width::Long, ArgOp::HasBits(flag))]));
        }
    }

    #[test]
    fn setid_modes_are_refused_on_every_mode_argument() {
        let s = spec(true, true);
        for &(syscall, arg) in MODE_ARGS {
            let rules = rules_of(&s, syscall);
            for bit in [abi::S_ISUID, abi::S_ISGID] {
                assert!(
                    rules.iter().any(|r| r.errno == Errno::Eperm
                        && r.when == [test(arg, Width::Int, ArgOp::HasBits(bit))]),
                    "{syscall} {bit:o}"
                );
            }
        }
    }

    #[test]
    fn chmod_is_allowed_but_never_to_a_set_id_mode() {
        let s = spec(false, true);
        for c in CHMOD {
            assert_eq!(always(&s, c), None, "{c}");
        }
    }

    #[test]
    fn process_targeting_calls_reach_only_the_caller() {
        let s = spec(false, true);
        let who =
            |syscall: &str, arg: u8| {
                let rules = rules_of(&s, syscall);
                assert!(
                    rules.iter().any(|r| r.errno == Errno::Eperm
                        && r.when == [test(arg, Width::Int, ArgOp::Ne(0))]),
                    "{syscall}"
                );
                rules
            };
        for syscall in [
            "prlimit64",
            "sched_setaffinity",
            "sched_setscheduler",
            "sched_setparam",
            "sched_setattr",
            "migrate_pages",
            "move_pages",
        ] {
            assert_eq!(who(syscall, 0).len(), 1, "{syscall}");
        }
        for (syscall, whole_uid) in [
            ("setpriority", abi::PRIO_USER),
            ("ioprio_set", abi::IOPRIO_WHO_USER),
        ] {
            let rules = who(syscall, 1);
            assert_eq!(rules.len(), 2, "{syscall}");
            assert!(rules
                .iter()
                .any(|r| r.when == [test(0, Width::Int, ArgOp::Eq(whole_uid))]));
        }
        for syscall in ["process_madvise", "process_mrelease"] {
            assert_eq!(always(&s, syscall), Some(Errno::Eperm), "{syscall}");
        }
    }

    #[test]
    fn the_chown_family_is_refused_outright() {
        for s in all_specs() {
            for syscall in ["chown", "fchown", "lchown", "fchownat"] {
                assert_eq!(always(&s, syscall), Some(Errno::Eperm), "{syscall}");
                assert_eq!(rules_of(&s, syscall).len(), 1, "{syscall}");
            }
        }
    }

    #[test]
    fn without_the_exec_right_memfds_and_descriptors_do_not_execute() {
        let (with, without) = (spec(false, true), spec(false, false));
        assert!(!with.deny_fd_exec && without.deny_fd_exec);
        assert_eq!(always(&without, "memfd_create"), Some(Errno::Eperm));
        let execveat = rules_of(&without, "execveat");
        assert_eq!(execveat.len(), 1);
        assert_eq!(execveat[0].errno, Errno::Eperm);
        assert_eq!(
            execveat[0].when,
            [test(4, Width::Int, ArgOp::HasBits(abi::AT_EMPTY_PATH))]
        );
        assert!(rules_of(&with, "memfd_create").is_empty());
        assert!(rules_of(&with, "execveat").is_empty());
        let rest: Vec<_> = without
            .rules
            .iter()
            .filter(|r| r.syscall != "memfd_create" && r.syscall != "execveat")
            .cloned()
            .collect();
        assert_eq!(rest, with.rules);
    }

    #[test]
    fn network_only_changes_the_socket_rule() {
        let (off, on) = (spec(false, true), spec(true, true));
        assert!(off.only_unix_sockets && !on.only_unix_sockets);
        for s in ["socket", "socketpair"] {
            let rules = rules_of(&off, s);
            assert_eq!(rules.len(), 1);
            assert_eq!(rules[0].errno, Errno::Eafnosupport);
            assert_eq!(
                rules[0].when,
                [test(0, Width::Int, ArgOp::Ne(abi::AF_UNIX))]
            );
            assert!(rules_of(&on, s).is_empty());
        }
        let rest = |s: &SeccompSpec| -> Vec<Rule> {
            s.rules
                .iter()
                .filter(|r| r.errno != Errno::Eafnosupport)
                .cloned()
                .collect()
        };
        assert_eq!(rest(&off), rest(&on));
    }

    #[test]
    fn allowlist_opens_exactly_the_ip_families() {
        let (off, list) = (spec(false, true), for_mode(NetworkMode::Allowlist, true));
        assert!(list.only_unix_and_inet_sockets && !list.only_unix_sockets);
        for s in ["socket", "socketpair"] {
            let rules = rules_of(&list, s);
            assert_eq!(rules.len(), 1, "{s}");
            assert_eq!(rules[0].errno, Errno::Eafnosupport);
            let open: Vec<u64> = rules[0]
                .when
                .iter()
                .map(|t| match t.op {
                    ArgOp::Ne(f) => f,
                    other => panic!("{other:?}"),
                })
                .collect();
            assert_eq!(open, [abi::AF_UNIX, abi::AF_INET, abi::AF_INET6]);
            assert!(rules[0]
                .when
                .iter()
                .all(|t| t.arg == 0 && t.width == Width::Int));
        }
        let rest = |s: &SeccompSpec| -> Vec<Rule> {
            s.rules
                .iter()
                .filter(|r| r.errno != Errno::Eafnosupport)
                .cloned()
                .collect()
        };
        assert_eq!(rest(&off), rest(&list));
    }
}
