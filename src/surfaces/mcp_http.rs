//! MCP over streamable HTTP. The gateway's side (`npc mcp serve --http`):
//! rmcp's streamable HTTP service mounted at [`MCP_HTTP_PATH`] on a loopback
//! listener; non-loopback addresses are refused here as well as by the
//! command, so nothing else can make the gateway listen beyond the machine.
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

use crate::mcp::Gateway;

/// Path of the MCP endpoint.
pub const MCP_HTTP_PATH: &str = "/mcp";

#[derive(Debug, thiserror::Error)]
pub enum McpHttpError {
    #[error("`{addr}` is not a loopback address; the gateway listens on 127.0.0.1 or ::1 only")]
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
}

impl McpHttpListener {
    /// Bind `addr`, which must be a loopback address.
    pub async fn bind(addr: SocketAddr) -> Result<Self, McpHttpError> {
        if !addr.ip().is_loopback() {
            return Err(McpHttpError::NotLoopback { addr });
        }
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| McpHttpError::Bind { addr, source })?;
        Ok(Self { listener })
    }

    /// The address actually bound (port 0 picks a free one).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// Serve `gateway` until `shutdown` is cancelled.
    pub async fn serve(
        self,
        gateway: Gateway,
        shutdown: CancellationToken,
    ) -> Result<(), McpHttpError> {
        let config =
            StreamableHttpServerConfig::default().with_cancellation_token(shutdown.child_token());
        let service = StreamableHttpService::new(
            move || Ok(gateway.clone()),
            Arc::new(LocalSessionManager::default()),
            config,
        );
        let router = axum::Router::new().nest_service(MCP_HTTP_PATH, service);
        axum::serve(self.listener, router)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await
            .map_err(McpHttpError::Serve)
    }
}
