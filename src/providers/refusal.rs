//! Whether a tool result an agent CLI streams is its own refusal of the
//! call under its permission rules (a run's policy, `native::run_policy`),
//! in each CLI's own words (checked against the installed versions):
//! - Claude Code: "Permission to use TOOL … has been denied" (a `deny`
//!   rule) and "… requested permissions to …, but you haven't granted it
//!   yet" (an `ask` nobody answers in `-p`).
//! - Gemini CLI: npc's own `denyMessage` ([`POLICY_MARK`], the same text
//!   which `native::run_policy` writes in the policy file).
//! - OpenCode: "The user has specified a rule which prevents you from
//!   using this specific tool call".
//! - Codex CLI refuses nothing by a per-tool rule.

use crate::model::ProviderKind;

/// Claude Code's refusal texts.
const CLAUDE: [&str; 2] = ["has been denied", "but you haven't granted it yet"];
/// OpenCode's refusal text.
const OPENCODE: &str =
    "The user has specified a rule which prevents you from using this specific tool call";
/// The start of the `denyMessage` of npc's Gemini CLI rules.
pub const POLICY_MARK: &str = "npc policy denies";

/// Whether `output` (an error tool result of `kind`) is the CLI's refusal.
pub fn refused(kind: ProviderKind, output: &str) -> bool {
    match kind {
        ProviderKind::ClaudeCode => {
            (output.contains("Permission to use") && CLAUDE.iter().any(|t| output.contains(t)))
                || output.contains(CLAUDE[1])
        }
        ProviderKind::GeminiCli => output.contains(POLICY_MARK),
        ProviderKind::Opencode => output.contains(OPENCODE),
        ProviderKind::Codex => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_cli_refusal_is_recognised_in_its_own_words() {
        assert!(refused(
            ProviderKind::ClaudeCode,
            "Permission to use Bash with command rm x has been denied."
        ));
        assert!(refused(
            ProviderKind::ClaudeCode,
            "Claude requested permissions to use Bash, but you haven't granted it yet."
        ));
        assert!(!refused(ProviderKind::ClaudeCode, "command failed: exit 1"));
        assert!(refused(
            ProviderKind::GeminiCli,
            "npc policy denies `Bash(rm:*)` (profile `a` `denied_tools`)"
        ));
        assert!(refused(
            ProviderKind::Opencode,
            &format!("{OPENCODE}. Here are")
        ));
        assert!(!refused(ProviderKind::Codex, "has been denied"));
    }
}
