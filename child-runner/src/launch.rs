//! Starting an attempt: the run's init is cloned into new namespaces
//! ([`crate::init`]) and starts the agent command, in a new session, with
//! an empty signal mask, every signal at its default, no inherited
//! descriptors, stdin from /dev/null (or the spec's context file), stdout and stderr into the runner's
//! pipe, and death with its parent. What fails before exec is told on a
//! pipe, in words, and the attempt ends as a program that could not run.

use crate::sandbox::scratch::Scratch;
use crate::sandbox::Prepared;
use crate::spec::RunnerSpec;
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use std::ffi::CString;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::time::Instant;

/// The agent command could not be started.
#[derive(Debug, thiserror::Error)]
#[error("cannot execute {program:?}: {reason}")]
pub struct LaunchError {
    /// `argv[0]`.
    pub program: String,
    /// The shell's convention: 127 when not found, 126 otherwise.
    pub code: i32,
    /// Why (from exec, or from the setup before it).
    pub reason: String,
}

impl LaunchError {
    /// The exit code the attempt reports.
    pub fn exit_code(&self) -> i32 {
        self.code
    }
}

/// An attempt whose agent has exec'd.
pub struct Started {
    /// The run's init (its pid in the runner's namespace).
    pub init: Pid,
    /// Where init writes the agent's status ([`crate::init::decode`]).
    pub status: OwnedFd,
    /// From the clone to the agent's exec, in µs.
    pub fork_to_exec_us: u64,
    /// When the agent exec'd, in µs since the epoch.
    pub exec_at_us: u64,
}

/// The agent's command line and environment, made before the clone.
struct Exec {
    candidates: Vec<CString>,
    argv: Vec<CString>,
    env: Vec<CString>,
    cwd: CString,
}

fn cstring(bytes: &[u8]) -> Option<CString> {
    CString::new(bytes).ok()
}

impl Exec {
    fn new(spec: &RunnerSpec) -> Option<Exec> {
        let argv0 = &spec.argv[0];
        let candidates = if argv0.contains('/') {
            vec![cstring(argv0.as_bytes())?]
        } else {
            let path = spec.env.get("PATH").map_or("", String::as_str);
            path.split(':')
                .filter(|d| !d.is_empty())
                .filter_map(|d| cstring(format!("{d}/{argv0}").as_bytes()))
                .collect()
        };
        Some(Exec {
            candidates,
            argv: spec
                .argv
                .iter()
                .map(|a| cstring(a.as_bytes()))
                .collect::<Option<_>>()?,
            env: spec
                .env
                .iter()
                .map(|(k, v)| cstring(format!("{k}={v}").as_bytes()))
                .collect::<Option<_>>()?,
            cwd: cstring(spec.cwd.as_os_str().as_bytes())?,
        })
    }

    /// execve of each candidate in turn, as execvpe does; returns the
    /// error that says most (EACCES over ENOENT).
    fn exec(&self) -> nix::Error {
        let mut worst = nix::Error::ENOENT;
        for c in &self.candidates {
            let e = match nix::unistd::execve(c, &self.argv, &self.env) {
                Err(e) => e,
                Ok(never) => match never {},
            };
            if worst == nix::Error::ENOENT || e == nix::Error::EACCES {
                worst = e;
            }
        }
        worst
    }
}

/// Everything the agent process does between fork and exec; never returns.
fn agent(exec: &Exec, sandbox: &Prepared, stdin: RawFd, output: RawFd, why: RawFd) -> ! {
    let fail = |step: &str, e: &dyn std::fmt::Display| -> ! {
        crate::init::fail(why, 126, &format!("sandbox: {step}: {e}"))
    };
    if let Err(e) = nix::unistd::setsid() {
        fail("setsid", &e);
    }
    if let Err(e) = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL) {
        fail("prctl(PR_SET_PDEATHSIG)", &e);
    }
    crate::init::unblock_all();
    defaults_for_all_signals();
    for (from, to) in [(stdin, 0), (output, 1), (output, 2)] {
        // SAFETY: dup2 onto the standard descriptors, both open here.
        if unsafe { libc::dup2(from, to) } < 0 {
            fail("dup2", &std::io::Error::last_os_error());
        }
    }
    if let Err(e) = crate::sys::cloexec_from(3) {
        fail("close descriptors", &e);
    }
    if let Err(e) = nix::unistd::chdir(exec.cwd.as_c_str()) {
        fail("chdir to the working directory", &e);
    }
    if let Err(e) = sandbox.apply_in_agent() {
        crate::init::fail(why, 126, &format!("sandbox: {e}"));
    }
    let e = exec.exec();
    let code = if e == nix::Error::ENOENT { 127 } else { 126 };
    crate::init::fail(why, code, &format!("exec: {}", std::io::Error::from(e)))
}

/// Every signal back to its default disposition (an ignored signal would
/// stay ignored across exec; the runner ignores SIGPIPE).
fn defaults_for_all_signals() {
    for sig in Signal::iterator() {
        if matches!(sig, Signal::SIGKILL | Signal::SIGSTOP) {
            continue;
        }
        // SAFETY: SIG_DFL installs no handler code; the call only changes
        // this process's disposition table.
        let _ = unsafe { nix::sys::signal::signal(sig, nix::sys::signal::SigHandler::SigDfl) };
    }
}

/// The agent's stdin: the spec's file (written by the daemon or the runner
/// into the context dir; opened without following a link, as a regular
/// file), else /dev/null.
fn open_stdin(spec: &RunnerSpec) -> Result<OwnedFd, StdinError> {
    let Some(path) = &spec.stdin else {
        return nix::fcntl::open(
            "/dev/null",
            nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
        .map_err(StdinError::DevNull);
    };
    let opened = crate::safefile::open(path)?;
    Ok(OwnedFd::from(opened.into_file()))
}

/// Why the agent's stdin could not be opened.
#[derive(Debug, thiserror::Error)]
enum StdinError {
    /// /dev/null could not be opened.
    #[error("/dev/null: {0}")]
    DevNull(#[source] nix::Error),
    /// The context file could not be opened safely.
    #[error(transparent)]
    File(#[from] crate::safefile::SafeFileError),
}

/// Starts an attempt: clones the run's init, which starts the agent with
/// `output` as its stdout and stderr. Returns once the agent has exec'd.
pub fn start(
    spec: &RunnerSpec,
    output: OwnedFd,
    sandbox: &Prepared,
    scratch: &Scratch,
) -> Result<Started, LaunchError> {
    let program = spec.argv[0].clone();
    let err = |code: i32, reason: String| LaunchError {
        program: program.clone(),
        code,
        reason,
    };
    let exec = Exec::new(spec).ok_or_else(|| err(126, "an argument holds a NUL byte".into()))?;
    let sys = |e: nix::Error| err(126, format!("sandbox: {e}"));
    let stdin = open_stdin(spec).map_err(|e| err(126, format!("stdin: {e}")))?;
    let (why_r, why_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(sys)?;
    let (status_r, status_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(sys)?;
    let started = Instant::now();
    let fds = (stdin.as_raw_fd(), output.as_raw_fd(), why_w.as_raw_fd());
    let agent = || agent(&exec, sandbox, fds.0, fds.1, fds.2);
    let init = match crate::sandbox::namespaces::fork_into(sandbox.namespaces()) {
        Ok(Some(pid)) => pid,
        Ok(None) => {
            drop(why_r);
            drop(status_r);
            crate::init::run(crate::init::InitArgs {
                sandbox,
                scratch,
                why: fds.2,
                status: status_w,
                agent: &agent,
            })
        }
        Err(e) => return Err(err(126, format!("sandbox: clone into new namespaces: {e}"))),
    };
    drop((stdin, output, why_w, status_w));
    let mut text = String::new();
    let _ = std::fs::File::from(why_r).read_to_string(&mut text);
    let fork_to_exec_us = started.elapsed().as_micros() as u64;
    if text.is_empty() {
        return Ok(Started {
            init,
            status: status_r,
            fork_to_exec_us,
            exec_at_us: crate::now_unix_us(),
        });
    }
    // Init or the agent failed before exec and exits on its own.
    let _ = nix::sys::wait::waitpid(init, None);
    let (code, reason) = match text.split_once(' ') {
        Some((c, r)) => (c.parse().unwrap_or(126), r.to_owned()),
        None => (126, text),
    };
    Err(err(code, reason))
}
