//! The files npc writes for the agents: each declared provider's native MCP
//! configuration (see `native`) and every rendered profile (see `render`).
//! `npc plan` shows their diffs, `npc apply` and every daemon reload write
//! them atomically, and the store remembers which native entries npc manages.
//! In gateway mode (`[mcp] gateway = true`) each native file gets ONE entry,
//! [`GATEWAY_ENTRY`], running `npc mcp serve` for the repository, instead of
//! one entry per server ([`exported`]).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::RepoPaths;
use crate::model::{Manifest, ProviderKind};
use crate::native::{self, FileChange, JsonDoc, PlanOptions, Scope, Target};
use crate::render::{self, RenderContext};
use crate::repofs::{Links, WriteOptions};
use crate::store::Store;

/// One file npc would write, and what would change in it.
#[derive(Debug, Clone, Serialize)]
pub struct FilePlan {
    /// Relative to the repository root.
    pub path: String,
    /// What the file is for.
    pub what: String,
    /// `create`, `update`, `remove`, `unchanged`, `skip` (left alone, with
    /// a note saying why) or `error`.
    pub action: &'static str,
    pub diff: String,
    pub notes: Vec<String>,
    /// Entries npc leaves alone because a manifest server has their name
    /// but npc did not write them (`--force-agent-files` replaces them).
    pub conflicts: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip)]
    change: Option<FileChange>,
    /// A native config file whose managed entry names the store keeps.
    #[serde(skip)]
    native: bool,
    /// The directory the file is confined to (the repository, or the home
    /// directory for user-level files).
    #[serde(skip)]
    root: PathBuf,
    /// npc's own file, removed (its manifest entry is gone).
    #[serde(skip)]
    remove: bool,
}

impl FilePlan {
    pub fn is_change(&self) -> bool {
        matches!(self.action, "create" | "update" | "remove")
    }

    /// The file's absolute path and the content npc would write there.
    pub fn content(&self) -> Option<(&Path, &str)> {
        self.change
            .as_ref()
            .map(|c| (c.path.as_path(), c.after.as_str()))
    }

    fn from_change(root: &Path, what: String, change: FileChange) -> Self {
        let action = match (&change.before, change.is_change()) {
            (_, false) => "unchanged",
            (None, true) => "create",
            (Some(_), true) => "update",
        };
        let notes = change.notes.clone();
        Self {
            path: rel(root, &change.path),
            what,
            action,
            diff: change.diff.clone(),
            notes,
            conflicts: change.conflicts.clone(),
            error: None,
            change: Some(change),
            native: false,
            root: root.to_path_buf(),
            remove: false,
        }
    }

    /// A file of `native::managed`'s plan (rules, commands, agents).
    fn from_planned(root: &Path, planned: native::managed::Planned, secrets: &[String]) -> Self {
        let path = root.join(&planned.path);
        if let Some(error) = planned.error {
            return Self::failed(rel(root, &path), planned.what, error);
        }
        let remove = planned.after.is_none() && planned.before.is_some();
        let after = planned.after.unwrap_or_default();
        let diff = if planned.before.as_deref() == Some(after.as_str()) {
            String::new()
        } else {
            native::redacted_diff(&path, planned.before.as_deref(), &after, secrets)
        };
        let change = FileChange {
            path,
            before: planned.before,
            after,
            diff,
            notes: planned.notes,
            managed: BTreeSet::new(),
            conflicts: Vec::new(),
        };
        let mut plan = Self {
            native: true,
            ..Self::from_change(root, planned.what, change)
        };
        if remove {
            plan.action = "remove";
            plan.remove = true;
        } else if plan.action == "unchanged" && !plan.notes.is_empty() {
            // Left alone (a user's file of npc's name): shown with its note.
            plan.action = "skip";
        }
        plan
    }

    fn failed(path: String, what: String, error: String) -> Self {
        Self {
            path,
            what,
            action: "error",
            diff: String::new(),
            notes: Vec::new(),
            conflicts: Vec::new(),
            error: Some(error),
            change: None,
            native: false,
            root: PathBuf::new(),
            remove: false,
        }
    }

    /// A file npc leaves as it is, with a note saying why (shown by the
    /// plan; nothing is written).
    fn left_alone(path: String, what: String, note: String) -> Self {
        Self {
            action: "skip",
            error: None,
            notes: vec![note],
            ..Self::failed(path, what, String::new())
        }
    }
}

fn rel(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .display()
        .to_string()
}

/// The provider kinds the manifest declares, each once.
fn declared_kinds(manifest: &Manifest) -> BTreeSet<ProviderKind> {
    manifest.providers.values().map(|p| p.kind).collect()
}

pub use crate::native::gateway::{DEFAULT_MANIFEST_NAME, GATEWAY_ENTRY, gateway_tools};

/// The manifest as `kind`'s agent file sees it ([`native::gateway::exported`]),
/// `npc mcp serve` given the manifest's name when it is not the default.
pub fn exported(manifest: &Manifest, paths: &RepoPaths) -> Manifest {
    let name = paths.manifest.file_name().and_then(|n| n.to_str());
    native::gateway::exported(manifest, name)
}

/// Plan every file. `store` (read-only is fine) supplies the managed sets;
/// `scope` picks the project files (the default) or the user-level ones.
pub fn plan_files(
    manifest: &Manifest,
    paths: &RepoPaths,
    store: Option<&Store>,
    scope: &Scope,
) -> Vec<FilePlan> {
    plan_files_with(manifest, paths, store, scope, PlanOptions::default())
}

/// [`plan_files`] with options: `opts.force` replaces entries npc did not
/// write (`--force-agent-files`).
pub fn plan_files_with(
    manifest: &Manifest,
    paths: &RepoPaths,
    store: Option<&Store>,
    scope: &Scope,
    opts: PlanOptions,
) -> Vec<FilePlan> {
    let mut out = Vec::new();
    // Which entries are npc's: its store, and for the repository's own
    // files the lock that travels with the repository (a fresh clone).
    let project = *scope == Scope::Project;
    let (lock, lock_note) = if project {
        match native::ownership::read(&paths.root) {
            Ok(lock) => (lock, None),
            Err(e) => (native::ownership::Ownership::default(), Some(e.to_string())),
        }
    } else {
        (native::ownership::Ownership::default(), None)
    };
    let managed_of = |key: &str| -> BTreeSet<String> {
        let mut entries = store
            .and_then(|s| s.managed_entries(key).ok())
            .unwrap_or_default();
        entries.extend(lock.entries(key));
        entries
    };
    let exported = exported(manifest, paths);
    let secrets = manifest.secret_values();
    let name = manifest_name(paths);
    for kind in declared_kinds(manifest) {
        let target = Target {
            kind,
            scope: scope.clone(),
        };
        let path = native::target_path(&paths.root, &target);
        let key = rel(&paths.root, &path);
        // The store keeps MCP entry names and (with a `:`) npc's
        // permission entries of the same file.
        let (permission_entries, managed): (BTreeSet<String>, BTreeSet<String>) = managed_of(&key)
            .into_iter()
            .partition(|name| name.contains(':'));
        let what = match kind {
            ProviderKind::GeminiCli if project => {
                format!("{} MCP servers, hooks and permissions", kind.as_str())
            }
            ProviderKind::Opencode if project => {
                format!("{} MCP servers and permissions", kind.as_str())
            }
            _ => format!("{} MCP servers", kind.as_str()),
        };
        // The hook bridge and the permissions live in the same file: one
        // change for all, the file parsed once.
        let hooks = |doc: &mut JsonDoc<'_>, notes: &mut Vec<String>, _: &mut BTreeSet<String>| {
            native::hooks::edit_doc(doc, manifest, &name, notes)
        };
        let allowed =
            |doc: &mut JsonDoc<'_>, _: &mut Vec<String>, managed: &mut BTreeSet<String>| {
                permission_edit(kind)(doc, &permission_entries, managed)
            };
        let passes: &[native::Pass<'_>] = match kind {
            ProviderKind::GeminiCli if project => &[&hooks, &allowed],
            ProviderKind::Opencode if project => &[&allowed],
            _ => &[],
        };
        let planned = native::plan_file(
            &paths.root,
            &target,
            &exported,
            &managed,
            opts,
            native::Extra {
                passes,
                secrets: &secrets,
            },
        );
        match planned {
            Ok(change) => out.push(FilePlan {
                native: true,
                root: native::target_root(&paths.root, &target).to_path_buf(),
                ..FilePlan::from_change(&paths.root, what, change)
            }),
            Err(e) => out.push(FilePlan::failed(key, what, e.to_string())),
        }
        if project && matches!(kind, ProviderKind::ClaudeCode | ProviderKind::Codex) {
            out.extend(plan_hooks_file(kind, manifest, paths, &managed_of));
        }
        if project && kind == ProviderKind::Opencode {
            out.extend(plan_opencode_plugin(manifest, paths));
        }
    }
    if let Some(note) = lock_note {
        out.push(FilePlan::left_alone(
            native::ownership::LOCK_FILE.to_string(),
            "the agent-file entries npc manages".to_string(),
            note,
        ));
    }
    let ctx = RenderContext::new(&paths.root, manifest);
    crate::model::template::with_fuel_pool(crate::model::template::BATCH_FUEL, || {
        plan_profiles(manifest, paths, &ctx, &mut out);
        if *scope == Scope::Project {
            plan_agent_config(manifest, paths, &ctx, &mut out);
        }
    });
    out
}

/// The rules files' blocks, the slash commands and the subagents (see
/// `native::rules`, `native::commands`, `native::agents`): only the
/// files that change (or cannot be planned) are listed.
fn plan_agent_config(
    manifest: &Manifest,
    paths: &RepoPaths,
    ctx: &RenderContext,
    out: &mut Vec<FilePlan>,
) {
    let secrets = manifest.secret_values();
    let kinds = declared_kinds(manifest);
    let rendered = render::instructions(manifest, ctx);
    // `CLAUDE.md` is often a link to `AGENTS.md`: one file, planned once
    // for all the CLIs that read it.
    let repo = crate::repofs::Root::new(&paths.root).ok();
    let mut files: Vec<(Option<PathBuf>, &str, Vec<&str>)> = Vec::new();
    for file in native::rules::RULES_FILES {
        let readers: Vec<&str> = kinds
            .iter()
            .filter(|k| native::rules::rules_file(**k) == file)
            .map(|k| k.as_str())
            .collect();
        let real = repo
            .as_ref()
            .and_then(|r| r.real_path(Path::new(file)).ok());
        match files.iter_mut().find(|(r, _, _)| r.is_some() && *r == real) {
            Some((_, _, earlier)) => earlier.extend(readers),
            None => files.push((real, file, readers)),
        }
    }
    for (_, file, readers) in files {
        let path = paths.root.join(file);
        let what = if readers.is_empty() {
            "agent instructions".to_string()
        } else {
            format!("agent instructions ({})", readers.join(", "))
        };
        let body = match (&rendered, readers.is_empty()) {
            (_, true) | (Ok(None), _) => None,
            (Ok(Some(body)), false) => Some(body.as_str()),
            (Err(e), false) => {
                out.push(FilePlan::failed(file.to_string(), what, e.to_string()));
                continue;
            }
        };
        let mut notes = Vec::new();
        if body.is_some() && readers.contains(&ProviderKind::GeminiCli.as_str()) {
            let settings =
                native::target_path(&paths.root, &Target::project(ProviderKind::GeminiCli));
            if let Ok(Some(text)) = native::read_existing_in(&paths.root, &settings) {
                notes.extend(native::rules::gemini_context_note(&settings, &text));
            }
        }
        let planned = match native::read_existing_in(&paths.root, &path) {
            Ok(before) => match native::rules::edit(before.as_deref(), body) {
                Ok(after) => native::managed::Planned {
                    path: file.into(),
                    what,
                    before,
                    after,
                    notes,
                    error: None,
                },
                Err(e) => native::managed::Planned {
                    path: file.into(),
                    what,
                    before,
                    after: None,
                    notes: Vec::new(),
                    error: Some(format!("`{file}`: {e}")),
                },
            },
            // Nothing to write: a file npc cannot read (a link out of the
            // repository) is left alone without a word.
            Err(_) if body.is_none() => continue,
            Err(e) => native::managed::Planned::failed(file.into(), what, e.to_string()),
        };
        if planned.is_change() || planned.error.is_some() || !planned.notes.is_empty() {
            out.push(FilePlan::from_planned(&paths.root, planned, &secrets));
        }
    }
    for (planned, notes) in [
        native::commands::plan(manifest, &paths.root, ctx),
        native::agents::plan(manifest, &paths.root, ctx),
    ] {
        let first = out.len();
        out.extend(
            planned
                .into_iter()
                .map(|p| FilePlan::from_planned(&paths.root, p, &secrets)),
        );
        if let Some(plan) = out.get_mut(first) {
            plan.notes.extend(notes);
        }
    }
}

/// The manifest's file name, as the hook bridge commands name it.
fn manifest_name(paths: &RepoPaths) -> String {
    paths
        .manifest
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(DEFAULT_MANIFEST_NAME)
        .to_string()
}

/// npc's permission entries of `kind`'s settings file (see
/// [`native::permissions`]).
fn permission_edit(kind: ProviderKind) -> native::permissions::PermissionEdit {
    match kind {
        ProviderKind::GeminiCli => native::permissions::gemini_edit,
        ProviderKind::Opencode => native::permissions::opencode_edit,
        _ => native::permissions::claude_edit,
    }
}

/// Claude Code's project settings (Codex CLI's hooks file) with the hook
/// bridge entries; `None` when the file does not exist and no entry is due.
fn plan_hooks_file(
    kind: ProviderKind,
    manifest: &Manifest,
    paths: &RepoPaths,
    managed_of: &dyn Fn(&str) -> BTreeSet<String>,
) -> Option<FilePlan> {
    let file = match kind {
        ProviderKind::Codex => native::hooks::CODEX_HOOKS,
        _ => native::hooks::CLAUDE_SETTINGS,
    };
    let path = paths.root.join(file);
    let what = match kind {
        ProviderKind::ClaudeCode => format!("{} hooks and permissions", kind.as_str()),
        _ => format!("{} hooks", kind.as_str()),
    };
    let name = manifest_name(paths);
    let permissions = managed_of(file);
    let hooks = |doc: &mut JsonDoc<'_>, notes: &mut Vec<String>, _: &mut BTreeSet<String>| {
        native::hooks::edit_doc(doc, manifest, &name, notes)
    };
    let allowed = |doc: &mut JsonDoc<'_>, _: &mut Vec<String>, managed: &mut BTreeSet<String>| {
        permission_edit(kind)(doc, &permissions, managed)
    };
    let passes: &[native::Pass<'_>] = match kind {
        ProviderKind::ClaudeCode => &[&hooks, &allowed],
        _ => &[&hooks],
    };
    let planned = native::read_existing_in(&paths.root, &path).and_then(|before| {
        native::plan_settings(
            path.clone(),
            kind,
            before,
            passes,
            &manifest.secret_values(),
        )
    });
    Some(match planned {
        Ok(change) if change.before.is_none() && change.after.is_empty() => return None,
        Ok(change) => FilePlan {
            native: true,
            root: paths.root.clone(),
            ..FilePlan::from_change(&paths.root, what, change)
        },
        Err(e) => FilePlan::failed(rel(&paths.root, &path), what, e.to_string()),
    })
}

/// OpenCode's managed hook plugin (see [`native::hooks::opencode_plugin`]);
/// `None` when it does not exist and no tool hook is declared.
fn plan_opencode_plugin(manifest: &Manifest, paths: &RepoPaths) -> Option<FilePlan> {
    let path = paths.root.join(native::hooks::OPENCODE_PLUGIN);
    let what = format!("{} hooks", ProviderKind::Opencode.as_str());
    Some(match native::read_existing_in(&paths.root, &path) {
        Ok(before) => {
            let (after, notes) =
                native::hooks::opencode_plugin(before.as_deref(), manifest, &manifest_name(paths));
            if before.is_none() && after.is_empty() {
                return None;
            }
            let diff = if before.as_deref() == Some(after.as_str()) {
                String::new()
            } else {
                native::redacted_diff(&path, before.as_deref(), &after, &manifest.secret_values())
            };
            let change = FileChange {
                path: path.clone(),
                before,
                after,
                diff,
                notes,
                managed: BTreeSet::new(),
                conflicts: Vec::new(),
            };
            FilePlan {
                native: true,
                root: paths.root.clone(),
                ..FilePlan::from_change(&paths.root, what, change)
            }
        }
        Err(e) => FilePlan::failed(rel(&paths.root, &path), what, e.to_string()),
    })
}

/// Plan every rendered profile (all drawing on one render budget).
fn plan_profiles(
    manifest: &Manifest,
    paths: &RepoPaths,
    ctx: &RenderContext,
    out: &mut Vec<FilePlan>,
) {
    let secrets = manifest.secret_values();
    for name in manifest.profiles.keys() {
        let path = render::profile_path(&paths.state_dir, name);
        let what = format!("profile `{name}`");
        let rendered = render::profile(manifest, name, ctx);
        // npc's own file: never read through a link.
        let before = crate::repofs::Root::new(&paths.root)
            .and_then(|root| {
                root.read_existing(&path, native::MAX_NATIVE_FILE_BYTES, Links::Refuse)
            })
            .map_err(native::NativeError::from);
        match (rendered, before) {
            (Ok(after), Ok(before)) => {
                let diff = if before.as_deref() == Some(after.as_str()) {
                    String::new()
                } else {
                    native::redacted_diff(&path, before.as_deref(), &after, &secrets)
                };
                let change = FileChange {
                    path: path.clone(),
                    before,
                    after,
                    diff,
                    notes: Vec::new(),
                    managed: BTreeSet::new(),
                    conflicts: Vec::new(),
                };
                out.push(FilePlan::from_change(&paths.root, what, change));
            }
            (Err(e), _) => out.push(FilePlan::failed(
                rel(&paths.root, &path),
                what,
                e.to_string(),
            )),
            (_, Err(e)) => out.push(FilePlan::failed(
                rel(&paths.root, &path),
                what,
                e.to_string(),
            )),
        }
    }
}

/// Write the files that change and record the managed sets. Returns one
/// line per file: `(path, outcome)`; an `Err` outcome means nothing was
/// written to that file.
pub async fn write_files(
    plans: &[FilePlan],
    store: &Store,
    repo: &Path,
) -> Vec<(String, Result<&'static str, String>)> {
    let mut out = Vec::new();
    // The lock of the repository's own files: what npc manages, for a clone.
    let mut lock = native::ownership::read(repo).unwrap_or_default();
    let locked = lock.clone();
    for plan in plans {
        let Some(change) = &plan.change else {
            if plan.error.is_none() {
                // Left alone: nothing to write.
                continue;
            }
            out.push((
                plan.path.clone(),
                Err(plan.error.clone().unwrap_or_default()),
            ));
            continue;
        };
        let options = if plan.native {
            WriteOptions::SHARED
        } else {
            WriteOptions::PRIVATE
        };
        let written = if plan.remove {
            native::remove(&plan.root, change).map_err(|e| e.to_string())
        } else if plan.is_change() {
            native::write(&plan.root, change, options).map_err(|e| e.to_string())
        } else {
            Ok(false)
        };
        if written.is_ok() && plan.native {
            let _ = store
                .set_managed_entries(plan.path.clone(), change.managed.clone())
                .await;
            if plan.root == repo {
                lock.set(&plan.path, change.managed.clone());
            }
        }
        out.push((
            plan.path.clone(),
            written.map(|w| match (w, plan.remove) {
                (true, true) => "removed",
                (true, false) => "written",
                (false, _) => "unchanged",
            }),
        ));
    }
    if lock != locked {
        let written = native::ownership::write(repo, &lock)
            .map(|changed| if changed { "written" } else { "unchanged" })
            .map_err(|e| e.to_string());
        out.push((native::ownership::LOCK_FILE.to_string(), written));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{McpTransport, Text};

    use std::collections::BTreeMap;

    fn manifest(text: &str) -> Manifest {
        struct NoFiles;
        impl crate::model::Files for NoFiles {
            fn read_to_string(&self, _: &Path) -> std::io::Result<String> {
                Err(std::io::ErrorKind::NotFound.into())
            }
            fn is_dir(&self, _: &Path) -> bool {
                false
            }
        }
        let env = std::collections::BTreeMap::<String, String>::new();
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

    const BASE: &str = "version = 1\n[mcp]\ngateway = true\n[mcp.servers.fs]\ncommand = \"x\"\n[mcp.servers.web]\nurl = \"https://example.com/mcp\"\ntool_timeout_ms = 90000\n[providers.codex]\nkind = \"codex\"\n[providers.claude]\nkind = \"claude_code\"\n";

    fn paths() -> RepoPaths {
        RepoPaths {
            root: PathBuf::from("/repo"),
            manifest: PathBuf::from("/repo/npcagent.toml"),
            state_dir: PathBuf::from("/repo/.npc"),
        }
    }

    #[test]
    fn a_settings_file_with_servers_hooks_and_permissions_is_parsed_once_per_plan() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let paths = RepoPaths {
            manifest: root.join("npcagent.toml"),
            state_dir: root.join(".npc"),
            root: root.clone(),
        };
        std::fs::create_dir_all(root.join(".gemini")).unwrap();
        // The user's file, with a comment and an entry of npc's of an
        // earlier version (the lock names it).
        std::fs::write(
            root.join(".gemini/settings.json"),
            "{\n  // mine\n  \"tools\": {\"exclude\": [\"web_fetch\", \"mine\"]}\n}\n",
        )
        .unwrap();
        let mut lock = native::ownership::Ownership::default();
        lock.set(
            ".gemini/settings.json",
            ["tools.exclude:web_fetch".to_string()].into(),
        );
        native::ownership::write(&root, &lock).unwrap();
        let m = manifest(&format!(
            "{BASE}[providers.gemini]\nkind = \"gemini_cli\"\n[[hooks.before_tool]]\ncommand = \"true\"\n"
        ));
        crate::native::edit::PARSED.with(|p| p.borrow_mut().clear());
        let plans = plan_files(&m, &paths, None, &Scope::Project);
        let parsed = crate::native::edit::PARSED.with(|p| p.borrow().clone());
        let settings = root.join(".gemini/settings.json");
        assert_eq!(
            parsed.iter().filter(|p| **p == settings).count(),
            1,
            "{parsed:?}"
        );
        let plan = plans
            .iter()
            .find(|p| p.path == ".gemini/settings.json")
            .unwrap_or_else(|| panic!("{plans:#?}"));
        let diff = &plan.diff;
        let added: Vec<&str> = diff.lines().filter(|l| l.starts_with('+')).collect();
        // All three passes in one change: the gateway, the hook bridge, the
        // earlier entry gone and the user's kept, the comment in place.
        assert!(diff.contains(" // mine"), "{diff}");
        assert!(added.iter().any(|l| l.contains(GATEWAY_ENTRY)), "{diff}");
        assert!(added.iter().any(|l| l.contains("BeforeTool")), "{diff}");
        assert!(added.iter().any(|l| l.contains("\"mine\"")), "{diff}");
        assert!(!added.iter().any(|l| l.contains("web_fetch")), "{diff}");
    }

    #[test]
    fn gateway_mode_exports_one_npc_server() {
        let m = manifest(BASE);
        let out = exported(&m, &paths());
        assert_eq!(out.mcp_servers.keys().collect::<Vec<_>>(), [GATEWAY_ENTRY]);
        let gateway = &out.mcp_servers[GATEWAY_ENTRY];
        let McpTransport::Stdio(command) = &gateway.transport else {
            panic!("{gateway:?}")
        };
        assert_eq!(command.command, "npc");
        let args: Vec<&str> = command.args.iter().map(Text::expose).collect();
        assert_eq!(args, ["mcp", "serve"]);
        assert_eq!(gateway.tool_timeout_ms, 90_000);
        assert_eq!(gateway.enabled_tools, None);
        let mut other = paths();
        other.manifest = PathBuf::from("/repo/npcagent.json");
        let McpTransport::Stdio(command) =
            &exported(&m, &other).mcp_servers[GATEWAY_ENTRY].transport
        else {
            panic!()
        };
        let args: Vec<&str> = command.args.iter().map(Text::expose).collect();
        assert_eq!(args, ["mcp", "serve", "--manifest", "npcagent.json"]);
        let plain = manifest(&BASE.replace("gateway = true", "gateway = false"));
        assert_eq!(exported(&plain, &paths()), plain);
    }

    #[test]
    fn a_second_profile_of_a_cli_renders_no_repository_file_of_the_firsts_differently() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let paths = RepoPaths {
            manifest: root.join("npcagent.toml"),
            state_dir: root.join(".npc"),
            root,
        };
        let kinds = "[providers.gemini]\nkind = \"gemini_cli\"\n[providers.opencode]\nkind = \"opencode\"\n";
        let mut one = format!("{BASE}{kinds}");
        for provider in ["codex", "claude", "gemini", "opencode"] {
            one.push_str(&format!(
                "[profiles.first_{provider}]\nprovider = \"{provider}\"\ndescription = \"a\"\nmcp_servers = [\"fs\"]\nallowed_tools = [\"Bash\", \"mcp__fs__read\"]\ndenied_tools = [\"WebFetch\"]\n"
            ));
        }
        let mut two = one.clone();
        for provider in ["codex", "claude", "gemini", "opencode"] {
            two.push_str(&format!(
                "[profiles.second_{provider}]\nprovider = \"{provider}\"\ndescription = \"b\"\nmcp_servers = [\"fs\"]\nallowed_tools = [\"Read\", \"mcp__fs__write\"]\ndenied_tools = [\"Bash\"]\n"
            ));
        }
        let rendered = |text: &str| -> BTreeMap<String, String> {
            plan_files(&manifest(text), &paths, None, &Scope::Project)
                .into_iter()
                .filter(|f| !f.path.contains("second_"))
                .map(|f| {
                    assert!(f.error.is_none(), "{}: {:?}", f.path, f.error);
                    let after = f.change.map(|c| c.after).unwrap_or_default();
                    (f.path, after)
                })
                .collect()
        };
        let (first, both) = (rendered(&one), rendered(&two));
        // (A profile's `ask_tools` would add the hook bridge, which asks per
        // run, `NPC_PROFILE`, the same for every profile.)
        let differing: Vec<&String> = first
            .keys()
            .chain(both.keys())
            .filter(|k| first.get(*k) != both.get(*k))
            .collect();
        assert!(differing.is_empty(), "{differing:?}");
        // Only a profile's own agent file carries its patterns.
        for (path, text) in both
            .iter()
            .filter(|(p, _)| !p.contains("agents/") && !p.starts_with(".npc/profiles/"))
        {
            assert!(
                !text.contains("WebFetch")
                    && !text.contains("web_fetch")
                    && !text.contains("webfetch"),
                "{path} carries a profile's pattern: {text}"
            );
        }
    }

    #[test]
    fn a_runs_profile_exact_mcp_tools_become_its_entrys_tools() {
        let exact = format!(
            "{BASE}[profiles.a]\nprovider = \"codex\"\ndescription = \"a\"\nallowed_tools = [\"mcp__fs__read_file\", \"Bash(ls)\"]\n[profiles.b]\nprovider = \"codex\"\ndescription = \"b\"\nallowed_tools = [\"mcp__web__search\"]\n"
        );
        let m = manifest(&exact);
        let tools = |m: &Manifest, name: &str| gateway_tools(m, &m.profiles[name]);
        // Each profile its own: another profile's tools never widen it.
        assert_eq!(tools(&m, "a"), Some(vec!["fs__read_file".to_string()]));
        assert_eq!(tools(&m, "b"), Some(vec!["web__search".to_string()]));
        let wild = exact.replace("mcp__web__search", "mcp__web__*");
        assert_eq!(tools(&manifest(&wild), "b"), None);
        let unnamed = exact.replace("[\"mcp__web__search\"]", "[\"Bash(ls)\"]");
        assert_eq!(tools(&manifest(&unnamed), "b"), None);
        // Names known at run time, or a search's two tools: no filter.
        for setting in ["prefix = \"on_conflict\"", "tools = \"search\""] {
            let m =
                manifest(&exact.replace("gateway = true", &format!("gateway = true\n{setting}")));
            assert_eq!(tools(&m, "a"), None, "{setting}");
        }
        // The repository's entry carries no profile's tools.
        let repo = exported(&m, &paths());
        assert_eq!(repo.mcp_servers[GATEWAY_ENTRY].enabled_tools, None);
    }
}
