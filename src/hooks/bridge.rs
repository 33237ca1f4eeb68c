//! The hook protocols `npc hook run` speaks: npc's own (the Agent Plugins
//! envelope's `payload` in, the hook answer shape out, so `npc hook run` is
//! itself a valid hook) and the native hook protocols of the agent CLIs that
//! have one, so one policy governs their built-in tools too:
//! - Claude Code (`PreToolUse` / `PostToolUse` command hooks in
//!   `.claude/settings.json`): stdin `{hook_event_name, tool_name,
//!   tool_input, tool_use_id, tool_response?, …}`; a denial (or a failing
//!   hook: fail closed) is exit status 2 with the reason on stderr, which
//!   blocks the tool; a rewrite is `hookSpecificOutput.updatedInput`.
//! - Gemini CLI (`BeforeTool` / `AfterTool` in `.gemini/settings.json`,
//!   project hooks run in trusted folders only): same input fields; a denial
//!   is `{"decision":"deny","reason":…}` on stdout with exit 0 (Gemini treats
//!   exit 1 as a warning that lets the tool run, so failures are answered
//!   as denials too); a rewrite is `hookSpecificOutput.tool_input`.
//!
//! - Codex CLI (`PreToolUse` / `PostToolUse` in `.codex/hooks.json`,
//!   project hooks in trusted projects only, each one trusted by the user
//!   once through `/hooks`): Claude Code's protocol.
//!
//! None of these CLIs can replace a built-in tool's output after it ran: an
//! `after_tool` replacement is handed to the model as additional context,
//! and a failing `after_tool` hook is reported to it as an error.

use serde_json::{Value, json};

use super::{AfterTool, BeforeTool, HookFailure, ToolCallInfo, ToolResultInfo};
use crate::model::HookEvent;

/// Largest stdin `npc hook run` reads (the hook input bound).
pub const MAX_NATIVE_INPUT_BYTES: usize = super::MAX_INPUT_BYTES;

/// Whose protocol `npc hook run` reads and answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Protocol {
    /// npc's own: stdin is the event's payload, stdout the hook answer.
    Npc,
    /// Claude Code's command hooks.
    Claude,
    /// Gemini CLI's command hooks.
    Gemini,
    /// Codex CLI's command hooks (`.codex/hooks.json`): Claude Code's
    /// protocol (`PreToolUse` / `PostToolUse`, exit status 2 with the
    /// reason on stderr blocks, `updatedInput` rewrites).
    Codex,
}

impl Protocol {
    /// The native event name of `event` in this protocol (tool events only
    /// are bridged for the agent CLIs).
    pub fn native_event(self, event: HookEvent) -> Option<&'static str> {
        match (self, event) {
            (Self::Claude | Self::Codex, HookEvent::BeforeTool) => Some("PreToolUse"),
            (Self::Claude | Self::Codex, HookEvent::AfterTool) => Some("PostToolUse"),
            (Self::Gemini, HookEvent::BeforeTool) => Some("BeforeTool"),
            (Self::Gemini, HookEvent::AfterTool) => Some("AfterTool"),
            (Self::Npc, e) => Some(e.as_str()),
            _ => None,
        }
    }
}

/// Errors reading a native hook input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BridgeError {
    #[error(
        "the hook input on stdin is not a JSON object: {reason}; `npc hook run` reads what the agent CLI sends"
    )]
    NotJson { reason: String },
    #[error("the hook input has no `{field}`; is `--agent` the CLI that calls this hook?")]
    Missing { field: &'static str },
    #[error(
        "`{event}` is not bridged for this agent CLI; its hook settings call `npc hook run before_tool` or `after_tool`"
    )]
    NotBridged { event: &'static str },
}

/// What a tool event's input says.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolInput {
    pub call: ToolCallInfo,
    /// `after_tool` only.
    pub result: Option<ToolResultInfo>,
}

fn as_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// Parse the input of a tool event.
pub fn tool_input(
    protocol: Protocol,
    event: HookEvent,
    input: &Value,
) -> Result<ToolInput, BridgeError> {
    if protocol.native_event(event).is_none() {
        return Err(BridgeError::NotBridged {
            event: event.as_str(),
        });
    }
    let (call, result) = match protocol {
        Protocol::Npc => {
            let call = input
                .get("tool_call")
                .ok_or(BridgeError::Missing { field: "tool_call" })?;
            let name = call
                .get("name")
                .and_then(Value::as_str)
                .ok_or(BridgeError::Missing {
                    field: "tool_call.name",
                })?;
            let call = ToolCallInfo {
                id: call.get("id").map(as_text).unwrap_or_default(),
                name: name.to_string(),
                arguments: call.get("arguments").cloned().unwrap_or(Value::Null),
            };
            let result = input.get("result").map(|r| ToolResultInfo {
                call_id: call.id.clone(),
                tool_name: call.name.clone(),
                output: r.get("output").map(as_text).unwrap_or_default(),
                is_error: r.get("is_error").and_then(Value::as_bool).unwrap_or(false),
            });
            (call, result)
        }
        Protocol::Claude | Protocol::Gemini | Protocol::Codex => {
            let name = input
                .get("tool_name")
                .and_then(Value::as_str)
                .ok_or(BridgeError::Missing { field: "tool_name" })?;
            let call = ToolCallInfo {
                id: input
                    .get("tool_use_id")
                    .or_else(|| input.get("tool_call_id"))
                    .map(as_text)
                    .unwrap_or_default(),
                name: name.to_string(),
                arguments: input.get("tool_input").cloned().unwrap_or(Value::Null),
            };
            let result = input.get("tool_response").map(|r| ToolResultInfo {
                call_id: call.id.clone(),
                tool_name: call.name.clone(),
                output: as_text(r),
                is_error: r.get("is_error").and_then(Value::as_bool).unwrap_or(false),
            });
            (call, result)
        }
    };
    if event == HookEvent::AfterTool && result.is_none() {
        return Err(BridgeError::Missing {
            field: match protocol {
                Protocol::Npc => "result",
                _ => "tool_response",
            },
        });
    }
    Ok(ToolInput { call, result })
}

/// What `npc hook run` answers: its exit status and output.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Answer {
    pub exit: u8,
    pub stdout: String,
    pub stderr: String,
}

/// Exit status of a refusal in npc's own protocol and of a failed hook.
pub const EXIT_DENIED: u8 = 1;
/// Exit status that makes Claude Code block a tool.
pub const CLAUDE_BLOCK_EXIT: u8 = 2;

fn deny(protocol: Protocol, reason: String) -> Answer {
    match protocol {
        Protocol::Npc => Answer {
            exit: EXIT_DENIED,
            stdout: json!({"decision": "deny", "reason": reason}).to_string(),
            stderr: String::new(),
        },
        Protocol::Claude | Protocol::Codex => Answer {
            exit: CLAUDE_BLOCK_EXIT,
            stdout: String::new(),
            stderr: reason,
        },
        Protocol::Gemini => Answer {
            exit: 0,
            stdout: json!({"decision": "deny", "reason": reason}).to_string(),
            stderr: String::new(),
        },
    }
}

/// Deny a `before_tool` call whose hooks could not run at all (an
/// unreadable input or manifest, no runtime): fail closed, saying why.
pub fn before_tool_refused(protocol: Protocol, reason: &str) -> Answer {
    deny(
        protocol,
        format!("npc denies this tool call because it could not run the hooks: {reason}"),
    )
}

/// Answer a `before_tool` outcome in `protocol`. A denial names the hook
/// that denied as the gateway does (`… (hook before_tool[0])`).
pub fn before_tool_answer(protocol: Protocol, outcome: Result<BeforeTool, HookFailure>) -> Answer {
    match outcome {
        Ok(BeforeTool::Deny { hook, reason }) => deny(protocol, format!("{reason} (hook {hook})")),
        Err(failure) => deny(protocol, failure.to_string()),
        Ok(BeforeTool::Continue { arguments: None }) => Answer {
            stdout: match protocol {
                Protocol::Npc => json!({"decision": "continue"}).to_string(),
                _ => String::new(),
            },
            ..Answer::default()
        },
        Ok(BeforeTool::Continue {
            arguments: Some(arguments),
        }) => Answer {
            stdout: match protocol {
                Protocol::Npc => json!({"decision": "rewrite", "arguments": arguments}),
                Protocol::Claude | Protocol::Codex => json!({"hookSpecificOutput": {
                    "hookEventName": "PreToolUse", "updatedInput": arguments }}),
                Protocol::Gemini => json!({"hookSpecificOutput": {
                    "hookEventName": "BeforeTool", "tool_input": arguments }}),
            }
            .to_string(),
            ..Answer::default()
        },
    }
}

/// Answer an `after_tool` outcome in `protocol`.
pub fn after_tool_answer(protocol: Protocol, outcome: Result<AfterTool, HookFailure>) -> Answer {
    let event = HookEvent::AfterTool;
    let changed = match outcome {
        Err(failure) => return deny(protocol, failure.to_string()),
        Ok(changed) => changed,
    };
    if changed.output.is_none() && changed.is_error.is_none() {
        return Answer::default();
    }
    let stdout = match protocol {
        Protocol::Npc => {
            let mut answer = serde_json::Map::new();
            if let Some(output) = changed.output {
                answer.insert("output".into(), output.into());
            }
            if let Some(is_error) = changed.is_error {
                answer.insert("is_error".into(), is_error.into());
            }
            Value::Object(answer)
        }
        Protocol::Claude | Protocol::Gemini | Protocol::Codex => {
            let mut context = String::from("npc's after_tool hooks replaced this tool's result");
            if changed.is_error == Some(true) {
                context.push_str(" and marked it an error");
            }
            if let Some(output) = changed.output {
                context.push_str(": ");
                context.push_str(&output);
            }
            json!({"hookSpecificOutput": {
                "hookEventName": protocol.native_event(event),
                "additionalContext": context }})
        }
    }
    .to_string();
    Answer {
        stdout,
        ..Answer::default()
    }
}

/// Answer an observing event's outcome (npc's own protocol).
pub fn observe_answer(outcome: Result<(), HookFailure>) -> Answer {
    match outcome {
        Ok(()) => Answer::default(),
        Err(failure) => Answer {
            exit: EXIT_DENIED,
            stdout: String::new(),
            stderr: format!("error: {failure}"),
        },
    }
}

/// Parse stdin as one JSON object.
pub fn parse_input(bytes: &[u8]) -> Result<Value, BridgeError> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(_) => Err(BridgeError::NotJson {
            reason: "it is JSON but not an object".into(),
        }),
        Err(e) => Err(BridgeError::NotJson {
            reason: e.to_string(),
        }),
    }
}
