//! A profile's tool patterns (`allowed_tools`, `ask_tools`, `denied_tools`)
//! as each agent CLI takes them for ONE run, through what it reads per
//! invocation — never a repository file another profile shares (checked
//! against the installed CLIs, `fixtures/clis/VERSIONS.md`):
//! - Claude Code: `--settings JSON` with `permissions.allow` / `ask` /
//!   `deny`, the patterns as written (flag settings merge over the
//!   project's; a deny anywhere wins). In `-p` nobody answers an `ask`:
//!   Claude Code refuses the call.
//! - Gemini CLI: `--policy FILE`, a policy-engine TOML file in the run's
//!   directory (user tier, above the workspace and `--yolo` defaults):
//!   `deny` rules (with [`DENY_MARK`] in their `denyMessage`, so the refusal
//!   is recognised in its stream) for `denied_tools` and for `ask_tools`
//!   (nobody can answer an unattended run), `allow` rules for
//!   `allowed_tools`.
//! - OpenCode: `OPENCODE_PERMISSION` (JSON merged over every config file),
//!   the `permission` rules of [`super::permissions::opencode_permission`];
//!   an `ask` is `deny` there (`opencode run` has nobody to ask).
//! - Codex CLI has no per-tool list for its own tools (an approval policy
//!   and a sandbox only): its gateway tools are the gateway's to refuse.
//!
//! In gateway mode an MCP tool's `denied_tools` / `ask_tools` pattern
//! (`mcp__SERVER__TOOL`) is left to the gateway, which knows the run's
//! profile from the entry's `env` and records each refusal as a
//! `tool.denied` of the run (the CLI would hide the tool and nothing would
//! be recorded); its `allowed_tools` patterns reach the CLI as the gateway
//! entry's tools (`mcp__npc__SERVER__TOOL`), so the CLI runs them without
//! asking.

use serde_json::{Value, json};

use super::gateway::GATEWAY_ENTRY;
use super::permissions::{claude_lists, gemini_tool, opencode_permission};
use crate::model::{Manifest, Profile, ProviderKind};

/// How a refusal by a run's own policy names itself in Gemini CLI's
/// stream (its `denyMessage`), followed by the pattern.
/// The start of the `denyMessage` of npc's Gemini CLI rules: a refusal
/// that names the pattern ([`denied_pattern`] reads it back).
pub const DENY_MARK: &str = "npc policy denies";

/// Gemini CLI policy priority of npc's rules (within the user tier, whose
/// range is 0..=999): above the tier's own flag rules.
const GEMINI_PRIORITY: u32 = 900;

/// Prefix of an MCP tool pattern (`mcp__SERVER__TOOL`).
const MCP_PREFIX: &str = "mcp__";

/// A run's tool policy for one CLI: what goes on its command line or in its
/// environment ([`crate::providers::RunPolicy`] takes it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunPolicyText {
    /// Claude Code: the `--settings` JSON.
    ClaudeSettings { json: String },
    /// Gemini CLI: the text of the `--policy` file.
    GeminiPolicy { toml: String },
    /// OpenCode: the `OPENCODE_PERMISSION` JSON.
    OpencodePermission { json: String },
}

/// `profile`'s patterns as the CLI of `kind` runs them: in gateway mode the
/// MCP denies and asks are the gateway's, and the MCP allows name the
/// gateway's entry.
fn effective(manifest: &Manifest, profile: &Profile) -> Profile {
    let gateway = manifest.mcp.gateway;
    let is_mcp = |p: &String| p.trim_start().starts_with(MCP_PREFIX);
    let native = |list: &[String]| -> Vec<String> {
        list.iter()
            .filter(|p| !(gateway && is_mcp(p)))
            .cloned()
            .collect()
    };
    let allowed = profile
        .allowed_tools
        .iter()
        .map(|p| match p.trim_start().strip_prefix(MCP_PREFIX) {
            Some(rest) if gateway => format!("{MCP_PREFIX}{GATEWAY_ENTRY}__{rest}"),
            _ => p.clone(),
        })
        .collect();
    Profile {
        allowed_tools: allowed,
        ask_tools: native(&profile.ask_tools),
        denied_tools: native(&profile.denied_tools),
        ..profile.clone()
    }
}

/// The run policy of `profile` (named `name`) for `kind`; `None` when it has
/// nothing the CLI can be told.
pub fn run_policy(
    manifest: &Manifest,
    name: &str,
    profile: &Profile,
    kind: ProviderKind,
) -> Option<RunPolicyText> {
    let p = effective(manifest, profile);
    if p.allowed_tools.is_empty() && p.ask_tools.is_empty() && p.denied_tools.is_empty() {
        return None;
    }
    match kind {
        ProviderKind::ClaudeCode => {
            let mut permissions = serde_json::Map::new();
            for (list, patterns) in claude_lists(&p) {
                if !patterns.is_empty() {
                    permissions.insert(list.to_string(), json!(patterns));
                }
            }
            Some(RunPolicyText::ClaudeSettings {
                json: json!({ "permissions": permissions }).to_string(),
            })
        }
        ProviderKind::GeminiCli => {
            gemini_policy(name, &p).map(|toml| RunPolicyText::GeminiPolicy { toml })
        }
        ProviderKind::Opencode => {
            // `opencode run` has nobody to ask: an ask is a deny.
            let unattended = Profile {
                denied_tools: p.denied_tools.iter().chain(&p.ask_tools).cloned().collect(),
                ask_tools: Vec::new(),
                ..p
            };
            let (permission, _) = opencode_permission(&unattended);
            (!permission.is_empty()).then(|| RunPolicyText::OpencodePermission {
                json: Value::Object(permission).to_string(),
            })
        }
        ProviderKind::Codex => None,
    }
}

/// One Gemini CLI policy rule for npc pattern `pattern`; `None` when Gemini
/// CLI has no such tool.
fn gemini_rule(pattern: &str, decision: &str, message: Option<&str>) -> Option<String> {
    let tool = gemini_tool(pattern)?;
    let (name, prefix) = match tool.split_once('(') {
        Some((name, rest)) => (name.to_string(), rest.strip_suffix(')').map(str::to_string)),
        None => (tool, None),
    };
    let q = |s: &str| toml::Value::String(s.to_string()).to_string();
    let mut rule = format!(
        "[[rule]]\ntoolName = {}\ndecision = {}\npriority = {GEMINI_PRIORITY}\n",
        q(&name),
        q(decision)
    );
    if let Some(prefix) = prefix {
        rule.push_str(&format!("commandPrefix = {}\n", q(&prefix)));
    }
    if let Some(message) = message {
        rule.push_str(&format!("denyMessage = {}\n", q(message)));
    }
    Some(rule)
}

/// The `--policy` file text of profile `name` (its effective patterns);
/// `None` when no pattern names a Gemini CLI tool.
fn gemini_policy(name: &str, p: &Profile) -> Option<String> {
    let mut rules = Vec::new();
    for pattern in &p.allowed_tools {
        // Gemini CLI matches a shell command by prefix only: an exact
        // subject (`Bash(ls)`) would allow `lsof` too, so it is left out
        // (narrower, never wider than the profile).
        if pattern
            .split_once('(')
            .is_some_and(|(_, rest)| !rest.ends_with(":*)"))
        {
            continue;
        }
        rules.extend(gemini_rule(pattern, "allow", None));
    }
    for (list, patterns) in [
        ("denied_tools", &p.denied_tools),
        ("ask_tools", &p.ask_tools),
    ] {
        for pattern in patterns {
            let message = format!(
                "{DENY_MARK} `{pattern}` (profile `{name}` `{list}`; nobody answers an ask in an unattended run)"
            );
            // A subject Gemini CLI cannot match (a file, a domain) denies
            // the whole tool: wider than the profile, never a silent allow.
            let rule = gemini_rule(pattern, "deny", Some(&message)).or_else(|| {
                let (tool, _) = pattern.split_once('(')?;
                gemini_rule(tool, "deny", Some(&message))
            });
            rules.extend(rule);
        }
    }
    (!rules.is_empty()).then(|| rules.join("\n"))
}

/// The pattern a Gemini CLI refusal text names, when a rule of
/// [`gemini_policy`] refused (`None` for any other error).
pub fn denied_pattern(text: &str) -> Option<&str> {
    let rest = &text[text.find(DENY_MARK)? + DENY_MARK.len()..];
    let rest = rest.trim_start().strip_prefix('`')?;
    rest.split_once('`').map(|(pattern, _)| pattern)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: &str = "version = 1\n[mcp]\ngateway = true\n[mcp.servers.fs]\ncommand = \"x\"\n[providers.c]\nkind = \"claude_code\"\n[profiles.one]\nprovider = \"c\"\ndescription = \"d\"\nallowed_tools = [\"Bash(ls)\", \"mcp__fs__read\"]\nask_tools = [\"Bash(git push:*)\", \"mcp__fs__write\"]\ndenied_tools = [\"WebFetch\", \"mcp__fs__delete\"]\n[profiles.two]\nprovider = \"c\"\ndescription = \"e\"\nallowed_tools = [\"Bash\"]\n";

    fn policy(kind: ProviderKind, name: &str) -> Option<RunPolicyText> {
        let m =
            crate::native::commands::tests::manifest(&TWO.replace("claude_code", kind.as_str()));
        run_policy(&m, name, &m.profiles[name], kind)
    }

    #[test]
    fn claude_gets_the_runs_own_lists_with_gateway_tools_left_to_the_gateway() {
        let Some(RunPolicyText::ClaudeSettings { json }) = policy(ProviderKind::ClaudeCode, "one")
        else {
            panic!()
        };
        let v: Value = serde_json::from_str(&json).unwrap();
        assert_eq!(
            v,
            json!({"permissions": {
                "allow": ["Bash(ls)", "mcp__npc__fs__read"],
                "ask": ["Bash(git push:*)"],
                "deny": ["WebFetch"],
            }})
        );
        // The other profile of the same CLI: its own, nothing of the first's.
        let Some(RunPolicyText::ClaudeSettings { json }) = policy(ProviderKind::ClaudeCode, "two")
        else {
            panic!()
        };
        assert_eq!(json, r#"{"permissions":{"allow":["Bash"]}}"#);
    }

    #[test]
    fn gemini_denies_asks_and_denials_with_a_message_npc_recognises() {
        let Some(RunPolicyText::GeminiPolicy { toml }) = policy(ProviderKind::GeminiCli, "one")
        else {
            panic!()
        };
        let doc: toml::Table = toml.parse().unwrap();
        let rules = doc["rule"].as_array().unwrap();
        let push = rules
            .iter()
            .find(|r| r.get("commandPrefix").and_then(|p| p.as_str()) == Some("git push"))
            .unwrap();
        assert_eq!(push["decision"].as_str(), Some("deny"));
        assert_eq!(
            denied_pattern(push["denyMessage"].as_str().unwrap()),
            Some("Bash(git push:*)")
        );
        assert!(
            rules
                .iter()
                .any(|r| r["toolName"].as_str() == Some("web_fetch")
                    && r["decision"].as_str() == Some("deny"))
        );
        assert!(
            rules
                .iter()
                .any(|r| r["toolName"].as_str() == Some("mcp_npc_fs__read")
                    && r["decision"].as_str() == Some("allow"))
        );
        assert_eq!(denied_pattern("Tool execution denied"), None);
    }

    #[test]
    fn a_hostile_pattern_stays_one_quoted_value_in_every_form() {
        // A pattern that tries to end its TOML string and add an `allow`.
        let evil = "Bash(x\"\ndecision = \"allow\"\npriority = 999\n#:*)";
        let m = crate::native::commands::tests::manifest(
            "version = 1\n[providers.g]\nkind = \"gemini_cli\"\n[profiles.p]\nprovider = \"g\"\ndescription = \"d\"\n",
        );
        let mut profile = m.profiles["p"].clone();
        profile.denied_tools = vec![evil.to_string()];
        let Some(RunPolicyText::GeminiPolicy { toml }) =
            run_policy(&m, "p", &profile, ProviderKind::GeminiCli)
        else {
            panic!()
        };
        let doc: toml::Table = toml.parse().unwrap();
        let rules = doc["rule"].as_array().unwrap();
        assert_eq!(rules.len(), 1, "{toml}");
        assert_eq!(rules[0]["decision"].as_str(), Some("deny"), "{toml}");
        assert!(
            rules[0]["commandPrefix"]
                .as_str()
                .unwrap()
                .contains("decision = \"allow\""),
            "{toml}"
        );
        let Some(RunPolicyText::ClaudeSettings { json }) =
            run_policy(&m, "p", &profile, ProviderKind::ClaudeCode)
        else {
            panic!()
        };
        let v: Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["permissions"]["deny"], json!([evil]));
    }

    #[test]
    fn opencode_asks_are_denials_and_codex_has_no_list() {
        let Some(RunPolicyText::OpencodePermission { json }) =
            policy(ProviderKind::Opencode, "one")
        else {
            panic!()
        };
        let v: Value = serde_json::from_str(&json).unwrap();
        assert_eq!(
            v["bash"],
            json!({"ls": "allow", "git push *": "deny"}),
            "{v}"
        );
        assert_eq!(v["webfetch"], "deny");
        assert_eq!(policy(ProviderKind::Codex, "one"), None);
    }

    #[test]
    fn gemini_never_gets_a_wider_allow_or_a_dropped_deny() {
        let m = crate::native::commands::tests::manifest(
            "version = 1\n[providers.g]\nkind = \"gemini_cli\"\n[profiles.p]\nprovider = \"g\"\ndescription = \"d\"\n",
        );
        let profile = |allowed: &[&str], denied: &[&str]| Profile {
            allowed_tools: allowed.iter().map(|s| s.to_string()).collect(),
            denied_tools: denied.iter().map(|s| s.to_string()).collect(),
            ..m.profiles["p"].clone()
        };
        // An exact shell allow is left out; a prefix allow stays.
        let text = gemini_policy("p", &profile(&["Bash(ls)", "Bash(git diff:*)"], &[])).unwrap();
        assert!(!text.contains("\"ls\""), "{text}");
        assert!(text.contains("commandPrefix = \"git diff\""), "{text}");
        // A deny of a file or a domain denies the whole tool.
        let text = gemini_policy(
            "p",
            &profile(&[], &["Read(.env)", "WebFetch(domain:x.com)"]),
        )
        .unwrap();
        assert!(text.contains("toolName = \"read_file\""), "{text}");
        assert!(text.contains("toolName = \"web_fetch\""), "{text}");
        assert_eq!(text.matches("decision = \"deny\"").count(), 2, "{text}");
    }
}
