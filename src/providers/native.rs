//! Shared pieces of the four native JSON parsers: per-stream state (tool
//! names by call id, so results can name their tool) and small accessors
//! that never panic on unexpected shapes.

use std::collections::HashMap;

use serde_json::Value;

use super::AgentEvent;

/// Tool call ids remembered per stream before the memory is reset.
pub const TOOL_MEMORY: usize = 4096;

/// Did the parser recognise a JSON line?
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    Understood,
    /// A JSON object of a type this format does not have (the value is the
    /// type, or `?` when there is none).
    Unknown,
}

/// State a native parser keeps across lines.
#[derive(Debug, Default)]
pub struct NativeState {
    tools: HashMap<String, String>,
    pub started: bool,
}

impl NativeState {
    /// Remember that call `id` is tool `name`. Returns false when the id
    /// was already known (a repeated start).
    pub fn remember(&mut self, id: &str, name: &str) -> bool {
        if self.tools.len() >= TOOL_MEMORY && !self.tools.contains_key(id) {
            self.tools.clear();
        }
        self.tools
            .insert(id.to_string(), name.to_string())
            .is_none()
    }

    pub fn knows(&self, id: &str) -> bool {
        self.tools.contains_key(id)
    }

    pub fn name_of(&self, id: Option<&str>) -> Option<String> {
        id.and_then(|id| self.tools.get(id)).cloned()
    }
}

pub fn str_at<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

pub fn string_at(v: &Value, key: &str) -> Option<String> {
    str_at(v, key).map(str::to_string)
}

pub fn u64_at(v: &Value, key: &str) -> Option<u64> {
    v.get(key).and_then(Value::as_u64)
}

/// Tool output as text: strings as they are, `[{type:"text",text}]` blocks
/// joined by newlines, anything else as compact JSON.
pub fn output_text(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(items)) if items.iter().all(|i| str_at(i, "text").is_some()) => items
            .iter()
            .filter_map(|i| str_at(i, "text"))
            .collect::<Vec<_>>()
            .join("\n"),
        // An MCP `CallToolResult` (Codex's `mcp_tool_call.result`): its
        // content's text.
        Some(result @ Value::Object(_)) if result.get("content").is_some_and(Value::is_array) => {
            output_text(result.get("content"))
        }
        Some(other) => other.to_string(),
    }
}

/// An error value as a message: a string, `{message}`, or JSON.
pub fn error_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Object(_) => str_at(v, "message")
            .map(str::to_string)
            .or_else(|| v.get("data").and_then(|d| string_at(d, "message")))
            .unwrap_or_else(|| v.to_string()),
        other => other.to_string(),
    }
}

pub fn provider_error(message: impl Into<String>) -> AgentEvent {
    AgentEvent::error(super::ErrorKind::Provider, message)
}

/// Most refusals one line of agent output may report (Claude Code lists a
/// turn's permission denials in its `result`); the rest are dropped.
pub const MAX_DENIALS_PER_LINE: usize = 64;

/// The refusal of a tool call by the agent CLI itself.
pub fn denied(id: Option<String>, tool: String, rule: &str, reason: Option<String>) -> AgentEvent {
    AgentEvent::Denied {
        id,
        tool,
        rule: rule.to_string(),
        reason,
    }
}
