//! Where a repository's npc state lives ([`RepoPaths`]: the manifest, its
//! root, the state directory, the fixed runtime directory) and how its store
//! is opened (through the guarded layer, side files checked first).

use std::path::{Path, PathBuf};

use crate::model::{self};
use crate::store::Store;

use super::{RuntimeError, lock};

/// The repository's API token inside the state directory (see [`RepoPaths::api_token`]).
pub const TOKEN_FILE: &str = "api.token";
/// Random bytes in the API token (it is stored as hex).
pub const TOKEN_BYTES: usize = 32;
/// Longest token file read.
pub const MAX_TOKEN_FILE_BYTES: usize = 1024;

/// Name of the SQLite database inside the state directory.
pub const DB_FILE: &str = crate::store::DB_FILE_NAME;

/// Where a repository keeps its manifest and state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoPaths {
    /// Canonical repository root (the manifest's directory).
    pub root: PathBuf,
    pub manifest: PathBuf,
    pub state_dir: PathBuf,
}

impl RepoPaths {
    /// Resolve `manifest` (relative, `~` and symlinked directories collapse
    /// to one) and the state directory the manifest names (default `.npc`).
    /// The root is the manifest's directory; the manifest itself need not
    /// exist (`npc status` finds a daemon whose manifest was deleted), and a
    /// manifest that is a link never moves the root elsewhere.
    pub fn resolve(manifest: &Path, state_dir: &str) -> Result<Self, RuntimeError> {
        let expanded = expand_home(manifest);
        let dir = match expanded.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let root = dir.canonicalize().map_err(|source| RuntimeError::Repo {
            path: expanded.clone(),
            source,
        })?;
        let manifest = root.join(expanded.file_name().unwrap_or_default());
        let state_dir = root.join(state_dir);
        Ok(Self {
            root,
            manifest,
            state_dir,
        })
    }

    /// The same repository with the state directory `state_dir` (relative
    /// to the root), for a caller that learned it from the loaded manifest.
    pub fn with_state_dir(self, state_dir: &str) -> Self {
        Self {
            state_dir: self.root.join(state_dir),
            ..self
        }
    }

    pub fn db(&self) -> PathBuf {
        self.state_dir.join(DB_FILE)
    }

    /// Where the lock and the control socket live: `<root>/.npc`, whatever
    /// the manifest says (see [`lock::RUNTIME_DIR`]).
    pub fn runtime_dir(&self) -> PathBuf {
        self.root.join(lock::RUNTIME_DIR)
    }

    /// The repository's API token (`STATE_DIR/api.token`): the credential
    /// of the REST API and `npc mcp serve --http` unless `daemon.token_env`
    /// names another. Created on first use — random, owner-only, whole or
    /// not at all, one winner when two processes race — and read back after.
    /// A token file npc did not make (readable by others, as a clone leaves
    /// it; another user's) is replaced, never used.
    pub fn api_token(&self) -> Result<String, RuntimeError> {
        let root = crate::repofs::Root::new(&self.root)?;
        self.claim_state_dir(&root)?;
        let path = self.state_dir.join(TOKEN_FILE);
        let bad = |reason: &str| RuntimeError::Token {
            path: path.clone(),
            reason: reason.to_string(),
        };
        // A second read covers the process that lost the race to create it.
        for _ in 0..3 {
            match root.read_own(&path, MAX_TOKEN_FILE_BYTES) {
                Ok(bytes) => {
                    let token = String::from_utf8(bytes).unwrap_or_default();
                    let token = token.trim();
                    if token.len() != TOKEN_BYTES * 2
                        || !token.bytes().all(|b| b.is_ascii_hexdigit())
                    {
                        return Err(bad(
                            "it is not a token npc wrote; delete it and npc makes a new one",
                        ));
                    }
                    return Ok(token.to_string());
                }
                // Not npc's (readable by others, another's, linked): never
                // adopted; replaced by a new one.
                Err(e) if e.is_not_own() => {
                    tracing::warn!(error = %e, "a new API token replaces it");
                    root.remove_file(&path)?;
                }
                Err(e) if e.is_not_found() => {
                    let token = crate::stdx::random_hex(TOKEN_BYTES)
                        .map_err(|e| bad(&format!("no randomness: {e}")))?;
                    if root.write_new(&path, token.as_bytes())? {
                        return Ok(token);
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(bad("it keeps changing; stop what rewrites it"))
    }

    /// Make the state directory npc's own ([`crate::repofs::Root::ensure_state_dir`]),
    /// the runtime directory first when the state directory is inside it
    /// (so the runtime directory is never made as a mere parent, without
    /// its owner file, and moved aside later with the state inside).
    fn claim_state_dir(&self, root: &crate::repofs::Root) -> Result<(), RuntimeError> {
        let runtime = self.runtime_dir();
        if self.state_dir != runtime && self.state_dir.starts_with(&runtime) {
            root.ensure_state_dir(&runtime)?;
        }
        root.ensure_state_dir(&self.state_dir)?;
        Ok(())
    }

    /// Who may use the repository's TCP surfaces that take a credential
    /// (the REST API, `npc mcp serve --http`): nothing with `daemon.auth =
    /// "none"`, else the token in the variable `daemon.token_env` names
    /// when it is set, else the repository's own ([`RepoPaths::api_token`]).
    pub fn access(
        &self,
        daemon: &crate::model::Daemon,
    ) -> Result<crate::surfaces::tcp::Access, RuntimeError> {
        use crate::surfaces::tcp::Access;
        if daemon.auth == crate::model::Auth::None {
            return Ok(Access::Loopback);
        }
        match Access::from_token_env(daemon.token_env.as_deref()) {
            token @ Access::Token(_) => Ok(token),
            Access::Loopback => Ok(Access::Token(self.api_token()?.into())),
        }
    }

    /// The control socket of the daemon holding the repository, and its
    /// pid; `None` when no daemon runs or the socket is not one (a link
    /// could lead anywhere, so it is never connected to).
    pub fn running_daemon(&self) -> Option<(PathBuf, u32)> {
        let pid = lock::holder(&self.runtime_dir())?;
        let socket = crate::surfaces::control::socket_path(&self.runtime_dir());
        crate::repofs::Root::new(&self.root)
            .and_then(|root| root.socket_check(&socket))
            .ok()?;
        Some((socket, pid))
    }
}

/// Files SQLite keeps beside the database (`state.db-wal`, …), named by
/// these suffixes. SQLite opens them itself, following links, so they are
/// checked through the guarded layer first.
pub const STORE_SIDE_SUFFIXES: [&str; 3] = crate::store::DB_SIDE_SUFFIXES;

/// Make the state directory and the database file ready through the
/// guarded layer (private, never links), then open the store.
pub fn open_store(paths: &RepoPaths) -> Result<Store, RuntimeError> {
    prepare_store(paths)?;
    Ok(Store::open(paths.db())?)
}

/// [`open_store`] for a process that records a few events and exits
/// (`npc hook run`): see [`Store::open_brief`].
pub fn open_store_brief(paths: &RepoPaths) -> Result<Store, RuntimeError> {
    prepare_store(paths)?;
    Ok(Store::open_brief(paths.db())?)
}

/// The checks before a writable open: the state directory is npc's (claimed),
/// the database and its side files are regular files, never links.
fn prepare_store(paths: &RepoPaths) -> Result<(), RuntimeError> {
    let root = crate::repofs::Root::new(&paths.root)?;
    paths.claim_state_dir(&root)?;
    drop(root.open_private(&paths.db())?);
    check_side_files(&root, paths)
}

/// Open the existing store read-only (the CLI beside a daemon), after the
/// same checks as [`open_store`]: the state directory is npc's own (one
/// that came with the repository is moved aside and reads as none), the
/// database and its side files are regular files, never links. `None`
/// when there is no store yet (nothing recorded, or nothing npc made).
pub fn open_existing_store(paths: &RepoPaths) -> Result<Option<Store>, RuntimeError> {
    let root = crate::repofs::Root::new(&paths.root)?;
    if paths.state_dir.starts_with(paths.runtime_dir()) {
        match root.existing_state_dir(&paths.runtime_dir()) {
            Ok(()) => {}
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(e.into()),
        }
    }
    for check in [
        root.existing_state_dir(&paths.state_dir),
        root.open_existing(&paths.db()).map(drop),
    ] {
        match check {
            Ok(()) => {}
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(e.into()),
        }
    }
    check_side_files(&root, paths)?;
    match Store::open_read_only(paths.db()) {
        Ok(store) => Ok(Some(store)),
        Err(crate::store::StoreError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// [`open_existing_store`] for a caller that needs the store: its absence
/// is an error naming the database.
pub fn open_store_read_only(paths: &RepoPaths) -> Result<Store, RuntimeError> {
    open_existing_store(paths)?.ok_or_else(|| crate::repofs::FsError::not_found(paths.db()).into())
}

/// Each of SQLite's side files is absent or a regular file in the state
/// directory: a link (to anywhere) or a FIFO there is refused by name.
fn check_side_files(root: &crate::repofs::Root, paths: &RepoPaths) -> Result<(), RuntimeError> {
    for suffix in STORE_SIDE_SUFFIXES {
        let mut name = paths.db().into_os_string();
        name.push(suffix);
        match root.open_existing(Path::new(&name)) {
            Ok(_) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn expand_home(path: &Path) -> PathBuf {
    match (path.strip_prefix("~"), std::env::var_os("HOME")) {
        (Ok(rest), Some(home)) => PathBuf::from(home).join(rest),
        _ => path.to_path_buf(),
    }
}

/// The key of `[project]` that names the state directory.
const STATE_DIR_KEY: &str = "state_dir";

/// The state directory a manifest names, read leniently so that `npc
/// status` and `npc events` work while the manifest is invalid (that is when
/// the events matter most): `project.state_dir` if the file parses at all,
/// else the default. The manifest is read through the guarded layer with
/// the manifest size cap, so a huge or hostile file costs nothing.
pub fn state_dir_hint(manifest: &Path) -> String {
    let bytes = crate::disk::read_manifest(manifest).unwrap_or_default();
    let text = String::from_utf8(bytes).unwrap_or_default();
    // Without the key's name in the text (nor an escape that could spell
    // it) the default is the answer; most manifests, and `npc hook run` on
    // every tool call, skip a second parse of the whole file.
    if !text.contains(STATE_DIR_KEY) && !text.contains("\\u") && !text.contains("\\U") {
        return model::DEFAULT_STATE_DIR.to_string();
    }
    let value: Option<serde_json::Value> = if manifest.extension().is_some_and(|e| e == "json") {
        serde_json::from_str(&text).ok()
    } else {
        toml::from_str(&text).ok()
    };
    value
        .as_ref()
        .and_then(|v| v.pointer("/project/state_dir"))
        .and_then(|v| v.as_str())
        .unwrap_or(model::DEFAULT_STATE_DIR)
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sandbox_hides_the_files_the_runtime_keeps() {
        // `runs::sandbox` (below this room) names them on its own.
        assert_eq!(crate::runs::sandbox::TOKEN_FILE, TOKEN_FILE);
        assert_eq!(
            crate::runs::sandbox::RUNTIME_DIR,
            crate::runtime::lock::RUNTIME_DIR
        );
    }

    #[test]
    fn the_state_dir_hint_reads_the_key_however_it_is_spelled() {
        let dir = tempfile::tempdir().unwrap();
        let hint = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            state_dir_hint(&path)
        };
        let plain = "version = 1\n[project]\nname = \"x\"\n";
        assert_eq!(hint("a.toml", plain), model::DEFAULT_STATE_DIR);
        let named = "version = 1\n[project]\nstate_dir = \".state\"\n";
        assert_eq!(hint("b.toml", named), ".state");
        let escaped = "version = 1\n[project]\n\"state\\u005fdir\" = \".escaped\"\n";
        assert_eq!(hint("c.toml", escaped), ".escaped");
        let json = r#"{"version": 1, "project": {"state_dir": ".j"}}"#;
        assert_eq!(hint("d.json", json), ".j");
        assert_eq!(
            hint("e.toml", "not toml at all [["),
            model::DEFAULT_STATE_DIR
        );
    }
}
