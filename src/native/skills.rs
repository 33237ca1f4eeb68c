//! Plugin skills for the agents: `npc apply` (and every daemon reload)
//! copies each enabled plugin's Agent Skills (`skills/<name>/SKILL.md` and
//! the files beside it) into the project skills folder of every declared
//! agent CLI that has one, checked against the installed CLIs:
//! - Claude Code (2.1): `.claude/skills/<name>/`
//! - Codex CLI (0.171): `.agents/skills/<name>/` (the repository's skills)
//! - Gemini CLI (0.61): `.gemini/skills/<name>/` (read in trusted folders only)
//! - OpenCode (1.18): `.opencode/skills/<name>/`
//!
//! Every CLI npc configures has such a folder, so none is left out. npc's
//! copies also leave the folder of a CLI the manifest no longer declares.
//!
//! Copies, never links: a link would point the agent (and whoever clones
//! the repository) at a path outside it for a user-registry plugin, and a
//! copy is what the agent reads even when the package moves. Each copy
//! holds a marker file, [`MARKER_FILE`]; a folder with the marker is npc's
//! (replaced when its source changes, removed when its plugin is disabled
//! or gone), anything else in the skills folder is the user's and never
//! touched — a user folder with a plugin skill's name wins and the skill is
//! skipped with a note. Nothing is followed out of the repository: the
//! skills folder must resolve inside it, an entry that is a link is never
//! npc's, and a link inside a skill's source is not copied. Copies are
//! bounded ([`MAX_SKILL_FILES`], [`MAX_SKILL_BYTES`], [`MAX_SKILL_DEPTH`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;
use sha2::Digest as _;

use crate::model::{Manifest, ProviderKind};
use crate::repofs::{Links, Perms, Root, WriteOptions};

/// The file marking a skill folder as npc's copy (JSON: plugin, source, digest).
pub const MARKER_FILE: &str = ".npc-skill.json";
/// Most files copied per skill.
pub const MAX_SKILL_FILES: usize = 256;
/// Most bytes copied per skill (all files together).
pub const MAX_SKILL_BYTES: usize = 8 * 1024 * 1024;
/// Deepest folder level copied below a skill folder.
pub const MAX_SKILL_DEPTH: usize = 8;
/// Most entries of a skills folder looked at (the bound of every agent folder).
use super::managed::MAX_FOLDER_ENTRIES;
/// Largest marker file read.
const MAX_MARKER_BYTES: usize = 64 * 1024;

/// The project skills folder of `kind`'s CLI, relative to the repository.
pub fn skills_dir(kind: ProviderKind) -> Option<&'static str> {
    Some(match kind {
        ProviderKind::ClaudeCode => ".claude/skills",
        ProviderKind::Codex => ".agents/skills",
        ProviderKind::GeminiCli => ".gemini/skills",
        ProviderKind::Opencode => ".opencode/skills",
    })
}

/// What happens to one skill folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SkillAction {
    Create,
    Update,
    Remove,
    Unchanged,
    /// Left alone (user content, or the skill cannot be copied).
    Skip,
}

impl SkillAction {
    pub fn symbol(self) -> &'static str {
        match self {
            Self::Create => "+",
            Self::Update => "~",
            Self::Remove => "-",
            Self::Unchanged => "=",
            Self::Skip => "!",
        }
    }

    pub fn is_change(self) -> bool {
        matches!(self, Self::Create | Self::Update | Self::Remove)
    }
}

/// One skill folder npc would write or remove.
#[derive(Debug, Clone, Serialize)]
pub struct SkillChange {
    /// Relative to the repository root (`.claude/skills/NAME`).
    pub path: String,
    pub action: SkillAction,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plugin: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The files to write (relative path, bytes) and the marker.
    #[serde(skip)]
    files: SkillFiles,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
struct Marker {
    plugin: String,
    skill: String,
    digest: String,
}

/// A skill's files: (path relative to the skill folder, bytes), sorted.
type SkillFiles = Vec<(PathBuf, Vec<u8>)>;

/// A skill's files read from its package, bounded.
fn read_skill(root: &Path, dir: &Path) -> Result<SkillFiles, String> {
    let pkg = Root::new(root).map_err(|e| e.to_string())?;
    let rel = dir.strip_prefix(root).map_err(|_| {
        format!(
            "`{}` is not inside its package; it is not copied",
            dir.display()
        )
    })?;
    // The folder must resolve inside the package; files are read below it
    // without following any further link.
    let real = pkg.real_path(rel).map_err(|e| e.to_string())?;
    let rel = real
        .strip_prefix(pkg.path())
        .map_err(|_| "it resolves outside its package".to_string())?
        .to_path_buf();
    let mut out = Vec::new();
    let mut total = 0usize;
    let mut stack = vec![(PathBuf::new(), 0usize)];
    while let Some((sub, depth)) = stack.pop() {
        let entries = std::fs::read_dir(real.join(&sub)).map_err(|e| e.to_string())?;
        for entry in entries.take(MAX_FOLDER_ENTRIES) {
            let entry = entry.map_err(|e| e.to_string())?;
            let name = sub.join(entry.file_name());
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() && depth < MAX_SKILL_DEPTH {
                stack.push((name, depth + 1));
            } else if kind.is_file() {
                if out.len() >= MAX_SKILL_FILES {
                    return Err(format!("it has more than {MAX_SKILL_FILES} files"));
                }
                let bytes = pkg
                    .read_with(&rel.join(&name), MAX_SKILL_BYTES - total, Links::Refuse)
                    .map_err(|e| e.to_string())?;
                total += bytes.len();
                out.push((name, bytes));
            }
            // Links, FIFOs, devices and deeper folders are not copied.
        }
    }
    out.sort();
    Ok(out)
}

fn digest(files: &[(PathBuf, Vec<u8>)]) -> String {
    let mut h = sha2::Sha256::new();
    for (path, bytes) in files {
        h.update(path.to_string_lossy().as_bytes());
        h.update([0]);
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    }
    hex::encode(h.finalize())
}

/// npc's marker in `dir` (a real folder, not a link), if it has one.
fn marker_of(repo: &Root, dir: &Path) -> Option<Marker> {
    let st = std::fs::symlink_metadata(repo.path().join(dir)).ok()?;
    if !st.is_dir() {
        return None;
    }
    let text = repo
        .read_existing(&dir.join(MARKER_FILE), MAX_MARKER_BYTES, Links::Refuse)
        .ok()??;
    serde_json::from_str(&text).ok()
}

/// Every skill folder npc would create, update or remove for `manifest`
/// in the repository at `root` (unchanged ones included, for `npc plan`).
pub fn plan(manifest: &Manifest, root: &Path) -> Vec<SkillChange> {
    let kinds: std::collections::BTreeSet<ProviderKind> =
        manifest.providers.values().map(|p| p.kind).collect();
    // The skills to install, by name: the first plugin (discovery order) wins.
    let mut wanted: BTreeMap<String, (String, Result<SkillFiles, String>)> = BTreeMap::new();
    let mut shadowed = Vec::new();
    for (plugin, parts) in manifest.plugin_parts() {
        for skill in &parts.skills {
            if wanted.contains_key(&skill.name) {
                shadowed.push((skill.name.clone(), plugin.to_string()));
                continue;
            }
            wanted.insert(
                skill.name.clone(),
                (plugin.to_string(), read_skill(&parts.root, &skill.dir)),
            );
        }
    }
    let Ok(repo) = Root::new(root) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let none = BTreeMap::new();
    // Every CLI's folder is looked at, so npc's copies also leave the folder
    // of a CLI the manifest no longer declares; skills go to declared ones.
    for kind in ProviderKind::ALL {
        let Some(folder) = skills_dir(kind) else {
            continue;
        };
        let declared = kinds.contains(&kind);
        let wanted = if declared { &wanted } else { &none };
        let folder = Path::new(folder);
        let existing = match repo.real_path(folder) {
            Ok(real) if real.starts_with(repo.path()) => list(&real),
            Ok(_) => Vec::new(),
            Err(e) if e.is_not_found() => Vec::new(),
            Err(_) if !declared => Vec::new(),
            Err(e) => {
                out.push(SkillChange {
                    path: folder.display().to_string(),
                    action: SkillAction::Skip,
                    plugin: None,
                    note: Some(format!("{e}; no skills are installed there")),
                    files: Vec::new(),
                });
                continue;
            }
        };
        for name in &existing {
            let path = folder.join(name);
            if wanted.contains_key(name) {
                continue;
            }
            if let Some(marker) = marker_of(&repo, &path) {
                out.push(SkillChange {
                    path: path.display().to_string(),
                    action: SkillAction::Remove,
                    plugin: Some(marker.plugin),
                    note: None,
                    files: Vec::new(),
                });
            }
        }
        for (name, (plugin, files)) in wanted {
            let path = folder.join(name);
            let shown = path.display().to_string();
            let change = |action, note: Option<String>, files| SkillChange {
                path: shown.clone(),
                action,
                plugin: Some(plugin.clone()),
                note,
                files,
            };
            let files = match files {
                Ok(f) => f,
                Err(e) => {
                    out.push(change(
                        SkillAction::Skip,
                        Some(format!("skill `{name}` cannot be copied: {e}")),
                        Vec::new(),
                    ));
                    continue;
                }
            };
            let d = digest(files);
            let present = existing.contains(name);
            let action = match (present, marker_of(&repo, &path)) {
                (false, _) => SkillAction::Create,
                (true, Some(m)) if m.digest == d && m.plugin == *plugin => SkillAction::Unchanged,
                (true, Some(_)) => SkillAction::Update,
                (true, None) => {
                    out.push(change(
                        SkillAction::Skip,
                        Some(format!(
                            "`{shown}` is not npc's (no `{MARKER_FILE}`); it is left alone and plugin skill `{name}` is not installed there"
                        )),
                        Vec::new(),
                    ));
                    continue;
                }
            };
            let marker = Marker {
                plugin: plugin.clone(),
                skill: name.clone(),
                digest: d,
            };
            let mut files = files.clone();
            files.push((
                PathBuf::from(MARKER_FILE),
                serde_json::to_vec_pretty(&marker).unwrap_or_default(),
            ));
            out.push(change(action, None, files));
        }
    }
    for (name, plugin) in shadowed {
        out.push(SkillChange {
            path: name.clone(),
            action: SkillAction::Skip,
            plugin: Some(plugin),
            note: Some(format!(
                "skill `{name}` is also provided by an earlier plugin, whose copy is kept"
            )),
            files: Vec::new(),
        });
    }
    out
}

/// Names in the folder `real`, bounded.
fn list(real: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(real) else {
        return Vec::new();
    };
    entries
        .take(MAX_FOLDER_ENTRIES)
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect()
}

/// Carry out `changes` in the repository at `root`: one line per change
/// made, `(path, outcome)`.
pub fn apply(root: &Path, changes: &[SkillChange]) -> Vec<(String, Result<&'static str, String>)> {
    let mut out = Vec::new();
    let Ok(repo) = Root::new(root) else {
        return out;
    };
    for c in changes.iter().filter(|c| c.action.is_change()) {
        let result = match c.action {
            SkillAction::Remove => remove(&repo, Path::new(&c.path)).map(|()| "removed"),
            _ => write(&repo, Path::new(&c.path), &c.files).map(|()| "written"),
        };
        out.push((c.path.clone(), result));
    }
    out
}

/// Remove npc's copy at `path`: it must still be a real folder inside the
/// repository with npc's marker.
fn remove(repo: &Root, path: &Path) -> Result<(), String> {
    if marker_of(repo, path).is_none() {
        return Err(format!(
            "`{}` is no longer npc's copy; left alone",
            path.display()
        ));
    }
    let parent = path.parent().unwrap_or(Path::new(""));
    let real_parent = repo.real_path(parent).map_err(|e| e.to_string())?;
    let name = path.file_name().ok_or("no folder name")?;
    // `remove_dir_all` never follows a link inside the folder.
    std::fs::remove_dir_all(real_parent.join(name)).map_err(|e| e.to_string())
}

/// Write `files` as the folder `path`: into a fresh sibling folder first,
/// then swapped in for the old copy.
fn write(repo: &Root, path: &Path, files: &[(PathBuf, Vec<u8>)]) -> Result<(), String> {
    let parent = path.parent().unwrap_or(Path::new(""));
    let name = path
        .file_name()
        .ok_or("no folder name")?
        .to_string_lossy()
        .into_owned();
    let real_parent = repo
        .create_dir_all(parent, Perms::Shared)
        .map_err(|e| e.to_string())?;
    let staging = parent.join(format!(".{name}.npc-{}.staging", std::process::id()));
    let real_staging = real_parent.join(staging.file_name().ok_or("no name")?);
    let _ = std::fs::remove_dir_all(&real_staging);
    for (rel, bytes) in files {
        repo.write(&staging.join(rel), bytes, WriteOptions::SHARED)
            .map_err(|e| e.to_string())?;
    }
    let target = real_parent.join(&name);
    if std::fs::symlink_metadata(&target).is_ok() {
        if marker_of(repo, path).is_none() {
            let _ = std::fs::remove_dir_all(&real_staging);
            return Err(format!(
                "`{}` appeared and is not npc's; left alone",
                path.display()
            ));
        }
        std::fs::remove_dir_all(&target).map_err(|e| e.to_string())?;
    }
    std::fs::rename(&real_staging, &target).map_err(|e| e.to_string())
}
