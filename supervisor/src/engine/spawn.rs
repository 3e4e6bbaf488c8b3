//! Starting a runner with `posix_spawn` instead of fork + exec.
//!
//! The daemon is a multi-threaded tokio process. A `fork` from it copies
//! its page tables and, in glibc, first takes every malloc arena lock, so it
//! waits for whichever worker thread holds one; with a `pre_exec` hook,
//! `std::process::Command` must fork. glibc's `posix_spawn` uses
//! `clone(CLONE_VM | CLONE_VFORK)`: no page-table copy, no arena locks, and
//! exec errors come back as its return value. Everything the runner needs
//! set up before its first instruction is expressed as spawn attributes:
//! a new session, the blocked signal mask, SIGPIPE back to its default,
//! cwd `/`, stdin (`/dev/null`, or a warm runner's socket), stdout and
//! stderr (runner.log, or `/dev/null` for a warm runner), runner.lock as
//! fd 3 and the run's uid lease as fd 4 (both without close-on-exec) when
//! there are.

use nix::sys::signal::SigSet;
use std::ffi::{CString, NulError};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The fd number the runner finds runner.lock on.
pub const LOCK_FD: RawFd = 3;

/// The fd number the runner finds its uid lease on (with
/// `--uid-lock-fd 4`).
pub const UID_LOCK_FD: RawFd = 4;

/// Why a runner could not be spawned.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// A path or argument holds a NUL byte.
    #[error("{what} contains a NUL byte: {source}")]
    Nul {
        /// Which string.
        what: &'static str,
        /// The error.
        source: NulError,
    },
    /// A posix_spawn setup call or the spawn itself failed.
    #[error("{op} {program}: {source}")]
    Sys {
        /// The call.
        op: &'static str,
        /// The program.
        program: String,
        /// The error.
        source: std::io::Error,
    },
}

/// What a spawned runner gets.
pub struct RunnerSpawn<'a> {
    /// The program.
    pub program: &'a Path,
    /// Its arguments (without argv\[0\], which is the program).
    pub args: &'a [String],
    /// Its stdin (None: `/dev/null`).
    pub stdin: Option<BorrowedFd<'a>>,
    /// Its stdout and stderr (None: `/dev/null`).
    pub output: Option<BorrowedFd<'a>>,
    /// The descriptor handed over as fd [`LOCK_FD`], if any.
    pub lock: Option<BorrowedFd<'a>>,
    /// The descriptor handed over as fd [`UID_LOCK_FD`], if any.
    pub uid_lock: Option<BorrowedFd<'a>>,
    /// The signals blocked from its first instruction.
    pub blocked: SigSet,
}

/// An initialised `posix_spawn_file_actions_t`, destroyed on drop.
struct FileActions(libc::posix_spawn_file_actions_t);

impl Drop for FileActions {
    fn drop(&mut self) {
        // SAFETY: initialised in `spawn` before this value was built, and
        // destroyed exactly once here.
        unsafe { libc::posix_spawn_file_actions_destroy(&mut self.0) };
    }
}

/// An initialised `posix_spawnattr_t`, destroyed on drop.
struct Attr(libc::posix_spawnattr_t);

impl Drop for Attr {
    fn drop(&mut self) {
        // SAFETY: initialised in `spawn` before this value was built, and
        // destroyed exactly once here.
        unsafe { libc::posix_spawnattr_destroy(&mut self.0) };
    }
}

fn cstr(what: &'static str, bytes: &[u8]) -> Result<CString, SpawnError> {
    CString::new(bytes).map_err(|source| SpawnError::Nul { what, source })
}

/// Spawns the runner; returns its pid. The caller reaps it (via a pidfd).
pub fn spawn(s: &RunnerSpawn<'_>) -> Result<i32, SpawnError> {
    let program = s.program.display().to_string();
    let check = |op: &'static str, rc: libc::c_int| {
        if rc == 0 {
            Ok(())
        } else {
            Err(SpawnError::Sys {
                op,
                program: program.clone(),
                source: std::io::Error::from_raw_os_error(rc),
            })
        }
    };
    let path = cstr("the runner's path", s.program.as_os_str().as_bytes())?;
    let mut argv_c = vec![path.clone()];
    for a in s.args {
        argv_c.push(cstr("a runner argument", a.as_bytes())?);
    }
    let mut argv: Vec<*mut libc::c_char> = argv_c.iter().map(|a| a.as_ptr().cast_mut()).collect();
    argv.push(std::ptr::null_mut());
    let envp: [*mut libc::c_char; 1] = [std::ptr::null_mut()];
    let dev_null = cstr("/dev/null", b"/dev/null")?;
    let root = cstr("/", b"/")?;

    // dup2(fd, fd) would keep close-on-exec, and one dup2 could overwrite
    // the other's source: move both off fds 3 and 4 first.
    let off_low =
        |fd: Option<BorrowedFd<'_>>, what: &'static str| -> Result<Option<OwnedFd>, SpawnError> {
            let Some(fd) = fd.filter(|f| [LOCK_FD, UID_LOCK_FD].contains(&f.as_raw_fd())) else {
                return Ok(None);
            };
            // SAFETY: F_DUPFD_CLOEXEC on a descriptor we borrow returns a new
            // descriptor (>= 10) or -1; no memory is touched.
            let new = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 10) };
            if new < 0 {
                return Err(SpawnError::Sys {
                    op: what,
                    program: program.clone(),
                    source: std::io::Error::last_os_error(),
                });
            }
            // SAFETY: the kernel just returned this descriptor; we own it.
            Ok(Some(unsafe { OwnedFd::from_raw_fd(new) }))
        };
    let moved_lock = off_low(s.lock, "fcntl(F_DUPFD_CLOEXEC) runner.lock for")?;
    let moved_uid = off_low(s.uid_lock, "fcntl(F_DUPFD_CLOEXEC) the uid lease for")?;
    let uid_fd = match &moved_uid {
        Some(f) => Some(f.as_raw_fd()),
        None => s.uid_lock.map(|l| l.as_raw_fd()),
    };
    let lock_fd = match &moved_lock {
        Some(f) => Some(f.as_raw_fd()),
        None => s.lock.map(|l| l.as_raw_fd()),
    };

    // SAFETY: zeroed storage is what posix_spawn_file_actions_init expects
    // to initialise; `FileActions` destroys it only after a successful init.
    let mut fa = unsafe {
        let mut raw: libc::posix_spawn_file_actions_t = std::mem::zeroed();
        check(
            "posix_spawn_file_actions_init",
            libc::posix_spawn_file_actions_init(&mut raw),
        )?;
        FileActions(raw)
    };
    // SAFETY: each call records an action in `fa` (initialised above); the
    // strings are copied by glibc, the descriptors are only numbers here.
    // In order: stdin, stdout, stderr, then the lock (the daemon's own
    // descriptors are all above 2, so none is overwritten before use).
    unsafe {
        match s.stdin {
            Some(fd) => check(
                "posix_spawn_file_actions_adddup2 stdin for",
                libc::posix_spawn_file_actions_adddup2(&mut fa.0, fd.as_raw_fd(), 0),
            )?,
            None => check(
                "posix_spawn_file_actions_addopen /dev/null for",
                libc::posix_spawn_file_actions_addopen(
                    &mut fa.0,
                    0,
                    dev_null.as_ptr(),
                    libc::O_RDONLY,
                    0,
                ),
            )?,
        }
        match s.output {
            Some(fd) => check(
                "posix_spawn_file_actions_adddup2 stdout for",
                libc::posix_spawn_file_actions_adddup2(&mut fa.0, fd.as_raw_fd(), 1),
            )?,
            None => check(
                "posix_spawn_file_actions_addopen /dev/null (stdout) for",
                libc::posix_spawn_file_actions_addopen(
                    &mut fa.0,
                    1,
                    dev_null.as_ptr(),
                    libc::O_WRONLY,
                    0,
                ),
            )?,
        }
        check(
            "posix_spawn_file_actions_adddup2 stderr for",
            libc::posix_spawn_file_actions_adddup2(&mut fa.0, 1, 2),
        )?;
        if let Some(lock_fd) = lock_fd {
            check(
                "posix_spawn_file_actions_adddup2 runner.lock for",
                libc::posix_spawn_file_actions_adddup2(&mut fa.0, lock_fd, LOCK_FD),
            )?;
        }
        if let Some(uid_fd) = uid_fd {
            check(
                "posix_spawn_file_actions_adddup2 the uid lease for",
                libc::posix_spawn_file_actions_adddup2(&mut fa.0, uid_fd, UID_LOCK_FD),
            )?;
        }
        check(
            "posix_spawn_file_actions_addchdir_np / for",
            libc::posix_spawn_file_actions_addchdir_np(&mut fa.0, root.as_ptr()),
        )?;
    }

    // SAFETY: as for the file actions: zeroed storage for init, destroyed
    // by `Attr` only after a successful init.
    let mut attr = unsafe {
        let mut raw: libc::posix_spawnattr_t = std::mem::zeroed();
        check("posix_spawnattr_init", libc::posix_spawnattr_init(&mut raw))?;
        Attr(raw)
    };
    let mut default = SigSet::empty();
    default.add(nix::sys::signal::Signal::SIGPIPE);
    let flags = libc::POSIX_SPAWN_SETSID
        | libc::POSIX_SPAWN_SETSIGMASK as libc::c_short
        | libc::POSIX_SPAWN_SETSIGDEF as libc::c_short;
    // SAFETY: the attribute object is initialised; the sigset pointers are
    // to live values that glibc copies.
    unsafe {
        check(
            "posix_spawnattr_setsigmask for",
            libc::posix_spawnattr_setsigmask(&mut attr.0, s.blocked.as_ref()),
        )?;
        check(
            "posix_spawnattr_setsigdefault for",
            libc::posix_spawnattr_setsigdefault(&mut attr.0, default.as_ref()),
        )?;
        check(
            "posix_spawnattr_setflags for",
            libc::posix_spawnattr_setflags(&mut attr.0, flags),
        )?;
    }

    let mut pid: libc::pid_t = 0;
    // SAFETY: every pointer is to a live, NUL-terminated value (argv and
    // envp end with a null pointer); glibc returns an errno value, or 0 and
    // the new pid.
    let rc = unsafe {
        libc::posix_spawn(
            &mut pid,
            path.as_ptr(),
            &fa.0,
            &attr.0,
            argv.as_ptr(),
            envp.as_ptr(),
        )
    };
    drop(moved_lock);
    drop(moved_uid);
    check("posix_spawn", rc)?;
    Ok(pid)
}
