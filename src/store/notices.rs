//! The user-level notice board: one SQLite file under the user's data
//! directory (`$XDG_DATA_HOME/npc/notices.sqlite3`, else
//! `~/.local/share/npc/…`) shared by every daemon of the user. A daemon
//! posts its repository's notices here (a pane entering `needs_attention`,
//! a plugin's `attention`) and reads the others', so a client of any
//! repository hears about a pane that needs a person in another one (seed
//! 002's session notices). A notice carries only names and a fixed reason
//! label, never pane output or plugin text; every field and the number of
//! rows kept are bounded.
//!
//! [`Notices`] is the seam a daemon posts and reads notices through: this
//! user-level board, or, with `[store] url`, the fleet's board in
//! PostgreSQL (`store::pg`), which every daemon of the fleet shares
//! whatever machine it runs on, each notice naming its host.

use std::fmt::Debug;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, params};
use serde::{Deserialize, Serialize};

use super::memory::open_user_db;

/// The board's file, under the user's data directory.
pub const NOTICES_FILE: &str = "notices.sqlite3";
/// The board's directory, under the user's data directory.
pub const NOTICES_SUBDIR: &str = "npc";
/// Notices kept; the oldest go first.
pub const MAX_NOTICES: i64 = 1_000;
/// Longest field of a notice, in characters (longer ones are cut).
pub const MAX_FIELD_CHARS: usize = 256;
/// Most notices one read returns.
pub const MAX_READ: usize = 100;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS notices (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms INTEGER NOT NULL,
    repository TEXT NOT NULL,
    pane TEXT NOT NULL,
    plugin TEXT NOT NULL,
    reason TEXT NOT NULL
);";

/// Why the board cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum NoticeError {
    #[error(
        "no user data directory for the notice board: set `HOME` or an absolute `XDG_DATA_HOME`"
    )]
    NoDataDir,
    #[error("the notice board failed: {0}; remove the file if it is damaged")]
    Sqlite(#[from] rusqlite::Error),
    #[error("the fleet's notice board failed: {0}")]
    Store(#[from] super::StoreError),
    #[error("the notice board's task failed: {0}")]
    Task(String),
}

/// What a [`Notices`] call resolves to.
pub type NoticeFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, NoticeError>> + Send + 'a>>;

/// A notice to post.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewNotice {
    /// The host the daemon runs on (kept by a fleet's board).
    pub host: String,
    /// The repository's root directory.
    pub repository: String,
    pub pane: String,
    pub plugin: String,
    /// `needs_attention` or `attention`.
    pub reason: String,
}

/// A notice board (see the module docs): fields cut to
/// [`MAX_FIELD_CHARS`], control characters blanked, the newest
/// [`MAX_NOTICES`] kept.
pub trait Notices: Send + Sync + Debug {
    /// Post a notice; its id.
    fn post<'a>(&'a self, notice: &'a NewNotice) -> NoticeFuture<'a, i64>;
    /// The newest notice's id (0 when there is none).
    fn last_id(&self) -> NoticeFuture<'_, i64>;
    /// Notices after `after_id`, oldest first, at most [`MAX_READ`].
    fn since(&self, after_id: i64) -> NoticeFuture<'_, Vec<Notice>>;
}

/// One notice on the board.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Notice {
    pub id: i64,
    /// Milliseconds since the Unix epoch.
    pub at_ms: i64,
    /// The repository's root directory.
    pub repository: String,
    pub pane: String,
    pub plugin: String,
    /// `needs_attention` or `attention`.
    pub reason: String,
    /// The host that posted it, on a fleet's board (empty on the user's).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub host: String,
}

/// The board, open.
#[derive(Debug, Clone)]
pub struct NoticeBoard {
    conn: Arc<Mutex<Connection>>,
}

/// Where the board lives for this user, if there is a data directory.
pub fn default_dir() -> Result<PathBuf, NoticeError> {
    crate::repofs::user_data_dir()
        .map(|d| d.join(NOTICES_SUBDIR))
        .ok_or(NoticeError::NoDataDir)
}

/// `text` as a notice's field: at most [`MAX_FIELD_CHARS`], control
/// characters blanked.
pub fn bounded(text: &str) -> String {
    text.chars()
        .take(MAX_FIELD_CHARS)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

impl NoticeBoard {
    /// Open (creating) the board in `dir`.
    pub fn open(dir: &Path) -> Result<Self, NoticeError> {
        let conn = open_user_db(dir, NOTICES_FILE)?;
        conn.execute_batch(SCHEMA)?;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        crate::stdx::lock(&self.conn)
    }

    /// Post a notice (fields cut to [`MAX_FIELD_CHARS`], control characters
    /// blanked); the oldest beyond [`MAX_NOTICES`] are dropped. Its id.
    pub fn post(
        &self,
        repository: &str,
        pane: &str,
        plugin: &str,
        reason: &str,
    ) -> Result<i64, NoticeError> {
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        tx.execute(
            "INSERT INTO notices(at_ms, repository, pane, plugin, reason) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![
                super::now_ms(),
                bounded(repository),
                bounded(pane),
                bounded(plugin),
                bounded(reason)
            ],
        )?;
        let id = tx.last_insert_rowid();
        tx.execute(
            "DELETE FROM notices WHERE id <= ?1",
            params![id - MAX_NOTICES],
        )?;
        tx.commit()?;
        Ok(id)
    }

    /// The newest notice's id (0 when there is none).
    pub fn last_id(&self) -> Result<i64, NoticeError> {
        Ok(self
            .conn()
            .query_row("SELECT coalesce(max(id), 0) FROM notices", [], |r| r.get(0))?)
    }

    /// Notices after `after_id`, oldest first, at most [`MAX_READ`].
    pub fn since(&self, after_id: i64) -> Result<Vec<Notice>, NoticeError> {
        let conn = self.conn();
        // Every daemon of the user writes the board: fields are cut in
        // SQL and blanked of controls once read, as when posted.
        let field = |col: &str| super::untrusted::sqlite_text(col, MAX_FIELD_CHARS);
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT id, at_ms, {}, {}, {}, {} FROM notices WHERE id > ?1 ORDER BY id LIMIT ?2",
            field("repository"),
            field("pane"),
            field("plugin"),
            field("reason"),
        ))?;
        let rows = stmt.query_map(params![after_id, MAX_READ as i64], |r| {
            Ok(Notice {
                id: r.get(0)?,
                at_ms: r.get(1)?,
                repository: bounded(&r.get::<_, String>(2)?),
                pane: bounded(&r.get::<_, String>(3)?),
                plugin: bounded(&r.get::<_, String>(4)?),
                reason: bounded(&r.get::<_, String>(5)?),
                host: String::new(),
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}

impl NoticeBoard {
    /// Run `job` on the board off the async threads.
    fn blocking<T: Send + 'static>(
        &self,
        job: impl FnOnce(&NoticeBoard) -> Result<T, NoticeError> + Send + 'static,
    ) -> NoticeFuture<'_, T> {
        let board = self.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || job(&board))
                .await
                .map_err(|e| NoticeError::Task(e.to_string()))?
        })
    }
}

/// The user-level board of one machine.
impl Notices for NoticeBoard {
    fn post<'a>(&'a self, notice: &'a NewNotice) -> NoticeFuture<'a, i64> {
        let n = notice.clone();
        self.blocking(move |board| board.post(&n.repository, &n.pane, &n.plugin, &n.reason))
    }

    fn last_id(&self) -> NoticeFuture<'_, i64> {
        self.blocking(NoticeBoard::last_id)
    }

    fn since(&self, after_id: i64) -> NoticeFuture<'_, Vec<Notice>> {
        self.blocking(move |board| board.since(after_id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notices_are_read_in_order_after_an_id_and_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let board = NoticeBoard::open(dir.path()).unwrap();
        assert_eq!(board.last_id().unwrap(), 0);
        let a = board.post("/r/a", "one", "rec", "needs_attention").unwrap();
        let long = "x".repeat(10 * MAX_FIELD_CHARS);
        let b = board
            .post("/r/b", &long, "rec", "attention\n\u{1b}[2J")
            .unwrap();
        let read = board.since(0).unwrap();
        assert_eq!(read.iter().map(|n| n.id).collect::<Vec<_>>(), [a, b]);
        assert_eq!(read[1].pane.chars().count(), MAX_FIELD_CHARS);
        assert!(!read[1].reason.chars().any(char::is_control));
        assert_eq!(board.since(a).unwrap().len(), 1);
        // A second handle (another daemon) sees the same board.
        let other = NoticeBoard::open(dir.path()).unwrap();
        assert_eq!(other.last_id().unwrap(), b);
    }

    #[tokio::test]
    async fn the_board_is_a_notices_seam() {
        let dir = tempfile::tempdir().unwrap();
        let board: Arc<dyn Notices> = Arc::new(NoticeBoard::open(dir.path()).unwrap());
        assert_eq!(board.last_id().await.unwrap(), 0);
        let posted = NewNotice {
            host: "h".into(),
            repository: "/r".into(),
            pane: "one".into(),
            plugin: "rec".into(),
            reason: "needs_attention".into(),
        };
        let id = board.post(&posted).await.unwrap();
        let read = board.since(0).await.unwrap();
        assert_eq!(read.len(), 1);
        assert_eq!((read[0].id, read[0].pane.as_str()), (id, "one"));
        // One machine's board keeps no host.
        assert_eq!(read[0].host, "");
    }

    #[test]
    fn the_board_keeps_only_the_newest_notices() {
        let dir = tempfile::tempdir().unwrap();
        let board = NoticeBoard::open(dir.path()).unwrap();
        for i in 0..MAX_NOTICES + 5 {
            board.post("/r", &i.to_string(), "p", "attention").unwrap();
        }
        let count: i64 = board
            .conn()
            .query_row("SELECT count(*) FROM notices", [], |r| r.get(0))
            .unwrap();
        assert_eq!(count, MAX_NOTICES);
        assert_eq!(board.since(0).unwrap()[0].pane, "5");
    }

    #[test]
    fn a_link_in_place_of_the_board_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = dir.path().join("elsewhere");
        std::fs::write(&elsewhere, "").unwrap();
        let boards = dir.path().join("npc");
        std::fs::create_dir(&boards).unwrap();
        std::os::unix::fs::symlink(&elsewhere, boards.join(NOTICES_FILE)).unwrap();
        assert!(NoticeBoard::open(&boards).is_err());
        assert_eq!(std::fs::read(&elsewhere).unwrap(), b"");
    }
}
