//! What the pure core reads through its seams, from the real machine: the
//! manifest and the files it references on disk ([`DiskFiles`], the
//! `model::Files` of every loader, through the guarded layer `repofs`) and
//! the process environment ([`ProcessEnv`], the `model::Env` of `${VAR}`).
//! `model` declares both seams and never touches the disk or the
//! environment itself; tests hand it maps.
//!
//! Architecture invariant: nothing here interprets a manifest; it reads
//! bytes and variables and hands them to `model`.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::model::lower::MAX_TEMPLATE_BYTES;
use crate::model::{self, Env, Files, Loaded};
use crate::repofs::{self, FsError, Root};

/// The real process environment.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
}

/// The process environment, a variable it does not set only a warning
/// (`npc validate --allow-missing-env`).
#[derive(Debug, Clone, Copy)]
pub struct ProcessEnvAllowingUnset;

impl Env for ProcessEnvAllowingUnset {
    fn var(&self, name: &str) -> Option<String> {
        ProcessEnv.var(name)
    }

    fn unset_is_warning(&self) -> bool {
        true
    }
}

/// The real file system, rooted at the manifest's directory, through the
/// guarded layer (`crate::repofs`): nothing outside the root is read, only
/// regular files, at most [`MAX_TEMPLATE_BYTES`] of each. It checks no
/// plugin package: `plugins::PackageFiles` wraps it to.
#[derive(Debug, Clone)]
pub struct DiskFiles {
    root: PathBuf,
    /// The guarded root, resolved at the first file read and kept: one
    /// load resolves the manifest's directory once, not once per file.
    guarded: OnceLock<Root>,
}

impl DiskFiles {
    /// Files relative to the manifest directory `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            guarded: OnceLock::new(),
        }
    }

    /// The guarded layer's [`Root`] at the manifest directory.
    pub fn guarded(&self) -> Result<&Root, FsError> {
        if let Some(root) = self.guarded.get() {
            return Ok(root);
        }
        let root = Root::new(&self.root)?;
        Ok(self.guarded.get_or_init(|| root))
    }
}

impl Files for DiskFiles {
    fn is_git_repository(&self) -> Option<bool> {
        Some(
            std::fs::symlink_metadata(self.root.join(".git"))
                .is_ok_and(|m| m.is_dir() || m.is_file()),
        )
    }
    fn read_to_string(&self, path: &Path) -> std::io::Result<String> {
        self.guarded()
            .and_then(|root| root.read_string(path, MAX_TEMPLATE_BYTES))
            .map_err(FsError::into_reason)
    }
    fn is_dir(&self, path: &Path) -> bool {
        self.check_dir(path).is_ok()
    }
    fn check_dir(&self, path: &Path) -> std::io::Result<()> {
        self.guarded()
            .and_then(|root| root.dir_check(path))
            .map_err(FsError::into_reason)
    }
}

/// Load the manifest at `path`, with referenced files read through `files`
/// (relative to its directory). The manifest is read through the guarded
/// layer: a regular file inside its directory (a link may point elsewhere
/// in it), read no further than [`model::node::MAX_MANIFEST_BYTES`]. Commands load
/// through `plugins::files::load_path` (plugin packages checked); the
/// runtime wraps those files to tell operational read failures from
/// invalid input.
pub fn load_path_with(path: &Path, env: &dyn Env, files: &dyn Files) -> std::io::Result<Loaded> {
    let name = path.display().to_string();
    let bytes = match read_manifest(path) {
        Ok(bytes) => bytes,
        Err(e) if matches!(e.reason, repofs::Reason::TooLarge { .. }) => {
            return Ok(model::too_large(&name));
        }
        Err(e) => return Err(e.into()),
    };
    Ok(model::load_owned(
        &name,
        bytes,
        model::Syntax::from_path(&name),
        env,
        files,
    ))
}

/// The manifest's bytes, through the guarded layer rooted at its directory.
pub fn read_manifest(path: &Path) -> Result<Vec<u8>, repofs::FsError> {
    let dir = path.parent().unwrap_or(Path::new(""));
    let file = path.file_name().map(Path::new).unwrap_or(path);
    repofs::Root::new(dir)?.read(file, model::node::MAX_MANIFEST_BYTES)
}
