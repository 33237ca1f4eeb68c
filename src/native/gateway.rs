//! Gateway mode (`[mcp] gateway = true`): the one MCP entry every agent
//! gets instead of one per server — `npc mcp serve`, run by the agent CLI —
//! in its agent file (`npc apply`) and in a run's own MCP configuration
//! (`npc run`), so every tool call of every agent passes npc's gateway, its
//! hooks and its event log.

use crate::model::{
    CommandSpec, DEFAULT_MCP_IDLE_TIMEOUT_S, DEFAULT_STARTUP_TIMEOUT_MS, Manifest, McpServer,
    McpTransport, ProviderKind, RestartPolicy, Text,
};
use std::collections::BTreeSet;

/// Name of the one agent-file entry gateway mode writes.
pub const GATEWAY_ENTRY: &str = "npc";
/// The manifest file name `npc mcp serve` finds without `--manifest`.
pub const DEFAULT_MANIFEST_NAME: &str = "npcagent.toml";

/// The manifest as `kind`'s agent file sees it: itself, or in gateway mode
/// one server, [`GATEWAY_ENTRY`]: `npc mcp serve` (run by the agent CLI in
/// the repository, with `--manifest` when the manifest, `manifest_name`,
/// has another name),
/// whose tool timeout is the longest of the servers it fronts and whose
/// tools are the profiles' allowed ones ([`gateway_tools`]).
pub fn exported(manifest: &Manifest, manifest_name: Option<&str>, kind: ProviderKind) -> Manifest {
    if !manifest.mcp.gateway {
        return manifest.clone();
    }
    let mut args = vec![Text::plain("mcp"), Text::plain("serve")];
    if let Some(name) = manifest_name
        && name != DEFAULT_MANIFEST_NAME
    {
        args.extend([Text::plain("--manifest"), Text::plain(name)]);
    }
    let enabled = manifest.mcp_servers.values().filter(|s| s.enabled);
    let gateway = McpServer {
        transport: McpTransport::Stdio(CommandSpec {
            command: "npc".to_string(),
            args,
            env: Default::default(),
            cwd: None,
        }),
        enabled: true,
        // The gateway connects its servers before it answers.
        startup_timeout_ms: enabled
            .clone()
            .map(|s| s.startup_timeout_ms)
            .max()
            .unwrap_or(DEFAULT_STARTUP_TIMEOUT_MS)
            .max(DEFAULT_STARTUP_TIMEOUT_MS),
        tool_timeout_ms: enabled
            .map(|s| s.tool_timeout_ms)
            .max()
            .unwrap_or(crate::model::DEFAULT_TOOL_TIMEOUT_MS),
        idle_timeout_s: DEFAULT_MCP_IDLE_TIMEOUT_S,
        enabled_tools: gateway_tools(manifest, kind),
        disabled_tools: Vec::new(),
        restart: RestartPolicy::Never,
    };
    let mut out = manifest.clone();
    out.mcp_servers = [(GATEWAY_ENTRY.to_string(), gateway)].into();
    out
}

/// Prefix of an MCP tool in a profile's `allowed_tools` (`mcp__SERVER__TOOL`).
const MCP_TOOL_PREFIX: &str = "mcp__";

/// The gateway tools (`SERVER__TOOL`) `kind`'s profiles allow, when that
/// can be said exactly: every profile of a provider of `kind` allows MCP
/// tools only by exact name (`mcp__SERVER__TOOL`, no `*`). Otherwise (no
/// such profile, a wildcard, or a profile that allows no MCP tool by
/// name) `None`: the entry lists every tool and the gateway's own filters
/// apply. Targets without a tool filter note that they cannot express it.
pub fn gateway_tools(manifest: &Manifest, kind: ProviderKind) -> Option<Vec<String>> {
    // Names are known only at run time with `on_conflict`, and in search
    // mode the agent sees only `search_tools` and `call_tool`; the gateway
    // applies the profiles' tools itself.
    if manifest.mcp.prefix != crate::model::Prefix::Always
        || manifest.mcp.tools != crate::model::ToolListing::All
    {
        return None;
    }
    let profiles: Vec<_> = manifest
        .profiles
        .values()
        .filter(|p| manifest.providers.get(&p.provider).map(|v| v.kind) == Some(kind))
        .collect();
    if profiles.is_empty() {
        return None;
    }
    let mut tools = BTreeSet::new();
    for profile in profiles {
        let named: Vec<&str> = profile
            .allowed_tools
            .iter()
            .filter_map(|t| t.strip_prefix(MCP_TOOL_PREFIX))
            .collect();
        if named.is_empty() || named.iter().any(|t| t.contains('*')) {
            return None;
        }
        tools.extend(named.into_iter().map(str::to_string));
    }
    Some(tools.into_iter().collect())
}
