//! Continuing a provider's conversation: the arguments that make each CLI
//! resume conversation `session` (a prompt of `npc acp` that follows an
//! earlier one), and where they go among the launch arguments
//! (`super::launch_plan`'s). Codex and Gemini CLI get none: their headless
//! modes have no per-id resume npc can use.

use crate::model::ProviderKind;

/// The arguments that make `kind`'s CLI continue conversation `session`
/// (`fork`: as a new conversation branching off it).
pub fn args(kind: ProviderKind, session: &str, fork: bool) -> Vec<String> {
    match kind {
        ProviderKind::ClaudeCode => {
            let mut args = vec!["--resume".to_string(), session.to_string()];
            if fork {
                args.push("--fork-session".to_string());
            }
            args
        }
        ProviderKind::Opencode => vec!["--session".to_string(), session.to_string()],
        ProviderKind::Codex | ProviderKind::GeminiCli => Vec::new(),
    }
}

/// Where [`args`] go in a launch's arguments: first for Claude Code, after
/// the `run` subcommand for OpenCode.
pub fn position(kind: ProviderKind, launch: &[String]) -> usize {
    match kind {
        ProviderKind::Opencode => usize::from(launch.first().is_some_and(|a| a == "run")),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn resume_arguments_per_provider_and_their_place() {
        assert_eq!(
            args(ProviderKind::ClaudeCode, "abc", false),
            ["--resume", "abc"]
        );
        assert_eq!(
            args(ProviderKind::ClaudeCode, "abc", true),
            ["--resume", "abc", "--fork-session"]
        );
        assert_eq!(args(ProviderKind::Opencode, "s", false), ["--session", "s"]);
        assert!(args(ProviderKind::Codex, "s", false).is_empty());
        assert!(args(ProviderKind::GeminiCli, "s", true).is_empty());
        assert_eq!(
            position(ProviderKind::Opencode, &strings(&["run", "--format"])),
            1
        );
        assert_eq!(position(ProviderKind::ClaudeCode, &strings(&["-p"])), 0);
    }
}
