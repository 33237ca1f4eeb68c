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
//! These translations serve a run's own policy (`super::run_policy`: flags,
//! a per-run file or variable) and the profiles' agent files. The
//! repository's settings files carry project-level policy only: no
//! profile's patterns (two profiles of one CLI would overwrite each
//! other's, and a run of either would get the other's). npc's entries
//! that earlier versions wrote there from "the profile that stands for
//! the CLI" (the store keeps them) are removed by the next `npc apply`;
//! the user's own entries stay.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use super::NativeError;
use super::edit::JsonDoc;
use crate::model::{Profile, ProviderKind};

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

/// The name a profile's patterns give OpenCode's own tool `tool` (they
/// use Claude Code's names: `bash` is `Bash`); `None` for a tool it has
/// no name for.
pub fn opencode_pattern_name(tool: &str) -> Option<&'static str> {
    OPENCODE_TOOLS
        .iter()
        .find(|(_, oc)| *oc == tool)
        .map(|(claude, _)| *claude)
}

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
    doc: &mut JsonDoc<'_>,
    container: &str,
    lists: &[(&str, &str, Vec<String>)],
    previously: &BTreeSet<String>,
    managed: &mut BTreeSet<String>,
) -> Result<(), NativeError> {
    let mut section = match doc.root.get(container) {
        None => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(_) => return Err(doc.shape(format!("`{container}` is not a JSON object"))),
    };
    for (name, key, patterns) in lists {
        let mut entries = match section.get(*key) {
            None => Vec::new(),
            Some(Value::Array(a)) => a.clone(),
            Some(_) => return Err(doc.shape(format!("`{container}.{key}` is not a JSON array"))),
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
    if section.is_empty() && !empty_object(doc.original(), container) {
        doc.root.shift_remove(container);
    } else {
        doc.root
            .insert(container.to_string(), Value::Object(section));
    }
    Ok(())
}

/// Whether `root.key` is an empty object (the user's; kept as it is).
fn empty_object(root: &Map<String, Value>, key: &str) -> bool {
    root.get(key)
        .is_some_and(|c| c.as_object().is_some_and(Map::is_empty))
}

/// One CLI's edit of npc's permission entries of its settings file: the
/// document, the entries npc added before, the entries it manages now.
pub type PermissionEdit =
    fn(&mut JsonDoc<'_>, &BTreeSet<String>, &mut BTreeSet<String>) -> Result<(), NativeError>;

/// Claude Code's settings `doc` with npc's `permissions.allow/ask/deny`
/// entries of earlier versions removed (see the module's doc).
/// `previously` names the entries npc added before (from the store);
/// `managed` gains the entries npc manages now (none).
pub fn claude_edit(
    doc: &mut JsonDoc<'_>,
    previously: &BTreeSet<String>,
    managed: &mut BTreeSet<String>,
) -> Result<(), NativeError> {
    let lists: Vec<(&str, &str, Vec<String>)> = CLAUDE_LISTS
        .into_iter()
        .map(|list| (list, list, Vec::new()))
        .collect();
    edit_lists(doc, "permissions", &lists, previously, managed)
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

/// The Claude Code name npc's patterns use for `kind`'s own tool `name`
/// (OpenCode's `bash`, Gemini CLI's `run_shell_command`: `Bash`), when it
/// has one.
pub fn pattern_name(kind: ProviderKind, name: &str) -> Option<&'static str> {
    let table: &[(&str, &str)] = match kind {
        ProviderKind::Opencode => &OPENCODE_TOOLS,
        ProviderKind::GeminiCli => &GEMINI_TOOLS,
        _ => &[],
    };
    table
        .iter()
        .find(|(_, native)| *native == name)
        .map(|(claude, _)| *claude)
}

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

/// Gemini CLI's settings `doc` with npc's `tools.allowed` and
/// `tools.exclude` entries of earlier versions removed (see
/// [`claude_edit`]).
pub fn gemini_edit(
    doc: &mut JsonDoc<'_>,
    previously: &BTreeSet<String>,
    managed: &mut BTreeSet<String>,
) -> Result<(), NativeError> {
    let lists = [
        ("tools.allowed", "allowed", Vec::new()),
        ("tools.exclude", "exclude", Vec::new()),
    ];
    edit_lists(doc, "tools", &lists, previously, managed)
}

/// How the store names one of npc's keys of OpenCode's `permission`.
fn opencode_managed(key: &str) -> String {
    format!("permission:{key}")
}

/// OpenCode's `opencode.json` `doc` with npc's keys of `permission` of
/// earlier versions removed (see the module's doc); the user's keys stay.
pub fn opencode_edit(
    doc: &mut JsonDoc<'_>,
    previously: &BTreeSet<String>,
    _managed: &mut BTreeSet<String>,
) -> Result<(), NativeError> {
    let Some(Value::Object(permission)) = doc.root.get("permission") else {
        return Ok(());
    };
    let mut permission = permission.clone();
    permission.retain(|k, _| !previously.contains(&opencode_managed(k)));
    if permission.is_empty() && !empty_object(doc.original(), "permission") {
        doc.root.shift_remove("permission");
    } else {
        doc.root
            .insert("permission".into(), Value::Object(permission));
    }
    Ok(())
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

    use std::path::Path;

    /// `edit` on the text `before` of `kind`'s file at `path`: the text, the
    /// entries managed and the notes.
    fn on_text(
        edit: PermissionEdit,
        path: &Path,
        kind: ProviderKind,
        before: Option<&str>,
        previously: &BTreeSet<String>,
    ) -> (String, BTreeSet<String>, Vec<String>) {
        let mut doc = JsonDoc::parse(path, kind, before).unwrap();
        let (mut managed, mut notes) = (BTreeSet::new(), Vec::new());
        edit(&mut doc, previously, &mut managed).unwrap();
        (doc.finish(&mut notes).unwrap(), managed, notes)
    }

    /// The entries earlier versions of npc wrote from "the profile that
    /// stands for the CLI" (the store remembers them).
    fn earlier(entries: &[&str]) -> BTreeSet<String> {
        entries.iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn claude_settings_keep_the_users_entries_and_lose_npcs_profile_ones() {
        let path = Path::new(".claude/settings.json");
        let written = r#"{"permissions":{"allow":["Bash(ls)","Read","mcp__fs__*"],"deny":["WebFetch"],"defaultMode":"plan"},"model":"x"}"#;
        let previously = earlier(&["allow:mcp__fs__*", "deny:WebFetch"]);
        let (text, managed, notes) = on_text(
            claude_edit,
            path,
            ProviderKind::ClaudeCode,
            Some(written),
            &previously,
        );
        assert!(
            managed.is_empty() && notes.is_empty(),
            "{managed:?} {notes:?}"
        );
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            v,
            json!({"permissions": {"allow": ["Bash(ls)", "Read"], "defaultMode": "plan"}, "model": "x"})
        );
        // The user's file with no entry of npc's: as it is, whatever the
        // manifest's profiles (they are no input here).
        let user = r#"{"permissions":{"allow":["Bash"]}}"#;
        let (same, _, _) = on_text(
            claude_edit,
            path,
            ProviderKind::ClaudeCode,
            Some(user),
            &BTreeSet::new(),
        );
        assert_eq!(same, user);
        // No file: nothing is created.
        assert!(
            on_text(
                claude_edit,
                path,
                ProviderKind::ClaudeCode,
                None,
                &BTreeSet::new()
            )
            .0
            .is_empty()
        );
    }

    #[test]
    fn a_clis_own_tool_names_map_back_to_the_patterns_names() {
        assert_eq!(pattern_name(ProviderKind::Opencode, "bash"), Some("Bash"));
        assert_eq!(
            pattern_name(ProviderKind::GeminiCli, "run_shell_command"),
            Some("Bash")
        );
        assert_eq!(pattern_name(ProviderKind::Opencode, "edit"), Some("Edit"));
        assert_eq!(pattern_name(ProviderKind::ClaudeCode, "Bash"), None);
    }

    #[test]
    fn gemini_settings_lose_npcs_tools_entries_only() {
        assert_eq!(
            gemini_tool("Bash(git diff:*)").as_deref(),
            Some("run_shell_command(git diff)")
        );
        assert_eq!(gemini_tool("mcp__fs__read").as_deref(), Some("mcp_fs_read"));
        assert_eq!(gemini_tool("Read(*.rs)"), None);
        let path = Path::new(".gemini/settings.json");
        let written = "{\n  // mine\n  \"tools\": {\"allowed\": [\"read_file\", \"run_shell_command(ls)\"], \"exclude\": [\"web_fetch\"]}\n}\n";
        let previously = earlier(&[
            "tools.allowed:run_shell_command(ls)",
            "tools.exclude:web_fetch",
        ]);
        let (gone, left, _) = on_text(
            gemini_edit,
            path,
            ProviderKind::GeminiCli,
            Some(written),
            &previously,
        );
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
    fn opencode_permission_keys_of_npcs_go_and_the_users_stay() {
        let path = Path::new("opencode.json");
        let user = r#"{"mcp":{},"permission":{"webfetch":"allow"}}"#;
        let written =
            r#"{"mcp":{},"permission":{"webfetch":"allow","bash":{"ls":"allow"},"fs_*":"allow"}}"#;
        let previously = earlier(&["permission:bash", "permission:fs_*"]);
        let (gone, managed, _) = on_text(
            opencode_edit,
            path,
            ProviderKind::Opencode,
            Some(written),
            &previously,
        );
        assert!(managed.is_empty());
        assert_eq!(
            serde_json::from_str::<Value>(&gone).unwrap(),
            serde_json::from_str::<Value>(user).unwrap()
        );
        let (same, _, _) = on_text(
            opencode_edit,
            path,
            ProviderKind::Opencode,
            Some(user),
            &BTreeSet::new(),
        );
        assert_eq!(same, user);
        assert!(
            on_text(
                opencode_edit,
                path,
                ProviderKind::Opencode,
                None,
                &BTreeSet::new()
            )
            .0
            .is_empty()
        );
    }
}
