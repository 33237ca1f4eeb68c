//! Gemini CLI `-o stream-json` (JSONL): `init{session_id,model}`,
//! `message{role,content,delta}`, `tool_use{tool_name,tool_id,parameters}`,
//! `tool_result{tool_id,status,output,error{type,message}}` (a refused
//! call's `type` is `policy_violation`), `error{severity,message}`,
//! `result{status,error,stats}`.

use serde_json::Value;

use super::AgentEvent;
use super::native::{
    NativeState, Read, denied, error_text, output_text, provider_error, str_at, string_at, u64_at,
};

/// The `tool_result` error type of a call Gemini CLI's policy engine
/// refused (its `ToolErrorType.POLICY_VIOLATION`), the rule npc records.
const POLICY_VIOLATION: &str = "policy_violation";

pub fn parse(v: &Value, st: &mut NativeState, out: &mut Vec<AgentEvent>) -> Read {
    match str_at(v, "type").unwrap_or("") {
        "init" => {
            st.started = true;
            out.push(AgentEvent::Started {
                session_id: string_at(v, "session_id"),
                model: string_at(v, "model"),
            });
            Read::Understood
        }
        "message" => {
            if str_at(v, "role") == Some("assistant") {
                out.push(AgentEvent::Message {
                    text: output_text(v.get("content")),
                    delta: v.get("delta").and_then(Value::as_bool).unwrap_or(false),
                });
            }
            Read::Understood
        }
        "tool_use" => {
            let id = string_at(v, "tool_id");
            let name = string_at(v, "tool_name").unwrap_or_default();
            if let Some(id) = &id {
                st.remember(id, &name);
            }
            out.push(AgentEvent::ToolCall {
                id,
                name,
                input: v.get("parameters").cloned().unwrap_or(Value::Null),
            });
            Read::Understood
        }
        "tool_result" => {
            let id = string_at(v, "tool_id");
            let is_error = str_at(v, "status").is_some_and(|s| s != "success");
            let output = match v.get("error") {
                Some(e) if is_error && !e.is_null() => error_text(e),
                _ => output_text(v.get("output")),
            };
            let name = st.name_of(id.as_deref());
            let refused = is_error
                && v.get("error").and_then(|e| str_at(e, "type")) == Some(POLICY_VIOLATION);
            if refused {
                out.push(denied(
                    id.clone(),
                    name.clone().unwrap_or_default(),
                    POLICY_VIOLATION,
                    Some(output.clone()),
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
        "error" => {
            out.push(provider_error(error_text(v.get("message").unwrap_or(v))));
            Read::Understood
        }
        "result" => {
            let status = string_at(v, "status").unwrap_or_else(|| "result".to_string());
            let is_error = status != "success";
            let error = v.get("error").filter(|e| !e.is_null()).map(error_text);
            if is_error {
                out.push(provider_error(format!(
                    "gemini_cli run ended with `{status}`{}",
                    error
                        .as_deref()
                        .map(|e| format!(": {e}"))
                        .unwrap_or_default()
                )));
            }
            let stats = v.get("stats");
            out.push(AgentEvent::Usage {
                input_tokens: stats.and_then(|s| u64_at(s, "input_tokens")),
                output_tokens: stats.and_then(|s| u64_at(s, "output_tokens")),
                cached_input_tokens: stats.and_then(|s| u64_at(s, "cached")),
                cost_usd: None,
            });
            out.push(AgentEvent::Idle {
                status,
                is_error,
                result: error,
            });
            Read::Understood
        }
        _ => Read::Unknown,
    }
}
