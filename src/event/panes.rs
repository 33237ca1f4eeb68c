//! The pane host's events (`pane.*` about a pane, `pane_plugin.*` about a
//! pane plugin; the component names which).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How a PTY child ended: its exit code, or the name of the signal that
/// killed it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PtyExit {
    pub code: Option<u32>,
    pub signal: Option<String>,
}

/// Severity of a plugin's `log`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LogLevel {
    Error,
    Warn,
    #[default]
    Info,
    Debug,
}

/// A pane needs a person (`reason`: `needs_attention` or `attention`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PaneNotice {
    pub plugin: String,
    pub reason: String,
}

/// A pane's process started.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PaneOpened {
    pub id: u64,
    pub generation: u64,
    pub pid: u32,
}

/// A pane, by its process's id and generation (`pane.closed`, `pane.hold_expired`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PaneInstance {
    pub id: u64,
    pub generation: u64,
}

/// A pane's process exited; `held` while a plugin may relaunch it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PaneExited {
    pub id: u64,
    pub generation: u64,
    pub exit: PtyExit,
    pub held: bool,
}

/// A pane's recovery ended (`state`: `cancelled`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PaneRecovery {
    pub state: String,
}

/// A pane needs a person: a plugin said so, or it exited and is not relaunched.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PaneAttention {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A plugin typed into a pane (`bytes` long).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PaneInput {
    pub plugin: String,
    pub bytes: usize,
}

/// A plugin watches a pane.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PaneWatched {
    pub plugin: String,
}

/// A plugin's status report of a pane it watches.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PaneStatus {
    pub plugin: String,
    /// The plugin's word (`needs_attention`, `recovering`, `cancelled`, …).
    pub state: String,
    pub detail: Option<String>,
    pub deadline_epoch: Option<i64>,
    pub attempt: u32,
}

/// A plugin relaunched a pane's process.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PaneRelaunched {
    pub plugin: String,
    pub id: u64,
    pub previous_id: Option<u64>,
    pub generation: u64,
    pub resume_args: Vec<String>,
}

/// A plugin's relaunch of a pane failed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PaneRelaunchFailed {
    pub plugin: String,
    pub error: String,
}

/// Something failed (`pane.start_failed`, `pane_plugin.rejected`, `pane_plugin.failed`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PaneError {
    pub error: String,
}

/// The guard refused a plugin's command `cmd`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PanePluginRefused {
    pub cmd: String,
    pub reason: String,
}

/// A plugin's `log` line.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PanePluginLog {
    pub level: LogLevel,
    pub message: String,
}

/// A pane plugin's process exited (`exit` in words); `restarting` when it starts again.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PanePluginExited {
    pub exit: Option<String>,
    pub restarting: bool,
}
