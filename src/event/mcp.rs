//! The MCP gateway's and pool's events (`mcp.*`) and hooks' (`hook.call`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One `tools/call` the gateway served.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct McpToolCall {
    /// The namespaced name the client called.
    pub name: String,
    /// `None` when the name resolved to no tool.
    pub server: Option<String>,
    pub tool: Option<String>,
    /// `ok`, `tool_error`, `protocol_error`, `unavailable`, `timeout`,
    /// `lost`, `denied`, `unknown_tool`, `cancelled`, …
    pub outcome: String,
    pub duration_ms: f64,
    pub error: Option<String>,
    /// The JSON-RPC error code the server answered with (`protocol_error`:
    /// passed to the client as that error, e.g. `-32042` for a URL
    /// elicitation the user must complete first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<i32>,
    /// A built-in tool of npc's own.
    pub builtin: bool,
    /// The call's arguments as the agent sent them (open), sensitive ones
    /// redacted, a large whole replaced by its size.
    pub arguments: serde_json::Value,
    /// The run whose agent made the call, when one is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
}

/// A client finished its handshake with the gateway (as it names itself).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct McpClientConnected {
    pub client: String,
    pub version: String,
}

/// One `resources/read` the gateway served.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct McpResourceRead {
    pub uri: String,
    /// `ok` or `error`.
    pub outcome: String,
    pub error: Option<String>,
    pub duration_ms: f64,
}

/// One `prompts/get` the gateway served.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct McpPromptGet {
    pub name: String,
    /// `ok` or `error`.
    pub outcome: String,
    pub error: Option<String>,
    pub duration_ms: f64,
}

/// A request an upstream server sent the client through the gateway
/// (sampling, elicitation).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct McpRequest {
    pub server: String,
    pub method: String,
    /// What it asked, in brief (message counts, an elicitation's mode,
    /// message and field names): the upstream's own words, open.
    pub request: serde_json::Value,
    /// `ok` or `error`.
    pub outcome: String,
    pub error: Option<String>,
    pub duration_ms: f64,
}

/// Messages the gateway dropped: notifications a slow client did not read,
/// an oversized upstream request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct McpDropped {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    /// `notifications`, `elicitation_schema`.
    pub what: String,
    pub count: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<usize>,
    pub reason: String,
}

/// An MCP server could not be reached.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct McpServerFailed {
    pub server: String,
    pub reason: String,
}

/// The decision of one hook call, as recorded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum HookDecision {
    #[default]
    Continue,
    Deny,
    Rewrite,
    Ask,
    Replace,
    Observe,
    Failed,
}

/// One hook call (a hook of the manifest or a plugin, or a profile's
/// `denied_tools`/`allowed_tools`/`ask_tools`): its decision and duration.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct HookCall {
    /// The lifecycle event (`before_tool`, …).
    pub event: String,
    pub hook: String,
    /// The hook's place among its event's hooks (`null` for a profile's rule).
    pub index: Option<usize>,
    /// The plugin the hook came from.
    pub plugin: Option<String>,
    /// The profile whose tool rules decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// The `ask_tools` pattern that asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    pub tool: Option<String>,
    pub decision: HookDecision,
    pub detail: Option<String>,
    pub duration_ms: f64,
}

/// Who denied a tool call ([`ToolDenied::by`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DeniedBy {
    /// The agent CLI's own permission rules (from the profile's per-run policy).
    Cli,
    /// A `before_tool` hook or a profile's tool rules in `npc hook run`.
    #[default]
    Hook,
    /// The MCP gateway (`npc mcp serve`).
    Gateway,
    /// A person (or the approval timeout) answered an `ask`.
    Approval,
    /// The run's sandbox.
    Sandbox,
}

/// A tool call of a run that was denied: the run, the tool, the rule that
/// denied it and who applied the rule. A run with one of these ends
/// `blocked` unless it also succeeded at what it tried otherwise.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ToolDenied {
    /// The run (`null` for a call outside any run).
    pub run_id: Option<String>,
    /// The profile the run uses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// The tool as the agent named it.
    pub tool: String,
    /// The rule: a `denied_tools` / `ask_tools` pattern, a hook's name, a
    /// sandbox rule.
    pub rule: String,
    pub by: DeniedBy,
    /// Why, in words (a hook's reason, an approver's reason).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}
