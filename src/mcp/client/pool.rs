//! The upstream client pool: one [`Upstream`] per enabled MCP server, each
//! with at most one live session. Membership is dynamic ([`Pool::upsert`],
//! [`Pool::remove`]): the daemon's MCP driver adds, edits and removes servers
//! as the manifest changes, and every change tells the gateway's clients
//! (`notifications/tools/list_changed`). Sessions connect in the background
//! or lazily on a call (or all at once with [`Pool::connect_all`]), at most
//! [`MAX_CONCURRENT_CONNECTS`] at a time, each within its
//! `startup_timeout_ms`; a server that fails is an `mcp.server_failed` event
//! and its own state, never the others'. The tool list is cached per server
//! and survives a closed session, so `tools/list` never waits on a server.
//!
//! How a stdio server's process runs is the pool's [`Launch`]: `Owned` (the
//! standalone `npc mcp serve`) starts one process per session and stops it
//! with the session; `Supervised` (the daemon) leaves the process to the
//! supervisor (restart policy, backoff, log) and rides the session on the
//! current process's stdin/stdout, reconnecting after each restart
//! ([`Pool::process_started`]). A call that times out or loses its
//! connection closes the session (an owned process is stopped, a live
//! supervised one restarted); the next call reconnects.

use crate::stdx::{read, write};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

// Sampling and roots are deprecated (SEP-2577), but servers use them.
#[allow(deprecated)]
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, ClientResult,
    CreateMessageRequest, CreateMessageRequestParams, CreateMessageResult, ElicitRequest,
    ElicitRequestParams, ElicitResult, ElicitationCapability, FormElicitationCapability,
    Implementation, JsonObject, ListRootsRequest, ListRootsResult, LoggingLevel,
    LoggingMessageNotificationParam, PaginatedRequestParams, ProgressNotificationParam,
    ProtocolVersion, ResourceUpdatedNotificationParam, RootsCapabilities, SamplingCapability,
    ServerRequest, SetLevelRequestParams, Tool, UrlElicitationCapability,
};
use rmcp::service::{
    ClientInitializeError, ClientLifecycleMode, ClientServiceExt as _, NotificationContext,
    RequestContext, RunningService,
};
use rmcp::{ClientHandler, ErrorData, Peer, RoleClient};
use tokio::sync::{Semaphore, broadcast};

use super::catalog::{CatalogChange, ServerCatalog, refresh_begins, refresh_done};
use super::wire::{Envelope, Failure, Lent, Wire};
use crate::mcp::lock;
use crate::mcp::passthrough::{
    Clients, Entered, InFlight, LIST_CHANGED_DEBOUNCE, Passthrough, call_tracked,
};

use crate::bus::EventBus;
use crate::driver::{DriverContext, child_spec};
use crate::model::{CommandSpec, Manifest, McpServer, McpTransport, Prefix, RestartPolicy};
use crate::plan::{ComponentId, Kind};
use crate::supervisor::{ChildSpec, ChildState, OutputWiring, Supervisor, SupervisorError};

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
/// Most `tools/list` pages fetched from one server at a time (as many as
/// of its other lists).
pub const MAX_TOOL_PAGES: usize = super::catalog::MAX_LIST_PAGES;

mod http_wire;
mod upstream;

use http_wire::HttpWire;
use upstream::*;
pub use upstream::{CallError, LastCall, UpstreamState};

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
    #[error(
        "MCP server `{server}`'s process is `{state}`; the supervisor restarts it per its `restart` policy (see `npc status` and its log)"
    )]
    NotRunning { server: String, state: String },
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
            | Self::NotRunning { server, .. }
            | Self::LegacySse { server } => server,
        }
    }
}

/// How a pool's stdio servers run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launch {
    /// The pool starts a stdio server for each session (never restarted by
    /// the supervisor) and stops it with the session: `npc mcp serve`
    /// without a daemon.
    Owned,
    /// The daemon's MCP driver runs each stdio server as a supervised
    /// component with its `restart` policy; sessions ride on the current
    /// process's pipes.
    Supervised,
}

/// The child spec of a stdio server's process: its command, stdout piped
/// for the session, stderr to the component's log.
pub fn stdio_spec(
    cx: &DriverContext,
    name: &str,
    command: &CommandSpec,
    restart: RestartPolicy,
) -> ChildSpec {
    let id = ComponentId::new(Kind::McpServer, name);
    crate::plugins::data::ensure_for(&command.env);
    let mut spec = child_spec(cx, &id, command, restart);
    spec.stdio.stdout = OutputWiring::Piped;
    spec
}

/// One server of the pool, as `npc status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ServerStatus {
    pub name: String,
    /// `stdio` or `http`.
    pub transport: &'static str,
    #[serde(flatten)]
    pub state: UpstreamState,
    /// Tools the gateway lists for it.
    pub tools: usize,
    /// Their namespaced names, as clients see them (the dashboard lists them).
    pub tool_names: Vec<String>,
    pub last_call: Option<LastCall>,
}

/// The upstream servers of one manifest.
#[derive(Debug)]
pub struct Pool {
    members: RwLock<Arc<BTreeMap<String, Arc<Upstream>>>>,
    cx: DriverContext,
    launch: Launch,
    bus: Option<EventBus>,
    connects: Arc<Semaphore>,
    changed: broadcast::Sender<()>,
    catalog_changed: broadcast::Sender<CatalogChange>,
    /// How tools and prompts are named (`mcp.prefix`).
    prefix: RwLock<Prefix>,
    /// The gateway's client sessions in front of this pool.
    clients: Arc<Clients>,
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
    /// A pool for the manifest's enabled MCP servers, each stdio server
    /// started per session (`Launch::Owned`); nothing connects yet. Stdio
    /// servers run through `supervisor`, in `repo`, logging to
    /// `state_dir/logs`.
    pub fn new(
        manifest: &Manifest,
        repo: PathBuf,
        state_dir: PathBuf,
        supervisor: Supervisor,
    ) -> Self {
        let cx = DriverContext {
            repo,
            state_dir,
            supervisor,
        };
        let pool = Self::empty(cx, Launch::Owned, None);
        pool.set_prefix(manifest.mcp.prefix);
        let members = manifest
            .mcp_servers
            .iter()
            .filter(|(_, s)| s.enabled)
            .map(|(name, config)| (name.clone(), pool.upstream(name, config)))
            .collect();
        *write(&pool.members) = Arc::new(members);
        pool
    }

    /// An empty pool whose members come and go ([`Pool::upsert`],
    /// [`Pool::remove`]); failures are recorded on `bus` when given.
    pub fn empty(cx: DriverContext, launch: Launch, bus: Option<EventBus>) -> Self {
        let (changed, _) = broadcast::channel(CHANGE_QUEUE_DEPTH);
        let (catalog_changed, _) = broadcast::channel(CHANGE_QUEUE_DEPTH);
        Self {
            members: RwLock::new(Arc::default()),
            cx,
            launch,
            bus,
            connects: Arc::new(Semaphore::new(MAX_CONCURRENT_CONNECTS)),
            changed,
            catalog_changed,
            prefix: RwLock::new(Prefix::default()),
            clients: Arc::default(),
        }
    }

    /// The gateway's client sessions in front of this pool, which the
    /// upstreams' notifications and requests reach.
    pub fn clients(&self) -> &Arc<Clients> {
        &self.clients
    }

    /// Name tools and prompts by `prefix` from now on; clients are told
    /// when that changes their names.
    pub fn set_prefix(&self, prefix: Prefix) {
        let old = std::mem::replace(&mut *write(&self.prefix), prefix);
        if old != prefix {
            let _ = self.changed.send(());
            let _ = self.catalog_changed.send(CatalogChange::Prompts);
        }
    }

    /// Tell the gateway's clients the tool list changed.
    pub fn tools_changed(&self) {
        let _ = self.changed.send(());
    }

    /// How tools and prompts are named now.
    pub fn prefix(&self) -> Prefix {
        *read(&self.prefix)
    }

    /// Record connection failures on `bus` (`mcp.server_failed`).
    pub fn with_events(mut self, bus: EventBus) -> Self {
        self.bus = Some(bus.clone());
        let members = read(&self.members).clone();
        let rebuilt = members
            .iter()
            .map(|(name, u)| (name.clone(), self.upstream(name, &u.config())))
            .collect();
        *write(&self.members) = Arc::new(rebuilt);
        self
    }

    /// How this pool runs stdio servers.
    pub fn launch(&self) -> Launch {
        self.launch
    }

    fn upstream(&self, name: &str, config: &McpServer) -> Arc<Upstream> {
        Arc::new(Upstream {
            name: name.to_string(),
            config: RwLock::new(Arc::new(config.clone())),
            cx: self.cx.clone(),
            launch: self.launch,
            bus: self.bus.clone(),
            last_call: Mutex::new(None),
            tools: Arc::default(),
            session: tokio::sync::Mutex::new(None),
            state: Mutex::new(UpstreamState::Disconnected),
            generation: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            last_used: Mutex::new(Instant::now()),
            calls: Semaphore::new(MAX_CONCURRENT_CALLS_PER_SERVER),
            changed: self.changed.clone(),
            catalog: Arc::new(ServerCatalog::new(self.catalog_changed.clone())),
            passthrough: Passthrough {
                server: name.to_string(),
                in_flight: Arc::new(InFlight::default()),
                clients: self.clients.clone(),
                bus: self.bus.clone(),
            },
        })
    }

    /// The current members (a snapshot: membership changes replace the map).
    fn members(&self) -> Arc<BTreeMap<String, Arc<Upstream>>> {
        read(&self.members).clone()
    }

    fn member(&self, name: &str) -> Option<Arc<Upstream>> {
        self.members().get(name).cloned()
    }

    /// Add server `name`, or apply an edit of it. An edit that keeps its
    /// transport and restart policy (filters, timeouts) applies in place and
    /// keeps the session; any other replaces the member, closing its
    /// session. A new member connects in the background. Only `name` is
    /// touched; the gateway's clients are told the tool list changed.
    pub fn upsert(self: &Arc<Self>, name: &str, config: &McpServer) {
        let existing = self.member(name);
        if let Some(u) = &existing {
            let old = u.config();
            if old.transport == config.transport && old.restart == config.restart {
                *write(&u.config) = Arc::new(config.clone());
                let _ = self.changed.send(());
                return;
            }
        }
        let upstream = self.upstream(name, config);
        {
            let mut members = write(&self.members);
            let mut next = (**members).clone();
            next.insert(name.to_string(), upstream.clone());
            *members = Arc::new(next);
        }
        self.membership_changed();
        let pool = self.clone();
        tokio::spawn(async move {
            if let Some(old) = existing {
                old.detach().await;
            }
            pool.connect_member(&upstream).await;
        });
    }

    /// Take server `name` out of the pool and close its session. Returns
    /// whether it was a member.
    pub async fn remove(&self, name: &str) -> bool {
        let removed = {
            let mut members = write(&self.members);
            let mut next = (**members).clone();
            let removed = next.remove(name);
            *members = Arc::new(next);
            removed
        };
        let Some(upstream) = removed else {
            return false;
        };
        upstream.detach().await;
        self.membership_changed();
        true
    }

    /// Tell the gateway's clients that resources or prompts changed (the
    /// manifest's prompts are served beside the servers').
    pub fn catalog_changed(&self, change: CatalogChange) {
        let _ = self.catalog_changed.send(change);
    }

    /// A server joined, left or was replaced: its tools, resources and
    /// prompts appeared or went away.
    fn membership_changed(&self) {
        let _ = self.changed.send(());
        let _ = self.catalog_changed.send(CatalogChange::Resources);
        let _ = self.catalog_changed.send(CatalogChange::Prompts);
    }

    /// The supervisor (re)started server `name`'s process: connect a
    /// session on its fresh pipes in the background.
    pub fn process_started(self: &Arc<Self>, name: &str) {
        let Some(upstream) = self.member(name) else {
            return;
        };
        let pool = self.clone();
        tokio::spawn(async move { pool.connect_member(&upstream).await });
    }

    async fn connect_member(&self, upstream: &Arc<Upstream>) {
        if upstream.is_connected().await {
            return;
        }
        let result = upstream.link(&self.connects, Trigger::Background).await;
        *lock(&upstream.last_used) = Instant::now();
        if let Err(e) = result {
            tracing::warn!(server = %upstream.name, error = %e, "mcp: a server failed to connect");
        }
    }

    /// Connect every server (at most [`MAX_CONCURRENT_CONNECTS`] at once);
    /// returns the ones that failed. A failure affects only its server.
    pub async fn connect_all(&self) -> Vec<PoolError> {
        let mut attempts = tokio::task::JoinSet::new();
        for upstream in self.members().values() {
            let (upstream, connects) = (upstream.clone(), self.connects.clone());
            attempts.spawn(async move {
                let result = upstream.link(&connects, Trigger::Call).await;
                *lock(&upstream.last_used) = Instant::now();
                result.err()
            });
        }
        attempts.join_all().await.into_iter().flatten().collect()
    }

    /// Names of the pool's servers.
    pub fn servers(&self) -> Vec<String> {
        self.members().keys().cloned().collect()
    }

    /// Each server's state.
    pub fn states(&self) -> BTreeMap<String, UpstreamState> {
        self.members()
            .iter()
            .map(|(n, u)| (n.clone(), lock(&u.state).clone()))
            .collect()
    }

    /// Each server's state, listed tools and last call, in name order.
    pub fn status(&self) -> Vec<ServerStatus> {
        let tools = self.tools();
        self.members()
            .iter()
            .map(|(name, u)| ServerStatus {
                name: name.clone(),
                transport: match u.config().transport {
                    McpTransport::Stdio(_) => "stdio",
                    McpTransport::Http { .. } => "http",
                },
                state: lock(&u.state).clone(),
                tools: tools.iter().filter(|t| &t.server == name).count(),
                tool_names: tools
                    .iter()
                    .filter(|t| &t.server == name)
                    .map(|t| t.definition.name.to_string())
                    .collect(),
                last_call: lock(&u.last_call).as_ref().map(|(at, tool)| LastCall {
                    tool: tool.clone(),
                    at: chrono::DateTime::<chrono::Utc>::from(*at).to_rfc3339(),
                }),
            })
            .collect()
    }

    /// Every exposed tool of every server under its gateway name
    /// ([`crate::mcp::expose`] by the pool's prefix, no built-in reserved),
    /// servers in name order and tools in each server's order.
    pub fn tools(&self) -> Vec<ListedTool> {
        self.tools_beside(|_| false)
    }

    /// Like [`Pool::tools`], with `reserved` names (the built-ins') taken.
    pub fn tools_beside(&self, reserved: impl Fn(&str) -> bool) -> Vec<ListedTool> {
        let members = self.members();
        self.exposed(&members, reserved)
            .into_iter()
            .filter_map(|e| {
                let upstream = members.get(&e.server)?;
                let mut definition = read(&upstream.tools)
                    .iter()
                    .find(|t| t.name == e.own)?
                    .clone();
                definition.name = e.name.into();
                Some(ListedTool {
                    server: e.server,
                    tool: e.own,
                    definition,
                })
            })
            .collect()
    }

    /// Every exposed tool's gateway name, with `reserved` names taken (no
    /// definitions cloned).
    pub fn names_beside(&self, reserved: impl Fn(&str) -> bool) -> Vec<crate::mcp::Exposed> {
        self.exposed(&self.members(), reserved)
    }

    /// The exposed tools of `members` under their gateway names.
    fn exposed(
        &self,
        members: &BTreeMap<String, Arc<Upstream>>,
        reserved: impl Fn(&str) -> bool,
    ) -> Vec<crate::mcp::Exposed> {
        let lists: Vec<_> = members
            .iter()
            .map(|(server, u)| (server.as_str(), u.config(), read(&u.tools)))
            .collect();
        let items = lists.iter().flat_map(|(server, config, tools)| {
            tools
                .iter()
                .filter(|t| crate::mcp::exposes(config, &t.name))
                .map(|t| (*server, t.name.as_ref()))
        });
        crate::mcp::expose(self.prefix(), items, reserved)
    }

    /// The (server, tool) a gateway name stands for, if listed (no
    /// built-in reserved).
    pub fn resolve(&self, name: &str) -> Option<(String, String)> {
        self.resolve_beside(name, |_| false)
    }

    /// Like [`Pool::resolve`], with `reserved` names taken. With
    /// `prefix = "always"` the first match in [`Pool::tools`] order,
    /// without building the list.
    pub fn resolve_beside(
        &self,
        name: &str,
        reserved: impl Fn(&str) -> bool,
    ) -> Option<(String, String)> {
        if self.prefix() == Prefix::OnConflict {
            return self
                .exposed(&self.members(), reserved)
                .into_iter()
                .find(|e| e.name == name)
                .map(|e| (e.server, e.own));
        }
        self.members().iter().find_map(|(server, upstream)| {
            let tool = name
                .strip_prefix(server.as_str())?
                .strip_prefix(crate::mcp::NAMESPACE_SEPARATOR)?;
            let listed = read(&upstream.tools).iter().any(|t| t.name == tool)
                && crate::mcp::exposes(&upstream.config(), tool)
                && crate::mcp::namespaced(server, tool).is_some();
            listed.then(|| (server.clone(), tool.to_string()))
        })
    }

    /// Call `tool` of `server` within the server's `tool_timeout_ms`.
    pub async fn call(
        &self,
        server: &str,
        tool: &str,
        arguments: Option<&JsonObject>,
    ) -> Result<CallToolResult, CallError> {
        let upstream = self.member(server).ok_or_else(|| {
            CallError::Unavailable(PoolError::UnknownServer {
                server: server.to_string(),
            })
        })?;
        upstream.call(tool, arguments, &self.connects).await
    }

    /// Each server's resources and prompts, servers in name order.
    pub fn catalogs(&self) -> impl Iterator<Item = (String, Arc<ServerCatalog>)> + use<> {
        let members = self.members();
        let catalogs: Vec<_> = members
            .iter()
            .map(|(name, u)| (name.clone(), u.catalog.clone()))
            .collect();
        catalogs.into_iter()
    }

    /// The resources and prompts of `server`, if it is in the pool.
    pub fn catalog_of(&self, server: &str) -> Option<Arc<ServerCatalog>> {
        self.member(server).map(|u| u.catalog.clone())
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
        let upstream = self.member(server).ok_or_else(|| {
            CallError::Unavailable(PoolError::UnknownServer {
                server: server.to_string(),
            })
        })?;
        upstream
            .request(&self.connects, |link| async move {
                send(link.peer).await.map_err(Failure::from)
            })
            .await
    }

    /// The live sessions of the servers, without connecting any.
    async fn live_peers(&self) -> Vec<Peer<RoleClient>> {
        let mut peers = Vec::new();
        for upstream in self.members().values() {
            let slot = upstream.session.lock().await;
            if let Some(s) = slot.as_ref()
                && !s.service.is_closed()
            {
                peers.push(s.service.peer().clone());
            }
        }
        peers
    }

    /// A client set a logging level: every connected server gets the most
    /// verbose one any client set (each client still gets only what its own
    /// level lets through).
    #[allow(deprecated)]
    pub async fn set_level(&self, level: LoggingLevel) {
        for peer in self.live_peers().await {
            let params = SetLevelRequestParams::new(level);
            tokio::spawn(async move {
                let _ = peer.set_level(params).await;
            });
        }
    }

    /// A client's roots changed: every connected server is told.
    pub async fn roots_changed(&self) {
        for peer in self.live_peers().await {
            tokio::spawn(async move {
                let _ = peer.notify_roots_list_changed().await;
            });
        }
    }

    /// A receiver told whenever some server's tool list changed.
    pub fn subscribe_changes(&self) -> broadcast::Receiver<()> {
        self.changed.subscribe()
    }

    /// Close sessions idle for longer than their server's `idle_timeout`.
    pub async fn sweep_idle(&self) {
        let now = Instant::now();
        for upstream in self.members().values() {
            upstream.sweep(now).await;
        }
    }

    /// Close every session and stop every server process.
    pub async fn shutdown(&self) {
        for upstream in self.members().values() {
            upstream.detach().await;
        }
    }
}
