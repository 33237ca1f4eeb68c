//! A run's workspace: the repository's own checkout (`in_place`), or a git
//! worktree of its own (`worktree`) made for the run and handed back as a
//! branch. Seed 000 splits a run's places the same way: the repository root
//! keeps npc's state, the store and the memory tools; the tool working
//! directory is where the agent works.
//!
//! A worktree run: `git worktree add` of the run's base commit on a new
//! branch under the worktrees directory ([`Worktree::create`]; a fleet
//! worker's from its mirror at the commit the run's ingress recorded,
//! [`Start::Mirror`]), files
//! copied in from the main checkout ([`Worktree::copy_in`]), `setup`
//! commands ([`run_commands`]), then the action with the worktree
//! as its directory; afterwards what the action changed is committed on the
//! branch ([`Worktree::conclude`]: the run's id and trigger in the message,
//! npc's author, the repository's hooks not run), with a diff stat, and the
//! worktree is removed ([`Worktree::remove`]) or kept for inspection; with
//! `push = true` the branch goes to `origin` first ([`Worktree::push`]).
//! Every git command runs through the supervisor, bounded in time and
//! output, with hooks and the file system monitor off
//! ([`GIT_SAFE_CONFIG`]): nothing a repository, a mirror or an agent wrote
//! into git's config or hooks runs on npc's behalf. No ref or branch a
//! payload supplies reads as an option: each is checked first
//! ([`check_ref_name`]: no leading `-`, no `..`, `@{`, spaces or
//! controls), and refs git resolves on its own come after
//! `--end-of-options`; a run's branch names one branch and nothing else
//! ([`check_branch_name`]: not `@`, `HEAD`, `refs/heads/main`). A run's
//! branch is new on `origin` too: a push only ever creates it there.
//!
//! Architecture invariant: a worktree run never touches the main checkout:
//! not its files, its index or its current branch (`git worktree add`
//! writes only below `.git/` and the new directory).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use crate::supervisor::{ChildSpec, OutputLimits, Supervisor};

/// Directory of the state directory holding the worktrees of runs, unless
/// `[runs] worktrees_dir` names another.
pub const WORKTREES_DIR: &str = "worktrees";
/// The branch a worktree run commits to unless `branch` says otherwise.
pub const DEFAULT_BRANCH_TEMPLATE: &str = "npc/{{ run.id }}";
/// The commit a worktree starts from unless `ref` says otherwise.
pub const DEFAULT_REF: &str = "HEAD";
/// Who commits a run's changes unless `[runs] author` says otherwise.
pub const DEFAULT_AUTHOR: &str = "npc <npc@localhost>";
/// Longest one git command may take (a checkout of a large tree included).
pub const GIT_TIMEOUT: Duration = Duration::from_secs(300);
/// Most output kept of one git command.
pub const MAX_GIT_OUTPUT_BYTES: usize = 64 * 1024;
/// Most output kept of one `setup` or `after` command (the rest is dropped).
pub const MAX_COMMAND_OUTPUT_BYTES: usize = 64 * 1024;
/// Most of a run's patch `npc runs diff` prints.
pub const MAX_DIFF_BYTES: usize = 16 * 1024 * 1024;
/// Largest file `copy` brings into a worktree.
pub const MAX_COPY_BYTES: usize = 16 * 1024 * 1024;
pub use crate::model::refname::MAX_REF_BYTES;
/// The remote a run's branch is pushed to and a mirror fetches from.
pub const ORIGIN: &str = "origin";
/// What a git command that talks to a remote keeps of the environment
/// besides the supervisor's essentials: how to reach an ssh agent and
/// which ssh to run.
pub const REMOTE_ENV: [&str; 2] = ["SSH_AUTH_SOCK", "GIT_SSH_COMMAND"];
/// Configuration every git command npc runs gets on its command line
/// (`-c`, which outranks every config file and reaches the git commands
/// it starts): no hook and no file system monitor runs, whatever a
/// repository's, a mirror's or an agent's config or hooks directory says.
pub const GIT_SAFE_CONFIG: [(&str, &str); 2] =
    [("core.hooksPath", "/dev/null"), ("core.fsmonitor", "false")];

/// Why a workspace could not be made or concluded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkspaceError {
    #[error(
        "`{}` is not a git repository; a worktree run needs one (set `workspace = \"in_place\"`, or `git init` it)",
        .0.display()
    )]
    NotGit(PathBuf),
    #[error(
        "ref `{0}` names no commit in this repository; fetch it, or set `ref` to one that exists"
    )]
    NoSuchRef(String),
    #[error(
        "branch `{0}` exists already; a run's branch is new (set `branch` to a template with `{{{{ run.id }}}}`)"
    )]
    BranchExists(String),
    #[error(
        "branch `{0}` exists on `origin` already; a run's branch is new there too, so nothing was pushed (set `branch` to a template with `{{{{ run.id }}}}`, or delete the branch on `origin`)"
    )]
    BranchOnOrigin(String),
    #[error("`{name}` is not a valid {what}: {reason}")]
    BadName {
        what: &'static str,
        name: String,
        reason: String,
    },
    #[error("the worktrees directory `{}` is not usable: {reason}", path.display())]
    Dir { path: PathBuf, reason: String },
    #[error("cannot copy `{path}` into the worktree: {reason}")]
    Copy { path: String, reason: String },
    #[error("`git {command}` failed: {detail}")]
    Git { command: String, detail: String },
    #[error(
        "merging branch `{branch}` conflicts in {files}; resolve it in an earlier step, or merge fewer branches"
    )]
    MergeConflict { branch: String, files: String },
    #[error("`{command}` failed ({status}): {output}")]
    Command {
        command: String,
        status: String,
        output: String,
    },
}

pub use crate::event::{Pushed, RunResult};

impl RunResult {
    /// The result stored with run `row`, if it handed one back.
    pub fn of(row: &crate::store::queue::RunRow) -> Option<Self> {
        row.result
            .as_ref()
            .and_then(|r| serde_json::from_value(r.clone()).ok())
    }
}

/// Where the worktrees of runs are made: `[runs] worktrees_dir` below the
/// repository `repo`, else [`WORKTREES_DIR`] in the state directory.
pub fn worktrees_root(repo: &Path, state_dir: &Path, runs: &crate::model::RunsSettings) -> PathBuf {
    match &runs.worktrees_dir {
        Some(dir) => repo.join(dir),
        None => state_dir.join(WORKTREES_DIR),
    }
}

/// What a worktree's branch starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start<'a> {
    /// The ref as asked, resolved in the main checkout, which holds the
    /// branch.
    Checkout,
    /// `commit` (a full object id) of `git`, another repository that holds
    /// the branch: a fleet worker's mirror (`runs::mirror`).
    Mirror { git: &'a Path, commit: &'a str },
}

/// A git worktree made for one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Worktree {
    /// The main checkout.
    pub repo: PathBuf,
    /// The repository holding its branch: the main checkout, or a fleet
    /// worker's mirror.
    pub git: PathBuf,
    /// The worktree's directory.
    pub dir: PathBuf,
    pub branch: String,
    /// The commit it starts from.
    pub base: String,
    /// The base as asked for (`HEAD`, a branch, a sha).
    pub base_ref: String,
}

/// What concludes a run before `run.finished` is recorded: its worktree's
/// changes committed and measured; the result kept for the executor.
#[derive(Debug, Clone)]
pub struct Conclusion {
    worktree: Worktree,
    message: String,
    author: String,
    supervisor: Supervisor,
    result: std::sync::Arc<std::sync::Mutex<Option<Result<RunResult, String>>>>,
}

impl Conclusion {
    pub fn new(
        worktree: Worktree,
        message: String,
        author: String,
        supervisor: Supervisor,
    ) -> Self {
        Self {
            worktree,
            message,
            author,
            supervisor,
            result: Default::default(),
        }
    }

    /// Commit and measure; the fields `run.finished` carries (`result`, or
    /// `result_error`).
    pub async fn conclude(&self) -> crate::event::Concluded {
        let result = self
            .worktree
            .conclude(&self.supervisor, &self.message, &self.author)
            .await
            .map_err(|e| e.to_string());
        let fields = crate::event::Concluded {
            result: result.as_ref().ok().cloned(),
            result_error: result.as_ref().err().cloned(),
        };
        *crate::stdx::lock(&self.result) = Some(result);
        fields
    }

    /// The result [`Conclusion::conclude`] found, once.
    pub fn taken(&self) -> Option<Result<RunResult, String>> {
        crate::stdx::lock(&self.result).take()
    }
}

/// Merge the object `extra` into the object `payload`.
pub fn merge(payload: &mut serde_json::Value, extra: serde_json::Value) {
    if let (serde_json::Value::Object(p), serde_json::Value::Object(e)) = (payload, extra) {
        p.extend(e);
    }
}

/// Whether `repo` is the top of a git working tree (a `.git` directory, or
/// the `.git` file of a worktree or submodule). Read without running git.
pub fn is_git_repository(repo: &Path) -> bool {
    std::fs::symlink_metadata(repo.join(".git")).is_ok_and(|m| m.is_dir() || m.is_file())
}

/// Refuse a ref name that git would read as something else: an option, a
/// revision range, a name git's rules refuse
/// ([`crate::model::refname::ref_name_problem`]).
pub fn check_ref_name(what: &'static str, name: &str) -> Result<(), WorkspaceError> {
    match crate::model::refname::ref_name_problem(name) {
        Some(reason) => Err(bad_name(what, name, reason)),
        None => Ok(()),
    }
}

/// Refuse a run's branch name that is no ref npc hands to git or names
/// something besides one branch (`@`, `HEAD`, `refs/heads/main`, `tags/v1`:
/// [`crate::model::refname::branch_name_problem`]).
pub fn check_branch_name(name: &str) -> Result<(), WorkspaceError> {
    match crate::model::refname::branch_name_problem(name) {
        Some(reason) => Err(bad_name("branch name", name, reason)),
        None => Ok(()),
    }
}

/// A [`WorkspaceError::BadName`], the name printable and cut.
fn bad_name(what: &'static str, name: &str, reason: String) -> WorkspaceError {
    WorkspaceError::BadName {
        what,
        name: crate::stdx::term::printable(name)
            .chars()
            .take(80)
            .collect(),
        reason,
    }
}

/// Run `git ARGS` in `cwd` through the supervisor; its standard output
/// (trimmed) when it exits 0, else its error output.
pub async fn git(
    supervisor: &Supervisor,
    cwd: &Path,
    args: &[&str],
) -> Result<String, WorkspaceError> {
    git_output(supervisor, cwd, args, MAX_GIT_OUTPUT_BYTES)
        .await
        .map(|(out, _)| out.trim().to_string())
}

/// [`git`] keeping at most `limit` bytes of standard output, untrimmed,
/// and whether there was more.
pub async fn git_output(
    supervisor: &Supervisor,
    cwd: &Path,
    args: &[&str],
    limit: usize,
) -> Result<(String, bool), WorkspaceError> {
    git_with(supervisor, cwd, args, limit, BTreeMap::new()).await
}

/// [`git`] for a command that talks to a remote (fetch, push): it keeps
/// [`REMOTE_ENV`] of this process's environment.
pub async fn git_remote(
    supervisor: &Supervisor,
    cwd: &Path,
    args: &[&str],
) -> Result<String, WorkspaceError> {
    let env = REMOTE_ENV
        .iter()
        .filter_map(|name| Some((name.to_string(), std::env::var(name).ok()?)))
        .collect();
    git_with(supervisor, cwd, args, MAX_GIT_OUTPUT_BYTES, env)
        .await
        .map(|(out, _)| out.trim().to_string())
}

/// Merge `branches`, one after the other, into the commit `base` names,
/// without a worktree (`git merge-tree --write-tree`, then `commit-tree`
/// with npc as the author): the merged commit, or the first branch that
/// conflicts with the files it conflicts in. Nothing checked out changes.
pub async fn merge_branches(
    supervisor: &Supervisor,
    repo: &Path,
    base: &str,
    branches: &[String],
) -> Result<String, WorkspaceError> {
    let mut current = resolve_commit(supervisor, repo, base).await?;
    let author: BTreeMap<String, String> = [
        ("GIT_AUTHOR_NAME", "npc"),
        ("GIT_AUTHOR_EMAIL", "npc@localhost"),
        ("GIT_COMMITTER_NAME", "npc"),
        ("GIT_COMMITTER_EMAIL", "npc@localhost"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    for branch in branches {
        check_ref_name("branch", branch)?;
        let theirs = resolve_commit(supervisor, repo, branch).await?;
        let args = [
            "merge-tree",
            "--write-tree",
            "--name-only",
            "--no-messages",
            current.as_str(),
            theirs.as_str(),
        ];
        let (clean, out) = git_status(
            supervisor,
            repo,
            &args,
            MAX_GIT_OUTPUT_BYTES,
            BTreeMap::new(),
        )
        .await?;
        let mut lines = out.lines();
        let tree = lines.next().unwrap_or("").trim().to_string();
        if !clean {
            let files: Vec<String> = lines
                .take_while(|l| !l.is_empty())
                .take(MAX_CONFLICTS_NAMED)
                .map(|f| format!("`{}`", crate::stdx::term::printable(f)))
                .collect();
            return Err(WorkspaceError::MergeConflict {
                branch: branch.clone(),
                files: files.join(", "),
            });
        }
        if !is_object_id(&tree) {
            return Err(WorkspaceError::Git {
                command: "merge-tree".into(),
                detail: "it printed no tree".into(),
            });
        }
        let message = format!("npc: merge {branch}");
        let args = [
            "commit-tree",
            tree.as_str(),
            "-p",
            current.as_str(),
            "-p",
            theirs.as_str(),
            "-m",
            message.as_str(),
        ];
        let (out, _) = git_with(
            supervisor,
            repo,
            &args,
            MAX_GIT_OUTPUT_BYTES,
            author.clone(),
        )
        .await?;
        current = out.trim().to_string();
        if !is_object_id(&current) {
            return Err(WorkspaceError::Git {
                command: "commit-tree".into(),
                detail: "it printed no commit".into(),
            });
        }
    }
    Ok(current)
}

/// Files a merge conflict names at most.
pub const MAX_CONFLICTS_NAMED: usize = 20;

async fn git_with(
    supervisor: &Supervisor,
    cwd: &Path,
    args: &[&str],
    limit: usize,
    env: BTreeMap<String, String>,
) -> Result<(String, bool), WorkspaceError> {
    let (_, stdout, truncated) = git_checked(supervisor, cwd, args, limit, env, None).await?;
    Ok((stdout, truncated))
}

/// [`git_with`] where exit status 1 is an answer, not a failure (`git
/// merge-tree`: conflicts): whether it exited 0, and its output.
async fn git_status(
    supervisor: &Supervisor,
    cwd: &Path,
    args: &[&str],
    limit: usize,
    env: BTreeMap<String, String>,
) -> Result<(bool, String), WorkspaceError> {
    let (clean, stdout, _) = git_checked(supervisor, cwd, args, limit, env, Some(1)).await?;
    Ok((clean, stdout))
}

/// `git ARGS` in `cwd` with npc's safe configuration: whether it exited 0,
/// its output and whether that was cut. A non-zero exit is an error unless
/// it is `answer` (a command whose status is its answer).
async fn git_checked(
    supervisor: &Supervisor,
    cwd: &Path,
    args: &[&str],
    limit: usize,
    env: BTreeMap<String, String>,
    answer: Option<i32>,
) -> Result<(bool, String, bool), WorkspaceError> {
    let mut spec = ChildSpec::new("git", cwd);
    spec.env = env;
    spec.args = GIT_SAFE_CONFIG
        .iter()
        .flat_map(|(key, value)| ["-c".to_string(), format!("{key}={value}")])
        .chain(args.iter().map(|a| a.to_string()))
        .collect();
    // Parseable, never interactive, never paged.
    spec.env.insert("LC_ALL".into(), "C".into());
    spec.env.insert("GIT_TERMINAL_PROMPT".into(), "0".into());
    spec.env.insert("GIT_PAGER".into(), "cat".into());
    let limits = OutputLimits {
        stdout: limit,
        stderr: MAX_GIT_OUTPUT_BYTES,
    };
    let command = args.first().copied().unwrap_or("").to_string();
    let out = supervisor
        .run_once(&spec, None, GIT_TIMEOUT, limits)
        .await
        .map_err(|e| WorkspaceError::Git {
            command: command.clone(),
            detail: e.to_string(),
        })?;
    if out.timed_out {
        return Err(WorkspaceError::Git {
            command,
            detail: format!("it took longer than {}s", GIT_TIMEOUT.as_secs()),
        });
    }
    let clean = out.status.success();
    if !clean && (answer.is_none() || out.status.code != answer) {
        let text = String::from_utf8_lossy(&out.stderr);
        let detail = text.trim().lines().last().unwrap_or("").to_string();
        return Err(WorkspaceError::Git {
            command,
            detail: format!("{} ({})", crate::stdx::term::printable(&detail), out.status),
        });
    }
    Ok((
        clean,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        out.stdout_truncated,
    ))
}

/// `git ARGS` in `dir` as a user runs it, hooks and all (none of
/// [`GIT_SAFE_CONFIG`]), which must succeed; its standard output, trimmed.
/// What the tests prove hooks live with.
#[cfg(test)]
pub(crate) async fn git_as_user(supervisor: &Supervisor, dir: &Path, args: &[&str]) -> String {
    let spec = ChildSpec::new("git", dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@localhost"])
        .args(args.iter().copied());
    let limits = OutputLimits {
        stdout: MAX_GIT_OUTPUT_BYTES,
        stderr: MAX_GIT_OUTPUT_BYTES,
    };
    let out = supervisor
        .run_once(&spec, None, GIT_TIMEOUT, limits)
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Held around `git worktree add` (see [`Worktree::create`]); a daemon
/// makes the worktrees of one repository, so one lock per process is one
/// per repository.
static WORKTREE_ADD: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

impl Worktree {
    /// Make the worktree of run `run_id`: `base_ref` resolved to a commit
    /// (or the commit `start` names), branch `branch` (new) checked out at
    /// it in `root/run_id`. `root` must be a real directory (no link)
    /// inside the repository.
    pub async fn create(
        supervisor: &Supervisor,
        repo: &Path,
        root: &Path,
        run_id: &str,
        base_ref: &str,
        branch: &str,
        start: Start<'_>,
    ) -> Result<Self, WorkspaceError> {
        let (git_dir, from) = match start {
            Start::Checkout => (repo, base_ref),
            Start::Mirror { git, commit } => (git, commit),
        };
        if !is_git_repository(repo) {
            return Err(WorkspaceError::NotGit(repo.to_path_buf()));
        }
        // The directory is named after the run: only an id npc makes (a
        // row of the store, a file in the repository, could name `../x`).
        if !is_run_id(run_id) {
            return Err(bad_name(
                "run id",
                run_id,
                "it is not one npc makes (`run-` and lowercase letters, digits and `-`)"
                    .to_string(),
            ));
        }
        check_ref_name("ref", base_ref)?;
        check_ref_name("ref", from)?;
        check_branch_name(branch)?;
        prepare_root(repo, root)?;
        let dir = root.join(run_id);
        let shown = dir.display().to_string();
        // The common case in one git command; the checks that name what
        // was wrong run only when it fails.
        let commit = format!("{from}^{{commit}}");
        // One `worktree add` at a time: git's worktree bookkeeping is not
        // safe against itself, and of four runs started at once one could
        // fail after its branch was made ("exists already").
        let added = {
            let _one = WORKTREE_ADD.lock().await;
            git(
                supervisor,
                git_dir,
                &["worktree", "add", "--quiet", "-b", branch, &shown, &commit],
            )
            .await
        };
        if let Err(failed) = added {
            return Err(Self::why_not(supervisor, git_dir, from, branch, failed).await);
        }
        let base = git(supervisor, &dir, &["rev-parse", "HEAD"]).await?;
        Ok(Self {
            repo: repo.to_path_buf(),
            git: git_dir.to_path_buf(),
            dir,
            branch: branch.to_string(),
            base,
            base_ref: base_ref.to_string(),
        })
    }

    /// Why `git worktree add` refused: the ref names no commit, the branch
    /// exists or is no valid name, or git's own words.
    async fn why_not(
        supervisor: &Supervisor,
        repo: &Path,
        base_ref: &str,
        branch: &str,
        failed: WorkspaceError,
    ) -> WorkspaceError {
        let verify =
            |name: String| async move { verified(supervisor, repo, &name).await.is_some() };
        if !verify(format!("{base_ref}^{{commit}}")).await {
            return WorkspaceError::NoSuchRef(base_ref.to_string());
        }
        if verify(format!("refs/heads/{branch}")).await {
            return WorkspaceError::BranchExists(branch.to_string());
        }
        if git(supervisor, repo, &["check-ref-format", "--branch", branch])
            .await
            .is_err()
        {
            return WorkspaceError::BadName {
                what: "branch name",
                name: branch.to_string(),
                reason: "git's rules refuse it (`git check-ref-format --branch`)".to_string(),
            };
        }
        failed
    }

    /// Copy `paths` (relative, regular files inside the main checkout, no
    /// link followed) into the worktree at the same places.
    pub fn copy_in(&self, paths: &[String]) -> Result<(), WorkspaceError> {
        let failed = |path: &str, reason: String| WorkspaceError::Copy {
            path: path.to_string(),
            reason,
        };
        let from = crate::repofs::Root::new(&self.repo).map_err(|e| failed("", e.to_string()))?;
        let to = crate::repofs::Root::new(&self.dir).map_err(|e| failed("", e.to_string()))?;
        for path in paths {
            let bytes = from
                .read_with(
                    &self.repo.join(path),
                    MAX_COPY_BYTES,
                    crate::repofs::Links::Refuse,
                )
                .map_err(|e| failed(path, e.to_string()))?;
            to.write(
                &self.dir.join(path),
                &bytes,
                crate::repofs::WriteOptions {
                    links: crate::repofs::Links::Refuse,
                    perms: crate::repofs::Perms::Shared,
                },
            )
            .map_err(|e| failed(path, e.to_string()))?;
        }
        Ok(())
    }

    /// The environment a worktree run's processes get besides their own.
    pub fn env(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            ("NPC_WORKTREE".to_string(), self.dir.display().to_string()),
            ("NPC_REPO_ROOT".to_string(), self.repo.display().to_string()),
            ("NPC_BASE_REF".to_string(), self.base_ref.clone()),
        ])
    }

    /// Commit what the run changed on its branch (unless nothing did), and
    /// measure the branch against its base.
    pub async fn conclude(
        &self,
        supervisor: &Supervisor,
        message: &str,
        author: &str,
    ) -> Result<RunResult, WorkspaceError> {
        let (name, email) = split_author(author);
        git(supervisor, &self.dir, &["add", "--all"]).await?;
        let committed = git(
            supervisor,
            &self.dir,
            &[
                "-c",
                &format!("user.name={name}"),
                "-c",
                &format!("user.email={email}"),
                "commit",
                "--quiet",
                "--no-verify",
                "--no-gpg-sign",
                "-m",
                message,
            ],
        )
        .await;
        // A commit fails when nothing is staged (the action changed nothing,
        // or committed itself); any other failure is the run's.
        let staged = match committed {
            Ok(_) => true,
            Err(e) => {
                let nothing = git(supervisor, &self.dir, &["diff", "--cached", "--quiet"])
                    .await
                    .is_ok();
                if !nothing {
                    return Err(e);
                }
                false
            }
        };
        let head = git(supervisor, &self.dir, &["rev-parse", "HEAD"]).await?;
        let stat = git(
            supervisor,
            &self.dir,
            &[
                "diff",
                "--no-ext-diff",
                "--no-textconv",
                "--shortstat",
                &self.base,
                &head,
            ],
        )
        .await?;
        let (files, insertions, deletions) = parse_shortstat(&stat);
        Ok(RunResult {
            branch: self.branch.clone(),
            base: self.base.clone(),
            head,
            committed: staged,
            files,
            insertions,
            deletions,
            push: None,
            unchanged: files == 0,
        })
    }

    /// Remove the worktree (its branch stays).
    pub async fn remove(&self, supervisor: &Supervisor) -> Result<(), WorkspaceError> {
        remove_dir(supervisor, &self.git, &self.dir).await
    }

    /// Push the branch to `origin` of the repository holding it, under the
    /// same name, only ever creating it there: the push's lease expects the
    /// branch absent on `origin` (`--force-with-lease=refs/heads/B:`), so a
    /// branch origin has already (another run's, `main`) is never moved,
    /// not even fast-forwarded ([`WorkspaceError::BranchOnOrigin`]).
    pub async fn push(&self, supervisor: &Supervisor) -> Result<(), WorkspaceError> {
        check_branch_name(&self.branch)?;
        let full = format!("refs/heads/{}", self.branch);
        let refspec = format!("{full}:{full}");
        let lease = format!("--force-with-lease={full}:");
        let args = [
            "push",
            "--quiet",
            "--no-verify",
            &lease,
            "--end-of-options",
            ORIGIN,
            &refspec,
        ];
        let pushed = git_remote(supervisor, &self.dir, &args).await;
        match pushed {
            Ok(_) => Ok(()),
            Err(failed) => match on_origin(supervisor, &self.git, &self.branch).await {
                Ok(true) => Err(WorkspaceError::BranchOnOrigin(self.branch.clone())),
                _ => Err(failed),
            },
        }
    }
}

/// Refuse branch `branch` for a run that pushes when `origin` of `git` (the
/// checkout, or a worker's mirror) has it already
/// ([`WorkspaceError::BranchOnOrigin`]): asked before the run does its work.
/// When `origin` cannot be asked the run goes on; its push's lease refuses
/// the branch then.
pub async fn check_new_on_origin(
    supervisor: &Supervisor,
    git: &Path,
    branch: &str,
) -> Result<(), WorkspaceError> {
    check_branch_name(branch)?;
    match on_origin(supervisor, git, branch).await {
        Ok(true) => Err(WorkspaceError::BranchOnOrigin(branch.to_string())),
        Ok(false) => Ok(()),
        Err(e) => {
            tracing::warn!("cannot ask `origin` whether it has branch `{branch}`: {e}");
            Ok(())
        }
    }
}

/// Whether `origin` of `git` has branch `branch` (`git ls-remote`; the
/// name checked by the caller).
async fn on_origin(
    supervisor: &Supervisor,
    git: &Path,
    branch: &str,
) -> Result<bool, WorkspaceError> {
    let full = format!("refs/heads/{branch}");
    let args = ["ls-remote", "--heads", "--end-of-options", ORIGIN, &full];
    let listed = git_remote(supervisor, git, &args).await?;
    Ok(listed
        .lines()
        .any(|line| line.split('\t').nth(1) == Some(full.as_str())))
}

/// Whether `id` is a full git object id: 40 (SHA-1) or 64 (SHA-256)
/// lowercase hex digits. The only form of a commit a fleet's row may name.
pub fn is_object_id(id: &str) -> bool {
    matches!(id.len(), 40 | 64) && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The commit `base_ref` names in `repo`, as a full object id: a full id
/// as it is (lowercased; the repository need not have it), anything else
/// resolved by git.
pub async fn resolve_commit(
    supervisor: &Supervisor,
    repo: &Path,
    base_ref: &str,
) -> Result<String, WorkspaceError> {
    let lower = base_ref.to_ascii_lowercase();
    if is_object_id(&lower) {
        return Ok(lower);
    }
    check_ref_name("ref", base_ref)?;
    verified(supervisor, repo, &format!("{base_ref}^{{commit}}"))
        .await
        .filter(|id| is_object_id(id))
        .ok_or_else(|| WorkspaceError::NoSuchRef(base_ref.to_string()))
}

/// The object `name` (a revision, after `--end-of-options`) names in
/// `repo`, if any.
async fn verified(supervisor: &Supervisor, repo: &Path, name: &str) -> Option<String> {
    let args = ["rev-parse", "--verify", "--quiet", "--end-of-options", name];
    git(supervisor, repo, &args).await.ok()
}

/// The patch of `result`: `git diff BASE HEAD` in `repo`, at most
/// [`MAX_DIFF_BYTES`] of it, and whether it was cut. Both commits are
/// checked to be hex object names first (a result is read from the store,
/// a file in the repository).
pub async fn patch(
    supervisor: &Supervisor,
    repo: &Path,
    result: &RunResult,
) -> Result<(String, bool), WorkspaceError> {
    for sha in [&result.base, &result.head] {
        if !(7..=64).contains(&sha.len()) || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad_name(
                "commit",
                sha,
                "it is not a hex object name".to_string(),
            ));
        }
    }
    git_output(
        supervisor,
        repo,
        &[
            "diff",
            "--no-ext-diff",
            "--no-textconv",
            &result.base,
            &result.head,
            "--",
        ],
        MAX_DIFF_BYTES,
    )
    .await
}

/// Remove the worktree at `dir` of `repo` (its branch stays), and forget it
/// in git's list even when the directory is gone already.
pub async fn remove_dir(
    supervisor: &Supervisor,
    repo: &Path,
    dir: &Path,
) -> Result<(), WorkspaceError> {
    let shown = dir.display().to_string();
    let removed = git(
        supervisor,
        repo,
        &["worktree", "remove", "--force", "--force", &shown],
    )
    .await;
    if removed.is_ok() {
        return Ok(());
    }
    if dir.exists() {
        // Not a worktree git knows (a half-made one): only ours to delete
        // when it lies where npc puts worktrees, which the caller checked.
        std::fs::remove_dir_all(dir).map_err(|e| WorkspaceError::Dir {
            path: dir.to_path_buf(),
            reason: e.to_string(),
        })?;
    }
    prune(supervisor, repo).await
}

/// `git worktree prune`: forget worktrees whose directories are gone.
pub async fn prune(supervisor: &Supervisor, repo: &Path) -> Result<(), WorkspaceError> {
    if !is_git_repository(repo) {
        return Ok(());
    }
    git(supervisor, repo, &["worktree", "prune"])
        .await
        .map(drop)
}

/// Make sure `root` is a real directory inside `repo`: created (private)
/// when missing, a link anywhere on the way refused.
pub(super) fn prepare_root(repo: &Path, root: &Path) -> Result<(), WorkspaceError> {
    let bad = |reason: String| WorkspaceError::Dir {
        path: root.to_path_buf(),
        reason,
    };
    let fs = crate::repofs::Root::new(repo).map_err(|e| bad(e.to_string()))?;
    if let Ok(meta) = std::fs::symlink_metadata(root)
        && !meta.is_dir()
    {
        return Err(bad("it is a link or a file, not a directory".to_string()));
    }
    let real = fs
        .create_dir_all(root, crate::repofs::Perms::Private)
        .map_err(|e| bad(e.to_string()))?;
    if real != root {
        return Err(bad(format!("it resolves to `{}`", real.display())));
    }
    // Out of the main checkout's `git status` wherever it lies (the state
    // directory keeps one too).
    fs.write_new(
        &root.join(crate::repofs::GITIGNORE_FILE),
        crate::repofs::GITIGNORE_TEXT.as_bytes(),
    )
    .map_err(|e| bad(e.to_string()))?;
    Ok(())
}

/// One `setup` or `after` command's outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CommandOutcome {
    pub command: String,
    pub ok: bool,
    /// `exit code N`, `signal N`, or `timed out`.
    pub status: String,
    /// The command's output (stdout then stderr), at most
    /// [`MAX_COMMAND_OUTPUT_BYTES`] of each.
    pub output: String,
}

/// Run `commands` in order, each as `sh -c COMMAND` in `dir` with `env`,
/// until one fails; all of them together within `timeout`. Every outcome
/// is returned (the failed one last).
pub async fn run_commands(
    supervisor: &Supervisor,
    dir: &Path,
    commands: &[String],
    env: &BTreeMap<String, String>,
    timeout: Duration,
    sandbox: Option<&crate::supervisor::SandboxSpec>,
) -> Vec<CommandOutcome> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut outcomes = Vec::new();
    for command in commands {
        let mut spec = ChildSpec::new("sh", dir);
        spec.args = vec!["-c".to_string(), command.clone()];
        spec.env = env.clone();
        spec.sandbox = sandbox.cloned();
        let limits = OutputLimits {
            stdout: MAX_COMMAND_OUTPUT_BYTES,
            stderr: MAX_COMMAND_OUTPUT_BYTES,
        };
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let outcome = match supervisor.run_once(&spec, None, left, limits).await {
            Ok(out) => {
                let mut output = String::from_utf8_lossy(&out.stdout).into_owned();
                output.push_str(&String::from_utf8_lossy(&out.stderr));
                CommandOutcome {
                    command: command.clone(),
                    ok: out.status.success() && !out.timed_out,
                    status: if out.timed_out {
                        "timed out".to_string()
                    } else {
                        out.status.to_string()
                    },
                    output,
                }
            }
            Err(e) => CommandOutcome {
                command: command.clone(),
                ok: false,
                status: "not started".to_string(),
                output: e.to_string(),
            },
        };
        let ok = outcome.ok;
        outcomes.push(outcome);
        if !ok {
            break;
        }
    }
    outcomes
}

/// The context of a run's one-line templates (`ref`, `branch`,
/// `concurrency_key`): `trigger` is the firing's payload as prompts see it,
/// `payload` the request's own JSON (a webhook's body, a manual firing's
/// `--payload`), `run.id` the run's id (none before it has one). Lookups
/// into payloads are lenient, as in prompts.
pub fn line_context(payload: &serde_json::Value, run_id: Option<&str>) -> minijinja::Value {
    let request = crate::model::template::request_payload(payload);
    minijinja::context! {
        trigger => crate::render::lenient::lenient(payload.clone()),
        payload => crate::render::lenient::lenient(request),
        run => minijinja::context! { id => run_id },
    }
}

/// Which kept worktrees [`clean`] removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeepPolicy {
    /// A failed run's worktree older than this goes.
    pub keep_failed: Duration,
    /// Past this many, the oldest go.
    pub max_kept: usize,
    /// Every kept worktree goes (`npc runs clean --all`).
    pub all: bool,
}

impl KeepPolicy {
    /// `[runs]`'s policy (`all`: every kept worktree now).
    pub fn of(runs: &crate::model::RunsSettings, all: bool) -> Self {
        Self {
            keep_failed: Duration::from_secs(runs.keep_failed_secs),
            max_kept: runs.max_kept_worktrees,
            all,
        }
    }
}

/// Whether `id` is a run id npc made (`run-` and lowercase letters, digits
/// and `-`): the only names [`clean`] joins to the worktrees directory.
pub fn is_run_id(id: &str) -> bool {
    id.strip_prefix(crate::runs::RUN_ID_PREFIX)
        .is_some_and(|rest| {
            !rest.is_empty()
                && rest.len() <= 64
                && rest
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
}

/// Remove the kept worktrees of finished runs that `policy` lets go: a
/// worktree is only ever `root/RUN_ID` (a path the store names is never
/// trusted: the store is a file in the repository), a running or queued
/// run's never. Then `git worktree prune`. Returns the runs whose worktree
/// this call removed (not those whose directory was gone already).
pub async fn clean(
    store: &std::sync::Arc<crate::store::Store>,
    supervisor: &Supervisor,
    repo: &Path,
    root: &Path,
    policy: KeepPolicy,
) -> Result<Vec<String>, WorkspaceError> {
    // Nothing is removed through a link: the directory (and every one
    // above it) must be itself, else its runs' worktrees are left alone.
    match root.canonicalize() {
        Ok(real) if real == root => {}
        Ok(real) => {
            return Err(WorkspaceError::Dir {
                path: root.to_path_buf(),
                reason: format!("it resolves to `{}`; nothing was removed", real.display()),
            });
        }
        // No worktree was ever made.
        Err(_) => return Ok(Vec::new()),
    }
    let reader = store.clone();
    let kept = tokio::task::spawn_blocking(move || reader.kept_worktrees())
        .await
        .map_err(|e| WorkspaceError::Dir {
            path: root.to_path_buf(),
            reason: e.to_string(),
        })?
        .map_err(|e| WorkspaceError::Dir {
            path: root.to_path_buf(),
            reason: e.to_string(),
        })?;
    let now = chrono::Utc::now().timestamp_millis();
    let keep_ms = i64::try_from(policy.keep_failed.as_millis()).unwrap_or(i64::MAX);
    let mut removed = Vec::new();
    // Newest first: the first `max_kept` young ones stay.
    for (n, (id, finished_at_ms)) in kept.into_iter().enumerate() {
        let old = finished_at_ms.is_none_or(|at| now.saturating_sub(at) > keep_ms);
        if !(policy.all || old || n >= policy.max_kept) || !is_run_id(&id) {
            continue;
        }
        let dir = root.join(&id);
        // Only what is there is removed, and only that is reported; a run
        // whose directory went otherwise is just forgotten (and `prune`d).
        let there = match std::fs::symlink_metadata(&dir) {
            // A link or a file where a worktree was: never followed, and
            // no worktree.
            Ok(meta) if !meta.is_dir() => {
                let _ = std::fs::remove_file(&dir);
                false
            }
            Ok(_) => {
                remove_dir(supervisor, repo, &dir).await?;
                true
            }
            Err(_) => false,
        };
        if let Err(e) = store.set_run_worktree(&id, None).await {
            tracing::warn!("cannot record the removed worktree of `{id}`: {e}");
        }
        if there {
            removed.push(id);
        }
    }
    prune(supervisor, repo).await?;
    Ok(removed)
}

/// `Name <email>` → (`Name`, `email`); a bare name gets npc's address.
pub fn split_author(author: &str) -> (String, String) {
    match author.split_once('<') {
        Some((name, rest)) => (
            name.trim().to_string(),
            rest.trim_end().trim_end_matches('>').trim().to_string(),
        ),
        None => (author.trim().to_string(), "npc@localhost".to_string()),
    }
}

/// `3 files changed, 10 insertions(+), 2 deletions(-)` → (3, 10, 2).
pub fn parse_shortstat(line: &str) -> (u64, u64, u64) {
    let mut counts = (0, 0, 0);
    for part in line.split(',') {
        let mut words = part.split_whitespace();
        let (Some(n), Some(word)) = (words.next(), words.next()) else {
            continue;
        };
        let Ok(n) = n.parse::<u64>() else { continue };
        if word.starts_with("file") {
            counts.0 = n;
        } else if word.starts_with("insertion") {
            counts.1 = n;
        } else if word.starts_with("deletion") {
            counts.2 = n;
        }
    }
    counts
}

#[cfg(test)]
mod tests;
