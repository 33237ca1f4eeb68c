//! Codex `exec --json` (JSONL): `thread.started`, `turn.started`,
//! `turn.completed{usage}`, `turn.failed{error}`, `error`, and
//! `item.started|updated|completed{item}` with item types `agent_message`,
//! `reasoning`, `command_execution`, `file_change`, `mcp_tool_call`,
//! `web_search`, `todo_list` and `error`; a tool-like item whose `status`
//! is `declined` was refused by Codex itself.

use serde_json::{Value, json};

use super::AgentEvent;
use super::native::{
    NativeState, Read, denied, error_text, output_text, provider_error, str_at, string_at, u64_at,
};

/// The status of an item Codex refused to carry out (its approval policy
/// or sandbox said no), the rule npc records.
const DECLINED: &str = "declined";

pub fn parse(v: &Value, st: &mut NativeState, out: &mut Vec<AgentEvent>) -> Read {
    match str_at(v, "type").unwrap_or("") {
        "thread.started" => {
            out.push(AgentEvent::Started {
                session_id: string_at(v, "thread_id"),
                model: None,
            });
            Read::Understood
        }
        "turn.started" => Read::Understood,
        "turn.completed" => {
            let usage = v.get("usage");
            out.push(AgentEvent::Usage {
                input_tokens: usage.and_then(|u| u64_at(u, "input_tokens")),
                output_tokens: usage.and_then(|u| u64_at(u, "output_tokens")),
                cached_input_tokens: usage.and_then(|u| u64_at(u, "cached_input_tokens")),
                cost_usd: None,
            });
            out.push(AgentEvent::Idle {
                status: "completed".to_string(),
                is_error: false,
                result: None,
            });
            Read::Understood
        }
        "turn.failed" => {
            let message = v.get("error").map(error_text).unwrap_or_default();
            out.push(provider_error(format!("codex turn failed: {message}")));
            out.push(AgentEvent::Idle {
                status: "failed".to_string(),
                is_error: true,
                result: Some(message),
            });
            Read::Understood
        }
        "error" => {
            out.push(provider_error(error_text(v.get("message").unwrap_or(v))));
            Read::Understood
        }
        "item.started" => item_started(v.get("item").unwrap_or(&Value::Null), st, out),
        "item.updated" => Read::Understood,
        "item.completed" => item_completed(v.get("item").unwrap_or(&Value::Null), st, out),
        _ => Read::Unknown,
    }
}

/// The tool name and input npc reports for a tool-like item.
fn tool_of(item: &Value) -> Option<(String, Value)> {
    let kind = str_at(item, "type")?;
    Some(match kind {
        "command_execution" => (
            "command_execution".to_string(),
            json!({ "command": item.get("command").cloned().unwrap_or(Value::Null) }),
        ),
        "mcp_tool_call" => (
            format!(
                "{}.{}",
                str_at(item, "server").unwrap_or("?"),
                str_at(item, "tool").unwrap_or("?")
            ),
            item.get("arguments").cloned().unwrap_or(Value::Null),
        ),
        "file_change" => (
            "file_change".to_string(),
            json!({ "changes": item.get("changes").cloned().unwrap_or(Value::Null) }),
        ),
        "web_search" => (
            "web_search".to_string(),
            json!({ "query": item.get("query").cloned().unwrap_or(Value::Null) }),
        ),
        _ => return None,
    })
}

fn call(item: &Value, st: &mut NativeState, out: &mut Vec<AgentEvent>) -> bool {
    let Some((name, input)) = tool_of(item) else {
        return false;
    };
    let id = string_at(item, "id");
    let fresh = id.as_deref().is_none_or(|i| st.remember(i, &name));
    if fresh {
        out.push(AgentEvent::ToolCall { id, name, input });
    }
    true
}

fn item_started(item: &Value, st: &mut NativeState, out: &mut Vec<AgentEvent>) -> Read {
    match str_at(item, "type") {
        Some(_) if call(item, st, out) => Read::Understood,
        Some("agent_message" | "reasoning" | "todo_list" | "error") => Read::Understood,
        _ => Read::Unknown,
    }
}

fn item_completed(item: &Value, st: &mut NativeState, out: &mut Vec<AgentEvent>) -> Read {
    let kind = str_at(item, "type").unwrap_or("");
    match kind {
        "agent_message" => {
            out.push(AgentEvent::Message {
                text: string_at(item, "text").unwrap_or_default(),
                delta: false,
            });
            Read::Understood
        }
        "reasoning" | "todo_list" => Read::Understood,
        "error" => {
            out.push(provider_error(
                string_at(item, "message").unwrap_or_default(),
            ));
            Read::Understood
        }
        "command_execution" | "mcp_tool_call" | "file_change" | "web_search" => {
            let id = string_at(item, "id");
            if id.as_deref().is_none_or(|i| !st.knows(i)) {
                call(item, st, out);
            }
            let declined = str_at(item, "status") == Some(DECLINED);
            let failed = declined || str_at(item, "status") == Some("failed");
            let (output, is_error) = match kind {
                "command_execution" => (
                    output_text(item.get("aggregated_output")),
                    failed
                        || item
                            .get("exit_code")
                            .and_then(Value::as_i64)
                            .is_some_and(|c| c != 0),
                ),
                "mcp_tool_call" => match item.get("error") {
                    Some(e) if !e.is_null() => (error_text(e), true),
                    _ => (output_text(item.get("result")), failed),
                },
                _ => (string_at(item, "status").unwrap_or_default(), failed),
            };
            let name = st
                .name_of(id.as_deref())
                .or_else(|| tool_of(item).map(|t| t.0));
            if declined {
                out.push(denied(
                    id.clone(),
                    name.clone().unwrap_or_default(),
                    DECLINED,
                    (!output.is_empty()).then(|| output.clone()),
                ));
            }
            out.push(AgentEvent::ToolResult {
                name,
                id,
                output,
                is_error,
            });
            Read::Understood
        }
        _ => Read::Unknown,
    }
}
