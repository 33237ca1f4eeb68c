//! The gateway's `tools/call` over streamable HTTP, answered before rmcp's
//! service sees it: the [`Shortcut`] of `npc mcp serve --http`. rmcp
//! answers every request of a session with an event stream, and clients
//! often tear the connection down with it, so each call paid a new TCP
//! connection on top of rmcp's session worker, its handler task and the
//! stream's framing. Here a session's `tools/call` is decoded once (the
//! same [`route`] as the stdio session loop), run through the
//! [`CallPath`] as the session's [`Caller`] in the connection's own task,
//! and answered as one `application/json` body (the transport lets a server
//! answer a POST either way), which keeps the connection open. The call is
//! recorded ([`CallPath::publish`](crate::mcp::CallPath::publish)) by a task that runs once the answer is
//! written.
//!
//! What the call causes on its way (its progress, a log message of its
//! upstream's) goes to the call's own stream ([`crate::mcp::passthrough::CallStream`]): a call that
//! causes nothing before its answer is answered as JSON, one that does as an
//! event stream of those messages and then the answer (the transport's two
//! ways; rmcp's `json_response` decides the same way).
//!
//! Taken only once the session finished its handshake here (its
//! `notifications/initialized` registered it, [`HttpSessions::register`];
//! the answer to that notification waits for it, within [`REGISTER_WAIT`],
//! so the session's next request finds it),
//! and only when the client declared none of sampling, elicitation and
//! roots: an upstream's request to the client needs rmcp's session to
//! carry the client's answer back, so those sessions' calls go to rmcp as
//! before (and for the others the passthrough refuses such a request at
//! once). A repeated request id, or more than [`MAX_CALLS_IN_FLIGHT`] calls
//! of one session, go to rmcp too. A client's `notifications/cancelled` of a
//! call running here stops it (its upstream is told, it is recorded as
//! `cancelled`, and its response closes with no answer); a client that
//! drops the connection drops the call.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};

use futures_util::StreamExt as _;
use futures_util::future::BoxFuture;
use rmcp::model::{RequestId, ServerJsonRpcMessage, ServerNotification};
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

use super::gateway::{HttpRegistry, Shape};
use super::session::{Notice, Route, answer, route};
use crate::mcp::call::CallPath;
use crate::mcp::lock;
use crate::mcp::passthrough::{Caller, Client, MAX_QUEUED_NOTIFICATIONS, as_caller};
use crate::surfaces::mcp_http::{Reply, Shortcut, Taken};

/// Calls of one session answered here at once; past it, rmcp takes them.
pub const MAX_CALLS_IN_FLIGHT: usize = super::session::MAX_CALLS_IN_FLIGHT;

/// One registered session.
struct Session {
    client: Weak<Client>,
    shape: Shape,
    /// Calls running here, by request id: what stops each.
    calls: Arc<Mutex<HashMap<RequestId, CancellationToken>>>,
}

/// How long the answer to a session's `notifications/initialized` waits
/// for the session to be registered here, so that its next call finds it.
pub const REGISTER_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// The HTTP sessions of one gateway, by the session id rmcp gave them.
pub struct HttpSessions {
    path: Arc<CallPath>,
    sessions: Arc<Mutex<HashMap<String, Session>>>,
    registered: Arc<Notify>,
}

impl std::fmt::Debug for HttpSessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpSessions")
            .field("sessions", &lock(&self.sessions).len())
            .finish_non_exhaustive()
    }
}

impl HttpSessions {
    pub fn new(path: Arc<CallPath>) -> Self {
        Self {
            path,
            sessions: Arc::default(),
            registered: Arc::default(),
        }
    }

    /// Session `id` finished its handshake as `client`. Sessions that
    /// ended (their client dropped with rmcp's session) are forgotten here,
    /// so the map holds at most the sessions alive.
    fn register_session(&self, id: &str, client: &Arc<Client>, shape: Shape) {
        let mut sessions = lock(&self.sessions);
        sessions.retain(|_, s| s.client.strong_count() > 0);
        sessions.insert(
            id.to_string(),
            Session {
                client: Arc::downgrade(client),
                shape,
                calls: Arc::default(),
            },
        );
        drop(sessions);
        self.registered.notify_waiters();
    }

    /// The live session `id`: its client, result shape and calls.
    fn session(&self, id: &str) -> Option<(Arc<Client>, Shape, Arc<Mutex<CallMap>>)> {
        let sessions = lock(&self.sessions);
        let session = sessions.get(id)?;
        Some((
            session.client.upgrade()?,
            session.shape,
            session.calls.clone(),
        ))
    }
}

impl HttpRegistry for HttpSessions {
    fn register(&self, id: &str, client: &Arc<Client>, shape: Shape) {
        self.register_session(id, client, shape);
    }
}

type CallMap = HashMap<RequestId, CancellationToken>;

/// Whether a call of `client` may be answered without the response's
/// stream (see the module docs).
fn needs_no_stream(client: &Client) -> bool {
    !client.takes_requests()
}

/// Removes a call from its session's map when it ends, however it ends.
struct Running {
    calls: Arc<Mutex<CallMap>>,
    id: RequestId,
}

impl Drop for Running {
    fn drop(&mut self) {
        lock(&self.calls).remove(&self.id);
    }
}

/// What a call answered here ends with: its answer, or nothing when the
/// client cancelled it.
type Served = Option<Vec<u8>>;

/// A call answered here, as its reply is being made: the call while it
/// runs, what it caused on its way (its progress, [`crate::mcp::passthrough::CallStream`]), and the
/// messages left to send.
struct Replying {
    call: Option<Pin<Box<dyn Future<Output = Served> + Send>>>,
    stream: mpsc::Receiver<ServerNotification>,
    ready: VecDeque<Vec<u8>>,
}

impl Replying {
    /// The next message of the reply: what the call caused, in order, then
    /// its answer; `None` after the last.
    async fn next(&mut self) -> Option<Vec<u8>> {
        loop {
            if let Some(message) = self.ready.pop_front() {
                return Some(message);
            }
            let call = self.call.as_mut()?;
            tokio::select! {
                biased;
                Some(notification) = self.stream.recv() => return Some(notification_frame(notification)),
                served = call => {
                    self.call = None;
                    // What the call caused before its answer goes first.
                    while let Ok(notification) = self.stream.try_recv() {
                        self.ready.push_back(notification_frame(notification));
                    }
                    self.ready.extend(served);
                }
            }
        }
    }

    /// The reply: one JSON body when the call caused nothing before its
    /// answer, else an event stream.
    async fn reply(mut self) -> Reply {
        let Some(first) = self.next().await else {
            return Reply::Nothing;
        };
        if self.call.is_none() && self.ready.is_empty() {
            return Reply::Json(first);
        }
        let rest = futures_util::stream::unfold(self, |mut replying| async move {
            let message = replying.next().await?;
            Some((message, replying))
        });
        Reply::Stream(Box::pin(
            futures_util::stream::once(async { first }).chain(rest),
        ))
    }
}

/// `notification` as one JSON-RPC frame.
fn notification_frame(notification: ServerNotification) -> Vec<u8> {
    crate::stdx::lines::encode(&ServerJsonRpcMessage::notification(notification))
        .unwrap_or_default()
}

impl Shortcut for HttpSessions {
    fn take(&self, session: &str, body: &[u8]) -> Option<Taken> {
        let (client, shape, calls) = self.session(session)?;
        match route(body, true) {
            Route::Call { id, params } => {
                if !needs_no_stream(&client) {
                    return None;
                }
                let progress = params.meta.as_ref().and_then(|m| m.get_progress_token());
                let stop = CancellationToken::new();
                {
                    let mut running = lock(&calls);
                    // A repeated id, or a session over its bound: rmcp's.
                    if running.contains_key(&id) || running.len() >= MAX_CALLS_IN_FLIGHT {
                        return None;
                    }
                    running.insert(id.clone(), stop.clone());
                }
                let running = Running {
                    calls,
                    id: id.clone(),
                };
                let (sender, stream) = mpsc::channel(MAX_QUEUED_NOTIFICATIONS);
                let caller = Caller {
                    client: client.clone(),
                    request: Some(id.clone()),
                    progress,
                    stream: Some(sender),
                };
                let path = self.path.clone();
                let call = async move {
                    let _running = running;
                    let started = std::time::Instant::now();
                    let name = params.name;
                    let recorder = path.clone();
                    let call =
                        as_caller(Some(caller), path.call_unrecorded(&name, params.arguments));
                    tokio::select! {
                        (result, record) = call => {
                            // What went through the session's queue goes first.
                            client.flush().await;
                            let answer = answer(id, result, shape);
                            // Recorded once the answer is on its way: the task
                            // runs after this connection's task wrote it.
                            tokio::spawn(async move { recorder.publish(record).await });
                            Some(answer)
                        }
                        () = stop.cancelled() => {
                            path.publish(path.cancelled(&name, started)).await;
                            None
                        }
                    }
                };
                let replying = Replying {
                    call: Some(Box::pin(call)),
                    stream,
                    ready: VecDeque::new(),
                };
                Some(Taken::Answer(Box::pin(replying.reply())))
            }
            Route::Forward(Notice::Cancelled(id)) => {
                let stop = lock(&calls).get(&id).cloned()?;
                stop.cancel();
                Some(Taken::Accepted)
            }
            Route::Forward(_) => None,
        }
    }

    fn settle(&self, session: &str, body: &[u8]) -> Option<BoxFuture<'static, ()>> {
        if route(body, false) != Route::Forward(Notice::Initialized) {
            return None;
        }
        let (sessions, registered, id) = (
            self.sessions.clone(),
            self.registered.clone(),
            session.to_string(),
        );
        Some(Box::pin(async move {
            let wait = async {
                loop {
                    let notified = registered.notified();
                    tokio::pin!(notified);
                    notified.as_mut().enable();
                    if lock(&sessions).contains_key(&id) {
                        return;
                    }
                    notified.await;
                }
            };
            // A session that never registers (its handshake failed) is
            // rmcp's; its client waited at most this long.
            let _ = tokio::time::timeout(REGISTER_WAIT, wait).await;
        }))
    }
}
