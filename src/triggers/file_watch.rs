//! `file_watch` triggers: notify, one watcher per trigger, on the
//! directories its globs can match (each watched on its own, never through
//! a link, at most [`MAX_WATCHED_DIRS`]); a directory created later is
//! watched as soon as it appears, and the files already in it count as
//! created. `.git/`, the state directory, the worktrees of runs and editor
//! temp files are ignored.
//!
//! Debounce: the first change of a path opens a window of `debounce_ms`
//! (500 ms by default); when it closes, the window's net change of that
//! path fires once — `created` (it did not exist before and does now),
//! `deleted` (it existed and is gone) or `modified`. So an editor's
//! write-rename-rename is one save, and a burst of writes fires once per
//! window. Windows that close together fire in the order they opened. `moved` is not an event (as in seed 000): a rename is a
//! `deleted` of the old path and a `created` of the new one. The payload
//! names the path relative to the repository and the event.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use notify::{EventKind, RecursiveMode, Watcher};
use serde_json::json;
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{
    FIRING_QUEUE_DEPTH, Firing, Firings, Origin, TriggerContext, TriggerError, TriggerKind,
};
use crate::model::{FileEvent, TriggerSource};

/// Directories one trigger watches at most.
pub const MAX_WATCHED_DIRS: usize = 10_000;
/// Paths waiting in debounce windows at once; changes of further paths are
/// dropped (and counted) until windows close.
pub const MAX_PENDING_PATHS: usize = 10_000;
/// Directory entries looked at when a new directory appears.
pub const MAX_NEW_DIR_ENTRIES: usize = 10_000;
/// Directory names never watched.
pub const IGNORED_DIRS: [&str; 1] = [".git"];

/// How a change of a path came to be known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Noted {
    /// notify reported it.
    ByEvent,
    /// A listing of a directory that appeared after start found it.
    ByListing,
}

/// How a window's first change saw the path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum First {
    /// The path appeared (it did not exist before the window).
    Created,
    /// The path existed before the window.
    Existed,
}

#[derive(Debug)]
struct Window {
    first: First,
    closes: Instant,
}

#[derive(Debug, Default)]
struct Pending {
    windows: HashMap<PathBuf, Window>,
    dropped: u64,
}

/// Shared between notify's thread and the trigger's task.
#[derive(Debug)]
struct Shared {
    root: PathBuf,
    ignored: Vec<PathBuf>,
    globs: globset::GlobSet,
    /// The trigger's own `ignore` globs.
    ignore: globset::GlobSet,
    debounce: Duration,
    pending: Mutex<Pending>,
    changed: Notify,
    /// Directories that appeared, with when notify said so.
    new_dirs: mpsc::UnboundedSender<(PathBuf, Instant)>,
}

impl Shared {
    fn is_ignored(&self, path: &Path) -> bool {
        !path.starts_with(&self.root)
            || self.ignored.iter().any(|d| path.starts_with(d))
            || crate::repofs::is_editor_noise(path)
    }

    fn matches(&self, path: &Path) -> bool {
        path.strip_prefix(&self.root)
            .is_ok_and(|rel| self.globs.is_match(rel) && !self.ignore.is_match(rel))
    }

    /// A change of `path` seen as `first` if it opens a window.
    fn note(&self, path: PathBuf, first: First) {
        self.open(path, first, Noted::ByEvent);
    }

    /// A file found in a directory that appeared after start: it is new,
    /// even when a change of it (a write notify reported before the
    /// directory was listed) opened its window first.
    fn note_listed(&self, path: PathBuf) {
        self.open(path, First::Created, Noted::ByListing);
    }

    fn open(&self, path: PathBuf, first: First, how: Noted) {
        if self.is_ignored(&path) || !self.matches(&path) {
            return;
        }
        let mut pending = crate::stdx::lock(&self.pending);
        let full = pending.windows.len() >= MAX_PENDING_PATHS;
        match pending.windows.get_mut(&path) {
            Some(w) if how == Noted::ByListing => w.first = First::Created,
            Some(_) => {}
            None if full => pending.dropped += 1,
            None => {
                pending.windows.insert(
                    path,
                    Window {
                        first,
                        closes: Instant::now() + self.debounce,
                    },
                );
                drop(pending);
                self.changed.notify_one();
            }
        }
    }

    fn on_event(&self, event: notify::Event) {
        use notify::event::{ModifyKind, RenameMode};
        let first = match event.kind {
            EventKind::Create(_) => First::Created,
            EventKind::Modify(ModifyKind::Name(RenameMode::To)) => First::Created,
            EventKind::Modify(ModifyKind::Name(RenameMode::Both)) => {
                // [from, to]
                let mut paths = event.paths.into_iter();
                if let Some(from) = paths.next() {
                    self.note(from, First::Existed);
                }
                if let Some(to) = paths.next() {
                    self.saw_dir(&to);
                    self.note(to, First::Created);
                }
                return;
            }
            EventKind::Modify(ModifyKind::Metadata(_)) | EventKind::Access(_) => return,
            EventKind::Modify(_) | EventKind::Remove(_) => First::Existed,
            EventKind::Any | EventKind::Other => First::Existed,
        };
        for path in event.paths {
            if first == First::Created {
                self.saw_dir(&path);
            }
            self.note(path, first);
        }
    }

    /// A directory appeared: have the task watch it.
    fn saw_dir(&self, path: &Path) {
        let is_dir = std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir());
        if is_dir && !self.is_ignored(path) {
            let _ = self.new_dirs.send((path.to_path_buf(), Instant::now()));
        }
    }

    /// Windows that closed by `now`, with their net event, in the order
    /// they opened: a path changed first fires first, however late the
    /// task wakes to close several windows at once.
    fn closed(&self, now: Instant) -> (Vec<(PathBuf, FileEvent)>, Option<Instant>) {
        let mut pending = crate::stdx::lock(&self.pending);
        let mut done: Vec<(Instant, PathBuf)> = pending
            .windows
            .iter()
            .filter(|(_, w)| w.closes <= now)
            .map(|(p, w)| (w.closes, p.clone()))
            .collect();
        done.sort();
        let mut out = Vec::new();
        for (_, path) in done {
            let Some(w) = pending.windows.remove(&path) else {
                continue;
            };
            let exists = std::fs::symlink_metadata(&path).is_ok();
            let event = match (w.first, exists) {
                (First::Created, true) => Some(FileEvent::Created),
                (First::Created, false) => None,
                (First::Existed, true) => Some(FileEvent::Modified),
                (First::Existed, false) => Some(FileEvent::Deleted),
            };
            let is_dir = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir());
            if let Some(e) = event.filter(|_| !is_dir) {
                out.push((path, e));
            }
        }
        let next = pending.windows.values().map(|w| w.closes).min();
        (out, next)
    }
}

/// The directory part of a pattern before its first glob character.
fn literal_prefix(pattern: &str) -> PathBuf {
    let mut out = PathBuf::new();
    let parts: Vec<&str> = pattern.split('/').collect();
    for (i, part) in parts.iter().enumerate() {
        let is_last = i + 1 == parts.len();
        if is_last || part.contains(['*', '?', '[', '{']) {
            break;
        }
        out.push(part);
    }
    out
}

/// When each watched directory was last watched (just before the watch
/// was asked for).
type Watched = HashMap<PathBuf, Instant>;

/// Watches `dir` and every directory under it (no links, nothing ignored,
/// at most [`MAX_WATCHED_DIRS`] in all and per call). Each
/// directory is watched before it is listed, so an entry made while this
/// runs is either listed or reported by notify, never neither. With
/// `appeared`, `dir` is one notify said appeared at that instant, and the
/// files found count as created.
fn watch_tree(
    dir: &Path,
    shared: &Shared,
    watcher: &mut notify::RecommendedWatcher,
    watched: &mut Watched,
    appeared: Option<Instant>,
) -> Result<(), TriggerError> {
    let note_files = appeared.is_some();
    let mut stack = vec![(dir.to_path_buf(), appeared)];
    let mut visited = 0usize;
    while let Some((d, appeared)) = stack.pop() {
        let last_watch = watched.get(&d).copied();
        let known = last_watch.is_some();
        if visited >= MAX_WATCHED_DIRS || (!known && watched.len() >= MAX_WATCHED_DIRS) {
            break;
        }
        let is_dir = std::fs::symlink_metadata(&d).is_ok_and(|m| m.is_dir());
        // At start a directory already walked is done. A directory that
        // appeared later may be one deleted and made again, so it is
        // watched afresh — unless it was watched after notify said it
        // appeared (then that watch and listing already cover it, and a
        // second listing would call its changed files new again).
        let covered = match (last_watch, appeared) {
            (Some(_), None) => !note_files,
            (Some(at), Some(appeared)) => at >= appeared,
            (None, _) => false,
        };
        if !is_dir || shared.is_ignored(&d) || covered {
            continue;
        }
        visited += 1;
        let now = Instant::now();
        watcher
            .watch(&d, RecursiveMode::NonRecursive)
            .map_err(|e| TriggerError::Watch {
                path: d.display().to_string(),
                detail: e.to_string(),
            })?;
        watched.insert(d.clone(), now);
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten().take(MAX_NEW_DIR_ENTRIES) {
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push((e.path(), None)),
                Ok(t) if t.is_file() && note_files => shared.note_listed(e.path()),
                _ => {}
            }
        }
    }
    Ok(())
}

/// `patterns` as one set (`*` stays within a directory, `**` crosses them).
fn glob_set(patterns: &[String]) -> Result<globset::GlobSet, TriggerError> {
    let mut builder = globset::GlobSetBuilder::new();
    for p in patterns {
        let glob = globset::GlobBuilder::new(p)
            .literal_separator(true)
            .build()
            .map_err(|e| TriggerError::Watch {
                path: p.clone(),
                detail: e.kind().to_string(),
            })?;
        builder.add(glob);
    }
    builder.build().map_err(|e| TriggerError::Watch {
        path: patterns.join(", "),
        detail: e.to_string(),
    })
}

/// A file-watch trigger.
#[derive(Debug)]
pub struct FileWatchTrigger {
    paths: Vec<String>,
    ignore: Vec<String>,
    events: Vec<FileEvent>,
    debounce: Duration,
    stop: Option<CancellationToken>,
}

impl FileWatchTrigger {
    /// `source` must be a file-watch source.
    pub fn new(source: &TriggerSource) -> Self {
        let (paths, ignore, events, debounce_ms) = match source {
            TriggerSource::FileWatch {
                paths,
                ignore,
                events,
                debounce_ms,
            } => (paths.clone(), ignore.clone(), events.clone(), *debounce_ms),
            _ => Default::default(),
        };
        Self {
            paths,
            ignore,
            events,
            debounce: Duration::from_millis(debounce_ms),
            stop: None,
        }
    }
}

impl TriggerKind for FileWatchTrigger {
    fn setup(&mut self, _cx: &TriggerContext) -> Result<(), TriggerError> {
        for p in &self.paths {
            let escapes = Path::new(p)
                .components()
                .any(|c| matches!(c, Component::ParentDir | Component::RootDir));
            if escapes {
                return Err(TriggerError::Watch {
                    path: p.clone(),
                    detail: "a watched path stays inside the repository".to_string(),
                });
            }
        }
        Ok(())
    }

    fn start(&mut self, cx: &TriggerContext) -> Result<Firings, TriggerError> {
        let globs = glob_set(&self.paths)?;
        let ignore = glob_set(&self.ignore)?;
        let (dirs_tx, mut dirs_rx) = mpsc::unbounded_channel();
        let ignored = IGNORED_DIRS
            .iter()
            .map(|d| cx.root.join(d))
            .chain([cx.state_dir.clone()])
            .chain(cx.ignored.iter().cloned())
            .collect();
        let shared = Arc::new(Shared {
            root: cx.root.clone(),
            ignored,
            globs,
            ignore,
            debounce: self.debounce,
            pending: Mutex::new(Pending::default()),
            changed: Notify::new(),
            new_dirs: dirs_tx,
        });
        let handler = {
            let shared = shared.clone();
            move |event: notify::Result<notify::Event>| {
                if let Ok(event) = event {
                    shared.on_event(event);
                }
            }
        };
        let config = notify::Config::default().with_follow_symlinks(false);
        let mut watcher =
            notify::RecommendedWatcher::new(handler, config).map_err(|e| TriggerError::Watch {
                path: cx.root.display().to_string(),
                detail: e.to_string(),
            })?;
        // The deepest existing directory of each pattern's literal prefix.
        let mut watched = Watched::new();
        for p in &self.paths {
            let mut dir = cx.root.join(literal_prefix(p));
            while !dir.is_dir() && dir.starts_with(&cx.root) && dir != cx.root {
                dir.pop();
            }
            watch_tree(&dir, &shared, &mut watcher, &mut watched, None)?;
        }
        let (tx, rx) = mpsc::channel(FIRING_QUEUE_DEPTH);
        let stop = CancellationToken::new();
        self.stop = Some(stop.clone());
        let (events, name, root) = (self.events.clone(), cx.name.clone(), cx.root.clone());
        tokio::spawn(async move {
            let mut next: Option<Instant> = None;
            loop {
                let sleep = async {
                    match next {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    () = stop.cancelled() => break,
                    () = shared.changed.notified() => {}
                    () = sleep => {}
                    Some((dir, appeared)) = dirs_rx.recv() => {
                        // A new directory: watch it (and what is under it),
                        // and count the files already there as created. A
                        // directory that cannot be watched is left out.
                        let _ = watch_tree(&dir, &shared, &mut watcher, &mut watched, Some(appeared));
                    }
                }
                let (closed, upcoming) = shared.closed(Instant::now());
                next = upcoming;
                for (path, event) in closed {
                    if !events.contains(&event) {
                        continue;
                    }
                    let rel = path
                        .strip_prefix(&root)
                        .unwrap_or(&path)
                        .display()
                        .to_string();
                    let firing = Firing::new(
                        &name,
                        Origin::FileWatch,
                        json!({
                            "trigger": name,
                            "kind": "file_watch",
                            "path": rel,
                            "event": event,
                        }),
                    );
                    if tx.send(firing).await.is_err() {
                        return;
                    }
                }
            }
            drop(watcher);
        });
        Ok(rx)
    }

    fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            stop.cancel();
        }
    }

    fn teardown(&mut self, _cx: &TriggerContext) {}

    fn next_fire_times(&self, _limit: usize) -> Vec<DateTime<Utc>> {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literal_prefixes() {
        assert_eq!(literal_prefix("src/**/*.rs"), PathBuf::from("src"));
        assert_eq!(literal_prefix("docs/a/b.md"), PathBuf::from("docs/a"));
        assert_eq!(literal_prefix("*.md"), PathBuf::new());
        assert_eq!(literal_prefix("a/{b,c}/d"), PathBuf::from("a"));
    }

    fn shared_in(root: &Path) -> Shared {
        let (new_dirs, _) = mpsc::unbounded_channel();
        Shared {
            root: root.to_path_buf(),
            ignored: Vec::new(),
            globs: glob_set(&["*.md".to_string()]).unwrap(),
            ignore: glob_set(&[]).unwrap(),
            debounce: Duration::from_millis(300),
            pending: Mutex::new(Pending::default()),
            changed: Notify::new(),
            new_dirs,
        }
    }

    #[test]
    fn windows_closing_together_fire_in_the_order_they_opened() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let shared = shared_in(root);
        let start = Instant::now();
        // Opened in this order (names chosen against any hash or name order).
        let names = ["m.md", "z.md", "a.md", "q.md", "b.md"];
        for (i, name) in names.iter().enumerate() {
            std::fs::write(root.join(name), "x").unwrap();
            crate::stdx::lock(&shared.pending).windows.insert(
                root.join(name),
                Window {
                    first: First::Existed,
                    closes: start + Duration::from_millis(i as u64),
                },
            );
        }
        // The task woke late: every window closed by now.
        let (closed, next) = shared.closed(start + Duration::from_secs(1));
        let order: Vec<String> = closed
            .iter()
            .map(|(p, _)| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(order, names);
        assert!(closed.iter().all(|(_, e)| *e == FileEvent::Modified));
        assert_eq!(next, None);
    }

    #[test]
    fn a_file_a_new_directory_lists_is_created_even_when_its_write_was_seen_first() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let shared = shared_in(root);
        let (written, changed) = (root.join("new.md"), root.join("old.md"));
        for path in [&written, &changed] {
            std::fs::write(path, "x").unwrap();
            // notify's write event, before any listing.
            shared.note(path.clone(), First::Existed);
        }
        // The new directory's listing finds only `new.md`.
        shared.note_listed(written.clone());
        let (mut closed, _) = shared.closed(Instant::now() + Duration::from_secs(1));
        closed.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            closed,
            vec![
                (written, FileEvent::Created),
                (changed, FileEvent::Modified)
            ]
        );
    }
}
