//! Profiles as each agent CLI's own subagents: every profile becomes an
//! agent definition of the CLI that runs it (its provider's kind), as
//! npc's own file (see [`super::managed`]); `.npc/profiles/` stays npc's
//! own rendering. Checked against the installed CLIs:
//! - Claude Code (2.1): `.claude/agents/NAME.md`, frontmatter `name`,
//!   `description`, `tools` and `disallowedTools` (comma-separated, the
//!   profile's `allowed_tools` and `denied_tools` as written), `model`; the
//!   body is the system prompt.
//! - OpenCode (1.18): `.opencode/agents/NAME.md` (it reads
//!   `{agent,agents}/**/*.md` under `.opencode`), frontmatter
//!   `description`, `mode: subagent`, `model`, and `permission` (the
//!   profile's patterns, see [`super::permissions::opencode_permission`]);
//!   the body is the prompt.
//! - Gemini CLI (0.61): `.gemini/agents/NAME.md`, frontmatter `name`,
//!   `description`, `model`. Its `tools` list takes Gemini's own tool names
//!   (`read_file`, `mcp_SERVER_*`), which npc's patterns do not name, so
//!   it is left out (the agent inherits the session's tools) with a note.
//! - Codex CLI (0.171): `.codex/agents/NAME.toml`, an agent role file it
//!   discovers by itself in a trusted project (no `[agents.NAME]` entry in
//!   `config.toml` needed; checked by running it: a role file without
//!   `name` is ignored with a warning, an unknown key too): `name`,
//!   `description`, `developer_instructions` (the prompt) and `model`. A
//!   role has no per-tool list, so the profile's tool patterns are left
//!   out with a note.
//!
//! The body is the profile's prompt (its description without one) rendered with its variables' defaults
//! and the profile as `profile`, the workspace block only where the
//! template prints it (an agent file is committed: no machine's paths in it
//! unless asked for). `ask_tools` have no place in Claude Code's and Gemini
//! CLI's agent files; `npc hook run` asks for them in every run.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::{Map, Value};

use super::managed::{self, Format, Planned, Wanted};
use super::permissions;
use crate::model::{Manifest, Profile, ProviderKind};
use crate::render::{self, RenderContext, RenderError};
use crate::repofs::Root;

/// The project agents folder of `kind`'s CLI and its file format.
pub fn agents_dir(kind: ProviderKind) -> (&'static str, Format) {
    match kind {
        ProviderKind::ClaudeCode => (".claude/agents", Format::Markdown),
        ProviderKind::Opencode => (".opencode/agents", Format::Markdown),
        ProviderKind::GeminiCli => (".gemini/agents", Format::Markdown),
        ProviderKind::Codex => (".codex/agents", Format::Toml),
    }
}

/// The text of `kind`'s agent file for profile `name`, and notes.
fn agent_file(
    kind: ProviderKind,
    manifest: &Manifest,
    name: &str,
    p: &Profile,
    ctx: &RenderContext,
) -> Result<(String, Vec<String>), RenderError> {
    let mut notes = Vec::new();
    let body = match &p.prompt {
        Some(prompt) => render::prompt(
            manifest,
            prompt,
            &BTreeMap::new(),
            &ctx.clone().with_profile(name),
        )?,
        // A subagent's body is its system prompt: never empty.
        None => p.description.clone(),
    };
    let model = p
        .model
        .as_ref()
        .map(|m| render::text_out(m, || format!("`model` of profile `{name}`")))
        .transpose()?;
    if kind == ProviderKind::Codex {
        let mut table = toml::Table::new();
        table.insert("name".into(), toml::Value::String(name.to_string()));
        table.insert(
            "description".into(),
            toml::Value::String(render::scrub(&p.description)),
        );
        if let Some(model) = model {
            table.insert("model".into(), toml::Value::String(model));
        }
        table.insert("developer_instructions".into(), toml::Value::String(body));
        if !(p.allowed_tools.is_empty() && p.ask_tools.is_empty() && p.denied_tools.is_empty()) {
            notes.push(format!(
                "Codex CLI's agent roles have no per-tool list; agent `{name}`'s tool patterns are left out (`npc hook run` still applies `ask_tools`)"
            ));
        }
        return Ok((
            Format::toml(&toml::to_string(&table).unwrap_or_default()),
            notes,
        ));
    }
    let mut front = Map::new();
    let joined = |list: &[String]| Value::String(list.join(", "));
    match kind {
        ProviderKind::Opencode => {
            front.insert("description".into(), p.description.clone().into());
            front.insert("mode".into(), "subagent".into());
            if let Some(model) = model {
                front.insert("model".into(), model.into());
            }
            let (permission, skipped) = permissions::opencode_permission(p);
            if !permission.is_empty() {
                front.insert("permission".into(), Value::Object(permission));
            }
            if !skipped.is_empty() {
                notes.push(format!(
                    "OpenCode has no tool for {}; left out of agent `{name}`'s permissions",
                    skipped
                        .iter()
                        .map(|s| format!("`{s}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
        }
        _ => {
            front.insert("name".into(), name.into());
            front.insert("description".into(), p.description.clone().into());
            if kind == ProviderKind::ClaudeCode {
                if !p.allowed_tools.is_empty() {
                    front.insert("tools".into(), joined(&p.allowed_tools));
                }
                if !p.denied_tools.is_empty() {
                    front.insert("disallowedTools".into(), joined(&p.denied_tools));
                }
            } else if !p.allowed_tools.is_empty() || !p.denied_tools.is_empty() {
                notes.push(format!(
                    "Gemini CLI's agent `tools` name its own tools, not npc's patterns; agent `{name}` inherits the session's tools"
                ));
            }
            if let Some(model) = model {
                front.insert("model".into(), model.into());
            }
        }
    }
    let front: Map<String, Value> = front
        .into_iter()
        .map(|(k, v)| (k, scrub_value(v)))
        .collect();
    Ok((
        Format::markdown(&render::yaml::mapping(&front), &body),
        notes,
    ))
}

fn scrub_value(v: Value) -> Value {
    match v {
        Value::String(s) => Value::String(render::scrub(&s)),
        Value::Object(m) => Value::Object(
            m.into_iter()
                .map(|(k, v)| (render::scrub(&k), scrub_value(v)))
                .collect(),
        ),
        other => other,
    }
}

/// Every agent file npc would create, update or remove in the repository
/// at `root` (unchanged ones left out), and notes.
pub fn plan(manifest: &Manifest, root: &Path, ctx: &RenderContext) -> (Vec<Planned>, Vec<String>) {
    let declared: BTreeSet<ProviderKind> = manifest.providers.values().map(|p| p.kind).collect();
    let kind_of = |p: &Profile| manifest.providers.get(&p.provider).map(|v| v.kind);
    let mut notes = Vec::new();
    let Ok(repo) = Root::new(root) else {
        return (Vec::new(), notes);
    };
    let mut out = Vec::new();
    for kind in ProviderKind::ALL {
        let (folder, format) = agents_dir(kind);
        let mut wanted = Wanted::new();
        let mut failed = Vec::new();
        if declared.contains(&kind) {
            for (name, p) in manifest
                .profiles
                .iter()
                .filter(|(_, p)| kind_of(p) == Some(kind))
            {
                let what = format!("{} agent `{name}`", kind.as_str());
                match agent_file(kind, manifest, name, p, ctx) {
                    Ok((text, more)) => {
                        notes.extend(more);
                        wanted.insert(name.clone(), (what, text));
                    }
                    Err(e) => {
                        // The file stays as it is.
                        wanted.insert(name.clone(), (String::new(), String::new()));
                        failed.push(Planned::failed(
                            Path::new(folder).join(format!("{name}.{}", format.extension())),
                            what,
                            e.to_string(),
                        ));
                    }
                }
            }
        }
        // A file that failed to render keeps its text as it is.
        out.extend(managed::plan_folder_with_failures(
            &repo,
            Path::new(folder),
            format,
            &wanted,
            failed,
        ));
    }
    (out, notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MANIFEST: &str = r#"version = 1
[providers.claude]
kind = "claude_code"
[providers.gemini]
kind = "gemini_cli"
[providers.opencode]
kind = "opencode"
[providers.codex]
kind = "codex"
[prompts.reviewer]
template = "You review {{ profile.name }}'s changes for {{ vars.focus }}."
[prompts.reviewer.variables.focus]
default = "bugs"
[profiles.reviewer]
provider = "claude"
description = "Reviews changes"
prompt = "reviewer"
model = "sonnet"
allowed_tools = ["Read", "Bash(git diff:*)", "mcp__fs__*"]
denied_tools = ["Write"]
[profiles.gem]
provider = "gemini"
description = "Gemini helper"
allowed_tools = ["Read"]
[profiles.oc]
provider = "opencode"
description = "OpenCode helper"
prompt = "reviewer"
allowed_tools = ["Read", "Bash(git diff:*)", "mcp__fs__read_file", "Frobnicate"]
ask_tools = ["Bash"]
denied_tools = ["Write"]
[profiles.cx]
provider = "codex"
description = "Codex helper"
prompt = "reviewer"
model = "gpt-5"
allowed_tools = ["Read"]
"#;

    #[test]
    fn each_profile_becomes_an_agent_of_its_own_cli() {
        let m = crate::native::commands::tests::manifest(MANIFEST);
        let dir = tempfile::tempdir().unwrap();
        let ctx = RenderContext::new(dir.path(), &m);
        let (planned, notes) = plan(&m, dir.path(), &ctx);
        let shown = managed::testing::shown(&planned);
        insta::assert_snapshot!(shown);
        insta::assert_debug_snapshot!(notes);
    }

    #[test]
    fn agents_leave_with_their_profile() {
        let m = crate::native::commands::tests::manifest(MANIFEST);
        let dir = tempfile::tempdir().unwrap();
        let ctx = RenderContext::new(dir.path(), &m);
        managed::testing::write_all(dir.path(), &plan(&m, dir.path(), &ctx).0);
        std::fs::write(
            dir.path().join(".claude/agents/mine.md"),
            "---\nname: mine\n---\n",
        )
        .unwrap();
        let none = crate::native::commands::tests::manifest(
            "version = 1\n[providers.claude]\nkind = \"claude_code\"\n",
        );
        let (planned, _) = plan(&none, dir.path(), &RenderContext::new(dir.path(), &none));
        let removed: Vec<String> = planned
            .iter()
            .filter(|p| p.after.is_none())
            .map(|p| p.path.display().to_string())
            .collect();
        assert_eq!(
            removed,
            [
                ".claude/agents/reviewer.md",
                ".codex/agents/cx.toml",
                ".gemini/agents/gem.md",
                ".opencode/agents/oc.md"
            ]
        );
    }
}
