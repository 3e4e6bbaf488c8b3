//! The seccomp filters, compiled with seccompiler from the policy's rules
//! before fork and installed in the child as the last step before exec.
//!
//! seccompiler gives a filter one action for every match, so there is one
//! filter per errno. The kernel runs every installed filter and takes the
//! lowest action; between equal actions (two ERRNOs) the filter installed
//! last decides. So that this never matters, a syscall may have rules of
//! one errno only ([`compile`] refuses the policy otherwise): it is
//! matched by one filter, and every other filter allows it. Each filter
//! kills the process on a syscall of another architecture; on x86_64 a
//! small filter of its own, installed first, kills it on an x32 syscall
//! too ([`x32_guard`]).

use policy::sandbox::seccomp::{ArgOp, ArgTest, Errno, SeccompSpec, Width};
use seccompiler::{
    sock_filter, BackendError, BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp,
    SeccompCondition, SeccompFilter, SeccompRule, TargetArch,
};
use std::collections::{BTreeMap, BTreeSet};

/// The filters could not be built or installed.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// The policy names a syscall this code does not know.
    #[error("seccomp: unknown syscall {0:?} in the policy")]
    UnknownSyscall(String),
    /// The policy gives one syscall two errnos.
    #[error("seccomp: {syscall} has rules answering {first:?} and {second:?}; a syscall answers one errno")]
    TwoErrnos {
        /// The syscall.
        syscall: String,
        /// The errno of its first rule.
        first: Errno,
        /// Another.
        second: Errno,
    },
    /// seccompiler has no filters for this architecture.
    #[error("seccomp: no filters for this architecture: {0}")]
    Arch(#[source] BackendError),
    /// seccompiler refused a rule or a filter.
    #[error("seccomp: building the {errno:?} filter: {source}")]
    Build {
        /// The filter's errno.
        errno: Errno,
        /// seccompiler's error.
        #[source]
        source: BackendError,
    },
    /// The kernel refused a filter.
    #[error("seccomp: installing the filters: {0}")]
    Install(#[source] seccompiler::Error),
}

/// Syscalls that do not exist on this architecture (skipped, reported).
fn absent_here(name: &str) -> bool {
    cfg!(not(target_arch = "x86_64"))
        && matches!(
            name,
            "iopl"
                | "ioperm"
                | "uselib"
                | "chmod"
                | "chown"
                | "lchown"
                | "open"
                | "creat"
                | "mkdir"
                | "mknod"
        )
}

/// The syscall number of `name` on this architecture.
pub fn number(name: &str) -> Option<i64> {
    let n = match name {
        "ptrace" => libc::SYS_ptrace,
        "process_vm_readv" => libc::SYS_process_vm_readv,
        "process_vm_writev" => libc::SYS_process_vm_writev,
        "pidfd_getfd" => libc::SYS_pidfd_getfd,
        "kcmp" => libc::SYS_kcmp,
        "mount" => libc::SYS_mount,
        "umount2" => libc::SYS_umount2,
        "pivot_root" => libc::SYS_pivot_root,
        "chroot" => libc::SYS_chroot,
        "open_tree" => libc::SYS_open_tree,
        "move_mount" => libc::SYS_move_mount,
        "fsopen" => libc::SYS_fsopen,
        "fsconfig" => libc::SYS_fsconfig,
        "fsmount" => libc::SYS_fsmount,
        "fspick" => libc::SYS_fspick,
        "mount_setattr" => libc::SYS_mount_setattr,
        "unshare" => libc::SYS_unshare,
        "setns" => libc::SYS_setns,
        "kexec_load" => libc::SYS_kexec_load,
        "kexec_file_load" => libc::SYS_kexec_file_load,
        "init_module" => libc::SYS_init_module,
        "finit_module" => libc::SYS_finit_module,
        "delete_module" => libc::SYS_delete_module,
        "bpf" => libc::SYS_bpf,
        "perf_event_open" => libc::SYS_perf_event_open,
        "keyctl" => libc::SYS_keyctl,
        "add_key" => libc::SYS_add_key,
        "request_key" => libc::SYS_request_key,
        "io_uring_setup" => libc::SYS_io_uring_setup,
        "io_uring_enter" => libc::SYS_io_uring_enter,
        "io_uring_register" => libc::SYS_io_uring_register,
        "reboot" => libc::SYS_reboot,
        "swapon" => libc::SYS_swapon,
        "swapoff" => libc::SYS_swapoff,
        "acct" => libc::SYS_acct,
        "quotactl" => libc::SYS_quotactl,
        "userfaultfd" => libc::SYS_userfaultfd,
        "open_by_handle_at" => libc::SYS_open_by_handle_at,
        "name_to_handle_at" => libc::SYS_name_to_handle_at,
        "syslog" => libc::SYS_syslog,
        "settimeofday" => libc::SYS_settimeofday,
        "clock_settime" => libc::SYS_clock_settime,
        "clock_adjtime" => libc::SYS_clock_adjtime,
        "adjtimex" => libc::SYS_adjtimex,
        "fanotify_init" => libc::SYS_fanotify_init,
        "vhangup" => libc::SYS_vhangup,
        "lookup_dcookie" => libc::SYS_lookup_dcookie,
        "personality" => libc::SYS_personality,
        "process_madvise" => libc::SYS_process_madvise,
        "process_mrelease" => libc::SYS_process_mrelease,
        "prlimit64" => libc::SYS_prlimit64,
        "setpriority" => libc::SYS_setpriority,
        "sched_setaffinity" => libc::SYS_sched_setaffinity,
        "sched_setscheduler" => libc::SYS_sched_setscheduler,
        "sched_setparam" => libc::SYS_sched_setparam,
        "sched_setattr" => libc::SYS_sched_setattr,
        "ioprio_set" => libc::SYS_ioprio_set,
        "migrate_pages" => libc::SYS_migrate_pages,
        "move_pages" => libc::SYS_move_pages,
        "memfd_create" => libc::SYS_memfd_create,
        "execveat" => libc::SYS_execveat,
        "clone" => libc::SYS_clone,
        "clone3" => libc::SYS_clone3,
        "openat2" => libc::SYS_openat2,
        "socket" => libc::SYS_socket,
        "socketpair" => libc::SYS_socketpair,
        "fchmod" => libc::SYS_fchmod,
        "fchown" => libc::SYS_fchown,
        "fchownat" => libc::SYS_fchownat,
        "fchmodat" => libc::SYS_fchmodat,
        "fchmodat2" => libc::SYS_fchmodat2,
        "openat" => libc::SYS_openat,
        "mkdirat" => libc::SYS_mkdirat,
        "mknodat" => libc::SYS_mknodat,
        _ => return x86_64_only(name),
    };
    Some(n)
}

/// The numbers of syscalls only x86_64 has (the older ones that newer
/// architectures replaced with their `*at` forms).
#[cfg(target_arch = "x86_64")]
fn x86_64_only(name: &str) -> Option<i64> {
    let n = match name {
        "iopl" => libc::SYS_iopl,
        "ioperm" => libc::SYS_ioperm,
        "uselib" => libc::SYS_uselib,
        "chown" => libc::SYS_chown,
        "lchown" => libc::SYS_lchown,
        "chmod" => libc::SYS_chmod,
        "open" => libc::SYS_open,
        "creat" => libc::SYS_creat,
        "mkdir" => libc::SYS_mkdir,
        "mknod" => libc::SYS_mknod,
        _ => return None,
    };
    Some(n)
}

#[cfg(not(target_arch = "x86_64"))]
fn x86_64_only(_: &str) -> Option<i64> {
    None
}

/// x86_64 runs x32 syscalls (the number with bit 30 set) under the same
/// audit architecture, so seccompiler's architecture check passes them and
/// its rules, which compare whole numbers, never match them: every rule of
/// the policy could be bypassed on a kernel with x32 support. seccompiler
/// has no rule for "any number with this bit", so this filter is written
/// by hand, with seccompiler's types, and kills the process as the
/// architecture check does. Other architectures have no such ABI.
#[cfg(target_arch = "x86_64")]
pub fn x32_guard() -> Option<BpfProgram> {
    // `struct seccomp_data`: the number at offset 0, the architecture at 4.
    const NR: u32 = 0;
    const ARCH: u32 = 4;
    /// `AUDIT_ARCH_X86_64`: EM_X86_64 | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE.
    const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
    /// `__X32_SYSCALL_BIT` (libc has it only for x32 targets).
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    let op = |code: u32, k: u32, jt: u8, jf: u8| sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    let load = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    Some(vec![
        op(load, ARCH, 0, 0),
        // Another architecture: the other filters kill it.
        op(
            libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
            AUDIT_ARCH_X86_64,
            0,
            3,
        ),
        op(load, NR, 0, 0),
        op(
            libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K,
            X32_SYSCALL_BIT,
            0,
            1,
        ),
        op(
            libc::BPF_RET | libc::BPF_K,
            libc::SECCOMP_RET_KILL_PROCESS,
            0,
            0,
        ),
        op(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW, 0, 0),
    ])
}

/// Architectures without a second ABI under their own need no guard.
#[cfg(not(target_arch = "x86_64"))]
pub fn x32_guard() -> Option<BpfProgram> {
    None
}

/// The compiled filters and what they hold.
pub struct Compiled {
    /// The x32 guard ([`x32_guard`]), installed first.
    pub guard: Option<BpfProgram>,
    /// One BPF program per errno, installed in order.
    pub programs: Vec<BpfProgram>,
    /// Syscalls refused outright with EPERM.
    pub denied: usize,
    /// Syscalls of the policy that do not exist on this architecture.
    pub absent: Vec<String>,
}

fn errno_value(e: Errno) -> u32 {
    let v = match e {
        Errno::Eperm => libc::EPERM,
        Errno::Enosys => libc::ENOSYS,
        Errno::Eafnosupport => libc::EAFNOSUPPORT,
    };
    v.unsigned_abs()
}

fn condition(t: &ArgTest) -> Result<SeccompCondition, BackendError> {
    let len = match t.width {
        Width::Int => SeccompCmpArgLen::Dword,
        Width::Long => SeccompCmpArgLen::Qword,
    };
    let (op, value) = match t.op {
        ArgOp::Eq(v) => (SeccompCmpOp::Eq, v),
        ArgOp::Ne(v) => (SeccompCmpOp::Ne, v),
        ArgOp::HasBits(bits) => (SeccompCmpOp::MaskedEq(bits), bits),
    };
    SeccompCondition::new(t.arg, len, op, value)
}

/// Each errno's rules by syscall number; an empty list matches always.
type Tables = BTreeMap<Errno, BTreeMap<i64, Vec<SeccompRule>>>;

/// Sorts the policy's rules into one table per errno; returns them, the
/// syscalls refused outright with EPERM, and the absent ones.
fn tables(spec: &SeccompSpec) -> Result<(Tables, usize, Vec<String>), SeccompError> {
    let mut tables = Tables::new();
    let mut errno_of: BTreeMap<i64, Errno> = BTreeMap::new();
    let mut outright: BTreeSet<(Errno, i64)> = BTreeSet::new();
    let mut absent = BTreeSet::new();
    for r in &spec.rules {
        let Some(n) = number(&r.syscall) else {
            if absent_here(&r.syscall) {
                absent.insert(r.syscall.clone());
                continue;
            }
            return Err(SeccompError::UnknownSyscall(r.syscall.clone()));
        };
        let first = *errno_of.entry(n).or_insert(r.errno);
        if first != r.errno {
            return Err(SeccompError::TwoErrnos {
                syscall: r.syscall.clone(),
                first,
                second: r.errno,
            });
        }
        let chain = tables.entry(r.errno).or_default().entry(n).or_default();
        if r.when.is_empty() {
            outright.insert((r.errno, n));
            continue;
        }
        let build = |source| SeccompError::Build {
            errno: r.errno,
            source,
        };
        let conds = r
            .when
            .iter()
            .map(condition)
            .collect::<Result<_, _>>()
            .map_err(build)?;
        chain.push(SeccompRule::new(conds).map_err(build)?);
    }
    // An outright refusal makes the syscall's conditions moot.
    for (errno, n) in &outright {
        if let Some(chain) = tables.get_mut(errno).and_then(|t| t.get_mut(n)) {
            chain.clear();
        }
    }
    let denied = outright.iter().filter(|(e, _)| *e == Errno::Eperm).count();
    Ok((tables, denied, absent.into_iter().collect()))
}

/// Compiles `spec` into one filter per errno.
pub fn compile(spec: &SeccompSpec) -> Result<Compiled, SeccompError> {
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(SeccompError::Arch)?;
    let (tables, denied, absent) = tables(spec)?;
    let mut programs = Vec::with_capacity(tables.len());
    for (errno, rules) in tables {
        let build = |source| SeccompError::Build { errno, source };
        let filter = SeccompFilter::new(
            rules,
            SeccompAction::Allow,
            SeccompAction::Errno(errno_value(errno)),
            arch,
        )
        .map_err(build)?;
        programs.push(BpfProgram::try_from(filter).map_err(build)?);
    }
    Ok(Compiled {
        guard: x32_guard(),
        programs,
        denied,
        absent,
    })
}

/// Installs the compiled filters on the calling thread (needs
/// no_new_privs or CAP_SYS_ADMIN). Does not allocate unless it fails.
pub fn install(compiled: &Compiled) -> Result<(), SeccompError> {
    for p in compiled.guard.iter().chain(&compiled.programs) {
        seccompiler::apply_filter(p).map_err(SeccompError::Install)?;
    }
    Ok(())
}

impl Compiled {
    /// The isolation report's line for these filters.
    pub fn describe(&self, spec: &SeccompSpec) -> String {
        format!(
            "{} syscalls refused with EPERM{}{}; {}namespace flags on clone refused; set-user/group-ID modes refused; chown family refused; prlimit64, setpriority, sched_set*, ioprio_set, migrate_pages and move_pages only on the caller; {}clone3 and openat2 answer ENOSYS; sockets: {}",
            self.denied,
            if spec.deny_fd_exec {
                " (memfd_create included: no exec right)"
            } else {
                ""
            },
            if self.absent.is_empty() {
                String::new()
            } else {
                format!(" ({} absent on this architecture)", self.absent.len())
            },
            if self.guard.is_some() {
                "x32 syscalls kill the process; "
            } else {
                ""
            },
            if spec.deny_fd_exec {
                "execveat of a descriptor (AT_EMPTY_PATH) refused; "
            } else {
                ""
            },
            if spec.only_unix_sockets {
                "AF_UNIX only"
            } else if spec.only_unix_and_inet_sockets {
                "AF_UNIX, AF_INET and AF_INET6 only"
            } else {
                "any family"
            }
        )
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use policy::sandbox::seccomp::{abi, spec, Rule, CLONE_NEW_FLAGS};

    fn all_specs() -> Vec<SeccompSpec> {
        let mut out = Vec::new();
        for network in [false, true] {
            for exec in [false, true] {
                out.push(spec(network, exec));
            }
        }
        out
    }

    #[test]
    fn every_policy_syscall_has_a_number_here() {
        for s in all_specs() {
            let c = compile(&s).unwrap();
            let outright: BTreeSet<_> = s
                .rules
                .iter()
                .filter(|r| r.when.is_empty() && r.errno == Errno::Eperm)
                .map(|r| &r.syscall)
                .collect();
            let absent = c.absent.iter().filter(|a| outright.contains(a)).count();
            assert_eq!(c.denied + absent, outright.len());
            let errnos: BTreeSet<_> = s.rules.iter().map(|r| r.errno).collect();
            assert_eq!(c.programs.len(), errnos.len());
        }
    }

    #[test]
    fn the_policys_constants_are_this_systems() {
        let clone_new = [
            libc::CLONE_NEWNS,
            libc::CLONE_NEWCGROUP,
            libc::CLONE_NEWUTS,
            libc::CLONE_NEWIPC,
            libc::CLONE_NEWUSER,
            libc::CLONE_NEWPID,
            libc::CLONE_NEWNET,
        ];
        let clone_new: Vec<u64> = clone_new.iter().map(|&f| f as u64).collect();
        assert_eq!(clone_new, CLONE_NEW_FLAGS);
        assert_eq!(abi::S_ISUID, u64::from(libc::S_ISUID));
        assert_eq!(abi::S_ISGID, u64::from(libc::S_ISGID));
        assert_eq!(abi::AF_UNIX, libc::AF_UNIX as u64);
        assert_eq!(abi::PRIO_USER, libc::PRIO_USER as u64);
        assert_eq!(abi::AT_EMPTY_PATH, libc::AT_EMPTY_PATH as u64);
    }

    #[test]
    fn a_syscall_with_two_errnos_is_refused() {
        let mut s = spec(false, true);
        s.rules.push(Rule {
            syscall: "ptrace".into(),
            when: Vec::new(),
            errno: Errno::Enosys,
            reason: "test".into(),
        });
        assert!(matches!(
            compile(&s),
            Err(SeccompError::TwoErrnos { syscall, .. }) if syscall == "ptrace"
        ));
    }

    fn no_setup() -> i32 {
        0
    }

    /// How a forked child ended that ran `setup`, installed the filters
    /// of `spec` and ran `checks`.
    fn run_filtered(
        spec: &SeccompSpec,
        setup: fn() -> i32,
        checks: fn() -> i32,
    ) -> nix::sys::wait::WaitStatus {
        run_compiled(&compile(spec).unwrap(), setup, checks)
    }

    /// [`run_filtered`] with filters compiled already.
    fn run_compiled(
        compiled: &Compiled,
        setup: fn() -> i32,
        checks: fn() -> i32,
    ) -> nix::sys::wait::WaitStatus {
        // SAFETY: the child only makes syscalls (no allocation, no lock)
        // and leaves with _exit; the parent waits for it.
        match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => {
                let code = match setup() {
                    0 => match install(compiled) {
                        Ok(()) => checks(),
                        Err(_) => 101,
                    },
                    c => c,
                };
                // SAFETY: leaves the forked child without running the
                // parent's destructors.
                unsafe { libc::_exit(code) }
            }
            nix::unistd::ForkResult::Parent { child } => {
                nix::sys::wait::waitpid(child, None).unwrap()
            }
        }
    }

    /// Runs `checks` in a forked child with the filters of `spec`
    /// installed; returns the child's exit code (0: every check held;
    /// otherwise the number of the first that did not).
    fn in_filtered_child(spec: &SeccompSpec, checks: fn() -> i32) -> i32 {
        in_filtered_child_after(spec, no_setup, checks)
    }

    /// [`in_filtered_child`], with `setup` run before the filters are
    /// installed.
    fn in_filtered_child_after(spec: &SeccompSpec, setup: fn() -> i32, checks: fn() -> i32) -> i32 {
        match run_filtered(spec, setup, checks) {
            nix::sys::wait::WaitStatus::Exited(_, c) => c,
            other => panic!("{other:?}"),
        }
    }

    fn have_seccomp() -> bool {
        if std::path::Path::new("/proc/sys/kernel/seccomp/actions_avail").exists() {
            return true;
        }
        crate::testsupport::skip("seccomp", "this kernel has no seccomp filters");
        false
    }

    fn errno() -> i32 {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    }

    /// Whether the call returned -1 with `want`.
    fn refused(ret: i64, want: i32) -> bool {
        ret == -1 && errno() == want
    }

    /// The checks, in the child. Each returns the check's number when it
    /// does not hold. The errnos are ones these calls do not return by
    /// themselves here (root, a plain file, a kernel with all of them).
    fn checks() -> i32 {
        // SAFETY: plain syscalls with valid or null arguments; a clone
        // that the filter fails to stop exits at once in the new process.
        unsafe {
            if libc::syscall(libc::SYS_getpid) <= 0 {
                return 1;
            }
            if !refused(
                libc::syscall(libc::SYS_unshare, libc::CLONE_NEWUTS),
                libc::EPERM,
            ) {
                return 2;
            }
            if !refused(
                libc::syscall(libc::SYS_clone3, std::ptr::null::<u8>(), 0),
                libc::ENOSYS,
            ) {
                return 3;
            }
            let r = libc::syscall(
                libc::SYS_clone,
                (libc::CLONE_NEWUTS | libc::SIGCHLD) as libc::c_ulong,
                0,
                0,
                0,
                0,
            );
            if r == 0 {
                libc::_exit(120);
            }
            if !refused(r, libc::EPERM) {
                return 4;
            }
            let inet = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
            if !refused(inet.into(), libc::EAFNOSUPPORT) {
                return 5;
            }
            let u = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            if u < 0 {
                return 6;
            }
            libc::close(u);
            let fd = libc::memfd_create(c"f".as_ptr(), 0);
            if fd < 0 {
                return 7;
            }
            if !refused(libc::fchmod(fd, 0o4755).into(), libc::EPERM) {
                return 8;
            }
            if libc::fchmod(fd, 0o644) != 0 {
                return 9;
            }
            if !refused(
                libc::syscall(libc::SYS_acct, std::ptr::null::<u8>()),
                libc::EPERM,
            ) {
                return 10;
            }
            if !refused(
                libc::syscall(libc::SYS_openat2, libc::AT_FDCWD, c"/".as_ptr(), 0, 0),
                libc::ENOSYS,
            ) {
                return 11;
            }
            let path = c"/nonexistent-dir-of-the-seccomp-test/d";
            if !refused(libc::mkdir(path.as_ptr(), 0o2755).into(), libc::EPERM) {
                return 12;
            }
        }
        0
    }

    #[test]
    fn the_kernel_applies_the_filters_as_compiled() {
        if !have_seccomp() {
            return;
        }
        let spec = spec(false, true);
        assert_eq!(
            in_filtered_child(&spec, checks),
            0,
            "the check of that number failed"
        );
    }

    /// With network, any socket family; chmod to an ordinary mode works.
    fn checks_network() -> i32 {
        // SAFETY: plain syscalls with valid arguments on descriptors this
        // function opens.
        unsafe {
            let inet = libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0);
            if inet < 0 {
                return 1;
            }
            libc::close(inet);
            let fd = libc::memfd_create(c"f".as_ptr(), 0);
            if fd < 0 {
                return 2;
            }
            if libc::fchmod(fd, 0o644) != 0 {
                return 3;
            }
            if !refused(
                libc::syscall(libc::SYS_clone3, std::ptr::null::<u8>(), 0),
                libc::ENOSYS,
            ) {
                return 4;
            }
            // With the exec right, a descriptor may be executed.
            if !refused(execveat_empty_path(-1), libc::EBADF) {
                return 5;
            }
        }
        0
    }

    #[test]
    fn the_network_right_changes_the_filters_as_the_policy_says() {
        if !have_seccomp() {
            return;
        }
        let spec = spec(true, true);
        assert_eq!(
            in_filtered_child(&spec, checks_network),
            0,
            "the check of that number failed"
        );
    }

    /// An otherwise unused uid the process-targeting checks run as (when
    /// root), so that a whole-uid call the filter failed to stop reaches
    /// only the test's processes.
    const LONE_UID: libc::uid_t = 3_999_999_991;

    /// Whether the setup switched to [`LONE_UID`] (in the forked child).
    static AS_LONE_UID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

    /// A session of its own (so that process group 0 holds only the
    /// test's processes); when root, [`LONE_UID`] inside a user namespace
    /// that maps uid 0 to it: ioprio_set reads `IOPRIO_WHO_USER` with id 0
    /// as uid 0 of the caller's namespace, so there it reaches only
    /// [`LONE_UID`]'s processes.
    fn setup_targets() -> i32 {
        // SAFETY: plain syscalls; the buffers are constants.
        unsafe {
            if libc::setsid() < 0 {
                return 1;
            }
            if libc::geteuid() == 0 {
                // The uid switch makes the process undumpable, which
                // would leave /proc/self/uid_map root's and refuse
                // migrate_pages and move_pages on the target by itself.
                if libc::setresgid(LONE_UID, LONE_UID, LONE_UID) != 0
                    || libc::setresuid(LONE_UID, LONE_UID, LONE_UID) != 0
                    || libc::prctl(libc::PR_SET_DUMPABLE, 1) != 0
                    || libc::unshare(libc::CLONE_NEWUSER) != 0
                {
                    return 2;
                }
                let map = b"0 3999999991 1\n";
                let fd = libc::open(c"/proc/self/uid_map".as_ptr(), libc::O_WRONLY);
                if fd < 0 || libc::write(fd, map.as_ptr().cast(), map.len()) != map.len() as isize {
                    return 3;
                }
                libc::close(fd);
                AS_LONE_UID.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
        0
    }

    /// Process-targeting calls against a grandchild of the same uid (each
    /// would succeed without the filter) and on the caller itself.
    fn checks_targets() -> i32 {
        // SAFETY: plain syscalls; the forked target only pauses until it
        // is killed below.
        unsafe {
            let target = libc::fork();
            if target == 0 {
                loop {
                    libc::pause();
                }
            }
            if target < 0 {
                return 5;
            }
            let code = match target_checks(target) {
                0 if AS_LONE_UID.load(std::sync::atomic::Ordering::Relaxed) => whole_uid_checks(),
                c => c,
            };
            libc::kill(target, libc::SIGKILL);
            libc::waitpid(target, std::ptr::null_mut(), 0);
            code
        }
    }

    /// The calls on `target` (refused with EPERM) and on the caller
    /// (allowed), in order; see [`checks_targets`].
    fn target_checks(target: libc::pid_t) -> i32 {
        use libc::c_long as L;
        // SAFETY: the pointers point at locals of the right type and size
        // (or are null where the kernel reads nothing).
        unsafe {
            let t = L::from(target);
            let mut lim: libc::rlimit = std::mem::zeroed();
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            let param = libc::sched_param { sched_priority: 0 };
            let cur = L::from(libc::getpriority(libc::PRIO_PROCESS, 0));
            // struct sched_attr, version 0: size, policy SCHED_OTHER, nice.
            let mut attr = [0u32; 12];
            attr[0] = 48;
            attr[4] = cur as u32;
            let node0: libc::c_ulong = 1;
            let (lim_p, set_p) = ((&raw mut lim) as L, (&raw mut set) as L);
            let (param_p, attr_p) = ((&raw const param) as L, attr.as_ptr() as L);
            let node_p = (&raw const node0) as L;
            let (nofile, size) = (libc::RLIMIT_NOFILE as L, size_of::<libc::cpu_set_t>() as L);
            let (other, be4) = (libc::SCHED_OTHER as L, (2 << 13) | 4);
            let (process, pgrp) = (libc::PRIO_PROCESS as L, libc::PRIO_PGRP as L);
            // (syscall, arguments, refused); IOPRIO_WHO_PROCESS 1, _PGRP 2.
            let checks: [(L, [L; 5], bool); 24] = [
                (libc::SYS_prlimit64, [t, nofile, 0, lim_p, 0], true),
                (libc::SYS_prlimit64, [0, nofile, 0, lim_p, 0], false),
                // A pid whose low 32 bits are 0 is the caller to the kernel.
                (libc::SYS_prlimit64, [1 << 32, nofile, 0, lim_p, 0], false),
                (libc::SYS_setpriority, [process, t, 19, 0, 0], true),
                (libc::SYS_setpriority, [process, 0, cur, 0, 0], false),
                (libc::SYS_setpriority, [pgrp, 0, cur, 0, 0], false),
                (libc::SYS_sched_getaffinity, [0, size, set_p, 0, 0], false),
                (libc::SYS_sched_setaffinity, [t, size, set_p, 0, 0], true),
                (libc::SYS_sched_setaffinity, [0, size, set_p, 0, 0], false),
                (
                    libc::SYS_sched_setscheduler,
                    [t, other, param_p, 0, 0],
                    true,
                ),
                (
                    libc::SYS_sched_setscheduler,
                    [0, other, param_p, 0, 0],
                    false,
                ),
                (libc::SYS_sched_setparam, [t, param_p, 0, 0, 0], true),
                (libc::SYS_sched_setparam, [0, param_p, 0, 0, 0], false),
                (libc::SYS_sched_setattr, [t, attr_p, 0, 0, 0], true),
                (libc::SYS_sched_setattr, [0, attr_p, 0, 0, 0], false),
                (libc::SYS_ioprio_set, [1, t, be4, 0, 0], true),
                (libc::SYS_ioprio_set, [1, 0, be4, 0, 0], false),
                (libc::SYS_ioprio_set, [2, 0, be4, 0, 0], false),
                (libc::SYS_migrate_pages, [t, 64, node_p, node_p, 0], true),
                (libc::SYS_migrate_pages, [0, 64, node_p, node_p, 0], false),
                (libc::SYS_move_pages, [t, 0, 0, 0, 0], true),
                (libc::SYS_move_pages, [0, 0, 0, 0, 0], false),
                // Without the filter: EBADF.
                (
                    libc::SYS_process_madvise,
                    [-1, 0, 0, libc::MADV_COLD as L, 0],
                    true,
                ),
                (libc::SYS_process_mrelease, [-1, 0, 0, 0, 0], true),
            ];
            for (i, (nr, a, eperm)) in checks.into_iter().enumerate() {
                let r = libc::syscall(nr, a[0], a[1], a[2], a[3], a[4], 0);
                let held = if eperm {
                    refused(r, libc::EPERM)
                } else {
                    r >= 0
                };
                if !held {
                    return 10 + i as i32;
                }
            }
            // glibc's getrlimit and setrlimit call prlimit64(0, ...); nice()
            // calls setpriority(PRIO_PROCESS, 0, ...).
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0
                || libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0
            {
                return 50;
            }
            *libc::__errno_location() = 0;
            if libc::nice(1) == -1 && errno() != 0 {
                return 51;
            }
        }
        0
    }

    /// Whole-uid targets, with id 0: as [`LONE_UID`] in its namespace,
    /// they would reach only this child and its target.
    fn whole_uid_checks() -> i32 {
        // SAFETY: plain syscalls with integer arguments.
        unsafe {
            let cur = libc::getpriority(libc::PRIO_PROCESS, 0);
            if !refused(
                libc::syscall(libc::SYS_setpriority, libc::PRIO_USER, 0, cur),
                libc::EPERM,
            ) {
                return 60;
            }
            // IOPRIO_WHO_USER 3, best effort level 4.
            if !refused(
                libc::syscall(libc::SYS_ioprio_set, 3, 0, (2 << 13) | 4),
                libc::EPERM,
            ) {
                return 61;
            }
        }
        0
    }

    /// Asserts that `checks` hold under `spec`, and that each rule `pick`
    /// selects (of those that exist here) is needed: without it, they
    /// fail.
    fn each_rule_is_needed(
        spec: &SeccompSpec,
        pick: impl Fn(&Rule) -> bool,
        setup: fn() -> i32,
        checks: fn() -> i32,
    ) {
        assert_eq!(
            in_filtered_child_after(spec, setup, checks),
            0,
            "the check of that number failed"
        );
        let picked: Vec<usize> = (0..spec.rules.len())
            .filter(|&i| pick(&spec.rules[i]) && number(&spec.rules[i].syscall).is_some())
            .collect();
        assert!(!picked.is_empty());
        for i in picked {
            let mut without = spec.clone();
            let r = without.rules.remove(i);
            assert_ne!(
                in_filtered_child_after(&without, setup, checks),
                0,
                "not needed: {r:?}"
            );
        }
    }

    #[test]
    fn process_targeting_calls_reach_only_the_caller() {
        if !have_seccomp() {
            return;
        }
        use policy::sandbox::seccomp::{ONLY_SELF, WHOLE_UID};
        assert_eq!(LONE_UID.to_string(), "3999999991", "the uid map's text");
        let root = nix::unistd::geteuid().is_root();
        if !root {
            println!("not root: the whole-uid targets are not checked");
        }
        let family = |r: &Rule| {
            let whole_uid = WHOLE_UID.iter().any(|(s, a, v, _)| {
                *s == r.syscall
                    && r.when
                        == [ArgTest {
                            arg: *a,
                            width: Width::Int,
                            op: ArgOp::Eq(*v),
                        }]
            });
            ONLY_SELF.iter().any(|(s, ..)| *s == r.syscall) && (root || !whole_uid)
                || ["process_madvise", "process_mrelease"].contains(&r.syscall.as_str())
        };
        each_rule_is_needed(&spec(false, true), family, setup_targets, checks_targets);
    }

    /// A file of the test's own for the chown checks (set before fork).
    static CHOWN_FILE: std::sync::OnceLock<std::ffi::CString> = std::sync::OnceLock::new();

    /// The chown family, with owner and group -1 (a change of nothing,
    /// which still clears set-user-ID bits): each succeeds without the
    /// filter.
    fn checks_chown() -> i32 {
        let Some(path) = CHOWN_FILE.get() else {
            return 1;
        };
        let (p, none) = (path.as_ptr(), libc::c_long::from(-1i32));
        // SAFETY: plain syscalls on a path that outlives the child and a
        // descriptor this function opens.
        unsafe {
            let fd = libc::memfd_create(c"f".as_ptr(), 0);
            if fd < 0 {
                return 2;
            }
            if !refused(libc::syscall(libc::SYS_fchown, fd, none, none), libc::EPERM) {
                return 3;
            }
            let at = libc::syscall(libc::SYS_fchownat, libc::AT_FDCWD, p, none, none, 0);
            if !refused(at, libc::EPERM) {
                return 4;
            }
            #[cfg(target_arch = "x86_64")]
            {
                if !refused(libc::syscall(libc::SYS_chown, p, none, none), libc::EPERM) {
                    return 5;
                }
                if !refused(libc::syscall(libc::SYS_lchown, p, none, none), libc::EPERM) {
                    return 6;
                }
            }
        }
        0
    }

    #[test]
    fn the_chown_family_is_refused() {
        if !have_seccomp() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"").unwrap();
        let path = std::ffi::CString::new(file.as_os_str().as_encoded_bytes()).unwrap();
        CHOWN_FILE.set(path).unwrap();
        let chown =
            |r: &Rule| ["chown", "fchown", "lchown", "fchownat"].contains(&r.syscall.as_str());
        for s in [spec(false, true), spec(true, true)] {
            each_rule_is_needed(&s, chown, no_setup, checks_chown);
        }
    }

    /// `execveat(fd, "", {NULL}, {NULL}, AT_EMPTY_PATH)`: fexecve.
    fn execveat_empty_path(fd: libc::c_int) -> i64 {
        let none = [std::ptr::null::<libc::c_char>()];
        // SAFETY: a valid empty path and empty argument and environment
        // arrays; on a descriptor that is not open it fails with EBADF.
        unsafe {
            libc::syscall(
                libc::SYS_execveat,
                fd,
                c"".as_ptr(),
                none.as_ptr(),
                none.as_ptr(),
                libc::AT_EMPTY_PATH,
            )
        }
    }

    /// Without the exec right: memfd_create and executing a descriptor
    /// are refused (each succeeds or fails otherwise without the filter),
    /// execveat with a path is not.
    fn checks_fd_exec() -> i32 {
        let none = [std::ptr::null::<libc::c_char>()];
        // SAFETY: plain syscalls with valid strings and arrays; the
        // execveat calls fail (no such descriptor, no such path).
        unsafe {
            let fd = libc::syscall(libc::SYS_memfd_create, c"f".as_ptr(), 0);
            if !refused(fd, libc::EPERM) {
                return 1;
            }
            if !refused(execveat_empty_path(-1), libc::EPERM) {
                return 2;
            }
            let by_path = libc::syscall(
                libc::SYS_execveat,
                libc::AT_FDCWD,
                c"/nonexistent-dir-of-the-seccomp-test/p".as_ptr(),
                none.as_ptr(),
                none.as_ptr(),
                0,
            );
            if !refused(by_path, libc::ENOENT) {
                return 3;
            }
        }
        0
    }

    #[test]
    fn without_the_exec_right_memfds_and_descriptors_do_not_execute() {
        if !have_seccomp() {
            return;
        }
        let fd_exec = |r: &Rule| r.syscall == "memfd_create" || r.syscall == "execveat";
        each_rule_is_needed(&spec(false, false), fd_exec, no_setup, checks_fd_exec);
    }

    /// A 32-bit syscall (`int 0x80`, getpid) on x86_64.
    #[cfg(target_arch = "x86_64")]
    fn i386_getpid() -> i32 {
        let mut ret: i64 = 20;
        // SAFETY: i386 getpid takes no argument and touches no memory;
        // int 0x80 clobbers only eax (and, on entry, r8-r11).
        unsafe {
            std::arch::asm!(
                "int 0x80",
                inlateout("rax") ret,
                lateout("r8") _, lateout("r9") _, lateout("r10") _, lateout("r11") _,
                options(nostack)
            );
        }
        if ret > 0 {
            0
        } else {
            1
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_syscall_of_another_architecture_kills_the_process() {
        use nix::sys::signal::Signal;
        use nix::sys::wait::WaitStatus;
        if !have_seccomp() {
            return;
        }
        // Without a filter the 32-bit call works (else the host has no
        // 32-bit emulation and there is nothing to check).
        let none = SeccompSpec {
            rules: Vec::new(),
            only_unix_sockets: false,
            only_unix_and_inet_sockets: false,
            deny_fd_exec: false,
        };
        match run_filtered(&none, no_setup, i386_getpid) {
            WaitStatus::Exited(_, 0) => {}
            other => {
                crate::testsupport::skip("seccomp", &format!("no 32-bit syscalls: {other:?}"));
                return;
            }
        }
        match run_filtered(&spec(false, true), no_setup, i386_getpid) {
            WaitStatus::Signaled(_, Signal::SIGSYS, _) => {}
            other => panic!("{other:?}"),
        }
    }

    /// An x32 syscall (getpid with the x32 bit): returns 0 whatever the
    /// kernel answers (ENOSYS without x32 support), unless it kills.
    #[cfg(target_arch = "x86_64")]
    fn x32_getpid() -> i32 {
        // SAFETY: getpid takes no argument and touches no memory.
        unsafe { libc::syscall(0x4000_0000 | libc::SYS_getpid) };
        0
    }

    /// getpid, by its x86_64 number: 0 when it answers.
    #[cfg(target_arch = "x86_64")]
    fn plain_getpid() -> i32 {
        // SAFETY: getpid takes no argument and touches no memory.
        i32::from(unsafe { libc::syscall(libc::SYS_getpid) } <= 0)
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn an_x32_syscall_kills_the_process() {
        use nix::sys::signal::Signal;
        use nix::sys::wait::WaitStatus;
        if !have_seccomp() {
            return;
        }
        for s in all_specs() {
            let compiled = compile(&s).unwrap();
            assert!(compiled
                .describe(&s)
                .contains("x32 syscalls kill the process"));
            // seccompiler's filters alone let it through: its rules
            // compare whole numbers.
            let unguarded = Compiled {
                guard: None,
                programs: compiled.programs.clone(),
                denied: compiled.denied,
                absent: Vec::new(),
            };
            match run_compiled(&unguarded, no_setup, x32_getpid) {
                WaitStatus::Exited(_, 0) => {}
                other => panic!("without the guard: {other:?}"),
            }
            match run_compiled(&compiled, no_setup, x32_getpid) {
                WaitStatus::Signaled(_, Signal::SIGSYS, _) => {}
                other => panic!("with the guard: {other:?}"),
            }
            // An ordinary call still passes the guard.
            assert_eq!(in_filtered_child(&s, plain_getpid), 0);
        }
    }
}
