//! The webhook listener's socket: a TCP listener on loopback (by default
//! `127.0.0.1:8765`, `daemon.webhook_listen`), or on another address only
//! when the manifest allows remote access and sets a token (checked by the
//! model; refused here again). The routes and the request gauntlet are
//! `crate::triggers::webhook`'s; this module binds and serves.

use std::net::SocketAddr;

use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error)]
pub enum WebhookListenError {
    #[error(
        "the webhook listener address `{addr}` is not a loopback address; set `daemon.allow_remote = true` and `daemon.token_env`, or listen on `127.0.0.1`"
    )]
    NotLoopback { addr: SocketAddr },
    #[error(
        "cannot listen for webhooks on `{addr}`: {source}; free the port or set `daemon.webhook_listen`"
    )]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// A bound webhook listener.
#[derive(Debug)]
pub struct WebhookSocket {
    listener: tokio::net::TcpListener,
}

impl WebhookSocket {
    /// Bind `addr`: loopback, or any address when `remote_allowed` (the
    /// manifest allows remote access and names a token).
    /// Call within a tokio runtime.
    pub fn bind(addr: SocketAddr, remote_allowed: bool) -> Result<Self, WebhookListenError> {
        let listener = super::tcp::bind(addr, remote_allowed).map_err(|e| match e {
            super::tcp::BindError::NotLoopback { addr } => WebhookListenError::NotLoopback { addr },
            super::tcp::BindError::Bind { addr, source } => {
                WebhookListenError::Bind { addr, source }
            }
        })?;
        Ok(Self { listener })
    }

    /// The address actually bound (port 0 picks a free one).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// Serve `router` until `shutdown` is cancelled (`tcp::serve`'s bounds).
    pub async fn serve(self, router: axum::Router, shutdown: CancellationToken) {
        super::tcp::serve(self.listener, router, shutdown).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_non_loopback_address_is_refused_unless_allowed() {
        let addr: SocketAddr = "192.0.2.1:9".parse().unwrap();
        assert!(matches!(
            WebhookSocket::bind(addr, false),
            Err(WebhookListenError::NotLoopback { .. })
        ));
    }
}
