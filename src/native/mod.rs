//! Native MCP configuration files: one registry (the manifest's
//! `mcp.servers`) kept in sync with each agent CLI's own MCP file — Claude
//! Code `.mcp.json`, Codex `.codex/config.toml`, Gemini CLI
//! `.gemini/settings.json`, OpenCode `opencode.json` — and the way back
//! (`npc import`).
//!
//! Export is a plan, then a write. [`plan_file`] reads the existing file,
//! changes only the entries npc manages (the caller passes the names it
//! managed before and stores the set returned), keeps every other key,
//! entry and comment, and returns the new text with a unified diff and
//! notes on anything a target cannot express. [`write`] replaces the file
//! atomically, and only when the text changed. A file that does not parse
//! is reported with its line and column and never overwritten. Gemini CLI
//! and OpenCode files are read as JSON with comments (see [`jsonc`]) and
//! rewritten with their comments kept. Secrets are written as environment
//! references, never as values, and plan diffs redact known secret values.

pub mod agents;
pub mod commands;
pub mod doctor;
pub(crate) mod edit;
pub use edit::{JsonDoc, Pass};
pub mod export;
pub mod gateway;
pub mod hooks;
pub mod import;
pub mod import_config;
pub mod jsonc;
pub mod managed;
pub mod ownership;
pub mod permissions;
pub mod refs;
pub mod rules;
pub mod run;
pub mod run_policy;
pub mod skills;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::model::Manifest;
pub use crate::model::ProviderKind;
use crate::repofs::{FsError, Reason, Root, WriteOptions};
pub use import::{
    Imported, ImportedServer, ImportedTransport, MergeOptions, Merged, import, import_str,
    import_with_kind, merge_into_manifest, same_as_manifest, to_manifest_toml,
};

/// Largest native configuration file npc reads (a user's `~/.claude.json`
/// holds per-project history and can grow to several megabytes).
pub const MAX_NATIVE_FILE_BYTES: usize = 16 * 1024 * 1024;
/// Lines of context around each change in a diff.
pub const DIFF_CONTEXT_LINES: usize = 3;

/// Which file: a project's own, or the user's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// The file inside the repository (the default).
    Project,
    /// The user-level file under `home`; only on an explicit request.
    User { home: PathBuf },
}

/// One native configuration file: which agent CLI, which scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub kind: ProviderKind,
    pub scope: Scope,
}

impl Target {
    /// The project-scoped file of `kind`.
    pub fn project(kind: ProviderKind) -> Self {
        Self {
            kind,
            scope: Scope::Project,
        }
    }
}

/// Options for [`plan_file`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PlanOptions {
    /// Replace an entry npc did not write when a manifest server has its
    /// name, instead of reporting a conflict and leaving it alone.
    pub force: bool,
}

/// The planned change to one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileChange {
    pub path: PathBuf,
    /// The file's text now; `None` when it does not exist.
    pub before: Option<String>,
    /// The file's text after the change. Empty, with `before` `None`, when
    /// there is nothing to write and the file is not created.
    pub after: String,
    /// Unified diff from `before` to `after`; empty when nothing changes.
    pub diff: String,
    /// What a target could not express, conflicts, and skipped servers.
    pub notes: Vec<String>,
    /// Entry names npc manages in this file after the change; the caller
    /// stores this and passes it as `previously_managed` next time.
    pub managed: BTreeSet<String>,
    /// Manifest servers whose name is taken by an entry npc did not write.
    pub conflicts: Vec<String>,
}

impl FileChange {
    /// Whether applying this change would modify the file system.
    pub fn is_change(&self) -> bool {
        match &self.before {
            Some(before) => *before != self.after,
            None => !self.after.is_empty(),
        }
    }

    /// The change from `before` to what `edited` made of it, its diff
    /// hiding `secrets`.
    fn planned(
        path: PathBuf,
        before: Option<String>,
        edited: edit::Edited,
        secrets: &[String],
    ) -> Self {
        let mut change = FileChange {
            diff: String::new(),
            path,
            before,
            after: edited.after,
            notes: edited.notes,
            managed: edited.managed,
            conflicts: edited.conflicts,
        };
        if change.is_change() {
            change.diff = redacted_diff(
                &change.path,
                change.before.as_deref(),
                &change.after,
                secrets,
            );
        }
        change
    }
}

/// Errors reading, planning, writing or importing native files.
#[derive(Debug, thiserror::Error)]
pub enum NativeError {
    #[error("cannot read `{path}`: {source}; check the path and its permissions")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write `{path}`: {source}; check the directory exists and is writable")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("`{path}` is larger than the limit of {limit} bytes; check the path")]
    TooLarge { path: PathBuf, limit: usize },
    #[error("`{path}` is not valid UTF-8; save it as UTF-8 and try again")]
    NotUtf8 { path: PathBuf },
    #[error(
        "{path}:{line}:{column}: not valid {format}: {message}; fix the file by hand (npc leaves it untouched)"
    )]
    Parse {
        path: PathBuf,
        line: usize,
        column: usize,
        format: &'static str,
        message: String,
    },
    #[error(
        "{path}:{line}:{column}: more items (keys, values, brackets) than the limit of {limit} for a file of this size; an agent config declares servers, not bulk data: check the file"
    )]
    TooManyItems {
        path: PathBuf,
        line: usize,
        column: usize,
        limit: usize,
    },
    #[error("`{path}`: {message}; fix the file by hand (npc leaves it untouched)")]
    Shape { path: PathBuf, message: String },
    #[error("`{path}` changed since it was planned; run the plan again")]
    Stale { path: PathBuf },
    #[error(
        "cannot tell which agent CLI `{path}` configures; expected `.mcp.json`, `.codex/config.toml`, `.gemini/settings.json` or `opencode.json`"
    )]
    UnknownKind { path: PathBuf },
    #[error(
        "MCP servers {names} are already declared in the manifest with different entries; pass `--replace` to take the imported ones, or rename them in the file, then import again\n{diff}"
    )]
    ImportConflict { names: String, diff: String },
    #[error(
        "entries {names} are already in the manifest with different values; pass `--replace` to take the imported ones, or rename the file, then import again\n{diff}"
    )]
    ConfigConflict { names: String, diff: String },
    /// Refused by the guarded file layer (a link out of the repository, a
    /// FIFO, …).
    #[error(transparent)]
    Guard(FsError),
}

impl From<FsError> for NativeError {
    fn from(e: FsError) -> Self {
        match e.reason {
            Reason::TooLarge { limit } => Self::TooLarge {
                path: e.path,
                limit,
            },
            Reason::NotUtf8 => Self::NotUtf8 { path: e.path },
            _ => Self::Guard(e),
        }
    }
}

/// The directory a target's file is confined to: the repository, or for
/// user-level files the home directory.
pub fn target_root<'a>(repo_root: &'a Path, target: &'a Target) -> &'a Path {
    match &target.scope {
        Scope::Project => repo_root,
        Scope::User { home } => home,
    }
}

/// The file a target lives in.
pub fn target_path(repo_root: &Path, target: &Target) -> PathBuf {
    match &target.scope {
        Scope::Project => repo_root.join(match target.kind {
            ProviderKind::ClaudeCode => ".mcp.json",
            ProviderKind::Codex => ".codex/config.toml",
            ProviderKind::GeminiCli => ".gemini/settings.json",
            ProviderKind::Opencode => "opencode.json",
        }),
        Scope::User { home } => home.join(match target.kind {
            ProviderKind::ClaudeCode => ".claude.json",
            ProviderKind::Codex => ".codex/config.toml",
            ProviderKind::GeminiCli => ".gemini/settings.json",
            ProviderKind::Opencode => ".config/opencode/opencode.json",
        }),
    }
}

/// Read a native file the user named (`npc import FILE`): `None` when it
/// does not exist, an error when it cannot be read, is not a regular file,
/// is too large or is not UTF-8.
pub fn read_existing(path: &Path) -> Result<Option<String>, NativeError> {
    Ok(crate::repofs::read_file_existing(
        path,
        MAX_NATIVE_FILE_BYTES,
    )?)
}

/// Read a native file confined to `root` (links inside it followed, links
/// out refused): `None` when it does not exist.
pub fn read_existing_in(root: &Path, path: &Path) -> Result<Option<String>, NativeError> {
    let root = Root::new(root)?;
    Ok(root.read_existing(path, MAX_NATIVE_FILE_BYTES, crate::repofs::Links::Follow)?)
}

/// What a plan of a native file does beside its MCP servers, and what its
/// diff hides.
#[derive(Clone, Copy, Default)]
pub struct Extra<'p> {
    /// More edits of a JSON file, in order (a TOML file takes none).
    pub passes: &'p [Pass<'p>],
    /// The values the diff never shows: the whole manifest's (an exported
    /// manifest may no longer hold a value the file does).
    pub secrets: &'p [String],
}

impl std::fmt::Debug for Extra<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Extra")
            .field("passes", &self.passes.len())
            .field("secrets", &self.secrets.len())
            .finish()
    }
}

/// Plan the change that brings `target`'s file in line with the
/// manifest's MCP servers, then with each of `extra.passes` (see
/// [`Extra`]). Reads the file; writes nothing.
pub fn plan_file(
    repo_root: &Path,
    target: &Target,
    manifest: &Manifest,
    previously_managed: &BTreeSet<String>,
    opts: PlanOptions,
    extra: Extra<'_>,
) -> Result<FileChange, NativeError> {
    let path = target_path(repo_root, target);
    let before = read_existing_in(target_root(repo_root, target), &path)?;
    plan_text(
        path,
        target.kind,
        before,
        manifest,
        previously_managed,
        opts,
        extra,
    )
}

/// [`plan_file`] on text already read: `before` is the file's content, or
/// `None` when it does not exist. The text is parsed once and the diff made
/// once, whatever the passes.
pub fn plan_text(
    path: PathBuf,
    kind: ProviderKind,
    before: Option<String>,
    manifest: &Manifest,
    previously_managed: &BTreeSet<String>,
    opts: PlanOptions,
    extra: Extra<'_>,
) -> Result<FileChange, NativeError> {
    let edited = edit::edit(
        &path,
        kind,
        before.as_deref(),
        manifest,
        previously_managed,
        opts,
        extra.passes,
    )?;
    Ok(FileChange::planned(path, before, edited, extra.secrets))
}

/// Plan a JSON settings file that holds no MCP servers of npc's (Claude
/// Code's `.claude/settings.json`, Codex CLI's hooks file): each of
/// `passes` over it, the text parsed once and the diff (hiding `secrets`)
/// made once.
pub fn plan_settings(
    path: PathBuf,
    kind: ProviderKind,
    before: Option<String>,
    passes: &[Pass<'_>],
    secrets: &[String],
) -> Result<FileChange, NativeError> {
    let mut doc = JsonDoc::parse(&path, kind, before.as_deref())?;
    let (mut notes, mut managed) = (Vec::new(), BTreeSet::new());
    for pass in passes {
        pass(&mut doc, &mut notes, &mut managed)?;
    }
    let after = doc.finish(&mut notes)?;
    let edited = edit::Edited {
        after,
        notes,
        managed,
        conflicts: Vec::new(),
    };
    Ok(FileChange::planned(path, before, edited, secrets))
}

/// [`unified_diff`] with every known secret value replaced on both sides
/// before diffing: the file on disk may hold a value a CLI resolved from
/// the environment (Gemini's `mcp add` writes `${VAR}` resolved), and a
/// plan never prints it.
pub fn redacted_diff<S: AsRef<str>>(
    path: &Path,
    before: Option<&str>,
    after: &str,
    secrets: &[S],
) -> String {
    let clean = |text: &str| crate::bus::redact_str(text, secrets);
    let before_clean = before.map(|b| clean(b).unwrap_or_else(|| b.to_string()));
    let after_clean = clean(after);
    unified_diff(
        path,
        before_clean.as_deref(),
        after_clean.as_deref().unwrap_or(after),
    )
}

/// A unified diff of a file's text, headed with its path.
pub fn unified_diff(path: &Path, before: Option<&str>, after: &str) -> String {
    let shown = path.display().to_string();
    let old = if before.is_some() {
        shown.as_str()
    } else {
        "/dev/null"
    };
    similar::TextDiff::from_lines(before.unwrap_or(""), after)
        .unified_diff()
        .context_radius(DIFF_CONTEXT_LINES)
        .header(old, &shown)
        .to_string()
}

/// Apply a planned change through the guarded layer confined to `root`:
/// the new text goes to a temporary file beside the target, renamed over
/// it (parents created). Does nothing (and returns `false`) when the text
/// would not change. Refuses when the file changed since it was planned.
/// `options` say whether links inside `root` are followed and who may read
/// a new file.
pub fn write(root: &Path, change: &FileChange, options: WriteOptions) -> Result<bool, NativeError> {
    if !change.is_change() {
        return Ok(false);
    }
    let root = Root::new(root)?;
    let path = &change.path;
    if root.read_existing(path, MAX_NATIVE_FILE_BYTES, options.links)? != change.before {
        return Err(NativeError::Stale { path: path.clone() });
    }
    root.write(path, change.after.as_bytes(), options)?;
    Ok(true)
}

/// Remove a planned file (npc's own, found in `change.before`) through the
/// guarded layer confined to `root`: never through a link, only a regular
/// file, and only when it still holds what was planned. Returns `false`
/// when there was nothing to remove.
pub fn remove(root: &Path, change: &FileChange) -> Result<bool, NativeError> {
    let Some(before) = &change.before else {
        return Ok(false);
    };
    let root = Root::new(root)?;
    let now = root.read_existing(
        &change.path,
        MAX_NATIVE_FILE_BYTES,
        crate::repofs::Links::Refuse,
    )?;
    if now.as_ref() != Some(before) {
        return Err(NativeError::Stale {
            path: change.path.clone(),
        });
    }
    root.remove_file(&change.path)?;
    Ok(true)
}

/// Which syntax [`check_items`] counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Syntax {
    Toml,
    /// Comment-free JSON (see [`jsonc::strip`]).
    Json,
}

/// Refuse `text` (read from `path`) when it holds more items than a
/// manifest of its size may ([`crate::model::node::item_limit`]), before
/// any parser builds a tree of it: every reader of an agent file goes
/// through here, so a file of millions of tiny values costs constant memory.
pub(crate) fn check_items(path: &Path, text: &str, syntax: Syntax) -> Result<(), NativeError> {
    let at = match syntax {
        Syntax::Toml => crate::model::node::toml_items_exceeded(text).map(|span| span.start),
        Syntax::Json => jsonc::items_exceeded(text),
    };
    let Some(at) = at else {
        return Ok(());
    };
    let (line, column) = line_col(text, at);
    Err(NativeError::TooManyItems {
        path: path.into(),
        line,
        column,
        limit: crate::model::node::item_limit(text.len()),
    })
}

/// 1-based line and column of byte `offset` in `text`.
pub(crate) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before
        .rsplit('\n')
        .next()
        .map(|l| l.chars().count() + 1)
        .unwrap_or(1);
    (line, column)
}

#[cfg(test)]
mod tests;
