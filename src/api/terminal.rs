//! A pane's terminal over a WebSocket (`GET /api/v1/panes/{name}/terminal`),
//! the browser's `npc pane attach`.
//!
//! Server to client: the scrollback as binary frames (at most
//! [`SCROLLBACK_FRAME_BYTES`] each), then the pane's live output as binary
//! frames; text frames are JSON: `{"type":"status",…}` (the last plugin
//! status, on connect) and `{"type":"exited","exit":…}` when the pane's
//! output ends. Client to server: a binary frame is typed input; a text
//! frame must be JSON `{"type":"input","data":STR}` or
//! `{"type":"resize","cols":N,"rows":N}`; anything else closes the socket
//! with a policy-violation code. Input goes through the same operator path
//! as `npc pane send`.
//!
//! Browsers cannot set headers on a WebSocket, so the token travels as the
//! subprotocol `npc.bearer.<token>` next to `npc.v1` (which the server
//! echoes; the guard in `super` reads it), and the `Origin` must be the
//! page the daemon served (same scheme-less authority as `Host`, a
//! loopback name unless the API is remote): no other site can open a
//! terminal with the user's browser (cross-site WebSocket hijacking).
//!
//! Each client has its own subscription to the pane's bounded output
//! broadcast; a client that falls behind it, or does not take a frame
//! within [`SEND_TIMEOUT`], is dropped (close code 1013) instead of
//! holding memory. At most [`MAX_TERMINALS`] are open at once.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::PathRejection;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade, close_code};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::RecvError;

use super::resources::{MAX_PANE_INPUT_BYTES, PaneOp, PaneSize, checked_size};
use super::{ApiBackend, ApiError, ApiState};

/// How every terminal route's path ends (the only paths whose token may
/// come as a subprotocol).
pub const PATH_SUFFIX: &str = "/terminal";
/// The subprotocol every terminal client offers and the server echoes.
pub const SUBPROTOCOL: &str = "npc.v1";
/// Prefix of the subprotocol that carries the bearer token.
pub const BEARER_SUBPROTOCOL_PREFIX: &str = "npc.bearer.";
/// Terminals open at once, over all panes; more get `503 too_many_terminals`.
pub const MAX_TERMINALS: usize = 64;
/// Largest message (and frame) a client may send.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;
/// Largest binary frame of the scrollback replay.
pub const SCROLLBACK_FRAME_BYTES: usize = 32 * 1024;
/// How long one frame may wait for a client that does not read.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(10);
/// After the pane's output ended, how long its exit status may take to be
/// recorded (the pane's reader drains first).
pub const EXIT_WAIT: Duration = Duration::from_secs(5);
/// How often the exit status is looked for meanwhile.
pub const EXIT_POLL: Duration = Duration::from_millis(50);

/// What a client attached to a pane gets from the backend.
pub struct Terminal {
    pub scrollback: Vec<u8>,
    pub output: broadcast::Receiver<Arc<[u8]>>,
    /// The last plugin status report, if one is cached.
    pub status: Option<Value>,
    /// The pane's exit, once recorded.
    pub exit: Box<dyn Fn() -> Option<Value> + Send + Sync>,
}

impl std::fmt::Debug for Terminal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Terminal")
            .field("scrollback", &self.scrollback.len())
            .finish_non_exhaustive()
    }
}

/// A client's text frame.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum ClientFrame {
    Input { data: String },
    Resize { cols: u16, rows: u16 },
}

/// The subprotocols a request offers.
pub(super) fn offered_protocols(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
}

/// `Authorization: Bearer …` as the subprotocol carries it.
pub(super) fn bearer_from_protocols(headers: &HeaderMap) -> Option<String> {
    offered_protocols(headers)
        .find_map(|p| p.strip_prefix(BEARER_SUBPROTOCOL_PREFIX))
        .map(|token| format!("Bearer {token}"))
}

/// `GET /api/v1/panes/{name}/terminal`.
pub(super) async fn terminal(
    State(state): State<ApiState>,
    name: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Response {
    open(state, name, &headers, ws).unwrap_or_else(IntoResponse::into_response)
}

fn open(
    state: ApiState,
    name: Result<Path<String>, PathRejection>,
    headers: &HeaderMap,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let Ok(Path(name)) = name else {
        return Err(ApiError::bad_request("bad path: a pane name"));
    };
    if !super::auth::origin_allowed(headers, state.remote) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "untrusted_origin",
            "a terminal opens only from the dashboard the daemon serves: the `Origin` header must match `Host`",
        ));
    }
    if !offered_protocols(headers).any(|p| p == SUBPROTOCOL) {
        return Err(ApiError::bad_request(format!(
            "offer the subprotocol `{SUBPROTOCOL}` (and `{BEARER_SUBPROTOCOL_PREFIX}<token>` when a token is set)"
        )));
    }
    let attached = state.backend.terminal(&name)?;
    let ws = ws.map_err(|e| {
        ApiError::new(
            StatusCode::UPGRADE_REQUIRED,
            "upgrade_required",
            format!("this endpoint is a WebSocket: {}", e.body_text()),
        )
    })?;
    let Ok(permit) = state.terminals.clone().try_acquire_owned() else {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "too_many_terminals",
            format!("{MAX_TERMINALS} terminals are open already; close one and retry"),
        ));
    };
    let backend = state.backend.clone();
    Ok(ws
        .protocols([SUBPROTOCOL])
        .max_message_size(MAX_MESSAGE_BYTES)
        .max_frame_size(MAX_MESSAGE_BYTES)
        .on_upgrade(move |socket| async move {
            let _permit = permit;
            session(socket, attached, backend, name).await;
        }))
}

/// Send one message, or give up on a client that does not read.
async fn send(socket: &mut WebSocket, message: Message) -> bool {
    matches!(
        tokio::time::timeout(SEND_TIMEOUT, socket.send(message)).await,
        Ok(Ok(()))
    )
}

async fn close(socket: &mut WebSocket, code: u16, reason: &'static str) {
    let frame = CloseFrame {
        code,
        reason: reason.into(),
    };
    let _ = send(socket, Message::Close(Some(frame))).await;
}

fn text(value: &Value) -> Message {
    Message::Text(value.to_string().into())
}

/// What a client message asks for, or why it ends the session.
enum Asked {
    Op(PaneOp),
    Nothing,
    Close(u16, &'static str),
}

fn asked(message: Message) -> Asked {
    match message {
        Message::Binary(bytes) if bytes.len() > MAX_PANE_INPUT_BYTES => {
            Asked::Close(close_code::SIZE, "input frames carry at most 8 KiB")
        }
        Message::Binary(bytes) => Asked::Op(PaneOp::Input(bytes.to_vec())),
        Message::Text(text) => match serde_json::from_str::<ClientFrame>(text.as_str()) {
            Ok(ClientFrame::Input { data }) if data.len() > MAX_PANE_INPUT_BYTES => {
                Asked::Close(close_code::SIZE, "input frames carry at most 8 KiB")
            }
            Ok(ClientFrame::Input { data }) => Asked::Op(PaneOp::Input(data.into_bytes())),
            Ok(ClientFrame::Resize { cols, rows }) => match checked_size(PaneSize { cols, rows }) {
                Ok(size) => Asked::Op(PaneOp::Resize {
                    rows: size.rows,
                    cols: size.cols,
                }),
                Err(_) => Asked::Close(close_code::POLICY, "cols and rows are 1 to 1000"),
            },
            Err(_) => Asked::Close(
                close_code::POLICY,
                "text frames are {\"type\":\"input\"|\"resize\",...}",
            ),
        },
        Message::Close(_) => Asked::Close(close_code::NORMAL, ""),
        Message::Ping(_) | Message::Pong(_) => Asked::Nothing,
    }
}

/// Serve one client until either side ends.
async fn session(
    mut socket: WebSocket,
    terminal: Terminal,
    backend: Arc<dyn ApiBackend>,
    name: String,
) {
    let Terminal {
        scrollback,
        mut output,
        status,
        exit,
    } = terminal;
    for chunk in scrollback.chunks(SCROLLBACK_FRAME_BYTES) {
        if !send(&mut socket, Message::Binary(chunk.to_vec().into())).await {
            return;
        }
    }
    if let Some(Value::Object(mut status)) = status {
        status.insert("type".into(), json!("status"));
        if !send(&mut socket, text(&Value::Object(status))).await {
            return;
        }
    }
    loop {
        tokio::select! {
            incoming = socket.recv() => {
                let Some(Ok(message)) = incoming else { return };
                match asked(message) {
                    Asked::Op(op) => {
                        if let Err(e) = backend.pane(name.clone(), op).await {
                            tracing::debug!("terminal of pane `{name}`: {}", e.message);
                            close(&mut socket, close_code::NORMAL, "the pane is not open").await;
                            return;
                        }
                    }
                    Asked::Nothing => {}
                    Asked::Close(code, reason) => {
                        close(&mut socket, code, reason).await;
                        return;
                    }
                }
            }
            chunk = output.recv() => match chunk {
                Ok(bytes) if bytes.is_empty() => {
                    // The pane's output ended: its exit follows.
                    let deadline = tokio::time::Instant::now() + EXIT_WAIT;
                    let mut code = exit();
                    while code.is_none() && tokio::time::Instant::now() < deadline {
                        tokio::time::sleep(EXIT_POLL).await;
                        code = exit();
                    }
                    let _ = send(&mut socket, text(&json!({ "type": "exited", "exit": code }))).await;
                    close(&mut socket, close_code::NORMAL, "the pane exited").await;
                    return;
                }
                Ok(bytes) => {
                    if !send(&mut socket, Message::Binary(bytes.to_vec().into())).await {
                        return;
                    }
                }
                Err(RecvError::Lagged(_)) => {
                    close(&mut socket, close_code::AGAIN, "too slow to follow the output; reconnect").await;
                    return;
                }
                Err(RecvError::Closed) => {
                    close(&mut socket, close_code::NORMAL, "the pane closed").await;
                    return;
                }
            }
        }
    }
}
