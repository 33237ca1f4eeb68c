//! The fleet's run queue (`store::fleet::FleetQueue`), one suite run against
//! both backends — the embedded SQLite store and a real PostgreSQL
//! (`pg::PgCluster`) — so their guarantees are the same word for word:
//! exactly-once claims among concurrent workers, fencing of late writes,
//! rescue of expired leases, dedupe and queue bounds, events in order.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use npcagent::event::{Event, RunFinished, RunOutput};
use npcagent::store::fleet::{
    Claimed, FleetQueue, Handover, LEASE_EXPIRED_DETAIL, LEASE_LOST_DETAIL, NextClaim, Rescue,
    Rescued, SqliteQueue,
};
use npcagent::store::pg::PgStore;
use npcagent::store::queue::{Enqueued, NewRun, state};
use npcagent::store::{Store, StoreError};
use serde_json::json;

use crate::pg::{PG_PASSWORD, PgCluster, Shutdown};

/// Runs the claim race enqueues.
const RACE_RUNS: usize = 300;
/// Workers racing for them.
const RACE_WORKERS: usize = 8;
/// A lease long enough never to end during a test.
const LONG_LEASE: Duration = Duration::from_secs(600);
/// A lease that has ended by the time anything looks at it again.
const SHORT_LEASE: Duration = Duration::from_millis(1);
/// How long a test waits for a lease to run out.
const EXPIRY_TIMEOUT: Duration = Duration::from_secs(10);
/// Runs of a few keys enqueued while workers end the ones before them.
const KEYED_RACE_RUNS: usize = 120;
/// The keys they share.
const KEYED_RACE_KEYS: usize = 3;
/// How long the keyed race may take before a run counts as left behind.
const KEYED_RACE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long an idle worker of the keyed race waits for a wake-up.
const KEYED_RACE_IDLE: Duration = Duration::from_millis(50);

/// Run `id` of trigger `t`, of a concurrency key of its own (so the runs
/// of `t` may run at once, as a trigger's runs of different keys do).
pub(crate) fn run(id: &str) -> NewRun {
    NewRun {
        max_queued: 100_000,
        concurrency_key: Some(id.to_string()),
        ..NewRun::new(
            id,
            "t",
            npcagent::model::RunOrigin::Api,
            json!({ "n": id }).to_string(),
        )
    }
}

/// Run `id` rescued to `interrupted`.
fn interrupted(id: &str) -> Rescued {
    Rescued {
        run_id: id.to_string(),
        rescue: Rescue::Interrupted,
    }
}

/// A backend under test, and what keeps it alive.
struct Backend {
    queue: Arc<dyn FleetQueue>,
    _keep: Box<dyn std::any::Any + Send>,
}

fn sqlite() -> Backend {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(Store::default_path(dir.path())).unwrap();
    Backend {
        queue: Arc::new(SqliteQueue::new(Arc::new(store))),
        _keep: Box::new(dir),
    }
}

async fn postgres() -> Option<Backend> {
    let cluster = tokio::task::spawn_blocking(PgCluster::start)
        .await
        .unwrap()?;
    let url = cluster.database("fleet");
    npcagent::store::pg::migrate(&url).await.unwrap();
    let store = PgStore::connect(&url, "proj@git.example/repo")
        .await
        .unwrap();
    Some(Backend {
        queue: Arc::new(store),
        _keep: Box::new(cluster),
    })
}

/// Each case as a test per backend.
macro_rules! both_backends {
    ($($case:ident),* $(,)?) => {
        mod on_sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let backend = super::sqlite();
                    super::$case(backend.queue.clone()).await;
                }
            )*
        }
        mod on_postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let Some(backend) = super::postgres().await else { return };
                    super::$case(backend.queue.clone()).await;
                }
            )*
        }
    };
}

both_backends!(
    concurrent_workers_claim_each_run_exactly_once,
    a_late_write_under_an_old_token_is_refused,
    an_end_under_a_lapsed_lease_nobody_took_is_recorded_once,
    an_expired_lease_is_rescued_once_and_never_claimed_again,
    dedupe_keys_and_queue_bounds_hold,
    fenced_events_append_in_order_and_a_lost_lease_appends_none,
    a_lost_run_is_queued_again_while_its_attempts_allow_then_interrupted,
    a_trigger_runs_one_run_of_a_key_at_once_oldest_first_and_runs_by_hand_never_wait,
    replace_marks_the_running_run_cancels_the_queued_and_starts_once_it_ended,
    runs_of_a_key_enqueued_while_others_end_start_one_at_a_time_in_order_and_none_is_left,
    an_end_brings_the_next_run_claimed_after_it_even_one_of_its_own_key,
    a_run_waits_for_the_running_run_of_its_key_however_that_one_started,
    a_run_handed_back_is_claimed_again_in_its_place_and_its_old_lease_writes_nothing,
);

/// A worker told to stop hands back a run it claimed and did not start: the
/// run is queued again with its attempt, before the runs enqueued after it
/// (its key's next run still waits for it), and the old lease writes
/// nothing more.
async fn a_run_handed_back_is_claimed_again_in_its_place_and_its_old_lease_writes_nothing(
    queue: Arc<dyn FleetQueue>,
) {
    for (id, key) in [("a", Some("k")), ("b", Some("k")), ("c", None)] {
        queue.enqueue(keyed_run(id, "t", key)).await.unwrap();
    }
    let first = queue.claim("w1", LONG_LEASE).await.unwrap().unwrap();
    assert_eq!(first.run.id, "a");
    queue.release(&first.lease).await.unwrap();
    let row = queue.run("a").await.unwrap().unwrap();
    assert_eq!(
        (row.state.as_str(), row.attempt, row.owner.as_deref()),
        (state::QUEUED, first.run.attempt, None)
    );
    let again = queue.claim("w2", LONG_LEASE).await.unwrap().unwrap();
    assert_eq!(again.run.id, "a", "a handed-back run keeps its place");
    assert!(again.lease.token > first.lease.token);
    for late in [
        queue.release(&first.lease).await.err(),
        queue
            .finish(&first.lease, state::SUCCEEDED, None, None)
            .await
            .err(),
    ] {
        assert!(matches!(late, Some(StoreError::Fenced { .. })), "{late:?}");
    }
    assert_eq!(
        claim_id(&queue, "w3").await.as_deref(),
        Some("c"),
        "`b` waits for `a`, of its key, running again"
    );
    queue
        .finish(&again.lease, state::SUCCEEDED, None, None)
        .await
        .unwrap();
    assert_eq!(claim_id(&queue, "w3").await.as_deref(), Some("b"));
}

/// The race between an enqueue and the end of the run before it (of one
/// key): the new run must start once that run ended, whichever committed
/// first — never alongside it, never left waiting for a start that will
/// not come.
async fn runs_of_a_key_enqueued_while_others_end_start_one_at_a_time_in_order_and_none_is_left(
    queue: Arc<dyn FleetQueue>,
) {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let key_of = |i: usize| format!("k{}", i % KEYED_RACE_KEYS);
    let running: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let started: Arc<Mutex<HashMap<String, Vec<usize>>>> = Arc::default();
    let ended = Arc::new(AtomicUsize::new(0));
    let deadline = Instant::now() + KEYED_RACE_TIMEOUT;
    let mut workers = Vec::new();
    for w in 0..RACE_WORKERS {
        let (queue, running, started, ended) = (
            queue.clone(),
            running.clone(),
            started.clone(),
            ended.clone(),
        );
        workers.push(tokio::spawn(async move {
            let me = format!("worker-{w}");
            while ended.load(Ordering::SeqCst) < KEYED_RACE_RUNS {
                assert!(Instant::now() < deadline, "a run was left waiting");
                let Some(claimed) = queue.claim(&me, LONG_LEASE).await.unwrap() else {
                    queue.wait_for_work(KEYED_RACE_IDLE).await.unwrap();
                    continue;
                };
                let key = claimed.run.concurrency_key.clone().unwrap();
                let n: usize = claimed.run.id[1..].parse().unwrap();
                {
                    let mut running = running.lock().unwrap();
                    let now = running.entry(key.clone()).or_default();
                    *now += 1;
                    assert_eq!(*now, 1, "two runs of `{key}` at once");
                }
                started
                    .lock()
                    .unwrap()
                    .entry(key.clone())
                    .or_default()
                    .push(n);
                tokio::task::yield_now().await;
                *running.lock().unwrap().get_mut(&key).unwrap() -= 1;
                queue
                    .finish(&claimed.lease, state::SUCCEEDED, None, None)
                    .await
                    .unwrap();
                ended.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    for i in 0..KEYED_RACE_RUNS {
        let run = keyed_run(&format!("r{i}"), "q", Some(&key_of(i)));
        assert_eq!(queue.enqueue(run).await.unwrap(), Enqueued::Queued);
        tokio::task::yield_now().await;
    }
    for worker in workers {
        worker.await.unwrap();
    }
    let started = started.lock().unwrap();
    for k in 0..KEYED_RACE_KEYS {
        let key = key_of(k);
        let expected: Vec<usize> = (0..KEYED_RACE_RUNS).filter(|i| key_of(*i) == key).collect();
        assert_eq!(
            started[&key], expected,
            "`{key}` started once each, oldest first"
        );
    }
}

/// Run `id` of trigger `trigger` in the queue of key `key`.
fn keyed_run(id: &str, trigger: &str, key: Option<&str>) -> NewRun {
    NewRun {
        trigger: trigger.to_string(),
        concurrency_key: key.map(str::to_string),
        ..run(id)
    }
}

/// The id of the run `worker` claims next, if any, for a long lease.
async fn claim_id(queue: &Arc<dyn FleetQueue>, worker: &str) -> Option<String> {
    let claimed = queue.claim(worker, LONG_LEASE).await.unwrap()?;
    Some(claimed.run.id)
}

async fn a_lost_run_is_queued_again_while_its_attempts_allow_then_interrupted(
    queue: Arc<dyn FleetQueue>,
) {
    // `retries = 1`: two attempts.
    let retried = NewRun {
        attempts: 2,
        ..run("r")
    };
    queue.enqueue(retried).await.unwrap();
    let first = queue.claim("w1", SHORT_LEASE).await.unwrap().unwrap();
    assert_eq!((first.run.attempt, first.run.attempts), (1, 2));
    until_expired(&queue, &first.lease).await;
    let rescued = queue.rescue_expired().await.unwrap();
    assert_eq!(
        rescued,
        vec![Rescued {
            run_id: "r".into(),
            rescue: Rescue::Retried { attempt: 2, of: 2 }
        }]
    );
    assert!(queue.rescue_expired().await.unwrap().is_empty(), "once");
    let row = queue.run("r").await.unwrap().unwrap();
    assert_eq!((row.state.as_str(), row.attempt), (state::QUEUED, 2));
    assert_eq!((row.owner.as_ref(), row.detail.as_ref()), (None, None));
    // The lost worker's late end is refused; another worker takes attempt 2.
    let late = queue
        .finish(&first.lease, state::SUCCEEDED, None, None)
        .await;
    assert!(matches!(late, Err(StoreError::Fenced { .. })), "{late:?}");
    let second = queue.claim("w2", SHORT_LEASE).await.unwrap().unwrap();
    assert_eq!((second.run.id.as_str(), second.run.attempt), ("r", 2));
    assert!(second.lease.token > first.lease.token);
    until_expired(&queue, &second.lease).await;
    assert_eq!(
        queue.rescue_expired().await.unwrap(),
        vec![interrupted("r")]
    );
    let row = queue.run("r").await.unwrap().unwrap();
    assert_eq!(row.state, state::INTERRUPTED);
    assert_eq!(row.detail.as_deref(), Some(LEASE_EXPIRED_DETAIL));
    assert!(claim_id(&queue, "w3").await.is_none(), "attempts spent");

    // A worker's own retry counts: attempt 2 of 2 began on it, so its
    // lost lease leaves nothing to retry.
    queue
        .enqueue(NewRun {
            attempts: 2,
            ..run("s")
        })
        .await
        .unwrap();
    let claimed = queue.claim("w4", LONG_LEASE).await.unwrap().unwrap();
    queue.set_attempt(&claimed.lease, 2).await.unwrap();
    // Then its worker goes quiet.
    queue.heartbeat(&claimed.lease, SHORT_LEASE).await.unwrap();
    until_expired(&queue, &claimed.lease).await;
    assert_eq!(
        queue.rescue_expired().await.unwrap(),
        vec![interrupted("s")]
    );
    let late = queue.set_attempt(&claimed.lease, 3).await;
    assert!(matches!(late, Err(StoreError::Fenced { .. })), "{late:?}");
    assert!(LEASE_EXPIRED_DETAIL.starts_with(LEASE_LOST_DETAIL));
}

async fn a_trigger_runs_one_run_of_a_key_at_once_oldest_first_and_runs_by_hand_never_wait(
    queue: Arc<dyn FleetQueue>,
) {
    for (id, trigger, key) in [
        ("a1", "q", Some("k1")),
        ("a2", "q", Some("k1")),
        ("b1", "q", Some("k2")),
        ("n1", "q", None),
        ("n2", "q", None),
        ("m1", "@manual", None),
        ("m2", "@manual", None),
    ] {
        let enqueued = queue.enqueue(keyed_run(id, trigger, key)).await.unwrap();
        assert_eq!(enqueued, Enqueued::Queued);
    }
    let mut leases = HashMap::new();
    let mut claimed = Vec::new();
    while let Some(c) = queue.claim("w", LONG_LEASE).await.unwrap() {
        claimed.push(c.run.id.clone());
        leases.insert(c.run.id, c.lease);
    }
    // The head of each key's queue, and every run by hand.
    assert_eq!(claimed, ["a1", "b1", "n1", "m1", "m2"]);
    // Once a key's run ended, the next of that key (and only it) starts.
    queue
        .finish(&leases["a1"], state::SUCCEEDED, None, None)
        .await
        .unwrap();
    assert_eq!(claim_id(&queue, "w").await.as_deref(), Some("a2"));
    assert_eq!(claim_id(&queue, "w").await, None);
    queue
        .finish(&leases["n1"], state::FAILED, None, None)
        .await
        .unwrap();
    assert_eq!(claim_id(&queue, "w").await.as_deref(), Some("n2"));
}

/// A run enqueued while a run of its key runs waits for it, and so does one
/// queued alone when a run of its key is then enqueued as running (a run
/// in the foreground): the PostgreSQL claim takes a run enqueued with none
/// of its key active without looking at its key's runs, so both starts of
/// a run of its key must reach it.
async fn a_run_waits_for_the_running_run_of_its_key_however_that_one_started(
    queue: Arc<dyn FleetQueue>,
) {
    queue
        .enqueue(keyed_run("a1", "q", Some("k1")))
        .await
        .unwrap();
    let a1 = queue.claim("w", LONG_LEASE).await.unwrap().unwrap();
    assert_eq!(a1.run.id, "a1");
    queue
        .enqueue(keyed_run("a2", "q", Some("k1")))
        .await
        .unwrap();
    assert_eq!(claim_id(&queue, "w").await, None, "a2 waits for a1");
    queue
        .enqueue(keyed_run("b1", "q", Some("k2")))
        .await
        .unwrap();
    let foreground = NewRun {
        claimed_by: Some("here".to_string()),
        ..keyed_run("b0", "q", Some("k2"))
    };
    assert_eq!(queue.enqueue(foreground).await.unwrap(), Enqueued::Queued);
    assert_eq!(
        queue.run("b0").await.unwrap().map(|r| r.state),
        Some(state::RUNNING.to_string())
    );
    assert_eq!(claim_id(&queue, "w").await, None, "b1 waits for b0");
    queue
        .finish(&a1.lease, state::SUCCEEDED, None, None)
        .await
        .unwrap();
    assert_eq!(claim_id(&queue, "w").await.as_deref(), Some("a2"));
    assert_eq!(claim_id(&queue, "w").await, None, "b0 still runs");
}

/// Check that `handover`'s end was fenced and that it brought run `next`;
/// that run.
fn fenced_bringing(handover: Handover, next: &str) -> Claimed {
    assert!(
        matches!(handover.ended, Err(StoreError::Fenced { .. })),
        "{:?}",
        handover.ended
    );
    let claimed = handover.next.unwrap().expect("the next run is claimed");
    assert_eq!(claimed.run.id, next);
    claimed
}

/// `finish_and_claim`: the end is written first, then the next run is
/// claimed for the asking worker (a run of the ended run's key, which
/// could not start before, included); a fenced end (its token moved on)
/// still frees the slot, and an end under a lease whose time ran out but
/// whose run nobody took is written, alike on both backends; with nothing
/// queued the answer is the end alone.
async fn an_end_brings_the_next_run_claimed_after_it_even_one_of_its_own_key(
    queue: Arc<dyn FleetQueue>,
) {
    for id in ["a1", "a2", "b1"] {
        let key = &id[..1];
        queue.enqueue(keyed_run(id, "q", Some(key))).await.unwrap();
    }
    let asking = NextClaim {
        worker: "w",
        lease: LONG_LEASE,
    };
    let a1 = queue.claim("w", LONG_LEASE).await.unwrap().unwrap();
    assert_eq!(a1.run.id, "a1");
    let handover = queue
        .finish_and_claim(&a1.lease, state::SUCCEEDED, None, None, asking)
        .await;
    handover.ended.unwrap();
    let a2 = handover.next.unwrap().expect("a2 may start once a1 ended");
    assert_eq!((a2.run.id.as_str(), a2.lease.worker.as_str()), ("a2", "w"));
    assert_eq!(a2.run.state, state::RUNNING);
    let row = queue.run("a1").await.unwrap().unwrap();
    assert_eq!(row.state, state::SUCCEEDED);
    // Ending a1 again is fenced; the slot is free all the same.
    let again = queue
        .finish_and_claim(&a1.lease, state::FAILED, None, None, asking)
        .await;
    let b1 = fenced_bringing(again, "b1");
    assert_eq!(
        queue.run("a1").await.unwrap().unwrap().state,
        state::SUCCEEDED,
        "nothing written under the old lease"
    );
    // A lease whose time ran out, its run not taken by anyone: its end is
    // written, and brings the next run.
    for id in ["c1", "d1"] {
        queue.enqueue(run(id)).await.unwrap();
    }
    let c1 = queue.claim("w", SHORT_LEASE).await.unwrap().unwrap();
    assert_eq!(c1.run.id, "c1");
    until_expired(&queue, &c1.lease).await;
    let lapsed = queue
        .finish_and_claim(&c1.lease, state::SUCCEEDED, None, None, asking)
        .await;
    lapsed.ended.unwrap();
    let d1 = lapsed.next.unwrap().expect("d1 is claimed after c1's end");
    assert_eq!(d1.run.id, "d1");
    assert_eq!(
        queue.run("c1").await.unwrap().unwrap().state,
        state::SUCCEEDED
    );
    for held in [a2, b1, d1] {
        let last = queue
            .finish_and_claim(&held.lease, state::SUCCEEDED, None, None, asking)
            .await;
        last.ended.unwrap();
        assert!(last.next.unwrap().is_none(), "nothing is left to claim");
    }
}

/// The next stop request `stops` hears, within [`EXPIRY_TIMEOUT`].
async fn next_stop(stops: &mut tokio::sync::broadcast::Receiver<String>, after: &str) -> String {
    tokio::time::timeout(EXPIRY_TIMEOUT, stops.recv())
        .await
        .unwrap_or_else(|_| panic!("no stop request after {after}"))
        .unwrap()
}

async fn replace_marks_the_running_run_cancels_the_queued_and_starts_once_it_ended(
    queue: Arc<dyn FleetQueue>,
) {
    let replacing = |id: &str| NewRun {
        replace_active: true,
        ..keyed_run(id, "rep", Some("pr-1"))
    };
    let mut stops = queue.stop_requests();
    queue.enqueue(replacing("r1")).await.unwrap();
    let r1 = queue.claim("w1", LONG_LEASE).await.unwrap().unwrap();
    assert_eq!(
        (r1.run.id.as_str(), r1.lease.replaced_by.as_ref()),
        ("r1", None)
    );
    // Another key of the trigger is neither replaced nor held up.
    let other = NewRun {
        replace_active: true,
        ..keyed_run("o1", "rep", Some("pr-2"))
    };
    queue.enqueue(other).await.unwrap();
    assert_eq!(claim_id(&queue, "w2").await.as_deref(), Some("o1"));
    assert_eq!(claim_id(&queue, "w2").await, None, "r1 still runs");

    queue.enqueue(replacing("r2")).await.unwrap();
    assert_eq!(next_stop(&mut stops, "r2").await, "r1");
    let renewed = queue.heartbeat(&r1.lease, LONG_LEASE).await.unwrap();
    assert_eq!(renewed.replaced_by.as_deref(), Some("r2"));
    assert_eq!(claim_id(&queue, "w2").await, None, "r1 is still stopping");
    // A newer firing cancels the queued one and replaces r1 again.
    queue.enqueue(replacing("r3")).await.unwrap();
    assert_eq!(next_stop(&mut stops, "r3").await, "r1");
    let r2 = queue.run("r2").await.unwrap().unwrap();
    assert_eq!(r2.state, state::CANCELLED);
    assert_eq!(r2.detail.as_deref(), Some("replaced by run `r3`"));
    let events = queue.events_after(0, 1_000).await.unwrap();
    let said = events
        .iter()
        .find(|e| e.kind == "run.cancelled" && e.payload["run_id"] == "r2")
        .unwrap_or_else(|| panic!("{events:?}"));
    assert_eq!(said.component.as_deref(), Some("run.r2"));
    assert_eq!(said.payload["detail"], "replaced by run `r3`");
    let renewed = queue.heartbeat(&renewed, LONG_LEASE).await.unwrap();
    assert_eq!(renewed.replaced_by.as_deref(), Some("r3"));
    // r1's worker stopped it: the newest run starts.
    queue
        .finish(
            &renewed,
            state::CANCELLED,
            Some("replaced by run `r3`".into()),
            None,
        )
        .await
        .unwrap();
    assert_eq!(claim_id(&queue, "w2").await.as_deref(), Some("r3"));

    // A replaced run whose worker is gone ends cancelled, never retried.
    queue
        .enqueue(NewRun {
            attempts: 3,
            ..replacing_on("lost", "rep-lost")
        })
        .await
        .unwrap();
    let lost = queue.claim("gone", SHORT_LEASE).await.unwrap().unwrap();
    assert_eq!(lost.run.id, "lost");
    queue
        .enqueue(replacing_on("newer", "rep-lost"))
        .await
        .unwrap();
    until_expired(&queue, &lost.lease).await;
    assert_eq!(
        queue.rescue_expired().await.unwrap(),
        vec![Rescued {
            run_id: "lost".into(),
            rescue: Rescue::Replaced { by: "newer".into() }
        }]
    );
    let row = queue.run("lost").await.unwrap().unwrap();
    assert_eq!(
        (row.state.as_str(), row.detail.as_deref()),
        (state::CANCELLED, Some("replaced by run `newer`"))
    );
    assert_eq!(claim_id(&queue, "w3").await.as_deref(), Some("newer"));
}

/// Run `id` of trigger `trigger` (no key) with overlap `replace`.
fn replacing_on(id: &str, trigger: &str) -> NewRun {
    NewRun {
        replace_active: true,
        ..keyed_run(id, trigger, None)
    }
}

async fn concurrent_workers_claim_each_run_exactly_once(queue: Arc<dyn FleetQueue>) {
    for i in 0..RACE_RUNS {
        assert_eq!(
            queue.enqueue(run(&format!("r{i:04}"))).await.unwrap(),
            Enqueued::Queued
        );
    }
    let mut workers = Vec::new();
    for w in 0..RACE_WORKERS {
        let queue = queue.clone();
        workers.push(tokio::spawn(async move {
            let me = format!("worker-{w}");
            let mut mine = Vec::new();
            while let Some(claimed) = queue.claim(&me, LONG_LEASE).await.unwrap() {
                assert_eq!(claimed.run.state, state::RUNNING);
                assert_eq!(claimed.run.owner.as_deref(), Some(me.as_str()));
                queue
                    .finish(&claimed.lease, state::SUCCEEDED, None, None)
                    .await
                    .unwrap();
                mine.push(claimed.run.id);
            }
            mine
        }));
    }
    let mut seen: HashMap<String, usize> = HashMap::new();
    for worker in workers {
        for id in worker.await.unwrap() {
            *seen.entry(id).or_default() += 1;
        }
    }
    assert_eq!(seen.len(), RACE_RUNS, "every run claimed");
    assert!(seen.values().all(|&n| n == 1), "no run claimed twice");
    let last = queue.run("r0000").await.unwrap().unwrap();
    assert_eq!(last.state, state::SUCCEEDED);
}

/// Wait until `lease` is refused by a heartbeat (its lease ran out).
async fn until_expired(queue: &Arc<dyn FleetQueue>, lease: &npcagent::store::fleet::Lease) {
    let deadline = Instant::now() + EXPIRY_TIMEOUT;
    loop {
        match queue.heartbeat(lease, SHORT_LEASE).await {
            Err(StoreError::Fenced { .. }) => return,
            Ok(_) => {}
            Err(e) => panic!("heartbeat failed: {e}"),
        }
        assert!(Instant::now() < deadline, "the lease never ran out");
        tokio::task::yield_now().await;
    }
}

async fn a_late_write_under_an_old_token_is_refused(queue: Arc<dyn FleetQueue>) {
    queue.enqueue(run("a")).await.unwrap();
    let first = queue.claim("w1", SHORT_LEASE).await.unwrap().unwrap();
    // Expired: the run may not go on under it (a renewal is refused).
    until_expired(&queue, &first.lease).await;
    let rescued = queue.rescue_expired().await.unwrap();
    assert_eq!(rescued, vec![interrupted("a")]);
    let row = queue.run("a").await.unwrap().unwrap();
    assert_eq!(row.state, state::INTERRUPTED);
    assert_eq!(row.detail.as_deref(), Some(LEASE_EXPIRED_DETAIL));
    // Rescued, its token moved on: every later write under the old lease
    // is refused.
    let late = queue
        .finish(&first.lease, state::SUCCEEDED, None, None)
        .await;
    assert!(
        matches!(late, Err(StoreError::Fenced { ref run, token }) if run == "a" && token == first.lease.token),
        "{late:?}"
    );
    let event = || vec![Event::RunFinished(RunFinished::default()).for_component("run.a")];
    for late in [
        queue.heartbeat(&first.lease, LONG_LEASE).await.err(),
        queue
            .finish(&first.lease, state::FAILED, Some("late".into()), None)
            .await
            .err(),
        queue.append_fenced(&first.lease, event()).await.err(),
        queue.set_attempt(&first.lease, 2).await.err(),
        queue.release(&first.lease).await.err(),
    ] {
        assert!(matches!(late, Some(StoreError::Fenced { .. })), "{late:?}");
    }
    let message = StoreError::Fenced {
        run: "a".into(),
        token: first.lease.token,
    }
    .to_string();
    assert!(message.contains("stop carrying it out"), "{message}");
    assert_eq!(
        queue.run("a").await.unwrap().unwrap().state,
        state::INTERRUPTED
    );
}

/// A run whose lease's time passed while its worker could not write (the
/// store was down) and that nobody took meanwhile: its worker's end is
/// written once, under the same token, with its events; its attempts are
/// not bumped; a rescue finds nothing, and a second end is refused.
async fn an_end_under_a_lapsed_lease_nobody_took_is_recorded_once(queue: Arc<dyn FleetQueue>) {
    queue.enqueue(run("late")).await.unwrap();
    let held = queue.claim("w1", SHORT_LEASE).await.unwrap().unwrap();
    until_expired(&queue, &held.lease).await;
    let finished = Event::RunFinished(RunFinished::default()).for_component("run.late");
    queue
        .append_fenced(&held.lease, vec![finished])
        .await
        .unwrap();
    let result = json!({ "branch": "npc/late" });
    queue
        .finish(&held.lease, state::SUCCEEDED, None, Some(result.clone()))
        .await
        .unwrap();
    assert!(
        queue.rescue_expired().await.unwrap().is_empty(),
        "nothing to rescue"
    );
    let row = queue.run("late").await.unwrap().unwrap();
    assert_eq!(
        (row.state.as_str(), row.attempt, row.result),
        (state::SUCCEEDED, 1, Some(result))
    );
    let again = queue.finish(&held.lease, state::FAILED, None, None).await;
    assert!(matches!(again, Err(StoreError::Fenced { .. })), "{again:?}");
    assert!(queue.claim("w2", LONG_LEASE).await.unwrap().is_none());
    let events = queue.events_after(0, 1_000).await.unwrap();
    let ends = events.iter().filter(|e| e.kind == "run.finished").count();
    assert_eq!(ends, 1, "{events:?}");
    assert_eq!(
        queue.run("late").await.unwrap().unwrap().state,
        state::SUCCEEDED
    );
}

async fn an_expired_lease_is_rescued_once_and_never_claimed_again(queue: Arc<dyn FleetQueue>) {
    queue.enqueue(run("lost")).await.unwrap();
    queue.enqueue(run("kept")).await.unwrap();
    let lost = queue.claim("gone", SHORT_LEASE).await.unwrap().unwrap();
    let kept = queue.claim("alive", LONG_LEASE).await.unwrap().unwrap();
    assert_eq!(
        (lost.run.id.as_str(), kept.run.id.as_str()),
        ("lost", "kept")
    );
    until_expired(&queue, &lost.lease).await;
    assert_eq!(
        queue.rescue_expired().await.unwrap(),
        vec![interrupted("lost")]
    );
    assert!(
        queue.rescue_expired().await.unwrap().is_empty(),
        "rescued once"
    );
    assert!(
        queue.claim("other", LONG_LEASE).await.unwrap().is_none(),
        "never claimed again"
    );
    // The live lease is untouched and renews.
    let renewed = queue.heartbeat(&kept.lease, LONG_LEASE).await.unwrap();
    assert_eq!(renewed.token, kept.lease.token);
    // Its end carries what the run handed back, for the fleet's listing.
    let result = json!({ "branch": "npc/kept", "commit": "0123abcd" });
    queue
        .finish(&renewed, state::SUCCEEDED, None, Some(result.clone()))
        .await
        .unwrap();
    let row = queue.run("kept").await.unwrap().unwrap();
    assert_eq!(
        (row.state.as_str(), row.result),
        (state::SUCCEEDED, Some(result))
    );
}

async fn dedupe_keys_and_queue_bounds_hold(queue: Arc<dyn FleetQueue>) {
    let keyed = |id: &str| NewRun {
        dedupe_key: Some("delivery-1".into()),
        ..run(id)
    };
    assert_eq!(queue.enqueue(keyed("k1")).await.unwrap(), Enqueued::Queued);
    assert_eq!(
        queue.enqueue(keyed("k2")).await.unwrap(),
        Enqueued::Duplicate
    );
    let bounded = |id: &str| NewRun {
        trigger: "small".into(),
        max_queued: 2,
        ..run(id)
    };
    for id in ["b1", "b2"] {
        assert_eq!(queue.enqueue(bounded(id)).await.unwrap(), Enqueued::Queued);
    }
    assert_eq!(queue.enqueue(bounded("b3")).await.unwrap(), Enqueued::Full);
    let skipping = |id: &str| NewRun {
        trigger: "skip".into(),
        skip_if_active: true,
        concurrency_key: None,
        ..run(id)
    };
    assert_eq!(
        queue.enqueue(skipping("s1")).await.unwrap(),
        Enqueued::Queued
    );
    assert_eq!(
        queue.enqueue(skipping("s2")).await.unwrap(),
        Enqueued::Skipped
    );
    assert_eq!(
        queue.run("s2").await.unwrap().unwrap().state,
        state::SKIPPED
    );
    assert!(queue.run("b3").await.unwrap().is_none());
    assert!(queue.run("k2").await.unwrap().is_none());
}

/// Run `e`'s output line `n`.
fn output_event(n: i64) -> Event {
    Event::RunOutput(RunOutput {
        run_id: "e".to_string(),
        stream: "stdout".to_string(),
        line: n.to_string(),
    })
}

async fn fenced_events_append_in_order_and_a_lost_lease_appends_none(queue: Arc<dyn FleetQueue>) {
    queue.enqueue(run("e")).await.unwrap();
    let claimed = queue.claim("w", LONG_LEASE).await.unwrap().unwrap();
    let before = queue.events_after(0, 1_000).await.unwrap().len();
    let events = (0..5)
        .map(|n| output_event(n).for_component("run.e"))
        .collect();
    let stored = queue.append_fenced(&claimed.lease, events).await.unwrap();
    assert!(stored.windows(2).all(|w| w[0].id < w[1].id));
    let all = queue.events_after(0, 1_000).await.unwrap();
    assert_eq!(all.len(), before + 5);
    let ns: Vec<i64> = all[before..]
        .iter()
        .map(|e| e.payload["line"].as_str().unwrap().parse().unwrap())
        .collect();
    assert_eq!(ns, vec![0, 1, 2, 3, 4]);
    queue
        .finish(&claimed.lease, state::SUCCEEDED, None, None)
        .await
        .unwrap();
    let late = queue
        .append_fenced(&claimed.lease, vec![output_event(5).for_component("run.e")])
        .await;
    assert!(matches!(late, Err(StoreError::Fenced { .. })), "{late:?}");
    assert_eq!(
        queue.events_after(0, 1_000).await.unwrap().len(),
        before + 5
    );
}

/// Finished runs in the history of the claim-plan test.
const HISTORY_RUNS: i64 = 20_000;
/// Runs queued after them: enough that statistics count many.
const HISTORY_QUEUED: i64 = 2_000;
/// Runs queued in a young fleet, before any statistics.
const YOUNG_QUEUED: i64 = 500;
/// Of those, the runs running when one of them ends.
const YOUNG_RUNNING: i64 = 16;
/// Buffers a claim may touch (walking the history by the primary key
/// touched one per finished run).
const CLAIM_BUFFERS_AT_MOST: u64 = 200;

/// The nodes of an `EXPLAIN (FORMAT JSON)` plan, depth first.
fn plan_nodes(node: &serde_json::Value, into: &mut Vec<serde_json::Value>) {
    into.push(node.clone());
    for child in node["Plans"].as_array().into_iter().flatten() {
        plan_nodes(child, into);
    }
}

/// A fresh database of `cluster` named `name`, migrated, with a client.
async fn plan_database(cluster: &PgCluster, name: &str) -> tokio_postgres::Client {
    let url = cluster.database(name);
    npcagent::store::pg::migrate(&url).await.unwrap();
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

/// Runs `from..=to` of fleet `f`, trigger `t`, each of a key of its own,
/// in `state`, each looking at its key's runs when claimed (`behind`, as
/// every run queued before a store's migration to schema 8 is).
async fn insert_runs(client: &tokio_postgres::Client, state: &str, from: i64, to: i64) {
    client
        .execute(
            "INSERT INTO npc_runs (fleet, id, trigger, origin, payload, state,
             enqueued_at_ms, concurrency_key, behind)
             SELECT 'f', 'r' || g, 't', 'api', '{}', $1, 0, 'k' || g, true
             FROM generate_series($2::bigint, $3::bigint) g",
            &[&state, &from, &to],
        )
        .await
        .unwrap();
}

/// The plan of `statement` (its parameters' types `types`) executed with
/// `arguments`, as `EXPLAIN (ANALYZE, BUFFERS)` gives it under
/// `plan_cache_mode` `mode` (rolled back: nothing changes).
async fn plan_of(
    client: &tokio_postgres::Client,
    mode: &str,
    (statement, types, arguments): (&str, &str, &str),
) -> serde_json::Value {
    client
        .batch_execute(&format!(
            "SET plan_cache_mode = {mode}; DEALLOCATE ALL;
             PREPARE s({types}) AS {statement}; BEGIN"
        ))
        .await
        .unwrap();
    let answer = client
        .simple_query(&format!(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE s({arguments})"
        ))
        .await
        .unwrap();
    client.batch_execute("ROLLBACK").await.unwrap();
    let text = answer
        .iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0),
            _ => None,
        })
        .unwrap();
    serde_json::from_str(text).unwrap()
}

/// The claim's plan in fleet `f` (see [`plan_of`]).
async fn claim_plan(client: &tokio_postgres::Client, mode: &str) -> serde_json::Value {
    let claim = npcagent::store::pg::claim_statement();
    let claim = (
        claim,
        "text, text, bigint, text",
        "'f', 'w', 600000, '@manual'",
    );
    plan_of(client, mode, claim).await
}

/// The indexes a claim may read to choose a run: its order, a key's queued
/// and running runs, and every running run (read once per claim when the
/// planner hashes the look for a running run of a key: as many rows as the
/// fleet runs at once).
const CLAIM_INDEXES: [&str; 4] = [
    "npc_runs_claim_order",
    "npc_runs_queued_of_queue",
    "npc_runs_running_of_queue",
    "npc_runs_by_lease",
];

/// Check a claim's plan under `what`: it scans the claim's order, reads
/// only the claim's indexes, at most [`CLAIM_BUFFERS_AT_MOST`] buffers,
/// and claims a run.
fn assert_claim_plan(plan: &serde_json::Value, what: &str) {
    let top = &plan[0]["Plan"];
    let mut nodes = Vec::new();
    plan_nodes(top, &mut nodes);
    let scans: Vec<_> = nodes
        .iter()
        .filter(|n| n["Alias"] == "q")
        .map(|n| n["Index Name"].as_str().unwrap_or("none").to_string())
        .collect();
    assert_eq!(scans, ["npc_runs_claim_order"], "{what}: {plan:#}");
    for node in &nodes {
        let Some(index) = node["Index Name"].as_str() else {
            continue;
        };
        if node["Alias"] == "r" {
            // The claimed run, updated by its key.
            assert_eq!(index, "npc_runs_pkey", "{what}: {plan:#}");
        } else {
            assert!(CLAIM_INDEXES.contains(&index), "{what}: {index}: {plan:#}");
        }
    }
    let buffers =
        top["Shared Hit Blocks"].as_u64().unwrap() + top["Shared Read Blocks"].as_u64().unwrap();
    assert!(
        buffers <= CLAIM_BUFFERS_AT_MOST,
        "{what}: {buffers} buffers: {plan:#}"
    );
    assert_eq!(top["Actual Rows"], 1, "{what}: {plan:#}");
}

/// Once `ANALYZE` counted many queued runs behind a long history, the
/// planner took `ORDER BY seq LIMIT 1` for a short walk of the primary key
/// and walked the whole history per claim; before a fleet's first
/// `ANALYZE`, it took the unique index of dedupe keys (then led by the
/// fleet and the trigger) to look for a run of the candidate's key ahead
/// of it, and read every run of the trigger per candidate. The claim keeps
/// to its own indexes, with custom and generic plans alike, with and
/// without statistics, and so does a run's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_reads_the_queue_not_the_history_whatever_the_statistics() {
    let Some(cluster) = tokio::task::spawn_blocking(PgCluster::start).await.unwrap() else {
        return;
    };
    let modes = ["force_custom_plan", "force_generic_plan"];
    // A young fleet: its first runs queued, no statistics yet.
    let young = plan_database(&cluster, "young").await;
    insert_runs(&young, "queued", 1, YOUNG_QUEUED).await;
    for mode in modes {
        assert_claim_plan(&claim_plan(&young, mode).await, &format!("young, {mode}"));
    }
    // A run's end finds its run among the leased runs by its id, not among
    // every running run or every run of the fleet, and looks for a waiting
    // run of its key in the queued runs of that key alone.
    young
        .batch_execute(&format!(
            "UPDATE npc_runs SET state = 'running', lease_token = 1,
             lease_expires_at_ms = npc_now_ms() + 600000
             WHERE id IN (SELECT 'r' || g FROM generate_series(1, {YOUNG_RUNNING}) g)"
        ))
        .await
        .unwrap();
    let finish = (
        npcagent::store::pg::finish_statement(),
        "text, text, bigint, text, text, text, text",
        "'f', 'r7', 1, 'succeeded', NULL, 'wake', NULL",
    );
    for mode in modes {
        let plan = plan_of(&young, mode, finish).await;
        let mut nodes = Vec::new();
        plan_nodes(&plan[0]["Plan"], &mut nodes);
        let looks: Vec<_> = nodes
            .iter()
            .filter(|n| n["Alias"] == "w")
            .map(|n| n["Index Name"].as_str().unwrap_or("none").to_string())
            .collect();
        assert_eq!(
            looks,
            ["npc_runs_queued_of_queue"],
            "young, {mode}: {plan:#}"
        );
        let found: Vec<_> = nodes
            .iter()
            .filter(|n| n["Alias"] == "npc_runs" && n["Node Type"] != "ModifyTable")
            .map(|n| n["Index Name"].as_str().unwrap_or("none").to_string())
            .collect();
        assert_eq!(found, ["npc_runs_leased"], "young, {mode}: {plan:#}");
        assert_eq!(plan[0]["Plan"]["Actual Rows"], 1, "young, {mode}: {plan:#}");
    }
    // A long history, then a queue, without and with statistics.
    let old = plan_database(&cluster, "old").await;
    insert_runs(&old, "succeeded", 1, HISTORY_RUNS).await;
    insert_runs(
        &old,
        "queued",
        HISTORY_RUNS + 1,
        HISTORY_RUNS + HISTORY_QUEUED,
    )
    .await;
    for statistics in ["none", "analyzed"] {
        if statistics == "analyzed" {
            old.batch_execute("ANALYZE npc_runs").await.unwrap();
        }
        for mode in modes {
            let what = format!("history, statistics {statistics}, {mode}");
            assert_claim_plan(&claim_plan(&old, mode).await, &what);
        }
    }
}

/// How long a notification may take to reach a listener.
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(20);

/// The payloads of the notifications `url`'s server sends on `channel`
/// from now on, as they arrive.
async fn notifications_on(
    url: &str,
    channel: &str,
) -> (
    tokio_postgres::Client,
    tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    use futures_util::StreamExt;
    let (client, mut connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let (heard, hear) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let tokio_postgres::AsyncMessage::Notification(n) = message {
                let _ = heard.send(n.payload().to_string());
            }
        }
    });
    client
        .batch_execute(&format!("LISTEN {channel}"))
        .await
        .unwrap();
    (client, hear)
}

/// A run's end wakes the fleet's waiting workers when a run of its key
/// waits for it, and only then: the end of a run with none waiting sends
/// nothing (the first notification after it is one sent by hand).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_end_wakes_the_workers_when_a_run_of_its_key_waits_and_only_then() {
    let Some(cluster) = tokio::task::spawn_blocking(PgCluster::start).await.unwrap() else {
        return;
    };
    let url = cluster.database("wakes");
    npcagent::store::pg::migrate(&url).await.unwrap();
    let fleet = "proj@git.example/repo";
    let queue = PgStore::connect(&url, fleet).await.unwrap();
    for (id, key) in [("a1", "k1"), ("a2", "k1"), ("b1", "k2")] {
        queue.enqueue(keyed_run(id, "q", Some(key))).await.unwrap();
    }
    let mut leases = HashMap::new();
    while let Some(c) = queue.claim("w", LONG_LEASE).await.unwrap() {
        leases.insert(c.run.id, c.lease);
    }
    assert_eq!(leases.len(), 2, "a1 and b1 run, a2 waits");
    let (listener, mut heard) = notifications_on(&url, npcagent::store::pg::WAKE_CHANNEL).await;
    queue
        .finish(&leases["b1"], state::SUCCEEDED, None, None)
        .await
        .unwrap();
    listener
        .batch_execute(&format!(
            "NOTIFY {}, 'by hand'",
            npcagent::store::pg::WAKE_CHANNEL
        ))
        .await
        .unwrap();
    let first = tokio::time::timeout(NOTIFY_TIMEOUT, heard.recv()).await;
    assert_eq!(first.unwrap().as_deref(), Some("by hand"), "b1's end woke");
    queue
        .finish(&leases["a1"], state::SUCCEEDED, None, None)
        .await
        .unwrap();
    let woken = tokio::time::timeout(NOTIFY_TIMEOUT, heard.recv()).await;
    assert_eq!(woken.unwrap().as_deref(), Some(fleet), "a1's end woke none");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_of_another_version_is_refused_with_the_migrate_hint() {
    let Some(cluster) = tokio::task::spawn_blocking(PgCluster::start).await.unwrap() else {
        return;
    };
    let url = cluster.database("fresh");
    let err = PgStore::connect(&url, "f").await.unwrap_err();
    assert!(
        matches!(err, StoreError::PgSchemaTooOld { found: 0, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("`npc store migrate`"), "{err}");
    let (from, to) = npcagent::store::pg::migrate(&url).await.unwrap();
    assert_eq!((from, to), (0, npcagent::store::pg::PG_SCHEMA_VERSION));
    // Migrating again is a no-op.
    let again = npcagent::store::pg::migrate(&url).await.unwrap();
    assert_eq!(again, (to, to));
    PgStore::connect(&url, "f").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_store_or_a_wrong_password_is_a_clear_error_without_the_password() {
    let Some(cluster) = tokio::task::spawn_blocking(PgCluster::start).await.unwrap() else {
        return;
    };
    let url = cluster.database("fleet");
    let wrong = url.replace(PG_PASSWORD, "not-the-password-77");
    let err = PgStore::connect(&wrong, "f").await.unwrap_err().to_string();
    assert!(err.contains("password authentication failed"), "{err}");
    assert!(!err.contains("not-the-password-77"), "{err}");
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let unreachable = format!("postgres://npc:{PG_PASSWORD}@127.0.0.1:{port}/fleet");
    let err = PgStore::connect(&unreachable, "f")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("cannot connect"), "{err}");
    assert!(!err.contains(PG_PASSWORD), "{err}");
    let err = PgStore::connect("mysql://root:hunter2@h/db", "f")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("`postgres://"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");
}

// ----- `npc worker` processes against a real PostgreSQL ------------------

/// The project name the fleet tests' manifests declare.
pub(crate) const FLEET_PROJECT: &str = "fleet-test";
/// The remote their repositories name (never fetched).
const FLEET_REMOTE: &str = "https://git.example.invalid/fleet.git";
/// Runs the drain test enqueues.
const DRAIN_RUNS: usize = 1_000;
/// Workers that drain them.
const DRAIN_WORKERS: usize = 4;
/// How long the drain may take on a loaded machine.
const DRAIN_LIMIT: Duration = Duration::from_secs(240);
/// The lease of the fault tests' workers, in seconds.
pub(crate) const FAULT_LEASE_SECS: &str = "2";
/// The lease of workers whose test is not about leases: it outlives any
/// stall of a loaded machine (and the restart test's restart).
pub(crate) const STEADY_LEASE_SECS: &str = "30";

/// A repository whose trigger `t` runs `script` (in `sh -c`).
pub(crate) fn fleet_repo(script: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let manifest = format!(
        "version = 1\n[project]\nname = \"{FLEET_PROJECT}\"\n[store]\nurl = \"${{NPC_STORE_URL}}\"\n\
         [runs]\nmax_concurrent = 4\n[triggers.t]\nkind = \"cron\"\nschedule = \"24h\"\n\
         action = {{ command = \"sh\", args = [\"-c\", {script:?}] }}\n"
    );
    std::fs::write(dir.path().join("npcagent.toml"), manifest).unwrap();
    make_checkout(dir.path());
    dir
}

/// Make `dir` a git checkout whose `origin` is the fleet's remote.
pub(crate) fn make_checkout(dir: &std::path::Path) {
    for args in [
        vec!["init", "-q"],
        vec!["remote", "add", "origin", FLEET_REMOTE],
    ] {
        let ok = std::process::Command::new("git")
            .args(&args)
            .current_dir(dir)
            .status()
            .unwrap()
            .success();
        assert!(ok, "git {args:?}");
    }
}

pub(crate) fn fleet_key() -> String {
    format!("{FLEET_PROJECT}@{FLEET_REMOTE}")
}

/// `npc worker` in `repo` against `url`, its stderr in `log`.
fn start_worker(repo: &std::path::Path, url: &str, log: &std::path::Path) -> std::process::Child {
    start_worker_leased(repo, url, log, FAULT_LEASE_SECS)
}

/// [`start_worker`] with a lease of `lease_secs`.
pub(crate) fn start_worker_leased(
    repo: &std::path::Path,
    url: &str,
    log: &std::path::Path,
    lease_secs: &str,
) -> std::process::Child {
    std::process::Command::new(crate::support::npc_path())
        .args(["worker", "--lease-secs", lease_secs])
        .current_dir(repo)
        .env("NPC_STORE_URL", url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap()
}

/// `n` workers in `repo` against `url` with the [`STEADY_LEASE_SECS`]
/// lease, their logs in `logs`; stopped when dropped.
fn steady_workers(
    repo: &std::path::Path,
    url: &str,
    logs: &std::path::Path,
    n: usize,
) -> Vec<crate::support::Stopped> {
    (0..n)
        .map(|w| {
            let log = logs.join(format!("worker-{w}.log"));
            crate::support::Stopped::new(start_worker_leased(repo, url, &log, STEADY_LEASE_SECS))
        })
        .collect()
}

/// Every worker log in `dir`, for a failure's message.
pub(crate) fn worker_logs(dir: &std::path::Path) -> String {
    let mut all = String::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        all.push_str(&format!("== {}\n{text}\n", entry.path().display()));
    }
    all
}

fn lines(path: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// A migrated store for the worker tests (through `npc store migrate`).
pub(crate) fn worker_store(cluster: &PgCluster, repo: &std::path::Path) -> String {
    let url = cluster.database("fleet");
    let out = crate::support::npc()
        .args(["store", "migrate"])
        .current_dir(repo)
        .env("NPC_STORE_URL", &url)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains(&format!(
            "migrated from schema version 0 to {}",
            npcagent::store::pg::PG_SCHEMA_VERSION
        )),
        "{said}"
    );
    assert!(!said.contains(PG_PASSWORD));
    url
}

fn enqueue_runs(rt: &tokio::runtime::Runtime, store: &PgStore, n: usize) {
    rt.block_on(async {
        for i in 0..n {
            let run = NewRun {
                max_queued: usize::MAX,
                ..run(&format!("run-{i:05}"))
            };
            assert_eq!(store.enqueue(run).await.unwrap(), Enqueued::Queued);
        }
    });
}

/// A throwaway cluster with a migrated store, a repository whose runs are
/// `script`, and `runs` runs queued there: what each worker test starts
/// from. `None` (the test skips) without PostgreSQL.
pub(crate) struct QueuedFleet {
    /// Dropping it stops the server: a test keeps its `QueuedFleet` bound
    /// to the end.
    pub(crate) cluster: PgCluster,
    pub(crate) repo: tempfile::TempDir,
    pub(crate) url: String,
    pub(crate) rt: tokio::runtime::Runtime,
    pub(crate) store: PgStore,
    pub(crate) logs: tempfile::TempDir,
}

pub(crate) fn queued_fleet(script: &str, runs: usize) -> Option<QueuedFleet> {
    let cluster = PgCluster::start()?;
    let repo = fleet_repo(script);
    let url = worker_store(&cluster, repo.path());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = rt.block_on(PgStore::connect(&url, &fleet_key())).unwrap();
    enqueue_runs(&rt, &store, runs);
    Some(QueuedFleet {
        cluster,
        repo,
        url,
        rt,
        store,
        logs: tempfile::tempdir().unwrap(),
    })
}

#[test]
fn a_thousand_queued_runs_drained_by_four_workers_each_run_exactly_once() {
    let Some(fleet) = queued_fleet("echo \"$NPC_RUN_ID\" >> ran.log", DRAIN_RUNS) else {
        return;
    };
    let QueuedFleet {
        repo,
        url,
        rt,
        store,
        logs,
        ..
    } = &fleet;
    let _workers = steady_workers(repo.path(), url, logs.path(), DRAIN_WORKERS);
    let rows = crate::support::wait_for_within("every run to end", DRAIN_LIMIT, || {
        let rows = rt.block_on(store.run_rows(None, DRAIN_RUNS)).unwrap();
        rows.iter()
            .all(|r| r.state != state::QUEUED && r.state != state::RUNNING)
            .then_some(rows)
    });
    assert_eq!(rows.len(), DRAIN_RUNS);
    let failed: Vec<_> = rows
        .iter()
        .filter(|r| r.state != state::SUCCEEDED)
        .collect();
    assert!(
        failed.is_empty(),
        "{failed:?}\n{}",
        worker_logs(logs.path())
    );
    let ran = lines(&repo.path().join("ran.log"));
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for id in &ran {
        *counts.entry(id.as_str()).or_default() += 1;
    }
    assert_eq!(counts.len(), DRAIN_RUNS, "every run executed");
    assert!(counts.values().all(|&n| n == 1), "none executed twice");
    let owners: std::collections::HashSet<_> =
        rows.iter().filter_map(|r| r.owner.clone()).collect();
    assert!(
        owners.len() > 1,
        "the runs were shared: {owners:?}\n{}",
        worker_logs(logs.path())
    );
    // Each run's events reached the shared log.
    let events = rt.block_on(store.events_after(0, 100_000)).unwrap();
    let finished = events.iter().filter(|e| e.kind == "run.finished").count();
    assert_eq!(finished, DRAIN_RUNS);
}

#[test]
fn a_worker_killed_mid_run_loses_the_run_to_interrupted_and_it_never_runs_again() {
    let Some(fleet) = queued_fleet("echo \"$NPC_RUN_ID\" >> ran.log; exec sleep 600", 1) else {
        return;
    };
    let QueuedFleet {
        repo,
        url,
        rt,
        store,
        logs,
        ..
    } = &fleet;
    let mut doomed = start_worker(repo.path(), url, &logs.path().join("a.log"));
    crate::support::wait_for("the run to start", || {
        (!lines(&repo.path().join("ran.log")).is_empty()).then_some(())
    });
    doomed.kill().unwrap();
    doomed.wait().unwrap();
    let _rescuer =
        crate::support::Stopped::new(start_worker(repo.path(), url, &logs.path().join("b.log")));
    let row = crate::support::wait_for("the run to be rescued", || {
        let row = rt.block_on(store.run("run-00000")).unwrap().unwrap();
        (row.state != state::RUNNING).then_some(row)
    });
    assert_eq!(row.state, state::INTERRUPTED);
    assert_eq!(row.detail.as_deref(), Some(LEASE_EXPIRED_DETAIL));
    let events = rt.block_on(store.events_after(0, 10_000)).unwrap();
    assert!(
        events.iter().any(|e| e.kind == "run.interrupted"),
        "{events:?}"
    );
    assert_eq!(
        lines(&repo.path().join("ran.log")).len(),
        1,
        "never run again"
    );
}

#[test]
fn a_worker_paused_past_its_lease_is_fenced_and_stops_its_agent() {
    let Some(fleet) = queued_fleet(
        "sh -c 'read -r p _ </proc/self/stat; echo \"$p\" > agent.pid; exec sleep 600' & wait",
        1,
    ) else {
        return;
    };
    let QueuedFleet {
        repo,
        url,
        rt,
        store,
        logs,
        ..
    } = &fleet;
    let log = logs.path().join("paused.log");
    let worker = crate::support::Stopped::new(start_worker(repo.path(), url, &log));
    let agent: u32 = crate::support::wait_for("the agent to start", || {
        std::fs::read_to_string(repo.path().join("agent.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    });
    let pid = nix::unistd::Pid::from_raw(worker.pid() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    // Nobody else rescues: the test does, once the lease ran out.
    let rescued = crate::support::wait_for("the lease to run out", || {
        let ids = rt.block_on(store.rescue_expired()).unwrap();
        (!ids.is_empty()).then_some(ids)
    });
    assert_eq!(rescued, vec![interrupted("run-00000")]);
    assert!(
        crate::support::alive(agent),
        "the agent still runs while its worker is paused"
    );
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    crate::support::wait_for("the fenced worker to stop its agent", || {
        (!crate::support::alive(agent)).then_some(())
    });
    let said = crate::support::wait_for("the worker to say why", || {
        let said = std::fs::read_to_string(&log).unwrap_or_default();
        said.contains("lease was lost").then_some(said)
    });
    assert!(!said.contains(PG_PASSWORD), "{said}");
    // Its late writes were refused: the row stays as the rescue left it.
    let row = rt.block_on(store.run("run-00000")).unwrap().unwrap();
    assert_eq!(row.state, state::INTERRUPTED);
    assert_eq!(row.detail.as_deref(), Some(LEASE_EXPIRED_DETAIL));
    let events = rt.block_on(store.events_after(0, 10_000)).unwrap();
    assert!(
        !events.iter().any(|e| e.kind == "run.finished"),
        "no end relayed after the rescue: {events:?}"
    );
}

#[test]
fn a_worker_that_claims_again_a_run_it_held_before_carries_its_next_attempt() {
    // The first attempt sleeps until stopped; the next ends at once. The
    // sleep writes its pid as the host sees it (`$!` is the run's PID
    // namespace's number): its shell reads `/proc/self/stat`, then is it.
    let script = "echo \"$NPC_RUN_ID\" >> ran.log; \
                  if [ ! -s first.pid ]; then \
                  sh -c 'read -r p _ </proc/self/stat; echo \"$p\" > first.pid; exec sleep 600' & wait; fi";
    let Some(fleet) = queued_fleet(script, 0) else {
        return;
    };
    let QueuedFleet {
        repo,
        url,
        rt,
        store,
        logs,
        ..
    } = &fleet;
    let again = NewRun {
        attempts: 2,
        max_queued: usize::MAX,
        ..run("run-again")
    };
    assert_eq!(rt.block_on(store.enqueue(again)).unwrap(), Enqueued::Queued);
    let log = logs.path().join("worker.log");
    // One worker: the run's next attempt can only be its own.
    let worker = crate::support::Stopped::new(start_worker(repo.path(), url, &log));
    let first: u32 = crate::support::wait_for("the first attempt to start", || {
        let row = rt.block_on(store.run("run-again")).unwrap().unwrap();
        assert!(
            matches!(row.state.as_str(), "queued" | "running"),
            "{row:?}\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::fs::read_to_string(repo.path().join("first.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    });
    let pid = nix::unistd::Pid::from_raw(worker.pid() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let rescued = crate::support::wait_for("the lease to run out", || {
        let ids = rt.block_on(store.rescue_expired()).unwrap();
        (!ids.is_empty()).then_some(ids)
    });
    assert_eq!(
        rescued[0].rescue,
        npcagent::store::fleet::Rescue::Retried { attempt: 2, of: 2 }
    );
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    let row = crate::support::wait_for("the next attempt to end", || {
        rt.block_on(store.run("run-again"))
            .unwrap()
            .filter(|r| r.attempt == 2 && !matches!(r.state.as_str(), "queued" | "running"))
    });
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(row.state, state::SUCCEEDED, "{row:?}\n{said}");
    assert!(!said.contains("UNIQUE"), "{said}");
    assert!(
        !crate::support::alive(first),
        "the first attempt was stopped"
    );
    let ran = std::fs::read_to_string(repo.path().join("ran.log")).unwrap();
    assert_eq!(ran.lines().collect::<Vec<_>>(), ["run-again", "run-again"]);
    // The shared log has the next attempt's start once after its retry:
    // the first attempt's events (relayed or not before the pause) were
    // not relayed again with the next's.
    let events = rt.block_on(store.events_after(0, 10_000)).unwrap();
    let retry = events.iter().position(|e| e.kind == "run.retry");
    let retry = retry.unwrap_or_else(|| panic!("{events:?}"));
    let started = |events: &[npcagent::store::Event]| {
        events.iter().filter(|e| e.kind == "run.started").count()
    };
    assert_eq!(started(&events[retry..]), 1, "{events:?}");
    assert!(started(&events[..retry]) <= 1, "{events:?}");
}

#[test]
fn a_worker_without_a_reachable_store_says_so_without_the_password() {
    let repo = fleet_repo("true");
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let url = format!("postgres://npc:{PG_PASSWORD}@127.0.0.1:{port}/fleet");
    let out = crate::support::npc()
        .args(["worker"])
        .current_dir(repo.path())
        .env("NPC_STORE_URL", &url)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("cannot join the fleet"), "{said}");
    assert!(said.contains("cannot connect"), "{said}");
    assert!(!said.contains(PG_PASSWORD), "{said}");
    let out = crate::support::npc()
        .args(["store", "migrate"])
        .current_dir(repo.path())
        .env("NPC_STORE_URL", &url)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(!String::from_utf8_lossy(&out.stderr).contains(PG_PASSWORD));
}

/// Runs the restart test enqueues.
const RESTART_RUNS: usize = 200;
/// Runs that end before the server restarts.
const RESTART_AFTER: usize = 50;

/// Two workers drain the fleet's queue while the server restarts in `mode`
/// (a fast shutdown rolls back the open transactions; an immediate one
/// quits as a crash does, answers lost mid-flight, and the next start
/// recovers from the write-ahead log): no run is executed twice, every run ends, and only a claim
/// whose answer the restart cut off may end `interrupted`, unexecuted.
fn restarted_mid_drain_loses_and_doubles_nothing(mode: Shutdown) {
    // Commits written out before they are answered: a store that forgets
    // a claim it answered (`synchronous_commit=off` and a crash) would
    // have the run claimed and executed again, whatever the workers do.
    let Some(mut cluster) = PgCluster::start_durable() else {
        return;
    };
    let repo = fleet_repo("echo \"$NPC_RUN_ID\" >> ran.log");
    let url = worker_store(&cluster, repo.path());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let ended = |rt: &tokio::runtime::Runtime| -> Option<Vec<npcagent::store::queue::RunRow>> {
        // A fresh view each time: the check itself survives the restart.
        let store = rt.block_on(PgStore::connect(&url, &fleet_key())).ok()?;
        let rows = rt.block_on(store.run_rows(None, RESTART_RUNS)).ok()?;
        Some(rows)
    };
    {
        let store = rt.block_on(PgStore::connect(&url, &fleet_key())).unwrap();
        enqueue_runs(&rt, &store, RESTART_RUNS);
    }
    let logs = tempfile::tempdir().unwrap();
    let _workers = steady_workers(repo.path(), &url, logs.path(), 2);
    crate::support::wait_for("some runs to end", || {
        let rows = ended(&rt)?;
        let done = rows.iter().filter(|r| r.state == state::SUCCEEDED).count();
        (done >= RESTART_AFTER).then_some(())
    });
    cluster.restart_in(mode);
    let rows = crate::support::wait_for_within("every run to end", DRAIN_LIMIT, || {
        let rows = ended(&rt)?;
        rows.iter()
            .all(|r| r.state != state::QUEUED && r.state != state::RUNNING)
            .then_some(rows)
    });
    assert_eq!(rows.len(), RESTART_RUNS);
    let ran = lines(&repo.path().join("ran.log"));
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for id in &ran {
        *counts.entry(id.as_str()).or_default() += 1;
    }
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "none executed twice: {twice:?}\n{:?}\n{}",
        rows.iter()
            .filter(|r| twice.iter().any(|(id, _)| **id == r.id))
            .collect::<Vec<_>>(),
        worker_logs(logs.path())
    );
    // A claim whose answer the restart cut off is the only run that may
    // not succeed: its lease runs out and it ends interrupted, unexecuted.
    for row in &rows {
        match row.state.as_str() {
            state::SUCCEEDED => {
                assert_eq!(counts.get(row.id.as_str()), Some(&1), "{row:?} ran once")
            }
            state::INTERRUPTED => {
                assert_eq!(row.detail.as_deref(), Some(LEASE_EXPIRED_DETAIL), "{row:?}")
            }
            _ => panic!("unexpected end: {row:?}"),
        }
    }
    let lost = rows.iter().filter(|r| r.state != state::SUCCEEDED).count();
    assert!(lost <= 2, "at most one cut-off claim per worker: {lost}");
}

#[test]
fn a_server_restarted_mid_drain_loses_and_doubles_nothing() {
    restarted_mid_drain_loses_and_doubles_nothing(Shutdown::Fast);
}

#[test]
fn a_server_restarted_in_immediate_mode_mid_drain_loses_and_doubles_nothing() {
    restarted_mid_drain_loses_and_doubles_nothing(Shutdown::Immediate);
}

// ----- a daemon in front of the fleet ------------------------------------

/// The webhook secret of the ingress tests.
const INGRESS_SECRET: &str = "ingress-s3cret";

/// A repository whose daemon takes webhooks (`gh`, route `github`) into
/// the fleet; its runs append their id to `ran.log`.
fn ingress_repo() -> tempfile::TempDir {
    let dir = fleet_repo("true");
    let manifest = format!(
        "version = 1\n[project]\nname = \"{FLEET_PROJECT}\"\n[store]\nurl = \"${{NPC_STORE_URL}}\"\n\
         [daemon]\nwebhook_listen = \"127.0.0.1:0\"\n\
         [triggers.gh]\nkind = \"webhook\"\nroute = \"github\"\nsecret_env = \"HOOK_SECRET\"\n\
         action = {{ command = \"sh\", args = [\"-c\", \"echo \\\"$NPC_RUN_ID\\\" >> ran.log\"] }}\n"
    );
    std::fs::write(dir.path().join("npcagent.toml"), manifest).unwrap();
    dir
}

/// A daemon on `repo` whose store URL is `url`.
pub(crate) fn ingress_daemon(repo: &std::path::Path, url: &str) -> crate::support::Daemon {
    crate::support::Daemon::start_in_with(
        repo,
        crate::support::DaemonSetup {
            only_env: Some(&[("HOOK_SECRET", INGRESS_SECRET), ("NPC_STORE_URL", url)]),
            ..crate::support::DaemonSetup::default()
        },
    )
}

/// `npc ARGS` in `repo`, whose manifest's store URL is `url`; it must succeed.
pub(crate) fn npc_in(repo: &std::path::Path, url: &str, args: &[&str]) -> std::process::Output {
    crate::support::npc()
        .args(args)
        .current_dir(repo)
        .env("NPC_STORE_URL", url)
        .output()
        .unwrap()
}

/// `npc ARGS --format json` in `repo`, as [`npc_in`].
pub(crate) fn npc_json(repo: &std::path::Path, url: &str, args: &[&str]) -> serde_json::Value {
    let args: Vec<&str> = args.iter().copied().chain(["--format", "json"]).collect();
    crate::triggers::json_of(&npc_in(repo, url, &args))
}

/// The human output of `npc COMMAND` in `repo`, as [`npc_in`].
fn npc_human(repo: &std::path::Path, url: &str, command: &str) -> String {
    let out = npc_in(repo, url, &[command]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Post one signed push delivery `id` to the daemon's `gh` webhook.
fn deliver(repo: &std::path::Path, url: &str, id: &str) -> (u16, String) {
    let url = crate::support::wait_for("the webhook listener's address", || {
        npc_json(repo, url, &["triggers"])["triggers"]
            .as_array()?
            .iter()
            .find(|t| t["name"] == "gh")?["url"]
            .as_str()
            .map(str::to_string)
    });
    let body = format!("{{\"delivery\":\"{id}\"}}");
    crate::triggers::http(
        &url,
        "POST",
        "/webhooks/github",
        &[
            ("Content-Type", "application/json".to_string()),
            ("X-GitHub-Event", "push".to_string()),
            ("X-GitHub-Delivery", id.to_string()),
            (
                "X-Hub-Signature-256",
                crate::triggers::sign(INGRESS_SECRET.as_bytes(), body.as_bytes()),
            ),
        ],
        body.as_bytes(),
    )
}

#[test]
fn a_daemon_with_a_store_url_answers_202_after_the_shared_commit_and_a_worker_runs_it() {
    let Some(cluster) = PgCluster::start() else {
        return;
    };
    let repo = ingress_repo();
    let url = worker_store(&cluster, repo.path());
    let daemon = ingress_daemon(repo.path(), &url);
    let status = crate::support::wait_for("the daemon to join the fleet", || {
        let status = npc_json(repo.path(), &url, &["status"]);
        (status["store"]["state"] == "connected").then_some(status)
    });
    assert_eq!(status["store"]["kind"], "postgres", "{status}");
    assert_eq!(status["store"]["fleet"], fleet_key().as_str(), "{status}");
    assert!(!status.to_string().contains(PG_PASSWORD), "{status}");
    let human = npc_human(repo.path(), &url, "status");
    assert!(human.contains("store PostgreSQL"), "{human}");
    assert!(human.contains("connected"), "{human}");

    let (code, text) = deliver(repo.path(), &url, "d-1");
    assert_eq!(code, 202, "{text}\n{}", daemon.log());
    let accepted: serde_json::Value = serde_json::from_str(&text).unwrap();
    let id = accepted["run_id"].as_str().unwrap().to_string();
    // Committed in the shared store before the answer: read after it.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = rt.block_on(PgStore::connect(&url, &fleet_key())).unwrap();
    let row = rt
        .block_on(store.run(&id))
        .unwrap()
        .expect("the shared row");
    assert_eq!(row.state, state::QUEUED);
    assert_eq!(
        row.origin.known(),
        Some(npcagent::model::RunOrigin::Webhook)
    );
    // The same delivery again is a replay the shared store refuses.
    let (code, text) = deliver(repo.path(), &url, "d-1");
    assert_eq!(code, 409, "{text}");
    // The daemon did not take the run itself.
    let local = npc_json(repo.path(), &url, &["runs"]);
    assert!(
        local
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["id"] != id.as_str()),
        "the ingress daemon queued the run locally: {local}"
    );

    let logs = tempfile::tempdir().unwrap();
    let _worker = crate::support::Stopped::new(start_worker_leased(
        repo.path(),
        &url,
        &logs.path().join("worker.log"),
        STEADY_LEASE_SECS,
    ));
    let row = crate::support::wait_for("the worker to carry the run out", || {
        rt.block_on(store.run(&id))
            .unwrap()
            .filter(|r| r.state == state::SUCCEEDED)
    });
    assert!(row.owner.as_ref().is_some_and(|o| o.contains('/')));
    assert_eq!(lines(&repo.path().join("ran.log")), vec![id.clone()]);
    // `npc runs --fleet` reads the shared store: the run, its end, its worker.
    let fleet_runs = npc_json(repo.path(), &url, &["runs", "--fleet", "--trigger", "gh"]);
    let listed = fleet_runs
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == id.as_str())
        .unwrap_or_else(|| panic!("{fleet_runs}"));
    assert_eq!(listed["state"], "succeeded");
    assert_eq!(listed["owner"].as_str(), row.owner.as_deref());
    let none = npc_json(
        repo.path(),
        &url,
        &["runs", "--fleet", "--trigger", "other"],
    );
    assert_eq!(none, json!([]));
    let events = rt.block_on(store.events_after(0, 1_000)).unwrap();
    let queued = events
        .iter()
        .position(|e| e.kind == "run.queued" && e.payload["run_id"] == id.as_str());
    let finished = events
        .iter()
        .position(|e| e.kind == "run.finished" && e.payload["run_id"] == id.as_str());
    assert!(
        matches!((queued, finished), (Some(q), Some(f)) if q < f),
        "{events:?}"
    );
}

#[test]
fn a_webhook_during_a_store_outage_answers_503_store_unreachable() {
    let Some(cluster) = PgCluster::start() else {
        return;
    };
    let repo = ingress_repo();
    let url = worker_store(&cluster, repo.path());
    let daemon = ingress_daemon(repo.path(), &url);
    crate::support::wait_for("the daemon to join the fleet", || {
        let status = npc_json(repo.path(), &url, &["status"]);
        (status["store"]["state"] == "connected").then_some(())
    });
    let (code, text) = deliver(repo.path(), &url, "d-before");
    assert_eq!(code, 202, "{text}\n{}", daemon.log());
    // The store goes away after the daemon joined it.
    drop(cluster);
    let (code, text) = deliver(repo.path(), &url, "d-during");
    assert_eq!(code, 503, "{text}\n{}", daemon.log());
    assert!(text.contains("webhook.store_unreachable"), "{text}");
    assert!(!text.contains(PG_PASSWORD), "{text}");
}

/// After joining, the daemon keeps asking: a store that stops answering,
/// or answers at another schema version (migrated by a newer npc while
/// this daemon could not see it), is said in `npc status` and refuses the
/// fleet's runs (503); once it answers at this build's schema again, runs
/// go to it again. One event per change.
#[test]
fn a_store_that_stops_answering_or_changes_schema_is_said_and_refused_until_it_answers_right() {
    let Some(mut cluster) = PgCluster::start() else {
        return;
    };
    let repo = ingress_repo();
    let url = worker_store(&cluster, repo.path());
    let daemon = ingress_daemon(repo.path(), &url);
    let state = |want: &str| {
        crate::support::wait_for(&format!("npc status to say `{want}`"), || {
            let status = npc_json(repo.path(), &url, &["status"]);
            (status["store"]["state"] == want).then_some(status)
        })
    };
    state("connected");
    let (code, text) = deliver(repo.path(), &url, "s-before");
    assert_eq!(code, 202, "{text}\n{}", daemon.log());
    // The server goes away after the daemon joined it.
    cluster.stop();
    let status = state("unreachable");
    assert!(!status.to_string().contains(PG_PASSWORD), "{status}");
    let (code, text) = deliver(repo.path(), &url, "s-down");
    assert_eq!(code, 503, "{text}");
    cluster.start_again();
    state("connected");
    let (code, text) = deliver(repo.path(), &url, "s-back");
    assert_eq!(code, 202, "{text}\n{}", daemon.log());
    // A newer npc migrated the store meanwhile: refused, and said why.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        client
            .execute(
                "INSERT INTO npc_schema_migrations (version, applied_at_ms) \
                 SELECT MAX(version) + 1, 0 FROM npc_schema_migrations",
                &[],
            )
            .await
            .unwrap();
    });
    let status = state("unreachable");
    let error = status["store"]["error"].as_str().unwrap_or_default();
    assert!(error.contains("schema"), "{status}");
    let (code, text) = deliver(repo.path(), &url, "s-newer");
    assert_eq!(code, 503, "{text}");
    let kinds: Vec<String> = daemon
        .events()
        .iter()
        .filter_map(|e| e["kind"].as_str().map(str::to_string))
        .filter(|k| k.starts_with("store."))
        .collect();
    assert_eq!(
        kinds,
        [
            "store.connected",
            "store.unreachable",
            "store.connected",
            "store.unreachable"
        ],
        "one event per change"
    );
}

#[test]
fn a_daemon_whose_store_is_unreachable_stays_up_says_so_and_refuses_webhooks() {
    let repo = ingress_repo();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let url = format!("postgres://npc:{PG_PASSWORD}@127.0.0.1:{port}/fleet");
    let daemon = ingress_daemon(repo.path(), &url);
    let status = crate::support::wait_for("the daemon to say the store is unreachable", || {
        let status = npc_json(repo.path(), &url, &["status"]);
        status["store"]["error"].is_string().then_some(status)
    });
    assert_eq!(status["store"]["state"], "unreachable", "{status}");
    let error = status["store"]["error"].as_str().unwrap();
    assert!(error.contains("cannot connect"), "{error}");
    assert!(!status.to_string().contains(PG_PASSWORD), "{status}");
    let human = npc_human(repo.path(), &url, "status");
    assert!(human.contains("unreachable"), "{human}");
    assert!(!human.contains(PG_PASSWORD), "{human}");
    let (code, text) = deliver(repo.path(), &url, "d-1");
    assert_eq!(code, 503, "{text}");
    assert!(
        text.contains(npcagent::triggers::webhook::STORE_UNREACHABLE_ANSWER),
        "{text}"
    );
    assert!(
        !text.contains("127.0.0.1"),
        "the store's address reached the sender: {text}"
    );
    assert!(!text.contains(PG_PASSWORD), "{text}");
    assert_eq!(npc_json(repo.path(), &url, &["runs"]), json!([]));
    assert!(!daemon.log().contains(PG_PASSWORD));
}

/// The roster as `npc workers --format json` in `repo` gives it.
/// A manifest whose daemon takes both listening addresses from the
/// environment, as several daemons of one host do.
const LISTEN_FROM_ENV: &str = "version = 1\n[daemon]\nlisten = \"${NPC_TEST_LISTEN}\"\n\
     webhook_listen = \"${NPC_TEST_HOOKS}\"\n[triggers.gh]\nkind = \"webhook\"\n\
     route = \"github\"\nsecret_env = \"HOOK_SECRET\"\naction = { command = \"true\" }\n";

#[test]
fn listen_addresses_take_their_value_from_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("npcagent.toml"), LISTEN_FROM_ENV).unwrap();
    // A non-loopback address from the environment is refused without
    // being quoted.
    let out = crate::support::npc()
        .arg("validate")
        .current_dir(dir.path())
        .env("NPC_TEST_LISTEN", "10.1.2.3:8766")
        .env("NPC_TEST_HOOKS", "127.0.0.1:0")
        .env("HOOK_SECRET", INGRESS_SECRET)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("not a loopback address"), "{said}");
    assert!(!said.contains("10.1.2.3"), "{said}");

    let (api, hooks) = (crate::support::free_port(), crate::support::free_port());
    let (api_addr, hooks_addr) = (format!("127.0.0.1:{api}"), format!("127.0.0.1:{hooks}"));
    let daemon = crate::support::Daemon::start_in_with(
        dir.path(),
        crate::support::DaemonSetup {
            only_env: Some(&[
                ("NPC_TEST_LISTEN", &api_addr),
                ("NPC_TEST_HOOKS", &hooks_addr),
                ("HOOK_SECRET", INGRESS_SECRET),
            ]),
            ..crate::support::DaemonSetup::default()
        },
    );
    let listening = daemon.wait_event(0, "api.listening");
    assert_eq!(
        listening["payload"]["url"],
        format!("http://{api_addr}").as_str(),
        "{listening}"
    );
    let url = crate::support::wait_for("the webhook listener's address", || {
        let out = crate::support::npc()
            .args(["triggers", "--format", "json"])
            .current_dir(dir.path())
            .env("NPC_TEST_LISTEN", &api_addr)
            .env("NPC_TEST_HOOKS", &hooks_addr)
            .env("HOOK_SECRET", INGRESS_SECRET)
            .output()
            .unwrap();
        crate::triggers::json_of(&out)["triggers"]
            .as_array()?
            .iter()
            .find(|t| t["name"] == "gh")?["url"]
            .as_str()
            .map(str::to_string)
    });
    assert!(url.contains(&hooks_addr), "{url}");
}

fn roster(repo: &std::path::Path, url: &str) -> Vec<serde_json::Value> {
    npc_json(repo, url, &["workers"])["workers"]
        .as_array()
        .unwrap()
        .clone()
}

#[test]
fn npc_workers_shows_each_worker_and_its_runs_and_a_killed_one_as_lost() {
    let Some(fleet) = queued_fleet("sleep 60", 1) else {
        return;
    };
    let QueuedFleet {
        repo, url, logs, ..
    } = &fleet;
    let first = crate::support::Stopped::new(start_worker(
        repo.path(),
        url,
        &logs.path().join("first.log"),
    ));
    let busy = crate::support::wait_for("the first worker to hold the run", || {
        roster(repo.path(), url)
            .into_iter()
            .find(|w| w["state"] == "alive" && w["running"] == json!(["run-00000"]))
    });
    assert_eq!(busy["version"], env!("CARGO_PKG_VERSION"));
    assert!(busy["host"].as_str().is_some_and(|h| !h.is_empty()));
    assert!(busy["heartbeat_age_ms"].as_i64().is_some_and(|a| a >= 0));
    let human = npc_human(repo.path(), url, "workers");
    assert!(human.contains(&format!("fleet {}", fleet_key())), "{human}");
    assert!(human.contains("alive"), "{human}");
    assert!(human.contains("running run-00000"), "{human}");
    assert!(!human.contains(PG_PASSWORD), "{human}");

    let second = crate::support::Stopped::new(start_worker(
        repo.path(),
        url,
        &logs.path().join("second.log"),
    ));
    first.kill();
    let first_id = busy["id"].as_str().unwrap().to_string();
    let workers = crate::support::wait_for("the killed worker to be shown lost", || {
        let workers = roster(repo.path(), url);
        let lost = workers
            .iter()
            .any(|w| w["id"] == first_id.as_str() && w["state"] == "lost");
        let alive = workers
            .iter()
            .any(|w| w["id"] != first_id.as_str() && w["state"] == "alive");
        (lost && alive).then_some(workers)
    });
    assert_eq!(workers.len(), 2, "{workers:?}");
    let human = npc_human(repo.path(), url, "workers");
    assert!(human.contains("LOST"), "{human}");

    assert!(second.terminate().success());
    crate::support::wait_for("the stopped worker to be shown stopped", || {
        roster(repo.path(), url)
            .iter()
            .any(|w| w["id"] != first_id.as_str() && w["state"] == "stopped")
            .then_some(())
    });
}

// ----- the triggers' policies across the fleet ---------------------------

/// What a policy test's first run does: it records its id (and `overlap`
/// if the run before it still runs), then, the first time only, sleeps
/// until stopped; later runs end at once.
/// Pids are the host's (`/proc/self/stat`): each run has a PID namespace of
/// its own, where `$$` is another number.
const FIRST_SLEEPS: &str = "if [ -s first.pid ] && [ -d \"/proc/$(cat first.pid)\" ]; \
     then echo overlap >> ran.log; fi; echo \"$NPC_RUN_ID\" >> ran.log; \
     if [ ! -s first.pid ]; then read -r p _ </proc/self/stat; echo \"$p\" > first.pid; \
     exec sleep 600; fi";

/// A fleet repository whose triggers (`[triggers.NAME]` bodies after the
/// kind, schedule and action, which run [`FIRST_SLEEPS`]) are `triggers`,
/// with a lease of [`FAULT_LEASE_SECS`].
fn policy_repo(triggers: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = fleet_repo("true");
    let mut manifest = format!(
        "version = 1\n[project]\nname = \"{FLEET_PROJECT}\"\n\
         [store]\nurl = \"${{NPC_STORE_URL}}\"\nlease_timeout = \"{FAULT_LEASE_SECS}s\"\n"
    );
    for (name, policy) in triggers {
        manifest.push_str(&format!(
            "[triggers.{name}]\nkind = \"cron\"\nschedule = \"24h\"\n{policy}\n\
             action = {{ command = \"sh\", args = [\"-c\", {FIRST_SLEEPS:?}] }}\n"
        ));
    }
    std::fs::write(dir.path().join("npcagent.toml"), manifest).unwrap();
    dir
}

/// A daemon on `repo` in front of the fleet at `url`, once it joined.
fn joined_daemon(repo: &std::path::Path, url: &str) -> crate::support::Daemon {
    let daemon = ingress_daemon(repo, url);
    crate::support::wait_for("the daemon to join the fleet", || {
        let status = npc_json(repo, url, &["status"]);
        (status["store"]["state"] == "connected").then_some(())
    });
    daemon
}

/// Fire trigger `name` through the daemon of `repo`; the new run's id.
fn fire_in_fleet(repo: &std::path::Path, url: &str, name: &str) -> String {
    let answer = npc_json(repo, url, &["trigger", "fire", name]);
    assert_eq!(answer["outcome"], "queued", "{answer}");
    answer["run_id"].as_str().unwrap().to_string()
}

/// The shared store's events of run `id`, oldest first.
fn run_events(
    rt: &tokio::runtime::Runtime,
    store: &PgStore,
    id: &str,
) -> Vec<npcagent::store::Event> {
    rt.block_on(store.events_after(0, 100_000))
        .unwrap()
        .into_iter()
        .filter(|e| e.component.as_deref() == Some(&format!("run.{id}")))
        .collect()
}

#[test]
fn a_killed_workers_run_is_retried_once_by_another_worker_as_its_trigger_allows() {
    let Some(cluster) = PgCluster::start() else {
        return;
    };
    let repo = policy_repo(&[("t", "retries = 1")]);
    let url = worker_store(&cluster, repo.path());
    let _daemon = joined_daemon(repo.path(), &url);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = rt.block_on(PgStore::connect(&url, &fleet_key())).unwrap();
    let id = fire_in_fleet(repo.path(), &url, "t");
    // The ingress wrote the trigger's attempts with the row.
    let row = rt.block_on(store.run(&id)).unwrap().unwrap();
    assert_eq!((row.attempt, row.attempts), (1, 2));
    let logs = tempfile::tempdir().unwrap();
    let mut doomed = start_worker(repo.path(), &url, &logs.path().join("doomed.log"));
    crate::support::wait_for("the first attempt to start", || {
        let relayed = run_events(&rt, &store, &id)
            .iter()
            .any(|e| e.kind == "run.started");
        (relayed && !lines(&repo.path().join("ran.log")).is_empty()).then_some(())
    });
    doomed.kill().unwrap();
    doomed.wait().unwrap();
    let _rescuer = crate::support::Stopped::new(start_worker(
        repo.path(),
        &url,
        &logs.path().join("rescuer.log"),
    ));
    let row = crate::support::wait_for("the retry to end", || {
        rt.block_on(store.run(&id))
            .unwrap()
            .filter(|r| r.state != state::RUNNING && r.state != state::QUEUED)
    });
    assert_eq!(row.state, state::SUCCEEDED, "{}", worker_logs(logs.path()));
    assert_eq!(row.attempt, 2);
    // Run exactly twice in all, the retry only once the first was gone.
    assert_eq!(
        lines(&repo.path().join("ran.log")),
        vec![id.clone(), id.clone()]
    );
    let kinds: Vec<String> = run_events(&rt, &store, &id)
        .iter()
        .map(|e| e.kind.clone())
        .filter(|k| k.starts_with("run."))
        .collect();
    let interrupted = kinds.iter().position(|k| k == "run.interrupted");
    let retry = kinds.iter().position(|k| k == "run.retry");
    let finished = kinds.iter().position(|k| k == "run.finished");
    assert!(
        matches!((interrupted, retry, finished), (Some(i), Some(r), Some(f)) if i < r && r < f),
        "{kinds:?}"
    );
    let events = run_events(&rt, &store, &id);
    let said = events.iter().find(|e| e.kind == "run.retry").unwrap();
    assert_eq!(said.payload["attempt"], 2);
    assert_eq!(said.payload["of"], 2);
    assert_eq!(said.payload["previous"]["state"], "interrupted");
    assert_eq!(said.payload["previous"]["detail"], LEASE_LOST_DETAIL);
    assert_eq!(
        kinds.iter().filter(|k| *k == "run.started").count(),
        2,
        "{kinds:?}"
    );
}

#[test]
fn overlap_replace_stops_the_fleets_running_run_before_the_new_one_starts() {
    let Some(cluster) = PgCluster::start() else {
        return;
    };
    let repo = policy_repo(&[("rep", "overlap = \"replace\"")]);
    let url = worker_store(&cluster, repo.path());
    let _daemon = joined_daemon(repo.path(), &url);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = rt.block_on(PgStore::connect(&url, &fleet_key())).unwrap();
    let logs = tempfile::tempdir().unwrap();
    let _workers = steady_workers(repo.path(), &url, logs.path(), 2);
    let first = fire_in_fleet(repo.path(), &url, "rep");
    crate::support::wait_for("the first run to start", || {
        (!lines(&repo.path().join("ran.log")).is_empty()).then_some(())
    });
    let second = fire_in_fleet(repo.path(), &url, "rep");
    let ended = |id: &str| {
        rt.block_on(store.run(id))
            .unwrap()
            .filter(|r| r.state != state::RUNNING && r.state != state::QUEUED)
    };
    let replaced = crate::support::wait_for("the first run to be stopped", || ended(&first));
    assert_eq!(
        replaced.state,
        state::CANCELLED,
        "{}",
        worker_logs(logs.path())
    );
    let said = format!("replaced by run `{second}`");
    assert_eq!(replaced.detail.as_deref(), Some(said.as_str()));
    let newer = crate::support::wait_for("the new run to end", || ended(&second));
    assert_eq!(
        newer.state,
        state::SUCCEEDED,
        "{}",
        worker_logs(logs.path())
    );
    // The new run started once the replaced one had ended, never with it.
    assert_eq!(
        lines(&repo.path().join("ran.log")),
        vec![first.clone(), second]
    );
    assert!(newer.started_at_ms >= replaced.finished_at_ms);
    // The replaced run's own end was relayed: the agent was stopped.
    let events = run_events(&rt, &store, &first);
    let end = events
        .iter()
        .find(|e| e.kind == "run.finished")
        .unwrap_or_else(|| panic!("{events:?}"));
    assert_eq!(end.payload["outcome"], "cancelled", "{end:?}");
}

// ----- one scheduler across the fleet ------------------------------------

/// The interval of the scheduler test's cron trigger, in seconds: shorter
/// than the lease (3 s), so fire times pass while no daemon leads and the
/// new leader owes them.
const TICK_SECS: i64 = 2;
/// Fire times the scheduler test waits for.
const TICKS: usize = 16;
/// The fire after which the scheduler test kills the leader.
const KILL_AFTER_TICKS: usize = 5;
/// How long the test waits for its fires, with room for a loaded machine.
const TICKS_LIMIT: Duration = Duration::from_secs(240);

/// A repository of the fleet whose daemon schedules cron `tick` every
/// [`TICK_SECS`], with a short lease so a leader's end hands over quickly.
fn scheduler_repo() -> tempfile::TempDir {
    let dir = fleet_repo("true");
    let manifest = format!(
        "version = 1\n[project]\nname = \"{FLEET_PROJECT}\"\n\
         [store]\nurl = \"${{NPC_STORE_URL}}\"\nlease_timeout = \"3s\"\n\
         [triggers.tick]\nkind = \"cron\"\nschedule = \"{TICK_SECS}s\"\n\
         action = {{ command = \"true\" }}\n"
    );
    std::fs::write(dir.path().join("npcagent.toml"), manifest).unwrap();
    dir
}

/// A daemon on each of `repos`, in front of the fleet at `url`.
fn scheduler_daemons(repos: &[tempfile::TempDir], url: &str) -> Vec<crate::support::Daemon> {
    repos
        .iter()
        .map(|repo| {
            crate::support::Daemon::start_in_with(
                repo.path(),
                crate::support::DaemonSetup {
                    only_env: Some(&[("NPC_STORE_URL", url)]),
                    ..crate::support::DaemonSetup::default()
                },
            )
        })
        .collect()
}

/// The scheduling state (`leader`, `standby`) each daemon's status shows.
fn scheduling_of(repos: &[tempfile::TempDir], url: &str, alive: &[bool]) -> Vec<String> {
    repos
        .iter()
        .zip(alive)
        .filter(|(_, alive)| **alive)
        .map(|(repo, _)| {
            let status = npc_json(repo.path(), url, &["status"]);
            status["store"]["scheduling"]
                .as_str()
                .unwrap_or("none")
                .to_string()
        })
        .collect()
}

/// The fire times (unix ms) of `tick` runs in the shared store, oldest first.
fn fire_times(rt: &tokio::runtime::Runtime, store: &PgStore) -> Vec<i64> {
    let mut times: Vec<i64> = rt
        .block_on(store.run_rows(Some("tick"), 1_000))
        .unwrap()
        .iter()
        .map(|r| r.dedupe_key.as_deref().unwrap().parse().unwrap())
        .collect();
    times.sort_unstable();
    times
}

#[test]
fn three_schedulers_fire_every_cron_time_exactly_once_and_a_killed_leader_hands_over() {
    let Some(cluster) = PgCluster::start() else {
        return;
    };
    let repos: Vec<tempfile::TempDir> = (0..3).map(|_| scheduler_repo()).collect();
    let url = worker_store(&cluster, repos[0].path());
    let mut daemons = scheduler_daemons(&repos, &url);
    let mut alive = vec![true; 3];
    // One leader, two standing by.
    let leader = crate::support::wait_for("one scheduler to lead", || {
        let states = scheduling_of(&repos, &url, &alive);
        let leaders: Vec<usize> = (0..3).filter(|i| states[*i] == "leader").collect();
        let standby = states.iter().filter(|s| *s == "standby").count();
        (leaders.len() == 1 && standby == 2).then(|| leaders[0])
    });
    let human = npc_human(repos[leader].path(), &url, "status");
    assert!(human.contains("cron scheduler: leader"), "{human}");
    let standbys: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    let listed = npc_json(repos[standbys[0]].path(), &url, &["triggers"]);
    assert_eq!(listed["triggers"][0]["standby"], true, "{listed}");

    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = rt.block_on(PgStore::connect(&url, &fleet_key())).unwrap();
    crate::support::wait_for_within("the first fires", TICKS_LIMIT, || {
        (fire_times(&rt, &store).len() >= KILL_AFTER_TICKS).then_some(())
    });
    // Right after a fire, so the next one is a whole interval away.
    daemons[leader].kill();
    alive[leader] = false;
    crate::support::wait_for("another scheduler to take the lead", || {
        let states = scheduling_of(&repos, &url, &alive);
        let leaders = states.iter().filter(|s| *s == "leader").count();
        let standby = states.iter().filter(|s| *s == "standby").count();
        (leaders == 1 && standby == 1).then_some(())
    });
    let times = crate::support::wait_for_within("two minutes of fires", TICKS_LIMIT, || {
        let times = fire_times(&rt, &store);
        (times.len() >= TICKS).then_some(times)
    });
    // Every fire time exactly once, none skipped across the handover: the
    // new leader went on from the fleet's stored next fire, firing the
    // ones that passed without a leader (`missed` is `skip` here).
    let gaps: Vec<i64> = times.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(
        gaps.iter().all(|g| *g == TICK_SECS * 1_000),
        "fire times {times:?} (gaps {gaps:?})\n{}",
        daemons
            .iter()
            .enumerate()
            .filter(|(i, _)| alive[*i])
            .map(|(_, d)| d.log())
            .collect::<String>()
    );
    let rows = rt.block_on(store.run_rows(Some("tick"), 1_000)).unwrap();
    assert!(
        rows.iter()
            .all(|r| r.origin.known() == Some(npcagent::model::RunOrigin::Cron)),
        "{rows:?}"
    );
    drop(daemons);
}

/// The interval of the paused-leader test's cron trigger, in seconds:
/// shorter than the lease, so fire times pass while nobody leads.
const PAUSE_TICK_SECS: i64 = 1;

/// A repository of the fleet whose daemon schedules cron `tick` every
/// [`PAUSE_TICK_SECS`] under a lease of two seconds, `missed` left at
/// `skip`: the fires a handover came too late for are owed by the fleet,
/// each fired once at its own time by the new leader.
fn paused_leader_repo() -> tempfile::TempDir {
    let dir = fleet_repo("true");
    let manifest = format!(
        "version = 1\n[project]\nname = \"{FLEET_PROJECT}\"\n\
         [store]\nurl = \"${{NPC_STORE_URL}}\"\nlease_timeout = \"2s\"\n\
         [triggers.tick]\nkind = \"cron\"\nschedule = \"{PAUSE_TICK_SECS}s\"\n\
         action = {{ command = \"true\" }}\n"
    );
    std::fs::write(dir.path().join("npcagent.toml"), manifest).unwrap();
    dir
}

/// Continues a stopped process when dropped (a failing test never leaves a
/// daemon stopped, where its SIGTERM would wait).
pub(crate) struct Continued(pub(crate) nix::unistd::Pid);

impl Drop for Continued {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(self.0, nix::sys::signal::Signal::SIGCONT);
    }
}

/// The `scheduler.*` events `daemon` recorded, oldest first (read from its
/// store, so even while it is stopped).
fn scheduler_events(daemon: &crate::support::Daemon) -> Vec<String> {
    daemon
        .events()
        .iter()
        .filter_map(|e| e["kind"].as_str())
        .filter(|k| k.starts_with("scheduler."))
        .map(str::to_string)
        .collect()
}

#[test]
fn a_leader_paused_past_its_lease_wakes_up_standing_by_and_every_fire_time_is_stored_once() {
    let Some(cluster) = PgCluster::start() else {
        return;
    };
    let repos: Vec<tempfile::TempDir> = (0..2).map(|_| paused_leader_repo()).collect();
    let url = worker_store(&cluster, repos[0].path());
    let daemons = scheduler_daemons(&repos, &url);
    let leader = crate::support::wait_for("one scheduler to lead", || {
        let states = scheduling_of(&repos, &url, &[true, true]);
        let leaders: Vec<usize> = (0..2).filter(|i| states[*i] == "leader").collect();
        (leaders.len() == 1 && states.contains(&"standby".to_string())).then(|| leaders[0])
    });
    let other = 1 - leader;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = rt.block_on(PgStore::connect(&url, &fleet_key())).unwrap();
    let fired = crate::support::wait_for_within("a first fire", TICKS_LIMIT, || {
        let n = fire_times(&rt, &store).len();
        (n >= 1).then_some(n)
    });
    // Right after a fire, so the next is a whole interval away.
    crate::support::wait_for_within("the next fire", TICKS_LIMIT, || {
        (fire_times(&rt, &store).len() > fired).then_some(())
    });
    let paused = nix::unistd::Pid::from_raw(daemons[leader].pid() as i32);
    nix::sys::signal::kill(paused, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let continued = Continued(paused);
    // The server ends the paused leader's lock once its lease passes.
    crate::support::wait_for("the other daemon to take the lead", || {
        scheduler_events(&daemons[other])
            .iter()
            .any(|k| k == "scheduler.leading")
            .then_some(())
    });
    let taken_over = fire_times(&rt, &store).len();
    crate::support::wait_for_within("fires of the new leader", TICKS_LIMIT, || {
        (fire_times(&rt, &store).len() >= taken_over + 2).then_some(())
    });
    drop(continued);
    // Awake, the old leader's renewal fails: it stands by, firing nothing.
    crate::support::wait_for("the old leader to stand by", || {
        let said = scheduler_events(&daemons[leader]);
        (said.last().map(String::as_str) == Some("scheduler.standby")).then_some(())
    });
    let states = scheduling_of(&repos, &url, &[true, true]);
    assert_eq!(states[leader], "standby", "{states:?}");
    assert_eq!(states[other], "leader", "{states:?}");
    let listed = npc_json(repos[leader].path(), &url, &["triggers"]);
    assert_eq!(listed["triggers"][0]["standby"], true, "{listed}");
    let awake = fire_times(&rt, &store).len();
    let times = crate::support::wait_for_within("fires after the wake-up", TICKS_LIMIT, || {
        let times = fire_times(&rt, &store);
        (times.len() >= awake + 2).then_some(times)
    });
    // Every fire time exactly once, none skipped, whoever fired it.
    let gaps: Vec<i64> = times.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(
        gaps.iter().all(|g| *g == PAUSE_TICK_SECS * 1_000),
        "fire times {times:?} (gaps {gaps:?})\n{}{}",
        daemons[0].log(),
        daemons[1].log()
    );
    let said = scheduler_events(&daemons[other]);
    assert_eq!(
        said.last().map(String::as_str),
        Some("scheduler.leading"),
        "{said:?}"
    );
}

// ----- roles: ingress and scheduler ---------------------------------------

/// A repository of the fleet whose daemon's `[store] role` comes from
/// `NPC_ROLE`, with webhook `gh` and a cron `tick` every second, and a
/// lease of a second (a scheduler candidate would ask for the lead three
/// times a second).
fn role_repo() -> tempfile::TempDir {
    let dir = fleet_repo("true");
    let manifest = format!(
        "version = 1\n[project]\nname = \"{FLEET_PROJECT}\"\n\
         [store]\nurl = \"${{NPC_STORE_URL}}\"\nlease_timeout = \"1s\"\nrole = \"${{NPC_ROLE:-all}}\"\n\
         [daemon]\nwebhook_listen = \"127.0.0.1:0\"\n\
         [triggers.gh]\nkind = \"webhook\"\nroute = \"github\"\nsecret_env = \"HOOK_SECRET\"\n\
         action = {{ command = \"sh\", args = [\"-c\", \"echo \\\"$NPC_RUN_ID\\\" >> ran.log\"] }}\n\
         [triggers.tick]\nkind = \"cron\"\nschedule = \"1s\"\naction = {{ command = \"true\" }}\n"
    );
    std::fs::write(dir.path().join("npcagent.toml"), manifest).unwrap();
    dir
}

/// A daemon on `repo` in front of the fleet at `url` as `role`.
fn role_daemon(repo: &std::path::Path, url: &str, role: &str) -> crate::support::Daemon {
    crate::support::Daemon::start_in_with(
        repo,
        crate::support::DaemonSetup {
            only_env: Some(&[
                ("HOOK_SECRET", INGRESS_SECRET),
                ("NPC_STORE_URL", url),
                ("NPC_ROLE", role),
            ]),
            ..crate::support::DaemonSetup::default()
        },
    )
}

#[test]
fn an_ingress_daemon_never_leads_and_a_scheduler_daemon_serves_no_webhooks() {
    let Some(cluster) = PgCluster::start() else {
        return;
    };
    let (ingress_repo, scheduler_repo) = (role_repo(), role_repo());
    let url = worker_store(&cluster, ingress_repo.path());
    let ingress = role_daemon(ingress_repo.path(), &url, "ingress");
    let status = crate::support::wait_for("the ingress daemon to join the fleet", || {
        let status = npc_json(ingress_repo.path(), &url, &["status"]);
        (status["store"]["state"] == "connected").then_some(status)
    });
    assert_eq!(status["store"]["role"], "ingress", "{status}");
    assert!(status["store"].get("scheduling").is_none(), "{status}");
    let human = npc_human(ingress_repo.path(), &url, "status");
    assert!(human.contains("role ingress"), "{human}");
    assert!(!human.contains("cron scheduler"), "{human}");

    // It takes webhooks into the fleet; a worker carries them out. All the
    // while, a scheduler candidate would have led and fired `tick`.
    let (code, text) = deliver(ingress_repo.path(), &url, "d-1");
    assert_eq!(code, 202, "{text}\n{}", ingress.log());
    let id = serde_json::from_str::<serde_json::Value>(&text).unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    let logs = tempfile::tempdir().unwrap();
    let _worker = crate::support::Stopped::new(start_worker_leased(
        ingress_repo.path(),
        &url,
        &logs.path().join("worker.log"),
        STEADY_LEASE_SECS,
    ));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = rt.block_on(PgStore::connect(&url, &fleet_key())).unwrap();
    crate::support::wait_for("the worker to carry the webhook's run out", || {
        rt.block_on(store.run(&id))
            .unwrap()
            .filter(|r| r.state == state::SUCCEEDED)
    });
    assert_eq!(
        fire_times(&rt, &store),
        Vec::<i64>::new(),
        "nobody schedules"
    );
    let leading =
        |d: &crate::support::Daemon| d.events().iter().any(|e| e["kind"] == "scheduler.leading");
    assert!(!leading(&ingress), "the ingress daemon led");

    // A scheduler-only daemon leads and fires, and opens no webhook port.
    let scheduler = role_daemon(scheduler_repo.path(), &url, "scheduler");
    let status = crate::support::wait_for("the scheduler daemon to lead", || {
        let status = npc_json(scheduler_repo.path(), &url, &["status"]);
        (status["store"]["scheduling"] == "leader").then_some(status)
    });
    assert_eq!(status["store"]["role"], "scheduler", "{status}");
    crate::support::wait_for("a fire of `tick`", || {
        (!fire_times(&rt, &store).is_empty()).then_some(())
    });
    let listed = npc_json(scheduler_repo.path(), &url, &["triggers"]);
    let gh = listed["triggers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "gh")
        .unwrap_or_else(|| panic!("{listed}"))
        .clone();
    assert_eq!(gh["standby"], true, "{gh}");
    assert!(gh["url"].is_null(), "a webhook port is open: {gh}");
    assert!(
        !scheduler
            .events()
            .iter()
            .any(|e| e["kind"] == "webhook.listening"),
        "the scheduler daemon listens for webhooks"
    );
    assert!(leading(&scheduler));
    assert!(!leading(&ingress), "the ingress daemon led");
    let status = npc_json(ingress_repo.path(), &url, &["status"]);
    assert!(status["store"].get("scheduling").is_none(), "{status}");
}

// ----- examples/fleet -------------------------------------------------------

#[test]
fn the_fleet_example_validates_and_its_units_run_commands_npc_has() {
    let example = crate::support::repo_root().join("examples/fleet");
    let dir = fleet_repo("true");
    std::fs::copy(
        example.join("npcagent.toml"),
        dir.path().join("npcagent.toml"),
    )
    .unwrap();
    let password = "example-pa55word";
    let url = format!("postgres://npc:{password}@127.0.0.1:5432/npc");
    let out = crate::support::npc()
        .args(["validate", "npcagent.toml"])
        .current_dir(dir.path())
        .env("NPC_STORE_URL", &url)
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("valid"), "{said}");
    assert!(!said.contains(password), "{said}");
    // Every npc command the units and the Deployment run is one npc has.
    let mut commands = Vec::new();
    for unit in ["systemd/npc-daemon.service", "systemd/npc-worker@.service"] {
        let text = std::fs::read_to_string(example.join(unit)).unwrap();
        for line in text.lines() {
            if let Some(rest) = line
                .strip_prefix("ExecStart=")
                .or_else(|| line.strip_prefix("ExecStartPre="))
                && let Some(args) = rest.strip_prefix("/usr/local/bin/npc ")
            {
                commands.push(args.split_whitespace().map(str::to_string).collect());
            }
        }
    }
    let deployment = std::fs::read_to_string(example.join("kubernetes/workers.yaml")).unwrap();
    for line in deployment.lines() {
        if let Some(list) = line.trim().strip_prefix("command: [\"npc\", ") {
            let args: Vec<String> = list
                .trim_end_matches(']')
                .split(", ")
                .map(|a| a.trim_matches('"').to_string())
                .collect();
            commands.push(args);
        }
    }
    assert_eq!(
        commands,
        vec![
            vec!["store".to_string(), "migrate".to_string()],
            vec!["daemon".to_string()],
            vec!["worker".to_string()],
            vec!["worker".to_string()],
        ]
    );
    for args in commands {
        crate::support::npc()
            .args(&args)
            .arg("--help")
            .assert()
            .success();
    }
}
