//! The validated manifest model: plain typed values with defaults applied,
//! names resolved and no spans, so two manifests compare equal exactly when
//! they mean the same thing (whichever syntax, order or formatting they were
//! written in). Everything downstream (plan, render, runtime) reads this.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::Serialize;

use super::keyword::keywords;
use super::schedule::Schedule;
use super::text::Text;

/// Default state directory, relative to the manifest's directory.
pub const DEFAULT_STATE_DIR: &str = ".npc";
/// Default REST API / webhook address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8766";
/// Default MCP server startup timeout.
pub const DEFAULT_STARTUP_TIMEOUT_MS: u64 = 10_000;
/// Default MCP tool-call timeout.
pub const DEFAULT_TOOL_TIMEOUT_MS: u64 = 60_000;
/// Largest MCP timeout accepted (one hour).
pub const MAX_MCP_TIMEOUT_MS: u64 = 3_600_000;
/// Default idle timeout of an MCP session, in seconds: a session unused this
/// long is closed and reconnected on the next call.
pub const DEFAULT_MCP_IDLE_TIMEOUT_S: u64 = 300;
/// Largest MCP idle timeout accepted, in seconds (one day).
pub const MAX_MCP_IDLE_TIMEOUT_S: u64 = 86_400;
/// Default hook timeout.
pub const DEFAULT_HOOK_TIMEOUT_MS: u64 = 5_000;
/// Largest hook timeout accepted.
pub const MAX_HOOK_TIMEOUT_MS: u64 = 30_000;
/// Default address of the webhook listener (seed 000 has it there; the REST
/// API keeps [`DEFAULT_LISTEN`]).
pub const DEFAULT_WEBHOOK_LISTEN: &str = "127.0.0.1:8765";
/// Default largest webhook request body (1 MiB).
pub const DEFAULT_WEBHOOK_MAX_BODY_BYTES: u64 = 1024 * 1024;
/// Largest `max_body_bytes` a webhook route may set (16 MiB).
pub const MAX_WEBHOOK_BODY_BYTES: u64 = 16 * 1024 * 1024;
/// Default webhook requests accepted per minute per route.
pub const DEFAULT_WEBHOOK_RATE_PER_MINUTE: u64 = 600;
/// Largest `rate_limit_per_minute` a route may set.
pub const MAX_WEBHOOK_RATE_PER_MINUTE: u64 = 100_000_000;
/// Default file-watch debounce.
pub const DEFAULT_DEBOUNCE_MS: u64 = 500;
/// Largest file-watch debounce accepted (one minute).
pub const MAX_DEBOUNCE_MS: u64 = 60_000;

/// A whole validated manifest.
#[derive(Debug, Clone, PartialEq, Hash, Serialize)]
pub struct Manifest {
    pub project: Project,
    pub daemon: Daemon,
    /// `[runs]`: how runs are carried out.
    pub runs: RunsSettings,
    /// `[store]`: the store a fleet shares.
    pub store: StoreSettings,
    pub mcp: McpSettings,
    pub mcp_servers: BTreeMap<String, McpServer>,
    pub mcp_builtins: McpBuiltins,
    pub providers: BTreeMap<String, Provider>,
    pub profiles: BTreeMap<String, Profile>,
    pub prompts: BTreeMap<String, Prompt>,
    /// `[instructions]`: the repository's agent instructions (a template
    /// without variables), delivered by `native::rules`.
    pub instructions: Option<Prompt>,
    pub hooks: BTreeMap<HookEvent, Vec<Hook>>,
    pub plugins: BTreeMap<String, Plugin>,
    pub triggers: BTreeMap<String, Trigger>,
    pub pane_plugins: BTreeMap<String, PanePlugin>,
    pub panes: BTreeMap<String, Pane>,
    /// `[notify.NAME]`: the notification sinks.
    pub notify: BTreeMap<String, NotifySink>,
    /// `[workflows.NAME]`: steps toward one goal.
    pub workflows: BTreeMap<String, Workflow>,
    /// Plugin registrations dropped while loading (collisions, user
    /// plugins that do not load): the daemon records each as an event.
    pub plugin_notices: Vec<PluginNotice>,
}

/// `[store] lease_timeout` unless the manifest says otherwise, in seconds.
pub const DEFAULT_LEASE_TIMEOUT_SECS: u64 = 30;
/// Longest `[store] lease_timeout`, in seconds.
pub const MAX_LEASE_TIMEOUT_SECS: u64 = 3_600;

/// `[store]`: where a fleet's run queue and event log live.
#[derive(Debug, Clone, PartialEq, Hash, Eq, Serialize)]
pub struct StoreSettings {
    /// The PostgreSQL store's URL, always secret (it holds a password);
    /// `None`: the embedded SQLite store.
    pub url: Option<Text>,
    /// How long a worker's claim and the scheduler's leadership hold
    /// without renewal, in seconds.
    pub lease_timeout_secs: u64,
    /// What a daemon does for the fleet.
    pub role: FleetRole,
}

impl Default for StoreSettings {
    fn default() -> Self {
        Self {
            url: None,
            lease_timeout_secs: DEFAULT_LEASE_TIMEOUT_SECS,
            role: FleetRole::default(),
        }
    }
}

keywords! {
    /// What a daemon in front of a fleet does (`[store] role`).
    #[derive(Debug, Clone, Copy, PartialEq, Hash, Eq, Serialize, Default)]
    pub enum FleetRole {
        /// Takes webhooks and stands for the cron scheduling.
        #[default]
        All = "all",
        /// Takes webhooks; never schedules cron.
        Ingress = "ingress",
        /// Stands for the cron scheduling; serves no webhooks.
        Scheduler = "scheduler",
    }
}

impl FleetRole {
    /// Whether the daemon serves the webhook triggers.
    pub fn takes_webhooks(self) -> bool {
        self != Self::Scheduler
    }

    /// Whether the daemon stands for the fleet's cron scheduling.
    pub fn schedules(self) -> bool {
        self != Self::Ingress
    }
}

#[derive(Debug, Clone, PartialEq, Hash, Eq, Serialize)]
pub struct Project {
    pub name: Option<String>,
    pub state_dir: String,
}

#[derive(Debug, Clone, PartialEq, Hash, Eq, Serialize)]
pub struct Daemon {
    pub listen: SocketAddr,
    pub token_env: Option<String>,
    /// Who may use the TCP surfaces that take a credential.
    pub auth: Auth,
    pub allow_remote: bool,
    pub log_level: LogLevel,
    /// Where the webhook listener binds.
    pub webhook_listen: SocketAddr,
}

keywords! {
    #[derive(Debug, Clone, Copy, PartialEq, Hash, Eq, PartialOrd, Ord, Serialize)]
    pub enum LogLevel {
        Error = "error",
        Warn = "warn",
        Info = "info",
        Debug = "debug",
        Trace = "trace",
    }
}

keywords! {
    /// `daemon.auth`: whether the REST API, the dashboard and the HTTP gateway
    /// want a credential.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Hash, Eq, Serialize)]
    pub enum Auth {
        /// A bearer token (the repository's, or `token_env`'s), or a dashboard
        /// session cookie.
        #[default]
        Token = "token",
        /// Nothing: any local account and any web page may use them (loopback
        /// addresses only).
        None = "none",
    }
}

keywords! {
    /// What a supervisor does when a child exits.
    #[derive(Debug, Clone, Copy, PartialEq, Hash, Eq, Serialize)]
    pub enum RestartPolicy {
        Never = "never",
        OnFailure = "on-failure",
        Always = "always",
    }
}

/// A program to run: executable, arguments, environment, working directory.
#[derive(Debug, Clone, PartialEq, Hash, Eq, Serialize)]
pub struct CommandSpec {
    pub command: String,
    pub args: Vec<Text>,
    pub env: BTreeMap<String, Text>,
    /// Relative to the manifest's directory; resolved when run.
    pub cwd: Option<Text>,
}

/// `[mcp]` settings other than the servers.
#[derive(Debug, Clone, Default, PartialEq, Hash, Eq, Serialize)]
pub struct McpSettings {
    /// The agent files get one entry, `npc mcp serve`, instead of one per server.
    pub gateway: bool,
    /// How the gateway names upstream tools, prompts and resource templates.
    pub prefix: Prefix,
    /// What the gateway's `tools/list` offers.
    pub tools: ToolListing,
}

keywords! {
    /// `mcp.prefix`: how the gateway names an upstream's tools, prompts and
    /// resource templates.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Hash, Eq, Serialize)]
    pub enum Prefix {
        /// Always `SERVER__NAME`.
        #[default]
        Always = "always",
        /// The upstream's own name, unless another server or a built-in tool
        /// has it too; then every clashing one is `SERVER__NAME`.
        OnConflict = "on_conflict",
    }
}

keywords! {
    /// `mcp.tools`: what the gateway's `tools/list` offers.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Hash, Eq, Serialize)]
    pub enum ToolListing {
        /// Every tool.
        #[default]
        All = "all",
        /// Only `search_tools` and `call_tool`.
        Search = "search",
    }
}

#[derive(Debug, Clone, PartialEq, Hash, Serialize)]
pub struct McpServer {
    pub transport: McpTransport,
    pub enabled: bool,
    pub startup_timeout_ms: u64,
    pub tool_timeout_ms: u64,
    /// Seconds an unused session stays open; `0` keeps it open.
    pub idle_timeout_s: u64,
    pub enabled_tools: Option<Vec<String>>,
    pub disabled_tools: Vec<String>,
    pub restart: RestartPolicy,
}

impl McpServer {
    /// The variables its start-time values (`env`, `headers`, `args`,
    /// `url`) name that were not set when the manifest was read: npc
    /// refuses to start the server rather than give it empty values.
    pub fn unset_variables(&self) -> Vec<String> {
        let texts: Vec<&Text> = match &self.transport {
            McpTransport::Stdio(spec) => spec.args.iter().chain(spec.env.values()).collect(),
            McpTransport::Http { url, headers, .. } => {
                std::iter::once(url).chain(headers.values()).collect()
            }
        };
        let mut names = Vec::new();
        for text in texts.into_iter().filter(|t| t.is_unresolved()) {
            let none = BTreeMap::<String, String>::new();
            let errors = text.source().map_or_else(Vec::new, |s| {
                super::interp::interpolate(s, &none)
                    .err()
                    .unwrap_or_default()
            });
            for error in errors {
                if let super::interp::InterpError::Unset { name, .. } = error
                    && !names.contains(&name)
                {
                    names.push(name);
                }
            }
        }
        names
    }

    /// [`McpServer::unset_variables`] as the error that refuses its start.
    pub fn check_start(&self) -> Result<(), UnsetVariables> {
        let names = self.unset_variables();
        if names.is_empty() {
            Ok(())
        } else {
            Err(UnsetVariables { names })
        }
    }
}

/// The `${VAR}`s of an MCP server that were not set when npc read the
/// manifest (the server is named by whoever reports it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "it needs {}, which npc did not find set when it read the manifest; export it and start npc again",
    names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
)]
pub struct UnsetVariables {
    pub names: Vec<String>,
}

/// Default limit of one `fetch_url` call.
pub const DEFAULT_FETCH_TIMEOUT_MS: u64 = 20_000;
/// Largest `fetch_timeout_ms` accepted (two minutes).
pub const MAX_FETCH_TIMEOUT_MS: u64 = 120_000;

/// `[mcp.builtins]`: settings of npc's built-in MCP tools.
#[derive(Debug, Clone, PartialEq, Hash, Eq, Serialize)]
pub struct McpBuiltins {
    /// `fetch_url` may reach every non-global unicast address.
    pub fetch_allow_private: bool,
    /// Non-global networks `fetch_url` may reach.
    pub fetch_allow_networks: Vec<IpNet>,
    /// Limit of one `fetch_url` call, all included.
    pub fetch_timeout_ms: u64,
}

impl Default for McpBuiltins {
    fn default() -> Self {
        Self {
            fetch_allow_private: false,
            fetch_allow_networks: Vec::new(),
            fetch_timeout_ms: DEFAULT_FETCH_TIMEOUT_MS,
        }
    }
}

/// An IP network in CIDR notation (`10.1.2.0/24`, `fd00::/8`).
#[derive(Debug, Clone, Copy, PartialEq, Hash, Eq)]
pub struct IpNet {
    /// The network's address, host bits cleared.
    pub addr: std::net::IpAddr,
    pub prefix: u8,
}

impl IpNet {
    /// `ADDR/PREFIX`, or a bare address (a network of one); `None` when
    /// malformed or the prefix is too long for the address.
    pub fn parse(s: &str) -> Option<Self> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p))
                if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && p.len() <= 3 =>
            {
                (
                    a.parse::<std::net::IpAddr>().ok()?,
                    Some(p.parse::<u8>().ok()?),
                )
            }
            Some(_) => return None,
            None => (s.parse::<std::net::IpAddr>().ok()?, None),
        };
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = prefix.unwrap_or(max);
        (prefix <= max).then(|| Self {
            addr: Self::masked(addr, prefix),
            prefix,
        })
    }

    fn masked(addr: std::net::IpAddr, prefix: u8) -> std::net::IpAddr {
        use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
        match addr {
            IpAddr::V4(a) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
                IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask))
            }
            IpAddr::V6(a) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
                IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask))
            }
        }
    }

    /// Whether `ip` lies in the network (an IPv4 network never contains an
    /// IPv6 address, nor the reverse; map first).
    pub fn contains(&self, ip: std::net::IpAddr) -> bool {
        ip.is_ipv4() == self.addr.is_ipv4() && Self::masked(ip, self.prefix) == self.addr
    }
}

impl std::fmt::Display for IpNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl Serialize for IpNet {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[derive(Debug, Clone, PartialEq, Hash, Eq, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum McpTransport {
    Stdio(CommandSpec),
    Http {
        url: Text,
        headers: BTreeMap<String, Text>,
        bearer_token_env: Option<String>,
    },
}

keywords! {
    #[derive(
        Debug,
        Clone,
        Copy,
        Default,
        PartialEq,
        Eq,
        PartialOrd,
        Ord,
        Hash,
        Serialize,
        serde::Deserialize,
        schemars::JsonSchema,
    )]
    pub enum ProviderKind {
        #[default]
        ClaudeCode = "claude_code",
        Codex = "codex",
        GeminiCli = "gemini_cli",
        Opencode = "opencode",
    }
}

impl ProviderKind {
    /// The executable this CLI is usually installed as.
    pub fn default_command(self) -> &'static str {
        match self {
            Self::ClaudeCode => "claude",
            Self::Codex => "codex",
            Self::GeminiCli => "gemini",
            Self::Opencode => "opencode",
        }
    }
}

keywords! {
    /// How npc drives a provider's CLI (`[providers.NAME] driver`).
    #[derive(Debug, Clone, Copy, Default, PartialEq, Hash, Eq, Serialize)]
    pub enum ProviderDriver {
        /// The CLI's headless mode, its output stream parsed
        /// (`providers::Parser`).
        #[default]
        Headless = "headless",
        /// The Agent Client Protocol: npc is the client of the CLI's ACP
        /// program (`providers::acp`).
        Acp = "acp",
    }
}

impl ProviderKind {
    /// The ACP program of this CLI and the arguments that make it speak
    /// ACP, when `driver = "acp"` names no `command`: the two adapters
    /// from npm (`@agentclientprotocol/claude-agent-acp`,
    /// `@agentclientprotocol/codex-acp`), Gemini CLI's `--acp` and
    /// OpenCode's `acp` subcommand.
    pub fn default_acp_command(self) -> (&'static str, &'static [&'static str]) {
        match self {
            Self::ClaudeCode => ("claude-agent-acp", &[]),
            Self::Codex => ("codex-acp", &[]),
            Self::GeminiCli => ("gemini", &["--acp"]),
            Self::Opencode => ("opencode", &["acp"]),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Hash, Eq, Serialize)]
pub struct Provider {
    pub kind: ProviderKind,
    /// How npc drives it; with `acp`, `command` and `args` are the ACP
    /// program's.
    pub driver: ProviderDriver,
    pub command: String,
    pub args: Vec<Text>,
    pub env: BTreeMap<String, Text>,
    pub version: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Hash, Serialize)]
pub struct Profile {
    pub provider: String,
    pub description: String,
    pub prompt: Option<String>,
    pub mcp_servers: Vec<String>,
    pub allowed_tools: Vec<String>,
    pub denied_tools: Vec<String>,
    /// Tool patterns whose calls need the user's approval (`hooks::policy`).
    pub ask_tools: Vec<String>,
    pub model: Option<Text>,
    pub skills: Vec<String>,
    pub frontmatter: Frontmatter,
    /// Where its runs work (a trigger's own settings come first).
    pub workspace: WorkspaceSpec,
    /// How long its runs wait for an answer to an `ask`, in seconds (a
    /// trigger's own comes first; `None`: `[runs] approval_timeout`).
    pub approval_timeout_secs: Option<u64>,
    /// Its runs' sandbox (a trigger's own comes first; `None`: `[runs]`).
    pub sandbox: Option<SandboxMode>,
}

/// The template name of `[instructions]` (in diagnostics and renders).
pub const INSTRUCTIONS_NAME: &str = "instructions";

#[derive(Debug, Clone, PartialEq, Hash, Eq, Serialize)]
pub struct Prompt {
    /// Where the template text came from.
    pub source: PromptSource,
    /// The template text (read from the file when `source` is a file).
    pub template: String,
    pub variables: BTreeMap<String, Variable>,
    /// Also a slash command of the agent CLIs (`native::commands`).
    pub command: bool,
    /// What the prompt does (a command's description).
    pub description: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Hash, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum PromptSource {
    Inline,
    /// Relative to the manifest's directory.
    File {
        path: String,
    },
}

#[derive(Debug, Clone, PartialEq, Hash, Eq, Serialize)]
pub struct Variable {
    pub description: Option<String>,
    pub default: Option<Text>,
}

keywords! {
    /// The seven lifecycle events of Agent Plugins hooks, in lifecycle order.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
    pub enum HookEvent {
        OnAgentStart = "on_agent_start",
        BeforeModel = "before_model",
        AfterModel = "after_model",
        BeforeTool = "before_tool",
        AfterTool = "after_tool",
        OnError = "on_error",
        OnAgentEnd = "on_agent_end",
    }
}

impl HookEvent {
    /// The event another tool's name stands for (Claude Code's
    /// `PreToolUse`, Gemini CLI's `BeforeTool`, a guess such as
    /// `pre_tool`): compared without case, `_` or `-`.
    pub fn other_name(name: &str) -> Option<Self> {
        let folded: String = name
            .chars()
            .filter(|c| !matches!(c, '_' | '-'))
            .flat_map(char::to_lowercase)
            .collect();
        Some(match folded.as_str() {
            "pretool" | "pretooluse" | "beforetool" | "beforetooluse" | "toolbefore" => {
                Self::BeforeTool
            }
            "posttool" | "posttooluse" | "aftertool" | "aftertooluse" | "toolafter" => {
                Self::AfterTool
            }
            "sessionstart" | "start" | "agentstart" | "onstart" | "userpromptsubmit" => {
                Self::OnAgentStart
            }
            "sessionend" | "stop" | "end" | "agentend" | "onend" | "onstop" => Self::OnAgentEnd,
            "premodel" | "beforemodel" | "beforellm" | "prellm" => Self::BeforeModel,
            "postmodel" | "aftermodel" | "afterllm" | "postllm" => Self::AfterModel,
            "error" | "onfailure" | "failure" | "posttoolusefailure" => Self::OnError,
            _ => return None,
        })
    }

    /// Observers whose failure does not stop a run.
    pub fn is_best_effort(self) -> bool {
        matches!(self, Self::OnError | Self::OnAgentEnd)
    }
}

#[derive(Debug, Clone, PartialEq, Hash, Eq, Serialize)]
pub struct Hook {
    pub run: CommandSpec,
    pub timeout_ms: u64,
    /// Regular expression on tool names (validated).
    pub matcher: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Hash, Eq, Serialize)]
pub struct Plugin {
    /// Package directory: relative to the manifest's directory for a
    /// manifest plugin, absolute (canonical) for a user-registry one.
    pub path: String,
    pub enabled: bool,
    /// Where the plugin was registered.
    pub source: PluginSource,
    /// What an enabled, valid package brings besides its MCP servers (those
    /// join `mcp_servers` as `NAME__SERVER`); `None` when disabled.
    pub parts: Option<PluginParts>,
}

/// Where a plugin was registered, in discovery order: the repository's
/// manifest first, then the user registry (`npc plugin install`).
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum PluginSource {
    #[default]
    Manifest,
    User,
}

/// The hooks and skills of an enabled plugin package, resolved.
#[derive(Debug, Clone, PartialEq, Hash, Eq, Serialize)]
pub struct PluginParts {
    /// The package's `plugin.json` name (its data directory's name).
    pub package: String,
    /// Canonical package root (`PLUGIN_ROOT`).
    pub root: std::path::PathBuf,
    /// The plugin's data directory (`PLUGIN_DATA`), under the user's data directory.
    pub data: std::path::PathBuf,
    /// Its hooks file's hooks (placeholders not yet expanded; the hook
    /// runner expands them), per event in file order.
    pub hooks: BTreeMap<HookEvent, Vec<Hook>>,
    /// Its valid skills: name and canonical folder.
    pub skills: Vec<PluginSkill>,
}

/// A plugin registration that does not run (see `crate::plugins::resolve`).
#[derive(Debug, Clone, PartialEq, Hash, Eq, Serialize)]
#[serde(tag = "notice", rename_all = "snake_case")]
pub enum PluginNotice {
    /// A later registration of a `(kind, id)` already registered: dropped.
    Collision {
        /// `plugin` or `mcp_server`.
        kind: String,
        id: String,
        kept: PluginSource,
        dropped: PluginSource,
        dropped_path: String,
        /// Always `keep_first`.
        policy: String,
    },
    /// A plugin (or one of its servers) that does not load: dropped.
    Dropped {
        id: String,
        source: PluginSource,
        path: String,
        reason: String,
    },
}

impl PluginNotice {
    /// The event kind the daemon records for it.
    pub fn event_kind(&self) -> &'static str {
        match self {
            Self::Collision { .. } => "registry.plugin_collision",
            Self::Dropped { .. } => "registry.plugin_dropped",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Hash, Eq, Serialize)]
pub struct PluginSkill {
    pub name: String,
    /// The skill's folder (`<root>/skills/<name>`), canonical.
    pub dir: std::path::PathBuf,
}

impl Manifest {
    /// Enabled plugins with their parts, in discovery order: the
    /// manifest's, then the user registry's, each by name. This is the
    /// order their hooks run in (after the manifest's own hooks).
    pub fn plugin_parts(&self) -> Vec<(&str, &PluginParts)> {
        let mut out: Vec<(PluginSource, &str, &PluginParts)> = self
            .plugins
            .iter()
            .filter(|(_, p)| p.enabled)
            .filter_map(|(n, p)| Some((p.source, n.as_str(), p.parts.as_ref()?)))
            .collect();
        out.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        out.into_iter().map(|(_, n, p)| (n, p)).collect()
    }
}

#[derive(Debug, Clone, PartialEq, Hash, Serialize)]
pub struct Trigger {
    pub enabled: bool,
    pub source: TriggerSource,
    pub action: Action,
    /// What a firing does while a run of this trigger is still going.
    pub overlap: Overlap,
    /// Where its runs work (before its profile's settings).
    pub workspace: WorkspaceSpec,
    /// A template: the overlap policy applies among runs of one key.
    pub concurrency_key: Option<String>,
    /// Longest a run may take, setup included, in seconds.
    pub timeout_secs: Option<u64>,
    /// How often a failed run is tried again.
    pub retries: u32,
    /// How long its runs wait for an answer to an `ask`, in seconds
    /// (`None`: the profile's, then `[runs] approval_timeout`).
    pub approval_timeout_secs: Option<u64>,
    /// Its runs' sandbox (`None`: the profile's, then `[runs]`).
    pub sandbox: Option<SandboxMode>,
}

keywords! {
    /// Where a run works (`workspace = "worktree" | "in_place"`).
    #[derive(
        Debug, Clone, Copy, PartialEq, Hash, Eq, Serialize, serde::Deserialize, schemars::JsonSchema,
    )]
    pub enum WorkspaceMode {
        /// A git worktree of its own; the result is a branch.
        Worktree = "worktree",
        /// The repository's own checkout.
        InPlace = "in_place",
    }
}

/// A trigger's or a profile's workspace settings; every field optional, so
/// a trigger's override its profile's one by one ([`WorkspaceSpec::over`]).
#[derive(Debug, Clone, Default, PartialEq, Hash, Eq, Serialize)]
pub struct WorkspaceSpec {
    pub mode: Option<WorkspaceMode>,
    /// The commit to start from (a template).
    pub base_ref: Option<String>,
    /// The run's branch (a template).
    pub branch: Option<String>,
    pub setup: Vec<String>,
    pub copy: Vec<String>,
    pub after: Vec<String>,
    /// Push the run's branch to `origin` once it succeeded with changes.
    pub push: Option<bool>,
    /// A run that changed no file fails (`no_changes`) instead of
    /// succeeding with an empty result.
    pub expect_changes: Option<bool>,
}

impl WorkspaceSpec {
    /// `self`'s settings where it has them, else `below`'s.
    pub fn over(&self, below: &WorkspaceSpec) -> WorkspaceSpec {
        let list =
            |a: &Vec<String>, b: &Vec<String>| if a.is_empty() { b.clone() } else { a.clone() };
        WorkspaceSpec {
            mode: self.mode.or(below.mode),
            base_ref: self.base_ref.clone().or_else(|| below.base_ref.clone()),
            branch: self.branch.clone().or_else(|| below.branch.clone()),
            setup: list(&self.setup, &below.setup),
            copy: list(&self.copy, &below.copy),
            after: list(&self.after, &below.after),
            push: self.push.or(below.push),
            expect_changes: self.expect_changes.or(below.expect_changes),
        }
    }
}

impl Manifest {
    /// How long a run of `profile` started by `trigger` (or of a workflow
    /// step's queue) waits for an answer to an `ask`, in seconds: the
    /// trigger's (the step's) `approval_timeout`,
    /// else the profile's, else `[runs] approval_timeout` (default 30m).
    pub fn approval_timeout_secs(&self, profile: Option<&str>, trigger: Option<&str>) -> u64 {
        let of_trigger = trigger.and_then(|t| match self.workflow_step(t) {
            Some((_, step)) => step.approval_timeout_secs,
            None => self.triggers.get(t).and_then(|t| t.approval_timeout_secs),
        });
        let of_profile = profile
            .and_then(|p| self.profiles.get(p))
            .and_then(|p| p.approval_timeout_secs);
        of_trigger
            .or(of_profile)
            .unwrap_or(self.runs.approval_timeout_secs)
    }

    /// The sandbox a run of `profile` started by `trigger` (or of a
    /// workflow step's queue) asks for: the trigger's (the step's), else the profile's, else `[runs]`'s; `None` when nothing
    /// says (the default then depends on who starts the run).
    pub fn sandbox_mode(
        &self,
        profile: Option<&str>,
        trigger: Option<&str>,
    ) -> Option<SandboxMode> {
        let of_trigger = trigger.and_then(|t| match self.workflow_step(t) {
            Some((_, step)) => step.sandbox,
            None => self.triggers.get(t).and_then(|t| t.sandbox),
        });
        let of_profile = profile
            .and_then(|p| self.profiles.get(p))
            .and_then(|p| p.sandbox);
        of_trigger.or(of_profile).or(self.runs.sandbox)
    }

    /// The longest any run of the manifest waits for an answer, in seconds:
    /// what an agent CLI must give a hook that may park its run, lest it
    /// kill the hook first (a killed hook does not block the tool).
    pub fn longest_approval_timeout_secs(&self) -> u64 {
        let profiles = self
            .profiles
            .values()
            .filter_map(|p| p.approval_timeout_secs);
        let triggers = self
            .triggers
            .values()
            .filter_map(|t| t.approval_timeout_secs);
        let steps = self
            .workflows
            .values()
            .flat_map(|w| w.steps.values())
            .filter_map(|s| s.approval_timeout_secs);
        profiles
            .chain(triggers)
            .chain(steps)
            .fold(self.runs.approval_timeout_secs, u64::max)
    }
}

impl Manifest {
    /// The workspace of a run without an explicit setting: `[runs]
    /// workspace`, else a worktree in a git repository, for a profile run
    /// the daemon starts unattended; in place for everything else (a
    /// command, `npc run`, `npc acp`).
    pub fn default_workspace(&self, action: &Action, unattended: bool, git: bool) -> WorkspaceMode {
        let profile = matches!(action, Action::RunProfile { .. });
        match (profile && unattended, self.runs.workspace) {
            (false, _) => WorkspaceMode::InPlace,
            (true, Some(mode)) => mode,
            (true, None) if git => WorkspaceMode::Worktree,
            (true, None) => WorkspaceMode::InPlace,
        }
    }

    /// The workspace settings of trigger `t`'s runs: its own over its profile's.
    pub fn trigger_workspace(&self, t: &Trigger) -> WorkspaceSpec {
        let below = match &t.action {
            Action::RunProfile { profile, .. } => self
                .profiles
                .get(profile)
                .map(|p| p.workspace.clone())
                .unwrap_or_default(),
            Action::RunCommand(_) | Action::StartWorkflow { .. } => WorkspaceSpec::default(),
        };
        t.workspace.over(&below)
    }

    /// Where trigger `t`'s runs work (`git`: whether the repository is one).
    pub fn trigger_workspace_mode(&self, t: &Trigger, git: bool) -> WorkspaceMode {
        self.trigger_workspace(t)
            .mode
            .unwrap_or_else(|| self.default_workspace(&t.action, true, git))
    }
}

/// `[runs]`: how runs are carried out.
#[derive(Debug, Clone, PartialEq, Hash, Eq, Serialize)]
pub struct RunsSettings {
    /// The default workspace of profile runs the daemon starts unattended.
    pub workspace: Option<WorkspaceMode>,
    /// Where worktrees are made, relative to the manifest's directory.
    pub worktrees_dir: Option<String>,
    pub max_concurrent: usize,
    /// How long a worktree of a run that did not succeed is kept.
    pub keep_failed_secs: u64,
    pub max_kept_worktrees: usize,
    /// Ports handed out as `NPC_PORT` (first, last).
    pub ports: Option<(u16, u16)>,
    /// Who commits a worktree run's changes (`Name <email>`).
    pub author: Option<String>,
    /// How long a run parked on an `ask` waits for an answer, in seconds.
    pub approval_timeout_secs: u64,
    /// The project's default sandbox (`None`: `workspace` for unattended
    /// runs where the kernel can, `off` for runs started by hand).
    pub sandbox: Option<SandboxMode>,
    /// What sandboxed runs may do beyond the defaults (`[runs.sandbox]`).
    pub sandbox_rules: SandboxRules,
}

keywords! {
    /// A run's sandbox (`sandbox = "off" | "workspace" | "strict"`).
    #[derive(Debug, Clone, Copy, PartialEq, Hash, Eq, Serialize)]
    pub enum SandboxMode {
        /// No sandbox: the run has the authority of the user.
        Off = "off",
        /// Files and processes confined; the network as it is.
        Workspace = "workspace",
        /// Files, processes and the network (only through npc's proxy).
        Strict = "strict",
    }
}

/// The user's secrets in the home directory: never readable by a
/// sandboxed run, and no `[runs.sandbox]` path may open them.
pub const SECRET_HOME_PATHS: [&str; 6] =
    [".ssh", ".aws", ".gnupg", ".config/gh", ".netrc", ".docker"];

/// A path of `[runs.sandbox]`, as written (the pure model knows no home
/// directory): resolved by the run that uses it.
#[derive(Debug, Clone, PartialEq, Hash, Eq, Serialize)]
#[serde(tag = "in", content = "path", rename_all = "snake_case")]
pub enum SandboxPath {
    /// `~/REL`: in the home directory.
    Home(String),
    /// `REL`: relative to the manifest's directory.
    Repository(String),
    /// An absolute path.
    Absolute(String),
}

/// A host `allow_hosts` admits: exact, or every subdomain (`*.NAME`), on
/// one port or any.
#[derive(Debug, Clone, PartialEq, Hash, Eq, Serialize)]
pub struct HostPattern {
    /// Lower-case host name, without the `*.` of a wildcard.
    pub host: String,
    /// `*.host`: its subdomains (not `host` itself).
    pub subdomains: bool,
    pub port: Option<u16>,
}

impl HostPattern {
    /// Whether `host` (any case) on `port` is admitted.
    pub fn admits(&self, host: &str, port: u16) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let name = if self.subdomains {
            host.strip_suffix(&self.host)
                .is_some_and(|rest| rest.len() > 1 && rest.ends_with('.'))
        } else {
            host == self.host
        };
        name && self.port.is_none_or(|p| p == port)
    }
}

/// `[runs.sandbox]`: what sandboxed runs may do beyond the defaults.
#[derive(Debug, Clone, PartialEq, Hash, Eq, Serialize, Default)]
pub struct SandboxRules {
    /// Written (and read) besides the run's own directories.
    pub writable: Vec<SandboxPath>,
    /// Read besides what is readable by default.
    pub readable: Vec<SandboxPath>,
    /// Reached through the proxy by `strict` runs.
    pub allow_hosts: Vec<HostPattern>,
}

/// Runs carried out at once unless `[runs] max_concurrent` says otherwise.
pub const DEFAULT_MAX_CONCURRENT_RUNS: usize = 4;
/// The largest `[runs] max_concurrent`.
pub const MAX_CONCURRENT_RUNS_LIMIT: usize = 64;
/// How long a failed run's worktree is kept unless `keep_failed` says otherwise.
pub const DEFAULT_KEEP_FAILED_SECS: u64 = 24 * 60 * 60;
/// Worktrees kept at once unless `max_kept_worktrees` says otherwise.
pub const DEFAULT_MAX_KEPT_WORKTREES: usize = 20;
/// The largest `max_kept_worktrees`.
pub const MAX_KEPT_WORKTREES_LIMIT: usize = 1000;
/// The most times a failed run is tried again.
pub const MAX_RETRIES: u32 = 10;
/// The longest `timeout` of a trigger's runs.
pub const MAX_RUN_TIMEOUT_SECS: u64 = 7 * 24 * 60 * 60;
/// How long a run parked on an `ask` waits for an answer unless
/// `approval_timeout` says otherwise.
pub const DEFAULT_APPROVAL_TIMEOUT_SECS: u64 = 30 * 60;
/// The longest `approval_timeout`.
pub const MAX_APPROVAL_TIMEOUT_SECS: u64 = 7 * 24 * 60 * 60;

impl Default for RunsSettings {
    fn default() -> Self {
        Self {
            workspace: None,
            worktrees_dir: None,
            max_concurrent: DEFAULT_MAX_CONCURRENT_RUNS,
            keep_failed_secs: DEFAULT_KEEP_FAILED_SECS,
            max_kept_worktrees: DEFAULT_MAX_KEPT_WORKTREES,
            ports: None,
            author: None,
            approval_timeout_secs: DEFAULT_APPROVAL_TIMEOUT_SECS,
            sandbox: None,
            sandbox_rules: SandboxRules::default(),
        }
    }
}

keywords! {
    /// A trigger's overlap policy (`overlap = "skip" | "queue" | "replace"`).
    #[derive(Debug, Clone, Copy, PartialEq, Hash, Eq, Serialize, Default)]
    pub enum Overlap {
        /// Record the firing as skipped.
        Skip = "skip",
        /// Run it after the current run ends.
        #[default]
        Queue = "queue",
        /// Cancel the current run and start this one.
        Replace = "replace",
    }
}

keywords! {
    /// What a cron trigger does with fires missed while no daemon ran
    /// (`missed = "skip" | "run_once"`).
    #[derive(Debug, Clone, Copy, PartialEq, Hash, Eq, Serialize, Default)]
    pub enum Missed {
        /// Forget them; the next fire is the next one from now.
        #[default]
        Skip = "skip",
        /// Run once on start (however many were missed), then go on.
        RunOnce = "run_once",
    }
}

/// A cron trigger's time zone, parsed once at load. It hashes and
/// serializes as its IANA name, as the manifest spells it, so plans and
/// fingerprints read as they did when it was kept as text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeZone(pub chrono_tz::Tz);

impl TimeZone {
    pub const UTC: Self = Self(chrono_tz::UTC);

    /// Its IANA name.
    pub fn name(self) -> &'static str {
        self.0.name()
    }
}

impl std::hash::Hash for TimeZone {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name().hash(state);
    }
}

impl Serialize for TimeZone {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

#[derive(Debug, Clone, PartialEq, Hash, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TriggerSource {
    Cron {
        schedule: Schedule,
        /// Checked at load: an IANA zone, `UTC` when none is given.
        timezone: TimeZone,
        missed: Missed,
    },
    Webhook {
        route: String,
        secret_env: Option<String>,
        events: Vec<String>,
        max_body_bytes: u64,
        rate_limit_per_minute: u64,
        /// A minijinja expression a request must make true (`payload`,
        /// `event`), else it is ignored; compiled at load.
        filter: Option<super::template::Filter>,
    },
    FileWatch {
        paths: Vec<String>,
        /// Globs of paths never to fire for.
        ignore: Vec<String>,
        events: Vec<FileEvent>,
        debounce_ms: u64,
    },
}

keywords! {
    #[derive(Debug, Clone, Copy, PartialEq, Hash, Eq, PartialOrd, Ord, Serialize)]
    pub enum FileEvent {
        Created = "created",
        Modified = "modified",
        Deleted = "deleted",
    }
}

#[derive(Debug, Clone, PartialEq, Hash, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Action {
    RunProfile {
        profile: String,
        prompt: Option<String>,
        vars: BTreeMap<String, Text>,
    },
    RunCommand(CommandSpec),
    /// Start a workflow (`[workflows.NAME]`) with these inputs.
    StartWorkflow {
        workflow: String,
        inputs: BTreeMap<String, Text>,
    },
}

#[derive(Debug, Clone, PartialEq, Hash, Eq, Serialize)]
pub struct PanePlugin {
    pub run: CommandSpec,
    pub enabled: bool,
    pub watch_on_signal: bool,
    pub allowed_resume_flags: Vec<String>,
    pub restart: RestartPolicy,
}

#[derive(Debug, Clone, PartialEq, Hash, Eq, Serialize)]
pub struct Pane {
    pub run: CommandSpec,
    pub plugin: Option<String>,
    /// No output for this long makes the pane idle.
    pub idle_ms: u64,
    /// How long an exited pane is held for a relaunch.
    pub relaunch_ttl_ms: u64,
}

/// Extra YAML frontmatter of a profile: free-form JSON values by key.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
#[serde(transparent)]
pub struct Frontmatter(pub BTreeMap<String, serde_json::Value>);

impl std::hash::Hash for Frontmatter {
    /// JSON values have no `Hash`; their canonical text does (map keys are
    /// ordered, so equal values give equal text).
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        for (k, v) in &self.0 {
            k.hash(state);
            v.to_string().hash(state);
        }
        self.0.len().hash(state);
    }
}

impl Manifest {
    /// Every secret value in the manifest (text that came from the
    /// environment), so logs and events can scrub them wherever they appear.
    pub fn secret_values(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut add = |t: &Text| {
            if t.is_secret() && !t.expose().is_empty() {
                out.push(t.expose().to_string());
            }
        };
        let command = |c: &CommandSpec, add: &mut dyn FnMut(&Text)| {
            c.args.iter().for_each(&mut *add);
            c.env.values().for_each(&mut *add);
            c.cwd.iter().for_each(&mut *add);
        };
        for s in self.mcp_servers.values() {
            match &s.transport {
                McpTransport::Stdio(c) => command(c, &mut add),
                McpTransport::Http { url, headers, .. } => {
                    add(url);
                    headers.values().for_each(&mut add);
                }
            }
        }
        for p in self.providers.values() {
            p.args.iter().for_each(&mut add);
            p.env.values().for_each(&mut add);
        }
        for p in self.profiles.values() {
            p.model.iter().for_each(&mut add);
        }
        for p in self.prompts.values() {
            p.variables
                .values()
                .filter_map(|v| v.default.as_ref())
                .for_each(&mut add);
        }
        for h in self.hooks.values().flatten() {
            command(&h.run, &mut add);
        }
        for t in self.triggers.values() {
            match &t.action {
                Action::RunProfile { vars, .. } => vars.values().for_each(&mut add),
                Action::RunCommand(c) => command(c, &mut add),
                Action::StartWorkflow { inputs, .. } => inputs.values().for_each(&mut add),
            }
        }
        for step in self.workflows.values().flat_map(|w| w.steps.values()) {
            if let Some(Action::RunCommand(c)) = &step.action {
                command(c, &mut add);
            }
        }
        for p in self.pane_plugins.values() {
            command(&p.run, &mut add);
        }
        for p in self.panes.values() {
            command(&p.run, &mut add);
        }
        for n in self.notify.values() {
            n.sink.secrets().for_each(&mut add);
        }
        out.sort();
        out.dedup();
        out
    }
}

/// The queue (trigger name) of runs by hand: no valid trigger name.
pub const MANUAL_QUEUE: &str = "@manual";

/// Attempts per notification unless `attempts` says otherwise.
pub const DEFAULT_NOTIFY_ATTEMPTS: u32 = 5;
/// Most `attempts` a sink may set.
pub const MAX_NOTIFY_ATTEMPTS: u32 = 20;
/// How long one notification request may take unless `timeout_ms` says otherwise.
pub const DEFAULT_NOTIFY_TIMEOUT_MS: u64 = 10_000;
/// Longest `timeout_ms` of a sink.
pub const MAX_NOTIFY_TIMEOUT_MS: u64 = 60_000;
/// The ntfy server of a `topic` without `server`.
pub const DEFAULT_NTFY_SERVER: &str = "https://ntfy.sh";

/// `[notify.NAME]`: a notification sink, what it is told and of which runs.
#[derive(Debug, Clone, PartialEq, Hash, Eq, Serialize)]
pub struct NotifySink {
    pub sink: Sink,
    /// What it is told, in the manifest's order, without repeats.
    pub on: Vec<NotifyOn>,
    /// Only runs of these triggers (`@manual` too); all when empty.
    pub triggers: Vec<String>,
    /// Only runs of these profiles; all when empty.
    pub profiles: Vec<String>,
    /// Only runs with these origins; all when empty.
    pub origins: Vec<RunOrigin>,
    pub attempts: u32,
    pub timeout_ms: u64,
    pub enabled: bool,
}

/// Where a sink sends, and how.
#[derive(Debug, Clone, PartialEq, Hash, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Sink {
    /// A JSON POST to `url`: `body` (a template of `message`) or the message.
    Webhook {
        url: Text,
        headers: BTreeMap<String, Text>,
        body: Option<String>,
    },
    /// A POST to an ntfy topic URL.
    Ntfy {
        url: Text,
        priority: Option<NtfyPriority>,
        token: Option<Text>,
    },
    /// A Slack incoming webhook.
    Slack { url: Text },
    /// `notify-send` on this machine.
    Desktop,
}

impl Sink {
    /// The sink's kind word (`webhook`, `ntfy`, `slack`, `desktop`).
    pub fn kind(&self) -> &'static str {
        match self {
            Sink::Webhook { .. } => "webhook",
            Sink::Ntfy { .. } => "ntfy",
            Sink::Slack { .. } => "slack",
            Sink::Desktop => "desktop",
        }
    }

    /// Every text of the sink that may hold a secret.
    pub fn secrets(&self) -> impl Iterator<Item = &Text> {
        let (url, more): (Option<&Text>, Vec<&Text>) = match self {
            Sink::Webhook { url, headers, .. } => (Some(url), headers.values().collect()),
            Sink::Ntfy { url, token, .. } => (Some(url), token.iter().collect()),
            Sink::Slack { url } => (Some(url), Vec::new()),
            Sink::Desktop => (None, Vec::new()),
        };
        url.into_iter().chain(more)
    }
}

keywords! {
    /// What a sink is told (`on`): names of what a person cares about, each
    /// mapped onto the recorded events in one place (`notify::topics`).
    #[derive(Debug, Clone, Copy, PartialEq, Hash, Eq, PartialOrd, Ord, Serialize)]
    pub enum NotifyOn {
        /// A run waits for a person's answer to a question (an `ask`).
        RunWaiting = "run.waiting",
        /// A run ended `blocked`: a policy or permission denial stopped it.
        RunBlocked = "run.blocked",
        /// A run ended `failed`, `timed_out`, `hook_failed` or `interrupted`.
        RunFailed = "run.failed",
        /// A run ended `succeeded`.
        RunSucceeded = "run.succeeded",
        /// A run ended, however it ended.
        RunFinished = "run.finished",
        /// A run was queued.
        RunQueued = "run.queued",
        /// A run was cancelled.
        RunCancelled = "run.cancelled",
        /// A tool call of a run was denied.
        ToolDenied = "tool.denied",
        /// A pane needs a person's attention.
        PaneAttention = "pane.attention",
        /// A component (an MCP server, a pane plugin, …) failed.
        ComponentFailed = "component.failed",
        /// The manifest no longer loads; the daemon keeps what runs.
        ManifestInvalid = "manifest.invalid",
    }
}

keywords! {
    /// What asked for a run: the origin a run's row and events name, and
    /// what a `[notify.NAME] origins` filter lists.
    #[derive(
        Debug, Clone, Copy, PartialEq, Hash, Eq, PartialOrd, Ord, Serialize, serde::Deserialize,
    )]
    pub enum RunOrigin {
        Cron = "cron",
        Webhook = "webhook",
        FileWatch = "file_watch",
        /// `npc trigger fire NAME`.
        Manual = "manual",
        /// A profile run started through the REST API (`POST /api/v1/runs`).
        Api = "api",
        /// A prompt of `npc acp`.
        Acp = "acp",
        /// `npc run`.
        Cli = "cli",
        /// A step of a workflow run (`npc workflow run`).
        Workflow = "workflow",
        /// A run an agent started with the gateway's `npc_delegate`.
        Delegate = "delegate",
    }
}

impl RunOrigin {
    /// Whether a run of this origin carries a local front end's request
    /// (`surfaces::runs::LocalRun`) as its row's payload.
    pub fn is_local(self) -> bool {
        matches!(self, Self::Acp | Self::Cli)
    }

    /// Whether a daemon in front of a fleet (`[store] url`) hands runs of
    /// this origin to the fleet's workers: triggers' firings and runs
    /// started through the API. A file watch's runs stay on the machine
    /// that watches, and `npc run` / `npc acp` runs on the machine asked.
    pub fn runs_in_fleet(self) -> bool {
        matches!(self, Self::Cron | Self::Webhook | Self::Manual | Self::Api)
    }
}

impl std::fmt::Display for RunOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

keywords! {
    /// An ntfy message's priority.
    #[derive(Debug, Clone, Copy, PartialEq, Hash, Eq, Serialize)]
    pub enum NtfyPriority {
        Min = "min",
        Low = "low",
        Default = "default",
        High = "high",
        Max = "max",
    }
}

/// `[workflows.NAME]`, validated: its steps form a graph without cycles
/// whose every `needs` names a step.
#[derive(Debug, Clone, PartialEq, Hash, Eq, Serialize)]
pub struct Workflow {
    pub description: Option<String>,
    pub inputs: BTreeMap<String, WorkflowInput>,
    pub steps: BTreeMap<String, Step>,
    /// Every step once, each after the steps it needs (ties by name).
    pub order: Vec<String>,
}

/// `[workflows.NAME.inputs.INPUT]`.
#[derive(Debug, Clone, PartialEq, Hash, Eq, Serialize)]
pub struct WorkflowInput {
    pub description: Option<String>,
    /// `None`: a start must give it.
    pub default: Option<String>,
}

/// What a step asks of a person before it runs.
#[derive(Debug, Clone, Copy, PartialEq, Hash, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Gate {
    /// An approval answered like a run's ask (`npc runs approve ID`).
    Approval,
}

/// A matrix entry: the values (each kept as JSON text), or an expression
/// over `inputs` and `steps` that gives them when the step is reached.
#[derive(Debug, Clone, PartialEq, Hash, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MatrixValues {
    Values(Vec<String>),
    Expression(String),
}

/// What a step hands on beyond its branch, head, diff and final message.
#[derive(Debug, Clone, PartialEq, Hash, Eq, Serialize)]
pub struct StepOutputs {
    /// A JSON file the step writes, relative to its workspace.
    pub file: String,
    /// The JSON Schema (its text, read at load) the file must satisfy.
    pub schema: Option<String>,
}

/// `[workflows.NAME.steps.ID]`, validated.
#[derive(Debug, Clone, PartialEq, Hash, Eq, Serialize)]
pub struct Step {
    /// What the step runs; `None`: a gate alone.
    pub action: Option<Action>,
    /// The agent's task (a template); `None`: the profile's own prompt.
    pub prompt: Option<String>,
    pub needs: Vec<String>,
    pub matrix: BTreeMap<String, MatrixValues>,
    /// An expression; `None`: always.
    pub when: Option<String>,
    /// Where it works (its `base` is the workspace's `base_ref` template).
    pub workspace: WorkspaceSpec,
    /// Steps whose branches are merged into the base first.
    pub merge: Vec<String>,
    pub gate: Option<Gate>,
    pub retries: u32,
    pub timeout_secs: Option<u64>,
    pub approval_timeout_secs: Option<u64>,
    pub sandbox: Option<SandboxMode>,
    pub outputs: Option<StepOutputs>,
}

impl Manifest {
    /// The workflow and step whose runs queue in `queue`, if declared.
    pub fn workflow_step(&self, queue: &str) -> Option<(&Workflow, &Step)> {
        let (workflow, step) = crate::model::workflow::parse_step_queue(queue)?;
        let w = self.workflows.get(workflow)?;
        Some((w, w.steps.get(step)?))
    }
}

impl Workflow {
    /// The steps `id` comes after: everything it needs, directly or not.
    /// Only their outputs exist when `id` is reached.
    /// The steps in stages: each step in the stage after the last of the
    /// steps it needs (stage 0: the steps that need none), in `order`.
    pub fn stages(&self) -> Vec<Vec<String>> {
        let mut depth: BTreeMap<&str, usize> = BTreeMap::new();
        let mut stages: Vec<Vec<String>> = Vec::new();
        for id in &self.order {
            let d = self.steps.get(id).map_or(0, |s| {
                s.needs
                    .iter()
                    .filter_map(|n| depth.get(n.as_str()))
                    .map(|d| d + 1)
                    .max()
                    .unwrap_or(0)
            });
            depth.insert(id, d);
            if stages.len() <= d {
                stages.resize(d + 1, Vec::new());
            }
            stages[d].push(id.clone());
        }
        stages
    }

    pub fn before(&self, id: &str) -> std::collections::BTreeSet<String> {
        let graph: BTreeMap<String, Vec<String>> = self
            .steps
            .iter()
            .map(|(k, s)| (k.clone(), s.needs.clone()))
            .collect();
        crate::model::workflow::ancestors(&graph, id)
    }
}
