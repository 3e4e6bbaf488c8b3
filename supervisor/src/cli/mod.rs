//! The `subagent` command: a client of the daemon's socket, plus `logs`
//! (which reads files directly) and `run` (which embeds the engine when no
//! daemon answers).
//!
//! - [`args`]: the command line as clap parses it, and the exit codes.
//! - [`follow`]: printing and following child.log from the file.
//! - [`linetimes`]: `logs --timestamps` and `--since`, from child.log.times.
//! - [`show`]: human output (status blocks, the `ls` table).
//! - [`commands`]: the socket commands.
//! - [`list`]: `subagent ls`, page by page.
//! - [`metrics`]: `subagent metrics`.
//! - [`prune`]: `subagent prune`'s lines.
//! - [`run`]: `subagent run`, for CI.
//! - [`stdout`]: writing to stdout; a closed stdout ends quietly.
//! - [`style`]: when output gets colour, and a state's colour.
//! - [`top`]: `subagent top`, the live view.

pub mod args;
pub mod commands;
pub mod follow;
pub mod linetimes;
pub mod list;
pub mod metrics;
pub mod prune;
pub mod run;
pub mod show;
pub mod stdout;
pub mod style;
pub mod top;

pub use args::{
    Cli, Command, LsArgs, RunArgs, TopArgs, WorktreeAction, EXIT_CLIENT_ERROR, EXIT_STILL_RUNNING,
};
use clap::Parser;
use std::path::PathBuf;

/// `subagent mcp`: its errors on stderr, since stdout is the MCP channel.
fn mcp(
    ctx: commands::Ctx,
    state_dir: Option<PathBuf>,
    args: crate::mcp::McpArgs,
) -> std::process::ExitCode {
    match crate::mcp::main(ctx.socket, ctx.trust, state_dir, args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
                "subagent mcp: {}",
                crate::sanitize::for_terminal(&e.to_string())
            );
            std::process::ExitCode::from(EXIT_CLIENT_ERROR)
        }
    }
}

/// The config's `expect_uid` (SUBAGENTD_CONFIG, else the default file).
/// A config that cannot be read names none: only the user and root are
/// then trusted, and the commands that need the config say why.
fn configured_uid() -> Option<u32> {
    let explicit = std::env::var_os("SUBAGENTD_CONFIG").map(PathBuf::from);
    crate::paths::load_config(explicit.as_deref())
        .ok()
        .and_then(|(_, c)| c.expect_uid)
}

/// Runs the `subagent` command line; returns the process exit code.
pub fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let socket = cli
        .socket
        .clone()
        .unwrap_or_else(crate::paths::default_socket);
    let state_dir = cli
        .state_dir
        .clone()
        .unwrap_or_else(crate::paths::default_state_dir);
    let expected = match cli.expect_uid.as_deref().map(crate::trust::parse_uid) {
        None => configured_uid(),
        Some(Ok(uid)) => Some(uid),
        Some(Err(e)) => {
            eprintln!("subagent: {e}");
            return std::process::ExitCode::from(EXIT_CLIENT_ERROR);
        }
    };
    let ctx = commands::Ctx {
        socket,
        state_dir,
        json: cli.json,
        explicit_state_dir: cli.state_dir.is_some(),
        trust: crate::trust::Trust::new(expected),
    };
    let result = match cli.command {
        Command::Run { run, raw } => return run::main(&ctx, run, raw),
        Command::Mcp(args) => return mcp(ctx, cli.state_dir, args),
        other => commands::execute(&ctx, other),
    };
    match result {
        Ok(code) => std::process::ExitCode::from(code),
        Err(e) if stdout::closed(&e) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
                "subagent: {}",
                crate::sanitize::for_terminal(&format!("{e:#}"))
            );
            std::process::ExitCode::from(EXIT_CLIENT_ERROR)
        }
    }
}
