//! A sandboxed run's channel to the process that owns it (the daemon, a
//! fleet worker, or `npc run`): inside the sandbox npc's state is
//! read-only, so what the run's own `npc hook run` records (its `hook.call`
//! and `tool.denied` events) and asks (an `ask` that parks the run) goes
//! over this socket instead. The owner binds one Unix socket per run in the
//! run's directory ([`SOCKET_FILE`], named to the run by [`SOCKET_ENV`])
//! and gives the run a random secret ([`SECRET_ENV`], [`RunSecret`]: never
//! printed, never in an event). A client writes one [`ChannelRequest`] line
//! (the run's id, its secret, one [`ChannelOp`]); the owner answers one
//! [`ChannelReply`] line and closes. A request naming another run or
//! carrying another secret is refused, and so is a peer of another uid;
//! what a request may record is the owner's to check ([`ChannelHandler`]):
//! only that run's own events. Lines are bounded
//! ([`MAX_REQUEST_BYTES`], [`MAX_RECORDED_EVENTS`]), and so are
//! connections ([`MAX_CONNECTIONS`]) and the time to send a request
//! ([`REQUEST_TIMEOUT`]).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt as _;
use tokio::net::{UnixListener, UnixStream};

use super::approval::{Answer, ApprovalRequest};
use crate::stdx::lines::{Line, LineReader, Overlong, Splitter};

/// A failed `accept` (out of descriptors, say) is tried again after this.
const ACCEPT_RETRY: Duration = Duration::from_millis(50);

/// The channel's socket, in the run's directory.
pub const SOCKET_FILE: &str = "npc.sock";
/// The variable naming the channel's socket to the run.
pub const SOCKET_ENV: &str = "NPC_RUN_CHANNEL";
/// The variable carrying the run's secret. Its name says neither
/// `SECRET` nor `TOKEN` nor `KEY`: Gemini CLI strips variables so named
/// from its MCP servers' environment, and npc's gateway is the server
/// meant to have it.
pub const SECRET_ENV: &str = "NPC_RUN_PASS";
/// The channel's protocol version: every request carries it.
pub const PROTOCOL_VERSION: u32 = 1;
/// Longest request line (a batch of events of one hook call).
pub const MAX_REQUEST_BYTES: usize = 4 * 1024 * 1024;
/// Longest answer line a client reads.
pub const MAX_REPLY_BYTES: usize = 64 * 1024;
/// Most events one request records.
pub const MAX_RECORDED_EVENTS: usize = 256;
/// Connections served at once; more wait in the kernel's backlog.
pub const MAX_CONNECTIONS: usize = 16;
/// How long a connected peer has to send its request.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client waits to connect, send and hear that its events are
/// recorded (an `ask` waits for as long as the owner parks the run).
pub const RECORD_TIMEOUT: Duration = Duration::from_secs(30);
/// Random bytes of a [`RunSecret`].
const SECRET_BYTES: usize = 32;

/// A run's secret: shown as `<redacted>`; compared in constant time.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RunSecret(String);

impl std::fmt::Debug for RunSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl RunSecret {
    /// A fresh secret from the kernel's random numbers (`None` without them).
    pub fn generate() -> Option<Self> {
        use std::io::Read as _;
        let mut bytes = [0u8; SECRET_BYTES];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut bytes))
            .ok()?;
        Some(Self(hex::encode(bytes)))
    }

    /// The secret a run was given ([`SECRET_ENV`]), if any.
    pub fn from_env() -> Option<Self> {
        std::env::var(SECRET_ENV)
            .ok()
            .filter(|s| !s.is_empty())
            .map(Self)
    }

    /// The value, for the run's environment only.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether `other` is this secret (constant time).
    pub fn matches(&self, other: &RunSecret) -> bool {
        super::tcp::constant_time_eq(self.0.as_bytes(), other.0.as_bytes())
    }

    /// The SHA-256 of the secret, hex: what a file may keep to check it.
    pub fn digest(&self) -> String {
        use sha2::Digest as _;
        hex::encode(sha2::Sha256::digest(self.0.as_bytes()))
    }
}

/// One request line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChannelRequest {
    pub protocol: u32,
    /// The run the request speaks for.
    pub run: String,
    pub secret: RunSecret,
    pub op: ChannelOp,
}

/// What a run asks its owner.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ChannelOp {
    /// Record these events of the run (at most [`MAX_RECORDED_EVENTS`]).
    Record { events: Vec<crate::event::Event> },
    /// An `ask` of a hook of the run: park the run until a person answers.
    Ask { request: ApprovalRequest },
}

/// The owner's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum ChannelReply {
    /// To [`ChannelOp::Record`]: how many events were recorded.
    Recorded { recorded: usize },
    /// To [`ChannelOp::Ask`].
    Answered { answer: Answer },
    /// The request was refused.
    Error { error: String },
}

/// What the owner does with a run's requests (the `runs` engine's).
pub trait ChannelHandler: Send + Sync {
    /// Record `events` of the run; `Err` says why they were refused.
    fn record(
        &self,
        events: Vec<crate::event::Event>,
    ) -> futures_util::future::BoxFuture<'_, Result<usize, String>>;

    /// Park the run on `request` until a person answers.
    fn ask(&self, request: ApprovalRequest) -> futures_util::future::BoxFuture<'_, Answer>;
}

/// Why a client's request failed (an `ask` that fails is a denial).
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    #[error(
        "this sandboxed run has no channel to npc (`{SOCKET_ENV}` and `{SECRET_ENV}` are unset); start it through npc"
    )]
    Unset,
    #[error("cannot reach the run's channel `{}`: {source}; the process that owns the run is gone", path.display())]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the run's channel did not answer within {}s", RECORD_TIMEOUT.as_secs())]
    Timeout,
    #[error("the run's channel answered something that is not an answer: {0}")]
    Invalid(String),
    #[error("the run's channel refused the request: {0}")]
    Refused(String),
    #[error("more than {MAX_RECORDED_EVENTS} events in one request; send fewer")]
    TooMany,
}

/// A bound channel of run `run`.
#[derive(Debug)]
pub struct ChannelListener {
    listener: UnixListener,
    run: String,
    secret: RunSecret,
}

/// Bind the channel of run `run` at `path` (a path made ready to bind,
/// `repofs::Root::prepare_socket`).
pub fn bind(path: &Path, run: &str, secret: RunSecret) -> std::io::Result<ChannelListener> {
    Ok(ChannelListener {
        listener: UnixListener::bind(path)?,
        run: run.to_string(),
        secret,
    })
}

impl ChannelListener {
    /// Answer requests until the task is dropped.
    pub async fn serve(self, handler: Arc<dyn ChannelHandler>) {
        let uid = nix::unistd::getuid().as_raw();
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
        let me = Arc::new((self.run, self.secret));
        loop {
            let Ok(permit) = slots.clone().acquire_owned().await else {
                return;
            };
            let stream = match self.listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!("run channel: accept failed: {e}");
                    tokio::time::sleep(ACCEPT_RETRY).await;
                    continue;
                }
            };
            let (handler, me) = (handler.clone(), me.clone());
            tokio::spawn(async move {
                let _permit = permit;
                let same_user = stream.peer_cred().map(|c| c.uid()).ok() == Some(uid);
                let (read, mut write) = stream.into_split();
                let reply = if same_user {
                    answer(read, &me.0, &me.1, handler.as_ref()).await
                } else {
                    refused("the run's channel answers only its own user")
                };
                let mut line = serde_json::to_vec(&reply).unwrap_or_default();
                line.push(b'\n');
                let _ = write.write_all(&line).await;
            });
        }
    }
}

fn refused(why: &str) -> ChannelReply {
    ChannelReply::Error {
        error: why.to_string(),
    }
}

/// The answer to the request on `read` for run `run` with `secret`.
async fn answer(
    read: impl tokio::io::AsyncRead + Unpin,
    run: &str,
    secret: &RunSecret,
    handler: &dyn ChannelHandler,
) -> ChannelReply {
    let mut reader = LineReader::new(read, Splitter::new(MAX_REQUEST_BYTES, Overlong::Stop));
    let line = match tokio::time::timeout(REQUEST_TIMEOUT, reader.next()).await {
        Ok(Ok(Some(Line::Line(line)))) => line,
        Ok(Ok(Some(_))) => {
            return refused(&format!(
                "the request is longer than {MAX_REQUEST_BYTES} bytes"
            ));
        }
        Ok(Ok(None)) => return refused("no request before the connection closed"),
        Ok(Err(e)) => return refused(&format!("cannot read the request: {e}")),
        Err(_) => return refused("no request arrived in time"),
    };
    let request: ChannelRequest = match serde_json::from_slice(&line) {
        Ok(r) => r,
        Err(e) => return refused(&format!("the request is not valid: {e}")),
    };
    if request.protocol != PROTOCOL_VERSION {
        return refused(&format!(
            "protocol {} is not this npc's ({PROTOCOL_VERSION}); use the npc that started the run",
            request.protocol
        ));
    }
    // One answer for a wrong run and a wrong secret: neither is told apart.
    if request.run != run || !secret.matches(&request.secret) {
        return refused("the request is not the run's own (run id or secret)");
    }
    match request.op {
        ChannelOp::Record { events } if events.len() > MAX_RECORDED_EVENTS => {
            refused(&ChannelError::TooMany.to_string())
        }
        ChannelOp::Record { events } => match handler.record(events).await {
            Ok(recorded) => ChannelReply::Recorded { recorded },
            Err(error) => ChannelReply::Error { error },
        },
        ChannelOp::Ask { request } => ChannelReply::Answered {
            answer: handler.ask(request).await,
        },
    }
}

/// A run's end of its channel: the socket and secret npc gave it.
#[derive(Debug, Clone)]
pub struct ChannelClient {
    socket: std::path::PathBuf,
    run: String,
    secret: RunSecret,
}

impl ChannelClient {
    /// The channel npc gave run `run` ([`SOCKET_ENV`], [`SECRET_ENV`]).
    pub fn from_env(run: &str) -> Result<Self, ChannelError> {
        let socket = std::env::var_os(SOCKET_ENV).ok_or(ChannelError::Unset)?;
        let secret = RunSecret::from_env().ok_or(ChannelError::Unset)?;
        Ok(Self {
            socket: socket.into(),
            run: run.to_string(),
            secret,
        })
    }

    /// Whether this process runs in a sandboxed run (one given a channel:
    /// its state is read-only here).
    pub fn given() -> bool {
        std::env::var_os(SOCKET_ENV).is_some() || std::env::var_os(SECRET_ENV).is_some()
    }

    /// Record `events` of the run.
    pub async fn record(&self, events: Vec<crate::event::Event>) -> Result<usize, ChannelError> {
        if events.len() > MAX_RECORDED_EVENTS {
            return Err(ChannelError::TooMany);
        }
        let reply = tokio::time::timeout(RECORD_TIMEOUT, self.send(ChannelOp::Record { events }))
            .await
            .map_err(|_| ChannelError::Timeout)??;
        match reply {
            ChannelReply::Recorded { recorded } => Ok(recorded),
            ChannelReply::Error { error } => Err(ChannelError::Refused(error)),
            other => Err(ChannelError::Invalid(format!("{other:?}"))),
        }
    }

    /// Ask (the owner parks the run until a person answers).
    pub async fn ask(&self, request: ApprovalRequest) -> Result<Answer, ChannelError> {
        match self.send(ChannelOp::Ask { request }).await? {
            ChannelReply::Answered { answer } => Ok(answer),
            ChannelReply::Error { error } => Err(ChannelError::Refused(error)),
            other => Err(ChannelError::Invalid(format!("{other:?}"))),
        }
    }

    async fn send(&self, op: ChannelOp) -> Result<ChannelReply, ChannelError> {
        let io = |source| ChannelError::Io {
            path: self.socket.clone(),
            source,
        };
        let stream = UnixStream::connect(&self.socket).await.map_err(io)?;
        let request = ChannelRequest {
            protocol: PROTOCOL_VERSION,
            run: self.run.clone(),
            secret: self.secret.clone(),
            op,
        };
        let mut line =
            serde_json::to_vec(&request).map_err(|e| ChannelError::Invalid(e.to_string()))?;
        if line.len() > MAX_REQUEST_BYTES {
            return Err(ChannelError::TooMany);
        }
        line.push(b'\n');
        let (read, mut write) = stream.into_split();
        write.write_all(&line).await.map_err(io)?;
        let mut reader = LineReader::new(read, Splitter::new(MAX_REPLY_BYTES, Overlong::Stop));
        match reader.next().await.map_err(io)? {
            Some(Line::Line(line)) => {
                serde_json::from_slice(&line).map_err(|e| ChannelError::Invalid(e.to_string()))
            }
            Some(_) => Err(ChannelError::Invalid(format!(
                "an answer longer than {MAX_REPLY_BYTES} bytes"
            ))),
            None => Err(ChannelError::Invalid(
                "the connection closed without an answer".into(),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Counting(std::sync::Mutex<usize>);

    impl ChannelHandler for Counting {
        fn record(
            &self,
            events: Vec<crate::event::Event>,
        ) -> futures_util::future::BoxFuture<'_, Result<usize, String>> {
            *self.0.lock().unwrap() += events.len();
            Box::pin(async move { Ok(events.len()) })
        }

        fn ask(&self, _request: ApprovalRequest) -> futures_util::future::BoxFuture<'_, Answer> {
            Box::pin(async { Answer::Allow })
        }
    }

    #[test]
    fn a_secret_never_prints() {
        let secret = RunSecret::generate().unwrap();
        assert_eq!(format!("{secret:?}"), "<redacted>");
        assert_eq!(secret.expose().len(), SECRET_BYTES * 2);
        assert!(secret.matches(&secret.clone()));
        assert!(!secret.matches(&RunSecret::generate().unwrap()));
    }

    #[tokio::test]
    async fn only_the_runs_own_id_and_secret_are_answered() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(SOCKET_FILE);
        let secret = RunSecret::generate().unwrap();
        let listener = bind(&path, "r1", secret.clone()).unwrap();
        let handler = Arc::new(Counting::default());
        let task = tokio::spawn(listener.serve(handler.clone()));
        let client = |run: &str, secret: RunSecret| ChannelClient {
            socket: path.clone(),
            run: run.to_string(),
            secret,
        };
        let event = || vec![crate::event::Event::examples().remove(0)];
        assert_eq!(
            client("r1", secret.clone()).record(event()).await.unwrap(),
            1
        );
        for forged in [
            client("r2", secret.clone()),
            client("r1", RunSecret::generate().unwrap()),
        ] {
            let e = forged.record(event()).await.unwrap_err();
            assert!(matches!(e, ChannelError::Refused(_)), "{e}");
        }
        let many = (0..=MAX_RECORDED_EVENTS)
            .map(|_| crate::event::Event::examples().remove(0))
            .collect();
        assert!(matches!(
            client("r1", secret.clone()).record(many).await,
            Err(ChannelError::TooMany)
        ));
        // A line past the bound is refused before it is parsed.
        let mut stream = UnixStream::connect(&path).await.unwrap();
        let long = vec![b'x'; MAX_REQUEST_BYTES + 2];
        let _ = stream.write_all(&long).await;
        let mut reply = String::new();
        let _ = tokio::io::AsyncReadExt::read_to_string(&mut stream, &mut reply).await;
        assert!(reply.contains("longer than"), "{reply}");
        assert_eq!(*handler.0.lock().unwrap(), 1);
        task.abort();
    }
}
