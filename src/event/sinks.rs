//! The events of notification sinks (`notify.*`): a message delivered,
//! or given up after its attempts. Neither carries the sink's URL (it may
//! hold a secret) nor the message's text, only what it was about.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A message a sink took (`notify.delivered`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NotifyDelivered {
    /// The `[notify.NAME]` sink.
    pub sink: String,
    /// `webhook`, `ntfy`, `slack` or `desktop`.
    pub kind: String,
    /// What it told (`run.failed`, …).
    pub on: String,
    /// The run it was about, if any.
    pub run_id: Option<String>,
    /// How many events the message stood for (more than one when a flood
    /// was coalesced).
    pub events: u64,
    /// The attempt that was taken (1 = the first).
    pub attempt: u32,
    /// The receiver's HTTP status (none for `desktop`).
    pub status: Option<u16>,
    pub duration_ms: u64,
}

/// A message npc gave up on (`notify.failed`): every attempt failed, or it
/// could not be made (a `body` that renders no JSON), or the sink's queue
/// was full.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NotifyFailed {
    pub sink: String,
    pub kind: String,
    pub on: String,
    pub run_id: Option<String>,
    pub events: u64,
    /// Attempts made.
    pub attempts: u32,
    /// The last attempt's error.
    pub error: String,
}
