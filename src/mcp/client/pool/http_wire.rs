//! The lean side of a session with a streamable HTTP upstream: its
//! `tools/call` posted on the session's [`HttpLink`] (a pooled connection,
//! in the caller's task; see `surfaces::mcp_link`) instead of through
//! rmcp's client worker. The call carries an `npc-N` id, as on a stdio
//! upstream's [`super::super::wire::Wire`], and the same decoding finds its
//! answer; what else the response's stream carries is handled as rmcp's
//! client would: progress under npc's tokens and log messages go to the
//! passthrough at once, in order, so they precede the answer; other
//! notifications (list changes) and the upstream's own requests (sampling,
//! elicitation, roots, ping) go to the session's [`Listener`] as if rmcp had
//! read them,
//! a request marked as arriving on this call's stream so that it reaches
//! the session whose call caused it, and its answer is posted back (at
//! most [`MAX_FORWARDED_REQUESTS`] at once; past it one is dropped). With
//! no session to post in yet (or one of a protocol version without
//! sessions), [`HttpWire::call_tool`] says so and the call goes through
//! rmcp. A call dropped before its answer tells the server with
//! `notifications/cancelled`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::Semaphore;

use rmcp::model::{
    ClientJsonRpcMessage, JsonObject, NumberOrString, ProgressToken, RequestId,
    ServerJsonRpcMessage, ServerNotification,
};
use rmcp::service::{InboundStreamOrigin, RequestContext};
use rmcp::{Peer, RoleClient, Service as _};

use super::super::catalog::CatalogChange;
use super::super::wire::{
    Answer, Failure, answer_of, call_frame, cancelled_frame, id_of, progress_of,
};
use super::upstream::Listener;
use crate::mcp::passthrough::{Entered, MAX_FORWARDED_REQUESTS};
use crate::surfaces::mcp_link::{HttpLink, PostError, Posted};

/// The lean side of one HTTP upstream session (see the module docs).
pub(in crate::mcp::client::pool) struct HttpWire {
    link: HttpLink,
    listener: Listener,
    next: AtomicU64,
    /// The upstream's requests on calls' streams being answered.
    requests: Arc<Semaphore>,
}

impl std::fmt::Debug for HttpWire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpWire")
            .field("link", &self.link)
            .finish_non_exhaustive()
    }
}

impl HttpWire {
    pub(in crate::mcp::client::pool) fn new(link: HttpLink, listener: Listener) -> Self {
        Self {
            link,
            listener,
            next: AtomicU64::new(1),
            requests: Arc::new(Semaphore::new(MAX_FORWARDED_REQUESTS)),
        }
    }

    /// Call `name` with `arguments` on the session `peer` belongs to, as
    /// `entered`; `None` when there is no session to post in (call through
    /// rmcp then).
    pub(in crate::mcp::client::pool) async fn call_tool(
        &self,
        peer: &Peer<RoleClient>,
        name: &str,
        arguments: Option<&JsonObject>,
        entered: Option<&Entered<'_>>,
    ) -> Option<Answer> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let token = entered.and_then(Entered::token);
        let frame = match call_frame(n, name, arguments, token.as_ref(), None) {
            Ok(frame) => frame,
            Err(e) => {
                return Some(Err(Failure::Lost(format!(
                    "the call did not serialize: {e}"
                ))));
            }
        };
        let id = RequestId::String(id_of(n).into());
        if let Some(entered) = entered {
            // The token is kept only when the caller asked for progress.
            let token = token
                .clone()
                .unwrap_or(ProgressToken(NumberOrString::Number(0)));
            entered.sent_as(id.clone(), token);
        }
        let mut answer = None;
        let mut waiting = Waiting {
            link: &self.link,
            n,
            answered: false,
        };
        let posted = self
            .link
            .post(frame, |message| {
                if let Some((m, a)) = answer_of(message) {
                    if m == n {
                        answer = Some(a);
                        return true;
                    }
                    return false;
                }
                self.other(message, peer, &id);
                false
            })
            .await;
        waiting.answered = true;
        match posted {
            Ok(Posted::Answered) => answer,
            Ok(Posted::Accepted) => Some(Err(Failure::Lost(
                "it accepted `tools/call` without answering it".into(),
            ))),
            Err(PostError::NoSession) => None,
            Err(e) => Some(Err(Failure::Lost(e.to_string()))),
        }
    }

    /// A message on call `id`'s stream other than its answer.
    fn other(&self, message: &[u8], peer: &Peer<RoleClient>, id: &RequestId) {
        let passthrough = &self.listener.passthrough;
        if let Some(params) = progress_of(message) {
            passthrough.progress(params);
            return;
        }
        let Ok(message) = serde_json::from_slice::<ServerJsonRpcMessage>(message) else {
            tracing::debug!(server = %passthrough.server, "mcp: skipped a message on a call's stream that is not JSON-RPC");
            return;
        };
        match message {
            ServerJsonRpcMessage::Notification(notification) => match notification.notification {
                ServerNotification::LoggingMessageNotification(log) => {
                    passthrough.log(log.params);
                }
                ServerNotification::ResourceUpdatedNotification(updated) => {
                    passthrough.resource_updated(updated.params);
                }
                ServerNotification::ToolListChangedNotification(_) => {
                    self.listener.tools_changed(peer.clone());
                }
                ServerNotification::ResourceListChangedNotification(_) => {
                    self.listener.catalog.list_changed(
                        CatalogChange::Resources,
                        peer.clone(),
                        passthrough.server.clone(),
                    );
                }
                ServerNotification::PromptListChangedNotification(_) => {
                    self.listener.catalog.list_changed(
                        CatalogChange::Prompts,
                        peer.clone(),
                        passthrough.server.clone(),
                    );
                }
                // Nothing a gateway's client is told of.
                _ => {}
            },
            ServerJsonRpcMessage::Request(request) => {
                // Bounded like a session's forwarded requests; past it the
                // request is dropped and the upstream's own timeout ends it.
                let Ok(permit) = self.requests.clone().try_acquire_owned() else {
                    tracing::warn!(server = %passthrough.server, "mcp: dropped an upstream's request on a call's stream: {MAX_FORWARDED_REQUESTS} are being answered already");
                    return;
                };
                let (listener, peer, link) =
                    (self.listener.clone(), peer.clone(), self.link.clone());
                let origin = InboundStreamOrigin::OutboundRequest(id.clone());
                tokio::spawn(async move {
                    let _permit = permit;
                    let mut context = RequestContext::new(request.id.clone(), peer);
                    context.extensions.insert(origin);
                    let reply = match listener.handle_request(request.request, context).await {
                        Ok(result) => ClientJsonRpcMessage::response(result, request.id),
                        Err(error) => ClientJsonRpcMessage::error(error, Some(request.id)),
                    };
                    let Ok(body) = serde_json::to_vec(&reply) else {
                        return;
                    };
                    if let Err(e) = link.post(body, |_| true).await {
                        tracing::warn!(server = %listener.passthrough.server, error = %e, "mcp: posting the answer to an upstream's request failed");
                    }
                });
            }
            // Answers to requests npc did not send on this stream.
            ServerJsonRpcMessage::Response(_) | ServerJsonRpcMessage::Error(_) => {}
        }
    }
}

/// A call on its way: when dropped unanswered, the server is told.
struct Waiting<'a> {
    link: &'a HttpLink,
    n: u64,
    answered: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if !self.answered
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let (link, frame) = (self.link.clone(), cancelled_frame(self.n));
            runtime.spawn(async move {
                let _ = link.post(frame, |_| true).await;
            });
        }
    }
}
