//! The HTTP checks every npc server shares before a handler runs: the
//! trusted host ([`trusted_host`]: a `Host` naming this machine, which stops
//! DNS-rebinding pages), the same origin ([`same_origin`]: a request from
//! another web page never changes state, and never opens a WebSocket or an
//! MCP session), and JSON bodies ([`is_json`]). The REST API (`api`) and the
//! MCP HTTP gateway (`mcp_http`) answer a refusal each in their own words.

use axum::http::{HeaderMap, Method, header};

/// Host names (without port) the trusted-host check accepts.
pub const TRUSTED_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "[::1]"];

/// Whether `host` (a `Host` header) names this machine.
pub fn trusted_host(host: Option<&[u8]>) -> bool {
    let Some(host) = host.and_then(|h| std::str::from_utf8(h).ok()) else {
        return false;
    };
    let name = if host.starts_with('[') {
        // `[::1]` or `[::1]:8766`
        match host.find(']') {
            Some(end) if host[end + 1..].is_empty() || host[end + 1..].starts_with(':') => {
                &host[..=end]
            }
            _ => return false,
        }
    } else {
        match host.split_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
            Some(_) => return false,
            None => host,
        }
    };
    TRUSTED_HOSTS
        .iter()
        .any(|trusted| trusted.eq_ignore_ascii_case(name))
}

/// Whether `Origin` is a page the daemon served: same authority as `Host`,
/// and a loopback name unless the API is remote.
pub fn origin_allowed(headers: &HeaderMap, remote: bool) -> bool {
    let text = |name| headers.get(name).and_then(|v| v.to_str().ok());
    let (Some(origin), Some(host)) = (text(header::ORIGIN), text(header::HOST)) else {
        return false;
    };
    let Some(authority) = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
    else {
        return false;
    };
    authority.eq_ignore_ascii_case(host) && (remote || trusted_host(Some(authority.as_bytes())))
}

/// Whether a request may change state from where it comes: a browser's
/// request from another origin is refused (its `Origin`, or without one
/// its `Sec-Fetch-Site`); a client that is no browser sends neither.
pub fn same_origin(headers: &HeaderMap, remote: bool) -> bool {
    if headers.contains_key(header::ORIGIN) {
        return origin_allowed(headers, remote);
    }
    matches!(
        headers.get("sec-fetch-site").map(|v| v.as_bytes()),
        None | Some(b"same-origin" | b"none")
    )
}

/// Whether `method` changes state (every method but the safe ones).
pub fn changes_state(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// Whether the request carries a body (a length above zero, or chunks).
pub fn has_body(headers: &HeaderMap) -> bool {
    headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|n| n.trim() != "0")
}

/// Whether the request's content type is JSON.
pub fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}
