//! What the pure planner cannot read itself: digests of each enabled
//! plugin's package ([`external_inputs`]), and which paths are npc's own
//! output ([`NpcOutput`]), never a reason to reload and never part of a
//! digest.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::model::{self, Manifest};
use crate::plan::{self, ExternalInputs};

use super::load::is_operational;

/// Digests of files the pure layer cannot read: each enabled plugin's
/// package. A file that cannot be read counts as empty (see
/// [`checked_external_inputs`] for the daemon, which must not plan from that).
pub fn external_inputs(manifest: &Manifest, root: &Path) -> ExternalInputs {
    external_inputs_with(manifest, root, &mut None)
}

/// [`external_inputs`], failing on an operational read error (out of
/// descriptors, say) instead of digesting a package that was not fully read.
pub fn checked_external_inputs(
    manifest: &Manifest,
    root: &Path,
) -> Result<ExternalInputs, std::io::Error> {
    let mut failure = None;
    let inputs = external_inputs_with(manifest, root, &mut failure);
    failure.map_or(Ok(inputs), Err)
}

fn external_inputs_with(
    manifest: &Manifest,
    root: &Path,
    failure: &mut Option<std::io::Error>,
) -> ExternalInputs {
    let skip = npc_output(&manifest.project.state_dir, root);
    let plugin_digests = manifest
        .plugins
        .iter()
        .map(|(name, p)| {
            (
                name.clone(),
                dir_digest(&root.join(&p.path), &skip, failure),
            )
        })
        .collect();
    ExternalInputs { plugin_digests }
}

/// What npc itself writes in a repository, which no digest or watch counts
/// as a change of its inputs (a plugin at `path = "."` would otherwise
/// change with every event npc records): the state directory and the
/// project-level agent config files, whose content follows the manifest.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NpcOutput {
    /// Directories (and everything under them).
    pub dirs: BTreeSet<PathBuf>,
    /// Single files.
    pub files: BTreeSet<PathBuf>,
}

impl NpcOutput {
    /// Whether `path` is something npc writes (or a temporary file beside it).
    pub fn contains(&self, path: &Path) -> bool {
        self.dirs.iter().any(|d| path.starts_with(d))
            || self.files.contains(path)
            || crate::repofs::is_editor_noise(path)
    }
}

/// [`NpcOutput`] of the repository at `root` whose manifest names `state_dir`.
pub fn npc_output(state_dir: &str, root: &Path) -> NpcOutput {
    let files = model::ProviderKind::ALL
        .iter()
        .map(|&kind| {
            crate::native::target_path(
                root,
                &crate::native::Target {
                    kind,
                    scope: crate::native::Scope::Project,
                },
            )
        })
        .collect();
    NpcOutput {
        dirs: BTreeSet::from([root.join(state_dir)]),
        files,
    }
}

/// Files looked at per plugin package when computing its digest.
pub const MAX_PACKAGE_FILES: usize = 10_000;
/// Bytes of one package file read for the digest (a larger file counts as
/// unreadable).
pub const MAX_PACKAGE_FILE_BYTES: usize = 16 * 1024 * 1024;
/// Bytes of all files of one package read for its digest: past this, a
/// file counts by its path and size only. Without it, 10,000 sparse 16 MiB
/// files (no disk space at all) would cost 160 GiB of hashing per reload.
pub const MAX_PACKAGE_BYTES: u64 = 64 * 1024 * 1024;
/// Directory entries looked at per package (the walk stops there), so a
/// package in a huge tree costs a bounded walk.
pub const MAX_PACKAGE_ENTRIES: usize = 100_000;

/// SHA-256 over the relative paths and contents of what the package at
/// `dir` declares (`plugins::DECLARED_FILES`, and every regular file under
/// `plugins::DECLARED_DIRS`: never another file of its folder, such as a
/// log beside it), each file hashed as it is read so size costs no memory,
/// except what npc writes itself (`skip`). The first operational read error
/// goes to `failure`.
fn dir_digest(dir: &Path, skip: &NpcOutput, failure: &mut Option<std::io::Error>) -> String {
    use sha2::Digest as _;
    let mut note = |e: std::io::Error| {
        if is_operational(&e) && failure.is_none() {
            *failure = Some(e);
        }
    };
    let guard = match crate::repofs::Root::new(dir) {
        Ok(guard) => guard,
        Err(e) => {
            note(e.into());
            return String::new();
        }
    };
    let mut files: Vec<PathBuf> = crate::plugins::DECLARED_FILES
        .iter()
        .map(|f| dir.join(f))
        .filter(|f| !skip.contains(f) && f.symlink_metadata().is_ok_and(|m| m.is_file()))
        .collect();
    let mut stack: Vec<PathBuf> = crate::plugins::DECLARED_DIRS
        .iter()
        .map(|d| dir.join(d))
        .filter(|d| d.symlink_metadata().is_ok_and(|m| m.is_dir()))
        .collect();
    let mut entries_seen = 0usize;
    while let Some(d) = stack.pop() {
        if entries_seen >= MAX_PACKAGE_ENTRIES {
            break;
        }
        let entries = match std::fs::read_dir(&d) {
            Ok(entries) => entries,
            Err(e) => {
                note(e);
                continue;
            }
        };
        for e in entries.take(MAX_PACKAGE_ENTRIES - entries_seen) {
            entries_seen += 1;
            let e = match e {
                Ok(e) => e,
                Err(e) => {
                    note(e);
                    continue;
                }
            };
            let p = e.path();
            if skip.contains(&p) {
                continue;
            }
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(p),
                Ok(t) if t.is_file() && files.len() < MAX_PACKAGE_FILES => files.push(p),
                _ => {}
            }
        }
    }
    files.sort();
    let mut bytes_left = MAX_PACKAGE_BYTES;
    let contents: Vec<(String, String)> = files
        .iter()
        .map(|f| {
            let mut hasher = sha2::Sha256::new();
            // Through the guarded layer: a regular file, never a link, opened
            // without blocking (a FIFO swapped in is refused).
            let rel = f.strip_prefix(dir).unwrap_or(f);
            if let Err(e) = guard
                .open_existing(rel)
                .map_err(std::io::Error::from)
                .and_then(|r| {
                    let len = r.metadata()?.len();
                    let budget = (MAX_PACKAGE_FILE_BYTES as u64).min(bytes_left);
                    let read = std::io::copy(&mut std::io::Read::take(r, budget), &mut hasher)?;
                    bytes_left -= read;
                    if read < len && budget < MAX_PACKAGE_FILE_BYTES as u64 {
                        // Cut short by the package budget: the size stands
                        // for the rest.
                        hasher.update(len.to_le_bytes());
                    }
                    Ok(())
                })
            {
                note(e);
            }
            (rel.display().to_string(), hex::encode(hasher.finalize()))
        })
        .collect();
    plan::fingerprint::fingerprint(&contents)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npc_output_covers_the_state_dir_agent_files_and_temp_files() {
        let root = Path::new("/repo");
        let own = npc_output(model::DEFAULT_STATE_DIR, root);
        assert!(own.contains(Path::new("/repo/.npc/state.db-wal")));
        assert!(own.contains(Path::new("/repo/./.npc/logs/x.log")));
        assert!(own.contains(Path::new("/repo/.mcp.json")));
        assert!(own.contains(Path::new("/repo/.codex/.config.toml.npc-1-2.tmp")));
        assert!(!own.contains(Path::new("/repo/plugin.json")));
        assert!(!own.contains(Path::new("/repo/npcagent.toml")));
    }

    #[test]
    fn a_plugin_digest_covers_what_the_package_declares_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("plugin.json"), "{}").unwrap();
        let own = npc_output(model::DEFAULT_STATE_DIR, root);
        let digest = || dir_digest(root, &own, &mut None);
        let before = digest();
        // A log (`npc daemon >> daemon.log` in a package at `path = "."`),
        // a server's script, a README: not the package's declaration.
        std::fs::write(root.join("daemon.log"), "a line").unwrap();
        std::fs::write(root.join("server.py"), "print()").unwrap();
        assert_eq!(digest(), before);
        for declared in ["mcp.json", "dev.npcagent/hooks.json", "skills/a/SKILL.md"] {
            let path = root.join(declared);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            let was = digest();
            std::fs::write(&path, "x").unwrap();
            assert_ne!(digest(), was, "{declared}");
        }
    }

    #[test]
    fn a_plugin_digest_ignores_what_npc_writes() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("plugin.json"), "{}").unwrap();
        let own = npc_output(model::DEFAULT_STATE_DIR, root);
        let before = dir_digest(root, &own, &mut None);
        std::fs::create_dir_all(root.join(".npc")).unwrap();
        std::fs::write(root.join(".npc/state.db"), "x").unwrap();
        std::fs::write(root.join(".mcp.json"), "{}").unwrap();
        assert_eq!(dir_digest(root, &own, &mut None), before);
        std::fs::write(root.join("plugin.json"), "{\"v\": 2}").unwrap();
        assert_ne!(dir_digest(root, &own, &mut None), before);
    }
}
