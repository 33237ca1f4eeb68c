//! What a reload did, as the daemon answers `npc apply` and the REST API's
//! reload: per component, and for the whole reload.

use serde::{Deserialize, Serialize};

use super::{Action, ComponentId};

/// What became of one component in a reload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    Applied,
    Failed,
    /// It failed and its previous config runs again.
    RolledBack,
    Unchanged,
}

impl Outcome {
    /// The word the wire and `npc apply` use.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Applied => "applied",
            Self::Failed => "failed",
            Self::RolledBack => "rolled-back",
            Self::Unchanged => "unchanged",
        }
    }
}

/// The outcome of one component in a reload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ComponentResult {
    pub id: ComponentId,
    pub action: Action,
    pub outcome: Outcome,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What a reload did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum ReloadOutcome {
    /// The manifest is invalid: nothing changed.
    Invalid { error_count: usize },
    /// The reload could not run for an operational reason (no file
    /// descriptors, no memory, a deadline): nothing changed, and the daemon
    /// tries again with backoff.
    Failed { error: String },
    /// A change cannot be applied live: nothing changed.
    Refused { reasons: Vec<String> },
    /// The plan to apply was computed from something other than what the
    /// one shown was (an edit since): nothing changed.
    Stale,
    /// The plan was applied (possibly with rollbacks).
    Applied { results: Vec<ComponentResult> },
}
