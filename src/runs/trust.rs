//! Workspace trust for a worktree npc made: each agent CLI reads a
//! repository's own settings (permissions, hooks, MCP servers) only in a
//! workspace its user trusts, and ignores them silently elsewhere (Claude
//! Code: "this workspace has not been trusted"). Before a worktree run
//! starts, [`TrustPlan::establish`] trusts the run's worktree the CLI's own
//! documented way, or fails the run at once ([`UntrustedWorkspace`], reason
//! `untrusted`, with the exact fix):
//! - Codex: the per-invocation override `-c projects={"DIR"={trust_level =
//!   "trusted"}}` (no file is written);
//! - Gemini CLI: `GEMINI_CLI_TRUST_WORKSPACE=true` in the run's environment
//!   (its documented headless way; no file is written);
//! - Claude Code trusts a git worktree through its repository (the
//!   `projects["REPO"].hasTrustDialogAccepted` its trust dialog stores in
//!   `~/.claude.json`, keyed by the repository holding the worktree's
//!   branch, never the worktree): npc trusts no repository on the user's
//!   behalf, so a worktree whose Claude Code settings
//!   (`.claude/settings.json`, `.claude/settings.local.json`) would be
//!   ignored fails at once with the fix; without them nothing is ignored;
//! - OpenCode has no workspace trust.
//!
//! Only a directory npc made is trusted: `ROOT/RUN-ID` under the worktrees
//! directory, a real directory (itself no link) whose name is a run id npc
//! makes. A repository names no path that gets trusted, and npc writes no
//! CLI's user configuration.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::model::ProviderKind;
use crate::supervisor::ChildSpec;

/// Claude Code's user config file name (in `$CLAUDE_CONFIG_DIR`, else `$HOME`).
pub const CLAUDE_CONFIG_FILE: &str = ".claude.json";
/// The key of a project entry Claude Code's trust dialog sets.
pub const CLAUDE_TRUST_KEY: &str = "hasTrustDialogAccepted";
/// Gemini CLI's variable that trusts the workspace for one session.
pub const GEMINI_TRUST_ENV: &str = "GEMINI_CLI_TRUST_WORKSPACE";
/// The project files Claude Code ignores in a workspace it does not trust.
pub const CLAUDE_PROJECT_SETTINGS: [&str; 2] =
    [".claude/settings.json", ".claude/settings.local.json"];

/// The agent CLI would not trust a run's workspace, and npc could not (or
/// may not) trust it for the CLI: the run fails at once (reason
/// `untrusted`) rather than run with the repository's settings ignored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{cli} does not trust `{}`: {why}; {fix}", dir.display())]
pub struct UntrustedWorkspace {
    pub cli: &'static str,
    pub dir: PathBuf,
    pub why: String,
    /// The exact command or edit that trusts it.
    pub fix: String,
}

/// The trust a worktree run needs before its agent starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustPlan {
    pub kind: ProviderKind,
    /// The run's worktree.
    pub dir: PathBuf,
    /// The worktrees directory it must lie directly in.
    pub worktrees: PathBuf,
    /// The repository holding the worktree's branch (the main checkout, a
    /// fleet worker's mirror): Claude Code's project for the worktree.
    pub repository: PathBuf,
}

/// What [`TrustPlan::establish`] found or did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Established {
    /// The CLI trusts the directory already, has no notion of trust, or has
    /// nothing there it would ignore.
    Already,
    /// The run's own arguments or environment trust it.
    ForTheRun,
}

/// Where Claude Code keeps its user config: `$CLAUDE_CONFIG_DIR/.claude.json`,
/// else `$HOME/.claude.json`.
pub fn claude_config_path(
    config_dir: Option<&std::ffi::OsStr>,
    home: Option<&Path>,
) -> Option<PathBuf> {
    match config_dir.filter(|d| !d.is_empty()) {
        Some(dir) => Some(Path::new(dir).join(CLAUDE_CONFIG_FILE)),
        None => home.map(|h| h.join(CLAUDE_CONFIG_FILE)),
    }
}

impl TrustPlan {
    /// Trust the run's worktree for its CLI: `spec` gets what trusts it for
    /// the run (Codex, Gemini CLI), or the CLI must trust it already (Claude
    /// Code, where it would ignore settings).
    pub fn establish(&self, spec: &mut ChildSpec) -> Result<Established, UntrustedWorkspace> {
        let dir = self.check_own()?;
        match self.kind {
            ProviderKind::Opencode => Ok(Established::Already),
            ProviderKind::GeminiCli => {
                spec.env
                    .insert(GEMINI_TRUST_ENV.to_string(), "true".to_string());
                Ok(Established::ForTheRun)
            }
            ProviderKind::Codex => {
                // Before the prompt's `--` (the args end `-- PROMPT`, and
                // the prompt itself may be `--`), among the CLI's options.
                let n = spec.args.len();
                let at = if n >= 2 && spec.args[n - 2] == "--" {
                    n - 2
                } else {
                    spec.args.iter().position(|a| a == "--").unwrap_or(n)
                };
                let pair = codex_trust_override(&dir);
                spec.args.splice(at..at, ["-c".to_string(), pair]);
                Ok(Established::ForTheRun)
            }
            ProviderKind::ClaudeCode => {
                // What the agent sees: its own environment, else npc's.
                let env = |k: &str| {
                    spec.env
                        .get(k)
                        .map(std::ffi::OsString::from)
                        .or_else(|| std::env::var_os(k))
                };
                let home = env("HOME").map(PathBuf::from);
                let config =
                    claude_config_path(env("CLAUDE_CONFIG_DIR").as_deref(), home.as_deref());
                self.claude_trust(config.as_deref(), &dir)
            }
        }
    }

    /// The directory must be one npc made: `worktrees/RUN-ID`, a real
    /// directory (itself no link; the worktrees directory resolved). Its
    /// real path, which the CLI sees as its working directory.
    fn check_own(&self) -> Result<PathBuf, UntrustedWorkspace> {
        let name = self
            .dir
            .file_name()
            .filter(|n| n.to_str().is_some_and(super::workspace::is_run_id));
        let is_dir = std::fs::symlink_metadata(&self.dir).is_ok_and(|m| m.is_dir());
        let real = self.dir.canonicalize().ok();
        let expected = match (name, self.worktrees.canonicalize()) {
            (Some(name), Ok(root)) if self.dir.parent() == Some(self.worktrees.as_path()) => {
                Some(root.join(name))
            }
            _ => None,
        };
        match (real, expected) {
            (Some(real), Some(expected)) if is_dir && real == expected => Ok(real),
            _ => Err(UntrustedWorkspace {
                cli: cli_name(self.kind),
                dir: self.dir.clone(),
                why: "npc trusts only the worktrees it made itself (a real directory named after the run in the worktrees directory)".to_string(),
                fix: "trust the directory yourself in the CLI, or run in place".to_string(),
            }),
        }
    }

    /// Claude Code: its project for the worktree (the repository) must be
    /// trusted when the worktree holds settings it would ignore.
    fn claude_trust(
        &self,
        config: Option<&Path>,
        dir: &Path,
    ) -> Result<Established, UntrustedWorkspace> {
        match claude_ignores(config, dir, &self.repository) {
            None => Ok(Established::Already),
            Some((project, ignored)) => Err(UntrustedWorkspace {
                cli: cli_name(self.kind),
                dir: self.dir.clone(),
                why: format!(
                    "it trusts a git worktree through its repository `{}`, which it does not trust, so it would ignore the worktree's `{}`",
                    project.display(),
                    ignored.join("`, `")
                ),
                fix: claude_fix(config, &project),
            }),
        }
    }
}

/// The project settings Claude Code would ignore in `dir` because its user
/// config (`config`) does not trust `project` (`dir`'s project: itself, or
/// a worktree's repository), with the project's real path; `None` when it
/// would ignore nothing.
fn claude_ignores(
    config: Option<&Path>,
    dir: &Path,
    project: &Path,
) -> Option<(PathBuf, Vec<&'static str>)> {
    let ignored: Vec<&str> = CLAUDE_PROJECT_SETTINGS
        .into_iter()
        .filter(|f| std::fs::symlink_metadata(dir.join(f)).is_ok())
        .collect();
    if ignored.is_empty() {
        return None;
    }
    let project = project
        .canonicalize()
        .unwrap_or_else(|_| project.to_path_buf());
    let text = config.and_then(|p| crate::native::read_existing(p).ok().flatten());
    (!claude_project_trusted(text.as_deref(), &project)).then_some((project, ignored))
}

/// How to make Claude Code trust `project`.
fn claude_fix(config: Option<&Path>, project: &Path) -> String {
    let file = config.map_or("~/.claude.json".to_string(), |f| f.display().to_string());
    format!(
        "start `claude` in `{}` once and accept its trust dialog, or set `projects[\"{}\"].{CLAUDE_TRUST_KEY}` to `true` in `{file}`",
        project.display(),
        project.display()
    )
}

/// The warning of a Claude Code run in place (in `dir`, with the child's
/// environment `env`) whose settings Claude Code would ignore: the run goes
/// on (what it is refused ends it `blocked`), the warning says why and how
/// to fix it.
pub fn claude_in_place_warning(
    env: &std::collections::BTreeMap<String, String>,
    dir: &Path,
) -> Option<String> {
    let var = |k: &str| {
        env.get(k)
            .map(std::ffi::OsString::from)
            .or_else(|| std::env::var_os(k))
    };
    let home = var("HOME").map(PathBuf::from);
    let config = claude_config_path(var("CLAUDE_CONFIG_DIR").as_deref(), home.as_deref());
    let (project, ignored) = claude_ignores(config.as_deref(), dir, dir)?;
    Some(format!(
        "Claude Code does not trust `{}` and ignores its `{}` (their permissions and hooks); {}",
        project.display(),
        ignored.join("`, `"),
        claude_fix(config.as_deref(), &project)
    ))
}

/// Whether Claude Code's user config (`~/.claude.json`'s text; `None` when
/// absent) trusts the project `root` itself: `projects["ROOT"]
/// .hasTrustDialogAccepted` is what it checks before reading a project's
/// settings (the directory a run starts in, or a worktree's repository).
pub fn claude_project_trusted(config: Option<&str>, root: &Path) -> bool {
    let Some(doc) = config.and_then(|c| serde_json::from_str::<Value>(c).ok()) else {
        return false;
    };
    root.to_str()
        .is_some_and(|k| doc["projects"][k][CLAUDE_TRUST_KEY] == Value::Bool(true))
}

/// The CLI's own name, for messages.
fn cli_name(kind: ProviderKind) -> &'static str {
    match kind {
        ProviderKind::ClaudeCode => "Claude Code",
        ProviderKind::Codex => "Codex",
        ProviderKind::GeminiCli => "Gemini CLI",
        ProviderKind::Opencode => "OpenCode",
    }
}

/// Codex's per-invocation override that trusts `dir`.
pub fn codex_trust_override(dir: &Path) -> String {
    let key = Value::String(dir.to_string_lossy().into_owned()).to_string();
    format!("projects={{{key}={{trust_level=\"trusted\"}}}}")
}

#[cfg(test)]
mod tests;
