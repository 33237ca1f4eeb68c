//! The memory store behind the `memory_*` and `board_*` built-in MCP tools
//! (`crate::mcp::builtin::memory`): one SQLite file per project (WAL, a busy
//! timeout so several gateways share it, opened without following a link),
//! named by a validated [`ProjectKey`]. Notes are indexed with FTS5; search
//! queries are reduced to quoted words first ([`fts_query`]), so no query is
//! an FTS5 syntax error. Texts, tags, results and the number of entries are
//! bounded; writer labels keep at most a [`TOKEN_PREFIX_CHARS`]-character
//! prefix of any token-like word ([`writer_label`]).

use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, OptionalExtension, params};

/// Longest project key.
pub const MAX_PROJECT_KEY_LEN: usize = 80;
/// Longest part of a project key taken from the repository's directory name.
const MAX_KEY_SLUG_LEN: usize = 32;
/// Largest text of one memory or post, in bytes.
pub const MAX_TEXT_BYTES: usize = 16 * 1024;
/// Most tags on one memory.
pub const MAX_TAGS: usize = 16;
/// Longest tag, in bytes.
pub const MAX_TAG_BYTES: usize = 64;
/// Longest writer label, in characters.
pub const MAX_WRITER_CHARS: usize = 64;
/// How much of a token-like word a writer label keeps.
pub const TOKEN_PREFIX_CHARS: usize = 6;
/// Longest search query, in bytes.
pub const MAX_QUERY_BYTES: usize = 1024;
/// Most words of a query used in the search.
pub const MAX_QUERY_TERMS: usize = 16;
/// Entries returned when the caller names no `limit`.
pub const DEFAULT_LIMIT: usize = 10;
/// Most entries one read returns.
pub const MAX_LIMIT: usize = 50;
/// Most memories one project keeps; further writes are refused.
pub const MAX_MEMORIES: i64 = 10_000;
/// Most board posts one project keeps; the oldest go first.
pub const MAX_BOARD_POSTS: i64 = 2_000;
/// Longest board channel name.
pub const MAX_CHANNEL_LEN: usize = 64;
/// How long a write waits for another process's lock.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// The board channel used when none is named.
pub const DEFAULT_CHANNEL: &str = "general";

/// What went wrong in the memory store.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    #[error(
        "`{key}` is not a valid project key; use 1 to {MAX_PROJECT_KEY_LEN} lowercase letters, digits, `.`, `_` or `-`, not starting with `.`"
    )]
    InvalidKey { key: String },
    #[error("the memory database failed: {0}; try again, or remove the file if it is damaged")]
    Sqlite(#[from] rusqlite::Error),
    #[error("`{field}` is {len} bytes; the most allowed is {max}; shorten it")]
    TooLong {
        field: &'static str,
        len: usize,
        max: usize,
    },
    #[error("the query has no words to search for; pass some words")]
    EmptyQuery,
    #[error(
        "this project already keeps {MAX_MEMORIES} memories; remove some with `memory_delete` first"
    )]
    Full,
    #[error("`{field}` is empty; pass some text")]
    Empty { field: &'static str },
    #[error(
        "`{channel}` is not a channel name; use up to {MAX_CHANNEL_LEN} lowercase letters, digits, `_` or `-`"
    )]
    InvalidChannel { channel: String },
}

/// A validated project key: names the project's memory file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectKey(String);

impl ProjectKey {
    /// `key` if it is a safe file-name stem: 1 to [`MAX_PROJECT_KEY_LEN`]
    /// characters of `[a-z0-9._-]`, not starting with `.` (no path
    /// separators, no `..`, nothing hidden).
    pub fn parse(key: &str) -> Result<Self, MemoryError> {
        let ok = !key.is_empty()
            && key.len() <= MAX_PROJECT_KEY_LEN
            && !key.starts_with('.')
            && key
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b));
        if ok {
            Ok(Self(key.to_string()))
        } else {
            Err(MemoryError::InvalidKey {
                key: key.chars().take(MAX_PROJECT_KEY_LEN).collect(),
            })
        }
    }

    /// The key of the repository at `root` (canonical): its directory
    /// name, reduced to safe characters, and a digest of the whole path,
    /// so two checkouts with the same name stay apart.
    pub fn for_repo(root: &Path) -> Self {
        use sha2::Digest as _;
        let name = root
            .file_name()
            .map(|n| n.to_string_lossy().to_lowercase())
            .unwrap_or_default();
        let slug: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                    c
                } else {
                    '-'
                }
            })
            .take(MAX_KEY_SLUG_LEN)
            .collect();
        let slug = slug.trim_matches('-');
        let digest = sha2::Sha256::digest(root.as_os_str().as_encoded_bytes());
        let hex = hex::encode(&digest[..8]);
        let key = if slug.is_empty() {
            hex
        } else {
            format!("{slug}-{hex}")
        };
        Self::parse(&key).unwrap_or(Self(hex::encode(&digest[..8])))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}
/// A writer label fit to store: at most [`MAX_WRITER_CHARS`] characters of
/// letters, digits and `-_.:@/ ` (any other character becomes `_`, any
/// whitespace a space), and every token-like word (a space-separated word
/// longer than 12 characters, or longer than 6 and all letters and digits,
/// mixing both) cut to its first [`TOKEN_PREFIX_CHARS`] characters and `…`.
pub fn writer_label(raw: &str) -> String {
    fn token_like(word: &str) -> bool {
        let n = word.chars().count();
        n > 12
            || (n > TOKEN_PREFIX_CHARS
                && word.chars().all(char::is_alphanumeric)
                && word.chars().any(|c| c.is_ascii_digit())
                && word.chars().any(char::is_alphabetic))
    }
    let clean: String = raw
        .trim()
        .chars()
        .map(|c| {
            if c.is_whitespace() {
                ' '
            } else if c.is_alphanumeric() || "-_.:@/".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    let words: Vec<String> = clean
        .split(' ')
        .filter(|w| !w.is_empty())
        .map(|w| {
            if token_like(w) {
                format!(
                    "{}…",
                    w.chars().take(TOKEN_PREFIX_CHARS).collect::<String>()
                )
            } else {
                w.to_string()
            }
        })
        .collect();
    let label: String = words.join(" ").chars().take(MAX_WRITER_CHARS).collect();
    if label.is_empty() {
        "agent".to_string()
    } else {
        label
    }
}

/// An FTS5 query matching any of `raw`'s words: each word (a run of
/// letters and digits) quoted, at most [`MAX_QUERY_TERMS`] of them, joined
/// by `OR`. Nothing of FTS5's syntax survives, so no query fails to parse.
pub fn fts_query(raw: &str) -> Result<String, MemoryError> {
    if raw.len() > MAX_QUERY_BYTES {
        return Err(MemoryError::TooLong {
            field: "query",
            len: raw.len(),
            max: MAX_QUERY_BYTES,
        });
    }
    let terms: Vec<String> = raw
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .take(MAX_QUERY_TERMS)
        .map(|w| format!("\"{w}\""))
        .collect();
    if terms.is_empty() {
        return Err(MemoryError::EmptyQuery);
    }
    Ok(terms.join(" OR "))
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS entries(
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    channel TEXT,
    writer TEXT NOT NULL,
    text TEXT NOT NULL,
    tags TEXT NOT NULL DEFAULT '',
    created_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS entries_by_kind ON entries(kind, channel, id);
CREATE VIRTUAL TABLE IF NOT EXISTS entries_fts USING fts5(text, tags, content='entries', content_rowid='id');
CREATE TRIGGER IF NOT EXISTS entries_indexed AFTER INSERT ON entries WHEN new.kind = 'memory' BEGIN
    INSERT INTO entries_fts(rowid, text, tags) VALUES (new.id, new.text, new.tags);
END;
CREATE TRIGGER IF NOT EXISTS entries_unindexed AFTER DELETE ON entries WHEN old.kind = 'memory' BEGIN
    INSERT INTO entries_fts(entries_fts, rowid, text, tags) VALUES ('delete', old.id, old.text, old.tags);
END;
";

/// One stored entry, as returned to agents.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Entry {
    pub id: i64,
    pub writer: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    pub text: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// RFC 3339, UTC.
    pub created: String,
}

/// One project's memory file.
#[derive(Debug)]
pub struct MemoryStore {
    conn: Mutex<Connection>,
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

fn entry(row: &rusqlite::Row<'_>) -> rusqlite::Result<Entry> {
    let tags: String = row.get(4)?;
    let created_ms: i64 = row.get(5)?;
    Ok(Entry {
        id: row.get(0)?,
        writer: row.get(1)?,
        channel: row.get(2)?,
        text: row.get(3)?,
        tags: tags
            .split('\n')
            .filter(|t| !t.is_empty())
            .map(String::from)
            .collect(),
        created: chrono::DateTime::from_timestamp_millis(created_ms)
            .map(|t| t.to_rfc3339())
            .unwrap_or_default(),
    })
}

const COLUMNS: &str = "id, writer, channel, text, tags, created_ms";

fn check_text(field: &'static str, text: &str) -> Result<(), MemoryError> {
    if text.trim().is_empty() {
        return Err(MemoryError::Empty { field });
    }
    if text.len() > MAX_TEXT_BYTES {
        return Err(MemoryError::TooLong {
            field,
            len: text.len(),
            max: MAX_TEXT_BYTES,
        });
    }
    Ok(())
}

fn check_channel(channel: &str) -> Result<(), MemoryError> {
    let ok = !channel.is_empty()
        && channel.len() <= MAX_CHANNEL_LEN
        && channel
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(MemoryError::InvalidChannel {
            channel: channel.chars().take(MAX_CHANNEL_LEN).collect(),
        })
    }
}

/// Open (creating) the user-level SQLite file `file` in `dir`: the
/// directory created private (0700), the file owner-only (0600, and SQLite
/// gives its side files the same mode), never through a link; WAL with a
/// [`BUSY_TIMEOUT`], so several processes of the user share it. The memory
/// store and the notice board (`crate::store::notices`) open theirs here.
pub fn open_user_db(dir: &Path, file: &str) -> Result<Connection, rusqlite::Error> {
    use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
    let cannot = |what: &Path, e: std::io::Error| {
        rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CANTOPEN),
            Some(format!("cannot create `{}`: {e}", what.display())),
        )
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| cannot(dir, e))?;
    let path = dir.join(file);
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(&path)
        .map_err(|e| cannot(&path, e))?;
    let conn = Connection::open_with_flags(
        &path,
        OpenFlags::default() | OpenFlags::SQLITE_OPEN_NOFOLLOW,
    )?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    Ok(conn)
}

impl MemoryStore {
    /// Open (creating) the file of `key` in `dir` (created private).
    pub fn open(dir: &Path, key: &ProjectKey) -> Result<Self, MemoryError> {
        let conn = open_user_db(dir, &format!("{}.sqlite3", key.as_str()))?;
        conn.execute_batch(SCHEMA)?;
        Ok(Self {
            conn: Mutex::new(conn),
        })
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        crate::stdx::lock(&self.conn)
    }

    /// Store a memory; its id.
    pub fn write(&self, writer: &str, text: &str, tags: &[String]) -> Result<i64, MemoryError> {
        check_text("text", text)?;
        if tags.len() > MAX_TAGS {
            return Err(MemoryError::TooLong {
                field: "tags",
                len: tags.len(),
                max: MAX_TAGS,
            });
        }
        let mut clean = Vec::new();
        for tag in tags {
            if tag.len() > MAX_TAG_BYTES {
                return Err(MemoryError::TooLong {
                    field: "tag",
                    len: tag.len(),
                    max: MAX_TAG_BYTES,
                });
            }
            let tag = tag.replace(['\n', '\r'], " ").trim().to_string();
            if !tag.is_empty() {
                clean.push(tag);
            }
        }
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let count: i64 = tx.query_row(
            "SELECT count(*) FROM entries WHERE kind = 'memory'",
            [],
            |r| r.get(0),
        )?;
        if count >= MAX_MEMORIES {
            return Err(MemoryError::Full);
        }
        tx.execute(
            "INSERT INTO entries(kind, writer, text, tags, created_ms) VALUES ('memory', ?1, ?2, ?3, ?4)",
            params![writer_label(writer), text, clean.join("\n"), now_ms()],
        )?;
        let id = tx.last_insert_rowid();
        tx.commit()?;
        Ok(id)
    }

    /// Memories matching any word of `query`, best first.
    pub fn search(&self, query: &str, limit: usize) -> Result<Vec<Entry>, MemoryError> {
        let fts = fts_query(query)?;
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {} FROM entries_fts JOIN entries e ON e.id = entries_fts.rowid \
             WHERE entries_fts MATCH ?1 AND e.kind = 'memory' ORDER BY entries_fts.rank LIMIT ?2",
            COLUMNS
                .split(", ")
                .map(|c| format!("e.{c}"))
                .collect::<Vec<_>>()
                .join(", ")
        ))?;
        let rows = stmt
            .query_map(params![fts, limit.min(MAX_LIMIT) as i64], entry)?
            .collect::<Result<_, _>>()?;
        Ok(rows)
    }

    /// The newest memories, newest first.
    pub fn recent(&self, limit: usize) -> Result<Vec<Entry>, MemoryError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM entries WHERE kind = 'memory' ORDER BY id DESC LIMIT ?1"
        ))?;
        let rows = stmt
            .query_map([limit.min(MAX_LIMIT) as i64], entry)?
            .collect::<Result<_, _>>()?;
        Ok(rows)
    }

    /// Remove memory `id`; whether it existed.
    pub fn delete(&self, id: i64) -> Result<bool, MemoryError> {
        let n = self.conn().execute(
            "DELETE FROM entries WHERE id = ?1 AND kind = 'memory'",
            [id],
        )?;
        Ok(n > 0)
    }

    /// Post to `channel`; the post's id. Beyond [`MAX_BOARD_POSTS`] the
    /// oldest posts go.
    pub fn post(&self, writer: &str, channel: &str, text: &str) -> Result<i64, MemoryError> {
        check_text("text", text)?;
        check_channel(channel)?;
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        tx.execute(
            "INSERT INTO entries(kind, channel, writer, text, created_ms) VALUES ('board', ?1, ?2, ?3, ?4)",
            params![channel, writer_label(writer), text, now_ms()],
        )?;
        let id = tx.last_insert_rowid();
        tx.execute(
            "DELETE FROM entries WHERE kind = 'board' AND id <= (SELECT id FROM entries WHERE kind = 'board' ORDER BY id DESC LIMIT 1 OFFSET ?1)",
            [MAX_BOARD_POSTS],
        )?;
        tx.commit()?;
        Ok(id)
    }

    /// Posts of `channel` (every channel when `None`), oldest first: those
    /// after `after` when given, else the newest `limit`.
    pub fn read_board(
        &self,
        channel: Option<&str>,
        after: Option<i64>,
        limit: usize,
    ) -> Result<Vec<Entry>, MemoryError> {
        if let Some(c) = channel {
            check_channel(c)?;
        }
        let limit = limit.min(MAX_LIMIT) as i64;
        let conn = self.conn();
        let filter = "kind = 'board' AND (?1 IS NULL OR channel = ?1)";
        let mut rows: Vec<Entry> = match after {
            Some(after) => conn
                .prepare_cached(&format!(
                    "SELECT {COLUMNS} FROM entries WHERE {filter} AND id > ?2 ORDER BY id LIMIT ?3"
                ))?
                .query_map(params![channel, after, limit], entry)?
                .collect::<Result<_, _>>()?,
            None => conn
                .prepare_cached(&format!(
                    "SELECT {COLUMNS} FROM entries WHERE {filter} ORDER BY id DESC LIMIT ?2"
                ))?
                .query_map(params![channel, limit], entry)?
                .collect::<Result<_, _>>()?,
        };
        if after.is_none() {
            rows.reverse();
        }
        Ok(rows)
    }

    /// Whether memory `id` exists (for tests and diagnostics).
    pub fn exists(&self, id: i64) -> Result<bool, MemoryError> {
        Ok(self
            .conn()
            .query_row("SELECT 1 FROM entries WHERE id = ?1", [id], |_| Ok(()))
            .optional()?
            .is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, MemoryStore) {
        let dir = tempfile::tempdir().unwrap();
        let key = ProjectKey::parse("proj-1").unwrap();
        let store = MemoryStore::open(&dir.path().join("m"), &key).unwrap();
        (dir, store)
    }

    #[test]
    fn the_file_is_owner_only_and_never_opened_through_a_link() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let key = ProjectKey::parse("p").unwrap();
        drop(MemoryStore::open(dir.path(), &key).unwrap());
        let mode = std::fs::metadata(dir.path().join("p.sqlite3"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "").unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join("q.sqlite3")).unwrap();
        let q = ProjectKey::parse("q").unwrap();
        assert!(MemoryStore::open(dir.path(), &q).is_err());
        assert_eq!(std::fs::read(&target).unwrap(), b"");
    }

    #[test]
    fn two_writers_on_one_file_both_succeed() {
        let dir = tempfile::tempdir().unwrap();
        let key = ProjectKey::parse("shared").unwrap();
        let stores: Vec<_> = (0..2)
            .map(|_| std::sync::Arc::new(MemoryStore::open(dir.path(), &key).unwrap()))
            .collect();
        let writers: Vec<_> = stores
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let s = s.clone();
                std::thread::spawn(move || {
                    for n in 0..50 {
                        s.write(&format!("w{i}"), &format!("note {n}"), &[])
                            .unwrap();
                        s.post(&format!("w{i}"), "general", "hi").unwrap();
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        assert_eq!(stores[0].recent(MAX_LIMIT).unwrap().len(), MAX_LIMIT);
        let count: i64 = stores[1]
            .conn()
            .query_row(
                "SELECT count(*) FROM entries WHERE kind = 'memory'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(count, 100);
    }

    #[test]
    fn project_keys_reject_separators_dots_and_length() {
        for bad in [
            "",
            "a/b",
            "..",
            ".hidden",
            "a\\b",
            "A",
            "a b",
            "é",
            &"k".repeat(MAX_PROJECT_KEY_LEN + 1),
        ] {
            assert!(ProjectKey::parse(bad).is_err(), "{bad:?}");
        }
        assert!(ProjectKey::parse("my-repo.2_x").is_ok());
    }

    #[test]
    fn derived_keys_are_valid_and_apart_for_same_named_checkouts() {
        let a = ProjectKey::for_repo(Path::new("/home/u/src/My Repo!"));
        let b = ProjectKey::for_repo(Path::new("/tmp/My Repo!"));
        assert!(a.as_str().starts_with("my-repo-"), "{a:?}");
        assert_ne!(a, b);
        let odd = ProjectKey::for_repo(Path::new("/x/../..///.."));
        assert!(ProjectKey::parse(odd.as_str()).is_ok());
        let long =
            ProjectKey::for_repo(&std::path::PathBuf::from(format!("/x/{}", "é".repeat(500))));
        assert!(long.as_str().len() <= MAX_PROJECT_KEY_LEN);
    }

    #[test]
    fn writer_labels_keep_six_characters_of_any_token() {
        assert_eq!(writer_label("claude_code"), "claude_code");
        assert_eq!(writer_label("gpt-4o-mini"), "gpt-4o-mini");
        assert_eq!(
            writer_label("codex sk-ant-api03-abcdefghijklmnop"),
            "codex sk-ant…"
        );
        assert_eq!(writer_label("session 3f9a2c7d1e"), "session 3f9a2c…");
        assert_eq!(writer_label("ghp_ABCDEFGHIJKLMNOPQRSTUV"), "ghp_AB…");
        assert_eq!(writer_label("  "), "agent");
        assert_eq!(writer_label("a\nb\u{1b}[31m"), "a b__31m");
        for label in ["x ghp_ABCDEFGHIJKLMNOPQRSTUV", "tok=0123456789abcdef0123"] {
            let kept = writer_label(label);
            assert!(
                !kept.contains("ABCDEFG") && !kept.contains("6789"),
                "{kept}"
            );
        }
        assert!(writer_label(&"ab ".repeat(100)).chars().count() <= MAX_WRITER_CHARS);
    }

    #[test]
    fn fts_queries_never_carry_fts_syntax() {
        assert_eq!(fts_query("hello world").unwrap(), "\"hello\" OR \"world\"");
        assert_eq!(
            fts_query("NEAR(\"a\" b) AND c* OR -d ^e {f}:g").unwrap(),
            "\"NEAR\" OR \"a\" OR \"b\" OR \"AND\" OR \"c\" OR \"OR\" OR \"d\" OR \"e\" OR \"f\" OR \"g\""
        );
        assert!(matches!(fts_query("\"*():^"), Err(MemoryError::EmptyQuery)));
        assert!(matches!(
            fts_query(&"a ".repeat(MAX_QUERY_BYTES)),
            Err(MemoryError::TooLong { .. })
        ));
        assert_eq!(
            fts_query(&"w ".repeat(100)).unwrap().matches("OR").count(),
            MAX_QUERY_TERMS - 1
        );
    }

    #[test]
    fn write_search_recent_delete() {
        let (_dir, s) = store();
        let a = s
            .write("codex", "The build uses cargo nextest", &["build".into()])
            .unwrap();
        let b = s
            .write("claude", "Deploys go through staging first", &[])
            .unwrap();
        let found = s.search("how does the build work?", 10).unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!((found[0].id, found[0].writer.as_str()), (a, "codex"));
        assert_eq!(found[0].tags, ["build"]);
        // Hostile FTS syntax is only words.
        for q in [
            "\"unterminated",
            "a OR",
            "NEAR(x y",
            "col:val",
            "*",
            "build)",
        ] {
            let r = s.search(q, 10);
            assert!(
                r.is_ok() || matches!(r, Err(MemoryError::EmptyQuery)),
                "{q}: {r:?}"
            );
        }
        let recent: Vec<i64> = s.recent(10).unwrap().iter().map(|e| e.id).collect();
        assert_eq!(recent, [b, a]);
        assert!(s.delete(a).unwrap());
        assert!(!s.delete(a).unwrap());
        assert!(s.search("build", 10).unwrap().is_empty(), "unindexed");
        assert!(s.exists(b).unwrap());
    }

    #[test]
    fn oversized_and_empty_texts_are_refused_and_nothing_is_written() {
        let (_dir, s) = store();
        let big = "x".repeat(MAX_TEXT_BYTES + 1);
        assert!(matches!(
            s.write("w", &big, &[]),
            Err(MemoryError::TooLong { .. })
        ));
        assert!(matches!(
            s.write("w", " \n", &[]),
            Err(MemoryError::Empty { .. })
        ));
        assert!(matches!(
            s.write("w", "ok", &vec!["t".into(); MAX_TAGS + 1]),
            Err(MemoryError::TooLong { .. })
        ));
        assert!(matches!(
            s.post("w", "general", &big),
            Err(MemoryError::TooLong { .. })
        ));
        assert!(s.recent(50).unwrap().is_empty());
        assert!(s.read_board(None, None, 50).unwrap().is_empty());
    }

    #[test]
    fn board_reads_oldest_first_pages_by_id_and_keeps_a_bounded_history() {
        let (_dir, s) = store();
        let ids: Vec<i64> = (0..5)
            .map(|i| s.post("w", "general", &format!("m{i}")).unwrap())
            .collect();
        s.post("w", "other", "elsewhere").unwrap();
        let newest = s.read_board(Some("general"), None, 2).unwrap();
        assert_eq!(
            newest.iter().map(|e| e.text.as_str()).collect::<Vec<_>>(),
            ["m3", "m4"]
        );
        let after = s.read_board(Some("general"), Some(ids[1]), 2).unwrap();
        assert_eq!(
            after.iter().map(|e| e.text.as_str()).collect::<Vec<_>>(),
            ["m2", "m3"]
        );
        assert!(matches!(
            s.read_board(Some("../x"), None, 1),
            Err(MemoryError::InvalidChannel { .. })
        ));
        let conn = s.conn();
        conn.execute_batch(&format!(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {MAX_BOARD_POSTS}) \
             INSERT INTO entries(kind, channel, writer, text, created_ms) SELECT 'board', 'general', 'w', 'filler', 0 FROM n"
        ))
        .unwrap();
        drop(conn);
        s.post("w", "general", "last").unwrap();
        let count: i64 = s
            .conn()
            .query_row(
                "SELECT count(*) FROM entries WHERE kind = 'board'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(count, MAX_BOARD_POSTS);
    }
}
