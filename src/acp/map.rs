//! From npc's agent events to ACP session updates. The input is the
//! recorded payload of an event ([`crate::runs::event_payload`]: the event's
//! JSON with its `type`), so a live prompt and `session/load`'s replay of
//! the event log go through the same [`Mapper`]:
//! `agent.message` → `agent_message_chunk`; `agent.tool_call` → `tool_call`
//! (status `in_progress`, kind from the tool's name, raw input), plus a
//! `plan` when the tool is a to-do list (Claude Code's `TodoWrite`);
//! `agent.tool_result` → `tool_call_update` (`completed` or `failed`, the
//! output as text); an error the agent reported → an agent message. A tool
//! result without an id closes the oldest open call. The stop reason of a
//! prompt comes from the run's [`Outcome`].

use agent_client_protocol_schema::v1::{
    ContentBlock, ContentChunk, Plan, PlanEntry, PlanEntryPriority, PlanEntryStatus, SessionUpdate,
    StopReason, ToolCall, ToolCallContent, ToolCallStatus, ToolCallUpdate, ToolCallUpdateFields,
    ToolKind,
};
use serde_json::Value;

use crate::runs::Outcome;

/// Tool calls remembered for id-less results; older ones are forgotten.
pub const MAX_OPEN_TOOL_CALLS: usize = 256;
/// Longest tool output sent in one update (the rest is cut, marked).
pub const MAX_TOOL_OUTPUT_BYTES: usize = 256 * 1024;
/// Entries of a plan sent.
pub const MAX_PLAN_ENTRIES: usize = 200;

/// Turns the agent events of one session into session updates.
#[derive(Debug, Default)]
pub struct Mapper {
    /// Generated ids of calls that came without one.
    next_id: u64,
    /// Calls started and not finished, oldest first.
    open: std::collections::VecDeque<String>,
}

impl Mapper {
    /// The updates for one recorded event payload (none for events editors
    /// have no use for: usage, idle, stderr lines, drift).
    pub fn updates(&mut self, event: &Value) -> Vec<SessionUpdate> {
        let text = |key: &str| event.get(key).and_then(Value::as_str).unwrap_or_default();
        match text("type") {
            "agent.message" => {
                if text("text").is_empty() {
                    return Vec::new();
                }
                vec![SessionUpdate::AgentMessageChunk(ContentChunk::new(
                    ContentBlock::from(text("text")),
                ))]
            }
            "agent.tool_call" => {
                let name = text("name");
                let id = match event.get("id").and_then(Value::as_str) {
                    Some(id) if !id.is_empty() => id.to_string(),
                    _ => {
                        self.next_id += 1;
                        format!("npc-tool-{}", self.next_id)
                    }
                };
                if self.open.len() >= MAX_OPEN_TOOL_CALLS {
                    self.open.pop_front();
                }
                self.open.push_back(id.clone());
                let input = event.get("input").cloned().unwrap_or(Value::Null);
                let mut updates = vec![SessionUpdate::ToolCall(
                    ToolCall::new(id, title(name, &input))
                        .kind(kind(name))
                        .status(ToolCallStatus::InProgress)
                        .raw_input(input.clone()),
                )];
                updates.extend(plan(name, &input).map(SessionUpdate::Plan));
                updates
            }
            "agent.tool_result" => {
                let id = match event.get("id").and_then(Value::as_str) {
                    Some(id) if !id.is_empty() => {
                        self.open.retain(|open| open != id);
                        id.to_string()
                    }
                    _ => match self.open.pop_front() {
                        Some(id) => id,
                        None => return Vec::new(),
                    },
                };
                let failed = event.get("is_error").and_then(Value::as_bool) == Some(true);
                let output = clip(text("output"));
                vec![SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(
                    id,
                    ToolCallUpdateFields::new()
                        .status(if failed {
                            ToolCallStatus::Failed
                        } else {
                            ToolCallStatus::Completed
                        })
                        .content(vec![ToolCallContent::from(output.clone())])
                        .raw_output(Value::String(output)),
                ))]
            }
            "agent.error" if text("kind") == "provider" => {
                vec![SessionUpdate::AgentMessageChunk(ContentChunk::new(
                    ContentBlock::from(format!("\n[agent error] {}\n", text("message"))),
                ))]
            }
            _ => Vec::new(),
        }
    }
}

/// The ACP stop reason of a run that ended with `outcome`; `max_turns` when
/// the agent said it stopped at its turn limit.
pub fn stop_reason(outcome: &Outcome, max_turns: bool) -> StopReason {
    match outcome {
        Outcome::Cancelled { .. } => StopReason::Cancelled,
        _ if max_turns => StopReason::MaxTurnRequests,
        _ => StopReason::EndTurn,
    }
}

/// Whether an `agent.idle` payload says the turn limit stopped the agent.
pub fn hit_turn_limit(event: &Value) -> bool {
    event.get("type").and_then(Value::as_str) == Some("agent.idle")
        && event
            .get("status")
            .and_then(Value::as_str)
            .is_some_and(|s| s.contains("max_turns"))
}

/// A tool's kind from its name (the four CLIs' built-in tool names).
pub fn kind(name: &str) -> ToolKind {
    let lower = name.to_ascii_lowercase();
    let has = |words: &[&str]| words.iter().any(|w| lower.contains(w));
    if has(&["todo", "plan", "think"]) {
        ToolKind::Think
    } else if has(&["bash", "shell", "exec", "command", "run"]) {
        ToolKind::Execute
    } else if has(&["edit", "write", "patch", "replace", "file_change"]) {
        ToolKind::Edit
    } else if has(&["read", "view", "cat"]) {
        ToolKind::Read
    } else if has(&["grep", "glob", "search", "find", "list", "ls"]) {
        ToolKind::Search
    } else if has(&["fetch", "web", "http"]) {
        ToolKind::Fetch
    } else if has(&["delete", "remove"]) {
        ToolKind::Delete
    } else if has(&["move", "rename"]) {
        ToolKind::Move
    } else {
        ToolKind::Other
    }
}

/// Longest tool-call title.
pub const MAX_TITLE_CHARS: usize = 120;

/// A title for a call: the tool's name and its most telling argument.
fn title(name: &str, input: &Value) -> String {
    let detail = ["command", "file_path", "path", "pattern", "url", "query"]
        .iter()
        .find_map(|k| input.get(k).and_then(Value::as_str));
    let full = match detail {
        Some(d) => format!("{name}: {d}"),
        None => name.to_string(),
    };
    let one_line = full.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.chars().count() > MAX_TITLE_CHARS {
        let cut: String = one_line.chars().take(MAX_TITLE_CHARS).collect();
        format!("{cut}…")
    } else {
        one_line
    }
}

/// The plan a to-do tool call carries (`{"todos": [{content, status, priority?}]}`).
fn plan(name: &str, input: &Value) -> Option<Plan> {
    if !name.to_ascii_lowercase().contains("todo") {
        return None;
    }
    let todos = input.get("todos")?.as_array()?;
    let entries = todos
        .iter()
        .take(MAX_PLAN_ENTRIES)
        .filter_map(|t| {
            let content = t.get("content").and_then(Value::as_str)?;
            let status = match t.get("status").and_then(Value::as_str) {
                Some("completed") => PlanEntryStatus::Completed,
                Some("in_progress") => PlanEntryStatus::InProgress,
                _ => PlanEntryStatus::Pending,
            };
            let priority = match t.get("priority").and_then(Value::as_str) {
                Some("high") => PlanEntryPriority::High,
                Some("low") => PlanEntryPriority::Low,
                _ => PlanEntryPriority::Medium,
            };
            Some(PlanEntry::new(content, priority, status))
        })
        .collect();
    Some(Plan::new(entries))
}

fn clip(text: &str) -> String {
    if text.len() <= MAX_TOOL_OUTPUT_BYTES {
        return text.to_string();
    }
    let cut = crate::model::source::floor_char_boundary(text, MAX_TOOL_OUTPUT_BYTES);
    format!("{}…[truncated]", &text[..cut])
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn wire(updates: &[SessionUpdate]) -> Vec<Value> {
        updates
            .iter()
            .map(|u| serde_json::to_value(u).unwrap())
            .collect()
    }

    #[test]
    fn messages_tool_calls_and_results_become_session_updates() {
        let mut m = Mapper::default();
        let got = wire(&m.updates(&json!({"type":"agent.message","text":"hi","delta":false})));
        assert_eq!(
            got,
            [json!({"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"hi"}})]
        );
        let got = wire(&m.updates(&json!({
            "type":"agent.tool_call","id":"t1","name":"Bash","input":{"command":"ls -la"}
        })));
        assert_eq!(got[0]["sessionUpdate"], "tool_call");
        assert_eq!(got[0]["toolCallId"], "t1");
        assert_eq!(got[0]["title"], "Bash: ls -la");
        assert_eq!(got[0]["kind"], "execute");
        assert_eq!(got[0]["status"], "in_progress");
        assert_eq!(got[0]["rawInput"], json!({"command":"ls -la"}));
        let got = wire(&m.updates(&json!({
            "type":"agent.tool_result","id":"t1","name":"Bash","output":"a\nb","is_error":true
        })));
        assert_eq!(got[0]["sessionUpdate"], "tool_call_update");
        assert_eq!(got[0]["toolCallId"], "t1");
        assert_eq!(got[0]["status"], "failed");
        assert_eq!(got[0]["content"][0]["content"]["text"], "a\nb");
        for quiet in [
            json!({"type":"agent.usage","input_tokens":1}),
            json!({"type":"agent.idle","status":"success","is_error":false}),
            json!({"type":"agent.error","kind":"stderr","message":"x"}),
            json!({"type":"agent.message","text":"","delta":true}),
            json!({"no":"type"}),
        ] {
            assert!(m.updates(&quiet).is_empty(), "{quiet}");
        }
    }

    #[test]
    fn calls_without_ids_get_one_and_results_close_the_oldest() {
        let mut m = Mapper::default();
        let a = wire(&m.updates(&json!({"type":"agent.tool_call","name":"Read","input":{}})));
        let b = wire(&m.updates(&json!({"type":"agent.tool_call","name":"Read","input":{}})));
        assert_ne!(a[0]["toolCallId"], b[0]["toolCallId"]);
        let r =
            wire(&m.updates(&json!({"type":"agent.tool_result","output":"x","is_error":false})));
        assert_eq!(r[0]["toolCallId"], a[0]["toolCallId"]);
        assert_eq!(r[0]["status"], "completed");
        let r = wire(&m.updates(&json!({"type":"agent.tool_result","output":"y"})));
        assert_eq!(r[0]["toolCallId"], b[0]["toolCallId"]);
        assert!(
            m.updates(&json!({"type":"agent.tool_result","output":"z"}))
                .is_empty()
        );
    }

    #[test]
    fn open_calls_and_outputs_are_bounded() {
        let mut m = Mapper::default();
        for i in 0..(MAX_OPEN_TOOL_CALLS + 10) {
            m.updates(&json!({"type":"agent.tool_call","id":format!("c{i}"),"name":"x"}));
        }
        assert_eq!(m.open.len(), MAX_OPEN_TOOL_CALLS);
        let big = "é".repeat(MAX_TOOL_OUTPUT_BYTES);
        let r = wire(&m.updates(&json!({"type":"agent.tool_result","id":"c20","output":big})));
        let text = r[0]["rawOutput"].as_str().unwrap();
        assert!(text.len() <= MAX_TOOL_OUTPUT_BYTES + 20);
        assert!(text.ends_with("…[truncated]"));
    }

    #[test]
    fn a_todo_list_is_also_a_plan() {
        let mut m = Mapper::default();
        let got = wire(&m.updates(&json!({
            "type":"agent.tool_call","id":"p","name":"TodoWrite",
            "input":{"todos":[
                {"content":"read","status":"completed"},
                {"content":"fix","status":"in_progress","priority":"high"},
                {"content":"test","status":"pending"}
            ]}
        })));
        assert_eq!(got.len(), 2);
        assert_eq!(got[1]["sessionUpdate"], "plan");
        let entries = got[1]["entries"].as_array().unwrap();
        assert_eq!(entries.len(), 3);
        assert_eq!(entries[0]["status"], "completed");
        assert_eq!(entries[1]["status"], "in_progress");
        assert_eq!(entries[1]["priority"], "high");
        assert_eq!(entries[2]["priority"], "medium");
    }

    #[test]
    fn stop_reasons_follow_the_outcome() {
        assert_eq!(
            stop_reason(&Outcome::Cancelled { signal: 15 }, true),
            StopReason::Cancelled
        );
        assert_eq!(stop_reason(&Outcome::Succeeded, false), StopReason::EndTurn);
        assert_eq!(
            stop_reason(&Outcome::TimedOut, true),
            StopReason::MaxTurnRequests
        );
        assert!(hit_turn_limit(
            &json!({"type":"agent.idle","status":"error_max_turns"})
        ));
        assert!(!hit_turn_limit(
            &json!({"type":"agent.idle","status":"success"})
        ));
    }

    #[test]
    fn tool_kinds_come_from_names() {
        assert_eq!(kind("Bash"), ToolKind::Execute);
        assert_eq!(kind("run_shell_command"), ToolKind::Execute);
        assert_eq!(kind("Edit"), ToolKind::Edit);
        assert_eq!(kind("read_file"), ToolKind::Read);
        assert_eq!(kind("Grep"), ToolKind::Search);
        assert_eq!(kind("WebFetch"), ToolKind::Fetch);
        assert_eq!(kind("fs__mystery"), ToolKind::Other);
    }
}
