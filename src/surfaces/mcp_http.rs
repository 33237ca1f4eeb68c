//! MCP over streamable HTTP. The gateway's side (`npc mcp serve --http`):
//! rmcp's streamable HTTP service mounted at [`MCP_HTTP_PATH`] on a loopback
//! listener; non-loopback addresses are refused here as well as by the
//! command, so nothing else can make the gateway listen beyond the machine.
//! The pool's side: [`client_transport`], the connection to an upstream
//! HTTP server (rustls with the ring provider; headers and bearer token from
//! the manifest).

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
