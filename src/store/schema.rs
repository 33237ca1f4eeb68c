//! Schema migrations for the state database. Each migration is applied once,
//! in order, inside one immediate transaction, and recorded in the
//! `schema_migrations` version table with the time it was applied. A
//! database written by a newer npc (a version this build does not know) is
//! refused rather than guessed at.

use rusqlite::{Connection, OptionalExtension, TransactionBehavior};

use super::{StoreError, now_ms, sqlite};

/// One schema step: the version it produces and the SQL that gets there.
struct Migration {
    version: i64,
    sql: &'static str,
}

/// Every migration, oldest first. Append only; never edit a shipped step.
const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        sql: r#"
        CREATE TABLE events (
            id        INTEGER PRIMARY KEY AUTOINCREMENT,
            ts_ms     INTEGER NOT NULL,
            kind      TEXT    NOT NULL,
            component TEXT,
            payload   TEXT    NOT NULL
        );
        CREATE INDEX events_by_component ON events (component, id);

        CREATE TABLE manifests (
            id            INTEGER PRIMARY KEY AUTOINCREMENT,
            hash          TEXT    NOT NULL,
            canonical     TEXT    NOT NULL,
            applied_at_ms INTEGER NOT NULL
        );

        CREATE TABLE components (
            kind        TEXT    NOT NULL,
            name        TEXT    NOT NULL,
            state       TEXT    NOT NULL,
            pid         INTEGER,
            restarts    INTEGER NOT NULL DEFAULT 0,
            since_ms    INTEGER NOT NULL,
            config_hash TEXT,
            detail      TEXT,
            PRIMARY KEY (kind, name)
        ) WITHOUT ROWID;

        CREATE TABLE managed_entries (
            path  TEXT NOT NULL,
            entry TEXT NOT NULL,
            PRIMARY KEY (path, entry)
        ) WITHOUT ROWID;

        CREATE TABLE trigger_state (
            trigger       TEXT    NOT NULL,
            key           TEXT    NOT NULL,
            value         TEXT    NOT NULL,
            updated_at_ms INTEGER NOT NULL,
            PRIMARY KEY (trigger, key)
        ) WITHOUT ROWID;
    "#,
    },
    Migration {
        // The durable run queue of triggers (`store::queue`). A firing with a
        // dedupe key (a cron fire time, a webhook delivery id) is stored at
        // most once per trigger: the UNIQUE constraint makes a duplicate
        // structurally impossible.
        version: 2,
        sql: r#"
        CREATE TABLE trigger_runs (
            seq            INTEGER PRIMARY KEY AUTOINCREMENT,
            id             TEXT    NOT NULL UNIQUE,
            trigger        TEXT    NOT NULL,
            origin         TEXT    NOT NULL,
            dedupe_key     TEXT,
            payload        TEXT    NOT NULL,
            state          TEXT    NOT NULL,
            enqueued_at_ms INTEGER NOT NULL,
            started_at_ms  INTEGER,
            finished_at_ms INTEGER,
            detail         TEXT,
            UNIQUE (trigger, dedupe_key)
        );
        CREATE INDEX trigger_runs_by_state ON trigger_runs (state, seq);
        CREATE INDEX trigger_runs_by_trigger ON trigger_runs (trigger, state, seq);
    "#,
    },
    Migration {
        // Sessions of `npc acp` (`store::acp`): a session and the runs its
        // prompts started, in order; the updates it streamed are the runs'
        // events in `events` (component `run.<id>`), replayed by
        // `session/load`. Additive: no existing table changes.
        version: 3,
        sql: r#"
        CREATE TABLE acp_sessions (
            id            TEXT    PRIMARY KEY,
            profile       TEXT    NOT NULL,
            cwd           TEXT    NOT NULL,
            title         TEXT,
            forked_from   TEXT,
            created_at_ms INTEGER NOT NULL,
            updated_at_ms INTEGER NOT NULL
        );
        CREATE INDEX acp_sessions_by_update ON acp_sessions (updated_at_ms, id);
        CREATE TABLE acp_session_runs (
            session_id TEXT    NOT NULL,
            seq        INTEGER NOT NULL,
            run_id     TEXT    NOT NULL,
            prompt     TEXT    NOT NULL,
            PRIMARY KEY (session_id, seq)
        );
    "#,
    },
    Migration {
        // One notion of a run: the queue holds every run, whatever started
        // it (`runs`, was `trigger_runs`), and a running row names the
        // process carrying it out (`owner`, `pid:start-time`), so a daemon
        // interrupts only runs whose process is gone. Runs that `npc run` and
        // `npc acp` recorded only as events before become rows (`@manual`,
        // origin `cli` or `acp`), in their order, with their outcome.
        version: 4,
        sql: r#"
        ALTER TABLE trigger_runs RENAME TO runs;
        ALTER TABLE runs ADD COLUMN owner TEXT;
        DROP INDEX trigger_runs_by_state;
        DROP INDEX trigger_runs_by_trigger;
        CREATE INDEX runs_by_state ON runs (state, seq);
        CREATE INDEX runs_by_trigger ON runs (trigger, state, seq);
        INSERT OR IGNORE INTO runs (id, trigger, origin, dedupe_key, payload, state,
                                    enqueued_at_ms, started_at_ms, finished_at_ms, detail)
        SELECT json_extract(s.payload, '$.run_id'),
               '@manual',
               CASE WHEN json_extract(s.payload, '$.source') = 'acp' THEN 'acp' ELSE 'cli' END,
               NULL,
               json_object('run', json_object('profile', json_extract(s.payload, '$.profile'))),
               COALESCE(
                   (SELECT CASE json_extract(f.payload, '$.outcome')
                               WHEN 'hook_failed' THEN 'failed'
                               ELSE json_extract(f.payload, '$.outcome') END
                    FROM events f
                    WHERE f.component = s.component AND f.kind = 'run.finished'
                      AND json_valid(f.payload)
                      AND json_type(f.payload, '$.outcome') = 'text'
                    ORDER BY f.id LIMIT 1),
                   'interrupted'),
               s.ts_ms,
               s.ts_ms,
               (SELECT f.ts_ms FROM events f
                WHERE f.component = s.component AND f.kind = 'run.finished'
                ORDER BY f.id LIMIT 1),
               NULL
        FROM events s
        WHERE s.component >= 'run.' AND s.component < 'run/' AND s.kind = 'run.started'
          AND json_valid(s.payload)
          AND json_type(s.payload, '$.run_id') = 'text'
          AND s.component = 'run.' || json_extract(s.payload, '$.run_id')
        ORDER BY s.id;
    "#,
    },
    Migration {
        // Webhook replay keys, each until its scheme's window ends, checked
        // in the job that enqueues the run, so a replay is refused across
        // restarts whatever header it carries. Since version 6 it holds
        // only the keys of pruned runs (`runs.replay_until_ms`).
        version: 5,
        sql: r#"
        CREATE TABLE webhook_replays (
            trigger       TEXT    NOT NULL,
            key           TEXT    NOT NULL,
            expires_at_ms INTEGER NOT NULL,
            PRIMARY KEY (trigger, key)
        ) WITHOUT ROWID;
        CREATE INDEX webhook_replays_by_expiry ON webhook_replays (trigger, expires_at_ms);
    "#,
    },
    Migration {
        // A run's dedupe key is its replay key while the row lives (its
        // UNIQUE index already holds it, so accepting a delivery writes no
        // second index); `replay_until_ms` says how long it must outlive
        // the row: pruning moves unexpired keys to `webhook_replays`.
        version: 6,
        sql: r#"
        ALTER TABLE runs ADD COLUMN replay_until_ms INTEGER;
    "#,
    },
    Migration {
        // Worktree runs: the key the overlap policy applies within (a
        // trigger's `concurrency_key`, rendered at enqueue), what a run
        // handed back (its branch, base, head and diff stat, as JSON), and
        // the worktree kept after it ended (NULL once removed).
        version: 7,
        sql: r#"
        ALTER TABLE runs ADD COLUMN concurrency_key TEXT;
        ALTER TABLE runs ADD COLUMN result TEXT;
        ALTER TABLE runs ADD COLUMN worktree TEXT;
        CREATE INDEX runs_kept_worktrees ON runs (finished_at_ms) WHERE worktree IS NOT NULL;
    "#,
    },
    Migration {
        // Leases of the fleet's run queue (`store::fleet`): a run claimed
        // through `RunQueue::claim` carries a fencing token (bumped by every
        // claim and every rescue) and the time its lease ends; rows claimed
        // the daemon's way keep no lease (NULL) and are never rescued by one.
        version: 8,
        sql: r#"
        ALTER TABLE runs ADD COLUMN lease_token INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE runs ADD COLUMN lease_expires_at_ms INTEGER;
        CREATE INDEX runs_by_lease ON runs (lease_expires_at_ms) WHERE lease_expires_at_ms IS NOT NULL;
    "#,
    },
    Migration {
        // The fleet's policies (`store::fleet`): the attempt a run is at and
        // the attempts its trigger allows (`retries` + 1, written at
        // enqueue), so a rescuer queues a lost run again without a manifest;
        // the run that replaced a running one (overlap `replace`); and an
        // index for the claim's "one running run per trigger and key".
        version: 9,
        sql: r#"
        ALTER TABLE runs ADD COLUMN attempt INTEGER NOT NULL DEFAULT 1;
        ALTER TABLE runs ADD COLUMN attempts INTEGER NOT NULL DEFAULT 1;
        ALTER TABLE runs ADD COLUMN replaced_by TEXT;
        CREATE INDEX runs_by_key ON runs (trigger, concurrency_key, state, seq);
    "#,
    },
    Migration {
        // The code a fleet's run starts from (`store::queue::RunCode`): the
        // remote URL its ingress recorded and the commit, kept on the row a
        // worker adopts.
        version: 10,
        sql: r#"
        ALTER TABLE runs ADD COLUMN remote TEXT;
        ALTER TABLE runs ADD COLUMN start_commit TEXT;
    "#,
    },
    Migration {
        // Pending approvals of runs (`store::approvals`): an `ask` of an
        // unattended run waits here for a person's answer.
        version: 11,
        sql: super::approvals::MIGRATION,
    },
    Migration {
        // Workflow runs and their steps' journal (`store::workflows`).
        version: 12,
        sql: super::workflows::MIGRATION,
    },
];

/// The schema version this build writes and reads.
pub const SCHEMA_VERSION: i64 = 12;

const CREATE_VERSION_TABLE: &str = "CREATE TABLE IF NOT EXISTS schema_migrations (
    version       INTEGER PRIMARY KEY,
    applied_at_ms INTEGER NOT NULL
)";

/// Whether the database holds no table at all (a file just created).
pub(super) fn is_empty(conn: &Connection) -> Result<bool, StoreError> {
    conn.query_row("SELECT count(*) FROM sqlite_master", [], |row| {
        row.get::<_, i64>(0)
    })
    .map(|n| n == 0)
    .map_err(sqlite("read the schema"))
}

/// The highest applied version, or 0 for a database with no version table.
pub(super) fn current_version(conn: &Connection) -> Result<i64, StoreError> {
    let has_table: Option<i64> = conn
        .query_row(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'",
            [],
            |row| row.get(0),
        )
        .optional()
        .map_err(sqlite("read the schema version"))?;
    if has_table.is_none() {
        return Ok(0);
    }
    conn.query_row(
        "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
        [],
        |row| row.get(0),
    )
    .map_err(sqlite("read the schema version"))
}

/// Bring the database up to [`SCHEMA_VERSION`], returning how many steps ran.
pub(super) fn migrate(conn: &mut Connection, path: &std::path::Path) -> Result<usize, StoreError> {
    // Up to date (every open but the first after an upgrade): read, without
    // taking the write lock for an empty transaction.
    if current_version(conn)? == SCHEMA_VERSION {
        return Ok(0);
    }
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(sqlite("begin the migration transaction"))?;
    tx.execute_batch(CREATE_VERSION_TABLE)
        .map_err(sqlite("create the version table"))?;
    let found = current_version(&tx)?;
    if found > SCHEMA_VERSION {
        return Err(StoreError::SchemaTooNew {
            path: path.to_path_buf(),
            found,
            supported: SCHEMA_VERSION,
        });
    }
    let mut applied = 0;
    for step in MIGRATIONS.iter().filter(|m| m.version > found) {
        tx.execute_batch(step.sql)
            .map_err(|source| StoreError::Migrate {
                version: step.version,
                source: source.into(),
            })?;
        tx.execute(
            "INSERT INTO schema_migrations (version, applied_at_ms) VALUES (?1, ?2)",
            (step.version, now_ms()),
        )
        .map_err(sqlite("record a migration"))?;
        applied += 1;
    }
    tx.commit().map_err(sqlite("commit the migrations"))?;
    Ok(applied)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_ordered_and_end_at_the_schema_version() {
        let versions: Vec<i64> = MIGRATIONS.iter().map(|m| m.version).collect();
        let mut sorted = versions.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(versions, sorted, "versions strictly increase");
        assert_eq!(versions.last().copied(), Some(SCHEMA_VERSION));
    }

    /// A store of schema 3 whose runs `npc run` and `npc acp` recorded as
    /// events only: migration 4 makes each a row, with its outcome.
    #[test]
    fn runs_recorded_only_as_events_become_rows() {
        let mut conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(CREATE_VERSION_TABLE).unwrap();
        for step in MIGRATIONS.iter().filter(|m| m.version <= 3) {
            conn.execute_batch(step.sql).unwrap();
            conn.execute(
                "INSERT INTO schema_migrations (version, applied_at_ms) VALUES (?1, 0)",
                [step.version],
            )
            .unwrap();
        }
        let event = |ts: i64, kind: &str, component: &str, payload: &str| {
            conn.execute(
                "INSERT INTO events (ts_ms, kind, component, payload) VALUES (?1, ?2, ?3, ?4)",
                (ts, kind, component, payload),
            )
            .unwrap();
        };
        event(
            1,
            "run.started",
            "run.run-a",
            r#"{"run_id":"run-a","profile":"dev"}"#,
        );
        event(
            2,
            "run.finished",
            "run.run-a",
            r#"{"run_id":"run-a","outcome":"hook_failed"}"#,
        );
        event(
            3,
            "run.started",
            "run.run-b",
            r#"{"run_id":"run-b","profile":"p","source":"acp"}"#,
        );
        // Hostile rows: not JSON, a run id of another component, a number.
        event(4, "run.started", "run.run-c", "not json");
        event(5, "run.started", "run.run-d", r#"{"run_id":"run-x"}"#);
        event(6, "run.started", "run.run-e", r#"{"run_id":7}"#);
        conn.execute(
            "INSERT INTO trigger_runs (id, trigger, origin, payload, state, enqueued_at_ms)
             VALUES ('run-q', 't', 'cron', '{}', 'succeeded', 0)",
            [],
        )
        .unwrap();
        let steps = migrate(&mut conn, std::path::Path::new("x")).unwrap();
        assert_eq!(
            steps as i64,
            SCHEMA_VERSION - 3,
            "every step after version 3"
        );
        let rows: Vec<(String, String, String, String, String, Option<i64>)> = conn
            .prepare(
                "SELECT id, trigger, origin, state, payload, finished_at_ms FROM runs ORDER BY seq",
            )
            .unwrap()
            .query_map([], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                ))
            })
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        let ids: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
        assert_eq!(ids, ["run-q", "run-a", "run-b"]);
        assert_eq!(rows[1].1, "@manual");
        assert_eq!((rows[1].2.as_str(), rows[1].3.as_str()), ("cli", "failed"));
        assert_eq!(rows[1].5, Some(2));
        assert_eq!(rows[1].4, r#"{"run":{"profile":"dev"}}"#);
        assert_eq!(
            (rows[2].2.as_str(), rows[2].3.as_str()),
            ("acp", "interrupted")
        );
    }
}
