//! Claude Code `--output-format stream-json --verbose` (NDJSON): `system`
//! (`init`), `assistant` (text / thinking / tool_use blocks), `user`
//! (tool_result blocks), `result` (end of the run, with usage and cost,
//! and the tool calls Claude Code refused: `permission_denials`),
//! plus `stream_event` and `rate_limit_event`, which carry nothing npc maps.

use serde_json::Value;

use super::AgentEvent;
use super::native::{
    MAX_DENIALS_PER_LINE, NativeState, Read, denied, error_text, output_text, provider_error,
    str_at, string_at, u64_at,
};

/// The `result` field listing the tool calls Claude Code refused in the
/// turn (`[{tool_name, tool_use_id, tool_input}]`), and the rule npc
/// records for each.
const PERMISSION_DENIALS: &str = "permission_denials";

pub fn parse(v: &Value, st: &mut NativeState, out: &mut Vec<AgentEvent>) -> Read {
    match str_at(v, "type").unwrap_or("") {
        "system" => {
            if str_at(v, "subtype") == Some("init") && !st.started {
                st.started = true;
                out.push(AgentEvent::Started {
                    session_id: string_at(v, "session_id"),
                    model: string_at(v, "model"),
                });
            }
            Read::Understood
        }
        "assistant" => {
            for block in content(v) {
                match str_at(block, "type") {
                    Some("text") => out.push(AgentEvent::Message {
                        text: string_at(block, "text").unwrap_or_default(),
                        delta: false,
                    }),
                    Some("tool_use") => {
                        let id = string_at(block, "id");
                        let name = string_at(block, "name").unwrap_or_default();
                        if let Some(id) = &id {
                            st.remember(id, &name);
                        }
                        out.push(AgentEvent::ToolCall {
                            id,
                            name,
                            input: block.get("input").cloned().unwrap_or(Value::Null),
                        });
                    }
                    _ => {}
                }
            }
            Read::Understood
        }
        "user" => {
            for block in content(v) {
                if str_at(block, "type") == Some("tool_result") {
                    let id = string_at(block, "tool_use_id");
                    out.push(AgentEvent::ToolResult {
                        name: st.name_of(id.as_deref()),
                        id,
                        output: output_text(block.get("content")),
                        is_error: block
                            .get("is_error")
                            .and_then(Value::as_bool)
                            .unwrap_or(false),
                    });
                }
            }
            Read::Understood
        }
        "result" => {
            let is_error = v.get("is_error").and_then(Value::as_bool).unwrap_or(false);
            let status = string_at(v, "subtype").unwrap_or_else(|| "result".to_string());
            let result = match v.get("result") {
                Some(r) if !r.is_null() => Some(error_text(r)),
                _ => None,
            };
            if is_error {
                out.push(provider_error(format!(
                    "claude_code run ended with `{status}`{}",
                    result
                        .as_deref()
                        .map(|r| format!(": {r}"))
                        .unwrap_or_default()
                )));
            }
            let refused = v.get(PERMISSION_DENIALS).and_then(Value::as_array);
            for d in refused.into_iter().flatten().take(MAX_DENIALS_PER_LINE) {
                out.push(denied(
                    string_at(d, "tool_use_id"),
                    string_at(d, "tool_name").unwrap_or_default(),
                    PERMISSION_DENIALS,
                    None,
                ));
            }
            let usage = v.get("usage");
            out.push(AgentEvent::Usage {
                input_tokens: usage.and_then(|u| u64_at(u, "input_tokens")),
                output_tokens: usage.and_then(|u| u64_at(u, "output_tokens")),
                cached_input_tokens: usage.and_then(|u| u64_at(u, "cache_read_input_tokens")),
                cost_usd: v.get("total_cost_usd").and_then(Value::as_f64),
            });
            out.push(AgentEvent::Idle {
                status,
                is_error,
                result,
            });
            Read::Understood
        }
        "stream_event" | "rate_limit_event" => Read::Understood,
        _ => Read::Unknown,
    }
}

fn content(v: &Value) -> &[Value] {
    v.get("message")
        .and_then(|m| m.get("content"))
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}
