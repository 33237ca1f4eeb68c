//! The raw manifest: serde structs that mirror `npcagent.toml` field for
//! field. They keep spans, reject unknown fields, and are the source of the
//! JSON Schema (`npc schema`); their doc comments become its descriptions.
//! Nothing here is checked beyond shape: [`super::lower`] turns a
//! [`RawManifest`] into the validated [`super::Manifest`].

use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::Deserialize;

use super::de::{Entry, Spanned};
use super::text::Text;

/// A name of a manifest entry (`[a-z0-9][a-z0-9_-]*`), with its span.
pub type Name = Spanned<String>;
/// A string-to-text map (environment variables, HTTP headers).
pub type TextMap = IndexMap<Spanned<String>, Spanned<Text>>;

/// `npcagent.toml`: one repository's MCP servers, agent providers, profiles,
/// prompts, hooks, plugins, triggers and pane plugins.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "npcagent manifest")]
pub struct RawManifest {
    /// JSON Schema reference for editors; ignored by npc.
    #[serde(rename = "$schema")]
    pub schema: Option<String>,
    /// Manifest format version. Must be `1`.
    #[schemars(extend("const" = 1))]
    pub version: Spanned<i64>,
    /// The project this manifest belongs to.
    pub project: Option<Entry<Spanned<RawProject>>>,
    /// Settings of the long-running reconciler (`npc daemon`).
    pub daemon: Option<Entry<Spanned<RawDaemon>>>,
    /// How runs are carried out: their workspace, concurrency, worktrees.
    pub runs: Option<Entry<Spanned<RawRuns>>>,
    /// Where the run queue and the event log live when a fleet of machines
    /// shares them (`npc worker`). Without it, the embedded SQLite store.
    pub store: Option<Entry<Spanned<RawStore>>>,
    /// Model Context Protocol servers the agents may use.
    pub mcp: Option<Entry<RawMcp>>,
    /// Agent CLIs npc can launch, keyed by provider name.
    #[serde(default)]
    #[schemars(extend("propertyNames" = { "pattern": "^[a-z0-9][a-z0-9_-]*$" }))]
    pub providers: IndexMap<Name, Entry<Spanned<RawProvider>>>,
    /// Agent profiles, keyed by profile name.
    #[serde(default)]
    #[schemars(extend("propertyNames" = { "pattern": "^[a-z0-9][a-z0-9_-]*$" }))]
    pub profiles: IndexMap<Name, Entry<Spanned<RawProfile>>>,
    /// The repository's agent instructions (a template, rendered like a
    /// prompt), kept as npc's block in `AGENTS.md`, `CLAUDE.md` and
    /// `GEMINI.md` for the declared agent CLIs.
    pub instructions: Option<Entry<Spanned<RawInstructions>>>,
    /// Prompt templates (minijinja), keyed by prompt name.
    #[serde(default)]
    #[schemars(extend("propertyNames" = { "pattern": "^[a-z0-9][a-z0-9_-]*$" }))]
    pub prompts: IndexMap<Name, Entry<Spanned<RawPrompt>>>,
    /// Lifecycle hooks, keyed by event: `on_agent_start`, `before_model`,
    /// `after_model`, `before_tool`, `after_tool`, `on_error`, `on_agent_end`.
    #[serde(default)]
    #[schemars(extend("propertyNames" = { "enum": ["on_agent_start", "before_model", "after_model", "before_tool", "after_tool", "on_error", "on_agent_end"] }))]
    pub hooks: IndexMap<Name, Entry<Vec<Entry<Spanned<RawHook>>>>>,
    /// Local Agent Plugins 1.0 packages, keyed by name.
    #[serde(default)]
    #[schemars(extend("propertyNames" = { "pattern": "^[a-z0-9][a-z0-9_-]*$" }))]
    pub plugins: IndexMap<Name, Entry<Spanned<RawPlugin>>>,
    /// Cron, webhook and file-watch triggers, keyed by name.
    #[serde(default)]
    #[schemars(extend("propertyNames" = { "pattern": "^[a-z0-9][a-z0-9_-]*$" }))]
    pub triggers: IndexMap<Name, Entry<Spanned<RawTrigger>>>,
    /// Supervised pane-plugin children speaking the NDJSON pane protocol.
    #[serde(default)]
    #[schemars(extend("propertyNames" = { "pattern": "^[a-z0-9][a-z0-9_-]*$" }))]
    pub pane_plugins: IndexMap<Name, Entry<Spanned<RawPanePlugin>>>,
    /// Agent panes (PTYs) npc starts, keyed by name.
    #[serde(default)]
    #[schemars(extend("propertyNames" = { "pattern": "^[a-z0-9][a-z0-9_-]*$" }))]
    pub panes: IndexMap<Name, Entry<Spanned<RawPane>>>,
    /// Notification sinks: where the daemon tells a person that a run
    /// waits for an answer, was blocked, failed or finished, or that a
    /// pane needs attention. Keyed by sink name.
    #[serde(default)]
    #[schemars(extend("propertyNames" = { "pattern": "^[a-z0-9][a-z0-9_-]*$" }))]
    pub notify: IndexMap<Name, Entry<Spanned<RawNotify>>>,
    /// Workflows: several steps (agents or commands) toward one goal, each
    /// step a run, in the order their `needs` give. Keyed by name.
    #[serde(default)]
    #[schemars(extend("propertyNames" = { "pattern": "^[a-z0-9][a-z0-9_-]*$" }))]
    pub workflows: IndexMap<Name, Entry<Spanned<RawWorkflow>>>,
}

/// `[project]`
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Project")]
pub struct RawProject {
    /// Human-readable project name.
    pub name: Option<Spanned<String>>,
    /// Where npc keeps its state (database, rendered files), relative to the
    /// manifest's directory. Default `.npc`. Cannot change while a daemon runs.
    pub state_dir: Option<Spanned<String>>,
}

/// `[daemon]`
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Daemon")]
pub struct RawDaemon {
    /// Address of the REST API and webhook listener. Default `127.0.0.1:8766`.
    /// Non-loopback addresses need `allow_remote = true` and `token_env`.
    pub listen: Option<Spanned<Text>>,
    /// Name of the environment variable that holds the API bearer token
    /// (instead of the repository's own, `STATE_DIR/api.token`).
    pub token_env: Option<Spanned<String>>,
    /// Who may use the REST API, the dashboard and `npc mcp serve --http`:
    /// `token` (default: a bearer token, or the dashboard's session cookie)
    /// or `none` (any local account and any web page: loopback only).
    #[schemars(extend("enum" = ["token", "none"]))]
    pub auth: Option<Spanned<String>>,
    /// Allow binding a non-loopback address. Default `false`.
    pub allow_remote: Option<bool>,
    /// Log level: `error`, `warn`, `info`, `debug` or `trace`. Default `info`.
    #[schemars(extend("enum" = ["error", "warn", "info", "debug", "trace"]))]
    pub log_level: Option<Spanned<String>>,
    /// Address of the webhook listener (`POST /webhooks/ROUTE`). Default
    /// `127.0.0.1:8765`. Non-loopback addresses need `allow_remote = true`
    /// and `token_env`.
    pub webhook_listen: Option<Spanned<Text>>,
}

/// `[store]`
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Store")]
pub struct RawStore {
    /// The PostgreSQL store a fleet shares, `postgres://USER:PASSWORD@HOST:PORT/DATABASE`.
    /// It holds a password: write an environment reference such as
    /// `"${NPC_STORE_URL}"`. It is redacted wherever npc shows it.
    pub url: Option<Spanned<Text>>,
    /// How long a fleet's lease holds without renewal, such as `30s`: a
    /// worker's claim on a run (unless `npc worker --lease-secs` says
    /// otherwise) and the scheduler's leadership. A machine that stops
    /// renewing loses them after it.
    pub lease_timeout: Option<Spanned<String>>,
    /// What a daemon of this manifest does for the fleet: `all` (default)
    /// takes webhooks and stands for the cron scheduling, `ingress` only
    /// takes webhooks (it never schedules cron), `scheduler` only stands
    /// for the cron scheduling (it serves no webhooks). The machines of a
    /// fleet share one manifest, so set it per machine with an environment
    /// reference such as `"${NPC_ROLE:-all}"`. A new role takes a restart.
    pub role: Option<Spanned<Text>>,
}

/// `[runs]`
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Runs")]
pub struct RawRuns {
    /// The project's default workspace for profile runs the daemon starts
    /// unattended: `worktree` or `in_place`.
    #[schemars(extend("enum" = ["worktree", "in_place"]))]
    pub workspace: Option<Spanned<String>>,
    /// Where worktrees of runs are made, relative to the manifest's
    /// directory and inside it. Default `STATE_DIR/worktrees`.
    pub worktrees_dir: Option<Spanned<String>>,
    /// Runs carried out at once. Default 4.
    #[schemars(range(min = 1, max = 64))]
    pub max_concurrent: Option<Spanned<i64>>,
    /// How long the worktree of a run that did not succeed is kept (`24h`).
    pub keep_failed: Option<Spanned<String>>,
    /// Most worktrees kept at once; the oldest are removed first. Default 20.
    #[schemars(range(min = 0, max = 1000))]
    pub max_kept_worktrees: Option<Spanned<i64>>,
    /// Ports handed to runs as `NPC_PORT`, one per running run (`"41000-41099"`).
    pub ports: Option<Spanned<String>>,
    /// Who commits a worktree run's changes (`Name <email>`). Default `npc <npc@localhost>`.
    pub author: Option<Spanned<String>>,
    /// How long a run parked on an `ask` waits for a person's answer
    /// (`npc runs approve` / `deny`) before the call is denied (`30m`, `2h`).
    /// Default `30m`; a profile's or trigger's own comes first.
    pub approval_timeout: Option<Spanned<String>>,
    /// The sandbox of runs: a mode (`sandbox = "strict"`) or the table
    /// `[runs.sandbox]` (`mode`, `writable`, `readable`, `allow_hosts`, …).
    pub sandbox: Option<Spanned<RawRunsSandbox>>,
}

/// `[runs] sandbox`: a mode alone, or the table `[runs.sandbox]`.
#[derive(Debug, JsonSchema)]
#[schemars(untagged, rename = "RunsSandbox")]
pub enum RawRunsSandbox {
    /// `off`, `workspace` or `strict`.
    Mode(#[schemars(extend("enum" = ["off", "workspace", "strict"]))] String),
    /// `[runs.sandbox]`.
    Table(RawSandboxTable),
}

impl<'de> Deserialize<'de> for RawRunsSandbox {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = RawRunsSandbox;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(
                    "a sandbox mode (`off`, `workspace`, `strict`) or a `[runs.sandbox]` table",
                )
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(RawRunsSandbox::Mode(v.to_string()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<Self::Value, A::Error> {
                RawSandboxTable::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(RawRunsSandbox::Table)
            }
        }
        d.deserialize_any(V)
    }
}

/// `[runs.sandbox]`: what sandboxed runs may do beyond the defaults.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "RunsSandboxTable")]
pub struct RawSandboxTable {
    /// The project's default sandbox: `off`, `workspace` (files and
    /// processes) or `strict` (also the network, through npc's proxy).
    /// Default: `workspace` for runs the daemon starts unattended where the
    /// kernel can, `off` for runs started by hand.
    #[schemars(extend("enum" = ["off", "workspace", "strict"]))]
    pub mode: Option<Spanned<String>>,
    /// Paths a sandboxed run may also write (and read): `~/…` in the home
    /// directory or relative to the manifest's directory (`~/.cache/npm`).
    #[serde(default)]
    pub writable: Vec<Spanned<String>>,
    /// Absolute paths outside the home directory and the repository a
    /// sandboxed run may write: said apart from `writable` on purpose.
    #[serde(default)]
    pub writable_outside: Vec<Spanned<String>>,
    /// Paths in the home directory (`~/…`), the repository or elsewhere a
    /// sandboxed run may also read.
    #[serde(default)]
    pub readable: Vec<Spanned<String>>,
    /// Hosts a `strict` run may reach through npc's proxy besides its
    /// model endpoint and npc's gateway: `host`, `host:port`, or
    /// `*.example.com` for its subdomains.
    #[serde(default)]
    pub allow_hosts: Vec<Spanned<String>>,
}

/// `[mcp]`
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Mcp")]
pub struct RawMcp {
    /// Gateway mode: `npc apply` writes ONE server entry (`npc mcp serve`
    /// for this repository) into each agent CLI's config instead of one
    /// entry per server, so every tool call passes npc's gateway. Default `false`.
    pub gateway: Option<bool>,
    /// How the gateway names upstream tools, prompts and resource templates:
    /// `always` (default: `SERVER__NAME`) or `on_conflict` (an upstream's own
    /// name, unless two servers or a built-in tool share it; then every
    /// clashing one is `SERVER__NAME`).
    #[schemars(extend("enum" = ["always", "on_conflict"]))]
    pub prefix: Option<Spanned<String>>,
    /// What the gateway's `tools/list` offers: `all` (default: every tool)
    /// or `search` (only `search_tools` and `call_tool`, which find and call
    /// the others, so an agent with hundreds of tools keeps its context small).
    #[schemars(extend("enum" = ["all", "search"]))]
    pub tools: Option<Spanned<String>>,
    /// MCP servers, keyed by name.
    #[serde(default)]
    #[schemars(extend("propertyNames" = { "pattern": "^[a-z0-9][a-z0-9_-]*$" }))]
    pub servers: IndexMap<Name, Entry<Spanned<RawMcpServer>>>,
    /// Settings of npc's built-in MCP tools (served by `npc mcp serve`).
    pub builtins: Option<Entry<Spanned<RawMcpBuiltins>>>,
}

/// `[mcp.builtins]`: settings of npc's built-in MCP tools.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "McpBuiltins")]
pub struct RawMcpBuiltins {
    /// Let `fetch_url` reach every non-global unicast address: private
    /// (`10/8`, `172.16/12`, `192.168/16`, `fc00::/7`), loopback, link-local
    /// and shared (`100.64/10`) ones. Default `false`: only global addresses.
    pub fetch_allow_private: Option<bool>,
    /// Networks `fetch_url` may reach although they are not global, in CIDR
    /// notation (such as `10.1.2.0/24` or `127.0.0.1/32`); a narrower opt-in
    /// than `fetch_allow_private`.
    #[serde(default)]
    pub fetch_allow_networks: Vec<Spanned<String>>,
    /// How long one `fetch_url` call may take in all (name resolution,
    /// redirects, the whole body), in milliseconds. Default 20000.
    #[schemars(range(min = 1, max = 120000))]
    pub fetch_timeout_ms: Option<Spanned<i64>>,
}

/// `[mcp.servers.NAME]`: a stdio server (`command`) or a streamable HTTP
/// server (`url`).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "McpServer")]
pub struct RawMcpServer {
    /// Executable of a stdio server: a bare program name or path, no placeholders.
    pub command: Option<Spanned<String>>,
    /// Arguments of a stdio server.
    #[serde(default)]
    pub args: Vec<Spanned<Text>>,
    /// Environment of a stdio server (added to a cleared environment).
    #[serde(default)]
    pub env: TextMap,
    /// Working directory of a stdio server, relative to the manifest's directory.
    pub cwd: Option<Spanned<Text>>,
    /// Endpoint of a streamable HTTP server (`https://`, or `http://` on loopback).
    pub url: Option<Spanned<Text>>,
    /// HTTP headers sent to an HTTP server.
    #[serde(default)]
    pub headers: TextMap,
    /// Name of the environment variable holding a bearer token for an HTTP server.
    pub bearer_token_env: Option<Spanned<String>>,
    /// Whether agents get this server. Default `true`.
    pub enabled: Option<bool>,
    /// How long the server may take to start, in milliseconds. Default 10000.
    #[schemars(range(min = 1, max = 3600000))]
    pub startup_timeout_ms: Option<Spanned<i64>>,
    /// How long one tool call may take, in milliseconds. Default 60000.
    #[schemars(range(min = 1, max = 3600000))]
    pub tool_timeout_ms: Option<Spanned<i64>>,
    /// Seconds an unused session stays open before npc closes it (it is
    /// reconnected on the next call). Default 300; `0` never closes it.
    #[schemars(range(min = 0, max = 86400))]
    pub idle_timeout: Option<Spanned<i64>>,
    /// Only these tools are exposed (all when absent).
    pub enabled_tools: Option<Vec<Spanned<String>>>,
    /// These tools are never exposed.
    #[serde(default)]
    pub disabled_tools: Vec<Spanned<String>>,
    /// Restart policy when the daemon supervises a stdio server:
    /// `never`, `on-failure` (default) or `always`.
    #[schemars(extend("enum" = ["never", "on-failure", "always"]))]
    pub restart: Option<Spanned<String>>,
}

/// `[providers.NAME]`: an agent CLI.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Provider")]
pub struct RawProvider {
    /// Which CLI this is: `claude_code`, `codex`, `gemini_cli` or `opencode`.
    #[schemars(extend("enum" = ["claude_code", "codex", "gemini_cli", "opencode"]))]
    pub kind: Spanned<String>,
    /// How npc drives the CLI: `headless` (its non-interactive mode, the
    /// output parsed; the default) or `acp` (npc speaks the Agent Client
    /// Protocol to the CLI's ACP program).
    #[schemars(extend("enum" = ["headless", "acp"]))]
    pub driver: Option<Spanned<String>>,
    /// Executable to launch. Default: the CLI's usual name (`claude`,
    /// `codex`, `gemini`, `opencode`); with `driver = "acp"`, its ACP
    /// program (`claude-agent-acp`, `codex-acp`, `gemini --acp`,
    /// `opencode acp`).
    pub command: Option<Spanned<String>>,
    /// Extra arguments, placed before the ones npc adds.
    #[serde(default)]
    pub args: Vec<Spanned<Text>>,
    /// Extra environment for the CLI.
    #[serde(default)]
    pub env: TextMap,
    /// Required CLI version, a semver requirement such as `>=2.0, <3`.
    pub version: Option<Spanned<String>>,
}

/// `[profiles.NAME]`: an agent profile (Markdown with YAML frontmatter).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Profile")]
pub struct RawProfile {
    /// The provider (a `providers` entry) that runs this profile.
    pub provider: Spanned<String>,
    /// What the agent is for; required by the profile format.
    pub description: Spanned<String>,
    /// The prompt (a `prompts` entry) rendered as the profile's body.
    pub prompt: Option<Spanned<String>>,
    /// MCP servers (entries of `mcp.servers`) this profile may use.
    #[serde(default)]
    pub mcp_servers: Vec<Spanned<String>>,
    /// Tool patterns the agent may use, such as `mcp__fs__*` or `Bash(git diff:*)`.
    #[serde(default)]
    pub allowed_tools: Vec<Spanned<String>>,
    /// Tool patterns the agent may not use.
    #[serde(default)]
    pub denied_tools: Vec<Spanned<String>>,
    /// Tool patterns whose calls need the user's approval, such as `Bash` or
    /// `Bash(git push:*)`: npc's `before_tool` asks (the editor under `npc
    /// acp`; with nobody to ask, the call is denied).
    #[serde(default)]
    pub ask_tools: Vec<Spanned<String>>,
    /// How long a run of this profile parked on an `ask` waits for an
    /// answer before the call is denied (`30m`). Default: `[runs]
    /// approval_timeout`; a trigger's own comes first.
    pub approval_timeout: Option<Spanned<String>>,
    /// The sandbox of this profile's runs: `off`, `workspace` or `strict`
    /// (a trigger's own comes first; default `[runs] sandbox`).
    #[schemars(extend("enum" = ["off", "workspace", "strict"]))]
    pub sandbox: Option<Spanned<String>>,
    /// Model name passed to the provider.
    pub model: Option<Spanned<Text>>,
    /// Agent Skills the profile loads.
    #[serde(default)]
    pub skills: Vec<Spanned<String>>,
    /// Extra YAML frontmatter fields (`role`, `tags`, `permissionMode`, …).
    #[serde(default)]
    pub frontmatter: IndexMap<Spanned<String>, serde_json::Value>,
    /// Where a run works: `worktree` (a git worktree of its own, its result
    /// a branch) or `in_place` (the repository's checkout). Default: `[runs]
    /// workspace`, else `worktree` for profile runs the daemon starts
    /// unattended in a git repository and `in_place` for everything else.
    #[schemars(extend("enum" = ["worktree", "in_place"]))]
    pub workspace: Option<Spanned<String>>,
    /// worktree: the commit to start from, a template (such as
    /// `{{ payload.pull_request.head.sha }}`). Default `HEAD`.
    #[serde(rename = "ref")]
    pub base_ref: Option<Spanned<String>>,
    /// worktree: the run's new branch, a template. Default `npc/{{ run.id }}`.
    pub branch: Option<Spanned<String>>,
    /// worktree: commands (`sh -c`) run in the worktree before the action;
    /// one failing fails the run with its output.
    #[serde(default)]
    pub setup: Vec<Spanned<String>>,
    /// worktree: files copied from the main checkout into the worktree
    /// (regular files inside the repository, such as `.env`).
    #[serde(default)]
    pub copy: Vec<Spanned<String>>,
    /// worktree: commands (`sh -c`) run in the worktree once the result is
    /// committed, with `NPC_RUN_BRANCH`, `NPC_RUN_STATUS` and `NPC_RUN_HEAD`.
    #[serde(default)]
    pub after: Vec<Spanned<String>>,
    /// worktree: push the run's branch to the repository's `origin` once
    /// the run succeeded with changes (before `after`); a failed push is
    /// recorded (`run.push_failed`, the result's `push`), the run's outcome
    /// kept. Default `false`.
    pub push: Option<bool>,
    /// worktree: a run that changed no file fails (reason `no_changes`)
    /// instead of succeeding with an empty result. Default `false`.
    pub expect_changes: Option<bool>,
}

/// `[prompts.NAME]`: a minijinja template, inline or from a file.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Prompt")]
pub struct RawPrompt {
    /// The template text.
    pub template: Option<Spanned<String>>,
    /// A file holding the template, relative to the manifest's directory.
    pub file: Option<Spanned<String>>,
    /// Variables the template reads as `vars.NAME`.
    #[serde(default)]
    pub variables: IndexMap<Spanned<String>, Entry<Spanned<RawVariable>>>,
    /// Also a slash command (`/NAME`) of every declared agent CLI, its
    /// variables the command's arguments. Default `false`.
    pub command: Option<bool>,
    /// What the prompt does: the command's description.
    pub description: Option<Spanned<String>>,
}

/// `[instructions]`: the repository's agent instructions.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Instructions")]
pub struct RawInstructions {
    /// The template text (minijinja, rendered like a prompt without variables).
    pub template: Option<Spanned<String>>,
    /// A file holding the template, relative to the manifest's directory.
    pub file: Option<Spanned<String>>,
}

/// A declared template variable.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Variable")]
pub struct RawVariable {
    /// What the variable means.
    pub description: Option<String>,
    /// Value used when none is given; without one the variable is required.
    pub default: Option<Spanned<Text>>,
}

/// One hook command.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Hook")]
pub struct RawHook {
    /// Executable to run, one process per call; a bare program, no placeholders.
    pub command: Spanned<String>,
    /// Arguments.
    #[serde(default)]
    pub args: Vec<Spanned<Text>>,
    /// Environment (added to a cleared environment).
    #[serde(default)]
    pub env: TextMap,
    /// Working directory, relative to the manifest's directory.
    pub cwd: Option<Spanned<Text>>,
    /// Time limit in milliseconds, 1..=30000. Default 5000.
    #[schemars(range(min = 1, max = 30000))]
    pub timeout_ms: Option<Spanned<i64>>,
    /// Regular expression on the tool name; the hook runs only for matching
    /// tools (`before_tool`, `after_tool`).
    pub matcher: Option<Spanned<String>>,
}

/// `[plugins.NAME]`: a local Agent Plugins 1.0 package.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Plugin")]
pub struct RawPlugin {
    /// Package directory (holding `plugin.json`), relative to the manifest's directory.
    pub path: Spanned<String>,
    /// Whether the plugin is active. Default `true`.
    pub enabled: Option<bool>,
}

/// `[triggers.NAME]`
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Trigger")]
pub struct RawTrigger {
    /// `cron`, `webhook` or `file_watch`.
    #[schemars(extend("enum" = ["cron", "webhook", "file_watch"]))]
    pub kind: Spanned<String>,
    /// cron: a 5-field crontab expression (`0 3 * * 1-5`), a macro
    /// (`@daily`), or a duration (`15m`, `1h30m`).
    pub schedule: Option<Spanned<String>>,
    /// cron: IANA time zone of the schedule. Default `UTC`.
    pub timezone: Option<Spanned<String>>,
    /// webhook: the route; requests arrive at `POST /webhooks/ROUTE`.
    pub route: Option<Spanned<String>>,
    /// webhook: environment variable holding the HMAC secret for signatures.
    pub secret_env: Option<Spanned<String>>,
    /// webhook: events accepted (such as GitHub's `push`); all when empty.
    /// file_watch: `created`, `modified` and/or `deleted` (default all three).
    #[serde(default)]
    pub events: Vec<Spanned<String>>,
    /// file_watch: paths or globs, relative to the manifest's directory.
    #[serde(default)]
    pub paths: Vec<Spanned<String>>,
    /// file_watch: globs of paths never to fire for, relative to the
    /// manifest's directory (`.git/`, the state directory and editor temp
    /// files are always ignored).
    #[serde(default)]
    pub ignore: Vec<Spanned<String>>,
    /// file_watch: quiet time before firing, in milliseconds. Default 500.
    #[schemars(range(min = 0, max = 60000))]
    pub debounce_ms: Option<Spanned<i64>>,
    /// webhook: largest request body accepted, in bytes. Default 1 MiB.
    #[schemars(range(min = 1, max = 16777216))]
    pub max_body_bytes: Option<Spanned<i64>>,
    /// webhook: requests accepted per minute on this route (a token bucket
    /// holding a minute's worth). Default 600.
    #[schemars(range(min = 1, max = 100000000))]
    pub rate_limit_per_minute: Option<Spanned<i64>>,
    /// What a firing does while a run of this trigger is still going:
    /// `skip` it (recorded as skipped), `queue` it (default; runs after the
    /// current one), or `replace` the current run (cancelled).
    #[schemars(extend("enum" = ["skip", "queue", "replace"]))]
    pub overlap: Option<Spanned<String>>,
    /// cron: fires missed while the daemon was down: `skip` them (default)
    /// or `run_once` on start.
    #[schemars(extend("enum" = ["skip", "run_once"]))]
    pub missed: Option<Spanned<String>>,
    /// Whether the trigger is active. Default `true`.
    pub enabled: Option<bool>,
    /// Where a run works: `worktree` (a git worktree of its own, its result
    /// a branch) or `in_place` (the repository's checkout). Default: `[runs]
    /// workspace`, else `worktree` for profile runs the daemon starts
    /// unattended in a git repository and `in_place` for everything else.
    #[schemars(extend("enum" = ["worktree", "in_place"]))]
    pub workspace: Option<Spanned<String>>,
    /// worktree: the commit to start from, a template (such as
    /// `{{ payload.pull_request.head.sha }}`). Default `HEAD`.
    #[serde(rename = "ref")]
    pub base_ref: Option<Spanned<String>>,
    /// worktree: the run's new branch, a template. Default `npc/{{ run.id }}`.
    pub branch: Option<Spanned<String>>,
    /// worktree: commands (`sh -c`) run in the worktree before the action;
    /// one failing fails the run with its output.
    #[serde(default)]
    pub setup: Vec<Spanned<String>>,
    /// worktree: files copied from the main checkout into the worktree
    /// (regular files inside the repository, such as `.env`).
    #[serde(default)]
    pub copy: Vec<Spanned<String>>,
    /// worktree: commands (`sh -c`) run in the worktree once the result is
    /// committed, with `NPC_RUN_BRANCH`, `NPC_RUN_STATUS` and `NPC_RUN_HEAD`.
    #[serde(default)]
    pub after: Vec<Spanned<String>>,
    /// worktree: push the run's branch to the repository's `origin` once
    /// the run succeeded with changes (before `after`); a failed push is
    /// recorded (`run.push_failed`, the result's `push`), the run's outcome
    /// kept. Default `false`.
    pub push: Option<bool>,
    /// worktree: a run that changed no file fails (reason `no_changes`)
    /// instead of succeeding with an empty result. Default `false`.
    pub expect_changes: Option<bool>,
    /// A template naming what the overlap policy applies to (such as
    /// `{{ payload.pull_request.number }}`): runs with different keys
    /// run side by side, runs with the same key queue, skip or replace.
    pub concurrency_key: Option<Spanned<String>>,
    /// webhook: a minijinja expression over the request (`payload` is its
    /// JSON body, `event` its event header), such as `payload.action ==
    /// "created"`; a request it is not true of is answered 200 and ignored.
    pub filter: Option<Spanned<String>>,
    /// Longest a run may take, setup included (`30m`, `2h`). Default `30m`.
    pub timeout: Option<Spanned<String>>,
    /// How long a run of this trigger parked on an `ask` waits for an
    /// answer before the call is denied (`30m`). Default: the profile's,
    /// then `[runs] approval_timeout`.
    pub approval_timeout: Option<Spanned<String>>,
    /// The sandbox of this trigger's runs: `off`, `workspace` or `strict`
    /// (default: the profile's, then `[runs] sandbox`).
    #[schemars(extend("enum" = ["off", "workspace", "strict"]))]
    pub sandbox: Option<Spanned<String>>,
    /// How often a failed run is tried again (with a growing pause). Default 0.
    #[schemars(range(min = 0, max = 10))]
    pub retries: Option<Spanned<i64>>,
    /// What happens when the trigger fires.
    pub action: Spanned<RawAction>,
}

/// A trigger's action: run a profile (`profile`) or a command (`command`).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Action")]
pub struct RawAction {
    /// Run this profile (a `profiles` entry).
    pub profile: Option<Spanned<String>>,
    /// With this prompt (a `prompts` entry) as the task.
    pub prompt: Option<Spanned<String>>,
    /// Values for the prompt's variables.
    #[serde(default)]
    pub vars: TextMap,
    /// Or run this command.
    pub command: Option<Spanned<String>>,
    /// Arguments of the command.
    #[serde(default)]
    pub args: Vec<Spanned<Text>>,
    /// Environment of the command.
    #[serde(default)]
    pub env: TextMap,
    /// Working directory of the command.
    pub cwd: Option<Spanned<Text>>,
    /// Or start this workflow (a `workflows` entry); its steps read the
    /// firing's request as `payload`.
    pub workflow: Option<Spanned<String>>,
    /// The workflow's inputs.
    #[serde(default)]
    pub inputs: TextMap,
}

/// `[pane_plugins.NAME]`: a pane-plugin child (nightcrow protocol, v3).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "PanePlugin")]
pub struct RawPanePlugin {
    /// Executable of the plugin; a bare program, no placeholders.
    pub command: Spanned<String>,
    /// Arguments.
    #[serde(default)]
    pub args: Vec<Spanned<Text>>,
    /// Environment (added to a cleared environment).
    #[serde(default)]
    pub env: TextMap,
    /// Whether the plugin runs. Default `false`, as in nightcrow.
    pub enabled: Option<bool>,
    /// Let the plugin watch panes that signal it (`watch_pane`). Default `false`.
    pub watch_on_signal: Option<bool>,
    /// Flags and subcommands a relaunch may add to the pane's command.
    #[serde(default)]
    pub allowed_resume_flags: Vec<Spanned<String>>,
    /// Restart policy: `never`, `on-failure` (default) or `always`.
    #[schemars(extend("enum" = ["never", "on-failure", "always"]))]
    pub restart: Option<Spanned<String>>,
}

/// `[panes.NAME]`: an agent pane.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Pane")]
pub struct RawPane {
    /// Startup command of the pane; a bare program, no placeholders.
    pub command: Spanned<String>,
    /// Arguments.
    #[serde(default)]
    pub args: Vec<Spanned<Text>>,
    /// Working directory, relative to the manifest's directory.
    pub cwd: Option<Spanned<Text>>,
    /// Environment of the pane.
    #[serde(default)]
    pub env: TextMap,
    /// The pane plugin (a `pane_plugins` entry) watching this pane.
    pub plugin: Option<Spanned<String>>,
    /// Milliseconds without output after which the pane counts as idle
    /// (`pane_idle`). Default 2000.
    pub idle_ms: Option<Spanned<i64>>,
    /// Milliseconds an exited pane is held for its plugin's relaunch.
    /// Default 120000.
    pub relaunch_ttl_ms: Option<Spanned<i64>>,
}

/// `[notify.NAME]`: a notification sink.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Notify")]
pub struct RawNotify {
    /// `webhook` (a JSON POST), `ntfy`, `slack` (an incoming webhook) or
    /// `desktop` (`notify-send`, when it is installed).
    #[schemars(extend("enum" = ["webhook", "ntfy", "slack", "desktop"]))]
    pub kind: Spanned<String>,
    /// webhook, slack: the URL npc POSTs to; ntfy: the topic's URL
    /// (`https://ntfy.sh/TOPIC`). It usually holds a secret: write an
    /// environment reference such as `"${SLACK_WEBHOOK_URL}"`; it is
    /// redacted wherever npc shows it. `https`, or `http` on loopback only.
    pub url: Option<Spanned<Text>>,
    /// ntfy: the topic, instead of `url` (with `server`).
    pub topic: Option<Spanned<Text>>,
    /// ntfy: the server of `topic`. Default `https://ntfy.sh`.
    pub server: Option<Spanned<Text>>,
    /// ntfy: the priority, `min`, `low`, `default`, `high` or `max`.
    /// Default: `high` for a run that waits for an answer, else `default`.
    #[schemars(extend("enum" = ["min", "low", "default", "high", "max"]))]
    pub priority: Option<Spanned<String>>,
    /// ntfy: an access token sent as `Authorization: Bearer` (write
    /// `"${NTFY_TOKEN}"`).
    pub token: Option<Spanned<Text>>,
    /// webhook: HTTP headers sent with each request (values may be
    /// `"${VAR}"`).
    #[serde(default)]
    pub headers: TextMap,
    /// webhook: the JSON body, a minijinja template of `message` (`title`,
    /// `text`, `on`, `run`, `trigger`, `links`, …). Values are written as
    /// JSON (`{"text": {{ message.text }}}`); the rendered body must be
    /// JSON. Default: `message` itself.
    pub body: Option<Spanned<String>>,
    /// What to tell: `run.waiting`, `run.blocked`, `run.failed`,
    /// `run.succeeded`, `run.finished`, `tool.denied`, `pane.attention`, …
    pub on: Vec<Spanned<String>>,
    /// Only runs of these triggers (`@manual` for runs by hand); all when empty.
    #[serde(default)]
    pub triggers: Vec<Spanned<String>>,
    /// Only runs of these profiles; all when empty.
    #[serde(default)]
    pub profiles: Vec<Spanned<String>>,
    /// Only runs with these origins (`cron`, `webhook`, `file_watch`,
    /// `manual`, `api`, `acp`, `cli`); all when empty.
    #[serde(default)]
    pub origins: Vec<Spanned<String>>,
    /// Attempts per message before npc gives up (`notify.failed`). Default 5.
    #[schemars(range(min = 1, max = 20))]
    pub attempts: Option<Spanned<i64>>,
    /// Milliseconds one request may take. Default 10000.
    #[schemars(range(min = 1, max = 60000))]
    pub timeout_ms: Option<Spanned<i64>>,
    /// Whether the sink is used. Default `true`.
    pub enabled: Option<bool>,
}

/// `[workflows.NAME]`: steps toward one goal.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Workflow")]
pub struct RawWorkflow {
    /// What the workflow is for (shown by `npc workflows`).
    pub description: Option<Spanned<String>>,
    /// The values a start gives (`npc workflow run NAME --input k=v`),
    /// read as `inputs.NAME` in the steps' templates.
    #[serde(default)]
    #[schemars(extend("propertyNames" = { "pattern": "^[a-z0-9][a-z0-9_-]*$" }))]
    pub inputs: IndexMap<Name, Entry<Spanned<RawWorkflowInput>>>,
    /// The steps, keyed by id.
    #[schemars(extend("propertyNames" = { "pattern": "^[a-z0-9][a-z0-9_-]*$" }))]
    pub steps: IndexMap<Name, Entry<Spanned<RawStep>>>,
}

/// `[workflows.NAME.inputs.INPUT]`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "WorkflowInput")]
pub struct RawWorkflowInput {
    /// What the input is.
    pub description: Option<Spanned<String>>,
    /// Its value when a start gives none; without one, a start must give it.
    pub default: Option<Spanned<String>>,
}

/// `[workflows.NAME.steps.ID]`: one step, a run of a profile or a command
/// (or, with `gate` alone, a person's approval).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "WorkflowStep")]
pub struct RawStep {
    /// Run this profile (a `profiles` entry).
    pub profile: Option<Spanned<String>>,
    /// The agent's task, a template reading `inputs`, `steps` (earlier
    /// steps' outputs), `matrix`, `payload` and `workflow`. Default: the
    /// profile's own prompt.
    pub prompt: Option<Spanned<String>>,
    /// Or run this command (it reads the same values as JSON from
    /// `NPC_TRIGGER_PAYLOAD`).
    pub command: Option<Spanned<String>>,
    /// Arguments of the command.
    #[serde(default)]
    pub args: Vec<Spanned<Text>>,
    /// Environment of the command.
    #[serde(default)]
    pub env: TextMap,
    /// The steps that must have succeeded before this one starts.
    #[serde(default)]
    pub needs: Vec<Spanned<String>>,
    /// Fan-out: one instance of the step per combination of these values
    /// (`{ part = ["api", "cli"] }`), each reading `matrix.KEY`; a string is
    /// an expression giving the list (`"steps.plan.output.tasks"`).
    #[serde(default)]
    #[schemars(extend("propertyNames" = { "pattern": "^[a-z0-9][a-z0-9_-]*$" }))]
    pub matrix: IndexMap<Name, Spanned<RawMatrix>>,
    /// An expression over the same values as `prompt`; a step it is not
    /// true of is `skipped` (and so are the steps that need it).
    pub when: Option<Spanned<String>>,
    /// Where the step works: `worktree` or `in_place` (default: the
    /// profile's, then `[runs] workspace`).
    pub workspace: Option<Spanned<String>>,
    /// worktree: the commit to start from, a template such as
    /// `{{ steps.plan.branch }}` (a step works on another step's result).
    /// Default `HEAD`.
    pub base: Option<Spanned<String>>,
    /// worktree: merge the branches of these earlier steps (every instance
    /// of a fan-out) into the base before the step starts; a conflict fails
    /// the step, naming the files.
    #[serde(default)]
    pub merge: Vec<Spanned<String>>,
    /// `approval`: the step waits for a person (`npc runs approve ID`)
    /// before it runs; a step with `gate` and no `profile` or `command` is
    /// the approval alone.
    #[schemars(extend("enum" = ["approval"]))]
    pub gate: Option<Spanned<String>>,
    /// How often a failed run of the step is tried again. Default 0.
    #[schemars(range(min = 0, max = 10))]
    pub retries: Option<Spanned<i64>>,
    /// Longest one run of the step may take (`30m`).
    pub timeout: Option<Spanned<String>>,
    /// How long the step's gate (and its runs' asks) wait for an answer.
    pub approval_timeout: Option<Spanned<String>>,
    /// The sandbox of the step's agent runs (`off`, `workspace`, `strict`).
    #[schemars(extend("enum" = ["off", "workspace", "strict"]))]
    pub sandbox: Option<Spanned<String>>,
    /// What the step hands on beyond its branch, head, diff and final
    /// message: a JSON file it writes.
    pub outputs: Option<Spanned<RawStepOutputs>>,
}

/// `outputs` of a step.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "WorkflowStepOutputs")]
pub struct RawStepOutputs {
    /// A JSON file the step writes (relative to its workspace), read as
    /// `steps.ID.output`; a missing or invalid file fails the step.
    pub file: Spanned<String>,
    /// A JSON Schema (a file relative to the manifest) the file must
    /// satisfy.
    pub schema: Option<Spanned<String>>,
}

/// A `matrix` entry: the values, or an expression giving them.
#[derive(Debug, JsonSchema)]
#[schemars(untagged, rename = "WorkflowMatrix")]
pub enum RawMatrix {
    /// The values, one instance each.
    Values(Vec<serde_json::Value>),
    /// An expression over `inputs` and `steps` that gives a list.
    Expression(String),
}

impl<'de> Deserialize<'de> for RawMatrix {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = RawMatrix;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a list of values or an expression giving one")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(RawMatrix::Expression(v.to_string()))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                seq: A,
            ) -> Result<Self::Value, A::Error> {
                Vec::<serde_json::Value>::deserialize(serde::de::value::SeqAccessDeserializer::new(
                    seq,
                ))
                .map(RawMatrix::Values)
            }
        }
        d.deserialize_any(V)
    }
}
