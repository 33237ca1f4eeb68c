//! The fleet's roster in PostgreSQL ([`Roster`]): one `npc_workers` row per
//! worker, its heartbeat in the database's clock, and the runs it holds
//! read from `npc_runs` (`owner`), so the roster and the queue never
//! disagree about who runs what.

use std::sync::LazyLock;

use crate::store::fleet::{ROSTER_KEEP, Roster, StoreFuture, WorkerInfo, WorkerRow, WorkerState};
use crate::store::{StoreError, untrusted};

use super::{PgStore, bounded, pg_error};

/// Rows `npc workers` reads at most.
pub const MAX_ROSTER_ROWS: i64 = 1_000;

/// The roster: `$1` the fleet, `$2` the most rows. Other machines wrote
/// it, so each text is cut to [`untrusted::MAX_NAME_CHARS`] and each
/// worker lists at most [`untrusted::MAX_LISTED_RUNNING`] running runs.
static ROSTER_SQL: LazyLock<String> = LazyLock::new(|| {
    let name = |col: &str| untrusted::pg_text(col, untrusted::MAX_NAME_CHARS);
    format!(
        "SELECT {}, {}, {}, w.started_at_ms,
           npc_now_ms() - w.heartbeat_at_ms, w.lease_ms, w.stopped_at_ms IS NOT NULL,
           ARRAY(SELECT {} FROM npc_runs r WHERE r.fleet = w.fleet AND r.owner = w.id
                 AND r.state = 'running' ORDER BY r.id LIMIT {})
         FROM npc_workers w WHERE w.fleet = $1
         ORDER BY w.started_at_ms DESC, w.id LIMIT $2",
        name("w.id"),
        name("w.host"),
        name("w.version"),
        name("r.id"),
        untrusted::MAX_LISTED_RUNNING,
    )
});

impl PgStore {
    async fn enlist_worker(&self, worker: &WorkerInfo) -> Result<(), StoreError> {
        let failed = pg_error("join the roster");
        let client = self.client().await?;
        client
            .execute(
                "DELETE FROM npc_workers WHERE fleet = $1 AND heartbeat_at_ms < npc_now_ms() - $2",
                &[&self.fleet(), &keep_ms()],
            )
            .await
            .map_err(&failed)?;
        client
            .execute(
                "INSERT INTO npc_workers (fleet, id, host, version, started_at_ms, heartbeat_at_ms, lease_ms)
                 VALUES ($1, $2, $3, $4, npc_now_ms(), npc_now_ms(), $5)
                 ON CONFLICT (fleet, id) DO UPDATE SET host = EXCLUDED.host,
                   version = EXCLUDED.version, started_at_ms = EXCLUDED.started_at_ms,
                   heartbeat_at_ms = EXCLUDED.heartbeat_at_ms, lease_ms = EXCLUDED.lease_ms,
                   stopped_at_ms = NULL",
                &[&self.fleet(), &worker.id, &worker.host, &worker.version, &worker.lease_ms],
            )
            .await
            .map_err(&failed)?;
        Ok(())
    }

    async fn set_worker(&self, id: &str, sql: &str, op: &'static str) -> Result<(), StoreError> {
        let client = self.client().await?;
        client
            .execute(sql, &[&self.fleet(), &id])
            .await
            .map_err(pg_error(op))?;
        Ok(())
    }

    async fn roster(&self) -> Result<Vec<WorkerRow>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(&*ROSTER_SQL, &[&self.fleet(), &MAX_ROSTER_ROWS])
            .await
            .map_err(pg_error("read the roster"))?;
        Ok(rows
            .iter()
            .map(|row| {
                let age: i64 = row.get(4);
                let lease: i64 = row.get(5);
                let state = if row.get::<_, bool>(6) {
                    WorkerState::Stopped
                } else if age > lease {
                    WorkerState::Lost
                } else {
                    WorkerState::Alive
                };
                WorkerRow {
                    id: untrusted::text(row.get(0)),
                    host: untrusted::text(row.get(1)),
                    version: untrusted::text(row.get(2)),
                    state,
                    started_at_ms: row.get(3),
                    heartbeat_age_ms: age,
                    lease_ms: lease,
                    running: row
                        .get::<_, Vec<String>>(7)
                        .into_iter()
                        .map(untrusted::text)
                        .collect(),
                }
            })
            .collect())
    }
}

/// [`ROSTER_KEEP`] in milliseconds.
fn keep_ms() -> i64 {
    i64::try_from(ROSTER_KEEP.as_millis()).unwrap_or(i64::MAX)
}

impl Roster for PgStore {
    fn enlist<'a>(&'a self, worker: &'a WorkerInfo) -> StoreFuture<'a, ()> {
        Box::pin(bounded("join the roster", self.enlist_worker(worker)))
    }

    fn beat<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
        let beat = self.set_worker(
            id,
            "UPDATE npc_workers SET heartbeat_at_ms = npc_now_ms(), stopped_at_ms = NULL
             WHERE fleet = $1 AND id = $2",
            "renew the roster's heartbeat",
        );
        Box::pin(bounded("renew the roster's heartbeat", beat))
    }

    fn leave<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
        let leave = self.set_worker(
            id,
            "UPDATE npc_workers SET stopped_at_ms = npc_now_ms() WHERE fleet = $1 AND id = $2",
            "leave the roster",
        );
        Box::pin(bounded("leave the roster", leave))
    }

    fn workers(&self) -> StoreFuture<'_, Vec<WorkerRow>> {
        Box::pin(bounded("read the roster", self.roster()))
    }
}
