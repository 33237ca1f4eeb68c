//! The webhook listener's events (`webhook.*`): where it listens, and
//! every request it refused (within a per-second budget).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The webhook listener listens on `addr`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct WebhookListening {
    pub addr: String,
}

/// The webhook listener could not move to its new address.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct WebhookListenFailed {
    pub error: String,
}

/// A webhook request the listener refused, and the HTTP status it answered.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct WebhookRefused {
    /// The route it was sent to, once known.
    pub route: Option<String>,
    pub status: u16,
    pub detail: String,
    /// Refusals not recorded since the last recorded one (over the budget).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suppressed_before: Option<u64>,
}
