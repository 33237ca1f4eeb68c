//! The upstream client pool: one [`Upstream`] per enabled MCP server of the
//! manifest, each with at most one live session. Sessions connect lazily
//! (or all at once with [`Pool::connect_all`], at most
//! [`MAX_CONCURRENT_CONNECTS`] at a time), each within its
//! `startup_timeout_ms`. The tool list is cached per server and survives a
//! closed session, so `tools/list` never waits on a server. A call that
//! times out or loses its connection closes the session (and stops the
//! server's process); the next call reconnects.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequestParams, CallToolResult, JsonObject, PaginatedRequestParams, Tool,
};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::{ClientHandler, ErrorData, Peer, RoleClient, ServiceExt};
use tokio::sync::{Semaphore, broadcast};

use super::catalog::{CatalogChange, ServerCatalog};

use crate::model::{Manifest, McpServer, McpTransport, RestartPolicy};
use crate::plan::{ComponentId, Kind};
use crate::runtime::drivers::{DriverContext, child_spec};
use crate::supervisor::{OutputWiring, Supervisor, SupervisorError};

/// Upstream sessions being established at once: enough that a repository's
/// servers all start together (start-up is bounded by the slowest one, see
/// `benches/mcp_gateway.rs`), still bounded.
pub const MAX_CONCURRENT_CONNECTS: usize = 32;
/// Calls in flight to one upstream server at once; more wait their turn.
pub const MAX_CONCURRENT_CALLS_PER_SERVER: usize = 64;
/// How often idle sessions are looked for.
pub const IDLE_SWEEP_INTERVAL: Duration = Duration::from_secs(1);
/// Tool-list refreshes queued for gateway clients before the oldest is dropped.
const CHANGE_QUEUE_DEPTH: usize = 16;
/// Most tools kept from one server; the rest are left out (logged).
pub const MAX_TOOLS_PER_SERVER: usize = 1024;
/// Most `tools/list` pages fetched from one server at a time.
pub const MAX_TOOL_PAGES: usize = 64;

/// The server's tools, at most [`MAX_TOOL_PAGES`] pages and
/// [`MAX_TOOLS_PER_SERVER`] tools, so a server paging forever or listing
/// without end cannot grow npc's memory.
async fn fetch_tools(
    peer: &Peer<RoleClient>,
    server: &str,
) -> Result<Vec<Tool>, rmcp::ServiceError> {
    let mut tools = Vec::new();
    let mut cursor = None;
    for _ in 0..MAX_TOOL_PAGES {
        let params = cursor.map(|c| PaginatedRequestParams::default().with_cursor(Some(c)));
        let page = peer.list_tools(params).await?;
        tools.extend(page.tools);
        if tools.len() > MAX_TOOLS_PER_SERVER {
            tracing::warn!(
                server,
                limit = MAX_TOOLS_PER_SERVER,
                "mcp: server lists too many tools; the rest are left out"
            );
            tools.truncate(MAX_TOOLS_PER_SERVER);
            return Ok(tools);
        }
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(tools),
        }
    }
    tracing::warn!(
        server,
        pages = MAX_TOOL_PAGES,
        "mcp: server pages its tools without end; the rest are left out"
    );
    Ok(tools)
}

/// A refresh of a session's tool list: none running, one running, or one
/// running with another notification since it started.
const REFRESH_IDLE: u8 = 0;
const REFRESH_RUNNING: u8 = 1;
const REFRESH_AGAIN: u8 = 2;

/// Why an upstream server could not be used.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PoolError {
    #[error("no MCP server `{server}` in the manifest (or it is disabled)")]
    UnknownServer { server: String },
    #[error("MCP server `{server}` did not start: {reason}")]
    Spawn { server: String, reason: String },
    #[error(
        "MCP server `{server}` did not finish connecting within its `startup_timeout_ms` of {limit_ms} ms"
    )]
    StartupTimeout { server: String, limit_ms: u64 },
    #[error("MCP server `{server}` failed to connect: {reason}")]
    Handshake { server: String, reason: String },
    /// The server speaks the HTTP+SSE transport of protocol 2024-11-05,
    /// which rmcp's client dropped (rmcp 0.11).
    #[error(
        "MCP server `{server}` speaks the deprecated HTTP+SSE transport (protocol 2024-11-05), which npc does not support; point `url` at the server's streamable HTTP endpoint, or run it as a stdio server with `command`"
    )]
    LegacySse { server: String },
}

impl PoolError {
    /// The server the error is about.
    pub fn server(&self) -> &str {
        match self {
            Self::UnknownServer { server }
            | Self::Spawn { server, .. }
            | Self::StartupTimeout { server, .. }
            | Self::Handshake { server, .. }
            | Self::LegacySse { server } => server,
        }
    }
}

/// Where an upstream's session stands (for status and events).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum UpstreamState {
    /// Never connected, or closed (idle, or after a failed call); the next
    /// call connects.
    Disconnected,
    Connecting,
    Connected,
    Failed {
        reason: String,
    },
}

/// Keeps a session's cached tool list fresh: `notifications/tools/list_changed`
/// refetches it and tells the gateway's clients.
/// Notifications arriving while a refresh runs coalesce into one more
/// refresh, so a server flooding them costs at most one task.
#[derive(Debug, Clone)]
struct Listener {
    server: String,
    tools: Arc<RwLock<Vec<Tool>>>,
    changed: broadcast::Sender<()>,
    refresh: Arc<AtomicU8>,
    catalog: Arc<ServerCatalog>,
}

impl ClientHandler for Listener {
    async fn on_resource_list_changed(&self, context: NotificationContext<RoleClient>) {
        self.catalog
            .list_changed(CatalogChange::Resources, context.peer, self.server.clone());
    }

    async fn on_prompt_list_changed(&self, context: NotificationContext<RoleClient>) {
        self.catalog
            .list_changed(CatalogChange::Prompts, context.peer, self.server.clone());
    }

    async fn on_tool_list_changed(&self, context: NotificationContext<RoleClient>) {
        let previous = self
            .refresh
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |s| {
                Some(if s == REFRESH_IDLE {
                    REFRESH_RUNNING
                } else {
                    REFRESH_AGAIN
                })
            })
            .unwrap_or(REFRESH_AGAIN);
        if previous != REFRESH_IDLE {
            return;
        }
        let (peer, listener) = (context.peer.clone(), self.clone());
        tokio::spawn(async move {
            loop {
                match fetch_tools(&peer, &listener.server).await {
                    Ok(list) => {
                        *write(&listener.tools) = list;
                        let _ = listener.changed.send(());
                    }
                    Err(e) => {
                        tracing::warn!(server = %listener.server, error = %e, "mcp: refreshing a tool list failed")
                    }
                }
                let done = listener.refresh.compare_exchange(
                    REFRESH_RUNNING,
                    REFRESH_IDLE,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                );
                if done.is_ok() {
                    break;
                }
                listener.refresh.store(REFRESH_RUNNING, Ordering::SeqCst);
            }
        });
    }
}

struct Session {
    service: RunningService<RoleClient, Listener>,
    generation: u64,
}

/// One upstream server: its config, cached tools and (at most one) session.
struct Upstream {
    name: String,
    config: McpServer,
    cx: DriverContext,
    tools: Arc<RwLock<Vec<Tool>>>,
    session: tokio::sync::Mutex<Option<Session>>,
    state: Mutex<UpstreamState>,
    generation: AtomicU64,
    in_flight: AtomicUsize,
    last_used: Mutex<Instant>,
    calls: Semaphore,
    changed: broadcast::Sender<()>,
    catalog: Arc<ServerCatalog>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("name", &self.name)
            .field("state", &*lock(&self.state))
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn write<T>(m: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|p| p.into_inner())
}

fn read<T>(m: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(|p| p.into_inner())
}

/// How one upstream call ended, before it becomes a tool result.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error(transparent)]
    Unavailable(PoolError),
    /// The call outlived `tool_timeout_ms`.
    #[error(
        "MCP server `{server}` did not answer within its `tool_timeout_ms` of {limit_ms} ms; its session was closed and is reconnected on the next call"
    )]
    Timeout { server: String, limit_ms: u64 },
    /// The session broke during the call (the server crashed or closed).
    #[error(
        "MCP server `{server}` lost its connection during the call ({reason}); it is reconnected on the next call"
    )]
    Lost { server: String, reason: String },
}

impl Upstream {
    fn set_state(&self, state: UpstreamState) {
        *lock(&self.state) = state;
    }

    /// The live session's peer, connecting first when there is none.
    async fn peer(&self, connects: &Semaphore) -> Result<(Peer<RoleClient>, u64), PoolError> {
        let mut slot = self.session.lock().await;
        if let Some(s) = slot.as_ref()
            && !s.service.is_closed()
        {
            return Ok((s.service.peer().clone(), s.generation));
        }
        if let Some(old) = slot.take() {
            drop(old);
            self.stop_process().await;
        }
        let _permit = connects.acquire().await;
        self.set_state(UpstreamState::Connecting);
        match self.connect().await {
            Ok(service) => {
                let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
                let peer = service.peer().clone();
                *slot = Some(Session {
                    service,
                    generation,
                });
                self.set_state(UpstreamState::Connected);
                Ok((peer, generation))
            }
            Err(e) => {
                self.stop_process().await;
                self.set_state(UpstreamState::Failed {
                    reason: e.to_string(),
                });
                Err(e)
            }
        }
    }

    fn component(&self) -> ComponentId {
        ComponentId::new(Kind::McpServer, &self.name)
    }

    async fn connect(&self) -> Result<RunningService<RoleClient, Listener>, PoolError> {
        let server = self.name.clone();
        match &self.config.transport {
            McpTransport::Stdio(command) => {
                let id = self.component();
                // The pool reconnects lazily, so the supervisor never restarts it.
                let mut spec = child_spec(&self.cx, &id, command, RestartPolicy::Never);
                spec.stdio.stdout = OutputWiring::Piped;
                let key = id.to_string();
                let _ = self.cx.supervisor.remove(&key).await;
                let spawn = |e: SupervisorError| PoolError::Spawn {
                    server: server.clone(),
                    reason: e.to_string(),
                };
                self.cx.supervisor.start(&key, spec).map_err(spawn)?;
                let pipes = self.cx.supervisor.take_pipes(&key);
                let (Some(stdout), Some(stdin)) =
                    pipes.map_or((None, None), |p| (p.stdout, p.stdin))
                else {
                    return Err(PoolError::Spawn {
                        server,
                        reason: "its standard streams were not piped".into(),
                    });
                };
                self.handshake((stdout, stdin)).await
            }
            McpTransport::Http {
                url,
                headers,
                bearer_token_env,
            } => {
                let bearer = match bearer_token_env {
                    None => None,
                    Some(var) => Some(std::env::var(var).map_err(|_| PoolError::Handshake {
                        server: server.clone(),
                        reason: format!(
                            "its `bearer_token_env` names `{var}`, which is not set; export it before starting npc"
                        ),
                    })?),
                };
                let headers = headers
                    .iter()
                    .map(|(k, v)| (k.clone(), v.expose().to_string()))
                    .collect();
                let transport = crate::surfaces::mcp_http::client_transport(
                    url.expose(),
                    &headers,
                    bearer.clone(),
                )
                .map_err(|e| PoolError::Handshake {
                    server: server.clone(),
                    reason: e.to_string(),
                })?;
                let result = self.handshake(transport).await;
                if let Err(PoolError::Handshake { .. }) = &result
                    && crate::surfaces::mcp_http::is_legacy_sse(
                        url.expose(),
                        &headers,
                        bearer.as_deref(),
                    )
                    .await
                {
                    return Err(PoolError::LegacySse { server });
                }
                result
            }
        }
    }

    /// Initialize a session over `transport` and fetch its tools, within
    /// the server's `startup_timeout_ms`.
    async fn handshake<T, E, A>(
        &self,
        transport: T,
    ) -> Result<RunningService<RoleClient, Listener>, PoolError>
    where
        T: rmcp::transport::IntoTransport<RoleClient, E, A>,
        E: std::error::Error + Send + Sync + 'static,
    {
        let server = self.name.clone();
        let listener = Listener {
            server: server.clone(),
            tools: self.tools.clone(),
            changed: self.changed.clone(),
            refresh: Arc::default(),
            catalog: self.catalog.clone(),
        };
        let limit_ms = self.config.startup_timeout_ms;
        let handshake = async {
            let service = listener.serve(transport).await.map_err(|e| e.to_string())?;
            let tools = fetch_tools(service.peer(), &server)
                .await
                .map_err(|e| format!("`tools/list` failed: {e}"))?;
            self.catalog.fetch(service.peer(), &server).await;
            Ok::<_, String>((service, tools))
        };
        match tokio::time::timeout(Duration::from_millis(limit_ms), handshake).await {
            Err(_) => Err(PoolError::StartupTimeout { server, limit_ms }),
            Ok(Err(reason)) => Err(PoolError::Handshake { server, reason }),
            Ok(Ok((service, tools))) => {
                *write(&self.tools) = tools;
                let _ = self.changed.send(());
                Ok(service)
            }
        }
    }

    async fn stop_process(&self) {
        if matches!(self.config.transport, McpTransport::Stdio(_)) {
            let _ = self
                .cx
                .supervisor
                .remove(&self.component().to_string())
                .await;
        }
    }

    /// Close the session of `generation` (if still current) and stop its process.
    async fn close(&self, generation: Option<u64>) {
        let mut slot = self.session.lock().await;
        if generation.is_none_or(|g| slot.as_ref().is_some_and(|s| s.generation == g)) {
            if let Some(s) = slot.take() {
                let _ = s.service.cancel().await;
            }
            self.stop_process().await;
            self.set_state(UpstreamState::Disconnected);
        }
    }

    async fn call(
        &self,
        tool: &str,
        arguments: Option<JsonObject>,
        connects: &Semaphore,
    ) -> Result<CallToolResult, CallError> {
        let mut params = CallToolRequestParams::new(tool.to_string());
        params.arguments = arguments;
        let answer = self
            .request(connects, |peer| async move { peer.call_tool(params).await })
            .await?;
        // A protocol-level error answer: the session is fine.
        Ok(answer.unwrap_or_else(|e| {
            CallToolResult::error(vec![rmcp::model::ContentBlock::text(format!(
                "MCP server `{}` answered with an error: {}",
                self.name, e.message
            ))])
        }))
    }

    /// Send one request through `send` within the server's
    /// `tool_timeout_ms`, connecting first when there is no session. An error
    /// answer is the inner `Err` (the session stays); a timeout or a broken
    /// session closes the session, and the next request reconnects.
    async fn request<T, F, Fut>(
        &self,
        connects: &Semaphore,
        send: F,
    ) -> Result<Result<T, ErrorData>, CallError>
    where
        F: FnOnce(Peer<RoleClient>) -> Fut,
        Fut: std::future::Future<Output = Result<T, rmcp::ServiceError>>,
    {
        let _slot = self.calls.acquire().await;
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let result = self.request_inner(connects, send).await;
        *lock(&self.last_used) = Instant::now();
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        result
    }

    async fn request_inner<T, F, Fut>(
        &self,
        connects: &Semaphore,
        send: F,
    ) -> Result<Result<T, ErrorData>, CallError>
    where
        F: FnOnce(Peer<RoleClient>) -> Fut,
        Fut: std::future::Future<Output = Result<T, rmcp::ServiceError>>,
    {
        let (peer, generation) = self.peer(connects).await.map_err(CallError::Unavailable)?;
        let limit_ms = self.config.tool_timeout_ms;
        match tokio::time::timeout(Duration::from_millis(limit_ms), send(peer)).await {
            Ok(Ok(answer)) => Ok(Ok(answer)),
            Ok(Err(rmcp::ServiceError::McpError(e))) => Ok(Err(e)),
            Ok(Err(e)) => {
                self.close(Some(generation)).await;
                Err(CallError::Lost {
                    server: self.name.clone(),
                    reason: e.to_string(),
                })
            }
            Err(_) => {
                self.close(Some(generation)).await;
                Err(CallError::Timeout {
                    server: self.name.clone(),
                    limit_ms,
                })
            }
        }
    }

    /// Close the session if it has been unused for the server's idle timeout.
    async fn sweep(&self, now: Instant) {
        let idle = Duration::from_secs(self.config.idle_timeout_s);
        if idle.is_zero() || self.in_flight.load(Ordering::SeqCst) > 0 {
            return;
        }
        if now.duration_since(*lock(&self.last_used)) < idle {
            return;
        }
        let has_session = self
            .session
            .try_lock()
            .is_ok_and(|slot| slot.as_ref().is_some());
        if has_session {
            tracing::info!(server = %self.name, "mcp: closing an idle session");
            self.close(None).await;
        }
    }
}

/// The upstream servers of one manifest.
#[derive(Debug)]
pub struct Pool {
    upstreams: BTreeMap<String, Arc<Upstream>>,
    connects: Arc<Semaphore>,
    changed: broadcast::Sender<()>,
    catalog_changed: broadcast::Sender<CatalogChange>,
}

/// One tool as the gateway lists it.
#[derive(Debug, Clone)]
pub struct ListedTool {
    pub server: String,
    /// The upstream's own name for it.
    pub tool: String,
    /// The tool under its namespaced name, as clients see it.
    pub definition: Tool,
}

impl Pool {
    /// A pool for the manifest's enabled MCP servers; nothing connects yet.
    /// Stdio servers run through `supervisor`, in `repo`, logging to
    /// `state_dir/logs`.
    pub fn new(
        manifest: &Manifest,
        repo: PathBuf,
        state_dir: PathBuf,
        supervisor: Supervisor,
    ) -> Self {
        let (changed, _) = broadcast::channel(CHANGE_QUEUE_DEPTH);
        let (catalog_changed, _) = broadcast::channel(CHANGE_QUEUE_DEPTH);
        let cx = DriverContext {
            repo,
            state_dir,
            supervisor,
        };
        let upstreams = manifest
            .mcp_servers
            .iter()
            .filter(|(_, s)| s.enabled)
            .map(|(name, config)| {
                let upstream = Upstream {
                    name: name.clone(),
                    config: config.clone(),
                    cx: cx.clone(),
                    tools: Arc::default(),
                    session: tokio::sync::Mutex::new(None),
                    state: Mutex::new(UpstreamState::Disconnected),
                    generation: AtomicU64::new(0),
                    in_flight: AtomicUsize::new(0),
                    last_used: Mutex::new(Instant::now()),
                    calls: Semaphore::new(MAX_CONCURRENT_CALLS_PER_SERVER),
                    changed: changed.clone(),
                    catalog: Arc::new(ServerCatalog::new(catalog_changed.clone())),
                };
                (name.clone(), Arc::new(upstream))
            })
            .collect();
        Self {
            upstreams,
            connects: Arc::new(Semaphore::new(MAX_CONCURRENT_CONNECTS)),
            changed,
            catalog_changed,
        }
    }

    /// Connect every server (at most [`MAX_CONCURRENT_CONNECTS`] at once);
    /// returns the ones that failed. A failure affects only its server.
    pub async fn connect_all(&self) -> Vec<PoolError> {
        let mut attempts = tokio::task::JoinSet::new();
        for upstream in self.upstreams.values() {
            let (upstream, connects) = (upstream.clone(), self.connects.clone());
            attempts.spawn(async move {
                let result = upstream.peer(&connects).await;
                *lock(&upstream.last_used) = Instant::now();
                result.err()
            });
        }
        attempts.join_all().await.into_iter().flatten().collect()
    }

    /// Names of the pool's servers.
    pub fn servers(&self) -> impl Iterator<Item = &str> {
        self.upstreams.keys().map(String::as_str)
    }

    /// Each server's state.
    pub fn states(&self) -> BTreeMap<String, UpstreamState> {
        self.upstreams
            .iter()
            .map(|(n, u)| (n.clone(), lock(&u.state).clone()))
            .collect()
    }

    /// Every exposed tool of every server, namespaced, servers in name order
    /// and tools in each server's order. A tool whose namespaced name is not
    /// portable, or collides with an earlier one, is left out.
    pub fn tools(&self) -> Vec<ListedTool> {
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::new();
        for (server, upstream) in &self.upstreams {
            for tool in read(&upstream.tools).iter() {
                if !super::exposes(&upstream.config, &tool.name) {
                    continue;
                }
                let Some(name) = super::namespaced(server, &tool.name) else {
                    tracing::warn!(server = %server, tool = %tool.name, "mcp: tool name is not portable; left out");
                    continue;
                };
                if !seen.insert(name.clone()) {
                    tracing::warn!(name = %name, "mcp: namespaced tool name collides; left out");
                    continue;
                }
                let mut definition = tool.clone();
                definition.name = name.into();
                out.push(ListedTool {
                    server: server.clone(),
                    tool: tool.name.to_string(),
                    definition,
                });
            }
        }
        out
    }

    /// The (server, tool) a namespaced name stands for, if listed (the
    /// first match in [`Pool::tools`] order, without building the list).
    pub fn resolve(&self, name: &str) -> Option<(String, String)> {
        self.upstreams.iter().find_map(|(server, upstream)| {
            let tool = name
                .strip_prefix(server.as_str())?
                .strip_prefix(super::NAMESPACE_SEPARATOR)?;
            let listed = read(&upstream.tools).iter().any(|t| t.name == tool)
                && super::exposes(&upstream.config, tool)
                && super::namespaced(server, tool).is_some();
            listed.then(|| (server.clone(), tool.to_string()))
        })
    }

    /// Call `tool` of `server` within the server's `tool_timeout_ms`.
    pub async fn call(
        &self,
        server: &str,
        tool: &str,
        arguments: Option<JsonObject>,
    ) -> Result<CallToolResult, CallError> {
        let upstream = self.upstreams.get(server).ok_or_else(|| {
            CallError::Unavailable(PoolError::UnknownServer {
                server: server.to_string(),
            })
        })?;
        upstream.call(tool, arguments, &self.connects).await
    }

    /// Each server's resources and prompts, servers in name order.
    pub fn catalogs(&self) -> impl Iterator<Item = (&str, &Arc<ServerCatalog>)> {
        self.upstreams
            .iter()
            .map(|(name, u)| (name.as_str(), &u.catalog))
    }

    /// The resources and prompts of `server`, if it is in the pool.
    pub fn catalog_of(&self, server: &str) -> Option<&Arc<ServerCatalog>> {
        self.upstreams.get(server).map(|u| &u.catalog)
    }

    /// A receiver told whenever some server's resources or prompts changed.
    pub fn subscribe_catalog_changes(&self) -> broadcast::Receiver<CatalogChange> {
        self.catalog_changed.subscribe()
    }

    /// Send one request to `server` through `send`, like a tool call: within
    /// its `tool_timeout_ms`, connecting first when needed; a timeout or a
    /// broken session costs the session. The inner `Err` is the server's
    /// error answer.
    pub async fn request<T, F, Fut>(
        &self,
        server: &str,
        send: F,
    ) -> Result<Result<T, ErrorData>, CallError>
    where
        F: FnOnce(Peer<RoleClient>) -> Fut,
        Fut: std::future::Future<Output = Result<T, rmcp::ServiceError>>,
    {
        let upstream = self.upstreams.get(server).ok_or_else(|| {
            CallError::Unavailable(PoolError::UnknownServer {
                server: server.to_string(),
            })
        })?;
        upstream.request(&self.connects, send).await
    }

    /// A receiver told whenever some server's tool list changed.
    pub fn subscribe_changes(&self) -> broadcast::Receiver<()> {
        self.changed.subscribe()
    }

    /// Close sessions idle for longer than their server's `idle_timeout`.
    pub async fn sweep_idle(&self) {
        let now = Instant::now();
        for upstream in self.upstreams.values() {
            upstream.sweep(now).await;
        }
    }

    /// Close every session and stop every server process.
    pub async fn shutdown(&self) {
        for upstream in self.upstreams.values() {
            upstream.close(None).await;
        }
    }
}
