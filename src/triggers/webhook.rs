//! `webhook` triggers: one `POST /webhooks/{route}` per configured route on
//! the daemon's webhook listener (`daemon.webhook_listen`, default
//! `127.0.0.1:8765`). Routes change live on reload; the listener stays.
//!
//! Every request passes one ordered gauntlet; each step refuses with its
//! own status and event, and a refused request enqueues nothing:
//!
//! | step | status | event |
//! |---|---|---|
//! | method is `POST` | 405 | `webhook.method_not_allowed` |
//! | the route is configured | 404 | `webhook.unknown_route` |
//! | body within `max_body_bytes` (1 MiB) | 413 | `webhook.too_large` |
//! | body within the listener's budget of unverified bytes ([`MAX_UNVERIFIED_BODY_BYTES`]) | 503 | `webhook.busy` |
//! | body sent within `surfaces::http::BODY_READ_TIMEOUT` | 408 | `webhook.too_slow` |
//! | content type is JSON | 415 | `webhook.unsupported_media_type` |
//! | signature (when `secret_env` is set) | 401 | `webhook.bad_signature` |
//! | delivery (its signature, else its id) not accepted before | 409 | `webhook.replayed` |
//! | route under its rate limit | 429 | `webhook.rate_limited` |
//! | body parses as JSON | 400 | `webhook.bad_json` |
//! | the event is one the route takes | 200 | `webhook.ignored` |
//! | the trigger's `filter` is true of the request (`payload`, `event`) | 200 | `webhook.filtered` |
//! | the trigger's queue has room | 503 | `webhook.queue_full` |
//!
//! Then the run is enqueued, and `202 {"run_id": …}` is sent only after the
//! enqueue committed. Signatures are HMAC-SHA256 over the raw body, as
//! GitHub's `X-Hub-Signature-256: sha256=HEX`, or the generic
//! `X-Npc-Signature: t=UNIX,v1=HEX` over `UNIX.BODY` with a timestamp
//! tolerance of [`TIMESTAMP_TOLERANCE`]; compared in constant time. A
//! signed delivery is known by its signature (the id headers are not
//! signed: a captured delivery under a new `X-GitHub-Delivery` is the same
//! delivery), an unsigned one by `X-GitHub-Delivery` or `X-Npc-Delivery`.
//! That key is remembered in memory and, as the run's dedupe key, in the
//! store across restarts, for as long as the signature could verify: twice
//! the timestamp tolerance for `X-Npc-Signature`, [`GITHUB_REPLAY_WINDOW`]
//! for GitHub's, which signs no timestamp (past run pruning, in the replay
//! table, bounded per queue). Rejection events are capped at
//! [`MAX_REJECTION_EVENTS_PER_SECOND`]; the next one counts what was left out.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::{
    FIRING_QUEUE_DEPTH, Firing, Firings, Origin, Refused, TriggerContext, TriggerError, TriggerKind,
};
use crate::bus::EventBus;
use crate::event::{Event, WebhookListenFailed, WebhookListening, WebhookRefused};
use crate::model::TriggerSource;
use crate::store::NewEvent;
use crate::store::queue::Enqueued;
use crate::surfaces::tcp::constant_time_eq;
use crate::surfaces::webhook::WebhookSocket;

/// Path prefix of every webhook route.
pub const ROUTE_PREFIX: &str = "/webhooks/";
/// What a sender reads when the fleet's shared store cannot be reached.
pub const STORE_UNREACHABLE_ANSWER: &str = "the fleet's shared store is not reachable; retry later";
/// What a sender reads when the queue failed to record its delivery.
pub const QUEUE_FAILED_ANSWER: &str = "the run queue cannot record the delivery; retry later";
/// How long a delivery id is remembered in memory.
pub const REPLAY_WINDOW: Duration = Duration::from_secs(10 * 60);
/// Delivery ids remembered per route (the oldest are forgotten first).
pub const MAX_REMEMBERED_DELIVERIES: usize = 100_000;
/// A delivery id longer than this is remembered by its SHA-256.
pub const MAX_DELIVERY_ID_BYTES: usize = 128;
/// How far a generic signature's timestamp may be from now.
pub const TIMESTAMP_TOLERANCE: Duration = Duration::from_secs(5 * 60);
/// How long a GitHub signature is kept as a replay key. GitHub signs no
/// timestamp, so a captured delivery verifies forever; npc remembers its
/// signature this long (bounded by `store::queue::MAX_REPLAY_KEYS_PER_QUEUE`).
pub const GITHUB_REPLAY_WINDOW: Duration = Duration::from_secs(30 * 24 * 60 * 60);
/// Hex digits of a verified signature that name its delivery: its first
/// 128 bits (a truncated HMAC; another body with the same ones needs the
/// secret), half the index a whole signature would take.
pub const REPLAY_KEY_HEX_DIGITS: usize = 32;
/// Rejection events recorded per second over all routes.
pub const MAX_REJECTION_EVENTS_PER_SECOND: u32 = 50;
/// Bytes of request bodies the listener holds at once before their
/// signatures are checked, over every route; a body that would pass it is
/// refused (503) as it arrives, so a flood of unsigned bodies costs at most
/// this much memory.
pub const MAX_UNVERIFIED_BODY_BYTES: usize = 32 * 1024 * 1024;
/// GitHub's signature header.
pub const GITHUB_SIGNATURE: &str = "x-hub-signature-256";
/// The generic signature header (`t=UNIX,v1=HEX`).
pub const NPC_SIGNATURE: &str = "x-npc-signature";
/// Delivery id headers, in the order they are looked at.
pub const DELIVERY_HEADERS: [&str; 2] = ["x-github-delivery", "x-npc-delivery"];
/// Event name headers, in the order they are looked at.
pub const EVENT_HEADERS: [&str; 2] = ["x-github-event", "x-npc-event"];

/// HMAC-SHA256 (RFC 2104) of the concatenated `parts` under `key`.
pub fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut k = [0u8; BLOCK];
    if key.len() > BLOCK {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(k.map(|b| b ^ 0x36));
    for p in parts {
        inner.update(p);
    }
    let mut outer = Sha256::new();
    outer.update(k.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

/// Why a signature did not verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignatureProblem {
    Missing,
    Malformed,
    Mismatch,
    StaleTimestamp,
}

impl SignatureProblem {
    fn describe(self) -> &'static str {
        match self {
            Self::Missing => "no `X-Hub-Signature-256` or `X-Npc-Signature` header",
            Self::Malformed => "the signature header is not `sha256=HEX` or `t=UNIX,v1=HEX`",
            Self::Mismatch => "the signature does not match the body",
            Self::StaleTimestamp => "the signature's timestamp is outside the tolerance",
        }
    }
}

/// A signature that verified: its hex, and how long a replay of it could
/// still verify (its scheme's window).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signature {
    pub hex: String,
    pub window: Duration,
}

/// Check the request's signature over `body` with `secret`; on success,
/// the signature (a replay key whatever id header comes with it).
pub fn verify_signature(
    headers: &HeaderMap,
    body: &[u8],
    secret: &[u8],
    now: DateTime<Utc>,
) -> Result<Signature, SignatureProblem> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(sig) = text(GITHUB_SIGNATURE) {
        let hex_sig = sig
            .strip_prefix("sha256=")
            .ok_or(SignatureProblem::Malformed)?;
        let given = hex::decode(hex_sig).map_err(|_| SignatureProblem::Malformed)?;
        let expected = hmac_sha256(secret, &[body]);
        return if constant_time_eq(&given, &expected) {
            Ok(Signature {
                hex: hex_sig.to_ascii_lowercase(),
                window: GITHUB_REPLAY_WINDOW,
            })
        } else {
            Err(SignatureProblem::Mismatch)
        };
    }
    let Some(sig) = text(NPC_SIGNATURE) else {
        return Err(SignatureProblem::Missing);
    };
    let (mut t, mut v1) = (None, None);
    for part in sig.split(',') {
        match part.trim().split_once('=') {
            Some(("t", value)) => t = Some(value),
            Some(("v1", value)) => v1 = Some(value),
            _ => {}
        }
    }
    let (Some(t), Some(v1)) = (t, v1) else {
        return Err(SignatureProblem::Malformed);
    };
    let ts: i64 = t.parse().map_err(|_| SignatureProblem::Malformed)?;
    let given = hex::decode(v1).map_err(|_| SignatureProblem::Malformed)?;
    let expected = hmac_sha256(secret, &[t.as_bytes(), b".", body]);
    if !constant_time_eq(&given, &expected) {
        return Err(SignatureProblem::Mismatch);
    }
    let skew = (now.timestamp() - ts).unsigned_abs();
    if skew > TIMESTAMP_TOLERANCE.as_secs() {
        return Err(SignatureProblem::StaleTimestamp);
    }
    // Past the tolerance on either side the timestamp refuses a replay.
    Ok(Signature {
        hex: v1.to_ascii_lowercase(),
        window: TIMESTAMP_TOLERANCE * 2,
    })
}

/// A token bucket holding a minute's worth of requests.
#[derive(Debug)]
struct Bucket {
    per_minute: f64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn new(per_minute: u64) -> Self {
        Self {
            per_minute: per_minute as f64,
            tokens: per_minute as f64,
            at: Instant::now(),
        }
    }

    fn take(&mut self) -> bool {
        let now = Instant::now();
        let refill = now.duration_since(self.at).as_secs_f64() * self.per_minute / 60.0;
        self.tokens = (self.tokens + refill).min(self.per_minute);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Delivery ids seen within [`REPLAY_WINDOW`], bounded.
#[derive(Debug, Default)]
struct Seen {
    ids: HashMap<String, Instant>,
    order: VecDeque<(Instant, String)>,
}

impl Seen {
    fn expire(&mut self, now: Instant) {
        while let Some((at, id)) = self.order.front() {
            let old = now.duration_since(*at) > REPLAY_WINDOW;
            if !old && self.order.len() <= MAX_REMEMBERED_DELIVERIES {
                break;
            }
            if self.ids.get(id) == Some(at) {
                self.ids.remove(id);
            }
            self.order.pop_front();
        }
    }

    fn contains(&mut self, id: &str) -> bool {
        self.expire(Instant::now());
        self.ids.contains_key(id)
    }

    fn insert(&mut self, id: String) {
        let now = Instant::now();
        self.ids.insert(id.clone(), now);
        self.order.push_back((now, id));
        self.expire(now);
    }
}

/// One configured route.
#[derive(Debug)]
struct Route {
    trigger: String,
    secret: Option<Vec<u8>>,
    events: Vec<String>,
    /// The trigger's `filter`, compiled at load.
    filter: Option<crate::model::template::Filter>,
    max_body_bytes: u64,
    bucket: Mutex<Bucket>,
    seen: Mutex<Seen>,
    firings: mpsc::Sender<Firing>,
}

/// The running server.
#[derive(Debug)]
struct Server {
    wanted: SocketAddr,
    bound: SocketAddr,
    stop: CancellationToken,
}

/// Rejection events in the current second, and those left out.
#[derive(Debug, Default)]
struct RejectionBudget {
    second: u64,
    recorded: u32,
    suppressed: u64,
}

/// The daemon's webhook listener and its route table.
#[derive(Debug)]
pub struct Listener {
    bus: EventBus,
    routes: RwLock<HashMap<String, Arc<Route>>>,
    config: Mutex<(SocketAddr, bool)>,
    server: Mutex<Option<Server>>,
    budget: Mutex<RejectionBudget>,
    /// Bytes of bodies being read before their signature is checked, over
    /// every route ([`MAX_UNVERIFIED_BODY_BYTES`]).
    unverified: Arc<tokio::sync::Semaphore>,
    /// `now` for signature timestamps.
    clock: Arc<dyn super::clock::Clock>,
}

impl Listener {
    pub fn new(bus: EventBus, clock: Arc<dyn super::clock::Clock>) -> Arc<Self> {
        Arc::new(Self {
            bus,
            routes: RwLock::new(HashMap::new()),
            config: Mutex::new((
                crate::model::DEFAULT_WEBHOOK_LISTEN
                    .parse()
                    .expect("default address parses"),
                false,
            )),
            server: Mutex::new(None),
            budget: Mutex::new(RejectionBudget::default()),
            unverified: Arc::new(tokio::sync::Semaphore::new(MAX_UNVERIFIED_BODY_BYTES)),
            clock,
        })
    }

    /// Where to listen (from the manifest). A running listener on another
    /// address moves there.
    pub fn configure(self: &Arc<Self>, addr: SocketAddr, remote_allowed: bool) {
        *crate::stdx::lock(&self.config) = (addr, remote_allowed);
        let moved = crate::stdx::lock(&self.server)
            .as_ref()
            .is_some_and(|s| s.wanted != addr);
        if moved {
            if let Some(old) = crate::stdx::lock(&self.server).take() {
                old.stop.cancel();
            }
            if let Err(e) = self.ensure_serving() {
                tracing::error!("{e}");
                let bus = self.bus.clone();
                let error = e.to_string();
                tokio::spawn(async move {
                    let _ = bus
                        .publish(NewEvent::from(Event::WebhookListenFailed(
                            WebhookListenFailed { error },
                        )))
                        .await;
                });
            }
        }
    }

    /// The address the listener is bound to, when it runs.
    pub fn bound(&self) -> Option<SocketAddr> {
        crate::stdx::lock(&self.server).as_ref().map(|s| s.bound)
    }

    /// Bind and serve, unless already serving.
    fn ensure_serving(self: &Arc<Self>) -> Result<(), TriggerError> {
        let mut server = crate::stdx::lock(&self.server);
        if server.is_some() {
            return Ok(());
        }
        let (addr, remote) = *crate::stdx::lock(&self.config);
        let socket = WebhookSocket::bind(addr, remote)?;
        let bound = socket.local_addr().unwrap_or(addr);
        let stop = CancellationToken::new();
        let router = axum::Router::new()
            .fallback(handle)
            .with_state(self.clone());
        tokio::spawn(socket.serve(router, stop.clone()));
        *server = Some(Server {
            wanted: addr,
            bound,
            stop,
        });
        let bus = self.bus.clone();
        tokio::spawn(async move {
            let _ = bus
                .publish(NewEvent::from(Event::WebhookListening(WebhookListening {
                    addr: bound.to_string(),
                })))
                .await;
        });
        Ok(())
    }

    fn add(self: &Arc<Self>, route: &str, r: Arc<Route>) -> Result<(), TriggerError> {
        crate::stdx::write(&self.routes).insert(route.to_string(), r);
        self.ensure_serving()
    }

    fn remove(&self, route: &str, trigger: &str) {
        let mut routes = crate::stdx::write(&self.routes);
        if routes.get(route).is_some_and(|r| r.trigger == trigger) {
            routes.remove(route);
        }
    }

    /// Close the listener.
    pub fn shutdown(&self) {
        if let Some(s) = crate::stdx::lock(&self.server).take() {
            s.stop.cancel();
        }
    }

    fn now(&self) -> DateTime<Utc> {
        self.clock.now()
    }

    /// Record a refused request (within the per-second budget) and answer it.
    async fn refuse(
        &self,
        status: StatusCode,
        kind: fn(WebhookRefused) -> Event,
        route: Option<&str>,
        detail: &str,
    ) -> Response {
        let suppressed = {
            let mut b = crate::stdx::lock(&self.budget);
            let second = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            if b.second != second {
                b.second = second;
                b.recorded = 0;
            }
            if b.recorded >= MAX_REJECTION_EVENTS_PER_SECOND {
                b.suppressed += 1;
                None
            } else {
                b.recorded += 1;
                Some(std::mem::take(&mut b.suppressed))
            }
        };
        if let Some(suppressed) = suppressed {
            let payload = WebhookRefused {
                route: route.map(str::to_string),
                status: status.as_u16(),
                detail: detail.to_string(),
                suppressed_before: (suppressed > 0).then_some(suppressed),
            };
            let event = kind(payload);
            let name = event.kind();
            if let Err(e) = self.bus.publish(NewEvent::from(event)).await {
                tracing::warn!("cannot record `{name}`: {e}");
            }
        }
        let name = kind(WebhookRefused::default()).kind();
        (
            status,
            axum::Json(json!({ "error": detail, "event": name })),
        )
            .into_response()
    }
}

fn header_text<'a>(headers: &'a HeaderMap, names: &[&str]) -> Option<&'a str> {
    names
        .iter()
        .find_map(|n| headers.get(*n).and_then(|v| v.to_str().ok()))
}

fn is_json(headers: &HeaderMap) -> bool {
    let Some(ct) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let mime = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    mime == "application/json" || (mime.starts_with("application/") && mime.ends_with("+json"))
}

/// A delivery id as remembered: itself, or its SHA-256 when long.
fn delivery_key(id: &str) -> String {
    if id.len() <= MAX_DELIVERY_ID_BYTES {
        id.to_string()
    } else {
        hex::encode(Sha256::digest(id.as_bytes()))
    }
}

/// The gauntlet (see the module docs).
async fn handle(State(listener): State<Arc<Listener>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    if parts.method != Method::POST {
        return listener
            .refuse(
                StatusCode::METHOD_NOT_ALLOWED,
                Event::WebhookMethodNotAllowed,
                None,
                "webhooks take `POST` only",
            )
            .await;
    }
    let path = parts.uri.path();
    let name = path.strip_prefix(ROUTE_PREFIX).unwrap_or("");
    let route = crate::stdx::read(&listener.routes).get(name).cloned();
    let Some(route) = route.filter(|_| !name.is_empty()) else {
        let shown: String = path.chars().take(MAX_DELIVERY_ID_BYTES).collect();
        return listener
            .refuse(
                StatusCode::NOT_FOUND,
                Event::WebhookUnknownRoute,
                None,
                &format!("no webhook route at `{shown}`"),
            )
            .await;
    };
    let name = Some(name);
    let too_large = || format!("the body is larger than {} bytes", route.max_body_bytes);
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > route.max_body_bytes) {
        return listener
            .refuse(
                StatusCode::PAYLOAD_TOO_LARGE,
                Event::WebhookTooLarge,
                name,
                &too_large(),
            )
            .await;
    }
    let limit = usize::try_from(route.max_body_bytes).unwrap_or(usize::MAX);
    let read = crate::surfaces::http::read_body(Body::new(body), limit, Some(&listener.unverified));
    let body = match read.await {
        Ok(read) => read,
        Err(refusal) => {
            use crate::surfaces::http::BodyRefusal as R;
            let kind: fn(WebhookRefused) -> Event = match refusal {
                R::TooLarge => Event::WebhookTooLarge,
                R::TooSlow => Event::WebhookTooSlow,
                R::Busy => Event::WebhookBusy,
                R::Broken => Event::WebhookBrokenBody,
            };
            let detail = match refusal {
                R::TooLarge => too_large(),
                other => other.message(limit),
            };
            return listener.refuse(refusal.status(), kind, name, &detail).await;
        }
    };
    if !is_json(&parts.headers) {
        return listener
            .refuse(StatusCode::UNSUPPORTED_MEDIA_TYPE, Event::WebhookUnsupportedMediaType, name, "send `Content-Type: application/json` (in GitHub, choose the `application/json` content type)")
            .await;
    }
    // A delivery is known by its signature (what an attacker who captured
    // one cannot change) and by its id header (what the sender says it is).
    let header_id = header_text(&parts.headers, &DELIVERY_HEADERS).map(delivery_key);
    let mut signature = None;
    if let Some(secret) = &route.secret {
        match verify_signature(&parts.headers, &body.bytes, secret, listener.now()) {
            Ok(sig) => signature = Some(sig),
            Err(problem) => {
                return listener
                    .refuse(
                        StatusCode::UNAUTHORIZED,
                        Event::WebhookBadSignature,
                        name,
                        problem.describe(),
                    )
                    .await;
            }
        }
    }
    // A signed delivery is known by its signature, whatever id header
    // comes with it (the id is not signed); an unsigned one by its id.
    let window = signature.as_ref().map_or(REPLAY_WINDOW, |s| s.window);
    let replay_until_ms = listener.now().timestamp_millis()
        + i64::try_from(window.as_millis()).unwrap_or(i64::MAX / 2);
    let replay_key = signature
        .as_ref()
        .map(|s| {
            s.hex
                .get(..REPLAY_KEY_HEX_DIGITS)
                .unwrap_or(&s.hex)
                .to_string()
        })
        .or_else(|| header_id.clone());
    let delivery = header_id.or_else(|| signature.map(|s| s.hex));
    if replay_key
        .as_ref()
        .is_some_and(|k| crate::stdx::lock(&route.seen).contains(k))
    {
        return listener
            .refuse(
                StatusCode::CONFLICT,
                Event::WebhookReplayed,
                name,
                "this delivery was already accepted",
            )
            .await;
    }
    if !crate::stdx::lock(&route.bucket).take() {
        return listener
            .refuse(
                StatusCode::TOO_MANY_REQUESTS,
                Event::WebhookRateLimited,
                name,
                "too many requests on this route; slow down",
            )
            .await;
    }
    let json: Value = match serde_json::from_slice(&body.bytes) {
        Ok(v) => v,
        Err(e) => {
            return listener
                .refuse(
                    StatusCode::BAD_REQUEST,
                    Event::WebhookBadJson,
                    name,
                    &format!("the body is not JSON: {e}"),
                )
                .await;
        }
    };
    let event = header_text(&parts.headers, &EVENT_HEADERS).map(str::to_string);
    if !route.events.is_empty() && !event.as_ref().is_some_and(|e| route.events.contains(e)) {
        let detail = format!(
            "event `{}` is not one this route takes",
            event.as_deref().unwrap_or("")
        );
        return listener
            .refuse(StatusCode::OK, Event::WebhookIgnored, name, &detail)
            .await;
    }
    if let Some(filter) = &route.filter {
        let ctx = minijinja::context! {
            payload => crate::render::lenient::lenient(json.clone()),
            event => event.clone(),
        };
        let detail = match filter.matches(ctx) {
            Ok(true) => None,
            Ok(false) => Some("the route's `filter` is not true of this request".to_string()),
            Err(e) => Some(format!("the route's `filter` failed on this request: {e}")),
        };
        if let Some(detail) = detail {
            return listener
                .refuse(StatusCode::OK, Event::WebhookFiltered, name, &detail)
                .await;
        }
    }
    let (ack, answer) = oneshot::channel();
    let mut firing = Firing::new(
        &route.trigger,
        Origin::Webhook,
        json!({
            "trigger": route.trigger,
            "kind": "webhook",
            "route": name,
            "event": event,
            "delivery": delivery,
            "body": json,
        }),
    );
    firing.dedupe_key = replay_key.clone();
    firing.replay_until_ms = replay_key.is_some().then_some(replay_until_ms);
    firing.ack = Some(ack);
    if route.firings.send(firing).await.is_err() {
        return listener
            .refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                Event::WebhookQueueFull,
                name,
                "the route is being reconfigured; retry",
            )
            .await;
    }
    match answer.await {
        Ok(Ok(accepted)) if accepted.outcome == Enqueued::Duplicate => {
            listener
                .refuse(
                    StatusCode::CONFLICT,
                    Event::WebhookReplayed,
                    name,
                    "this delivery was already accepted",
                )
                .await
        }
        Ok(Ok(accepted)) => {
            if let Some(key) = replay_key {
                crate::stdx::lock(&route.seen).insert(key);
            }
            (
                StatusCode::ACCEPTED,
                axum::Json(json!({ "run_id": accepted.run_id, "outcome": accepted.outcome })),
            )
                .into_response()
        }
        Ok(Err(Refused::QueueFull(_))) => {
            listener
                .refuse(
                    StatusCode::SERVICE_UNAVAILABLE,
                    Event::WebhookQueueFull,
                    name,
                    "the trigger's run queue is full; retry later",
                )
                .await
        }
        // A sender learns nothing of the store behind the queue (its host,
        // user, the server's words): the reason is in the daemon's log,
        // its `store.unreachable` event and `npc status`.
        Ok(Err(Refused::Unreachable(_))) => {
            listener
                .refuse(
                    StatusCode::SERVICE_UNAVAILABLE,
                    Event::WebhookStoreUnreachable,
                    name,
                    STORE_UNREACHABLE_ANSWER,
                )
                .await
        }
        Ok(Err(e)) => {
            tracing::warn!("webhook of trigger `{}`: {e}", route.trigger);
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                axum::Json(json!({ "error": QUEUE_FAILED_ANSWER })),
            )
                .into_response()
        }
        Err(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            axum::Json(json!({ "error": "the firing was dropped" })),
        )
            .into_response(),
    }
}

/// A webhook trigger: a route on the shared [`Listener`].
#[derive(Debug)]
pub struct WebhookTrigger {
    name: String,
    route: String,
    secret_env: Option<String>,
    events: Vec<String>,
    max_body_bytes: u64,
    rate_limit_per_minute: u64,
    filter: Option<crate::model::template::Filter>,
    secret: Option<Vec<u8>>,
    listener: Arc<Listener>,
}

impl WebhookTrigger {
    /// `source` must be a webhook source.
    pub fn new(name: &str, source: &TriggerSource, listener: Arc<Listener>) -> Self {
        let (route, secret_env, events, max_body_bytes, rate_limit_per_minute, filter) =
            match source {
                TriggerSource::Webhook {
                    route,
                    secret_env,
                    events,
                    max_body_bytes,
                    rate_limit_per_minute,
                    filter,
                } => (
                    route.clone(),
                    secret_env.clone(),
                    events.clone(),
                    *max_body_bytes,
                    *rate_limit_per_minute,
                    filter.clone(),
                ),
                _ => Default::default(),
            };
        Self {
            name: name.to_string(),
            route,
            secret_env,
            events,
            max_body_bytes,
            rate_limit_per_minute,
            filter,
            secret: None,
            listener,
        }
    }
}

impl TriggerKind for WebhookTrigger {
    fn setup(&mut self, _cx: &TriggerContext) -> Result<(), TriggerError> {
        if let Some(var) = &self.secret_env {
            let value = std::env::var(var).ok().filter(|v| !v.is_empty());
            let Some(value) = value else {
                return Err(TriggerError::MissingSecret {
                    route: self.route.clone(),
                    var: var.clone(),
                });
            };
            self.secret = Some(value.into_bytes());
        }
        Ok(())
    }

    fn start(&mut self, _cx: &TriggerContext) -> Result<Firings, TriggerError> {
        let (tx, rx) = mpsc::channel(FIRING_QUEUE_DEPTH);
        let route = Arc::new(Route {
            trigger: self.name.clone(),
            secret: self.secret.clone(),
            events: self.events.clone(),
            filter: self.filter.clone(),
            max_body_bytes: self.max_body_bytes,
            bucket: Mutex::new(Bucket::new(self.rate_limit_per_minute)),
            seen: Mutex::new(Seen::default()),
            firings: tx,
        });
        self.listener.add(&self.route, route)?;
        Ok(rx)
    }

    fn stop(&mut self) {
        self.listener.remove(&self.route, &self.name);
    }

    fn teardown(&mut self, _cx: &TriggerContext) {}

    fn next_fire_times(&self, _limit: usize) -> Vec<DateTime<Utc>> {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc_4231() {
        assert_eq!(
            hex::encode(hmac_sha256(
                b"Jefe",
                &[b"what do ya want ", b"for nothing?"]
            )),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        let long_key = [0xaau8; 131];
        assert_eq!(
            hex::encode(hmac_sha256(
                &long_key,
                &[b"Test Using Larger Than Block-Size Key - Hash Key First"]
            )),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    fn headers(pairs: &[(&'static str, String)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn both_signature_forms_verify_and_tampering_fails() {
        let now = Utc::now();
        let body = br#"{"a":1}"#;
        let gh = format!("sha256={}", hex::encode(hmac_sha256(b"s3cret", &[body])));
        assert!(
            verify_signature(
                &headers(&[(GITHUB_SIGNATURE, gh.clone())]),
                body,
                b"s3cret",
                now
            )
            .is_ok()
        );
        assert_eq!(
            verify_signature(
                &headers(&[(GITHUB_SIGNATURE, gh)]),
                b"{\"a\":2}",
                b"s3cret",
                now
            ),
            Err(SignatureProblem::Mismatch)
        );
        let t = now.timestamp().to_string();
        let v1 = hex::encode(hmac_sha256(b"s3cret", &[t.as_bytes(), b".", body]));
        let generic = format!("t={t},v1={v1}");
        assert!(
            verify_signature(
                &headers(&[(NPC_SIGNATURE, generic.clone())]),
                body,
                b"s3cret",
                now
            )
            .is_ok()
        );
        let later = now + chrono::Duration::seconds(TIMESTAMP_TOLERANCE.as_secs() as i64 + 1);
        assert_eq!(
            verify_signature(
                &headers(&[(NPC_SIGNATURE, generic)]),
                body,
                b"s3cret",
                later
            ),
            Err(SignatureProblem::StaleTimestamp)
        );
        assert_eq!(
            verify_signature(&HeaderMap::new(), body, b"s3cret", now),
            Err(SignatureProblem::Missing)
        );
        assert_eq!(
            verify_signature(
                &headers(&[(GITHUB_SIGNATURE, "sha1=ab".into())]),
                body,
                b"s3cret",
                now
            ),
            Err(SignatureProblem::Malformed)
        );
    }

    #[test]
    fn the_bucket_holds_a_minute_and_seen_ids_are_bounded() {
        let mut b = Bucket::new(2);
        assert!(b.take() && b.take());
        assert!(!b.take());
        let mut seen = Seen::default();
        for i in 0..(MAX_REMEMBERED_DELIVERIES + 10) {
            seen.insert(i.to_string());
        }
        assert!(seen.order.len() <= MAX_REMEMBERED_DELIVERIES);
        assert!(!seen.contains("0"));
        assert!(seen.contains(&(MAX_REMEMBERED_DELIVERIES + 9).to_string()));
    }
}
