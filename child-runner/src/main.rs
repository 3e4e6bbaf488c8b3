//! `subagent-runner [--lock-fd N] RUNNER_JSON`: runs one subagent; see the
//! library docs.
//!
//! `--lock-fd N` is runner.lock, opened and flock'ed by the daemon and handed
//! over: the runner writes its pid into it and holds it until it dies, so a
//! restarted daemon can tell a live runner from a dead one.
//!
//! Exit status: 0 when exit.json was written, 2 when the runner could not do
//! its job (the reason is on stderr, which the daemon keeps as runner.log).

use std::path::PathBuf;
use std::process::ExitCode;
use subagent_runner::spec::RunnerSpec;
use subagent_runner::{lockfd, supervise};

fn usage() -> ExitCode {
    say("usage: subagent-runner [--lock-fd N] RUNNER_JSON");
    ExitCode::from(2)
}

/// Writes a line to stderr (runner.log), ignoring failure: a full disk must
/// not turn into a panic.
fn say(msg: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "subagent-runner: {msg}");
}

/// Creates a 64 KiB file beside exit.json and returns its path.
fn exit_reserve(exit_path: &std::path::Path) -> Option<PathBuf> {
    let mut name = exit_path.file_name()?.to_owned();
    name.push(".reserve");
    let path = exit_path.with_file_name(name);
    std::fs::write(&path, vec![0u8; 64 * 1024]).ok()?;
    Some(path)
}

fn main() -> ExitCode {
    let main_started = std::time::Instant::now();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (lock_fd, spec_path) = match args.as_slice() {
        [flag, fd, spec] if flag == "--lock-fd" => match fd.parse::<i32>() {
            Ok(fd) => (Some(fd), PathBuf::from(spec)),
            Err(_) => return usage(),
        },
        [spec] => (None, PathBuf::from(spec)),
        _ => return usage(),
    };
    if let Some(fd) = lock_fd {
        if let Err(e) = lockfd::adopt(fd) {
            say(&format!("{e}"));
            return ExitCode::from(2);
        }
    }
    let spec = match RunnerSpec::load(&spec_path) {
        Ok(spec) => spec,
        Err(e) => {
            say(&format!("{e}"));
            return ExitCode::from(2);
        }
    };
    // Room for exit.json, kept from the start: if the child fills the disk,
    // the reserve is given back just before the record is written.
    let reserve = exit_reserve(&spec.exit_path);
    let record = match supervise::run(&spec, main_started) {
        Ok(record) => record,
        Err(e) => {
            say(&format!("run {}: {e}", spec.run_id));
            return ExitCode::from(2);
        }
    };
    if let Some(r) = &reserve {
        let _ = std::fs::remove_file(r);
    }
    if let Err(e) = record.save(&spec.exit_path) {
        say(&format!("run {}: {e}", spec.run_id));
        return ExitCode::from(2);
    }
    ExitCode::SUCCESS
}
