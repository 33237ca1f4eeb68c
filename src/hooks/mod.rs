//! Lifecycle hooks (Agent Plugins 1.0 as Orcacode runs them, seed 004):
//! the [`HookSet`] (every hook of every source, in a documented order) and
//! the [`HookRunner`] that runs them — one process per call through the
//! supervisor's one-shot spawn path (cleared environment plus essentials,
//! declared `env`, `PLUGIN_ROOT` / `PLUGIN_DATA` for plugin hooks), the JSON
//! envelope `{version, event, plugin, payload}` on stdin (≤
//! [`MAX_INPUT_BYTES`]), one JSON object or nothing on stdout (≤
//! [`MAX_OUTPUT_BYTES`]), bounded stderr, a timeout per hook. Decisions:
//! `before_tool` continue / deny (non-empty reason) / rewrite (arguments
//! chain from hook to hook; the first deny wins) / ask (the user decides
//! through the runner's [`Approve`]r — an editor attached with `npc acp`;
//! with none, or when asking fails, the call is denied); `after_tool` an optional
//! replacement `output` / `is_error`; the other events observe. Fail closed:
//! invalid output, a non-zero exit, a timeout or a launch failure stops what
//! the hook guards, except for the best-effort observers `on_error` and
//! `on_agent_end`. Every call is a `hook.call` event. The set is swapped live
//! ([`HookRunner::replace`]) without touching anything else. The gateway's
//! call path wraps `tools/call` with it ([`stage::HookStage`]), `npc run`
//! calls the agent and model events, and `npc hook run` answers agent CLIs'
//! own hook protocols through [`bridge`].

pub mod approve;
pub mod bridge;
mod exec;
pub mod park;
pub mod policy;
pub mod stage;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::bus::EventBus;
use crate::model::{Hook, HookEvent, Manifest};
use crate::supervisor::Supervisor;

pub use exec::HookError;

/// Version of the stdin envelope (`{"version": 1, …}`).
pub const PROTOCOL_VERSION: u64 = 1;
/// Largest stdin envelope a hook is sent (seed 004: 2 MiB); a larger one is
/// a failure of the hook (fail closed), except that an `after_tool` result's
/// `output` is clipped to fit first.
pub const MAX_INPUT_BYTES: usize = 2 * 1024 * 1024;
// An approval question carries a call of up to a hook's whole envelope.
const _: () = assert!(crate::surfaces::approval::MAX_FRAME_BYTES >= MAX_INPUT_BYTES + 64 * 1024);
/// Largest stdout a hook may answer with (seed 004: 1 MiB); more is invalid output.
pub const MAX_OUTPUT_BYTES: usize = 1024 * 1024;
/// stderr kept per call for diagnostics; the rest is read and dropped.
pub const MAX_STDERR_BYTES: usize = 16 * 1024;
/// Characters of a hook's stderr quoted in an error message or event.
pub const STDERR_QUOTE_CHARS: usize = 400;
/// The environment variables naming a plugin's package and data directory;
/// also the only placeholders (`${PLUGIN_ROOT}`, `${PLUGIN_DATA}`) expanded in
/// a plugin hook's args, env and cwd, in one non-recursive pass.
pub const PLUGIN_ROOT_VAR: &str = "PLUGIN_ROOT";
pub const PLUGIN_DATA_VAR: &str = "PLUGIN_DATA";

/// Where a hook was declared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum HookSource {
    /// The manifest's `[[hooks.EVENT]]`: runs in the repository root, no
    /// `PLUGIN_*` variables, `plugin` is `null` in the envelope.
    Manifest,
    /// An enabled plugin's hooks file.
    Plugin {
        name: String,
        /// The package root (`PLUGIN_ROOT`; relative programs and `cwd` resolve here).
        root: PathBuf,
        /// The plugin's data directory (`PLUGIN_DATA`), created by the caller.
        data: PathBuf,
    },
}

impl HookSource {
    /// The plugin's name (`None` for the manifest).
    pub fn plugin(&self) -> Option<&str> {
        match self {
            Self::Manifest => None,
            Self::Plugin { name, .. } => Some(name),
        }
    }
}

/// The hooks one source declares, event by event, in declaration order.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceHooks {
    pub source: HookSource,
    pub hooks: BTreeMap<HookEvent, Vec<Hook>>,
}

/// One runnable hook.
#[derive(Debug, Clone)]
pub struct HookEntry {
    pub event: HookEvent,
    pub source: HookSource,
    /// Position among its source's hooks of this event.
    pub index: usize,
    pub hook: Hook,
    /// The `matcher` (tool events only; `None` matches every tool).
    matcher: Option<Matcher>,
}

/// A hook's `matcher`, compiled the first time a tool is tested against
/// it: `npc hook run` answers one event of one tool call, and compiling
/// every matcher of every hook up front was a large part of its time. A
/// matcher of plain names (`Bash`, `^Bash`, `Edit|Write`, `^mcp__fs__read$`:
/// branches of letters, digits, `_` and `-`, each perhaps anchored) is
/// matched as the regular expression would, without compiling one
/// ([`Literals`]). A pattern that does not compile (validation refuses its
/// syntax; a pattern too big for the regex engine can pass it) matches
/// every tool, so a hook that guards tools fails closed.
#[derive(Debug, Clone)]
struct Matcher {
    pattern: Arc<str>,
    literals: Option<Literals>,
    compiled: Arc<OnceLock<Option<regex::Regex>>>,
}

/// A matcher whose branches are literal names, each anchored at the start
/// (`^`), the end (`$`), both or neither.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Literals(Vec<Literal>);

#[derive(Debug, Clone, PartialEq, Eq)]
struct Literal {
    text: String,
    start: bool,
    end: bool,
}

impl Literals {
    /// `pattern` as literal branches, if that is all it is.
    fn parse(pattern: &str) -> Option<Self> {
        let plain = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
        pattern
            .split('|')
            .map(|branch| {
                let (start, rest) = match branch.strip_prefix('^') {
                    Some(rest) => (true, rest),
                    None => (false, branch),
                };
                let (end, text) = match rest.strip_suffix('$') {
                    Some(text) => (true, text),
                    None => (false, rest),
                };
                text.chars().all(plain).then(|| Literal {
                    text: text.to_string(),
                    start,
                    end,
                })
            })
            .collect::<Option<Vec<_>>>()
            .map(Self)
    }

    fn is_match(&self, tool: &str) -> bool {
        self.0.iter().any(|l| match (l.start, l.end) {
            (true, true) => tool == l.text,
            (true, false) => tool.starts_with(&l.text),
            (false, true) => tool.ends_with(&l.text),
            (false, false) => tool.contains(&l.text),
        })
    }
}

impl Matcher {
    fn new(pattern: &str) -> Self {
        Self {
            pattern: pattern.into(),
            literals: Literals::parse(pattern),
            compiled: Arc::default(),
        }
    }

    fn is_match(&self, tool: &str) -> bool {
        if let Some(literals) = &self.literals {
            return literals.is_match(tool);
        }
        let compiled = self.compiled.get_or_init(|| {
            regex::Regex::new(&self.pattern)
                .inspect_err(|e| {
                    tracing::warn!(
                        matcher = %self.pattern,
                        "hook matcher does not compile ({e}); it matches every tool"
                    );
                })
                .ok()
        });
        compiled.as_ref().is_none_or(|re| re.is_match(tool))
    }
}

impl HookEntry {
    /// A stable name for messages and events: `before_tool[0]` for the
    /// manifest, `plugin NAME before_tool[0]` for a plugin.
    pub fn label(&self) -> String {
        match self.source.plugin() {
            None => format!("{}[{}]", self.event.as_str(), self.index),
            Some(p) => format!("plugin `{p}` {}[{}]", self.event.as_str(), self.index),
        }
    }

    /// Whether the hook applies to `tool`, however the agent spells it:
    /// Codex turns `-` in MCP tool and server names into `_`
    /// (`mcp__everything__get_env` for `get-env`), so a matcher written
    /// with the manifest's spelling also meets the dashed form.
    fn matches(&self, tool: Option<&str>) -> bool {
        match (&self.matcher, tool) {
            (Some(m), Some(tool)) => {
                m.is_match(tool)
                    || (tool.contains('_') && m.is_match(&crate::model::pattern::dashed(tool)))
            }
            _ => true,
        }
    }
}

/// Every hook npc runs, per event, in order: the manifest's first, then each
/// plugin's in the order the sources were given (the plugin discovery order),
/// each source's hooks in declaration order.
#[derive(Debug, Clone, Default)]
pub struct HookSet {
    /// The repository root: manifest hooks run here and relative programs
    /// with a slash (`./hooks/x`) resolve against it.
    root: PathBuf,
    entries: BTreeMap<HookEvent, Vec<HookEntry>>,
}

impl HookSet {
    /// The set of `sources`, in the order given; matchers compile when
    /// first used ([`Matcher`]).
    pub fn build(root: &Path, sources: &[SourceHooks]) -> Self {
        let mut entries: BTreeMap<HookEvent, Vec<HookEntry>> = BTreeMap::new();
        for source in sources {
            for (event, hooks) in &source.hooks {
                for (index, hook) in hooks.iter().enumerate() {
                    let matcher = hook.matcher.as_deref().map(Matcher::new);
                    entries.entry(*event).or_default().push(HookEntry {
                        event: *event,
                        source: source.source.clone(),
                        index,
                        hook: hook.clone(),
                        matcher,
                    });
                }
            }
        }
        Self {
            root: root.to_path_buf(),
            entries,
        }
    }

    /// The manifest's hooks alone.
    pub fn from_manifest(root: &Path, manifest: &Manifest) -> Self {
        Self::build(
            root,
            &[SourceHooks {
                source: HookSource::Manifest,
                hooks: manifest.hooks.clone(),
            }],
        )
    }

    /// Every hook that runs for the repository at `root`: the manifest's,
    /// then each enabled plugin's in discovery order
    /// ([`Manifest::plugin_parts`]: the manifest's plugins, then the user
    /// registry's, each by name). The one place that lists the sources:
    /// every runner (gateway, daemon, `npc run`, triggered runs, `npc hook
    /// run`) builds its set here.
    pub fn for_repository(root: &Path, manifest: &Manifest) -> Self {
        let mut sources = vec![SourceHooks {
            source: HookSource::Manifest,
            hooks: manifest.hooks.clone(),
        }];
        sources.extend(
            manifest
                .plugin_parts()
                .into_iter()
                .map(|(name, parts)| SourceHooks {
                    source: HookSource::Plugin {
                        name: name.to_string(),
                        root: parts.root.clone(),
                        data: parts.data.clone(),
                    },
                    hooks: parts.hooks.clone(),
                }),
        );
        Self::build(root, &sources)
    }

    /// The hooks of `event` that apply to `tool` (every hook of a non-tool event).
    pub fn matching<'a>(
        &'a self,
        event: HookEvent,
        tool: Option<&'a str>,
    ) -> impl Iterator<Item = &'a HookEntry> + 'a {
        self.entries
            .get(&event)
            .into_iter()
            .flatten()
            .filter(move |e| e.matches(tool))
    }

    /// Whether any hook of `event` is declared.
    pub fn has(&self, event: HookEvent) -> bool {
        self.entries.get(&event).is_some_and(|e| !e.is_empty())
    }

    /// Number of hooks in the set.
    pub fn len(&self) -> usize {
        self.entries.values().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn root(&self) -> &Path {
        &self.root
    }
}

/// A tool call as hooks see it (`payload.tool_call`); also the call an
/// approval question carries, hence defined with the approval socket's
/// wire types.
pub use crate::surfaces::approval::ToolCallInfo;

/// A tool's result as `after_tool` hooks see it (`payload.result`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolResultInfo {
    pub call_id: String,
    pub tool_name: String,
    pub output: String,
    pub is_error: bool,
}

/// What the `before_tool` hooks decided together.
#[derive(Debug, Clone, PartialEq)]
pub enum BeforeTool {
    /// Every hook let the call through; `arguments` is set when one or more
    /// rewrote them (the last rewrite, built on the ones before it).
    Continue { arguments: Option<Value> },
    /// A hook denied the call (the first deny wins; later hooks do not run).
    Deny { hook: String, reason: String },
}

/// What the `after_tool` hooks made of a result (each sees the previous one's).
#[derive(Debug, Clone, PartialEq)]
pub struct AfterTool {
    pub output: Option<String>,
    pub is_error: Option<bool>,
}

/// A tool call a `before_tool` hook wants the user to approve (the
/// approval socket's wire type).
pub use crate::surfaces::approval::ApprovalRequest;

/// The user's answer to an [`ApprovalRequest`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Approval {
    Allow,
    Deny { reason: String },
}

/// Who answers a hook's `ask`: the one way a user approves tool calls of
/// any agent CLI (`npc acp` forwards it to the editor as
/// `session/request_permission`). Every failure to get an answer must be a
/// [`Approval::Deny`] (fail closed).
pub trait Approve: std::fmt::Debug + Send + Sync {
    fn approve(&self, request: ApprovalRequest) -> futures_util::future::BoxFuture<'_, Approval>;

    /// Whether a denial it answers is already recorded (`tool.denied`, by
    /// `approval`): the approvers that park a run record their own, with
    /// the run they park; the runner records every other one, so each
    /// denial is one event.
    fn records_denials(&self) -> bool {
        false
    }
}

/// Who the tool calls of one gateway session ask, and the profile policy of
/// the agent behind it. The daemon's gateway shares one runner among all its
/// sessions, so the runner has neither of its own; the `npc mcp serve` in
/// front of the daemon names them (the `npc acp` its agent belongs to, the
/// agent's profile), and the session runs its calls inside
/// [`SessionAsking::scope`]. The runner's own approver and policy, when set,
/// come first.
#[derive(Debug, Clone, Default)]
pub struct SessionAsking {
    pub approver: Option<Arc<dyn Approve>>,
    pub policy: Option<Arc<policy::ToolPolicy>>,
}

tokio::task_local! {
    static SESSION_ASKING: SessionAsking;
}

impl SessionAsking {
    /// Run `work` with this asking in effect for every hook decision made
    /// while it is polled.
    pub async fn scope<F: std::future::Future>(self, work: F) -> F::Output {
        SESSION_ASKING.scope(self, work).await
    }

    fn current() -> Option<Self> {
        SESSION_ASKING.try_with(Clone::clone).ok()
    }
}

/// Why a tool call a hook asks about is denied when the runner has no [`Approve`]r.
pub const NO_APPROVER_REASON: &str = "a hook asks for the user's approval of this tool call and nobody can be asked; run the agent through `npc acp` (an editor answers) or change the hook";

/// A hook failed (launch failure, non-zero exit, timeout, invalid output):
/// what it guarded stops — fail closed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "hook {hook} failed: {error}; fix the hook or remove it from the manifest (hooks fail closed, so what it guards is stopped)"
)]
pub struct HookFailure {
    /// The failing hook's [`HookEntry::label`].
    pub hook: String,
    pub error: HookError,
}

/// The decision of one hook call, as recorded.
use crate::event::HookDecision as Recorded;
use crate::event::{DeniedBy, Event, HookCall, ToolDenied};

/// Events a runner keeps instead of publishing them: a sandboxed run's
/// `npc hook run`, which cannot write the store, sends them to the run's
/// owner (`surfaces::channel`).
pub type Collected = Arc<std::sync::Mutex<Vec<Event>>>;

/// Runs the hooks of the current [`HookSet`] (swapped live by [`HookRunner::replace`]).
#[derive(Debug)]
pub struct HookRunner {
    set: ArcSwap<HookSet>,
    supervisor: Supervisor,
    bus: Option<EventBus>,
    /// Where records go instead of `bus` ([`HookRunner::collecting`]).
    collected: Option<Collected>,
    /// Who answers `ask` decisions; `None` denies them.
    approver: Option<Arc<dyn Approve>>,
    /// The profile's `ask_tools`, applied after the `before_tool` hooks.
    policy: Option<policy::ToolPolicy>,
    /// Who this runner is when it applies a profile's tool rules (the
    /// gateway, or the hook bridge `npc hook run`): a `tool.denied`'s `by`.
    site: DeniedBy,
    /// The run whose agent makes the calls, when the runner serves one run
    /// (`npc hook run`); else the gateway session's ([`crate::mcp::call::current_run`]).
    run: Option<String>,
}

impl HookRunner {
    /// A runner spawning through `supervisor` and recording on `bus` (when given).
    pub fn new(set: HookSet, supervisor: Supervisor, bus: Option<EventBus>) -> Self {
        Self {
            set: ArcSwap::from_pointee(set),
            supervisor,
            bus,
            collected: None,
            approver: None,
            policy: None,
            site: DeniedBy::Gateway,
            run: None,
        }
    }

    /// Record denials as made by `site` for run `run` (`npc hook run`:
    /// [`DeniedBy::Hook`] and the run in its environment).
    pub fn for_site(mut self, site: DeniedBy, run: Option<String>) -> Self {
        self.site = site;
        self.run = run;
        self
    }

    /// Keep every record in `collected` instead of publishing it.
    pub fn collecting(mut self, collected: Collected) -> Self {
        self.collected = Some(collected);
        self
    }

    /// Ask `approver` when a `before_tool` hook answers `ask`.
    pub fn with_approver(mut self, approver: Arc<dyn Approve>) -> Self {
        self.approver = Some(approver);
        self
    }

    /// Ask about the calls `policy` matches too (see [`policy`]).
    pub fn with_policy(mut self, policy: policy::ToolPolicy) -> Self {
        self.policy = Some(policy);
        self
    }

    /// Whether a `before_tool` call of tool `name` may do anything: a hook
    /// matches it or the profile's policy may ask about it.
    pub fn guards_tool(&self, name: &str) -> bool {
        self.set()
            .matching(HookEvent::BeforeTool, Some(name))
            .next()
            .is_some()
            || self
                .policy
                .as_ref()
                .is_some_and(|p| p.may_ask(name) || p.may_refuse())
            || SessionAsking::current()
                .and_then(|s| s.policy)
                .is_some_and(|p| p.may_ask(name) || p.may_refuse())
    }

    /// Whether the profile's policy (the runner's, else the session's) lets
    /// the agent call tool `name` at all (a tool search lists only those).
    pub fn permits(&self, name: &str) -> bool {
        let session = SessionAsking::current().and_then(|s| s.policy);
        self.policy
            .as_ref()
            .or(session.as_deref())
            .is_none_or(|p| p.permits(name))
    }

    /// The user's answer to `request` from the approver; without one, a
    /// denial with `no_approver` as the reason.
    /// Ask the approver; the answer, and whether a denial still needs
    /// recording (see [`Approve::records_denials`]).
    async fn ask_user(&self, request: ApprovalRequest, no_approver: String) -> (Approval, bool) {
        let approver = self
            .approver
            .clone()
            .or_else(|| SessionAsking::current().and_then(|s| s.approver));
        match &approver {
            Some(approver) => (approver.approve(request).await, !approver.records_denials()),
            None => (
                Approval::Deny {
                    reason: no_approver,
                },
                true,
            ),
        }
    }

    /// Use `set` from the next call on (calls in flight finish with the old one).
    pub fn replace(&self, set: HookSet) {
        self.set.store(Arc::new(set));
    }

    /// The set used now.
    pub fn set(&self) -> Arc<HookSet> {
        self.set.load_full()
    }

    /// Run the `before_tool` hooks matching `call.name`, chaining rewrites.
    pub async fn before_tool(&self, call: &ToolCallInfo) -> Result<BeforeTool, HookFailure> {
        // The profile's `denied_tools` / `allowed_tools` first: a refused
        // call runs no hook.
        let session = SessionAsking::current().and_then(|s| s.policy);
        // The hook bridge sees an agent CLI's own tools: `denied_tools`
        // apply; the MCP allow-list is the gateway's, under its names.
        let bridge = self.site == DeniedBy::Hook;
        if let Some(policy) = self.policy.as_ref().or(session.as_deref())
            && let Some((rule, reason)) = if bridge {
                policy.denial(call)
            } else {
                policy.refusal(call)
            }
        {
            let label = format!("profile `{}` tools", policy.profile());
            self.denied(Some(policy.profile()), &call.name, rule, self.site, &reason)
                .await;
            self.publish(HookCall {
                event: HookEvent::BeforeTool.as_str().to_string(),
                hook: label.clone(),
                profile: Some(policy.profile().to_string()),
                tool: Some(call.name.clone()),
                decision: Recorded::Deny,
                detail: Some(reason.clone()),
                duration_ms: 0.0,
                ..HookCall::default()
            })
            .await;
            return Ok(BeforeTool::Deny {
                hook: label,
                reason,
            });
        }
        let set = self.set();
        let mut arguments = call.arguments.clone();
        let mut rewritten = false;
        let mut asked = false;
        for entry in set.matching(HookEvent::BeforeTool, Some(&call.name)) {
            let payload = json!({ "tool_call": { "id": call.id, "name": call.name, "arguments": arguments } });
            let started = Instant::now();
            let answer = self
                .call(&set, entry, payload)
                .await
                .and_then(exec::before_tool_answer);
            match answer {
                Err(error) => {
                    return Err(self.failed(entry, Some(&call.name), started, error).await);
                }
                Ok(exec::BeforeAnswer::Continue) => {
                    self.record(entry, Some(&call.name), Recorded::Continue, started, None)
                        .await;
                }
                Ok(exec::BeforeAnswer::Rewrite { arguments: new }) => {
                    self.record(entry, Some(&call.name), Recorded::Rewrite, started, None)
                        .await;
                    arguments = Value::Object(new);
                    rewritten = true;
                }
                Ok(exec::BeforeAnswer::Ask { reason }) => {
                    let request = ApprovalRequest {
                        hook: entry.label(),
                        reason,
                        tool_call: ToolCallInfo {
                            arguments: arguments.clone(),
                            ..call.clone()
                        },
                    };
                    asked = true;
                    let (approval, record) =
                        self.ask_user(request, NO_APPROVER_REASON.to_string()).await;
                    let detail = match &approval {
                        Approval::Allow => "allowed by the user".to_string(),
                        Approval::Deny { reason } => format!("denied: {reason}"),
                    };
                    self.record(
                        entry,
                        Some(&call.name),
                        Recorded::Ask,
                        started,
                        Some(&detail),
                    )
                    .await;
                    if let Approval::Deny { reason } = approval {
                        if record {
                            self.denied(
                                None,
                                &call.name,
                                entry.label(),
                                DeniedBy::Approval,
                                &reason,
                            )
                            .await;
                        }
                        return Ok(BeforeTool::Deny {
                            hook: entry.label(),
                            reason,
                        });
                    }
                }
                Ok(exec::BeforeAnswer::Deny { reason }) => {
                    self.record(
                        entry,
                        Some(&call.name),
                        Recorded::Deny,
                        started,
                        Some(&reason),
                    )
                    .await;
                    self.denied(None, &call.name, entry.label(), DeniedBy::Hook, &reason)
                        .await;
                    return Ok(BeforeTool::Deny {
                        hook: entry.label(),
                        reason,
                    });
                }
            }
        }
        // The profile's policy, on the arguments the hooks left, unless a
        // hook already asked the user about this call.
        let call = ToolCallInfo {
            arguments,
            ..call.clone()
        };
        let session_policy = SessionAsking::current().and_then(|s| s.policy);
        if !asked
            && let Some(policy) = self.policy.as_ref().or(session_policy.as_deref())
            && let Some(pattern) = policy.asks(&call)
        {
            let started = Instant::now();
            let label = format!("profile `{}` ask_tools", policy.profile());
            let request = ApprovalRequest {
                hook: label.clone(),
                reason: Some(format!(
                    "the profile asks before calls matching `{}`",
                    pattern.as_str()
                )),
                tool_call: call.clone(),
            };
            let no_approver = format!(
                "profile `{}` asks for the user's approval of calls matching `{}` (`ask_tools`) and nobody can be asked; run the agent through `npc acp` (an editor answers) or change `ask_tools`",
                policy.profile(),
                pattern.as_str()
            );
            let (approval, record) = self.ask_user(request, no_approver).await;
            let detail = match &approval {
                Approval::Allow => "allowed by the user".to_string(),
                Approval::Deny { reason } => format!("denied: {reason}"),
            };
            self.publish(HookCall {
                event: HookEvent::BeforeTool.as_str().to_string(),
                hook: label.clone(),
                profile: Some(policy.profile().to_string()),
                pattern: Some(pattern.as_str().to_string()),
                tool: Some(call.name.clone()),
                decision: Recorded::Ask,
                detail: Some(detail),
                duration_ms: millis(started.elapsed()),
                ..HookCall::default()
            })
            .await;
            if let Approval::Deny { reason } = approval {
                if record {
                    self.denied(
                        Some(policy.profile()),
                        &call.name,
                        pattern.as_str().to_string(),
                        DeniedBy::Approval,
                        &reason,
                    )
                    .await;
                }
                return Ok(BeforeTool::Deny {
                    hook: label,
                    reason,
                });
            }
        }
        Ok(BeforeTool::Continue {
            arguments: rewritten.then_some(call.arguments),
        })
    }

    /// Run the `after_tool` hooks matching `call.name`; each sees the result
    /// the previous one left.
    pub async fn after_tool(
        &self,
        call: &ToolCallInfo,
        result: &ToolResultInfo,
    ) -> Result<AfterTool, HookFailure> {
        let set = self.set();
        let mut current = result.clone();
        let mut changed = AfterTool {
            output: None,
            is_error: None,
        };
        for entry in set.matching(HookEvent::AfterTool, Some(&call.name)) {
            let payload = after_tool_payload(call, &current);
            let started = Instant::now();
            match self
                .call(&set, entry, payload)
                .await
                .and_then(exec::after_tool_answer)
            {
                Err(error) => {
                    return Err(self.failed(entry, Some(&call.name), started, error).await);
                }
                Ok(answer) => {
                    let replaced = answer.output.is_some() || answer.is_error.is_some();
                    if let Some(output) = answer.output {
                        current.output = output.clone();
                        changed.output = Some(output);
                    }
                    if let Some(is_error) = answer.is_error {
                        current.is_error = is_error;
                        changed.is_error = Some(is_error);
                    }
                    let decision = if replaced {
                        Recorded::Replace
                    } else {
                        Recorded::Continue
                    };
                    self.record(entry, Some(&call.name), decision, started, None)
                        .await;
                }
            }
        }
        Ok(changed)
    }

    /// Run the hooks of an observing event (`on_agent_start`, `before_model`,
    /// `after_model`, `on_error`, `on_agent_end`) with `payload`. The first
    /// failure stops the chain and is returned, except for the best-effort
    /// observers (`on_error`, `on_agent_end`): their failures are recorded,
    /// every hook runs, and the result is `Ok`.
    pub async fn observe(&self, event: HookEvent, payload: Value) -> Result<(), HookFailure> {
        let set = self.set();
        for entry in set.matching(event, None) {
            let started = Instant::now();
            match self
                .call(&set, entry, payload.clone())
                .await
                .and_then(exec::observer_answer)
            {
                Ok(()) => {
                    self.record(entry, None, Recorded::Observe, started, None)
                        .await
                }
                Err(error) => {
                    let failure = self.failed(entry, None, started, error).await;
                    if !event.is_best_effort() {
                        return Err(failure);
                    }
                    tracing::warn!("{failure}");
                }
            }
        }
        Ok(())
    }

    /// Run one hook with `payload` and return its parsed stdout (`None` when empty).
    async fn call(
        &self,
        set: &HookSet,
        entry: &HookEntry,
        payload: Value,
    ) -> Result<Option<Map<String, Value>>, HookError> {
        let envelope = json!({
            "version": PROTOCOL_VERSION,
            "event": entry.event.as_str(),
            "plugin": entry.source.plugin(),
            "payload": payload,
        });
        exec::run(&self.supervisor, &set.root, entry, &envelope).await
    }

    async fn failed(
        &self,
        entry: &HookEntry,
        tool: Option<&str>,
        started: Instant,
        error: HookError,
    ) -> HookFailure {
        let message = error.to_string();
        self.record(entry, tool, Recorded::Failed, started, Some(&message))
            .await;
        HookFailure {
            hook: entry.label(),
            error,
        }
    }

    async fn record(
        &self,
        entry: &HookEntry,
        tool: Option<&str>,
        decision: Recorded,
        started: Instant,
        detail: Option<&str>,
    ) {
        self.publish(HookCall {
            event: entry.event.as_str().to_string(),
            hook: entry.label(),
            index: Some(entry.index),
            plugin: entry.source.plugin().map(str::to_string),
            tool: tool.map(str::to_string),
            decision,
            detail: detail.map(str::to_string),
            duration_ms: millis(started.elapsed()),
            ..HookCall::default()
        })
        .await;
    }

    /// Record one `tool.denied`: the call of `tool` of the run this runner
    /// serves, denied by `rule` as applied by `by`. `profile` is the
    /// profile whose rule it is, else the profile the agent runs for.
    async fn denied(
        &self,
        profile: Option<&str>,
        tool: &str,
        rule: String,
        by: DeniedBy,
        reason: &str,
    ) {
        if self.bus.is_none() && self.collected.is_none() {
            return;
        }
        let session = SessionAsking::current().and_then(|s| s.policy);
        let profile = profile.map(str::to_string).or_else(|| {
            self.policy
                .as_ref()
                .or(session.as_deref())
                .map(|p| p.profile().to_string())
        });
        let run_id = self.run.clone().or_else(crate::mcp::call::current_run);
        let component = run_id.as_deref().map_or_else(
            || crate::plan::ComponentId::new(crate::plan::Kind::Hooks, "before_tool").to_string(),
            crate::store::queue::run_component,
        );
        let event = Event::ToolDenied(ToolDenied {
            run_id,
            profile,
            tool: tool.to_string(),
            rule,
            by,
            reason: Some(reason.to_string()),
        });
        self.keep(event, component).await;
    }

    /// Record one `hook.call` (its `event` names the component).
    async fn publish(&self, call: HookCall) {
        let component =
            crate::plan::ComponentId::new(crate::plan::Kind::Hooks, &call.event).to_string();
        self.keep(Event::HookCall(call), component).await;
    }

    /// Publish `event` of `component`, or keep it ([`HookRunner::collecting`]).
    async fn keep(&self, event: Event, component: String) {
        if let Some(collected) = &self.collected {
            crate::stdx::lock(collected).push(event);
            return;
        }
        let Some(bus) = &self.bus else { return };
        if let Err(e) = bus.publish(event.for_component(component)).await {
            tracing::warn!(error = %e, "hooks: recording an event failed");
        }
    }
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The `after_tool` payload, with `output` clipped so the envelope stays
/// within [`MAX_INPUT_BYTES`] (the clipped result says `output_truncated`).
fn after_tool_payload(call: &ToolCallInfo, result: &ToolResultInfo) -> Value {
    /// Room kept for the envelope, the call and JSON escaping of the rest.
    const ENVELOPE_ROOM: usize = 64 * 1024;
    let call_size = serde_json::to_string(&call.arguments).map_or(0, |s| s.len());
    // JSON escaping can grow a string up to 6× (`\u0000`); clip by the worst case.
    let budget = MAX_INPUT_BYTES.saturating_sub(ENVELOPE_ROOM + call_size) / 6;
    let mut result = serde_json::to_value(result).unwrap_or(Value::Null);
    if result["output"].as_str().is_some_and(|o| o.len() > budget) {
        let output = result["output"].as_str().unwrap_or_default();
        let cut = crate::model::source::floor_char_boundary(output, budget);
        result["output"] = Value::String(output[..cut].to_string());
        result["output_truncated"] = Value::Bool(true);
    }
    json!({
        "tool_call": { "id": call.id, "name": call.name, "arguments": call.arguments },
        "result": result,
    })
}
