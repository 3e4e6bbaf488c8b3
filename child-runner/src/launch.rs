//! Starting the agent command: a new session, an empty signal mask, no
//! inherited descriptors, stdin from /dev/null, stdout and stderr into the
//! runner's pipe, and death with the runner.

use crate::sandbox::Prepared;
use crate::spec::RunnerSpec;
use nix::sys::signal::{sigprocmask, SigSet, SigmaskHow, Signal};
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};

/// The agent command could not be started.
#[derive(Debug, thiserror::Error)]
#[error("cannot execute {program:?}: {source}")]
pub struct LaunchError {
    /// argv[0].
    pub program: String,
    /// Why (from exec, or from the setup before it).
    pub source: std::io::Error,
}

impl LaunchError {
    /// The shell's convention: 127 when not found, 126 otherwise.
    pub fn exit_code(&self) -> i32 {
        if self.source.kind() == std::io::ErrorKind::NotFound {
            127
        } else {
            126
        }
    }
}

/// Starts the agent command with `output` as its stdout and stderr, inside
/// the prepared sandbox.
/// Returns the child and its sandbox steps' durations ("name=µs ...").
pub fn start(
    spec: &RunnerSpec,
    output: OwnedFd,
    sandbox: std::sync::Arc<Prepared>,
) -> Result<(Child, String), LaunchError> {
    let err = |source| LaunchError {
        program: spec.argv[0].clone(),
        source,
    };
    let stderr = output.try_clone().map_err(err)?;
    let runner_pid = nix::unistd::getpid();
    // The child reports a failed sandbox step here, in words (the standard
    // library's own channel carries only an errno).
    let (why_r, why_w) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| err(e.into()))?;
    let why_fd = std::os::fd::AsRawFd::as_raw_fd(&why_w);
    // And reports its setup steps' durations here (CLOEXEC: closed at exec).
    let (times_r, times_w) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| err(e.into()))?;
    let times_fd = std::os::fd::AsRawFd::as_raw_fd(&times_w);
    let mut cmd = Command::new(&spec.argv[0]);
    cmd.args(&spec.argv[1..])
        .env_clear()
        .envs(&spec.env)
        .current_dir(&spec.cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::from(output))
        .stderr(Stdio::from(stderr));
    // SAFETY: the closure runs between fork and exec in the child. The
    // runner is single-threaded, so no lock can be held by another thread
    // at the fork: allocating here (Landlock, cgroup writes) is safe.
    unsafe {
        cmd.pre_exec(move || {
            nix::unistd::setsid()?;
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            if nix::unistd::getppid() != runner_pid {
                // The runner died before the death signal was armed.
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)?;
            crate::sys::cloexec_from(3).map_err(|e| e.source)?;
            match sandbox.apply() {
                Ok(times) => {
                    // SAFETY: writes our own buffer to a pipe we hold open.
                    let _ = libc::write(times_fd, times.as_ptr().cast(), times.len());
                }
                Err(why) => {
                    // SAFETY: writes our own buffer to a pipe we hold open.
                    let _ = libc::write(why_fd, why.as_ptr().cast(), why.len());
                    return Err(std::io::Error::from_raw_os_error(libc::EPERM));
                }
            }
            Ok(())
        });
    }
    let spawned = cmd.spawn();
    drop(cmd);
    drop(why_w);
    drop(times_w);
    match spawned {
        Ok(child) => {
            let mut t = String::new();
            let _ = std::io::Read::read_to_string(&mut std::fs::File::from(times_r), &mut t);
            Ok((child, t))
        }
        Err(e) => {
            let mut why = String::new();
            let _ = std::io::Read::read_to_string(&mut std::fs::File::from(why_r), &mut why);
            if why.is_empty() {
                Err(err(e))
            } else {
                Err(LaunchError {
                    program: spec.argv[0].clone(),
                    source: std::io::Error::other(format!("sandbox: {why}")),
                })
            }
        }
    }
}
