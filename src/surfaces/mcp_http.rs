//! The gateway over streamable HTTP (`npc mcp serve --http`): rmcp's
//! streamable HTTP service mounted at [`MCP_HTTP_PATH`] on a loopback
//! listener. Non-loopback addresses are refused here as well as by the
//! command, so nothing else can make the gateway listen beyond the machine.

use std::net::SocketAddr;
use std::sync::Arc;

use rmcp::transport::StreamableHttpServerConfig;
use rmcp::transport::StreamableHttpService;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
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
