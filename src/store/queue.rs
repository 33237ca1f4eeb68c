//! The durable run queue: one row per run in `runs` (migrations 2 and 4),
//! whatever started it — a trigger's firing, the API, `npc acp`, `npc run` —
//! moving `queued` → `running` → a final state. A run is committed here
//! before anyone hears of it (a webhook answers 202 only after
//! [`Store::enqueue_run`] resolved). A firing with a dedupe key (a cron fire
//! time, a webhook delivery id) is stored at most once per trigger, by a
//! UNIQUE constraint; a cron trigger's advanced next fire time is written in
//! the same job, so a crash can lose a firing but never repeat one. A
//! running row names its `owner` (the process carrying it out), so only
//! runs whose process is gone are ever interrupted. The executor lives in
//! `crate::runs::executor`; this module only reads and writes rows.

use rusqlite::{Connection, OptionalExtension, Row};
use serde::{Deserialize, Serialize};

use super::{Event, Pending, Store, StoreError, json_error, now_ms, sqlite, untrusted};
use crate::model::RunOrigin;

/// Most rows one listing returns.
pub const MAX_RUNS_PER_READ: usize = 1_000;
/// Finished runs kept; older finished rows are pruned.
pub const RUN_HISTORY_LIMIT: usize = 10_000;

/// The component name of run `id` in the event log: every event of a run
/// is recorded under it.
pub fn run_component(id: &str) -> String {
    format!("run.{id}")
}

/// What a run cancelled for a newer firing of its queue (overlap
/// `replace`) says: the run that replaced it.
pub fn replaced_detail(by: &str) -> String {
    format!("replaced by run `{by}`")
}

/// The queue of runs started by hand (the API, `npc acp`, `npc run`). It is
/// not a valid trigger name (`[a-z0-9][a-z0-9_-]*`), so no trigger shares
/// it; its runs never wait behind each other (overlap does not apply).
pub use crate::model::MANUAL_QUEUE;

/// Run states as stored.
pub mod state {
    pub const QUEUED: &str = "queued";
    pub const RUNNING: &str = "running";
    pub const SUCCEEDED: &str = "succeeded";
    pub const FAILED: &str = "failed";
    /// Recorded, never run: the overlap policy is `skip` and a run was active.
    pub const SKIPPED: &str = "skipped";
    /// Cancelled: replaced by a newer run, the trigger was removed, or the
    /// daemon stopped.
    pub const CANCELLED: &str = "cancelled";
    /// Was running when the daemon died; never run again (at most once).
    pub const INTERRUPTED: &str = "interrupted";
    pub const TIMED_OUT: &str = "timed_out";
    /// Parked on a question (an `ask`) until a person answers it or its
    /// `approval_timeout` passes. Read, not stored: the row stays
    /// `running` (it holds its slot) while an approval of it is pending
    /// (`store::approvals`).
    pub const WAITING: &str = "waiting";
    /// Ended after a policy or permission denial stopped something the
    /// agent tried (the denials are `tool.denied` events of the run).
    pub const BLOCKED: &str = "blocked";
}

/// A run to record.
#[derive(Debug, Clone, PartialEq)]
pub struct NewRun {
    pub id: String,
    /// Its queue: the trigger's name, or [`MANUAL_QUEUE`].
    pub trigger: String,
    /// What asked for it.
    pub origin: RunOrigin,
    /// Same key, same trigger: stored once.
    pub dedupe_key: Option<String>,
    /// JSON text of the payload.
    pub payload: String,
    /// Record the firing as skipped when a run of the trigger is queued or
    /// running (overlap `skip`).
    pub skip_if_active: bool,
    /// Refuse the firing when this many runs of the trigger wait already.
    pub max_queued: usize,
    /// A trigger-state key written in the same job, whatever the outcome
    /// (a cron trigger's next fire time).
    pub state: Option<(String, serde_json::Value)>,
    /// Recorded `running` at once, owned by this process (see
    /// [`RunRow::owner`]): the run is carried out by the process that asks
    /// for it, and no executor ever claims it.
    pub claimed_by: Option<String>,
    /// Until when [`NewRun::dedupe_key`] keeps refusing a later
    /// submission of the queue (a webhook signature's window), even after
    /// this row is pruned: [`Store::prune_runs`] moves the keys of rows it
    /// forgets to the replay table until then.
    pub replay_until_ms: Option<i64>,
    /// The overlap policy applies among the queue's runs of this key only
    /// (`skip_if_active` looks at them alone, and each key has its own
    /// head of the queue).
    pub concurrency_key: Option<String>,
    /// The attempt the run is at: 1, unless a fleet worker takes in a run
    /// the fleet queued again after a lost attempt.
    pub attempt: u32,
    /// The attempts its trigger allows (`retries` + 1; 1 for a run by hand).
    pub attempts: u32,
    /// Overlap `replace` in a queue workers share (`store::fleet`): the
    /// queue's running runs of the same key are marked replaced by this one
    /// (their workers stop them), and its queued ones are cancelled.
    pub replace_active: bool,
    /// The code the run starts from, when a fleet's ingress queued it.
    pub code: Option<RunCode>,
}

impl NewRun {
    /// Run `id` of queue `trigger`, from `origin`, with
    /// `payload` (JSON text): queued at the first of one attempt, with no
    /// dedupe key, concurrency key, overlap policy or bound on its queue.
    /// A caller sets the rest with struct update syntax; one that queues
    /// what others send (a trigger's firing) sets `max_queued`, as
    /// `runs::queue` does with its named bound.
    pub fn new(
        id: impl Into<String>,
        trigger: impl Into<String>,
        origin: RunOrigin,
        payload: impl Into<String>,
    ) -> Self {
        Self {
            id: id.into(),
            trigger: trigger.into(),
            origin,
            dedupe_key: None,
            payload: payload.into(),
            skip_if_active: false,
            max_queued: usize::MAX,
            state: None,
            claimed_by: None,
            replay_until_ms: None,
            concurrency_key: None,
            attempt: 1,
            attempts: 1,
            replace_active: false,
            code: None,
        }
    }
}

/// Where a fleet's run takes its code from, as its ingress recorded it:
/// the repository's remote URL (credentials stripped) and the commit its
/// worktree starts from (none for a run in place, or a ref the ingress
/// could not resolve). Data other machines wrote: a worker checks both
/// before any git command sees them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunCode {
    pub remote: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
}

/// Replay keys kept per queue; the soonest to expire go first past it.
pub const MAX_REPLAY_KEYS_PER_QUEUE: usize = 100_000;

/// What [`Store::enqueue_run`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Enqueued {
    Queued,
    /// Recorded as skipped (overlap `skip`).
    Skipped,
    /// The dedupe key was seen before for this trigger: nothing recorded.
    Duplicate,
    /// The trigger's queue is full: nothing recorded.
    Full,
}

/// A stored run's origin as read back: one a build of npc writes, or a
/// word none writes (a row another writer put in a shared store, or a
/// database that arrived with a clone), kept printable and clipped to
/// [`untrusted::MAX_NAME_CHARS`] for display. Nothing decides on an
/// unknown origin: [`RowOrigin::known`] is `None` for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum RowOrigin {
    Known(RunOrigin),
    Unknown(String),
}

impl RowOrigin {
    /// The origin, when it is one npc writes.
    pub fn known(&self) -> Option<RunOrigin> {
        match self {
            Self::Known(origin) => Some(*origin),
            Self::Unknown(_) => None,
        }
    }

    /// The word as stored (clipped and printable when unknown).
    pub fn as_str(&self) -> &str {
        match self {
            Self::Known(origin) => origin.as_str(),
            Self::Unknown(word) => word,
        }
    }
}

impl From<RunOrigin> for RowOrigin {
    fn from(origin: RunOrigin) -> Self {
        Self::Known(origin)
    }
}

impl From<String> for RowOrigin {
    fn from(word: String) -> Self {
        match RunOrigin::parse(&word) {
            Some(origin) => Self::Known(origin),
            None => Self::Unknown(untrusted::text(
                word.chars().take(untrusted::MAX_NAME_CHARS).collect(),
            )),
        }
    }
}

impl From<RowOrigin> for String {
    fn from(origin: RowOrigin) -> Self {
        match origin {
            RowOrigin::Known(origin) => origin.as_str().to_string(),
            RowOrigin::Unknown(word) => word,
        }
    }
}

impl std::fmt::Display for RowOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One stored run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRow {
    pub seq: i64,
    pub id: String,
    /// Its queue: the trigger's name, or `@manual`.
    pub trigger: String,
    pub origin: RowOrigin,
    pub dedupe_key: Option<String>,
    pub payload: serde_json::Value,
    pub state: String,
    pub enqueued_at_ms: i64,
    pub started_at_ms: Option<i64>,
    pub finished_at_ms: Option<i64>,
    pub detail: Option<String>,
    /// The process carrying the run out while it runs (`pid:start-time`,
    /// `supervisor::ProcessRecord::key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// The key the overlap policy applies within.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency_key: Option<String>,
    /// What a worktree run handed back (`runs::workspace::RunResult`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
    /// The run's worktree while it is kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worktree: Option<String>,
    /// The attempt it is at (see [`NewRun::attempt`]).
    #[serde(default = "first_attempt", skip_serializing_if = "is_first")]
    pub attempt: u32,
    /// The attempts it is allowed (see [`NewRun::attempts`]).
    #[serde(default = "first_attempt", skip_serializing_if = "is_first")]
    pub attempts: u32,
    /// The code it starts from (a fleet's run; see [`RunCode`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<RunCode>,
}

fn first_attempt() -> u32 {
    1
}

fn is_first(n: &u32) -> bool {
    *n == 1
}

/// A stored attempt count as a number (1 for anything a build never wrote).
pub(super) fn attempt_of(stored: i64) -> u32 {
    u32::try_from(stored).ok().filter(|n| *n >= 1).unwrap_or(1)
}

/// The columns [`run_from_row`] reads, in its order, as a literal.
macro_rules! run_columns {
    () => {
        "seq, id, trigger, origin, dedupe_key, payload, state, enqueued_at_ms, started_at_ms, \
         finished_at_ms, detail, owner, concurrency_key, result, worktree, attempt, attempts, \
         remote, start_commit"
    };
}

/// The columns [`run_from_row`] reads, in its order.
pub(super) const RUN_SELECT_COLUMNS: &str = run_columns!();

/// [`RUN_SELECT_COLUMNS`] with the state a reader sees: a running run with
/// a pending approval (`store::approvals`) reads [`state::WAITING`].
macro_rules! run_columns_seen {
    () => {
        "seq, id, trigger, origin, dedupe_key, payload, \
         CASE WHEN state = 'running' AND EXISTS (SELECT 1 FROM approvals a \
         WHERE a.run_id = runs.id AND a.state = 'pending') THEN 'waiting' ELSE state END, \
         enqueued_at_ms, started_at_ms, finished_at_ms, detail, owner, concurrency_key, result, \
         worktree, attempt, attempts, remote, start_commit"
    };
}

const RUN_SELECT: &str = concat!("SELECT ", run_columns_seen!(), " FROM runs");

pub(super) type RawRun = (RunRow, String);

pub(super) fn run_from_row(row: &Row<'_>) -> rusqlite::Result<RawRun> {
    Ok((
        RunRow {
            seq: row.get(0)?,
            id: row.get(1)?,
            trigger: row.get(2)?,
            origin: RowOrigin::from(row.get::<_, String>(3)?),
            dedupe_key: row.get(4)?,
            payload: serde_json::Value::Null,
            state: row.get(6)?,
            enqueued_at_ms: row.get(7)?,
            started_at_ms: row.get(8)?,
            finished_at_ms: row.get(9)?,
            detail: row.get(10)?,
            owner: row.get(11)?,
            concurrency_key: row.get(12)?,
            result: row
                .get::<_, Option<String>>(13)?
                .and_then(|text| serde_json::from_str(&text).ok()),
            worktree: row.get(14)?,
            attempt: attempt_of(row.get(15)?),
            attempts: attempt_of(row.get(16)?),
            code: RunCode::of(row.get(17)?, row.get(18)?),
        },
        row.get(5)?,
    ))
}

impl RunCode {
    /// The code of a row's `remote` and `start_commit` columns (none
    /// without a remote).
    pub fn of(remote: Option<String>, commit: Option<String>) -> Option<Self> {
        remote.map(|remote| Self { remote, commit })
    }
}

pub(super) fn decode(rows: Vec<RawRun>) -> Result<Vec<RunRow>, StoreError> {
    rows.into_iter()
        .map(|(mut row, payload)| {
            row.payload = serde_json::from_str(&payload).map_err(json_error("run payload"))?;
            Ok(row)
        })
        .collect()
}

/// Overlap `replace` in a shared queue: the queue's queued runs of `run`'s
/// key are cancelled (each with its `run.cancelled`) and its running ones
/// marked replaced by `run`. Returns the running ones.
fn replace_active(conn: &Connection, run: &NewRun) -> Result<Vec<String>, StoreError> {
    let failed = sqlite("replace the running runs");
    let detail = replaced_detail(&run.id);
    let cancelled: Vec<String> = conn
        .prepare_cached(
            "UPDATE runs SET state = ?3, detail = ?4, finished_at_ms = ?5
             WHERE trigger = ?1 AND concurrency_key IS ?2 AND state = 'queued' RETURNING id",
        )
        .and_then(|mut s| {
            s.query_map(
                (
                    &run.trigger,
                    &run.concurrency_key,
                    state::CANCELLED,
                    &detail,
                    now_ms(),
                ),
                |r| r.get(0),
            )?
            .collect()
        })
        .map_err(&failed)?;
    if !cancelled.is_empty() {
        let events = cancelled
            .iter()
            .map(|id| super::EncodedEvent::encode(cancelled_event(id, &detail)))
            .collect();
        super::insert_events(events)(conn)?;
    }
    conn.prepare_cached(
        "UPDATE runs SET replaced_by = ?3
         WHERE trigger = ?1 AND concurrency_key IS ?2 AND state = 'running' RETURNING id",
    )
    .and_then(|mut s| {
        s.query_map((&run.trigger, &run.concurrency_key, &run.id), |r| r.get(0))?
            .collect()
    })
    .map_err(&failed)
}

/// The `run.cancelled` event of run `id`, ended for `detail`.
pub fn cancelled_event(id: &str, detail: &str) -> super::NewEvent {
    crate::event::Event::RunCancelled(crate::event::RunCancelled {
        run_id: id.to_string(),
        detail: Some(detail.to_string()),
    })
    .for_component(run_component(id))
}

/// Record `run`; returns what became of it and, for overlap `replace`,
/// the running runs it replaces.
pub(super) fn enqueue(
    conn: &Connection,
    run: &NewRun,
) -> Result<(Enqueued, Vec<String>), StoreError> {
    let failed = sqlite("enqueue a run");
    let now = now_ms();
    if let Some((key, value)) = &run.state {
        conn.prepare_cached(
            "INSERT OR REPLACE INTO trigger_state (trigger, key, value, updated_at_ms)
             VALUES (?1, ?2, ?3, ?4)",
        )
        .and_then(|mut s| s.execute((&run.trigger, key, value.to_string(), now)))
        .map_err(&failed)?;
    }
    if let Some(key) = &run.dedupe_key {
        // A row's key, or a pruned row's within its window.
        let held: Option<i64> = conn
            .prepare_cached(
                "SELECT 1 FROM runs WHERE trigger = ?1 AND dedupe_key = ?2
                 UNION ALL SELECT 1 FROM webhook_replays
                 WHERE trigger = ?1 AND key = ?2 AND expires_at_ms > ?3 LIMIT 1",
            )
            .and_then(|mut s| {
                s.query_row((&run.trigger, key, now), |r| r.get(0))
                    .optional()
            })
            .map_err(&failed)?;
        if held.is_some() {
            return Ok((Enqueued::Duplicate, Vec::new()));
        }
    }
    let active = |states: &str, limit: usize| -> Result<usize, StoreError> {
        conn.prepare_cached(&format!(
            "SELECT COUNT(*) FROM (SELECT 1 FROM runs
             WHERE trigger = ?1 AND state IN ({states}) LIMIT ?2)"
        ))
        .and_then(|mut s| s.query_row((&run.trigger, limit as i64), |r| r.get::<_, i64>(0)))
        .map(|n| usize::try_from(n).unwrap_or(usize::MAX))
        .map_err(&failed)
    };
    // Overlap `skip` looks at the runs of the same key only.
    let active_of_key = || -> Result<bool, StoreError> {
        conn.prepare_cached(
            "SELECT 1 FROM runs WHERE trigger = ?1 AND state IN ('queued', 'running')
             AND concurrency_key IS ?2 LIMIT 1",
        )
        .and_then(|mut s| {
            s.query_row((&run.trigger, &run.concurrency_key), |r| r.get::<_, i64>(0))
                .optional()
        })
        .map(|found| found.is_some())
        .map_err(&failed)
    };
    let outcome = if run.skip_if_active && active_of_key()? {
        Enqueued::Skipped
    } else if run.claimed_by.is_none() && active("'queued'", run.max_queued)? >= run.max_queued {
        return Ok((Enqueued::Full, Vec::new()));
    } else {
        Enqueued::Queued
    };
    let replaced = if run.replace_active && outcome == Enqueued::Queued {
        replace_active(conn, run)?
    } else {
        Vec::new()
    };
    let (state, started, finished) = match (outcome, &run.claimed_by) {
        (Enqueued::Skipped, _) => (state::SKIPPED, None, Some(now)),
        (_, Some(_)) => (state::RUNNING, Some(now), None),
        _ => (state::QUEUED, None, None),
    };
    conn.prepare_cached(
        "INSERT INTO runs (id, trigger, origin, dedupe_key, payload, state,
         enqueued_at_ms, started_at_ms, finished_at_ms, owner, replay_until_ms, concurrency_key,
         attempt, attempts, remote, start_commit)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
    )
    .and_then(|mut s| {
        s.execute((
            &run.id,
            &run.trigger,
            run.origin.as_str(),
            &run.dedupe_key,
            &run.payload,
            state,
            now,
            started,
            finished,
            &run.claimed_by,
            run.replay_until_ms,
            &run.concurrency_key,
            run.attempt.max(1),
            run.attempts.max(1),
            run.code.as_ref().map(|c| &c.remote),
            run.code.as_ref().and_then(|c| c.commit.as_ref()),
        ))
    })
    .map_err(&failed)?;
    Ok((outcome, replaced))
}

impl Store {
    /// Record a firing (see [`NewRun`]); resolves once committed.
    pub fn enqueue_run(&self, run: NewRun) -> Pending<Enqueued> {
        self.write(move |conn| enqueue(conn, &run).map(|(outcome, _)| outcome))
    }

    /// Record `run`, a run another store handed over (a fleet worker's
    /// claim), as [`enqueue_run`](Self::enqueue_run) does; when this store
    /// holds an ended run of its id (the worker carried an earlier attempt
    /// of it, and claims it again after a rescue), that row is queued again
    /// with `run`'s fields, its end, result and worktree forgotten (its
    /// events stay). [`Enqueued::Duplicate`] when a run of its id is still
    /// queued or running here.
    pub fn adopt_run(&self, run: NewRun) -> Pending<Enqueued> {
        self.write(move |conn| {
            let failed = sqlite("take in a run");
            let held: Option<String> = conn
                .prepare_cached("SELECT state FROM runs WHERE id = ?1")
                .and_then(|mut s| s.query_row([&run.id], |r| r.get(0)).optional())
                .map_err(&failed)?;
            match held.as_deref() {
                None => enqueue(conn, &run).map(|(outcome, _)| outcome),
                Some(state::QUEUED | state::RUNNING) => Ok(Enqueued::Duplicate),
                Some(_) => {
                    conn.prepare_cached(
                        "UPDATE runs SET trigger = ?2, origin = ?3, payload = ?4,
                         state = 'queued', enqueued_at_ms = ?5, started_at_ms = NULL,
                         finished_at_ms = NULL, detail = NULL, owner = NULL,
                         concurrency_key = ?6, result = NULL, worktree = NULL,
                         attempt = ?7, attempts = ?8, replaced_by = NULL,
                         remote = ?9, start_commit = ?10
                         WHERE id = ?1",
                    )
                    .and_then(|mut s| {
                        s.execute((
                            &run.id,
                            &run.trigger,
                            run.origin.as_str(),
                            &run.payload,
                            now_ms(),
                            &run.concurrency_key,
                            run.attempt.max(1),
                            run.attempts.max(1),
                            run.code.as_ref().map(|c| &c.remote),
                            run.code.as_ref().and_then(|c| c.commit.as_ref()),
                        ))
                    })
                    .map_err(&failed)?;
                    Ok(Enqueued::Queued)
                }
            }
        })
    }

    /// Record the attempt run `id` is at (a retry begins).
    pub fn set_run_attempt(&self, id: impl Into<String>, attempt: u32) -> Pending<()> {
        let id = id.into();
        self.write(move |conn| {
            conn.prepare_cached("UPDATE runs SET attempt = ?2 WHERE id = ?1")
                .and_then(|mut s| s.execute((&id, attempt)))
                .map(drop)
                .map_err(sqlite("record a run's attempt"))
        })
    }

    /// Record (or, with `None`, clear) run `id`'s kept worktree.
    pub fn set_run_worktree(&self, id: impl Into<String>, path: Option<String>) -> Pending<()> {
        let id = id.into();
        self.write(move |conn| {
            conn.prepare_cached("UPDATE runs SET worktree = ?2 WHERE id = ?1")
                .and_then(|mut s| s.execute((&id, &path)))
                .map(drop)
                .map_err(sqlite("record a run's worktree"))
        })
    }

    /// Record what run `id` handed back (`runs::workspace::RunResult`).
    pub fn set_run_result(&self, id: impl Into<String>, result: serde_json::Value) -> Pending<()> {
        let id = id.into();
        self.write(move |conn| {
            conn.prepare_cached("UPDATE runs SET result = ?2 WHERE id = ?1")
                .and_then(|mut s| s.execute((&id, result.to_string())))
                .map(drop)
                .map_err(sqlite("record a run's result"))
        })
    }

    /// The finished runs whose worktree is kept, newest first: id and
    /// finish time (at most [`MAX_RUNS_PER_READ`]).
    pub fn kept_worktrees(&self) -> Result<Vec<(String, Option<i64>)>, StoreError> {
        self.read("read kept worktrees", |conn| {
            conn.prepare_cached(
                "SELECT id, finished_at_ms FROM runs WHERE worktree IS NOT NULL
                 AND state NOT IN ('queued', 'running') ORDER BY seq DESC LIMIT ?1",
            )?
            .query_map([MAX_RUNS_PER_READ as i64], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect()
        })
    }

    /// Move run `id` to `state` with an optional detail. `running` sets its
    /// start time; any other state its finish time.
    pub fn mark_run(
        &self,
        id: impl Into<String>,
        state: &'static str,
        detail: Option<String>,
    ) -> Pending<()> {
        let id = id.into();
        self.write(move |conn| {
            let sql = if state == state::RUNNING {
                "UPDATE runs SET state = ?2, detail = ?3, started_at_ms = ?4 WHERE id = ?1"
            } else {
                "UPDATE runs SET state = ?2, detail = ?3, finished_at_ms = ?4 WHERE id = ?1"
            };
            conn.execute(sql, (&id, state, &detail, now_ms()))
                .map(drop)
                .map_err(sqlite("update a run"))
        })
    }

    /// Move run `id` from state `from` to `to` only if it is still in
    /// `from`; resolves to whether it moved. The executor and a cancel race
    /// for a queued run through this one write, so exactly one wins.
    pub fn mark_run_if(
        &self,
        id: impl Into<String>,
        from: &'static str,
        to: &'static str,
        detail: Option<String>,
    ) -> Pending<bool> {
        let id = id.into();
        self.write(move |conn| {
            let sql = if to == state::RUNNING {
                "UPDATE runs SET state = ?2, detail = ?3, started_at_ms = ?4
                 WHERE id = ?1 AND state = ?5"
            } else {
                "UPDATE runs SET state = ?2, detail = ?3, finished_at_ms = ?4
                 WHERE id = ?1 AND state = ?5"
            };
            conn.execute(sql, (&id, to, &detail, now_ms(), from))
                .map(|changed| changed > 0)
                .map_err(sqlite("update a run"))
        })
    }

    /// Claim queued run `id` for `owner`: `queued` → `running`, only if it
    /// is still queued; resolves to whether it moved. The executor and a
    /// cancel race for a queued run through this one write, so exactly one
    /// wins.
    pub fn claim_run(&self, id: impl Into<String>, owner: Option<String>) -> Pending<bool> {
        let id = id.into();
        self.write(move |conn| {
            conn.execute(
                "UPDATE runs SET state = ?2, detail = NULL, started_at_ms = ?3, owner = ?4
                 WHERE id = ?1 AND state = ?5",
                (&id, state::RUNNING, now_ms(), &owner, state::QUEUED),
            )
            .map(|changed| changed > 0)
            .map_err(sqlite("claim a run"))
        })
    }

    /// The running runs and their owners (the processes carrying them out).
    pub fn running_runs(&self) -> Result<Vec<(String, Option<String>)>, StoreError> {
        self.read("read running runs", |conn| {
            conn.prepare_cached("SELECT id, owner FROM runs WHERE state = 'running' LIMIT ?1")?
                .query_map([MAX_RUNS_PER_READ as i64], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect()
        })
    }

    /// Runs `(id, owner)` whose process is gone become `interrupted` (never
    /// run again: at most once), each only if it is still running for that
    /// owner. Returns the ids that moved.
    pub fn interrupt_runs(&self, orphans: Vec<(String, Option<String>)>) -> Pending<Vec<String>> {
        self.write(move |conn| {
            let failed = sqlite("mark interrupted runs");
            let mut moved = Vec::new();
            for (id, owner) in orphans {
                let changed = conn
                    .prepare_cached(
                        "UPDATE runs SET state = ?1, finished_at_ms = ?2,
                         detail = 'the daemon stopped while it ran; not run again'
                         WHERE id = ?3 AND state = ?4 AND owner IS ?5",
                    )
                    .and_then(|mut s| {
                        s.execute((state::INTERRUPTED, now_ms(), &id, state::RUNNING, &owner))
                    })
                    .map_err(&failed)?;
                if changed > 0 {
                    moved.push(id);
                }
            }
            Ok(moved)
        })
    }

    /// Forget expired replay keys, and per queue those beyond
    /// [`MAX_REPLAY_KEYS_PER_QUEUE`] that expire soonest.
    pub fn prune_replays(&self) -> Pending<usize> {
        self.write(|conn| {
            let failed = sqlite("prune replay keys");
            let mut gone = conn
                .execute(
                    "DELETE FROM webhook_replays WHERE expires_at_ms <= ?1",
                    [now_ms()],
                )
                .map_err(&failed)?;
            let crowded: Vec<String> = conn
                .prepare(
                    "SELECT trigger FROM webhook_replays GROUP BY trigger HAVING COUNT(*) > ?1",
                )
                .and_then(|mut s| {
                    s.query_map([MAX_REPLAY_KEYS_PER_QUEUE as i64], |r| r.get(0))?
                        .collect::<rusqlite::Result<_>>()
                })
                .map_err(&failed)?;
            for trigger in crowded {
                gone += conn
                    .execute(
                        "DELETE FROM webhook_replays WHERE trigger = ?1 AND key IN (
                         SELECT key FROM webhook_replays WHERE trigger = ?1
                         ORDER BY expires_at_ms DESC LIMIT -1 OFFSET ?2)",
                        (&trigger, MAX_REPLAY_KEYS_PER_QUEUE as i64),
                    )
                    .map_err(&failed)?;
            }
            Ok(gone)
        })
    }

    /// Forget finished runs beyond the newest `keep`; the dedupe keys of
    /// those still within their [`NewRun::replay_until_ms`] move to the
    /// replay table (bounded by [`Store::prune_replays`]).
    pub fn prune_runs(&self, keep: usize) -> Pending<usize> {
        self.write(move |conn| {
            let failed = sqlite("prune runs");
            // Below the newest `keep` rows (none when there are no more).
            const PRUNED: &str = "FROM runs WHERE state NOT IN ('queued', 'running') AND seq <=
                 (SELECT seq FROM runs ORDER BY seq DESC LIMIT 1 OFFSET ?1)";
            conn.execute(
                &format!(
                    "INSERT OR REPLACE INTO webhook_replays (trigger, key, expires_at_ms)
                     SELECT trigger, dedupe_key, replay_until_ms {PRUNED}
                     AND dedupe_key IS NOT NULL AND replay_until_ms > ?2"
                ),
                (keep as i64, now_ms()),
            )
            .map_err(&failed)?;
            conn.execute(&format!("DELETE {PRUNED}"), [keep as i64])
                .map_err(&failed)
        })
    }

    /// How many runs run `parent`'s agent delegated (`npc_delegate`).
    pub fn delegated_runs_of(&self, parent: &str) -> Result<usize, StoreError> {
        self.read("count delegated runs", |conn| {
            conn.prepare_cached(
                "SELECT COUNT(*) FROM runs WHERE origin = 'delegate' AND json_valid(payload)
                 AND json_extract(payload, '$.parent') = ?1",
            )?
            .query_row([parent], |r| r.get::<_, i64>(0))
        })
        .map(|n| usize::try_from(n).unwrap_or(usize::MAX))
    }

    /// The oldest queued run of each trigger, oldest first, at most `limit`
    /// (the executor's view: a trigger's later runs wait behind its first).
    pub fn queued_runs(&self, limit: usize) -> Result<Vec<RunRow>, StoreError> {
        let limit = limit.min(MAX_RUNS_PER_READ) as i64;
        let rows = self.read("read queued runs", |conn| {
            conn.prepare_cached(&format!(
                "{RUN_SELECT} WHERE seq IN (SELECT MIN(seq) FROM runs
                 WHERE state = 'queued' GROUP BY trigger, concurrency_key) ORDER BY seq LIMIT ?1"
            ))?
            .query_map([limit], run_from_row)?
            .collect()
        })?;
        decode(rows)
    }

    /// The newest runs (of queue `trigger`, or of all), newest first.
    pub fn run_rows(&self, trigger: Option<&str>, limit: usize) -> Result<Vec<RunRow>, StoreError> {
        let limit = limit.min(MAX_RUNS_PER_READ) as i64;
        let rows = self.read("read runs", |conn| match trigger {
            Some(t) => conn
                .prepare_cached(&format!(
                    "{RUN_SELECT} WHERE trigger = ?1 ORDER BY seq DESC LIMIT ?2"
                ))?
                .query_map((t, limit), run_from_row)?
                .collect(),
            None => conn
                .prepare_cached(&format!("{RUN_SELECT} ORDER BY seq DESC LIMIT ?1"))?
                .query_map([limit], run_from_row)?
                .collect(),
        })?;
        decode(rows)
    }

    /// One run by id.
    pub fn run_row(&self, id: &str) -> Result<Option<RunRow>, StoreError> {
        let row = self.read("read a run", |conn| {
            conn.prepare_cached(&format!("{RUN_SELECT} WHERE id = ?1"))?
                .query_row([id], run_from_row)
                .optional()
        })?;
        Ok(decode(row.into_iter().collect())?.pop())
    }

    /// Events of `component` after event `after`, oldest first (a range
    /// scan on the component index).
    pub fn component_events(
        &self,
        component: &str,
        after: i64,
        limit: usize,
    ) -> Result<Vec<Event>, StoreError> {
        self.events_where(
            "component = ?1 AND id > ?2 ORDER BY id LIMIT ?3",
            (
                component.to_string(),
                after,
                limit.min(super::MAX_EVENTS_PER_READ) as i64,
            ),
        )
    }

    /// The `run.started` and `run.finished` events of run `id` (a range
    /// scan on the component index), oldest first.
    pub fn run_bracket(&self, id: &str) -> Result<Vec<Event>, StoreError> {
        self.events_where(
            "component = ?1 AND kind IN ('run.started', 'run.finished') ORDER BY id LIMIT 4",
            [run_component(id)],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(id: &str, key: Option<&str>) -> NewRun {
        NewRun {
            dedupe_key: key.map(str::to_string),
            max_queued: 3,
            ..NewRun::new(id, "t", crate::model::RunOrigin::Cron, "{}")
        }
    }

    #[test]
    fn a_stored_origin_is_typed_once_and_an_unknown_one_decides_nothing() {
        let known = RowOrigin::from("webhook".to_string());
        assert_eq!(known.known(), Some(RunOrigin::Webhook));
        let hostile = format!("cli\x1b[2J{}", "x".repeat(10_000));
        let unknown = RowOrigin::from(hostile);
        assert_eq!(unknown.known(), None);
        assert!(!unknown.as_str().contains('\x1b'), "{}", unknown.as_str());
        assert!(unknown.as_str().chars().count() <= 4 * untrusted::MAX_NAME_CHARS);
        assert!(unknown.as_str().starts_with("cli"));
        // serde keeps the word: a row goes out and comes back the same.
        let text = serde_json::to_string(&known).unwrap();
        assert_eq!(text, "\"webhook\"");
        assert_eq!(serde_json::from_str::<RowOrigin>(&text).unwrap(), known);
        assert_eq!(
            serde_json::from_str::<RowOrigin>("\"nope\"")
                .unwrap()
                .known(),
            None
        );
    }

    fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("state.db")).unwrap();
        (dir, store)
    }

    #[test]
    fn a_dedupe_key_is_stored_once_and_the_state_advances_anyway() {
        let (_dir, store) = store();
        let mut first = run("a", Some("k"));
        first.state = Some(("next".into(), serde_json::json!(1)));
        assert_eq!(store.enqueue_run(first).wait().unwrap(), Enqueued::Queued);
        let mut again = run("b", Some("k"));
        again.state = Some(("next".into(), serde_json::json!(2)));
        assert_eq!(
            store.enqueue_run(again).wait().unwrap(),
            Enqueued::Duplicate
        );
        assert_eq!(store.run_rows(None, 10).unwrap().len(), 1);
        assert_eq!(store.trigger_state("t").unwrap()["next"], 2);
    }

    #[test]
    fn skip_records_a_skipped_run_and_the_queue_is_bounded() {
        let (_dir, store) = store();
        for i in 0..3 {
            let r = run(&format!("q{i}"), None);
            assert_eq!(store.enqueue_run(r).wait().unwrap(), Enqueued::Queued);
        }
        assert_eq!(
            store.enqueue_run(run("full", None)).wait().unwrap(),
            Enqueued::Full
        );
        let mut skip = run("s", None);
        skip.skip_if_active = true;
        assert_eq!(store.enqueue_run(skip).wait().unwrap(), Enqueued::Skipped);
        assert_eq!(store.run_row("s").unwrap().unwrap().state, "skipped");
        assert!(store.run_row("full").unwrap().is_none());
    }

    #[test]
    fn a_conditional_move_happens_once_and_only_from_its_state() {
        let (_dir, store) = store();
        store.enqueue_run(run("a", None)).wait().unwrap();
        let cancel = || store.mark_run_if("a", state::QUEUED, state::CANCELLED, None);
        let start = || store.mark_run_if("a", state::QUEUED, state::RUNNING, None);
        assert!(cancel().wait().unwrap());
        assert!(!start().wait().unwrap(), "a cancelled run never starts");
        assert!(!cancel().wait().unwrap());
        assert_eq!(store.run_row("a").unwrap().unwrap().state, "cancelled");
        assert!(
            !store
                .mark_run_if("nope", state::QUEUED, state::RUNNING, None)
                .wait()
                .unwrap()
        );
    }

    #[test]
    fn running_runs_become_interrupted_and_are_not_queued_again() {
        let (_dir, store) = store();
        store.enqueue_run(run("a", None)).wait().unwrap();
        store.enqueue_run(run("b", None)).wait().unwrap();
        assert!(store.claim_run("a", Some("1:1".into())).wait().unwrap());
        let mut owned = run("c", None);
        owned.claimed_by = Some("2:2".into());
        assert_eq!(store.enqueue_run(owned).wait().unwrap(), Enqueued::Queued);
        let running = store.running_runs().unwrap();
        assert_eq!(running.len(), 2);
        // Only the run whose owner is gone, and only for that owner.
        let gone = vec![
            ("a".to_string(), Some("1:1".to_string())),
            ("c".to_string(), Some("9:9".to_string())),
        ];
        assert_eq!(
            store.interrupt_runs(gone).wait().unwrap(),
            vec!["a".to_string()]
        );
        assert_eq!(store.run_row("c").unwrap().unwrap().state, "running");
        assert!(
            !store.claim_run("b-missing", None).wait().unwrap(),
            "a missing run is not claimed"
        );
        let queued: Vec<String> = store
            .queued_runs(10)
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(queued, vec!["b".to_string()]);
        assert_eq!(store.run_row("a").unwrap().unwrap().state, "interrupted");
    }

    #[test]
    fn pruning_keeps_the_newest_and_every_waiting_run() {
        let (_dir, store) = store();
        for i in 0..3 {
            let mut r = run(&format!("r{i}"), None);
            r.max_queued = 100;
            store.enqueue_run(r).wait().unwrap();
            store
                .mark_run(format!("r{i}"), state::SUCCEEDED, None)
                .wait()
                .unwrap();
        }
        store.prune_runs(1).wait().unwrap();
        let ids: Vec<String> = store
            .run_rows(None, 10)
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(ids, vec!["r2".to_string()]);
    }

    #[test]
    fn a_dedupe_key_outlives_its_pruned_row_until_its_replay_window_ends() {
        let (_dir, store) = store();
        let finished = |id: &str| {
            store.mark_run(id, state::SUCCEEDED, None).wait().unwrap();
        };
        let later = now_ms() + 60_000;
        let mut first = run("a", Some("sig-ab"));
        first.replay_until_ms = Some(later);
        assert_eq!(store.enqueue_run(first).wait().unwrap(), Enqueued::Queued);
        finished("a");
        assert_eq!(
            store.enqueue_run(run("b", Some("sig-ab"))).wait().unwrap(),
            Enqueued::Duplicate
        );
        // A key past its window is forgotten with its row.
        let mut old = run("c", Some("sig-old"));
        old.replay_until_ms = Some(now_ms() - 1);
        assert_eq!(store.enqueue_run(old).wait().unwrap(), Enqueued::Queued);
        finished("c");
        // So is one that never had a window.
        assert_eq!(
            store.enqueue_run(run("d", Some("id-1"))).wait().unwrap(),
            Enqueued::Queued
        );
        finished("d");
        assert_eq!(store.prune_runs(0).wait().unwrap(), 3);
        assert!(store.run_row("a").unwrap().is_none());
        assert_eq!(
            store.enqueue_run(run("e", Some("sig-ab"))).wait().unwrap(),
            Enqueued::Duplicate,
            "the pruned row's key still refuses a replay"
        );
        for (id, key) in [("f", "sig-old"), ("g", "id-1")] {
            assert_eq!(
                store.enqueue_run(run(id, Some(key))).wait().unwrap(),
                Enqueued::Queued
            );
        }
        assert_eq!(store.prune_replays().wait().unwrap(), 0, "nothing expired");
    }
}
