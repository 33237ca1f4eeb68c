//! A profile's tool policy: the calls its `ask_tools` patterns match need
//! the user's approval. The [`HookRunner`](super::HookRunner) applies it
//! after the `before_tool` hooks (on the arguments they left, and only when
//! no hook asked about the call already): a match is asked like a hook's
//! `ask` — through the runner's approver (the editor under `npc acp`), and
//! denied when there is none. Which profile an agent runs for reaches its
//! hooks in [`PROFILE_ENV`], which every run of a profile sets
//! (`runs::prepare`).
//!
//! The patterns are `model::pattern`'s (the manifest's validation parses
//! them with the same code).

use super::ToolCallInfo;
use crate::model::Manifest;
pub use crate::model::pattern::{PatternError, ToolPattern};

/// Environment variable naming the profile an agent runs for.
pub const PROFILE_ENV: &str = "NPC_PROFILE";

/// The tool policy of one profile.
#[derive(Debug, Clone)]
pub struct ToolPolicy {
    profile: String,
    ask: Vec<ToolPattern>,
}

impl ToolPolicy {
    /// The policy of profile `name`; `None` when it has no `ask_tools` (or
    /// no such profile). A pattern that does not parse (the manifest's
    /// validation refuses it) asks about every call: fail closed.
    pub fn for_profile(manifest: &Manifest, name: &str) -> Option<Self> {
        let profile = manifest.profiles.get(name)?;
        if profile.ask_tools.is_empty() {
            return None;
        }
        let ask = profile
            .ask_tools
            .iter()
            .map(|p| ToolPattern::parse(p).or_else(|_| ToolPattern::parse("*")))
            .collect::<Result<Vec<_>, _>>()
            .ok()?;
        Some(Self {
            profile: name.to_string(),
            ask,
        })
    }

    /// The policy of the profile [`PROFILE_ENV`] names, if any.
    pub fn from_env(manifest: &Manifest) -> Option<Self> {
        let name = std::env::var(PROFILE_ENV).ok()?;
        Self::for_profile(manifest, &name)
    }

    pub fn profile(&self) -> &str {
        &self.profile
    }

    /// The first pattern that asks about `call`.
    pub fn asks(&self, call: &ToolCallInfo) -> Option<&ToolPattern> {
        self.ask
            .iter()
            .find(|p| p.matches(&call.name, &call.arguments))
    }

    /// Whether the policy may ask about a call of tool `name` (whatever its
    /// arguments): lets a caller skip the hooks' machinery when it cannot.
    pub fn may_ask(&self, name: &str) -> bool {
        self.ask.iter().any(|p| p.matches_name(name))
    }
}
