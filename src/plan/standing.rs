//! What is true of a component that no process stands for, in one
//! vocabulary: the runtime records it, and `npc status`, `npc apply`,
//! `GET /api/v1/status` and the dashboard show the same word.
//!
//! A supervised component (a stdio MCP server, a pane) has a live state
//! (`running`, `backoff`, …); every other kind is accepted and then stands in
//! one of the states below, so nothing reads as running that npc does not run.

use super::Kind;

/// The state a component of a kind without a process of its own is in once
/// its config is accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Validated and recorded, but npc has no runtime for the kind itself
    /// (plugins: their servers and hooks run as their own components).
    Declared,
    /// Run once per call, no process of its own (hooks: around the
    /// gateway's tool calls, in `npc run`, from the agents' native hooks).
    PerCall,
    /// Runs only inside the daemon, and no daemon runs (panes, pane plugins).
    InDaemon,
    /// Read by `npc run` and `npc render` when they are used (providers,
    /// prompts, profiles).
    Ready,
    /// Written into the agents' config files; the agent connects to it (an
    /// HTTP MCP server).
    Configured,
    /// Settings npc itself reads (project, daemon).
    Recorded,
    /// A trigger the daemon runs: its firings go to the run queue.
    Armed,
}

/// The state stores written before standings held for all of them.
const LEGACY_ACCEPTED: &str = "applied";

impl Standing {
    /// The standing of an accepted component of `kind`.
    pub fn of_kind(kind: Kind) -> Self {
        match kind {
            Kind::Plugin => Self::Declared,
            Kind::Trigger => Self::Armed,
            Kind::Hooks => Self::PerCall,
            Kind::Pane | Kind::PanePlugin => Self::InDaemon,
            Kind::Provider | Kind::Prompt | Kind::Profile => Self::Ready,
            Kind::McpServer => Self::Configured,
            Kind::Project | Kind::Daemon => Self::Recorded,
        }
    }

    /// The standing a recorded or reported `state` of a component of
    /// `kind` is; `None` for any other state (`running`, a trigger's `not
    /// running` without a daemon, …). The catch-all `applied` of older
    /// stores reads as the kind's standing.
    pub fn of_state(kind: &str, state: &str) -> Option<Self> {
        let standing = Self::of_kind(Kind::parse(kind)?);
        (state == LEGACY_ACCEPTED || state == standing.state()).then_some(standing)
    }

    /// The state word, as every surface reports it (`_` reads as a space
    /// where people read it).
    pub fn state(self) -> &'static str {
        match self {
            Self::Declared => "declared",
            Self::PerCall => "per_call",
            Self::InDaemon => "not running",
            Self::Ready => "ready",
            Self::Configured => "configured",
            Self::Recorded => "recorded",
            Self::Armed => "armed",
        }
    }

    /// The state word with what it means in a few words, for a table's
    /// state column.
    pub fn human(self) -> &'static str {
        match self {
            Self::Declared => "declared (not run yet)",
            Self::PerCall => "per call (no process of its own)",
            Self::InDaemon => "not running (runs in `npc daemon`)",
            Self::Ready => "ready",
            Self::Configured => "configured",
            Self::Recorded => "recorded",
            Self::Armed => "armed",
        }
    }

    /// One sentence on what the state means.
    pub fn detail(self) -> &'static str {
        match self {
            Self::Declared => {
                "validated and recorded; nothing runs it yet (npc has no runtime for this kind)"
            }
            Self::PerCall => {
                "run once per call: around the gateway's tool calls, in `npc run`, and from the agents' native hooks (`npc hook run`)"
            }
            Self::InDaemon => "panes and pane plugins run while `npc daemon` runs",
            Self::Ready => "used by `npc run` and `npc render`; no process of its own",
            Self::Configured => {
                "written to the agents' config files; each agent connects to it, npc runs no process"
            }
            Self::Recorded => "settings npc reads; no process of its own",
            Self::Armed => {
                "the daemon fires it into the run queue; see `npc triggers` and `npc runs`"
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_a_standing_its_state_word_reads_back() {
        for kind in super::super::KINDS {
            let standing = Standing::of_kind(kind);
            assert_eq!(
                Standing::of_state(kind.as_str(), standing.state()),
                Some(standing)
            );
            assert_eq!(
                Standing::of_state(kind.as_str(), LEGACY_ACCEPTED),
                Some(standing),
                "an older store's `applied` reads as the kind's standing"
            );
            assert!(
                standing
                    .human()
                    .starts_with(&standing.state().replace('_', " "))
            );
        }
        assert_eq!(Standing::of_state("mcp_server", "running"), None);
        assert_eq!(
            Standing::of_state("trigger", "not running"),
            None,
            "another kind's standing is not this kind's"
        );
        assert_eq!(Standing::of_state("mcp_server", "backoff"), None);
    }
}
