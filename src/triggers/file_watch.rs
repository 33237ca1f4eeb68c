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
//! window. `moved` is not an event (as in seed 000): a rename is a
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
    new_dirs: mpsc::UnboundedSender<PathBuf>,
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
        if self.is_ignored(&path) || !self.matches(&path) {
            return;
        }
        let mut pending = crate::stdx::lock(&self.pending);
        let full = pending.windows.len() >= MAX_PENDING_PATHS;
        match pending.windows.get(&path) {
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
            let _ = self.new_dirs.send(path.to_path_buf());
        }
    }

    /// Windows that closed by `now`, with their net event.
    fn closed(&self, now: Instant) -> (Vec<(PathBuf, FileEvent)>, Option<Instant>) {
        let mut pending = crate::stdx::lock(&self.pending);
        let done: Vec<PathBuf> = pending
            .windows
            .iter()
            .filter(|(_, w)| w.closes <= now)
            .map(|(p, _)| p.clone())
            .collect();
        let mut out = Vec::new();
        for path in done {
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

/// Watches `dir` and every directory under it (no links, nothing ignored,
/// at most [`MAX_WATCHED_DIRS`] in all and per call). Each
/// directory is watched before it is listed, so an entry made while this
/// runs is either listed or reported by notify, never neither. With
/// `note_files`, the files found count as created (a directory that
/// appeared after start).
fn watch_tree(
    dir: &Path,
    shared: &Shared,
    watcher: &mut notify::RecommendedWatcher,
    watched: &mut std::collections::BTreeSet<PathBuf>,
    note_files: bool,
) -> Result<(), TriggerError> {
    let mut stack = vec![dir.to_path_buf()];
    let mut visited = 0usize;
    while let Some(d) = stack.pop() {
        let known = watched.contains(&d);
        if visited >= MAX_WATCHED_DIRS || (!known && watched.len() >= MAX_WATCHED_DIRS) {
            break;
        }
        let is_dir = std::fs::symlink_metadata(&d).is_ok_and(|m| m.is_dir());
        // At start a directory already walked is done; a directory that
        // appeared later may be one deleted and made again, so it is
        // watched afresh.
        if !is_dir || shared.is_ignored(&d) || (known && !note_files) {
            continue;
        }
        visited += 1;
        watcher
            .watch(&d, RecursiveMode::NonRecursive)
            .map_err(|e| TriggerError::Watch {
                path: d.display().to_string(),
                detail: e.to_string(),
            })?;
        watched.insert(d.clone());
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten().take(MAX_NEW_DIR_ENTRIES) {
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(e.path()),
                Ok(t) if t.is_file() && note_files => shared.note(e.path(), First::Created),
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
        let mut watched = std::collections::BTreeSet::new();
        for p in &self.paths {
            let mut dir = cx.root.join(literal_prefix(p));
            while !dir.is_dir() && dir.starts_with(&cx.root) && dir != cx.root {
                dir.pop();
            }
            watch_tree(&dir, &shared, &mut watcher, &mut watched, false)?;
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
                    Some(dir) = dirs_rx.recv() => {
                        // A new directory: watch it (and what is under it),
                        // and count the files already there as created. A
                        // directory that cannot be watched is left out.
                        let _ = watch_tree(&dir, &shared, &mut watcher, &mut watched, true);
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
}
