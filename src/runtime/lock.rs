//! The repository lock: one daemon per repository. An exclusive `flock` on
//! `<state_dir>/daemon.lock` held for the daemon's life, with the holder's
//! pid written inside so a second daemon can say who holds it. The kernel
//! drops the lock when the process dies, so a crash never leaves it stale.

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

/// File name of the lock inside the state directory.
pub const LOCK_FILE: &str = "daemon.lock";

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
}

/// Holds the repository lock until dropped.
#[derive(Debug)]
pub struct RepoLock {
    _lock: Flock<File>,
    path: PathBuf,
}

impl RepoLock {
    /// Take the lock for `repo` in `state_dir`, or say which pid holds it.
    pub fn acquire(state_dir: &Path, repo: &Path) -> Result<Self, LockError> {
        let path = state_dir.join(LOCK_FILE);
        let io = |source| LockError::Io {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(state_dir).map_err(io)?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        let mut lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => lock,
            Err((mut file, _)) => {
                let mut pid = String::new();
                let _ = file.read_to_string(&mut pid);
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
        lock.set_len(0).map_err(io)?;
        lock.rewind().map_err(io)?;
        write!(lock, "{}", std::process::id()).map_err(io)?;
        lock.flush().map_err(io)?;
        Ok(Self { _lock: lock, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The pid written in a lock file, if a daemon holds it now.
pub fn holder(state_dir: &Path) -> Option<u32> {
    let path = state_dir.join(LOCK_FILE);
    let file = File::open(&path).ok()?;
    match Flock::lock(file, FlockArg::LockSharedNonblock) {
        Ok(_free) => None,
        Err((mut file, _)) => {
            let mut pid = String::new();
            file.read_to_string(&mut pid).ok()?;
            pid.trim().parse().ok()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_names_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let first = RepoLock::acquire(dir.path(), Path::new("/repo")).unwrap();
        let err = RepoLock::acquire(dir.path(), Path::new("/repo")).unwrap_err();
        assert!(
            err.to_string()
                .contains(&format!("pid {}", std::process::id())),
            "{err}"
        );
        assert_eq!(holder(dir.path()), Some(std::process::id()));
        drop(first);
        assert_eq!(holder(dir.path()), None);
        RepoLock::acquire(dir.path(), Path::new("/repo")).unwrap();
    }
}
