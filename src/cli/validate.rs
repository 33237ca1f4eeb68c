//! `npc validate`: load a manifest and print every diagnostic, like a
//! compiler (human) or like `terraform validate -json` (json).

use std::path::PathBuf;

use anyhow::Context as _;

use super::{Exit, Format};
use crate::model::Manifest;
use crate::model::diagnostics::JsonReport;
use crate::stdx::term::printable;

/// How `npc validate` reads the environment.
#[derive(Debug, Clone, Copy)]
pub struct Env {
    /// A `${VAR}` nobody set is a warning (`--allow-missing-env`).
    pub allow_missing_env: bool,
}

pub fn run(path: Option<PathBuf>, env: Env, format: Format) -> anyhow::Result<Exit> {
    let path = super::manifest_path(path)?;
    let process: &dyn crate::model::Env = if env.allow_missing_env {
        &crate::disk::ProcessEnvAllowingUnset
    } else {
        &crate::disk::ProcessEnv
    };
    let loaded = crate::runtime::load_from_disk_with(&path, process)
        .with_context(|| format!("cannot read `{}`", path.display()))?;
    let errors = loaded.error_count();
    let warnings = loaded.diagnostics.len() - errors;
    match format {
        Format::Json => {
            let report = JsonReport::new(&loaded.diagnostics);
            outln!("{}", serde_json::to_string_pretty(&report)?)?;
        }
        Format::Human => {
            let mut out = String::new();
            for d in &loaded.diagnostics {
                out.push_str(&d.to_string());
                out.push('\n');
            }
            let name = loaded.source.name();
            match &loaded.manifest {
                Some(m) if warnings == 0 => {
                    out.push_str(&format!("{name}: valid ({})\n", summary(m)))
                }
                Some(m) => out.push_str(&format!(
                    "{name}: valid with {} ({})\n",
                    plural(warnings, "warning"),
                    summary(m)
                )),
                None => out.push_str(&format!(
                    "{name}: invalid: {}{}\n",
                    plural(errors, "error"),
                    if warnings > 0 {
                        format!(", {}", plural(warnings, "warning"))
                    } else {
                        String::new()
                    }
                )),
            }
            if let Some(m) = &loaded.manifest {
                let dir = path.parent().unwrap_or(std::path::Path::new("."));
                let dir = if dir.as_os_str().is_empty() {
                    std::path::Path::new(".")
                } else {
                    dir
                };
                out.push_str(&workspaces(
                    m,
                    crate::runs::workspace::is_git_repository(dir),
                ));
                out.push_str(&sandboxes(m));
            }
            out!("{}", printable(&out))?;
        }
    }
    // The process ends here: its memory goes back to the system at once.
    loaded.leave();
    Ok(if errors == 0 { Exit::Ok } else { Exit::Failed })
}

/// Where each trigger's runs work, one line per trigger (none without triggers).
fn workspaces(m: &Manifest, git: bool) -> String {
    m.triggers
        .iter()
        .map(|(name, t)| {
            let place = match m.trigger_workspace_mode(t, git) {
                crate::model::WorkspaceMode::Worktree => {
                    "in a worktree of its own, its result a branch"
                }
                crate::model::WorkspaceMode::InPlace => "in the repository's checkout",
            };
            format!("trigger `{name}` runs {place}\n")
        })
        .collect()
}

/// Which sandbox each trigger's and profile's runs get, as the manifest
/// declares it. Whether this machine provides it is `npc doctor`'s to say:
/// validate checks a document (in CI, often on another machine), and a
/// probe of the kernel costs two processes.
fn sandboxes(m: &Manifest) -> String {
    if m.triggers.is_empty() && m.profiles.is_empty() {
        return String::new();
    }
    crate::runs::sandbox::describe(m, &Ok(()))
        .into_iter()
        .map(|line| line + "\n")
        .collect()
}

/// Whether this machine can sandbox runs (`Err`: why not).
pub fn sandbox_support() -> Result<(), String> {
    std::env::current_exe()
        .map_err(|e| format!("cannot find the `npc` binary: {e}"))
        .and_then(|exe| crate::supervisor::probe_sandbox(&exe))
}

fn plural(n: usize, word: &str) -> String {
    if n == 1 {
        format!("1 {word}")
    } else {
        format!("{n} {word}s")
    }
}

/// "2 MCP servers, 1 provider, …" for the sections that have entries.
fn summary(m: &Manifest) -> String {
    let hooks: usize = m.hooks.values().map(Vec::len).sum();
    let parts = [
        (m.mcp_servers.len(), "MCP server"),
        (m.providers.len(), "provider"),
        (m.profiles.len(), "profile"),
        (m.prompts.len(), "prompt"),
        (hooks, "hook"),
        (m.plugins.len(), "plugin"),
        (m.triggers.len(), "trigger"),
        (m.pane_plugins.len(), "pane plugin"),
        (m.panes.len(), "pane"),
        (m.notify.len(), "notification sink"),
        (m.workflows.len(), "workflow"),
    ];
    let shown: Vec<String> = parts
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, w)| plural(*n, w))
        .collect();
    if shown.is_empty() {
        "empty".to_string()
    } else {
        shown.join(", ")
    }
}
