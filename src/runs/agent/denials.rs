//! The rule behind a refusal an agent CLI reported itself (the parsers'
//! [`AgentEvent::Denied`]: Claude Code's `permission_denials`, Gemini CLI's
//! `policy_violation`, Codex's declined items, OpenCode's refusals): the
//! pattern Gemini CLI's refusal names (npc's own `denyMessage`), else the
//! first of the profile's `denied_tools` / `ask_tools` patterns that
//! matches the call (as the CLI named the tool, or by the patterns' name
//! for it: OpenCode's `bash` is `Bash`), else [`CLI_RULE`]. The reason is
//! the refusal's text, or the error result the CLI streamed for the call.
//! The run records each as a `tool.denied` (`by = cli`) at its end, unless
//! npc recorded that denial itself (its hook, its gateway).

use std::collections::HashMap;

use serde_json::Value;

use crate::event::{DeniedBy, RunDenial};
use crate::model::ProviderKind;
use crate::model::pattern::ToolPattern;
use crate::native::permissions::pattern_name;
use crate::native::run_policy::denied_pattern;
use crate::providers::AgentEvent;

/// The rule of a refusal no pattern of the profile explains (the CLI's own
/// settings, or a translated pattern).
pub const CLI_RULE: &str = "the CLI's permission rules";
/// Calls (and error results) remembered for a later refusal: a bound on an
/// agent that never reports results.
pub const MAX_REMEMBERED_CALLS: usize = 1024;
/// Longest reason kept from a CLI's refusal text.
pub const MAX_REASON_CHARS: usize = 500;

/// What one run's agent called, to explain the refusals its CLI reports.
#[derive(Debug)]
pub struct CliDenials {
    kind: ProviderKind,
    /// The profile's `denied_tools`, then `ask_tools`.
    rules: Vec<String>,
    calls: HashMap<String, (String, Value)>,
    errors: HashMap<String, String>,
}

impl CliDenials {
    pub fn new(kind: ProviderKind, rules: Vec<String>) -> Self {
        Self {
            kind,
            rules,
            calls: HashMap::new(),
            errors: HashMap::new(),
        }
    }

    /// Remember a call, or the error result of one.
    pub fn remember(&mut self, event: &AgentEvent) {
        if self.calls.len() >= MAX_REMEMBERED_CALLS {
            self.calls.clear();
            self.errors.clear();
        }
        match event {
            AgentEvent::ToolCall {
                id: Some(id),
                name,
                input,
            } => {
                self.calls.insert(id.clone(), (name.clone(), input.clone()));
            }
            AgentEvent::ToolResult {
                id: Some(id),
                output,
                is_error: true,
                ..
            } => {
                self.errors.insert(id.clone(), output.clone());
            }
            _ => {}
        }
    }

    /// The denial of the CLI's refusal of call `id` of `tool`.
    pub fn denial(&self, id: Option<&str>, tool: &str, reason: Option<&str>) -> RunDenial {
        let reason = reason
            .map(str::to_string)
            .or_else(|| id.and_then(|i| self.errors.get(i).cloned()));
        let call = id.and_then(|i| self.calls.get(i));
        let rule = reason
            .as_deref()
            .and_then(denied_pattern)
            .map(str::to_string)
            .or_else(|| {
                let (name, input) = call?;
                // As the CLI names the tool, else as the patterns do.
                let names = [Some(name.as_str()), pattern_name(self.kind, name)];
                self.rules
                    .iter()
                    .find(|r| {
                        ToolPattern::parse(r)
                            .is_ok_and(|p| names.iter().flatten().any(|n| p.matches(n, input)))
                    })
                    .cloned()
            })
            .unwrap_or_else(|| CLI_RULE.to_string());
        RunDenial {
            tool: call.map_or_else(|| tool.to_string(), |(n, _)| n.clone()),
            rule,
            by: DeniedBy::Cli,
            reason: reason.map(|r| r.chars().take(MAX_REASON_CHARS).collect()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(id: &str, name: &str, input: Value) -> AgentEvent {
        AgentEvent::ToolCall {
            id: Some(id.to_string()),
            name: name.to_string(),
            input,
        }
    }

    #[test]
    fn a_refusal_names_the_pattern_that_matches_the_call() {
        let rules = vec!["WebFetch".to_string(), "Bash(touch:*)".to_string()];
        let mut d = CliDenials::new(ProviderKind::Opencode, rules);
        d.remember(&call("c1", "bash", json!({"command": "touch x"})));
        let refusal =
            "The user has specified a rule which prevents you from using this specific tool call.";
        let denied = d.denial(Some("c1"), "bash", Some(refusal));
        assert_eq!(
            (denied.tool.as_str(), denied.rule.as_str(), denied.by),
            ("bash", "Bash(touch:*)", DeniedBy::Cli)
        );
        assert_eq!(denied.reason.as_deref(), Some(refusal));
        // A refusal of a call npc never saw: the CLI's own rules.
        assert_eq!(d.denial(Some("c3"), "bash", Some(refusal)).rule, CLI_RULE);
    }

    #[test]
    fn geminis_refusal_names_its_pattern_itself() {
        let d = CliDenials::new(ProviderKind::GeminiCli, Vec::new());
        let denied = d.denial(
            Some("c"),
            "run_shell_command",
            Some("npc policy denies `Bash(rm:*)` (profile `p` `denied_tools`)"),
        );
        assert_eq!(denied.rule, "Bash(rm:*)");
    }

    #[test]
    fn a_refusal_without_text_takes_the_error_result_of_its_call() {
        let mut d = CliDenials::new(ProviderKind::ClaudeCode, vec!["Bash(touch:*)".to_string()]);
        d.remember(&call("t1", "Bash", json!({"command": "touch x"})));
        d.remember(&AgentEvent::ToolResult {
            id: Some("t1".to_string()),
            name: Some("Bash".to_string()),
            output: "Permission to use Bash has been denied.".to_string(),
            is_error: true,
        });
        let denied = d.denial(Some("t1"), "Bash", None);
        assert_eq!(denied.rule, "Bash(touch:*)");
        assert_eq!(
            denied.reason.as_deref(),
            Some("Permission to use Bash has been denied.")
        );
    }
}
