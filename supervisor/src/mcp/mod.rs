//! `subagent mcp`: an MCP server on stdio (rmcp) that lets any MCP client
//! (Claude Code, Codex, …) delegate tasks to sandboxed subagents. It is a
//! client of the daemon's socket, never a second engine: when no daemon
//! answers it starts one. docs/mcp.md describes the tools.
//!
//! - [`daemon`]: the socket calls, and starting a daemon.
//! - [`settings`]: the options, what they resolve to, and the errors.
//! - [`tools`]: the tools' arguments, schemas and descriptions.
//! - [`context`]: what each call works with: the connection's state,
//!   argument decoding, the tool error.
//! - [`server`]: the MCP handler: the session, the tool list.
//! - [`calls`]: what each tool does.
//! - [`render`]: results for the model, with child-written text made harmless.

pub mod calls;
pub mod context;
pub mod daemon;
pub mod render;
pub mod server;
pub mod settings;
pub mod tools;

use rmcp::ServiceExt;
pub use settings::{McpArgs, McpError, Settings, DEFAULT_TOOLS};
use std::path::PathBuf;

/// Serves MCP on stdin/stdout until the client goes away. Logs go to
/// stderr: stdout is the MCP channel.
pub fn main(
    socket: PathBuf,
    trust: crate::trust::Trust,
    state_dir: Option<PathBuf>,
    args: McpArgs,
) -> Result<(), McpError> {
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SUBAGENT_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,subagentd=info")),
        )
        .try_init();
    let settings = args.settings()?;
    let link = daemon::Link::new(socket, state_dir, !args.no_start_daemon).with_trust(trust);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(McpError::Runtime)?;
    rt.block_on(async move {
        match link.ensure().await {
            Ok(None) => tracing::info!("subagentd answers on {}", link.socket.display()),
            Ok(Some(_)) => {}
            // The tools say so on each call; the session itself stays up.
            Err(e) => tracing::warn!("{e}"),
        }
        let service = server::Server::new(link, settings)
            .serve(rmcp::transport::stdio())
            .await
            .map_err(|e| McpError::Handshake(Box::new(e)))?;
        service.waiting().await?;
        Ok(())
    })
}
