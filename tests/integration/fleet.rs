//! The fleet's run queue (`store::fleet::RunQueue`), one suite run against
//! both backends — the embedded SQLite store and a real PostgreSQL
//! (`pg::PgCluster`) — so their guarantees are the same word for word:
//! exactly-once claims among concurrent workers, fencing of late writes,
//! rescue of expired leases, dedupe and queue bounds, events in order.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use npcagent::store::fleet::{LEASE_EXPIRED_DETAIL, RunQueue, SqliteQueue};
use npcagent::store::pg::PgStore;
use npcagent::store::queue::{Enqueued, NewRun, state};
use npcagent::store::{NewEvent, Store, StoreError};
use serde_json::json;

use crate::pg::{PG_PASSWORD, PgCluster};

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

fn run(id: &str) -> NewRun {
    NewRun {
        id: id.to_string(),
        trigger: "t".to_string(),
        origin: "api".to_string(),
        dedupe_key: None,
        payload: json!({ "n": id }).to_string(),
        skip_if_active: false,
        max_queued: 100_000,
        state: None,
        claimed_by: None,
        replay_until_ms: None,
        concurrency_key: None,
    }
}

/// A backend under test, and what keeps it alive.
struct Backend {
    queue: Arc<dyn RunQueue>,
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
    an_expired_lease_is_rescued_once_and_never_claimed_again,
    dedupe_keys_and_queue_bounds_hold,
    fenced_events_append_in_order_and_a_lost_lease_appends_none,
);

async fn concurrent_workers_claim_each_run_exactly_once(queue: Arc<dyn RunQueue>) {
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
                    .finish(&claimed.lease, state::SUCCEEDED, None)
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
async fn until_expired(queue: &Arc<dyn RunQueue>, lease: &npcagent::store::fleet::Lease) {
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

async fn a_late_write_under_an_old_token_is_refused(queue: Arc<dyn RunQueue>) {
    queue.enqueue(run("a")).await.unwrap();
    let first = queue.claim("w1", SHORT_LEASE).await.unwrap().unwrap();
    until_expired(&queue, &first.lease).await;
    // Expired but not yet rescued: the late finish is refused all the same.
    let late = queue.finish(&first.lease, state::SUCCEEDED, None).await;
    assert!(
        matches!(late, Err(StoreError::Fenced { ref run, token }) if run == "a" && token == first.lease.token),
        "{late:?}"
    );
    let rescued = queue.rescue_expired().await.unwrap();
    assert_eq!(rescued, vec!["a".to_string()]);
    let row = queue.run("a").await.unwrap().unwrap();
    assert_eq!(row.state, state::INTERRUPTED);
    assert_eq!(row.detail.as_deref(), Some(LEASE_EXPIRED_DETAIL));
    // Every later write under the old lease stays refused.
    for late in [
        queue.heartbeat(&first.lease, LONG_LEASE).await.err(),
        queue
            .finish(&first.lease, state::FAILED, Some("late".into()))
            .await
            .err(),
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

async fn an_expired_lease_is_rescued_once_and_never_claimed_again(queue: Arc<dyn RunQueue>) {
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
        vec!["lost".to_string()]
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
    queue
        .finish(&renewed, state::SUCCEEDED, None)
        .await
        .unwrap();
    assert_eq!(
        queue.run("kept").await.unwrap().unwrap().state,
        state::SUCCEEDED
    );
}

async fn dedupe_keys_and_queue_bounds_hold(queue: Arc<dyn RunQueue>) {
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

async fn fenced_events_append_in_order_and_a_lost_lease_appends_none(queue: Arc<dyn RunQueue>) {
    queue.enqueue(run("e")).await.unwrap();
    let claimed = queue.claim("w", LONG_LEASE).await.unwrap().unwrap();
    let before = queue.events_after(0, 1_000).await.unwrap().len();
    let events = (0..5)
        .map(|n| NewEvent::new("run.output", json!({ "n": n })).for_component("run.e"))
        .collect();
    let stored = queue.append_fenced(&claimed.lease, events).await.unwrap();
    assert!(stored.windows(2).all(|w| w[0].id < w[1].id));
    let all = queue.events_after(0, 1_000).await.unwrap();
    assert_eq!(all.len(), before + 5);
    let ns: Vec<i64> = all[before..]
        .iter()
        .map(|e| e.payload["n"].as_i64().unwrap())
        .collect();
    assert_eq!(ns, vec![0, 1, 2, 3, 4]);
    queue
        .finish(&claimed.lease, state::SUCCEEDED, None)
        .await
        .unwrap();
    let late = queue
        .append_fenced(
            &claimed.lease,
            vec![NewEvent::new("run.output", json!({ "n": 5 })).for_component("run.e")],
        )
        .await;
    assert!(matches!(late, Err(StoreError::Fenced { .. })), "{late:?}");
    assert_eq!(
        queue.events_after(0, 1_000).await.unwrap().len(),
        before + 5
    );
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
