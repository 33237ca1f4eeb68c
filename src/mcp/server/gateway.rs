//! The MCP server npc speaks (`npc mcp serve`): `tools/list` lists every
//! upstream tool under its gateway name from the pool's cache (or, with
//! `mcp.tools = "search"`, only the tool search's two tools);
//! `tools/call` goes through the [`CallPath`]; clients get
//! `notifications/tools/list_changed` when an upstream's tool list changes.
//! Resources and prompts are served from the [`Catalog`] (namespaced like
//! tools, see [`super::catalog`]); clients get
//! `notifications/resources/list_changed` and `notifications/prompts/list_changed`
//! when an upstream's lists change.

use std::sync::{Arc, OnceLock};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CompleteRequestParams, CompleteResult,
    GetPromptRequestParams, GetPromptResponse, Implementation, ListPromptsResult,
    ListResourceTemplatesResult, ListResourcesResult, ListToolsResult, PaginatedRequestParams,
    ReadResourceRequestParams, ReadResourceResponse, ServerCapabilities, ServerConfig,
};
// Logging and subscriptions are deprecated (SEP-2577) but clients still use them.
use rmcp::model::{ProtocolVersion, ServerResult};
#[allow(deprecated)]
use rmcp::model::{SetLevelRequestParams, SubscribeRequestParams, UnsubscribeRequestParams};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::{ErrorData, Peer, RoleServer, ServerHandler};

use super::catalog::{Catalog, ManifestPrompts};
use crate::mcp::call::{CallPath, Served};
use crate::mcp::client::catalog::CatalogChange;
use crate::mcp::passthrough::{Caller, Client, Sink, as_caller};
use crate::mcp::resource_uri;

/// The wire shape of results, from the protocol version the client
/// initialized with (what rmcp's handler does for its own answers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Before 2026-07-28: no `resultType: "complete"`, object output only.
    Legacy,
    /// 2026-07-28 and later: caching hints filled in.
    Current,
}

impl Shape {
    pub fn of(peer: &Peer<RoleServer>) -> Self {
        let version = peer.peer_info().map(|info| info.protocol_version.clone());
        if version.is_some_and(|v| v.as_str() >= ProtocolVersion::V_2026_07_28.as_str()) {
            Self::Current
        } else {
            Self::Legacy
        }
    }

    pub(super) fn apply(self, result: &mut ServerResult) {
        match self {
            Self::Legacy => {
                result.strip_result_type_for_legacy_peer();
                result.strip_non_object_output_for_legacy_peer();
            }
            Self::Current => result.fill_missing_cache_hints(),
        }
    }
}

/// Where the gateway registers an HTTP session once its handshake is done:
/// `server::shortcut::HttpSessions`, which then answers the session's calls
/// itself. A seam, so the gateway knows no transport above it.
pub trait HttpRegistry: std::fmt::Debug + Send + Sync {
    /// Session `id` finished its handshake as `client`, answered in `shape`.
    fn register(&self, id: &str, client: &Arc<Client>, shape: Shape);
}

/// The gateway's MCP server handler; cheap to clone (one per session).
#[derive(Debug)]
pub struct Gateway {
    path: Arc<CallPath>,
    catalog: Arc<Catalog>,
    client: ClientSlot,
    /// An HTTP front's sessions, which each session joins once initialized.
    http: Option<Arc<dyn HttpRegistry>>,
    /// The run this session's agent works for ([`crate::mcp::call::for_run`]),
    /// carried into rmcp's handlers, which run outside the session's task.
    run: Option<String>,
}

impl Clone for Gateway {
    /// Another session's gateway: the same call path and catalog, its own
    /// client session.
    fn clone(&self) -> Self {
        Self {
            path: self.path.clone(),
            catalog: self.catalog.clone(),
            client: ClientSlot::default(),
            http: self.http.clone(),
            run: None,
        }
    }
}

/// A gateway session's [`Client`], joined once the peer is known.
#[derive(Debug, Clone, Default)]
pub struct ClientSlot(Arc<OnceLock<Arc<Client>>>);

impl ClientSlot {
    /// The session's client, joining `path`'s pool's clients on first use
    /// with its notifications sent to `sink`.
    pub fn get(
        &self,
        path: &CallPath,
        peer: &Peer<RoleServer>,
        sink: impl FnOnce() -> Sink,
    ) -> Arc<Client> {
        self.0
            .get_or_init(|| {
                path.pool()
                    .clients()
                    .join(peer.clone(), sink(), path.bus().cloned())
            })
            .clone()
    }
}

impl Gateway {
    pub fn new(path: Arc<CallPath>) -> Self {
        let catalog = Arc::new(Catalog::new(path.pool().clone()));
        Self::with_catalog(path, catalog)
    }

    /// A gateway serving `catalog`'s resources and prompts (shared with
    /// other gateways of the same pool, so one update reaches them all).
    pub fn with_catalog(path: Arc<CallPath>, catalog: Arc<Catalog>) -> Self {
        Self {
            path,
            catalog,
            client: ClientSlot::default(),
            http: None,
            run: None,
        }
    }

    /// This session's calls are run `run`'s.
    pub fn for_run(mut self, run: Option<String>) -> Self {
        self.run = run;
        self
    }

    /// Behind an HTTP front: each session, once initialized, joins
    /// `sessions`, which answers its `tools/call` itself.
    pub fn with_http_sessions(mut self, sessions: Arc<dyn HttpRegistry>) -> Self {
        self.http = Some(sessions);
        self
    }

    /// This session's client slot (shared with the session loop).
    pub fn client_slot(&self) -> ClientSlot {
        self.client.clone()
    }

    /// This session's client, joining the pool's clients on first use.
    pub fn client(&self, peer: &Peer<RoleServer>) -> Arc<Client> {
        self.client.get(&self.path, peer, || Sink::Peer)
    }

    /// The call path every `tools/call` of this gateway takes.
    pub fn call_path(&self) -> &Arc<CallPath> {
        &self.path
    }

    /// The caller of a call of this session's request `context`.
    pub fn caller(&self, context: &RequestContext<RoleServer>) -> Caller {
        Caller {
            client: self.client(&context.peer),
            request: Some(context.id.clone()),
            progress: context.meta.get_progress_token(),
            stream: None,
        }
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
                .enable_resources_subscribe()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
        .with_server_info(Implementation::new("npc", env!("CARGO_PKG_VERSION")))
        .with_instructions(match self.path.listing() {
            crate::model::ToolListing::All => {
                "npc gateway: npc's built-in tools (memory_*, board_*, fetch_url, web_search, npc_*), the repository's MCP servers' tools and prompts, named SERVER__NAME (or their own names where they do not clash, with `mcp.prefix = \"on_conflict\"`), and their resources, named npc://SERVER/URI (or, the same way, their own URIs); every tool call is recorded"
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
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let caller = self.caller(&context);
        let client = caller.client.clone();
        let started = std::time::Instant::now();
        let name = request.name;
        let call = crate::mcp::call::for_run(
            self.run.clone(),
            as_caller(Some(caller), self.path.call(&name, request.arguments)),
        );
        tokio::select! {
            result = call => {
                // The call's progress goes out before its answer.
                client.flush().await;
                // A server's JSON-RPC error reaches the client as that error.
                result.map(Into::into)
            }
            // Dropping the call tells its upstream; rmcp sends no answer.
            () = context.ct.cancelled() => {
                self.path.publish(self.path.cancelled(&name, started)).await;
                Err(ErrorData::internal_error("the call was cancelled", None))
            }
        }
    }

    #[allow(deprecated)]
    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let Some((server, uri)) = self.catalog.route_resource(&request.uri) else {
            return Err(ErrorData::invalid_params(
                format!(
                    "no resource `{}`; see `resources/list` for the gateway's resources",
                    request.uri
                ),
                None,
            ));
        };
        let client = self.client(&context.peer);
        let params = SubscribeRequestParams::new(uri);
        self.path
            .pool()
            .request(&server, |peer| async move { peer.subscribe(params).await })
            .await
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))??;
        client.subscribe(&request.uri, true);
        Ok(())
    }

    #[allow(deprecated)]
    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let client = self.client(&context.peer);
        if !client.subscribe(&request.uri, false) {
            return Ok(());
        }
        let Some((server, uri)) = self.catalog.route_resource(&request.uri) else {
            return Ok(());
        };
        // The upstream keeps the subscription while another session holds
        // it, under either of its names.
        let gateway_uri = resource_uri(&server, &uri);
        let others = self
            .path
            .pool()
            .clients()
            .each()
            .iter()
            .any(|c| c.is_subscribed(&gateway_uri) || c.is_subscribed(&uri));
        if others {
            return Ok(());
        }
        let params = UnsubscribeRequestParams::new(uri);
        self.path
            .pool()
            .request(
                &server,
                |peer| async move { peer.unsubscribe(params).await },
            )
            .await
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))??;
        Ok(())
    }

    async fn on_roots_list_changed(&self, _context: NotificationContext<RoleServer>) {
        self.path.pool().roots_changed().await;
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
            .record_request(
                Served::ResourceRead,
                &request.uri,
                error.as_deref(),
                started,
            )
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
            .record_request(Served::PromptGet, &request.name, error.as_deref(), started)
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

    /// The session's level filters its servers' log messages; the servers
    /// get the most verbose level any session set. The gateway sends no
    /// log messages of its own (its logs go to stderr).
    #[allow(deprecated)]
    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.client(&context.peer).set_level(request.level);
        let pool = self.path.pool();
        if let Some(level) = pool.clients().level() {
            pool.set_level(level).await;
        }
        Ok(())
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        if let Some(info) = context.peer.peer_info() {
            let client = &info.client_info;
            self.path.record_client(&client.name, &client.version).await;
        }
        if let Some(sessions) = &self.http
            && let Some(parts) = context.extensions.get::<axum::http::request::Parts>()
            && let Some(id) = parts
                .headers
                .get(crate::surfaces::mcp_http::SESSION_ID_HEADER)
                .and_then(|v| v.to_str().ok())
        {
            sessions.register(id, &self.client(&context.peer), Shape::of(&context.peer));
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
