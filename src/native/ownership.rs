//! Which entries of the repository's own agent files npc manages, kept in
//! a file that travels with the repository: `npcagent.lock`
//! ([`LOCK_FILE`], beside the manifest; commit it with the agent files).
//! Whole files npc writes carry their own marker (`managed`), hook entries
//! are known by their command; what an MCP entry or a permission entry is
//! cannot say inside a CLI's file, so npc lists them here as well as in its
//! store. A teammate's fresh clone then plans clean instead of reporting
//! npc's own entries as "an entry npc did not write".
//!
//! The lock is repository input like the manifest: it only ever names
//! entries of files inside the repository (keys are relative paths; the
//! user-level files' entries stay in the store alone), it is read through
//! the guarded layer without following links, bounded in size and count,
//! and a lock that does not parse is a note, never an error that stops a
//! plan. What it can claim is what the repository could write itself: that
//! an entry of the repository's own file is npc's to replace or remove,
//! which the plan shows before anything is written.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::repofs::{Links, Root, WriteOptions};

/// The file, beside the manifest.
pub const LOCK_FILE: &str = "npcagent.lock";
/// Largest lock npc reads.
pub const MAX_LOCK_BYTES: usize = 256 * 1024;
/// Most files a lock may list.
pub const MAX_LOCK_FILES: usize = 256;
/// Most entries a lock may list for one file.
pub const MAX_LOCK_ENTRIES: usize = 4096;
/// The format's version.
pub const LOCK_VERSION: u32 = 1;
/// What the lock says about itself, for whoever opens it.
const LOCK_NOTE: &str =
    "written by npc: the entries of these agent files npc manages; commit it with them";

/// The entries npc manages, per file relative to the repository.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ownership {
    pub version: u32,
    #[serde(default)]
    pub note: String,
    #[serde(default)]
    pub files: BTreeMap<String, BTreeSet<String>>,
}

/// Why the lock was not taken (a note on the plan; npc goes by its store).
#[derive(Debug, thiserror::Error)]
pub enum OwnershipError {
    #[error("`{LOCK_FILE}` cannot be read: {0}")]
    Read(#[from] crate::repofs::FsError),
    #[error(
        "`{LOCK_FILE}` is not npc's lock ({0}); npc goes by its own records and rewrites it on the next apply"
    )]
    Parse(String),
    #[error(
        "`{LOCK_FILE}` has version {0}; this npc reads version {LOCK_VERSION}: upgrade npc, or delete the file and run `npc apply`"
    )]
    Version(u32),
    #[error(
        "`{LOCK_FILE}` lists more than {MAX_LOCK_FILES} files or {MAX_LOCK_ENTRIES} entries of one file; npc ignores it and rewrites it on the next apply"
    )]
    TooLarge,
}

impl Ownership {
    /// The entries of `file` (relative to the repository).
    pub fn entries(&self, file: &str) -> BTreeSet<String> {
        self.files.get(file).cloned().unwrap_or_default()
    }

    /// Record `entries` as npc's in `file` (none: the file leaves the lock).
    pub fn set(&mut self, file: &str, entries: BTreeSet<String>) {
        if entries.is_empty() {
            self.files.remove(file);
        } else {
            self.files.insert(file.to_string(), entries);
        }
    }

    /// The lock's text: stable (sorted) JSON, so a commit shows only what changed.
    pub fn to_text(&self) -> String {
        let shown = Self {
            version: LOCK_VERSION,
            note: LOCK_NOTE.to_string(),
            files: self.files.clone(),
        };
        let mut text = serde_json::to_string_pretty(&shown).unwrap_or_default();
        text.push('\n');
        text
    }

    /// Parse a lock's text, checking its version and bounds.
    pub fn parse(text: &str) -> Result<Self, OwnershipError> {
        let lock: Self =
            serde_json::from_str(text).map_err(|e| OwnershipError::Parse(e.to_string()))?;
        if lock.version != LOCK_VERSION {
            return Err(OwnershipError::Version(lock.version));
        }
        if lock.files.len() > MAX_LOCK_FILES
            || lock.files.values().any(|e| e.len() > MAX_LOCK_ENTRIES)
        {
            return Err(OwnershipError::TooLarge);
        }
        Ok(lock)
    }
}

/// The repository's lock (empty when there is none).
pub fn read(repo: &Path) -> Result<Ownership, OwnershipError> {
    let root = Root::new(repo)?;
    match root.read_existing(&repo.join(LOCK_FILE), MAX_LOCK_BYTES, Links::Refuse)? {
        None => Ok(Ownership::default()),
        Some(text) => Ownership::parse(&text),
    }
}

/// Write the lock when its text changes (removed when it lists nothing).
/// Returns whether the file changed.
pub fn write(repo: &Path, lock: &Ownership) -> Result<bool, OwnershipError> {
    let root = Root::new(repo)?;
    let path = repo.join(LOCK_FILE);
    let before = root.read_existing(&path, MAX_LOCK_BYTES, Links::Refuse)?;
    if lock.files.is_empty() {
        if before.is_none() {
            return Ok(false);
        }
        root.remove_file(&path)?;
        return Ok(true);
    }
    let text = lock.to_text();
    if before.as_deref() == Some(text.as_str()) {
        return Ok(false);
    }
    let options = WriteOptions {
        links: Links::Refuse,
        ..WriteOptions::SHARED
    };
    root.write(&path, text.as_bytes(), options)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_lock_round_trips_sorted_and_leaves_when_empty() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().canonicalize().unwrap();
        let mut lock = read(&repo).unwrap();
        assert_eq!(lock, Ownership::default());
        lock.set(".mcp.json", set(&["zeta", "alpha"]));
        lock.set(".claude/settings.json", set(&["allow:Bash"]));
        assert!(write(&repo, &lock).unwrap());
        assert!(
            !write(&repo, &lock).unwrap(),
            "unchanged text is not rewritten"
        );
        let text = std::fs::read_to_string(repo.join(LOCK_FILE)).unwrap();
        assert!(text.find(".claude").unwrap() < text.find(".mcp").unwrap());
        assert!(text.find("alpha").unwrap() < text.find("zeta").unwrap());
        let again = read(&repo).unwrap();
        assert_eq!(again.entries(".mcp.json"), set(&["alpha", "zeta"]));
        lock.set(".mcp.json", BTreeSet::new());
        lock.set(".claude/settings.json", BTreeSet::new());
        assert!(write(&repo, &lock).unwrap());
        assert!(!repo.join(LOCK_FILE).exists());
    }

    #[test]
    fn a_hostile_lock_is_refused_with_a_reason() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().canonicalize().unwrap();
        let cases = [
            ("not json", "is not npc's lock"),
            (
                r#"{"version": 1, "files": {}, "extra": 1}"#,
                "is not npc's lock",
            ),
            (r#"{"version": 9, "files": {}}"#, "has version 9"),
            (
                r#"{"version": 1, "files": {"a": [1]}}"#,
                "is not npc's lock",
            ),
        ];
        for (text, expect) in cases {
            std::fs::write(repo.join(LOCK_FILE), text).unwrap();
            let e = read(&repo).unwrap_err().to_string();
            assert!(e.contains(expect), "{text}: {e}");
        }
        let many: BTreeMap<String, Vec<String>> = (0..=MAX_LOCK_FILES)
            .map(|i| (format!("f{i}"), vec!["x".to_string()]))
            .collect();
        let text = serde_json::json!({"version": 1, "files": many}).to_string();
        std::fs::write(repo.join(LOCK_FILE), text).unwrap();
        assert!(matches!(read(&repo), Err(OwnershipError::TooLarge)));
        std::fs::write(repo.join(LOCK_FILE), vec![b' '; MAX_LOCK_BYTES + 1]).unwrap();
        assert!(matches!(read(&repo), Err(OwnershipError::Read(_))));
        // A link is never followed, not even inside the repository.
        std::fs::remove_file(repo.join(LOCK_FILE)).unwrap();
        std::fs::write(repo.join("real.lock"), r#"{"version": 1, "files": {}}"#).unwrap();
        std::os::unix::fs::symlink(repo.join("real.lock"), repo.join(LOCK_FILE)).unwrap();
        assert!(matches!(read(&repo), Err(OwnershipError::Read(_))));
        let mut lock = Ownership::default();
        lock.set(".mcp.json", set(&["a"]));
        assert!(
            write(&repo, &lock).is_err(),
            "a link is never written through"
        );
        assert_eq!(
            std::fs::read_to_string(repo.join("real.lock")).unwrap(),
            r#"{"version": 1, "files": {}}"#
        );
    }
}
