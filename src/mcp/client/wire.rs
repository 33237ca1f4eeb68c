//! The client side of a session with a stdio upstream, lean where it
//! counts. `tools/call` is the request the pool sends over and over, so it
//! goes straight onto the server's stdin as one line, and its answer comes
//! straight back from the server's stdout to the waiting call: decoded once
//! (the envelope, then the result as a [`CallToolResult`]), with no task,
//! channel hop or untagged-enum decode in between. Everything else (the
//! handshake, lists, notifications, the server's own requests, answers to
//! rmcp's requests, lines that are not JSON) passes through an in-process
//! pipe to rmcp's client, which keeps doing what it did on the raw pipes.
//!
//! The wire's calls carry string ids `npc-N`; rmcp numbers its own, so the
//! two never collide, and an answer is the wire's only when its id is
//! exactly one of those. A frame longer than [`MAX_FRAME_BYTES`], the end
//! of the server's stdout, or the end of rmcp's session closes the wire:
//! every call waiting gets [`Failure::Lost`] with the reason, rmcp sees the
//! end of its input, and the server's stdin is closed. A call dropped before
//! its answer (a timeout, a client that went away) is forgotten and the
//! server is told with `notifications/cancelled`, as rmcp does.
//!
//! A server of protocol 2026-07-28 or later has no session: every request
//! carries the version, npc's client info and capabilities in its `_meta`
//! ([`Envelope`]), which the wire adds to its calls once rmcp's handshake
//! found such a server ([`Wire::speak`]). rmcp's ends of the pipe are
//! [`Lent`]: a handshake that fails (a server that refuses `initialize`)
//! gives them back, so the next one runs on the same process.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rmcp::ErrorData;
use rmcp::model::{
    CallToolResult, JsonObject, ProgressNotificationParam, ProgressToken, RequestMetaObject,
};
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::io::{
    AsyncBufReadExt as _, AsyncRead, AsyncWrite, AsyncWriteExt as _, BufReader, DuplexStream,
    ReadHalf, WriteHalf,
};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::mcp::MAX_FRAME_BYTES;
use crate::mcp::lock;
use crate::mcp::passthrough::{INPUT_REQUIRED, Passthrough};
use crate::stdx::lines::{Line, LineReader, Overlong, Splitter, encode};

/// Prefix of the ids of the wire's own requests.
const ID_PREFIX: &str = "npc-";
/// Buffer of the in-process pipe to and from rmcp's client.
const PIPE_BYTES: usize = 256 * 1024;

/// rmcp's ends of the in-process pipe: what it reads from the server, and
/// where it writes to the server.
pub type RmcpSide = (ReadHalf<DuplexStream>, WriteHalf<DuplexStream>);

/// One end of a pipe, lent to one user at a time: each holds a clone, and
/// the end closes once the last clone is gone. rmcp's ends of the wire's
/// pipe are lent to a handshake attempt, so one that fails leaves them to
/// the next attempt.
pub struct Lent<T>(Arc<Mutex<T>>);

impl<T> Lent<T> {
    pub fn new(end: T) -> Self {
        Self(Arc::new(Mutex::new(end)))
    }
}

impl<T> std::fmt::Debug for Lent<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Lent")
    }
}

impl<T> Clone for Lent<T> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Lent<T> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut *lock(&self.0)).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Lent<T> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut *lock(&self.0)).poll_write(cx, buf)
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut *lock(&self.0)).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut *lock(&self.0)).poll_shutdown(cx)
    }
}

/// How a request on the wire failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Failure {
    /// The server answered with a JSON-RPC error; the session is fine.
    #[error("{}", .0.message)]
    Answer(ErrorData),
    /// The session is gone (or the answer made no sense); the reason says why.
    #[error("{0}")]
    Lost(String),
}

impl From<rmcp::ServiceError> for Failure {
    fn from(e: rmcp::ServiceError) -> Self {
        match e {
            rmcp::ServiceError::McpError(e) => Self::Answer(e),
            e => Self::Lost(e.to_string()),
        }
    }
}

pub(super) type Answer = Result<CallToolResult, Failure>;
type Stdin = Box<dyn AsyncWrite + Send + Unpin>;

/// Calls waiting for their answer, and why the wire closed (once it did).
#[derive(Default)]
struct Pending {
    calls: HashMap<u64, oneshot::Sender<Answer>>,
    closed: Option<String>,
}

/// What the wire's handle and its two pump tasks share.
struct Shared {
    /// The server's stdin; `None` once the wire closed it.
    stdin: tokio::sync::Mutex<Option<Stdin>>,
    pending: Mutex<Pending>,
    closed: CancellationToken,
}

impl Shared {
    /// Write one whole frame to the server (frames never interleave).
    async fn write(&self, frame: &[u8]) -> Result<(), String> {
        let mut stdin = self.stdin.lock().await;
        let Some(w) = stdin.as_mut() else {
            return Err("its session was closed".into());
        };
        let written = match w.write_all(frame).await {
            Ok(()) => w.flush().await,
            Err(e) => Err(e),
        };
        written.map_err(|e| format!("writing to its standard input failed: {e}"))
    }

    /// Close the wire: every waiting call gets `reason`.
    fn close(&self, reason: &str) {
        let calls = {
            let mut pending = lock(&self.pending);
            pending.closed.get_or_insert_with(|| reason.to_string());
            std::mem::take(&mut pending.calls)
        };
        self.closed.cancel();
        for (_, call) in calls {
            let _ = call.send(Err(Failure::Lost(reason.to_string())));
        }
    }

    /// Hand `answer` to call `n`, if it still waits.
    fn deliver(&self, n: u64, answer: Answer) {
        if let Some(call) = lock(&self.pending).calls.remove(&n) {
            let _ = call.send(answer);
        }
    }
}

/// The `_meta` a request of a sessionless protocol version (2026-07-28 and
/// later) carries: the version, the client's info and its capabilities,
/// each encoded once.
#[derive(Debug)]
pub struct Envelope(Vec<(String, Box<RawValue>)>);

impl Envelope {
    /// The entries of `meta`, encoded.
    pub fn new(meta: &RequestMetaObject) -> Result<Self, serde_json::Error> {
        meta.iter()
            .map(|(key, value)| Ok((key.clone(), serde_json::value::to_raw_value(value)?)))
            .collect::<Result<_, _>>()
            .map(Self)
    }
}

/// The lean side of one upstream session (see the module docs).
pub struct Wire {
    shared: Arc<Shared>,
    next: AtomicU64,
    /// Set once the session turned out to be of a sessionless version.
    envelope: std::sync::OnceLock<Envelope>,
}

impl std::fmt::Debug for Wire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wire")
            .field("closed", &self.shared.closed.is_cancelled())
            .finish_non_exhaustive()
    }
}

impl Wire {
    /// Start the wire on the server's `stdout`/`stdin`; returns it and the
    /// pipe ends to give rmcp's client as its transport. Spawns the two
    /// pumps on the current runtime; they end when the wire closes. The
    /// progress of the wire's calls goes to `progress` as it is read, so it
    /// reaches the caller before the call's answer.
    pub fn start<R, W>(stdout: R, stdin: W, progress: Option<Passthrough>) -> (Self, RmcpSide)
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let shared = Arc::new(Shared {
            stdin: tokio::sync::Mutex::new(Some(Box::new(stdin))),
            pending: Mutex::default(),
            closed: CancellationToken::new(),
        });
        let (ours, theirs) = tokio::io::duplex(PIPE_BYTES);
        let (from_rmcp, to_rmcp) = tokio::io::split(ours);
        tokio::spawn(inbound(stdout, to_rmcp, shared.clone(), progress));
        tokio::spawn(outbound(from_rmcp, shared.clone()));
        let wire = Self {
            shared,
            next: AtomicU64::new(1),
            envelope: std::sync::OnceLock::new(),
        };
        (wire, tokio::io::split(theirs))
    }

    /// The session is of a sessionless version: every call carries
    /// `envelope` from now on.
    pub fn speak(&self, envelope: Envelope) {
        let _ = self.envelope.set(envelope);
    }

    /// Call `name` with `arguments` and wait for the answer (the caller
    /// bounds the wait; dropping the future forgets the call and tells the
    /// server); `progress` is the token the server reports progress under.
    pub async fn call_tool(
        &self,
        name: &str,
        arguments: Option<&JsonObject>,
        progress: Option<&ProgressToken>,
    ) -> Answer {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let frame = call_frame(n, name, arguments, progress, self.envelope.get())
            .map_err(|e| Failure::Lost(format!("the call did not serialize: {e}")))?;
        let (answered, answer) = oneshot::channel();
        {
            // Checked under the lock that `close` drains, so no call
            // registers after the wire closed.
            let mut pending = lock(&self.shared.pending);
            if let Some(reason) = &pending.closed {
                return Err(Failure::Lost(reason.clone()));
            }
            pending.calls.insert(n, answered);
        }
        let mut waiting = Waiting {
            shared: &self.shared,
            n,
            sent: false,
        };
        self.shared.write(&frame).await.map_err(Failure::Lost)?;
        waiting.sent = true;
        answer
            .await
            .unwrap_or_else(|_| Err(Failure::Lost("its session was closed".into())))
    }
}

/// A call on its way: forgotten when dropped unanswered, and the server
/// told once the request was sent.
struct Waiting<'a> {
    shared: &'a Arc<Shared>,
    n: u64,
    sent: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let forgotten = lock(&self.shared.pending).calls.remove(&self.n).is_some();
        if forgotten
            && self.sent
            && !self.shared.closed.is_cancelled()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let shared = self.shared.clone();
            let frame = cancelled_frame(self.n);
            runtime.spawn(async move {
                let _ = shared.write(&frame).await;
            });
        }
    }
}

/// `id` of the wire's request `n`.
pub(super) fn id_of(n: u64) -> String {
    format!("{ID_PREFIX}{n}")
}

/// The `tools/call` request `n` as one frame (with `envelope`'s entries in
/// its `_meta` for a sessionless version).
pub(super) fn call_frame(
    n: u64,
    name: &str,
    arguments: Option<&JsonObject>,
    progress: Option<&ProgressToken>,
    envelope: Option<&Envelope>,
) -> Result<Vec<u8>, serde_json::Error> {
    #[derive(serde::Serialize)]
    struct Request<'a> {
        jsonrpc: &'static str,
        id: String,
        method: &'static str,
        params: Params<'a>,
    }
    #[derive(serde::Serialize)]
    struct Params<'a> {
        name: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        arguments: Option<&'a JsonObject>,
        #[serde(rename = "_meta", skip_serializing_if = "Option::is_none")]
        meta: Option<Meta<'a>>,
    }
    struct Meta<'a> {
        progress_token: Option<&'a ProgressToken>,
        envelope: Option<&'a Envelope>,
    }
    impl serde::Serialize for Meta<'_> {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeMap as _;
            let mut map = serializer.serialize_map(None)?;
            if let Some(token) = self.progress_token {
                map.serialize_entry("progressToken", token)?;
            }
            for (key, value) in self.envelope.iter().flat_map(|e| &e.0) {
                map.serialize_entry(key, value)?;
            }
            map.end()
        }
    }
    let meta = (progress.is_some() || envelope.is_some()).then_some(Meta {
        progress_token: progress,
        envelope,
    });
    encode(&Request {
        jsonrpc: "2.0",
        id: id_of(n),
        method: "tools/call",
        params: Params {
            name,
            arguments,
            meta,
        },
    })
}

/// `notifications/cancelled` for request `n`, as one frame.
pub(super) fn cancelled_frame(n: u64) -> Vec<u8> {
    let notification = serde_json::json!({
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": { "requestId": id_of(n), "reason": "the gateway's caller stopped waiting" },
    });
    // A `Value` always serializes.
    encode(&notification).unwrap_or_default()
}

/// What the wire reads of a frame from the server.
#[derive(Deserialize)]
struct Reply<'a> {
    #[serde(default, borrow)]
    id: Option<&'a RawValue>,
    #[serde(default, borrow)]
    method: Option<&'a RawValue>,
    #[serde(default, borrow)]
    result: Option<&'a RawValue>,
    #[serde(default, borrow)]
    error: Option<&'a RawValue>,
}

/// The number of the wire's request `id` names (`"npc-N"`, no escapes).
fn own_request(id: &RawValue) -> Option<u64> {
    let n = id
        .get()
        .strip_prefix('"')?
        .strip_suffix('"')?
        .strip_prefix(ID_PREFIX)?;
    n.bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| n.parse().ok())
        .flatten()
}

/// If `line` answers one of the wire's requests: its number and the answer.
pub(super) fn answer_of(line: &[u8]) -> Option<(u64, Answer)> {
    let reply: Reply = serde_json::from_slice(line).ok()?;
    if reply.method.is_some() {
        return None;
    }
    let n = own_request(reply.id?)?;
    let answer = match (reply.result, reply.error) {
        (Some(result), None) => tool_result(result),
        (None, Some(error)) => serde_json::from_str::<ErrorData>(error.get())
            .map(|e| Err(Failure::Answer(e)))
            .unwrap_or_else(|e| {
                Err(Failure::Lost(format!(
                    "it answered `tools/call` with a malformed error ({e})"
                )))
            }),
        _ => Err(Failure::Lost(
            "it answered `tools/call` with neither a result nor an error".into(),
        )),
    };
    Some((n, answer))
}

/// If `line` reports progress under a token npc gave a call: its params.
pub(super) fn progress_of(line: &[u8]) -> Option<ProgressNotificationParam> {
    let reply: Reply = serde_json::from_slice(line).ok()?;
    if reply.id.is_some() || reply.method?.get() != "\"notifications/progress\"" {
        return None;
    }
    #[derive(Deserialize)]
    struct Progress {
        params: ProgressNotificationParam,
    }
    let Progress { params } = serde_json::from_slice(line).ok()?;
    Passthrough::is_own_token(&params.progress_token).then_some(params)
}

/// A `tools/call` result: a tool result, or one with no content at all
/// (`{}`, or only `_meta`), which rmcp's client also takes as complete. A
/// result asking for more input is an error answer (the session is fine).
fn tool_result(result: &RawValue) -> Answer {
    match serde_json::from_str::<CallToolResult>(result.get()) {
        Ok(result) => Ok(result),
        Err(e) => {
            #[derive(Deserialize)]
            struct Kind {
                #[serde(rename = "resultType")]
                result_type: Option<rmcp::model::ResultType>,
            }
            if serde_json::from_str::<Kind>(result.get())
                .is_ok_and(|k| k.result_type == Some(rmcp::model::ResultType::INPUT_REQUIRED))
            {
                return Err(Failure::Answer(ErrorData::internal_error(
                    INPUT_REQUIRED,
                    None,
                )));
            }
            #[derive(Deserialize)]
            #[serde(deny_unknown_fields)]
            struct Contentless {
                #[serde(rename = "_meta", default)]
                meta: Option<rmcp::model::MetaObject>,
            }
            match serde_json::from_str::<Contentless>(result.get()) {
                Ok(Contentless { meta }) => {
                    let mut result = CallToolResult::default();
                    result.result_type = None;
                    result.meta = meta;
                    Ok(result)
                }
                Err(_) => Err(Failure::Lost(format!(
                    "its answer to `tools/call` is not a tool result ({e})"
                ))),
            }
        }
    }
}

/// The server's stdout: the wire's answers to their calls, every other
/// frame to rmcp.
async fn inbound<R>(
    stdout: R,
    mut to_rmcp: WriteHalf<DuplexStream>,
    shared: Arc<Shared>,
    progress: Option<Passthrough>,
) where
    R: AsyncRead + Unpin,
{
    let mut reader = LineReader::new(
        stdout,
        Splitter::new(MAX_FRAME_BYTES, Overlong::Stop).skip_blank(),
    );
    let reason = loop {
        let frame = tokio::select! {
            frame = reader.next() => frame,
            () = shared.closed.cancelled() => break None,
        };
        match frame {
            Ok(Some(Line::Line(mut line))) => {
                if let Some((n, answer)) = answer_of(&line) {
                    shared.deliver(n, answer);
                    continue;
                }
                if let Some(passthrough) = &progress
                    && let Some(params) = progress_of(&line)
                {
                    passthrough.progress(params);
                    continue;
                }
                line.push(b'\n');
                if to_rmcp.write_all(&line).await.is_err() {
                    break Some("its session was closed".to_string());
                }
            }
            Ok(Some(Line::TooLong { .. } | Line::Truncated(_))) => {
                break Some(format!(
                    "it sent a frame longer than {MAX_FRAME_BYTES} bytes"
                ));
            }
            Ok(None) => break Some("it closed its standard output".to_string()),
            Err(e) => break Some(format!("reading its standard output failed: {e}")),
        }
    };
    if let Some(reason) = reason {
        shared.close(&reason);
    }
    // Dropping `to_rmcp` ends rmcp's input, so its session ends too.
}

/// rmcp's frames to the server, whole lines at a time; when rmcp's session
/// ends, the wire closes and the server's stdin with it.
async fn outbound(from_rmcp: ReadHalf<DuplexStream>, shared: Arc<Shared>) {
    let mut from_rmcp = BufReader::new(from_rmcp);
    let mut line = Vec::new();
    let reason = loop {
        line.clear();
        let read = tokio::select! {
            read = from_rmcp.read_until(b'\n', &mut line) => read,
            () = shared.closed.cancelled() => break None,
        };
        match read {
            Ok(0) | Err(_) => break Some("its session was closed".to_string()),
            Ok(_) => {
                if let Err(reason) = shared.write(&line).await {
                    break Some(reason);
                }
            }
        }
    };
    if let Some(reason) = reason {
        shared.close(&reason);
    }
    *shared.stdin.lock().await = None;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_string()).unwrap()
    }

    #[test]
    fn only_exact_own_ids_are_the_wires() {
        assert_eq!(own_request(&raw(r#""npc-7""#)), Some(7));
        for id in [
            "7",
            r#""7""#,
            r#""npc-""#,
            r#""npc-7x""#,
            r#""npc--7""#,
            r#""npc-+7""#,
            r#""npc\u002d7""#,
            r#""npc-99999999999999999999999""#,
            "null",
        ] {
            assert_eq!(own_request(&raw(id)), None, "{id}");
        }
    }

    #[test]
    fn answers_to_own_calls_are_decoded_and_everything_else_is_not() {
        let ok =
            br#"{"jsonrpc":"2.0","id":"npc-3","result":{"content":[{"type":"text","text":"hi"}]}}"#;
        let (n, answer) = answer_of(ok).unwrap();
        assert_eq!(n, 3);
        let result = answer.unwrap();
        assert_eq!(result.content[0].as_text().unwrap().text, "hi");
        assert_eq!(result.is_error, None);

        let error =
            br#"{"jsonrpc":"2.0","id":"npc-4","error":{"code":-32602,"message":"no such tool"}}"#;
        match answer_of(error).unwrap() {
            (4, Err(Failure::Answer(e))) => assert_eq!(e.message, "no such tool"),
            other => panic!("an error answer, not {other:?}"),
        }

        // Contentless results are complete, as rmcp's client takes them.
        for contentless in [
            br#"{"jsonrpc":"2.0","id":"npc-5","result":{}}"#.as_slice(),
            br#"{"jsonrpc":"2.0","id":"npc-5","result":{"_meta":{"k":1}}}"#,
        ] {
            let (_, answer) = answer_of(contentless).unwrap();
            assert!(answer.unwrap().content.is_empty());
        }

        // Ours, but nonsense: the call is lost (and the session closed by the pool).
        for broken in [
            br#"{"jsonrpc":"2.0","id":"npc-6","result":42}"#.as_slice(),
            br#"{"jsonrpc":"2.0","id":"npc-6","result":{"tools":[]}}"#,
            br#"{"jsonrpc":"2.0","id":"npc-6","error":{"code":"x"}}"#,
            br#"{"jsonrpc":"2.0","id":"npc-6"}"#,
            br#"{"jsonrpc":"2.0","id":"npc-6","result":{"content":[]},"error":{"code":1,"message":"m"}}"#,
        ] {
            match answer_of(broken) {
                Some((6, Err(Failure::Lost(_)))) => {}
                other => panic!("{}: lost, not {other:?}", String::from_utf8_lossy(broken)),
            }
        }

        // A tool asking for more input: an error answer, the session stays.
        let input = br#"{"jsonrpc":"2.0","id":"npc-7","result":{"resultType":"input_required","inputRequests":{}}}"#;
        match answer_of(input) {
            Some((7, Err(Failure::Answer(e)))) => assert_eq!(e.message, INPUT_REQUIRED),
            other => panic!("an error answer, not {other:?}"),
        }

        // rmcp's: its numeric ids, requests and notifications of the
        // server, anything that is not JSON.
        for theirs in [
            br#"{"jsonrpc":"2.0","id":1,"result":{"tools":[]}}"#.as_slice(),
            br#"{"jsonrpc":"2.0","id":"npc-1","method":"ping"}"#,
            br#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#,
            br#"{"jsonrpc":"2.0","id":"other-1","result":{}}"#,
            b"not json at all",
            br#"{"jsonrpc":"2.0","id":"npc-1","result":{"content":["#,
            br#"[{"jsonrpc":"2.0","id":"npc-1","result":{}}]"#,
        ] {
            assert!(
                answer_of(theirs).is_none(),
                "{}",
                String::from_utf8_lossy(theirs)
            );
        }
    }

    #[test]
    fn only_progress_under_npcs_tokens_is_taken_off_the_line() {
        let own = br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"npc-progress-4","progress":2,"total":3}}"#;
        let params = progress_of(own).unwrap();
        assert_eq!(params.progress, 2.0);
        for theirs in [
            br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":7,"progress":1}}"#.as_slice(),
            br#"{"jsonrpc":"2.0","method":"notifications/message","params":{"progressToken":"npc-progress-4"}}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"notifications/progress","params":{"progressToken":"npc-progress-4","progress":1}}"#,
            br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"npc-progress-4"}}"#,
            b"not json",
        ] {
            assert!(progress_of(theirs).is_none(), "{}", String::from_utf8_lossy(theirs));
        }
        // A call asking for progress carries its token in `_meta`.
        let token = ProgressToken(rmcp::model::NumberOrString::String("npc-progress-4".into()));
        let frame = call_frame(4, "t", None, Some(&token), None).unwrap();
        let value: Value = serde_json::from_slice(&frame).unwrap();
        assert_eq!(value["params"]["_meta"]["progressToken"], "npc-progress-4");
    }

    #[test]
    fn requests_are_one_line_of_json_rpc() {
        let mut arguments = JsonObject::new();
        arguments.insert("message".into(), json!("a\nb"));
        let frame = call_frame(9, "echo", Some(&arguments), None, None).unwrap();
        assert_eq!(frame.iter().filter(|&&b| b == b'\n').count(), 1);
        let value: Value = serde_json::from_slice(&frame).unwrap();
        assert_eq!(
            value,
            json!({"jsonrpc": "2.0", "id": "npc-9", "method": "tools/call",
                   "params": {"name": "echo", "arguments": {"message": "a\nb"}}})
        );
        let value: Value =
            serde_json::from_slice(&call_frame(1, "t", None, None, None).unwrap()).unwrap();
        assert_eq!(value["params"], json!({"name": "t"}));
        let value: Value = serde_json::from_slice(&cancelled_frame(9)).unwrap();
        assert_eq!(value["params"]["requestId"], "npc-9");
    }

    /// A wire whose server is the test: what the wire writes to the
    /// server, and where the test writes the server's frames.
    struct Server {
        requests: tokio::io::Lines<BufReader<DuplexStream>>,
        replies: DuplexStream,
    }

    fn started() -> (Wire, RmcpSide, Server) {
        let (server_out, wire_in) = tokio::io::duplex(1024 * 1024);
        let (wire_out, server_in) = tokio::io::duplex(1024 * 1024);
        let (wire, rmcp) = Wire::start(wire_in, wire_out, None);
        let server = Server {
            requests: BufReader::new(server_in).lines(),
            replies: server_out,
        };
        (wire, rmcp, server)
    }

    async fn next_request(server: &mut Server) -> Value {
        let line = server
            .requests
            .next_line()
            .await
            .unwrap()
            .expect("a request");
        serde_json::from_str(&line).unwrap()
    }

    /// The server writes `message` as one frame.
    async fn reply(server: &mut Server, message: Value) {
        let frame = encode(&message).unwrap();
        server.replies.write_all(&frame).await.unwrap();
    }

    #[tokio::test]
    async fn calls_are_answered_by_id_and_rmcp_gets_the_rest() {
        let (wire, (from_server, mut to_server), mut server) = started();
        let wire = Arc::new(wire);
        let (a, b) = (wire.clone(), wire.clone());
        let first = tokio::spawn(async move { a.call_tool("one", None, None).await });
        let one = next_request(&mut server).await;
        let second = tokio::spawn(async move { b.call_tool("two", None, None).await });
        let two = next_request(&mut server).await;
        assert_eq!(
            (&one["params"]["name"], &two["params"]["name"]),
            (&json!("one"), &json!("two"))
        );
        // rmcp's request reaches the server whole, between the wire's.
        to_server
            .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\"}\n")
            .await
            .unwrap();
        assert_eq!(next_request(&mut server).await["method"], "tools/list");
        // Answers out of order, with a notification and rmcp's answer between.
        let answer = |id: &Value, text: &str| {
            format!(
                "{}\n",
                json!({"jsonrpc": "2.0", "id": id, "result": {"content": [{"type": "text", "text": text}]}})
            )
        };
        let mut out = answer(&two["id"], "2");
        out.push_str("{\"jsonrpc\":\"2.0\",\"method\":\"notifications/tools/list_changed\"}\n");
        out.push_str("{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"tools\":[]}}\n");
        out.push_str(&answer(&one["id"], "1"));
        server.replies.write_all(out.as_bytes()).await.unwrap();
        let text = |r: Answer| r.unwrap().content[0].as_text().unwrap().text.clone();
        assert_eq!(text(first.await.unwrap()), "1");
        assert_eq!(text(second.await.unwrap()), "2");
        let mut rmcp_lines = BufReader::new(from_server).lines();
        let got = rmcp_lines.next_line().await.unwrap().unwrap();
        assert!(got.contains("list_changed"), "{got}");
        let got = rmcp_lines.next_line().await.unwrap().unwrap();
        assert!(got.contains("\"id\":1"), "{got}");
    }

    #[tokio::test]
    async fn the_end_of_the_servers_output_loses_every_waiting_call_and_ends_rmcps_input() {
        let (wire, (from_server, _to_server), mut server) = started();
        let wire = Arc::new(wire);
        let w = wire.clone();
        let call = tokio::spawn(async move { w.call_tool("slow", None, None).await });
        next_request(&mut server).await;
        drop(server.replies);
        match call.await.unwrap() {
            Err(Failure::Lost(reason)) => assert!(reason.contains("standard output"), "{reason}"),
            other => panic!("lost, not {other:?}"),
        }
        let mut rest = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut BufReader::new(from_server), &mut rest)
            .await
            .unwrap();
        assert!(rest.is_empty());
        // Later calls fail at once; the server's stdin is closed.
        assert!(matches!(
            wire.call_tool("x", None, None).await,
            Err(Failure::Lost(_))
        ));
        assert_eq!(server.requests.next_line().await.unwrap(), None);
    }

    #[tokio::test]
    async fn an_overlong_frame_closes_the_wire() {
        let (wire, _rmcp, mut server) = started();
        let wire = Arc::new(wire);
        let w = wire.clone();
        let call = tokio::spawn(async move { w.call_tool("big", None, None).await });
        next_request(&mut server).await;
        // An endless line: the server never ends it, nor its output.
        let chunk = vec![b'x'; 1024 * 1024];
        let writer =
            tokio::spawn(async move { while server.replies.write_all(&chunk).await.is_ok() {} });
        match call.await.unwrap() {
            Err(Failure::Lost(reason)) => assert!(reason.contains("longer than"), "{reason}"),
            other => panic!("lost, not {other:?}"),
        }
        writer.abort();
    }

    #[tokio::test]
    async fn a_dropped_call_is_forgotten_and_the_server_told() {
        let (wire, _rmcp, mut server) = started();
        let wire = Arc::new(wire);
        let w = wire.clone();
        let call = tokio::spawn(async move { w.call_tool("slow", None, None).await });
        let request = next_request(&mut server).await;
        call.abort();
        let cancelled = next_request(&mut server).await;
        assert_eq!(cancelled["method"], "notifications/cancelled");
        assert_eq!(cancelled["params"]["requestId"], request["id"]);
        assert!(lock(&wire.shared.pending).calls.is_empty());
        // A late answer to it is dropped; the wire still serves.
        let late = json!({"jsonrpc": "2.0", "id": request["id"], "result": {"content": []}});
        reply(&mut server, late).await;
        let w = wire.clone();
        let next = tokio::spawn(async move { w.call_tool("again", None, None).await });
        let again = next_request(&mut server).await;
        let answer = json!({"jsonrpc": "2.0", "id": again["id"], "result": {"isError": true}});
        reply(&mut server, answer).await;
        assert_eq!(next.await.unwrap().unwrap().is_error, Some(true));
    }

    #[test]
    fn calls_of_a_sessionless_version_carry_the_envelope_beside_the_token() {
        let meta = RequestMetaObject::with_client_context(
            rmcp::model::ProtocolVersion::V_2026_07_28,
            rmcp::model::Implementation::new("npc", "1"),
            rmcp::model::ClientCapabilities::default(),
        );
        let envelope = Envelope::new(&meta).unwrap();
        let token = ProgressToken(rmcp::model::NumberOrString::String("npc-progress-1".into()));
        let frame = call_frame(2, "t", None, Some(&token), Some(&envelope)).unwrap();
        let value: Value = serde_json::from_slice(&frame).unwrap();
        let sent = &value["params"]["_meta"];
        assert_eq!(sent["progressToken"], "npc-progress-1");
        assert_eq!(
            sent["io.modelcontextprotocol/protocolVersion"],
            "2026-07-28"
        );
        assert_eq!(sent["io.modelcontextprotocol/clientInfo"]["name"], "npc");
        assert!(sent["io.modelcontextprotocol/clientCapabilities"].is_object());
        let frame = call_frame(3, "t", None, None, Some(&envelope)).unwrap();
        let value: Value = serde_json::from_slice(&frame).unwrap();
        assert_eq!(value["params"]["_meta"].as_object().unwrap().len(), 3);
    }

    #[tokio::test]
    async fn lent_ends_outlive_a_failed_attempt_and_close_with_the_last() {
        let (_wire, (from_server, to_server), mut server) = started();
        let (read, write) = (Lent::new(from_server), Lent::new(to_server));
        // An attempt that fails drops its clones; the pipe stays open.
        drop((read.clone(), write.clone()));
        let mut next = write.clone();
        next.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n")
            .await
            .unwrap();
        assert_eq!(next_request(&mut server).await["method"], "ping");
        // The last clone gone, the wire closes the server's stdin.
        drop((read, write, next));
        assert_eq!(server.requests.next_line().await.unwrap(), None);
    }

    #[tokio::test]
    async fn the_end_of_rmcps_session_closes_the_servers_stdin() {
        let (wire, rmcp, mut server) = started();
        drop(rmcp);
        assert_eq!(server.requests.next_line().await.unwrap(), None);
        assert!(matches!(
            wire.call_tool("x", None, None).await,
            Err(Failure::Lost(_))
        ));
    }
}
