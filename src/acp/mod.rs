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
//! and `session/fork` work across restarts; with `[store] url` they live
//! in the fleet's PostgreSQL (`Config::sessions`), so an editor on any
//! machine of the fleet lists, loads, resumes and forks them: their
//! working directories are kept relative to the repository, and a run's
//! agent events are copied there once its prompt ended. A later prompt of a session
//! resumes the provider's own conversation where the CLI can
//! (`providers::resume`: Claude Code `--resume`, and `--fork-session` for a
//! fork's first prompt; OpenCode `--session`); Codex and Gemini CLI start
//! a fresh conversation per prompt. Every bound is a constant here or in
//! [`frame`] / [`map`].

pub use crate::surfaces::jsonrpc as frame;
pub mod map;
mod permission;
mod prompt;
mod server;
mod sessions;

pub use server::serve;

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
use crate::store::acp::{AcpSession, AcpSessions, NewAcpRun};
use crate::supervisor::Supervisor;
use crate::surfaces::approval::{self, Answer, Asked};
use crate::surfaces::control::{Client, ControlError, Reply, Request};
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
    /// This process's store: its runs and their events.
    pub store: Arc<Store>,
    /// Where the sessions live: `store`, or the fleet's PostgreSQL with
    /// `[store] url`, shared by every machine of the fleet.
    pub sessions: Arc<dyn AcpSessions>,
    /// This machine's name (a fleet's sessions record where each run ran).
    pub host: String,
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
    let known = || crate::model::diagnostics::known_names(manifest.profiles.keys());
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

fn clip(s: &str) -> String {
    s.chars().take(frame::MAX_QUOTED_METHOD_CHARS).collect()
}

#[cfg(test)]
mod tests;
