//! The daemon's control channel: newline-delimited JSON over a Unix socket
//! in the state directory, readable and writable by the owner only, and
//! answering only peers with the daemon's own uid. `npc plan`, `apply`,
//! `status` and `events` use it to talk to a running daemon, and `npc acp`
//! to run its prompts in the daemon (`acp_run`, `cancel_run`).
//!
//! A client writes one request line ([`Request`], with the
//! [`PROTOCOL_VERSION`] it speaks in `protocol`); the server answers with
//! one or more [`Reply`] lines (a stream for `events --follow`) and closes.
//! A request of another protocol version is answered with an error that
//! names both versions ([`Reply::Error`] carries the daemon's), so a CLI
//! and a daemon of different npc versions say so instead of misreading
//! each other. The one
//! exception is the MCP upgrade (`{"op":"mcp"}`): the daemon answers
//! [`MCP_UPGRADED`] and the connection then carries MCP's newline-delimited
//! JSON-RPC frames both ways, served by the daemon's gateway ([`Upgrade`]),
//! so `npc mcp serve` can front the daemon's pool.

use crate::stdx::lines::{Line, LineReader, Overlong, Splitter, encode};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, watch};
use tokio::task::AbortHandle;

/// Socket file name inside the state directory.
pub const SOCKET_FILE: &str = "daemon.sock";
/// Longest request line accepted.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;
/// Longest answer line a client reads from the daemon (a status or plan
/// document, an event); a longer one is a protocol error.
pub const MAX_ANSWER_BYTES: usize = 64 * 1024 * 1024;
/// Read buffer of a connection that may be upgraded (the bytes after the
/// request line stay in it for the upgraded protocol).
pub const UPGRADED_READ_BYTES: usize = 8 * 1024;
/// Responses buffered per connection before the handler waits for the client.
pub const RESPONSE_QUEUE: usize = 1024;
/// How long a client waits to connect and for each response line (except
/// while following events).
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(120);
/// Longest Unix socket path the kernel accepts (sun_path minus the NUL).
pub const MAX_SOCKET_PATH: usize = 107;
/// Connections served at once. At the cap, a new connection evicts the
/// oldest one that has not sent its request yet; when every connection is
/// busy, the new one gets an error and is closed.
pub const MAX_CONNECTIONS: usize = 256;
/// How long a connection may take to send its request line.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long writing one answer line may wait for a client that does not read.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// First pause after a failed `accept` (out of descriptors, say): the
/// pending connection stays queued, so retrying at once would spin.
pub const ACCEPT_BACKOFF_INITIAL: Duration = Duration::from_millis(10);
/// Longest pause between `accept` attempts while they keep failing.
pub const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// The version of the control protocol this npc speaks: every request
/// carries it, and a daemon answers a request of another version with an
/// error naming both. Version 1 was the protocol before requests carried
/// one (answers as untyped JSON).
pub const PROTOCOL_VERSION: u32 = 2;
/// The field of a request line that carries its protocol version.
pub const PROTOCOL_FIELD: &str = "protocol";

/// A request line: the request and the protocol version of its client.
#[derive(Debug, Serialize)]
struct Envelope<'a> {
    protocol: u32,
    #[serde(flatten)]
    request: &'a Request,
}

/// What a client asks the daemon.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Each component: state, pid, restarts, since.
    Status,
    /// The applied (observed) state, for planning.
    State,
    /// Reload the manifest now and apply it; answers with per-component
    /// results. With `fingerprint` (the plan the user saw), only a plan of
    /// that fingerprint is applied; another one answers `stale`.
    Apply {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        fingerprint: Option<String>,
    },
    /// Events after `since`; with `follow`, keep streaming new ones.
    Events { since: Option<i64>, follow: bool },
    /// Turn this connection into an MCP session with the daemon's gateway.
    /// `approval` and `profile`: the `npc acp` whose agent the session
    /// serves and the agent's profile, from the environment of the `npc mcp
    /// serve` in front (a hook's `ask` and the profile's `ask_tools` then
    /// reach that editor).
    Mcp {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        approval: Option<super::runs::ApprovalRoute>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        profile: Option<String>,
        /// The npc run whose agent started the `npc mcp serve` in front
        /// (its `NPC_RUN_ID`): the session's calls are recorded with it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        run: Option<String>,
        /// A sandboxed run's secret (its `NPC_RUN_PASS`): from a
        /// [`confined`] peer, `run` counts only with it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        secret: Option<super::channel::RunSecret>,
        /// Set by the server, never by a client: the peer runs in a sandbox.
        #[serde(skip)]
        confined: bool,
    },
    /// Every pane: state, generation, watcher, last status report.
    PaneList,
    /// Open a configured pane.
    PaneOpen { name: String },
    /// Close a pane.
    PaneClose { name: String },
    /// Type `text` into a pane.
    PaneSend { name: String, text: String },
    /// Turn this connection into a terminal session with a pane: the
    /// daemon answers one line, then sends the pane's raw output; the
    /// client sends [`AttachInput`] lines.
    PaneAttach { name: String, rows: u16, cols: u16 },
    /// The applied triggers: next fire times, routes, watched paths.
    Triggers,
    /// Fire trigger `name` by hand through the run queue.
    FireTrigger {
        name: String,
        payload: Option<serde_json::Value>,
    },
    /// Queue a prompt of `npc acp` as a run of the daemon (origin `acp`);
    /// answers `{"run_id"}`.
    AcpRun { run: super::runs::LocalRun },
    /// Queue `npc run`'s run as a run of the daemon (origin `cli`); answers
    /// `{"run_id"}`.
    Run { run: super::runs::LocalRun },
    /// A URL that opens the dashboard: a new one-time code in its fragment
    /// when the API wants a credential; answers `{"url"}`.
    DashboardUrl,
    /// Cancel run `id`: a queued run never starts, a running one has its
    /// process group killed; answers `{"run_id", "state"}` once it ended.
    CancelRun { id: String },
    /// Start workflow `name` with `inputs` (`npc workflow run`); answers
    /// the workflow run's id.
    WorkflowRun {
        name: String,
        #[serde(default)]
        inputs: std::collections::BTreeMap<String, String>,
    },
    /// Cancel workflow run `id` (`npc workflow cancel`).
    WorkflowCancel { id: String },
    /// Allow pending approval `approval` of run `id`, or its oldest
    /// (`npc runs approve`); with `always`, later identical calls of the
    /// run are allowed too.
    ApproveRun {
        id: String,
        #[serde(default)]
        always: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        approval: Option<String>,
    },
    /// Deny pending approval `approval` of run `id`, or its oldest
    /// (`npc runs deny`).
    DenyRun {
        id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        approval: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
}

/// What the daemon answers, one JSON line each, tagged by `reply`.
/// Documents an engine owns (pane and trigger views, the MCP pool's
/// status) are carried as JSON this layer does not interpret.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum Reply {
    /// The request was refused or failed; with `protocol`, the daemon's
    /// protocol version (a version skew names both).
    Error {
        error: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        protocol: Option<u32>,
    },
    /// To [`Request::Status`].
    Status(Box<StatusReply>),
    /// To [`Request::State`]: the applied state, keyed `kind.name`.
    State {
        components: crate::plan::ObservedState,
    },
    /// To [`Request::Apply`].
    Apply {
        outcome: crate::plan::outcome::ReloadOutcome,
    },
    /// To [`Request::PaneList`].
    Panes { panes: Vec<serde_json::Value> },
    /// To [`Request::PaneOpen`].
    PaneOpened { opened: serde_json::Value },
    /// To [`Request::PaneClose`].
    PaneClosed { closed: String },
    /// To [`Request::PaneSend`]: the bytes typed.
    PaneSent { sent: usize },
    /// To [`Request::PaneAttach`]: the pane's raw output follows.
    Attached {
        attached: String,
        generation: u64,
        status: Option<serde_json::Value>,
    },
    /// To [`Request::Triggers`].
    Triggers { triggers: Vec<serde_json::Value> },
    /// To [`Request::FireTrigger`]: the run it queued.
    Fired { fired: serde_json::Value },
    /// To [`Request::AcpRun`] and [`Request::Run`].
    RunQueued { run_id: String },
    /// To [`Request::DashboardUrl`].
    DashboardUrl { url: String },
    /// To [`Request::WorkflowRun`].
    WorkflowStarted { workflow_run: String },
    /// To [`Request::WorkflowCancel`]: its state after.
    WorkflowCancelled { workflow_run: String, state: String },
    /// To [`Request::CancelRun`]: the run's state once it ended.
    Cancelled { run_id: String, state: String },
    /// To [`Request::ApproveRun`] and [`Request::DenyRun`]: the approval
    /// answered, its tool and its new state (`allowed`, `denied`).
    Answered {
        run_id: String,
        approval_id: String,
        tool: String,
        state: String,
    },
    /// One event of [`Request::Events`] (the store's row).
    Event { event: serde_json::Value },
    /// To [`Request::Mcp`]: MCP frames follow.
    Upgraded { upgraded: String },
}

/// The daemon's status ([`Reply::Status`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusReply {
    pub pid: u32,
    pub components: Vec<ComponentStatus>,
    /// The MCP gateway and its pool's servers.
    pub mcp: serde_json::Value,
    /// The REST API's base URL, when it listens.
    pub api: Option<String>,
    /// The store that takes the runs (and, in a fleet, the daemon's role).
    pub store: serde_json::Value,
}

/// One row of `npc status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComponentStatus {
    pub id: String,
    pub kind: String,
    pub state: String,
    pub pid: Option<u32>,
    pub restarts: u32,
    pub since: Option<String>,
    /// Why it failed to start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What `state` means, for a component no process stands for
    /// ([`crate::plan::Standing::detail`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

impl Reply {
    /// An error answer.
    pub fn error(error: impl Into<String>) -> Self {
        Self::Error {
            error: error.into(),
            protocol: None,
        }
    }

    /// The error for a request of protocol version `client` (`None`: a
    /// request without one, from before versions).
    fn skew(client: Option<u64>) -> Self {
        let client = client.map_or_else(|| "1".to_string(), |v| v.to_string());
        Self::Error {
            error: format!(
                "this daemon speaks control protocol version {PROTOCOL_VERSION} and the client version {client}: they are different versions of npc; restart the daemon with the npc you run (stop it, then `npc daemon`)"
            ),
            protocol: Some(PROTOCOL_VERSION),
        }
    }
}

/// What an attached client sends, one JSON line each.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum AttachInput {
    /// Bytes typed, hex-encoded.
    Input(String),
    /// The client's terminal size changed.
    Resize { rows: u16, cols: u16 },
}

/// Attached sessions served at once (below [`MAX_CONNECTIONS`], like MCP sessions).
pub const MAX_ATTACH_SESSIONS: usize = 64;
/// Serves an attach upgrade (the request names the pane) until either side closes.
pub type AttachUpgrade = Arc<
    dyn Fn(
            Request,
            UpgradedRead,
            tokio::net::unix::OwnedWriteHalf,
        ) -> Pin<Box<dyn Future<Output = ()> + Send>>
        + Send
        + Sync,
>;

/// The daemon's answer to an accepted MCP upgrade; MCP frames follow.
pub const MCP_UPGRADED: &str = "mcp";
/// MCP sessions served at once over upgraded connections. They stay open
/// (unlike requests), so they are capped below [`MAX_CONNECTIONS`]: control
/// requests always find room.
pub const MAX_MCP_SESSIONS: usize = 64;
/// How long an upgraded connection may take to send MCP's `initialize`.
pub const MCP_INIT_TIMEOUT: Duration = Duration::from_secs(30);

/// The reading half of an upgraded connection (bytes the client sent right
/// after its request line are kept).
pub type UpgradedRead = BufReader<tokio::net::unix::OwnedReadHalf>;
/// Serves an upgraded connection (the upgrading request, then its two
/// halves) until either side closes it.
pub type Upgrade = Arc<
    dyn Fn(
            Request,
            UpgradedRead,
            tokio::net::unix::OwnedWriteHalf,
        ) -> Pin<Box<dyn Future<Output = ()> + Send>>
        + Send
        + Sync,
>;

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error(
        "the socket path `{0}` is too long for a Unix socket; use a shorter `project.state_dir`"
    )]
    PathTooLong(PathBuf),
    #[error("cannot bind the control socket `{path}`: {source}")]
    Bind {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no daemon answers at `{path}`: {source}")]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the daemon did not answer within {0:?}")]
    Timeout(Duration),
    #[error("control channel i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("the daemon sent a malformed answer: {0}")]
    Protocol(String),
    #[error("the daemon refused the request: {0}")]
    Refused(String),
    #[error(
        "this npc speaks control protocol version {cli} and the running daemon version {daemon}: the daemon was started by another version of npc; restart it with this npc (stop it, then `npc daemon`)"
    )]
    VersionSkew { cli: u32, daemon: String },
}

impl ControlError {
    /// An answer that is not one to the request sent.
    pub fn unexpected(reply: &Reply) -> Self {
        let text = serde_json::to_string(reply).unwrap_or_default();
        Self::Protocol(format!(
            "unexpected answer: {}",
            crate::stdx::term::printable(&text)
        ))
    }
}

/// Responses are written here by a handler; closing it ends the answer.
pub type Responder = mpsc::Sender<Reply>;
/// The function that answers requests.
pub type Handler =
    Arc<dyn Fn(Request, Responder) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// Path of the control socket for a state directory.
pub fn socket_path(state_dir: &Path) -> PathBuf {
    state_dir.join(SOCKET_FILE)
}

/// The directory the guarded layer confines a socket path to (the one
/// above the socket's directory: the repository for `<repo>/.npc/daemon.sock`,
/// so a runtime directory that is a link out of it is refused) and the
/// socket's path relative to it.
fn socket_parts(path: &Path) -> (&Path, &Path) {
    let root = path
        .parent()
        .and_then(Path::parent)
        .or_else(|| path.parent())
        .unwrap_or(Path::new(""));
    let rel = path.strip_prefix(root).unwrap_or(path);
    (root, rel)
}

/// A bound control socket: clients can connect from the moment [`bind`]
/// returns, before [`Bound::serve`] runs.
pub struct Bound {
    listener: UnixListener,
    path: PathBuf,
    upgrade: Option<Upgrade>,
    attach: Option<AttachUpgrade>,
}

impl std::fmt::Debug for Bound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bound")
            .field("path", &self.path)
            .field("mcp", &self.upgrade.is_some())
            .finish_non_exhaustive()
    }
}

/// Bind the socket, owner-only (0600). Needs a tokio runtime.
pub fn bind(path: &Path) -> Result<Bound, ControlError> {
    if path.as_os_str().len() > MAX_SOCKET_PATH {
        return Err(ControlError::PathTooLong(path.to_path_buf()));
    }
    let bind_error = |source| ControlError::Bind {
        path: path.to_path_buf(),
        source,
    };
    // A stale socket from a crashed daemon: the repository lock (held by the
    // caller) proves nobody serves it. Anything else there (a link, a
    // file) is refused, never followed or removed.
    let (dir, name) = socket_parts(path);
    let guard = crate::repofs::Root::new(dir).map_err(|e| bind_error(e.into()))?;
    let real = guard
        .prepare_socket(name)
        .map_err(|e| bind_error(e.into()))?;
    let listener = UnixListener::bind(&real).map_err(bind_error)?;
    guard
        .socket_private(name)
        .map_err(|e| bind_error(e.into()))?;
    Ok(Bound {
        listener,
        path: path.to_path_buf(),
        upgrade: None,
        attach: None,
    })
}

impl Bound {
    /// Serve MCP upgrades with `upgrade` (without it they are refused).
    pub fn with_mcp(mut self, upgrade: Upgrade) -> Self {
        self.upgrade = Some(upgrade);
        self
    }

    /// Serve pane attach upgrades with `attach` (without it they are refused).
    pub fn with_attach(mut self, attach: AttachUpgrade) -> Self {
        self.attach = Some(attach);
        self
    }

    /// Answer requests until `shutdown` turns true, then remove the socket.
    pub async fn serve(self, handler: Handler, mut shutdown: watch::Receiver<bool>) {
        let Bound {
            listener,
            path,
            upgrade,
            attach,
        } = self;
        let attach_sessions = Arc::new(tokio::sync::Semaphore::new(MAX_ATTACH_SESSIONS));
        let uid = nix::unistd::getuid().as_raw();
        let mut connections = tokio::task::JoinSet::new();
        // Live connections, oldest first, with whether each still waits for
        // its request (those are the ones the cap evicts).
        let mut live: std::collections::VecDeque<(tokio::task::Id, AbortHandle, Arc<AtomicBool>)> =
            std::collections::VecDeque::new();
        let per_connection = shutdown.clone();
        let mcp_sessions = Arc::new(tokio::sync::Semaphore::new(MAX_MCP_SESSIONS));
        let mut backoff = ACCEPT_BACKOFF_INITIAL;
        loop {
            tokio::select! {
                _ = stopped(&mut shutdown) => break,
                accepted = listener.accept() => {
                    let stream = match accepted {
                        Ok((stream, _)) => {
                            backoff = ACCEPT_BACKOFF_INITIAL;
                            stream
                        }
                        Err(e) => {
                            tracing::warn!("control channel: accept failed: {e}; retrying in {backoff:?}");
                            tokio::select! {
                                _ = stopped(&mut shutdown) => break,
                                () = tokio::time::sleep(backoff) => {}
                            }
                            backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                            continue;
                        }
                    };
                    let cred = stream.peer_cred().ok();
                    if cred.map(|c| c.uid()) != Some(uid) {
                        tracing::warn!("control channel: refused a peer with another uid");
                        continue;
                    }
                    let confined = confined(cred.and_then(|c| c.pid()));
                    if live.len() >= MAX_CONNECTIONS {
                        let idle = live.iter().position(|(_, _, waiting)| waiting.load(Ordering::Relaxed));
                        match idle.and_then(|i| live.remove(i)) {
                            Some((_, handle, _)) => handle.abort(),
                            None => {
                                tokio::spawn(refuse(stream));
                                continue;
                            }
                        }
                    }
                    let waiting = Arc::new(AtomicBool::new(true));
                    let handle = connections.spawn(serve_one(
                        stream,
                        confined,
                        handler.clone(),
                        upgrade.clone().map(|u| (u, mcp_sessions.clone())),
                        attach.clone().map(|a| (a, attach_sessions.clone())),
                        per_connection.clone(),
                        waiting.clone(),
                    ));
                    live.push_back((handle.id(), handle, waiting));
                }
                Some(done) = connections.join_next_with_id(), if !connections.is_empty() => {
                    let id = match done {
                        Ok((id, ())) => id,
                        Err(e) => e.id(),
                    };
                    live.retain(|(live_id, _, _)| *live_id != id);
                }
            }
        }
        connections.shutdown().await;
        let (dir, name) = socket_parts(&path);
        if let Ok(guard) = crate::repofs::Root::new(dir) {
            let _ = guard.remove_socket(name);
        }
    }
}

/// Answer a connection over the cap with an error, then close it.
async fn refuse(stream: UnixStream) {
    let (_, mut write) = stream.into_split();
    let error = format!(
        "the daemon serves {MAX_CONNECTIONS} connections already; try again when some have closed"
    );
    let _ = tokio::time::timeout(WRITE_TIMEOUT, write_line(&mut write, &Reply::error(error))).await;
}

/// Whether the peer `pid` runs in a sandbox: in a user namespace and a
/// mount namespace other than this process's (a sandboxed run's stub makes
/// both; the daemon's other children share its mount namespace). A peer
/// whose namespaces cannot be read counts as confined.
pub fn confined(pid: Option<i32>) -> bool {
    let ns = |pid: &str, kind: &str| std::fs::read_link(format!("/proc/{pid}/ns/{kind}")).ok();
    let Some(pid) = pid.filter(|p| *p > 0).map(|p| p.to_string()) else {
        return true;
    };
    let theirs = ns(&pid, "user").zip(ns(&pid, "mnt"));
    let ours = ns("self", "user").zip(ns("self", "mnt"));
    match (theirs, ours) {
        (Some((user, mnt)), Some((own_user, own_mnt))) => user != own_user && mnt != own_mnt,
        // This process cannot read its own: nothing tells runs apart.
        (_, None) => false,
        (None, Some(_)) => true,
    }
}

/// What a confined peer (a sandboxed run) may ask: the MCP upgrade, with
/// no editor to ask (a sandboxed run has none: a route it names would be
/// its own) and marked confined, so its `run` counts only with the run's
/// secret; nothing else (no approvals, no runs, no triggers, no panes).
fn confine(request: Result<Request, Reply>) -> Result<Request, Reply> {
    match request? {
        Request::Mcp {
            profile,
            run,
            secret,
            ..
        } => Ok(Request::Mcp {
            approval: None,
            profile,
            run,
            secret,
            confined: true,
        }),
        _ => Err(Reply::error(
            "the daemon answers a sandboxed run only its MCP gateway (`npc mcp serve`); its hooks talk to the run's channel; run other npc commands outside the run",
        )),
    }
}

async fn serve_one(
    stream: UnixStream,
    confined: bool,
    handler: Handler,
    upgrade: Option<(Upgrade, Arc<tokio::sync::Semaphore>)>,
    attach: Option<(AttachUpgrade, Arc<tokio::sync::Semaphore>)>,
    mut shutdown: watch::Receiver<bool>,
    waiting: Arc<AtomicBool>,
) {
    let (read, mut write) = stream.into_split();
    let mut reader = LineReader::with_capacity(
        UPGRADED_READ_BYTES,
        read,
        Splitter::new(MAX_REQUEST_BYTES, Overlong::Stop),
    );
    let request = match tokio::time::timeout(REQUEST_TIMEOUT, reader.next()).await {
        Err(_) => Err(Reply::error(format!(
            "no request within {REQUEST_TIMEOUT:?}; send one JSON line right after connecting"
        ))),
        Ok(Ok(Some(Line::Line(line)))) => parse_request(&line),
        Ok(Ok(Some(_))) => Err(Reply::error("request line too long")),
        Ok(Ok(None)) => Err(Reply::error("no request before the connection closed")),
        Ok(Err(e)) => Err(Reply::error(format!("cannot read the request: {e}"))),
    };
    waiting.store(false, Ordering::Relaxed);
    let request = if confined { confine(request) } else { request };
    let request = match (request, upgrade) {
        (Ok(request @ Request::Mcp { .. }), Some((upgrade, sessions))) => {
            let Ok(_session) = sessions.try_acquire_owned() else {
                let error = format!(
                    "the daemon serves {MAX_MCP_SESSIONS} MCP sessions already; close one (an idle `npc mcp serve`) and try again"
                );
                let _ = tokio::time::timeout(
                    WRITE_TIMEOUT,
                    write_line(&mut write, &Reply::error(error)),
                )
                .await;
                return;
            };
            let answer = Reply::Upgraded {
                upgraded: MCP_UPGRADED.to_string(),
            };
            match tokio::time::timeout(WRITE_TIMEOUT, write_line(&mut write, &answer)).await {
                Ok(Ok(())) => {}
                _ => return,
            }
            // Ends with the daemon: the connection task is dropped at shutdown.
            tokio::select! {
                _ = stopped(&mut shutdown) => {}
                () = upgrade(request, reader.into_inner(), write) => {}
            }
            return;
        }
        (Ok(Request::Mcp { .. }), None) => Err(Reply::error("this daemon serves no MCP gateway")),
        (Ok(request @ Request::PaneAttach { .. }), _) => {
            let Some((attach, sessions)) = attach else {
                let error = "this daemon serves no panes";
                let _ = tokio::time::timeout(
                    WRITE_TIMEOUT,
                    write_line(&mut write, &Reply::error(error)),
                )
                .await;
                return;
            };
            let Ok(_session) = sessions.try_acquire_owned() else {
                let error = format!(
                    "the daemon serves {MAX_ATTACH_SESSIONS} attached terminals already; detach one and try again"
                );
                let _ = tokio::time::timeout(
                    WRITE_TIMEOUT,
                    write_line(&mut write, &Reply::error(error)),
                )
                .await;
                return;
            };
            // The attach handler answers (or refuses) itself.
            tokio::select! {
                _ = stopped(&mut shutdown) => {}
                () = attach(request, reader.into_inner(), write) => {}
            }
            return;
        }
        (request, _) => request,
    };
    let request = match request {
        Ok(r) => r,
        Err(error) => {
            let _ = tokio::time::timeout(WRITE_TIMEOUT, write_line(&mut write, &error)).await;
            return;
        }
    };
    let (tx, mut rx) = mpsc::channel(RESPONSE_QUEUE);
    // Aborted when this connection ends, however it ends (an evicted or
    // shut-down connection is dropped mid-await).
    let _work = AbortOnDrop(tokio::spawn(handler(request, tx)).abort_handle());
    // A client sends nothing after its request, so reading ends only when
    // it closes: a follower that died or was killed ends its connection
    // now, not at the next event (until then it would hold a place under
    // the cap that the cap cannot evict). A client that only shut down its
    // sending side still gets its answers.
    let mut rest = reader.into_inner();
    let mut sink = [0u8; 64];
    let mut watching = true;
    loop {
        tokio::select! {
            _ = stopped(&mut shutdown) => break,
            read = rest.read(&mut sink), if watching => match read {
                Ok(0) | Err(_) if peer_gone(rest.get_ref().as_ref()) => break,
                Ok(0) | Err(_) => watching = false,
                Ok(_) => {}
            },
            next = rx.recv() => match next {
                Some(value) => {
                    match tokio::time::timeout(WRITE_TIMEOUT, write_line(&mut write, &value)).await {
                        Ok(Ok(())) => {}
                        _ => break, // the client went away or stopped reading
                    }
                }
                None => break,
            }
        }
    }
    let _ = write.shutdown().await;
}

/// A request line: its protocol version first (a client of another version
/// gets an error naming both, whatever else its line holds), then the
/// request.
fn parse_request(line: &[u8]) -> Result<Request, Reply> {
    let mut value: serde_json::Value =
        serde_json::from_slice(line).map_err(|e| Reply::error(format!("bad request: {e}")))?;
    let Some(fields) = value.as_object_mut() else {
        return Err(Reply::error("bad request: not a JSON object"));
    };
    match fields.remove(PROTOCOL_FIELD) {
        Some(v) if v.as_u64() == Some(u64::from(PROTOCOL_VERSION)) => {}
        Some(v) => return Err(Reply::skew(Some(v.as_u64().unwrap_or_default()))),
        None => return Err(Reply::skew(None)),
    }
    serde_json::from_value(value).map_err(|e| Reply::error(format!("bad request: {e}")))
}

/// Whether the peer of `stream` closed entirely (not only its sending side).
fn peer_gone(stream: &UnixStream) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd as _;
    let mut fds = [PollFd::new(stream.as_fd(), PollFlags::POLLOUT)];
    poll(&mut fds, PollTimeout::ZERO).is_ok()
        && fds[0]
            .revents()
            .is_some_and(|r| r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR))
}

/// Aborts a task when dropped.
#[derive(Debug)]
struct AbortOnDrop(AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Resolves once `rx` holds `true` (or its sender is gone).
pub async fn stopped(rx: &mut watch::Receiver<bool>) {
    loop {
        if *rx.borrow_and_update() {
            return;
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// Write `value` as one JSON line.
pub async fn write_line(
    w: &mut (impl AsyncWriteExt + Unpin),
    value: &(impl Serialize + ?Sized),
) -> std::io::Result<()> {
    w.write_all(&encode(value).map_err(std::io::Error::other)?)
        .await
}

/// Connect to the daemon at `path` and upgrade the connection to an MCP
/// session with its gateway; MCP frames go to the returned writer and come
/// from the returned reader.
pub async fn connect_mcp(
    path: &Path,
    request: &Request,
) -> Result<(UpgradedRead, tokio::net::unix::OwnedWriteHalf), ControlError> {
    let (reader, write, answer) = connect_upgrade(path, request).await?;
    match answer {
        Reply::Upgraded { upgraded } if upgraded == MCP_UPGRADED => Ok((reader, write)),
        other => Err(ControlError::unexpected(&other)),
    }
}

/// Connect to the daemon's control socket at `path` (within
/// [`CLIENT_TIMEOUT`]) and send `request` as one line; the connection's
/// halves are the caller's to read the answer from.
async fn send_request(
    path: &Path,
    request: &Request,
) -> Result<
    (
        tokio::net::unix::OwnedReadHalf,
        tokio::net::unix::OwnedWriteHalf,
    ),
    ControlError,
> {
    let stream = tokio::time::timeout(CLIENT_TIMEOUT, UnixStream::connect(path))
        .await
        .map_err(|_| ControlError::Timeout(CLIENT_TIMEOUT))?
        .map_err(|source| ControlError::Connect {
            path: path.to_path_buf(),
            source,
        })?;
    let (read, mut write) = stream.into_split();
    let request = Envelope {
        protocol: client_protocol(),
        request,
    };
    write_line(&mut write, &request).await?;
    Ok((read, write))
}

/// Send an upgrading `request` (MCP, pane attach) and read the daemon's
/// one answer line; the connection then carries the upgraded protocol.
pub async fn connect_upgrade(
    path: &Path,
    request: &Request,
) -> Result<(UpgradedRead, tokio::net::unix::OwnedWriteHalf, Reply), ControlError> {
    let (read, write) = send_request(path, request).await?;
    let mut reader = LineReader::with_capacity(
        UPGRADED_READ_BYTES,
        read,
        Splitter::new(MAX_REQUEST_BYTES, Overlong::Stop),
    );
    let line = tokio::time::timeout(CLIENT_TIMEOUT, reader.next())
        .await
        .map_err(|_| ControlError::Timeout(CLIENT_TIMEOUT))??;
    let answer = match line {
        Some(Line::Line(line)) => decode_reply(&line)?,
        _ => return Err(ControlError::Protocol("no answer to the upgrade".into())),
    };
    Ok((reader.into_inner(), write, answer))
}

/// The protocol version this client sends: [`PROTOCOL_VERSION`], unless
/// `NPC_TEST_CONTROL_PROTOCOL` makes it claim another (a test seam: an
/// npc of another version is not at hand in a test).
fn client_protocol() -> u32 {
    std::env::var(PROTOCOL_OVERRIDE_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(PROTOCOL_VERSION)
}

/// See [`client_protocol`].
pub const PROTOCOL_OVERRIDE_ENV: &str = "NPC_TEST_CONTROL_PROTOCOL";

/// One answer line of the daemon, parsed once: an error answer is an
/// error (a version skew named as one), anything that is not a [`Reply`]
/// a protocol error.
fn decode_reply(line: &[u8]) -> Result<Reply, ControlError> {
    let reply = match serde_json::from_slice::<Reply>(line) {
        Ok(reply) => reply,
        Err(e) => {
            // A daemon of protocol 1 answers untyped JSON; its refusal of
            // this client's `protocol` field names the field.
            let old: Option<serde_json::Value> = serde_json::from_slice(line).ok();
            if let Some(error) = old.as_ref().and_then(|v| v["error"].as_str())
                && error.contains(PROTOCOL_FIELD)
            {
                return Err(ControlError::VersionSkew {
                    cli: client_protocol(),
                    daemon: "1".to_string(),
                });
            }
            return Err(ControlError::Protocol(format!(
                "the daemon's answer is not one of protocol version {PROTOCOL_VERSION}: {e}"
            )));
        }
    };
    match reply {
        // Only a refusal of the client's version carries the daemon's.
        Reply::Error {
            protocol: Some(daemon),
            ..
        } => Err(ControlError::VersionSkew {
            cli: client_protocol(),
            daemon: daemon.to_string(),
        }),
        Reply::Error { error, .. } => Err(ControlError::Refused(error)),
        reply => Ok(reply),
    }
}

/// A connection to a running daemon.
#[derive(Debug)]
pub struct Client {
    lines: LineReader<tokio::net::unix::OwnedReadHalf>,
    _write: tokio::net::unix::OwnedWriteHalf,
}

impl Client {
    /// Send `request`; read the answer with [`Client::next`].
    pub async fn request(path: &Path, request: &Request) -> Result<Self, ControlError> {
        let (read, write) = send_request(path, request).await?;
        Ok(Self {
            lines: LineReader::new(read, Splitter::new(MAX_ANSWER_BYTES, Overlong::Stop)),
            _write: write,
        })
    }

    /// The next answer line, `None` at the end. `wait` bounds the wait.
    pub async fn next(&mut self, wait: Option<Duration>) -> Result<Option<Reply>, ControlError> {
        let line = match wait {
            Some(limit) => tokio::time::timeout(limit, self.lines.next())
                .await
                .map_err(|_| ControlError::Timeout(limit))??,
            None => self.lines.next().await?,
        };
        let line = match line {
            None => return Ok(None),
            Some(Line::Line(line)) => line,
            Some(_) => {
                return Err(ControlError::Protocol(format!(
                    "the daemon answered a line longer than {MAX_ANSWER_BYTES} bytes"
                )));
            }
        };
        decode_reply(&line).map(Some)
    }

    /// Send `request` and return its single answer.
    pub async fn call(path: &Path, request: &Request) -> Result<Reply, ControlError> {
        let mut client = Self::request(path, request).await?;
        client
            .next(Some(CLIENT_TIMEOUT))
            .await?
            .ok_or_else(|| ControlError::Protocol("empty answer".into()))
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn a_confined_peer_gets_the_mcp_upgrade_without_an_editor_and_nothing_else() {
        let mcp = Request::Mcp {
            approval: Some(super::super::runs::ApprovalRoute {
                socket: "npc-acp-approval-00000000000000000000000000000000".into(),
                session: "s".into(),
            }),
            profile: Some("p".into()),
            run: Some("run-1".into()),
            secret: None,
            confined: false,
        };
        match confine(Ok(mcp)) {
            Ok(Request::Mcp {
                approval,
                run,
                confined,
                ..
            }) => {
                assert!(approval.is_none());
                assert!(confined);
                assert_eq!(run.as_deref(), Some("run-1"));
            }
            other => panic!("{other:?}"),
        }
        for refused in [
            Request::Status,
            Request::ApproveRun {
                id: "run-1".into(),
                always: true,
                approval: None,
            },
            Request::FireTrigger {
                name: "t".into(),
                payload: None,
            },
            Request::PaneSend {
                name: "p".into(),
                text: "x".into(),
            },
        ] {
            assert!(confine(Ok(refused)).is_err());
        }
        // A client cannot say it is not confined: the field is the server's.
        let line = r#"{"op":"mcp","protocol":2,"confined":false}"#;
        assert!(parse_request(line.as_bytes()).is_err());
        // This process is not confined to itself.
        assert!(!confined(Some(std::process::id() as i32)));
        assert!(confined(None));
    }
    use tokio::io::AsyncBufReadExt as _;

    fn echo_handler() -> Handler {
        Arc::new(|req, tx| {
            Box::pin(async move {
                match req {
                    Request::Events { since, .. } => {
                        for i in since.unwrap_or(0)..3 {
                            let event = serde_json::json!({ "id": i });
                            let _ = tx.send(Reply::Event { event }).await;
                        }
                    }
                    other => {
                        let echo = Reply::PaneClosed {
                            closed: format!("{other:?}"),
                        };
                        let _ = tx.send(echo).await;
                    }
                }
            })
        })
    }

    #[tokio::test]
    async fn requests_and_streams_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = socket_path(dir.path());
        let (stop_tx, stop_rx) = watch::channel(false);
        let server = tokio::spawn(bind(&path).unwrap().serve(echo_handler(), stop_rx));
        let answer = Client::call(&path, &Request::Status).await.unwrap();
        assert_eq!(
            answer,
            Reply::PaneClosed {
                closed: "Status".into()
            }
        );
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let mut c = Client::request(
            &path,
            &Request::Events {
                since: Some(1),
                follow: false,
            },
        )
        .await
        .unwrap();
        let mut ids = Vec::new();
        while let Some(v) = c.next(Some(Duration::from_secs(5))).await.unwrap() {
            let Reply::Event { event } = v else {
                panic!("{v:?}")
            };
            ids.push(event["id"].as_i64().unwrap());
        }
        assert_eq!(ids, vec![1, 2]);
        stop_tx.send(true).unwrap();
        server.await.unwrap();
        assert!(!path.exists(), "socket removed on shutdown");
    }

    #[tokio::test]
    async fn connections_over_the_cap_evict_idle_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = socket_path(dir.path());
        let (stop_tx, stop_rx) = watch::channel(false);
        let server = tokio::spawn(bind(&path).unwrap().serve(echo_handler(), stop_rx));
        let mut idle = Vec::new();
        for _ in 0..MAX_CONNECTIONS + 20 {
            idle.push(UnixStream::connect(&path).await.unwrap());
        }
        let answer = tokio::time::timeout(
            Duration::from_secs(10),
            Client::call(&path, &Request::Status),
        )
        .await
        .unwrap()
        .unwrap();
        assert_eq!(
            answer,
            Reply::PaneClosed {
                closed: "Status".into()
            }
        );
        // The oldest idle connection was closed by the server.
        let mut first = idle.remove(0);
        let mut buf = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(10), first.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(read, 0, "evicted connection reads end of file");
        stop_tx.send(true).unwrap();
        server.await.unwrap();
    }

    #[test]
    fn a_request_of_another_protocol_version_is_refused_naming_both() {
        for (line, client) in [
            (r#"{"op":"status"}"#.to_string(), "version 1"),
            (r#"{"protocol":7,"op":"status"}"#.to_string(), "version 7"),
            // Whatever else the line holds: the version is read first.
            (
                r#"{"protocol":1,"op":"from_the_future"}"#.to_string(),
                "version 1",
            ),
        ] {
            let Err(Reply::Error { error, protocol }) = parse_request(line.as_bytes()) else {
                panic!("{line} was taken");
            };
            assert_eq!(protocol, Some(PROTOCOL_VERSION));
            assert!(error.contains(client), "{error}");
            assert!(
                error.contains(&format!("version {PROTOCOL_VERSION}")),
                "{error}"
            );
            assert!(error.contains("restart the daemon"), "{error}");
        }
        let line = format!(r#"{{"protocol":{PROTOCOL_VERSION},"op":"status"}}"#);
        assert_eq!(parse_request(line.as_bytes()), Ok(Request::Status));
    }

    #[test]
    fn an_error_answer_is_an_error_and_a_skew_names_both_versions() {
        let refused = br#"{"reply":"error","error":"no run `x`"}"#;
        assert!(
            matches!(decode_reply(refused), Err(ControlError::Refused(e)) if e == "no run `x`")
        );
        let skew = br#"{"reply":"error","error":"other","protocol":9}"#;
        let e = decode_reply(skew).unwrap_err().to_string();
        assert!(
            e.contains(&format!("version {PROTOCOL_VERSION}")) && e.contains("version 9"),
            "{e}"
        );
        // A daemon of protocol 1 refuses the field it does not know.
        let old = br#"{"error":"bad request: unknown field `protocol`, expected `op`"}"#;
        assert!(matches!(
            decode_reply(old),
            Err(ControlError::VersionSkew { .. })
        ));
        // Untyped JSON is no answer, not a default.
        assert!(matches!(
            decode_reply(br#""{}""#),
            Err(ControlError::Protocol(_))
        ));
    }

    #[tokio::test]
    async fn malformed_and_oversized_requests_get_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = socket_path(dir.path());
        let (stop_tx, stop_rx) = watch::channel(false);
        let server = tokio::spawn(bind(&path).unwrap().serve(echo_handler(), stop_rx));
        let connect = || async { UnixStream::connect(&path).await.unwrap() };
        for bad in [
            b"{\"op\":\"nope\"}\n".to_vec(),
            b"not json\n".to_vec(),
            vec![b'x'; MAX_REQUEST_BYTES + 10],
        ] {
            let s = connect().await;
            let (r, mut w) = s.into_split();
            let _ = w.write_all(&bad).await;
            let _ = w.shutdown().await;
            let mut lines = BufReader::new(r).lines();
            let line = tokio::time::timeout(Duration::from_secs(5), lines.next_line())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            assert!(line.contains("error"), "{line}");
        }
        stop_tx.send(true).unwrap();
        server.await.unwrap();
    }
}
