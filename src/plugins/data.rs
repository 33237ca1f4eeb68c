//! `PLUGIN_DATA`: one persistent directory per plugin under the user's data
//! directory, `$XDG_DATA_HOME/npc/plugin-data/<name>` (else
//! `~/.local/share/npc/plugin-data/<name>`), created mode 0700 and
//! re-enforced (an existing one is tightened, a link refused) before every
//! start of a plugin's process. Never under the repository: a package
//! cannot choose where its data goes. `npc plugin validate` never creates it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::repofs::{FsError, Perms, Root};

/// Where plugin data lives, under the user's data directory.
pub const DATA_SUBDIR: &str = "npc/plugin-data";

/// Why a plugin's data directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("no user data directory: set `HOME` or an absolute `XDG_DATA_HOME`")]
    NoDataDir,
    #[error("cannot create `{}`: {source}; check its permissions", path.display())]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("plugin data directory {0}")]
    Guard(#[from] FsError),
}

/// The base of every plugin's data directory.
pub fn base() -> Result<PathBuf, DataError> {
    crate::repofs::user_data_dir()
        .map(|d| d.join(DATA_SUBDIR))
        .ok_or(DataError::NoDataDir)
}

/// The data directory of plugin `name` (a valid plugin name: no `/`, no `..`).
pub fn dir_of(name: &str) -> Result<PathBuf, DataError> {
    Ok(base()?.join(name))
}

/// Create (or re-enforce) the data directory of plugin `name`: mode 0700,
/// not a link. Returns its path. Called before every start.
pub fn ensure(name: &str) -> Result<PathBuf, DataError> {
    let base = base()?;
    std::fs::create_dir_all(&base).map_err(|source| DataError::Create {
        path: base.clone(),
        source,
    })?;
    let root = Root::new(&base)?;
    Ok(root.create_dir_all(Path::new(name), Perms::Private)?)
}

/// Before a start: when `env` (a server's declared environment) carries a
/// `PLUGIN_DATA` that is a plugin data directory (directly under
/// [`base`]), create or re-enforce it. Failures are logged; the start then
/// fails on its own with the reason.
pub fn ensure_for(env: &BTreeMap<String, crate::model::Text>) {
    if let Some(data) = env.get(super::PLUGIN_DATA) {
        ensure_at(Path::new(data.expose()));
    }
}

/// When `path` is a plugin data directory (directly under [`base`]),
/// create or re-enforce it. Failures are logged; the start then fails on
/// its own with the reason.
pub fn ensure_at(path: &Path) {
    let (Ok(base), Some(parent), Some(name)) = (base(), path.parent(), path.file_name()) else {
        return;
    };
    if parent != base {
        return;
    }
    if let Err(e) = ensure(&name.to_string_lossy()) {
        tracing::warn!("cannot prepare `{}`: {e}", path.display());
    }
}

/// The environment of a plugin's process: the declared `env` (placeholders
/// expanded), then `PLUGIN_ROOT` and `PLUGIN_DATA` set last (§9).
pub fn plugin_env(
    declared: &BTreeMap<String, String>,
    places: &super::expand::Placeholders<'_>,
) -> BTreeMap<String, String> {
    let mut env = places.expand_env(declared);
    env.insert(
        super::PLUGIN_ROOT.into(),
        places.root.to_string_lossy().into_owned(),
    );
    env.insert(
        super::PLUGIN_DATA.into(),
        places.data.to_string_lossy().into_owned(),
    );
    env
}
