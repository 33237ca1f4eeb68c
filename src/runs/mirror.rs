//! A fleet worker's mirror of its repository: one bare repository,
//! [`MIRROR_DIR`] in the state directory of the checkout the worker was
//! started in, whose `origin` is that checkout's `origin`. A run its
//! ingress queued names the commit it starts from (`store::queue::RunCode`);
//! the worker fetches when the mirror lacks it (`git fetch` of origin's
//! branches and tags into `refs/remotes/origin/*` and `refs/tags/*`, then
//! the commit itself when no branch holds it) and makes the run's worktree
//! from the mirror at that commit, so a worker whose checkout is behind
//! still runs the code its run was queued for. The run's branch lives in
//! the mirror, and `push = true` sends it to `origin` from there.
//!
//! A row is data other machines wrote: the mirror only ever fetches from
//! the worker's own `origin` ([`check_code`] refuses a row naming another
//! remote before any git command runs), and the commit must be a full hex
//! object id (`workspace::is_object_id`), so nothing of a row reaches git
//! as an option or a URL. One run at a time works on the mirror (fetch,
//! prune, `git worktree add`), in this process and among the workers that
//! share the state directory (an `flock` on [`LOCK_FILE`]), each waiting
//! at most [`MIRROR_WAIT`].
//!
//! The mirror is in the state directory, where a clone may have put one
//! too: before each run's turn a mirror the checkout tracks files of is
//! refused, and the mirror is checked to be one npc made (no config key
//! npc does not write, no hook, nothing that makes git read elsewhere) and
//! made again when not;
//! and no git command npc runs starts a hook or a file system monitor
//! anyway (`workspace::GIT_SAFE_CONFIG`).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::fcntl::{Flock, FlockArg};

use super::remote::Remote;
use super::workspace::{self, ORIGIN, WorkspaceError};
use crate::store::queue::RunCode;
use crate::supervisor::Supervisor;

/// The mirror's directory, in the state directory.
pub const MIRROR_DIR: &str = "mirror.git";
/// The file whose `flock` the workers sharing a mirror take in turn, in
/// the state directory.
pub const LOCK_FILE: &str = "mirror.lock";
/// Longest a run waits for its turn on the mirror (another run's fetch):
/// two of git's longest commands.
pub const MIRROR_WAIT: Duration = Duration::from_secs(2 * workspace::GIT_TIMEOUT.as_secs());
/// How often a run waiting for another process's turn on the mirror looks
/// again.
pub const LOCK_POLL: Duration = Duration::from_millis(50);
/// Most characters of a row's text an error quotes.
pub const MAX_QUOTED_CHARS: usize = 200;
/// What a fetch brings: origin's branches (as remote-tracking refs, apart
/// from the runs' own branches in `refs/heads`) and its tags.
pub const FETCH_REFSPECS: [&str; 2] = [
    "+refs/heads/*:refs/remotes/origin/*",
    "+refs/tags/*:refs/tags/*",
];

/// The config keys (as `git config --list` names them) a mirror npc made
/// holds: what `git init --bare` writes, and `origin`'s URL. A mirror whose
/// config holds any other (`core.fsmonitor`, `core.hooksPath`,
/// `core.sshCommand`, a filter, an include, …) is not npc's.
pub const MIRROR_CONFIG_KEYS: [&str; 10] = [
    "core.repositoryformatversion",
    "core.filemode",
    "core.bare",
    "core.ignorecase",
    "core.precomposeunicode",
    "core.symlinks",
    "core.logallrefupdates",
    "extensions.objectformat",
    "extensions.refstorage",
    "remote.origin.url",
];
/// Files that make git read objects, refs or config from elsewhere; a
/// mirror npc made has none.
pub const MIRROR_FOREIGN_FILES: [&str; 5] = [
    "commondir",
    "gitdir",
    "config.worktree",
    "objects/info/alternates",
    "objects/info/http-alternates",
];
/// Most entries of a mirror's `hooks` directory looked at; a mirror with
/// more is not npc's.
pub const MAX_HOOK_ENTRIES: usize = 64;

/// Why a run cannot start from the mirror.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MirrorError {
    #[error(
        "the run comes from remote `{row}`, and this worker's fleet is `{ours}`; it was not run (a worker fetches only from its own `origin`)"
    )]
    OtherRemote { row: String, ours: String },
    #[error(
        "the run comes from remote `{0}`, and this process keeps no mirror of it; start `npc worker` in a checkout whose `origin` is that remote"
    )]
    NoMirror(String),
    #[error("the run's commit `{0}` is not a full hex object id; it was not run")]
    BadCommit(String),
    #[error(
        "the run names no commit: its ingress could not resolve `ref` `{0}` when it queued it; fetch in the ingress's checkout, or set `ref` to a commit id"
    )]
    NoCommit(String),
    #[error("commit `{commit}` is not in `{remote}` even after a fetch; push it there first")]
    NotInRemote { commit: String, remote: String },
    #[error("another run held the mirror for longer than {}s; try the run again", .0.as_secs())]
    Busy(Duration),
    #[error(
        "the checkout tracks files of the mirror `{}` (they came with the repository), so it was not used; remove them from the repository (`git rm -r --cached {inside}`) and commit",
        path.display()
    )]
    Shipped { path: PathBuf, inside: String },
    #[error("the mirror `{}` is not usable: {reason}", path.display())]
    Dir { path: PathBuf, reason: String },
    #[error("{0}")]
    Git(String),
}

/// Check a claimed row's code before anything runs: its remote must be
/// the worker's fleet remote (`ours`, none when the worker's checkout has
/// no `origin`), its commit a full hex object id. A row without code (a
/// run queued by an older npc or by hand) passes.
pub fn check_code(code: Option<&RunCode>, ours: Option<&str>) -> Result<(), MirrorError> {
    let Some(code) = code else {
        return Ok(());
    };
    match ours {
        Some(ours) if ours == code.remote => {}
        Some(ours) => {
            return Err(MirrorError::OtherRemote {
                row: shown(&code.remote),
                ours: shown(ours),
            });
        }
        None => return Err(no_mirror(&code.remote)),
    }
    match &code.commit {
        Some(commit) if !workspace::is_object_id(commit) => {
            Err(MirrorError::BadCommit(shown(commit)))
        }
        _ => Ok(()),
    }
}

/// A run of `remote` met a process that keeps no mirror of it.
pub fn no_mirror(remote: &str) -> MirrorError {
    MirrorError::NoMirror(shown(remote))
}

/// Text of a row as an error quotes it: printable, at most
/// [`MAX_QUOTED_CHARS`] characters.
pub(crate) fn shown(text: &str) -> String {
    crate::stdx::term::printable(text)
        .chars()
        .take(MAX_QUOTED_CHARS)
        .collect()
}

/// A worker's mirror (see the module docs).
#[derive(Debug)]
pub struct Mirror {
    supervisor: Supervisor,
    /// The checkout the worker was started in.
    repo: PathBuf,
    /// Its state directory, which holds the mirror and the lock.
    state_dir: PathBuf,
    dir: PathBuf,
    remote: Remote,
    /// One run at a time in this process (then the `flock` among processes).
    turn: tokio::sync::Mutex<bool>,
}

/// A run's turn on the mirror: the mirror holds its commit; no other run
/// fetches or adds a worktree until it is dropped.
#[derive(Debug)]
pub struct Turn<'a> {
    _here: tokio::sync::MutexGuard<'a, bool>,
    _among: Flock<File>,
}

impl Mirror {
    /// The mirror of the checkout `repo` (state directory `state_dir`),
    /// when its `origin` names one; made on first use.
    pub async fn of(supervisor: Supervisor, repo: &Path, state_dir: &Path) -> Option<Self> {
        let remote = super::remote::origin_of(&supervisor, repo).await?;
        Some(Self {
            supervisor,
            repo: repo.to_path_buf(),
            state_dir: state_dir.to_path_buf(),
            dir: state_dir.join(MIRROR_DIR),
            remote,
            turn: tokio::sync::Mutex::new(false),
        })
    }

    /// The bare repository.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The remote it fetches from, without credentials.
    pub fn remote(&self) -> &str {
        &self.remote.shown
    }

    /// The remote it fetches from and pushes to.
    pub fn origin(&self) -> &Remote {
        &self.remote
    }

    /// The commit `code` starts from, checked (see [`check_code`]); a
    /// code without one names the ref its ingress could not resolve,
    /// `base_ref`.
    pub fn commit_of<'c>(&self, code: &'c RunCode, base_ref: &str) -> Result<&'c str, MirrorError> {
        check_code(Some(code), Some(self.remote()))?;
        code.commit
            .as_deref()
            .ok_or_else(|| MirrorError::NoCommit(shown(base_ref)))
    }

    /// Wait for this run's turn (at most [`MIRROR_WAIT`]), make the mirror
    /// if it is not there yet, and fetch until it holds `commit` (a full
    /// object id: [`check_code`]). Worktrees whose directories are gone
    /// are forgotten first.
    pub async fn hold(&self, commit: &str) -> Result<Turn<'_>, MirrorError> {
        if !workspace::is_object_id(commit) {
            return Err(MirrorError::BadCommit(shown(commit)));
        }
        let deadline = tokio::time::Instant::now() + MIRROR_WAIT;
        let mut made = tokio::time::timeout_at(deadline, self.turn.lock())
            .await
            .map_err(|_| MirrorError::Busy(MIRROR_WAIT))?;
        let among = self.lock_among(deadline).await?;
        self.check_untracked().await?;
        // A mirror npc did not make (one that came with a clone, or one an
        // agent's run wrote config or hooks into) is made again: nothing
        // of it is used.
        if let Some(reason) = self.foreign().await {
            tracing::warn!(
                "the mirror `{}` is not one npc made ({reason}); it is made again",
                self.dir.display()
            );
            self.discard()?;
            *made = false;
        }
        if !*made {
            self.make().await?;
            *made = true;
        }
        let git = |args: Vec<String>| async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            workspace::git_remote(&self.supervisor, &self.dir, &args)
                .await
                .map_err(|e| MirrorError::Git(self.remote.scrub(&e.to_string())))
        };
        let has = || async {
            let object = format!("{commit}^{{commit}}");
            workspace::git(
                &self.supervisor,
                &self.dir,
                &["cat-file", "-e", "--end-of-options", &object],
            )
            .await
            .is_ok()
        };
        if !has().await {
            let mut fetch: Vec<String> = ["-c", "gc.auto=0", "fetch", "--quiet", "--prune"]
                .map(String::from)
                .to_vec();
            fetch.push("--end-of-options".into());
            fetch.push(ORIGIN.into());
            fetch.extend(FETCH_REFSPECS.map(String::from));
            git(fetch).await?;
            if !has().await {
                // A commit no branch or tag holds (a pull request's head):
                // asked for by its id, which servers allow for reachable ones.
                let by_id = ["-c", "gc.auto=0", "fetch", "--quiet", "--end-of-options"]
                    .into_iter()
                    .chain([ORIGIN, commit])
                    .map(String::from)
                    .collect();
                let fetched = git(by_id).await;
                if fetched.is_err() || !has().await {
                    return Err(MirrorError::NotInRemote {
                        commit: commit.to_string(),
                        remote: self.remote().to_string(),
                    });
                }
            }
        }
        workspace::prune(&self.supervisor, &self.dir)
            .await
            .map_err(|e| MirrorError::Git(e.to_string()))?;
        Ok(Turn {
            _here: made,
            _among: among,
        })
    }

    /// The `flock` every worker sharing the state directory takes in turn,
    /// tried every [`LOCK_POLL`] until `deadline`.
    async fn lock_among(&self, deadline: tokio::time::Instant) -> Result<Flock<File>, MirrorError> {
        let path = self.state_dir.join(LOCK_FILE);
        let bad = |reason: String| MirrorError::Dir {
            path: path.clone(),
            reason,
        };
        let root = crate::repofs::Root::new(&self.repo).map_err(|e| bad(e.to_string()))?;
        root.ensure_state_dir(&self.state_dir)
            .map_err(|e| bad(e.to_string()))?;
        let mut file = root.open_private(&path).map_err(|e| bad(e.to_string()))?;
        loop {
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(lock) => return Ok(lock),
                Err((back, _)) => file = back,
            }
            if tokio::time::Instant::now() + LOCK_POLL > deadline {
                return Err(MirrorError::Busy(MIRROR_WAIT));
            }
            tokio::time::sleep(LOCK_POLL).await;
        }
    }

    /// Refuse a mirror the checkout tracks files of: it came with the
    /// repository, and what it holds (objects too) is not npc's. Refused,
    /// not made again: the files stay tracked, so it would be made again
    /// before every run.
    async fn check_untracked(&self) -> Result<(), MirrorError> {
        let Ok(inside) = self.dir.strip_prefix(&self.repo) else {
            return Ok(());
        };
        let inside = inside.display().to_string();
        let args = ["--literal-pathspecs", "ls-files", "-z", "--", &inside];
        let tracked = workspace::git(&self.supervisor, &self.repo, &args)
            .await
            .map_err(|e| MirrorError::Git(e.to_string()))?;
        if tracked.is_empty() {
            return Ok(());
        }
        Err(MirrorError::Shipped {
            path: self.dir.clone(),
            inside,
        })
    }

    /// Why the mirror's directory, when there, is not a mirror npc made: a file that
    /// makes git read elsewhere ([`MIRROR_FOREIGN_FILES`]), a config key
    /// npc does not write ([`MIRROR_CONFIG_KEYS`]), a hook. Its config is
    /// read by `git config --file --no-includes`, which runs nothing.
    async fn foreign(&self) -> Option<String> {
        let meta = std::fs::symlink_metadata(&self.dir).ok()?;
        if !meta.is_dir() {
            return Some("it is a link or a file".to_string());
        }
        if let Some(file) = MIRROR_FOREIGN_FILES
            .iter()
            .find(|f| std::fs::symlink_metadata(self.dir.join(f)).is_ok())
        {
            return Some(format!("it has `{file}`"));
        }
        let config = self.dir.join("config");
        if !std::fs::symlink_metadata(&config).is_ok_and(|m| m.is_file()) {
            return Some("its `config` is not a file".to_string());
        }
        let file = config.display().to_string();
        let args = ["config", "--file", &file, "--no-includes", "--list", "-z"];
        // Run in the checkout: git need not open the mirror as a repository.
        let listed = match workspace::git(&self.supervisor, &self.repo, &args).await {
            Ok(listed) => listed,
            Err(e) => return Some(format!("its config cannot be read: {e}")),
        };
        for entry in listed.split('\0').filter(|e| !e.is_empty()) {
            let (key, value) = entry.split_once('\n').unwrap_or((entry, ""));
            if !MIRROR_CONFIG_KEYS.contains(&key) {
                return Some(format!("its config sets `{}`", shown(key)));
            }
            if key == "core.bare" && value != "true" {
                return Some("it is not bare".to_string());
            }
        }
        let hooks = self.dir.join("hooks");
        match std::fs::symlink_metadata(&hooks) {
            Err(_) => None,
            Ok(meta) if !meta.is_dir() => Some("its `hooks` is not a directory".to_string()),
            Ok(_) => {
                let Ok(entries) = std::fs::read_dir(&hooks) else {
                    return Some("its `hooks` cannot be listed".to_string());
                };
                for (n, entry) in entries.enumerate() {
                    if n >= MAX_HOOK_ENTRIES {
                        return Some(format!("it has more than {MAX_HOOK_ENTRIES} hook files"));
                    }
                    let name = entry.map(|e| e.file_name().to_string_lossy().into_owned());
                    match name {
                        Ok(name) if name.ends_with(".sample") => {}
                        Ok(name) => return Some(format!("it has hook `{}`", shown(&name))),
                        Err(e) => return Some(format!("its `hooks` cannot be listed: {e}")),
                    }
                }
                None
            }
        }
    }

    /// Remove the mirror's directory (a link where it was is removed, never
    /// followed); worktrees made from it lose their repository.
    fn discard(&self) -> Result<(), MirrorError> {
        let bad = |reason: String| MirrorError::Dir {
            path: self.dir.clone(),
            reason,
        };
        let meta = std::fs::symlink_metadata(&self.dir).map_err(|e| bad(e.to_string()))?;
        let removed = if meta.is_dir() {
            std::fs::remove_dir_all(&self.dir)
        } else {
            std::fs::remove_file(&self.dir)
        };
        removed.map_err(|e| {
            bad(format!(
                "it is not one npc made, and cannot be removed: {e}"
            ))
        })
    }

    /// Make the bare repository (a real directory of the state directory,
    /// no link on the way; no template, so no hook) and point its `origin`
    /// at the checkout's.
    async fn make(&self) -> Result<(), MirrorError> {
        workspace::prepare_root(&self.repo, &self.dir).map_err(|e| MirrorError::Dir {
            path: self.dir.clone(),
            reason: e.to_string(),
        })?;
        let git = |args: &'static [&'static str]| async move {
            workspace::git(&self.supervisor, &self.dir, args).await
        };
        let failed = |e: WorkspaceError| MirrorError::Git(self.remote.scrub(&e.to_string()));
        git(&["init", "--quiet", "--bare", "--template="])
            .await
            .map_err(failed)?;
        let set = workspace::git(
            &self.supervisor,
            &self.dir,
            &[
                "config",
                "--end-of-options",
                "remote.origin.url",
                &self.remote.url,
            ],
        )
        .await;
        set.map_err(failed)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
