//! The MCP server npc speaks (`npc mcp serve`): `tools/list` lists every
//! upstream tool under its namespaced name from the pool's cache;
//! `tools/call` goes through the [`CallPath`]; clients get
//! `notifications/tools/list_changed` when an upstream's tool list changes.

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, Implementation, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig,
};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::{ErrorData, RoleServer, ServerHandler};

use super::call::CallPath;

/// The gateway's MCP server handler; cheap to clone (one per HTTP session).
#[derive(Debug, Clone)]
pub struct Gateway {
    path: Arc<CallPath>,
}

impl Gateway {
    pub fn new(path: Arc<CallPath>) -> Self {
        Self { path }
    }
}

impl ServerHandler for Gateway {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
        .with_server_info(Implementation::new("npc", env!("CARGO_PKG_VERSION")))
        .with_instructions(
            "npc gateway: npc's built-in tools (memory_*, board_*, fetch_url, web_search, npc_*) and the repository's MCP servers' tools, named SERVER__TOOL; every call is recorded",
        )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        // Built-ins first, then every upstream tool (never the same names:
        // upstream ones are `server__tool`).
        let mut tools = self.path.builtins().tools().to_vec();
        tools.extend(self.path.pool().tools().into_iter().map(|t| t.definition));
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        Ok(self
            .path
            .call(&request.name, request.arguments)
            .await
            .into())
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        let mut changes = self.path.pool().subscribe_changes();
        let peer = context.peer.clone();
        tokio::spawn(async move {
            use tokio::sync::broadcast::error::RecvError;
            while let Ok(()) | Err(RecvError::Lagged(_)) = changes.recv().await {
                if peer.notify_tool_list_changed().await.is_err() {
                    break;
                }
            }
        });
    }
}
