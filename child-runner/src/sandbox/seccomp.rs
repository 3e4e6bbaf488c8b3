//! The seccomp filters, compiled from the policy's deny-list before fork
//! and installed in the child as the last step before exec.

use policy::sandbox::seccomp::SeccompSpec;
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};
use std::collections::BTreeMap;

/// The filter could not be built or installed.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// The deny-list names a syscall this code does not know.
    #[error("seccomp: unknown syscall {0:?} in the deny-list")]
    UnknownSyscall(String),
    /// seccompiler refused the rules.
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

fn build(rules: BTreeMap<i64, Vec<SeccompRule>>, errno: i32) -> Result<BpfProgram, SeccompError> {
    let arch: TargetArch = std::env::consts::ARCH
        .try_into()
        .map_err(|e| SeccompError::Build(format!("{e:?}")))?;
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(errno as u32),
        arch,
    )
    .map_err(|e| SeccompError::Build(e.to_string()))?;
    filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| SeccompError::Build(e.to_string()))
}

/// A condition on argument `arg`: `wide` for unsigned long arguments (clone
/// flags), else the low 32 bits (ints such as a socket family or a mode).
fn cond(
    arg: u8,
    wide: bool,
    op: SeccompCmpOp,
    value: u64,
) -> Result<SeccompCondition, SeccompError> {
    let len = if wide {
        SeccompCmpArgLen::Qword
    } else {
        SeccompCmpArgLen::Dword
    };
    SeccompCondition::new(arg, len, op, value).map_err(|e| SeccompError::Build(e.to_string()))
}

fn rule(conds: Vec<SeccompCondition>) -> Result<SeccompRule, SeccompError> {
    SeccompRule::new(conds).map_err(|e| SeccompError::Build(e.to_string()))
}

/// The compiled filters and how many rules they hold.
pub struct Compiled {
    /// BPF programs, installed in order.
    pub programs: Vec<BpfProgram>,
    /// Syscalls refused outright.
    pub denied: usize,
    /// Deny-list entries that do not exist on this architecture.
    pub absent: Vec<String>,
}

/// Compiles `spec` into BPF programs: the deny-list (EPERM), namespace
/// flags on clone (EPERM) and clone3 (ENOSYS), and socket families
/// (EAFNOSUPPORT) when only Unix sockets are allowed.
pub fn compile(spec: &SeccompSpec) -> Result<Compiled, SeccompError> {
    let mut deny: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    let mut absent = Vec::new();
    for d in &spec.deny {
        match number(&d.syscall) {
            Some(n) => {
                deny.insert(n, vec![]);
            }
            None if absent_here(&d.syscall) => absent.push(d.syscall.clone()),
            None => return Err(SeccompError::UnknownSyscall(d.syscall.clone())),
        }
    }
    for d in &spec.deny_chmod {
        match number(&d.syscall) {
            Some(n) => {
                deny.insert(n, vec![]);
            }
            None if absent_here(&d.syscall) => {}
            None => return Err(SeccompError::UnknownSyscall(d.syscall.clone())),
        }
    }
    let denied = deny.len();
    if spec.deny_new_namespaces {
        let rules = CLONE_NEW_FLAGS
            .iter()
            .map(|&f| rule(vec![cond(0, true, SeccompCmpOp::MaskedEq(f), f)?]))
            .collect::<Result<Vec<_>, _>>()?;
        deny.insert(libc::SYS_clone, rules);
    }
    const SETID: [u64; 2] = [libc::S_ISUID as u64, libc::S_ISGID as u64];
    for (name, arg) in &spec.deny_setid_modes {
        if spec.deny_chmod.iter().any(|d| &d.syscall == name) {
            continue; // refused outright above
        }
        let Some(n) = number(name) else {
            if absent_here(name) {
                continue;
            }
            return Err(SeccompError::UnknownSyscall(name.clone()));
        };
        let rules = SETID
            .iter()
            .map(|&bit| rule(vec![cond(*arg, false, SeccompCmpOp::MaskedEq(bit), bit)?]))
            .collect::<Result<Vec<_>, _>>()?;
        deny.insert(n, rules);
    }
    let mut programs = vec![build(deny, libc::EPERM)?];
    let mut enosys: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for d in &spec.enosys {
        let n =
            number(&d.syscall).ok_or_else(|| SeccompError::UnknownSyscall(d.syscall.clone()))?;
        enosys.insert(n, vec![]);
    }
    if !enosys.is_empty() {
        programs.push(build(enosys, libc::ENOSYS)?);
    }
    if spec.only_unix_sockets {
        let not_unix = || {
            rule(vec![cond(
                0,
                false,
                SeccompCmpOp::Ne,
                libc::AF_UNIX as u64,
            )?])
        };
        let rules: BTreeMap<i64, Vec<SeccompRule>> = [
            (libc::SYS_socket, vec![not_unix()?]),
            (libc::SYS_socketpair, vec![not_unix()?]),
        ]
        .into();
        programs.push(build(rules, libc::EAFNOSUPPORT)?);
    }
    Ok(Compiled {
        programs,
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
    use super::*;

    #[test]
    fn every_policy_syscall_has_a_number_here() {
        let spec = policy::sandbox::seccomp::spec(false, false);
        let c = compile(&spec).unwrap();
        assert_eq!(c.denied + c.absent.len(), spec.deny.len());
        assert_eq!(c.programs.len(), 3);
        assert_eq!(
            compile(&policy::sandbox::seccomp::spec(true, true))
                .unwrap()
                .programs
                .len(),
            2
        );
    }
}
