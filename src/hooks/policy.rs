//! A profile's tool policy: the gateway refuses the calls its
//! `denied_tools` match, and, when its `allowed_tools` name MCP tools
//! (`mcp__SERVER__TOOL`), every gateway tool they do not (so a tool stays
//! refused however it is called, `call_tool` of `mcp.tools = "search"`
//! included, and a tool search never shows it). The calls its `ask_tools` patterns match need
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
    /// `denied_tools`: refused at the gateway.
    denied: Vec<ToolPattern>,
    /// The MCP patterns of `allowed_tools` (`mcp__…`): when there are any,
    /// the gateway's tools the profile may call.
    allowed: Option<Vec<ToolPattern>>,
}

/// The rule a [`ToolPolicy::refusal`] names when a call is not among the
/// MCP tools a profile's `allowed_tools` name.
pub const ALLOWED_RULE: &str = "allowed_tools";

/// How a profile names an MCP tool in `allowed_tools` (`mcp__SERVER__TOOL`).
pub const MCP_PATTERN_PREFIX: &str = "mcp__";

/// The names a profile's patterns may give gateway tool `name`: as the
/// gateway has it (`SERVER__TOOL`), as an agent has it
/// (`mcp__SERVER__TOOL`), and for a built-in (no `__`) as the agent of a
/// gateway-mode entry has it (`mcp__npc__memory_write`).
fn forms(name: &str) -> Vec<String> {
    let mut forms = vec![name.to_string(), format!("{MCP_PATTERN_PREFIX}{name}")];
    if !name.contains(crate::mcp::NAMESPACE_SEPARATOR) {
        forms.push(format!(
            "{MCP_PATTERN_PREFIX}{}{}{name}",
            crate::mcp::builtin::BUILTIN_SERVER,
            crate::mcp::NAMESPACE_SEPARATOR
        ));
    }
    forms
}

impl ToolPolicy {
    /// The policy of profile `name`; `None` when it has no `ask_tools` (or
    /// no such profile). A pattern that does not parse (the manifest's
    /// validation refuses it) asks about every call: fail closed.
    pub fn for_profile(manifest: &Manifest, name: &str) -> Option<Self> {
        let profile = manifest.profiles.get(name)?;
        // A pattern that does not parse stands for every tool: fail closed.
        let compile = |patterns: &mut dyn Iterator<Item = &String>| -> Vec<ToolPattern> {
            patterns
                .filter_map(|p| {
                    ToolPattern::parse(p)
                        .or_else(|_| ToolPattern::parse("*"))
                        .ok()
                })
                .collect()
        };
        let ask = compile(&mut profile.ask_tools.iter());
        let denied = compile(&mut profile.denied_tools.iter());
        let allowed = compile(
            &mut profile
                .allowed_tools
                .iter()
                .filter(|p| p.trim_start().starts_with(MCP_PATTERN_PREFIX)),
        );
        let allowed = (!allowed.is_empty()).then_some(allowed);
        if ask.is_empty() && denied.is_empty() && allowed.is_none() {
            return None;
        }
        Some(Self {
            profile: name.to_string(),
            ask,
            denied,
            allowed,
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

    /// Whether the policy may refuse a call of a gateway tool (it has
    /// `denied_tools` or names MCP tools in `allowed_tools`).
    pub fn may_refuse(&self) -> bool {
        !self.denied.is_empty() || self.allowed.is_some()
    }

    /// Why the profile refuses `call` of a gateway tool (`SERVER__TOOL`, or
    /// a built-in's name), if it does: a `denied_tools` pattern matches it,
    /// or `allowed_tools` names MCP tools and none of them is this one.
    /// Patterns meet the name as the gateway has it and as an agent has it
    /// (`mcp__SERVER__TOOL`).
    pub fn refuses(&self, call: &ToolCallInfo) -> Option<String> {
        self.refusal(call).map(|(_, reason)| reason)
    }

    /// [`Self::refuses`] with the rule that refuses: the `denied_tools`
    /// pattern, or `allowed_tools` when the call is not among the tools
    /// they name. Returns (rule, reason).
    pub fn refusal(&self, call: &ToolCallInfo) -> Option<(String, String)> {
        if let Some(denied) = self.denial(call) {
            return Some(denied);
        }
        let forms = forms(&call.name);
        match &self.allowed {
            Some(allowed)
                if !allowed
                    .iter()
                    .any(|p| forms.iter().any(|f| p.matches(f, &call.arguments))) =>
            {
                Some((
                    ALLOWED_RULE.to_string(),
                    format!(
                        "profile `{}` allows only the MCP tools its `allowed_tools` name; add `mcp__{}` there to allow this one",
                        self.profile, call.name
                    ),
                ))
            }
            _ => None,
        }
    }

    /// The `denied_tools` pattern that refuses `call`, with the reason: all
    /// the hook bridge applies to an agent CLI's own tools (`allowed_tools`
    /// names MCP tools, which the gateway governs under their own names).
    pub fn denial(&self, call: &ToolCallInfo) -> Option<(String, String)> {
        let forms = forms(&call.name);
        let p = self
            .denied
            .iter()
            .find(|p| forms.iter().any(|f| p.matches(f, &call.arguments)))?;
        Some((
            p.as_str().to_string(),
            format!(
                "profile `{}` denies calls matching `{}` (`denied_tools`)",
                self.profile,
                p.as_str()
            ),
        ))
    }

    /// Whether the profile may call the gateway tool `name` at all (with
    /// some arguments): what a tool search may show it.
    pub fn permits(&self, name: &str) -> bool {
        let forms = forms(name);
        let denied = self
            .denied
            .iter()
            .any(|p| !p.has_subject() && forms.iter().any(|f| p.matches_name(f)));
        let allowed = self
            .allowed
            .as_ref()
            .is_none_or(|a| a.iter().any(|p| forms.iter().any(|f| p.matches_name(f))));
        !denied && allowed
    }
}
