//! npc as an Agent Client Protocol *client* of an agent CLI
//! (`driver = "acp"`): a sans-IO state machine the run feeds the agent's
//! stdout lines and its own decisions, and that answers with frames to
//! write and [`AgentEvent`]s to record ([`Step`]). It speaks ACP v1 with
//! the `agent-client-protocol-schema` crate's types (the server side,
//! `npc acp`, uses the same crate): `initialize` advertising no `fs` and
//! no `terminal` (the agent does its own I/O, inside the run's sandbox);
//! `session/new` with the run's MCP servers (npc's gateway), or
//! `session/resume` / `session/load` of a stored session where the agent
//! says it can; one `session/prompt`; `session/update`s mapped to agent
//! events ([`map`]); `session/request_permission` handed to the run as a
//! [`PermissionAsk`] and answered with an option id the agent offered
//! ([`Client::answer`]); `session/cancel` with every pending permission
//! answered `cancelled` ([`Client::cancel`]). Everything the agent sends
//! is input: frames are cut at [`MAX_FRAME_BYTES`] by the reader, at most
//! [`MAX_PENDING_PERMISSIONS`] questions wait at once, tool calls tracked
//! and texts kept are bounded, a method npc did not offer is answered
//! with the protocol's error, and an agent that never answers meets the
//! phase deadlines ([`Phase::limit`]).

mod map;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use agent_client_protocol_schema::ProtocolVersion;
use agent_client_protocol_schema::v1::{
    CancelNotification, ClientCapabilities, ContentBlock, EnvVariable, FileSystemCapabilities,
    HttpHeader, Implementation, InitializeRequest, InitializeResponse, LoadSessionRequest,
    McpServer, McpServerHttp, McpServerStdio, NewSessionRequest, NewSessionResponse,
    PermissionOptionKind, PromptRequest, PromptResponse, RequestPermissionOutcome,
    RequestPermissionRequest, RequestPermissionResponse, ResumeSessionRequest,
    SelectedPermissionOutcome, SessionConfigKind, SessionConfigOption, SessionConfigOptionCategory,
    SessionConfigOptionValue, SessionConfigSelectOptions, SessionNotification,
    SetSessionConfigOptionRequest, SetSessionModeRequest, StopReason, TextContent,
};
use serde_json::{Value, json};

use super::AgentEvent;
use crate::event::{ErrorKind, PermissionAnswer};
use crate::surfaces::jsonrpc::{self, Incoming};

/// Longest frame read from the agent (a tool result may carry a file).
pub const MAX_FRAME_BYTES: usize = jsonrpc::MAX_LINE_BYTES;
/// Permission questions of the agent waiting for npc's answer at once;
/// more are answered `cancelled` at once.
pub const MAX_PENDING_PERMISSIONS: usize = 16;
/// Tool calls whose names npc remembers for their results (oldest
/// forgotten first).
pub const MAX_TRACKED_TOOL_CALLS: usize = 4096;
/// Protocol complaints (a bad frame, a method npc did not offer) recorded
/// per run; the rest are counted in the last one.
pub const MAX_COMPLAINTS: usize = 16;
/// Longest text of an agent's error npc keeps, in bytes.
pub const MAX_ERROR_TEXT_BYTES: usize = 1024;
/// Longest model id quoted from the agent.
pub const MAX_MODEL_ID_BYTES: usize = 128;
/// How long the agent may take to answer `initialize` (an adapter starts
/// Node.js and its SDK first).
pub const INITIALIZE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the agent may take to open its session (`session/new`,
/// `session/resume`, `session/load`): peers have seen 30–60 s while an
/// agent starts its MCP servers.
pub const SESSION_TIMEOUT: Duration = Duration::from_secs(120);
/// After `session/cancel`, how long npc waits for the turn to end with
/// `cancelled` before it ends the process group.
pub const CANCEL_GRACE: Duration = Duration::from_secs(10);

/// The MCP server npc hands the agent for a run (`session/new`'s
/// `mcpServers`). Its values are exposed: never logged (`Debug` names
/// only the server).
#[derive(Clone, PartialEq, Eq)]
pub enum McpEntry {
    Stdio {
        name: String,
        command: String,
        args: Vec<String>,
        env: Vec<(String, String)>,
    },
    Http {
        name: String,
        url: String,
        headers: Vec<(String, String)>,
    },
}

impl McpEntry {
    pub fn name(&self) -> &str {
        match self {
            Self::Stdio { name, .. } | Self::Http { name, .. } => name,
        }
    }
}

impl std::fmt::Debug for McpEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Stdio { name, command, .. } => f
                .debug_struct("Stdio")
                .field("name", name)
                .field("command", command)
                .finish_non_exhaustive(),
            Self::Http { name, .. } => f
                .debug_struct("Http")
                .field("name", name)
                .finish_non_exhaustive(),
        }
    }
}

/// What one ACP run asks of its agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Start {
    /// The session's working directory (absolute).
    pub cwd: PathBuf,
    /// The task prompt, sent as one text block.
    pub prompt: String,
    pub mcp_servers: Vec<McpEntry>,
    /// The agent's session id of an earlier run to continue.
    pub resume: Option<String>,
    /// The session mode to set when the agent offers it and starts in
    /// another (Claude Code's adapter starts in `auto`, whose classifier
    /// blocks tool calls without asking: `default` asks npc).
    pub mode: Option<String>,
    /// The model the profile names: set through the session's model option
    /// (a `select` config option of category `model`) when the agent lists
    /// that value; otherwise a notice says which model the run keeps.
    pub model: Option<String>,
    /// The CLI's own tool for an ACP tool kind (`execute` → `Bash`), for a
    /// permission question that names no tool.
    pub tool_for_kind: std::collections::BTreeMap<String, String>,
}

/// Where the conversation with the agent stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// `initialize` sent, no answer yet.
    Initializing,
    /// `session/new` (or resume, load) sent, no answer yet.
    OpeningSession,
    /// `session/prompt` sent: the turn runs.
    Prompting,
    /// `session/cancel` sent: waiting for the turn to end.
    Cancelling,
    /// The turn ended (or the conversation failed): nothing more to do.
    Done,
}

impl Phase {
    /// How long this phase may last before the run gives up on the agent
    /// (`None`: the run's own timeout governs).
    pub fn limit(self) -> Option<Duration> {
        match self {
            Self::Initializing => Some(INITIALIZE_TIMEOUT),
            Self::OpeningSession => Some(SESSION_TIMEOUT),
            Self::Cancelling => Some(CANCEL_GRACE),
            Self::Prompting | Self::Done => None,
        }
    }

    /// What the run was waiting for, in words (for a timeout's error).
    pub fn waiting_for(self) -> &'static str {
        match self {
            Self::Initializing => "its answer to `initialize`",
            Self::OpeningSession => "its session (`session/new`)",
            Self::Prompting => "the end of its turn",
            Self::Cancelling => "the end of its turn after `session/cancel`",
            Self::Done => "nothing",
        }
    }
}

/// How the turn ended (the prompt's `stopReason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnEnd {
    EndTurn,
    MaxTokens,
    MaxTurnRequests,
    Refusal,
    Cancelled,
}

impl TurnEnd {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::EndTurn => "end_turn",
            Self::MaxTokens => "max_tokens",
            Self::MaxTurnRequests => "max_turn_requests",
            Self::Refusal => "refusal",
            Self::Cancelled => "cancelled",
        }
    }

    /// Whether the agent did what it was asked (else the run fails, or
    /// ends cancelled).
    pub fn is_success(self) -> bool {
        self == Self::EndTurn
    }

    fn of(reason: StopReason) -> Self {
        match reason {
            StopReason::EndTurn => Self::EndTurn,
            StopReason::MaxTokens => Self::MaxTokens,
            StopReason::MaxTurnRequests => Self::MaxTurnRequests,
            StopReason::Refusal => Self::Refusal,
            StopReason::Cancelled => Self::Cancelled,
            // A reason of a later protocol: the turn did not say it ended well.
            _ => Self::Refusal,
        }
    }
}

/// Why the conversation with the agent failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AcpFailure {
    #[error("the agent answered `{method}` with error {code}: {message}; {hint}")]
    Refused {
        method: &'static str,
        code: i64,
        message: String,
        /// What to do next, for this method.
        hint: &'static str,
    },
    #[error(
        "the agent's answer to `{method}` is not what ACP says: {reason}; the ACP program may speak another protocol version"
    )]
    BadAnswer {
        method: &'static str,
        reason: String,
    },
    #[error(
        "the agent speaks ACP version {version}, npc speaks version 1; install an ACP program of protocol version 1"
    )]
    Version { version: String },
    #[error(
        "the agent cannot continue session `{session}`: it offers neither `session/resume` nor `session/load`; start a new run instead"
    )]
    CannotResume { session: String },
    #[error("npc cannot write to the agent: {reason}; the agent stopped reading what npc sends")]
    Unwritable { reason: String },
}

/// A permission question of the agent, for the run to decide.
#[derive(Debug, Clone, PartialEq)]
pub struct PermissionAsk {
    /// The key [`Client::answer`] takes.
    pub key: u64,
    /// The tool call's id.
    pub call_id: String,
    /// The tool as the agent names it ([`map::tool_name`]).
    pub tool: String,
    /// Its arguments (the agent's `rawInput`; `{}` when it sent none).
    pub arguments: Value,
    pub title: Option<String>,
    /// The ids of the options offered, in order.
    pub options: Vec<String>,
}

/// What npc decided about a [`PermissionAsk`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Allow,
    Deny,
}

/// What the run does next.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Write this frame (a line, newline included) to the agent's stdin.
    Send(Vec<u8>),
    /// Record this event (and show it).
    Event(AgentEvent),
    /// Decide this question and call [`Client::answer`].
    Permission(PermissionAsk),
    /// An answer went back: record it (`run.permission`).
    Answered(Answered),
    /// The turn ended: the agent may be stopped.
    Ended(TurnEnd),
    /// The conversation failed: stop the agent, fail the run.
    Failed(AcpFailure),
}

/// The answer npc gave to a permission question.
#[derive(Debug, Clone, PartialEq)]
pub struct Answered {
    /// The question's key ([`PermissionAsk::key`]; `0` for one answered
    /// at once, never asked).
    pub key: u64,
    pub tool: String,
    pub title: Option<String>,
    pub options: Vec<String>,
    pub answer: PermissionAnswer,
    pub option_id: Option<String>,
}

/// What npc is waiting for an answer to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
    Initialize,
    NewSession,
    Resume,
    Load,
    SetMode,
    SetModel,
    Prompt,
}

impl Sent {
    /// What to do when the agent refuses this request.
    fn hint(self) -> &'static str {
        match self {
            Self::Resume | Self::Load => {
                "the agent could not continue that session; start a new run instead"
            }
            Self::Prompt => "the agent refused the turn; its stderr (the run's events) says why",
            _ => {
                "check the provider's `command` names its ACP program and that the CLI is signed in"
            }
        }
    }

    fn method(self) -> &'static str {
        match self {
            Self::Initialize => "initialize",
            Self::NewSession => "session/new",
            Self::Resume => "session/resume",
            Self::Load => "session/load",
            Self::SetMode => "session/set_mode",
            Self::SetModel => "session/set_config_option",
            Self::Prompt => "session/prompt",
        }
    }
}

/// A question of the agent waiting for npc's answer.
#[derive(Debug, Clone)]
struct Waiting {
    key: u64,
    /// The agent's request id, echoed in the answer.
    id: Value,
    tool: String,
    title: Option<String>,
    /// (option id, kind), as offered.
    options: Vec<(String, PermissionOptionKind)>,
}

/// The client side of one ACP conversation (see the module).
#[derive(Debug)]
pub struct Client {
    start: Start,
    phase: Phase,
    next_id: i64,
    sent: HashMap<i64, Sent>,
    session: Option<String>,
    /// A `session/load` replays the conversation before its answer: those
    /// updates are history, not this run's events.
    replaying: bool,
    waiting: HashMap<u64, Waiting>,
    next_key: u64,
    tools: map::Tools,
    complaints: usize,
    /// Session settings still to send (mode, model), in order, once the
    /// session is open; the prompt goes after the last.
    settings: std::collections::VecDeque<(Sent, Value)>,
}

impl Client {
    pub fn new(start: Start) -> Self {
        Self {
            start,
            phase: Phase::Initializing,
            next_id: 0,
            sent: HashMap::new(),
            session: None,
            replaying: false,
            waiting: HashMap::new(),
            next_key: 0,
            tools: map::Tools::default(),
            complaints: 0,
            settings: std::collections::VecDeque::new(),
        }
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The agent's session id, once it opened one.
    pub fn session(&self) -> Option<&str> {
        self.session.as_deref()
    }

    /// Permission questions not answered yet.
    pub fn pending_permissions(&self) -> usize {
        self.waiting.len()
    }

    /// The first frame: `initialize`.
    pub fn begin(&mut self) -> Vec<Step> {
        let request = InitializeRequest::new(ProtocolVersion::V1)
            .client_capabilities(
                ClientCapabilities::new()
                    .fs(FileSystemCapabilities::new()
                        .read_text_file(false)
                        .write_text_file(false))
                    .terminal(false),
            )
            .client_info(Implementation::new("npc", env!("CARGO_PKG_VERSION")));
        vec![self.request(Sent::Initialize, to_value(&request))]
    }

    /// Take one line the agent wrote.
    pub fn feed(&mut self, line: &[u8]) -> Vec<Step> {
        match jsonrpc::classify(line) {
            Incoming::Empty => Vec::new(),
            Incoming::Invalid { id, error } => {
                let mut steps = self.complain(format!(
                    "the agent wrote a frame that is not JSON-RPC: {}",
                    error["message"].as_str().unwrap_or_default()
                ));
                // A frame with a usable id may be a request waiting for us.
                if !id.is_null() {
                    steps.push(send(&jsonrpc::response(id, Err(error))));
                }
                steps
            }
            Incoming::Response { id, outcome } => self.response(&id, outcome),
            Incoming::Request { id, method, params } => self.request_of_agent(id, &method, params),
            Incoming::Notification { method, params } => {
                if method == "session/update" {
                    self.update(params)
                } else {
                    // Notifications npc does not know are ignored (ACP's
                    // extension notifications start with `_`).
                    Vec::new()
                }
            }
        }
    }

    /// The agent's output ended or broke off (`reason`): the line that was
    /// cut (longer than [`MAX_FRAME_BYTES`]) is a complaint.
    pub fn overlong(&mut self) -> Vec<Step> {
        self.complain(format!(
            "the agent wrote a frame longer than {MAX_FRAME_BYTES} bytes; it was skipped"
        ))
    }

    /// Answer permission question `key` with `decision`: the first option
    /// of the agent's that says it (a one-time option before an
    /// `always` one); `cancelled` when it offered none.
    pub fn answer(&mut self, key: u64, decision: Decision) -> Vec<Step> {
        let Some(waiting) = self.waiting.remove(&key) else {
            return Vec::new();
        };
        let wanted: &[PermissionOptionKind] = match decision {
            Decision::Allow => &[
                PermissionOptionKind::AllowOnce,
                PermissionOptionKind::AllowAlways,
            ],
            Decision::Deny => &[
                PermissionOptionKind::RejectOnce,
                PermissionOptionKind::RejectAlways,
            ],
        };
        let chosen = wanted
            .iter()
            .find_map(|k| waiting.options.iter().find(|(_, kind)| kind == k))
            .map(|(id, _)| id.clone());
        let answer = match (&chosen, decision) {
            (None, _) => PermissionAnswer::Cancelled,
            (Some(_), Decision::Allow) => PermissionAnswer::Allowed,
            (Some(_), Decision::Deny) => PermissionAnswer::Denied,
        };
        self.reply_permission(waiting, chosen, answer)
    }

    /// Cancel the turn: `session/cancel`, then every pending question
    /// answered `cancelled`. Before the session is open there is no turn
    /// to cancel: the conversation is over.
    pub fn cancel(&mut self) -> Vec<Step> {
        let mut steps = Vec::new();
        match (self.phase, &self.session) {
            (Phase::Prompting, Some(session)) => {
                let note = CancelNotification::new(session.clone());
                steps.push(send(&jsonrpc::message(
                    None,
                    "session/cancel",
                    to_value(&note),
                )));
                self.phase = Phase::Cancelling;
            }
            (Phase::Cancelling | Phase::Done, _) => {}
            _ => self.phase = Phase::Done,
        }
        let keys: Vec<u64> = self.waiting.keys().copied().collect();
        for key in keys {
            if let Some(waiting) = self.waiting.remove(&key) {
                steps.extend(self.reply_permission(waiting, None, PermissionAnswer::Cancelled));
            }
        }
        steps
    }

    fn reply_permission(
        &mut self,
        waiting: Waiting,
        chosen: Option<String>,
        answer: PermissionAnswer,
    ) -> Vec<Step> {
        let outcome = match &chosen {
            Some(id) => {
                RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(id.clone()))
            }
            None => RequestPermissionOutcome::Cancelled,
        };
        let result = to_value(&RequestPermissionResponse::new(outcome));
        vec![
            send(&jsonrpc::response(waiting.id, Ok(result))),
            Step::Answered(Answered {
                key: waiting.key,
                tool: waiting.tool,
                title: waiting.title,
                options: waiting.options.into_iter().map(|(id, _)| id).collect(),
                answer,
                option_id: chosen,
            }),
        ]
    }

    fn request(&mut self, what: Sent, params: Value) -> Step {
        self.next_id += 1;
        self.sent.insert(self.next_id, what);
        send(&jsonrpc::message(Some(self.next_id), what.method(), params))
    }

    fn response(&mut self, id: &Value, outcome: Result<Value, Value>) -> Vec<Step> {
        let Some(what) = id.as_i64().and_then(|n| self.sent.remove(&n)) else {
            return self.complain("the agent answered a request npc did not send".to_string());
        };
        let result = match outcome {
            Ok(result) => result,
            Err(error) if matches!(what, Sent::SetMode | Sent::SetModel) => {
                // The session works in its own mode or model: say so, go on.
                let setting = if what == Sent::SetMode {
                    "session mode"
                } else {
                    "model"
                };
                let mut steps = vec![Step::Event(AgentEvent::Notice {
                    text: format!(
                        "the agent refused the {setting} npc asked for: {}",
                        clip(
                            error["message"].as_str().unwrap_or_default(),
                            MAX_ERROR_TEXT_BYTES
                        )
                    ),
                })];
                steps.extend(self.next_setting());
                return steps;
            }
            Err(error) => {
                self.phase = Phase::Done;
                let message = error["message"].as_str().unwrap_or_default();
                // The agent's own words are in `data` when its message is generic.
                let detail = error["data"]
                    .get("details")
                    .and_then(Value::as_str)
                    .map(|d| format!("{message} ({d})"))
                    .unwrap_or_else(|| message.to_string());
                return vec![Step::Failed(AcpFailure::Refused {
                    method: what.method(),
                    code: error["code"].as_i64().unwrap_or_default(),
                    message: clip(&detail, MAX_ERROR_TEXT_BYTES),
                    hint: what.hint(),
                })];
            }
        };
        match what {
            Sent::Initialize => self.initialized(result),
            Sent::NewSession => match serde_json::from_value::<NewSessionResponse>(result) {
                Ok(r) => {
                    let session = r.session_id.to_string();
                    self.session = Some(session.clone());
                    // A mode npc wants, set only when the agent listed it.
                    let wanted = self.start.mode.clone().filter(|m| {
                        r.modes.as_ref().is_some_and(|modes| {
                            *modes.current_mode_id.0 != **m
                                && modes.available_modes.iter().any(|a| *a.id.0 == **m)
                        })
                    });
                    if let Some(mode) = wanted {
                        let request = SetSessionModeRequest::new(session.clone(), mode);
                        self.settings.push_back((Sent::SetMode, to_value(&request)));
                    }
                    let mut steps = Vec::new();
                    if let Some(model) = self.start.model.clone() {
                        match model_setting(r.config_options.as_deref().unwrap_or_default(), &model)
                        {
                            ModelSetting::Current => {}
                            ModelSetting::Set { option } => {
                                let request = SetSessionConfigOptionRequest::new(
                                    session,
                                    option,
                                    SessionConfigOptionValue::value_id(model),
                                );
                                self.settings
                                    .push_back((Sent::SetModel, to_value(&request)));
                            }
                            ModelSetting::Unlisted { offered, current } => {
                                steps.push(Step::Event(AgentEvent::Notice {
                                    text: unlisted_model(&model, &offered, current.as_deref()),
                                }));
                            }
                        }
                    }
                    steps.extend(self.next_setting());
                    steps
                }
                Err(e) => self.bad_answer(what, &e),
            },
            Sent::SetMode | Sent::SetModel => self.next_setting(),
            Sent::Resume | Sent::Load => {
                self.replaying = false;
                let session = self.start.resume.clone().unwrap_or_default();
                self.opened(session)
            }
            Sent::Prompt => match serde_json::from_value::<PromptResponse>(result) {
                Ok(r) => {
                    let end = TurnEnd::of(r.stop_reason);
                    self.phase = Phase::Done;
                    let mut steps = Vec::new();
                    if let Some(usage) = r.usage {
                        steps.push(Step::Event(AgentEvent::Usage {
                            input_tokens: Some(usage.input_tokens),
                            output_tokens: Some(usage.output_tokens),
                            cached_input_tokens: usage.cached_read_tokens,
                            cost_usd: None,
                        }));
                    }
                    steps.push(Step::Event(AgentEvent::Idle {
                        status: end.as_str().to_string(),
                        is_error: !end.is_success() && end != TurnEnd::Cancelled,
                        result: None,
                    }));
                    steps.push(Step::Ended(end));
                    steps
                }
                Err(e) => self.bad_answer(what, &e),
            },
        }
    }

    fn bad_answer(&mut self, what: Sent, e: &serde_json::Error) -> Vec<Step> {
        self.phase = Phase::Done;
        vec![Step::Failed(AcpFailure::BadAnswer {
            method: what.method(),
            reason: clip(&e.to_string(), MAX_ERROR_TEXT_BYTES),
        })]
    }

    /// `initialize` answered: open (or continue) the session.
    fn initialized(&mut self, result: Value) -> Vec<Step> {
        let init: InitializeResponse = match serde_json::from_value(result) {
            Ok(init) => init,
            Err(e) => return self.bad_answer(Sent::Initialize, &e),
        };
        if init.protocol_version != ProtocolVersion::V1 {
            self.phase = Phase::Done;
            return vec![Step::Failed(AcpFailure::Version {
                version: clip(&format!("{:?}", init.protocol_version), 64),
            })];
        }
        let caps = &init.agent_capabilities;
        let mut steps = Vec::new();
        let mut servers = Vec::new();
        for entry in &self.start.mcp_servers {
            match entry {
                McpEntry::Stdio {
                    name,
                    command,
                    args,
                    env,
                } => servers.push(McpServer::Stdio(
                    McpServerStdio::new(name.clone(), command.clone())
                        .args(args.clone())
                        .env(env.iter().map(|(k, v)| EnvVariable::new(k.clone(), v.clone())).collect()),
                )),
                McpEntry::Http { name, url, headers } if caps.mcp_capabilities.http => {
                    servers.push(McpServer::Http(
                        McpServerHttp::new(name.clone(), url.clone()).headers(
                            headers
                                .iter()
                                .map(|(k, v)| HttpHeader::new(k.clone(), v.clone()))
                                .collect(),
                        ),
                    ));
                }
                McpEntry::Http { name, .. } => steps.push(Step::Event(AgentEvent::Notice {
                    text: format!(
                        "the agent takes no HTTP MCP servers, so `{name}` is not offered to it; declare it with a `command` or use npc's gateway"
                    ),
                })),
            }
        }
        self.phase = Phase::OpeningSession;
        let cwd = self.start.cwd.clone();
        let step = match self.start.resume.clone() {
            None => self.request(
                Sent::NewSession,
                to_value(&NewSessionRequest::new(cwd).mcp_servers(servers)),
            ),
            Some(session) if caps.session_capabilities.resume.is_some() => self.request(
                Sent::Resume,
                to_value(&ResumeSessionRequest::new(session, cwd).mcp_servers(servers)),
            ),
            Some(session) if caps.load_session => {
                self.replaying = true;
                self.request(
                    Sent::Load,
                    to_value(&LoadSessionRequest::new(session, cwd).mcp_servers(servers)),
                )
            }
            Some(session) => {
                self.phase = Phase::Done;
                return vec![Step::Failed(AcpFailure::CannotResume {
                    session: clip(&session, 128),
                })];
            }
        };
        steps.push(step);
        steps
    }

    /// The next session setting, or the prompt when none is left.
    fn next_setting(&mut self) -> Vec<Step> {
        match self.settings.pop_front() {
            Some((what, params)) => vec![self.request(what, params)],
            None => {
                let session = self.session.clone().unwrap_or_default();
                self.opened(session)
            }
        }
    }

    /// The session is open: announce it and send the prompt.
    fn opened(&mut self, session: String) -> Vec<Step> {
        self.session = Some(session.clone());
        self.phase = Phase::Prompting;
        let prompt = PromptRequest::new(
            session.clone(),
            vec![ContentBlock::Text(TextContent::new(
                self.start.prompt.clone(),
            ))],
        );
        vec![
            Step::Event(AgentEvent::Started {
                session_id: Some(session),
                model: None,
            }),
            self.request(Sent::Prompt, to_value(&prompt)),
        ]
    }

    fn request_of_agent(&mut self, id: Value, method: &str, params: Value) -> Vec<Step> {
        if method != "session/request_permission" {
            // npc offered no `fs`, no `terminal`, no elicitation: the
            // agent asks for what it was not given.
            let mut steps = self.complain(format!(
                "the agent called `{}`, which npc does not offer its agents",
                clip(method, jsonrpc::MAX_QUOTED_METHOD_CHARS)
            ));
            steps.push(send(&jsonrpc::response(
                id,
                Err(jsonrpc::method_not_found(method)),
            )));
            return steps;
        }
        let request: RequestPermissionRequest = match serde_json::from_value(params) {
            Ok(r) => r,
            Err(e) => {
                let error = jsonrpc::error(
                    jsonrpc::INVALID_PARAMS,
                    &format!(
                        "invalid params: {}",
                        clip(&e.to_string(), MAX_ERROR_TEXT_BYTES)
                    ),
                );
                let mut steps =
                    self.complain("the agent asked permission with invalid params".to_string());
                steps.push(send(&jsonrpc::response(id, Err(error))));
                return steps;
            }
        };
        let call = map::call_of_update(&request.tool_call, &self.tools, &self.start.tool_for_kind);
        // Its updates name the tool as the question did.
        self.tools.remember(&call.id, &call.tool, false);
        let mut waiting = Waiting {
            key: 0,
            id,
            tool: call.tool.clone(),
            title: call.title.clone(),
            options: request
                .options
                .iter()
                .map(|o| (o.option_id.to_string(), o.kind))
                .collect(),
        };
        let foreign = self.session.as_deref() != Some(&*request.session_id.0);
        // A question outside the turn, of another session, or beyond the
        // bound is answered `cancelled` at once.
        if foreign
            || self.phase != Phase::Prompting
            || self.waiting.len() >= MAX_PENDING_PERMISSIONS
        {
            return self.reply_permission(waiting, None, PermissionAnswer::Cancelled);
        }
        self.next_key += 1;
        let key = self.next_key;
        waiting.key = key;
        let ask = PermissionAsk {
            key,
            call_id: call.id,
            tool: call.tool,
            arguments: call.arguments,
            title: call.title,
            options: waiting.options.iter().map(|(id, _)| id.clone()).collect(),
        };
        self.waiting.insert(key, waiting);
        vec![Step::Permission(ask)]
    }

    fn update(&mut self, params: Value) -> Vec<Step> {
        let note: SessionNotification = match serde_json::from_value(params) {
            Ok(n) => n,
            Err(e) => {
                return self.complain(format!(
                    "the agent sent a `session/update` npc cannot read: {}",
                    clip(&e.to_string(), MAX_ERROR_TEXT_BYTES)
                ));
            }
        };
        if self.replaying || self.session.as_deref() != Some(&*note.session_id.0) {
            return Vec::new();
        }
        map::update(note.update, &mut self.tools)
            .into_iter()
            .map(Step::Event)
            .collect()
    }

    /// Record a protocol complaint, at most [`MAX_COMPLAINTS`] per run.
    fn complain(&mut self, message: String) -> Vec<Step> {
        self.complaints += 1;
        if self.complaints > MAX_COMPLAINTS {
            return Vec::new();
        }
        let message = if self.complaints == MAX_COMPLAINTS {
            format!("{message} (later complaints of this run are not recorded)")
        } else {
            message
        };
        vec![Step::Event(AgentEvent::error(
            ErrorKind::UnknownEvent,
            message,
        ))]
    }
}

/// A frame as a line to write.
fn send(frame: &Value) -> Step {
    let mut bytes = serde_json::to_vec(frame).unwrap_or_default();
    bytes.push(b'\n');
    Step::Send(bytes)
}

fn to_value<T: serde::Serialize>(value: &T) -> Value {
    serde_json::to_value(value).unwrap_or_else(|_| json!({}))
}

/// What to do about the profile's model, given the session's config options.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ModelSetting {
    /// The session already uses it.
    Current,
    /// Set it through config option `option`, which lists it.
    Set { option: String },
    /// No model option lists it; `offered` is what the agent offers (the
    /// frame it came in is bounded) and which one is current.
    Unlisted {
        offered: Vec<String>,
        current: Option<String>,
    },
}

/// [`ModelSetting`] for `model` among `options`: only a `select` option of
/// category `model` that lists `model` as a value is used, so npc never
/// sends an id the agent did not list.
fn model_setting(options: &[SessionConfigOption], model: &str) -> ModelSetting {
    let mut offered = Vec::new();
    let mut current = None;
    for option in options {
        if option.category != Some(SessionConfigOptionCategory::Model) {
            continue;
        }
        let SessionConfigKind::Select(select) = &option.kind else {
            continue;
        };
        let values: Vec<&str> = match &select.options {
            SessionConfigSelectOptions::Ungrouped(values) => {
                values.iter().map(|v| &*v.value.0).collect()
            }
            SessionConfigSelectOptions::Grouped(groups) => groups
                .iter()
                .flat_map(|g| g.options.iter().map(|v| &*v.value.0))
                .collect(),
            // A shape of a later schema: nothing npc can name.
            _ => Vec::new(),
        };
        if *select.current_value.0 == *model {
            return ModelSetting::Current;
        }
        if values.contains(&model) {
            return ModelSetting::Set {
                option: option.id.0.to_string(),
            };
        }
        current.get_or_insert_with(|| clip(&select.current_value.0, MAX_MODEL_ID_BYTES));
        offered.extend(values.into_iter().map(str::to_string));
    }
    ModelSetting::Unlisted { offered, current }
}

/// The notice for a profile's model the agent does not offer.
fn unlisted_model(model: &str, offered: &[String], current: Option<&str>) -> String {
    let keeps = current.map_or_else(
        || "the agent's own model".to_string(),
        |c| format!("the agent's current model `{c}`"),
    );
    let listed = if offered.is_empty() {
        "the agent lists no model option".to_string()
    } else {
        let offered: Vec<&str> = offered.iter().map(String::as_str).collect();
        format!(
            "the agent offers {}",
            crate::model::diagnostics::quoted_list(&offered)
        )
    };
    format!(
        "the profile's model `{}` is not one the agent offers ({listed}); the run uses {keeps}: name one it offers in the profile's `model`",
        clip(model, MAX_MODEL_ID_BYTES)
    )
}

/// `text` cut to at most `max` bytes, on a character boundary.
fn clip(text: &str, max: usize) -> String {
    let cut = crate::model::source::floor_char_boundary(text, max);
    text[..cut].to_string()
}
