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

use rmcp::model::{
    CallToolRequestParams, CallToolResult, JsonObject, PaginatedRequestParams, Tool,
};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::{ClientHandler, ErrorData, Peer, RoleClient, ServiceExt};
use tokio::sync::{Semaphore, broadcast};

use super::catalog::{CatalogChange, ServerCatalog};
use super::lock;
use super::wire::{Failure, Wire};

use crate::bus::EventBus;
use crate::driver::{DriverContext, child_spec};
use crate::model::{CommandSpec, Manifest, McpServer, McpTransport, RestartPolicy};
use crate::plan::{ComponentId, Kind};
use crate::store::NewEvent;
use crate::supervisor::{ChildSpec, ChildState, OutputWiring, Supervisor, SupervisorError};

/// Event recorded when an upstream server cannot be connected.
pub const SERVER_FAILED_EVENT: &str = "mcp.server_failed";

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

/// Who asked for a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trigger {
    /// A tool call: a supervised process whose pipes an earlier session used
    /// is restarted to get fresh ones.
    Call,
    /// A background connect (a new server, a restarted process): uses only
    /// fresh pipes, so a server that fails its handshake is never restarted
    /// in a loop.
    Background,
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

/// The last tool call of a server (for status).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LastCall {
    /// The upstream's own name of the tool.
    pub tool: String,
    /// RFC 3339.
    pub at: String,
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
    /// A stdio server's lean side, which its tool calls take.
    wire: Option<Arc<Wire>>,
    generation: u64,
    /// The supervised process the session rides on, if any.
    pid: Option<u32>,
}

/// A live session as a request sees it.
struct Link {
    peer: Peer<RoleClient>,
    wire: Option<Arc<Wire>>,
    generation: u64,
}

impl Session {
    fn link(&self) -> Link {
        Link {
            peer: self.service.peer().clone(),
            wire: self.wire.clone(),
            generation: self.generation,
        }
    }
}

/// One upstream server: its config, cached tools and (at most one) session.
struct Upstream {
    name: String,
    /// Replaced in place by an edit that keeps the transport.
    config: RwLock<Arc<McpServer>>,
    cx: DriverContext,
    launch: Launch,
    bus: Option<EventBus>,
    last_call: Mutex<Option<(SystemTime, String)>>,
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

    fn config(&self) -> Arc<McpServer> {
        read(&self.config).clone()
    }

    /// Whether a session is up.
    async fn is_connected(&self) -> bool {
        let slot = self.session.lock().await;
        slot.as_ref().is_some_and(|s| !s.service.is_closed())
    }

    /// The live session, connecting first when there is none.
    /// `Ok(None)`: a background connect found nothing to connect to.
    async fn link(
        &self,
        connects: &Semaphore,
        trigger: Trigger,
    ) -> Result<Option<Link>, PoolError> {
        let mut slot = self.session.lock().await;
        if let Some(s) = slot.as_ref()
            && !s.service.is_closed()
        {
            return Ok(Some(s.link()));
        }
        if let Some(old) = slot.take() {
            self.stop_process(old.pid).await;
        }
        let _permit = connects.acquire().await;
        let rides_on_pipes = self.launch == Launch::Supervised
            && matches!(self.config().transport, McpTransport::Stdio(_));
        let pipes = match self.process_pipes(trigger).await {
            Ok(Some(pipes)) => Some(pipes),
            Ok(None) if rides_on_pipes && trigger == Trigger::Background => return Ok(None),
            Ok(None) if rides_on_pipes => {
                // Never start a second, unsupervised copy of the server.
                let e = PoolError::NotRunning {
                    server: self.name.clone(),
                    state: "restarting".into(),
                };
                self.failed(&e).await;
                return Err(e);
            }
            Ok(None) => None,
            Err(e) => {
                self.failed(&e).await;
                return Err(e);
            }
        };
        self.set_state(UpstreamState::Connecting);
        let pid = pipes.as_ref().map(|p| p.pid);
        match self.connect(pipes).await {
            Ok((service, wire)) => {
                let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
                let session = Session {
                    service,
                    wire: wire.map(Arc::new),
                    generation,
                    pid,
                };
                let link = session.link();
                *slot = Some(session);
                self.set_state(UpstreamState::Connected);
                Ok(Some(link))
            }
            Err(e) => {
                if self.launch == Launch::Owned {
                    self.stop_process(None).await;
                }
                self.failed(&e).await;
                Err(e)
            }
        }
    }

    /// Record a failed connect: the state, and an `mcp.server_failed` event.
    async fn failed(&self, e: &PoolError) {
        self.set_state(UpstreamState::Failed {
            reason: e.to_string(),
        });
        if let Some(bus) = &self.bus {
            let event = NewEvent::new(
                SERVER_FAILED_EVENT,
                serde_json::json!({ "server": self.name, "reason": e.to_string() }),
            )
            .for_component(self.component().to_string());
            if let Err(e) = bus.publish(event).await {
                tracing::warn!(error = %e, "mcp: recording a failed server failed");
            }
        }
    }

    /// The pipes of the supervised process to ride a session on (`None`
    /// for an owned launch or an HTTP server, which connect themselves, and
    /// for a background connect that finds no fresh pipes).
    async fn process_pipes(
        &self,
        trigger: Trigger,
    ) -> Result<Option<crate::supervisor::ChildPipes>, PoolError> {
        let config = self.config();
        let McpTransport::Stdio(command) = &config.transport else {
            return Ok(None);
        };
        if self.launch == Launch::Owned {
            return Ok(None);
        }
        let key = self.component().to_string();
        if let Some(pipes) = self.cx.supervisor.take_pipes(&key) {
            return Ok(Some(pipes));
        }
        if trigger == Trigger::Background {
            return Ok(None);
        }
        match self.cx.supervisor.status(&key) {
            // Alive, but an earlier session used its pipes: a fresh process.
            Some(s) if matches!(s.state, ChildState::Running | ChildState::Starting) => {
                let spec = stdio_spec(&self.cx, &self.name, command, config.restart);
                self.cx
                    .supervisor
                    .restart(&key, spec)
                    .await
                    .map_err(|e| PoolError::Spawn {
                        server: self.name.clone(),
                        reason: e.to_string(),
                    })?;
                Ok(self.cx.supervisor.take_pipes(&key))
            }
            status => Err(PoolError::NotRunning {
                server: self.name.clone(),
                state: status.map_or("not started".to_string(), |s| s.state.as_str().to_string()),
            }),
        }
    }

    fn component(&self) -> ComponentId {
        ComponentId::new(Kind::McpServer, &self.name)
    }

    /// Connect a session: over a stdio server's pipes through a [`Wire`]
    /// (returned too), over HTTP through rmcp alone.
    async fn connect(
        &self,
        pipes: Option<crate::supervisor::ChildPipes>,
    ) -> Result<(RunningService<RoleClient, Listener>, Option<Wire>), PoolError> {
        let server = self.name.clone();
        let config = self.config();
        match &config.transport {
            McpTransport::Stdio(_) if pipes.is_some() => {
                let (Some(stdout), Some(stdin)) =
                    pipes.map_or((None, None), |p| (p.stdout, p.stdin))
                else {
                    return Err(PoolError::Spawn {
                        server,
                        reason: "its standard streams were not piped".into(),
                    });
                };
                self.handshake_stdio(stdout, stdin).await
            }
            McpTransport::Stdio(command) => {
                // The pool reconnects lazily, so the supervisor never restarts it.
                let spec = stdio_spec(&self.cx, &self.name, command, RestartPolicy::Never);
                let key = self.component().to_string();
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
                self.handshake_stdio(stdout, stdin).await
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
                let result = self.handshake(transport).await.map(|s| (s, None));
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

    /// Initialize a session over a stdio server's pipes, through a [`Wire`].
    async fn handshake_stdio(
        &self,
        stdout: tokio::process::ChildStdout,
        stdin: tokio::process::ChildStdin,
    ) -> Result<(RunningService<RoleClient, Listener>, Option<Wire>), PoolError> {
        let (wire, rmcp) = Wire::start(stdout, stdin);
        let service = self.handshake(rmcp).await?;
        Ok((service, Some(wire)))
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
        let limit_ms = self.config().startup_timeout_ms;
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

    /// After a session ended: an owned process is stopped; a supervised
    /// one that still runs as `session_pid` is restarted (its pipes belong to
    /// the dead session), which reconnects through [`Pool::process_started`].
    async fn stop_process(&self, session_pid: Option<u32>) {
        let config = self.config();
        let McpTransport::Stdio(command) = &config.transport else {
            return;
        };
        let key = self.component().to_string();
        match self.launch {
            Launch::Owned => {
                let _ = self.cx.supervisor.remove(&key).await;
            }
            Launch::Supervised => {
                let Some(pid) = session_pid else { return };
                let alive = self.cx.supervisor.status(&key).is_some_and(|s| {
                    s.pid == Some(pid)
                        && matches!(s.state, ChildState::Running | ChildState::Starting)
                });
                if alive {
                    let spec = stdio_spec(&self.cx, &self.name, command, config.restart);
                    if let Err(e) = self.cx.supervisor.restart(&key, spec).await {
                        tracing::warn!(server = %self.name, error = %e, "mcp: restarting a server failed");
                    }
                }
            }
        }
    }

    /// Close the session of `generation` (if still current) and stop (or,
    /// supervised, restart) its process.
    async fn close(&self, generation: Option<u64>) {
        let mut slot = self.session.lock().await;
        if generation.is_none_or(|g| slot.as_ref().is_some_and(|s| s.generation == g)) {
            let mut pid = None;
            if let Some(s) = slot.take() {
                pid = s.pid;
                let _ = s.service.cancel().await;
            }
            self.stop_process(pid).await;
            self.set_state(UpstreamState::Disconnected);
        }
    }

    /// Close the session for good (the server left the pool): an owned
    /// process is stopped; a supervised one is the driver's to stop.
    async fn detach(&self) {
        let mut slot = self.session.lock().await;
        if let Some(s) = slot.take() {
            let _ = s.service.cancel().await;
        }
        if self.launch == Launch::Owned {
            self.stop_process(None).await;
        }
        self.set_state(UpstreamState::Disconnected);
    }

    async fn call(
        &self,
        tool: &str,
        arguments: Option<&JsonObject>,
        connects: &Semaphore,
    ) -> Result<CallToolResult, CallError> {
        *lock(&self.last_call) = Some((SystemTime::now(), tool.to_string()));
        let answer = self
            .request(connects, |link| async move {
                match link.wire {
                    Some(wire) => wire.call_tool(tool, arguments).await,
                    None => {
                        let mut params = CallToolRequestParams::new(tool.to_string());
                        params.arguments = arguments.cloned();
                        link.peer.call_tool(params).await.map_err(Failure::from)
                    }
                }
            })
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
        F: FnOnce(Link) -> Fut,
        Fut: std::future::Future<Output = Result<T, Failure>>,
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
        F: FnOnce(Link) -> Fut,
        Fut: std::future::Future<Output = Result<T, Failure>>,
    {
        let link = self
            .link(connects, Trigger::Call)
            .await
            .map_err(CallError::Unavailable)?
            .ok_or_else(|| {
                CallError::Unavailable(PoolError::NotRunning {
                    server: self.name.clone(),
                    state: "not started".into(),
                })
            })?;
        let limit_ms = self.config().tool_timeout_ms;
        let generation = link.generation;
        match tokio::time::timeout(Duration::from_millis(limit_ms), send(link)).await {
            Ok(Ok(answer)) => Ok(Ok(answer)),
            Ok(Err(Failure::Answer(e))) => Ok(Err(e)),
            Ok(Err(Failure::Lost(reason))) => {
                self.close(Some(generation)).await;
                Err(CallError::Lost {
                    server: self.name.clone(),
                    reason,
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

    /// Close the session if it has been unused for the server's idle
    /// timeout. A supervised stdio server's session lives as long as its
    /// process (closing it would end the process the supervisor keeps).
    async fn sweep(&self, now: Instant) {
        let config = self.config();
        if self.launch == Launch::Supervised && matches!(config.transport, McpTransport::Stdio(_)) {
            return;
        }
        let idle = Duration::from_secs(config.idle_timeout_s);
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
    members: RwLock<Arc<BTreeMap<String, Arc<Upstream>>>>,
    cx: DriverContext,
    launch: Launch,
    bus: Option<EventBus>,
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
        }
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

    /// Every exposed tool of every server, namespaced, servers in name order
    /// and tools in each server's order. A tool whose namespaced name is not
    /// portable, or collides with an earlier one, is left out.
    pub fn tools(&self) -> Vec<ListedTool> {
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::new();
        for (server, upstream) in self.members().iter() {
            let config = upstream.config();
            for tool in read(&upstream.tools).iter() {
                if !super::exposes(&config, &tool.name) {
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
        self.members().iter().find_map(|(server, upstream)| {
            let tool = name
                .strip_prefix(server.as_str())?
                .strip_prefix(super::NAMESPACE_SEPARATOR)?;
            let listed = read(&upstream.tools).iter().any(|t| t.name == tool)
                && super::exposes(&upstream.config(), tool)
                && super::namespaced(server, tool).is_some();
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
