//! The events of an agent CLI's output (`agent.*`,
//! `cli_detection.drift_detected`): what a provider's parser read, with
//! the `type` it was read as and the run it belongs to.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::model::ProviderKind;

/// Why an `agent.error` was emitted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The agent itself reported an error (an `error` event, a failed turn).
    #[default]
    Provider,
    /// A line on the child's stderr.
    Stderr,
    /// A line that is not JSON where JSON was expected; skipped.
    NotJson,
    /// A JSON line of a type this parser does not know; skipped.
    UnknownEvent,
    /// A line longer than the parser's bound; skipped.
    LineTooLong,
    /// A line that is not UTF-8 where JSON was expected; skipped.
    InvalidUtf8,
    /// Output ended in the middle of a line; the partial line was skipped.
    Truncated,
    /// The recorded fixtures for drift detection could not be read.
    Detection,
}

/// One way of reading a provider's output.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    #[default]
    NativeStreamJson,
    NativeJson,
    NativeNdjson,
    CaptureDiffFallback,
    RegexFallback,
    ProbeOnStale,
}

/// An agent event as recorded: `type` (its kind again), its fields, and
/// the `run_id` of the run whose agent printed it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AgentRecord<T> {
    /// The event's kind (`agent.message`, …).
    #[serde(rename = "type")]
    pub type_name: String,
    #[serde(flatten)]
    pub event: T,
    pub run_id: String,
}

/// The CLI announced its session.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AgentStarted {
    pub session_id: Option<String>,
    pub model: Option<String>,
}

/// Text the agent wrote; `delta` when it is a fragment of a longer message.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AgentMessage {
    pub text: String,
    pub delta: bool,
}

/// The agent started a tool call.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AgentToolCall {
    pub id: Option<String>,
    pub name: String,
    /// The tool's arguments as the agent CLI printed them (open).
    pub input: serde_json::Value,
}

/// A tool call finished.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AgentToolResult {
    pub id: Option<String>,
    pub name: Option<String>,
    pub output: String,
    pub is_error: bool,
}

/// Token counts and cost, where the format carries them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AgentUsage {
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    pub cached_input_tokens: Option<u64>,
    pub cost_usd: Option<f64>,
}

/// The agent finished its turn; `status` is the provider's own word.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AgentIdle {
    pub status: String,
    pub is_error: bool,
    pub result: Option<String>,
}

/// Something went wrong: reported by the agent, or a line npc could not read.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AgentError {
    pub kind: ErrorKind,
    pub message: String,
}

/// A line the agent CLI printed on stderr that is no error.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AgentNotice {
    pub text: String,
}

/// Live output no longer looks like the newest recorded fixture; the
/// parser moved from `from` to `to`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DriftDetected {
    pub provider: ProviderKind,
    pub ratio: f64,
    pub threshold: f64,
    pub fixture_version: String,
    pub from: Strategy,
    pub to: Strategy,
}

/// A fragment of the agent's reasoning (ACP `agent_thought_chunk`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AgentThought {
    pub text: String,
}

/// The agent's plan for the turn (ACP `plan`): every entry, in order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AgentPlan {
    pub entries: Vec<AgentPlanEntry>,
}

/// One step of an [`AgentPlan`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AgentPlanEntry {
    pub content: String,
    /// `pending`, `in_progress` or `completed`.
    pub status: String,
    /// `high`, `medium` or `low`.
    pub priority: String,
}

/// The agent's session mode changed (ACP `current_mode_update`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AgentMode {
    pub mode: String,
}

/// What a tool call is doing, beyond its start and result (ACP
/// `tool_call` / `tool_call_update`): its kind, status, the files it
/// touches and the diffs it proposes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AgentToolUpdate {
    pub id: Option<String>,
    /// `pending`, `in_progress`, `completed`, `failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// `read`, `edit`, `delete`, `move`, `search`, `execute`, `think`, `fetch`, `other`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// `path` or `path:line`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub locations: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub diffs: Vec<AgentDiff>,
}

/// A file change a tool call proposes or made, counted in lines.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AgentDiff {
    pub path: String,
    pub added: u64,
    pub removed: u64,
}
