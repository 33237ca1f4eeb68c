//! The repository lock: one daemon per repository. An exclusive `flock` on
//! `<repo>/.npc/daemon.lock` (the runtime directory, [`RUNTIME_DIR`]: a
//! fixed place that does not depend on the manifest, so changing
//! `project.state_dir` or breaking the manifest never hides a running
//! daemon) held for the daemon's life, with the holder's pid written inside
//! so a second daemon can say who holds it. The kernel drops the lock when
//! the process dies, so a crash never leaves it stale. The file is opened
//! through the guarded layer: never through a link, owner-only.
//!
//! A file lock lasts only as long as its file: `rm -rf .npc` (or `git
//! clean -fdx`, the directory being git-ignored) while a daemon runs would
//! let a second daemon lock a fresh file and supervise a second copy of
//! everything. So the lock is also a name no file operation can remove: an
//! abstract Unix socket named after the repository's canonical path
//! ([`abstract_name`]), bound for the daemon's life and released by the
//! kernel when the process dies, like the `flock`.

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

use crate::repofs::{FsError, Root};

/// The runtime directory under the repository root: the lock and the
/// control socket live here whatever `project.state_dir` says.
pub const RUNTIME_DIR: &str = ".npc";

/// File name of the lock inside the state directory.
pub const LOCK_FILE: &str = "daemon.lock";
/// Bytes of the lock file read for the holder's pid (a pid is at most 10
/// digits).
pub const MAX_LOCK_BYTES: u64 = 64;

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error(
        "another npc daemon (pid {pid}) already runs for `{repo}`; stop it first, or talk to it with `npc status`"
    )]
    Held { pid: String, repo: PathBuf },
    #[error("cannot open the lock file `{path}`: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Refused by the guarded layer. Not a `source`: the message already
    /// says it, and a chained source would print it twice.
    #[error("cannot take the repository lock: {0}")]
    Guard(FsError),
}

impl From<FsError> for LockError {
    fn from(e: FsError) -> Self {
        Self::Guard(e)
    }
}

/// Prefix of the abstract socket name that locks a repository.
pub const ABSTRACT_LOCK_PREFIX: &str = "npc-lock-";
/// Hex digits of the repository path's SHA-256 in that name.
pub const ABSTRACT_LOCK_DIGEST_HEX: usize = 32;

/// The abstract socket name locking the repository at `repo` (its
/// canonical path): the prefix and a digest of the directory's device and
/// inode and its path, so any path fits, and the same path in another mount
/// namespace sharing the network namespace (two containers on the host
/// network) is another repository.
pub fn abstract_name(repo: &Path) -> String {
    use sha2::Digest as _;
    use std::os::unix::ffi::OsStrExt as _;
    use std::os::unix::fs::MetadataExt as _;
    let mut hasher = sha2::Sha256::new();
    if let Ok(meta) = std::fs::metadata(repo) {
        hasher.update(meta.dev().to_le_bytes());
        hasher.update(meta.ino().to_le_bytes());
    }
    hasher.update(repo.as_os_str().as_bytes());
    let digest = hasher.finalize();
    let hex = crate::stdx::hex(&digest);
    format!("{ABSTRACT_LOCK_PREFIX}{}", &hex[..ABSTRACT_LOCK_DIGEST_HEX])
}

/// Bind the abstract lock socket of `repo`: `Ok(None)` when the system
/// offers no abstract sockets (the file lock still holds), an error when
/// another process holds it.
fn bind_abstract(repo: &Path) -> Result<Option<std::os::unix::net::UnixListener>, LockError> {
    use std::os::linux::net::SocketAddrExt as _;
    let Ok(addr) = std::os::unix::net::SocketAddr::from_abstract_name(abstract_name(repo)) else {
        return Ok(None);
    };
    match std::os::unix::net::UnixListener::bind_addr(&addr) {
        Ok(listener) => Ok(Some(listener)),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Err(LockError::Held {
            pid: "unknown: its `.npc` directory was removed while it ran".to_string(),
            repo: repo.to_path_buf(),
        }),
        Err(_) => Ok(None),
    }
}

/// Holds the repository lock until dropped.
#[derive(Debug)]
pub struct RepoLock {
    _lock: Flock<File>,
    _name: Option<std::os::unix::net::UnixListener>,
    path: PathBuf,
}

impl RepoLock {
    /// Take the lock for `repo` in `dir` (its runtime directory, made a
    /// private state directory first), or say which pid holds it.
    pub fn acquire(dir: &Path, repo: &Path) -> Result<Self, LockError> {
        let path = dir.join(LOCK_FILE);
        let io = |source| LockError::Io {
            path: path.clone(),
            source,
        };
        let root = Root::new(repo)?;
        root.ensure_state_dir(dir)?;
        let file = root.open_private(&path)?;
        let mut lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => lock,
            Err((mut file, _)) => {
                let mut pid = String::new();
                let _ = (&mut file).take(MAX_LOCK_BYTES).read_to_string(&mut pid);
                let pid = if pid.trim().is_empty() {
                    "unknown".to_string()
                } else {
                    pid.trim().to_string()
                };
                return Err(LockError::Held {
                    pid,
                    repo: repo.to_path_buf(),
                });
            }
        };
        let name = bind_abstract(repo)?;
        lock.set_len(0).map_err(io)?;
        lock.rewind().map_err(io)?;
        write!(lock, "{}", std::process::id()).map_err(io)?;
        lock.flush().map_err(io)?;
        Ok(Self {
            _lock: lock,
            _name: name,
            path,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The pid written in the lock file in `dir`, if a daemon holds it now.
/// A lock file that is a link or not a regular file is no daemon's.
pub fn holder(dir: &Path) -> Option<u32> {
    // Rooted at the repository, so a runtime directory that is a link out
    // of it is not followed.
    let repo = dir.parent().unwrap_or(Path::new(""));
    let file = Root::new(repo)
        .ok()?
        .open_existing(&dir.join(LOCK_FILE))
        .ok()?;
    match Flock::lock(file, FlockArg::LockSharedNonblock) {
        Ok(_free) => None,
        Err((mut file, _)) => {
            let mut pid = String::new();
            (&mut file)
                .take(MAX_LOCK_BYTES)
                .read_to_string(&mut pid)
                .ok()?;
            pid.trim().parse().ok()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How long a released lock may stay held by a copy of its descriptors:
    /// a process another test forks holds them from `fork` to `exec` (they
    /// are close-on-exec), so the release is awaited, not assumed.
    const RELEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

    /// The lock, once every copy of a released holder's descriptors is gone.
    fn acquire_once_released(dir: &Path, repo: &Path) -> RepoLock {
        let deadline = std::time::Instant::now() + RELEASE_WAIT;
        loop {
            match RepoLock::acquire(dir, repo) {
                Ok(lock) => return lock,
                Err(LockError::Held { .. }) if std::time::Instant::now() < deadline => {
                    std::thread::yield_now();
                }
                Err(e) => panic!("the released lock was not free within {RELEASE_WAIT:?}: {e}"),
            }
        }
    }

    #[test]
    fn second_lock_names_the_holder() {
        let repo = tempfile::tempdir().unwrap();
        let dir = repo.path().join(RUNTIME_DIR);
        let first = RepoLock::acquire(&dir, repo.path()).unwrap();
        let err = RepoLock::acquire(&dir, repo.path()).unwrap_err();
        assert!(
            err.to_string()
                .contains(&format!("pid {}", std::process::id())),
            "{err}"
        );
        assert_eq!(holder(&dir), Some(std::process::id()));
        drop(first);
        let again = acquire_once_released(&dir, repo.path());
        assert_eq!(holder(&dir), Some(std::process::id()));
        drop(again);
    }

    #[test]
    fn removing_the_runtime_directory_does_not_free_the_lock() {
        let repo = tempfile::tempdir().unwrap();
        let root = repo.path().canonicalize().unwrap();
        let dir = root.join(RUNTIME_DIR);
        let first = RepoLock::acquire(&dir, &root).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let err = RepoLock::acquire(&dir, &root).unwrap_err();
        assert!(matches!(err, LockError::Held { .. }), "{err}");
        drop(first);
        acquire_once_released(&dir, &root);
    }
}
