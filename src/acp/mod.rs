//! `npc acp`: npc as an Agent Client Protocol agent for editors (Zed, VS
//! Code). Newline-delimited JSON-RPC 2.0 on stdio ([`frame`]; stdout carries
//! only protocol frames, logs go to stderr), the wire types of the
//! `agent-client-protocol-schema` crate (ACP v1). A session is a sequence
//! of runs of one manifest profile: `session/prompt` is one run — of the
//! daemon when one holds the repository (a `surfaces::runs::LocalRun` queued
//! over the control socket, followed in the store by `runs::follow`), else
//! of this process like `npc run` (`runs::here`) —
//! recorded in the event log like any run, its parsed agent events streamed
//! back as `session/update`s ([`map`]) and its outcome the stop reason
//! (`_meta.npc.ranIn` says where it ran). `session/cancel` ends the
//! prompt's run by killing the agent's process group (through the daemon
//! for its runs). A `before_tool` hook answering `ask`, or a profile's
//! `ask_tools` ([`crate::hooks::policy`]), inside the agent's own hook
//! (`npc hook run`) or npc's gateway reaches this process over the approval
//! socket ([`crate::surfaces::approval`]) and becomes a
//! `session/request_permission` to the editor, whose answer is the
//! decision. Sessions live in the store (`store::acp`), so `session/list`,
//! `session/load` (replaying the runs' recorded events), `session/resume`
//! and `session/fork` work across restarts. A later prompt of a session
//! resumes the provider's own conversation where the CLI can
//! (`providers::resume`: Claude Code `--resume`, and `--fork-session` for a
//! fork's first prompt; OpenCode `--session`); Codex and Gemini CLI start
//! a fresh conversation per prompt. Every bound is a constant here or in
//! [`frame`] / [`map`].

pub mod frame;
pub mod map;

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_client_protocol_schema::v1::{
    AgentCapabilities, AvailableCommand as Slash, AvailableCommandInput, AvailableCommandsUpdate,
    CancelNotification, ContentBlock, ContentChunk, EmbeddedResourceResource, ForkSessionRequest,
    ForkSessionResponse, Implementation, InitializeResponse, ListSessionsRequest,
    ListSessionsResponse, LoadSessionRequest, LoadSessionResponse, McpCapabilities,
    NewSessionRequest, NewSessionResponse, PermissionOption, PermissionOptionKind,
    PromptCapabilities, PromptRequest, PromptResponse, RequestPermissionRequest,
    ResumeSessionRequest, ResumeSessionResponse, SessionCapabilities, SessionForkCapabilities,
    SessionInfo, SessionListCapabilities, SessionNotification, SessionResumeCapabilities,
    SessionUpdate, StopReason, ToolCallStatus, ToolCallUpdate, ToolCallUpdateFields,
    UnstructuredCommandInput,
};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _};
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::bus::EventBus;
use crate::hooks::{ApprovalRequest, HookRunner};
use crate::model::Manifest;
use crate::runs::follow::{Follower, Step};
use crate::runs::here::Here;
use crate::runs::{self, Origin, Outcome, PromptChoice, RunRequest};
use crate::stdx::lines::{Line, LineReader, Overlong, Splitter};
use crate::store::Store;
use crate::store::acp::AcpSession;
use crate::supervisor::Supervisor;
use crate::surfaces::approval::{self, Answer, Asked};
use crate::surfaces::control::{Client, ControlError, Request};
pub use crate::surfaces::runs::SESSION_ID_PREFIX;
use crate::surfaces::runs::{ApprovalRoute, LocalRun, MAX_DAEMON_PROMPT_BYTES, Resume};
use agent_client_protocol_schema::ProtocolVersion;
use frame::{BUSY, INTERNAL_ERROR, INVALID_PARAMS, Incoming, RESOURCE_NOT_FOUND};

/// Requests from the client handled at once; more are refused (`-32000`).
pub const MAX_INFLIGHT_REQUESTS: usize = 64;
/// npc's own requests to the client (permission questions) waiting for an
/// answer; more are denied without asking.
pub const MAX_PENDING_REQUESTS: usize = 32;
/// Sessions held in memory by one connection; the least recently used
/// idle one is dropped from memory (it stays in the store) to make room.
pub const MAX_SESSIONS: usize = 128;
/// Sessions one `session/list` page returns.
pub const SESSIONS_PER_PAGE: usize = 50;
/// Questions from the approval socket waiting to be put to the client.
pub const APPROVAL_QUEUE: usize = 16;
/// Longest a prompt's text may be after its content blocks are joined.
pub const MAX_PROMPT_BYTES: usize = frame::MAX_LINE_BYTES;
/// Characters of the first prompt kept as a session's title.
pub const MAX_TITLE_CHARS: usize = 80;
/// The "signal" a cancelled prompt's run records (SIGTERM: the editor asked it to stop).
pub const CANCEL_SIGNAL: i32 = nix::sys::signal::Signal::SIGTERM as i32;
/// Key of npc's extensions in `_meta` objects.
pub const META_KEY: &str = "npc";
/// `ranIn` of a prompt response whose run the daemon carried out.
pub const RAN_IN_DAEMON: &str = "daemon";
/// `ranIn` of a prompt response whose run this `npc acp` carried out.
pub const RAN_IN_ACP: &str = "acp";
/// Why `npc acp` could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum AcpError {
    #[error(
        "no profile to run: pass `--profile NAME` (the manifest has {known}), or give the manifest one profile or one named `default`"
    )]
    NoProfile { known: String },
    #[error("no profile `{name}` in the manifest; known profiles: {known}")]
    UnknownProfile { name: String, known: String },
    #[error("cannot bind the approval socket: {0}")]
    Approval(std::io::Error),
    #[error("cannot read or write the standard streams: {0}")]
    Io(#[from] std::io::Error),
}

/// What one `npc acp` serves.
#[derive(Debug, Clone)]
pub struct Config {
    pub manifest: Manifest,
    /// The repository root.
    pub root: PathBuf,
    /// The profile new sessions run (checked by [`Config::new`]).
    pub profile: String,
    pub store: Arc<Store>,
    pub bus: EventBus,
    pub supervisor: Supervisor,
    /// The manifest's hooks (for the runs' model and agent events).
    pub hooks: Arc<HookRunner>,
    /// Each run's timeout.
    pub timeout: Duration,
    /// The repository's paths, to find the daemon holding it at each
    /// prompt (`None`: prompts always run in this process).
    pub daemon: Option<crate::runtime::RepoPaths>,
}

/// The profile `npc acp` runs: `requested`, else the manifest's only
/// profile, else one named `default`.
pub fn choose_profile(manifest: &Manifest, requested: Option<&str>) -> Result<String, AcpError> {
    let known = || {
        let names: Vec<String> = manifest.profiles.keys().map(|n| format!("`{n}`")).collect();
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        }
    };
    match requested {
        Some(name) if manifest.profiles.contains_key(name) => Ok(name.to_string()),
        Some(name) => Err(AcpError::UnknownProfile {
            name: name.to_string(),
            known: known(),
        }),
        None if manifest.profiles.len() == 1 => {
            Ok(manifest.profiles.keys().next().cloned().unwrap_or_default())
        }
        None if manifest.profiles.contains_key("default") => Ok("default".to_string()),
        None => Err(AcpError::NoProfile { known: known() }),
    }
}

/// One session held in memory.
#[derive(Debug)]
struct Session {
    record: AcpSession,
    /// The running prompt's cancel switch and its permission questions' cancel.
    active: Mutex<Option<Active>>,
}

#[derive(Debug)]
struct Active {
    cancel: Option<oneshot::Sender<()>>,
    /// Fires when the prompt ends or is cancelled (pending questions are denied).
    ended: tokio::sync::watch::Receiver<bool>,
}

/// The agent side of one connection.
#[derive(Debug)]
struct Agent {
    config: Config,
    out: mpsc::UnboundedSender<Value>,
    next_id: AtomicI64,
    pending: Mutex<HashMap<i64, oneshot::Sender<Result<Value, Value>>>>,
    sessions: Mutex<VecDeque<Arc<Session>>>,
    approval_name: String,
}

/// Serve ACP on `input`/`output` until the client closes `input` or `stop`
/// resolves; either way running prompts are cancelled first (in-process
/// agents' groups killed, the daemon's runs cancelled through it).
pub async fn serve<R, W>(
    config: Config,
    input: R,
    output: W,
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), AcpError>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    tokio::pin!(stop);
    let listener = approval::bind().map_err(AcpError::Approval)?;
    let (out, mut frames) = mpsc::unbounded_channel::<Value>();
    let writer = tokio::spawn(async move {
        let mut output = output;
        while let Some(frame) = frames.recv().await {
            let line = crate::stdx::lines::encode(&frame).unwrap_or_default();
            if output.write_all(&line).await.is_err() || output.flush().await.is_err() {
                break;
            }
        }
    });
    let agent = Arc::new(Agent {
        config,
        out,
        next_id: AtomicI64::new(1),
        pending: Mutex::new(HashMap::new()),
        sessions: Mutex::new(VecDeque::new()),
        approval_name: listener.name().to_string(),
    });
    let (asked_tx, mut asked) = mpsc::channel::<Asked>(APPROVAL_QUEUE);
    let approvals = tokio::spawn(listener.serve(asked_tx));
    let asker = {
        let agent = agent.clone();
        tokio::spawn(async move {
            while let Some((question, reply)) = asked.recv().await {
                let agent = agent.clone();
                tokio::spawn(async move {
                    let answer = agent
                        .ask_permission(&question.session, question.request)
                        .await;
                    let _ = reply.send(answer);
                });
            }
        })
    };
    let inflight = Arc::new(Semaphore::new(MAX_INFLIGHT_REQUESTS));
    let mut lines = LineReader::new(input, Splitter::new(frame::MAX_LINE_BYTES, Overlong::Skip));
    let result = loop {
        let next = tokio::select! {
            next = lines.next() => next,
            () = &mut stop => break Ok(()),
        };
        let line = match next {
            Ok(Some(line)) => line,
            Ok(None) => break Ok(()),
            Err(e) => break Err(AcpError::Io(e)),
        };
        let incoming = match line {
            Line::TooLong { bytes } => Incoming::Invalid {
                id: Value::Null,
                error: frame::error(
                    frame::INVALID_REQUEST,
                    &format!(
                        "the frame is {bytes} bytes, more than the {} npc reads; send smaller frames",
                        frame::MAX_LINE_BYTES
                    ),
                ),
            },
            Line::Line(bytes) | Line::Truncated(bytes) => frame::classify(&bytes),
        };
        match incoming {
            Incoming::Empty => {}
            Incoming::Invalid { id, error } => agent.send(frame::response(id, Err(error))),
            Incoming::Response { id, outcome } => {
                let waiting = id
                    .as_i64()
                    .and_then(|id| agent.pending.lock().ok()?.remove(&id));
                match waiting {
                    Some(tx) => {
                        let _ = tx.send(outcome);
                    }
                    None => tracing::warn!("acp: a response to no request of npc's (id {id})"),
                }
            }
            Incoming::Notification { method, params } => agent.notification(&method, params),
            Incoming::Request { id, method, params } => {
                let Ok(permit) = inflight.clone().try_acquire_owned() else {
                    agent.send(frame::response(
                        id,
                        Err(frame::error(
                            BUSY,
                            &format!(
                                "more than {MAX_INFLIGHT_REQUESTS} requests are in flight; wait for answers before sending more"
                            ),
                        )),
                    ));
                    continue;
                };
                let agent = agent.clone();
                tokio::spawn(async move {
                    let mut announce = None;
                    let outcome = agent.request(&method, params, &mut announce).await;
                    agent.send(frame::response(id, outcome));
                    // A session's commands follow the response that named it.
                    if let Some(session) = announce {
                        agent.announce_commands(&session);
                    }
                    drop(permit);
                });
            }
        }
    };
    // The client is gone: stop every running prompt (their agents' groups
    // are killed), then let the writer drain.
    let sessions: Vec<Arc<Session>> = agent
        .sessions
        .lock()
        .map(|s| s.iter().cloned().collect())
        .unwrap_or_default();
    for s in sessions {
        cancel(&s);
    }
    approvals.abort();
    asker.abort();
    let deadline = runs::POST_EXIT_DRAIN + Duration::from_secs(5);
    let _ = tokio::time::timeout(deadline, async {
        while inflight.available_permits() < MAX_INFLIGHT_REQUESTS {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    drop(agent);
    let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
    result
}

fn cancel(session: &Session) {
    if let Ok(mut active) = session.active.lock()
        && let Some(active) = active.as_mut()
        && let Some(cancel) = active.cancel.take()
    {
        let _ = cancel.send(());
    }
}

fn invalid_params(e: impl std::fmt::Display) -> Value {
    frame::error(INVALID_PARAMS, &format!("invalid params: {e}"))
}

fn params<T: for<'de> serde::Deserialize<'de>>(params: Value) -> Result<T, Value> {
    let params = if params.is_null() { json!({}) } else { params };
    serde_json::from_value(params).map_err(invalid_params)
}

fn to_value(v: impl serde::Serialize) -> Result<Value, Value> {
    serde_json::to_value(v).map_err(|e| frame::error(INTERNAL_ERROR, &e.to_string()))
}

fn internal(e: impl std::fmt::Display) -> Value {
    frame::error(INTERNAL_ERROR, &e.to_string())
}

fn meta(value: Value) -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
    m.insert(META_KEY.to_string(), value);
    m
}

impl Agent {
    fn send(&self, frame: Value) {
        let _ = self.out.send(frame);
    }

    fn update(&self, session: &str, update: SessionUpdate) {
        let note = SessionNotification::new(session.to_string(), update);
        if let Ok(params) = serde_json::to_value(note) {
            self.send(frame::message(None, "session/update", params));
        }
    }

    fn notification(self: &Arc<Self>, method: &str, params: Value) {
        if method == "session/cancel" {
            match serde_json::from_value::<CancelNotification>(params) {
                Ok(c) => {
                    if let Some(s) = self.session(&c.session_id.0) {
                        cancel(&s);
                    }
                }
                Err(e) => tracing::warn!("acp: a `session/cancel` with invalid params: {e}"),
            }
        }
        // Other notifications (`$/…` extensions) are ignored, as JSON-RPC asks.
    }

    /// Answer one request; `announce` names a session whose available
    /// commands go out after the response.
    async fn request(
        self: &Arc<Self>,
        method: &str,
        p: Value,
        announce: &mut Option<String>,
    ) -> Result<Value, Value> {
        let (result, session) = match method {
            "session/new" => self.new_session(params(p)?).await?,
            "session/load" => self.load(params(p)?).await?,
            "session/resume" => self.resume(params(p)?).await?,
            "session/fork" => self.fork(params(p)?).await?,
            _ => return self.plain_request(method, p).await,
        };
        *announce = Some(session);
        Ok(result)
    }

    async fn plain_request(self: &Arc<Self>, method: &str, p: Value) -> Result<Value, Value> {
        match method {
            "initialize" => self.initialize(),
            "authenticate" => Ok(json!({})),
            "session/prompt" => self.prompt(params(p)?).await,
            "session/list" => self.list(params(p)?),
            "session/cancel" => {
                self.notification(method, p);
                Ok(Value::Null)
            }
            other => Err(frame::method_not_found(other)),
        }
    }

    fn initialize(&self) -> Result<Value, Value> {
        let m = &self.config.manifest;
        let profiles: Vec<Value> = m
            .profiles
            .iter()
            .map(|(name, p)| {
                json!({
                    "name": name,
                    "provider": p.provider,
                    "description": p.description,
                    "mcpServers": p.mcp_servers,
                })
            })
            .collect();
        let caps = AgentCapabilities::new()
            .load_session(true)
            .prompt_capabilities(PromptCapabilities::new().embedded_context(true))
            .mcp_capabilities(McpCapabilities::new())
            .session_capabilities(
                SessionCapabilities::new()
                    .list(SessionListCapabilities::new())
                    .resume(SessionResumeCapabilities::new())
                    .fork(SessionForkCapabilities::new()),
            )
            .meta(meta(json!({
                "profile": self.config.profile,
                "profiles": profiles,
                "mcpServers": self.profile_servers(&self.config.profile),
                "commands": self.commands().iter().map(|c| c.name.clone()).collect::<Vec<_>>(),
            })));
        to_value(
            InitializeResponse::new(ProtocolVersion::V1)
                .agent_capabilities(caps)
                .agent_info(Implementation::new("npc", env!("CARGO_PKG_VERSION")).title("npc")),
        )
    }

    /// The MCP servers `profile` gives its agent.
    fn profile_servers(&self, profile: &str) -> Vec<String> {
        self.config
            .manifest
            .profiles
            .get(profile)
            .map(|p| p.mcp_servers.clone())
            .unwrap_or_default()
    }

    /// The manifest's prompts as slash commands.
    fn commands(&self) -> Vec<Slash> {
        self.config
            .manifest
            .prompts
            .iter()
            .map(|(name, p)| {
                let first = p
                    .template
                    .lines()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or("");
                let description: String = first.trim().chars().take(MAX_TITLE_CHARS).collect();
                let mut c = Slash::new(name.clone(), description);
                if !p.variables.is_empty() {
                    let hint = p
                        .variables
                        .keys()
                        .map(|k| format!("{k}=…"))
                        .collect::<Vec<_>>()
                        .join(" ");
                    c = c.input(AvailableCommandInput::Unstructured(
                        UnstructuredCommandInput::new(hint),
                    ));
                }
                c
            })
            .collect()
    }

    fn announce_commands(&self, session: &str) {
        self.update(
            session,
            SessionUpdate::AvailableCommandsUpdate(AvailableCommandsUpdate::new(self.commands())),
        );
    }

    fn session(&self, id: &str) -> Option<Arc<Session>> {
        let mut sessions = self.sessions.lock().ok()?;
        let at = sessions.iter().position(|s| s.record.id == id)?;
        let s = sessions.remove(at)?;
        sessions.push_back(s.clone());
        Some(s)
    }

    /// Hold `record` in memory (making room by dropping the least recently
    /// used idle session), or refuse when every slot runs a prompt.
    fn hold(&self, record: AcpSession) -> Result<Arc<Session>, Value> {
        let mut sessions = self.sessions.lock().map_err(internal)?;
        if let Some(s) = sessions.iter().find(|s| s.record.id == record.id) {
            return Ok(s.clone());
        }
        if sessions.len() >= MAX_SESSIONS {
            let idle = sessions
                .iter()
                .position(|s| s.active.lock().map(|a| a.is_none()).unwrap_or(false));
            match idle {
                Some(at) => {
                    sessions.remove(at);
                }
                None => {
                    return Err(frame::error(
                        BUSY,
                        &format!(
                            "{MAX_SESSIONS} sessions are running prompts; wait for one to end"
                        ),
                    ));
                }
            }
        }
        let s = Arc::new(Session {
            record,
            active: Mutex::new(None),
        });
        sessions.push_back(s.clone());
        Ok(s)
    }

    /// A stored session by id (held in memory from now on).
    fn stored(&self, id: &str) -> Result<Arc<Session>, Value> {
        if let Some(s) = self.session(id) {
            return Ok(s);
        }
        let record = self
            .config
            .store
            .acp_session(id)
            .map_err(internal)?
            .ok_or_else(|| {
                frame::error(
                    RESOURCE_NOT_FOUND,
                    &format!("no session `{}`; list them with `session/list`", clip(id)),
                )
            })?;
        self.hold(record)
    }

    async fn create(&self, cwd: PathBuf, forked_from: Option<String>) -> Result<String, Value> {
        let now = crate::store::now_ms();
        let id = runs::new_run_id().replacen(runs::RUN_ID_PREFIX, SESSION_ID_PREFIX, 1);
        let record = AcpSession {
            id: id.clone(),
            profile: self.config.profile.clone(),
            cwd: cwd.display().to_string(),
            title: None,
            forked_from,
            created_at_ms: now,
            updated_at_ms: now,
        };
        self.config
            .store
            .create_acp_session(record.clone())
            .await
            .map_err(internal)?;
        self.hold(record)?;
        Ok(id)
    }

    fn session_meta(&self, profile: &str) -> serde_json::Map<String, Value> {
        meta(json!({
            "profile": profile,
            "mcpServers": self.profile_servers(profile),
        }))
    }

    async fn new_session(&self, req: NewSessionRequest) -> Result<(Value, String), Value> {
        let id = self.create(req.cwd, None).await?;
        let response = to_value(
            NewSessionResponse::new(id.clone()).meta(self.session_meta(&self.config.profile)),
        )?;
        Ok((response, id))
    }

    fn list(&self, req: ListSessionsRequest) -> Result<Value, Value> {
        let cwd = req.cwd.as_ref().map(|c| c.display().to_string());
        let cursor = match req.cursor.as_deref() {
            None => None,
            Some(c) => Some(
                c.split_once(':')
                    .and_then(|(ms, id)| Some((ms.parse::<i64>().ok()?, id.to_string())))
                    .ok_or_else(|| invalid_params("`cursor` is not one npc gave"))?,
            ),
        };
        let rows = self
            .config
            .store
            .acp_sessions(
                cwd.as_deref(),
                cursor.as_ref().map(|(ms, id)| (*ms, id.as_str())),
                SESSIONS_PER_PAGE + 1,
            )
            .map_err(internal)?;
        let more = rows.len() > SESSIONS_PER_PAGE;
        let page = &rows[..rows.len().min(SESSIONS_PER_PAGE)];
        let sessions: Vec<SessionInfo> = page
            .iter()
            .map(|s| {
                let updated = chrono::DateTime::from_timestamp_millis(s.updated_at_ms)
                    .map(|t| t.to_rfc3339())
                    .unwrap_or_default();
                SessionInfo::new(s.id.clone(), PathBuf::from(&s.cwd))
                    .title(s.title.clone())
                    .updated_at(updated)
                    .meta(meta(json!({
                        "profile": s.profile,
                        "forkedFrom": s.forked_from,
                    })))
            })
            .collect();
        let next = more
            .then(|| page.last().map(|s| format!("{}:{}", s.updated_at_ms, s.id)))
            .flatten();
        to_value(ListSessionsResponse::new(sessions).next_cursor(next))
    }

    async fn load(&self, req: LoadSessionRequest) -> Result<(Value, String), Value> {
        let session = self.stored(&req.session_id.0)?;
        let id = session.record.id.clone();
        let runs = self.config.store.acp_session_runs(&id).map_err(internal)?;
        let mut mapper = map::Mapper::default();
        for run in runs {
            self.update(
                &id,
                SessionUpdate::UserMessageChunk(ContentChunk::new(ContentBlock::from(run.prompt))),
            );
            let events = self
                .config
                .store
                .run_agent_events(&run.run_id)
                .map_err(internal)?;
            for e in events {
                for u in mapper.updates(&e.payload) {
                    self.update(&id, u);
                }
            }
        }
        let response =
            to_value(LoadSessionResponse::new().meta(self.session_meta(&session.record.profile)))?;
        Ok((response, id))
    }

    async fn resume(&self, req: ResumeSessionRequest) -> Result<(Value, String), Value> {
        let session = self.stored(&req.session_id.0)?;
        let response = to_value(
            ResumeSessionResponse::new().meta(self.session_meta(&session.record.profile)),
        )?;
        Ok((response, session.record.id.clone()))
    }

    async fn fork(&self, req: ForkSessionRequest) -> Result<(Value, String), Value> {
        let parent = self.stored(&req.session_id.0)?;
        let id = self.create(req.cwd, Some(parent.record.id.clone())).await?;
        let response = to_value(
            ForkSessionResponse::new(id.clone()).meta(self.session_meta(&parent.record.profile)),
        )?;
        Ok((response, id))
    }

    async fn prompt(self: &Arc<Self>, req: PromptRequest) -> Result<Value, Value> {
        let session = self.stored(&req.session_id.0)?;
        let text = prompt_text(&req.prompt)?;
        let choice = self.choice(&text);
        let (cancel_tx, mut cancel_rx) = oneshot::channel::<()>();
        let (ended_tx, ended_rx) = tokio::sync::watch::channel(false);
        {
            let mut active = session.active.lock().map_err(internal)?;
            if active.is_some() {
                return Err(frame::error(
                    BUSY,
                    "this session is already running a prompt; wait for it or send `session/cancel`",
                ));
            }
            *active = Some(Active {
                cancel: Some(cancel_tx),
                ended: ended_rx,
            });
        }
        let result = self
            .run_prompt(&session, text, choice, &mut cancel_rx)
            .await;
        let _ = ended_tx.send(true);
        if let Ok(mut active) = session.active.lock() {
            *active = None;
        }
        result
    }

    /// A slash command `/NAME k=v …` naming a manifest prompt renders it;
    /// anything else is the task as written.
    fn choice(&self, text: &str) -> PromptChoice {
        let literal = || PromptChoice::Literal {
            text: text.to_string(),
        };
        let Some(command) = text.trim_start().strip_prefix('/') else {
            return literal();
        };
        let mut words = command.split_whitespace();
        let Some(name) = words.next() else {
            return literal();
        };
        if !self.config.manifest.prompts.contains_key(name) {
            return literal();
        }
        let vars = words
            .filter_map(|w| w.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        PromptChoice::Template {
            name: name.to_string(),
            vars,
        }
    }

    /// Run one prompt: in the daemon when one holds the repository (and
    /// the prompt fits its control channel), else in this process.
    async fn run_prompt(
        self: &Arc<Self>,
        session: &Session,
        text: String,
        choice: PromptChoice,
        cancel_rx: &mut oneshot::Receiver<()>,
    ) -> Result<Value, Value> {
        let record = &session.record;
        let resume = self.resume_of(record)?;
        if text.len() <= MAX_DAEMON_PROMPT_BYTES
            && let Some((socket, _pid)) = self
                .config
                .daemon
                .as_ref()
                .and_then(|paths| paths.running_daemon())
        {
            let ran = self
                .run_in_daemon(&socket, record, &text, &choice, resume.clone(), cancel_rx)
                .await;
            if let Some(result) = ran {
                return result;
            }
        }
        self.run_here(record, text, choice, resume, cancel_rx).await
    }

    /// Where the hooks of `record`'s runs ask: this process's approval
    /// socket, for that session.
    fn route(&self, record: &AcpSession) -> ApprovalRoute {
        ApprovalRoute {
            socket: self.approval_name.clone(),
            session: record.id.clone(),
        }
    }

    /// The provider conversation a new prompt of `record` continues: the
    /// one its last run recorded (forked when the session has no run of its
    /// own yet).
    fn resume_of(&self, record: &AcpSession) -> Result<Option<Resume>, Value> {
        let store = &self.config.store;
        let earlier = store.acp_session_runs(&record.id).map_err(internal)?;
        let own_runs = match &record.forked_from {
            Some(parent) => earlier.len() > store.acp_session_runs(parent).map_err(internal)?.len(),
            None => true,
        };
        Ok(earlier
            .last()
            .and_then(|last| provider_session(store, &last.run_id))
            .map(|session| Resume {
                session,
                fork: !own_runs,
            }))
    }

    async fn record_run(&self, record: &AcpSession, run_id: &str, text: &str) -> Result<(), Value> {
        let title: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
        let title: String = title.chars().take(MAX_TITLE_CHARS).collect();
        self.config
            .store
            .add_acp_session_run(&record.id, run_id, text, title)
            .await
            .map_err(internal)
    }

    /// Say in the session why run `run_id` did not succeed.
    fn say_why(&self, session: &str, run_id: &str, outcome: &str, why: &str) {
        self.update(
            session,
            SessionUpdate::AgentMessageChunk(ContentChunk::new(ContentBlock::from(format!(
                "\n[npc] run {run_id} {outcome}: {why}\n"
            )))),
        );
    }

    /// Queue the prompt as a run of the daemon at `socket` and stream it
    /// from the store until it ended. `None` when the daemon is gone before
    /// it took the run (the caller runs it here instead).
    async fn run_in_daemon(
        self: &Arc<Self>,
        socket: &std::path::Path,
        record: &AcpSession,
        text: &str,
        choice: &PromptChoice,
        resume: Option<Resume>,
        cancel_rx: &mut oneshot::Receiver<()>,
    ) -> Option<Result<Value, Value>> {
        let run = choice.manual_run(&record.profile);
        let cwd = PathBuf::from(&record.cwd);
        let request = Request::AcpRun {
            run: LocalRun {
                run,
                cwd: (cwd.is_absolute() && cwd.is_dir()).then_some(cwd),
                timeout_secs: Some(self.config.timeout.as_secs().max(1)),
                probe_after_secs: None,
                resume,
                approval: Some(self.route(record)),
            },
        };
        let run_id = match Client::call(socket, &request).await {
            Ok(answer) => match answer["run_id"].as_str() {
                Some(id) => id.to_string(),
                None => return Some(Err(internal(format!("the daemon answered {answer}")))),
            },
            Err(ControlError::Connect { .. }) => return None,
            Err(ControlError::Refused(e)) => {
                return Some(Err(frame::error(INVALID_PARAMS, &e)));
            }
            Err(e) => return Some(Err(internal(e))),
        };
        if let Err(e) = self.record_run(record, &run_id, text).await {
            return Some(Err(e));
        }
        Some(self.follow(socket, record, &run_id, cancel_rx).await)
    }

    /// Stream run `run_id` of the daemon at `socket` from the store (its
    /// events carry its id) until it ended; a cancel asks the daemon to
    /// cancel it.
    async fn follow(
        self: &Arc<Self>,
        socket: &std::path::Path,
        record: &AcpSession,
        run_id: &str,
        cancel_rx: &mut oneshot::Receiver<()>,
    ) -> Result<Value, Value> {
        let mut follower = Follower::new(self.config.store.clone(), run_id);
        let mut mapper = map::Mapper::default();
        let mut max_turns = false;
        let mut cancel_sent = false;
        let daemon_up = || {
            self.config
                .daemon
                .as_ref()
                .is_some_and(|paths| paths.running_daemon().is_some())
        };
        let ended = loop {
            let step = tokio::select! {
                step = follower.next(&daemon_up) => step.map_err(internal)?,
                _ = &mut *cancel_rx, if !cancel_sent => {
                    cancel_sent = true;
                    cancel_in_daemon(socket, run_id);
                    continue;
                }
            };
            match step {
                Step::Events(page) => {
                    for e in page.iter().filter(|e| e.kind.starts_with("agent.")) {
                        max_turns |= map::hit_turn_limit(&e.payload);
                        for u in mapper.updates(&e.payload) {
                            self.update(&record.id, u);
                        }
                    }
                }
                Step::Ended(ended) => break ended,
            }
        };
        let outcome = ended.outcome;
        let stop = match outcome.as_str() {
            "cancelled" => StopReason::Cancelled,
            _ if max_turns => StopReason::MaxTurnRequests,
            _ => StopReason::EndTurn,
        };
        if !matches!(outcome.as_str(), "succeeded" | "cancelled") {
            let why = ended
                .why
                .unwrap_or_else(|| format!("see `npc events` for run {run_id}"));
            self.say_why(&record.id, run_id, &outcome, &why);
        }
        to_value(PromptResponse::new(stop).meta(meta(json!({
            "runId": run_id,
            "outcome": outcome,
            "ranIn": RAN_IN_DAEMON,
        }))))
    }

    /// Run the prompt in this process (no daemon holds the repository).
    async fn run_here(
        self: &Arc<Self>,
        record: &AcpSession,
        text: String,
        choice: PromptChoice,
        resume: Option<Resume>,
        cancel_rx: &mut oneshot::Receiver<()>,
    ) -> Result<Value, Value> {
        let cwd = PathBuf::from(&record.cwd);
        let asked = LocalRun {
            run: choice.manual_run(&record.profile),
            cwd: (cwd.is_absolute() && cwd.is_dir()).then(|| cwd.clone()),
            timeout_secs: Some(self.config.timeout.as_secs().max(1)),
            probe_after_secs: None,
            resume: resume.clone(),
            approval: Some(self.route(record)),
        };
        let request = RunRequest {
            profile: record.profile.clone(),
            prompt: choice,
            timeout: self.config.timeout,
            cwd: cwd.is_dir().then_some(cwd),
            probe_after: crate::providers::STALE_AFTER,
            trigger: None,
        };
        let run_id = runs::new_run_id();
        let preparing = runs::prepare_blocking(
            self.config.manifest.clone(),
            self.config.root.clone(),
            request,
            run_id.clone(),
        );
        let mut prepared = tokio::select! {
            prepared = preparing => prepared.map_err(|e| frame::error(INVALID_PARAMS, &e.to_string()))?,
            _ = &mut *cancel_rx => return to_value(PromptResponse::new(StopReason::Cancelled)),
        };
        for w in &prepared.warnings {
            tracing::warn!("acp: {w}");
        }
        prepared.apply_local(resume.as_ref(), Some(&self.route(record)));
        // Listed like the daemon's runs of a prompt: source `acp`.
        prepared.source = Some(Origin::Acp.as_str());
        self.record_run(record, &run_id, &text).await?;
        let mut mapper = map::Mapper::default();
        let mut max_turns = false;
        let sink = |e: &crate::providers::AgentEvent| {
            let payload = runs::event_payload(&run_id, e);
            max_turns |= map::hit_turn_limit(&payload);
            for u in mapper.updates(&payload) {
                self.update(&record.id, u);
            }
        };
        let cancelled = async {
            let _ = (&mut *cancel_rx).await;
            CANCEL_SIGNAL
        };
        let here = Here {
            store: self.config.store.clone(),
            bus: self.config.bus.clone(),
            supervisor: self.config.supervisor.clone(),
        };
        let report = here
            .run(
                Origin::Acp,
                &asked,
                &prepared,
                &self.config.hooks,
                sink,
                cancelled,
            )
            .await
            .map_err(|e| frame::error(INTERNAL_ERROR, &e.to_string()))?;
        match report.outcome {
            Outcome::Succeeded | Outcome::Cancelled { .. } => {}
            other => {
                let why = match other {
                    Outcome::TimedOut => format!(
                        "the run outlived its timeout of {}s",
                        prepared.timeout.as_secs()
                    ),
                    Outcome::HookFailed => report.hook_error.clone().unwrap_or_default(),
                    _ => format!("the agent failed ({})", report.exit),
                };
                self.say_why(&record.id, &prepared.id, other.as_str(), &why);
            }
        }
        to_value(
            PromptResponse::new(map::stop_reason(report.outcome, max_turns)).meta(meta(json!({
                "runId": prepared.id,
                "outcome": report.outcome.as_str(),
                "ranIn": RAN_IN_ACP,
            }))),
        )
    }

    /// Put a hook's question to the client as `session/request_permission`.
    /// Fail closed: no such session, no running prompt, too many questions
    /// waiting, an error answer, a cancelled prompt — each is a denial.
    async fn ask_permission(
        self: &Arc<Self>,
        session_id: &str,
        request: ApprovalRequest,
    ) -> Answer {
        let deny = |reason: &str| Answer::Deny {
            reason: reason.to_string(),
        };
        let Some(session) = self.session(session_id) else {
            return deny("the approval names no session of this `npc acp`");
        };
        let Some(mut ended) = session
            .active
            .lock()
            .ok()
            .and_then(|a| a.as_ref().map(|a| a.ended.clone()))
        else {
            return deny("the session runs no prompt");
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let Ok(mut pending) = self.pending.lock() else {
                return deny("internal error");
            };
            if pending.len() >= MAX_PENDING_REQUESTS {
                return deny("too many questions are waiting for the editor");
            }
            pending.insert(id, tx);
        }
        let call = &request.tool_call;
        // `request.hook` names the asker: a hook (`before_tool[0]`) or the
        // profile's policy (`profile `dev` ask_tools`).
        let mut title = format!("{} (asked by {})", call.name, request.hook);
        if let Some(reason) = &request.reason {
            title = format!("{title}: {reason}");
        }
        let tool_call = ToolCallUpdate::new(
            call.id.clone(),
            ToolCallUpdateFields::new()
                .title(title)
                .kind(map::kind(&call.name))
                .status(ToolCallStatus::Pending)
                .raw_input(call.arguments.clone()),
        );
        let options = vec![
            PermissionOption::new("allow", "Allow", PermissionOptionKind::AllowOnce),
            PermissionOption::new("deny", "Deny", PermissionOptionKind::RejectOnce),
        ];
        let params = RequestPermissionRequest::new(session_id.to_string(), tool_call, options)
            .meta(meta(
                json!({ "hook": request.hook, "reason": request.reason }),
            ));
        match serde_json::to_value(params) {
            Ok(params) => self.send(frame::message(
                Some(id),
                "session/request_permission",
                params,
            )),
            Err(e) => return deny(&e.to_string()),
        }
        let answer = tokio::select! {
            answer = rx => answer,
            _ = ended.wait_for(|ended| *ended) => {
                if let Ok(mut pending) = self.pending.lock() {
                    pending.remove(&id);
                }
                return deny("the prompt ended before the editor answered");
            }
        };
        match answer {
            Ok(Ok(result)) => {
                let outcome = &result["outcome"];
                if outcome["outcome"] == "selected" && outcome["optionId"] == "allow" {
                    Answer::Allow
                } else if outcome["outcome"] == "cancelled" {
                    deny("the editor cancelled the question")
                } else {
                    deny("denied in the editor")
                }
            }
            Ok(Err(error)) => deny(&format!("the editor answered with an error: {error}")),
            Err(_) => deny("the editor gave no answer"),
        }
    }
}

/// Ask the daemon at `socket` to cancel run `id` (it kills the agent's
/// process group; the run's `run.finished` then ends the prompt).
fn cancel_in_daemon(socket: &std::path::Path, id: &str) {
    let (socket, id) = (socket.to_path_buf(), id.to_string());
    tokio::spawn(async move {
        let request = Request::CancelRun { id: id.clone() };
        if let Err(e) = Client::call(&socket, &request).await {
            tracing::warn!("acp: cannot cancel run `{id}` in the daemon: {e}");
        }
    });
}

/// The text of a prompt's content blocks: text as written, embedded text
/// resources and resource links as their URI and text.
fn prompt_text(blocks: &[ContentBlock]) -> Result<String, Value> {
    let mut text = String::new();
    for block in blocks {
        match block {
            ContentBlock::Text(t) => text.push_str(&t.text),
            ContentBlock::ResourceLink(link) => {
                text.push_str(&format!("\n[{}]({})\n", link.name, link.uri));
            }
            ContentBlock::Resource(r) => {
                if let EmbeddedResourceResource::TextResourceContents(t) = &r.resource {
                    text.push_str(&format!(
                        "\n<file uri=\"{}\">\n{}\n</file>\n",
                        t.uri, t.text
                    ));
                }
            }
            _ => {}
        }
        if text.len() > MAX_PROMPT_BYTES {
            return Err(invalid_params(format!(
                "the prompt is longer than {MAX_PROMPT_BYTES} bytes"
            )));
        }
    }
    if text.trim().is_empty() {
        return Err(invalid_params("the prompt has no text"));
    }
    Ok(text)
}

/// The provider's own session id recorded by run `run_id` (its `agent.started`).
fn provider_session(store: &Store, run_id: &str) -> Option<String> {
    store
        .run_agent_events(run_id)
        .ok()?
        .into_iter()
        .find(|e| e.kind == "agent.started")
        .and_then(|e| e.payload["session_id"].as_str().map(str::to_string))
        .filter(|s| crate::surfaces::runs::valid_provider_session(s))
}

fn clip(s: &str) -> String {
    s.chars().take(frame::MAX_QUOTED_METHOD_CHARS).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An agent over a real store in `dir`, writing its frames to the returned receiver.
    fn agent(dir: &std::path::Path) -> (Arc<Agent>, mpsc::UnboundedReceiver<Value>) {
        let text = "version = 1\n[providers.p]\nkind = \"claude_code\"\n\
                    [profiles.dev]\nprovider = \"p\"\ndescription = \"d\"\n";
        let files = crate::model::DiskFiles {
            root: dir.to_path_buf(),
        };
        let manifest = crate::model::load_bytes(
            "npcagent.toml",
            text.as_bytes(),
            crate::model::Syntax::Toml,
            &std::collections::BTreeMap::<String, String>::new(),
            &files,
        )
        .manifest
        .unwrap();
        let store = Arc::new(Store::open(dir.join("state.db")).unwrap());
        let (events, _) = mpsc::unbounded_channel();
        let supervisor = Supervisor::new(events, crate::supervisor::BackoffPolicy::default());
        let bus = EventBus::new(store.clone());
        let hooks = Arc::new(HookRunner::new(
            crate::hooks::HookSet::default(),
            supervisor.clone(),
            None,
        ));
        let (out, frames) = mpsc::unbounded_channel();
        let config = Config {
            profile: choose_profile(&manifest, None).unwrap(),
            manifest,
            root: dir.to_path_buf(),
            store,
            bus,
            supervisor,
            hooks,
            timeout: Duration::from_secs(5),
            daemon: None,
        };
        let agent = Agent {
            config,
            out,
            next_id: AtomicI64::new(1),
            pending: Mutex::new(HashMap::new()),
            sessions: Mutex::new(VecDeque::new()),
            approval_name: String::new(),
        };
        (Arc::new(agent), frames)
    }

    fn record(id: &str) -> AcpSession {
        AcpSession {
            id: id.into(),
            profile: "dev".into(),
            cwd: "/".into(),
            title: None,
            forked_from: None,
            created_at_ms: 0,
            updated_at_ms: 0,
        }
    }

    fn busy(session: &Session) {
        let (_tx, ended) = tokio::sync::watch::channel(false);
        *session.active.lock().unwrap() = Some(Active {
            cancel: None,
            ended,
        });
    }

    #[tokio::test]
    async fn sessions_in_memory_are_bounded_dropping_idle_ones_first() {
        let dir = tempfile::tempdir().unwrap();
        let (agent, _frames) = agent(dir.path());
        let first = agent.hold(record("s0")).unwrap();
        busy(&first);
        for i in 1..MAX_SESSIONS {
            agent.hold(record(&format!("s{i}"))).unwrap();
        }
        // Full: the least recently used idle session (s1) makes room; the busy s0 stays.
        agent.hold(record("extra")).unwrap();
        let held: Vec<String> = agent
            .sessions
            .lock()
            .unwrap()
            .iter()
            .map(|s| s.record.id.clone())
            .collect();
        assert_eq!(held.len(), MAX_SESSIONS);
        assert!(held.contains(&"s0".to_string()));
        assert!(!held.contains(&"s1".to_string()));
        // Every slot busy: refused, not grown.
        for s in agent.sessions.lock().unwrap().iter() {
            busy(s);
        }
        let e = agent.hold(record("one-too-many")).unwrap_err();
        assert_eq!(e["code"], BUSY);
        assert_eq!(agent.sessions.lock().unwrap().len(), MAX_SESSIONS);
    }

    #[tokio::test]
    async fn permission_questions_fail_closed() {
        let dir = tempfile::tempdir().unwrap();
        let (agent, mut frames) = agent(dir.path());
        let request = ApprovalRequest {
            hook: "before_tool[0]".into(),
            reason: None,
            tool_call: crate::hooks::ToolCallInfo {
                id: "t".into(),
                name: "Bash".into(),
                arguments: json!({}),
            },
        };
        let denied = |a: Answer| matches!(a, Answer::Deny { .. });
        // No such session; a session with no prompt running.
        assert!(denied(agent.ask_permission("nope", request.clone()).await));
        let s = agent.hold(record("s")).unwrap();
        assert!(denied(agent.ask_permission("s", request.clone()).await));
        // Too many questions waiting: denied without asking.
        busy(&s);
        {
            let mut pending = agent.pending.lock().unwrap();
            for i in 0..MAX_PENDING_REQUESTS {
                pending.insert(1000 + i as i64, oneshot::channel().0);
            }
        }
        assert!(denied(agent.ask_permission("s", request.clone()).await));
        assert!(frames.try_recv().is_err(), "nothing was asked");
        agent.pending.lock().unwrap().clear();
        // Asked, then the prompt ends before an answer: denied.
        let (ended_tx, ended) = tokio::sync::watch::channel(false);
        *s.active.lock().unwrap() = Some(Active {
            cancel: None,
            ended,
        });
        let asking = tokio::spawn({
            let agent = agent.clone();
            async move { agent.ask_permission("s", request).await }
        });
        let asked = frames.recv().await.unwrap();
        assert_eq!(asked["method"], "session/request_permission");
        ended_tx.send(true).unwrap();
        assert!(denied(asking.await.unwrap()));
        assert!(agent.pending.lock().unwrap().is_empty());
    }

    #[test]
    fn prompt_text_joins_blocks_and_refuses_empty_or_huge_prompts() {
        let blocks: Vec<ContentBlock> = serde_json::from_value(json!([
            {"type":"text","text":"fix it"},
            {"type":"resource_link","name":"a.rs","uri":"file:///a.rs"},
            {"type":"resource","resource":{"uri":"file:///b.rs","text":"fn b() {}"}}
        ]))
        .unwrap();
        let text = prompt_text(&blocks).unwrap();
        assert!(text.starts_with("fix it"));
        assert!(text.contains("[a.rs](file:///a.rs)"));
        assert!(text.contains("fn b() {}"));
        assert!(prompt_text(&[]).is_err());
        let huge = vec![ContentBlock::from("x".repeat(MAX_PROMPT_BYTES + 1))];
        assert_eq!(prompt_text(&huge).unwrap_err()["code"], INVALID_PARAMS);
    }
}
