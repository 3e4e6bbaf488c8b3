//! `subagent-runner [--lock-fd N [--uid-lock-fd M]] RUNNER_JSON`: runs one
//! subagent; see the library docs. `subagent-runner --warm`: the same, for
//! a run handed over later on the socket at fd 0 (see
//! `subagent_runner::warm`).
//!
//! `--lock-fd N` is runner.lock, opened and flock'ed by the daemon and handed
//! over: the runner writes its pid into it and holds it until it dies, so a
//! restarted daemon can tell a live runner from a dead one. `--uid-lock-fd
//! M` is the lease on the run's own uid, held the same way.
//!
//! Exit status: 0 when exit.json was written, 2 when the runner could not do
//! its job (the reason is on stderr, which the daemon keeps as runner.log).

use std::path::PathBuf;
use std::process::ExitCode;
use subagent_runner::spec::RunnerSpec;
use subagent_runner::{lockfd, supervise};

fn usage() -> ExitCode {
    say("usage: subagent-runner [--lock-fd N [--uid-lock-fd M]] RUNNER_JSON | subagent-runner --warm");
    ExitCode::from(2)
}

/// Writes a line to stderr (runner.log), ignoring failure: a full disk must
/// not turn into a panic.
fn say(msg: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "subagent-runner: {msg}");
}

/// The room held for exit.json.
const EXIT_RESERVE_BYTES: usize = 64 * 1024;

fn main() -> ExitCode {
    let main_started = std::time::Instant::now();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (lock_fd, uid_fd, spec_path, started) = match args.as_slice() {
        [flag] if flag == "--warm" => {
            match subagent_runner::warm::wait(subagent_runner::warm::SOCKET_FD) {
                // The daemon let this warm runner go.
                Ok(None) => return ExitCode::SUCCESS,
                Ok(Some(h)) => {
                    if let Err(e) = subagent_runner::warm::install_stdio(&h.log) {
                        say(&format!("{e}"));
                        return ExitCode::from(2);
                    }
                    drop(h.log);
                    // The start is timed from the hand-over, not from the wait.
                    (
                        Some(std::os::fd::IntoRawFd::into_raw_fd(h.lock)),
                        h.uid_lock.map(std::os::fd::IntoRawFd::into_raw_fd),
                        h.spec,
                        std::time::Instant::now(),
                    )
                }
                Err(e) => {
                    say(&format!("warm runner: {e}"));
                    return ExitCode::from(2);
                }
            }
        }
        [flag, fd, spec] if flag == "--lock-fd" => match fd.parse::<i32>() {
            Ok(fd) => (Some(fd), None, PathBuf::from(spec), main_started),
            Err(_) => return usage(),
        },
        [flag, fd, uflag, ufd, spec] if flag == "--lock-fd" && uflag == "--uid-lock-fd" => {
            match (fd.parse::<i32>(), ufd.parse::<i32>()) {
                (Ok(fd), Ok(ufd)) if ufd > 2 && ufd != fd => {
                    (Some(fd), Some(ufd), PathBuf::from(spec), main_started)
                }
                _ => return usage(),
            }
        }
        [spec] => (None, None, PathBuf::from(spec), main_started),
        _ => return usage(),
    };
    run(lock_fd, uid_fd, &spec_path, started)
}

/// Runs the run of `spec_path`, holding runner.lock (`lock_fd`).
fn run(
    lock_fd: Option<i32>,
    uid_fd: Option<i32>,
    spec_path: &std::path::Path,
    main_started: std::time::Instant,
) -> ExitCode {
    if let Some(fd) = lock_fd {
        if let Err(e) = lockfd::adopt(fd) {
            say(&format!("{e}"));
            return ExitCode::from(2);
        }
    }
    if let Some(fd) = uid_fd {
        if let Err(e) = lockfd::hold(fd) {
            say(&format!("{e}"));
            return ExitCode::from(2);
        }
    }
    let spec = match RunnerSpec::load(spec_path) {
        Ok(spec) => spec,
        Err(e) => {
            say(&format!("{e}"));
            return ExitCode::from(2);
        }
    };
    // Room for exit.json, kept from the start: if the child fills the disk,
    // the record is still written, into the reserved file.
    let reserve = subagent_runner::atomic::Reserved::create(&spec.exit_path, EXIT_RESERVE_BYTES);
    if let Err(e) = &reserve {
        say(&format!(
            "run {}: reserving room for exit.json: {e}",
            spec.run_id
        ));
    }
    let record = match supervise::run(&spec, main_started) {
        Ok(record) => record,
        Err(e) => {
            say(&format!("run {}: {e}", spec.run_id));
            return ExitCode::from(2);
        }
    };
    let saved = match reserve {
        Ok(r) => record.save_into(r),
        Err(_) => record.save(&spec.exit_path),
    };
    if let Err(e) = saved {
        say(&format!("run {}: {e}", spec.run_id));
        return ExitCode::from(2);
    }
    ExitCode::SUCCESS
}
