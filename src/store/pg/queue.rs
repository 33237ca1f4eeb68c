//! [`FleetQueue`] over PostgreSQL: the same semantics as the SQLite queue
//! (`store::queue`, `store::fleet`), word for word, for many machines. An
//! enqueue holds a transaction-level advisory lock on its queue (so two
//! ingress processes never both see "no run active", and a `replace`
//! marks the running run of its key in the same transaction); a claim takes
//! the oldest queued row that may start (the head of its trigger's queue
//! of its key, none of which runs) with `FOR UPDATE SKIP LOCKED`: one
//! statement, so a claimer that skips a locked head never takes the run
//! behind it; every write under a
//! lease checks its fencing token in the same statement (a renewal its
//! expiry too: [`crate::store::fleet::LeaseCheck`]);
//! events are appended under a per-fleet advisory lock, so their ids are in
//! commit order and a tailer never skips one committed late. Finished runs
//! past the newest `RUN_HISTORY_LIMIT` are pruned as the embedded store
//! prunes them ([`PgStore::prune`]), their live webhook replay keys kept in
//! `npc_webhook_replays`, bounded per queue.

use std::sync::LazyLock;
use std::time::Duration;

use deadpool_postgres::GenericClient;
use tokio_postgres::Row;

use super::{EVENTS_CHANNEL, PgStore, STOP_CHANNEL, WAKE_CHANNEL, bounded, pg_error};
use crate::store::fleet::{
    Claimed, FleetQueue, Handover, HandoverFuture, Lease, NextClaim, Rescue, Rescued, StoreFuture,
    lease_ms,
};
use crate::store::queue::{
    Enqueued, MANUAL_QUEUE, MAX_REPLAY_KEYS_PER_QUEUE, MAX_RUNS_PER_READ, NewRun, RowOrigin,
    RunCode, RunRow, attempt_of, cancelled_event, replaced_detail, state,
};
use crate::store::{Event, MAX_EVENTS_PER_READ, NewEvent, StoreError, json_error, untrusted};

/// The advisory lock class of a queue's enqueues (key: its trigger).
const QUEUE_LOCK_CLASS: i32 = 0x6e70_6371;
/// The advisory lock class of a fleet's event appends.
const EVENTS_LOCK_CLASS: i32 = 0x6e70_6576;

/// A run row's columns as a query reads them: each text cut to its bound
/// and each JSON field over its bound read as the truncation marker
/// ([`untrusted`]), the payload at most `payload_bytes`; named as the
/// table's columns, each prefixed by `alias` (`""` or `"r."`).
fn run_columns(alias: &str, payload_bytes: usize, states: States) -> String {
    RUN_COLUMN_NAMES
        .iter()
        .map(|&(col, read)| {
            let named = format!("{alias}{col}");
            if col == "state" && states == States::Seen {
                return seen_state();
            }
            match read {
                Read::Plain => named,
                Read::Name => format!(
                    "{} AS {col}",
                    untrusted::pg_text(&named, untrusted::MAX_NAME_CHARS)
                ),
                Read::Text => format!(
                    "{} AS {col}",
                    untrusted::pg_text(&named, untrusted::MAX_TEXT_CHARS)
                ),
                Read::Payload => {
                    format!("{} AS {col}", untrusted::pg_json(&named, payload_bytes))
                }
                Read::Result => format!(
                    "{} AS {col}",
                    untrusted::pg_json(&named, untrusted::MAX_LISTED_JSON_BYTES)
                ),
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Which state a run row's `state` column reads ([`run_columns`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum States {
    /// As stored: what a claim or a worker acts on.
    Stored,
    /// As a person reads a listing ([`seen_state`]).
    Seen,
}

/// How a column of a run row is read ([`run_columns`]).
#[derive(Clone, Copy)]
enum Read {
    Plain,
    Name,
    Text,
    Payload,
    Result,
}

/// A run row's columns, in order, and how each is read.
const RUN_COLUMN_NAMES: [(&str, Read); 21] = [
    ("seq", Read::Plain),
    ("id", Read::Name),
    ("trigger", Read::Name),
    ("origin", Read::Name),
    ("dedupe_key", Read::Name),
    ("payload", Read::Payload),
    ("state", Read::Name),
    ("enqueued_at_ms", Read::Plain),
    ("started_at_ms", Read::Plain),
    ("finished_at_ms", Read::Plain),
    ("detail", Read::Text),
    ("owner", Read::Name),
    ("concurrency_key", Read::Name),
    ("result", Read::Result),
    ("worktree", Read::Text),
    ("lease_token", Read::Plain),
    ("lease_expires_at_ms", Read::Plain),
    ("attempt", Read::Plain),
    ("attempts", Read::Plain),
    ("remote", Read::Name),
    ("start_commit", Read::Name),
];

/// The `state` column of a listed run as a reader sees it: a running run
/// with a pending approval in `npc_approvals` reads `waiting`, as a local
/// store's listing says (`store::queue`'s `run_columns_seen`).
fn seen_state() -> String {
    format!(
        "CASE WHEN state = '{running}' AND EXISTS (SELECT 1 FROM npc_approvals a \
         WHERE a.fleet = npc_runs.fleet AND a.run_id = npc_runs.id AND a.state = '{pending}') \
         THEN '{waiting}' ELSE {stored} END AS state",
        running = state::RUNNING,
        waiting = state::WAITING,
        pending = crate::store::approvals::state::PENDING,
        stored = untrusted::pg_text("state", untrusted::MAX_NAME_CHARS),
    )
}

/// A page of the fleet's runs: `$1` the fleet, `$2` the most rows, `$3` a
/// trigger or NULL, `$4` the run the page goes on before or NULL; newest
/// first, each payload and result as a listing reads them, a run waiting on
/// an approval as `waiting` ([`seen_state`]), the page cut at
/// [`untrusted::MAX_PAGE_BYTES`].
static RUN_PAGE_SQL: LazyLock<String> = LazyLock::new(|| {
    let columns = run_columns("", untrusted::MAX_LISTED_JSON_BYTES, States::Seen);
    let names = RUN_COLUMN_NAMES
        .iter()
        .map(|(col, _)| *col)
        .collect::<Vec<_>>()
        .join(", ");
    untrusted::pg_budgeted(
        &format!(
            "SELECT {columns}, {} + {} + {} AS bytes
             FROM npc_runs WHERE fleet = $1
             AND ($3::text IS NULL OR trigger = $3)
             AND ($4::text IS NULL
                  OR seq < (SELECT seq FROM npc_runs WHERE fleet = $1 AND id = $4))
             ORDER BY seq DESC LIMIT $2",
            untrusted::pg_size("payload", untrusted::MAX_LISTED_JSON_BYTES),
            untrusted::pg_size("result", untrusted::MAX_LISTED_JSON_BYTES),
            untrusted::pg_size("detail", untrusted::MAX_TEXT_CHARS),
        ),
        &names,
        "seq DESC",
    )
});

/// A page of the fleet's event log: `$1` the fleet, `$2` the id it goes on
/// after, `$3` the most rows, `$4` a component or NULL; oldest first, each
/// text cut to its bound and each payload to
/// [`untrusted::MAX_EVENT_PAYLOAD_BYTES`], the page cut at
/// [`untrusted::MAX_PAGE_BYTES`].
static EVENT_PAGE_SQL: LazyLock<String> = LazyLock::new(|| {
    untrusted::pg_budgeted(
        &format!(
            "SELECT id, ts_ms, {} AS kind, {} AS component, {} AS payload,
                 {} AS bytes
             FROM npc_events
             WHERE fleet = $1 AND id > $2 AND ($4::text IS NULL OR component = $4)
             ORDER BY id LIMIT $3",
            untrusted::pg_text("kind", untrusted::MAX_KIND_CHARS),
            untrusted::pg_text("component", untrusted::MAX_COMPONENT_CHARS),
            untrusted::pg_json("payload", untrusted::MAX_EVENT_PAYLOAD_BYTES),
            untrusted::pg_size("payload", untrusted::MAX_EVENT_PAYLOAD_BYTES),
        ),
        "id, ts_ms, kind, component, payload",
        "id",
    )
});

/// [`run_columns`] of one run read whole (a claim, a look at one run).
static RUN_COLUMNS: LazyLock<String> =
    LazyLock::new(|| run_columns("", untrusted::MAX_CLAIMED_PAYLOAD_BYTES, States::Stored));

/// A run row as read: other machines wrote it, so every text is made
/// printable (the id too; a claim's lease names the row's id as stored).
fn run_of(row: &Row) -> Result<RunRow, StoreError> {
    let payload: String = row.get("payload");
    Ok(RunRow {
        seq: row.get("seq"),
        id: untrusted::text(row.get("id")),
        trigger: untrusted::text(row.get("trigger")),
        origin: RowOrigin::from(row.get::<_, String>("origin")),
        dedupe_key: untrusted::opt_text(row.get("dedupe_key")),
        payload: untrusted::json(
            serde_json::from_str(&payload).map_err(json_error("run payload"))?,
        ),
        state: untrusted::text(row.get("state")),
        enqueued_at_ms: row.get("enqueued_at_ms"),
        started_at_ms: row.get("started_at_ms"),
        finished_at_ms: row.get("finished_at_ms"),
        detail: untrusted::opt_text(row.get("detail")),
        owner: untrusted::opt_text(row.get("owner")),
        concurrency_key: untrusted::opt_text(row.get("concurrency_key")),
        result: row
            .get::<_, Option<String>>("result")
            .and_then(|text| serde_json::from_str(&text).ok())
            .map(untrusted::json),
        worktree: untrusted::opt_text(row.get("worktree")),
        attempt: attempt_of(row.get::<_, i32>("attempt").into()),
        attempts: attempt_of(row.get::<_, i32>("attempts").into()),
        code: RunCode::of(
            untrusted::opt_text(row.get("remote")),
            untrusted::opt_text(row.get("start_commit")),
        ),
    })
}

/// An event as read: another machine may have written it, so its texts
/// are made printable ([`EVENT_PAGE_SQL`] bounds them).
fn event_of(row: &Row) -> Result<Event, StoreError> {
    let payload: String = row.get("payload");
    Ok(Event {
        id: row.get("id"),
        ts_ms: row.get("ts_ms"),
        kind: untrusted::text(row.get("kind")),
        component: untrusted::opt_text(row.get("component")),
        payload: untrusted::json(
            serde_json::from_str(&payload).map_err(json_error("event payload"))?,
        ),
    })
}

/// An attempt count as the schema stores it.
fn count_of(n: u32) -> i32 {
    i32::try_from(n.max(1)).unwrap_or(i32::MAX)
}

fn fenced(lease: &Lease) -> StoreError {
    StoreError::Fenced {
        run: lease.run_id.clone(),
        token: lease.token,
    }
}

/// A claim's answer: the run and its lease, if one was claimed.
fn claimed_of(row: Option<Row>, worker: &str) -> Result<Option<Claimed>, StoreError> {
    let Some(row) = row else {
        return Ok(None);
    };
    let run = run_of(&row)?;
    let lease = Lease {
        // The row's id as stored (cut to its bound), whatever it shows as.
        run_id: row.get("id"),
        worker: worker.to_string(),
        token: row.get("lease_token"),
        expires_at_ms: row.get("lease_expires_at_ms"),
        replaced_by: None,
    };
    Ok(Some(Claimed { run, lease }))
}

/// A run's end as written under its lease.
#[derive(Clone, Copy)]
struct Written<'a> {
    lease: &'a Lease,
    end: &'a str,
    detail: &'a Option<String>,
    result: &'a Option<String>,
}

/// Write a run's end ([`FINISH_SQL`], prepared as `finish`) for `fleet`:
/// fenced when nothing was written. Its request is sent on the first poll.
async fn end_on(
    client: &deadpool_postgres::Object,
    finish: &tokio_postgres::Statement,
    fleet: &str,
    written: Written<'_>,
) -> Result<(), StoreError> {
    let Written {
        lease,
        end,
        detail,
        result,
    } = written;
    let written = client
        .query_opt(
            finish,
            &[
                &fleet,
                &lease.run_id,
                &lease.token,
                &end,
                detail,
                &WAKE_CHANNEL,
                result,
            ],
        )
        .await
        .map_err(pg_error("finish a run"))?;
    if written.is_none() {
        return Err(fenced(lease));
    }
    Ok(())
}

/// The condition that a run of fleet `$1` is still under a lease, the
/// placeholders `id` and `token` naming the run and the lease's token:
/// running under that token, its expiry passed or not (see
/// [`crate::store::fleet::LeaseCheck::Token`]: only a rescue, a release or
/// a claim moves the token on). The run is named by one value,
/// `npc_run_of(fleet, id)`, which only the index of leased runs
/// (`npc_runs_leased`, whose predicate is the expiry's presence) is led
/// by, so the look reads that run alone whatever the statistics; it names
/// no state, since only a running run holds a lease (the table's check
/// `npc_runs_lease_only_running`), and a state would let the partial
/// indexes of running runs serve it, read whole.
fn under_token(id: &str, token: &str) -> String {
    format!(
        "npc_run_of(fleet, id) = npc_run_of($1, {id}) AND lease_token = {token} \
         AND lease_expires_at_ms IS NOT NULL"
    )
}

/// [`under_token`]: `$2` the run id, `$3` the token; what every write
/// under a lease checks but a renewal.
static UNDER_TOKEN: LazyLock<String> = LazyLock::new(|| under_token("$2", "$3"));

/// [`UNDER_TOKEN`] and not expired
/// ([`crate::store::fleet::LeaseCheck::Live`]): what a renewal checks.
static HELD: LazyLock<String> =
    LazyLock::new(|| format!("{} AND lease_expires_at_ms >= npc_now_ms()", *UNDER_TOKEN));

/// The claim: `$1` fleet, `$2` worker, `$3` the lease in milliseconds, `$4`
/// the queue of runs by hand. The oldest queued run that heads its
/// trigger's queue of its key with none of them running; a run by hand
/// waits for nothing. The candidates come from `npc_runs_claim_order` in
/// its order, `seq + 0` (no other index has it, so the planner never
/// walks the whole history by the primary key instead, as it did for
/// `ORDER BY seq` once statistics showed many queued runs; `q.seq > 0`
/// names its predicate); "none of its key running or ahead" holds without
/// a look for a run not `behind` (none of its key was queued or running
/// at its enqueue, and none can be since: see [`BEHIND_SQL`]), and is two
/// index-only probes for one that is, so concurrent claimers skipping
/// each other's locked runs probe nothing in the usual case.
static CLAIM_SQL: LazyLock<String> = LazyLock::new(|| claim_sql(""));

/// The claim's SQL, for `EXPLAIN`: `$1` the fleet, `$2` the worker, `$3`
/// the lease in milliseconds, `$4` the queue of runs by hand.
pub fn claim_statement() -> &'static str {
    &CLAIM_SQL
}

/// The claim sent with a run's end ([`FleetQueue::finish_and_claim`]):
/// [`CLAIM_SQL`], made only once run `$5` is no longer [`under_token`]
/// `$6` (one probe, evaluated once), as the embedded store claims after
/// an end that was written or fenced.
static CLAIM_AFTER_SQL: LazyLock<String> = LazyLock::new(|| {
    claim_sql(&format!(
        "NOT EXISTS (SELECT 1 FROM npc_runs WHERE {}) AND",
        under_token("$5", "$6")
    ))
});

/// [`CLAIM_SQL`], claiming only when `only_if` (a condition followed by
/// `AND`, or nothing) holds.
fn claim_sql(only_if: &str) -> String {
    format!(
        "WITH next AS (
             SELECT q.seq FROM npc_runs q WHERE {only_if} q.fleet = $1 AND q.state = 'queued'
             AND q.seq > 0 AND (NOT q.behind OR q.trigger = $4 OR (NOT EXISTS (SELECT 1 FROM npc_runs o
                     WHERE {same} AND o.state = 'running')
                 AND NOT EXISTS (SELECT 1 FROM npc_runs o
                     WHERE {same} AND o.state = 'queued' AND o.seq < q.seq)))
             ORDER BY q.seq + 0 LIMIT 1 FOR UPDATE OF q SKIP LOCKED)
         UPDATE npc_runs r SET state = 'running', detail = NULL,
             started_at_ms = npc_now_ms(), owner = $2, lease_token = r.lease_token + 1,
             lease_expires_at_ms = npc_now_ms() + $3
         FROM next WHERE r.seq = next.seq
         RETURNING {}",
        run_columns("r.", untrusted::MAX_CLAIMED_PAYLOAD_BYTES, States::Stored),
        same = of_queue("o.", "q.fleet", "q.trigger", "q.key_slot"),
    )
}

/// The condition that a run (its columns named with `alias`, `""` or
/// `"o."`) is of the trigger's queue of one key given as SQL expressions:
/// `npc_queue_of` of both sides, so only the indexes of a key's queued and
/// running runs serve it (named as three columns, the fleet and the
/// trigger lead other indexes too, and the planner took one of those
/// before a fleet's first `ANALYZE`, reading every run of the trigger).
fn of_queue(alias: &str, fleet: &str, trigger: &str, key_slot: &str) -> String {
    format!(
        "npc_queue_of({alias}fleet, {alias}trigger, {alias}key_slot) \
         = npc_queue_of({fleet}, {trigger}, {key_slot})"
    )
}

/// Whether a run of the fleet `fleet`'s trigger `trigger` and key `key`
/// (SQL expressions) is queued or running.
fn key_active(fleet: &str, trigger: &str, key: &str) -> String {
    let same = of_queue("", fleet, trigger, &format!("npc_key_slot({key})"));
    format!(
        "(EXISTS (SELECT 1 FROM npc_runs WHERE {same} AND state = 'queued')
         OR EXISTS (SELECT 1 FROM npc_runs WHERE {same} AND state = 'running'))"
    )
}

/// Whether a run enqueued now is `behind` another of its trigger's queue of
/// its key: one of them queued or running, `$1` the fleet, `$3` the
/// trigger and `$12` the key, as [`ENQUEUE_SQL`] numbers them.
///
/// A run not behind heads its key's queue with none of them running, and
/// stays so while queued: every run of its key enqueued later comes after
/// it, a run of its key can start only by a claim (it heads them all) or
/// by an enqueue as running, which marks the queued runs of its key behind
/// first, and a rescue puts a run back in the queue behind. Enqueues of
/// one trigger hold its queue's lock, so none of them misses another's
/// run.
static BEHIND_SQL: LazyLock<String> = LazyLock::new(|| key_active("$1", "$3", "$12"));

/// [`of_queue`] of the fleet `$1`'s trigger `$2` and key `$3`, as the
/// enqueue's statements about the runs of its key number them.
static OF_KEY: LazyLock<String> = LazyLock::new(|| of_queue("", "$1", "$2", "npc_key_slot($3)"));

/// Whether a run of the fleet `$1`'s trigger `$2` and key `$3` is queued or
/// running (`skip`).
static KEY_ACTIVE_SQL: LazyLock<String> =
    LazyLock::new(|| format!("SELECT {}", key_active("$1", "$2", "$3")));

/// A run enqueued as running (in the foreground) puts the queued runs of
/// its key ([`OF_KEY`]) behind it.
static PUT_BEHIND_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE npc_runs SET behind = true WHERE {} AND state = 'queued' AND NOT behind",
        *OF_KEY
    )
});

/// Overlap `replace`: the queued runs of the key ([`OF_KEY`]) cancelled,
/// `$4` their state and `$5` their detail.
static CANCEL_QUEUED_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE npc_runs SET state = $4, detail = $5, finished_at_ms = npc_now_ms()
         WHERE {} AND state = 'queued' RETURNING id",
        *OF_KEY
    )
});

/// Overlap `replace`: the running runs of the key ([`OF_KEY`]) marked
/// replaced by run `$4`.
static MARK_REPLACED_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE npc_runs SET replaced_by = $4 WHERE {} AND state = 'running' RETURNING id",
        *OF_KEY
    )
});

/// A run's insert by its enqueue, whether it is [`BEHIND_SQL`] with it.
static ENQUEUE_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "INSERT INTO npc_runs (fleet, id, trigger, origin, dedupe_key, payload, state,
         enqueued_at_ms, started_at_ms, finished_at_ms, owner, replay_until_ms,
         concurrency_key, attempt, attempts, remote, start_commit, behind)
         VALUES ($1, $2, $3, $4, $5, $6, $7, npc_now_ms(),
                 CASE WHEN $8 THEN npc_now_ms() END, CASE WHEN $9 THEN npc_now_ms() END,
                 $10, $11, $12, $13, $14, $15, $16, {})",
        *BEHIND_SQL
    )
});

/// A renewal: [`HELD`], and `$4` the lease in milliseconds.
static RENEW_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE npc_runs SET lease_expires_at_ms = npc_now_ms() + $4
         WHERE {} RETURNING lease_expires_at_ms, replaced_by",
        *HELD
    )
});

/// A run's end: [`UNDER_TOKEN`], `$4` its state and `$5` its detail; wakes the
/// workers (`$6`, the wake channel) when a run of its key waits. A row
/// when written, none when fenced. One `UPDATE` whose returned value looks
/// for the waiting run: the same work as data-modifying CTEs joined and
/// counted, in 4 plan nodes instead of 11, which the server sets up again
/// for every execution.
static FINISH_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE npc_runs SET state = $4, detail = $5, finished_at_ms = npc_now_ms(),
             result = COALESCE($7, result), lease_expires_at_ms = NULL
         WHERE {held}
         RETURNING (SELECT pg_notify($6, $1) FROM npc_runs w
             WHERE {same} AND w.state = 'queued' LIMIT 1) IS NULL",
        held = *UNDER_TOKEN,
        same = of_queue("w.", "$1", "npc_runs.trigger", "npc_runs.key_slot"),
    )
});

/// A run's end's SQL, for `EXPLAIN`: `$1` the fleet, `$2` the run, `$3` its
/// lease's token, `$4` its state, `$5` its detail, `$6` the wake channel,
/// `$7` its result.
pub fn finish_statement() -> &'static str {
    &FINISH_SQL
}

/// A run handed back to the queue: [`UNDER_TOKEN`]; wakes the workers (`$4`, the
/// wake channel). It is `behind` again, as a rescued run is: whatever
/// started meanwhile, its claim looks. A row when handed back, none when
/// fenced.
static RELEASE_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE npc_runs SET state = 'queued', started_at_ms = NULL, owner = NULL,
             lease_token = lease_token + 1, lease_expires_at_ms = NULL, behind = true
         WHERE {} RETURNING pg_notify($4, $1)",
        *UNDER_TOKEN
    )
});

/// A change of attempt under a lease: [`UNDER_TOKEN`], `$4` the attempt.
static ATTEMPT_SQL: LazyLock<String> =
    LazyLock::new(|| format!("UPDATE npc_runs SET attempt = $4 WHERE {}", *UNDER_TOKEN));

impl PgStore {
    async fn enqueue_run(&self, run: NewRun) -> Result<Enqueued, StoreError> {
        let failed = pg_error("enqueue a run");
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(&failed)?;
        let fleet = self.fleet();
        let queue_key = format!("{fleet}\n{}", run.trigger);
        tx.execute(
            "SELECT pg_advisory_xact_lock($1, hashtext($2))",
            &[&QUEUE_LOCK_CLASS, &queue_key],
        )
        .await
        .map_err(&failed)?;
        if let Some((key, value)) = &run.state {
            tx.execute(
                "INSERT INTO npc_trigger_state (fleet, trigger, key, value, updated_at_ms)
                 VALUES ($1, $2, $3, $4, npc_now_ms())
                 ON CONFLICT (fleet, trigger, key)
                 DO UPDATE SET value = EXCLUDED.value, updated_at_ms = EXCLUDED.updated_at_ms",
                &[&fleet, &run.trigger, key, &value.to_string()],
            )
            .await
            .map_err(&failed)?;
        }
        let outcome = 'decide: {
            if let Some(key) = &run.dedupe_key {
                let held = tx
                    .query_opt(
                        "SELECT 1 FROM npc_runs WHERE fleet = $1 AND trigger = $2 AND dedupe_key = $3
                         UNION ALL SELECT 1 FROM npc_webhook_replays
                         WHERE fleet = $1 AND trigger = $2 AND key = $3
                           AND expires_at_ms > npc_now_ms() LIMIT 1",
                        &[&fleet, &run.trigger, key],
                    )
                    .await
                    .map_err(&failed)?;
                if held.is_some() {
                    break 'decide Enqueued::Duplicate;
                }
            }
            if run.skip_if_active {
                let active: bool = tx
                    .query_one(
                        &*KEY_ACTIVE_SQL,
                        &[&fleet, &run.trigger, &run.concurrency_key],
                    )
                    .await
                    .map_err(&failed)?
                    .get(0);
                if active {
                    break 'decide Enqueued::Skipped;
                }
            }
            if run.claimed_by.is_none() {
                let limit = i64::try_from(run.max_queued).unwrap_or(i64::MAX);
                let waiting: i64 = tx
                    .query_one(
                        "SELECT COUNT(*) FROM (SELECT 1 FROM npc_runs WHERE fleet = $1
                         AND trigger = $2 AND state = 'queued' LIMIT $3) AS q",
                        &[&fleet, &run.trigger, &limit],
                    )
                    .await
                    .map_err(&failed)?
                    .get(0);
                if waiting >= limit {
                    break 'decide Enqueued::Full;
                }
            }
            Enqueued::Queued
        };
        let mut replaced = Vec::new();
        if outcome == Enqueued::Queued && run.replace_active {
            replaced = self.replace_active(&tx, &run).await?;
        }
        if matches!(outcome, Enqueued::Queued | Enqueued::Skipped) {
            let (row_state, started, finished) = match (outcome, &run.claimed_by) {
                (Enqueued::Skipped, _) => (state::SKIPPED, false, true),
                (_, Some(_)) => (state::RUNNING, true, false),
                _ => (state::QUEUED, false, false),
            };
            if row_state == state::RUNNING {
                tx.execute(
                    &*PUT_BEHIND_SQL,
                    &[&fleet, &run.trigger, &run.concurrency_key],
                )
                .await
                .map_err(&failed)?;
            }
            tx.execute(
                &*ENQUEUE_SQL,
                &[
                    &fleet,
                    &run.id,
                    &run.trigger,
                    &run.origin.as_str(),
                    &run.dedupe_key,
                    &run.payload,
                    &row_state,
                    &started,
                    &finished,
                    &run.claimed_by,
                    &run.replay_until_ms,
                    &run.concurrency_key,
                    &count_of(run.attempt),
                    &count_of(run.attempts),
                    &run.code.as_ref().map(|c| c.remote.as_str()),
                    &run.code.as_ref().and_then(|c| c.commit.as_deref()),
                ],
            )
            .await
            .map_err(&failed)?;
            if row_state == state::QUEUED {
                tx.execute("SELECT pg_notify($1, $2)", &[&WAKE_CHANNEL, &fleet])
                    .await
                    .map_err(&failed)?;
            }
        }
        for id in &replaced {
            tx.execute("SELECT pg_notify($1, $2)", &[&STOP_CHANNEL, id])
                .await
                .map_err(&failed)?;
        }
        tx.commit().await.map_err(&failed)?;
        Ok(outcome)
    }

    /// Overlap `replace`, in `run`'s enqueue: the queue's queued runs of its
    /// key are cancelled (each with its `run.cancelled`), its running ones
    /// marked replaced by `run`; returns the running ones.
    async fn replace_active(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        run: &NewRun,
    ) -> Result<Vec<String>, StoreError> {
        let failed = pg_error("replace the running runs");
        let fleet = self.fleet();
        let detail = replaced_detail(&run.id);
        let cancelled = tx
            .query(
                &*CANCEL_QUEUED_SQL,
                &[
                    &fleet,
                    &run.trigger,
                    &run.concurrency_key,
                    &state::CANCELLED,
                    &detail,
                ],
            )
            .await
            .map_err(&failed)?;
        let running = tx
            .query(
                &*MARK_REPLACED_SQL,
                &[&fleet, &run.trigger, &run.concurrency_key, &run.id],
            )
            .await
            .map_err(&failed)?;
        // The event lock last: every row lock is taken before it, as in
        // a fenced append.
        let events: Vec<NewEvent> = cancelled
            .iter()
            .map(|row| cancelled_event(row.get(0), &detail))
            .collect();
        if !events.is_empty() {
            self.insert_events(tx, events).await?;
        }
        Ok(running.iter().map(|row| row.get(0)).collect())
    }

    async fn claim_run(
        &self,
        worker: &str,
        lease: Duration,
    ) -> Result<Option<Claimed>, StoreError> {
        let client = self.client().await?;
        let claim = client
            .prepare_cached(&CLAIM_SQL)
            .await
            .map_err(pg_error("claim a run"))?;
        let row = client
            .query_opt(
                &claim,
                &[&self.fleet(), &worker, &lease_ms(lease), &MANUAL_QUEUE],
            )
            .await
            .map_err(pg_error("claim a run"))?;
        claimed_of(row, worker)
    }

    async fn renew(&self, lease: &Lease, lease_for: Duration) -> Result<Lease, StoreError> {
        let client = self.client().await?;
        let renew = client
            .prepare_cached(&RENEW_SQL)
            .await
            .map_err(pg_error("renew a lease"))?;
        let row = client
            .query_opt(
                &renew,
                &[
                    &self.fleet(),
                    &lease.run_id,
                    &lease.token,
                    &lease_ms(lease_for),
                ],
            )
            .await
            .map_err(pg_error("renew a lease"))?;
        match row {
            Some(row) => Ok(Lease {
                expires_at_ms: row.get(0),
                replaced_by: row.get(1),
                ..lease.clone()
            }),
            None => Err(fenced(lease)),
        }
    }

    async fn finish_run(
        &self,
        lease: &Lease,
        end: &'static str,
        detail: Option<String>,
        result: Option<serde_json::Value>,
    ) -> Result<(), StoreError> {
        let result = result.map(|r| r.to_string());
        let client = self.client().await?;
        let finish = client
            .prepare_cached(&FINISH_SQL)
            .await
            .map_err(pg_error("finish a run"))?;
        let written = Written {
            lease,
            end,
            detail: &detail,
            result: &result,
        };
        end_on(&client, &finish, self.fleet(), written).await
    }

    async fn release_run(&self, lease: &Lease) -> Result<(), StoreError> {
        let client = self.client().await?;
        let released = client
            .query_opt(
                RELEASE_SQL.as_str(),
                &[&self.fleet(), &lease.run_id, &lease.token, &WAKE_CHANNEL],
            )
            .await
            .map_err(pg_error("hand a run back"))?;
        released.map(drop).ok_or_else(|| fenced(lease))
    }

    /// A run's end and the claim after it, pipelined on one connection:
    /// both statements go out at once, the end first, so the claim (made
    /// only once the run is no longer held) sees it and a run of its key
    /// may be the next.
    async fn hand_over(
        &self,
        lease: &Lease,
        end: &'static str,
        detail: Option<String>,
        result: Option<serde_json::Value>,
        next: NextClaim<'_>,
    ) -> Handover {
        let result = result.map(|r| r.to_string());
        let client = match self.client().await {
            Ok(client) => client,
            Err(e) => {
                return Handover {
                    ended: Err(e),
                    next: Ok(None),
                };
            }
        };
        let (finish, claim) = match futures_util::future::try_join(
            client.prepare_cached(&FINISH_SQL),
            client.prepare_cached(&CLAIM_AFTER_SQL),
        )
        .await
        {
            Ok(prepared) => prepared,
            Err(e) => {
                return Handover {
                    ended: Err(pg_error("finish a run")(e)),
                    next: Ok(None),
                };
            }
        };
        let fleet = self.fleet();
        let lease_for = lease_ms(next.lease);
        let written = Written {
            lease,
            end,
            detail: &detail,
            result: &result,
        };
        // `join` polls the end first: its request is queued before the claim's.
        let (ended, claimed) = futures_util::future::join(
            end_on(&client, &finish, fleet, written),
            client.query_opt(
                &claim,
                &[
                    &fleet,
                    &next.worker,
                    &lease_for,
                    &MANUAL_QUEUE,
                    &lease.run_id,
                    &lease.token,
                ],
            ),
        )
        .await;
        Handover {
            ended,
            next: claimed
                .map_err(pg_error("claim a run"))
                .and_then(|row| claimed_of(row, next.worker)),
        }
    }

    async fn attempting(&self, lease: &Lease, attempt: u32) -> Result<(), StoreError> {
        let client = self.client().await?;
        let changed = client
            .execute(
                ATTEMPT_SQL.as_str(),
                &[
                    &self.fleet(),
                    &lease.run_id,
                    &lease.token,
                    &count_of(attempt),
                ],
            )
            .await
            .map_err(pg_error("record a run's attempt"))?;
        if changed == 0 {
            return Err(fenced(lease));
        }
        Ok(())
    }

    async fn append(
        &self,
        lease: Option<&Lease>,
        events: Vec<NewEvent>,
    ) -> Result<Vec<Event>, StoreError> {
        let failed = pg_error("append events");
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(&failed)?;
        if let Some(lease) = lease {
            // The row stays locked to the commit: a rescue waits for it.
            let held = tx
                .query_opt(
                    &format!("SELECT 1 FROM npc_runs WHERE {} FOR UPDATE", *UNDER_TOKEN),
                    &[&self.fleet(), &lease.run_id, &lease.token],
                )
                .await
                .map_err(&failed)?;
            if held.is_none() {
                return Err(fenced(lease));
            }
        }
        let stored = self.insert_events(&tx, events).await?;
        tx.commit().await.map_err(&failed)?;
        Ok(stored)
    }

    /// Append `events` in `tx`, under the fleet's event lock (so ids are in
    /// commit order).
    async fn insert_events(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        events: Vec<NewEvent>,
    ) -> Result<Vec<Event>, StoreError> {
        let failed = pg_error("append events");
        tx.execute(
            "SELECT pg_advisory_xact_lock($1, hashtext($2))",
            &[&EVENTS_LOCK_CLASS, &self.fleet()],
        )
        .await
        .map_err(&failed)?;
        // The notification goes with the commit, in the insert's own round
        // trip (one per transaction: the server folds equal ones).
        let insert = tx
            .prepare(
                "WITH stored AS (INSERT INTO npc_events (fleet, ts_ms, kind, component, payload)
                   VALUES ($1, npc_now_ms(), $2, $3, $4) RETURNING id, ts_ms)
                 SELECT id, ts_ms, pg_notify($5, $1) FROM stored",
            )
            .await
            .map_err(&failed)?;
        let mut stored = Vec::with_capacity(events.len());
        for event in events {
            let (kind, component, payload) = event.into_parts();
            let row = tx
                .query_one(
                    &insert,
                    &[
                        &self.fleet(),
                        &kind,
                        &component,
                        &payload.to_string(),
                        &EVENTS_CHANNEL,
                    ],
                )
                .await
                .map_err(&failed)?;
            stored.push(Event {
                id: row.get(0),
                ts_ms: row.get(1),
                kind,
                component,
                payload,
            });
        }
        Ok(stored)
    }

    /// Rescue the fleet's runs whose lease ran out (see [`Rescue`]); each
    /// once: a second rescuer waits on the row locks and then finds them
    /// rescued.
    async fn expired(&self) -> Result<Vec<Rescued>, StoreError> {
        let failed = pg_error("rescue expired leases");
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(&failed)?;
        let lost = tx
            .query(
                "SELECT id, attempt, attempts, replaced_by FROM npc_runs
                 WHERE fleet = $1 AND state = 'running' AND lease_expires_at_ms < npc_now_ms()
                 ORDER BY seq FOR UPDATE",
                &[&self.fleet()],
            )
            .await
            .map_err(&failed)?;
        let mut rescued = Vec::with_capacity(lost.len());
        for row in &lost {
            let id: String = row.get(0);
            let rescue = Rescue::of(
                attempt_of(row.get::<_, i32>(1).into()),
                attempt_of(row.get::<_, i32>(2).into()),
                row.get(3),
            );
            if let Rescue::Retried { attempt, .. } = &rescue {
                tx.execute(
                    "UPDATE npc_runs SET state = $3, detail = NULL, started_at_ms = NULL,
                     owner = NULL, attempt = $4, lease_token = lease_token + 1,
                     lease_expires_at_ms = NULL, behind = true WHERE fleet = $1 AND id = $2",
                    &[&self.fleet(), &id, &rescue.state(), &count_of(*attempt)],
                )
                .await
                .map_err(&failed)?;
            } else {
                tx.execute(
                    "UPDATE npc_runs SET state = $3, detail = $4, finished_at_ms = npc_now_ms(),
                     lease_token = lease_token + 1, lease_expires_at_ms = NULL
                     WHERE fleet = $1 AND id = $2",
                    &[&self.fleet(), &id, &rescue.state(), &rescue.detail()],
                )
                .await
                .map_err(&failed)?;
            }
            rescued.push(Rescued { run_id: id, rescue });
        }
        if !rescued.is_empty() {
            let events = rescued.iter().flat_map(Rescued::events).collect();
            self.insert_events(&tx, events).await?;
        }
        if rescued
            .iter()
            .any(|r| matches!(r.rescue, Rescue::Retried { .. }))
        {
            tx.execute("SELECT pg_notify($1, $2)", &[&WAKE_CHANNEL, &self.fleet()])
                .await
                .map_err(&failed)?;
        }
        tx.commit().await.map_err(&failed)?;
        Ok(rescued)
    }

    async fn run_row(&self, id: &str) -> Result<Option<RunRow>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                &format!(
                    "SELECT {} FROM npc_runs WHERE fleet = $1 AND id = $2",
                    *RUN_COLUMNS
                ),
                &[&self.fleet(), &id],
            )
            .await
            .map_err(pg_error("read a run"))?;
        row.as_ref().map(run_of).transpose()
    }

    /// The fleet's runs (of `trigger` only, when given), newest first (at
    /// most [`MAX_RUNS_PER_READ`]).
    pub async fn run_rows(
        &self,
        trigger: Option<&str>,
        limit: usize,
    ) -> Result<Vec<RunRow>, StoreError> {
        self.run_page(trigger, None, limit).await
    }

    /// [`run_rows`](Self::run_rows) queued before run `before` (none when
    /// the fleet has no such run).
    pub async fn run_page(
        &self,
        trigger: Option<&str>,
        before: Option<&str>,
        limit: usize,
    ) -> Result<Vec<RunRow>, StoreError> {
        let client = self.client().await?;
        let limit = i64::try_from(limit.min(MAX_RUNS_PER_READ)).unwrap_or(i64::MAX);
        let rows = client
            .query(&*RUN_PAGE_SQL, &[&self.fleet(), &limit, &trigger, &before])
            .await
            .map_err(pg_error("read runs"))?;
        rows.iter().map(run_of).collect()
    }

    /// Forget the fleet's finished runs past the newest `keep` (their
    /// dedupe keys still within `replay_until_ms` move to the replay
    /// table), expired replay keys, and per queue the replay keys past
    /// [`MAX_REPLAY_KEYS_PER_QUEUE`] that expire soonest; the rows pruned.
    pub async fn prune(&self, keep: usize) -> Result<u64, StoreError> {
        let failed = pg_error("prune old runs");
        let keep = i64::try_from(keep).unwrap_or(i64::MAX);
        let cap = i64::try_from(MAX_REPLAY_KEYS_PER_QUEUE).unwrap_or(i64::MAX);
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(&failed)?;
        // Below the newest `keep` rows of the fleet (none when no more).
        const PRUNED: &str = "FROM npc_runs WHERE fleet = $1
             AND state NOT IN ('queued', 'running') AND seq <= (SELECT seq FROM npc_runs
             WHERE fleet = $1 ORDER BY seq DESC OFFSET $2 LIMIT 1)";
        tx.execute(
            &format!(
                "INSERT INTO npc_webhook_replays (fleet, trigger, key, expires_at_ms)
                 SELECT fleet, trigger, dedupe_key, replay_until_ms {PRUNED}
                 AND dedupe_key IS NOT NULL AND replay_until_ms > npc_now_ms()
                 ON CONFLICT (fleet, trigger, key) DO UPDATE
                 SET expires_at_ms = GREATEST(npc_webhook_replays.expires_at_ms,
                                              EXCLUDED.expires_at_ms)"
            ),
            &[&self.fleet(), &keep],
        )
        .await
        .map_err(&failed)?;
        let mut gone = tx
            .execute(&format!("DELETE {PRUNED}"), &[&self.fleet(), &keep])
            .await
            .map_err(&failed)?;
        gone += tx
            .execute(
                "DELETE FROM npc_webhook_replays WHERE fleet = $1
                 AND expires_at_ms <= npc_now_ms()",
                &[&self.fleet()],
            )
            .await
            .map_err(&failed)?;
        gone += tx
            .execute(
                "DELETE FROM npc_webhook_replays r USING (
                     SELECT trigger, key, row_number() OVER (
                         PARTITION BY trigger ORDER BY expires_at_ms DESC) AS n
                     FROM npc_webhook_replays WHERE fleet = $1) crowded
                 WHERE r.fleet = $1 AND r.trigger = crowded.trigger
                   AND r.key = crowded.key AND crowded.n > $2",
                &[&self.fleet(), &cap],
            )
            .await
            .map_err(&failed)?;
        tx.commit().await.map_err(&failed)?;
        Ok(gone)
    }

    async fn events_since(&self, after: i64, limit: usize) -> Result<Vec<Event>, StoreError> {
        self.event_page(after, limit, None).await
    }

    /// The fleet's events with ids above `after` (of `component` only,
    /// when given), oldest first: every worker's and daemon's in one order,
    /// at most `limit` (and [`MAX_EVENTS_PER_READ`]). Appends hold a
    /// per-fleet lock to their commit, so ids are in commit order and a
    /// reader that goes on from the last id it saw misses none.
    pub async fn event_page(
        &self,
        after: i64,
        limit: usize,
        component: Option<&str>,
    ) -> Result<Vec<Event>, StoreError> {
        let client = self.client().await?;
        let limit = i64::try_from(limit.min(MAX_EVENTS_PER_READ)).unwrap_or(i64::MAX);
        let rows = client
            .query(
                &*EVENT_PAGE_SQL,
                &[&self.fleet(), &after, &limit, &component],
            )
            .await
            .map_err(pg_error("read events"))?;
        rows.iter().map(event_of).collect()
    }

    /// [`event_page`](Self::event_page) of the whole log; when it has
    /// nothing after `after` yet, wait up to `at_most` for an append
    /// (`LISTEN/NOTIFY`) and read again.
    pub async fn wait_for_events(
        &self,
        after: i64,
        limit: usize,
        at_most: Duration,
    ) -> Result<Vec<Event>, StoreError> {
        let page = self.event_page(after, limit, None).await?;
        if !page.is_empty() {
            return Ok(page);
        }
        self.wait_for_append(at_most).await;
        self.event_page(after, limit, None).await
    }

    /// The store's clock, unix milliseconds: what run times and heartbeat
    /// ages are measured by.
    pub async fn now_ms(&self) -> Result<i64, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_one("SELECT npc_now_ms()", &[])
            .await
            .map_err(pg_error("read the store's clock"))?;
        Ok(row.get(0))
    }
}

impl FleetQueue for PgStore {
    fn enqueue(&self, run: NewRun) -> StoreFuture<'_, Enqueued> {
        Box::pin(bounded("enqueue a run", self.enqueue_run(run)))
    }

    fn claim<'a>(&'a self, worker: &'a str, lease: Duration) -> StoreFuture<'a, Option<Claimed>> {
        Box::pin(bounded("claim a run", self.claim_run(worker, lease)))
    }

    fn heartbeat<'a>(&'a self, lease: &'a Lease, lease_for: Duration) -> StoreFuture<'a, Lease> {
        Box::pin(bounded("renew a lease", self.renew(lease, lease_for)))
    }

    fn finish<'a>(
        &'a self,
        lease: &'a Lease,
        end: &'static str,
        detail: Option<String>,
        result: Option<serde_json::Value>,
    ) -> StoreFuture<'a, ()> {
        Box::pin(bounded(
            "finish a run",
            self.finish_run(lease, end, detail, result),
        ))
    }

    fn finish_and_claim<'a>(
        &'a self,
        lease: &'a Lease,
        end: &'static str,
        detail: Option<String>,
        result: Option<serde_json::Value>,
        next: NextClaim<'a>,
    ) -> HandoverFuture<'a> {
        Box::pin(async move {
            let ended = bounded("finish a run", async {
                Ok(self.hand_over(lease, end, detail, result, next).await)
            });
            ended.await.unwrap_or_else(|unanswered| Handover {
                ended: Err(unanswered),
                next: Ok(None),
            })
        })
    }

    fn release<'a>(&'a self, lease: &'a Lease) -> StoreFuture<'a, ()> {
        Box::pin(bounded("hand a run back", self.release_run(lease)))
    }

    fn append_fenced<'a>(
        &'a self,
        lease: &'a Lease,
        events: Vec<NewEvent>,
    ) -> StoreFuture<'a, Vec<Event>> {
        Box::pin(bounded("append events", self.append(Some(lease), events)))
    }

    fn append_events(&self, events: Vec<NewEvent>) -> StoreFuture<'_, Vec<Event>> {
        Box::pin(bounded("append events", self.append(None, events)))
    }

    fn set_attempt<'a>(&'a self, lease: &'a Lease, attempt: u32) -> StoreFuture<'a, ()> {
        Box::pin(bounded(
            "record a run's attempt",
            self.attempting(lease, attempt),
        ))
    }

    fn rescue_expired(&self) -> StoreFuture<'_, Vec<Rescued>> {
        Box::pin(bounded("rescue expired leases", self.expired()))
    }

    fn stop_requests(&self) -> tokio::sync::broadcast::Receiver<String> {
        self.stops.subscribe()
    }

    fn run<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<RunRow>> {
        Box::pin(bounded("read a run", self.run_row(id)))
    }

    fn events_after(&self, after: i64, limit: usize) -> StoreFuture<'_, Vec<Event>> {
        Box::pin(bounded("read events", self.events_since(after, limit)))
    }

    fn wait_for_work(&self, at_most: Duration) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let _ = tokio::time::timeout(at_most, self.wake.notified()).await;
            Ok(())
        })
    }

    fn answers(&self) -> StoreFuture<'_, ()> {
        Box::pin(self.check())
    }

    fn share_approvals<'a>(
        &'a self,
        rows: &'a [crate::store::approvals::ApprovalRow],
    ) -> StoreFuture<'a, ()> {
        Box::pin(bounded("share approvals", self.share_approvals_of(rows)))
    }

    fn shared_answers<'a>(
        &'a self,
        run_id: &'a str,
    ) -> StoreFuture<'a, Vec<super::approvals::SharedAnswer>> {
        Box::pin(bounded("read approvals' answers", self.answers_of(run_id)))
    }
}
