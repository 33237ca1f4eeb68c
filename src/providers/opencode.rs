//! OpenCode NDJSON, in both shapes npc has seen.
//!
//! The installed CLI (`run --format json`, see FORMATS.md): `{type,
//! timestamp, sessionID, part}` with types `step_start`, `text`
//! (`part.text`), `tool_use` (`part{callID, tool, state{status, input,
//! output, error}}`; an `error` that starts as OpenCode's refusals do is
//! a refused call), `step_finish` (`part{reason, tokens{input, output,
//! reasoning, cache{read, write}}, cost}`), `reasoning` and `error`
//! (`error{name, data{message}}`). A `step_finish` whose reason is not
//! `tool-calls` ends the turn.
//!
//! The seed's description (`message`, `tool`, `tool_output`, `done`
//! kinds), read field by field with the usual spellings, since the seed
//! names only the kinds: the kind in `type` or `kind`; `message{role?,
//! content|text, delta?}` (only the assistant's, when a role is given);
//! `tool{id|callID|call_id, name|tool, input|args|arguments|parameters}`;
//! `tool_output{id|callID|call_id, name|tool?, output|content|result,
//! is_error?|error?|status?}`; `done{reason|status?, is_error?, error?,
//! usage|tokens?, cost?}`, which ends the turn.

use serde_json::Value;

use super::AgentEvent;
use super::native::{
    NativeState, Read, denied, error_text, output_text, provider_error, str_at, string_at, u64_at,
};

/// How OpenCode's errors of a refused tool call begin (its
/// `PermissionDeniedError`, a rule says `deny`; its `RejectedError`, an
/// `ask` nobody allowed): such an error is a refusal, not a failure.
const REFUSALS: [&str; 2] = [
    "The user has specified a rule which prevents you from using this specific tool call",
    "The user rejected permission to use this specific tool call",
];
/// The rule npc records for a call OpenCode refused.
const PERMISSION_RULE: &str = "permission";

/// The `step_finish` reason that means another step follows.
const MORE_STEPS_REASON: &str = "tool-calls";

pub fn parse(v: &Value, st: &mut NativeState, out: &mut Vec<AgentEvent>) -> Read {
    let part = v.get("part").unwrap_or(&Value::Null);
    let kind = str_at(v, "type")
        .or_else(|| str_at(v, "kind"))
        .unwrap_or("");
    match kind {
        "message" | "tool" | "tool_output" | "done" => seed(kind, v, st, out),
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
                Some("error") => {
                    let output = state.get("error").map(error_text).unwrap_or_default();
                    if REFUSALS.iter().any(|r| output.starts_with(r)) {
                        out.push(denied(
                            id.clone(),
                            name.clone(),
                            PERMISSION_RULE,
                            Some(output.clone()),
                        ));
                    }
                    out.push(AgentEvent::ToolResult {
                        id,
                        name: Some(name),
                        output,
                        is_error: true,
                    });
                }
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

/// The first of `keys` that `v` has (and is not null).
fn first<'a>(v: &'a Value, keys: &[&str]) -> Option<&'a Value> {
    keys.iter().find_map(|k| v.get(*k).filter(|x| !x.is_null()))
}

fn first_string(v: &Value, keys: &[&str]) -> Option<String> {
    first(v, keys).and_then(Value::as_str).map(str::to_string)
}

/// Keys a seed-shaped tool call or output carries its call id in.
const SEED_ID_KEYS: [&str; 3] = ["id", "callID", "call_id"];
/// Keys a seed-shaped tool call or output carries the tool name in.
const SEED_NAME_KEYS: [&str; 3] = ["name", "tool", "tool_name"];

/// One line of the seed's shape (`message`, `tool`, `tool_output`, `done`).
fn seed(kind: &str, v: &Value, st: &mut NativeState, out: &mut Vec<AgentEvent>) -> Read {
    match kind {
        "message" => {
            if str_at(v, "role").is_none_or(|r| r == "assistant") {
                out.push(AgentEvent::Message {
                    text: output_text(first(v, &["content", "text", "message"])),
                    delta: v.get("delta").and_then(Value::as_bool).unwrap_or(false),
                });
            }
        }
        "tool" => {
            let id = first_string(v, &SEED_ID_KEYS);
            let name = first_string(v, &SEED_NAME_KEYS).unwrap_or_default();
            if let Some(id) = &id {
                st.remember(id, &name);
            }
            out.push(AgentEvent::ToolCall {
                id,
                name,
                input: first(v, &["input", "args", "arguments", "parameters"])
                    .cloned()
                    .unwrap_or(Value::Null),
            });
        }
        "tool_output" => {
            let id = first_string(v, &SEED_ID_KEYS);
            let error = first(v, &["error"]);
            let is_error = v.get("is_error").and_then(Value::as_bool).unwrap_or(false)
                || error.is_some()
                || str_at(v, "status").is_some_and(|s| s == "error");
            let output = match error {
                Some(e) if first(v, &["output", "content", "result"]).is_none() => error_text(e),
                _ => output_text(first(v, &["output", "content", "result"])),
            };
            out.push(AgentEvent::ToolResult {
                name: first_string(v, &SEED_NAME_KEYS).or_else(|| st.name_of(id.as_deref())),
                id,
                output,
                is_error,
            });
        }
        _ => {
            let tokens = first(v, &["usage", "tokens"]);
            let cost = v.get("cost").and_then(Value::as_f64);
            if tokens.is_some() || cost.is_some() {
                out.push(AgentEvent::Usage {
                    input_tokens: tokens
                        .and_then(|t| first(t, &["input_tokens", "input"]))
                        .and_then(Value::as_u64),
                    output_tokens: tokens
                        .and_then(|t| first(t, &["output_tokens", "output"]))
                        .and_then(Value::as_u64),
                    cached_input_tokens: tokens
                        .and_then(|t| t.get("cache"))
                        .and_then(|c| u64_at(c, "read")),
                    cost_usd: cost,
                });
            }
            let error = first(v, &["error"]).map(error_text);
            let status =
                first_string(v, &["reason", "status"]).unwrap_or_else(|| "done".to_string());
            let is_error = v.get("is_error").and_then(Value::as_bool).unwrap_or(false)
                || error.is_some()
                || status == "error";
            if let Some(e) = &error {
                out.push(provider_error(e.clone()));
            }
            out.push(AgentEvent::Idle {
                status,
                is_error,
                result: error,
            });
        }
    }
    Read::Understood
}
