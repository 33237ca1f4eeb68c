//! The one guarded TCP bind every TCP server of npc goes through (the REST
//! API, the MCP HTTP gateway, the webhook listener): a loopback address, or
//! another one only when the caller's policy allows remote access (a bearer
//! token for the API and the gateway; the manifest's `daemon.allow_remote`
//! with a token for webhooks). Also the one constant-time comparison of
//! secrets ([`constant_time_eq`], [`bearer_matches`]).

use std::net::SocketAddr;

/// Who may use a TCP server that takes a bearer token.
#[derive(Clone)]
pub enum Access {
    /// Anyone on this machine; only loopback addresses may be bound.
    Loopback,
    /// Requests carrying `Authorization: Bearer <token>`; any address.
    Token(String),
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
            .map_or(Self::Loopback, Self::Token)
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

/// Equal bytes, in time that depends only on the lengths.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// Whether `header` is `Bearer <token>`, in time independent of where they
/// differ (both sides are hashed first, so their lengths do not leak either).
pub fn bearer_matches(header: Option<&[u8]>, token: &str) -> bool {
    use sha2::{Digest as _, Sha256};
    let Some(given) = header.and_then(|h| h.strip_prefix(b"Bearer ")) else {
        return false;
    };
    constant_time_eq(&Sha256::digest(given), &Sha256::digest(token.as_bytes()))
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
