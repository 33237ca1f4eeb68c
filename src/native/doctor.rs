//! What `npc doctor` checks of an agent CLI's own user-level state, the
//! part that decides whether it reads the files npc writes (checked against
//! the installed versions, see `fixtures/clis/VERSIONS.md`):
//! - Codex reads a repository's `.codex/config.toml` and `.codex/hooks.json`
//!   only in a trusted project (`[projects."ROOT"] trust_level =
//!   "trusted"` in `~/.codex/config.toml`), and runs a project hook only
//!   once its review is stored there (`[hooks.state."FILE:EVENT:GROUP:HANDLER"]
//!   trusted_hash = "sha256:…"`, the key `codex app-server`'s `hooks/list`
//!   reports; the hash changes with the hook);
//! - Gemini CLI reads the workspace settings (the MCP servers and hooks npc
//!   writes) only in a trusted folder (`~/.gemini/trustedFolders.json`:
//!   path → `TRUST_FOLDER` / `TRUST_PARENT` / `DO_NOT_TRUST`, the longest
//!   matching path deciding; `security.folderTrust.enabled = false` turns
//!   the check off), and headless it refuses to start in an untrusted one;
//!   it offers a project agent (`.gemini/agents/NAME.md`) only once the user
//!   acknowledged that file (`~/.gemini/acknowledgments/agents.json`:
//!   project root → agent name → the SHA-256 of the file's text, hex; its
//!   start-up dialog stores it), so an edited agent waits for a new yes.
//!
//! - Claude Code reads a repository's `.claude/settings.json` (its
//!   permissions and hooks) only in a trusted workspace: `projects["ROOT"]
//!   .hasTrustDialogAccepted = true` in `~/.claude.json` (what its trust
//!   dialog stores; `runs::trust` reads it); elsewhere it ignores them
//!   ("this workspace has not been trusted");
//! - OpenCode has no workspace trust: it reads a project's files anywhere.
//!
//! Pure functions over the files' text; the command reads the files.

use std::path::Path;

use serde_json::Value;

use super::hooks::BRIDGE_COMMAND;

/// Codex's trust level of a trusted project.
const CODEX_TRUSTED: &str = "trusted";

/// Whether Codex's `config` (its `config.toml`; `None` when absent) trusts
/// the project at `root` (or a directory above it).
pub fn codex_trusts(config: Option<&str>, root: &Path) -> bool {
    let Some(doc) = config.and_then(|c| c.parse::<toml::Table>().ok()) else {
        return false;
    };
    let Some(projects) = doc.get("projects").and_then(toml::Value::as_table) else {
        return false;
    };
    // The nearest entry decides (an untrusted repository under a trusted
    // parent stays untrusted).
    root.ancestors()
        .find_map(|dir| projects.get(dir.to_str()?))
        .and_then(|p| p.get("trust_level"))
        .and_then(toml::Value::as_str)
        == Some(CODEX_TRUSTED)
}

/// The keys (as Codex names them) of npc's hooks in the project's
/// `hooks.json` (its text, at `hooks_path`) that `config` stores no review
/// for.
pub fn codex_unreviewed_hooks(
    config: Option<&str>,
    hooks_path: &Path,
    hooks_json: &str,
) -> Vec<String> {
    let reviewed: Vec<String> = config
        .and_then(|c| c.parse::<toml::Table>().ok())
        .and_then(|doc| {
            let state = doc.get("hooks")?.get("state")?.as_table()?;
            Some(
                state
                    .iter()
                    .filter(|(_, v)| v.get("trusted_hash").is_some())
                    .map(|(k, _)| k.clone())
                    .collect(),
            )
        })
        .unwrap_or_default();
    let Ok(file) = serde_json::from_str::<Value>(hooks_json) else {
        return Vec::new();
    };
    let mut keys = Vec::new();
    for (event, groups) in file["hooks"].as_object().into_iter().flatten() {
        for (g, group) in groups.as_array().into_iter().flatten().enumerate() {
            for (h, handler) in group["hooks"].as_array().into_iter().flatten().enumerate() {
                let ours = handler["command"]
                    .as_str()
                    .is_some_and(|c| c.starts_with(BRIDGE_COMMAND));
                let key = format!("{}:{}:{g}:{h}", hooks_path.display(), snake_case(event));
                if ours && !reviewed.contains(&key) {
                    keys.push(key);
                }
            }
        }
    }
    keys
}

/// `PreToolUse` → `pre_tool_use`.
fn snake_case(name: &str) -> String {
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// Gemini CLI's trust of a folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GeminiTrust {
    /// Folder trust is off in the user's settings: every folder is trusted.
    CheckOff,
    Trusted,
    Untrusted,
    /// No rule names the folder (headless Gemini refuses to start there).
    Unknown,
}

/// How Gemini CLI trusts `root`, from the user's `settings.json` and
/// `trustedFolders.json` (their text; `None` when absent).
pub fn gemini_trust(
    settings: Option<&str>,
    trusted_folders: Option<&str>,
    root: &Path,
) -> GeminiTrust {
    let parse = |t: Option<&str>| {
        t.and_then(|t| {
            let plain = super::jsonc::strip(
                t,
                super::jsonc::Dialect {
                    trailing_commas: false,
                },
            );
            serde_json::from_str::<Value>(plain.as_deref().unwrap_or(t)).ok()
        })
    };
    let settings = parse(settings).unwrap_or(Value::Null);
    if settings["security"]["folderTrust"]["enabled"] == Value::Bool(false) {
        return GeminiTrust::CheckOff;
    }
    let rules = parse(trusted_folders).unwrap_or(Value::Null);
    let mut best: Option<(usize, GeminiTrust)> = None;
    for (path, level) in rules.as_object().into_iter().flatten() {
        let path = Path::new(path);
        let (scope, trust) = match level.as_str() {
            Some("TRUST_FOLDER") => (Some(path), GeminiTrust::Trusted),
            Some("TRUST_PARENT") => (path.parent(), GeminiTrust::Trusted),
            Some("DO_NOT_TRUST") => (Some(path), GeminiTrust::Untrusted),
            _ => continue,
        };
        let Some(scope) = scope.filter(|s| root.starts_with(s)) else {
            continue;
        };
        let depth = scope.components().count();
        if best.is_none_or(|(d, _)| depth >= d) {
            best = Some((depth, trust));
        }
    }
    best.map_or(GeminiTrust::Unknown, |(_, t)| t)
}

/// The names among `agents` (name, the text of its `.gemini/agents` file)
/// that Gemini CLI's acknowledgements (`acks`, the text of its
/// `acknowledgments/agents.json`; `None` when absent) do not hold for the
/// project at `root` with that text.
pub fn gemini_unacknowledged_agents(
    acks: Option<&str>,
    root: &Path,
    agents: &[(String, String)],
) -> Vec<String> {
    use sha2::Digest as _;
    let acks: Value = acks
        .and_then(|a| serde_json::from_str(a).ok())
        .unwrap_or(Value::Null);
    let project = root.to_str().map_or(&Value::Null, |r| &acks[r]);
    agents
        .iter()
        .filter(|(name, text)| {
            let hash = crate::stdx::hex(&sha2::Sha256::digest(text.as_bytes()));
            project[name.as_str()].as_str() != Some(hash.as_str())
        })
        .map(|(name, _)| name.clone())
        .collect()
}

/// The first `X.Y.Z` in a CLI's `--version` output.
pub fn version_in(output: &str) -> Option<semver::Version> {
    output
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .filter(|w| w.matches('.').count() == 2)
        .find_map(|w| semver::Version::parse(w).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codex_trust_is_the_nearest_project_entry() {
        let root = Path::new("/work/repo");
        assert!(!codex_trusts(None, root));
        let trusted = "[projects.\"/work/repo\"]\ntrust_level = \"trusted\"\n";
        assert!(codex_trusts(Some(trusted), root));
        let parent = "[projects.\"/work\"]\ntrust_level = \"trusted\"\n";
        assert!(codex_trusts(Some(parent), root));
        let both = format!("{parent}[projects.\"/work/repo\"]\ntrust_level = \"untrusted\"\n");
        assert!(!codex_trusts(Some(&both), root));
        assert!(!codex_trusts(Some("not toml ["), root));
    }

    #[test]
    fn codex_hooks_need_a_stored_review_each() {
        let path = Path::new("/work/repo/.codex/hooks.json");
        let hooks = r#"{"hooks": {"PreToolUse": [{"hooks": [{"type": "command", "command": "npc hook run before_tool --agent codex"}]}], "PostToolUse": [{"hooks": [{"type": "command", "command": "mine.sh"}, {"type": "command", "command": "npc hook run after_tool --agent codex"}]}]}}"#;
        assert_eq!(
            codex_unreviewed_hooks(None, path, hooks),
            [
                "/work/repo/.codex/hooks.json:pre_tool_use:0:0",
                "/work/repo/.codex/hooks.json:post_tool_use:0:1"
            ]
        );
        let config = "[hooks.state.\"/work/repo/.codex/hooks.json:pre_tool_use:0:0\"]\ntrusted_hash = \"sha256:00\"\n";
        assert_eq!(
            codex_unreviewed_hooks(Some(config), path, hooks),
            ["/work/repo/.codex/hooks.json:post_tool_use:0:1"]
        );
    }

    #[test]
    fn gemini_trust_is_the_longest_matching_rule() {
        let root = Path::new("/work/repo");
        assert_eq!(gemini_trust(None, None, root), GeminiTrust::Unknown);
        let off = r#"{"security": {"folderTrust": {"enabled": false}}}"#;
        assert_eq!(gemini_trust(Some(off), None, root), GeminiTrust::CheckOff);
        let folder = r#"{"/work/repo": "TRUST_FOLDER"}"#;
        assert_eq!(gemini_trust(None, Some(folder), root), GeminiTrust::Trusted);
        let parent = r#"{"/work/repo/sub": "TRUST_PARENT"}"#;
        assert_eq!(gemini_trust(None, Some(parent), root), GeminiTrust::Trusted);
        let nested = r#"{"/work": "TRUST_FOLDER", "/work/repo": "DO_NOT_TRUST"}"#;
        assert_eq!(
            gemini_trust(None, Some(nested), root),
            GeminiTrust::Untrusted
        );
        let elsewhere = r#"{"/other": "TRUST_FOLDER"}"#;
        assert_eq!(
            gemini_trust(None, Some(elsewhere), root),
            GeminiTrust::Unknown
        );
    }

    #[test]
    fn gemini_agents_need_an_acknowledgement_of_their_text() {
        let root = Path::new("/repo");
        let agents = vec![
            ("a".to_string(), "---\nname: a\n---\nbody\n".to_string()),
            ("b".to_string(), "---\nname: b\n---\nother\n".to_string()),
        ];
        // sha256 of a's text, as Gemini CLI stores it.
        let a = "a8a5ee8ad4ff5d0ba5b8bd4e0d5fbc7b5e3b5e4d7b0a4d9b9c8f3a1e2d3c4b5a";
        let real = {
            use sha2::Digest as _;
            crate::stdx::hex(&sha2::Sha256::digest(agents[0].1.as_bytes()))
        };
        assert_ne!(real, a);
        let acks = serde_json::json!({ "/repo": { "a": real, "b": a } }).to_string();
        assert_eq!(
            gemini_unacknowledged_agents(Some(&acks), root, &agents),
            ["b"]
        );
        assert_eq!(
            gemini_unacknowledged_agents(None, root, &agents),
            ["a", "b"]
        );
        // Acknowledged for another project only.
        let elsewhere = serde_json::json!({ "/other": { "a": real } }).to_string();
        assert_eq!(
            gemini_unacknowledged_agents(Some(&elsewhere), root, &agents[..1]),
            ["a"]
        );
    }

    #[test]
    fn versions_are_read_from_version_lines() {
        let v = |s| version_in(s).map(|v| v.to_string());
        assert_eq!(v("2.1.197 (Claude Code)").as_deref(), Some("2.1.197"));
        assert_eq!(v("codex-cli 0.171.0").as_deref(), Some("0.171.0"));
        assert_eq!(v("0.61.0\n").as_deref(), Some("0.61.0"));
        assert_eq!(v("no version"), None);
    }
}
