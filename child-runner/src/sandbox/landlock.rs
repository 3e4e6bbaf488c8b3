//! Landlock: the file-system rules (every right the kernel's ABI has), TCP
//! when the run has no network, and the abstract-socket and signal scopes.
//! Built and enforced in the child; a rule set the kernel cannot enforce
//! fully is an error, never a silent fallback.

use landlock::{
    Access, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, PathBeneath, Ruleset,
    RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};
use policy::sandbox::fs::{Access as Want, FsRules};
use std::path::{Path, PathBuf};

/// Landlock could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum LandlockError {
    /// The kernel has no Landlock.
    #[error("landlock: not supported by this kernel")]
    Unsupported,
    /// A rule's path could not be opened (or examined once open).
    #[error("landlock: {}: {source}", path.display())]
    Path {
        /// The path.
        path: PathBuf,
        /// The underlying error.
        source: nix::errno::Errno,
    },
    /// A path granted as one file is not a regular file.
    #[error("landlock: {}: not a regular file (an agent program is granted as one file)", path.display())]
    NotAFile {
        /// The path.
        path: PathBuf,
    },
    /// The ruleset could not be built or enforced.
    #[error("landlock: {0}")]
    Ruleset(#[from] landlock::RulesetError),
    /// The kernel enforced less than asked.
    #[error("landlock: the rules were only {0} enforced")]
    NotFully(&'static str),
}

/// The newest Landlock ABI this build knows the rights of.
pub const NEWEST_KNOWN_ABI: i32 = 10;

/// The kernel's Landlock ABI version (0: none).
pub fn kernel_abi() -> i32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a null attribute pointer, size 0 and the VERSION flag,
    // landlock_create_ruleset only returns the ABI version; no memory is
    // read or written.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if v < 0 {
        0
    } else {
        v as i32
    }
}

/// The crate's ABI for a kernel version number (capped at what the crate
/// knows).
pub fn abi(version: i32) -> ABI {
    match version {
        ..=0 => ABI::Unsupported,
        1 => ABI::V1,
        2 => ABI::V2,
        3 => ABI::V3,
        4 => ABI::V4,
        5 => ABI::V5,
        6 => ABI::V6,
        7 => ABI::V7,
        8 => ABI::V8,
        9 => ABI::V9,
        _ => ABI::V10,
    }
}

/// What the ruleset allows of TCP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetRules {
    /// Nothing is restricted (full network).
    Open,
    /// No bind; connect only to these ports (none: no TCP at all).
    ConnectOnly(Vec<u16>),
}

/// The TCP rules of a run: none without network, the proxy port in
/// allowlist mode (and the gateway's for a driver run), open with full
/// network.
pub fn net_rules(spec: &policy::sandbox::SandboxSpec) -> NetRules {
    if spec.network {
        return NetRules::Open;
    }
    let proxy = spec.egress.as_ref().map(|e| e.proxy_port);
    let gateway = spec.gateway.as_ref().map(|g| g.port);
    NetRules::ConnectOnly(proxy.into_iter().chain(gateway).collect())
}

/// Builds the ruleset (opening every rule's path now, while the process
/// may still reach it) without enforcing it. `net` restricts TCP bind
/// and connect (ABI 4+).
pub fn build(
    rules: &FsRules,
    net: NetRules,
    version: i32,
) -> Result<landlock::RulesetCreated, LandlockError> {
    let abi = abi(version);
    if abi == ABI::Unsupported {
        return Err(LandlockError::Unsupported);
    }
    let all = AccessFs::from_all(abi);
    let read_exec = AccessFs::from_read(abi);
    let read = read_exec & !AccessFs::Execute;
    let read_write = all & !AccessFs::Execute;
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(all)?;
    let ports = match net {
        NetRules::ConnectOnly(ports) if version >= 4 => {
            ruleset = ruleset.handle_access(AccessNet::from_all(abi))?;
            ports
        }
        _ => Vec::new(),
    };
    if version >= 6 {
        ruleset = ruleset.scope(Scope::from_all(abi))?;
    }
    let mut beneath = Vec::new();
    let mut add = |path: &std::path::Path,
                   want: Want,
                   must_exist: bool,
                   file_only: bool|
     -> Result<(), LandlockError> {
        // The rule is on what was opened; its kind comes from that same
        // descriptor.
        let (fd, is_dir) = match open_rule_path(path, file_only) {
            Ok(opened) => opened,
            Err(_) if !must_exist => return Ok(()),
            Err(e) => return Err(e),
        };
        let mut access = match want {
            Want::Read => read,
            Want::ReadExec => read_exec,
            Want::ReadWrite => read_write,
        };
        if !is_dir {
            access &= AccessFs::from_file(abi);
        }
        beneath.push(PathBeneath::new(fd, access));
        Ok(())
    };
    for r in &rules.rules {
        add(&r.path, r.access, r.must_exist, r.file_only)?;
    }
    if rules.proc_self {
        // Resolved now, in the child: its own /proc/<pid>, nobody else's.
        add(Path::new("/proc/self"), Want::Read, true, false)?;
    }
    ruleset
        .create()?
        .add_rules(beneath.into_iter().map(Ok::<_, landlock::RulesetError>))?
        .add_rules(
            ports
                .into_iter()
                .map(|p| Ok::<_, landlock::RulesetError>(NetPort::new(p, AccessNet::ConnectTcp))),
        )
        .map_err(LandlockError::Ruleset)
}

/// Opens a rule's path with `O_PATH` and says whether it is a directory.
/// A `file_only` path must be a regular file reached with no symlink on
/// the way (the daemon resolved it to a canonical path).
fn open_rule_path(
    path: &Path,
    file_only: bool,
) -> Result<(std::os::fd::OwnedFd, bool), LandlockError> {
    use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
    let bad = |source| LandlockError::Path {
        path: path.to_path_buf(),
        source,
    };
    let flags = OFlag::O_PATH | OFlag::O_CLOEXEC;
    let fd = if file_only {
        let how = OpenHow::new()
            .flags(flags)
            .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_MAGICLINKS);
        nix::fcntl::openat2(nix::fcntl::AT_FDCWD, path, how)
    } else {
        nix::fcntl::open(path, flags, nix::sys::stat::Mode::empty())
    }
    .map_err(bad)?;
    let st = nix::sys::stat::fstat(&fd).map_err(bad)?;
    let kind =
        nix::sys::stat::SFlag::from_bits_truncate(st.st_mode) & nix::sys::stat::SFlag::S_IFMT;
    if file_only && kind != nix::sys::stat::SFlag::S_IFREG {
        return Err(LandlockError::NotAFile {
            path: path.to_path_buf(),
        });
    }
    Ok((fd, kind == nix::sys::stat::SFlag::S_IFDIR))
}

/// Restricts the calling process with a built ruleset; anything short of
/// full enforcement is an error.
pub fn enforce(created: landlock::RulesetCreated) -> Result<(), LandlockError> {
    let status = created.restrict_self()?;
    match status.ruleset {
        RulesetStatus::FullyEnforced => Ok(()),
        RulesetStatus::PartiallyEnforced => Err(LandlockError::NotFully("partially")),
        RulesetStatus::NotEnforced => Err(LandlockError::NotFully("not")),
    }
}
