//! A run's tool calls that its CLI refused under the run's own policy
//! (`native::run_policy`), as `tool.denied` events (`by = cli`): each CLI
//! says so in the tool result it streams, in its own words
//! ([`providers::refused`]); the rule is the pattern Gemini CLI's refusal
//! names, else the first of the profile's `denied_tools` / `ask_tools`
//! patterns that matches the call (as the CLI named the tool, or by the
//! patterns' name for it: OpenCode's `bash` is `Bash`), else [`CLI_RULE`].

use std::collections::HashMap;

use serde_json::Value;

use crate::event::{DeniedBy, ToolDenied};
use crate::model::ProviderKind;
use crate::model::pattern::ToolPattern;
use crate::native::permissions::pattern_name;
use crate::native::run_policy::denied_pattern;
use crate::providers::{self, AgentEvent};

/// The rule of a refusal no pattern of the profile explains (the CLI's own
/// settings, or a translated pattern).
pub const CLI_RULE: &str = "the CLI's permission rules";
/// Calls remembered for their arguments: a bound on an agent that never
/// reports results.
pub const MAX_REMEMBERED_CALLS: usize = 1024;

/// Watches one run's agent events for the CLI's refusals.
#[derive(Debug)]
pub struct CliDenials {
    run_id: String,
    profile: String,
    kind: ProviderKind,
    /// The profile's `denied_tools`, then `ask_tools`.
    rules: Vec<String>,
    calls: HashMap<String, (String, Value)>,
}

impl CliDenials {
    pub fn new(run_id: &str, profile: &str, kind: ProviderKind, rules: Vec<String>) -> Self {
        Self {
            run_id: run_id.to_string(),
            profile: profile.to_string(),
            kind,
            rules,
            calls: HashMap::new(),
        }
    }

    /// The denial `event` reports, if it does.
    pub fn note(&mut self, event: &AgentEvent) -> Option<ToolDenied> {
        match event {
            AgentEvent::ToolCall {
                id: Some(id),
                name,
                input,
            } => {
                if self.calls.len() >= MAX_REMEMBERED_CALLS {
                    self.calls.clear();
                }
                self.calls.insert(id.clone(), (name.clone(), input.clone()));
                None
            }
            AgentEvent::ToolResult {
                id,
                name,
                output,
                is_error: true,
            } if providers::refused(self.kind, output) => {
                let call = id.as_deref().and_then(|i| self.calls.remove(i));
                let tool = call
                    .as_ref()
                    .map(|(n, _)| n.clone())
                    .or_else(|| name.clone())
                    .unwrap_or_default();
                let rule = denied_pattern(output)
                    .map(str::to_string)
                    .or_else(|| {
                        let (name, input) = call.as_ref()?;
                        // As the CLI names the tool, else as the patterns do.
                        let names = [Some(name.as_str()), pattern_name(self.kind, name)];
                        self.rules
                            .iter()
                            .find(|r| {
                                ToolPattern::parse(r).is_ok_and(|p| {
                                    names.iter().flatten().any(|n| p.matches(n, input))
                                })
                            })
                            .cloned()
                    })
                    .unwrap_or_else(|| CLI_RULE.to_string());
                Some(ToolDenied {
                    run_id: Some(self.run_id.clone()),
                    profile: Some(self.profile.clone()),
                    tool,
                    rule,
                    by: DeniedBy::Cli,
                    reason: Some(output.chars().take(MAX_REASON_CHARS).collect()),
                })
            }
            _ => None,
        }
    }
}

/// Longest reason kept from a CLI's refusal text.
pub const MAX_REASON_CHARS: usize = 500;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn result(id: &str, output: &str) -> AgentEvent {
        AgentEvent::ToolResult {
            id: Some(id.to_string()),
            name: Some("bash".to_string()),
            output: output.to_string(),
            is_error: true,
        }
    }

    #[test]
    fn a_refusal_names_the_pattern_that_matches_the_call() {
        let rules = vec!["WebFetch".to_string(), "Bash(touch:*)".to_string()];
        let mut d = CliDenials::new("run-1", "p", ProviderKind::Opencode, rules);
        let call = AgentEvent::ToolCall {
            id: Some("c1".to_string()),
            name: "bash".to_string(),
            input: json!({"command": "touch x"}),
        };
        assert_eq!(d.note(&call), None);
        let refusal =
            "The user has specified a rule which prevents you from using this specific tool call.";
        let denied = d.note(&result("c1", refusal)).unwrap();
        assert_eq!(
            (denied.tool.as_str(), denied.rule.as_str(), denied.by),
            ("bash", "Bash(touch:*)", DeniedBy::Cli)
        );
        assert_eq!(denied.run_id.as_deref(), Some("run-1"));
        // A failure that is no refusal, and a refusal of an unknown call.
        assert_eq!(d.note(&result("c2", "exit status 1")), None);
        assert_eq!(d.note(&result("c3", refusal)).unwrap().rule, CLI_RULE);
    }

    #[test]
    fn geminis_refusal_names_its_pattern_itself() {
        let mut d = CliDenials::new("r", "p", ProviderKind::GeminiCli, Vec::new());
        let denied = d
            .note(&result(
                "c",
                "npc policy denies `Bash(rm:*)` (profile `p` `denied_tools`)",
            ))
            .unwrap();
        assert_eq!(denied.rule, "Bash(rm:*)");
    }
}
