//! [`AgentEvent`]: what every provider parser turns agent CLI output into.
//! Serialized with a `type` field (`agent.message`, `agent.tool_call`,
//! `agent.tool_result`, `agent.idle`, `agent.error`, `agent.usage`,
//! `agent.started`, `cli_detection.drift_detected`) so the runner can put
//! the events on the bus as they are.

use serde::{Deserialize, Serialize};

use crate::model::ProviderKind;

use super::Strategy;

/// One event read from an agent CLI's output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum AgentEvent {
    /// The CLI announced its session (Claude `system/init`, Codex
    /// `thread.started`, Gemini `init`, OpenCode's first `step_start`).
    #[serde(rename = "agent.started")]
    Started {
        session_id: Option<String>,
        model: Option<String>,
    },
    /// Text the agent wrote. `delta` is true when the text is a fragment of a
    /// longer message that arrives in pieces (Gemini `message{delta:true}`).
    #[serde(rename = "agent.message")]
    Message { text: String, delta: bool },
    /// The agent started a tool call.
    #[serde(rename = "agent.tool_call")]
    ToolCall {
        id: Option<String>,
        name: String,
        input: serde_json::Value,
    },
    /// A tool call finished. `name` is known when the call was seen first.
    #[serde(rename = "agent.tool_result")]
    ToolResult {
        id: Option<String>,
        name: Option<String>,
        output: String,
        is_error: bool,
    },
    /// Token counts and cost, where the format carries them.
    #[serde(rename = "agent.usage")]
    Usage {
        input_tokens: Option<u64>,
        output_tokens: Option<u64>,
        cached_input_tokens: Option<u64>,
        cost_usd: Option<f64>,
    },
    /// The agent finished its turn and waits (or exits). `status` is the
    /// provider's own word (`success`, `error_max_turns`, `completed`,
    /// `failed`, `stop`, `marker`…).
    #[serde(rename = "agent.idle")]
    Idle {
        status: String,
        is_error: bool,
        result: Option<String>,
    },
    /// Something went wrong: reported by the agent, or a line npc could not
    /// read (the line is skipped, parsing goes on).
    #[serde(rename = "agent.error")]
    Error { kind: ErrorKind, message: String },
    /// A line the agent CLI printed on stderr that is no error: its known
    /// chatter (Codex's `Reading additional input from stdin...`, Gemini
    /// CLI's YOLO and terminal-colour warnings).
    #[serde(rename = "agent.notice")]
    Notice { text: String },
    /// Live output no longer looks like the newest recorded fixture; the
    /// parser moved from `from` to `to` in the provider's strategy chain.
    #[serde(rename = "cli_detection.drift_detected")]
    DriftDetected {
        provider: ProviderKind,
        ratio: f64,
        threshold: f64,
        fixture_version: String,
        from: Strategy,
        to: Strategy,
    },
}

impl AgentEvent {
    /// The serialized `type` name of this event.
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::Started { .. } => "agent.started",
            Self::Message { .. } => "agent.message",
            Self::ToolCall { .. } => "agent.tool_call",
            Self::ToolResult { .. } => "agent.tool_result",
            Self::Usage { .. } => "agent.usage",
            Self::Idle { .. } => "agent.idle",
            Self::Error { .. } => "agent.error",
            Self::Notice { .. } => "agent.notice",
            Self::DriftDetected { .. } => "cli_detection.drift_detected",
        }
    }

    pub(crate) fn error(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self::Error {
            kind,
            message: message.into(),
        }
    }
}

/// Why an [`AgentEvent::Error`] was emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The agent itself reported an error (an `error` event, a failed turn).
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
