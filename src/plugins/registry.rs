//! The user-level plugin registry: `$XDG_DATA_HOME/npc/plugins.json` (else
//! `~/.local/share/npc/plugins.json`), owner-only, written atomically.
//! `install` records a package's canonical path, disabled; the same name
//! with the same path again is idempotent, with another path it is
//! rejected; `enable` revalidates first; `uninstall` removes only the
//! registration (source and `PLUGIN_DATA` stay).
//!
//! Discovery order, used wherever plugins are gathered: the repository's
//! manifest (`[plugins.*]`) first, then the user registry, then npc's
//! built-ins (none are packages today). The first registration of a
//! `(kind, id)` wins; a later one is reported as a collision
//! (`registry.plugin_collision`, `policy = "keep_first"`) and dropped.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::repofs::{Links, Root, WriteOptions};

/// The registry file, under the user's data directory.
pub const REGISTRY_FILE: &str = "npc/plugins.json";
/// Largest registry file read.
pub const MAX_REGISTRY_BYTES: usize = 1024 * 1024;
/// Most plugins the registry holds.
pub const MAX_REGISTERED: usize = 1000;
/// The policy on a second registration of the same plugin.
pub const COLLISION_POLICY: &str = "keep_first";

/// One registered plugin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Canonical absolute path of the package root.
    pub path: PathBuf,
    pub enabled: bool,
}

/// The registry document.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Registry {
    pub version: u32,
    pub plugins: BTreeMap<String, Entry>,
}

/// Why the registry cannot be read, written or changed.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error(transparent)]
    Data(#[from] super::data::DataError),
    #[error("the plugin registry {0}")]
    Fs(#[from] crate::repofs::FsError),
    #[error("the plugin registry `{}` is not valid: {message}; fix or remove it", path.display())]
    Invalid { path: PathBuf, message: String },
    #[error("no plugin `{name}` is installed; see `npc plugin list`")]
    Unknown { name: String },
    #[error(
        "plugin `{name}` is already installed from `{}`; uninstall it first (`npc plugin uninstall {name}`) to install it from `{}`",
        existing.display(), requested.display()
    )]
    Conflict {
        name: String,
        existing: PathBuf,
        requested: PathBuf,
    },
    #[error("the registry holds {MAX_REGISTERED} plugins already; uninstall some first")]
    Full,
}

/// Where the registry lives: the base directory and the file in it.
fn location() -> Result<(PathBuf, &'static Path), RegistryError> {
    let base = crate::repofs::user_data_dir().ok_or(super::data::DataError::NoDataDir)?;
    Ok((base, Path::new(REGISTRY_FILE)))
}

/// The registry's path, for messages.
pub fn path() -> Result<PathBuf, RegistryError> {
    let (base, file) = location()?;
    Ok(base.join(file))
}

/// Read the registry (empty when it does not exist).
pub fn load() -> Result<Registry, RegistryError> {
    let (base, file) = location()?;
    if !base.is_dir() {
        return Ok(Registry::default());
    }
    let root = Root::new(&base)?;
    let Some(text) = root.read_existing(file, MAX_REGISTRY_BYTES, Links::Refuse)? else {
        return Ok(Registry::default());
    };
    let reg: Registry = serde_json::from_str(&text).map_err(|e| RegistryError::Invalid {
        path: base.join(file),
        message: e.to_string(),
    })?;
    if reg.plugins.len() > MAX_REGISTERED {
        return Err(RegistryError::Invalid {
            path: base.join(file),
            message: format!("more than {MAX_REGISTERED} plugins"),
        });
    }
    Ok(reg)
}

/// Write the registry atomically, owner-only.
pub fn save(reg: &Registry) -> Result<(), RegistryError> {
    let (base, file) = location()?;
    std::fs::create_dir_all(base.join("npc")).map_err(|source| super::data::DataError::Create {
        path: base.join("npc"),
        source,
    })?;
    let root = Root::new(&base)?;
    let mut doc = reg.clone();
    doc.version = 1;
    let text = serde_json::to_string_pretty(&doc).expect("JSON") + "\n";
    root.write(file, text.as_bytes(), WriteOptions::PRIVATE)?;
    Ok(())
}

/// What [`Registry::install`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Installed {
    New,
    AlreadyThere,
}

impl Registry {
    /// Register `name` at canonical `path`, disabled.
    pub fn install(&mut self, name: &str, path: &Path) -> Result<Installed, RegistryError> {
        match self.plugins.get(name) {
            Some(e) if e.path == path => Ok(Installed::AlreadyThere),
            Some(e) => Err(RegistryError::Conflict {
                name: name.into(),
                existing: e.path.clone(),
                requested: path.into(),
            }),
            None if self.plugins.len() >= MAX_REGISTERED => Err(RegistryError::Full),
            None => {
                self.plugins.insert(
                    name.into(),
                    Entry {
                        path: path.into(),
                        enabled: false,
                    },
                );
                Ok(Installed::New)
            }
        }
    }

    pub fn get(&self, name: &str) -> Result<&Entry, RegistryError> {
        self.plugins
            .get(name)
            .ok_or_else(|| RegistryError::Unknown { name: name.into() })
    }

    pub fn set_enabled(&mut self, name: &str, enabled: bool) -> Result<(), RegistryError> {
        let e = self
            .plugins
            .get_mut(name)
            .ok_or_else(|| RegistryError::Unknown { name: name.into() })?;
        e.enabled = enabled;
        Ok(())
    }

    pub fn uninstall(&mut self, name: &str) -> Result<Entry, RegistryError> {
        self.plugins
            .remove(name)
            .ok_or_else(|| RegistryError::Unknown { name: name.into() })
    }
}

/// Where a discovered plugin came from, in discovery order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    Manifest,
    User,
    Builtin,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Manifest => "manifest",
            Source::User => "user",
            Source::Builtin => "builtin",
        }
    }
}

/// One discovered plugin before deduplication.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Found {
    pub kind: &'static str,
    pub id: String,
    pub source: Source,
    pub path: PathBuf,
    pub enabled: bool,
}

/// A registration dropped because an earlier one has its `(kind, id)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Collision {
    pub kind: &'static str,
    pub id: String,
    pub kept: Source,
    pub dropped: Source,
    pub dropped_path: PathBuf,
    pub policy: &'static str,
}

/// Keep the first registration of every `(kind, id)` in `found` (already
/// in discovery order); the rest are collisions.
pub fn dedup(found: Vec<Found>) -> (Vec<Found>, Vec<Collision>) {
    let mut kept: Vec<Found> = Vec::new();
    let mut collisions = Vec::new();
    for f in found {
        if let Some(first) = kept.iter().find(|k| k.kind == f.kind && k.id == f.id) {
            collisions.push(Collision {
                kind: f.kind,
                id: f.id.clone(),
                kept: first.source,
                dropped: f.source,
                dropped_path: f.path.clone(),
                policy: COLLISION_POLICY,
            });
        } else {
            kept.push(f);
        }
    }
    (kept, collisions)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn install_is_idempotent_per_path_and_rejects_another_path() {
        let mut r = Registry::default();
        assert_eq!(r.install("a", Path::new("/p/a")).unwrap(), Installed::New);
        assert_eq!(
            r.install("a", Path::new("/p/a")).unwrap(),
            Installed::AlreadyThere
        );
        assert!(matches!(
            r.install("a", Path::new("/q/a")),
            Err(RegistryError::Conflict { .. })
        ));
        assert!(!r.get("a").unwrap().enabled);
        r.set_enabled("a", true).unwrap();
        assert!(r.get("a").unwrap().enabled);
        r.uninstall("a").unwrap();
        assert!(matches!(r.get("a"), Err(RegistryError::Unknown { .. })));
    }

    #[test]
    fn the_first_registration_wins() {
        let f = |source, path: &str| Found {
            kind: "plugin",
            id: "x".into(),
            source,
            path: path.into(),
            enabled: true,
        };
        let (kept, collisions) = dedup(vec![f(Source::Manifest, "/m"), f(Source::User, "/u")]);
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].source, Source::Manifest);
        assert_eq!(collisions[0].dropped, Source::User);
        assert_eq!(collisions[0].policy, "keep_first");
    }
}
