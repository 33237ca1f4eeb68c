//! A profile's tool patterns (`allowed_tools`, `ask_tools`, `denied_tools`,
//! Claude Code's syntax: `Bash`, `Bash(git diff:*)`, `mcp__fs__*`) as each
//! agent CLI's native permission settings, checked against the installed
//! CLIs:
//! - Claude Code (2.1): `.claude/settings.json` `permissions.allow`, `ask`
//!   and `deny`, the patterns as written. npc's entries are the ones it
//!   added (the store keeps them, as for MCP entries); a user's entry is
//!   never removed, and one the user already has is not added twice.
//! - OpenCode (1.18): `permission` — `{TOOL: "allow" | "ask" | "deny"}` or
//!   `{TOOL: {PATTERN: ACTION}}` — in `opencode.json` and in an agent file's
//!   frontmatter. [`opencode_rule`] translates: `Bash(git diff:*)` becomes
//!   `bash: {"git diff *": …}`, `Edit`/`Write` `edit`, `mcp__fs__read`
//!   OpenCode's MCP tool name `fs_read`, `*` every tool.
//! - Gemini CLI (0.61) has `tools.allowed` (no confirmation) and
//!   `tools.exclude` (not offered) with its own tool names
//!   (`run_shell_command(git diff)`), and no "ask" (asking is its default);
//!   not written yet.
//! - Codex CLI (0.171) has no per-tool list, only an approval policy and a
//!   sandbox: nothing of a pattern list can be expressed there.
//!
//! The repository-level settings take the patterns of the profile that
//! stands for the CLI ([`repository_profile`]): the only profile the CLI
//! runs, else the one named `default` (as `npc acp` picks its profile).

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::{Map, Value, json};

use super::NativeError;
use super::edit::{parse_native_json, rewrite_json};
use crate::model::{Manifest, Profile, ProviderKind};

/// The profile name that stands for the repository when a CLI runs several.
pub const DEFAULT_PROFILE: &str = "default";

/// The profile whose tool patterns become `kind`'s repository-level
/// permissions: the only profile `kind` runs, else the one named
/// [`DEFAULT_PROFILE`] when `kind` runs it.
pub fn repository_profile(manifest: &Manifest, kind: ProviderKind) -> Option<(&str, &Profile)> {
    let runs = |p: &Profile| manifest.providers.get(&p.provider).map(|v| v.kind) == Some(kind);
    let mine: Vec<(&String, &Profile)> =
        manifest.profiles.iter().filter(|(_, p)| runs(p)).collect();
    match mine.as_slice() {
        [(name, p)] => Some((name.as_str(), p)),
        _ => mine
            .into_iter()
            .find(|(name, _)| name.as_str() == DEFAULT_PROFILE)
            .map(|(name, p)| (name.as_str(), p)),
    }
}

/// Claude Code's permission lists, in order.
const CLAUDE_LISTS: [&str; 3] = ["allow", "ask", "deny"];

/// Claude Code's three lists for `profile`: (`allow`, `ask`, `deny`).
pub fn claude_lists(profile: &Profile) -> [(&'static str, &[String]); 3] {
    [
        (CLAUDE_LISTS[0], profile.allowed_tools.as_slice()),
        (CLAUDE_LISTS[1], profile.ask_tools.as_slice()),
        (CLAUDE_LISTS[2], profile.denied_tools.as_slice()),
    ]
}

/// Claude Code's built-in tools and the OpenCode permission each maps to.
const OPENCODE_TOOLS: [(&str, &str); 12] = [
    ("Bash", "bash"),
    ("Read", "read"),
    ("Edit", "edit"),
    ("Write", "edit"),
    ("MultiEdit", "edit"),
    ("NotebookEdit", "edit"),
    ("Glob", "glob"),
    ("Grep", "grep"),
    ("WebFetch", "webfetch"),
    ("WebSearch", "websearch"),
    ("Task", "task"),
    ("TodoWrite", "todowrite"),
];

/// One npc pattern as an OpenCode permission: (key, sub-pattern).
/// `None` when OpenCode has no such tool.
pub fn opencode_rule(pattern: &str) -> Option<(String, Option<String>)> {
    let (name, subject) = match pattern.split_once('(') {
        Some((name, rest)) => (name, Some(rest.strip_suffix(')')?)),
        None => (pattern, None),
    };
    let key = if name == "*" {
        "*".to_string()
    } else if let Some(mcp) = name.strip_prefix("mcp__") {
        // OpenCode names an MCP tool `SERVER_TOOL`.
        mcp.replacen("__", "_", 1)
    } else {
        OPENCODE_TOOLS
            .iter()
            .find(|(claude, _)| *claude == name)
            .map(|(_, oc)| oc.to_string())?
    };
    // `PREFIX:*` is a command prefix: OpenCode's `PREFIX *`.
    let subject = subject.map(|s| match s.strip_suffix(":*") {
        Some(prefix) => format!("{prefix} *"),
        None => s.to_string(),
    });
    Some((key, subject))
}

/// OpenCode's `permission` object for `profile`'s patterns (allow, then
/// ask, then deny: a later rule for the same key wins; a whole-tool rule
/// is its patterns' `*`, first, since OpenCode's last matching pattern
/// wins), and the patterns it cannot express.
pub fn opencode_permission(profile: &Profile) -> (Map<String, Value>, Vec<String>) {
    let mut out = Map::new();
    let mut skipped = Vec::new();
    for (action, list) in [
        ("allow", &profile.allowed_tools),
        ("ask", &profile.ask_tools),
        ("deny", &profile.denied_tools),
    ] {
        for pattern in list {
            let Some((key, subject)) = opencode_rule(pattern) else {
                skipped.push(pattern.clone());
                continue;
            };
            match subject {
                None => match out.get_mut(&key).and_then(Value::as_object_mut) {
                    // Rules by pattern before: the whole tool is their `*`.
                    // OpenCode's last matching rule wins: `*` goes first.
                    Some(map) => {
                        map.shift_remove("*");
                        map.shift_insert(0, "*".into(), json!(action));
                    }
                    None => {
                        out.insert(key, json!(action));
                    }
                },
                Some(subject) => {
                    let entry = out.entry(key).or_insert_with(|| json!({}));
                    if !entry.is_object() {
                        // A whole-tool rule before: it becomes the `*` rule.
                        *entry = json!({ "*": entry.clone() });
                    }
                    if let Some(map) = entry.as_object_mut() {
                        map.insert(subject, json!(action));
                    }
                }
            }
        }
    }
    (out, skipped)
}

/// How the store names one of npc's entries in Claude Code's lists
/// (`allow:Bash(ls)`).
fn managed_name(list: &str, pattern: &str) -> String {
    format!("{list}:{pattern}")
}

/// Claude Code's settings text (`before`, `None` when absent) with npc's
/// `permissions` entries brought in line with the repository profile's
/// patterns. `previously` names the entries npc added before (from the
/// store); returns the text, the entries npc manages now, and notes.
pub fn claude_edit(
    path: &Path,
    before: Option<&str>,
    manifest: &Manifest,
    previously: &BTreeSet<String>,
) -> Result<(String, BTreeSet<String>, Vec<String>), NativeError> {
    let kind = ProviderKind::ClaudeCode;
    let mut notes = Vec::new();
    let profile = repository_profile(manifest, kind).map(|(_, p)| p);
    if profile.is_none()
        && manifest.profiles.values().any(|p| {
            manifest.providers.get(&p.provider).map(|v| v.kind) == Some(kind)
                && !(p.allowed_tools.is_empty()
                    && p.ask_tools.is_empty()
                    && p.denied_tools.is_empty())
        })
    {
        notes.push(format!(
            "Claude Code runs several profiles and none is named `{DEFAULT_PROFILE}`; no profile's tool patterns become the repository's permissions"
        ));
    }
    let due = profile.is_some_and(|p| claude_lists(p).iter().any(|(_, l)| !l.is_empty()));
    let (mut root, stripped) = match before {
        Some(text) => parse_native_json(path, kind, text)?,
        None if !due => return Ok((String::new(), BTreeSet::new(), notes)),
        None => (Map::new(), None),
    };
    let original = root.clone();
    let mut permissions = match root.get("permissions") {
        None => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(_) => {
            return Err(NativeError::Shape {
                path: path.into(),
                message: "`permissions` is not a JSON object".into(),
            });
        }
    };
    let mut managed = BTreeSet::new();
    for (index, list) in CLAUDE_LISTS.into_iter().enumerate() {
        let patterns: &[String] = profile.map_or(&[], |p| claude_lists(p)[index].1);
        let mut entries = match permissions.get(list) {
            None => Vec::new(),
            Some(Value::Array(a)) => a.clone(),
            Some(_) => {
                return Err(NativeError::Shape {
                    path: path.into(),
                    message: format!("`permissions.{list}` is not a JSON array"),
                });
            }
        };
        let had = permissions.contains_key(list);
        entries.retain(|e| {
            !e.as_str()
                .is_some_and(|e| previously.contains(&managed_name(list, e)))
        });
        for pattern in patterns {
            if entries.iter().any(|e| e.as_str() == Some(pattern)) {
                // The user's own entry: kept, never npc's.
                continue;
            }
            entries.push(Value::String(pattern.clone()));
            managed.insert(managed_name(list, pattern));
        }
        if entries.is_empty() {
            if had && original_is_empty(&original, list) {
                continue;
            }
            permissions.shift_remove(list);
        } else {
            permissions.insert(list.to_string(), Value::Array(entries));
        }
    }
    if permissions.is_empty() {
        if !original
            .get("permissions")
            .is_some_and(|p| p.as_object().is_some_and(Map::is_empty))
        {
            root.shift_remove("permissions");
        }
    } else {
        root.insert("permissions".into(), Value::Object(permissions));
    }
    let text = rewrite_json(
        path,
        kind,
        before,
        stripped.as_deref(),
        original,
        root,
        &mut notes,
    )?;
    Ok((text, managed, notes))
}

/// Whether `permissions.LIST` was an empty array in the user's file (kept so).
fn original_is_empty(original: &Map<String, Value>, list: &str) -> bool {
    original
        .get("permissions")
        .and_then(|p| p.get(list))
        .and_then(Value::as_array)
        .is_some_and(Vec::is_empty)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_translate_to_opencode_rules() {
        assert_eq!(opencode_rule("Bash"), Some(("bash".into(), None)));
        assert_eq!(
            opencode_rule("Bash(git diff:*)"),
            Some(("bash".into(), Some("git diff *".into())))
        );
        assert_eq!(opencode_rule("Write"), Some(("edit".into(), None)));
        assert_eq!(
            opencode_rule("mcp__fs__read_file"),
            Some(("fs_read_file".into(), None))
        );
        assert_eq!(opencode_rule("mcp__fs__*"), Some(("fs_*".into(), None)));
        assert_eq!(opencode_rule("*"), Some(("*".into(), None)));
        assert_eq!(opencode_rule("Frobnicate"), None);
        assert_eq!(opencode_rule("Bash(unclosed"), None);
    }

    const CLAUDE: &str = "version = 1\n[providers.c]\nkind = \"claude_code\"\n[profiles.dev]\nprovider = \"c\"\ndescription = \"d\"\nallowed_tools = [\"Bash(ls)\", \"mcp__fs__*\"]\nask_tools = [\"Bash(git push:*)\"]\ndenied_tools = [\"WebFetch\"]\n";

    #[test]
    fn claude_permissions_are_npcs_entries_beside_the_users() {
        let path = Path::new(".claude/settings.json");
        let m = crate::native::commands::tests::manifest(CLAUDE);
        let user =
            r#"{"permissions":{"allow":["Bash(ls)","Read"],"defaultMode":"plan"},"model":"x"}"#;
        let (text, managed, _) = claude_edit(path, Some(user), &m, &BTreeSet::new()).unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            v["permissions"]["allow"],
            json!(["Bash(ls)", "Read", "mcp__fs__*"])
        );
        assert_eq!(v["permissions"]["ask"], json!(["Bash(git push:*)"]));
        assert_eq!(v["permissions"]["deny"], json!(["WebFetch"]));
        assert_eq!(v["permissions"]["defaultMode"], "plan");
        // `Bash(ls)` was the user's: not npc's to remove.
        assert_eq!(
            managed,
            BTreeSet::from([
                "allow:mcp__fs__*".to_string(),
                "ask:Bash(git push:*)".to_string(),
                "deny:WebFetch".to_string()
            ])
        );
        let (again, same, _) = claude_edit(path, Some(&text), &m, &managed).unwrap();
        assert_eq!((again.as_str(), &same), (text.as_str(), &managed));
        // Dropped from the manifest: the user's file comes back.
        let none = crate::native::commands::tests::manifest("version = 1\n");
        let (gone, left, _) = claude_edit(path, Some(&text), &none, &managed).unwrap();
        assert!(left.is_empty());
        let v: Value = serde_json::from_str(&gone).unwrap();
        assert_eq!(v, serde_json::from_str::<Value>(user).unwrap());
        // No file and nothing due: nothing is created.
        assert!(
            claude_edit(path, None, &none, &BTreeSet::new())
                .unwrap()
                .0
                .is_empty()
        );
    }

    #[test]
    fn the_repository_profile_is_the_only_one_else_default() {
        let two = format!("{CLAUDE}[profiles.other]\nprovider = \"c\"\ndescription = \"o\"\n");
        let m = crate::native::commands::tests::manifest(&two);
        assert!(repository_profile(&m, ProviderKind::ClaudeCode).is_none());
        let (text, _, notes) =
            claude_edit(Path::new("s.json"), None, &m, &BTreeSet::new()).unwrap();
        assert!(text.is_empty());
        assert!(notes[0].contains("none is named `default`"), "{notes:?}");
        let named = two.replace("[profiles.other]", "[profiles.default]");
        let m = crate::native::commands::tests::manifest(&named);
        assert_eq!(
            repository_profile(&m, ProviderKind::ClaudeCode).unwrap().0,
            "default"
        );
        let m = crate::native::commands::tests::manifest(CLAUDE);
        assert_eq!(
            repository_profile(&m, ProviderKind::ClaudeCode).unwrap().0,
            "dev"
        );
        assert!(repository_profile(&m, ProviderKind::Codex).is_none());
    }
}
