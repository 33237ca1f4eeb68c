//! Events: the one closed [`Event`] enum every event npc records is made
//! from (one payload struct per kind, serde-tagged by its dotted kind), and
//! [`NewEvent`], what the bus and the store persist, built only from it.
//! The stored form is unchanged by the types: the `kind` column holds the
//! dotted kind and the `payload` column the payload struct serialised as
//! the JSON object it always was (field order included). Pure: no IO.
//! `schemas/events.schema.json` ([`json_schema`]) and `docs/events.md`
//! ([`markdown`]) are generated from the enum and checked by tests.

mod agent;
mod daemon;
mod docs;
mod mcp;
mod panes;
mod runs;
mod sinks;
mod triggers;
mod workflows;

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

pub use agent::*;
pub use daemon::*;
pub use docs::{markdown, markdown_of};
pub use mcp::*;
pub use panes::*;
pub use runs::*;
pub use sinks::*;
pub use triggers::*;
pub use workflows::*;

/// One closed list of event kinds: `$kind => $Struct` makes the variant
/// `Event::$Struct($Struct)`, serialised as `{"kind": $kind, "payload": …}`.
macro_rules! events {
    ($( $(#[$doc:meta])* $kind:literal => $variant:ident($ty:ty), )*) => {
        /// Every event npc records: `kind` is the dotted kind stored in the
        /// `kind` column, `payload` the object stored in the `payload` column.
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
        #[serde(tag = "kind", content = "payload")]
        pub enum Event {
            $( $(#[$doc])* #[serde(rename = $kind)] $variant($ty), )*
        }

        impl Event {
            /// Every kind, in the order of the enum.
            pub const KINDS: &[&str] = &[$($kind),*];

            /// The dotted kind (`run.queued`).
            pub fn kind(&self) -> &'static str {
                match self { $( Self::$variant(_) => $kind, )* }
            }

            /// The payload as the JSON object stored in the `payload` column.
            pub fn payload(&self) -> serde_json::Value {
                // Plain structs with string-keyed maps: serialising them to a
                // `Value` cannot fail (every kind round-trips in a test).
                match self { $( Self::$variant(p) => serde_json::to_value(p).unwrap_or_default(), )* }
            }

            /// One example of every kind (its `Default`), for the tests.
            pub fn examples() -> Vec<Event> {
                vec![$( Self::$variant(<$ty>::default()), )*]
            }
        }

    };
}

events! {
    /// A run was queued.
    "run.queued" => RunQueued(RunQueued),
    /// A run will not run (overlap `skip`, or skipped at its end).
    "run.skipped" => RunSkipped(RunSkipped),
    /// A run was cancelled.
    "run.cancelled" => RunCancelled(RunCancelled),
    /// A run's process went away without an end.
    "run.interrupted" => RunInterrupted(RunInterrupted),
    /// A failed attempt is tried again.
    "run.retry" => RunRetry(RunRetry),
    /// A run's agent or command started.
    "run.started" => RunStarted(RunStarted),
    /// A run ended.
    "run.finished" => RunFinished(RunFinished),
    /// A line a command action printed.
    "run.output" => RunOutput(RunOutput),
    /// A run got its git worktree.
    "run.workspace" => RunWorkspace(RunWorkspace),
    /// One `setup` command of a worktree run.
    "run.setup" => RunSetup(RunCommand),
    /// One `after` command of a worktree run.
    "run.after" => RunAfter(RunCommand),
    /// A worktree run's worktree was kept.
    "run.worktree_kept" => RunWorktreeKept(RunWorktreeKept),
    /// A worktree run's branch was pushed to `origin`.
    "run.pushed" => RunPushed(RunPush),
    /// A worktree run's branch could not be pushed.
    "run.push_failed" => RunPushFailed(RunPush),
    /// A run parked on an `ask`: a tool call waits for a person's answer.
    "run.waiting" => RunWaiting(RunWaiting),
    /// An `ask` of a run was answered (allowed, denied, timed out).
    "run.approval" => RunApproval(RunApproval),
    /// A run's agent reported its progress (`npc_progress`).
    "run.progress" => RunProgress(RunProgress),
    /// An ACP agent asked permission for a tool call; npc answered.
    "run.permission" => RunPermission(RunPermission),
    /// The advisory idle probe was written to a silent agent.
    "run.probe_sent" => RunProbeSent(RunProbeSent),
    /// The agent spoke again after a probe.
    "run.probe_answered" => RunProbeAnswered(RunProbeAnswered),
    /// The probe could not be written.
    "run.probe_failed" => RunProbeFailed(RunProbeFailed),
    /// A `strict` run's connection through npc's egress proxy, admitted or refused.
    "run.egress" => RunEgress(RunEgress),
    /// A workflow run started.
    "workflow.started" => WorkflowStarted(WorkflowStarted),
    /// A step (one instance of it) of a workflow run changed state.
    "workflow.step" => WorkflowStep(WorkflowStep),
    /// A workflow run ended.
    "workflow.finished" => WorkflowFinished(WorkflowFinished),
    /// The agent CLI announced its session.
    "agent.started" => AgentStarted(AgentRecord<AgentStarted>),
    /// Text the agent wrote.
    "agent.message" => AgentMessage(AgentRecord<AgentMessage>),
    /// The agent started a tool call.
    "agent.tool_call" => AgentToolCall(AgentRecord<AgentToolCall>),
    /// A tool call of the agent finished.
    "agent.tool_result" => AgentToolResult(AgentRecord<AgentToolResult>),
    /// Token counts and cost.
    "agent.usage" => AgentUsage(AgentRecord<AgentUsage>),
    /// The agent finished its turn.
    "agent.idle" => AgentIdle(AgentRecord<AgentIdle>),
    /// The agent reported an error, or npc could not read a line of it.
    "agent.error" => AgentError(AgentRecord<AgentError>),
    /// A line on the agent's stderr that is no error.
    "agent.notice" => AgentNotice(AgentRecord<AgentNotice>),
    /// A fragment of the agent's reasoning (ACP runs).
    "agent.thought" => AgentThought(AgentRecord<AgentThought>),
    /// The agent's plan for the turn (ACP runs).
    "agent.plan" => AgentPlan(AgentRecord<AgentPlan>),
    /// The agent's session mode changed (ACP runs).
    "agent.mode" => AgentMode(AgentRecord<AgentMode>),
    /// A tool call's kind, status, locations and diffs (ACP runs).
    "agent.tool_update" => AgentToolUpdate(AgentRecord<AgentToolUpdate>),
    /// The agent's output no longer looks like the recorded fixture.
    "cli_detection.drift_detected" => DriftDetected(AgentRecord<DriftDetected>),
    /// The daemon started.
    "daemon.started" => DaemonStarted(DaemonStarted),
    /// The daemon is stopping its components.
    "daemon.stopping" => DaemonStopping(Empty),
    /// The daemon stopped.
    "daemon.stopped" => DaemonStopped(Empty),
    /// The manifest does not load; nothing changed.
    "manifest.invalid" => ManifestInvalid(ManifestInvalid),
    /// The manifest loads again.
    "manifest.valid" => ManifestValid(ManifestValid),
    /// A reload failed for an operational reason; it is tried again.
    "reload.failed" => ReloadFailed(ReloadFailed),
    /// A reload would change what cannot change live; nothing changed.
    "reload.refused" => ReloadRefused(ReloadRefused),
    /// File changes start reloads in a loop; reloads are damped.
    "reload.damped" => ReloadDamped(ReloadDamped),
    /// The plan a reload applies.
    "reconcile.planned" => ReconcilePlanned(ReconcilePlanned),
    /// A reload's plan was applied.
    "reconcile.applied" => ReconcileApplied(ReconcileApplied),
    /// The agent files a reload wrote.
    "files.written" => FilesWritten(FilesWritten),
    /// A component was added.
    "component.added" => ComponentAdded(ComponentApplied),
    /// A component was replaced (stopped, then started with its new config).
    "component.replaced" => ComponentReplaced(ComponentApplied),
    /// A component was updated in place.
    "component.updated" => ComponentUpdated(ComponentApplied),
    /// A component was removed.
    "component.removed" => ComponentRemoved(ComponentRemoved),
    /// A component failed to start.
    "component.start_failed" => ComponentStartFailed(ComponentStartFailed),
    /// A component's new config failed; the previous one runs again.
    "component.rolled_back" => ComponentRolledBack(ComponentRolledBack),
    /// A component failed.
    "component.failed" => ComponentFailed(ComponentFailed),
    /// A component's process started.
    "component.started" => ComponentStarted(ProcessStarted),
    /// A component's process ended.
    "component.exited" => ComponentExited(ProcessExited),
    /// A component's process restarts after a delay.
    "component.restarting" => ComponentRestarting(ProcessRestarting),
    /// A component's process was stopped on request.
    "component.stopped" => ComponentStopped(ProcessStopped),
    /// The REST API listens.
    "api.listening" => ApiListening(ApiListening),
    /// The REST API could not listen.
    "api.failed" => ApiFailed(ApiFailed),
    /// The daemon reached its fleet's shared store.
    "store.connected" => StoreConnected(Fleet),
    /// The fleet's shared store does not answer.
    "store.unreachable" => StoreUnreachable(FleetError),
    /// This daemon leads the fleet's cron scheduling.
    "scheduler.leading" => SchedulerLeading(Fleet),
    /// This daemon lost the lead of the fleet's scheduling.
    "scheduler.standby" => SchedulerStandby(FleetError),
    /// A plugin registration collided with an earlier one and was dropped.
    "registry.plugin_collision" => PluginCollision(PluginCollision),
    /// A plugin that does not load was dropped.
    "registry.plugin_dropped" => PluginDropped(PluginDropped),
    /// A notice of another repository's (or host's) pane.
    "notice" => Notice(Notice),
    /// A `tools/call` the MCP gateway served.
    "mcp.tool_call" => McpToolCall(McpToolCall),
    /// A client finished its handshake with the MCP gateway.
    "mcp.client_connected" => McpClientConnected(McpClientConnected),
    /// A `resources/read` the MCP gateway served.
    "mcp.resource_read" => McpResourceRead(McpResourceRead),
    /// A `prompts/get` the MCP gateway served.
    "mcp.prompt_get" => McpPromptGet(McpPromptGet),
    /// A request of an upstream server passed to the client.
    "mcp.request" => McpRequest(McpRequest),
    /// Messages the MCP gateway dropped.
    "mcp.dropped" => McpDropped(McpDropped),
    /// An MCP server could not be reached.
    "mcp.server_failed" => McpServerFailed(McpServerFailed),
    /// One hook call and its decision.
    "hook.call" => HookCall(HookCall),
    /// A tool call of a run was denied (by the CLI, a hook, the gateway, an
    /// approval or the sandbox): the run, the tool and the rule.
    "tool.denied" => ToolDenied(ToolDenied),
    /// A notification sink took a message.
    "notify.delivered" => NotifyDelivered(NotifyDelivered),
    /// A notification was given up.
    "notify.failed" => NotifyFailed(NotifyFailed),
    /// A pane needs a person.
    "pane.notice" => PaneNotice(PaneNotice),
    /// A pane's process started.
    "pane.opened" => PaneOpened(PaneOpened),
    /// A pane closed.
    "pane.closed" => PaneClosed(PaneInstance),
    /// A pane's recovery ended.
    "pane.recovery" => PaneRecovery(PaneRecovery),
    /// A pane's process exited.
    "pane.exited" => PaneExited(PaneExited),
    /// A pane needs a person's attention.
    "pane.attention" => PaneAttention(PaneAttention),
    /// A pane's hold for a relaunch expired; it closed.
    "pane.hold_expired" => PaneHoldExpired(PaneInstance),
    /// A plugin typed into a pane.
    "pane.input" => PaneInput(PaneInput),
    /// A plugin watches a pane.
    "pane.watched" => PaneWatched(PaneWatched),
    /// A plugin's status report of a pane.
    "pane.status" => PaneStatus(PaneStatus),
    /// A plugin relaunched a pane.
    "pane.relaunched" => PaneRelaunched(PaneRelaunched),
    /// A plugin's relaunch of a pane failed.
    "pane.relaunch_failed" => PaneRelaunchFailed(PaneRelaunchFailed),
    /// A pane failed to start.
    "pane.start_failed" => PaneStartFailed(PaneError),
    /// A pane plugin's command could not be read.
    "pane_plugin.rejected" => PanePluginRejected(PaneError),
    /// The guard refused a pane plugin's command.
    "pane_plugin.refused" => PanePluginRefused(PanePluginRefused),
    /// A pane plugin's log line.
    "pane_plugin.log" => PanePluginLog(PanePluginLog),
    /// A pane plugin's process exited.
    "pane_plugin.exited" => PanePluginExited(PanePluginExited),
    /// A pane plugin failed to start.
    "pane_plugin.failed" => PanePluginFailed(PaneError),
    /// The webhook listener listens.
    "webhook.listening" => WebhookListening(WebhookListening),
    /// The webhook listener could not move to its new address.
    "webhook.listen_failed" => WebhookListenFailed(WebhookListenFailed),
    /// A webhook request refused: the body is not the JSON the route wants.
    "webhook.bad_json" => WebhookBadJson(WebhookRefused),
    /// A webhook request refused: the signature or token does not match.
    "webhook.bad_signature" => WebhookBadSignature(WebhookRefused),
    /// A webhook request refused: the body broke off.
    "webhook.broken_body" => WebhookBrokenBody(WebhookRefused),
    /// A webhook request refused: too many bodies are being read at once.
    "webhook.busy" => WebhookBusy(WebhookRefused),
    /// A webhook request refused: the route's filter did not match the payload.
    "webhook.filtered" => WebhookFiltered(WebhookRefused),
    /// A webhook request refused: the request was ignored (an event the route does not take).
    "webhook.ignored" => WebhookIgnored(WebhookRefused),
    /// A webhook request refused: a method other than POST.
    "webhook.method_not_allowed" => WebhookMethodNotAllowed(WebhookRefused),
    /// A webhook request refused: the trigger's queue is full.
    "webhook.queue_full" => WebhookQueueFull(WebhookRefused),
    /// A webhook request refused: over the route's rate limit.
    "webhook.rate_limited" => WebhookRateLimited(WebhookRefused),
    /// A webhook request refused: a delivery seen before (replay window, dedupe key).
    "webhook.replayed" => WebhookReplayed(WebhookRefused),
    /// A webhook request refused: the fleet's shared store does not answer.
    "webhook.store_unreachable" => WebhookStoreUnreachable(WebhookRefused),
    /// A webhook request refused: the body is over the bound.
    "webhook.too_large" => WebhookTooLarge(WebhookRefused),
    /// A webhook request refused: the body came too slowly.
    "webhook.too_slow" => WebhookTooSlow(WebhookRefused),
    /// A webhook request refused: no trigger listens on the path.
    "webhook.unknown_route" => WebhookUnknownRoute(WebhookRefused),
    /// A webhook request refused: a body that is not JSON.
    "webhook.unsupported_media_type" => WebhookUnsupportedMediaType(WebhookRefused),
}

/// An event to persist; the store assigns `id` and `ts_ms`. Made only from
/// an [`Event`] (`NewEvent::from(event)`, [`Event::for_component`]), or
/// [`NewEvent::relayed`] for an event this process already stored.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    kind: Cow<'static, str>,
    component: Option<String>,
    payload: serde_json::Value,
}

impl From<Event> for NewEvent {
    fn from(event: Event) -> Self {
        Self {
            kind: Cow::Borrowed(event.kind()),
            component: None,
            payload: event.payload(),
        }
    }
}

impl Event {
    /// This event about `component` (`kind/name`).
    pub fn for_component(self, component: impl Into<String>) -> NewEvent {
        NewEvent::from(self).for_component(component)
    }
}

impl NewEvent {
    /// An event already stored by this process (made from an [`Event`]
    /// then), copied as it is into another store: a fleet worker relays its
    /// runs' events to the fleet's log. Its payload may have been cut to
    /// size, so it is not parsed again.
    pub fn relayed(kind: String, component: Option<String>, payload: serde_json::Value) -> Self {
        Self {
            kind: Cow::Owned(kind),
            component,
            payload,
        }
    }

    /// An event of any kind, for tests of the bus and the store.
    #[cfg(test)]
    pub fn untyped(kind: impl Into<String>, payload: serde_json::Value) -> Self {
        Self {
            kind: Cow::Owned(kind.into()),
            component: None,
            payload,
        }
    }

    /// Attach the component (`kind/name`) the event concerns.
    pub fn for_component(mut self, component: impl Into<String>) -> Self {
        self.component = Some(component.into());
        self
    }

    /// The dotted kind.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The component (`kind/name`) it concerns, if any.
    pub fn component(&self) -> Option<&str> {
        self.component.as_deref()
    }

    /// The payload object.
    pub fn payload(&self) -> &serde_json::Value {
        &self.payload
    }

    /// The payload, for the bus's scrubbing and cutting to size.
    pub fn payload_mut(&mut self) -> &mut serde_json::Value {
        &mut self.payload
    }

    /// Kind, component and payload.
    pub fn into_parts(self) -> (String, Option<String>, serde_json::Value) {
        (self.kind.into_owned(), self.component, self.payload)
    }
}

/// The JSON Schema of [`Event`], generated: what `schemas/events.schema.json`
/// holds (`committed_events_schema_is_the_generated_one`). The binary prints
/// and documents the committed text ([`SCHEMA_TEXT`]) instead, so this code
/// (half a megabyte of generated schema builders) stays out of it.
pub fn json_schema() -> serde_json::Value {
    let schema = schemars::schema_for!(Event);
    let mut value = serde_json::to_value(schema).unwrap_or_default();
    if let Some(obj) = value.as_object_mut() {
        obj.insert("$id".into(), SCHEMA_ID.into());
    }
    value
}

/// The `$id` of the published event schema.
pub const SCHEMA_ID: &str = "https://npcagent.dev/schemas/events.schema.json";

/// `schemas/events.schema.json` as committed: what `npc schema --events`
/// prints and `docs/events.md` is made from (equal to [`json_schema`]'s
/// output, or a test fails).
pub const SCHEMA_TEXT: &str = include_str!("../../schemas/events.schema.json");

/// [`SCHEMA_TEXT`], parsed.
pub fn schema() -> serde_json::Value {
    serde_json::from_str(SCHEMA_TEXT).unwrap_or_default()
}

#[cfg(test)]
mod tests;
