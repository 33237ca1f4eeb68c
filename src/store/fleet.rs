//! The fleet's seam: [`FleetQueue`], what a worker (`npc worker`) needs of a
//! run queue shared by many processes, whatever holds it — the embedded
//! SQLite [`Store`] (one machine) or PostgreSQL ([`super::pg::PgStore`], a
//! fleet). A claim is a [`Lease`]: the run moves `queued` → `running` for
//! one worker until `expires_at_ms`, renewed by [`FleetQueue::heartbeat`].
//! Every write under a lease names its fencing token, which every claim and
//! every rescue moves on, so a worker that wakes up after its lease ended
//! has its late writes refused ([`StoreError::Fenced`]) and stops. A lease
//! that ran out is rescued by [`FleetQueue::rescue_expired`]: the run becomes
//! `interrupted` (at most once) and is never carried out twice at once.
//!
//! Rows the daemon claims its own way ([`Store::claim_run`]) hold no lease
//! and are never rescued here; their owner process decides.

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension};
use serde::Serialize;

use super::queue::{Enqueued, NewRun, RUN_SELECT_COLUMNS, RunRow, state};
use super::{EncodedEvent, Event, NewEvent, Store, StoreError, now_ms, sqlite};

/// What a [`FleetQueue`] call resolves to.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// Longest lease a claim or heartbeat may ask for.
pub const MAX_LEASE: Duration = Duration::from_secs(3_600);
/// What `run.interrupted` says of a run whose lease ran out.
pub const LEASE_EXPIRED_DETAIL: &str =
    "its worker stopped renewing the lease (gone, cut off or paused); not run again";
/// How often [`FleetQueue::wait_for_work`] looks again when nothing wakes it.
pub const WORK_POLL: Duration = Duration::from_millis(500);

/// A worker's hold on one running run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Lease {
    pub run_id: String,
    pub worker: String,
    /// The fencing token: every write under this lease names it.
    pub token: i64,
    /// When the lease ends unless renewed, unix milliseconds (the store's
    /// clock).
    pub expires_at_ms: i64,
}

/// A run a worker claimed.
#[derive(Debug, Clone, PartialEq)]
pub struct Claimed {
    pub run: RunRow,
    pub lease: Lease,
}

/// A run queue many workers share (see the module docs).
pub trait FleetQueue: Send + Sync + Debug {
    /// Record a run (the semantics of [`Store::enqueue_run`]); wakes
    /// waiting workers once committed.
    fn enqueue(&self, run: NewRun) -> StoreFuture<'_, Enqueued>;
    /// Claim the oldest queued run for `worker` for `lease`, if any. Two
    /// workers never claim the same run.
    fn claim<'a>(&'a self, worker: &'a str, lease: Duration) -> StoreFuture<'a, Option<Claimed>>;
    /// Renew `lease` for `lease_for` from now; [`StoreError::Fenced`] when
    /// it is no longer held (expired, rescued, claimed again).
    fn heartbeat<'a>(&'a self, lease: &'a Lease, lease_for: Duration) -> StoreFuture<'a, Lease>;
    /// Record the end of the run `lease` holds; [`StoreError::Fenced`] when
    /// the lease is no longer held (nothing written).
    fn finish<'a>(
        &'a self,
        lease: &'a Lease,
        end: &'static str,
        detail: Option<String>,
    ) -> StoreFuture<'a, ()>;
    /// Append a run's events under its lease, in order; refused (nothing
    /// written) when the lease is no longer held.
    fn append_fenced<'a>(
        &'a self,
        lease: &'a Lease,
        events: Vec<NewEvent>,
    ) -> StoreFuture<'a, Vec<Event>>;
    /// Append events outside any lease (a rescuer's `run.interrupted`).
    fn append_events(&self, events: Vec<NewEvent>) -> StoreFuture<'_, Vec<Event>>;
    /// Running runs whose lease ran out become `interrupted` (their token
    /// moves on, so their worker's late writes are refused); returns their
    /// ids.
    fn rescue_expired(&self) -> StoreFuture<'_, Vec<String>>;
    /// Run `id`, if stored.
    fn run<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<RunRow>>;
    /// Events with ids above `after`, oldest first, at most `limit`.
    fn events_after(&self, after: i64, limit: usize) -> StoreFuture<'_, Vec<Event>>;
    /// Resolve when a run may have been queued, or after `at_most`.
    fn wait_for_work(&self, at_most: Duration) -> StoreFuture<'_, ()>;
}

/// A worker as it joins its fleet's roster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WorkerInfo {
    /// Its name in the fleet (`host/pid:start-time`).
    pub id: String,
    pub host: String,
    /// The npc version it runs.
    pub version: String,
    /// Its lease: a worker whose last heartbeat is older is lost.
    pub lease_ms: i64,
}

/// How a worker stands on the roster.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum WorkerState {
    /// Heartbeating within its lease.
    Alive,
    /// No heartbeat for longer than its lease: killed, cut off or paused.
    Lost,
    /// Stopped cleanly (SIGINT or SIGTERM).
    Stopped,
}

/// A worker as `npc workers` (and the API's `GET /api/v1/fleet/workers`)
/// shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct WorkerRow {
    pub id: String,
    pub host: String,
    pub version: String,
    pub state: WorkerState,
    pub started_at_ms: i64,
    /// Milliseconds since its last heartbeat (the store's clock).
    pub heartbeat_age_ms: i64,
    pub lease_ms: i64,
    /// Ids of the runs it holds now.
    pub running: Vec<String>,
}

/// Stopped or lost workers stay on the roster this long after their last
/// heartbeat, then a joining worker removes them.
pub const ROSTER_KEEP: Duration = Duration::from_secs(24 * 3_600);

/// The fleet's roster of workers (PostgreSQL; one machine has no fleet).
pub trait Roster: Send + Sync + Debug {
    /// Put `worker` on the roster (again, after a restart of the same id),
    /// heartbeating now; forgets workers gone for [`ROSTER_KEEP`].
    fn enlist<'a>(&'a self, worker: &'a WorkerInfo) -> StoreFuture<'a, ()>;
    /// Worker `id` is alive now.
    fn beat<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()>;
    /// Worker `id` stopped cleanly.
    fn leave<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()>;
    /// Every worker on the roster, newest first.
    fn workers(&self) -> StoreFuture<'_, Vec<WorkerRow>>;
}

/// Milliseconds of `lease`, bounded by [`MAX_LEASE`].
pub(super) fn lease_ms(lease: Duration) -> i64 {
    i64::try_from(lease.min(MAX_LEASE).as_millis()).unwrap_or(i64::MAX)
}

/// The SQLite store as a [`FleetQueue`]: one machine's workers share it
/// through its writer thread, which serialises every claim.
#[derive(Debug)]
pub struct SqliteQueue {
    store: Arc<Store>,
    wake: tokio::sync::Notify,
}

impl SqliteQueue {
    pub fn new(store: Arc<Store>) -> Self {
        Self {
            store,
            wake: tokio::sync::Notify::new(),
        }
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }
}

fn claim_sqlite(
    conn: &Connection,
    worker: &str,
    lease: i64,
) -> Result<Option<Claimed>, StoreError> {
    let now = now_ms();
    let sql = format!(
        "UPDATE runs SET state = 'running', detail = NULL, started_at_ms = ?1, owner = ?2,
         lease_token = lease_token + 1, lease_expires_at_ms = ?1 + ?3
         WHERE seq = (SELECT seq FROM runs WHERE state = 'queued' ORDER BY seq LIMIT 1)
         RETURNING {RUN_SELECT_COLUMNS}, lease_token, lease_expires_at_ms"
    );
    let found = conn
        .prepare_cached(&sql)
        .and_then(|mut s| {
            s.query_row((now, worker, lease), |row| {
                let raw = super::queue::run_from_row(row)?;
                let token = row.get::<_, i64>("lease_token")?;
                Ok((raw, token, row.get::<_, i64>("lease_expires_at_ms")?))
            })
            .optional()
        })
        .map_err(sqlite("claim a run"))?;
    let Some((raw, token, expires_at_ms)) = found else {
        return Ok(None);
    };
    let run = super::queue::decode(vec![raw])?
        .pop()
        .ok_or(StoreError::Task("a claimed row vanished".into()))?;
    let lease = Lease {
        run_id: run.id.clone(),
        worker: worker.to_string(),
        token,
        expires_at_ms,
    };
    Ok(Some(Claimed { run, lease }))
}

/// Whether `lease` is still held, in the writer's transaction.
fn held_sqlite(conn: &Connection, lease: &Lease) -> Result<bool, StoreError> {
    conn.prepare_cached(
        "SELECT 1 FROM runs WHERE id = ?1 AND lease_token = ?2 AND state = 'running'
         AND lease_expires_at_ms >= ?3",
    )
    .and_then(|mut s| {
        s.query_row((&lease.run_id, lease.token, now_ms()), |r| {
            r.get::<_, i64>(0)
        })
        .optional()
    })
    .map(|found| found.is_some())
    .map_err(sqlite("check a lease"))
}

fn fenced(lease: &Lease) -> StoreError {
    StoreError::Fenced {
        run: lease.run_id.clone(),
        token: lease.token,
    }
}

impl FleetQueue for SqliteQueue {
    fn enqueue(&self, run: NewRun) -> StoreFuture<'_, Enqueued> {
        Box::pin(async move {
            let outcome = self.store.enqueue_run(run).await?;
            self.wake.notify_one();
            Ok(outcome)
        })
    }

    fn claim<'a>(&'a self, worker: &'a str, lease: Duration) -> StoreFuture<'a, Option<Claimed>> {
        let worker = worker.to_string();
        let lease = lease_ms(lease);
        Box::pin(
            self.store
                .write(move |conn| claim_sqlite(conn, &worker, lease)),
        )
    }

    fn heartbeat<'a>(&'a self, lease: &'a Lease, lease_for: Duration) -> StoreFuture<'a, Lease> {
        let held = lease.clone();
        let ms = lease_ms(lease_for);
        Box::pin(self.store.write(move |conn| {
            if !held_sqlite(conn, &held)? {
                return Err(fenced(&held));
            }
            let expires_at_ms = now_ms() + ms;
            conn.prepare_cached(
                "UPDATE runs SET lease_expires_at_ms = ?3 WHERE id = ?1 AND lease_token = ?2",
            )
            .and_then(|mut s| s.execute((&held.run_id, held.token, expires_at_ms)))
            .map_err(sqlite("renew a lease"))?;
            Ok(Lease {
                expires_at_ms,
                ..held
            })
        }))
    }

    fn finish<'a>(
        &'a self,
        lease: &'a Lease,
        end: &'static str,
        detail: Option<String>,
    ) -> StoreFuture<'a, ()> {
        let held = lease.clone();
        Box::pin(self.store.write(move |conn| {
            if !held_sqlite(conn, &held)? {
                return Err(fenced(&held));
            }
            conn.prepare_cached(
                "UPDATE runs SET state = ?3, detail = ?4, finished_at_ms = ?5,
                 lease_expires_at_ms = NULL WHERE id = ?1 AND lease_token = ?2",
            )
            .and_then(|mut s| s.execute((&held.run_id, held.token, end, &detail, now_ms())))
            .map(drop)
            .map_err(sqlite("finish a run"))
        }))
    }

    fn append_fenced<'a>(
        &'a self,
        lease: &'a Lease,
        events: Vec<NewEvent>,
    ) -> StoreFuture<'a, Vec<Event>> {
        let held = lease.clone();
        let encoded: Vec<EncodedEvent> = events.into_iter().map(EncodedEvent::encode).collect();
        let insert = super::insert_events(encoded);
        Box::pin(self.store.write(move |conn| {
            if !held_sqlite(conn, &held)? {
                return Err(fenced(&held));
            }
            insert(conn)
        }))
    }

    fn append_events(&self, events: Vec<NewEvent>) -> StoreFuture<'_, Vec<Event>> {
        let encoded = events.into_iter().map(EncodedEvent::encode).collect();
        Box::pin(self.store.append_events(encoded))
    }

    fn rescue_expired(&self) -> StoreFuture<'_, Vec<String>> {
        Box::pin(self.store.write(|conn| {
            conn.prepare_cached(
                "UPDATE runs SET state = ?1, detail = ?2, finished_at_ms = ?3,
                 lease_token = lease_token + 1, lease_expires_at_ms = NULL
                 WHERE state = 'running' AND lease_expires_at_ms < ?3 RETURNING id",
            )
            .and_then(|mut s| {
                s.query_map((state::INTERRUPTED, LEASE_EXPIRED_DETAIL, now_ms()), |r| {
                    r.get(0)
                })?
                .collect()
            })
            .map_err(sqlite("rescue expired leases"))
        }))
    }

    fn run<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<RunRow>> {
        let store = self.store.clone();
        let id = id.to_string();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || store.run_row(&id))
                .await
                .map_err(|e| StoreError::Task(e.to_string()))?
        })
    }

    fn events_after(&self, after: i64, limit: usize) -> StoreFuture<'_, Vec<Event>> {
        let store = self.store.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || store.events_since(after, limit))
                .await
                .map_err(|e| StoreError::Task(e.to_string()))?
        })
    }

    fn wait_for_work(&self, at_most: Duration) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let _ = tokio::time::timeout(at_most.min(WORK_POLL), self.wake.notified()).await;
            Ok(())
        })
    }
}
