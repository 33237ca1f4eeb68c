//! The one guarded TCP bind every TCP server of npc goes through (the REST
//! API, the MCP HTTP gateway, the webhook listener): a loopback address, or
//! another one only when the caller's policy allows remote access (a bearer
//! token for the API and the gateway; the manifest's `daemon.allow_remote`
//! with a token for webhooks); and the one guarded serve loop ([`serve`]):
//! at most [`MAX_CONNECTIONS`] connections at once (one more is closed at
//! once, so a flood costs that listener, never the daemon's descriptors),
//! a request's headers — and on a kept-alive connection the next request —
//! within [`HEADER_READ_TIMEOUT`], accept errors backed off. Also the one
//! constant-time comparison of secrets ([`constant_time_eq`],
//! [`bearer_matches`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// Connections one listener serves at once.
pub const MAX_CONNECTIONS: usize = 256;
/// Longest a connection may take to send a request's headers, and to start
/// its next request when kept alive (then it is closed).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a stopping listener waits for its connections to finish.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);
/// The first pause after a failed `accept` (out of descriptors), doubling.
pub const ACCEPT_BACKOFF_INITIAL: Duration = Duration::from_millis(10);
/// The longest pause after failed `accept`s.
pub const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Who may use a TCP server that takes a bearer token.
#[derive(Clone)]
pub enum Access {
    /// Anyone on this machine; only loopback addresses may be bound.
    Loopback,
    /// Requests carrying `Authorization: Bearer <token>`; any address.
    /// Shared: every request's check reads it, none copies it.
    Token(Arc<str>),
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Loopback => f.write_str("Loopback"),
            Self::Token(_) => f.write_str("Token(<redacted>)"),
        }
    }
}

impl Access {
    /// The access the daemon's settings ask for: a token when
    /// `token_env` names a variable holding a non-empty value.
    pub fn from_token_env(token_env: Option<&str>) -> Self {
        token_env
            .and_then(|var| std::env::var(var).ok())
            .filter(|t| !t.is_empty())
            .map_or(Self::Loopback, |t| Self::Token(t.into()))
    }

    /// Whether a listener on `addr` may serve under this access: beyond
    /// loopback only with a token.
    pub fn allows(&self, addr: SocketAddr) -> bool {
        addr.ip().is_loopback() || matches!(self, Self::Token(_))
    }
}

/// Why [`bind`] bound nothing.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("`{addr}` is not a loopback address")]
    NotLoopback { addr: SocketAddr },
    #[error("cannot listen on `{addr}`: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// Bind `addr`: a loopback address, or any address when `remote_allowed`.
/// Call within a tokio runtime.
pub fn bind(addr: SocketAddr, remote_allowed: bool) -> Result<tokio::net::TcpListener, BindError> {
    if !addr.ip().is_loopback() && !remote_allowed {
        return Err(BindError::NotLoopback { addr });
    }
    let bind_error = |source| BindError::Bind { addr, source };
    let listener = std::net::TcpListener::bind(addr).map_err(bind_error)?;
    listener.set_nonblocking(true).map_err(bind_error)?;
    tokio::net::TcpListener::from_std(listener).map_err(bind_error)
}

/// Serve `router` on `listener` until `shutdown` is cancelled, within
/// [`MAX_CONNECTIONS`] and [`HEADER_READ_TIMEOUT`]; WebSocket upgrades
/// work; each connection's answers go out at once (`TCP_NODELAY`).
/// Connections still open at shutdown get [`SHUTDOWN_GRACE`].
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    shutdown: CancellationToken,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut backoff = ACCEPT_BACKOFF_INITIAL;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shutdown.cancelled() => return,
        };
        let stream = match accepted {
            Ok((stream, _)) => {
                backoff = ACCEPT_BACKOFF_INITIAL;
                // Answers are whole messages: send each at once, not after
                // the peer's delayed acknowledgement of the last.
                let _ = stream.set_nodelay(true);
                stream
            }
            Err(e) => {
                tracing::warn!("accept failed: {e}; pausing {backoff:?}");
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    () = shutdown.cancelled() => return,
                }
                backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                continue;
            }
        };
        // Full: this one is closed now, so it holds no descriptor.
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            drop(stream);
            continue;
        };
        let (router, shutdown) = (router.clone(), shutdown.clone());
        tokio::spawn(async move {
            let _slot = slot;
            let service = hyper_util::service::TowerToHyperService::new(router);
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .with_upgrades();
            tokio::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                () = shutdown.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(SHUTDOWN_GRACE, connection).await;
                }
            }
        });
    }
}

/// Equal bytes, in time that depends only on the lengths.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// Whether `header` is `Bearer <token>`, in time independent of where they
/// differ ([`constant_time_eq`]; only a length mismatch answers early, and a
/// token's length is no secret: the repository's are 64 hex digits).
pub fn bearer_matches(header: Option<&[u8]>, token: &str) -> bool {
    header
        .and_then(|h| h.strip_prefix(b"Bearer "))
        .is_some_and(|given| constant_time_eq(given, token.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_match_exactly() {
        assert!(bearer_matches(Some(b"Bearer s3cret"), "s3cret"));
        assert!(!bearer_matches(Some(b"Bearer s3cre"), "s3cret"));
        assert!(!bearer_matches(Some(b"Bearer s3cretx"), "s3cret"));
        assert!(!bearer_matches(Some(b"bearer s3cret"), "s3cret"));
        assert!(!bearer_matches(Some(b"s3cret"), "s3cret"));
        assert!(!bearer_matches(None, "s3cret"));
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }

    #[tokio::test]
    async fn only_loopback_binds_unless_remote_is_allowed() {
        let lo: SocketAddr = "127.0.0.1:0".parse().unwrap();
        assert!(bind(lo, false).is_ok());
        let any: SocketAddr = "0.0.0.0:0".parse().unwrap();
        assert!(matches!(
            bind(any, false),
            Err(BindError::NotLoopback { .. })
        ));
        assert!(!Access::Loopback.allows(any));
        assert!(Access::Token("t".into()).allows(any));
    }
}
