//! `subagent`: the command-line client of subagentd.

fn main() -> std::process::ExitCode {
    subagentd::cli::main()
}
