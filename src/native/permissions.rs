//! A profile's tool patterns (`allowed_tools`, `ask_tools`, `denied_tools`,
//! Claude Code's syntax: `Bash`, `Bash(git diff:*)`, `mcp__fs__*`) as each
//! agent CLI's native permission settings, checked against the installed
//! CLIs:
//! - Claude Code (2.1): `.claude/settings.json` `permissions.allow`, `ask`
//!   and `deny`, the patterns as written. npc's entries are the ones it
//!   added (the store keeps them, as for MCP entries); a user's entry is
//!   never removed, and one the user already has is not added twice.
//! - OpenCode (1.18): `permission` — `{TOOL: "allow" | "ask" | "deny"}` or
//!   `{TOOL: {PATTERN: ACTION}}` — in `opencode.json` (npc's keys only; a
//!   key the user set wins) and in an agent file's frontmatter. [`opencode_rule`] translates: `Bash(git diff:*)` becomes
//!   `bash: {"git diff *": …}`, `Edit`/`Write` `edit`, `mcp__fs__read`
//!   OpenCode's MCP tool name `fs_read`, `*` every tool.
//! - Gemini CLI (0.61): `.gemini/settings.json` `tools.allowed` (run
//!   without asking) and `tools.exclude` (never offered), in its own tool
//!   names ([`gemini_tool`]: `Bash(git diff:*)` is `run_shell_command(git
//!   diff)`, `mcp__fs__read` `mcp_fs_read`); asking is its default, so
//!   `ask_tools` need no entry. Its policy engine's workspace policies
//!   (`.gemini/policies/*.toml`) are disabled in 0.61.
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

/// How the store names one of npc's entries in a list (`allow:Bash(ls)`,
/// `tools.exclude:run_shell_command`).
fn managed_name(list: &str, pattern: &str) -> String {
    format!("{list}:{pattern}")
}

/// The settings text (`before`, `None` when absent) with npc's entries of
/// the arrays `container.LIST` brought in line with `lists` (each list's
/// name in the store, its key, the entries due). `previously` names the
/// entries npc added before; a user's entry is never removed, and one the
/// user already has is not added twice (and stays the user's). Returns the
/// text and the entries npc manages now.
fn edit_lists(
    path: &Path,
    kind: ProviderKind,
    before: Option<&str>,
    container: &str,
    lists: &[(&str, &str, Vec<String>)],
    previously: &BTreeSet<String>,
    notes: &mut Vec<String>,
) -> Result<(String, BTreeSet<String>), NativeError> {
    let due = lists.iter().any(|(_, _, l)| !l.is_empty());
    let (mut root, stripped) = match before {
        Some(text) => parse_native_json(path, kind, text)?,
        None if !due => return Ok((String::new(), BTreeSet::new())),
        None => (Map::new(), None),
    };
    let original = root.clone();
    let shape = |message: String| NativeError::Shape {
        path: path.into(),
        message,
    };
    let mut section = match root.get(container) {
        None => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(_) => return Err(shape(format!("`{container}` is not a JSON object"))),
    };
    let mut managed = BTreeSet::new();
    for (name, key, patterns) in lists {
        let mut entries = match section.get(*key) {
            None => Vec::new(),
            Some(Value::Array(a)) => a.clone(),
            Some(_) => return Err(shape(format!("`{container}.{key}` is not a JSON array"))),
        };
        let users_empty = section
            .get(*key)
            .and_then(Value::as_array)
            .is_some_and(Vec::is_empty);
        entries.retain(|e| {
            !e.as_str()
                .is_some_and(|e| previously.contains(&managed_name(name, e)))
        });
        for pattern in patterns {
            if entries.iter().any(|e| e.as_str() == Some(pattern)) {
                continue;
            }
            entries.push(Value::String(pattern.clone()));
            managed.insert(managed_name(name, pattern));
        }
        if !entries.is_empty() {
            section.insert(key.to_string(), Value::Array(entries));
        } else if !users_empty {
            section.shift_remove(*key);
        }
    }
    if section.is_empty() && !empty_object(&original, container) {
        root.shift_remove(container);
    } else {
        root.insert(container.to_string(), Value::Object(section));
    }
    let text = rewrite_json(
        path,
        kind,
        before,
        stripped.as_deref(),
        original,
        root,
        notes,
    )?;
    Ok((text, managed))
}

/// Whether `root.key` is an empty object (the user's; kept as it is).
fn empty_object(root: &Map<String, Value>, key: &str) -> bool {
    root.get(key)
        .is_some_and(|c| c.as_object().is_some_and(Map::is_empty))
}

/// A note when `kind` runs several profiles, none named `default`, and
/// some have tool patterns: none becomes the repository's permissions.
fn no_repository_profile(manifest: &Manifest, kind: ProviderKind, notes: &mut Vec<String>) {
    if repository_profile(manifest, kind).is_none()
        && manifest.profiles.values().any(|p| {
            manifest.providers.get(&p.provider).map(|v| v.kind) == Some(kind)
                && !(p.allowed_tools.is_empty()
                    && p.ask_tools.is_empty()
                    && p.denied_tools.is_empty())
        })
    {
        notes.push(format!(
            "{} runs several profiles and none is named `{DEFAULT_PROFILE}`; no profile's tool patterns become the repository's permissions",
            kind.as_str()
        ));
    }
}

/// Claude Code's settings text (`before`, `None` when absent) with npc's
/// `permissions.allow/ask/deny` entries brought in line with the repository
/// profile's patterns. `previously` names the entries npc added before
/// (from the store); returns the text, the entries npc manages now, and
/// notes.
pub fn claude_edit(
    path: &Path,
    before: Option<&str>,
    manifest: &Manifest,
    previously: &BTreeSet<String>,
) -> Result<(String, BTreeSet<String>, Vec<String>), NativeError> {
    let kind = ProviderKind::ClaudeCode;
    let mut notes = Vec::new();
    no_repository_profile(manifest, kind, &mut notes);
    let profile = repository_profile(manifest, kind).map(|(_, p)| p);
    let lists: Vec<(&str, &str, Vec<String>)> = CLAUDE_LISTS
        .into_iter()
        .enumerate()
        .map(|(i, list)| {
            let due = profile.map_or_else(Vec::new, |p| claude_lists(p)[i].1.to_vec());
            (list, list, due)
        })
        .collect();
    let (text, managed) = edit_lists(
        path,
        kind,
        before,
        "permissions",
        &lists,
        previously,
        &mut notes,
    )?;
    Ok((text, managed, notes))
}

/// Claude Code's built-in tools and Gemini CLI's names for them.
const GEMINI_TOOLS: [(&str, &str); 9] = [
    ("Bash", "run_shell_command"),
    ("Read", "read_file"),
    ("Write", "write_file"),
    ("Edit", "replace"),
    ("MultiEdit", "replace"),
    ("Glob", "glob"),
    ("Grep", "grep_search"),
    ("WebFetch", "web_fetch"),
    ("WebSearch", "google_web_search"),
];

/// One npc pattern as a Gemini CLI tool name (`run_shell_command(git
/// diff)`, `mcp_fs_read_file`); `None` when Gemini CLI has no such tool.
pub fn gemini_tool(pattern: &str) -> Option<String> {
    let (name, subject) = match pattern.split_once('(') {
        Some((name, rest)) => (name, Some(rest.strip_suffix(')')?)),
        None => (pattern, None),
    };
    let tool = if let Some(mcp) = name.strip_prefix("mcp__") {
        // Gemini CLI names an MCP tool `mcp_SERVER_TOOL`.
        format!("mcp_{}", mcp.replacen("__", "_", 1))
    } else {
        GEMINI_TOOLS
            .iter()
            .find(|(claude, _)| *claude == name)
            .map(|(_, g)| g.to_string())?
    };
    Some(match subject {
        None => tool,
        // Only a shell command's prefix is a subject Gemini CLI matches.
        Some(s) if tool == "run_shell_command" => {
            format!("{tool}({})", s.strip_suffix(":*").unwrap_or(s))
        }
        Some(_) => return None,
    })
}

/// Gemini CLI's settings text with npc's `tools.allowed` (run without
/// asking) and `tools.exclude` (never offered) entries brought in line
/// with the repository profile's `allowed_tools` and `denied_tools`.
/// Gemini CLI asks before a tool by default, so `ask_tools` need no entry.
pub fn gemini_edit(
    path: &Path,
    before: Option<&str>,
    manifest: &Manifest,
    previously: &BTreeSet<String>,
) -> Result<(String, BTreeSet<String>, Vec<String>), NativeError> {
    let kind = ProviderKind::GeminiCli;
    let mut notes = Vec::new();
    no_repository_profile(manifest, kind, &mut notes);
    let profile = repository_profile(manifest, kind).map(|(_, p)| p);
    let mut skipped = Vec::new();
    let mut names = |patterns: &[String]| -> Vec<String> {
        let mut out = Vec::new();
        for p in patterns {
            match gemini_tool(p) {
                Some(t) if !out.contains(&t) => out.push(t),
                Some(_) => {}
                None => skipped.push(format!("`{p}`")),
            }
        }
        out
    };
    let allowed = profile.map_or_else(Vec::new, |p| names(&p.allowed_tools));
    let excluded = profile.map_or_else(Vec::new, |p| names(&p.denied_tools));
    if !skipped.is_empty() {
        notes.push(format!(
            "Gemini CLI has no tool for {}; left out of its `tools` settings",
            skipped.join(", ")
        ));
    }
    let lists = [
        ("tools.allowed", "allowed", allowed),
        ("tools.exclude", "exclude", excluded),
    ];
    let (text, managed) = edit_lists(path, kind, before, "tools", &lists, previously, &mut notes)?;
    Ok((text, managed, notes))
}

/// How the store names one of npc's keys of OpenCode's `permission`.
fn opencode_managed(key: &str) -> String {
    format!("permission:{key}")
}

/// OpenCode's `opencode.json` text with npc's keys of `permission` brought
/// in line with the repository profile's patterns. A key the user set is
/// the user's (kept, and npc's rule for it left out with a note).
pub fn opencode_edit(
    path: &Path,
    before: Option<&str>,
    manifest: &Manifest,
    previously: &BTreeSet<String>,
) -> Result<(String, BTreeSet<String>, Vec<String>), NativeError> {
    let kind = ProviderKind::Opencode;
    let mut notes = Vec::new();
    no_repository_profile(manifest, kind, &mut notes);
    let (wanted, skipped) = repository_profile(manifest, kind)
        .map(|(_, p)| opencode_permission(p))
        .unwrap_or_default();
    if !skipped.is_empty() {
        notes.push(format!(
            "OpenCode has no tool for {}; left out of its `permission`",
            skipped
                .iter()
                .map(|s| format!("`{s}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let (mut root, stripped) = match before {
        Some(text) => parse_native_json(path, kind, text)?,
        None if wanted.is_empty() => return Ok((String::new(), BTreeSet::new(), notes)),
        None => (Map::new(), None),
    };
    let original = root.clone();
    let mut permission = match root.get("permission") {
        None => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(_) if wanted.is_empty() => Map::new(),
        Some(_) => {
            notes.push("`permission` in `opencode.json` is one action for every tool, yours; npc's rules are left out".into());
            return Ok((
                before.unwrap_or_default().to_string(),
                BTreeSet::new(),
                notes,
            ));
        }
    };
    permission.retain(|k, _| !previously.contains(&opencode_managed(k)));
    let mut managed = BTreeSet::new();
    for (key, rule) in wanted {
        if permission.contains_key(&key) {
            notes.push(format!(
                "`permission.{key}` in `opencode.json` is yours; npc's rule for it is left out"
            ));
            continue;
        }
        managed.insert(opencode_managed(&key));
        permission.insert(key, rule);
    }
    if permission.is_empty() && !empty_object(&original, "permission") {
        root.shift_remove("permission");
    } else {
        root.insert("permission".into(), Value::Object(permission));
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
    fn gemini_gets_its_own_tool_names_in_tools_allowed_and_exclude() {
        assert_eq!(
            gemini_tool("Bash(git diff:*)").as_deref(),
            Some("run_shell_command(git diff)")
        );
        assert_eq!(gemini_tool("mcp__fs__read").as_deref(), Some("mcp_fs_read"));
        assert_eq!(gemini_tool("Read(*.rs)"), None);
        let m =
            crate::native::commands::tests::manifest(&CLAUDE.replace("claude_code", "gemini_cli"));
        let path = Path::new(".gemini/settings.json");
        let user = "{\n  // mine\n  \"tools\": {\"allowed\": [\"read_file\"]}\n}\n";
        let (text, managed, notes) = gemini_edit(path, Some(user), &m, &BTreeSet::new()).unwrap();
        assert!(text.contains("// mine"), "{text}");
        assert!(text.contains("\"run_shell_command(ls)\""), "{text}");
        let stripped = crate::native::jsonc::strip(
            &text,
            crate::native::edit::dialect(ProviderKind::GeminiCli).unwrap(),
        );
        let v: Value = serde_json::from_str(stripped.as_deref().unwrap_or(&text)).unwrap();
        assert_eq!(v["tools"]["exclude"], json!(["web_fetch"]), "{text}");
        assert!(notes.is_empty(), "{notes:?}");
        assert_eq!(managed.len(), 3, "{managed:?}");
        let none = crate::native::commands::tests::manifest("version = 1\n");
        let (gone, left, _) = gemini_edit(path, Some(&text), &none, &managed).unwrap();
        assert!(left.is_empty());
        assert!(
            gone.contains("// mine") && gone.contains("\"read_file\""),
            "{gone}"
        );
        assert!(
            !gone.contains("exclude") && !gone.contains("run_shell"),
            "{gone}"
        );
    }

    #[test]
    fn opencode_permission_keys_are_npcs_unless_the_user_set_them() {
        let m =
            crate::native::commands::tests::manifest(&CLAUDE.replace("claude_code", "opencode"));
        let path = Path::new("opencode.json");
        let user = r#"{"mcp":{},"permission":{"webfetch":"allow"}}"#;
        let (text, managed, notes) = opencode_edit(path, Some(user), &m, &BTreeSet::new()).unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["permission"]["webfetch"], "allow", "the user's key wins");
        assert_eq!(
            v["permission"]["bash"],
            json!({"ls": "allow", "git push *": "ask"})
        );
        assert_eq!(v["permission"]["fs_*"], "allow");
        assert!(
            notes.iter().any(|n| n.contains("`permission.webfetch`")),
            "{notes:?}"
        );
        assert_eq!(
            managed,
            BTreeSet::from(["permission:bash".to_string(), "permission:fs_*".to_string()])
        );
        let none = crate::native::commands::tests::manifest("version = 1\n");
        let (gone, _, _) = opencode_edit(path, Some(&text), &none, &managed).unwrap();
        assert_eq!(
            serde_json::from_str::<Value>(&gone).unwrap(),
            serde_json::from_str::<Value>(user).unwrap()
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
