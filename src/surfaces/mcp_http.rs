//! MCP over streamable HTTP. The gateway's side (`npc mcp serve --http`):
//! rmcp's streamable HTTP service mounted at [`MCP_HTTP_PATH`]. A listener
//! binds a loopback address, or another one only with a bearer token
//! ([`Access::Token`]): nothing else can make the gateway listen beyond the
//! machine without one. With a token, every request must carry
//! `Authorization: Bearer <token>`, compared in constant time; others get 401.
//! A front may answer some of a session's POSTs itself before rmcp sees
//! them (a [`Shortcut`]: the gateway's `tools/call`, as one JSON body).
//! The pool's side: [`client_transport`], the connection to an upstream
//! HTTP server (rustls with the ring provider; headers and bearer token from
//! the manifest), and [`is_legacy_sse`], which recognises a server of the
//! deprecated HTTP+SSE transport (protocol 2024-11-05) that rmcp's client
//! no longer speaks (removed in rmcp 0.11), so npc can say so.

use std::collections::{BTreeMap, HashMap};

use std::net::SocketAddr;
use std::sync::Arc;

use rmcp::RoleClient;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{
    StreamableHttpClientTransport, StreamableHttpServerConfig, StreamableHttpService, Transport,
};
use tokio_util::sync::CancellationToken;

/// Path of the MCP endpoint.
pub const MCP_HTTP_PATH: &str = "/mcp";
/// MCP sessions one HTTP gateway serves at once. Below the daemon's cap of
/// upgraded control-socket sessions (`control::MAX_MCP_SESSIONS`), so an
/// HTTP front never takes the last places of the agents' stdio gateways.
pub const MAX_SESSIONS: usize = 32;
/// Largest request body (one JSON-RPC message or batch).
pub const MAX_REQUEST_BODY_BYTES: usize = 16 * 1024 * 1024;
const _: () = assert!(MAX_SESSIONS < super::control::MAX_MCP_SESSIONS);

/// The header naming a request's MCP session.
pub const SESSION_ID_HEADER: &str = "mcp-session-id";

#[derive(Debug, thiserror::Error)]
pub enum McpHttpError {
    #[error(
        "`{addr}` is not a loopback address; the gateway listens beyond the machine only with a bearer token (`daemon.allow_remote` and `daemon.token_env`)"
    )]
    NotLoopback { addr: SocketAddr },
    #[error("cannot listen on `{addr}`: {source}; pick another port")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("the HTTP gateway stopped: {0}")]
    Serve(std::io::Error),
    #[error("header `{name}` cannot be sent: {reason}")]
    Header { name: String, reason: String },
}

/// A client transport to the streamable HTTP MCP server at `url`, sending
/// `headers` and, when given, `Authorization: Bearer <bearer>` (rmcp's
/// client alone; the pool's sessions use [`super::mcp_link::client_link`]).
pub fn client_transport(
    url: &str,
    headers: &BTreeMap<String, String>,
    bearer: Option<String>,
) -> Result<impl Transport<RoleClient> + 'static, McpHttpError> {
    Ok(StreamableHttpClientTransport::from_config(client_config(
        url, headers, bearer,
    )?))
}

/// rmcp's client configuration for `url`, `headers` and `bearer`.
pub(super) fn client_config(
    url: &str,
    headers: &BTreeMap<String, String>,
    bearer: Option<String>,
) -> Result<StreamableHttpClientTransportConfig, McpHttpError> {
    // reqwest is built without a default TLS provider; install ring once.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut custom = HashMap::new();
    for (name, value) in headers {
        let header = |reason: String| McpHttpError::Header {
            name: name.clone(),
            reason,
        };
        let key =
            axum::http::HeaderName::try_from(name.as_str()).map_err(|e| header(e.to_string()))?;
        let value = axum::http::HeaderValue::try_from(value.as_str())
            .map_err(|_| header("its value has characters HTTP does not allow".into()))?;
        custom.insert(key, value);
    }
    let mut config = StreamableHttpClientTransportConfig::with_uri(url).custom_headers(custom);
    if let Some(token) = bearer {
        config = config.auth_header(token);
    }
    Ok(config)
}

pub use super::tcp::Access;

/// How long the legacy SSE probe waits for the server's first event.
pub const SSE_PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);
/// Most bytes of the event stream the legacy SSE probe reads.
pub const SSE_PROBE_MAX_BYTES: usize = 4096;

/// Whether `url` answers like a server of the deprecated HTTP+SSE
/// transport: a GET with `Accept: text/event-stream` opens an event stream
/// whose first event is `endpoint`. Reads at most [`SSE_PROBE_MAX_BYTES`]
/// within [`SSE_PROBE_TIMEOUT`], follows no redirect; any failure is `false`.
pub async fn is_legacy_sse(
    url: &str,
    headers: &BTreeMap<String, String>,
    bearer: Option<&str>,
) -> bool {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let probe = async {
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .ok()?;
        let mut request = client
            .get(url)
            .header(reqwest::header::ACCEPT, "text/event-stream");
        for (name, value) in headers {
            request = request.header(name.as_str(), value.as_str());
        }
        if let Some(token) = bearer {
            request = request.bearer_auth(token);
        }
        let mut response = request.send().await.ok()?;
        let event_stream = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if !response.status().is_success() || !event_stream {
            return Some(false);
        }
        let mut head = Vec::new();
        while head.len() < SSE_PROBE_MAX_BYTES && !head.windows(2).any(|w| w == b"\n\n") {
            match response.chunk().await.ok()? {
                Some(chunk) => head.extend_from_slice(&chunk),
                None => break,
            }
        }
        let head = String::from_utf8_lossy(&head);
        Some(head.lines().any(|l| {
            l.strip_prefix("event:")
                .is_some_and(|e| e.trim() == "endpoint")
        }))
    };
    matches!(
        tokio::time::timeout(SSE_PROBE_TIMEOUT, probe).await,
        Ok(Some(true))
    )
}

/// A POST a [`Shortcut`] took.
pub enum Taken {
    /// The request's reply, once it is known how to send it.
    Answer(futures_util::future::BoxFuture<'static, Reply>),
    /// A notification handled here: `202 Accepted`.
    Accepted,
}

/// How a request a [`Shortcut`] took is answered.
pub enum Reply {
    /// One JSON-RPC message, sent as one `application/json` body.
    Json(Vec<u8>),
    /// JSON-RPC messages as an event stream, one event each (what the
    /// request caused before its answer, then the answer), ending after
    /// the last.
    Stream(futures_util::stream::BoxStream<'static, Vec<u8>>),
    /// Nothing (the request was cancelled): an event stream that closes
    /// with no event, what rmcp sends for a cancelled request.
    Nothing,
}
impl std::fmt::Debug for Taken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Answer(_) => "Answer",
            Self::Accepted => "Accepted",
        })
    }
}

impl std::fmt::Debug for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Json(_) => "Json",
            Self::Stream(_) => "Stream",
            Self::Nothing => "Nothing",
        })
    }
}

/// `message` (one JSON-RPC message, with or without its line's newline)
/// as one event of an event stream.
fn event(message: &[u8]) -> axum::body::Bytes {
    let message = message.strip_suffix(b"\n").unwrap_or(message);
    let mut event = Vec::with_capacity(message.len() + 8);
    event.extend_from_slice(b"data: ");
    event.extend_from_slice(message);
    event.extend_from_slice(b"\n\n");
    event.into()
}

/// What a front answers itself of a session's POSTs before rmcp's service
/// sees them. Asked only for a POST that names a session, sends JSON,
/// accepts JSON and event streams (what rmcp requires too) and names no
/// protocol version of the per-request kind (2026-07-28 and later, which
/// rmcp serves without sessions); everything it does not take goes to
/// rmcp unchanged. The point is the connection: an answer in one JSON
/// body ends the response at once, so the client keeps its connection for
/// the next request, where an event stream is often torn down with it.
pub trait Shortcut: Send + Sync + 'static {
    /// `body`, a POST of the session `session`, if this front answers it.
    fn take(&self, session: &str, body: &[u8]) -> Option<Taken>;

    /// What to wait for before rmcp's answer to `body`, a POST of the
    /// session `session` this front did not take, reaches the client (the
    /// front learning of a session its handshake completes), if anything.
    fn settle(
        &self,
        session: &str,
        body: &[u8],
    ) -> Option<futures_util::future::BoxFuture<'static, ()>>;
}

/// Whether `request` is a POST a [`Shortcut`] may take (see its docs).
fn shortcut_may_take(request: &axum::extract::Request) -> Option<String> {
    use axum::http::{Method, header};
    let headers = request.headers();
    if request.method() != Method::POST {
        return None;
    }
    let session = headers.get(SESSION_ID_HEADER)?.to_str().ok()?;
    let is_json = super::http::is_json(headers);
    let accepts = |kind: &str| {
        headers.get_all(header::ACCEPT).iter().any(|v| {
            v.to_str().is_ok_and(|v| {
                v.split(',').any(|t| {
                    t.split(';')
                        .next()
                        .is_some_and(|t| t.trim().eq_ignore_ascii_case(kind))
                })
            })
        })
    };
    let sessionful_version = match headers.get(PROTOCOL_VERSION_HEADER) {
        None => true,
        Some(v) => v.to_str().is_ok_and(served_in_sessions),
    };
    (is_json && accepts(JSON) && accepts(EVENT_STREAM) && sessionful_version)
        .then(|| session.to_string())
}

const JSON: &str = "application/json";
const EVENT_STREAM: &str = "text/event-stream";
/// The header naming a request's protocol version.
pub const PROTOCOL_VERSION_HEADER: &str = "mcp-protocol-version";

/// The response to a POST a [`Shortcut`] took.
async fn shortcut_response(taken: Taken) -> axum::response::Response {
    use axum::http::{StatusCode, header};
    use axum::response::IntoResponse as _;
    use futures_util::StreamExt as _;
    match taken {
        Taken::Accepted => StatusCode::ACCEPTED.into_response(),
        Taken::Answer(answer) => match answer.await {
            Reply::Json(json) => ([(header::CONTENT_TYPE, JSON)], json).into_response(),
            Reply::Stream(messages) => {
                let events = messages.map(|m| Ok::<_, std::convert::Infallible>(event(&m)));
                (
                    [
                        (header::CONTENT_TYPE, EVENT_STREAM),
                        (header::CACHE_CONTROL, "no-cache"),
                    ],
                    axum::body::Body::from_stream(events),
                )
                    .into_response()
            }
            Reply::Nothing => ([(header::CONTENT_TYPE, EVENT_STREAM)], "").into_response(),
        },
    }
}

/// A bound, not yet serving, gateway listener.
#[derive(Debug)]
pub struct McpHttpListener {
    listener: tokio::net::TcpListener,
    access: Access,
}

impl McpHttpListener {
    /// Bind `addr`, which must be a loopback address.
    pub async fn bind(addr: SocketAddr) -> Result<Self, McpHttpError> {
        Self::bind_with(addr, Access::Loopback).await
    }

    /// Bind `addr` for `access`: a non-loopback address only with a token.
    pub async fn bind_with(addr: SocketAddr, access: Access) -> Result<Self, McpHttpError> {
        let listener =
            super::tcp::bind(addr, matches!(access, Access::Token(_))).map_err(|e| match e {
                super::tcp::BindError::NotLoopback { addr } => McpHttpError::NotLoopback { addr },
                super::tcp::BindError::Bind { addr, source } => McpHttpError::Bind { addr, source },
            })?;
        Ok(Self { listener, access })
    }

    /// The address actually bound (port 0 picks a free one).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// Serve one MCP service from `make` per HTTP session until `shutdown`
    /// is cancelled; `shortcut`, when given, answers what it takes first.
    pub async fn serve_with<S>(
        self,
        make: impl Fn() -> S + Send + Sync + 'static,
        shortcut: Option<Arc<dyn Shortcut>>,
        shutdown: CancellationToken,
    ) -> Result<(), McpHttpError>
    where
        S: rmcp::ServerHandler + Send + 'static,
    {
        let config =
            StreamableHttpServerConfig::default().with_cancellation_token(shutdown.child_token());
        let sessions = Arc::new(LocalSessionManager::default());
        let service = StreamableHttpService::new(move || Ok(make()), sessions.clone(), config);
        let remote = self
            .listener
            .local_addr()
            .is_ok_and(|a| !a.ip().is_loopback());
        let token: Option<Arc<str>> = match self.access {
            Access::Token(token) => Some(token),
            Access::Loopback => None,
        };
        let router = axum::Router::new()
            .nest_service(MCP_HTTP_PATH, service)
            .layer(axum::middleware::from_fn(
                move |request: axum::extract::Request, next: axum::middleware::Next| {
                    let (token, sessions) = (token.clone(), sessions.clone());
                    let shortcut = shortcut.clone();
                    async move {
                        if let Some(refused) = refusal(request.headers(), token.as_deref(), remote)
                        {
                            return refused;
                        }
                        // A new session (a request naming none) finds room,
                        // or is refused; idle ones end (rmcp's keep-alive).
                        if !request.headers().contains_key(SESSION_ID_HEADER)
                            && sessions.sessions.read().await.len() >= MAX_SESSIONS
                        {
                            return axum::response::IntoResponse::into_response((
                                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                                format!("this gateway serves {MAX_SESSIONS} MCP sessions already; close one and retry\n"),
                            ));
                        }
                        let session = shortcut.as_ref().and_then(|_| shortcut_may_take(&request));
                        let (parts, body) = request.into_parts();
                        let body = match super::http::read_body(body, MAX_REQUEST_BODY_BYTES, None).await {
                            Ok(read) => read.bytes,
                            Err(refusal) => return axum::response::IntoResponse::into_response((
                                refusal.status(),
                                refusal.message(MAX_REQUEST_BODY_BYTES) + "\n",
                            )),
                        };
                        let mut settle = None;
                        if let (Some(shortcut), Some(session)) = (&shortcut, session) {
                            if let Some(taken) = shortcut.take(&session, &body) {
                                return shortcut_response(taken).await;
                            }
                            settle = shortcut.settle(&session, &body);
                        }
                        let request = axum::extract::Request::from_parts(parts, axum::body::Body::from(body));
                        let response = next.run(request).await;
                        if let Some(settle) = settle
                            && response.status() == axum::http::StatusCode::ACCEPTED
                        {
                            settle.await;
                        }
                        response
                    }
                },
            ));
        super::tcp::serve(self.listener, router, shutdown).await;
        Ok(())
    }
}

/// Why the gateway refuses a request before MCP sees it, if it does: a
/// `Host` that does not name this machine (unless bound beyond it), an
/// `Origin` of another page (the MCP transport's rule: servers must
/// validate it), a missing or wrong bearer token.
fn refusal(
    headers: &axum::http::HeaderMap,
    token: Option<&str>,
    remote: bool,
) -> Option<axum::response::Response> {
    use axum::http::{StatusCode, header};
    use axum::response::IntoResponse as _;
    let host = headers.get(header::HOST).map(|v| v.as_bytes());
    if !remote && !super::http::trusted_host(host) {
        return Some(
            (
                StatusCode::FORBIDDEN,
                "the `Host` header must be localhost, 127.0.0.1 or [::1]\n",
            )
                .into_response(),
        );
    }
    if !super::http::same_origin(headers, remote) {
        return Some(
            (
                StatusCode::FORBIDDEN,
                "a request from another web page is refused: the `Origin` must be this gateway's\n",
            )
                .into_response(),
        );
    }
    let token = token?;
    let given = headers.get(header::AUTHORIZATION).map(|v| v.as_bytes());
    if super::tcp::bearer_matches(given, token) {
        return None;
    }
    Some(
        (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "this MCP gateway needs `Authorization: Bearer <token>`: the repository's token in `STATE_DIR/api.token`, or the one the variable `daemon.token_env` names\n",
        )
            .into_response(),
    )
}

/// Whether `version` is a protocol version rmcp knows that is served in
/// sessions (one with an `initialize`, before 2026-07-28).
pub fn served_in_sessions(version: &str) -> bool {
    rmcp::model::ProtocolVersion::KNOWN_VERSIONS
        .iter()
        .any(|known| known.as_str() == version && known.has_initialize())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_non_loopback_address_is_refused_without_a_token() {
        // Refused before any socket is bound.
        let addr: SocketAddr = "192.0.2.1:9".parse().unwrap();
        assert!(matches!(
            McpHttpListener::bind(addr).await,
            Err(McpHttpError::NotLoopback { .. })
        ));
    }
}
