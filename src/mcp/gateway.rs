//! The MCP server npc speaks (`npc mcp serve`): `tools/list` lists every
//! upstream tool under its gateway name from the pool's cache (or, with
//! `mcp.tools = "search"`, only the tool search's two tools);
//! `tools/call` goes through the [`CallPath`]; clients get
//! `notifications/tools/list_changed` when an upstream's tool list changes.
//! Resources and prompts are served from the [`Catalog`] (namespaced like
//! tools, see [`super::catalog`]); clients get
//! `notifications/resources/list_changed` and `notifications/prompts/list_changed`
//! when an upstream's lists change.

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CompleteRequestParams, CompleteResult,
    GetPromptRequestParams, GetPromptResponse, Implementation, ListPromptsResult,
    ListResourceTemplatesResult, ListResourcesResult, ListToolsResult, PaginatedRequestParams,
    ReadResourceRequestParams, ReadResourceResponse, ServerCapabilities, ServerConfig,
};
// Logging is deprecated (SEP-2577) but clients still set a level.
#[allow(deprecated)]
use rmcp::model::SetLevelRequestParams;
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::{ErrorData, RoleServer, ServerHandler};

use super::call::{CallPath, PROMPT_GET_EVENT, RESOURCE_READ_EVENT};
use super::catalog::{Catalog, CatalogChange, ManifestPrompts};

/// The gateway's MCP server handler; cheap to clone (one per HTTP session).
#[derive(Debug, Clone)]
pub struct Gateway {
    path: Arc<CallPath>,
    catalog: Arc<Catalog>,
}

impl Gateway {
    pub fn new(path: Arc<CallPath>) -> Self {
        let catalog = Arc::new(Catalog::new(path.pool().clone()));
        Self { path, catalog }
    }

    /// A gateway serving `catalog`'s resources and prompts (shared with
    /// other gateways of the same pool, so one update reaches them all).
    pub fn with_catalog(path: Arc<CallPath>, catalog: Arc<Catalog>) -> Self {
        Self { path, catalog }
    }

    /// The call path every `tools/call` of this gateway takes.
    pub fn call_path(&self) -> &Arc<CallPath> {
        &self.path
    }

    /// Serve the manifest's `prompts` as MCP prompts too.
    pub fn with_manifest_prompts(mut self, prompts: ManifestPrompts) -> Self {
        let catalog = Catalog::new(self.path.pool().clone()).with_manifest_prompts(prompts);
        self.catalog = Arc::new(catalog);
        self
    }
}

impl ServerHandler for Gateway {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            #[allow(deprecated)] // logging: accepted for clients that set a level
            ServerCapabilities::builder()
                .enable_logging()
                .enable_completions()
                .enable_prompts()
                .enable_prompts_list_changed()
                .enable_resources()
                .enable_resources_list_changed()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
        .with_server_info(Implementation::new("npc", env!("CARGO_PKG_VERSION")))
        .with_instructions(match self.path.listing() {
            crate::model::ToolListing::All => {
                "npc gateway: npc's built-in tools (memory_*, board_*, fetch_url, web_search, npc_*), the repository's MCP servers' tools and prompts, named SERVER__NAME (or their own names where they do not clash, with `mcp.prefix = \"on_conflict\"`), and their resources, named npc://SERVER/URI; every tool call is recorded"
            }
            crate::model::ToolListing::Search => {
                "npc gateway: find the tools available here with `search_tools` (a query of what the tool should do) and call one with `call_tool` (its name and arguments); prompts are named SERVER__NAME and resources npc://SERVER/URI; every tool call is recorded"
            }
        })
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.path.listed_tools()))
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

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        Ok(ListResourcesResult::with_all_items(
            self.catalog.resources(),
        ))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        Ok(ListResourceTemplatesResult::with_all_items(
            self.catalog.resource_templates(),
        ))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let started = std::time::Instant::now();
        let read = self.catalog.read_resource(&request.uri).await;
        let error = read.as_ref().err().map(|e| e.message.to_string());
        self.path
            .record_request(RESOURCE_READ_EVENT, &request.uri, error.as_deref(), started)
            .await;
        Ok(read?.into())
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        Ok(ListPromptsResult::with_all_items(self.catalog.prompts()))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        let started = std::time::Instant::now();
        let got = self
            .catalog
            .get_prompt(&request.name, request.arguments)
            .await;
        let error = got.as_ref().err().map(|e| e.message.to_string());
        self.path
            .record_request(PROMPT_GET_EVENT, &request.name, error.as_deref(), started)
            .await;
        Ok(got?.into())
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        self.catalog.complete(request).await
    }

    /// Accepted: the gateway sends no log notifications of its own (its
    /// logs go to stderr), so every level filters them all.
    #[allow(deprecated)]
    async fn set_level(
        &self,
        _request: SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        Ok(())
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        if let Some(info) = context.peer.peer_info() {
            let client = &info.client_info;
            self.path.record_client(&client.name, &client.version).await;
        }
        let mut catalog_changes = self.path.pool().subscribe_catalog_changes();
        let catalog_peer = context.peer.clone();
        tokio::spawn(async move {
            use tokio::sync::broadcast::error::RecvError;
            loop {
                let sent = match catalog_changes.recv().await {
                    Ok(CatalogChange::Resources) => {
                        catalog_peer.notify_resource_list_changed().await
                    }
                    Ok(CatalogChange::Prompts) => catalog_peer.notify_prompt_list_changed().await,
                    // Missed some: tell both.
                    Err(RecvError::Lagged(_)) => {
                        let _ = catalog_peer.notify_resource_list_changed().await;
                        catalog_peer.notify_prompt_list_changed().await
                    }
                    Err(RecvError::Closed) => break,
                };
                if sent.is_err() {
                    break;
                }
            }
        });
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
