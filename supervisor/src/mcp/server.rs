//! The MCP server handler: the session this connection is, the tool list,
//! and each call routed to its tool; every failure becomes a tool error
//! ([`super::context::ToolError`]).

use super::context::Inner;
use super::daemon::Link;
use super::render;
use super::settings::Settings;
use super::tools;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, Implementation, InitializeRequestParams,
    InitializeResult, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use std::sync::Arc;

const INSTRUCTIONS: &str = "Delegate work to sandboxed subagents: spawn_agent returns a \
run_id at once; wait_agent_run (up to 50 s per call, call again while it is still running) \
or check_agent_run follow it; read_agent_log shows its output; take_notices lists runs that \
ended. A subagent sees only its task, context and the project, never this conversation.";

/// The MCP server of one stdio connection.
#[derive(Clone)]
pub struct Server {
    inner: Arc<Inner>,
}

impl Server {
    /// A server talking to the daemon through `link`.
    pub fn new(link: Link, settings: Settings) -> Server {
        Server {
            inner: Arc::new(Inner::new(link, settings)),
        }
    }
}

impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("subagent", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        context.peer.set_peer_info(request.clone());
        let session = self.inner.session(Some(&request.client_info.name));
        tracing::info!(
            "MCP client {} {}: session {session}, project {}",
            crate::sanitize::one_line(&request.client_info.name),
            crate::sanitize::one_line(&request.client_info.version),
            self.inner.settings.project_dir.display()
        );
        self.negotiate_initialize(&request)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools::catalog()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.to_string();
        let result = super::calls::dispatch(&self.inner, request, &context).await;
        Ok(match result {
            Ok(r) => r,
            Err(e) => {
                tracing::info!("{name}: {e}");
                render::error(&e.to_string())
            }
        }
        .into())
    }
}
