//! The seccomp filter, compiled from the policy's deny-list before fork
//! (one binary-search program, [`super::bpf`]) and installed in the child
//! as the last step before exec.

use super::bpf::{self, Cond, Policy, Rule};
use policy::sandbox::seccomp::SeccompSpec;
use seccompiler::BpfProgram;

/// The filter could not be built or installed.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// The deny-list names a syscall this code does not know.
    #[error("seccomp: unknown syscall {0:?} in the deny-list")]
    UnknownSyscall(String),
    /// The filter cannot be built here.
    #[error("seccomp: building the filter: {0}")]
    Build(String),
    /// The kernel refused the filter.
    #[error("seccomp: installing the filter: {0}")]
    Install(String),
}

/// Syscalls that do not exist on this architecture (skipped, reported).
fn absent_here(name: &str) -> bool {
    cfg!(not(target_arch = "x86_64"))
        && matches!(
            name,
            "iopl" | "ioperm" | "uselib" | "chmod" | "open" | "creat" | "mkdir" | "mknod"
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
        #[cfg(target_arch = "x86_64")]
        "iopl" => libc::SYS_iopl,
        #[cfg(target_arch = "x86_64")]
        "ioperm" => libc::SYS_ioperm,
        #[cfg(target_arch = "x86_64")]
        "uselib" => libc::SYS_uselib,
        "fanotify_init" => libc::SYS_fanotify_init,
        "vhangup" => libc::SYS_vhangup,
        "lookup_dcookie" => libc::SYS_lookup_dcookie,
        "personality" => libc::SYS_personality,
        "clone3" => libc::SYS_clone3,
        "openat2" => libc::SYS_openat2,
        "fchmod" => libc::SYS_fchmod,
        "fchmodat" => libc::SYS_fchmodat,
        "fchmodat2" => libc::SYS_fchmodat2,
        "openat" => libc::SYS_openat,
        "mkdirat" => libc::SYS_mkdirat,
        "mknodat" => libc::SYS_mknodat,
        #[cfg(target_arch = "x86_64")]
        "chmod" => libc::SYS_chmod,
        #[cfg(target_arch = "x86_64")]
        "open" => libc::SYS_open,
        #[cfg(target_arch = "x86_64")]
        "creat" => libc::SYS_creat,
        #[cfg(target_arch = "x86_64")]
        "mkdir" => libc::SYS_mkdir,
        #[cfg(target_arch = "x86_64")]
        "mknod" => libc::SYS_mknod,
        _ => return None,
    };
    Some(n)
}

const CLONE_NEW_FLAGS: [u64; 7] = [
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWCGROUP as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
];

/// The compiled filter and how many rules it holds.
pub struct Compiled {
    /// BPF programs, installed in order (one: see [`super::bpf`]).
    pub programs: Vec<BpfProgram>,
    /// Syscalls refused outright.
    pub denied: usize,
    /// Deny-list entries that do not exist on this architecture.
    pub absent: Vec<String>,
}

fn nr(n: i64) -> u32 {
    // Syscall numbers are small and positive.
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn always(errno: i32) -> Rule {
    Rule {
        conds: vec![],
        errno: errno as u32,
    }
}

/// `(arg & bit) == bit`, on the whole argument (`wide`) or its low 32 bits.
fn has_bit(arg: u8, wide: bool, bit: u64, errno: i32) -> Rule {
    Rule {
        conds: vec![Cond {
            arg,
            wide,
            mask: bit,
            value: bit,
            negate: false,
        }],
        errno: errno as u32,
    }
}

/// The policy `spec` describes, as rules per syscall number in the order
/// they apply: socket families (EAFNOSUPPORT) first, then ENOSYS, then
/// EPERM (the order the kernel gave the three filters this replaced: the
/// last installed decides between equal actions).
pub fn policy(spec: &SeccompSpec) -> Result<(Policy, usize, Vec<String>), SeccompError> {
    let mut p = Policy::new();
    let mut absent = Vec::new();
    for (list, report) in [(&spec.deny, true), (&spec.deny_chmod, false)] {
        for d in list {
            match number(&d.syscall) {
                Some(n) => {
                    p.insert(nr(n), vec![always(libc::EPERM)]);
                }
                None if absent_here(&d.syscall) => {
                    if report {
                        absent.push(d.syscall.clone());
                    }
                }
                None => return Err(SeccompError::UnknownSyscall(d.syscall.clone())),
            }
        }
    }
    let denied = p.len();
    if spec.deny_new_namespaces {
        let rules = p.entry(nr(libc::SYS_clone)).or_default();
        for f in CLONE_NEW_FLAGS {
            rules.push(has_bit(0, true, f, libc::EPERM));
        }
    }
    const SETID: [u64; 2] = [libc::S_ISUID as u64, libc::S_ISGID as u64];
    for (name, arg) in &spec.deny_setid_modes {
        let Some(n) = number(name) else {
            if absent_here(name) {
                continue;
            }
            return Err(SeccompError::UnknownSyscall(name.clone()));
        };
        let rules = p.entry(nr(n)).or_default();
        for bit in SETID {
            rules.push(has_bit(*arg, false, bit, libc::EPERM));
        }
    }
    for d in &spec.enosys {
        let n =
            number(&d.syscall).ok_or_else(|| SeccompError::UnknownSyscall(d.syscall.clone()))?;
        p.entry(nr(n)).or_default().insert(0, always(libc::ENOSYS));
    }
    if spec.only_unix_sockets {
        for n in [libc::SYS_socket, libc::SYS_socketpair] {
            let not_unix = Rule {
                conds: vec![Cond {
                    arg: 0,
                    wide: false,
                    mask: u64::from(u32::MAX),
                    value: libc::AF_UNIX as u64,
                    negate: true,
                }],
                errno: libc::EAFNOSUPPORT as u32,
            };
            p.entry(nr(n)).or_default().insert(0, not_unix);
        }
    }
    Ok((p, denied, absent))
}

/// `AUDIT_ARCH_*` of this build's architecture.
fn audit_arch() -> Result<u32, SeccompError> {
    match std::env::consts::ARCH {
        "x86_64" => Ok(0xc000_003e),
        "aarch64" => Ok(0xc000_00b7),
        "riscv64" => Ok(0xc000_00f3),
        other => Err(SeccompError::Build(format!(
            "no seccomp support for {other}"
        ))),
    }
}

/// Compiles `spec` into one BPF program: the deny-list (EPERM), namespace
/// flags on clone (EPERM) and clone3 (ENOSYS), set-id mode bits (EPERM),
/// and socket families (EAFNOSUPPORT) when only Unix sockets are allowed.
pub fn compile(spec: &SeccompSpec) -> Result<Compiled, SeccompError> {
    let (p, denied, absent) = policy(spec)?;
    Ok(Compiled {
        programs: vec![bpf::compile(&p, audit_arch()?)],
        denied,
        absent,
    })
}

/// Installs the compiled filters on the calling thread (needs
/// no_new_privs or CAP_SYS_ADMIN).
pub fn install(compiled: &Compiled) -> Result<(), SeccompError> {
    for p in &compiled.programs {
        seccompiler::apply_filter(p).map_err(|e| SeccompError::Install(e.to_string()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use seccompiler::{
        SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
    };
    use std::collections::BTreeMap;

    #[test]
    fn every_policy_syscall_has_a_number_here() {
        let spec = policy::sandbox::seccomp::spec(false, false);
        let c = compile(&spec).unwrap();
        assert_eq!(c.denied + c.absent.len(), spec.deny.len());
        assert_eq!(c.programs.len(), 1);
    }

    /// The three seccompiler filters this module installed before the
    /// binary-search program, kept as the reference.
    fn seccompiler_programs(spec: &SeccompSpec) -> Vec<BpfProgram> {
        let build = |rules: BTreeMap<i64, Vec<SeccompRule>>, errno: i32| -> BpfProgram {
            SeccompFilter::new(
                rules,
                SeccompAction::Allow,
                SeccompAction::Errno(errno as u32),
                std::env::consts::ARCH.try_into().unwrap(),
            )
            .unwrap()
            .try_into()
            .unwrap()
        };
        let cond = |arg: u8, wide: bool, op: SeccompCmpOp, v: u64| {
            let len = if wide {
                SeccompCmpArgLen::Qword
            } else {
                SeccompCmpArgLen::Dword
            };
            SeccompCondition::new(arg, len, op, v).unwrap()
        };
        let mut deny: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
        for d in spec.deny.iter().chain(&spec.deny_chmod) {
            if let Some(n) = number(&d.syscall) {
                deny.insert(n, vec![]);
            }
        }
        if spec.deny_new_namespaces {
            let rules = CLONE_NEW_FLAGS
                .iter()
                .map(|&f| {
                    SeccompRule::new(vec![cond(0, true, SeccompCmpOp::MaskedEq(f), f)]).unwrap()
                })
                .collect();
            deny.insert(libc::SYS_clone, rules);
        }
        for (name, arg) in &spec.deny_setid_modes {
            if spec.deny_chmod.iter().any(|d| &d.syscall == name) {
                continue;
            }
            let Some(n) = number(name) else { continue };
            let rules = [libc::S_ISUID as u64, libc::S_ISGID as u64]
                .iter()
                .map(|&b| {
                    SeccompRule::new(vec![cond(*arg, false, SeccompCmpOp::MaskedEq(b), b)]).unwrap()
                })
                .collect();
            deny.insert(n, rules);
        }
        let mut out = vec![build(deny, libc::EPERM)];
        let enosys: BTreeMap<i64, Vec<SeccompRule>> = spec
            .enosys
            .iter()
            .map(|d| (number(&d.syscall).unwrap(), vec![]))
            .collect();
        if !enosys.is_empty() {
            out.push(build(enosys, libc::ENOSYS));
        }
        if spec.only_unix_sockets {
            let not_unix = || {
                vec![
                    SeccompRule::new(vec![cond(0, false, SeccompCmpOp::Ne, libc::AF_UNIX as u64)])
                        .unwrap(),
                ]
            };
            out.push(build(
                [
                    (libc::SYS_socket, not_unix()),
                    (libc::SYS_socketpair, not_unix()),
                ]
                .into(),
                libc::EAFNOSUPPORT,
            ));
        }
        out
    }

    /// Runs `checks` in a forked child with the compiled filter of
    /// `spec` installed; returns the child's exit code (0: every check
    /// held; otherwise the number of the first that did not).
    fn in_filtered_child(spec: &SeccompSpec, checks: fn() -> i32) -> i32 {
        let compiled = compile(spec).unwrap();
        // SAFETY: the child only makes syscalls (no allocation, no lock)
        // and leaves with _exit; the parent waits for it.
        match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => {
                // SAFETY: prctl and seccomp on this process only; the
                // program outlives the call.
                let code = unsafe {
                    if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                        100
                    } else {
                        let p = &compiled.programs[0];
                        let prog = libc::sock_fprog {
                            len: p.len() as u16,
                            filter: p.as_ptr() as *mut libc::sock_filter,
                        };
                        if libc::syscall(libc::SYS_seccomp, 1, 0, &prog) != 0 {
                            101
                        } else {
                            checks()
                        }
                    }
                };
                // SAFETY: leaves the forked child without running the
                // parent's destructors.
                unsafe { libc::_exit(code) }
            }
            nix::unistd::ForkResult::Parent { child } => {
                match nix::sys::wait::waitpid(child, None).unwrap() {
                    nix::sys::wait::WaitStatus::Exited(_, c) => c,
                    other => panic!("{other:?}"),
                }
            }
        }
    }

    fn errno() -> i32 {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
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
            if libc::syscall(libc::SYS_unshare, libc::CLONE_NEWUTS) != -1 || errno() != libc::EPERM
            {
                return 2;
            }
            if libc::syscall(libc::SYS_clone3, std::ptr::null::<u8>(), 0) != -1
                || errno() != libc::ENOSYS
            {
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
            if r != -1 || errno() != libc::EPERM {
                return 4;
            }
            if libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) != -1
                || errno() != libc::EAFNOSUPPORT
            {
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
            if libc::fchmod(fd, 0o4755) != -1 || errno() != libc::EPERM {
                return 8;
            }
            if libc::fchmod(fd, 0o644) != 0 {
                return 9;
            }
            if libc::syscall(libc::SYS_acct, std::ptr::null::<u8>()) != -1 || errno() != libc::EPERM
            {
                return 10;
            }
        }
        0
    }

    #[test]
    fn the_kernel_applies_the_program_as_compiled() {
        if !std::path::Path::new("/proc/sys/kernel/seccomp/actions_avail").exists() {
            crate::testsupport::skip("seccomp", "this kernel has no seccomp filters");
            return;
        }
        let spec = policy::sandbox::seccomp::spec(false, false);
        assert_eq!(
            in_filtered_child(&spec, checks),
            0,
            "the check of that number failed"
        );
    }

    /// What the kernel returns for stacked filters: every filter runs, the
    /// lowest action wins, and between equal actions the filter installed
    /// last.
    fn stacked(programs: &[BpfProgram], arch: u32, nr: u32, args: &[u64; 6]) -> u32 {
        let mut best = u32::MAX;
        for p in programs.iter().rev() {
            let r = bpf::interp::run(p, arch, nr, args);
            if (r & 0xffff_0000) < (best & 0xffff_0000) || best == u32::MAX {
                best = r;
            }
        }
        best
    }

    #[test]
    fn the_single_program_decides_as_the_three_seccompiler_filters_did() {
        let arch = audit_arch().unwrap();
        let flags = [
            0u64,
            libc::CLONE_NEWUSER as u64,
            libc::CLONE_NEWNET as u64 | libc::SIGCHLD as u64,
            libc::CLONE_VM as u64 | libc::CLONE_THREAD as u64,
            u64::MAX,
        ];
        let modes = [0o644u64, 0o4755, 0o2755, 0o6755, 0o1777, 1 << 32 | 0o644];
        let families = [
            libc::AF_UNIX as u64,
            libc::AF_INET as u64,
            libc::AF_NETLINK as u64,
            1 << 32 | 1,
        ];
        let mut samples = Vec::new();
        for &a in flags.iter().chain(&families) {
            for &m in &modes {
                samples.push([a, m, m, m, 0, 0]);
            }
        }
        for (network, unrestricted) in [(false, false), (true, false), (false, true), (true, true)]
        {
            let spec = policy::sandbox::seccomp::spec(network, unrestricted);
            let old = seccompiler_programs(&spec);
            let new = compile(&spec).unwrap().programs;
            assert_eq!(new.len(), 1);
            for nr in 0..600 {
                for args in &samples {
                    assert_eq!(
                        bpf::interp::run(&new[0], arch, nr, args),
                        stacked(&old, arch, nr, args),
                        "spec {network}/{unrestricted}, nr {nr}, args {args:?}"
                    );
                }
            }
            // Another architecture is killed by both.
            assert_eq!(
                bpf::interp::run(&new[0], 0x4000_0003, 1, &[0; 6]),
                stacked(&old, 0x4000_0003, 1, &[0; 6])
            );
        }
    }
}
