//! npc as an MCP client and server. [`pool`] keeps one client session per
//! upstream server of the manifest (`mcp.servers`): connected with the
//! server's `startup_timeout_ms` and bounded concurrency, `tools/list`
//! cached and refreshed on `notifications/tools/list_changed`, tools
//! filtered by `enabled_tools` / `disabled_tools`, every call bounded by
//! `tool_timeout_ms`, idle sessions closed after `idle_timeout`. A server
//! that crashes, hangs or writes garbage costs the caller one `isError`
//! result and the server a reconnect on the next call, never the pool.
//! [`call`] is the ONE path every `tools/call` takes (stages run before and
//! after the dispatch, then the call is recorded as an `mcp.tool_call`
//! event); [`gateway`] is the MCP server `npc mcp serve` speaks, listing every
//! upstream tool under its namespaced name ([`namespaced`]) after npc's own
//! [`builtin`] tools; [`session`] serves it over a byte stream, answering
//! `tools/call` itself and handing every other message to rmcp. Its mirror
//! on the client side is [`wire`]: a stdio upstream's tool calls go straight
//! onto its pipes, everything else through rmcp's client.
//!
//! Stdio upstreams are started through the supervisor (the MCP session rides
//! on the child's stdin/stdout; its stderr goes to the component's log). In
//! the daemon the pool is owned by the MCP driver (`runtime::mcp`) and
//! `npc mcp serve` is a thin front to it ([`relay`] for HTTP sessions).

pub mod builtin;
pub mod call;
pub mod catalog;
pub mod gateway;
pub mod pool;
pub mod relay;
pub mod session;
pub mod wire;

pub use call::{Before, CallPath, CallStage, Outcome, ToolCall};
pub use gateway::Gateway;
pub use pool::{Pool, PoolError, UpstreamState};

/// Between a server's name and its tool's name in a namespaced tool name:
/// `server__tool`. Claude Code, Codex, Gemini CLI and OpenCode all accept
/// tool names of ASCII letters, digits, `_` and `-` up to
/// [`MAX_TOOL_NAME_LEN`]; dots, which some of them reject, are never used.
pub const NAMESPACE_SEPARATOR: &str = "__";
/// Longest namespaced tool name exposed; longer ones are left out (logged),
/// since some agent CLIs reject them.
pub const MAX_TOOL_NAME_LEN: usize = 64;

/// The crate's poison-tolerant lock (every critical section here leaves
/// its data consistent).
pub(crate) use crate::stdx::lock;

/// `server__tool`, if that is a name every agent CLI accepts.
pub fn namespaced(server: &str, tool: &str) -> Option<String> {
    let name = format!("{server}{NAMESPACE_SEPARATOR}{tool}");
    let ok = !tool.is_empty()
        && name.len() <= MAX_TOOL_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    ok.then_some(name)
}

/// Whether `config` exposes its server's tool `tool`: listed in
/// `enabled_tools` (when present) and not in `disabled_tools`.
pub fn exposes(config: &crate::model::McpServer, tool: &str) -> bool {
    config
        .enabled_tools
        .as_ref()
        .is_none_or(|e| e.iter().any(|t| t == tool))
        && !config.disabled_tools.iter().any(|t| t == tool)
}

#[cfg(test)]
mod tests;
