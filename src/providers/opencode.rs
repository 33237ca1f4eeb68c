//! OpenCode `run --format json` (NDJSON): `{type, timestamp, sessionID,
//! part}` with types `step_start`, `text` (`part.text`), `tool_use`
//! (`part{callID, tool, state{status, input, output, error}}`),
//! `step_finish` (`part{reason, tokens{input, output, reasoning,
//! cache{read, write}}, cost}`), `reasoning` and `error` (`error{name,
//! data{message}}`). A `step_finish` whose reason is not `tool-calls` ends
//! the turn.

use serde_json::Value;

use super::AgentEvent;
use super::native::{
    NativeState, Read, error_text, output_text, provider_error, str_at, string_at, u64_at,
};

/// The `step_finish` reason that means another step follows.
const MORE_STEPS_REASON: &str = "tool-calls";

pub fn parse(v: &Value, st: &mut NativeState, out: &mut Vec<AgentEvent>) -> Read {
    let part = v.get("part").unwrap_or(&Value::Null);
    match str_at(v, "type").unwrap_or("") {
        "step_start" => {
            if !st.started {
                st.started = true;
                out.push(AgentEvent::Started {
                    session_id: string_at(v, "sessionID").or_else(|| string_at(part, "sessionID")),
                    model: None,
                });
            }
            Read::Understood
        }
        "text" => {
            out.push(AgentEvent::Message {
                text: string_at(part, "text").unwrap_or_default(),
                delta: false,
            });
            Read::Understood
        }
        "reasoning" => Read::Understood,
        "tool_use" => {
            let id = string_at(part, "callID").or_else(|| string_at(part, "id"));
            let name = string_at(part, "tool").unwrap_or_default();
            let state = part.get("state").unwrap_or(&Value::Null);
            let fresh = id.as_deref().is_none_or(|i| st.remember(i, &name));
            if fresh {
                out.push(AgentEvent::ToolCall {
                    id: id.clone(),
                    name: name.clone(),
                    input: state.get("input").cloned().unwrap_or(Value::Null),
                });
            }
            match str_at(state, "status") {
                Some("completed") => out.push(AgentEvent::ToolResult {
                    id,
                    name: Some(name),
                    output: output_text(state.get("output")),
                    is_error: false,
                }),
                Some("error") => out.push(AgentEvent::ToolResult {
                    id,
                    name: Some(name),
                    output: state.get("error").map(error_text).unwrap_or_default(),
                    is_error: true,
                }),
                _ => {}
            }
            Read::Understood
        }
        "step_finish" => {
            let tokens = part.get("tokens");
            out.push(AgentEvent::Usage {
                input_tokens: tokens.and_then(|t| u64_at(t, "input")),
                output_tokens: tokens.and_then(|t| u64_at(t, "output")),
                cached_input_tokens: tokens
                    .and_then(|t| t.get("cache"))
                    .and_then(|c| u64_at(c, "read")),
                cost_usd: part.get("cost").and_then(Value::as_f64),
            });
            let reason = string_at(part, "reason").unwrap_or_else(|| "stop".to_string());
            if reason != MORE_STEPS_REASON {
                out.push(AgentEvent::Idle {
                    status: reason,
                    is_error: false,
                    result: None,
                });
            }
            Read::Understood
        }
        "error" => {
            let e = v.get("error").or_else(|| part.get("error")).unwrap_or(v);
            out.push(provider_error(error_text(e)));
            Read::Understood
        }
        _ => Read::Unknown,
    }
}
