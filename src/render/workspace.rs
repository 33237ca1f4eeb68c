//! The workspace snapshot: what an agent is told about where it works (the
//! repository root, the git branch, the MCP servers and tools its profile
//! may use). It is captured ONCE, when a run's [`RenderContext`] is built,
//! and every `<workspace-context>` block is rendered then, so the block is
//! byte-identical for the whole run whatever happens on disk meanwhile:
//! provider prompt caches key on those bytes.
//!
//! The branch comes from reading `.git/HEAD` directly (no git subprocess).
//!
//! [`RenderContext`]: super::RenderContext

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::model::{Manifest, McpTransport};

/// Opening line of the block.
pub const BLOCK_OPEN: &str = "<workspace-context>";
/// Closing line of the block.
pub const BLOCK_CLOSE: &str = "</workspace-context>";
/// Largest `.git/HEAD` (or `.git` file) read; real ones are under 100 bytes.
pub const MAX_GIT_FILE_BYTES: u64 = 4096;
/// Most ancestor directories searched for `.git`.
pub const MAX_GIT_SEARCH_DEPTH: usize = 64;
/// Hex digits of a detached commit shown in the block.
pub const SHORT_COMMIT_LEN: usize = 12;

/// Where `HEAD` points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GitHead {
    /// On a branch (`ref: refs/heads/NAME`).
    Branch { name: String },
    /// Detached at a commit.
    Detached { commit: String },
    /// No repository found, or `HEAD` could not be read or understood.
    Unknown,
}

impl GitHead {
    /// Read `HEAD` of the repository containing `dir`.
    pub fn read(dir: &Path) -> Self {
        let Some(git_dir) = find_git_dir(dir) else {
            return Self::Unknown;
        };
        match read_small(&git_dir.join("HEAD")) {
            Some(text) => Self::parse(&text),
            None => Self::Unknown,
        }
    }

    /// Parse the text of a `HEAD` file.
    pub fn parse(text: &str) -> Self {
        let text = text.trim();
        if let Some(target) = text.strip_prefix("ref:") {
            let target = target.trim();
            let name = target.strip_prefix("refs/heads/").unwrap_or(target);
            if name.is_empty() || name.chars().any(char::is_control) {
                return Self::Unknown;
            }
            return Self::Branch {
                name: name.to_string(),
            };
        }
        if text.len() >= SHORT_COMMIT_LEN && text.chars().all(|c| c.is_ascii_hexdigit()) {
            return Self::Detached {
                commit: text.to_string(),
            };
        }
        Self::Unknown
    }

    /// The branch name, if on one.
    pub fn branch(&self) -> Option<&str> {
        match self {
            Self::Branch { name } => Some(name),
            _ => None,
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::Branch { name } => name.clone(),
            Self::Detached { commit } => {
                format!(
                    "detached at {}",
                    &commit[..SHORT_COMMIT_LEN.min(commit.len())]
                )
            }
            Self::Unknown => "unknown".to_string(),
        }
    }
}

/// The git directory for `dir`: `.git` in it or an ancestor, following a
/// `.git` file (`gitdir: PATH`, as worktrees and submodules have). A git
/// directory may lie outside the repository (worktrees, submodules, a
/// checkout below the git root), but only one that looks like git's own
/// (its real path has a component named `.git` or ending in `.git`) is
/// read, so a `.git` file or link cannot point npc at an arbitrary file.
fn find_git_dir(dir: &Path) -> Option<PathBuf> {
    for ancestor in dir.ancestors().take(MAX_GIT_SEARCH_DEPTH) {
        let dot_git = ancestor.join(".git");
        let found = if dot_git.is_dir() {
            dot_git
        } else if dot_git.is_file() {
            let text = read_small(&dot_git)?;
            let target = text.trim().strip_prefix("gitdir:")?.trim();
            ancestor.join(target)
        } else {
            continue;
        };
        let real = found.canonicalize().ok()?;
        let gitlike = real.components().any(|c| {
            c.as_os_str()
                .to_str()
                .is_some_and(|s| s == ".git" || s.ends_with(".git"))
        });
        return gitlike.then_some(real);
    }
    None
}

/// A small git file: a regular file only (a FIFO never blocks), at most
/// [`MAX_GIT_FILE_BYTES`].
fn read_small(path: &Path) -> Option<String> {
    let bytes = crate::repofs::read_file(path, MAX_GIT_FILE_BYTES as usize).ok()?;
    String::from_utf8(bytes).ok()
}

/// One MCP server as the block describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ServerLine {
    name: String,
    transport: &'static str,
    enabled_tools: Option<Vec<String>>,
    disabled_tools: Vec<String>,
}

/// Everything the workspace block says, captured once.
#[derive(Debug, Clone)]
pub struct WorkspaceSnapshot {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    root: PathBuf,
    head: GitHead,
    /// The block for each profile, rendered at capture.
    profile_blocks: BTreeMap<String, String>,
    /// The block when no profile is involved (every enabled server).
    general_block: String,
}

impl WorkspaceSnapshot {
    /// Capture the workspace at `root` (the manifest's directory) for
    /// `manifest`: read `HEAD` once and render every block now.
    pub fn capture(root: &Path, manifest: &Manifest) -> Self {
        Self::with_head(root, GitHead::read(root), manifest)
    }

    /// Like [`capture`](Self::capture) with a known `HEAD`.
    pub fn with_head(root: &Path, head: GitHead, manifest: &Manifest) -> Self {
        let servers: BTreeMap<&str, ServerLine> = manifest
            .mcp_servers
            .iter()
            .filter(|(_, s)| s.enabled)
            .map(|(name, s)| {
                let line = ServerLine {
                    name: name.clone(),
                    transport: match s.transport {
                        McpTransport::Stdio(_) => "stdio",
                        McpTransport::Http { .. } => "http",
                    },
                    enabled_tools: s.enabled_tools.clone(),
                    disabled_tools: s.disabled_tools.clone(),
                };
                (name.as_str(), line)
            })
            .collect();
        let header = header(root, &head);
        let general_block = block(&header, servers.values(), &[], &[]);
        let profile_blocks = manifest
            .profiles
            .iter()
            .map(|(name, p)| {
                let lines = p.mcp_servers.iter().filter_map(|s| servers.get(s.as_str()));
                let text = block(&header, lines, &p.allowed_tools, &p.denied_tools);
                (name.clone(), text)
            })
            .collect();
        Self {
            inner: Arc::new(Inner {
                root: root.to_path_buf(),
                head,
                profile_blocks,
                general_block,
            }),
        }
    }

    pub fn root(&self) -> &Path {
        &self.inner.root
    }

    pub fn head(&self) -> &GitHead {
        &self.inner.head
    }

    /// The `<workspace-context>` block for `profile` (or for no profile:
    /// every enabled server). The same bytes every time.
    pub fn block(&self, profile: Option<&str>) -> &str {
        profile
            .and_then(|p| self.inner.profile_blocks.get(p))
            .unwrap_or(&self.inner.general_block)
    }

    /// The template value `workspace`: prints as the block, and has
    /// `root`, `branch` (none when detached or unknown), `head` and `block`.
    /// The flag turns true once the template prints the block.
    pub(crate) fn value(&self, profile: Option<&str>) -> (minijinja::Value, Arc<AtomicBool>) {
        let printed = Arc::new(AtomicBool::new(false));
        let value = minijinja::Value::from_object(WorkspaceValue {
            snapshot: self.clone(),
            block: self.block(profile).to_string(),
            printed: printed.clone(),
        });
        (value, printed)
    }
}

fn header(root: &Path, head: &GitHead) -> String {
    format!(
        "repository: {}\nbranch: {}\n",
        one_line(&root.display().to_string()),
        one_line(&head.describe())
    )
}

fn block<'a>(
    header: &str,
    servers: impl Iterator<Item = &'a ServerLine>,
    allowed: &[String],
    denied: &[String],
) -> String {
    let mut out = String::new();
    out.push_str(BLOCK_OPEN);
    out.push('\n');
    out.push_str(header);
    let mut any = false;
    for s in servers {
        if !any {
            out.push_str("mcp servers:\n");
            any = true;
        }
        let tools = match &s.enabled_tools {
            None => "all tools".to_string(),
            Some(t) => format!("tools {}", list(t)),
        };
        let _ = write!(out, "- {} ({}): {tools}", one_line(&s.name), s.transport);
        if !s.disabled_tools.is_empty() {
            let _ = write!(out, "; not {}", list(&s.disabled_tools));
        }
        out.push('\n');
    }
    if !any {
        out.push_str("mcp servers: none\n");
    }
    if !allowed.is_empty() {
        let _ = writeln!(out, "allowed tools: {}", list(allowed));
    }
    if !denied.is_empty() {
        let _ = writeln!(out, "denied tools: {}", list(denied));
    }
    out.push_str(BLOCK_CLOSE);
    out.push('\n');
    out
}

fn list(items: &[String]) -> String {
    items
        .iter()
        .map(|s| one_line(s))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `s` with control characters escaped, so every value stays on its line.
fn one_line(s: &str) -> String {
    if !s.chars().any(char::is_control) {
        return s.to_string();
    }
    s.chars()
        .flat_map(|c| {
            if c.is_control() {
                c.escape_default().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect()
}

/// The `workspace` template value.
#[derive(Debug)]
struct WorkspaceValue {
    snapshot: WorkspaceSnapshot,
    block: String,
    /// Set when the block is printed (or read as `workspace.block`).
    printed: Arc<AtomicBool>,
}

impl minijinja::value::Object for WorkspaceValue {
    fn get_value(self: &Arc<Self>, key: &minijinja::Value) -> Option<minijinja::Value> {
        let s = &self.snapshot;
        Some(match key.as_str()? {
            "root" => minijinja::Value::from(s.root().display().to_string()),
            "branch" => s
                .head()
                .branch()
                .map_or(minijinja::Value::from(()), minijinja::Value::from),
            "head" => minijinja::Value::from(s.head().describe()),
            "block" => {
                self.printed.store(true, Ordering::Relaxed);
                minijinja::Value::from(self.block.as_str())
            }
            _ => return None,
        })
    }

    fn enumerate(self: &Arc<Self>) -> minijinja::value::Enumerator {
        minijinja::value::Enumerator::Str(&["root", "branch", "head", "block"])
    }

    fn render(self: &Arc<Self>, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.printed.store(true, Ordering::Relaxed);
        f.write_str(&self.block)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_head() {
        assert_eq!(
            GitHead::parse("ref: refs/heads/feature/x\n"),
            GitHead::Branch {
                name: "feature/x".into()
            }
        );
        let sha = "0123456789abcdef0123456789abcdef01234567";
        assert_eq!(
            GitHead::parse(sha),
            GitHead::Detached { commit: sha.into() }
        );
        assert_eq!(GitHead::parse("garbage"), GitHead::Unknown);
        assert_eq!(GitHead::parse("ref: "), GitHead::Unknown);
        assert_eq!(GitHead::parse(""), GitHead::Unknown);
        assert_eq!(GitHead::parse("ref: refs/heads/a\u{0}b"), GitHead::Unknown);
    }

    #[test]
    fn reads_head_from_disk_and_worktree_files() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("repo");
        std::fs::create_dir_all(repo.join(".git")).unwrap();
        std::fs::write(repo.join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
        let sub = repo.join("a/b");
        std::fs::create_dir_all(&sub).unwrap();
        assert_eq!(GitHead::read(&sub).branch(), Some("main"));

        // A worktree: `.git` is a file pointing at the real git dir.
        let wt = dir.path().join("wt");
        let wt_git = dir.path().join("main/.git/worktrees/wt");
        std::fs::create_dir_all(&wt).unwrap();
        std::fs::create_dir_all(&wt_git).unwrap();
        std::fs::write(wt.join(".git"), format!("gitdir: {}\n", wt_git.display())).unwrap();
        std::fs::write(wt_git.join("HEAD"), "ref: refs/heads/topic\n").unwrap();
        assert_eq!(GitHead::read(&wt).branch(), Some("topic"));
    }

    #[test]
    fn oversized_head_is_not_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join(".git")).unwrap();
        let big = format!(
            "ref: refs/heads/{}",
            "x".repeat(2 * MAX_GIT_FILE_BYTES as usize)
        );
        std::fs::write(dir.path().join(".git/HEAD"), big).unwrap();
        assert_eq!(GitHead::read(dir.path()), GitHead::Unknown);
    }

    #[test]
    fn a_git_file_pointing_at_something_else_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let other = dir.path().join("elsewhere");
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(other.join("HEAD"), "ref: refs/heads/secret\n").unwrap();
        let repo = dir.path().join("repo");
        std::fs::create_dir_all(&repo).unwrap();
        std::fs::write(repo.join(".git"), format!("gitdir: {}\n", other.display())).unwrap();
        assert_eq!(GitHead::read(&repo), GitHead::Unknown);
        // A FIFO as HEAD is refused without blocking.
        let fifo_repo = dir.path().join("fifo");
        std::fs::create_dir_all(fifo_repo.join(".git")).unwrap();
        nix::unistd::mkfifo(
            &fifo_repo.join(".git/HEAD"),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        assert_eq!(GitHead::read(&fifo_repo), GitHead::Unknown);
    }

    #[test]
    fn values_stay_on_one_line() {
        assert_eq!(one_line("a\nb"), "a\\nb");
        assert_eq!(one_line("plain ✓"), "plain ✓");
    }
}
