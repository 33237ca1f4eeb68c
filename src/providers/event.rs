//! [`AgentEvent`]: what every provider parser turns agent CLI output into.
//! Serialized with a `type` field (`agent.message`, `agent.tool_call`,
//! `agent.tool_result`, `agent.idle`, `agent.error`, `agent.usage`,
//! `agent.started`, `tool.denied`, `cli_detection.drift_detected`, and
//! from ACP runs `agent.thought`, `agent.plan`, `agent.mode`,
//! `agent.tool_update`) so the runner can put
//! the events on the bus as they are.

use serde::{Deserialize, Serialize};

use crate::model::ProviderKind;

use super::Strategy;
use crate::event::{self as ev, AgentRecord, Event};

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
    /// The agent CLI refused a tool call the agent tried, by its own
    /// permission rules or policy: `rule` is the CLI's word for the refusal
    /// (Claude Code's `permission_denials`, Gemini CLI's `policy_violation`,
    /// Codex's `declined`, OpenCode's `permission`). Recorded as
    /// `tool.denied` (`by: cli`) unless npc recorded that denial already.
    #[serde(rename = "tool.denied")]
    Denied {
        id: Option<String>,
        tool: String,
        rule: String,
        reason: Option<String>,
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
    /// A fragment of the agent's reasoning (ACP `agent_thought_chunk`).
    #[serde(rename = "agent.thought")]
    Thought(ev::AgentThought),
    /// The agent's plan for the turn (ACP `plan`).
    #[serde(rename = "agent.plan")]
    Plan(ev::AgentPlan),
    /// The agent's session mode changed (ACP `current_mode_update`).
    #[serde(rename = "agent.mode")]
    Mode(ev::AgentMode),
    /// A tool call's kind, status, locations and diffs (ACP).
    #[serde(rename = "agent.tool_update")]
    ToolUpdate(ev::AgentToolUpdate),
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
            Self::Denied { .. } => "tool.denied",
            Self::Error { .. } => "agent.error",
            Self::Notice { .. } => "agent.notice",
            Self::Thought(_) => "agent.thought",
            Self::Plan(_) => "agent.plan",
            Self::Mode(_) => "agent.mode",
            Self::ToolUpdate(_) => "agent.tool_update",
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

pub use crate::event::ErrorKind;

impl AgentEvent {
    /// This event as recorded for run `run_id`: its kind's [`Event`], the
    /// payload its fields with `type` first and `run_id` last.
    pub fn into_event(self, run_id: &str) -> Event {
        fn record<T>(type_name: &str, event: T, run_id: &str) -> AgentRecord<T> {
            AgentRecord {
                type_name: type_name.to_string(),
                event,
                run_id: run_id.to_string(),
            }
        }
        let t = self.type_name();
        match self {
            Self::Started { session_id, model } => {
                Event::AgentStarted(record(t, ev::AgentStarted { session_id, model }, run_id))
            }
            Self::Message { text, delta } => {
                Event::AgentMessage(record(t, ev::AgentMessage { text, delta }, run_id))
            }
            Self::ToolCall { id, name, input } => {
                Event::AgentToolCall(record(t, ev::AgentToolCall { id, name, input }, run_id))
            }
            Self::ToolResult {
                id,
                name,
                output,
                is_error,
            } => Event::AgentToolResult(record(
                t,
                ev::AgentToolResult {
                    id,
                    name,
                    output,
                    is_error,
                },
                run_id,
            )),
            Self::Usage {
                input_tokens,
                output_tokens,
                cached_input_tokens,
                cost_usd,
            } => Event::AgentUsage(record(
                t,
                ev::AgentUsage {
                    input_tokens,
                    output_tokens,
                    cached_input_tokens,
                    cost_usd,
                },
                run_id,
            )),
            Self::Idle {
                status,
                is_error,
                result,
            } => Event::AgentIdle(record(
                t,
                ev::AgentIdle {
                    status,
                    is_error,
                    result,
                },
                run_id,
            )),
            Self::Denied {
                tool, rule, reason, ..
            } => Event::ToolDenied(ev::ToolDenied {
                run_id: Some(run_id.to_string()),
                profile: None,
                tool,
                rule,
                by: ev::DeniedBy::Cli,
                reason,
            }),
            Self::Error { kind, message } => {
                Event::AgentError(record(t, ev::AgentError { kind, message }, run_id))
            }
            Self::Notice { text } => {
                Event::AgentNotice(record(t, ev::AgentNotice { text }, run_id))
            }
            Self::Thought(e) => Event::AgentThought(record(t, e, run_id)),
            Self::Plan(e) => Event::AgentPlan(record(t, e, run_id)),
            Self::Mode(e) => Event::AgentMode(record(t, e, run_id)),
            Self::ToolUpdate(e) => Event::AgentToolUpdate(record(t, e, run_id)),
            Self::DriftDetected {
                provider,
                ratio,
                threshold,
                fixture_version,
                from,
                to,
            } => Event::DriftDetected(record(
                t,
                ev::DriftDetected {
                    provider,
                    ratio,
                    threshold,
                    fixture_version,
                    from,
                    to,
                },
                run_id,
            )),
        }
    }
}
