//! One session of the gateway over a byte stream: the standard streams of
//! `npc mcp serve`, or a control connection the daemon upgraded for an
//! `npc mcp serve` in front of it. Frames are newline-delimited JSON-RPC.
//!
//! `tools/call` is the message an agent sends over and over, so the session
//! answers it itself: the line is decoded once, the call goes through the
//! [`CallPath`](crate::mcp::CallPath) in this task (no handler task per request), the answer is
//! written as soon as the result is there, and only then is the call
//! recorded ([`CallPath::publish`](crate::mcp::CallPath::publish)). Every other message (the handshake,
//! lists, resources, prompts, completions, pings, malformed lines) goes to
//! rmcp's server for the same [`Gateway`] over an in-process pipe, and its
//! frames come back out through the same writer, whole lines at a time. A
//! `tools/call` is answered here only once the client has sent
//! `notifications/initialized` and when it is well formed and carries
//! nothing this loop does not handle (multi-round-trip input); anything
//! else goes to rmcp, so both paths answer alike.
//!
//! Bounds: a frame longer than [`MAX_FRAME_BYTES`] is dropped unread and
//! answered with a JSON-RPC parse error (its id is unknown); at most
//! [`MAX_CALLS_IN_FLIGHT`] calls run at once, and past that the session
//! stops reading until one ends. A call the client cancels
//! (`notifications/cancelled`) stops: its upstream is told, it is not
//! answered, and it is recorded as `cancelled`. Each call runs as the session's
//! [`Caller`] with its progress token (see [`crate::mcp::passthrough`]), so what
//! its upstream sends back during the call reaches this client. When the
//! client closes its side, calls still running are dropped.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use futures_util::stream::FuturesUnordered;
use rmcp::ServiceExt as _;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, RequestId, ServerJsonRpcMessage,
    ServerResult,
};
use rmcp::service::{Peer, ServerInitializeError};
use rmcp::{ErrorData, RoleServer};
use serde::Deserialize;
use tokio::io::{AsyncBufReadExt as _, AsyncRead, AsyncWrite, AsyncWriteExt as _, BufReader};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use super::gateway::{Gateway, Shape};
use crate::mcp::MAX_FRAME_BYTES;
use crate::mcp::passthrough::{Caller, Client, FrameWriter, Sink, as_caller};
use crate::stdx::lines::{Line, LineReader, Overlong, Splitter, encode};

/// Calls of one session running at once; past it the session stops reading.
pub const MAX_CALLS_IN_FLIGHT: usize = 64;
/// Buffer of the in-process pipe to and from rmcp's server.
const PIPE_BYTES: usize = 256 * 1024;

/// Why a session ended badly (a client that leaves, even before its
/// handshake, is a clean end).
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("the MCP client did not initialize: {0}")]
    Initialize(#[source] Box<ServerInitializeError>),
    #[error("the MCP client did not send `initialize` within {}s", .0.as_secs())]
    InitializeTimeout(Duration),
    #[error("the gateway's session task failed: {0}")]
    Task(#[source] tokio::task::JoinError),
    #[error("reading from the MCP client failed: {0}")]
    Read(#[source] std::io::Error),
    #[error("writing to the MCP client failed: {0}")]
    Write(#[source] std::io::Error),
}

/// What the session needs to know of a frame, decoded in one pass.
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(default, borrow)]
    jsonrpc: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    method: Option<Cow<'a, str>>,
    #[serde(default)]
    id: Option<RequestId>,
    #[serde(default, borrow)]
    params: Option<&'a serde_json::value::RawValue>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Cancelled {
    request_id: RequestId,
}

/// What to do with one frame.
#[derive(Debug, PartialEq)]
pub(super) enum Route {
    /// Answer here: a well-formed `tools/call` after the handshake.
    Call {
        id: RequestId,
        params: CallToolRequestParams,
    },
    /// Hand to rmcp, noting what the frame announces.
    Forward(Notice),
}

/// What a frame handed to rmcp announces to the session loop.
#[derive(Debug, PartialEq)]
pub(super) enum Notice {
    Nothing,
    /// The client's `initialize` request.
    Initialize,
    /// `notifications/initialized`.
    Initialized,
    /// `notifications/cancelled` of this request.
    Cancelled(RequestId),
}

const FORWARD: Route = Route::Forward(Notice::Nothing);

/// `initialized`: the client sent `notifications/initialized` and rmcp
/// has its handshake.
pub(super) fn route(line: &[u8], initialized: bool) -> Route {
    let Ok(envelope) = serde_json::from_slice::<Envelope>(line) else {
        return FORWARD;
    };
    if envelope.jsonrpc.as_deref() != Some("2.0") {
        return FORWARD;
    }
    match (envelope.method.as_deref(), envelope.id, envelope.params) {
        (Some("tools/call"), Some(id), Some(params)) if initialized => {
            match serde_json::from_str::<CallToolRequestParams>(params.get()) {
                // A version negotiated inline, or multi-round-trip input, is
                // rmcp's to check.
                Ok(params)
                    if params.input_responses.is_none()
                        && params.request_state.is_none()
                        && params
                            .meta
                            .as_ref()
                            .and_then(|m| m.protocol_version())
                            .is_none() =>
                {
                    Route::Call { id, params }
                }
                _ => FORWARD,
            }
        }
        (Some("initialize"), Some(_), _) => Route::Forward(Notice::Initialize),
        (Some("notifications/initialized"), None, _) => Route::Forward(Notice::Initialized),
        (Some("notifications/cancelled"), None, Some(params)) => {
            match serde_json::from_str::<Cancelled>(params.get()) {
                Ok(c) => Route::Forward(Notice::Cancelled(c.request_id)),
                Err(_) => FORWARD,
            }
        }
        _ => FORWARD,
    }
}

/// `message` as one frame.
fn frame(message: &ServerJsonRpcMessage) -> Vec<u8> {
    encode(message).unwrap_or_else(|e| {
        // The model's types always serialize; say so rather than panic.
        tracing::error!(error = %e, "mcp: an answer did not serialize");
        br#"{"jsonrpc":"2.0","id":null,"error":{"code":-32603,"message":"the answer did not serialize"}}
"#.to_vec()
    })
}

pub(super) fn answer(
    id: RequestId,
    result: Result<CallToolResult, ErrorData>,
    shape: Shape,
) -> Vec<u8> {
    match result {
        Ok(result) => {
            let mut result = ServerResult::from(CallToolResponse::from(result));
            shape.apply(&mut result);
            frame(&ServerJsonRpcMessage::response(result, id))
        }
        Err(error) => frame(&ServerJsonRpcMessage::error(error, Some(id))),
    }
}

/// The answer to a frame longer than [`MAX_FRAME_BYTES`].
fn too_long() -> Vec<u8> {
    let message = format!(
        "a frame longer than {MAX_FRAME_BYTES} bytes was dropped; send smaller messages (large content belongs in resources)"
    );
    let error = serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": { "code": -32700, "message": message },
    });
    // A `Value` always serializes.
    encode(&error).unwrap_or_default()
}

async fn write_frame(writer: &FrameWriter, bytes: &[u8]) -> Result<(), SessionError> {
    let mut w = writer.lock().await;
    w.write_all(bytes).await.map_err(SessionError::Write)?;
    w.flush().await.map_err(SessionError::Write)
}

/// Serve one gateway session on `read`/`write` until the client closes
/// its side (or the connection breaks); `initialize` must come within
/// `initialize_within` when given.
pub async fn serve<R, W>(
    gateway: Gateway,
    read: R,
    write: W,
    initialize_within: Option<Duration>,
) -> Result<(), SessionError>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    // rmcp answers in tasks of its own: the session's run goes with it.
    let gateway = gateway.for_run(crate::mcp::call::current_run());
    let path = gateway.call_path().clone();
    let slot = gateway.client_slot();
    let (ours, theirs) = tokio::io::duplex(PIPE_BYTES);
    let (from_rmcp, mut to_rmcp) = tokio::io::split(ours);
    // rmcp's side of the handshake, once it is done (dropped when it failed).
    let (handshook, mut handshake) = tokio::sync::watch::channel::<Option<Peer<RoleServer>>>(None);
    let mut service = tokio::spawn(async move {
        let starting = gateway.serve(tokio::io::split(theirs));
        let started = match initialize_within {
            Some(limit) => tokio::time::timeout(limit, starting)
                .await
                .map_err(|_| SessionError::InitializeTimeout(limit))?,
            None => starting.await,
        };
        let running = match started {
            Ok(running) => running,
            Err(ServerInitializeError::ConnectionClosed(_)) => return Ok(()),
            Err(e) => return Err(SessionError::Initialize(Box::new(e))),
        };
        let _ = handshook.send(Some(running.peer().clone()));
        let _ = running.waiting().await;
        drop(handshook);
        Ok(())
    });
    let writer: FrameWriter = Arc::new(Mutex::new(Box::new(write)));
    // rmcp's frames, whole lines at a time, so they never interleave with
    // the answers written here.
    let pump = {
        let writer = writer.clone();
        tokio::spawn(async move {
            let mut from_rmcp = BufReader::new(from_rmcp);
            let mut line = Vec::new();
            loop {
                line.clear();
                match from_rmcp.read_until(b'\n', &mut line).await {
                    Ok(0) | Err(_) => return Ok(()),
                    Ok(_) => write_frame(&writer, &line).await?,
                }
            }
        })
    };
    let mut reader = LineReader::new(
        read,
        Splitter::new(MAX_FRAME_BYTES, Overlong::Skip).skip_blank(),
    );
    let mut calls = FuturesUnordered::new();
    // Calls running here and not cancelled, by id (a count: ids may repeat).
    let mut answering: HashMap<RequestId, usize> = HashMap::new();
    // What stops the calls of an id the client cancels.
    let mut cancels: HashMap<RequestId, CancellationToken> = HashMap::new();
    // The session as its calls' caller, once the handshake is done.
    let mut client: Option<Arc<Client>> = None;
    // The client sent `initialize`, so rmcp ends its handshake (or fails).
    let mut initializing = false;
    let mut shape = None;
    // rmcp's session's end, once the loop saw it.
    let mut served = None;
    let ended: Result<(), SessionError> = loop {
        tokio::select! {
            Some((id, served)) = calls.next(), if !calls.is_empty() => {
                let answer_it = match answering.get_mut(&id) {
                    Some(n) => {
                        *n -= 1;
                        if *n == 0 {
                            answering.remove(&id);
                            cancels.remove(&id);
                        }
                        true
                    }
                    None => false,
                };
                // Cancelled: stopped and recorded, not answered.
                let (result, record) = match served {
                    Ok(served) => served,
                    Err(record) => {
                        path.publish(record).await;
                        continue;
                    }
                };
                // Only calls routed here after the handshake are in flight.
                let shape = shape.unwrap_or(Shape::Legacy);
                let written = if answer_it {
                    // The call's progress goes out before its answer.
                    if let Some(client) = &client {
                        client.flush().await;
                    }
                    write_frame(&writer, &answer(id, result, shape)).await
                } else {
                    Ok(())
                };
                path.publish(record).await;
                if let Err(e) = written {
                    break Err(e);
                }
            }
            frame = reader.next(), if calls.len() < MAX_CALLS_IN_FLIGHT => {
                let line = match frame {
                    Ok(Some(Line::Line(line))) => line,
                    Ok(Some(Line::TooLong { .. } | Line::Truncated(_))) => {
                        tracing::warn!("mcp: dropped a frame longer than {MAX_FRAME_BYTES} bytes");
                        if let Err(e) = write_frame(&writer, &too_long()).await {
                            break Err(e);
                        }
                        continue;
                    }
                    Ok(None) => break Ok(()),
                    Err(e) => break Err(SessionError::Read(e)),
                };
                match route(&line, shape.is_some()) {
                    Route::Call { id, params } => {
                        *answering.entry(id.clone()).or_default() += 1;
                        let cancelled = cancels.entry(id.clone()).or_default().clone();
                        let caller = client.clone().map(|client| Caller {
                            client,
                            request: None,
                            progress: params.meta.as_ref().and_then(|m| m.get_progress_token()),
                            stream: None,
                        });
                        let path = path.clone();
                        calls.push(async move {
                            let started = std::time::Instant::now();
                            let name = params.name;
                            let call = as_caller(caller, path.call_unrecorded(&name, params.arguments));
                            let served = tokio::select! {
                                served = call => Ok(served),
                                () = cancelled.cancelled() => Err(path.cancelled(&name, started)),
                            };
                            (id, served)
                        });
                    }
                    Route::Forward(notice) => {
                        match &notice {
                            Notice::Initialize => initializing = true,
                            Notice::Cancelled(id) => {
                                answering.remove(id);
                                if let Some(stop) = cancels.remove(id) {
                                    stop.cancel();
                                }
                            }
                            Notice::Nothing | Notice::Initialized => {}
                        }
                        let mut bytes = line;
                        bytes.push(b'\n');
                        // rmcp gone: its end shows in `service` below.
                        if to_rmcp.write_all(&bytes).await.is_err() {
                            break Ok(());
                        }
                        // The client saw rmcp's answer to `initialize`, and rmcp
                        // is done with the handshake right after writing it:
                        // wait for that, so that no call after this frame goes
                        // to rmcp for want of it (an error: rmcp gave up).
                        if notice == Notice::Initialized
                            && initializing
                            && shape.is_none()
                            && let Ok(peer) = handshake.wait_for(Option::is_some).await
                        {
                            shape = peer.as_ref().map(Shape::of);
                            client = peer
                                .as_ref()
                                .map(|peer| slot.get(&path, peer, || Sink::Frames(writer.clone())));
                        }
                    }
                }
            }
            done = &mut service => {
                served = Some(done.map_err(SessionError::Task).and_then(|r| r));
                break Ok(());
            }
        }
    };
    // Closing rmcp's input ends its session, then its output and the pump.
    let _ = to_rmcp.shutdown().await;
    drop(to_rmcp);
    let served = match served {
        Some(served) => served,
        None => service.await.map_err(SessionError::Task).and_then(|r| r),
    };
    let pumped = pump.await.map_err(SessionError::Task).and_then(|r| r);
    ended.and(served).and(pumped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn call_route(line: &str, initialized: bool) -> Route {
        route(line.as_bytes(), initialized)
    }

    #[test]
    fn only_well_formed_calls_after_the_handshake_are_answered_here() {
        let call = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"a__b","arguments":{"x":1}}}"#;
        match call_route(call, true) {
            Route::Call { id, params } => {
                assert_eq!(id, RequestId::Number(7));
                assert_eq!(params.name, "a__b");
                assert_eq!(params.arguments.unwrap()["x"], 1);
            }
            other => panic!("answered here, not {other:?}"),
        }
        // Before `notifications/initialized`, rmcp decides.
        assert_eq!(call_route(call, false), FORWARD);
        for line in [
            // Not JSON-RPC 2.0, no id, no params, a bad name, an array.
            r#"{"jsonrpc":"1.0","id":7,"method":"tools/call","params":{"name":"a"}}"#,
            r#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"a"}}"#,
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call"}"#,
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":5}}"#,
            r#"{"jsonrpc":"2.0","id":null,"method":"tools/call","params":{"name":"a"}}"#,
            r#"[{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"a"}}]"#,
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"a","requestState":"s"}}"#,
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/list"}"#,
            "not json at all",
            "{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"tools/call\",\"params\":{\"name\":\"a\"",
        ] {
            assert_eq!(call_route(line, true), FORWARD, "{line}");
        }
    }

    #[test]
    fn the_handshake_and_cancellations_are_noticed_and_still_forwarded() {
        assert_eq!(
            call_route(
                r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
                false
            ),
            Route::Forward(Notice::Initialized)
        );
        assert_eq!(
            call_route(
                r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}"#,
                false
            ),
            Route::Forward(Notice::Initialize)
        );
        assert_eq!(
            call_route(
                r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"r-1","reason":"x"}}"#,
                true
            ),
            Route::Forward(Notice::Cancelled(RequestId::String("r-1".into())))
        );
    }

    #[test]
    fn answers_are_one_json_rpc_line() {
        let result = || CallToolResult::success(vec![rmcp::model::ContentBlock::text("hi")]);
        let legacy: Value =
            serde_json::from_slice(&answer(RequestId::Number(1), Ok(result()), Shape::Legacy))
                .unwrap();
        assert_eq!(legacy["result"].get("resultType"), None, "{legacy}");
        let current: Value =
            serde_json::from_slice(&answer(RequestId::Number(1), Ok(result()), Shape::Current))
                .unwrap();
        assert_eq!(current["result"]["resultType"], "complete", "{current}");
        let bytes = answer(RequestId::String("q".into()), Ok(result()), Shape::Legacy);
        assert_eq!(bytes.last(), Some(&b'\n'));
        assert_eq!(bytes.iter().filter(|&&b| b == b'\n').count(), 1);
        let value: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(value["jsonrpc"], "2.0");
        assert_eq!(value["id"], "q");
        assert_eq!(value["result"]["content"][0]["text"], "hi");
        // A server's error answer is the same error under the client's id.
        let data =
            serde_json::json!({"elicitations": [{"mode": "url", "url": "https://example.com"}]});
        let refused = ErrorData::new(
            rmcp::model::ErrorCode(-32042),
            "open it",
            Some(data.clone()),
        );
        let error: Value =
            serde_json::from_slice(&answer(RequestId::Number(9), Err(refused), Shape::Current))
                .unwrap();
        assert_eq!(error["id"], 9);
        assert_eq!(error["error"]["code"], -32042);
        assert_eq!(error["error"]["data"], data);
        let error: Value = serde_json::from_slice(&too_long()).unwrap();
        assert_eq!(error["error"]["code"], -32700);
        assert_eq!(error["id"], Value::Null);
    }
}
