//! The HTTP checks every npc server shares before a handler runs: the
//! trusted host ([`trusted_host`]: a `Host` naming this machine, which stops
//! DNS-rebinding pages), the same origin ([`same_origin`]: a request from
//! another web page never changes state, and never opens a WebSocket or an
//! MCP session), and JSON bodies ([`is_json`]). The REST API (`api`) and the
//! MCP HTTP gateway (`mcp_http`) answer a refusal each in their own words.

use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, Method, StatusCode, header};

/// Longest a client may take to send a request's whole body.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

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

/// Why a body was not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyRefusal {
    /// Longer than the limit.
    TooLarge,
    /// Not sent within [`BODY_READ_TIMEOUT`].
    TooSlow,
    /// The listener's budget of bodies in flight is spent: retry later.
    Busy,
    /// The client broke the body off.
    Broken,
}

impl BodyRefusal {
    pub fn status(self) -> StatusCode {
        match self {
            Self::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::TooSlow => StatusCode::REQUEST_TIMEOUT,
            Self::Busy => StatusCode::SERVICE_UNAVAILABLE,
            Self::Broken => StatusCode::BAD_REQUEST,
        }
    }

    /// What the refusal says, for the client.
    pub fn message(self, limit: usize) -> String {
        match self {
            Self::TooLarge => format!("the body is larger than {limit} bytes"),
            Self::TooSlow => format!(
                "the body did not arrive within {}s",
                BODY_READ_TIMEOUT.as_secs()
            ),
            Self::Busy => "too many request bodies are being read at once; retry".to_string(),
            Self::Broken => "the body was broken off".to_string(),
        }
    }
}

/// A body read whole, and what it holds of a budget until dropped.
#[derive(Debug)]
pub struct ReadBody {
    pub bytes: axum::body::Bytes,
    _held: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// Read `body` whole: at most `limit` bytes, within [`BODY_READ_TIMEOUT`],
/// and — when a `budget` of bytes is given (bodies read before their
/// sender is known) — each chunk charged to it as it arrives, refused when
/// it is spent, and held until the returned body is dropped.
pub async fn read_body(
    body: Body,
    limit: usize,
    budget: Option<&std::sync::Arc<tokio::sync::Semaphore>>,
) -> Result<ReadBody, BodyRefusal> {
    use http_body_util::BodyExt as _;
    let read = async {
        let mut body = body;
        let mut bytes = Vec::new();
        let mut held: Option<tokio::sync::OwnedSemaphorePermit> = None;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|_| BodyRefusal::Broken)?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            if bytes.len() + data.len() > limit {
                return Err(BodyRefusal::TooLarge);
            }
            if let Some(budget) = budget
                && !data.is_empty()
            {
                let n = u32::try_from(data.len()).map_err(|_| BodyRefusal::TooLarge)?;
                let permit = budget
                    .clone()
                    .try_acquire_many_owned(n)
                    .map_err(|_| BodyRefusal::Busy)?;
                match &mut held {
                    Some(h) => h.merge(permit),
                    None => held = Some(permit),
                }
            }
            bytes.extend_from_slice(&data);
        }
        Ok(ReadBody {
            bytes: bytes.into(),
            _held: held,
        })
    };
    tokio::time::timeout(BODY_READ_TIMEOUT, read)
        .await
        .unwrap_or(Err(BodyRefusal::TooSlow))
}

/// `request` with its body read whole (see [`read_body`], no budget), so a
/// handler never waits on a slow client.
pub async fn buffer_body(request: Request, limit: usize) -> Result<Request, BodyRefusal> {
    let (parts, body) = request.into_parts();
    let read = read_body(body, limit, None).await?;
    Ok(Request::from_parts(parts, Body::from(read.bytes)))
}
