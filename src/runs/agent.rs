//! An agent run: launch one profile's provider CLI
//! headless with a rendered prompt and the profile's MCP servers, read its
//! output with the provider's [`Parser`], hand every [`AgentEvent`] to the
//! caller (for the terminal) and to the event log (the [`EventBus`]), and
//! end with an [`Outcome`].
//!
//! A run is prepared ([`prepare`]: render the prompt once, write the MCP
//! configuration under `<state>/runs/<run-id>/`, build the launch plan and
//! the child's environment) and then executed ([`execute`]: spawn through
//! the [`Supervisor`], stream, and stop on exit, timeout or cancellation by
//! killing the child's whole process group). Every recorded event carries
//! the run id in its payload and the component `run.<id>`; the run is
//! bracketed by `run.started` and `run.finished`. A provider whose chain
//! has `probe_on_stale` (Gemini CLI) keeps its stdin open for the advisory
//! idle probe: after [`RunRequest::probe_after`] of silence outside an idle
//! state, a newline ([`PROBE_BYTES`]) goes to the agent once per silence,
//! recorded as `run.probe_sent`, then `run.probe_answered` when output
//! follows (`run.probe_failed` when stdin no longer takes it).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};

use super::trust::UntrustedWorkspace;
use super::{component, run_dir};

pub mod acp;
mod denials;
use crate::bus::{BusError, EventBus};
use crate::event::{
    AgentRunFinished, AgentRunNotStarted, AgentRunStarted, Concluded, DeniedBy, Event, RunDenial,
    RunFinished, RunProbeAnswered, RunProbeFailed, RunProbeSent, RunStarted, ToolDenied,
};
use crate::hooks::{HookFailure, HookRunner};
use crate::model::{HookEvent, Manifest, ProviderKind};
use crate::native::run_policy::RunPolicyText;
use crate::native::{self, NativeError, PlanOptions, Target};
use crate::providers::{
    self, AgentEvent, LaunchError, LaunchRequest, McpHandoff, Parser, RunMcp, RunPolicy,
};
use crate::render::{self, RenderContext, RenderError, RunInfo};
use crate::supervisor::{ChildSpec, ExitInfo, Supervisor, SupervisorError};
use crate::surfaces::approval::{APPROVAL_SESSION_ENV, APPROVAL_SOCKET_ENV};
use crate::surfaces::runs::{ApprovalRoute, ManualRun, Resume};

/// The run id every process of a run gets (`npc mcp serve` records its
/// calls with it).
pub const RUN_ID_ENV: &str = "NPC_RUN_ID";
/// Where a run's store is, relative to the state directory, when it is
/// not the repository's own (a fleet worker's `workers/NAME`): the run's
/// hooks park their asks there.
pub const RUN_STATE_ENV: &str = "NPC_RUN_STATE";
/// The repository a run's processes belong to (a worktree run's gateway
/// serves the repository's manifest).
pub const REPO_ROOT_ENV: &str = "NPC_REPO_ROOT";
/// The file of a Gemini CLI run's own policy (`--policy`), in the run's
/// directory.
pub const GEMINI_POLICY_FILE: &str = "gemini-policy.toml";
/// The variables a sandboxed run's gateway needs from the run (its
/// channel, its secret, its own `TMPDIR`), for the CLIs that pass an MCP
/// server only what its entry names.
pub const CHANNEL_VARS: [&str; 3] = [
    crate::surfaces::channel::SOCKET_ENV,
    crate::surfaces::channel::SECRET_ENV,
    "TMPDIR",
];
/// How long a run may take unless `--timeout` says otherwise.
pub const DEFAULT_RUN_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// After the agent exits, how long its output streams may take to close.
pub const POST_EXIT_DRAIN: Duration = Duration::from_secs(2);
/// Provider CLI authentication and configuration variables passed through
/// to the agent when set (on top of the supervisor's essentials). Their
/// values are never logged or recorded.
pub const AUTH_ENV: [&str; 9] = [
    "ANTHROPIC_API_KEY",
    "CLAUDE_CODE_OAUTH_TOKEN",
    "CLAUDE_CONFIG_DIR",
    "OPENAI_API_KEY",
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "CODEX_HOME",
    "XDG_CONFIG_HOME",
];
/// How long an ACP agent whose conversation is over may take to exit
/// after SIGTERM (saving its session) before its process group is killed.
pub const ACP_STOP_GRACE: Duration = Duration::from_secs(3);
/// Exit status of `npc run` when the run timed out (as `timeout(1)`).
pub const EXIT_TIMED_OUT: u8 = 124;
/// Exit status of `npc run` when a denial stopped something the agent
/// tried (the run is `blocked`).
pub const EXIT_BLOCKED: u8 = 3;
/// Most denials a run's outcome lists (the rest are still events).
pub const MAX_RUN_DENIALS: usize = 64;
/// Exit statuses after a signal are 128 plus the signal number.
pub const EXIT_SIGNAL_BASE: u8 = 128;
/// What the advisory idle probe writes to a stale agent's stdin (the seed's
/// "sends a newline and watches for a response").
pub const PROBE_BYTES: &[u8] = b"\n";
/// Longest a probe may wait for room in the agent's stdin pipe (an agent
/// that never reads it fills it eventually); after that probing stops.
pub const PROBE_WRITE_LIMIT: Duration = Duration::from_secs(1);

/// Why a run could not be prepared or executed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("no profile `{name}` in the manifest; known profiles: {known}")]
    UnknownProfile { name: String, known: String },
    #[error(
        "profile `{profile}` names provider `{provider}`, which the manifest does not define; run `npc validate` and fix the reference"
    )]
    UnknownProvider { profile: String, provider: String },
    #[error(
        "profile `{profile}` has no `prompt`; pass `--prompt TEXT` or `--prompt-template NAME`"
    )]
    NoPrompt { profile: String },
    #[error(
        "`--var` needs `--prompt-template NAME`; `--prompt` text and the profile's prompt take no variables"
    )]
    VarsWithoutTemplate,
    #[error(transparent)]
    Render(#[from] RenderError),
    #[error(
        "rendering the prompt and preparing the run took longer than {}s; look for loops over large ranges in the prompt template",
        deadline.as_secs()
    )]
    PrepareTimeout { deadline: Duration },
    #[error("preparing the run failed: {reason}; report this as a bug")]
    PrepareFailed { reason: String },
    #[error("working directory `{}` is not a directory; pass an existing `--cwd`", path.display())]
    BadCwd { path: PathBuf },
    #[error("cannot write the run's MCP configuration: {0}")]
    Native(#[from] NativeError),
    #[error("cannot create `{}`: {source}; check the state directory's permissions", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "`{}` does not declare the MCP servers `{missing}` of this run; Gemini CLI takes a run's servers only from the workspace settings (it reads a settings file named by a variable only when root owns it and every directory above it), so run `npc apply` in this directory first",
        path.display()
    )]
    WorkspaceSettings { path: PathBuf, missing: String },
    #[error(transparent)]
    Launch(#[from] LaunchError),
    #[error("cannot start the agent: {0}")]
    Spawn(#[from] SupervisorError),
    #[error("cannot record the run in the event log: {0}")]
    Record(#[from] BusError),
    #[error("cannot record the run in the run queue: {0}")]
    Queue(#[from] crate::store::StoreError),
    #[error("the run did not start: {0}")]
    Hook(#[from] HookFailure),
    #[error("the run did not start: {0}")]
    Untrusted(#[from] UntrustedWorkspace),
    #[error(
        "profile `{profile}` rules on Codex's own tools (`{pattern}`), and Codex over ACP asks npc about none of its own tool calls, so the rule could not be enforced; use `driver = \"headless\"` for this provider (with the project's hooks reviewed), or keep the profile's rules to MCP tools (`mcp__…`)"
    )]
    AcpUnenforceable { profile: String, pattern: String },
}

/// Where the task prompt comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptChoice {
    /// `--prompt TEXT`, used as written.
    Literal { text: String },
    /// `--prompt-template NAME` rendered with `--var`s.
    Template {
        name: String,
        vars: BTreeMap<String, String>,
    },
    /// The profile's own `prompt`, rendered with its defaults.
    Profile,
}

impl PromptChoice {
    /// The choice as a run request's wire form, for profile `profile`.
    pub fn manual_run(&self, profile: &str) -> ManualRun {
        let mut run = ManualRun {
            profile: profile.to_string(),
            prompt: None,
            prompt_template: None,
            vars: BTreeMap::new(),
            workspace: None,
            provider: None,
        };
        match self {
            Self::Literal { text } => run.prompt = Some(text.clone()),
            Self::Template { name, vars } => {
                run.prompt_template = Some(name.clone());
                run.vars = vars.clone();
            }
            Self::Profile => {}
        }
        run
    }
}

/// What the caller asks of one run.
#[derive(Debug, Clone)]
pub struct RunRequest {
    pub profile: String,
    pub prompt: PromptChoice,
    pub timeout: Duration,
    /// Where the agent runs (e.g. a worktree); the repository root when `None`.
    pub cwd: Option<PathBuf>,
    /// Silence after which a provider with `probe_on_stale` is probed
    /// ([`providers::STALE_AFTER`] by default).
    pub probe_after: Duration,
    /// The trigger that started the run, if one did.
    pub trigger: Option<TriggeredBy>,
    /// Another `[providers.NAME]` than the profile's (`npc run --provider`):
    /// the same profile with another CLI.
    pub provider: Option<String>,
}

/// The trigger behind a run: its name (`run.trigger` in a template) and
/// its payload (the template value `trigger`, looked up leniently).
#[derive(Debug, Clone, PartialEq)]
pub struct TriggeredBy {
    pub name: String,
    pub payload: serde_json::Value,
}

/// A run ready to start: everything [`execute`] needs.
#[derive(Debug, Clone)]
pub struct PreparedRun {
    pub id: String,
    pub profile: String,
    pub provider: String,
    pub kind: ProviderKind,
    /// The rendered task prompt.
    pub prompt: String,
    /// The child to spawn (exposed values; never log `args` or `env`).
    pub spec: ChildSpec,
    /// The repository root: the tools' working directory.
    pub tool_cwd: PathBuf,
    /// The MCP configuration file passed to the agent, if any.
    pub mcp_config: Option<PathBuf>,
    pub timeout: Duration,
    /// See [`RunRequest::probe_after`].
    pub probe_after: Duration,
    /// Things the user should know (printed on stderr, not recorded as errors).
    pub warnings: Vec<String>,
    /// Who started the run when the CLI did not (`acp`): recorded as its
    /// `run.started` event's `source`, which the run listings show.
    pub source: Option<&'static str>,
    /// A worktree run's end: its changes committed and measured before
    /// `run.finished`, which carries the result.
    pub conclusion: Option<super::workspace::Conclusion>,
    /// The profile's `denied_tools` then `ask_tools`: the rules a refusal
    /// by the CLI names (`tool.denied`, [`denials::CliDenials`]).
    pub refusing_rules: Vec<String>,
    /// A worktree run that changed nothing fails (`expect_changes = true`).
    pub expect_changes: bool,
    /// What trusts the run's worktree for its agent CLI before it starts
    /// (a worktree npc made; `None` in place).
    pub trust: Option<super::trust::TrustPlan>,
    /// A provider of `driver = "acp"`: the conversation to hold with its
    /// ACP program (`spec`), instead of parsing a headless stream.
    pub acp: Option<acp::AcpRun>,
}

impl PreparedRun {
    /// Give the run what a local front end adds (a prompt of `npc acp`):
    /// the provider's resume arguments in their place and the approval
    /// route's two variables. The one place every path (in process and in
    /// the daemon) does it.
    pub fn apply_local(&mut self, resume: Option<&Resume>, route: Option<&ApprovalRoute>) {
        match (resume, &mut self.acp) {
            // An ACP agent continues its session over the protocol
            // (`session/resume` or `session/load`, where it offers one).
            (Some(r), Some(acp)) => acp.start.resume = Some(r.session.clone()),
            (Some(r), None) => {
                let extra = providers::resume::args(self.kind, &r.session, r.fork);
                if extra.is_empty() {
                    self.warnings.push(format!(
                        "{} run headless cannot continue an earlier conversation; this run starts a new one (`driver = \"acp\"` continues it where the agent can)",
                        self.kind.as_str()
                    ));
                }
                let at = providers::resume::position(self.kind, &self.spec.args);
                self.spec.args.splice(at..at, extra);
            }
            (None, _) => {}
        }
        if let Some(route) = route {
            self.spec
                .env
                .insert(APPROVAL_SOCKET_ENV.to_string(), route.socket.clone());
            self.spec
                .env
                .insert(APPROVAL_SESSION_ENV.to_string(), route.session.clone());
        }
    }
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    /// The agent exited 0, did not report a failed turn, and nothing it
    /// tried was denied.
    Succeeded,
    /// The agent ended its turn, but a policy or permission denial stopped
    /// something it tried: `tool.denied` events of the run and the refusals
    /// the agent CLI reported, oldest first (at most [`MAX_RUN_DENIALS`]).
    Blocked { denials: Vec<RunDenial> },
    /// A worktree run of `expect_changes = true` changed no file.
    NoChanges,
    /// The agent exited non-zero, was killed, or reported a failed turn.
    Failed { exit: ExitInfo },
    /// The run outlived its timeout; the process group was killed.
    TimedOut,
    /// The run was cancelled by `signal` (SIGINT, SIGTERM); the process
    /// group was killed.
    Cancelled { signal: i32 },
    /// A `before_model` / `after_model` hook failed (hooks fail closed); the
    /// process group was killed.
    HookFailed,
}

impl Outcome {
    /// The exit status `npc run` ends with.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Succeeded => 0,
            Self::Blocked { .. } => EXIT_BLOCKED,
            Self::Failed { .. } | Self::HookFailed | Self::NoChanges => 1,
            Self::TimedOut => EXIT_TIMED_OUT,
            Self::Cancelled { signal } => {
                EXIT_SIGNAL_BASE.saturating_add(u8::try_from(*signal).unwrap_or(0))
            }
        }
    }

    /// The run's outcome (`run.finished`'s `outcome`): its stored state but
    /// for `hook_failed` (stored `failed`).
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Succeeded => "succeeded",
            Self::Blocked { .. } => "blocked",
            Self::Failed { .. } | Self::NoChanges => "failed",
            Self::TimedOut => "timed_out",
            Self::Cancelled { .. } => "cancelled",
            Self::HookFailed => "hook_failed",
        }
    }

    /// Why it ended as it did, as a word (`run.finished`'s `reason`).
    pub fn reason(&self) -> Option<&'static str> {
        match self {
            Self::Succeeded => None,
            Self::Blocked { .. } => Some("denied"),
            Self::NoChanges => Some("no_changes"),
            Self::Failed { .. } => Some("exit_status"),
            Self::TimedOut => Some("timeout"),
            Self::Cancelled { .. } => Some("signal"),
            Self::HookFailed => Some("hook"),
        }
    }
}

/// A `blocked` run's denials in words, for its stored detail and its
/// error (`` `Bash` denied by cli (permission_denials) ``), at most
/// [`MAX_DENIALS_IN_WORDS`] of them.
pub fn denials_in_words(denials: &[RunDenial]) -> String {
    let by = |b: DeniedBy| {
        serde_json::to_value(b)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default()
    };
    let mut words: Vec<String> = denials
        .iter()
        .take(MAX_DENIALS_IN_WORDS)
        .map(|d| format!("`{}` denied by {} ({})", d.tool, by(d.by), d.rule))
        .collect();
    if denials.len() > MAX_DENIALS_IN_WORDS {
        words.push(format!("{} more", denials.len() - MAX_DENIALS_IN_WORDS));
    }
    words.join(", ")
}

/// Most denials a run's detail names (the event lists all it keeps).
pub const MAX_DENIALS_IN_WORDS: usize = 5;

/// What [`execute`] reports at the end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunReport {
    pub outcome: Outcome,
    /// The agent's own exit status (killed by a signal after a timeout or
    /// cancellation).
    pub exit: ExitInfo,
    pub duration: Duration,
    /// Agent events read from the output (recorded and handed to the sink).
    pub events: usize,
    /// Why a hook stopped the run ([`Outcome::HookFailed`]).
    pub hook_error: Option<String>,
    /// Why an ACP conversation failed ([`Outcome::Failed`]): what the
    /// agent answered, or what it never sent.
    pub acp_error: Option<String>,
}

/// Longest [`prepare_blocking`] may take: rendering is bounded by its fuel
/// budget well before this (the daemon's reloads have the same deadline,
/// `runtime::LOAD_DEADLINE`).
pub const PREPARE_DEADLINE: Duration = Duration::from_secs(30);

/// [`prepare`] on a blocking thread, off the async executor, within
/// [`PREPARE_DEADLINE`]: while the prompt renders, the executor stays free
/// for the signal handlers, so Ctrl-C and SIGTERM still end the command.
pub async fn prepare_blocking(
    manifest: Manifest,
    root: PathBuf,
    req: RunRequest,
    id: String,
) -> Result<PreparedRun, RunError> {
    let work = tokio::task::spawn_blocking(move || prepare(&manifest, &root, &req, id));
    match tokio::time::timeout(PREPARE_DEADLINE, work).await {
        Ok(Ok(result)) => result,
        Ok(Err(e)) => Err(RunError::PrepareFailed {
            reason: e.to_string(),
        }),
        Err(_) => Err(RunError::PrepareTimeout {
            deadline: PREPARE_DEADLINE,
        }),
    }
}

/// Prepare run `req` of `manifest` (repository at `root`): render the
/// prompt with one [`RenderContext`], write the profile's MCP servers in
/// the provider's native format under the run's directory, and build the
/// child's launch plan and environment.
pub fn prepare(
    manifest: &Manifest,
    root: &Path,
    req: &RunRequest,
    id: String,
) -> Result<PreparedRun, RunError> {
    let profile = manifest
        .profiles
        .get(&req.profile)
        .ok_or_else(|| RunError::UnknownProfile {
            name: req.profile.clone(),
            known: crate::model::diagnostics::known_names(manifest.profiles.keys()),
        })?;
    let provider_name = req.provider.as_ref().unwrap_or(&profile.provider);
    let provider =
        manifest
            .providers
            .get(provider_name)
            .ok_or_else(|| RunError::UnknownProvider {
                profile: req.profile.clone(),
                provider: provider_name.clone(),
            })?;
    let cwd = match &req.cwd {
        None => root.to_path_buf(),
        Some(dir) => resolve_cwd(dir)?,
    };
    let mut ctx = RenderContext::new(root, manifest)
        .with_profile(req.profile.clone())
        .with_run(RunInfo {
            id: id.clone(),
            trigger: req.trigger.as_ref().map(|t| t.name.clone()),
            started_at: Some(chrono::Utc::now().to_rfc3339()),
        });
    if let Some(t) = &req.trigger {
        ctx = ctx.with_trigger(t.payload.clone());
    }
    let prompt = match &req.prompt {
        PromptChoice::Literal { text } => text.clone(),
        PromptChoice::Template { name, vars } => render::prompt(manifest, name, vars, &ctx)?,
        PromptChoice::Profile => {
            let name = profile.prompt.as_ref().ok_or_else(|| RunError::NoPrompt {
                profile: req.profile.clone(),
            })?;
            render::prompt(manifest, name, &BTreeMap::new(), &ctx)?
        }
    };
    let dir = run_dir(ctx.state_dir(), &id);
    let mut warnings = Vec::new();
    // What every process of the run knows of it, the gateway entry's `env`
    // included (Codex passes an MCP server no other variable).
    let run_env: BTreeMap<String, String> = [
        (RUN_ID_ENV, id.clone()),
        (crate::hooks::policy::PROFILE_ENV, req.profile.clone()),
        (REPO_ROOT_ENV, root.display().to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    if provider.driver == crate::model::ProviderDriver::Acp {
        if let Some(pattern) = acp::unenforceable(provider.kind, profile) {
            return Err(RunError::AcpUnenforceable {
                profile: req.profile.clone(),
                pattern: pattern.to_string(),
            });
        }
        let mcp_servers = match run_servers(manifest, profile, &run_env) {
            Some(only) => acp::mcp_entries(&only, &mut warnings),
            None => Vec::new(),
        };
        let mut env = auth_env();
        env.extend(acp::fixed_env(provider.kind, profile));
        env.extend(
            provider
                .env
                .iter()
                .map(|(k, v)| (k.clone(), v.expose().to_string())),
        );
        env.extend(run_env);
        let spec = ChildSpec::new(provider.command.clone(), cwd.clone())
            .args(provider.args.iter().map(|a| a.expose().to_string()));
        let spec = ChildSpec { env, ..spec };
        let start = crate::providers::acp::Start {
            cwd,
            prompt: prompt.clone(),
            mcp_servers,
            resume: None,
            mode: acp::mode_for(provider.kind),
            model: profile.model.as_ref().map(|m| m.expose().to_string()),
            tool_for_kind: acp::tool_for_kind(provider.kind),
        };
        return Ok(PreparedRun {
            acp: Some(acp::AcpRun {
                start,
                kind: provider.kind,
                policy: crate::hooks::policy::ToolPolicy::for_profile(manifest, &req.profile),
                manifest: std::sync::Arc::new(manifest.clone()),
                reach: None,
            }),
            ..prepared_run(
                req,
                profile,
                id,
                provider_name,
                provider.kind,
                prompt,
                spec,
                root,
                None,
                warnings,
            )
        });
    }
    let mcp_text = mcp_config_text(manifest, profile, provider.kind, &dir, &run_env)?;
    let model = profile.model.as_ref().map(|m| m.expose());
    let mut mcp_config = None;
    let plan = match (providers::mcp_handoff(provider.kind), &mcp_text) {
        (McpHandoff::Overrides, _) => {
            let run_config = mcp_text.as_ref().map(|(_, text)| text.as_str());
            let mut pairs = run_config
                .map(native::run::codex_overrides)
                .unwrap_or_default();
            let project_path = native::target_path(&cwd, &Target::project(provider.kind));
            let project = native::read_existing_in(&cwd, &project_path)?;
            let disabled = native::run::codex_disabled(project.as_deref(), run_config);
            warnings.extend(disabled.unreachable.iter().map(|name| {
                format!(
                    "`{}` declares the server `{}`, which Codex cannot be told to leave out of this run; rename it there",
                    project_path.display(),
                    crate::stdx::term::printable(name)
                )
            }));
            pairs.extend(disabled.pairs);
            // Codex hands a server only its entry's variables: a sandboxed
            // run's gateway reaches its owner over the channel these name
            // (names only: the values stay in the environment).
            if run_config.is_some() && manifest.mcp.gateway {
                pairs.push(format!(
                    "{}.{}.env_vars={}",
                    native::run::CODEX_SERVERS_KEY,
                    native::gateway::GATEWAY_ENTRY,
                    serde_json::json!(CHANNEL_VARS)
                ));
            }
            let mcp = (!pairs.is_empty()).then_some(RunMcp::Overrides { pairs: &pairs });
            launch(provider, &prompt, model, mcp)?
        }
        (_, None) => launch(provider, &prompt, model, None)?,
        (McpHandoff::File, Some((path, text))) => {
            let plan = launch(provider, &prompt, model, Some(RunMcp::File { path }))?;
            // The run's directory is in the state directory: npc's own
            // before anything is written there (else the state directory
            // would be made a mere parent, without its owner file).
            own_state_dir(root, ctx.state_dir())?;
            write_file(root, path, text)?;
            mcp_config = Some(path.clone());
            plan
        }
        (McpHandoff::WorkspaceSettings, Some((_, text))) => {
            let (workspace, differing) =
                workspace_settings(manifest, root, ctx.state_dir(), &cwd, provider.kind, text)?;
            warnings.extend(differing.iter().map(|name| {
                format!(
                    "`{}` declares the server `{}` with another program than the manifest, and Gemini CLI uses that one; run `npc apply` to write the manifest's",
                    workspace.display(),
                    crate::stdx::term::printable(name)
                )
            }));
            let names = native::run::gemini_names(text);
            let plan = launch(
                provider,
                &prompt,
                model,
                Some(RunMcp::Named { names: &names }),
            )?;
            mcp_config = Some(workspace);
            plan
        }
    };
    // The profile's tools, for this run only (`native::run_policy`).
    let plan = match native::run_policy::run_policy(manifest, &req.profile, profile, provider.kind)
    {
        None => plan,
        Some(RunPolicyText::ClaudeSettings { json }) => {
            plan.with_policy(RunPolicy::Settings { json: &json })
        }
        Some(RunPolicyText::OpencodePermission { json }) => {
            plan.with_policy(RunPolicy::PermissionEnv { json: &json })
        }
        Some(RunPolicyText::GeminiPolicy { toml }) => {
            let path = dir.join(GEMINI_POLICY_FILE);
            own_state_dir(root, ctx.state_dir())?;
            write_file(root, &path, &toml)?;
            plan.with_policy(RunPolicy::PolicyFile { path: &path })
        }
    };
    let mut env = auth_env();
    env.extend(
        plan.exposed_env()
            .map(|(k, v)| (k.to_string(), v.to_string())),
    );
    // Its processes (an `npc mcp serve` it starts) know the run, and its
    // hooks (`npc hook run`) apply the profile's `ask_tools`.
    env.extend(run_env);
    if provider.kind == ProviderKind::ClaudeCode
        && req.cwd.is_none()
        && let Some(warning) = super::trust::claude_in_place_warning(&env, &cwd)
    {
        warnings.push(warning);
    }
    let spec =
        ChildSpec::new(plan.program.clone(), cwd).args(plan.exposed_args().map(str::to_string));
    let spec = ChildSpec { env, ..spec };
    Ok(prepared_run(
        req,
        profile,
        id,
        provider_name,
        provider.kind,
        prompt,
        spec,
        root,
        mcp_config,
        warnings,
    ))
}

/// The provider CLIs' authentication variables that are set here
/// ([`AUTH_ENV`]).
fn auth_env() -> BTreeMap<String, String> {
    AUTH_ENV
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
        .collect()
}

/// A prepared run of either driver (a headless one: `acp` is `None`).
#[allow(clippy::too_many_arguments)]
fn prepared_run(
    req: &RunRequest,
    profile: &crate::model::Profile,
    id: String,
    provider_name: &str,
    kind: ProviderKind,
    prompt: String,
    spec: ChildSpec,
    root: &Path,
    mcp_config: Option<PathBuf>,
    warnings: Vec<String>,
) -> PreparedRun {
    PreparedRun {
        id,
        profile: req.profile.clone(),
        provider: provider_name.to_string(),
        kind,
        prompt,
        spec,
        tool_cwd: root.to_path_buf(),
        mcp_config,
        timeout: req.timeout,
        probe_after: req.probe_after,
        warnings,
        source: None,
        conclusion: None,
        refusing_rules: profile
            .denied_tools
            .iter()
            .chain(&profile.ask_tools)
            .cloned()
            .collect(),
        expect_changes: false,
        trust: None,
        acp: None,
    }
}

/// `dir` as an absolute, existing directory (relative to the current one).
pub fn resolve_cwd(dir: &Path) -> Result<PathBuf, RunError> {
    let dir = if dir.is_absolute() {
        dir.to_path_buf()
    } else {
        std::env::current_dir().unwrap_or_default().join(dir)
    };
    dir.canonicalize()
        .ok()
        .filter(|d| d.is_dir())
        .ok_or(RunError::BadCwd { path: dir })
}

fn launch(
    provider: &crate::model::Provider,
    prompt: &str,
    model: Option<&str>,
    mcp: Option<RunMcp<'_>>,
) -> Result<providers::LaunchPlan, LaunchError> {
    providers::launch_plan(provider, &LaunchRequest { prompt, model, mcp })
}

/// The workspace settings of `cwd` that hand a Gemini run its servers
/// (`wanted`, rendered for the run): they must declare every one of them.
/// A worktree of npc's own that lacks the file gets it; anywhere else a
/// missing entry fails the run (the user's file is the user's; `npc apply`
/// writes it), since Gemini reads no per-run file from a non-root user.
/// Also returns the servers the file declares with another program (the
/// run's warnings).
fn workspace_settings(
    manifest: &Manifest,
    root: &Path,
    state_dir: &Path,
    cwd: &Path,
    kind: ProviderKind,
    wanted: &str,
) -> Result<(PathBuf, Vec<String>), RunError> {
    let path = native::target_path(cwd, &Target::project(kind));
    let existing = native::read_existing_in(cwd, &path)?;
    let entries = native::run::gemini_entries(existing.as_deref(), wanted);
    if entries.missing.is_empty() {
        return Ok((path, entries.differing));
    }
    let worktrees = super::workspace::worktrees_root(root, state_dir, &manifest.runs);
    if existing.is_none() && cwd.starts_with(&worktrees) {
        write_file(cwd, &path, wanted)?;
        return Ok((path, Vec::new()));
    }
    Err(RunError::WorkspaceSettings {
        path,
        missing: entries.missing.join("`, `"),
    })
}

/// The native MCP configuration holding only `profile`'s servers, and
/// where it goes under `dir`; `None` when the profile names no server.
/// In gateway mode the entry carries the profile's tools and `run_env`
/// ([`native::gateway::for_run`]).
fn mcp_config_text(
    manifest: &Manifest,
    profile: &crate::model::Profile,
    kind: ProviderKind,
    dir: &Path,
    run_env: &BTreeMap<String, String>,
) -> Result<Option<(PathBuf, String)>, RunError> {
    let Some(only) = run_servers(manifest, profile, run_env) else {
        return Ok(None);
    };
    let path = native::target_path(dir, &Target::project(kind));
    let change = native::plan_text(
        path.clone(),
        kind,
        None,
        &only,
        &BTreeSet::new(),
        PlanOptions::default(),
        Default::default(),
    )?;
    if change.after.is_empty() {
        return Ok(None);
    }
    Ok(Some((path, change.after)))
}

/// The manifest whose servers a run of `profile` gets: in gateway mode
/// the gateway only (its calls pass npc's hooks and event log), never the
/// raw servers beside it; else the profile's servers. `None` when the
/// profile names no server.
fn run_servers(
    manifest: &Manifest,
    profile: &crate::model::Profile,
    run_env: &BTreeMap<String, String>,
) -> Option<Manifest> {
    let servers = &profile.mcp_servers;
    if servers.is_empty() {
        return None;
    }
    Some(if manifest.mcp.gateway {
        native::gateway::for_run(manifest, profile, run_env)
    } else {
        let mut only = manifest.clone();
        only.mcp_servers.retain(|name, _| servers.contains(name));
        only
    })
}

/// Make `state_dir` npc's own state directory in the repository `root`
/// ([`crate::repofs::Root::ensure_state_dir`]).
fn own_state_dir(root: &Path, state_dir: &Path) -> Result<(), RunError> {
    let io = |source| RunError::Io {
        path: state_dir.to_path_buf(),
        source,
    };
    crate::repofs::Root::new(root)
        .and_then(|guard| guard.ensure_state_dir(state_dir))
        .map_err(|e| io(e.into()))?;
    Ok(())
}

/// Write one of npc's own files under the repository `root` through the
/// guarded layer: private, never through a link.
fn write_file(root: &Path, path: &Path, text: &str) -> Result<(), RunError> {
    let io = |source| RunError::Io {
        path: path.to_path_buf(),
        source,
    };
    let guard = crate::repofs::Root::new(root).map_err(|e| io(e.into()))?;
    guard
        .write(path, text.as_bytes(), crate::repofs::WriteOptions::PRIVATE)
        .map_err(|e| io(e.into()))?;
    Ok(())
}

/// The recorded (and `--format json`) payload of an agent event: the event
/// with its `type`, plus the run id.
pub fn event_payload(run_id: &str, event: &AgentEvent) -> Value {
    if let AgentEvent::Denied { .. } = event {
        // Recorded as `tool.denied` (no `type`); printed as the others are.
        let mut v = serde_json::to_value(event).unwrap_or_default();
        v["run_id"] = run_id.into();
        return v;
    }
    event.clone().into_event(run_id).payload()
}

/// Start `run` through `supervisor` and stream it: every parsed event goes
/// to `sink` and is recorded on `bus`. The run stops when the agent exits,
/// when its timeout passes, or when `cancel` resolves (with the signal
/// number); the last two kill the child's process group.
///
/// `hooks` observe the run: `on_agent_start` and `before_model` (the task
/// prompt) before the agent starts — a failure there means it never starts
/// ([`RunError::Hook`]); `after_model` for each assistant message and
/// `before_model` for each tool result the agent feeds back, from the
/// parsed provider events — a failure kills the agent
/// ([`Outcome::HookFailed`]); then the best-effort `on_error` (a run that
/// did not succeed) and `on_agent_end`. Tool hooks are not run here: the
/// gateway and the agents' native hook bridges enforce them.
pub async fn execute<F>(
    run: &PreparedRun,
    supervisor: &Supervisor,
    bus: &EventBus,
    hooks: &HookRunner,
    mut sink: F,
    cancel: impl std::future::Future<Output = i32>,
) -> Result<RunReport, RunError>
where
    F: FnMut(&AgentEvent),
{
    let started = Instant::now();
    let component = component(&run.id);
    let record = |event: Event| bus.publish(event.for_component(component.clone()));
    let started_payload = AgentRunStarted {
        run_id: run.id.clone(),
        profile: run.profile.clone(),
        provider: run.provider.clone(),
        provider_kind: run.kind.as_str().to_string(),
        program: run.spec.program.clone(),
        cwd: run.spec.cwd.clone(),
        tool_cwd: run.tool_cwd.clone(),
        mcp_config: run.mcp_config.clone(),
        timeout_secs: run.timeout.as_secs(),
        prompt_chars: run.prompt.chars().count(),
        source: run.source.map(str::to_string),
        // What the run's starter prints (`npc run` follows the daemon's runs).
        warnings: run.warnings.clone(),
        sandbox: run.spec.sandbox.as_ref().map(|s| {
            match s.egress {
                Some(_) => "strict",
                None => "workspace",
            }
            .to_string()
        }),
    };
    // Denials recorded for this run from here on (by its hooks, its
    // gateway) are read back at its end.
    let since = {
        let store = bus.store().clone();
        tokio::task::spawn_blocking(move || store.last_event_id())
            .await
            .map_err(|e| RunError::PrepareFailed {
                reason: e.to_string(),
            })??
    };
    record(Event::RunStarted(RunStarted::Agent(started_payload))).await?;
    let not_started_because = |outcome: &str, error: &str, reason: Option<&str>| {
        Event::RunFinished(RunFinished::NotStarted(AgentRunNotStarted {
            run_id: run.id.clone(),
            outcome: outcome.to_string(),
            error: error.to_string(),
            reason: reason.map(str::to_string),
            duration_ms: millis(started.elapsed()),
            cwd: run.spec.cwd.clone(),
            tool_cwd: run.tool_cwd.clone(),
            cancelled: false,
        }))
    };
    let not_started = |outcome: &str, error: &str| not_started_because(outcome, error, None);
    let mut spec = run.spec.clone();
    if let Some(plan) = &run.trust {
        let plan = plan.clone();
        let mut trusted_spec = spec.clone();
        let established = tokio::task::spawn_blocking(move || {
            plan.establish(&mut trusted_spec).map(|_| trusted_spec)
        })
        .await
        .map_err(|e| RunError::PrepareFailed {
            reason: e.to_string(),
        })?;
        match established {
            Ok(trusted) => spec = trusted,
            Err(untrusted) => {
                let message = untrusted.to_string();
                record(not_started_because("failed", &message, Some(UNTRUSTED))).await?;
                end_hooks(hooks, run, Some(&message), "failed").await;
                return Err(untrusted.into());
            }
        }
    }
    let start_payload = json!({
        "messages": [{ "role": "user", "content": run.prompt }],
        "run_id": run.id,
        "profile": run.profile,
        "provider": run.provider,
    });
    let starting = match hooks
        .observe(HookEvent::OnAgentStart, start_payload.clone())
        .await
    {
        Ok(()) => hooks.observe(HookEvent::BeforeModel, start_payload).await,
        failed => failed,
    };
    if let Err(failure) = starting {
        let message = failure.to_string();
        record(not_started("hook_failed", &message)).await?;
        end_hooks(hooks, run, Some(&message), "hook_failed").await;
        return Err(failure.into());
    }
    let spawned = match &run.acp {
        Some(_) => supervisor.spawn_streaming_lines(&spec, crate::providers::acp::MAX_FRAME_BYTES),
        None => supervisor.spawn_streaming(&spec),
    };
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            let message = e.to_string();
            record(not_started("failed", &message)).await?;
            end_hooks(hooks, run, Some(&message), "failed").await;
            return Err(e.into());
        }
    };
    let mut model = ModelHooks::default();
    let mut hook_error: Option<String> = None;
    let mut parser = Parser::embedded(run.kind).with_stale_after(run.probe_after);
    // The agent reads nothing from npc but the advisory idle probe: for a
    // provider that is probed (`probe_on_stale`, Gemini CLI) stdin stays
    // open for it — Gemini stops waiting for piped input after 500 ms of
    // silence, so an open stdin does not hold it up; for every other
    // provider stdin closes at once (EOF, as `/dev/null` would give).
    // An ACP run's stdin carries the conversation.
    let mut conversation = run
        .acp
        .as_ref()
        .map(|plan| acp::Conversation::new(run, plan, supervisor, bus, hooks, child.stdin.take()));
    let mut probe_pipe = child.stdin.take().filter(|_| parser.probes());
    let mut probe = ProbeState::default();
    let killer = child.killer();
    let (_, empty_out) = tokio::sync::mpsc::channel(1);
    let (_, empty_err) = tokio::sync::mpsc::channel(1);
    let mut stdout = std::mem::replace(&mut child.stdout, empty_out);
    let mut stderr = std::mem::replace(&mut child.stderr, empty_err);
    let mut count = 0usize;
    let mut failed_turn = false;
    let mut cli_denials = denials::CliDenials::new(run.kind, run.refusing_rules.clone());
    // Refusals the agent CLI reported: recorded at the end, unless npc
    // recorded the same denial itself (its hook, its gateway).
    let mut refused: Vec<RunDenial> = Vec::new();
    let mut deliver = |events: Vec<AgentEvent>, count: &mut usize| {
        let mut pending = Vec::with_capacity(events.len());
        for e in events {
            if let AgentEvent::Idle { is_error, .. } = &e {
                failed_turn = *is_error;
            }
            cli_denials.remember(&e);
            sink(&e);
            *count += 1;
            if let AgentEvent::Denied {
                id, tool, reason, ..
            } = e
            {
                if refused.len() < MAX_RUN_DENIALS {
                    refused.push(cli_denials.denial(id.as_deref(), &tool, reason.as_deref()));
                }
                continue;
            }
            pending.push(record(e.into_event(&run.id)));
        }
        pending
    };
    let timeout = tokio::time::sleep(run.timeout);
    tokio::pin!(timeout);
    tokio::pin!(cancel);
    let wait = child.wait();
    tokio::pin!(wait);
    let mut stop: Option<Outcome> = None;
    let mut exit: Option<ExitInfo> = None;
    let (mut out_open, mut err_open) = (true, true);
    let drain = tokio::time::sleep(run.timeout.saturating_add(POST_EXIT_DRAIN));
    tokio::pin!(drain);
    let probe_timer = tokio::time::sleep(run.timeout);
    tokio::pin!(probe_timer);
    // An ACP conversation's phase deadline (`acp::Phase::limit`).
    let phase_timer = tokio::time::sleep(run.timeout);
    tokio::pin!(phase_timer);
    let mut phase = None;
    // The conversation is over (its turn ended or it failed): the agent was
    // stopped.
    let mut acp_over = false;
    let stop_grace = tokio::time::sleep(run.timeout);
    tokio::pin!(stop_grace);
    // The agent was sent SIGTERM; after `ACP_STOP_GRACE` comes SIGKILL.
    let mut terminated = false;
    let mut acp_error: Option<String> = None;
    if let Some(c) = &mut conversation {
        let events = c.begin().await;
        model.saw(&events);
        for p in deliver(events, &mut count) {
            p.await?;
        }
    }
    while out_open || err_open || exit.is_none() {
        if let Some(c) = &conversation {
            let now = c.client().phase();
            if phase != Some(now) {
                phase = Some(now);
                if let Some(limit) = now.limit() {
                    phase_timer
                        .as_mut()
                        .reset(tokio::time::Instant::now() + limit);
                }
            }
        }
        let phase_due = !acp_over
            && exit.is_none()
            && phase
                .and_then(crate::providers::acp::Phase::limit)
                .is_some();
        let deciding = conversation
            .as_ref()
            .is_some_and(acp::Conversation::deciding);
        // The probe is due when the parser says the agent went stale; the
        // timer is re-armed after every event.
        let due = probe_pipe
            .as_ref()
            .and(parser.probe_due())
            .filter(|_| exit.is_none() && stop.is_none());
        if let Some(due) = due {
            probe_timer
                .as_mut()
                .reset(tokio::time::Instant::from_std(due));
        }
        let mut probe_records = Vec::new();
        let pending = tokio::select! {
            line = stdout.recv(), if out_open => match line {
                Some(mut line) => {
                    if let Some(payload) = probe.answered(&run.id) {
                        probe_records.push(record(Event::RunProbeAnswered(payload)));
                    }
                    let events = match &mut conversation {
                        Some(c) => c.line(&line.bytes, line.truncated).await,
                        None => {
                            line.bytes.push(b'\n');
                            parser.feed(&line.bytes)
                        }
                    };
                    model.saw(&events);
                    deliver(events, &mut count)
                }
                None => {
                    out_open = false;
                    Vec::new()
                }
            },
            line = stderr.recv(), if err_open => match line {
                Some(mut line) => {
                    line.bytes.push(b'\n');
                    if let Some(payload) = probe.answered(&run.id) {
                        probe_records.push(record(Event::RunProbeAnswered(payload)));
                    }
                    let events = parser.feed_stderr(&line.bytes);
                    model.saw(&events);
                    deliver(events, &mut count)
                }
                None => {
                    err_open = false;
                    Vec::new()
                }
            },
            status = &mut wait, if exit.is_none() => {
                exit = Some(status?);
                drain.as_mut().reset(tokio::time::Instant::now() + POST_EXIT_DRAIN);
                Vec::new()
            }
            () = &mut drain, if exit.is_some() => break,
            () = &mut probe_timer, if due.is_some() => {
                let now = Instant::now();
                let silent = parser.last_output().map_or(started, |t| t.max(started));
                let written = match probe_pipe.as_mut() {
                    Some(pipe) => write_probe(pipe).await,
                    None => Ok(()),
                };
                parser.probe_sent(now);
                let event = match written {
                    Ok(()) => {
                        probe.sent = Some(now);
                        Event::RunProbeSent(RunProbeSent {
                            run_id: run.id.clone(),
                            silent_ms: millis(now.saturating_duration_since(silent)),
                            advisory: true,
                        })
                    }
                    Err(e) => {
                        // The agent closed its stdin or never reads it: no
                        // more probes.
                        probe_pipe = None;
                        Event::RunProbeFailed(RunProbeFailed { run_id: run.id.clone(), error: e.to_string() })
                    }
                };
                probe_records.push(record(event));
                Vec::new()
            }
            events = async { match conversation.as_mut() {
                Some(c) => c.decided().await,
                None => Vec::new(),
            } }, if deciding && stop.is_none() => {
                model.saw(&events);
                deliver(events, &mut count)
            }
            () = &mut stop_grace, if terminated && exit.is_none() => {
                let _ = killer.kill();
                Vec::new()
            }
            () = &mut phase_timer, if phase_due => {
                // The agent did not answer in time: a cancelled turn is
                // ended by force; a silent start fails the run.
                if let Some(p) = phase
                    && p != crate::providers::acp::Phase::Cancelling
                {
                    acp_error.get_or_insert(format!(
                        "the agent did not send {} within {}s; check that the provider's `command` is its ACP program",
                        p.waiting_for(),
                        p.limit().unwrap_or_default().as_secs()
                    ));
                }
                acp_over = true;
                let _ = killer.kill();
                Vec::new()
            }
            () = &mut timeout, if stop.is_none() && exit.is_none() => {
                stop = Some(Outcome::TimedOut);
                match conversation.as_mut().filter(|_| !acp_over) {
                    Some(c) => deliver(c.cancel().await, &mut count),
                    None => {
                        let _ = killer.kill();
                        Vec::new()
                    }
                }
            }
            signal = &mut cancel, if stop.is_none() && exit.is_none() => {
                stop = Some(Outcome::Cancelled { signal });
                match conversation.as_mut().filter(|_| !acp_over) {
                    Some(c) => deliver(c.cancel().await, &mut count),
                    None => {
                        let _ = killer.kill();
                        Vec::new()
                    }
                }
            }
        };
        // An ACP conversation that is over stops its agent (an ACP
        // program waits for more prompts).
        if let Some(c) = &mut conversation
            && !acp_over
            && (c.ended.is_some() || c.failed.is_some() || exit.is_some())
        {
            acp_over = true;
            if let Some(failure) = &c.failed {
                acp_error.get_or_insert(failure.to_string());
            }
            // Asked to stop (its stdin closed, SIGTERM), the agent saves
            // its session for a later resume; after the grace it is killed.
            c.close();
            terminated = true;
            let _ = killer.signal(nix::sys::signal::Signal::SIGTERM);
            stop_grace
                .as_mut()
                .reset(tokio::time::Instant::now() + ACP_STOP_GRACE);
        }
        for p in probe_records {
            p.await?;
        }
        for p in pending {
            p.await?;
        }
        if stop.is_none()
            && let Err(failure) = model.run(hooks, &run.id).await
        {
            stop = Some(Outcome::HookFailed);
            hook_error = Some(failure.to_string());
            let _ = killer.kill();
        }
    }
    drop(probe_pipe);
    let events = parser.finish();
    model.saw(&events);
    model.flush();
    for p in deliver(events, &mut count) {
        p.await?;
    }
    if stop.is_none()
        && let Err(failure) = model.run(hooks, &run.id).await
    {
        stop = Some(Outcome::HookFailed);
        hook_error = Some(failure.to_string());
    }
    let exit = exit.unwrap_or_default();
    let denials = run_denials(bus, since, run, refused).await?;
    // An ACP agent is stopped by npc once its turn ended: its turn's end
    // says how it went, not its exit status.
    let acp_ended = conversation.as_ref().and_then(|c| c.ended);
    if let Some(c) = &conversation
        && acp_ended.is_none()
        && acp_error.is_none()
        && stop.is_none()
    {
        acp_error = Some(match &c.failed {
            Some(failure) => failure.to_string(),
            None => format!(
                "the agent exited ({exit}) before its turn ended; run its ACP program by hand to see why"
            ),
        });
    }
    let exited_badly = match acp_ended {
        Some(end) => !end.is_success(),
        None => !exit.success() || acp_error.is_some(),
    };
    let mut outcome = stop.unwrap_or(if exited_badly || failed_turn {
        Outcome::Failed { exit }
    } else if denials.is_empty() {
        Outcome::Succeeded
    } else {
        Outcome::Blocked { denials }
    });
    let duration = started.elapsed();
    let mut concluded = Concluded::default();
    if let Some(conclusion) = &run.conclusion {
        concluded = conclusion.conclude().await;
        let unchanged = concluded.result.as_ref().is_some_and(|r| r.unchanged);
        if unchanged && run.expect_changes && outcome == Outcome::Succeeded {
            outcome = Outcome::NoChanges;
        }
    }
    let error = match &outcome {
        Outcome::Succeeded => None,
        Outcome::Blocked { denials } => Some(format!(
            "a denial stopped what the agent tried: {}",
            denials_in_words(denials)
        )),
        Outcome::NoChanges => Some(
            "the run changed no file, and `expect_changes = true` asks for changes".to_string(),
        ),
        Outcome::HookFailed => hook_error.clone(),
        Outcome::Failed { .. } if acp_error.is_some() => acp_error.clone(),
        Outcome::Failed { exit } => match acp_ended {
            Some(end) => Some(format!("the agent ended its turn with `{}`", end.as_str())),
            None => Some(format!("the agent failed ({exit})")),
        },
        Outcome::TimedOut => Some(format!(
            "the run outlived its timeout of {}s",
            run.timeout.as_secs()
        )),
        Outcome::Cancelled { signal } => Some(format!("the run was cancelled by signal {signal}")),
    };
    let finished = AgentRunFinished {
        run_id: run.id.clone(),
        outcome: outcome.as_str().to_string(),
        exit,
        exit_code: outcome.exit_code(),
        cancelled: matches!(outcome, Outcome::Cancelled { .. }),
        timed_out: outcome == Outcome::TimedOut,
        duration_ms: millis(duration),
        cwd: run.spec.cwd.clone(),
        tool_cwd: run.tool_cwd.clone(),
        events: count,
        // A hook's failure as before; the words of a blocked or unchanged run.
        error: match &outcome {
            Outcome::Blocked { .. } | Outcome::NoChanges => error.clone(),
            Outcome::Failed { .. } if conversation.is_some() => error.clone(),
            _ => hook_error.clone(),
        },
        reason: outcome.reason().map(str::to_string),
        denials: match &outcome {
            Outcome::Blocked { denials } => denials.clone(),
            _ => Vec::new(),
        },
        concluded,
    };
    record(Event::RunFinished(RunFinished::Agent(finished))).await?;
    end_hooks(hooks, run, error.as_deref(), outcome.as_str()).await;
    Ok(RunReport {
        outcome,
        exit,
        duration,
        events: count,
        hook_error,
        acp_error,
    })
}

/// The reason (`run.finished`'s `reason`) of a run whose workspace its
/// agent CLI would not trust.
pub const UNTRUSTED: &str = "untrusted";

/// The denials of run `run`: the `tool.denied` events recorded for it
/// since event `since` (by its hooks, its gateway, an approval), then the
/// refusals its agent CLI reported (`refused`) that npc did not record
/// itself, each recorded now as `tool.denied` (`by: cli`). Oldest first,
/// at most [`MAX_RUN_DENIALS`]; an event of another run never counts.
async fn run_denials(
    bus: &EventBus,
    since: i64,
    run: &PreparedRun,
    refused: Vec<RunDenial>,
) -> Result<Vec<RunDenial>, RunError> {
    let store = bus.store().clone();
    let id = run.id.clone();
    let stored =
        tokio::task::spawn_blocking(move || store.denials_of_run(since, &id, MAX_RUN_DENIALS))
            .await
            .map_err(|e| RunError::PrepareFailed {
                reason: e.to_string(),
            })??;
    let mut denials: Vec<RunDenial> = stored
        .into_iter()
        .filter_map(|e| serde_json::from_value::<ToolDenied>(e.payload).ok())
        .filter(|d| d.run_id.as_deref() == Some(run.id.as_str()))
        .map(|d| RunDenial {
            tool: d.tool,
            rule: d.rule,
            by: d.by,
            reason: d.reason,
        })
        .collect();
    for d in refused {
        if denials.iter().any(|k| same_tool(&k.tool, &d.tool)) {
            continue;
        }
        let event = Event::ToolDenied(ToolDenied {
            run_id: Some(run.id.clone()),
            profile: Some(run.profile.clone()),
            tool: d.tool.clone(),
            rule: d.rule.clone(),
            by: DeniedBy::Cli,
            reason: d.reason.clone(),
        });
        bus.publish(event.for_component(component(&run.id))).await?;
        if denials.len() < MAX_RUN_DENIALS {
            denials.push(d);
        }
    }
    Ok(denials)
}

/// Whether two names of a tool name the same one: equal, or one the other
/// with the CLI's prefix for a gateway tool (`mcp__npc__everything__echo`
/// and `everything__echo`).
fn same_tool(a: &str, b: &str) -> bool {
    let (short, long) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    !short.is_empty()
        && long.ends_with(short)
        && (long.len() == short.len()
            || long[..long.len() - short.len()].ends_with(['_', '.', '/', ':']))
}

/// The best-effort end of a run's hooks: `on_error` with `error` (when the
/// run did not succeed), then `on_agent_end`.
async fn end_hooks(hooks: &HookRunner, run: &PreparedRun, error: Option<&str>, outcome: &str) {
    if let Some(error) = error {
        let payload = json!({ "error": error, "run_id": run.id, "outcome": outcome });
        let _ = hooks.observe(HookEvent::OnError, payload).await;
    }
    let payload = json!({ "messages": [], "run_id": run.id, "outcome": outcome });
    let _ = hooks.observe(HookEvent::OnAgentEnd, payload).await;
}

/// Longest assistant text gathered from message fragments for one
/// `after_model` call; the rest of a longer message is dropped from it.
pub const MAX_MODEL_TEXT_BYTES: usize = 1024 * 1024;

/// The model hooks a run's parsed events call for, in order: `after_model`
/// for each assistant message (fragments gathered until the message ends),
/// `before_model` for each tool result the agent hands back to its model.
#[derive(Debug, Default)]
struct ModelHooks {
    /// Text of a message arriving in fragments.
    partial: String,
    due: Vec<(HookEvent, Value)>,
}

impl ModelHooks {
    fn saw(&mut self, events: &[AgentEvent]) {
        for e in events {
            match e {
                AgentEvent::Message { text, delta: true } => {
                    let room = MAX_MODEL_TEXT_BYTES.saturating_sub(self.partial.len());
                    let cut = crate::model::source::floor_char_boundary(text, room);
                    self.partial.push_str(&text[..cut]);
                }
                AgentEvent::Message { text, delta: false } => {
                    self.flush();
                    self.after_model(text.clone());
                }
                AgentEvent::ToolResult {
                    id,
                    name,
                    output,
                    is_error,
                } => {
                    self.flush();
                    self.due.push((
                        HookEvent::BeforeModel,
                        json!({ "messages": [{
                            "role": "tool",
                            "tool_call_id": id,
                            "name": name,
                            "content": output,
                            "is_error": is_error,
                        }] }),
                    ));
                }
                AgentEvent::Idle { .. } | AgentEvent::ToolCall { .. } => self.flush(),
                _ => {}
            }
        }
    }

    /// A message that arrived in fragments is complete.
    fn flush(&mut self) {
        if !self.partial.is_empty() {
            let text = std::mem::take(&mut self.partial);
            self.after_model(text);
        }
    }

    fn after_model(&mut self, text: String) {
        self.due.push((
            HookEvent::AfterModel,
            json!({ "messages": [{ "role": "assistant", "content": text }] }),
        ));
    }

    /// Run the hooks due, in order; the first failure stops them.
    async fn run(&mut self, hooks: &HookRunner, run_id: &str) -> Result<(), HookFailure> {
        for (event, mut payload) in std::mem::take(&mut self.due) {
            if !hooks.set().has(event) {
                continue;
            }
            payload["run_id"] = run_id.into();
            hooks.observe(event, payload).await?;
        }
        Ok(())
    }
}

/// The idle probe's bookkeeping within one run.
#[derive(Debug, Default)]
struct ProbeState {
    /// When the last probe went out, until the agent's next output.
    sent: Option<Instant>,
}

impl ProbeState {
    /// Output arrived: the payload of `run.probe_answered` when a probe was
    /// waiting for it.
    fn answered(&mut self, run_id: &str) -> Option<RunProbeAnswered> {
        let sent = self.sent.take()?;
        Some(RunProbeAnswered {
            run_id: run_id.to_string(),
            after_ms: millis(sent.elapsed()),
        })
    }
}

/// Write [`PROBE_BYTES`] to the agent's stdin, within [`PROBE_WRITE_LIMIT`].
async fn write_probe(pipe: &mut tokio::process::ChildStdin) -> std::io::Result<()> {
    use tokio::io::AsyncWriteExt as _;
    let write = async {
        pipe.write_all(PROBE_BYTES).await?;
        pipe.flush().await
    };
    tokio::time::timeout(PROBE_WRITE_LIMIT, write)
        .await
        .unwrap_or_else(|_| {
            Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the agent's stdin stayed full; it does not read the probe",
            ))
        })
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests;
