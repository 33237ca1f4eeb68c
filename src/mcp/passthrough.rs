//! What crosses the gateway besides calls, both ways and per client
//! session. Each client session of the gateway is a [`Client`] (its peer,
//! its declared capabilities, its logging level and resource
//! subscriptions, and a bounded queue of notifications to it) in the
//! pool's [`Clients`]. A `tools/call` runs as a [`Caller`] (the session,
//! the id of its request and its progress token, in a task-local set
//! around the call, see [`as_caller`]); the upstream the call reaches
//! keeps it in its [`InFlight`] for as long as the call runs, under the
//! progress token and request id the upstream knows it by. So what the
//! upstream sends back finds its way:
//!
//! - `notifications/progress` go to the caller under the caller's own
//!   token; a token no call holds is dropped;
//! - the upstream's requests (`sampling/createMessage`, `elicitation/create`,
//!   `roots/list`) go to the session whose call caused them: the one whose
//!   call's response stream they arrived on (HTTP upstreams), else the one
//!   session with calls in flight there. A `roots/list` no call caused (a
//!   server's follow-up of a client's `notifications/roots/list_changed`)
//!   is answered with the union of the roots of every session that declared
//!   `roots`. With no such session, or one that
//!   did not declare the capability, the upstream gets `-32601` at once
//!   (what a client without the capability answers), never a hang; an
//!   elicitation whose schema is over [`MAX_ELICITATION_SCHEMA_BYTES`], or
//!   one of a mode the client did not declare, `-32602`;
//! - `notifications/message` go to the sessions that set a level it meets
//!   (else to the one calling), with the server's name as logger;
//! - `notifications/resources/updated` go to the sessions subscribed to the
//!   resource, under its gateway URI.
//!
//! A session's notifications wait in a queue of at most
//! [`MAX_QUEUED_NOTIFICATIONS`]; past it they are dropped and counted, and
//! once the queue drains, one `mcp.dropped` event says how many. At most
//! [`MAX_FORWARDED_REQUESTS`] upstream requests wait on one session at once.
//! Sampling and elicitation requests are recorded (`mcp.request`) with
//! what was asked, never what was answered.

// Sampling, roots and logging are deprecated (SEP-2577), but servers and
// clients still use them, and a gateway passes them on.
#![allow(deprecated)]

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use rmcp::model::GetExtensions as _;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, CancelledNotificationParam,
    ClientCapabilities, ClientRequest, ClientResult, ElicitRequestParams, ListRootsRequest,
    ListRootsResult, LoggingLevel, LoggingMessageNotification, LoggingMessageNotificationParam,
    NumberOrString, ProgressNotification, ProgressNotificationParam, ProgressToken, RequestId,
    ResourceUpdatedNotification, ResourceUpdatedNotificationParam, ServerJsonRpcMessage,
    ServerNotification, ServerRequest, ServerResult,
};
use rmcp::service::{
    InboundStreamOrigin, OriginatingRequestId, PeerRequestOptions, RequestContext,
};
use rmcp::{ErrorData, Peer, RoleClient, RoleServer};
use serde_json::{Value, json};
use tokio::io::{AsyncWrite, AsyncWriteExt as _};
use tokio::sync::{Semaphore, mpsc, oneshot};

use super::lock;
use super::resource_uri;
use crate::bus::EventBus;
use crate::event::{Event, McpDropped, McpRequest};
use crate::stdx::lines::encode;
use crate::store::NewEvent;

/// Why a call whose tool asked for more input (`resultType:
/// "input_required"`, protocol 2026-07-28's multi-round-trip requests) fails.
pub const INPUT_REQUIRED: &str = "the tool asked for more input (a multi-round-trip request of protocol 2026-07-28), which the gateway does not pass on yet; call the server directly for this tool";

/// Notifications waiting for one client session; past this they are dropped
/// (and counted), so a flooding upstream costs bounded memory per session.
pub const MAX_QUEUED_NOTIFICATIONS: usize = 1024;
/// Upstream requests waiting on one client session at once; more are
/// answered with an error.
pub const MAX_FORWARDED_REQUESTS: usize = 16;
/// Largest `requestedSchema` of an elicitation passed to a client, as JSON.
pub const MAX_ELICITATION_SCHEMA_BYTES: usize = 64 * 1024;
/// How long a `list_changed` waits before its list is fetched again, so a
/// server announcing changes every millisecond costs one fetch per window.
pub const LIST_CHANGED_DEBOUNCE: Duration = Duration::from_millis(50);
/// Most field names of an elicitation's schema recorded in its event.
pub const MAX_RECORDED_FIELDS: usize = 64;
/// How long a session has to answer a `roots/list` asked of every session.
pub const ROOTS_ANSWER_LIMIT: Duration = Duration::from_secs(10);
/// Most roots in the union answered to a `roots/list` no call caused.
pub const MAX_UNION_ROOTS: usize = 1024;
/// Prefix of the progress tokens npc gives upstreams.
const TOKEN_PREFIX: &str = "npc-progress-";

/// Where a session's frames to its client are written, whole, by the
/// session loop and the notification queue alike (so an answer written
/// after [`Client::flush`] follows every notification queued before it).
pub type FrameWriter = Arc<tokio::sync::Mutex<Box<dyn AsyncWrite + Send + Unpin>>>;

/// How a session's notifications reach its client.
pub enum Sink {
    /// Through rmcp's server (an HTTP session).
    Peer,
    /// Straight onto the session's own stream (the session loop's).
    Frames(FrameWriter),
}

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Peer => "Peer",
            Self::Frames(_) => "Frames",
        })
    }
}

/// What waits in a session's notification queue.
enum Outgoing {
    Notification(ServerNotification),
    /// Answered once everything queued before it was sent.
    Flush(oneshot::Sender<()>),
}

/// One client session of the gateway, as the upstreams reach it.
pub struct Client {
    id: u64,
    peer: Peer<RoleServer>,
    outbox: mpsc::Sender<Outgoing>,
    /// Notifications queued and not yet sent.
    pending: AtomicUsize,
    dropped: AtomicU64,
    requests: Semaphore,
    level: Mutex<Option<LoggingLevel>>,
    subscriptions: Mutex<HashSet<String>>,
    bus: Option<EventBus>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// What the client declared it can do.
    pub fn capabilities(&self) -> ClientCapabilities {
        self.peer
            .peer_info()
            .map(|info| info.capabilities.clone())
            .unwrap_or_default()
    }

    /// Whether the client declared anything an upstream may ask it for:
    /// sampling, elicitation or roots.
    pub fn takes_requests(&self) -> bool {
        self.peer.peer_info().is_some_and(|info| {
            let capabilities = &info.capabilities;
            capabilities.sampling.is_some()
                || capabilities.elicitation.is_some()
                || capabilities.roots.is_some()
        })
    }

    /// Queue `notification` for the client; dropped (and counted) when the
    /// queue is full.
    pub fn notify(&self, notification: ServerNotification) {
        self.pending.fetch_add(1, Ordering::SeqCst);
        if let Err(e) = self.outbox.try_send(Outgoing::Notification(notification)) {
            self.pending.fetch_sub(1, Ordering::SeqCst);
            if let mpsc::error::TrySendError::Full(_) = e {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Wait until every notification queued so far was sent (at once when
    /// none waits), so an answer written next comes after them.
    pub async fn flush(&self) {
        if self.pending.load(Ordering::SeqCst) == 0 {
            return;
        }
        let (done, sent) = oneshot::channel();
        if self.outbox.send(Outgoing::Flush(done)).await.is_ok() {
            let _ = sent.await;
        }
    }

    /// Notifications dropped for this session and not yet reported.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Record the drops since the last report as one `mcp.dropped` event.
    async fn report_drops(&self) {
        let count = self.dropped.swap(0, Ordering::Relaxed);
        if count == 0 {
            return;
        }
        tracing::warn!(
            count,
            "mcp: a client read notifications slower than its upstreams sent them; some were dropped"
        );
        if let Some(bus) = &self.bus {
            let payload = McpDropped {
                server: None,
                what: "notifications".to_string(),
                count,
                bytes: None,
                reason: format!("more than {MAX_QUEUED_NOTIFICATIONS} waited for the client"),
            };
            let _ = bus
                .publish_detached(NewEvent::from(Event::McpDropped(payload)))
                .await;
        }
    }

    /// The logging level the client set, if it set one.
    pub fn set_level(&self, level: LoggingLevel) {
        *lock(&self.level) = Some(level);
    }

    /// Subscribe to (or, `false`, unsubscribe from) the gateway URI `uri`.
    /// Returns whether that changed anything.
    pub fn subscribe(&self, uri: &str, on: bool) -> bool {
        let mut subscriptions = lock(&self.subscriptions);
        if on {
            subscriptions.insert(uri.to_string())
        } else {
            subscriptions.remove(uri)
        }
    }

    /// Whether the session is subscribed to the gateway URI `uri`.
    pub fn is_subscribed(&self, uri: &str) -> bool {
        lock(&self.subscriptions).contains(uri)
    }

    /// Pass `request` to the client, on the response stream of `origin`
    /// (its request the upstream's request belongs to) when known.
    async fn request(
        &self,
        mut request: ServerRequest,
        origin: Option<RequestId>,
    ) -> Result<ClientResult, ErrorData> {
        let Ok(_waiting) = self.requests.try_acquire() else {
            return Err(ErrorData::internal_error(
                format!(
                    "the client already has {MAX_FORWARDED_REQUESTS} requests of the gateway's servers to answer; retry later"
                ),
                None,
            ));
        };
        if let Some(id) = origin {
            request.extensions_mut().insert(OriginatingRequestId(id));
        }
        self.peer.send_request(request).await.map_err(|e| match e {
            rmcp::ServiceError::McpError(e) => e,
            other => ErrorData::internal_error(
                format!("the gateway's client did not answer: {other}"),
                None,
            ),
        })
    }
}

/// Every client session in front of one pool.
#[derive(Debug, Default)]
pub struct Clients {
    next: AtomicU64,
    all: Mutex<Vec<Weak<Client>>>,
}

impl Clients {
    /// A new client session on `peer` (after its handshake), its
    /// notifications sent to `sink`, recording on `bus`. Its notification
    /// queue drains in a task that ends with it.
    pub fn join(&self, peer: Peer<RoleServer>, sink: Sink, bus: Option<EventBus>) -> Arc<Client> {
        let (outbox, mut queued) = mpsc::channel(MAX_QUEUED_NOTIFICATIONS);
        let client = Arc::new(Client {
            id: self.next.fetch_add(1, Ordering::Relaxed),
            peer: peer.clone(),
            outbox,
            pending: AtomicUsize::new(0),
            dropped: AtomicU64::new(0),
            requests: Semaphore::new(MAX_FORWARDED_REQUESTS),
            level: Mutex::new(None),
            subscriptions: Mutex::default(),
            bus,
        });
        let weak = Arc::downgrade(&client);
        tokio::spawn(async move {
            while let Some(outgoing) = queued.recv().await {
                let Some(client) = weak.upgrade() else { break };
                match outgoing {
                    Outgoing::Notification(notification) => {
                        let sent = send(&peer, &sink, notification).await;
                        client.pending.fetch_sub(1, Ordering::SeqCst);
                        if sent.is_err() {
                            break;
                        }
                    }
                    Outgoing::Flush(done) => {
                        let _ = done.send(());
                    }
                }
                if queued.is_empty() {
                    client.report_drops().await;
                }
            }
        });
        let mut all = lock(&self.all);
        all.retain(|c| c.strong_count() > 0);
        all.push(Arc::downgrade(&client));
        client
    }

    /// The sessions still there.
    pub fn each(&self) -> Vec<Arc<Client>> {
        lock(&self.all).iter().filter_map(Weak::upgrade).collect()
    }

    /// The most verbose level any session set, for the upstreams.
    pub fn level(&self) -> Option<LoggingLevel> {
        self.each()
            .iter()
            .filter_map(|c| *lock(&c.level))
            .min_by_key(|l| severity(*l))
    }
}

/// Send one notification to the client through `sink`.
async fn send(
    peer: &Peer<RoleServer>,
    sink: &Sink,
    notification: ServerNotification,
) -> Result<(), ()> {
    match sink {
        Sink::Peer => peer.send_notification(notification).await.map_err(drop),
        Sink::Frames(writer) => {
            let message = ServerJsonRpcMessage::notification(notification);
            let Ok(frame) = encode(&message) else {
                return Ok(());
            };
            let mut w = writer.lock().await;
            w.write_all(&frame).await.map_err(drop)?;
            w.flush().await.map_err(drop)
        }
    }
}

/// The response stream of a call's own request, where what the call
/// causes goes (an HTTP front's shortcut, see [`crate::mcp::server::shortcut`]).
pub type CallStream = mpsc::Sender<ServerNotification>;

/// Who makes a call: the session, its request's id and its progress token,
/// and the call's own stream when it has one.
#[derive(Debug, Clone)]
pub struct Caller {
    pub client: Arc<Client>,
    pub request: Option<RequestId>,
    pub progress: Option<ProgressToken>,
    pub stream: Option<CallStream>,
}

impl Caller {
    /// Tell the caller `notification`: on its call's stream when it has
    /// one (dropped and counted when [`MAX_QUEUED_NOTIFICATIONS`] wait
    /// there), else through its session's queue.
    fn notify(&self, notification: ServerNotification) {
        match &self.stream {
            Some(stream) => {
                if let Err(mpsc::error::TrySendError::Full(_)) = stream.try_send(notification) {
                    self.client.dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
            None => self.client.notify(notification),
        }
    }
}

tokio::task_local! {
    static CALLER: Caller;
}

/// Run `work` (one `tools/call`) as `caller`'s.
pub async fn as_caller<F: std::future::Future>(caller: Option<Caller>, work: F) -> F::Output {
    match caller {
        Some(caller) => CALLER.scope(caller, work).await,
        None => work.await,
    }
}

/// The caller of the call running in this task, if one was set.
pub fn caller() -> Option<Caller> {
    CALLER.try_with(Clone::clone).ok()
}

struct Entry {
    caller: Caller,
    /// The token the upstream reports progress under.
    token: Option<ProgressToken>,
    /// The id the upstream knows the call by, where npc learns it.
    request: Option<RequestId>,
}

/// One upstream's calls in flight, by the tokens and ids it knows them by.
#[derive(Default)]
pub struct InFlight {
    next: AtomicU64,
    calls: Mutex<HashMap<u64, Entry>>,
}

impl std::fmt::Debug for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlight")
            .field("calls", &lock(&self.calls).len())
            .finish()
    }
}

/// A call in an [`InFlight`]; it leaves when dropped.
#[derive(Debug)]
pub struct Entered<'a> {
    in_flight: &'a InFlight,
    n: u64,
}

impl Entered<'_> {
    /// The progress token the upstream gets for the call (when its caller
    /// asked for progress).
    pub fn token(&self) -> Option<ProgressToken> {
        lock(&self.in_flight.calls)
            .get(&self.n)
            .and_then(|e| e.token.clone())
    }

    /// The call went out as request `id` with progress token `token` (an
    /// HTTP upstream's session numbers both itself).
    pub fn sent_as(&self, id: RequestId, token: ProgressToken) {
        if let Some(entry) = lock(&self.in_flight.calls).get_mut(&self.n) {
            entry.request = Some(id);
            if entry.token.is_some() {
                entry.token = Some(token);
            }
        }
    }
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        lock(&self.in_flight.calls).remove(&self.n);
    }
}

impl InFlight {
    /// Enter the current task's call (if it has a caller).
    pub fn enter(&self) -> Option<Entered<'_>> {
        let caller = caller()?;
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let token = caller
            .progress
            .as_ref()
            .map(|_| ProgressToken(NumberOrString::String(format!("{TOKEN_PREFIX}{n}").into())));
        let entry = Entry {
            caller,
            token,
            request: None,
        };
        lock(&self.calls).insert(n, entry);
        Some(Entered { in_flight: self, n })
    }

    fn by_token(&self, token: &ProgressToken) -> Option<Caller> {
        lock(&self.calls)
            .values()
            .find(|e| e.token.as_ref() == Some(token))
            .map(|e| e.caller.clone())
    }

    /// The caller of a request of the upstream: the call whose response
    /// stream it came on, else the one session calling.
    fn route(&self, context: &RequestContext<RoleClient>) -> Option<Caller> {
        if let Some(InboundStreamOrigin::OutboundRequest(id)) = context.extensions.get() {
            let calls = lock(&self.calls);
            if let Some(e) = calls.values().find(|e| e.request.as_ref() == Some(id)) {
                return Some(e.caller.clone());
            }
        }
        self.sole_caller()
    }

    /// The latest caller, when exactly one session has calls in flight.
    fn sole_caller(&self) -> Option<Caller> {
        let calls = lock(&self.calls);
        let latest = calls.iter().max_by_key(|(n, _)| **n).map(|(_, e)| e)?;
        calls
            .values()
            .all(|e| e.caller.client.id == latest.caller.client.id)
            .then(|| latest.caller.clone())
    }
}

/// What an upstream's session needs to pass its messages to the clients.
#[derive(Debug, Clone)]
pub struct Passthrough {
    pub server: String,
    pub in_flight: Arc<InFlight>,
    pub clients: Arc<Clients>,
    pub bus: Option<EventBus>,
}

/// The method of `request`.
fn method_of(request: &ServerRequest) -> &str {
    match request {
        ServerRequest::PingRequest(_) => "ping",
        ServerRequest::CreateMessageRequest(_) => "sampling/createMessage",
        ServerRequest::ListRootsRequest(_) => "roots/list",
        ServerRequest::ElicitRequest(_) => "elicitation/create",
        ServerRequest::CustomRequest(r) => &r.method,
        _ => "an unknown method",
    }
}

/// How severe `level` is: the higher, the fewer sessions filter it out.
pub fn severity(level: LoggingLevel) -> u8 {
    match level {
        LoggingLevel::Debug => 0,
        LoggingLevel::Info => 1,
        LoggingLevel::Notice => 2,
        LoggingLevel::Warning => 3,
        LoggingLevel::Error => 4,
        LoggingLevel::Critical => 5,
        LoggingLevel::Alert => 6,
        LoggingLevel::Emergency => 7,
    }
}

/// `-32601`: what a client without the capability answers.
fn not_supported(method: &str, reason: &str) -> ErrorData {
    ErrorData::new(
        rmcp::model::ErrorCode::METHOD_NOT_FOUND,
        format!("`{method}` cannot be answered: {reason}"),
        None,
    )
}

/// Why `client` cannot take `request`, if it cannot.
#[allow(deprecated)]
fn refused(request: &ServerRequest, capabilities: &ClientCapabilities) -> Option<ErrorData> {
    let method = method_of(request);
    match request {
        ServerRequest::CreateMessageRequest(_) if capabilities.sampling.is_none() => Some(
            not_supported(method, "the gateway's client did not declare `sampling`"),
        ),
        ServerRequest::ListRootsRequest(_) if capabilities.roots.is_none() => Some(not_supported(
            method,
            "the gateway's client did not declare `roots`",
        )),
        ServerRequest::ElicitRequest(r) => {
            let Some(elicitation) = &capabilities.elicitation else {
                return Some(not_supported(
                    method,
                    "the gateway's client did not declare `elicitation`",
                ));
            };
            // `elicitation: {}` is form mode (2025-06-18).
            let (form, url) = (
                elicitation.form.is_some() || elicitation.url.is_none(),
                elicitation.url.is_some(),
            );
            let (mode, supported) = match &r.params {
                ElicitRequestParams::FormElicitationParams { .. } => ("form", form),
                ElicitRequestParams::UrlElicitationParams { .. } => ("url", url),
                #[allow(unreachable_patterns)]
                _ => ("unknown", false),
            };
            (!supported).then(|| {
                ErrorData::invalid_params(
                    format!(
                        "the gateway's client does not support elicitation mode `{mode}`; ask in a mode it declared"
                    ),
                    None,
                )
            })
        }
        _ => None,
    }
}

/// What is recorded of a request: what was asked, never what was answered.
#[allow(deprecated)]
fn asked(request: &ServerRequest) -> Option<Value> {
    match request {
        ServerRequest::CreateMessageRequest(r) => Some(json!({
            "messages": r.params.messages.len(),
            "max_tokens": r.params.max_tokens,
        })),
        ServerRequest::ElicitRequest(r) => Some(match &r.params {
            ElicitRequestParams::FormElicitationParams {
                message,
                requested_schema,
                ..
            } => json!({
                "mode": "form",
                "message": message,
                "fields": requested_schema
                    .properties
                    .keys()
                    .take(MAX_RECORDED_FIELDS)
                    .collect::<Vec<_>>(),
            }),
            ElicitRequestParams::UrlElicitationParams { message, url, .. } => json!({
                "mode": "url",
                "message": message,
                "url": url,
            }),
            #[allow(unreachable_patterns)]
            _ => json!({}),
        }),
        _ => None,
    }
}

/// An elicitation's schema over the bound, if it is.
fn oversized(request: &ServerRequest) -> Option<usize> {
    let ServerRequest::ElicitRequest(r) = request else {
        return None;
    };
    let ElicitRequestParams::FormElicitationParams {
        requested_schema, ..
    } = &r.params
    else {
        return None;
    };
    let bytes = serde_json::to_vec(requested_schema).map_or(usize::MAX, |v| v.len());
    (bytes > MAX_ELICITATION_SCHEMA_BYTES).then_some(bytes)
}

impl Passthrough {
    /// Pass the upstream's `request` to the session whose call caused it
    /// and hand back the answer (or the error the upstream gets).
    pub async fn request(
        &self,
        request: ServerRequest,
        context: &RequestContext<RoleClient>,
    ) -> Result<ClientResult, ErrorData> {
        let started = Instant::now();
        let asked = asked(&request);
        let method = method_of(&request).to_string();
        let answer = self.route_request(request, context).await;
        if let (Some(asked), Some(bus)) = (asked, &self.bus) {
            let payload = McpRequest {
                server: self.server.to_string(),
                method,
                request: asked,
                outcome: if answer.is_ok() { "ok" } else { "error" }.to_string(),
                error: answer.as_ref().err().map(|e| e.message.to_string()),
                duration_ms: started.elapsed().as_secs_f64() * 1000.0,
            };
            let _ = bus
                .publish_detached(NewEvent::from(Event::McpRequest(payload)))
                .await;
        }
        answer
    }

    async fn route_request(
        &self,
        request: ServerRequest,
        context: &RequestContext<RoleClient>,
    ) -> Result<ClientResult, ErrorData> {
        let method = method_of(&request).to_string();
        if let Some(bytes) = oversized(&request) {
            self.dropped("elicitation_schema", bytes).await;
            return Err(ErrorData::invalid_params(
                format!(
                    "the elicitation's `requestedSchema` is {bytes} bytes, over the gateway's bound of {MAX_ELICITATION_SCHEMA_BYTES}; ask for fewer or smaller fields"
                ),
                None,
            ));
        }
        let caller = self.in_flight.route(context);
        if caller.is_none() && matches!(request, ServerRequest::ListRootsRequest(_)) {
            // The follow-up of a client's `notifications/roots/list_changed`.
            return self.union_of_roots().await;
        }
        let Some(caller) = caller else {
            return Err(not_supported(
                &method,
                "no client session of the gateway has a call in flight to this server that it could belong to",
            ));
        };
        if let Some(e) = refused(&request, &caller.client.capabilities()) {
            return Err(e);
        }
        caller.client.request(request, caller.request.clone()).await
    }

    /// A `roots/list` no call caused: the union of the roots of every
    /// session that declared `roots` (each asked at once, within
    /// [`ROOTS_ANSWER_LIMIT`]; one that fails or is late adds none), in
    /// session order, each URI once, at most [`MAX_UNION_ROOTS`].
    async fn union_of_roots(&self) -> Result<ClientResult, ErrorData> {
        let sessions: Vec<Arc<Client>> = self
            .clients
            .each()
            .into_iter()
            .filter(|c| c.capabilities().roots.is_some())
            .collect();
        if sessions.is_empty() {
            return Err(not_supported(
                "roots/list",
                "no client session of the gateway declared `roots`",
            ));
        }
        let answers = futures_util::future::join_all(sessions.iter().map(|client| async move {
            let ask = ServerRequest::ListRootsRequest(ListRootsRequest::default());
            tokio::time::timeout(ROOTS_ANSWER_LIMIT, client.request(ask, None)).await
        }))
        .await;
        let mut seen = HashSet::new();
        let mut roots = Vec::new();
        let mut answered = false;
        for answer in answers {
            let Ok(Ok(ClientResult::ListRootsResult(listed))) = answer else {
                continue;
            };
            answered = true;
            for root in listed.roots {
                if roots.len() < MAX_UNION_ROOTS && seen.insert(root.uri.clone()) {
                    roots.push(root);
                }
            }
        }
        if !answered {
            return Err(ErrorData::internal_error(
                "no client session of the gateway answered `roots/list`; retry later",
                None,
            ));
        }
        Ok(ClientResult::ListRootsResult(ListRootsResult::new(roots)))
    }

    /// An upstream message that was dropped, as an `mcp.dropped` event.
    async fn dropped(&self, what: &str, bytes: usize) {
        tracing::warn!(server = %self.server, what, bytes, "mcp: dropped an oversized upstream request");
        if let Some(bus) = &self.bus {
            let payload = McpDropped {
                server: Some(self.server.to_string()),
                what: what.to_string(),
                count: 1,
                bytes: Some(bytes),
                reason: format!("over {MAX_ELICITATION_SCHEMA_BYTES} bytes"),
            };
            let _ = bus
                .publish_detached(NewEvent::from(Event::McpDropped(payload)))
                .await;
        }
    }

    /// Whether `token` is one npc gave an upstream's call.
    pub fn is_own_token(token: &ProgressToken) -> bool {
        matches!(&token.0, NumberOrString::String(s) if s.starts_with(TOKEN_PREFIX))
    }

    /// Progress of a call: to its caller, under the caller's token.
    pub fn progress(&self, mut params: ProgressNotificationParam) {
        let Some(caller) = self.in_flight.by_token(&params.progress_token) else {
            return;
        };
        let Some(token) = caller.progress.clone() else {
            return;
        };
        params.progress_token = token;
        caller.notify(ProgressNotification::new(params).into());
    }

    /// A log message: to the sessions whose level it meets, or to the one
    /// calling when none set a level; the server's name is its logger.
    pub fn log(&self, mut params: LoggingMessageNotificationParam) {
        params.logger = Some(match params.logger.take() {
            Some(logger) => format!("{}/{logger}", self.server),
            None => self.server.clone(),
        });
        let mut sent = false;
        for client in self.clients.each() {
            let level = *lock(&client.level);
            if let Some(level) = level {
                sent = true;
                if severity(params.level) >= severity(level) {
                    client.notify(LoggingMessageNotification::new(params.clone()).into());
                }
            }
        }
        if !sent && let Some(caller) = self.in_flight.sole_caller() {
            caller.notify(LoggingMessageNotification::new(params).into());
        }
    }

    /// A resource changed: to the sessions subscribed to it, under the name
    /// each subscribed with (`npc://SERVER/URI`, or the server's own URI).
    pub fn resource_updated(&self, params: ResourceUpdatedNotificationParam) {
        let gateway_uri = resource_uri(&self.server, &params.uri);
        for client in self.clients.each() {
            let uri = if client.is_subscribed(&gateway_uri) {
                &gateway_uri
            } else if client.is_subscribed(&params.uri) {
                &params.uri
            } else {
                continue;
            };
            let mut params = params.clone();
            params.uri = uri.clone();
            client.notify(ResourceUpdatedNotification::new(params).into());
        }
    }
}

/// Call a tool through rmcp's session `peer`, telling `sent` the request id
/// and progress token rmcp gave it once it is sent; a call dropped before
/// its answer tells the server (`notifications/cancelled`).
pub async fn call_tracked(
    peer: &Peer<RoleClient>,
    params: CallToolRequestParams,
    sent: impl FnOnce(&RequestId, &ProgressToken),
) -> Result<CallToolResult, rmcp::ServiceError> {
    let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
    let handle = peer
        .send_request_with_option(request, PeerRequestOptions::no_options())
        .await?;
    sent(&handle.id, &handle.progress_token);
    /// Tells the server when dropped before its answer.
    struct Unanswered {
        peer: Peer<RoleClient>,
        id: Option<RequestId>,
    }
    impl Drop for Unanswered {
        fn drop(&mut self) {
            if let (Some(id), Ok(runtime)) = (self.id.take(), tokio::runtime::Handle::try_current())
            {
                let peer = self.peer.clone();
                runtime.spawn(async move {
                    let cancelled = CancelledNotificationParam::new(
                        Some(id),
                        Some("the gateway's caller stopped waiting".into()),
                    );
                    let _ = peer.notify_cancelled(cancelled).await;
                });
            }
        }
    }
    let mut unanswered = Unanswered {
        peer: peer.clone(),
        id: Some(handle.id.clone()),
    };
    let answer = handle.await_response().await;
    unanswered.id = None;
    match answer? {
        ServerResult::CallToolResult(result) => Ok(result),
        ServerResult::InputRequiredResult(_) => Err(rmcp::ServiceError::McpError(
            ErrorData::internal_error(INPUT_REQUIRED, None),
        )),
        _ => Err(rmcp::ServiceError::McpError(ErrorData::internal_error(
            "the server answered `tools/call` with another kind of result",
            None,
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::{
        ElicitationCapability, FormElicitationCapability, ListRootsRequest, RootsCapabilities,
        SamplingCapability, UrlElicitationCapability,
    };

    fn request(value: Value) -> ServerRequest {
        serde_json::from_value(value).unwrap()
    }

    fn sampling() -> ServerRequest {
        request(json!({"method": "sampling/createMessage", "params": {
            "messages": [{"role": "user", "content": {"type": "text", "text": "secret words"}}],
            "maxTokens": 5}}))
    }

    fn form(properties: Value) -> ServerRequest {
        request(json!({"method": "elicitation/create", "params": {
            "mode": "form", "message": "who?",
            "requestedSchema": {"type": "object", "properties": properties}}}))
    }

    fn url() -> ServerRequest {
        request(json!({"method": "elicitation/create", "params": {
            "mode": "url", "message": "consent", "url": "https://example.com/c", "elicitationId": "e"}}))
    }

    fn code(e: Option<ErrorData>) -> Option<i32> {
        e.map(|e| e.code.0)
    }

    #[test]
    fn a_request_goes_only_to_a_client_that_declared_it() {
        let none = ClientCapabilities::default();
        let roots = ServerRequest::ListRootsRequest(ListRootsRequest::default());
        let name = form(json!({"name": {"type": "string"}}));
        for r in [&sampling(), &roots, &name, &url()] {
            assert_eq!(code(refused(r, &none)), Some(-32601), "{}", method_of(r));
        }
        let mut all = ClientCapabilities::default();
        all.sampling = Some(SamplingCapability::default());
        all.roots = Some(RootsCapabilities::default());
        all.elicitation = Some(
            ElicitationCapability::new()
                .with_form(FormElicitationCapability::new())
                .with_url(UrlElicitationCapability::new()),
        );
        for r in [&sampling(), &roots, &name, &url()] {
            assert_eq!(code(refused(r, &all)), None, "{}", method_of(r));
        }
        // `elicitation: {}` is form mode only; a mode not declared is -32602.
        let mut form_only = ClientCapabilities::default();
        form_only.elicitation = Some(ElicitationCapability::new());
        assert_eq!(code(refused(&name, &form_only)), None);
        assert_eq!(code(refused(&url(), &form_only)), Some(-32602));
        let mut url_only = ClientCapabilities::default();
        url_only.elicitation =
            Some(ElicitationCapability::new().with_url(UrlElicitationCapability::new()));
        assert_eq!(code(refused(&name, &url_only)), Some(-32602));
        // Ping is the gateway's to answer.
        let ping = request(json!({"method": "ping"}));
        assert_eq!(code(refused(&ping, &none)), None);
    }

    #[test]
    fn an_elicitation_schema_over_the_bound_is_refused_and_what_is_recorded_holds_no_answer() {
        assert_eq!(oversized(&form(json!({"a": {"type": "string"}}))), None);
        let many: serde_json::Map<String, Value> = (0..MAX_ELICITATION_SCHEMA_BYTES / 50)
            .map(|i| {
                (
                    format!("field{i}"),
                    json!({"type": "string", "description": "x".repeat(40)}),
                )
            })
            .collect();
        let big = form(Value::Object(many));
        assert!(oversized(&big).is_some_and(|b| b > MAX_ELICITATION_SCHEMA_BYTES));
        // Recorded: counts and names, bounded, never the message content.
        let recorded = asked(&big).unwrap();
        assert_eq!(
            recorded["fields"].as_array().unwrap().len(),
            MAX_RECORDED_FIELDS
        );
        let recorded = asked(&sampling()).unwrap();
        assert_eq!(recorded, json!({"messages": 1, "max_tokens": 5}));
        assert!(asked(&request(json!({"method": "ping"}))).is_none());
    }

    #[test]
    fn own_progress_tokens_and_levels() {
        let own = ProgressToken(NumberOrString::String(format!("{TOKEN_PREFIX}3").into()));
        assert!(Passthrough::is_own_token(&own));
        for other in [
            ProgressToken(NumberOrString::Number(3)),
            ProgressToken(NumberOrString::String("client-3".into())),
        ] {
            assert!(!Passthrough::is_own_token(&other));
        }
        let levels = [
            LoggingLevel::Debug,
            LoggingLevel::Info,
            LoggingLevel::Notice,
            LoggingLevel::Warning,
            LoggingLevel::Error,
            LoggingLevel::Critical,
            LoggingLevel::Alert,
            LoggingLevel::Emergency,
        ];
        assert!(levels.windows(2).all(|w| severity(w[0]) < severity(w[1])));
    }
}
