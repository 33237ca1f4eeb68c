//! The fleet's seam: [`FleetQueue`], what a worker (`npc worker`) needs of a
//! run queue shared by many processes, whatever holds it — the embedded
//! SQLite [`Store`] (one machine) or PostgreSQL ([`super::pg::PgStore`], a
//! fleet). A claim is a [`Lease`]: the run moves `queued` → `running` for
//! one worker until `expires_at_ms`, renewed by [`FleetQueue::heartbeat`].
//! Every write under a lease names its fencing token, which every claim,
//! release and rescue moves on, so a worker that wakes up after its run
//! was taken from it has its late writes refused ([`StoreError::Fenced`])
//! and stops. A write is taken while the run is still running under its
//! token even when the lease's time has passed ([`LeaseCheck`]): nobody
//! took the run, so the end of a run that ended while its worker could
//! not reach the store is recorded once when it can, not lost; only a
//! renewal is refused once the time has passed. A lease
//! that ran out is rescued by [`FleetQueue::rescue_expired`] (at most once):
//! the run is queued again while its attempts allow (its row carries the
//! attempt it is at and the attempts its trigger allows, written at
//! enqueue), else it becomes `interrupted`; it is never carried out twice
//! at once.
//!
//! A claim honours the overlap policies as the daemon's executor does: a
//! trigger's runs of one concurrency key run one at a time, oldest first
//! (runs by hand, `@manual`, never wait), and a firing with overlap
//! `replace` marks the running run of its key replaced
//! ([`Lease::replaced_by`], announced on [`FleetQueue::stop_requests`]) so
//! its worker stops it before the new one starts.
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

use crate::event as ev;

use super::queue::{Enqueued, MANUAL_QUEUE, NewRun, RUN_SELECT_COLUMNS, RunRow, state};
use super::{EncodedEvent, Event, NewEvent, Store, StoreError, now_ms, sqlite};

/// What a [`FleetQueue`] call resolves to.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// Longest lease a claim or heartbeat may ask for.
pub const MAX_LEASE: Duration = Duration::from_secs(3_600);
/// Why a rescued attempt ended, as a literal.
macro_rules! lease_lost {
    () => {
        "its worker stopped renewing the lease (gone, cut off or paused)"
    };
}
/// Why a rescued attempt ended (`run.interrupted`, and a `run.retry`'s
/// previous attempt).
pub const LEASE_LOST_DETAIL: &str = lease_lost!();
/// What `run.interrupted` says of a run whose lease ran out and whose
/// attempts are spent.
pub const LEASE_EXPIRED_DETAIL: &str = concat!(lease_lost!(), "; not run again");
/// Stop requests a subscriber of [`FleetQueue::stop_requests`] may fall
/// behind by; past it, it hears [`tokio::sync::broadcast::error::RecvError::Lagged`]
/// and looks at each of its leases.
pub const STOP_REQUEST_BACKLOG: usize = 256;
/// How often [`FleetQueue::wait_for_work`] looks again when nothing wakes it.
pub const WORK_POLL: Duration = Duration::from_millis(500);

/// What a write under a lease checks of the run's row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseCheck {
    /// Running under the lease's token and not expired: a renewal, which
    /// would let the run go on.
    Live,
    /// Running under the lease's token, its time passed or not: every
    /// other write (an end, events, an attempt, a hand-back). Only a
    /// rescue, a release or a claim moves the token on, so a write that
    /// passes this check comes before anyone else could carry the run.
    Token,
}

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
    /// The run that replaced this one (overlap `replace`), as the last
    /// claim or renewal read it: the worker is to stop it.
    pub replaced_by: Option<String>,
}

/// What a rescue did with a run whose lease ran out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Rescue {
    /// Its attempts are spent: it ends `interrupted`.
    Interrupted,
    /// Queued again as attempt `attempt` of `of`.
    Retried { attempt: u32, of: u32 },
    /// A newer run replaced it (overlap `replace`): it ends `cancelled`.
    Replaced { by: String },
}

impl Rescue {
    /// What becomes of a lost run at `attempt` of `attempts`, replaced by
    /// `replaced_by` if it was.
    pub fn of(attempt: u32, attempts: u32, replaced_by: Option<String>) -> Self {
        match replaced_by {
            Some(by) => Self::Replaced { by },
            None if attempt < attempts => Self::Retried {
                attempt: attempt + 1,
                of: attempts,
            },
            None => Self::Interrupted,
        }
    }

    /// The state the run moves to.
    pub fn state(&self) -> &'static str {
        match self {
            Self::Interrupted => state::INTERRUPTED,
            Self::Retried { .. } => state::QUEUED,
            Self::Replaced { .. } => state::CANCELLED,
        }
    }

    /// The run's stored detail after it.
    pub fn detail(&self) -> Option<String> {
        match self {
            Self::Interrupted => Some(LEASE_EXPIRED_DETAIL.to_string()),
            Self::Retried { .. } => None,
            Self::Replaced { by } => Some(super::queue::replaced_detail(by)),
        }
    }
}

/// A run a rescue took from its lost worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Rescued {
    pub run_id: String,
    pub rescue: Rescue,
}

impl Rescued {
    /// The events the rescue records with it, as the executor records the
    /// same ends: a run queued again reads `run.interrupted` (its lost
    /// attempt's end) then `run.retry` (attempt N of M, the previous
    /// attempt's state and detail); a spent one `run.interrupted`; a
    /// replaced one `run.cancelled`.
    pub fn events(&self) -> Vec<NewEvent> {
        let id = &self.run_id;
        let event = |event: ev::Event| event.for_component(super::queue::run_component(id));
        match &self.rescue {
            Rescue::Interrupted => vec![event(ev::Event::RunInterrupted(ev::RunInterrupted {
                run_id: id.clone(),
                detail: LEASE_EXPIRED_DETAIL.to_string(),
                attempt: None,
                of: None,
            }))],
            Rescue::Retried { attempt, of } => vec![
                event(ev::Event::RunInterrupted(ev::RunInterrupted {
                    run_id: id.clone(),
                    detail: LEASE_LOST_DETAIL.to_string(),
                    attempt: Some(attempt - 1),
                    of: Some(*of),
                })),
                event(ev::Event::RunRetry(ev::RunRetry {
                    run_id: id.clone(),
                    attempt: *attempt,
                    of: *of,
                    // The lease's timeout was its pause.
                    delay_ms: 0,
                    previous: ev::PreviousAttempt {
                        state: state::INTERRUPTED.to_string(),
                        detail: Some(LEASE_LOST_DETAIL.to_string()),
                    },
                })),
            ],
            Rescue::Replaced { by } => vec![super::queue::cancelled_event(
                id,
                &super::queue::replaced_detail(by),
            )],
        }
    }
}

/// A run a worker claimed.
#[derive(Debug, Clone, PartialEq)]
pub struct Claimed {
    pub run: RunRow,
    pub lease: Lease,
}

/// Who asks for the next run with an end, and for how long
/// ([`FleetQueue::finish_and_claim`]).
#[derive(Debug, Clone, Copy)]
pub struct NextClaim<'a> {
    pub worker: &'a str,
    pub lease: Duration,
}

/// What [`FleetQueue::finish_and_claim`] did: the end as
/// [`FleetQueue::finish`] reports it, and the claim as
/// [`FleetQueue::claim`] reports it.
#[derive(Debug)]
pub struct Handover {
    pub ended: Result<(), StoreError>,
    pub next: Result<Option<Claimed>, StoreError>,
}

/// What a [`FleetQueue::finish_and_claim`] call resolves to.
pub type HandoverFuture<'a> = Pin<Box<dyn Future<Output = Handover> + Send + 'a>>;

/// A run queue many workers share (see the module docs).
pub trait FleetQueue: Send + Sync + Debug {
    /// Record a run (the semantics of [`Store::enqueue_run`]); wakes
    /// waiting workers once committed.
    fn enqueue(&self, run: NewRun) -> StoreFuture<'_, Enqueued>;
    /// Claim the oldest queued run for `worker` for `lease`, if any, that
    /// may start: the first queued of its trigger and concurrency key, with
    /// none of them running (a run by hand always may). Two workers never
    /// claim the same run.
    fn claim<'a>(&'a self, worker: &'a str, lease: Duration) -> StoreFuture<'a, Option<Claimed>>;
    /// Renew `lease` for `lease_for` from now, reading whether the run was
    /// replaced meanwhile; [`StoreError::Fenced`] when it is no longer held
    /// (expired, rescued, claimed again: [`LeaseCheck::Live`]).
    fn heartbeat<'a>(&'a self, lease: &'a Lease, lease_for: Duration) -> StoreFuture<'a, Lease>;
    /// Record the end of the run `lease` holds, with what a worktree run
    /// handed back (`result`: its branch, commit, push), so the fleet's
    /// listing shows it; [`StoreError::Fenced`] when the run is no longer
    /// running under the lease's token (nothing written): taken even when
    /// the lease's time has passed, if nobody took the run meanwhile
    /// ([`LeaseCheck::Token`], as every write under a lease but a renewal).
    fn finish<'a>(
        &'a self,
        lease: &'a Lease,
        end: &'static str,
        detail: Option<String>,
        result: Option<serde_json::Value>,
    ) -> StoreFuture<'a, ()>;
    /// Record the end of the run `lease` holds ([`FleetQueue::finish`]),
    /// then claim the next run for `next` ([`FleetQueue::claim`]) once
    /// this lease no longer holds its run (ended here, or fenced): a worker
    /// whose slot just freed asks for its next run with the end. A backend
    /// may send both at once (one round trip); the claim still comes after
    /// the end, and none is made while the run is still held (the end
    /// failed otherwise, and the worker will write it again).
    fn finish_and_claim<'a>(
        &'a self,
        lease: &'a Lease,
        end: &'static str,
        detail: Option<String>,
        result: Option<serde_json::Value>,
        next: NextClaim<'a>,
    ) -> HandoverFuture<'a> {
        Box::pin(async move {
            let ended = self.finish(lease, end, detail, result).await;
            let next = match &ended {
                Ok(()) | Err(StoreError::Fenced { .. }) => {
                    self.claim(next.worker, next.lease).await
                }
                Err(_) => Ok(None),
            };
            Handover { ended, next }
        })
    }
    /// Put the run `lease` holds back in the queue as it was before its
    /// claim (its place, its attempt) for any worker, and wake the workers:
    /// a worker told to stop hands back a run it claimed and did not start.
    /// [`StoreError::Fenced`] when the lease no longer holds the run.
    fn release<'a>(&'a self, lease: &'a Lease) -> StoreFuture<'a, ()>;
    /// Append a run's events under its lease, in order; refused (nothing
    /// written) when the lease is no longer held.
    fn append_fenced<'a>(
        &'a self,
        lease: &'a Lease,
        events: Vec<NewEvent>,
    ) -> StoreFuture<'a, Vec<Event>>;
    /// Record that the run `lease` holds is at `attempt` (its worker began
    /// a retry), so a rescue counts it; refused when the lease is no
    /// longer held.
    fn set_attempt<'a>(&'a self, lease: &'a Lease, attempt: u32) -> StoreFuture<'a, ()>;
    /// Append events outside any lease (a rescuer's `run.interrupted`).
    fn append_events(&self, events: Vec<NewEvent>) -> StoreFuture<'_, Vec<Event>>;
    /// Running runs whose lease ran out are rescued, each once (their token
    /// moves on, so their worker's late writes are refused): queued again
    /// while their attempts allow, else `interrupted`, or `cancelled` when
    /// a newer run replaced them ([`Rescue`]); their events
    /// ([`Rescued::events`]) are committed with them.
    fn rescue_expired(&self) -> StoreFuture<'_, Vec<Rescued>>;
    /// The ids of running runs a newer firing replaced (overlap
    /// `replace`), as they are marked: their workers stop them.
    fn stop_requests(&self) -> tokio::sync::broadcast::Receiver<String>;
    /// Run `id`, if stored.
    fn run<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<RunRow>>;
    /// Events with ids above `after`, oldest first, at most `limit`.
    fn events_after(&self, after: i64, limit: usize) -> StoreFuture<'_, Vec<Event>>;
    /// Resolve when a run may have been queued, or after `at_most`.
    fn wait_for_work(&self, at_most: Duration) -> StoreFuture<'_, ()>;
    /// Resolve once the store answered a round trip that changes nothing:
    /// how a rescuer learns it sees the store again before it trusts what
    /// the leases say.
    fn answers(&self) -> StoreFuture<'_, ()>;
    /// Copy pending approvals of a run this worker carries where any node
    /// can answer them (a store of one machine has nothing to copy).
    fn share_approvals<'a>(
        &'a self,
        rows: &'a [super::approvals::ApprovalRow],
    ) -> StoreFuture<'a, ()> {
        let _ = rows;
        Box::pin(async { Ok(()) })
    }
    /// The answers given in the shared store to approvals of run `run_id`.
    fn shared_answers<'a>(
        &'a self,
        run_id: &'a str,
    ) -> StoreFuture<'a, Vec<super::pg::approvals::SharedAnswer>> {
        let _ = run_id;
        Box::pin(async { Ok(Vec::new()) })
    }
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
    stops: tokio::sync::broadcast::Sender<String>,
}

impl SqliteQueue {
    pub fn new(store: Arc<Store>) -> Self {
        Self {
            store,
            wake: tokio::sync::Notify::new(),
            stops: tokio::sync::broadcast::channel(STOP_REQUEST_BACKLOG).0,
        }
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// `write` in the writer's transaction while `lease` still holds its
    /// run as `check` asks; [`StoreError::Fenced`] (nothing written)
    /// otherwise.
    fn under_lease<T, F>(
        &self,
        lease: &Lease,
        check: LeaseCheck,
        write: F,
    ) -> super::writer::Pending<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, Lease) -> Result<T, StoreError> + Send + 'static,
    {
        let held = lease.clone();
        self.store.write(move |conn| {
            if !held_sqlite(conn, &held, check)? {
                return Err(fenced(&held));
            }
            write(conn, held)
        })
    }
}

fn claim_sqlite(
    conn: &Connection,
    worker: &str,
    lease: i64,
) -> Result<Option<Claimed>, StoreError> {
    let now = now_ms();
    // The head of its trigger's queue of its key, none of which runs; a
    // run by hand waits for nothing.
    let sql = format!(
        "UPDATE runs SET state = 'running', detail = NULL, started_at_ms = ?1, owner = ?2,
         lease_token = lease_token + 1, lease_expires_at_ms = ?1 + ?3
         WHERE seq = (SELECT q.seq FROM runs q WHERE q.state = 'queued' AND (q.trigger = ?4
             OR NOT EXISTS (SELECT 1 FROM runs o WHERE o.trigger = q.trigger
                 AND o.concurrency_key IS q.concurrency_key
                 AND (o.state = 'running' OR (o.state = 'queued' AND o.seq < q.seq))))
             ORDER BY q.seq LIMIT 1)
         RETURNING {RUN_SELECT_COLUMNS}, lease_token, lease_expires_at_ms"
    );
    let found = conn
        .prepare_cached(&sql)
        .and_then(|mut s| {
            s.query_row((now, worker, lease, MANUAL_QUEUE), |row| {
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
        replaced_by: None,
    };
    Ok(Some(Claimed { run, lease }))
}

/// Whether `lease` still holds its run as `check` asks, in the writer's
/// transaction.
fn held_sqlite(conn: &Connection, lease: &Lease, check: LeaseCheck) -> Result<bool, StoreError> {
    let until = match check {
        LeaseCheck::Live => now_ms(),
        LeaseCheck::Token => i64::MIN,
    };
    conn.prepare_cached(
        "SELECT 1 FROM runs WHERE id = ?1 AND lease_token = ?2 AND state = 'running'
         AND lease_expires_at_ms >= ?3",
    )
    .and_then(|mut s| {
        s.query_row((&lease.run_id, lease.token, until), |r| r.get::<_, i64>(0))
            .optional()
    })
    .map(|found| found.is_some())
    .map_err(sqlite("check a lease"))
}

/// Rescue the runs whose lease ran out, in the writer's transaction.
fn rescue_sqlite(conn: &Connection) -> Result<Vec<Rescued>, StoreError> {
    let failed = sqlite("rescue expired leases");
    let now = now_ms();
    let lost: Vec<(String, i64, i64, Option<String>)> = conn
        .prepare_cached(
            "SELECT id, attempt, attempts, replaced_by FROM runs
             WHERE state = 'running' AND lease_expires_at_ms < ?1 ORDER BY seq",
        )
        .and_then(|mut s| {
            s.query_map([now], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
                .collect()
        })
        .map_err(&failed)?;
    let mut rescued = Vec::with_capacity(lost.len());
    for (id, attempt, attempts, replaced_by) in lost {
        let rescue = Rescue::of(
            super::queue::attempt_of(attempt),
            super::queue::attempt_of(attempts),
            replaced_by,
        );
        let moved = if let Rescue::Retried { attempt, .. } = &rescue {
            conn.prepare_cached(
                "UPDATE runs SET state = ?2, detail = NULL, started_at_ms = NULL, owner = NULL,
                 attempt = ?3, lease_token = lease_token + 1, lease_expires_at_ms = NULL
                 WHERE id = ?1",
            )
            .and_then(|mut s| s.execute((&id, rescue.state(), *attempt)))
        } else {
            conn.prepare_cached(
                "UPDATE runs SET state = ?2, detail = ?3, finished_at_ms = ?4,
                 lease_token = lease_token + 1, lease_expires_at_ms = NULL WHERE id = ?1",
            )
            .and_then(|mut s| s.execute((&id, rescue.state(), rescue.detail(), now)))
        };
        moved.map_err(&failed)?;
        rescued.push(Rescued { run_id: id, rescue });
    }
    let events = rescued
        .iter()
        .flat_map(Rescued::events)
        .map(EncodedEvent::encode)
        .collect();
    super::insert_events(events)(conn)?;
    Ok(rescued)
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
            let (outcome, replaced) = self
                .store
                .write(move |conn| super::queue::enqueue(conn, &run))
                .await?;
            for id in replaced {
                let _ = self.stops.send(id);
            }
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
        let ms = lease_ms(lease_for);
        Box::pin(
            self.under_lease(lease, LeaseCheck::Live, move |conn, held| {
                let expires_at_ms = now_ms() + ms;
                let replaced_by = conn
                .prepare_cached(
                    "UPDATE runs SET lease_expires_at_ms = ?3 WHERE id = ?1 AND lease_token = ?2
                     RETURNING replaced_by",
                )
                .and_then(|mut s| {
                    s.query_row((&held.run_id, held.token, expires_at_ms), |r| r.get(0))
                })
                .map_err(sqlite("renew a lease"))?;
                Ok(Lease {
                    expires_at_ms,
                    replaced_by,
                    ..held
                })
            }),
        )
    }

    fn finish<'a>(
        &'a self,
        lease: &'a Lease,
        end: &'static str,
        detail: Option<String>,
        result: Option<serde_json::Value>,
    ) -> StoreFuture<'a, ()> {
        let result = result.map(|r| r.to_string());
        let written = self.under_lease(lease, LeaseCheck::Token, move |conn, held| {
            conn.prepare_cached(
                "UPDATE runs SET state = ?3, detail = ?4, finished_at_ms = ?5,
                 result = COALESCE(?6, result), lease_expires_at_ms = NULL
                 WHERE id = ?1 AND lease_token = ?2",
            )
            .and_then(|mut s| {
                s.execute((&held.run_id, held.token, end, &detail, now_ms(), &result))
            })
            .map(drop)
            .map_err(sqlite("finish a run"))
        });
        Box::pin(async move {
            written.await?;
            // A run of its key may start now.
            self.wake.notify_one();
            Ok(())
        })
    }

    fn release<'a>(&'a self, lease: &'a Lease) -> StoreFuture<'a, ()> {
        let handed = self.under_lease(lease, LeaseCheck::Token, |conn, held| {
            conn.prepare_cached(
                "UPDATE runs SET state = 'queued', started_at_ms = NULL, owner = NULL,
                 lease_token = lease_token + 1, lease_expires_at_ms = NULL
                 WHERE id = ?1 AND lease_token = ?2",
            )
            .and_then(|mut s| s.execute((&held.run_id, held.token)))
            .map(drop)
            .map_err(sqlite("hand a run back"))
        });
        Box::pin(async move {
            handed.await?;
            self.wake.notify_one();
            Ok(())
        })
    }

    fn append_fenced<'a>(
        &'a self,
        lease: &'a Lease,
        events: Vec<NewEvent>,
    ) -> StoreFuture<'a, Vec<Event>> {
        let encoded: Vec<EncodedEvent> = events.into_iter().map(EncodedEvent::encode).collect();
        let insert = super::insert_events(encoded);
        Box::pin(self.under_lease(lease, LeaseCheck::Token, move |conn, _| insert(conn)))
    }

    fn set_attempt<'a>(&'a self, lease: &'a Lease, attempt: u32) -> StoreFuture<'a, ()> {
        Box::pin(
            self.under_lease(lease, LeaseCheck::Token, move |conn, held| {
                conn.prepare_cached(
                    "UPDATE runs SET attempt = ?3 WHERE id = ?1 AND lease_token = ?2",
                )
                .and_then(|mut s| s.execute((&held.run_id, held.token, attempt)))
                .map(drop)
                .map_err(sqlite("record a run's attempt"))
            }),
        )
    }

    fn append_events(&self, events: Vec<NewEvent>) -> StoreFuture<'_, Vec<Event>> {
        let encoded = events.into_iter().map(EncodedEvent::encode).collect();
        Box::pin(self.store.append_events(encoded))
    }

    fn rescue_expired(&self) -> StoreFuture<'_, Vec<Rescued>> {
        Box::pin(async move {
            let rescued = self.store.write(rescue_sqlite).await?;
            if rescued
                .iter()
                .any(|r| matches!(r.rescue, Rescue::Retried { .. }))
            {
                self.wake.notify_one();
            }
            Ok(rescued)
        })
    }

    fn stop_requests(&self) -> tokio::sync::broadcast::Receiver<String> {
        self.stops.subscribe()
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

    fn answers(&self) -> StoreFuture<'_, ()> {
        // The embedded store is this process's own file: always there.
        Box::pin(async { Ok(()) })
    }
}
