//! Native hook bridges: the managed entries that make an agent CLI's own
//! hook mechanism call `npc hook run EVENT --agent CLI`, so the manifest's
//! tool hooks govern the agent's built-in tools (shell, file edits) as well
//! as the MCP tools the gateway serves. Checked against the installed CLIs:
//! - Claude Code (2.1): `.claude/settings.json`
//!   `hooks.PreToolUse` / `hooks.PostToolUse`: `[{matcher, hooks: [{type:
//!   "command", command, timeout (seconds)}]}]`, run through the shell with
//!   `CLAUDE_PROJECT_DIR` set.
//! - Gemini CLI (0.61): `.gemini/settings.json` (the MCP file too)
//!   `hooks.BeforeTool` / `hooks.AfterTool`, same shape, `timeout` in ms;
//!   it substitutes `$GEMINI_PROJECT_DIR` (shell-quoted) itself and runs
//!   project hooks only in trusted folders.
//! - Codex CLI (0.171, hooks on by default): `.codex/hooks.json`
//!   `hooks.PreToolUse` / `hooks.PostToolUse`, Claude Code's shape with
//!   `timeout` in seconds, run in the session's directory (the repository
//!   root, where npc's entry finds the manifest). Codex loads project hooks
//!   only in trusted projects and runs a new or changed hook only after the
//!   user trusted it once (`/hooks`). No `matcher`: every tool.
//! - OpenCode (1.18) has no command hooks; its plugins are bridged by a
//!   managed plugin file instead (see [`opencode_plugin`]).
//!
//! An entry is npc's when one of its commands starts with [`BRIDGE_COMMAND`];
//! those are replaced or removed, every other entry and key is kept. With no
//! tool hook declared (and no profile of the CLI with `ask_tools`, which
//! `npc hook run before_tool` applies), npc's entries are removed and
//! nothing is added.

use std::path::Path;

use serde_json::{Map, Value, json};

use super::NativeError;
use super::edit::JsonDoc;
use crate::model::{HookEvent, Manifest, ProviderKind};

/// What every bridge entry's command starts with (how npc knows its own).
pub const BRIDGE_COMMAND: &str = "npc hook run ";
/// What every bridge command ends with: when `npc hook run` cannot run
/// (`npc` is not on `PATH`: exit 127) or fails in any way other than its
/// own denial (exit 2), the shell says so on stderr and exits 2, which
/// Claude Code, Codex and Gemini CLI all take as "block the tool" (a
/// missing `npc` would otherwise exit 127, a non-blocking error to all
/// three: the policy would silently not apply). Gemini CLI's own denials
/// exit 0 with a JSON answer, so they pass through unchanged.
pub const FAIL_CLOSED: &str = " || { c=$?; [ \"$c\" -eq 2 ] || echo \"npc hook run could not run (exit $c), so the tool is denied; put npc on PATH (see npc doctor)\" >&2; exit 2; }";
/// Time an agent CLI gives `npc hook run` beyond the sum of its hooks'
/// timeouts (process start, manifest load).
pub const BRIDGE_MARGIN_MS: u64 = 10_000;
/// The project settings file holding Claude Code's hooks.
pub const CLAUDE_SETTINGS: &str = ".claude/settings.json";

/// The project file holding Codex CLI's hooks.
pub const CODEX_HOOKS: &str = ".codex/hooks.json";

/// Whether `kind`'s CLI has a command-hook mechanism npc bridges.
pub fn bridged(kind: ProviderKind) -> bool {
    matches!(
        kind,
        ProviderKind::ClaudeCode | ProviderKind::GeminiCli | ProviderKind::Codex
    )
}

/// The tool events bridged, with their name in `kind`'s settings.
fn events(kind: ProviderKind) -> [(HookEvent, &'static str); 2] {
    match kind {
        ProviderKind::GeminiCli => [
            (HookEvent::BeforeTool, "BeforeTool"),
            (HookEvent::AfterTool, "AfterTool"),
        ],
        _ => [
            (HookEvent::BeforeTool, "PreToolUse"),
            (HookEvent::AfterTool, "PostToolUse"),
        ],
    }
}

fn is_ours(group: &Value) -> bool {
    group
        .get("hooks")
        .and_then(Value::as_array)
        .is_some_and(|hooks| {
            hooks.iter().any(|h| {
                h.get("command")
                    .and_then(Value::as_str)
                    .is_some_and(|c| c.starts_with(BRIDGE_COMMAND))
            })
        })
}

/// The managed group of `event` for `kind`, when the manifest declares hooks of it.
fn entry(
    kind: ProviderKind,
    manifest: &Manifest,
    manifest_name: &str,
    event: HookEvent,
) -> Option<Value> {
    let hooks = tool_hooks(manifest, event);
    let asks = event == HookEvent::BeforeTool && profile_asks(manifest, kind);
    let governs = event == HookEvent::BeforeTool && profile_governs(manifest, kind);
    if hooks.is_empty() && !governs {
        return None;
    }
    // Every `before_tool` may ask: a hook's `ask` parks the run as
    // `ask_tools` does.
    let may_ask = asks || (event == HookEvent::BeforeTool && !hooks.is_empty());
    let total_ms: u64 = hooks.iter().map(|h| h.timeout_ms).sum::<u64>()
        + BRIDGE_MARGIN_MS
        + ask_wait_ms(manifest, may_ask);
    let (agent, manifest_arg, timeout) = match kind {
        ProviderKind::GeminiCli => (
            "gemini",
            format!("$GEMINI_PROJECT_DIR/{manifest_name}"),
            json!(total_ms),
        ),
        ProviderKind::Codex => (
            "codex",
            manifest_name.to_string(),
            json!(total_ms.div_ceil(1000)),
        ),
        _ => (
            "claude",
            format!("\"$CLAUDE_PROJECT_DIR\"/{manifest_name}"),
            json!(total_ms.div_ceil(1000)),
        ),
    };
    let command = format!(
        "{BRIDGE_COMMAND}{} --agent {agent} --manifest {manifest_arg}{FAIL_CLOSED}",
        event.as_str()
    );
    let handler = json!([{ "type": "command", "command": command, "timeout": timeout }]);
    Some(match kind {
        // Codex matches every tool without a `matcher`.
        ProviderKind::Codex => json!({ "hooks": handler }),
        _ => json!({ "matcher": "*", "hooks": handler }),
    })
}

/// Whether a profile run by `kind`'s CLI has `ask_tools`: its calls go
/// through `npc hook run before_tool` even with no hook declared.
fn profile_asks(manifest: &Manifest, kind: ProviderKind) -> bool {
    manifest.profiles.values().any(|p| {
        !p.ask_tools.is_empty() && manifest.providers.get(&p.provider).map(|v| v.kind) == Some(kind)
    })
}

/// Whether a profile run by `kind`'s CLI asks about tools (`ask_tools`)
/// or, for Codex, denies them (`denied_tools`): `npc hook run before_tool`
/// applies them to the CLI's own tools, so its calls go through the bridge
/// even with no hook declared. Codex has no per-run setting for its own
/// tools; the other CLIs get `denied_tools` in their run's own policy
/// (`native::run_policy`), so their repository files stay as they were.
/// The entry is the same for every profile: `npc hook run` reads the run's
/// profile from the run's environment.
fn profile_governs(manifest: &Manifest, kind: ProviderKind) -> bool {
    profile_asks(manifest, kind)
        || (kind == ProviderKind::Codex
            && manifest.profiles.values().any(|p| {
                !p.denied_tools.is_empty()
                    && manifest.providers.get(&p.provider).map(|v| v.kind) == Some(kind)
            }))
}

/// Time a person may take to answer an `ask` (a hook's, or `ask_tools`),
/// when the bridge may ask: the editor's limit under `npc acp`, or the
/// longest `approval_timeout` a parked run waits. The CLI's own timeout of
/// the bridge covers it, since a CLI that kills a hook runs the tool.
fn ask_wait_ms(manifest: &Manifest, asks: bool) -> u64 {
    if !asks {
        return 0;
    }
    let editor = crate::surfaces::approval::ANSWER_WAIT_LIMIT.as_secs();
    editor
        .max(manifest.longest_approval_timeout_secs())
        .saturating_mul(1000)
}

/// The hooks of `event` that `npc hook run` runs: the manifest's and its
/// enabled plugins' (see `HookSet::for_repository`).
fn tool_hooks(manifest: &Manifest, event: HookEvent) -> Vec<&crate::model::Hook> {
    let own = manifest.hooks.get(&event).into_iter().flatten();
    let plugins = manifest
        .plugin_parts()
        .into_iter()
        .flat_map(move |(_, parts)| parts.hooks.get(&event).into_iter().flatten());
    own.chain(plugins).collect()
}

/// OpenCode's managed plugin file (OpenCode loads `.opencode/plugins/*.js`).
pub const OPENCODE_PLUGIN: &str = ".opencode/plugins/npc-hooks.js";
/// How npc's plugin file starts (how npc knows its own).
pub const OPENCODE_MARKER: &str = "// Managed by npc";
/// The plugin's source, with `__NAME__` placeholders filled in by [`opencode_plugin`].
const OPENCODE_TEMPLATE: &str = include_str!("opencode/npc-hooks.js");

/// The text of OpenCode's managed plugin file (`before`, `None` when
/// absent) for `manifest`, and notes. OpenCode (1.18) has no command hooks
/// but loads JavaScript plugins whose `tool.execute.before` may throw to
/// stop a tool (and may change its arguments) and whose
/// `tool.execute.after` may change its output: npc's plugin calls `npc
/// hook run` (npc's own protocol) from them. A file of that name that is not
/// npc's is left alone; with no tool hook npc's file stays as a plugin that
/// does nothing.
pub fn opencode_plugin(
    before: Option<&str>,
    manifest: &Manifest,
    manifest_name: &str,
) -> (String, Vec<String>) {
    let mut notes = Vec::new();
    if let Some(text) = before
        && !text.starts_with(OPENCODE_MARKER)
    {
        notes.push(format!(
            "`{OPENCODE_PLUGIN}` is not npc's; it is left alone and OpenCode's own tools are not bridged to the hooks"
        ));
        return (text.to_string(), notes);
    }
    let before_hooks = tool_hooks(manifest, HookEvent::BeforeTool);
    let after_hooks = tool_hooks(manifest, HookEvent::AfterTool);
    let asks = profile_asks(manifest, ProviderKind::Opencode);
    if before_hooks.is_empty() && after_hooks.is_empty() && !asks && before.is_none() {
        return (String::new(), notes);
    }
    // One `npc hook run` runs one event's hooks one after the other.
    let sum = |hooks: &[&crate::model::Hook]| hooks.iter().map(|h| h.timeout_ms).sum::<u64>();
    let may_ask = asks || !before_hooks.is_empty();
    let total_ms = (sum(&before_hooks) + ask_wait_ms(manifest, may_ask)).max(sum(&after_hooks))
        + BRIDGE_MARGIN_MS;
    let text = OPENCODE_TEMPLATE
        .replace(
            "__MANIFEST__",
            &serde_json::to_string(manifest_name).unwrap_or_default(),
        )
        .replace("__TIMEOUT_MS__", &total_ms.to_string())
        .replace(
            "__BEFORE__",
            &(!before_hooks.is_empty() || asks).to_string(),
        )
        .replace("__AFTER__", &(!after_hooks.is_empty()).to_string());
    (text, notes)
}

/// A manifest file name is written into a shell command: only plain names.
fn shell_safe(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// The text of `kind`'s settings file (`before`, `None` when absent) with
/// npc's hook entries brought in line with the manifest, and notes.
pub fn edit(
    path: &Path,
    kind: ProviderKind,
    before: Option<&str>,
    manifest: &Manifest,
    manifest_name: &str,
) -> Result<(String, Vec<String>), NativeError> {
    let mut doc = JsonDoc::parse(path, kind, before)?;
    let mut notes = Vec::new();
    edit_doc(&mut doc, manifest, manifest_name, &mut notes)?;
    let text = doc.finish(&mut notes)?;
    Ok((text, notes))
}

/// npc's hook entries of the settings file `doc` brought in line with the
/// manifest (see [`edit`]), notes in `notes`.
pub fn edit_doc(
    doc: &mut JsonDoc<'_>,
    manifest: &Manifest,
    manifest_name: &str,
    notes: &mut Vec<String>,
) -> Result<(), NativeError> {
    let kind = doc.kind;
    let wanted: Vec<(&str, Value)> = if shell_safe(manifest_name) {
        events(kind)
            .into_iter()
            .filter_map(|(event, native)| {
                Some((native, entry(kind, manifest, manifest_name, event)?))
            })
            .collect()
    } else {
        notes.push(format!(
            "the manifest's file name `{}` is not a plain file name; no hook bridge is written (rename it `npcagent.toml`)",
            crate::model::diagnostics::clip(manifest_name)
        ));
        Vec::new()
    };
    let before_hooks = doc.root.get("hooks").cloned();
    let mut hooks = match &before_hooks {
        None => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(_) => return Err(doc.shape("`hooks` is not a JSON object")),
    };
    for (_, native) in events(kind) {
        let Some(groups) = hooks.get_mut(native) else {
            continue;
        };
        let Some(list) = groups.as_array_mut() else {
            return Err(doc.shape(format!("`hooks.{native}` is not a JSON array")));
        };
        list.retain(|g| !is_ours(g));
        if list.is_empty() {
            hooks.shift_remove(native);
        }
    }
    for (native, group) in wanted {
        match hooks
            .entry(native.to_string())
            .or_insert_with(|| Value::Array(Vec::new()))
        {
            Value::Array(list) => list.push(group),
            _ => unreachable!("checked above"),
        }
    }
    if hooks.is_empty() {
        doc.root.shift_remove("hooks");
    } else {
        doc.root.insert("hooks".into(), Value::Object(hooks));
    }
    let after_hooks = doc.root.get("hooks");
    if kind == ProviderKind::GeminiCli
        && after_hooks.is_some()
        && after_hooks != before_hooks.as_ref()
    {
        notes.push(
            "Gemini CLI runs project hooks only in folders you trust (`/permissions`)".into(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(hooks: &str) -> Manifest {
        let text = format!("version = 1\n{hooks}");
        let env = std::collections::BTreeMap::<String, String>::new();
        struct NoFiles;
        impl crate::model::Files for NoFiles {
            fn read_to_string(&self, _: &Path) -> std::io::Result<String> {
                Err(std::io::ErrorKind::NotFound.into())
            }
            fn is_dir(&self, _: &Path) -> bool {
                false
            }
        }
        crate::model::load_bytes(
            "t.toml",
            text.as_bytes(),
            crate::model::Syntax::Toml,
            &env,
            &NoFiles,
        )
        .manifest
        .expect("valid")
    }

    const DENY: &str = "[[hooks.before_tool]]\ncommand = \"./deny\"\ntimeout_ms = 2500\n";

    #[test]
    fn claude_entries_are_added_kept_apart_from_the_users_and_removed() {
        let path = Path::new(".claude/settings.json");
        let user = r#"{"permissions":{"allow":["Bash(ls)"]},"hooks":{"PreToolUse":[{"matcher":"Bash","hooks":[{"type":"command","command":"./mine"}]}]}}"#;
        let (text, _) = edit(
            path,
            ProviderKind::ClaudeCode,
            Some(user),
            &manifest(DENY),
            "npcagent.toml",
        )
        .unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        let groups = v["hooks"]["PreToolUse"].as_array().unwrap();
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[0]["hooks"][0]["command"], "./mine");
        assert_eq!(
            groups[1]["hooks"][0]["command"],
            format!(
                "npc hook run before_tool --agent claude --manifest \"$CLAUDE_PROJECT_DIR\"/npcagent.toml{FAIL_CLOSED}"
            )
        );
        // The hook's 2.5 s and the margin, and the longest wait for an
        // answer: a hook may answer `ask` (default `approval_timeout` 30m).
        assert_eq!(groups[1]["hooks"][0]["timeout"], 13 + 1800);
        assert!(v["hooks"].get("PostToolUse").is_none());
        assert_eq!(v["permissions"]["allow"][0], "Bash(ls)");
        // Idempotent, then removed when the manifest drops its hooks.
        let (again, _) = edit(
            path,
            ProviderKind::ClaudeCode,
            Some(&text),
            &manifest(DENY),
            "npcagent.toml",
        )
        .unwrap();
        assert_eq!(again, text);
        let (gone, _) = edit(
            path,
            ProviderKind::ClaudeCode,
            Some(&text),
            &manifest(""),
            "npcagent.toml",
        )
        .unwrap();
        let v: Value = serde_json::from_str(&gone).unwrap();
        assert_eq!(v["hooks"]["PreToolUse"].as_array().unwrap().len(), 1);
        // No file and no hooks: nothing is created.
        let (none, _) = edit(
            path,
            ProviderKind::ClaudeCode,
            None,
            &manifest(""),
            "npcagent.toml",
        )
        .unwrap();
        assert!(none.is_empty());
    }

    #[test]
    fn a_profile_with_ask_tools_gets_the_before_tool_bridge_of_its_cli_only() {
        let asks = "[providers.c]\nkind = \"claude_code\"\n[providers.g]\nkind = \"gemini_cli\"\n\
                    [profiles.dev]\nprovider = \"c\"\ndescription = \"d\"\nask_tools = [\"Bash\"]\n";
        let path = Path::new(".claude/settings.json");
        let (text, _) = edit(
            path,
            ProviderKind::ClaudeCode,
            None,
            &manifest(asks),
            "npcagent.toml",
        )
        .unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        let entry = &v["hooks"]["PreToolUse"][0]["hooks"][0];
        assert!(
            entry["command"]
                .as_str()
                .unwrap()
                .starts_with(BRIDGE_COMMAND)
        );
        // The user's answer may take its time.
        let wait = crate::surfaces::approval::ANSWER_WAIT_LIMIT
            .as_secs()
            .max(crate::model::DEFAULT_APPROVAL_TIMEOUT_SECS);
        assert_eq!(entry["timeout"], wait + BRIDGE_MARGIN_MS / 1000);
        assert!(v["hooks"].get("PostToolUse").is_none());
        // No profile of Gemini CLI asks: nothing for it.
        let (none, _) = edit(
            Path::new(".gemini/settings.json"),
            ProviderKind::GeminiCli,
            None,
            &manifest(asks),
            "npcagent.toml",
        )
        .unwrap();
        assert!(none.is_empty());
    }

    #[test]
    fn gemini_entries_keep_comments_and_use_milliseconds() {
        let path = Path::new(".gemini/settings.json");
        let before = "{\n  // mine\n  \"mcpServers\": {}\n}\n";
        let (text, notes) = edit(
            path,
            ProviderKind::GeminiCli,
            Some(before),
            &manifest(DENY),
            "npcagent.toml",
        )
        .unwrap();
        assert!(text.contains("// mine"), "{text}");
        let stripped = super::super::jsonc::strip(
            &text,
            super::super::edit::dialect(ProviderKind::GeminiCli).unwrap(),
        );
        let v: Value = serde_json::from_str(stripped.as_deref().unwrap_or(&text)).unwrap();
        assert_eq!(
            v["hooks"]["BeforeTool"][0]["hooks"][0]["timeout"],
            12_500 + 1_800_000
        );
        assert!(notes.iter().any(|n| n.contains("trust")));
    }

    #[test]
    fn odd_manifest_names_and_shapes_are_refused() {
        let path = Path::new(".claude/settings.json");
        let (text, notes) = edit(
            path,
            ProviderKind::ClaudeCode,
            None,
            &manifest(DENY),
            "a b;rm.toml",
        )
        .unwrap();
        assert!(text.is_empty());
        assert!(notes[0].contains("not a plain file name"));
        assert!(
            edit(
                path,
                ProviderKind::ClaudeCode,
                Some("{\"hooks\":[]}"),
                &manifest(DENY),
                "npcagent.toml"
            )
            .is_err()
        );
    }
}
