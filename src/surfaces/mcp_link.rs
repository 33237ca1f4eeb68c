//! The lean side of a session with a streamable HTTP MCP server: what the
//! pool posts itself, next to rmcp's client, on the same session.
//!
//! rmcp's client opens a new TCP connection for every request (its reqwest
//! client keeps no idle connection, to stay clear of bodies it leaves
//! unread) and passes each message through its worker task. A `tools/call`
//! is the request the pool sends over and over, so [`client_link`] gives
//! the pool both rmcp's transport, for the handshake and everything else,
//! and an [`HttpLink`] that posts on a pooled client of its own, in the
//! caller's task, and reads every response to its end so the connection
//! goes back to the pool. The link learns the session rmcp made (its id, the
//! protocol headers, the bearer token) from the requests rmcp sends
//! ([`Recording`]), and posts only once there is one, and only for
//! protocol versions served in sessions (before 2026-07-28); otherwise
//! [`PostError::NoSession`] says to go through rmcp.
//!
//! Bounds: a JSON body or one event of an event stream is at most
//! [`MAX_MESSAGE_BYTES`]; what is left of a stream after its answer is read
//! for at most [`DRAIN_TIMEOUT`] and [`MAX_DRAIN_BYTES`], then dropped with
//! its connection. Redirects are not followed.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt as _;
use futures_util::stream::BoxStream;
use rmcp::model::ClientJsonRpcMessage;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
    StreamableHttpResponseLimits,
};

use super::mcp_http::{
    McpHttpError, PROTOCOL_VERSION_HEADER, SESSION_ID_HEADER, served_in_sessions,
};

/// Largest JSON body, or event of an event stream, the link reads.
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;
/// How long what follows an answer on its stream is read, so that the
/// connection can be kept.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(1);
/// Most bytes read after an answer on its stream.
pub const MAX_DRAIN_BYTES: usize = 64 * 1024;
type Headers = HashMap<axum::http::HeaderName, axum::http::HeaderValue>;

/// The session rmcp's client made, as its requests show it: whether it is
/// of a version served in sessions, and the headers of a post in it
/// (session, protocol headers, bearer token, media types), built once.
#[derive(Debug)]
struct Posting {
    sessionful: bool,
    headers: reqwest::header::HeaderMap,
}

type Seen = Arc<Mutex<Option<Arc<Posting>>>>;

/// rmcp's reqwest client, noting the session each of its requests names.
/// rmcp's worker posts through `post_message_with_response_limits` and
/// opens streams through `get_stream_with_max_sse_event_size`, so those
/// keep reqwest's limits; the trait's other provided methods reach these.
#[derive(Debug, Clone)]
pub struct Recording {
    inner: reqwest::Client,
    seen: Seen,
}

impl Recording {
    fn note(&self, session: Option<&Arc<str>>, headers: &Headers, bearer: Option<&String>) {
        use reqwest::header::{self, HeaderValue};
        let Some(session) = session else { return };
        let Ok(session) = HeaderValue::from_str(session) else {
            return;
        };
        let sessionful = headers
            .iter()
            .find(|(name, _)| name.as_str().eq_ignore_ascii_case(PROTOCOL_VERSION_HEADER))
            .and_then(|(_, v)| v.to_str().ok())
            .is_some_and(served_in_sessions);
        let mut map = header::HeaderMap::with_capacity(headers.len() + 4);
        map.insert(
            header::ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        map.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        map.insert(SESSION_ID_HEADER, session);
        for (name, value) in headers {
            map.insert(name.clone(), value.clone());
        }
        if let Some(token) = bearer
            && let Ok(mut value) = HeaderValue::from_str(&format!("Bearer {token}"))
        {
            value.set_sensitive(true);
            map.insert(header::AUTHORIZATION, value);
        }
        let posting = Posting {
            sessionful,
            headers: map,
        };
        *self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Arc::new(posting));
    }
}

impl StreamableHttpClient for Recording {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: Headers,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        self.note(session_id.as_ref(), &custom_headers, auth_header.as_ref());
        self.inner
            .post_message(uri, message, session_id, auth_header, custom_headers)
            .await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: Headers,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        self.note(session_id.as_ref(), &custom_headers, auth_header.as_ref());
        self.inner
            .post_message_with_response_limits(
                uri,
                message,
                session_id,
                auth_header,
                custom_headers,
                limits,
            )
            .await
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: Headers,
    ) -> Result<(), StreamableHttpError<Self::Error>> {
        self.inner
            .delete_session(uri, session_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: Headers,
    ) -> Result<
        BoxStream<'static, Result<sse_stream::Sse, SseError>>,
        StreamableHttpError<Self::Error>,
    > {
        self.inner
            .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: Headers,
        max_sse_event_size: usize,
    ) -> Result<
        BoxStream<'static, Result<sse_stream::Sse, SseError>>,
        StreamableHttpError<Self::Error>,
    > {
        self.inner
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await
    }
}

/// Why a post of the link failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PostError {
    /// No session to post in yet, or one of a version without sessions:
    /// send through rmcp instead.
    #[error("no session to post in")]
    NoSession,
    /// The server no longer knows the session (404).
    #[error("the server ended the session (HTTP 404); it is started again")]
    Expired,
    #[error("the server answered HTTP {0}")]
    Status(u16),
    #[error("the server answered with `{0}`, neither JSON nor an event stream")]
    ContentType(String),
    #[error("the server sent a message over {MAX_MESSAGE_BYTES} bytes")]
    TooLarge,
    #[error("the server's response ended before its answer")]
    Unanswered,
    #[error("{0}")]
    Transport(String),
}

/// What became of a post.
#[derive(Debug, PartialEq, Eq)]
pub enum Posted {
    /// The server took it without answering (`202 Accepted`).
    Accepted,
    /// The handler saw the answer.
    Answered,
}

/// The lean side of one session (see the module docs); cheap to clone.
#[derive(Clone)]
pub struct HttpLink {
    client: reqwest::Client,
    /// Parsed once (`None`: not a URL reqwest takes; rmcp reports it).
    url: Option<reqwest::Url>,
    seen: Seen,
}

impl std::fmt::Debug for HttpLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpLink").field("url", &self.url).finish()
    }
}

/// rmcp's transport to the streamable HTTP MCP server at `url` (sending
/// `headers` and, when given, `Authorization: Bearer <bearer>`), and the
/// lean link on the session it makes.
pub fn client_link(
    url: &str,
    headers: &BTreeMap<String, String>,
    bearer: Option<String>,
) -> Result<(StreamableHttpClientTransport<Recording>, HttpLink), McpHttpError> {
    let config = super::mcp_http::client_config(url, headers, bearer)?;
    let build = |pooled: bool| {
        let mut builder = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none());
        if !pooled {
            builder = builder.pool_max_idle_per_host(0);
        }
        builder.build().map_err(|e| McpHttpError::Header {
            name: "(client)".into(),
            reason: e.to_string(),
        })
    };
    let seen = Seen::default();
    let recording = Recording {
        inner: build(false)?,
        seen: seen.clone(),
    };
    let link = HttpLink {
        client: build(true)?,
        url: reqwest::Url::parse(url).ok(),
        seen,
    };
    Ok((
        StreamableHttpClientTransport::with_client(recording, config),
        link,
    ))
}

impl HttpLink {
    /// The session to post in, when there is one of a session version.
    fn posting(&self) -> Option<Arc<Posting>> {
        let posting = self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()?;
        posting.sessionful.then_some(posting)
    }

    /// Post `body` (one JSON-RPC message) in the session. Every message the
    /// response carries goes to `each` in order, until `each` says it was the
    /// answer (`true`); a response without one is [`PostError::Unanswered`],
    /// unless the server accepted the post without answering.
    pub async fn post(
        &self,
        body: Vec<u8>,
        mut each: impl FnMut(&[u8]) -> bool,
    ) -> Result<Posted, PostError> {
        use reqwest::header;
        let posting = self.posting().ok_or(PostError::NoSession)?;
        let url = self.url.clone().ok_or(PostError::NoSession)?;
        let request = self
            .client
            .post(url)
            .headers(posting.headers.clone())
            .body(body);
        let transport = |e: reqwest::Error| PostError::Transport(e.to_string());
        let mut response = request.send().await.map_err(transport)?;
        let status = response.status();
        if status == reqwest::StatusCode::ACCEPTED || status == reqwest::StatusCode::NO_CONTENT {
            return Ok(Posted::Accepted);
        }
        if status == reqwest::StatusCode::NOT_FOUND {
            return Err(PostError::Expired);
        }
        if !status.is_success() {
            return Err(PostError::Status(status.as_u16()));
        }
        let kind = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .map(|v| v.trim().to_ascii_lowercase())
            .unwrap_or_default();
        match kind.as_str() {
            "application/json" => {
                let mut bytes = Vec::new();
                while let Some(chunk) = response.chunk().await.map_err(transport)? {
                    if bytes.len() + chunk.len() > MAX_MESSAGE_BYTES {
                        return Err(PostError::TooLarge);
                    }
                    bytes.extend_from_slice(&chunk);
                }
                if each(&bytes) {
                    Ok(Posted::Answered)
                } else {
                    Err(PostError::Unanswered)
                }
            }
            "text/event-stream" => {
                let mut events = Events::default();
                while let Some(chunk) = response.chunk().await.map_err(transport)? {
                    if events.feed(&chunk, &mut each)? {
                        drain(response);
                        return Ok(Posted::Answered);
                    }
                }
                Err(PostError::Unanswered)
            }
            other => Err(PostError::ContentType(other.to_string())),
        }
    }
}

/// Read what is left of `response` so its connection can be kept: at once
/// when it already ended (the usual case: the stream closes right after
/// its answer), else in a task within [`DRAIN_TIMEOUT`] and [`MAX_DRAIN_BYTES`].
fn drain(mut response: reqwest::Response) {
    let mut read = 0;
    loop {
        match response.chunk().now_or_never() {
            Some(Ok(Some(chunk))) => {
                read += chunk.len();
                if read > MAX_DRAIN_BYTES {
                    return;
                }
            }
            Some(Ok(None) | Err(_)) => return,
            None => break,
        }
    }
    tokio::spawn(async move {
        let _ = tokio::time::timeout(DRAIN_TIMEOUT, async {
            while let Ok(Some(chunk)) = response.chunk().await {
                read += chunk.len();
                if read > MAX_DRAIN_BYTES {
                    return;
                }
            }
        })
        .await;
    });
}

/// An event stream's messages, from its chunks: the `data` of each event
/// (its non-empty `data:` lines joined by newlines); other fields and
/// comments are skipped, events without data too (a server's priming events). Lines end
/// with `\n` or `\r\n`.
#[derive(Debug, Default)]
struct Events {
    /// The line not yet ended.
    line: Vec<u8>,
    /// The data of the event not yet ended (empty data lines add nothing).
    data: Vec<u8>,
}

impl Events {
    /// Feed `chunk`; `each` gets every complete event's data and says
    /// whether it was the answer; `true` once it was (the rest of `chunk`
    /// is left unread).
    fn feed(
        &mut self,
        chunk: &[u8],
        each: &mut impl FnMut(&[u8]) -> bool,
    ) -> Result<bool, PostError> {
        let mut rest = chunk;
        while let Some(end) = rest.iter().position(|&b| b == b'\n') {
            if self.line.len() + end > MAX_MESSAGE_BYTES {
                return Err(PostError::TooLarge);
            }
            self.line.extend_from_slice(&rest[..end]);
            rest = &rest[end + 1..];
            if self.line.last() == Some(&b'\r') {
                self.line.pop();
            }
            let line = std::mem::take(&mut self.line);
            if line.is_empty() {
                let data = std::mem::take(&mut self.data);
                if !data.is_empty() && each(&data) {
                    return Ok(true);
                }
                continue;
            }
            if let Some(value) = line.strip_prefix(b"data") {
                let value = match value {
                    [] => value,
                    [b':', b' ', rest @ ..] | [b':', rest @ ..] => rest,
                    // A field named otherwise (`datax:`).
                    _ => continue,
                };
                if self.data.len() + value.len() + 1 > MAX_MESSAGE_BYTES {
                    return Err(PostError::TooLarge);
                }
                if !self.data.is_empty() {
                    self.data.push(b'\n');
                }
                self.data.extend_from_slice(value);
            }
            // Keep the line's buffer for the next one.
            self.line = line;
            self.line.clear();
        }
        if self.line.len() + rest.len() > MAX_MESSAGE_BYTES {
            return Err(PostError::TooLarge);
        }
        self.line.extend_from_slice(rest);
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(chunks: &[&[u8]]) -> Result<Vec<String>, PostError> {
        let mut events = Events::default();
        let mut seen = Vec::new();
        for chunk in chunks {
            events.feed(chunk, &mut |data| {
                seen.push(String::from_utf8_lossy(data).into_owned());
                false
            })?;
        }
        Ok(seen)
    }

    #[test]
    fn events_are_read_across_chunks_and_line_endings() {
        let seen = events(&[
            b"id: 0\nretry: 3000\ndata: \n\n",
            b": a comment\r\nevent: message\r\ndata: {\"a\":",
            b"1}\r\n\r\ndata: one\ndata: two\n",
            b"\n",
            b"datax: not data\n\ndata:tight\n\n",
        ])
        .unwrap();
        assert_eq!(seen, ["{\"a\":1}", "one\ntwo", "tight"]);
    }

    #[test]
    fn the_answer_stops_the_reading() {
        let mut events = Events::default();
        let mut seen = 0;
        let answered = events
            .feed(b"data: a\n\ndata: b\n\ndata: c\n\n", &mut |data| {
                seen += 1;
                data == b"b"
            })
            .unwrap();
        assert!(answered);
        assert_eq!(seen, 2);
    }

    #[test]
    fn an_oversized_line_or_event_is_refused_at_the_bound() {
        let mut events = Events::default();
        let big = vec![b'x'; MAX_MESSAGE_BYTES];
        assert_eq!(
            events
                .feed(&big, &mut |_| false)
                .and(events.feed(b"y", &mut |_| false)),
            Err(PostError::TooLarge)
        );
        let mut events = Events::default();
        let half = vec![b'x'; MAX_MESSAGE_BYTES / 2 + 1];
        let mut line = b"data: ".to_vec();
        line.extend_from_slice(&half);
        line.push(b'\n');
        assert_eq!(events.feed(&line, &mut |_| false), Ok(false));
        assert_eq!(events.feed(&line, &mut |_| false), Err(PostError::TooLarge));
    }
}
