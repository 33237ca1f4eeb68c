//! `session/update` → [`AgentEvent`]: what an ACP agent reports, in the
//! words npc's headless parsers use, so a run means the same whichever
//! driver ran it (`agent.message` fragments, `agent.tool_call` and
//! `agent.tool_result` named alike), plus what only ACP says
//! (`agent.thought`, `agent.plan`, `agent.mode`, `agent.tool_update` with a
//! call's kind, status, locations and diffs). Texts are cut at
//! [`MAX_TEXT_BYTES`]; lists at [`MAX_LIST_ITEMS`].

use std::collections::{BTreeMap, HashMap, VecDeque};

use agent_client_protocol_schema::v1::{
    ContentBlock, SessionUpdate, ToolCall, ToolCallContent, ToolCallLocation, ToolCallStatus,
    ToolCallUpdate,
};
use serde_json::Value;

use super::{MAX_TRACKED_TOOL_CALLS, clip};
use crate::event::{
    AgentDiff, AgentMode, AgentPlan, AgentPlanEntry, AgentThought, AgentToolUpdate,
};
use crate::providers::AgentEvent;

/// Longest text of one event (a message fragment, a tool's output).
pub const MAX_TEXT_BYTES: usize = 64 * 1024;
/// Most entries of a plan, locations or diffs of one event.
pub const MAX_LIST_ITEMS: usize = 64;

/// The names of the tool calls seen, for their results (bounded: the
/// oldest is forgotten first).
#[derive(Debug, Default)]
pub struct Tools {
    /// Name, and whether its `agent.tool_call` was recorded.
    names: HashMap<String, (String, bool)>,
    order: VecDeque<String>,
}

impl Tools {
    /// Remember call `id`'s tool (`started`: its `agent.tool_call` is out).
    pub(super) fn remember(&mut self, id: &str, name: &str, started: bool) {
        let started = started || self.names.get(id).is_some_and(|(_, s)| *s);
        if self
            .names
            .insert(id.to_string(), (name.to_string(), started))
            .is_none()
        {
            self.order.push_back(id.to_string());
            while self.order.len() > MAX_TRACKED_TOOL_CALLS {
                if let Some(old) = self.order.pop_front() {
                    self.names.remove(&old);
                }
            }
        }
    }

    fn name(&self, id: &str) -> Option<&str> {
        self.names.get(id).map(|(n, _)| n.as_str())
    }

    /// How many calls are remembered.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.names.len()
    }

    fn started(&self, id: &str) -> bool {
        self.names.get(id).is_some_and(|(_, s)| *s)
    }
}

/// A tool call as a permission question names it.
#[derive(Debug, Clone, PartialEq)]
pub struct CallInfo {
    pub id: String,
    pub tool: String,
    pub arguments: Value,
    pub title: Option<String>,
}

/// The tool's own name: ACP's `name` where the agent gives it, else the
/// name an adapter puts in `_meta` (`claudeCode.toolName`), else the one
/// seen with the call's start, else its title.
fn tool_name(
    name: Option<&str>,
    meta: Option<&serde_json::Map<String, Value>>,
    title: &str,
) -> String {
    let from_meta = meta.and_then(|m| {
        m.values()
            .find_map(|v| v.get("toolName").and_then(Value::as_str))
    });
    let name = name.or(from_meta).unwrap_or(title);
    clip(name, MAX_NAME_BYTES)
}

/// Longest tool name kept.
pub const MAX_NAME_BYTES: usize = 256;

/// The call a permission question is about. Its tool's name: ACP's
/// `name`, an adapter's `_meta` name, the name seen with the call's start,
/// the prefix of an id of the form `TOOL__…` (Gemini CLI's), else the
/// CLI's tool for the call's kind (`by_kind`, from the run: `execute` is
/// Codex's `shell`), else the title.
pub fn call_of_update(
    update: &ToolCallUpdate,
    tools: &Tools,
    by_kind: &BTreeMap<String, String>,
) -> CallInfo {
    let id = update.tool_call_id.to_string();
    let f = &update.fields;
    let title = f.title.clone();
    let id_prefix = gemini_tool_of_id(&id);
    let by_kind = f
        .kind
        .as_ref()
        .and_then(|k| by_kind.get(&word(k)))
        .map(String::as_str);
    let tool = f
        .name
        .as_deref()
        .or(meta_name(update.meta.as_ref()))
        .or(tools.name(&id))
        .or(id_prefix)
        .or(by_kind)
        .or(title.as_deref())
        .unwrap_or("tool");
    let tool = clip(tool, MAX_NAME_BYTES);
    CallInfo {
        id,
        tool,
        arguments: f
            .raw_input
            .clone()
            .unwrap_or_else(|| Value::Object(Default::default())),
        title: title.map(|t| clip(&t, MAX_NAME_BYTES)),
    }
}

/// The tool of a Gemini CLI call id, `TOOL__TOOL_<digits>_<digits>`
/// (`run_shell_command__run_shell_command_1796458513260_0`).
pub(super) fn gemini_tool_of_id(id: &str) -> Option<&str> {
    id.match_indices("__").find_map(|(at, _)| {
        let (tool, rest) = (&id[..at], &id[at + 2..]);
        let tail = rest.strip_prefix(tool)?.strip_prefix('_')?;
        (!tool.is_empty() && tail.starts_with(|c: char| c.is_ascii_digit())).then_some(tool)
    })
}

fn meta_name(meta: Option<&serde_json::Map<String, Value>>) -> Option<&str> {
    meta?
        .values()
        .find_map(|v| v.get("toolName").and_then(Value::as_str))
}

/// The events of one update.
pub fn update(update: SessionUpdate, tools: &mut Tools) -> Vec<AgentEvent> {
    match update {
        SessionUpdate::AgentMessageChunk(chunk) => text_of(&chunk.content)
            .map(|text| AgentEvent::Message { text, delta: true })
            .into_iter()
            .collect(),
        SessionUpdate::AgentThoughtChunk(chunk) => text_of(&chunk.content)
            .map(|text| AgentEvent::Thought(AgentThought { text }))
            .into_iter()
            .collect(),
        SessionUpdate::ToolCall(call) => tool_call(call, tools),
        SessionUpdate::ToolCallUpdate(update) => tool_call_update(update, tools),
        SessionUpdate::Plan(plan) => vec![AgentEvent::Plan(AgentPlan {
            entries: plan
                .entries
                .into_iter()
                .take(MAX_LIST_ITEMS)
                .map(|e| AgentPlanEntry {
                    content: clip(&e.content, MAX_TEXT_BYTES),
                    status: word(&e.status),
                    priority: word(&e.priority),
                })
                .collect(),
        })],
        SessionUpdate::CurrentModeUpdate(mode) => vec![AgentEvent::Mode(AgentMode {
            mode: clip(&mode.current_mode_id.to_string(), MAX_NAME_BYTES),
        })],
        SessionUpdate::UsageUpdate(usage) => vec![AgentEvent::Usage {
            input_tokens: None,
            output_tokens: None,
            cached_input_tokens: None,
            cost_usd: usage
                .cost
                .filter(|c| c.currency.eq_ignore_ascii_case("usd"))
                .map(|c| c.amount),
        }],
        // The user's own words echoed, commands, titles, options: nothing
        // a run records.
        _ => Vec::new(),
    }
}

fn tool_call(call: ToolCall, tools: &mut Tools) -> Vec<AgentEvent> {
    let id = call.tool_call_id.to_string();
    let name = tool_name(call.name.as_deref(), call.meta.as_ref(), &call.title);
    tools.remember(&id, &name, true);
    let mut events = vec![AgentEvent::ToolCall {
        id: Some(id.clone()),
        name: name.clone(),
        input: call
            .raw_input
            .unwrap_or_else(|| Value::Object(Default::default())),
    }];
    events.push(AgentEvent::ToolUpdate(AgentToolUpdate {
        id: Some(id.clone()),
        status: Some(word(&call.status)),
        kind: Some(word(&call.kind)),
        title: Some(clip(&call.title, MAX_NAME_BYTES)),
        locations: locations(&call.locations),
        diffs: diffs(&call.content),
    }));
    if let Some(result) = result(
        &id,
        Some(name),
        call.status,
        &call.content,
        call.raw_output.as_ref(),
    ) {
        events.push(result);
    }
    events
}

fn tool_call_update(update: ToolCallUpdate, tools: &mut Tools) -> Vec<AgentEvent> {
    let id = update.tool_call_id.to_string();
    let f = update.fields;
    if let Some(name) = f.name.as_deref() {
        tools.remember(&id, &clip(name, MAX_NAME_BYTES), false);
    }
    let mut events = Vec::new();
    // A call first seen in an update (Gemini CLI asks permission for a
    // call it never announced): its start, so every result has one.
    if !tools.started(&id) {
        let name = tools.name(&id).map(str::to_string).unwrap_or_else(|| {
            tool_name(
                None,
                update.meta.as_ref(),
                f.title.as_deref().unwrap_or("tool"),
            )
        });
        tools.remember(&id, &name, true);
        events.push(AgentEvent::ToolCall {
            id: Some(id.clone()),
            name,
            input: f
                .raw_input
                .clone()
                .unwrap_or_else(|| Value::Object(Default::default())),
        });
    }
    let content = f.content.unwrap_or_default();
    let locations = f.locations.as_deref().map(locations).unwrap_or_default();
    let diffs = diffs(&content);
    if f.kind.is_some()
        || f.title.is_some()
        || !locations.is_empty()
        || !diffs.is_empty()
        || f.status.is_some()
    {
        events.push(AgentEvent::ToolUpdate(AgentToolUpdate {
            id: Some(id.clone()),
            status: f.status.as_ref().map(word),
            kind: f.kind.as_ref().map(word),
            title: f.title.as_deref().map(|t| clip(t, MAX_NAME_BYTES)),
            locations,
            diffs,
        }));
    }
    if let Some(status) = f.status {
        let name = tools.name(&id).map(str::to_string);
        if let Some(result) = result(&id, name, status, &content, f.raw_output.as_ref()) {
            events.push(result);
        }
    }
    events
}

/// The `agent.tool_result` of a call that `status` says ended.
fn result(
    id: &str,
    name: Option<String>,
    status: ToolCallStatus,
    content: &[ToolCallContent],
    raw_output: Option<&Value>,
) -> Option<AgentEvent> {
    let is_error = match status {
        ToolCallStatus::Completed => false,
        ToolCallStatus::Failed => true,
        _ => return None,
    };
    let mut output = String::new();
    for c in content {
        if let ToolCallContent::Content(c) = c
            && let Some(text) = text_of(&c.content)
        {
            if !output.is_empty() {
                output.push('\n');
            }
            output.push_str(&text);
        }
    }
    if output.is_empty()
        && let Some(raw) = raw_output
    {
        output = match raw {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
    }
    Some(AgentEvent::ToolResult {
        id: Some(id.to_string()),
        name,
        output: clip(&output, MAX_TEXT_BYTES),
        is_error,
    })
}

fn text_of(block: &ContentBlock) -> Option<String> {
    match block {
        ContentBlock::Text(t) => Some(clip(&t.text, MAX_TEXT_BYTES)),
        _ => None,
    }
}

fn locations(locations: &[ToolCallLocation]) -> Vec<String> {
    locations
        .iter()
        .take(MAX_LIST_ITEMS)
        .map(|l| {
            let path = clip(&l.path.display().to_string(), MAX_TEXT_BYTES / 16);
            match l.line {
                Some(line) => format!("{path}:{line}"),
                None => path,
            }
        })
        .collect()
}

fn diffs(content: &[ToolCallContent]) -> Vec<AgentDiff> {
    content
        .iter()
        .filter_map(|c| match c {
            ToolCallContent::Diff(d) => Some(d),
            _ => None,
        })
        .take(MAX_LIST_ITEMS)
        .map(|d| {
            let (added, removed) = count_lines(d.old_text.as_deref().unwrap_or(""), &d.new_text);
            AgentDiff {
                path: clip(&d.path.display().to_string(), MAX_TEXT_BYTES / 16),
                added,
                removed,
            }
        })
        .collect()
}

/// Lines added and removed from `old` to `new`, by a line-set comparison
/// (a diff's size, not a diff: bounded work on hostile texts).
fn count_lines(old: &str, new: &str) -> (u64, u64) {
    let mut counts: HashMap<&str, i64> = HashMap::new();
    for l in old.lines() {
        *counts.entry(l).or_default() -= 1;
    }
    for l in new.lines() {
        *counts.entry(l).or_default() += 1;
    }
    let (mut added, mut removed) = (0u64, 0u64);
    for n in counts.values() {
        if *n > 0 {
            added += n.unsigned_abs();
        } else {
            removed += n.unsigned_abs();
        }
    }
    (added, removed)
}

/// A protocol enum's wire word (`in_progress`, `execute`).
fn word<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}
