//! Watching the manifest and every file it references, as watchexec does:
//! watch parent directories (editors replace files by renaming a temp file
//! over them, which kills a watch on the file itself), filter by path,
//! ignore editor temp files and reads, and debounce with a trailing quiet
//! window. Nothing polls: with no file activity the watcher costs nothing.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use sha2::Digest as _;
use tokio::sync::mpsc;

use crate::repofs::is_editor_noise;

/// Quiet time after the last change before a reload starts.
pub const DEBOUNCE: Duration = Duration::from_millis(100);
/// Most changed paths remembered per burst (the rest still trigger a reload).
pub const MAX_PATHS_PER_BURST: usize = 256;
/// How long the set of files this process holds open for writing is reused
/// before it is read again from `/proc/self`.
pub const OWN_WRITES_TTL: Duration = Duration::from_secs(1);
/// Descriptors looked at when reading that set.
pub const MAX_FDS_LOOKED_AT: usize = 4096;
/// `O_WRONLY | O_RDWR` in `/proc/self/fdinfo`'s octal `flags`.
const WRITE_FLAGS: u32 = 0o1 | 0o2;

/// The files this process holds open for writing — its stdout and stderr
/// redirected to a file (`npc daemon >> daemon.log`), its logs — read from
/// `/proc/self`: a change to one is npc's own, never a reason to reload.
pub fn open_for_writing() -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    let Ok(fds) = std::fs::read_dir("/proc/self/fd") else {
        return out;
    };
    for fd in fds.flatten().take(MAX_FDS_LOOKED_AT) {
        let name = fd.file_name();
        let Some(n) = name.to_str() else { continue };
        let flags = std::fs::read_to_string(format!("/proc/self/fdinfo/{n}"))
            .ok()
            .and_then(|info| {
                info.lines()
                    .find_map(|l| l.strip_prefix("flags:"))
                    .and_then(|f| u32::from_str_radix(f.trim(), 8).ok())
            })
            .unwrap_or(0);
        if flags & WRITE_FLAGS == 0 {
            continue;
        }
        if let Ok(target) = std::fs::read_link(fd.path())
            && target.is_absolute()
        {
            out.insert(target);
        }
    }
    out
}

/// [`open_for_writing`], read at most once per [`OWN_WRITES_TTL`].
#[derive(Debug, Default)]
struct OwnWrites {
    read: Option<(std::time::Instant, BTreeSet<PathBuf>)>,
}

impl OwnWrites {
    fn contains(&mut self, path: &Path) -> bool {
        let stale = self
            .read
            .as_ref()
            .is_none_or(|(at, _)| at.elapsed() >= OWN_WRITES_TTL);
        if stale {
            self.read = Some((std::time::Instant::now(), open_for_writing()));
        }
        // The watched directory may be spelled `repo/./` (a package at
        // `path = "."`); `/proc` names the file without such steps.
        let plain: PathBuf = path
            .components()
            .filter(|c| !matches!(c, std::path::Component::CurDir))
            .collect();
        self.read
            .as_ref()
            .is_some_and(|(_, set)| set.contains(&plain))
    }
}

/// What to watch: exact files (by their directory) and whole directories,
/// minus what npc writes itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatchSet {
    pub files: BTreeSet<PathBuf>,
    pub dirs: BTreeSet<PathBuf>,
    /// npc's own output: changes under the state directory never count; a
    /// change to an agent file counts unless it holds what npc wrote there.
    pub own: super::NpcOutput,
}

impl WatchSet {
    fn matches(&self, path: &Path, written: &Written) -> bool {
        if is_editor_noise(path) {
            return false;
        }
        // A file named in the manifest counts wherever it is.
        if self.files.contains(path) {
            return true;
        }
        if self.own.dirs.iter().any(|d| path.starts_with(d))
            || (self.own.files.contains(path) && written.is_ours(path))
        {
            return false;
        }
        self.dirs.iter().any(|d| path.starts_with(d))
    }
}

/// The content npc last wrote to each agent file (as a SHA-256), so the
/// watcher can tell npc's own writes from a user's edit.
#[derive(Debug, Default)]
pub struct Written(std::sync::Mutex<std::collections::HashMap<PathBuf, (usize, Vec<u8>)>>);

impl Written {
    /// npc is about to write `content` to `path`.
    pub fn record(&self, path: &Path, content: &str) {
        let digest = sha2::Sha256::digest(content.as_bytes()).to_vec();
        crate::stdx::lock(&self.0).insert(path.to_path_buf(), (content.len(), digest));
    }

    /// Whether `path` holds exactly what npc last wrote to it.
    pub fn is_ours(&self, path: &Path) -> bool {
        let Some((len, digest)) = crate::stdx::lock(&self.0).get(path).cloned() else {
            return false;
        };
        // Through the guarded layer: a FIFO or a device swapped in for the
        // agent file is never opened (opening a FIFO would block the watcher
        // for good), and at most `len + 1` bytes are read.
        let Ok(bytes) = crate::repofs::read_file(path, len) else {
            return false;
        };
        bytes.len() == len && sha2::Sha256::digest(&bytes).as_slice() == digest.as_slice()
    }
}

/// Errors setting up a watch.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("cannot watch `{path}`: {source}")]
    Watch {
        path: PathBuf,
        source: notify::Error,
    },
}

/// A live watch; dropping it stops watching.
pub struct ManifestWatcher {
    watcher: RecommendedWatcher,
    watched_dirs: BTreeSet<(PathBuf, bool)>,
    set: std::sync::Arc<std::sync::RwLock<WatchSet>>,
}

impl std::fmt::Debug for ManifestWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManifestWatcher")
            .field("dirs", &self.watched_dirs)
            .finish()
    }
}

impl ManifestWatcher {
    /// Start watching; every relevant change sends its path on `tx`.
    /// `written` tells npc's own writes to agent files from other changes.
    pub fn new(
        set: WatchSet,
        written: std::sync::Arc<Written>,
        tx: mpsc::UnboundedSender<PathBuf>,
    ) -> Result<Self, WatchError> {
        let shared = std::sync::Arc::new(std::sync::RwLock::new(WatchSet::default()));
        let filter = shared.clone();
        let mut own_writes = OwnWrites::default();
        let watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            let Ok(event) = res else { return };
            if matches!(event.kind, EventKind::Access(_)) {
                return;
            }
            let Ok(set) = filter.read() else { return };
            for path in event.paths {
                if set.matches(&path, &written) && !own_writes.contains(&path) {
                    let _ = tx.send(path);
                }
            }
        })
        .map_err(|source| WatchError::Watch {
            path: PathBuf::new(),
            source,
        })?;
        let mut this = Self {
            watcher,
            watched_dirs: BTreeSet::new(),
            set: shared,
        };
        this.update(set)?;
        Ok(this)
    }

    /// Change what is watched (after a reload referenced other files).
    pub fn update(&mut self, set: WatchSet) -> Result<(), WatchError> {
        let mut wanted: BTreeSet<(PathBuf, bool)> = BTreeSet::new();
        for file in &set.files {
            if let Some(parent) = file.parent() {
                wanted.insert((parent.to_path_buf(), false));
            }
        }
        for dir in &set.dirs {
            wanted.insert((dir.clone(), true));
        }
        for (dir, recursive) in self
            .watched_dirs
            .difference(&wanted)
            .cloned()
            .collect::<Vec<_>>()
        {
            let _ = self.watcher.unwatch(&dir);
            self.watched_dirs.remove(&(dir, recursive));
        }
        for (dir, recursive) in wanted
            .difference(&self.watched_dirs.clone())
            .cloned()
            .collect::<Vec<_>>()
        {
            if !dir.is_dir() {
                continue; // a missing directory is reported by validation
            }
            let mode = if recursive {
                RecursiveMode::Recursive
            } else {
                RecursiveMode::NonRecursive
            };
            self.watcher
                .watch(&dir, mode)
                .map_err(|source| WatchError::Watch {
                    path: dir.clone(),
                    source,
                })?;
            self.watched_dirs.insert((dir, recursive));
        }
        if let Ok(mut shared) = self.set.write() {
            *shared = set;
        }
        Ok(())
    }
}

/// Wait for the next burst of changes: the first path, then everything that
/// arrives until the channel has been quiet for `quiet`. `None` when the
/// sender is gone.
pub async fn next_burst(
    rx: &mut mpsc::UnboundedReceiver<PathBuf>,
    quiet: Duration,
) -> Option<BTreeSet<PathBuf>> {
    let first = rx.recv().await?;
    let mut paths = BTreeSet::from([first]);
    while let Ok(Some(path)) = tokio::time::timeout(quiet, rx.recv()).await {
        if paths.len() < MAX_PATHS_PER_BURST {
            paths.insert(path);
        }
    }
    Some(paths)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_held_open_for_writing_are_npcs_own() {
        let dir = tempfile::tempdir().unwrap();
        let written = dir.path().join("daemon.log");
        let read = dir.path().join("read.txt");
        std::fs::write(&read, "x").unwrap();
        let _w = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&written)
            .unwrap();
        let _r = std::fs::File::open(&read).unwrap();
        let own = open_for_writing();
        assert!(own.contains(&written.canonicalize().unwrap()), "{own:?}");
        assert!(!own.contains(&read.canonicalize().unwrap()));
    }

    #[test]
    fn written_recognises_only_npc_content() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(".mcp.json");
        let written = Written::default();
        std::fs::write(&file, "{}").unwrap();
        assert!(!written.is_ours(&file), "never recorded");
        written.record(&file, "{\"a\": 1}");
        std::fs::write(&file, "{\"a\": 1}").unwrap();
        assert!(written.is_ours(&file));
        std::fs::write(&file, "{\"a\": 2}").unwrap();
        assert!(!written.is_ours(&file), "a user's edit");
        std::fs::write(&file, "{\"a\": 1} ").unwrap();
        assert!(!written.is_ours(&file), "longer content");
    }

    #[tokio::test]
    async fn a_replaced_file_is_seen_and_bursts_collapse() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let manifest = root.join("npcagent.toml");
        std::fs::write(&manifest, "a").unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let _w = ManifestWatcher::new(
            WatchSet {
                files: [manifest.clone()].into(),
                ..WatchSet::default()
            },
            std::sync::Arc::default(),
            tx,
        )
        .unwrap();
        // An editor-style save: write a temp file, rename it over the original.
        std::fs::write(root.join("npcagent.toml.tmp"), "b").unwrap();
        std::fs::rename(root.join("npcagent.toml.tmp"), &manifest).unwrap();
        std::fs::write(root.join("unrelated.txt"), "x").unwrap();
        let burst = tokio::time::timeout(Duration::from_secs(10), next_burst(&mut rx, DEBOUNCE))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(burst, BTreeSet::from([manifest.clone()]));
        // A second save after the rename is still watched.
        std::fs::write(&manifest, "c").unwrap();
        let burst = tokio::time::timeout(Duration::from_secs(10), next_burst(&mut rx, DEBOUNCE))
            .await
            .unwrap()
            .unwrap();
        assert!(burst.contains(&manifest));
    }
}
