//! `npc import` of a slash command or a subagent a CLI already has (the
//! way back of [`super::commands`] and [`super::agents`]): the file is
//! recognised by where it lives (`.claude/commands/NAME.md`,
//! `.gemini/commands/NAME.toml`, `.opencode/commands/NAME.md`,
//! `.claude/agents/NAME.md`, `.opencode/agents/NAME.md`,
//! `.gemini/agents/NAME.md`, `.codex/agents/NAME.toml`) and becomes manifest
//! tables:
//! - a command: `[prompts.NAME]` with `command = true`, its `description`,
//!   and its text as the template, each argument placeholder a variable
//!   (`$ARGUMENTS` → `vars.arguments`, `$1` → `vars.arg1`, Gemini CLI's
//!   `{{args}}` → `vars.args`);
//! - an agent: `[prompts.NAME]` (its body) and `[profiles.NAME]` with its
//!   `description`, `model` and (Claude Code) `tools` / `disallowedTools` as
//!   `allowed_tools` / `denied_tools`, run by the manifest's provider of
//!   that CLI (one is added when there is none).
//!
//! The file's text is taken literally: each `{{`, `{%` and `{#` in it is
//! written as an expression that prints it (templates do not expand
//! `${VAR}`; a `model` does, so its
//! `$` is written `$$`). What the manifest cannot express (an
//! OpenCode agent's `permission`, Gemini CLI's own tool names) is named in
//! a note. A file npc wrote (its marker line) is not imported.

use std::path::{Path, PathBuf};

use serde_json::Value;
use toml_edit::{Array, DocumentMut, Item, Table, value};

use super::edit::parse_toml;
use super::import::{implicit_table, is_manifest_name, lit, same_table};
use super::managed::{Format, MAX_MANAGED_FILE_BYTES};
use super::{NativeError, ProviderKind};
use crate::model::Manifest;

/// Largest frontmatter parsed.
pub const MAX_FRONTMATTER_BYTES: usize = 64 * 1024;

/// What a file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigKind {
    Command,
    Agent,
}

/// The CLI and kind of config `path` holds, from where it lives; `None`
/// for any other file.
pub fn recognise(path: &Path) -> Option<(ProviderKind, ConfigKind, String)> {
    let stem = path.file_stem()?.to_str()?.to_string();
    let ext = path.extension()?.to_str()?;
    let mut parents = path.parent()?.components().rev();
    let folder = parents.next()?.as_os_str().to_str()?;
    let cli = parents.next()?.as_os_str().to_str()?;
    let kind = match cli {
        ".claude" => ProviderKind::ClaudeCode,
        ".codex" => ProviderKind::Codex,
        ".gemini" => ProviderKind::GeminiCli,
        ".opencode" => ProviderKind::Opencode,
        _ => return None,
    };
    let what = match folder {
        "commands" | "command" => ConfigKind::Command,
        "agents" | "agent" => ConfigKind::Agent,
        _ => return None,
    };
    let want = match (kind, what) {
        (ProviderKind::GeminiCli, ConfigKind::Command) | (ProviderKind::Codex, _) => "toml",
        _ => "md",
    };
    if kind == ProviderKind::Codex && what == ConfigKind::Command {
        return None;
    }
    (ext == want).then_some((kind, what, stem))
}

/// Manifest tables read from one file.
#[derive(Debug, Clone)]
pub struct ImportedConfig {
    /// (section, name, table): `prompts`/`profiles`/`providers`.
    pub tables: Vec<(&'static str, String, Table)>,
    pub notes: Vec<String>,
}

impl ImportedConfig {
    /// The tables as manifest text.
    pub fn to_toml(&self) -> String {
        let mut doc = DocumentMut::new();
        for (section, name, table) in &self.tables {
            insert(doc.as_table_mut(), section, name, table.clone());
        }
        doc.to_string()
    }
}

/// The frontmatter (YAML, parsed) and body of a Markdown file.
fn split_markdown(
    path: &Path,
    text: &str,
) -> Result<(serde_json::Map<String, Value>, String), NativeError> {
    let shape = |message: String| NativeError::Shape {
        path: path.into(),
        message,
    };
    let Some(rest) = text
        .strip_prefix("---\n")
        .or_else(|| text.strip_prefix("---\r\n"))
    else {
        return Ok((serde_json::Map::new(), text.to_string()));
    };
    let mut offset = 0;
    for line in rest.split_inclusive('\n') {
        if line.trim_end() == "---" {
            let yaml = &rest[..offset];
            if yaml.len() > MAX_FRONTMATTER_BYTES {
                return Err(shape(format!(
                    "its frontmatter is larger than {MAX_FRONTMATTER_BYTES} bytes"
                )));
            }
            let body = rest[offset + line.len()..]
                .trim_start_matches(['\n', '\r'])
                .to_string();
            if yaml.trim().is_empty() {
                return Ok((serde_json::Map::new(), body));
            }
            let value: Value = serde_norway::from_str(yaml)
                .map_err(|e| shape(format!("its frontmatter is not valid YAML: {e}")))?;
            return match value {
                Value::Object(map) => Ok((map, body)),
                _ => Err(shape(
                    "its frontmatter is not a mapping of keys to values".into(),
                )),
            };
        }
        offset += line.len();
    }
    Err(shape("its frontmatter has no closing `---` line".into()))
}

/// `text` as a template that prints it literally, with each placeholder
/// of `placeholders` (text, variable) printing its variable. Returns the
/// template and the variables used, in order of first use.
/// `text` as a template that prints it as it is: each opening delimiter
/// (`{{`, `{%`, `{#`) becomes a string expression that prints it, so no
/// part of an imported file is ever read as template code (a `{% raw %}`
/// block would end at any spelling of `endraw` inside the text).
fn literal_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find('{') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        match after.chars().next() {
            Some(c @ ('{' | '%' | '#')) => {
                out.push_str("{{ \"{");
                out.push(c);
                out.push_str("\" }}");
                rest = &after[1..];
            }
            _ => {
                out.push('{');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

fn template_of(text: &str, placeholders: &[(String, String)]) -> (String, Vec<String>) {
    let mut out = String::new();
    let mut used: Vec<String> = Vec::new();
    let mut literal = String::new();
    let flush = |literal: &mut String, out: &mut String| {
        if literal.is_empty() {
            return;
        }
        out.push_str(&literal_text(literal));
        literal.clear();
    };
    let mut rest = text;
    'outer: while !rest.is_empty() {
        for (shown, var) in placeholders {
            if let Some(after) = rest.strip_prefix(shown.as_str()) {
                // `$1` must not eat the start of `$10`.
                let next_digit = shown.starts_with('$')
                    && shown[1..].chars().all(|c| c.is_ascii_digit())
                    && after.starts_with(|c: char| c.is_ascii_digit());
                if !next_digit {
                    flush(&mut literal, &mut out);
                    out.push_str(&format!("{{{{ vars.{var} }}}}"));
                    if !used.contains(var) {
                        used.push(var.clone());
                    }
                    rest = after;
                    continue 'outer;
                }
            }
        }
        let c = rest.chars().next().unwrap_or_default();
        literal.push(c);
        rest = &rest[c.len_utf8()..];
    }
    flush(&mut literal, &mut out);
    (out, used)
}

/// The argument placeholders of `kind`'s commands and their variables.
fn placeholders(kind: ProviderKind) -> Vec<(String, String)> {
    match kind {
        ProviderKind::GeminiCli => vec![("{{args}}".into(), "args".into())],
        _ => {
            let mut out = vec![("$ARGUMENTS".to_string(), "arguments".to_string())];
            out.extend((1..=9).map(|i| (format!("${i}"), format!("arg{i}"))));
            out
        }
    }
}

fn string(map: &serde_json::Map<String, Value>, key: &str) -> Option<String> {
    map.get(key).and_then(Value::as_str).map(str::to_string)
}

/// A tool list: a comma-separated string or a list of strings.
fn tools(map: &serde_json::Map<String, Value>, key: &str) -> Vec<String> {
    match map.get(key) {
        Some(Value::String(s)) => s
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::to_string)
            .collect(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
        _ => Vec::new(),
    }
}

fn array(items: &[String]) -> Item {
    let mut a = Array::new();
    for i in items {
        a.push(i.as_str());
    }
    value(a)
}

/// A prompt table of `template` with its variables.
fn prompt_table(template: String, vars: &[String]) -> Table {
    let mut t = Table::new();
    t.insert("template", value(template));
    if !vars.is_empty() {
        let mut variables = Table::new();
        for v in vars {
            let mut var = toml_edit::InlineTable::new();
            let description = match v.strip_prefix("arg") {
                Some(n) if n.chars().all(|c| c.is_ascii_digit()) && !n.is_empty() => {
                    format!("word {n} of the command's arguments")
                }
                _ => "the command's arguments".to_string(),
            };
            var.insert("description", description.into());
            variables.insert(v, value(var));
        }
        t.insert("variables", Item::Table(variables));
    }
    t
}

/// The short provider name npc gives `kind` when the manifest has none.
fn provider_name(kind: ProviderKind) -> &'static str {
    match kind {
        ProviderKind::ClaudeCode => "claude",
        ProviderKind::Codex => "codex",
        ProviderKind::GeminiCli => "gemini",
        ProviderKind::Opencode => "opencode",
    }
}

/// Read the command or agent in `text` (of `path`, recognised as `kind`'s
/// `what` named `name`) as manifest tables. `manifest` (when valid) names
/// the provider an agent's profile uses.
pub fn import_config(
    path: &Path,
    text: &str,
    (kind, what, name): (ProviderKind, ConfigKind, &str),
    manifest: Option<&Manifest>,
) -> Result<ImportedConfig, NativeError> {
    if text.len() > MAX_MANAGED_FILE_BYTES {
        return Err(NativeError::TooLarge {
            path: path.into(),
            limit: MAX_MANAGED_FILE_BYTES,
        });
    }
    if !is_manifest_name(name) {
        return Err(NativeError::Shape {
            path: path.into(),
            message: format!(
                "`{}` is not a manifest name (`[a-z0-9][a-z0-9_-]*`); rename the file",
                crate::model::diagnostics::clip(name)
            ),
        });
    }
    let format = match (kind, what) {
        (ProviderKind::GeminiCli, ConfigKind::Command) | (ProviderKind::Codex, _) => Format::Toml,
        _ => Format::Markdown,
    };
    if format.is_ours(text) {
        return Err(NativeError::Shape {
            path: path.into(),
            message: "npc wrote this file from the manifest; there is nothing to import".into(),
        });
    }
    let mut notes = Vec::new();
    let (front, body) = match format {
        Format::Toml => {
            super::check_items(path, text, super::Syntax::Toml)?;
            let table: toml::Table = toml::from_str(text).map_err(|e| NativeError::Shape {
                path: path.into(),
                message: format!("not valid TOML: {}", e.message()),
            })?;
            let mut map = serde_json::Map::new();
            for key in ["description", "model"] {
                if let Some(toml::Value::String(v)) = table.get(key) {
                    map.insert(key.into(), Value::String(v.clone()));
                }
            }
            // A Gemini CLI command's `prompt`, a Codex CLI role's
            // `developer_instructions`.
            let body_key = match kind {
                ProviderKind::Codex => "developer_instructions",
                _ => "prompt",
            };
            let Some(toml::Value::String(body)) = table.get(body_key) else {
                return Err(NativeError::Shape {
                    path: path.into(),
                    message: format!("it needs a `{body_key}` string"),
                });
            };
            (map, body.clone())
        }
        Format::Markdown => split_markdown(path, text)?,
    };
    let mut tables = Vec::new();
    match what {
        ConfigKind::Command => {
            let (template, vars) = template_of(&body, &placeholders(kind));
            let mut t = prompt_table(template, &vars);
            t.insert("command", value(true));
            if let Some(d) = string(&front, "description") {
                t.insert("description", value(d));
            }
            let word = |v: &String| {
                v.strip_prefix("arg")
                    .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
            };
            if vars.iter().any(word) && vars.iter().any(|v| v == "arguments") {
                notes.push("the command uses both `$ARGUMENTS` and `$N`: npc writes them back as words `$1`, `$2`, … in name order".into());
            }
            tables.push(("prompts", name.to_string(), t));
        }
        ConfigKind::Agent => {
            let (template, _) = template_of(&body, &[]);
            tables.push(("prompts", name.to_string(), prompt_table(template, &[])));
            let provider = manifest
                .and_then(|m| m.providers.iter().find(|(_, p)| p.kind == kind))
                .map(|(n, _)| n.clone());
            let provider = match provider {
                Some(p) => p,
                None => {
                    let mut p = Table::new();
                    p.insert("kind", value(kind.as_str()));
                    tables.push(("providers", provider_name(kind).to_string(), p));
                    provider_name(kind).to_string()
                }
            };
            let mut p = Table::new();
            p.insert("provider", value(provider));
            let description = string(&front, "description").unwrap_or_else(|| name.to_string());
            p.insert("description", value(description));
            p.insert("prompt", value(name));
            if let Some(model) = string(&front, "model") {
                // `model` expands `${VAR}`: the file's `$` is literal.
                p.insert("model", value(lit(&model)));
            }
            match kind {
                ProviderKind::ClaudeCode => {
                    for (key, ours) in [
                        ("tools", "allowed_tools"),
                        ("disallowedTools", "denied_tools"),
                    ] {
                        let list = tools(&front, key);
                        if !list.is_empty() {
                            p.insert(ours, array(&list));
                        }
                    }
                }
                _ => {
                    for key in ["tools", "permission"] {
                        if front.contains_key(key) {
                            notes.push(format!(
                                "the agent's `{key}` names {}'s own tools; it is not imported (write `allowed_tools` / `denied_tools` in the profile)",
                                kind.as_str()
                            ));
                        }
                    }
                }
            }
            tables.push(("profiles", name.to_string(), p));
        }
    }
    Ok(ImportedConfig { tables, notes })
}

fn insert(root: &mut Table, section: &str, name: &str, table: Table) -> Option<()> {
    let s = root
        .entry(section)
        .or_insert_with(implicit_table)
        .as_table_mut()?;
    s.insert(name, Item::Table(table));
    Some(())
}

/// Merge `imported` into the manifest's text (comments and layout kept):
/// a table the manifest has the same is left alone, a different one is
/// replaced only with `replace`, else the merge fails with a diff. Returns
/// the text and the names added or replaced.
pub fn merge_config(
    manifest_text: &str,
    imported: &ImportedConfig,
    replace: bool,
) -> Result<(String, Vec<String>), NativeError> {
    let path = PathBuf::from(crate::model::MANIFEST_NAMES[0]);
    let mut doc = parse_toml(&path, manifest_text)?;
    let mut changed = Vec::new();
    let mut differing = Vec::new();
    for (section, name, table) in &imported.tables {
        let ours = doc
            .get(section)
            .and_then(Item::as_table)
            .and_then(|s| s.get(name))
            .and_then(Item::as_table)
            .cloned();
        match ours {
            Some(ours) if same_table(&ours, table) => {}
            // A provider of that name is used as it is.
            Some(_) if *section == "providers" => {}
            Some(ours) => differing.push((section, name, ours, table)),
            None => changed.push(format!("{section}.{name}")),
        }
    }
    if !differing.is_empty() && !replace {
        let names = differing
            .iter()
            .map(|(s, n, _, _)| format!("`{s}.{n}`"))
            .collect::<Vec<_>>()
            .join(", ");
        let text = |section: &str, name: &str, t: &Table| {
            let mut d = DocumentMut::new();
            let mut bare = t.clone();
            bare.decor_mut().clear();
            insert(d.as_table_mut(), section, name, bare);
            d.to_string()
        };
        let diff = differing
            .iter()
            .map(|(s, n, ours, theirs)| {
                similar::TextDiff::from_lines(&text(s, n, ours), &text(s, n, theirs))
                    .unified_diff()
                    .context_radius(super::DIFF_CONTEXT_LINES)
                    .header("manifest", "imported")
                    .to_string()
            })
            .collect::<String>();
        return Err(NativeError::ConfigConflict { names, diff });
    }
    for (section, name, _, _) in &differing {
        changed.push(format!("{section}.{name}"));
    }
    for (section, name, table) in &imported.tables {
        if changed.contains(&format!("{section}.{name}")) {
            insert(doc.as_table_mut(), section, name, table.clone()).ok_or_else(|| {
                NativeError::Shape {
                    path: path.clone(),
                    message: format!("`{section}` must be a table"),
                }
            })?;
        }
    }
    Ok((doc.to_string(), changed))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn import(path: &str, text: &str) -> ImportedConfig {
        let path = Path::new(path);
        let (kind, what, name) = recognise(path).expect("recognised");
        import_config(path, text, (kind, what, &name), None).unwrap()
    }

    #[test]
    fn files_are_recognised_by_where_they_live() {
        let r = |p: &str| recognise(Path::new(p));
        assert_eq!(
            r(".claude/commands/review.md"),
            Some((
                ProviderKind::ClaudeCode,
                ConfigKind::Command,
                "review".into()
            ))
        );
        assert_eq!(
            r("x/.gemini/commands/fix.toml"),
            Some((ProviderKind::GeminiCli, ConfigKind::Command, "fix".into()))
        );
        assert_eq!(
            r(".opencode/agent/helper.md"),
            Some((ProviderKind::Opencode, ConfigKind::Agent, "helper".into()))
        );
        assert_eq!(
            r(".codex/agents/rev.toml"),
            Some((ProviderKind::Codex, ConfigKind::Agent, "rev".into()))
        );
        assert_eq!(r(".codex/commands/x.toml"), None);
        assert_eq!(r(".gemini/commands/fix.md"), None);
        assert_eq!(r(".mcp.json"), None);
        assert_eq!(r("docs/commands/x.md"), None);
    }

    #[test]
    fn commands_and_agents_become_manifest_tables() {
        let claude = import(
            ".claude/commands/review.md",
            "---\ndescription: Review a change\nargument-hint: <target>\n---\n\nReview $ARGUMENTS; cost ${PRICE}, {{ not jinja }}.\n",
        );
        let gemini = import(
            ".gemini/commands/port.toml",
            "description = \"Port\"\nprompt = \"Port {{args}} now, then $1.\"\n",
        );
        let agent = import(
            ".claude/agents/dev.md",
            "---\nname: dev\ndescription: Develops\ntools: Read, Bash(git diff:*)\nmodel: sonnet\n---\n\nYou develop.\n",
        );
        let oc = import(
            ".opencode/agents/helper.md",
            "---\ndescription: Helps\nmode: subagent\npermission:\n  edit: deny\n---\nHelp.\n",
        );
        let codex = import(
            ".codex/agents/rev.toml",
            "name = \"rev\"\ndescription = \"Reviews\"\nmodel = \"gpt-5\"\ndeveloper_instructions = \"You review.\"\n",
        );
        let shown = [claude, gemini, agent, oc, codex]
            .iter()
            .map(|i| format!("{}notes: {:?}\n", i.to_toml(), i.notes))
            .collect::<Vec<_>>()
            .join("----\n");
        insta::assert_snapshot!(shown);
    }

    #[test]
    fn an_imported_command_renders_back_to_the_same_text() {
        // Every spelling of `endraw` too: none ends a literal early.
        let body = "Review $ARGUMENTS; cost ${PRICE}, {{ x }} {% endraw %} {%endraw%}{{ 7*7 }} {%- endraw -%} {# c #} {x}.\n";
        let text = format!("---\ndescription: Review\n---\n\n{body}");
        let imported = import(".claude/commands/review.md", &text);
        let manifest_text = format!(
            "version = 1\n[providers.c]\nkind = \"claude_code\"\n{}",
            imported.to_toml()
        );
        let m = crate::native::commands::tests::manifest(&manifest_text);
        let dir = tempfile::tempdir().unwrap();
        let ctx = crate::render::RenderContext::new(dir.path(), &m);
        let (planned, _) = crate::native::commands::plan(&m, dir.path(), &ctx);
        let written = planned[0].after.as_deref().unwrap();
        assert!(written.ends_with(&format!("\n{body}")), "{written}");
    }

    #[test]
    fn npcs_own_files_and_bad_names_are_not_imported() {
        let ours = Format::markdown("description: x\n", "X");
        let path = Path::new(".claude/commands/x.md");
        let r = recognise(path).unwrap();
        assert!(import_config(path, &ours, (r.0, r.1, &r.2), None).is_err());
        let bad = Path::new(".claude/commands/Bad Name.md");
        let r = recognise(bad).unwrap();
        assert!(import_config(bad, "x", (r.0, r.1, &r.2), None).is_err());
    }

    #[test]
    fn merging_adds_keeps_the_same_and_refuses_a_different_entry() {
        let imported = import(".claude/commands/review.md", "Review $ARGUMENTS.\n");
        let manifest = "version = 1 # mine\n";
        let (text, changed) = merge_config(manifest, &imported, false).unwrap();
        assert!(text.starts_with("version = 1 # mine\n"), "{text}");
        assert_eq!(changed, ["prompts.review"]);
        let (again, changed) = merge_config(&text, &imported, false).unwrap();
        assert_eq!((again.as_str(), changed.len()), (text.as_str(), 0));
        let other = import(".claude/commands/review.md", "Other $ARGUMENTS.\n");
        let err = merge_config(&text, &other, false).unwrap_err().to_string();
        assert!(
            err.contains("`prompts.review`") && err.contains("--replace"),
            "{err}"
        );
        let (replaced, _) = merge_config(&text, &other, true).unwrap();
        assert!(replaced.contains("Other"), "{replaced}");
    }
}
