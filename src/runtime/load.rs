//! Loading the manifest for a reload: the one loader (plugins checked),
//! deadlines, and the line between an invalid manifest and an operational
//! failure ([`is_operational`], [`OperationalFiles`]), which is retried.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use crate::disk::ProcessEnv;
use crate::model;
use crate::plan::fingerprint::fingerprint;

use super::RuntimeError;

/// Load the manifest at `path` with the process environment.
pub fn load_manifest(path: &Path) -> Result<model::Loaded, RuntimeError> {
    load_from_disk(path).map_err(|source| RuntimeError::Manifest {
        path: path.to_path_buf(),
        source,
    })
}

/// [`load_manifest`], with what the manifest was computed from: for a
/// plan, whose fingerprint covers it.
pub fn load_sourced(path: &Path) -> Result<(model::Loaded, Sources), RuntimeError> {
    let files = package_files(path);
    load_with(path, &files).map_err(|source| RuntimeError::Manifest {
        path: path.to_path_buf(),
        source,
    })
}

/// The one loader on the disk for a load that plans nothing (`npc
/// validate`, `npc hook run` on every tool call, the API's listings: no
/// digest is computed for them): `plugins::files::load_path`, plugin
/// packages checked, which the API (a room below this one) calls itself.
/// Every command loads through it or [`load_sourced`] (the daemon's
/// reloads through [`load_with`], to tell operational failures apart).
pub fn load_from_disk(path: &Path) -> std::io::Result<model::Loaded> {
    load_from_disk_with(path, &ProcessEnv)
}

/// [`load_from_disk`] with another view of the environment (`npc validate
/// --allow-missing-env`: [`crate::disk::ProcessEnvAllowingUnset`]).
pub fn load_from_disk_with(path: &Path, env: &dyn model::Env) -> std::io::Result<model::Loaded> {
    crate::plugins::files::load_path(path, env)
}

/// The files of the manifest at `path`, plugin packages checked.
fn package_files(path: &Path) -> crate::plugins::files::PackageFiles {
    crate::plugins::files::PackageFiles::new(path.parent().unwrap_or(Path::new("")))
}

/// The loader of a plan: the manifest at `path` read once, validated with
/// the process environment, every file it references read through `files`
/// and recorded in the [`Sources`] it returns (a digest of each, which the
/// plan's fingerprint covers).
pub fn load_with(
    path: &Path,
    files: &dyn model::Files,
) -> std::io::Result<(model::Loaded, Sources)> {
    let bytes = match crate::disk::read_manifest(path) {
        Ok(bytes) => bytes,
        // Too large: the model's loader says so in its own diagnostic.
        Err(e) if matches!(e.reason, crate::repofs::Reason::TooLarge { .. }) => {
            let loaded = crate::disk::load_path_with(path, &ProcessEnv, files)?;
            return Ok((loaded, Sources::default()));
        }
        Err(e) => return Err(e.into()),
    };
    let name = path.display().to_string();
    let recording = Recording {
        inner: files,
        reads: Mutex::new(BTreeMap::new()),
    };
    let manifest = fingerprint(bytes.as_slice());
    let loaded = model::load_owned(
        &name,
        bytes,
        model::Syntax::from_path(&name),
        &ProcessEnv,
        &recording,
    );
    let files = recording
        .reads
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    Ok((loaded, Sources { manifest, files }))
}

/// What a manifest was computed from, besides the environment: a digest of
/// its bytes and of every file it references (prompt files, …) as the
/// loader read it, a failed read included. Plugin packages are covered by
/// their digests (`ExternalInputs`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Sources {
    manifest: String,
    files: BTreeMap<PathBuf, String>,
}

/// Why a plan was not applied: it was computed from something other than
/// the plan that was shown.
pub const STALE_PLAN: &str = "the manifest changed since the plan was shown; run `npc plan` again";

/// Version of what [`plan_fingerprint`] covers: a saved plan of another
/// version never matches.
pub const PLAN_BASIS_VERSION: u32 = 1;

/// The fingerprint of a plan: everything it was computed from — the
/// manifest and the files it references ([`Sources`]), the plugin
/// packages' digests, and the observed state it was compared with. Equal
/// fingerprints mean an equal plan.
pub fn plan_fingerprint(
    sources: &Sources,
    inputs: &crate::plan::ExternalInputs,
    observed: &crate::plan::ObservedState,
) -> String {
    let observed: Vec<(String, &str)> = observed
        .iter()
        .map(|(id, o)| (id.to_string(), o.fingerprint.as_str()))
        .collect();
    fingerprint(&(
        PLAN_BASIS_VERSION,
        sources,
        &inputs.plugin_digests,
        observed,
    ))
}

/// A [`model::Files`] that records a digest of every file read through it.
struct Recording<'a> {
    inner: &'a dyn model::Files,
    reads: Mutex<BTreeMap<PathBuf, String>>,
}

impl model::Files for Recording<'_> {
    fn read_to_string(&self, path: &Path) -> std::io::Result<String> {
        let read = self.inner.read_to_string(path);
        let digest = match &read {
            Ok(text) => fingerprint(text.as_str()),
            Err(e) => format!("unreadable: {:?}", e.kind()),
        };
        crate::stdx::lock(&self.reads).insert(path.to_path_buf(), digest);
        read
    }
    fn is_dir(&self, path: &Path) -> bool {
        self.inner.is_dir(path)
    }
    fn is_git_repository(&self) -> Option<bool> {
        self.inner.is_git_repository()
    }
    fn check_dir(&self, path: &Path) -> std::io::Result<()> {
        self.inner.check_dir(path)
    }
    fn package(&self, entry: &str, dir: &Path) -> Option<model::package::PackageView> {
        self.inner.package(entry, dir)
    }
    fn add_user_plugins(&self, manifest: &mut model::Manifest) {
        self.inner.add_user_plugins(manifest);
    }
}

/// Longest a reload may spend loading and validating the manifest (template
/// probes and plugin digests included) before it counts as an operational
/// failure and is retried.
pub const LOAD_DEADLINE: Duration = Duration::from_secs(30);
/// Longest a reload may spend rendering and planning the agent files.
pub const FILES_DEADLINE: Duration = Duration::from_secs(30);

/// Why a reload's load step did not produce a manifest.
#[derive(Debug)]
pub(super) enum LoadFailure {
    /// Not the manifest's fault: retried with backoff (`reload.failed`).
    Operational(String),
    /// The manifest is wrong: reported once (`manifest.invalid`).
    Invalid {
        payload: Box<crate::event::ManifestInvalid>,
        error_count: usize,
    },
}

/// Whether an I/O error is about the machine (descriptors, memory, an
/// interrupted or busy call) rather than the file: such a reload is retried
/// instead of calling the manifest invalid.
pub fn is_operational(e: &std::io::Error) -> bool {
    use nix::errno::Errno;
    use std::io::ErrorKind;
    let e = crate::repofs::os_error(e);
    const OPERATIONAL: [Errno; 8] = [
        Errno::EMFILE,
        Errno::ENFILE,
        Errno::ENOMEM,
        Errno::EAGAIN,
        Errno::EINTR,
        Errno::ENOBUFS,
        Errno::EIO,
        Errno::ETIMEDOUT,
    ];
    e.raw_os_error()
        .is_some_and(|n| OPERATIONAL.contains(&Errno::from_raw(n)))
        || matches!(
            e.kind(),
            ErrorKind::Interrupted
                | ErrorKind::WouldBlock
                | ErrorKind::TimedOut
                | ErrorKind::OutOfMemory
        )
}

/// The files a manifest references, read from disk, remembering the first
/// operational failure (a prompt file that cannot be opened for lack of
/// descriptors is not an invalid manifest).
pub(super) struct OperationalFiles {
    disk: crate::plugins::files::PackageFiles,
    failure: Mutex<Option<String>>,
}

impl OperationalFiles {
    pub(super) fn new(root: &Path) -> Self {
        Self {
            disk: crate::plugins::files::PackageFiles::new(root),
            failure: Mutex::new(None),
        }
    }

    pub(super) fn failure(&self) -> Option<String> {
        crate::stdx::lock(&self.failure).clone()
    }
}

impl model::Files for OperationalFiles {
    fn read_to_string(&self, path: &Path) -> std::io::Result<String> {
        let read = self.disk.read_to_string(path);
        if let Err(e) = &read
            && is_operational(e)
        {
            let mut failure = crate::stdx::lock(&self.failure);
            failure.get_or_insert_with(|| format!("cannot read `{}`: {e}", path.display()));
        }
        read
    }
    fn is_dir(&self, path: &Path) -> bool {
        self.disk.is_dir(path)
    }
    fn is_git_repository(&self) -> Option<bool> {
        self.disk.is_git_repository()
    }
    fn check_dir(&self, path: &Path) -> std::io::Result<()> {
        self.disk.check_dir(path)
    }
    fn package(&self, entry: &str, dir: &Path) -> Option<model::package::PackageView> {
        self.disk.package(entry, dir)
    }
    fn add_user_plugins(&self, manifest: &mut model::Manifest) {
        self.disk.add_user_plugins(manifest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_and_memory_errors_are_operational_missing_files_are_not() {
        for errno in [
            nix::errno::Errno::EMFILE,
            nix::errno::Errno::ENFILE,
            nix::errno::Errno::ENOMEM,
        ] {
            assert!(
                is_operational(&std::io::Error::from_raw_os_error(errno as i32)),
                "{errno}"
            );
        }
        for errno in [
            nix::errno::Errno::ENOENT,
            nix::errno::Errno::EACCES,
            nix::errno::Errno::EISDIR,
        ] {
            assert!(
                !is_operational(&std::io::Error::from_raw_os_error(errno as i32)),
                "{errno}"
            );
        }
    }
}
