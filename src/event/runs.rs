//! The events of runs (`run.*`): queued, started, their workspace and
//! commands, probes, the end. Every payload names its `run_id`.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Event;
use super::mcp::DeniedBy;

/// Deserialize a present value (`null` included) as `Some`, for a field
/// that is absent in one shape of a kind and `null` in another.
pub(crate) fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

/// How a process ended: an exit code, or the signal that killed it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ExitInfo {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

impl ExitInfo {
    /// Exit code 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

/// What a worktree run handed back: its branch, where it started and ended,
/// and how much changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct RunResult {
    pub branch: String,
    /// The commit the worktree started from.
    pub base: String,
    /// The branch's commit after the run (`base` when nothing changed).
    pub head: String,
    /// Whether npc committed the changes (the agent may have committed them itself).
    pub committed: bool,
    pub files: u64,
    pub insertions: u64,
    pub deletions: u64,
    /// What became of the branch's push (`push = true`), once tried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub push: Option<Pushed>,
    /// The run changed no file: its branch holds nothing `base` does not.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unchanged: bool,
}

/// A denial that stopped something a run's agent tried: the tool, the rule
/// and who applied it (a `tool.denied` event of the run, or a refusal the
/// agent CLI reported in its own output).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RunDenial {
    pub tool: String,
    pub rule: String,
    pub by: DeniedBy,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A run's branch pushed to `origin`, or why not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct Pushed {
    /// The remote's URL without credentials.
    pub remote: String,
    pub ok: bool,
    /// Why the push failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A run was queued: it waits for a slot.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RunQueued {
    pub run_id: String,
    /// The trigger (or `@manual`) whose queue it waits in.
    pub trigger: String,
    /// What asked for it: `cron`, `webhook`, `file_watch`, `manual`, `api`, `acp`, `cli`.
    pub origin: String,
    pub dedupe_key: Option<String>,
}

/// A run will not run: its trigger's overlap policy skipped it at enqueue
/// (then it names its trigger, origin and dedupe key), or it ended skipped.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RunSkipped {
    pub run_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub dedupe_key: Option<Option<String>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub detail: Option<Option<String>>,
}

/// A run was cancelled (by hand, or replaced by a newer run of its trigger).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RunCancelled {
    pub run_id: String,
    pub detail: Option<String>,
}

/// A run's process went away without an end: its daemon or worker died,
/// or a fleet worker's lease expired (then `attempt` of `of` when it is
/// queued again).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RunInterrupted {
    pub run_id: String,
    pub detail: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub of: Option<u32>,
}

/// How an attempt of a run ended, before its retry.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PreviousAttempt {
    pub state: String,
    pub detail: Option<String>,
}

/// A failed attempt is tried again: attempt `attempt` of `of` after `delay_ms`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RunRetry {
    pub run_id: String,
    pub attempt: u32,
    pub of: u32,
    pub delay_ms: u64,
    pub previous: PreviousAttempt,
}

/// A run's agent or command started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum RunStarted {
    Agent(AgentRunStarted),
    Command(CommandRunStarted),
}

impl Default for RunStarted {
    fn default() -> Self {
        Self::Command(CommandRunStarted::default())
    }
}

/// An agent run started: which profile, provider and program, where.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AgentRunStarted {
    pub run_id: String,
    pub profile: String,
    pub provider: String,
    pub provider_kind: String,
    pub program: String,
    pub cwd: PathBuf,
    pub tool_cwd: PathBuf,
    pub mcp_config: Option<PathBuf>,
    pub timeout_secs: u64,
    pub prompt_chars: usize,
    /// Where the agent's prompt came from, when known.
    pub source: Option<String>,
    /// What the run's starter prints.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// The sandbox the agent runs in (`workspace`, `strict`); absent
    /// without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
}

/// A command action's run started.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CommandRunStarted {
    pub run_id: String,
    pub trigger: String,
    pub origin: String,
    /// Always `command`.
    pub action: String,
    pub program: String,
    pub cwd: PathBuf,
}

/// A run ended: its `outcome` (`succeeded`, `blocked`, `failed`,
/// `timed_out`, `cancelled`, `hook_failed`, …) and what is known of how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum RunFinished {
    Agent(AgentRunFinished),
    Command(CommandRunFinished),
    NotStarted(AgentRunNotStarted),
    Failed(RunFailed),
}

impl Default for RunFinished {
    fn default() -> Self {
        Self::Failed(RunFailed::default())
    }
}

/// What a worktree run's end adds: the result, or why there is none.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Concluded {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<RunResult>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_error: Option<String>,
}

/// An agent run that ran to its end.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AgentRunFinished {
    pub run_id: String,
    pub outcome: String,
    pub exit: ExitInfo,
    pub exit_code: u8,
    pub cancelled: bool,
    pub timed_out: bool,
    pub duration_ms: u64,
    pub cwd: PathBuf,
    pub tool_cwd: PathBuf,
    /// How many agent events it recorded.
    pub events: usize,
    pub error: Option<String>,
    /// Why it ended as it did, as a word: `denied` (`blocked`),
    /// `no_changes` (`expect_changes = true`), `untrusted`,
    /// `exit_status`, `timeout`, `signal`, `hook`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The denials of a `blocked` run, oldest first (at most
    /// `runs::agent::MAX_RUN_DENIALS`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub denials: Vec<RunDenial>,
    #[serde(flatten)]
    pub concluded: Concluded,
}

/// An agent run that never started (a hook refused it, the spawn failed).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AgentRunNotStarted {
    pub run_id: String,
    pub outcome: String,
    pub error: String,
    /// Why, as a word, where one applies (`untrusted`: the agent CLI would
    /// not trust the run's worktree, and `error` says how to fix it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub duration_ms: u64,
    pub cwd: PathBuf,
    pub tool_cwd: PathBuf,
    pub cancelled: bool,
}

/// A command action's run ended.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CommandRunFinished {
    pub run_id: String,
    pub trigger: String,
    pub outcome: String,
    pub duration_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<ExitInfo>,
    /// Output lines past the bound, not recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_lines_dropped: Option<usize>,
    #[serde(flatten)]
    pub concluded: Concluded,
}

/// A run that failed before its action started (a bad row, a workspace
/// that could not be made, a refused fleet run).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RunFailed {
    pub run_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<String>,
    pub outcome: String,
    pub error: String,
}

/// One line a command action printed (`stream` is `stdout` or `stderr`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RunOutput {
    pub run_id: String,
    pub stream: String,
    pub line: String,
}

/// A run got its git worktree.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RunWorkspace {
    pub run_id: String,
    /// Always `worktree`.
    pub workspace: String,
    pub worktree: String,
    pub branch: String,
    /// The commit it starts from.
    pub base: String,
    /// The ref `base` was read from.
    #[serde(rename = "ref")]
    pub base_ref: String,
    /// The port handed to the run in `NPC_PORT`.
    pub port: Option<u16>,
}

/// One `setup` (`run.setup`) or `after` (`run.after`) command of a worktree run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RunCommand {
    pub run_id: String,
    pub command: String,
    pub ok: bool,
    pub status: String,
    /// The output's tail.
    pub output: String,
}

/// A worktree run's worktree was kept (its cleanup policy, or its state).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RunWorktreeKept {
    pub run_id: String,
    pub worktree: PathBuf,
    pub branch: String,
    pub state: String,
}

/// A worktree run's branch was pushed to `origin` (`run.pushed`), or not
/// (`run.push_failed`, with the error).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RunPush {
    pub run_id: String,
    pub branch: String,
    /// The remote's URL without credentials.
    pub remote: String,
    pub error: Option<String>,
}

/// A connection a `strict` run asked npc's egress proxy for: admitted
/// (`allowed`) or refused (then also a `tool.denied` by `sandbox`), or the
/// proxy itself stopping (`host` empty, `reason` says why).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RunEgress {
    pub run_id: String,
    /// The host asked for (as the run named it).
    pub host: String,
    pub port: u16,
    /// `CONNECT`, `GET`, …
    pub method: String,
    pub allowed: bool,
    /// Why it was refused or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The advisory idle probe was written to a silent agent's stdin.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RunProbeSent {
    pub run_id: String,
    pub silent_ms: u64,
    pub advisory: bool,
}

/// The agent spoke again after a probe.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RunProbeAnswered {
    pub run_id: String,
    pub after_ms: u64,
}

/// The probe could not be written; no more probes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RunProbeFailed {
    pub run_id: String,
    pub error: String,
}

impl Event {
    /// `run.finished` of a run that failed before its action started.
    pub fn run_failed(run_id: &str, trigger: Option<&str>, error: impl Into<String>) -> Self {
        Self::RunFinished(RunFinished::Failed(RunFailed {
            run_id: run_id.to_string(),
            trigger: trigger.map(str::to_string),
            outcome: "failed".to_string(),
            error: error.into(),
        }))
    }

    /// `run.interrupted` of run `run_id` for `detail`.
    pub fn run_interrupted(run_id: &str, detail: &str) -> Self {
        Self::RunInterrupted(RunInterrupted {
            run_id: run_id.to_string(),
            detail: detail.to_string(),
            attempt: None,
            of: None,
        })
    }
}

/// A run parked on an `ask`: a tool call waits for a person's answer
/// (`npc runs approve` / `npc runs deny`, the API, the dashboard). The run
/// holds its slot while it waits.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RunWaiting {
    pub run_id: String,
    /// The pending approval's id.
    pub approval_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// The tool as the agent named it.
    pub tool: String,
    /// What asks: a hook's label or the profile's `ask_tools`.
    pub rule: String,
    /// Why it asks, when it said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The call's arguments (secrets redacted, cut to a bound).
    pub arguments: serde_json::Value,
    /// When the ask is denied unless answered (ms since the epoch).
    pub deadline_ms: i64,
}

/// How an `ask` of a run was answered ([`RunApproval::decision`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalDecision {
    /// A person allowed the call.
    #[default]
    Allow,
    /// A person denied the call.
    Deny,
    /// Nobody answered within `approval_timeout`: denied.
    Timeout,
    /// An identical call of the run was allowed with `--always` before.
    Always,
}

/// The agent of a run reported its progress through the gateway's
/// `npc_progress`: a sentence, and named values for whoever follows the run
/// (a workflow step hands them on as its `progress` output; a later report
/// replaces a key).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RunProgress {
    pub run_id: String,
    /// What the agent says it has done or is doing.
    pub text: String,
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub outputs: serde_json::Map<String, serde_json::Value>,
}

/// An `ask` of a run was answered; the run goes on (a denied call is also
/// a `tool.denied` of the run, by `approval`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RunApproval {
    pub run_id: String,
    pub approval_id: String,
    pub tool: String,
    pub decision: ApprovalDecision,
    /// With `allow`: later identical calls of the run are allowed too.
    #[serde(default)]
    pub always: bool,
    /// Who answered: `cli`, `api`, `timeout`.
    pub by: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// How npc answered an ACP agent's `session/request_permission`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PermissionAnswer {
    /// An allow option the agent offered.
    Allowed,
    /// A reject option the agent offered.
    #[default]
    Denied,
    /// The `cancelled` outcome: the turn was cancelled, or the agent
    /// offered no option that says what npc decided.
    Cancelled,
}

/// An ACP agent asked permission for a tool call of a run, and npc
/// answered by the run's policy (its profile's tool rules, its hooks, a
/// person for an `ask`): the option chosen is one the agent offered.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RunPermission {
    pub run_id: String,
    /// The tool as the agent named it.
    pub tool: String,
    /// The agent's title of the call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// The ids of the options the agent offered.
    pub options: Vec<String>,
    pub answer: PermissionAnswer,
    /// The option chosen (`None` with `cancelled`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub option_id: Option<String>,
    /// Why, in words (the denying rule, the person's answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}
