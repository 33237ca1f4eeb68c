//! The daemon's own events: its life (`daemon.*`), reloads (`manifest.*`,
//! `reload.*`, `reconcile.*`, `files.written`), components
//! (`component.*`), the API listener, the fleet's store and scheduling,
//! the plugin registry and relayed notices.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::model::PluginSource;
use crate::plan::{Action, Summary};

/// The daemon started.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DaemonStarted {
    pub pid: u32,
    /// The repository's root.
    pub repo: PathBuf,
}

/// An event with no fields (`daemon.stopping`, `daemon.stopped`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Empty {}

/// The manifest does not load: nothing changed. One of `error` (it could
/// not be read) or `report` (its diagnostics), and the reload's `reason`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ManifestInvalid {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The diagnostics, as `npc validate --format json` prints them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report: Option<serde_json::Value>,
    /// Why the manifest was loaded (absent in a preview's answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The manifest loads again after `manifest.invalid`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ManifestValid {
    pub reason: String,
    /// Always `manifest.invalid`.
    pub after: String,
}

/// A reload failed for an operational reason; it is tried again.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ReloadFailed {
    pub reason: String,
    pub error: String,
}

/// A reload would change what cannot change live: nothing changed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ReloadRefused {
    pub reason: String,
    /// `component: cause`, one per refused change.
    pub refused: Vec<String>,
}

/// File changes start reloads in a loop: at most one every `interval_secs` now.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ReloadDamped {
    pub reloads: usize,
    pub window_secs: u64,
    pub interval_secs: u64,
    /// The paths that changed, comma-separated.
    pub changed: String,
}

/// One change of a plan about to be applied.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PlannedChange {
    /// The component, `kind/name`.
    pub id: String,
    pub action: Action,
    pub cause: String,
}

/// The plan a reload applies.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ReconcilePlanned {
    pub reason: String,
    pub summary: Summary,
    pub changes: Vec<PlannedChange>,
}

/// The outcome of one component in a reload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ComponentOutcome {
    /// The component, `kind/name`.
    pub id: String,
    pub action: Action,
    /// `applied`, `failed`, `rolled-back` or `unchanged`.
    pub outcome: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A reload's plan was applied (possibly with rollbacks).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ReconcileApplied {
    /// Always `applied`.
    pub outcome: String,
    pub results: Vec<ComponentOutcome>,
}

/// One agent file a reload wrote (or failed to).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct WrittenFile {
    pub path: String,
    /// What became of it (`written`, `unchanged`, …), or `error`.
    pub outcome: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The agent files a reload wrote.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FilesWritten {
    pub files: Vec<WrittenFile>,
}

/// A component went away (`cause`: why the plan removes it).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ComponentRemoved {
    pub cause: String,
}

/// A component was added, replaced or updated, with its process's pid.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ComponentApplied {
    pub cause: String,
    pub pid: Option<u32>,
}

/// A component failed to start; nothing of it runs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ComponentStartFailed {
    pub error: String,
}

/// A component's new config failed; the previous config runs again.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ComponentRolledBack {
    pub error: String,
    pub pid: Option<u32>,
    pub detail: String,
}

/// A component failed: the supervisor gave up on its process, or its
/// rollback failed too.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum ComponentFailed {
    Supervisor(ProcessFailed),
    RollBack(RollBackFailed),
}

impl Default for ComponentFailed {
    fn default() -> Self {
        Self::RollBack(RollBackFailed::default())
    }
}

/// A new config failed and so did going back to the previous one.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RollBackFailed {
    pub error: String,
    pub rollback_error: String,
}

/// The supervisor gave up on a process; `reason` says why.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ProcessFailed {
    /// Always `failed`.
    pub event: String,
    /// The supervised child, `kind/name`.
    pub id: String,
    pub reason: String,
}

/// A supervised process started.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ProcessStarted {
    /// Always `started`.
    pub event: String,
    pub id: String,
    pub pid: u32,
}

/// A supervised process ended (on its own or because it was stopped).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ProcessExited {
    /// Always `exited`.
    pub event: String,
    pub id: String,
    pub pid: u32,
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

/// A supervised process restarts after `delay_ms`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ProcessRestarting {
    /// Always `restarting`.
    pub event: String,
    pub id: String,
    pub attempt: u32,
    pub delay_ms: u64,
}

/// A supervised process was stopped on request; its process group is gone.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ProcessStopped {
    /// Always `stopped`.
    pub event: String,
    pub id: String,
}

/// The REST API listens at `url`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ApiListening {
    pub url: String,
}

/// The REST API could not listen on `listen`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ApiFailed {
    pub listen: String,
    pub error: String,
}

/// The daemon reached its fleet's shared store (`store.connected`), or the
/// fleet's scheduling is led here (`scheduler.leading`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Fleet {
    pub fleet: String,
}

/// The fleet's shared store does not answer (`store.unreachable`), or the
/// lead of its scheduling was lost (`scheduler.standby`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FleetError {
    pub fleet: String,
    pub error: String,
}

/// A later registration of a `(kind, id)` already registered was dropped.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PluginCollision {
    /// Always `collision`.
    pub notice: String,
    /// `plugin` or `mcp_server`.
    pub kind: String,
    pub id: String,
    pub kept: PluginSource,
    pub dropped: PluginSource,
    pub dropped_path: String,
    /// Always `keep_first`.
    pub policy: String,
}

/// A plugin (or one of its servers) that does not load was dropped.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PluginDropped {
    /// Always `dropped`.
    pub notice: String,
    pub id: String,
    pub source: PluginSource,
    pub path: String,
    pub reason: String,
}

/// A pane of another repository (or another host of the fleet) posted a notice.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Notice {
    pub repository: String,
    pub pane: String,
    pub plugin: String,
    pub reason: String,
    pub at_ms: i64,
    /// The host that posted it (a fleet's board).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The fleet whose board it came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<String>,
}
