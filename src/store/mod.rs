//! The state store: the ONE module that opens SQLite. Each repository has a
//! single database (`.npc/state.db` by default) in WAL mode with a busy
//! timeout and versioned migrations ([`schema`]). It records the last
//! applied manifests, the state of every supervised component, the entries
//! npc manages in native agent config files, per-trigger state, and the
//! durable event log the [`crate::bus`] writes before it fans out.
//!
//! Writes go to a dedicated writer thread that owns the writable connection
//! and commits queued writes together ([`writer`], group commit); every
//! write method returns a [`Pending`] that resolves after the commit. Reads
//! use separate read-only connections, which WAL lets run beside the writer.
//! A second process (e.g. `npc events` while the daemon runs) opens the same
//! file with [`Store::open_read_only`].
//!
//! Timestamps are unix milliseconds (UTC) in `i64` everywhere.

pub mod acp;
pub mod approvals;
pub mod fleet;
pub mod memory;
pub mod notices;
pub mod pg;
pub mod queue;
mod schema;
pub mod untrusted;
pub mod workflows;
mod writer;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rusqlite::config::DbConfig;
use rusqlite::{Connection, OpenFlags, OptionalExtension, Row};
use serde::{Deserialize, Serialize};

pub use schema::SCHEMA_VERSION;
pub use writer::{Commit, LINGER, MAX_JOBS_PER_TRANSACTION, Pending};

use writer::{Counters, WriterHandle};

/// Directory, relative to the repository root, that holds npc's state.
pub const DEFAULT_STATE_DIR: &str = ".npc";
/// File name of the state database inside the state directory.
pub const DB_FILE_NAME: &str = "state.db";
/// Files SQLite keeps beside the database (`state.db-wal`, …), named by
/// these suffixes.
pub const DB_SIDE_SUFFIXES: [&str; 3] = ["-wal", "-shm", "-journal"];
/// How long a connection waits for a lock held by another connection.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// The pause between two tries to switch a new database to WAL while
/// another process holds its lock.
pub const WAL_SWITCH_RETRY: Duration = Duration::from_millis(10);
/// Idle read-only connections kept for reuse.
pub const READER_POOL_SIZE: usize = 4;
/// Prepared statements each connection keeps (rusqlite's default is 16;
/// the writer's jobs use more, and one evicted is parsed again).
pub const STATEMENT_CACHE_CAPACITY: usize = 64;
/// Applied manifests kept as history; older ones are pruned on insert.
pub const MANIFEST_HISTORY_LIMIT: i64 = 20;
/// Most events one [`Store::events_since`] call returns.
pub const MAX_EVENTS_PER_READ: usize = 10_000;
/// First pause of [`Store::wait_for_events_after`] between polls.
pub const TAIL_POLL_INITIAL: Duration = Duration::from_millis(10);
/// Longest pause of [`Store::wait_for_events_after`] between polls.
pub const TAIL_POLL_MAX: Duration = Duration::from_millis(250);

/// Everything that can go wrong in the store. Cloneable, so one failed
/// group commit can answer every writer that shared it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("cannot create the state directory `{path}`: {source}; check its permissions")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: Arc<std::io::Error>,
    },
    #[error(
        "cannot open the state database `{path}`: {source}; check the path and its permissions"
    )]
    Open {
        path: PathBuf,
        #[source]
        source: Arc<rusqlite::Error>,
    },
    #[error(
        "the state database `{path}` does not exist; run `npc apply` or start `npc daemon` to create it"
    )]
    NotFound { path: PathBuf },
    #[error(
        "the state database `{path}` has schema version {found}, newer than this npc supports ({supported}); upgrade npc"
    )]
    SchemaTooNew {
        path: PathBuf,
        found: i64,
        supported: i64,
    },
    #[error(
        "the state database `{path}` has schema version {found}, older than this npc reads ({supported}); run `npc apply` or restart `npc daemon` to migrate it"
    )]
    SchemaTooOld {
        path: PathBuf,
        found: i64,
        supported: i64,
    },
    #[error(
        "state database migration to version {version} failed: {source}; restore a backup of the state database or delete it"
    )]
    Migrate {
        version: i64,
        #[source]
        source: Arc<rusqlite::Error>,
    },
    #[error("state database: cannot {op}: {source}")]
    Sqlite {
        op: &'static str,
        #[source]
        source: Arc<rusqlite::Error>,
    },
    #[error(
        "state database: stored {what} is not valid JSON: {source}; the row was written by something other than npc"
    )]
    Json {
        what: &'static str,
        #[source]
        source: Arc<serde_json::Error>,
    },
    #[error(
        "the state database was opened read-only; writes go through the process that owns it (`npc daemon`)"
    )]
    ReadOnly,
    #[error("cannot start the state database writer thread: {source}")]
    WriterThread {
        #[source]
        source: Arc<std::io::Error>,
    },
    #[error("the state database writer stopped; restart npc")]
    WriterGone,
    #[error("a read of the state database was cut off: {0}; retry")]
    Task(String),
    /// A write under a lease that is no longer held: it expired, or the run
    /// was rescued or claimed again (its fencing token moved on).
    #[error(
        "the lease of run `{run}` (token {token}) is no longer held; the run was taken from this worker, stop carrying it out"
    )]
    Fenced { run: String, token: i64 },
    #[error(
        "PostgreSQL store: cannot {op}: {message}; check `[store] url` and that the server is up"
    )]
    Postgres { op: &'static str, message: String },
    /// The PostgreSQL store did not answer: no connection could be had,
    /// one was lost, or the server is shutting down or starting up.
    #[error(
        "PostgreSQL store: cannot {op}: {message}; check `[store] url` and that the server is up"
    )]
    PgUnreachable { op: &'static str, message: String },
    #[error(
        "the PostgreSQL store has schema version {found}, this npc needs {supported}; run `npc store migrate`"
    )]
    PgSchemaTooOld { found: i64, supported: i64 },
    #[error(
        "the PostgreSQL store has schema version {found}, newer than this npc supports ({supported}); upgrade npc"
    )]
    PgSchemaTooNew { found: i64, supported: i64 },
    #[error(
        "`[store] url` is not a PostgreSQL URL this npc can use: {0}; write it as `postgres://USER:PASSWORD@HOST:PORT/DATABASE`"
    )]
    PgUrl(String),
    #[error("PostgreSQL store: {0}")]
    PgTls(String),
}

impl StoreError {
    /// Whether the store did not answer (an outage, not a refusal): what
    /// a caller reports as the store being unreachable.
    pub fn is_unreachable(&self) -> bool {
        matches!(self, Self::PgUnreachable { .. })
    }
}

/// Map a rusqlite error to [`StoreError::Sqlite`] for the named operation.
fn sqlite(op: &'static str) -> impl Fn(rusqlite::Error) -> StoreError {
    move |source| StoreError::Sqlite {
        op,
        source: Arc::new(source),
    }
}

fn json_error(what: &'static str) -> impl Fn(serde_json::Error) -> StoreError {
    move |source| StoreError::Json {
        what,
        source: Arc::new(source),
    }
}

/// Current time as unix milliseconds.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// One durable event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Strictly increasing; never reused.
    pub id: i64,
    /// When the event was persisted, unix milliseconds (UTC).
    pub ts_ms: i64,
    /// Dotted type, e.g. `component.started`, `reconcile.planned`.
    pub kind: String,
    /// The component it concerns, as `kind/name` (e.g. `mcp_server/fs`).
    pub component: Option<String>,
    pub payload: serde_json::Value,
}

pub use crate::event::NewEvent;

/// A [`NewEvent`] whose payload is already serialized, so the writer thread
/// spends its time inserting rather than encoding.
#[derive(Debug, Clone)]
pub struct EncodedEvent {
    pub event: NewEvent,
    pub payload_json: String,
}

impl EncodedEvent {
    pub fn encode(event: NewEvent) -> Self {
        let payload_json = event.payload().to_string();
        Self {
            event,
            payload_json,
        }
    }
}

/// A manifest as it was applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppliedManifest {
    pub id: i64,
    pub hash: String,
    /// The canonical JSON form the caller hashed.
    pub canonical: String,
    pub applied_at_ms: i64,
}

/// The recorded state of one supervised component.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComponentRecord {
    pub kind: String,
    pub name: String,
    /// Owned by the supervisor (`running`, `backoff`, `failed`, …).
    pub state: String,
    pub pid: Option<u32>,
    pub restarts: u32,
    /// When it entered `state`, unix milliseconds.
    pub since_ms: i64,
    pub config_hash: Option<String>,
    /// Last error or other detail.
    pub detail: Option<String>,
}

/// Counters for observing group commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StoreStats {
    /// Write transactions committed.
    pub transactions: u64,
    /// Write jobs committed (each store write method call is one job).
    pub jobs: u64,
}

/// The per-repository state database. Share it as `Arc<Store>`.
#[derive(Debug)]
pub struct Store {
    path: PathBuf,
    writer: Option<WriterHandle>,
    readers: Mutex<Vec<Connection>>,
    counters: Arc<Counters>,
}

/// How long a writable [`Store`] is held, which decides what its commits and
/// its close cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lifetime {
    /// A daemon or a command: commits synced at checkpoints
    /// (`synchronous = NORMAL`), the WAL folded in and removed at close.
    Long,
    /// A short-lived recorder ([`Store::open_brief`]).
    Brief,
}

/// WAL pages (of SQLite's 4 KiB, each with its frame header) past which a
/// brief opener, after its commit and its answer, folds the WAL into the
/// database and truncates it (`wal_checkpoint(TRUNCATE)`): about 512 KiB.
/// SQLite's own auto-checkpoint cannot bound a WAL that only brief openers
/// write: a first connection rebuilds the WAL's index at open and forgets
/// what was folded in, so the WAL is never restarted and grows with every
/// `npc hook run`, and each open reads and checksums all of it (`walChecksumBytes`
/// was the hottest function of a matching hook call at 2 MiB).
pub const WAL_CHECKPOINT_PAGES: u64 = 128;

/// The WAL file's length holding `pages` pages: SQLite's 32-byte header and
/// a 24-byte header per frame of one page (the store keeps SQLite's default
/// page of 4 KiB).
pub(crate) const fn wal_bytes(pages: u64) -> u64 {
    /// SQLite's WAL header, a frame's header, and the page size.
    const HEADER: u64 = 32;
    const FRAME_HEADER: u64 = 24;
    const PAGE: u64 = 4096;
    HEADER + pages * (FRAME_HEADER + PAGE)
}

/// [`WAL_CHECKPOINT_PAGES`] as the WAL file's length.
pub(crate) const WAL_CHECKPOINT_BYTES: u64 = wal_bytes(WAL_CHECKPOINT_PAGES);

impl Store {
    /// `<repo_root>/.npc/state.db`.
    pub fn default_path(repo_root: &Path) -> PathBuf {
        repo_root.join(DEFAULT_STATE_DIR).join(DB_FILE_NAME)
    }

    /// Open (creating it and its directory if needed) the database at
    /// `path` for writing, switch it to WAL and run pending migrations.
    /// One process should hold a writable store for a given file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_as(path.as_ref(), Lifetime::Long)
    }

    /// [`Store::open`] for a process that writes a few events and exits
    /// (`npc hook run`, on every tool call of every agent): each commit is
    /// durable when it returns, at the cost of one `fdatasync` of the WAL
    /// (and, when this opener created the WAL, one of the directory), so a
    /// crash of the process, the system or the power right after loses
    /// nothing; and closing neither checkpoints nor removes the WAL (the
    /// syncs of a checkpoint and two unlinks saved; the next long opener
    /// folds it into the database, and past [`WAL_CHECKPOINT_PAGES`] the
    /// brief opener does, after its answer, so the WAL stays bounded). SQLite's own
    /// `synchronous = FULL` would sync the directory at every open.
    pub fn open_brief(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_as(path.as_ref(), Lifetime::Brief)
    }

    fn open_as(path: &Path, lifetime: Lifetime) -> Result<Self, StoreError> {
        let path = path.to_path_buf();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            // Owner-only, like every state directory (callers in a
            // repository prepare it through `crate::repofs` first).
            std::os::unix::fs::DirBuilderExt::mode(
                std::fs::DirBuilder::new().recursive(true),
                crate::repofs::PRIVATE_DIR_MODE,
            )
            .create(dir)
            .map_err(|e| StoreError::CreateDir {
                path: dir.to_path_buf(),
                source: Arc::new(e),
            })?;
        }
        let open_error = |source| StoreError::Open {
            path: path.clone(),
            source: Arc::new(source),
        };
        // What a brief opener syncs after each commit (see `open_brief`).
        let durable = (lifetime == Lifetime::Brief).then(|| {
            let mut wal = path.clone().into_os_string();
            wal.push("-wal");
            let wal = PathBuf::from(wal);
            writer::Durable {
                sync_dir: !wal.exists(),
                wal,
                synced_changes: 0,
            }
        });
        let mut conn = Connection::open_with_flags(
            &path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX
                | OpenFlags::SQLITE_OPEN_NOFOLLOW,
        )
        .map_err(open_error)?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(open_error)?;
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE_CAPACITY);
        // Switching a new database to WAL takes its exclusive lock, and
        // SQLite answers a switch that would wait on another opener's lock
        // at once, busy handler or not: several processes creating the
        // store together try again until `BUSY_TIMEOUT`.
        let switching = std::time::Instant::now();
        let mode: String = loop {
            match conn.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0)) {
                Err(rusqlite::Error::SqliteFailure(e, _))
                    if e.code == rusqlite::ErrorCode::DatabaseBusy
                        && switching.elapsed() < BUSY_TIMEOUT =>
                {
                    std::thread::sleep(WAL_SWITCH_RETRY);
                }
                other => break other.map_err(open_error)?,
            }
        };
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Sqlite {
                op: "switch to WAL mode",
                source: Arc::new(rusqlite::Error::InvalidParameterName(format!(
                    "journal_mode stayed `{mode}`"
                ))),
            });
        }
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(open_error)?;
        if lifetime == Lifetime::Brief {
            conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)
                .map_err(open_error)?;
            // The writer folds the WAL in itself (see `WAL_CHECKPOINT_PAGES`).
            conn.pragma_update(None, "wal_autocheckpoint", 0)
                .map_err(open_error)?;
        }
        conn.pragma_update(None, "foreign_keys", true)
            .map_err(open_error)?;
        schema::migrate(&mut conn, &path)?;
        let counters = Arc::new(Counters::default());
        let writer = WriterHandle::spawn(conn, Arc::clone(&counters), durable)?;
        Ok(Self {
            path,
            writer: Some(writer),
            readers: Mutex::new(Vec::new()),
            counters,
        })
    }

    /// Open an existing database for reading only, e.g. from the CLI while
    /// the daemon owns the writable store. Every write returns
    /// [`StoreError::ReadOnly`].
    pub fn open_read_only(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
        if !path.is_file() {
            return Err(StoreError::NotFound { path });
        }
        let store = Self {
            path,
            writer: None,
            readers: Mutex::new(Vec::new()),
            counters: Arc::new(Counters::default()),
        };
        let conn = store.open_reader()?;
        // A database with nothing in it yet is one another process is
        // creating right now (its first transaction makes the tables): no
        // store yet, as before the file existed. Emptiness is read first:
        // the creator's one transaction makes the tables and the version
        // together, so a database found with tables has its version (read
        // the other way round, a commit in between looked like version 0).
        if schema::is_empty(&conn)? {
            return Err(StoreError::NotFound { path: store.path });
        }
        let found = schema::current_version(&conn)?;
        if let Ok(mut pool) = store.readers.lock() {
            pool.push(conn);
        }
        let (path, supported) = (store.path.clone(), SCHEMA_VERSION);
        match found {
            f if f > supported => Err(StoreError::SchemaTooNew {
                path,
                found,
                supported,
            }),
            f if f < supported => Err(StoreError::SchemaTooOld {
                path,
                found,
                supported,
            }),
            _ => Ok(store),
        }
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether writes are refused ([`Store::open_read_only`]).
    pub fn is_read_only(&self) -> bool {
        self.writer.is_none()
    }

    /// Group-commit counters since this store was opened.
    pub fn stats(&self) -> StoreStats {
        StoreStats {
            transactions: self.counters.transactions.load(Ordering::Relaxed),
            jobs: self.counters.jobs.load(Ordering::Relaxed),
        }
    }

    // ----- plumbing -------------------------------------------------------

    fn write<T, F>(&self, work: F) -> Pending<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        match &self.writer {
            Some(writer) => writer.submit(work),
            None => Pending::failed(StoreError::ReadOnly),
        }
    }

    /// Run `f` on a pooled read-only connection.
    fn read<T>(
        &self,
        op: &'static str,
        f: impl FnOnce(&Connection) -> rusqlite::Result<T>,
    ) -> Result<T, StoreError> {
        let pooled = self.readers.lock().ok().and_then(|mut pool| pool.pop());
        let conn = match pooled {
            Some(conn) => conn,
            None => self.open_reader()?,
        };
        let result = f(&conn).map_err(sqlite(op));
        if let Ok(mut pool) = self.readers.lock()
            && pool.len() < READER_POOL_SIZE
        {
            pool.push(conn);
        }
        result
    }

    fn open_reader(&self) -> Result<Connection, StoreError> {
        let open_error = |source| StoreError::Open {
            path: self.path.clone(),
            source: Arc::new(source),
        };
        let conn = Connection::open_with_flags(
            &self.path,
            OpenFlags::SQLITE_OPEN_READ_ONLY
                | OpenFlags::SQLITE_OPEN_NO_MUTEX
                | OpenFlags::SQLITE_OPEN_NOFOLLOW,
        )
        .map_err(open_error)?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(open_error)?;
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE_CAPACITY);
        Ok(conn)
    }

    // ----- events ---------------------------------------------------------

    /// Persist `events` in order, in one transaction, returning them with
    /// their ids and timestamp. The bus calls this; other code publishes
    /// through [`crate::bus::EventBus`] so subscribers see the events.
    pub fn append_events(&self, events: Vec<EncodedEvent>) -> Pending<Vec<Event>> {
        self.write(insert_events(events))
    }

    /// Like [`Store::append_events`], but `then` runs ON THE WRITER THREAD
    /// right after the commit, in commit order, with the stored events;
    /// with [`Commit::MayLinger`] the commit may wait a little for company
    /// (see [`LINGER`]). The
    /// bus uses it to fan out without another thread hop; keep `then`
    /// short, non-blocking, and free of any `Arc<Store>` (dropping the last
    /// one there would make the writer wait for itself).
    pub fn append_events_then<C>(&self, events: Vec<EncodedEvent>, commit: Commit, then: C)
    where
        C: FnOnce(Result<Vec<Event>, StoreError>) + Send + 'static,
    {
        match &self.writer {
            Some(writer) => {
                writer.submit_then(events.len() == 1, commit, insert_events(events), then);
            }
            None => then(Err(StoreError::ReadOnly)),
        }
    }

    /// Resolves once every write submitted before it has committed (or
    /// failed). Writes are applied in submission order.
    pub fn flush(&self) -> Pending<()> {
        self.write(|_| Ok(()))
    }

    /// Up to `limit` (at most [`MAX_EVENTS_PER_READ`]) events with
    /// `id > after_id`, oldest first. A range scan on the primary key.
    pub fn events_since(&self, after_id: i64, limit: usize) -> Result<Vec<Event>, StoreError> {
        let limit = limit.min(MAX_EVENTS_PER_READ) as i64;
        self.events_where("id > ?1 ORDER BY id LIMIT ?2", (after_id, limit))
    }

    /// Like [`Store::events_since`], only events of `kind`.
    pub fn events_of_kind_since(
        &self,
        after_id: i64,
        kind: &str,
        limit: usize,
    ) -> Result<Vec<Event>, StoreError> {
        let limit = limit.min(MAX_EVENTS_PER_READ) as i64;
        self.events_where(
            "id > ?1 AND kind = ?2 ORDER BY id LIMIT ?3",
            (after_id, kind, limit),
        )
    }

    /// Up to `limit` (at most [`MAX_EVENTS_PER_READ`]) `tool.denied` events
    /// with `id > after_id` whose payload names run `run_id`, oldest first.
    pub fn denials_of_run(
        &self,
        after_id: i64,
        run_id: &str,
        limit: usize,
    ) -> Result<Vec<Event>, StoreError> {
        let limit = limit.min(MAX_EVENTS_PER_READ) as i64;
        self.events_where(
            "id > ?1 AND kind = 'tool.denied' AND json_valid(payload) \
             AND json_extract(payload, '$.run_id') = ?2 ORDER BY id LIMIT ?3",
            (after_id, run_id, limit),
        )
    }

    /// The events matching `condition` (SQL after `WHERE`, with `params`).
    pub(super) fn events_where(
        &self,
        condition: &str,
        params: impl rusqlite::Params,
    ) -> Result<Vec<Event>, StoreError> {
        let rows = self.read("read events", |conn| {
            conn.prepare_cached(&format!(
                "SELECT id, ts_ms, kind, component, payload FROM events WHERE {condition}"
            ))?
            .query_map(params, |row| {
                Ok((
                    row.get::<_, i64>(0)?,
                    row.get::<_, i64>(1)?,
                    row.get::<_, String>(2)?,
                    row.get::<_, Option<String>>(3)?,
                    row.get::<_, String>(4)?,
                ))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()
        })?;
        rows.into_iter()
            .map(|(id, ts_ms, kind, component, payload)| {
                Ok(Event {
                    id,
                    ts_ms,
                    kind,
                    component,
                    payload: serde_json::from_str(&payload).map_err(json_error("event payload"))?,
                })
            })
            .collect()
    }

    /// The id of the newest event, 0 when there is none.
    /// The id after which the last `n` events lie (0 when there are no
    /// more than `n`): `npc events --limit N` starts after it.
    pub fn id_before_last_events(&self, n: usize) -> Result<i64, StoreError> {
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        self.read("read the recent event ids", |conn| {
            conn.query_row(
                "SELECT COALESCE((SELECT id FROM events ORDER BY id DESC LIMIT 1 OFFSET ?1), 0)",
                [n],
                |row| row.get(0),
            )
        })
    }

    pub fn last_event_id(&self) -> Result<i64, StoreError> {
        self.read("read the last event id", |conn| {
            conn.query_row("SELECT COALESCE(MAX(id), 0) FROM events", [], |row| {
                row.get(0)
            })
        })
    }

    /// Cross-process tail for a reader in another process: return events
    /// after `after_id` as soon as there are any, polling with a backoff
    /// from [`TAIL_POLL_INITIAL`] to [`TAIL_POLL_MAX`]; an empty vector
    /// once `timeout` passes. Blocks the calling thread. Inside the daemon
    /// use [`crate::bus::EventBus::follow`], which does not poll.
    pub fn wait_for_events_after(
        &self,
        after_id: i64,
        limit: usize,
        timeout: Duration,
    ) -> Result<Vec<Event>, StoreError> {
        let deadline = Instant::now() + timeout;
        let mut pause = TAIL_POLL_INITIAL;
        loop {
            let events = self.events_since(after_id, limit)?;
            let now = Instant::now();
            if !events.is_empty() || now >= deadline {
                return Ok(events);
            }
            std::thread::sleep(pause.min(deadline - now));
            pause = (pause * 2).min(TAIL_POLL_MAX);
        }
    }

    // ----- manifests ------------------------------------------------------

    /// Record that the manifest with this canonical JSON form and hash was
    /// applied now. Keeps the last [`MANIFEST_HISTORY_LIMIT`] entries.
    pub fn record_manifest(
        &self,
        hash: impl Into<String>,
        canonical: impl Into<String>,
    ) -> Pending<AppliedManifest> {
        let (hash, canonical) = (hash.into(), canonical.into());
        self.write(move |conn| {
            let applied_at_ms = now_ms();
            conn.execute(
                "INSERT INTO manifests (hash, canonical, applied_at_ms) VALUES (?1, ?2, ?3)",
                (&hash, &canonical, applied_at_ms),
            )
            .map_err(sqlite("record the applied manifest"))?;
            let id = conn.last_insert_rowid();
            conn.execute(
                "DELETE FROM manifests WHERE id <= ?1",
                [id - MANIFEST_HISTORY_LIMIT],
            )
            .map_err(sqlite("prune the manifest history"))?;
            Ok(AppliedManifest {
                id,
                hash,
                canonical,
                applied_at_ms,
            })
        })
    }

    /// The most recently applied manifest, if any.
    pub fn last_manifest(&self) -> Result<Option<AppliedManifest>, StoreError> {
        Ok(self.manifest_history(1)?.into_iter().next())
    }

    /// Up to `limit` applied manifests, newest first.
    pub fn manifest_history(&self, limit: usize) -> Result<Vec<AppliedManifest>, StoreError> {
        self.read("read the manifest history", |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT id, hash, canonical, applied_at_ms FROM manifests ORDER BY id DESC LIMIT ?1",
            )?;
            stmt.query_map([limit as i64], |row| {
                Ok(AppliedManifest {
                    id: row.get(0)?,
                    hash: row.get(1)?,
                    canonical: row.get(2)?,
                    applied_at_ms: row.get(3)?,
                })
            })?
            .collect()
        })
    }

    // ----- components -----------------------------------------------------

    /// Insert or replace the row for `(record.kind, record.name)`.
    pub fn put_component(&self, record: ComponentRecord) -> Pending<()> {
        self.write(move |conn| {
            conn.prepare_cached(
                "INSERT OR REPLACE INTO components
                 (kind, name, state, pid, restarts, since_ms, config_hash, detail)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )
            .and_then(|mut stmt| {
                stmt.execute((
                    &record.kind,
                    &record.name,
                    &record.state,
                    record.pid,
                    record.restarts,
                    record.since_ms,
                    &record.config_hash,
                    &record.detail,
                ))
            })
            .map(drop)
            .map_err(sqlite("record a component state"))
        })
    }

    /// Forget a component; resolves to whether it was recorded.
    pub fn remove_component(
        &self,
        kind: impl Into<String>,
        name: impl Into<String>,
    ) -> Pending<bool> {
        let (kind, name) = (kind.into(), name.into());
        self.write(move |conn| {
            conn.execute(
                "DELETE FROM components WHERE kind = ?1 AND name = ?2",
                (&kind, &name),
            )
            .map(|n| n > 0)
            .map_err(sqlite("remove a component state"))
        })
    }

    /// One component's row.
    pub fn component(&self, kind: &str, name: &str) -> Result<Option<ComponentRecord>, StoreError> {
        self.read("read a component state", |conn| {
            conn.prepare_cached(&format!("{COMPONENT_SELECT} WHERE kind = ?1 AND name = ?2"))?
                .query_row((kind, name), component_from_row)
                .optional()
        })
    }

    /// Every component row, ordered by kind then name.
    pub fn components(&self) -> Result<Vec<ComponentRecord>, StoreError> {
        self.read("read component states", |conn| {
            conn.prepare_cached(&format!("{COMPONENT_SELECT} ORDER BY kind, name"))?
                .query_map([], component_from_row)?
                .collect()
        })
    }

    // ----- managed entries --------------------------------------------------

    /// Entry names npc manages in the native config file at `path`.
    pub fn managed_entries(&self, path: &str) -> Result<BTreeSet<String>, StoreError> {
        self.read("read managed entries", |conn| {
            conn.prepare_cached("SELECT entry FROM managed_entries WHERE path = ?1")?
                .query_map([path], |row| row.get(0))?
                .collect()
        })
    }

    /// Replace the managed entry names for `path` (an empty set forgets it).
    pub fn set_managed_entries(
        &self,
        path: impl Into<String>,
        entries: BTreeSet<String>,
    ) -> Pending<()> {
        let path = path.into();
        self.write(move |conn| {
            let failed = sqlite("record managed entries");
            conn.execute("DELETE FROM managed_entries WHERE path = ?1", [&path])
                .map_err(&failed)?;
            let mut insert = conn
                .prepare_cached("INSERT INTO managed_entries (path, entry) VALUES (?1, ?2)")
                .map_err(&failed)?;
            for entry in &entries {
                insert.execute((&path, entry)).map_err(&failed)?;
            }
            Ok(())
        })
    }

    // ----- trigger state ----------------------------------------------------

    /// Every key recorded for `trigger` (e.g. `next_run_at`, `last_fired_at`).
    pub fn trigger_state(
        &self,
        trigger: &str,
    ) -> Result<BTreeMap<String, serde_json::Value>, StoreError> {
        let rows: Vec<(String, String)> = self.read("read trigger state", |conn| {
            conn.prepare_cached("SELECT key, value FROM trigger_state WHERE trigger = ?1")?
                .query_map([trigger], |row| Ok((row.get(0)?, row.get(1)?)))?
                .collect()
        })?;
        rows.into_iter()
            .map(|(key, value)| {
                Ok((
                    key,
                    serde_json::from_str(&value).map_err(json_error("trigger state"))?,
                ))
            })
            .collect()
    }

    /// Set one key of `trigger`'s state.
    pub fn set_trigger_value(
        &self,
        trigger: impl Into<String>,
        key: impl Into<String>,
        value: &serde_json::Value,
    ) -> Pending<()> {
        let (trigger, key, value) = (trigger.into(), key.into(), value.to_string());
        self.write(move |conn| {
            conn.execute(
                "INSERT OR REPLACE INTO trigger_state (trigger, key, value, updated_at_ms)
                 VALUES (?1, ?2, ?3, ?4)",
                (&trigger, &key, &value, now_ms()),
            )
            .map(drop)
            .map_err(sqlite("record trigger state"))
        })
    }

    /// Forget all of `trigger`'s state (the trigger was removed).
    pub fn clear_trigger_state(&self, trigger: impl Into<String>) -> Pending<()> {
        let trigger = trigger.into();
        self.write(move |conn| {
            conn.execute("DELETE FROM trigger_state WHERE trigger = ?1", [&trigger])
                .map(drop)
                .map_err(sqlite("clear trigger state"))
        })
    }

    // ----- test seams -------------------------------------------------------

    /// Make every following event insert fail (`true`) or work again
    /// (`false`), through a temporary trigger on the writer's connection.
    /// Hold the writer until the returned sender is dropped, so a test can
    /// queue writes that must then share a transaction.
    #[cfg(test)]
    pub(crate) fn pause_writer(&self) -> std::sync::mpsc::Sender<()> {
        let (release, paused) = std::sync::mpsc::channel::<()>();
        // The answer is not awaited: the job runs whether or not anyone waits.
        drop(self.write(move |_| {
            let _ = paused.recv();
            Ok(())
        }));
        release
    }

    #[cfg(test)]
    pub(crate) fn fail_event_inserts(&self, fail: bool) -> Pending<()> {
        self.write(move |conn| {
            let sql = if fail {
                "CREATE TEMP TRIGGER fail_event_inserts BEFORE INSERT ON main.events
                 BEGIN SELECT RAISE(ABORT, 'injected write failure'); END;"
            } else {
                "DROP TRIGGER IF EXISTS temp.fail_event_inserts"
            };
            conn.execute_batch(sql)
                .map_err(sqlite("inject a write failure"))
        })
    }
}

/// The write job inserting `events` in order with one timestamp.
fn insert_events(
    events: Vec<EncodedEvent>,
) -> impl FnOnce(&Connection) -> Result<Vec<Event>, StoreError> + Send + 'static {
    move |conn| {
        let ts_ms = now_ms();
        let mut insert = conn
            .prepare_cached(
                "INSERT INTO events (ts_ms, kind, component, payload) VALUES (?1, ?2, ?3, ?4)",
            )
            .map_err(sqlite("prepare the event insert"))?;
        let mut stored = Vec::with_capacity(events.len());
        for EncodedEvent {
            event,
            payload_json,
        } in events
        {
            let (kind, component, payload) = event.into_parts();
            insert
                .execute((ts_ms, &kind, &component, &payload_json))
                .map_err(sqlite("insert an event"))?;
            stored.push(Event {
                id: conn.last_insert_rowid(),
                ts_ms,
                kind,
                component,
                payload,
            });
        }
        Ok(stored)
    }
}

const COMPONENT_SELECT: &str =
    "SELECT kind, name, state, pid, restarts, since_ms, config_hash, detail FROM components";

fn component_from_row(row: &Row<'_>) -> rusqlite::Result<ComponentRecord> {
    Ok(ComponentRecord {
        kind: row.get(0)?,
        name: row.get(1)?,
        state: row.get(2)?,
        pid: row.get(3)?,
        restarts: row.get(4)?,
        since_ms: row.get(5)?,
        config_hash: row.get(6)?,
        detail: row.get(7)?,
    })
}

#[cfg(test)]
mod tests;
