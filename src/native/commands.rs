//! Slash commands: a prompt with `command = true` becomes `/NAME` in every
//! declared agent CLI that has project commands, as npc's own file (see
//! [`super::managed`]), checked against the installed CLIs:
//! - Claude Code (2.1): `.claude/commands/NAME.md`, frontmatter
//!   `description` and `argument-hint`; the body takes `$ARGUMENTS` (all
//!   the text after the command) or `$1`, `$2`, … (words).
//! - OpenCode (1.18): `.opencode/commands/NAME.md` (it reads
//!   `{command,commands}/**/*.md` under `.opencode`), frontmatter
//!   `description`; the body is the template, with `$ARGUMENTS` and `$1`, ….
//! - Gemini CLI (0.61): `.gemini/commands/NAME.toml`, `description` and
//!   `prompt`; `{{args}}` is the text after the command, and a prompt
//!   without it gets that text appended.
//! - Codex CLI (0.171) reads custom prompts only from the user's
//!   `$CODEX_HOME/prompts/`, outside the repository: npc writes none (a note
//!   says so).
//!
//! Variables become the CLI's arguments: a prompt with one variable takes
//! the whole argument text (`$ARGUMENTS`, `{{args}}`); with several, each
//! is one word in name order (`$1`, `$2`, … — Gemini CLI has no words, so
//! each variable is written as `<NAME>` and the argument text is appended).
//! A variable's default cannot be expressed: an omitted argument is empty.
//! The prompt is rendered like every prompt (`render::prompt`), with each
//! variable set to its placeholder, so `{{ vars.NAME }}` prints it.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Map, Value};

use super::managed::{self, Format, Planned, Wanted};
use crate::model::{Manifest, Prompt, ProviderKind};
use crate::render::{self, RenderContext};
use crate::repofs::Root;

/// The project commands folder of `kind`'s CLI and its file format.
pub fn commands_dir(kind: ProviderKind) -> Option<(&'static str, Format)> {
    match kind {
        ProviderKind::ClaudeCode => Some((".claude/commands", Format::Markdown)),
        ProviderKind::Opencode => Some((".opencode/commands", Format::Markdown)),
        ProviderKind::GeminiCli => Some((".gemini/commands", Format::Toml)),
        ProviderKind::Codex => None,
    }
}

/// What each variable renders as in `kind`'s command, in name order.
fn placeholders(kind: ProviderKind, prompt: &Prompt) -> BTreeMap<String, String> {
    let names: Vec<&String> = prompt.variables.keys().collect();
    let single = names.len() == 1;
    names
        .into_iter()
        .enumerate()
        .map(|(i, name)| {
            let shown = match kind {
                ProviderKind::GeminiCli if single => "{{args}}".to_string(),
                ProviderKind::GeminiCli => format!("<{name}>"),
                _ if single => "$ARGUMENTS".to_string(),
                _ => format!("${}", i + 1),
            };
            (name.clone(), shown)
        })
        .collect()
}

/// The text of `kind`'s command file for prompt `name`.
fn command_file(
    kind: ProviderKind,
    manifest: &Manifest,
    name: &str,
    prompt: &Prompt,
    ctx: &RenderContext,
) -> Result<String, render::RenderError> {
    let body = render::prompt(manifest, name, &placeholders(kind, prompt), ctx)?;
    let description = prompt.description.clone();
    Ok(match kind {
        ProviderKind::GeminiCli => {
            let mut table = toml::Table::new();
            if let Some(d) = description {
                table.insert("description".into(), toml::Value::String(d));
            }
            table.insert("prompt".into(), toml::Value::String(body));
            Format::toml(&toml::to_string(&table).unwrap_or_default())
        }
        _ => {
            let mut front = Map::new();
            if let Some(d) = description {
                front.insert("description".into(), Value::String(d));
            }
            if kind == ProviderKind::ClaudeCode && !prompt.variables.is_empty() {
                let hint: Vec<String> = prompt.variables.keys().map(|v| format!("<{v}>")).collect();
                front.insert("argument-hint".into(), Value::String(hint.join(" ")));
            }
            let front = if front.is_empty() {
                String::new()
            } else {
                render::yaml::mapping(&front)
            };
            Format::markdown(&front, &body)
        }
    })
}

/// Every command file npc would create, update or remove in the repository
/// at `root` (unchanged ones left out), and notes on what cannot be
/// expressed.
pub fn plan(manifest: &Manifest, root: &Path, ctx: &RenderContext) -> (Vec<Planned>, Vec<String>) {
    let declared: std::collections::BTreeSet<ProviderKind> =
        manifest.providers.values().map(|p| p.kind).collect();
    let commands: Vec<(&String, &Prompt)> =
        manifest.prompts.iter().filter(|(_, p)| p.command).collect();
    let mut notes = Vec::new();
    if !commands.is_empty() && declared.contains(&ProviderKind::Codex) {
        notes.push("Codex CLI reads custom prompts only from the user's `~/.codex/prompts`, outside the repository; npc writes no Codex command".to_string());
    }
    if commands
        .iter()
        .any(|(_, p)| p.variables.values().any(|v| v.default.is_some()))
    {
        notes.push("a command's variable defaults are not applied by the agent CLIs: an omitted argument is empty".to_string());
    }
    let Ok(repo) = Root::new(root) else {
        return (Vec::new(), notes);
    };
    let mut out = Vec::new();
    for kind in ProviderKind::ALL {
        let Some((folder, format)) = commands_dir(kind) else {
            continue;
        };
        let mut wanted = Wanted::new();
        let mut failed = Vec::new();
        if declared.contains(&kind) {
            for (name, prompt) in &commands {
                let what = format!("{} command /{name}", kind.as_str());
                match command_file(kind, manifest, name, prompt, ctx) {
                    Ok(text) => {
                        wanted.insert(name.to_string(), (what, text));
                    }
                    Err(e) => failed.push(Planned::failed(
                        Path::new(folder).join(format!("{name}.{}", format.extension())),
                        what,
                        e.to_string(),
                    )),
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
pub(crate) mod tests {
    use super::*;

    pub(crate) fn manifest(text: &str) -> Manifest {
        struct NoFiles;
        impl crate::model::Files for NoFiles {
            fn read_to_string(&self, _: &Path) -> std::io::Result<String> {
                Err(std::io::ErrorKind::NotFound.into())
            }
            fn is_dir(&self, _: &Path) -> bool {
                false
            }
        }
        let env = BTreeMap::<String, String>::new();
        let loaded = crate::model::load_bytes(
            "npcagent.toml",
            text.as_bytes(),
            crate::model::Syntax::Toml,
            &env,
            &NoFiles,
        );
        loaded
            .manifest
            .unwrap_or_else(|| panic!("{:#?}", loaded.diagnostics))
    }

    const MANIFEST: &str = r#"version = 1
[providers.claude]
kind = "claude_code"
[providers.gemini]
kind = "gemini_cli"
[providers.opencode]
kind = "opencode"
[providers.codex]
kind = "codex"
[prompts.review]
command = true
description = "Review a change"
template = "Review {{ vars.target }} carefully."
[prompts.review.variables.target]
description = "what to review"
[prompts.port]
command = true
template = "Port {{ vars.from }} to {{ vars.to }}."
[prompts.port.variables.from]
[prompts.port.variables.to]
default = "rust"
[prompts.plain]
template = "not a command"
"#;

    #[test]
    fn each_cli_gets_its_command_files_with_its_placeholders() {
        let m = manifest(MANIFEST);
        let dir = tempfile::tempdir().unwrap();
        let ctx = RenderContext::new(dir.path(), &m);
        let (planned, notes) = plan(&m, dir.path(), &ctx);
        let shown = managed::testing::shown(&planned);
        insta::assert_snapshot!(shown);
        assert!(notes.iter().any(|n| n.contains("Codex")), "{notes:?}");
        assert!(notes.iter().any(|n| n.contains("defaults")), "{notes:?}");
        assert!(
            !planned
                .iter()
                .any(|p| p.path.to_string_lossy().contains("plain"))
        );
    }

    #[test]
    fn commands_leave_when_the_prompt_or_the_cli_goes() {
        let m = manifest(MANIFEST);
        let dir = tempfile::tempdir().unwrap();
        let ctx = RenderContext::new(dir.path(), &m);
        let (planned, _) = plan(&m, dir.path(), &ctx);
        managed::testing::write_all(dir.path(), &planned);
        assert!(plan(&m, dir.path(), &ctx).0.is_empty(), "in step");
        let fewer = manifest(
            &MANIFEST
                .replace("[providers.gemini]\nkind = \"gemini_cli\"\n", "")
                .replace("[prompts.port]\ncommand = true\n", "[prompts.port]\n"),
        );
        let ctx = RenderContext::new(dir.path(), &fewer);
        let (planned, _) = plan(&fewer, dir.path(), &ctx);
        let removed: Vec<String> = planned
            .iter()
            .filter(|p| p.after.is_none())
            .map(|p| p.path.display().to_string())
            .collect();
        assert_eq!(
            removed,
            [
                ".claude/commands/port.md",
                ".gemini/commands/port.toml",
                ".gemini/commands/review.toml",
                ".opencode/commands/port.md",
            ]
        );
    }
}
