//! npc as an MCP client and server, in two halves and one bridge.
//! [`client`] is npc as a client: the pool keeps one session per upstream
//! server of the manifest (`mcp.servers`), connected with the server's
//! `startup_timeout_ms` and bounded concurrency, `tools/list` cached and
//! refreshed on `notifications/tools/list_changed`, tools filtered by
//! `enabled_tools` / `disabled_tools`, every call bounded by
//! `tool_timeout_ms`, idle sessions closed after `idle_timeout`. A server
//! that crashes, hangs or writes garbage costs the caller one `isError`
//! result and the server a reconnect on the next call, never the pool.
//! [`server`] is the gateway `npc mcp serve` speaks, listing every upstream
//! tool under its gateway name ([`expose`]: [`namespaced`], or with
//! `mcp.prefix = "on_conflict"` its own name where it does not clash) after
//! npc's own [`builtin`] tools, or with `mcp.tools = "search"` only the
//! [`toolsearch`]'s two tools. Between them, [`call`] is the ONE path every
//! `tools/call` takes (stages run before and after the dispatch, then the
//! call is recorded as an `mcp.tool_call` event), and [`passthrough`] is the
//! one bridge for everything else that crosses (an upstream's requests,
//! progress, logs and resource updates, routed to the client session that
//! caused them). This file holds the naming rules both halves share: tool
//! names and gateway resource URIs.
//!
//! Architecture invariant: `client` imports neither `server` nor `call`;
//! what an upstream sends for the gateway's clients goes through
//! `passthrough`, which imports neither half. No two files of this room
//! import each other, even through a third.
//!
//! Stdio upstreams are started through the supervisor (the MCP session rides
//! on the child's stdin/stdout; its stderr goes to the component's log). In
//! the daemon the pool is owned by the MCP driver (`runtime::mcp`) and
//! `npc mcp serve` is a thin front to it (`server::relay` for HTTP sessions).

pub mod builtin;
pub mod call;
pub mod client;
pub mod passthrough;
pub mod server;
pub mod toolsearch;

pub use call::{Before, CallPath, CallStage, Outcome, ToolCall};
pub use client::pool::{Pool, PoolError, UpstreamState};
pub use server::gateway::Gateway;

/// Between a server's name and its tool's name in a namespaced tool name:
/// `server__tool`. Claude Code, Codex, Gemini CLI and OpenCode all accept
/// tool names of ASCII letters, digits, `_` and `-` up to
/// [`MAX_TOOL_NAME_LEN`]; dots, which some of them reject, are never used.
pub const NAMESPACE_SEPARATOR: &str = "__";
/// Longest namespaced tool name exposed; longer ones are left out (logged),
/// since some agent CLIs reject them.
pub const MAX_TOOL_NAME_LEN: usize = 64;

/// Longest frame (one line) either side of the gateway reads: a client's
/// message to `npc mcp serve`, an upstream's to the pool; longer ones are
/// dropped (a client's, answered with a parse error) or end the session.
pub const MAX_FRAME_BYTES: usize = 16 * 1024 * 1024;
/// Scheme and prefix of the gateway's resource URIs: `npc://SERVER/URI`.
pub const RESOURCE_URI_PREFIX: &str = "npc://";

/// `npc://SERVER/URI`: how the gateway names resource `uri` of `server`.
pub fn resource_uri(server: &str, uri: &str) -> String {
    format!("{RESOURCE_URI_PREFIX}{server}/{uri}")
}

/// The (server, upstream URI) a gateway resource URI stands for.
pub fn split_resource_uri(uri: &str) -> Option<(&str, &str)> {
    uri.strip_prefix(RESOURCE_URI_PREFIX)?
        .split_once('/')
        .filter(|(server, rest)| !server.is_empty() && !rest.is_empty())
}

/// Whether `uri` is an expansion of the RFC 6570 `template`: its literal
/// parts in order, each `{…}` expression standing for at least one character.
pub fn expands(template: &str, uri: &str) -> bool {
    let mut literals = Vec::new();
    let mut rest = template;
    while let Some((literal, after)) = rest.split_once('{') {
        literals.push(literal);
        let Some((_, after)) = after.split_once('}') else {
            return false;
        };
        rest = after;
    }
    if literals.is_empty() {
        return template == uri;
    }
    let Some(mut at) = uri.strip_prefix(literals[0]).map(|_| literals[0].len()) else {
        return false;
    };
    for literal in literals[1..].iter().filter(|l| !l.is_empty()) {
        let Some(found) = uri.get(at + 1..).and_then(|u| u.find(literal)) else {
            return false;
        };
        at += 1 + found + literal.len();
    }
    uri.ends_with(rest) && uri.len() - rest.len() > at
}

/// The crate's poison-tolerant lock (every critical section here leaves
/// its data consistent).
pub(crate) use crate::stdx::lock;

/// `server__tool`, if that is a name every agent CLI accepts.
pub fn namespaced(server: &str, tool: &str) -> Option<String> {
    if tool.is_empty() {
        return None;
    }
    let name = format!("{server}{NAMESPACE_SEPARATOR}{tool}");
    portable(&name).then_some(name)
}

/// Whether every agent CLI accepts `name` as a tool name: ASCII letters,
/// digits, `_` and `-`, at most [`MAX_TOOL_NAME_LEN`].
pub fn portable(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_TOOL_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

pub use crate::model::{Prefix, ToolListing};

/// One upstream item (tool or prompt) under the name the gateway gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exposed {
    pub server: String,
    /// The upstream's own name.
    pub own: String,
    /// The name the gateway's clients see.
    pub name: String,
}

/// The names the gateway gives `items` (server, own name; servers in name
/// order, each server's items in its order) under `prefix`: always
/// [`namespaced`], or with [`Prefix::OnConflict`] the own name unless
/// another server lists it too or `reserved` (a built-in) has it, then
/// every clashing one namespaced. Deterministic; an item whose name is not
/// [`portable`], or that collides with an earlier one, is left out (logged).
pub fn expose<'a>(
    prefix: Prefix,
    items: impl IntoIterator<Item = (&'a str, &'a str)>,
    reserved: impl Fn(&str) -> bool,
) -> Vec<Exposed> {
    let items: Vec<(&str, &str)> = items.into_iter().collect();
    let mut servers_of: std::collections::HashMap<&str, std::collections::BTreeSet<&str>> =
        Default::default();
    if prefix == Prefix::OnConflict {
        for (server, own) in &items {
            servers_of.entry(own).or_default().insert(server);
        }
    }
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(items.len());
    for (server, own) in items {
        let clash = prefix == Prefix::Always
            || servers_of.get(own).is_some_and(|s| s.len() > 1)
            || reserved(own);
        let name = if clash {
            namespaced(server, own)
        } else {
            portable(own).then(|| own.to_string())
        };
        let Some(name) = name else {
            tracing::warn!(server, name = own, "mcp: name is not portable; left out");
            continue;
        };
        if !seen.insert(name.clone()) {
            tracing::warn!(name = %name, "mcp: exposed name collides; left out");
            continue;
        }
        out.push(Exposed {
            server: server.to_string(),
            own: own.to_string(),
            name,
        });
    }
    out
}

/// What the manifest alone says of the gateway's tool names under
/// `mcp.prefix = "on_conflict"` (what `npc plan` reports): the tools of
/// servers that list their `enabled_tools` whose names clash (with each
/// other, or a `reserved` built-in's) and are therefore prefixed, and the
/// servers whose tools are known only once they connect (their clashes are
/// resolved then, the same way).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct StaticNames {
    pub prefixed: Vec<PrefixedName>,
    pub known_at_run_time: Vec<String>,
}

/// A tool listed under `SERVER__TOOL` because its name clashes.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PrefixedName {
    pub server: String,
    pub tool: String,
    pub name: String,
    /// The other servers listing the same name, and `npc` for a built-in.
    pub clashes_with: Vec<String>,
}

/// [`StaticNames`] of `manifest` (empty unless `mcp.prefix = "on_conflict"`).
pub fn static_names(
    manifest: &crate::model::Manifest,
    reserved: impl Fn(&str) -> bool,
) -> StaticNames {
    if manifest.mcp.prefix != Prefix::OnConflict {
        return StaticNames::default();
    }
    let servers: Vec<_> = manifest
        .mcp_servers
        .iter()
        .filter(|(_, s)| s.enabled)
        .collect();
    let known_at_run_time = servers
        .iter()
        .filter(|(_, s)| s.enabled_tools.is_none())
        .map(|(n, _)| n.to_string())
        .collect();
    let items: Vec<(&str, &str)> = servers
        .iter()
        .filter_map(|(name, s)| Some((name.as_str(), s, s.enabled_tools.as_ref()?)))
        .flat_map(|(name, s, tools)| {
            tools
                .iter()
                .filter(|t| exposes(s, t))
                .map(move |t| (name, t.as_str()))
        })
        .collect();
    let prefixed = expose(Prefix::OnConflict, items.iter().copied(), &reserved)
        .into_iter()
        .filter(|e| e.name != e.own)
        .map(|e| {
            let mut clashes_with: Vec<String> = items
                .iter()
                .filter(|(server, own)| *own == e.own && *server != e.server)
                .map(|(server, _)| server.to_string())
                .collect();
            clashes_with.dedup();
            if reserved(&e.own) {
                clashes_with.push(builtin::BUILTIN_SERVER.to_string());
            }
            PrefixedName {
                server: e.server,
                tool: e.own,
                name: e.name,
                clashes_with,
            }
        })
        .collect();
    StaticNames {
        prefixed,
        known_at_run_time,
    }
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
