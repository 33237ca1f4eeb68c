//! Gateway mode (`[mcp] gateway = true`): the one MCP entry every agent
//! gets instead of one per server — `npc mcp serve`, run by the agent CLI —
//! in its agent file (`npc apply`) and in a run's own MCP configuration
//! (`npc run`), so every tool call of every agent passes npc's gateway, its
//! hooks and its event log.
//!
//! The repository's entry carries no profile's tools (every tool; the
//! gateway applies the profile of the agent that started it), so one
//! profile never changes another's files. A run's own entry
//! ([`for_run`]) carries the run's profile's exact MCP tools and, in its
//! `env`, the run, the profile and the repository (`NPC_RUN_ID`,
//! `NPC_PROFILE`, `NPC_REPO_ROOT`): Codex starts an MCP server with only
//! its own allow-list of variables, so the entry's `env` is the one way
//! they reach `npc mcp serve` there, and it is written for every CLI alike.

use crate::model::{
    CommandSpec, DEFAULT_MCP_IDLE_TIMEOUT_S, DEFAULT_STARTUP_TIMEOUT_MS, Manifest, McpServer,
    McpTransport, Profile, RestartPolicy, Text,
};
use std::collections::{BTreeMap, BTreeSet};

/// Name of the one agent-file entry gateway mode writes.
pub const GATEWAY_ENTRY: &str = "npc";
/// The manifest file name `npc mcp serve` finds without `--manifest`.
pub const DEFAULT_MANIFEST_NAME: &str = "npcagent.toml";

/// The manifest as an agent file sees it: itself, or in gateway mode one
/// server, [`GATEWAY_ENTRY`]: `npc mcp serve` (run by the agent CLI in the
/// repository, with `--manifest` when the manifest, `manifest_name`, has
/// another name), whose tool timeout is the longest of the servers it
/// fronts, with every tool (no profile's: see the module's doc).
pub fn exported(manifest: &Manifest, manifest_name: Option<&str>) -> Manifest {
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
        enabled_tools: None,
        disabled_tools: Vec::new(),
        restart: RestartPolicy::Never,
    };
    let mut out = manifest.clone();
    out.mcp_servers = [(GATEWAY_ENTRY.to_string(), gateway)].into();
    out
}

/// Prefix of an MCP tool in a profile's `allowed_tools` (`mcp__SERVER__TOOL`).
const MCP_TOOL_PREFIX: &str = "mcp__";

/// The manifest as one run's MCP configuration sees it: [`exported`], and
/// in gateway mode the entry's tools are `profile`'s ([`gateway_tools`])
/// and its `env` is `env` (the run's variables, see the module's doc).
pub fn for_run(manifest: &Manifest, profile: &Profile, env: &BTreeMap<String, String>) -> Manifest {
    let mut out = exported(manifest, None);
    if let Some(entry) = out.mcp_servers.get_mut(GATEWAY_ENTRY)
        && manifest.mcp.gateway
    {
        entry.enabled_tools = gateway_tools(manifest, profile);
        if let McpTransport::Stdio(command) = &mut entry.transport {
            command.env = env
                .iter()
                .map(|(k, v)| (k.clone(), Text::plain(v)))
                .collect();
        }
    }
    out
}

/// The gateway tools (`SERVER__TOOL`) `profile` allows, when that can be
/// said exactly: it allows MCP tools only by exact name
/// (`mcp__SERVER__TOOL`, no `*`). Otherwise (a wildcard, or no MCP tool by
/// name) `None`: the entry lists every tool and the gateway's own filters
/// apply. Targets without a tool filter note that they cannot express it.
pub fn gateway_tools(manifest: &Manifest, profile: &Profile) -> Option<Vec<String>> {
    // Names are known only at run time with `on_conflict`, and in search
    // mode the agent sees only `search_tools` and `call_tool`; the gateway
    // applies the profiles' tools itself.
    if manifest.mcp.prefix != crate::model::Prefix::Always
        || manifest.mcp.tools != crate::model::ToolListing::All
    {
        return None;
    }
    let named: Vec<&str> = profile
        .allowed_tools
        .iter()
        .filter_map(|t| t.strip_prefix(MCP_TOOL_PREFIX))
        .collect();
    if named.is_empty() || named.iter().any(|t| t.contains('*')) {
        return None;
    }
    let tools: BTreeSet<String> = named.into_iter().map(str::to_string).collect();
    Some(tools.into_iter().collect())
}
