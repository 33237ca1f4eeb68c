//! Workspace trust for a worktree npc made: each agent CLI reads a
//! repository's own settings (permissions, hooks, MCP servers) only in a
//! workspace its user trusts, and ignores them silently elsewhere (Claude
//! Code: "this workspace has not been trusted"). Before a worktree run
//! starts, [`TrustPlan::establish`] trusts the run's worktree the CLI's own
//! documented way, or fails the run at once ([`UntrustedWorkspace`], reason
//! `untrusted`, with the exact fix):
//! - Claude Code: `projects["DIR"].hasTrustDialogAccepted = true` in its
//!   user config (`$CLAUDE_CONFIG_DIR/.claude.json`, else `~/.claude.json`),
//!   what its trust dialog stores, unless the directory or one above it is
//!   trusted already; the file is edited as a document, written atomically,
//!   never through a link, and left alone when it does not parse;
//! - Codex: the per-invocation override `-c projects={"DIR"={trust_level =
//!   "trusted"}}` (no file is written);
//! - Gemini CLI: `GEMINI_CLI_TRUST_WORKSPACE=true` in the run's environment
//!   (its documented headless way; no file is written);
//! - OpenCode has no workspace trust.
//!
//! Only a directory npc made is trusted: `ROOT/RUN-ID` under the worktrees
//! directory, a real directory (no link on the way) whose name is a run id
//! npc makes. A repository names no path that gets trusted.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::agent::UntrustedWorkspace;
use crate::model::ProviderKind;
use crate::supervisor::ChildSpec;

/// Claude Code's user config file name (in `$CLAUDE_CONFIG_DIR`, else `$HOME`).
pub const CLAUDE_CONFIG_FILE: &str = ".claude.json";
/// The key of a project entry Claude Code's trust dialog sets.
pub const CLAUDE_TRUST_KEY: &str = "hasTrustDialogAccepted";
/// Gemini CLI's variable that trusts the workspace for one session.
pub const GEMINI_TRUST_ENV: &str = "GEMINI_CLI_TRUST_WORKSPACE";

/// Serializes npc's edits of the user's Claude Code config within this
/// process (a daemon starts several worktree runs at once).
static CLAUDE_CONFIG_EDIT: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The trust a worktree run needs before its agent starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustPlan {
    pub kind: ProviderKind,
    /// The run's worktree.
    pub dir: PathBuf,
    /// The worktrees directory it must lie directly in.
    pub worktrees: PathBuf,
}

/// What [`TrustPlan::establish`] did, in words (for the run's warnings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Established {
    /// The CLI trusts the directory already (or has no notion of trust).
    Already,
    /// The run's own arguments or environment trust it.
    ForTheRun,
    /// npc stored the CLI's trust of it in `file`.
    Stored { file: PathBuf },
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
    /// the run (Codex, Gemini CLI), or the user's config stores it (Claude
    /// Code).
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
                let at = spec
                    .args
                    .iter()
                    .rposition(|a| a == "--")
                    .unwrap_or(spec.args.len());
                let pair = codex_trust_override(&dir);
                spec.args.splice(at..at, ["-c".to_string(), pair]);
                Ok(Established::ForTheRun)
            }
            ProviderKind::ClaudeCode => {
                let env = |k: &str| {
                    spec.env
                        .get(k)
                        .map(std::ffi::OsString::from)
                        .or_else(|| std::env::var_os(k))
                };
                let home = env("HOME").map(PathBuf::from);
                let path = claude_config_path(env("CLAUDE_CONFIG_DIR").as_deref(), home.as_deref())
                    .ok_or_else(|| self.untrusted("npc knows no home directory (`HOME`)", None))?;
                self.claude_trust(&path, &dir)
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

    fn untrusted(&self, why: &str, file: Option<&Path>) -> UntrustedWorkspace {
        let file = file.map_or("~/.claude.json".to_string(), |f| f.display().to_string());
        UntrustedWorkspace {
            cli: cli_name(self.kind),
            dir: self.dir.clone(),
            why: why.to_string(),
            fix: format!(
                "set `projects[\"{}\"].{CLAUDE_TRUST_KEY}` to `true` in `{file}` (or start `claude` once in the repository and accept its trust dialog, which trusts every worktree below it)",
                self.dir.display()
            ),
        }
    }

    /// Claude Code: store the trust in its user config unless it holds it.
    fn claude_trust(&self, path: &Path, dir: &Path) -> Result<Established, UntrustedWorkspace> {
        let _one = crate::stdx::lock(&CLAUDE_CONFIG_EDIT);
        let text = crate::native::read_existing(path).map_err(|e| {
            self.untrusted(
                &format!("cannot read `{}`: {e}", path.display()),
                Some(path),
            )
        })?;
        if crate::native::doctor::claude_trusts(text.as_deref(), dir) {
            return Ok(Established::Already);
        }
        let after = claude_trusted(text.as_deref(), dir).ok_or_else(|| {
            self.untrusted(
                &format!("`{}` is not a JSON object npc can edit", path.display()),
                Some(path),
            )
        })?;
        let (Some(parent), Some(_)) = (path.parent(), path.file_name()) else {
            return Err(self.untrusted("its config has no directory", Some(path)));
        };
        let write = crate::repofs::Root::new(parent).and_then(|root| {
            root.write(
                path,
                after.as_bytes(),
                crate::repofs::WriteOptions {
                    links: crate::repofs::Links::Refuse,
                    perms: crate::repofs::Perms::Shared,
                },
            )
        });
        write.map_err(|e| {
            self.untrusted(
                &format!("cannot write `{}`: {e}", path.display()),
                Some(path),
            )
        })?;
        Ok(Established::Stored {
            file: path.to_path_buf(),
        })
    }
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

/// Claude Code's config `text` (`None`: no file yet) with `dir` trusted,
/// every other byte of meaning kept; `None` when the text is no JSON
/// object (or its `projects` no object), which npc leaves alone.
pub fn claude_trusted(text: Option<&str>, dir: &Path) -> Option<String> {
    let mut doc = match text {
        Some(t) if !t.trim().is_empty() => serde_json::from_str::<Value>(t).ok()?,
        _ => Value::Object(Map::new()),
    };
    let projects = doc
        .as_object_mut()?
        .entry("projects")
        .or_insert_with(|| Value::Object(Map::new()))
        .as_object_mut()?;
    let entry = projects
        .entry(dir.to_str()?.to_string())
        .or_insert_with(|| Value::Object(Map::new()));
    if !entry.is_object() {
        *entry = Value::Object(Map::new());
    }
    entry
        .as_object_mut()?
        .insert(CLAUDE_TRUST_KEY.to_string(), Value::Bool(true));
    let mut out = serde_json::to_string_pretty(&doc).ok()?;
    out.push('\n');
    Some(out)
}

#[cfg(test)]
mod tests;
