//! MCP over streamable HTTP. The gateway's side (`npc mcp serve --http`):
//! rmcp's streamable HTTP service mounted at [`MCP_HTTP_PATH`]. A listener
//! binds a loopback address, or another one only with a bearer token
//! ([`Access::Token`]): nothing else can make the gateway listen beyond the
//! machine without one. With a token, every request must carry
//! `Authorization: Bearer <token>`, compared in constant time; others get 401.
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
/// `headers` and, when given, `Authorization: Bearer <bearer>`.
pub fn client_transport(
    url: &str,
    headers: &BTreeMap<String, String>,
    bearer: Option<String>,
) -> Result<impl Transport<RoleClient> + 'static, McpHttpError> {
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
    Ok(StreamableHttpClientTransport::from_config(config))
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
    /// is cancelled.
    pub async fn serve_with<S>(
        self,
        make: impl Fn() -> S + Send + Sync + 'static,
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
                        match super::http::buffer_body(request, MAX_REQUEST_BODY_BYTES).await {
                            Ok(request) => next.run(request).await,
                            Err(refusal) => axum::response::IntoResponse::into_response((
                                refusal.status(),
                                refusal.message(MAX_REQUEST_BODY_BYTES) + "\n",
                            )),
                        }
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
