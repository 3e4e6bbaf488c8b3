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
    eprintln!("usage: subagent-runner [--lock-fd N] RUNNER_JSON");
    ExitCode::from(2)
}

fn main() -> ExitCode {
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
            eprintln!("subagent-runner: {e}");
            return ExitCode::from(2);
        }
    }
    let spec = match RunnerSpec::load(&spec_path) {
        Ok(spec) => spec,
        Err(e) => {
            eprintln!("subagent-runner: {e}");
            return ExitCode::from(2);
        }
    };
    let record = match supervise::run(&spec) {
        Ok(record) => record,
        Err(e) => {
            eprintln!("subagent-runner: run {}: {e}", spec.run_id);
            return ExitCode::from(2);
        }
    };
    if let Err(e) = record.save(&spec.exit_path) {
        eprintln!("subagent-runner: run {}: {e}", spec.run_id);
        return ExitCode::from(2);
    }
    ExitCode::SUCCESS
}
