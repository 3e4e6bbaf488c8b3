//! What `subagent mcp` is started with: its options, the settings they
//! resolve to, and why it could not run. Uses ids and the sandbox's
//! network grammar; the server and calls build on it.

use clap::Args;
use std::path::PathBuf;
use std::time::Duration;

/// `subagent mcp`'s options.
#[derive(Debug, Clone, Args)]
pub struct McpArgs {
    /// The parent's session id (default: the MCP client's name and a random
    /// suffix, new for each connection).
    #[arg(long, env = "SUBAGENT_SESSION", value_name = "ID")]
    pub session: Option<String>,
    /// The tools the parent holds, comma-separated (MCP clients do not say):
    /// children get those they may be delegated, and the model can only
    /// narrow them. Default: file_read,glob,grep (reading the project; no
    /// program but the agent's own, no network).
    #[arg(long, value_name = "T1,T2")]
    pub tools: Option<String>,
    /// A `host:port` children may be given (repeatable; `*.example.com:443`
    /// for a domain's hosts): the model's `network_allow` must lie within
    /// these. Default: none, so the model can give no network at all.
    #[arg(long, value_name = "HOST:PORT")]
    pub network_allow: Vec<String>,
    /// The parent's audience: personal or team.
    #[arg(long, default_value = "personal")]
    pub audience: String,
    /// The children's project dir (default: the current directory).
    #[arg(long, value_name = "DIR")]
    pub project_dir: Option<PathBuf>,
    /// Do not start a daemon when none answers.
    #[arg(long)]
    pub no_start_daemon: bool,
    /// Milliseconds between progress notifications while waiting.
    #[arg(
        long,
        hide = true,
        env = "SUBAGENT_MCP_PROGRESS_MS",
        default_value_t = 10_000
    )]
    pub progress_ms: u64,
}

/// What a parent holds without `--tools`: the catalog's read-only project
/// tools, so a model can never give a child exec or the network by naming
/// them; the operator widens this on the command line.
pub const DEFAULT_TOOLS: &[&str] = &["file_read", "glob", "grep"];

/// What the server was started with, resolved.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The session id given, if any.
    pub session: Option<String>,
    /// The parent's tools: `--tools`, else [`DEFAULT_TOOLS`].
    pub tools: Vec<String>,
    /// The hosts children may be given (`--network-allow`).
    pub network_allow: Vec<String>,
    /// The parent's audience.
    pub audience: policy::Audience,
    /// The children's project dir, absolute.
    pub project_dir: PathBuf,
    /// The pause between progress notifications.
    pub progress_every: Duration,
}

/// `subagent mcp` could not run.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    /// An option is not valid.
    #[error("{0}")]
    Option(String),
    /// The current directory or `--project-dir` cannot be resolved.
    #[error("project dir {path}: {source}")]
    ProjectDir {
        /// The dir.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The async runtime could not be built.
    #[error("cannot start the runtime: {0}")]
    Runtime(std::io::Error),
    /// The MCP handshake failed.
    #[error("MCP handshake: {0}")]
    Handshake(Box<rmcp::service::ServerInitializeError>),
    /// The server task ended abnormally.
    #[error("MCP server: {0}")]
    Join(#[from] tokio::task::JoinError),
}

impl McpArgs {
    /// The settings these options give.
    pub fn settings(&self) -> Result<Settings, McpError> {
        if let Some(s) = &self.session {
            crate::ids::check_session_id(s)
                .map_err(|e| McpError::Option(format!("--session {s:?}: {e}")))?;
        }
        let audience = serde_json::from_value(serde_json::json!(self.audience)).map_err(|_| {
            McpError::Option(format!(
                "--audience must be personal or team, not {:?}",
                self.audience
            ))
        })?;
        let dir = match &self.project_dir {
            Some(d) => std::path::absolute(d),
            None => std::env::current_dir(),
        };
        let project_dir = dir.map_err(|source| McpError::ProjectDir {
            path: self
                .project_dir
                .clone()
                .unwrap_or_else(|| PathBuf::from(".")),
            source,
        })?;
        let tools = match &self.tools {
            Some(t) => t
                .split(',')
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect(),
            None => DEFAULT_TOOLS.iter().map(|t| (*t).to_owned()).collect(),
        };
        for e in &self.network_allow {
            policy::sandbox::network::parse_entry(e)
                .map_err(|err| McpError::Option(format!("--network-allow: {err}")))?;
        }
        Ok(Settings {
            session: self.session.clone(),
            tools,
            network_allow: self.network_allow.clone(),
            audience,
            project_dir,
            progress_every: Duration::from_millis(self.progress_ms),
        })
    }
}
