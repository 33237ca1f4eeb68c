//! A run of a provider with `driver = "acp"`: its ACP program started
//! with no prompt on its command line and no MCP file written, the
//! conversation ([`providers::acp::Client`]) carried over its stdio, and
//! every `session/request_permission` decided by the run's policy — the
//! same [`HookRunner::before_tool`] the hook bridge runs (the profile's
//! `denied_tools`, its hooks, its `ask_tools` parking the run until a
//! person answers) — answered with an option the agent offered and
//! recorded as `run.permission`. A call of a gateway tool is the
//! gateway's to govern (it applies the same policy and records it), so
//! its question is allowed here: one ask, not two.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use tokio::io::AsyncWriteExt as _;

use crate::bus::EventBus;
use crate::event::{DeniedBy, Event, PermissionAnswer, RunPermission, ToolDenied};
use crate::hooks::park::{NoOneToAsk, ParkApprover, Reach};
use crate::hooks::policy::ToolPolicy;
use crate::hooks::{Approve, BeforeTool, HookRunner, ToolCallInfo};
use crate::model::{Manifest, McpTransport, Profile, ProviderKind};
use crate::providers::AgentEvent;
use crate::providers::acp::{AcpFailure, Client, Decision, McpEntry, Start, Step, TurnEnd};
use crate::supervisor::Supervisor;
use crate::surfaces::approval::{APPROVAL_SESSION_ENV, APPROVAL_SOCKET_ENV};

/// Longest a frame may wait for room in the agent's stdin (an agent that
/// stops reading fills the pipe); after that the conversation fails.
pub const WRITE_LIMIT: Duration = Duration::from_secs(10);
/// The gateway entry's name in a run's `mcpServers` (the agent's tools
/// from it are `mcp__npc__SERVER__TOOL` and the like).
pub const GATEWAY_NAME: &str = crate::native::gateway::GATEWAY_ENTRY;

/// Why a call is denied when a hook rewrote its arguments.
const REWRITE_DENIED: &str =
    "a hook rewrote the call's arguments, which an ACP permission cannot carry; the call is denied";
/// The rule of a denial npc records for a permission question itself (a
/// rewrite, a failed hook).
const DENIED_RULE: &str = "acp_permission";

/// What an ACP run needs beyond its child: the conversation's start and
/// what decides its permission questions.
#[derive(Clone)]
pub struct AcpRun {
    pub start: Start,
    /// The CLI (how its tools are named in the profile's patterns).
    pub kind: ProviderKind,
    /// The profile's tool rules (`None`: it names none).
    pub policy: Option<ToolPolicy>,
    pub manifest: Arc<Manifest>,
    /// Whether a person can answer an `ask` now (a daemon holds the
    /// repository); `None`: nobody can, the ask is denied and recorded.
    pub reach: Option<Reach>,
}

impl std::fmt::Debug for AcpRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AcpRun")
            .field("start", &self.start)
            .field("policy", &self.policy)
            .field("reach", &self.reach.is_some())
            .finish_non_exhaustive()
    }
}

/// The run's MCP servers as `session/new` takes them: the servers of
/// `only` (the gateway entry alone in gateway mode), their values exposed
/// for the agent. npc's own gateway is started as this very binary, so an
/// agent finds it without `npc` on its PATH.
pub fn mcp_entries(only: &Manifest, warnings: &mut Vec<String>) -> Vec<McpEntry> {
    let this = std::env::current_exe().ok();
    let mut entries = Vec::new();
    for (name, server) in only.mcp_servers.iter().filter(|(_, s)| s.enabled) {
        // A server missing a value it needs is not handed on with an empty
        // one (a secret above all): the agent does without it, and is told.
        if let Err(unset) = server.check_start() {
            warnings.push(format!(
                "the MCP server `{name}` is left out of the run: {unset}"
            ));
            continue;
        }
        match &server.transport {
            McpTransport::Stdio(spec) => {
                if spec.cwd.is_some() {
                    warnings.push(format!(
                        "the MCP server `{name}` has a `cwd`, which ACP cannot pass; the agent starts it in the run's directory"
                    ));
                }
                let command = match (
                    &this,
                    name.as_str() == GATEWAY_NAME && spec.command == "npc",
                ) {
                    (Some(exe), true) => exe.display().to_string(),
                    _ => spec.command.clone(),
                };
                entries.push(McpEntry::Stdio {
                    name: name.clone(),
                    command,
                    args: spec.args.iter().map(|a| a.expose().to_string()).collect(),
                    env: spec
                        .env
                        .iter()
                        .map(|(k, v)| (k.clone(), v.expose().to_string()))
                        .collect(),
                });
            }
            McpTransport::Http { url, headers, .. } => entries.push(McpEntry::Http {
                name: name.clone(),
                url: url.expose().to_string(),
                headers: headers
                    .iter()
                    .map(|(k, v)| (k.clone(), v.expose().to_string()))
                    .collect(),
            }),
        }
    }
    entries
}

/// The CLI's own tools by ACP tool kind, as a profile's tool patterns
/// name them, for the permission questions whose call names no tool
/// (Codex's; Gemini CLI's ids carry the name).
pub fn tool_for_kind(kind: ProviderKind) -> BTreeMap<String, String> {
    let pairs: &[(&str, &str)] = match kind {
        ProviderKind::ClaudeCode => &[
            ("execute", "Bash"),
            ("edit", "Edit"),
            ("read", "Read"),
            ("fetch", "WebFetch"),
        ],
        ProviderKind::Codex => &[("execute", "exec_command"), ("edit", "apply_patch")],
        ProviderKind::GeminiCli => &[
            ("execute", "run_shell_command"),
            ("edit", "replace"),
            ("read", "read_file"),
            ("fetch", "web_fetch"),
        ],
        ProviderKind::Opencode => &[
            ("execute", "bash"),
            ("edit", "edit"),
            ("read", "read"),
            ("fetch", "webfetch"),
        ],
    };
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The session mode an ACP run of `kind` works in, when the agent offers
/// it: Claude Code's adapter starts in `auto`, whose classifier refuses
/// tool calls without asking anyone; in `default` the questions come to
/// npc, which answers them by the run's policy.
pub fn mode_for(kind: ProviderKind) -> Option<String> {
    (kind == ProviderKind::ClaudeCode).then(|| "default".to_string())
}

/// Environment an ACP program of `kind` gets from npc (the provider's
/// `env` comes after it): Claude Code shows MCP tools only through its
/// tool search unless told otherwise, and a run's gateway tools are what
/// the profile grants.
///
/// OpenCode asks about nothing by default: its `OPENCODE_PERMISSION` turns
/// each tool rule of the profile (`ask_tools` and `denied_tools` alike)
/// into `ask`, so the question reaches npc, which answers it by the
/// policy (a denial is then a recorded `run.permission`, not a tool
/// OpenCode hides).
pub fn fixed_env(kind: ProviderKind, profile: &Profile) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    match kind {
        ProviderKind::ClaudeCode => {
            env.insert("ENABLE_TOOL_SEARCH".to_string(), "false".to_string());
        }
        // Codex's adapter leaves out a session server the Codex config
        // names already (the project's `npc` entry, without the run's
        // variables): the run's own entry must win.
        ProviderKind::Codex => {
            env.insert(
                "DISABLE_MCP_CONFIG_FILTERING".to_string(),
                "true".to_string(),
            );
        }
        ProviderKind::Opencode => {
            let (mut rules, _) = crate::native::permissions::opencode_permission(profile);
            for value in rules.values_mut() {
                asking(value);
            }
            if !rules.is_empty() {
                env.insert(
                    crate::providers::launch::OPENCODE_PERMISSION_ENV.to_string(),
                    serde_json::Value::Object(rules).to_string(),
                );
            }
        }
        _ => {}
    }
    env
}

/// A rule's `deny` as `ask` (nested pattern maps included).
fn asking(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::String(s) if s == "deny" => *s = "ask".to_string(),
        serde_json::Value::Object(map) => map.values_mut().for_each(asking),
        _ => {}
    }
}

/// The first rule of `profile` on the CLI's own tools that an ACP run of
/// `kind` cannot enforce: Codex's adapter runs its own tools in Codex's
/// sandbox and asks npc about none of them (only about escalations), so a
/// `denied_tools` or `ask_tools` pattern on them would be a promise npc
/// cannot keep. MCP tools (`mcp__…`) are the gateway's.
pub fn unenforceable(kind: ProviderKind, profile: &Profile) -> Option<&str> {
    if kind != ProviderKind::Codex {
        return None;
    }
    profile
        .denied_tools
        .iter()
        .chain(&profile.ask_tools)
        .map(String::as_str)
        .find(|p| {
            !p.trim_start()
                .starts_with(crate::hooks::policy::MCP_PATTERN_PREFIX)
        })
}

/// The name the profile's patterns give the CLI's tool `tool`: OpenCode's
/// own tools by their Claude Code names (`bash` is `Bash`), as
/// `denied_tools` writes them for it; every other name as it is.
fn pattern_name(kind: ProviderKind, tool: &str) -> String {
    match kind {
        ProviderKind::Opencode => crate::native::permissions::opencode_pattern_name(tool)
            .unwrap_or(tool)
            .to_string(),
        _ => tool.to_string(),
    }
}

/// Whether `tool` (as the agent names it) is one of npc's gateway's.
fn is_gateway_tool(tool: &str) -> bool {
    let gateway = GATEWAY_NAME;
    [
        format!("mcp__{gateway}__"),
        format!("{gateway}__"),
        format!("mcp_{gateway}_"),
        format!("{gateway}_"),
        format!("{gateway}/"),
    ]
    .iter()
    .any(|prefix| tool.starts_with(prefix.as_str()))
}

/// A decision that finished: the question's key, the decision and why.
type Decided = (u64, Decision, Verdict);

/// Why npc decided as it did, and whether a denial is on record already.
#[derive(Debug, Clone, Default)]
struct Verdict {
    reason: Option<String>,
    /// The runner recorded the denial (`tool.denied`) itself.
    recorded: bool,
}

impl Verdict {
    fn because(reason: impl Into<String>, recorded: bool) -> Self {
        Self {
            reason: Some(reason.into()),
            recorded,
        }
    }
}

/// One ACP conversation of a run, over the agent's stdin.
pub struct Conversation {
    client: Client,
    stdin: Option<tokio::process::ChildStdin>,
    run_id: String,
    profile: String,
    bus: EventBus,
    runner: Arc<HookRunner>,
    kind: ProviderKind,
    deciding: FuturesUnordered<BoxFuture<'static, Decided>>,
    reasons: HashMap<u64, Verdict>,
    /// How the turn ended, once it did.
    pub ended: Option<TurnEnd>,
    /// Why the conversation failed, if it did.
    pub failed: Option<AcpFailure>,
}

impl std::fmt::Debug for Conversation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conversation")
            .field("run_id", &self.run_id)
            .field("client", &self.client)
            .field("ended", &self.ended)
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

impl Conversation {
    /// The conversation of `run` per `plan`, deciding permission questions
    /// with the run's hooks (`hooks`' set) and policy.
    pub fn new(
        run: &super::PreparedRun,
        plan: &AcpRun,
        supervisor: &Supervisor,
        bus: &EventBus,
        hooks: &HookRunner,
        stdin: Option<tokio::process::ChildStdin>,
    ) -> Self {
        let (run_id, profile, env) = (run.id.as_str(), run.profile.as_str(), &run.spec.env);
        let approver: Arc<dyn Approve> = match (
            env.get(APPROVAL_SOCKET_ENV),
            env.get(APPROVAL_SESSION_ENV),
            &plan.reach,
        ) {
            (Some(socket), Some(session), _) => {
                match crate::hooks::approve::SocketApprover::new(socket.clone(), session.clone()) {
                    Some(a) => Arc::new(a),
                    None => nobody(bus, run_id, profile),
                }
            }
            (_, _, Some(reach)) => Arc::new(ParkApprover::new(
                bus.store().clone(),
                Some(bus.clone()),
                run_id.to_string(),
                Some(profile.to_string()),
                plan.manifest.clone(),
                reach.clone(),
            )),
            _ => nobody(bus, run_id, profile),
        };
        let mut runner = HookRunner::new(
            (*hooks.set()).clone(),
            supervisor.clone(),
            Some(bus.clone()),
        )
        .for_site(DeniedBy::Hook, Some(run_id.to_string()))
        .with_approver(approver);
        if let Some(policy) = &plan.policy {
            runner = runner.with_policy(policy.clone());
        }
        // A sandboxed run's gateway reaches its owner over the run's
        // channel: the agent hands its MCP servers only the entry's
        // environment (Gemini CLI and Codex filter their own), so the
        // channel's variables go into the gateway's entry.
        let mut start = plan.start.clone();
        let carried: Vec<(String, String)> = super::CHANNEL_VARS
            .iter()
            .filter_map(|k| env.get(*k).map(|v| (k.to_string(), v.clone())))
            .collect();
        for entry in &mut start.mcp_servers {
            if let McpEntry::Stdio { name, env, .. } = entry
                && name == GATEWAY_NAME
            {
                env.extend(carried.iter().cloned());
            }
        }
        Self {
            client: Client::new(start),
            stdin,
            run_id: run_id.to_string(),
            profile: profile.to_string(),
            bus: bus.clone(),
            runner: Arc::new(runner),
            kind: plan.kind,
            deciding: FuturesUnordered::new(),
            reasons: HashMap::new(),
            ended: None,
            failed: None,
        }
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Send `initialize`.
    pub async fn begin(&mut self) -> Vec<AgentEvent> {
        let steps = self.client.begin();
        self.carry(steps).await
    }

    /// A line of the agent's stdout (`cut`: it was longer than the bound).
    pub async fn line(&mut self, bytes: &[u8], cut: bool) -> Vec<AgentEvent> {
        let steps = if cut {
            self.client.overlong()
        } else {
            self.client.feed(bytes)
        };
        self.carry(steps).await
    }

    /// Cancel the turn (`session/cancel`, pending questions `cancelled`).
    pub async fn cancel(&mut self) -> Vec<AgentEvent> {
        self.deciding.clear();
        let steps = self.client.cancel();
        self.carry(steps).await
    }

    /// Whether a decision is being made (the run waits for it).
    pub fn deciding(&self) -> bool {
        !self.deciding.is_empty()
    }

    /// The next decision that finishes, answered to the agent.
    pub async fn decided(&mut self) -> Vec<AgentEvent> {
        let Some((key, decision, verdict)) = self.deciding.next().await else {
            return Vec::new();
        };
        self.reasons.insert(key, verdict);
        let steps = self.client.answer(key, decision);
        self.carry(steps).await
    }

    /// Carry `steps` out: frames to the agent, questions to the policy,
    /// answers recorded; the events to deliver come back.
    async fn carry(&mut self, steps: Vec<Step>) -> Vec<AgentEvent> {
        let mut events = Vec::new();
        for step in steps {
            match step {
                Step::Send(bytes) => {
                    if let Err(e) = self.write(&bytes).await {
                        events.push(AgentEvent::error(
                            crate::event::ErrorKind::Provider,
                            format!("cannot write to the agent: {e}"),
                        ));
                        self.failed.get_or_insert(AcpFailure::Unwritable {
                            reason: e.to_string(),
                        });
                    }
                }
                Step::Event(e) => events.push(e),
                Step::Permission(ask) => {
                    let runner = self.runner.clone();
                    let call = ToolCallInfo {
                        id: ask.call_id.clone(),
                        name: pattern_name(self.kind, &ask.tool),
                        arguments: ask.arguments.clone(),
                    };
                    let key = ask.key;
                    let gateway = is_gateway_tool(&ask.tool);
                    self.deciding.push(Box::pin(async move {
                        if gateway {
                            let why = "a gateway tool: npc's gateway applies the policy";
                            return (key, Decision::Allow, Verdict::because(why, false));
                        }
                        match runner.before_tool(&call).await {
                            Ok(BeforeTool::Continue { arguments: None }) => {
                                (key, Decision::Allow, Verdict::default())
                            }
                            Ok(BeforeTool::Continue { arguments: Some(_) }) => {
                                (key, Decision::Deny, Verdict::because(REWRITE_DENIED, false))
                            }
                            Ok(BeforeTool::Deny { reason, .. }) => {
                                (key, Decision::Deny, Verdict::because(reason, true))
                            }
                            // A failed hook is recorded as a `hook.call`, not a denial.
                            Err(failure) => (
                                key,
                                Decision::Deny,
                                Verdict::because(failure.to_string(), false),
                            ),
                        }
                    }));
                }
                Step::Answered(answered) => {
                    let verdict = self.reasons.remove(&answered.key);
                    // A denial npc decided that nothing recorded yet is a
                    // `tool.denied` of the run, so the run ends `blocked`,
                    // never `succeeded` with the call refused unseen.
                    if let Some(v) = &verdict
                        && answered.answer != PermissionAnswer::Allowed
                        && !v.recorded
                    {
                        let denied = Event::ToolDenied(ToolDenied {
                            run_id: Some(self.run_id.clone()),
                            profile: Some(self.profile.clone()),
                            tool: answered.tool.clone(),
                            rule: DENIED_RULE.to_string(),
                            by: DeniedBy::Hook,
                            reason: v.reason.clone(),
                        });
                        record(&self.bus, &self.run_id, denied).await;
                    }
                    let reason = verdict.and_then(|v| v.reason).or_else(|| {
                        (answered.answer == PermissionAnswer::Cancelled).then(|| {
                            "the turn was cancelled, or the agent offered no option for npc's decision".to_string()
                        })
                    });
                    let event = Event::RunPermission(RunPermission {
                        run_id: self.run_id.clone(),
                        tool: answered.tool,
                        title: answered.title,
                        options: answered.options,
                        answer: answered.answer,
                        option_id: answered.option_id,
                        reason,
                    });
                    record(&self.bus, &self.run_id, event).await;
                }
                Step::Ended(end) => {
                    self.ended = Some(end);
                }
                Step::Failed(failure) => {
                    self.failed.get_or_insert(failure);
                }
            }
        }
        events
    }

    async fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        let Some(pipe) = self.stdin.as_mut() else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "the agent's stdin is closed",
            ));
        };
        let write = async {
            pipe.write_all(bytes).await?;
            pipe.flush().await
        };
        tokio::time::timeout(WRITE_LIMIT, write)
            .await
            .unwrap_or_else(|_| {
                Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the agent's stdin stayed full; it does not read what npc sends",
                ))
            })
    }

    /// Close the agent's stdin (the conversation is over).
    pub fn close(&mut self) {
        self.stdin = None;
    }
}

/// Record `event` as run `run_id`'s; a store that refuses it is logged
/// (the answer already went to the agent).
async fn record(bus: &EventBus, run_id: &str, event: Event) {
    let event = event.for_component(super::super::component(run_id));
    if let Err(e) = bus.publish(event).await {
        tracing::error!("cannot record an answer of run `{run_id}`: {e}");
    }
}

fn nobody(bus: &EventBus, run_id: &str, profile: &str) -> Arc<dyn Approve> {
    Arc::new(NoOneToAsk {
        bus: Some(bus.clone()),
        run_id: Some(run_id.to_string()),
        profile: Some(profile.to_string()),
        why: "no daemon runs for this repository, so nobody can be asked; start `npc daemon` (then `npc runs approve ID` answers), or change the rule that asks".to_string(),
    })
}
