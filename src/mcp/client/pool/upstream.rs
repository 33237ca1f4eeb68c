//! One upstream server's life: its session (at most one live, with its
//! generation), how it links (an owned process, the supervised process's
//! pipes, or HTTP), the handshake, its cached tool list refreshed on
//! `list_changed`, calls and requests bounded by `tool_timeout_ms`, and
//! closing, detaching and the idle sweep. The set of upstreams is
//! [`super::Pool`]'s.

use super::*;
use crate::event::{Event, McpServerFailed};
use crate::mcp::passthrough::INPUT_REQUIRED;

/// The server's tools, at most [`MAX_TOOL_PAGES`] pages and
/// [`MAX_TOOLS_PER_SERVER`] tools, so a server paging forever or listing
/// without end cannot grow npc's memory.
pub(super) async fn fetch_tools(
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

/// Who asked for a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Trigger {
    /// A tool call: a supervised process whose pipes an earlier session used
    /// is restarted to get fresh ones.
    Call,
    /// A background connect (a new server, a restarted process): uses only
    /// fresh pipes, so a server that fails its handshake is never restarted
    /// in a loop.
    Background,
}

/// The last tool call of a server (for status).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LastCall {
    /// The upstream's own name of the tool.
    pub tool: String,
    /// RFC 3339.
    pub at: String,
}

/// An upstream session's client side: keeps its cached tool list fresh
/// (`notifications/tools/list_changed` refetches it after
/// [`LIST_CHANGED_DEBOUNCE`] and tells the gateway's clients; notifications
/// while one refresh waits or runs coalesce into one more, so a server
/// flooding them costs at most one task and one fetch per window), and
/// passes the server's requests and notifications to the gateway's clients
/// ([`Passthrough`]). npc announces what its clients can have: sampling,
/// elicitation in both modes and roots; each request is checked against
/// the capabilities of the client it goes to.
#[derive(Debug, Clone)]
pub(super) struct Listener {
    pub(super) server: String,
    pub(super) tools: Arc<RwLock<Vec<Tool>>>,
    pub(super) changed: broadcast::Sender<()>,
    pub(super) refresh: Arc<AtomicU8>,
    pub(super) catalog: Arc<ServerCatalog>,
    pub(super) passthrough: Passthrough,
}

/// What npc's `initialize` to an upstream declares: everything a client
/// of the gateway may be able to do.
#[allow(deprecated)]
fn client_capabilities() -> ClientCapabilities {
    let mut capabilities = ClientCapabilities::default();
    capabilities.sampling = Some(SamplingCapability::default());
    capabilities.elicitation = Some(
        ElicitationCapability::new()
            .with_form(FormElicitationCapability::new())
            .with_url(UrlElicitationCapability::new()),
    );
    let mut roots = RootsCapabilities::default();
    roots.list_changed = Some(true);
    capabilities.roots = Some(roots);
    capabilities
}

/// A failed handshake: why, and, when the server refused `initialize` as
/// one that speaks only sessionless versions, those it named (newest first).
pub(super) struct Refusal {
    pub(super) error: PoolError,
    pub(super) sessionless: Option<Vec<ProtocolVersion>>,
}

/// The sessionless protocol versions (no `initialize`: 2026-07-28 and later)
/// npc knows that a server named when it refused `initialize` with
/// UnsupportedProtocolVersionError, newest first; `None` for any other
/// failure, or when it named none npc speaks.
fn sessionless_only(error: &ClientInitializeError) -> Option<Vec<ProtocolVersion>> {
    let ClientInitializeError::JsonRpcError(e) = error else {
        return None;
    };
    if e.code != rmcp::model::ErrorCode::UNSUPPORTED_PROTOCOL_VERSION {
        return None;
    }
    // Without a list, every sessionless version npc knows is worth a try.
    let named: Option<Vec<ProtocolVersion>> = e
        .data
        .as_ref()
        .and_then(|d| d.get("supported"))
        .and_then(|v| serde_json::from_value(v.clone()).ok());
    let versions: Vec<ProtocolVersion> = ProtocolVersion::KNOWN_VERSIONS
        .iter()
        .rev()
        .filter(|v| !v.has_initialize())
        .filter(|v| named.as_ref().is_none_or(|named| named.contains(v)))
        .cloned()
        .collect();
    (!versions.is_empty()).then_some(versions)
}

/// The per-request `_meta` of `service`'s session, when it is of a
/// sessionless version: the version, and npc's client info and capabilities.
fn envelope(service: &RunningService<RoleClient, Listener>) -> Option<Envelope> {
    let version = service.peer().peer_info()?.protocol_version.clone();
    if version.has_initialize() {
        return None;
    }
    let info = service.service().get_info();
    let meta = rmcp::model::RequestMetaObject::with_client_context(
        version,
        info.client_info,
        info.capabilities,
    );
    Envelope::new(&meta)
        .inspect_err(|e| tracing::warn!(error = %e, "mcp: the per-request `_meta` did not encode"))
        .ok()
}

/// The answer of the expected kind, or the error the upstream gets.
fn expect<T>(
    answer: Result<ClientResult, ErrorData>,
    pick: impl FnOnce(ClientResult) -> Option<T>,
) -> Result<T, ErrorData> {
    pick(answer?).ok_or_else(|| {
        ErrorData::internal_error(
            "the gateway's client answered with another kind of result",
            None,
        )
    })
}

#[allow(deprecated)]
impl ClientHandler for Listener {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            client_capabilities(),
            Implementation::new("npc", env!("CARGO_PKG_VERSION")),
        )
    }

    async fn create_message(
        &self,
        params: CreateMessageRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        let request = ServerRequest::CreateMessageRequest(CreateMessageRequest::new(params));
        expect(
            self.passthrough.request(request, &context).await,
            |r| match r {
                ClientResult::CreateMessageResult(r) => Some(*r),
                _ => None,
            },
        )
    }

    async fn create_elicitation(
        &self,
        params: ElicitRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        let request = ServerRequest::ElicitRequest(ElicitRequest::new(params));
        expect(
            self.passthrough.request(request, &context).await,
            |r| match r {
                ClientResult::ElicitResult(r) => Some(r),
                _ => None,
            },
        )
    }

    async fn list_roots(
        &self,
        context: RequestContext<RoleClient>,
    ) -> Result<ListRootsResult, ErrorData> {
        let request = ServerRequest::ListRootsRequest(ListRootsRequest::default());
        expect(
            self.passthrough.request(request, &context).await,
            |r| match r {
                ClientResult::ListRootsResult(r) => Some(r),
                _ => None,
            },
        )
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.passthrough.progress(params);
    }

    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.passthrough.log(params);
    }

    async fn on_resource_updated(
        &self,
        params: ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.passthrough.resource_updated(params);
    }

    async fn on_resource_list_changed(&self, context: NotificationContext<RoleClient>) {
        self.catalog
            .list_changed(CatalogChange::Resources, context.peer, self.server.clone());
    }

    async fn on_prompt_list_changed(&self, context: NotificationContext<RoleClient>) {
        self.catalog
            .list_changed(CatalogChange::Prompts, context.peer, self.server.clone());
    }

    async fn on_tool_list_changed(&self, context: NotificationContext<RoleClient>) {
        self.tools_changed(context.peer);
    }
}

impl Listener {
    /// The upstream's tools changed: refetch them (debounced) on `peer`.
    pub(super) fn tools_changed(&self, peer: Peer<RoleClient>) {
        if !refresh_begins(&self.refresh) {
            return;
        }
        let listener = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(LIST_CHANGED_DEBOUNCE).await;
                match fetch_tools(&peer, &listener.server).await {
                    Ok(list) => {
                        *write(&listener.tools) = list;
                        let _ = listener.changed.send(());
                    }
                    Err(e) => {
                        tracing::warn!(server = %listener.server, error = %e, "mcp: refreshing a tool list failed")
                    }
                }
                if refresh_done(&listener.refresh) {
                    break;
                }
            }
        });
    }
}

/// A session's lean side, which its tool calls take.
#[derive(Debug)]
pub(super) enum Lean {
    /// A stdio server's.
    Stdio(Wire),
    /// A streamable HTTP server's.
    Http(HttpWire),
}

pub(super) struct Session {
    pub(super) service: RunningService<RoleClient, Listener>,
    pub(super) wire: Option<Arc<Lean>>,
    pub(super) generation: u64,
    /// The supervised process the session rides on, if any.
    pub(super) pid: Option<u32>,
}

/// A live session as a request sees it.
pub(super) struct Link {
    pub(super) peer: Peer<RoleClient>,
    pub(super) wire: Option<Arc<Lean>>,
    pub(super) generation: u64,
}

impl Session {
    pub(super) fn link(&self) -> Link {
        Link {
            peer: self.service.peer().clone(),
            wire: self.wire.clone(),
            generation: self.generation,
        }
    }
}

/// One upstream server: its config, cached tools and (at most one) session.
pub(super) struct Upstream {
    pub(super) name: String,
    /// Replaced in place by an edit that keeps the transport.
    pub(super) config: RwLock<Arc<McpServer>>,
    pub(super) cx: DriverContext,
    pub(super) launch: Launch,
    pub(super) bus: Option<EventBus>,
    pub(super) last_call: Mutex<Option<(SystemTime, String)>>,
    pub(super) tools: Arc<RwLock<Vec<Tool>>>,
    pub(super) session: tokio::sync::Mutex<Option<Session>>,
    pub(super) state: Mutex<UpstreamState>,
    pub(super) generation: AtomicU64,
    pub(super) in_flight: AtomicUsize,
    pub(super) last_used: Mutex<Instant>,
    pub(super) calls: Semaphore,
    pub(super) changed: broadcast::Sender<()>,
    pub(super) catalog: Arc<ServerCatalog>,
    /// Where the server's requests and notifications go.
    pub(super) passthrough: Passthrough,
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
    /// The server answered with a JSON-RPC error (the session is fine); the
    /// gateway passes it to its client as that error.
    #[error("MCP server `{server}` answered with an error: {}", .error.message)]
    Answered { server: String, error: ErrorData },
}

impl Upstream {
    pub(super) fn set_state(&self, state: UpstreamState) {
        *lock(&self.state) = state;
    }

    pub(super) fn config(&self) -> Arc<McpServer> {
        read(&self.config).clone()
    }

    /// Whether a session is up.
    pub(super) async fn is_connected(&self) -> bool {
        let slot = self.session.lock().await;
        slot.as_ref().is_some_and(|s| !s.service.is_closed())
    }

    /// The live session, connecting first when there is none.
    /// `Ok(None)`: a background connect found nothing to connect to.
    pub(super) async fn link(
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
    pub(super) async fn failed(&self, e: &PoolError) {
        self.set_state(UpstreamState::Failed {
            reason: e.to_string(),
        });
        if let Some(bus) = &self.bus {
            let event = Event::McpServerFailed(McpServerFailed {
                server: self.name.to_string(),
                reason: e.to_string(),
            })
            .for_component(self.component().to_string());
            if let Err(e) = bus.publish(event).await {
                tracing::warn!(error = %e, "mcp: recording a failed server failed");
            }
        }
    }

    /// The pipes of the supervised process to ride a session on (`None`
    /// for an owned launch or an HTTP server, which connect themselves, and
    /// for a background connect that finds no fresh pipes).
    pub(super) async fn process_pipes(
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

    pub(super) fn component(&self) -> ComponentId {
        ComponentId::new(Kind::McpServer, &self.name)
    }

    /// Connect a session: over a stdio server's pipes through a [`Wire`],
    /// over HTTP through rmcp with an [`HttpWire`] on its session (the lean
    /// side returned too).
    pub(super) async fn connect(
        &self,
        pipes: Option<crate::supervisor::ChildPipes>,
    ) -> Result<(RunningService<RoleClient, Listener>, Option<Lean>), PoolError> {
        let server = self.name.clone();
        let config = self.config();
        if let Err(e) = config.check_start() {
            return Err(PoolError::Spawn {
                server,
                reason: e.to_string(),
            });
        }
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
                let result = self
                    .negotiate(|| {
                        crate::surfaces::mcp_link::client_link(
                            url.expose(),
                            &headers,
                            bearer.clone(),
                        )
                        .map_err(|e| PoolError::Handshake {
                            server: server.clone(),
                            reason: e.to_string(),
                        })
                    })
                    .await
                    .map(|(s, link)| {
                        let wire = HttpWire::new(link, s.service().clone());
                        (s, Some(Lean::Http(wire)))
                    });
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

    /// Start a session over a stdio server's pipes, through a [`Wire`]
    /// whose calls carry the per-request `_meta` when the session is of a
    /// sessionless version.
    pub(super) async fn handshake_stdio(
        &self,
        stdout: tokio::process::ChildStdout,
        stdin: tokio::process::ChildStdin,
    ) -> Result<(RunningService<RoleClient, Listener>, Option<Lean>), PoolError> {
        let (wire, (read, write)) = Wire::start(stdout, stdin, Some(self.passthrough.clone()));
        // Lent, so that a refused `initialize` leaves the pipes to `server/discover`.
        let (read, write) = (Lent::new(read), Lent::new(write));
        let (service, ()) = self
            .negotiate(|| Ok(((read.clone(), write.clone()), ())))
            .await?;
        if let Some(envelope) = envelope(&service) {
            wire.speak(envelope);
        }
        Ok((service, Some(Lean::Stdio(wire))))
    }

    /// Start a session on a transport from `open` (with what goes with it),
    /// within the server's `startup_timeout_ms`: `initialize` first, so a
    /// server of both eras keeps the handshake era, where its requests to
    /// the client (sampling, elicitation, roots) and its own notifications
    /// pass through; a server that refuses it as one speaking only
    /// sessionless versions (UnsupportedProtocolVersionError naming them)
    /// is then reached with `server/discover` and per-request `_meta`, on a
    /// second transport from `open`.
    pub(super) async fn negotiate<T, E, A, X>(
        &self,
        mut open: impl FnMut() -> Result<(T, X), PoolError>,
    ) -> Result<(RunningService<RoleClient, Listener>, X), PoolError>
    where
        T: rmcp::transport::IntoTransport<RoleClient, E, A>,
        E: std::error::Error + Send + Sync + 'static,
    {
        let limit_ms = self.config().startup_timeout_ms;
        let deadline = tokio::time::Instant::now() + Duration::from_millis(limit_ms);
        let (transport, with) = open()?;
        let refused = match self
            .handshake(transport, ClientLifecycleMode::Initialize, deadline)
            .await
        {
            Ok(service) => return Ok((service, with)),
            Err(Refusal {
                sessionless: Some(versions),
                error,
            }) => {
                tracing::info!(server = %self.name, error = %error, "mcp: the server speaks only sessionless protocol versions; reaching it with `server/discover`");
                versions
            }
            Err(refusal) => return Err(refusal.error),
        };
        let (transport, with) = open()?;
        let lifecycle = ClientLifecycleMode::Discover {
            preferred_versions: refused,
        };
        match self.handshake(transport, lifecycle, deadline).await {
            Ok(service) => Ok((service, with)),
            Err(refusal) => Err(refusal.error),
        }
    }

    /// Start a session over `transport` by `lifecycle` and fetch its tools
    /// and catalog, by `deadline`.
    pub(super) async fn handshake<T, E, A>(
        &self,
        transport: T,
        lifecycle: ClientLifecycleMode,
        deadline: tokio::time::Instant,
    ) -> Result<RunningService<RoleClient, Listener>, Refusal>
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
            passthrough: self.passthrough.clone(),
        };
        let limit_ms = self.config().startup_timeout_ms;
        let handshake = async {
            let service = listener
                .serve_with_lifecycle(transport, lifecycle)
                .await
                .map_err(|e| (e.to_string(), sessionless_only(&e)))?;
            let tools = fetch_tools(service.peer(), &server)
                .await
                .map_err(|e| (format!("`tools/list` failed: {e}"), None))?;
            self.catalog.fetch(service.peer(), &server).await;
            Ok::<_, (String, Option<Vec<ProtocolVersion>>)>((service, tools))
        };
        match tokio::time::timeout_at(deadline, handshake).await {
            Err(_) => Err(Refusal {
                error: PoolError::StartupTimeout { server, limit_ms },
                sessionless: None,
            }),
            Ok(Err((reason, sessionless))) => Err(Refusal {
                error: PoolError::Handshake { server, reason },
                sessionless,
            }),
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
    pub(super) async fn stop_process(&self, session_pid: Option<u32>) {
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
    pub(super) async fn close(&self, generation: Option<u64>) {
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
    pub(super) async fn detach(&self) {
        let mut slot = self.session.lock().await;
        if let Some(s) = slot.take() {
            let _ = s.service.cancel().await;
        }
        if self.launch == Launch::Owned {
            self.stop_process(None).await;
        }
        self.set_state(UpstreamState::Disconnected);
    }

    pub(super) async fn call(
        &self,
        tool: &str,
        arguments: Option<&JsonObject>,
        connects: &Semaphore,
    ) -> Result<CallToolResult, CallError> {
        *lock(&self.last_call) = Some((SystemTime::now(), tool.to_string()));
        // The caller, for what the server sends back during the call.
        let entered = self.passthrough.in_flight.enter();
        let entered = entered.as_ref();
        let token = entered.and_then(|e| e.token());
        let answer = self
            .request(connects, |link| async move {
                let lean = match link.wire.as_deref() {
                    Some(Lean::Stdio(wire)) => {
                        Some(wire.call_tool(tool, arguments, token.as_ref()).await)
                    }
                    Some(Lean::Http(wire)) => {
                        wire.call_tool(&link.peer, tool, arguments, entered).await
                    }
                    None => None,
                };
                match lean {
                    Some(answer) => answer,
                    None => call_over_rmcp(&link.peer, tool, arguments, entered).await,
                }
            })
            .await?;
        // A protocol-level error answer: the session is fine. One the
        // gateway made itself (a multi-round-trip result it cannot pass on)
        // stays npc's own `isError` result.
        match answer {
            Ok(result) => Ok(result),
            Err(error) if error.message == INPUT_REQUIRED => Ok(CallToolResult::error(vec![
                rmcp::model::ContentBlock::text(format!(
                    "MCP server `{}` answered with an error: {}",
                    self.name, error.message
                )),
            ])),
            Err(error) => Err(CallError::Answered {
                server: self.name.to_string(),
                error,
            }),
        }
    }

    /// Send one request through `send` within the server's
    /// `tool_timeout_ms`, connecting first when there is no session. An error
    /// answer is the inner `Err` (the session stays); a timeout or a broken
    /// session closes the session, and the next request reconnects.
    pub(super) async fn request<T, F, Fut>(
        &self,
        connects: &Semaphore,
        send: F,
    ) -> Result<Result<T, ErrorData>, CallError>
    where
        F: FnOnce(Link) -> Fut,
        Fut: std::future::Future<Output = Result<T, Failure>>,
    {
        let _slot = self.calls.acquire().await;
        // Counted down even when the caller stops waiting (a cancelled call).
        struct Busy<'a>(&'a Upstream);
        impl Drop for Busy<'_> {
            fn drop(&mut self) {
                *lock(&self.0.last_used) = Instant::now();
                self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
            }
        }
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let _busy = Busy(self);
        self.request_inner(connects, send).await
    }

    pub(super) async fn request_inner<T, F, Fut>(
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
    pub(super) async fn sweep(&self, now: Instant) {
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

/// A tool call through rmcp's session (an HTTP upstream): the request's id
/// and progress token are rmcp's, learnt once it is sent.
async fn call_over_rmcp(
    peer: &Peer<RoleClient>,
    tool: &str,
    arguments: Option<&JsonObject>,
    entered: Option<&Entered<'_>>,
) -> Result<CallToolResult, Failure> {
    let mut params = CallToolRequestParams::new(tool.to_string());
    params.arguments = arguments.cloned();
    call_tracked(peer, params, |id, token| {
        if let Some(entered) = entered {
            entered.sent_as(id.clone(), token.clone());
        }
    })
    .await
    .map_err(Failure::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(code: i32, data: Option<serde_json::Value>) -> ClientInitializeError {
        ClientInitializeError::JsonRpcError(ErrorData::new(
            rmcp::model::ErrorCode(code),
            "unsupported protocol version",
            data,
        ))
    }

    #[test]
    fn only_a_refusal_naming_sessionless_versions_turns_to_discover() {
        let modern = Some(vec![ProtocolVersion::V_2026_07_28]);
        let named = serde_json::json!({"supported": ["2026-07-28"], "requested": "2025-11-25"});
        assert_eq!(sessionless_only(&refused(-32022, Some(named))), modern);
        // No list: every sessionless version npc knows.
        assert_eq!(sessionless_only(&refused(-32022, None)), modern);
        // Only versions with a handshake, or none npc knows: no retry.
        for data in [
            serde_json::json!({"supported": ["2025-06-18"]}),
            serde_json::json!({"supported": ["2099-01-01"]}),
        ] {
            assert_eq!(sessionless_only(&refused(-32022, Some(data))), None);
        }
        // Any other failure is the server's own.
        assert_eq!(sessionless_only(&refused(-32601, None)), None);
        assert_eq!(
            sessionless_only(&ClientInitializeError::ConnectionClosed("gone".into())),
            None
        );
    }
}
