//! `subagent-runner RUNNER_JSON`: runs one subagent; see the library docs.
//!
//! Exit status: 0 when exit.json was written, 2 when the runner could not do
//! its job (the reason is on stderr, which the daemon keeps as runner.log).

use std::path::PathBuf;
use std::process::ExitCode;
use subagent_runner::spec::RunnerSpec;
use subagent_runner::supervise;

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let (Some(spec_path), None) = (args.next(), args.next()) else {
        eprintln!("usage: subagent-runner RUNNER_JSON");
        return ExitCode::from(2);
    };
    let spec_path = PathBuf::from(spec_path);
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
