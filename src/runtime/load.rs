//! Loading the manifest for a reload: the one loader (plugins checked),
//! deadlines, and the line between an invalid manifest and an operational
//! failure ([`is_operational`], [`OperationalFiles`]), which is retried.

use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use crate::model::{self, ProcessEnv};

use super::RuntimeError;

/// Load the manifest at `path` with the process environment.
pub fn load_manifest(path: &Path) -> Result<model::Loaded, RuntimeError> {
    crate::plugins::files::load_path(path, &ProcessEnv).map_err(|source| RuntimeError::Manifest {
        path: path.to_path_buf(),
        source,
    })
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
