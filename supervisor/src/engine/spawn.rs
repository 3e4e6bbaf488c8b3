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
//! cwd `/`, stdin `/dev/null`, stdout and stderr (runner.log), and the
//! descriptors it is handed, each at the number it is told (without
//! close-on-exec).

use nix::sys::signal::SigSet;
use std::ffi::{CString, NulError};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

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
    /// Its stdout and stderr (None: `/dev/null`).
    pub output: Option<BorrowedFd<'a>>,
    /// Descriptors handed over: each source at the number beside it (3 and
    /// up, each number once).
    pub fds: &'a [(BorrowedFd<'a>, RawFd)],
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

/// A failed posix_spawn call as an error.
fn check(program: &Path, op: &'static str, rc: libc::c_int) -> Result<(), SpawnError> {
    if rc == 0 {
        return Ok(());
    }
    Err(SpawnError::Sys {
        op,
        program: program.display().to_string(),
        source: std::io::Error::from_raw_os_error(rc),
    })
}

/// Copies of the handed-over sources whose numbers are also targets: a
/// dup2 onto one of them would overwrite a source not yet copied. Each
/// copy is close-on-exec and above every target. Returns the sources to
/// use, in order, and the copies (which must live until the spawn).
fn sources(s: &RunnerSpawn<'_>) -> Result<(Vec<RawFd>, Vec<OwnedFd>), SpawnError> {
    let targets: Vec<RawFd> = s.fds.iter().map(|(_, to)| *to).collect();
    let above = targets.iter().copied().max().unwrap_or(2) + 1;
    let (mut out, mut moved) = (Vec::new(), Vec::new());
    for (fd, _) in s.fds {
        if !targets.contains(&fd.as_raw_fd()) {
            out.push(fd.as_raw_fd());
            continue;
        }
        // SAFETY: F_DUPFD_CLOEXEC on a descriptor we borrow returns a new
        // descriptor or -1; no memory is touched.
        let new = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, above) };
        if new < 0 {
            return Err(SpawnError::Sys {
                op: "fcntl(F_DUPFD_CLOEXEC) a descriptor for",
                program: s.program.display().to_string(),
                source: std::io::Error::last_os_error(),
            });
        }
        // SAFETY: the kernel just returned this descriptor; we own it.
        moved.push(unsafe { OwnedFd::from_raw_fd(new) });
        out.push(new);
    }
    Ok((out, moved))
}

/// The file actions: stdin, stdout, stderr, the handed-over descriptors,
/// then the working directory.
fn file_actions(s: &RunnerSpawn<'_>, from: &[RawFd]) -> Result<FileActions, SpawnError> {
    let check = |op, rc| check(s.program, op, rc);
    let dev_null = cstr("/dev/null", b"/dev/null")?;
    let root = cstr("/", b"/")?;
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
    // The daemon's own descriptors are all above 2, so none is overwritten
    // by the standard ones before use.
    unsafe {
        let null = |fa: &mut FileActions, fd, flags| {
            libc::posix_spawn_file_actions_addopen(&mut fa.0, fd, dev_null.as_ptr(), flags, 0)
        };
        check(
            "posix_spawn_file_actions_addopen /dev/null for",
            null(&mut fa, 0, libc::O_RDONLY),
        )?;
        match s.output {
            Some(fd) => check(
                "posix_spawn_file_actions_adddup2 stdout for",
                libc::posix_spawn_file_actions_adddup2(&mut fa.0, fd.as_raw_fd(), 1),
            )?,
            None => check(
                "posix_spawn_file_actions_addopen /dev/null (stdout) for",
                null(&mut fa, 1, libc::O_WRONLY),
            )?,
        }
        check(
            "posix_spawn_file_actions_adddup2 stderr for",
            libc::posix_spawn_file_actions_adddup2(&mut fa.0, 1, 2),
        )?;
        for (src, (_, to)) in from.iter().zip(s.fds) {
            check(
                "posix_spawn_file_actions_adddup2 a handed-over descriptor for",
                libc::posix_spawn_file_actions_adddup2(&mut fa.0, *src, *to),
            )?;
        }
        check(
            "posix_spawn_file_actions_addchdir_np / for",
            libc::posix_spawn_file_actions_addchdir_np(&mut fa.0, root.as_ptr()),
        )?;
    }
    Ok(fa)
}

/// The attributes: a new session, the blocked signals, SIGPIPE's default.
fn attributes(s: &RunnerSpawn<'_>) -> Result<Attr, SpawnError> {
    let check = |op, rc| check(s.program, op, rc);
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
    Ok(attr)
}

/// Spawns the runner; returns its pid. The caller reaps it (via a pidfd).
pub fn spawn(s: &RunnerSpawn<'_>) -> Result<i32, SpawnError> {
    let path = cstr("the runner's path", s.program.as_os_str().as_bytes())?;
    let mut argv_c = vec![path.clone()];
    for a in s.args {
        argv_c.push(cstr("a runner argument", a.as_bytes())?);
    }
    let mut argv: Vec<*mut libc::c_char> = argv_c.iter().map(|a| a.as_ptr().cast_mut()).collect();
    argv.push(std::ptr::null_mut());
    let envp: [*mut libc::c_char; 1] = [std::ptr::null_mut()];
    let (from, moved) = sources(s)?;
    let fa = file_actions(s, &from)?;
    let attr = attributes(s)?;
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
    drop(moved);
    check(s.program, "posix_spawn", rc)?;
    Ok(pid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;

    /// A file holding `text`, opened for reading at exactly `fd`.
    fn file_at(dir: &Path, text: &str, fd: RawFd) -> OwnedFd {
        let p = dir.join(text);
        std::fs::File::create(&p)
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        let f = std::fs::File::open(&p).unwrap();
        // SAFETY: dup2 onto a number this test owns from here on.
        assert_eq!(unsafe { libc::dup2(f.as_raw_fd(), fd) }, fd);
        // SAFETY: dup2 just made `fd`; nothing else owns it.
        unsafe { OwnedFd::from_raw_fd(fd) }
    }

    /// Sources may sit at each other's targets: each still arrives where
    /// it was sent.
    #[test]
    fn handed_over_descriptors_land_on_their_numbers_even_crossed() {
        let dir = tempfile::tempdir().unwrap();
        // Far above what the test harness opens, crossed over each other.
        let (a, b) = (file_at(dir.path(), "a", 941), file_at(dir.path(), "b", 942));
        let out = std::fs::File::create(dir.path().join("out")).unwrap();
        let fds = [(a.as_fd(), 942), (b.as_fd(), 941)];
        let args = [
            "-c".to_owned(),
            "cat /proc/self/fd/941 /proc/self/fd/942".to_owned(),
        ];
        let pid = spawn(&RunnerSpawn {
            program: Path::new("/bin/sh"),
            args: &args,
            output: Some(out.as_fd()),
            fds: &fds,
            blocked: SigSet::empty(),
        })
        .unwrap();
        let mut status = 0;
        // SAFETY: waits for our own child; writes one int we own.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert_eq!(
            std::fs::read_to_string(dir.path().join("out")).unwrap(),
            "ba"
        );
    }
}
