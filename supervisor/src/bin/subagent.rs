//! `subagent`: the command-line client of subagentd.

fn main() -> std::process::ExitCode {
    // An embedded supervisor (`subagent run`) spawns runners: what this
    // process inherited must not reach them.
    let _ = subagent_runner::sys::cloexec_from(3);
    subagentd::cli::main()
}
