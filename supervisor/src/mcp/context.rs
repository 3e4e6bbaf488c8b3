//! What every tool call works with: the connection's shared state (the
//! daemon link, the settings, the session id), argument decoding, and the
//! tool error each failure becomes. Uses `daemon`, `render` and
//! `settings`; the server handler and the calls build on it.

use super::daemon::{DaemonError, Link};
use super::render::LogError;
use super::settings::Settings;
use crate::protocol::codes;
use rmcp::model::CallToolResult;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::sync::OnceLock;

/// A tool call that could not be carried out.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// The arguments do not fit the tool's schema.
    #[error("bad arguments for {tool}: {detail}. Check the tool's input schema and call again.")]
    Arguments {
        /// The tool.
        tool: String,
        /// What is wrong, naming the field.
        detail: String,
    },
    /// No tool has this name.
    #[error("there is no tool named {0:?}; the tools are: spawn_agent, wait_agent_run, check_agent_run, cancel_agent_run, list_agent_runs, read_agent_log, agent_usage, take_notices, list_agents, working_context")]
    UnknownTool(String),
    /// The daemon could not be reached or refused the call.
    #[error("{source}{hint}")]
    Daemon {
        /// What failed.
        source: DaemonError,
        /// What the model can do about it.
        hint: &'static str,
    },
    /// A request this server refuses before asking the daemon.
    #[error("{0}")]
    Refused(String),
    /// The run's log could not be read.
    #[error("{0}")]
    Log(#[from] LogError),
    /// The subagent definitions could not be listed.
    #[error("cannot list the subagent definitions: {0}")]
    Agents(String),
}

impl From<DaemonError> for ToolError {
    fn from(source: DaemonError) -> ToolError {
        let hint = match &source {
            DaemonError::Rpc(e) if e.code == codes::RUN_NOT_FOUND => {
                ". list_agent_runs shows the runs there are."
            }
            DaemonError::Rpc(e) if e.code == codes::INVALID_PARAMS => {
                ". Fix the argument it names and call again."
            }
            DaemonError::Rpc(e) if e.code == codes::SHUTTING_DOWN => {
                ". Wait a little and call again."
            }
            DaemonError::Rpc(e) if e.code == codes::SESSION_NOT_OWNED => {
                ". Calling again will not help: ask the user to start subagent mcp with a --session of their own."
            }
            DaemonError::Rpc(_) => "",
            DaemonError::Untrusted(crate::trust::TrustError::Peer { .. }) => {
                ". Calling again will not help: ask the user what listens on that socket."
            }
            DaemonError::SocketDir { .. } | DaemonError::Untrusted(_) => {
                ". Calling again will not help: ask the user to remove or fix that directory."
            }
            _ => ". The supervisor is not available; try again later, or ask the user to start subagentd.",
        };
        ToolError::Daemon { source, hint }
    }
}

/// State shared by every call of one MCP connection.
pub struct Inner {
    /// The daemon.
    pub link: Link,
    /// What this server was started with.
    pub settings: Settings,
    /// The parent's session id, fixed at `initialize`.
    session: OnceLock<String>,
}

impl Inner {
    /// The state of a connection not yet initialized.
    pub fn new(link: Link, settings: Settings) -> Inner {
        Inner {
            link,
            settings,
            session: OnceLock::new(),
        }
    }

    /// The session id: the one given, else `client_name` and a random
    /// suffix (fixed by the first call).
    pub fn session(&self, client_name: Option<&str>) -> &str {
        self.session.get_or_init(|| match &self.settings.session {
            Some(s) => s.clone(),
            None => session_id_for(client_name.unwrap_or("mcp")),
        })
    }
}

/// `name` reduced to the session id grammar, with a random suffix.
pub fn session_id_for(name: &str) -> String {
    let base: String = name
        .chars()
        .map(|c| match c {
            'A'..='Z' | 'a'..='z' | '0'..='9' | '.' | '_' | '-' => c,
            _ => '-',
        })
        .take(40)
        .collect();
    let base = base.trim_matches(|c| c == '-' || c == '.');
    let base = if base.is_empty() { "mcp" } else { base };
    format!("{base}-{}", crate::ids::random_hex8())
}

/// Decodes a tool's arguments, naming the field that does not fit.
pub fn args<T: DeserializeOwned>(
    tool: &str,
    args: Option<serde_json::Map<String, Value>>,
) -> Result<T, ToolError> {
    let v = Value::Object(args.unwrap_or_default());
    serde_path_to_error::deserialize(v).map_err(|e| ToolError::Arguments {
        tool: tool.to_owned(),
        detail: e.to_string(),
    })
}

/// Keeps `CallToolResult` in this module's vocabulary for the calls.
pub type ToolResult = Result<CallToolResult, ToolError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_ids_follow_the_grammar() {
        for name in ["claude-code", "Codex CLI/1.0", "", "...", "ä\u{1b}x"] {
            let id = session_id_for(name);
            assert!(
                crate::ids::check_session_id(&id).is_ok(),
                "{name:?} -> {id}"
            );
        }
        assert!(session_id_for("claude-code").starts_with("claude-code-"));
        assert_ne!(session_id_for("a"), session_id_for("a"));
    }

    #[test]
    fn daemon_errors_say_what_to_do() {
        let e: ToolError = DaemonError::Rpc(crate::protocol::RpcError::new(
            codes::RUN_NOT_FOUND,
            "run not found: x",
        ))
        .into();
        assert!(e.to_string().contains("list_agent_runs"), "{e}");
        let e: ToolError = DaemonError::Rpc(crate::protocol::RpcError::new(
            codes::SESSION_NOT_OWNED,
            "permission denied: session s belongs to another user",
        ))
        .into();
        assert!(e.to_string().contains("--session"), "{e}");
    }
}
