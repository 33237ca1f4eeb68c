//! The fleet's claim path on PostgreSQL against a raw SQL `SKIP LOCKED`
//! claim loop, in the same run, on one throwaway cluster (the tests'
//! `pg::PgCluster`), with 1, 4 and 16 workers:
//!
//! - claims per second: N queued runs drained by W workers, each a
//!   `PgStore` of its own (its own pool and `LISTEN` connection, as
//!   separate `npc worker` processes have) doing claim + finish, against W
//!   raw connections running the same two statements without npc's code;
//! - enqueue → start: runs enqueued one at a time (`PgStore::enqueue`, its
//!   `NOTIFY` committed with the row) while W workers wait for work as
//!   `npc worker` does (`wait_for_work`, then claim); the latency is from
//!   the enqueue's commit to the claim's answer. The raw baseline polls
//!   without pause (its lower bound: no wake-up at all).
//!
//! `cargo bench --bench fleet`; `FLEET_BENCH_RUNS` overrides N (2,000),
//! `FLEET_BENCH_LATENCY_RUNS` the latency sample (300). Needs Debian's
//! `postgresql` (or `NPC_TEST_PG_BIN`); skips without it.

#[path = "../tests/integration/pg.rs"]
#[allow(dead_code)]
mod pg;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use npcagent::store::fleet::FleetQueue;
use npcagent::store::pg::PgStore;
use npcagent::store::queue::{NewRun, state};

/// Worker counts measured.
const WORKER_COUNTS: [usize; 3] = [1, 4, 16];
/// The lease every claim takes (never runs out during the bench).
const LEASE: Duration = Duration::from_secs(600);
/// The pause between two enqueues of the latency sample.
const ENQUEUE_PACE: Duration = Duration::from_millis(5);
/// How long a waiting worker waits before it looks again.
const WAIT_AT_MOST: Duration = Duration::from_millis(500);
const FLEET: &str = "bench@fleet";
const RAW_FLEET: &str = "raw@fleet";

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn new_run(id: String) -> NewRun {
    NewRun {
        id,
        trigger: "t".into(),
        origin: "api".into(),
        dedupe_key: None,
        payload: "{}".into(),
        skip_if_active: false,
        max_queued: usize::MAX,
        state: None,
        claimed_by: None,
        replay_until_ms: None,
        concurrency_key: None,
    }
}

const RAW_CLAIM: &str = "WITH next AS (
        SELECT seq FROM npc_runs WHERE fleet = $1 AND state = 'queued'
        ORDER BY seq LIMIT 1 FOR UPDATE SKIP LOCKED)
    UPDATE npc_runs r SET state = 'running', owner = $2, lease_token = r.lease_token + 1,
        started_at_ms = npc_now_ms(), lease_expires_at_ms = npc_now_ms() + 600000
    FROM next WHERE r.seq = next.seq RETURNING r.id, r.lease_token";
const RAW_FINISH: &str = "UPDATE npc_runs SET state = 'succeeded', finished_at_ms = npc_now_ms()
    WHERE fleet = $1 AND id = $2 AND lease_token = $3 AND state = 'running'";

async fn raw_client(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    client
}

async fn raw_fill(url: &str, n: usize) {
    let client = raw_client(url).await;
    client
        .execute(
            "INSERT INTO npc_runs (fleet, id, trigger, origin, payload, state, enqueued_at_ms)
             SELECT $1, 'raw-' || g, 't', 'api', '{}', 'queued', npc_now_ms()
             FROM generate_series(1, $2::bigint) g",
            &[&RAW_FLEET, &(n as i64)],
        )
        .await
        .unwrap();
}

/// Claims per second of npc's path and of the raw loop, with `workers`.
async fn throughput(url: &str, workers: usize, n: usize) -> (f64, f64) {
    let filler = PgStore::connect(url, FLEET).await.unwrap();
    for i in 0..n {
        filler.enqueue(new_run(format!("t-{i}"))).await.unwrap();
    }
    let mut stores = Vec::new();
    for _ in 0..workers {
        stores.push(Arc::new(PgStore::connect(url, FLEET).await.unwrap()));
    }
    let started = Instant::now();
    let tasks: Vec<_> = stores
        .into_iter()
        .enumerate()
        .map(|(w, store)| {
            tokio::spawn(async move {
                let me = format!("w{w}");
                while let Some(c) = store.claim(&me, LEASE).await.unwrap() {
                    store
                        .finish(&c.lease, state::SUCCEEDED, None)
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let npc = n as f64 / started.elapsed().as_secs_f64();

    raw_fill(url, n).await;
    let mut clients = Vec::new();
    for _ in 0..workers {
        clients.push(raw_client(url).await);
    }
    let started = Instant::now();
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(w, client)| {
            tokio::spawn(async move {
                let me = format!("raw{w}");
                let claim = client.prepare(RAW_CLAIM).await.unwrap();
                let finish = client.prepare(RAW_FINISH).await.unwrap();
                while let Some(row) = client.query_opt(&claim, &[&RAW_FLEET, &me]).await.unwrap() {
                    let (id, token): (String, i64) = (row.get(0), row.get(1));
                    client
                        .execute(&finish, &[&RAW_FLEET, &id, &token])
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let raw = n as f64 / started.elapsed().as_secs_f64();
    (npc, raw)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Enqueue → start of npc's waiting workers: (p50, p99).
async fn latency(url: &str, workers: usize, m: usize) -> (Duration, Duration) {
    let enqueuer = PgStore::connect(url, FLEET).await.unwrap();
    let committed: Arc<std::sync::Mutex<Vec<Option<Instant>>>> =
        Arc::new(std::sync::Mutex::new(vec![None; m]));
    let latencies = Arc::new(std::sync::Mutex::new(Vec::with_capacity(m)));
    let done = Arc::new(AtomicUsize::new(0));
    let stop = tokio_util::sync::CancellationToken::new();
    let mut tasks = Vec::new();
    for w in 0..workers {
        let store = Arc::new(PgStore::connect(url, FLEET).await.unwrap());
        let (committed, latencies, done, stop) = (
            committed.clone(),
            latencies.clone(),
            done.clone(),
            stop.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let me = format!("l{w}");
            loop {
                match store.claim(&me, LEASE).await.unwrap() {
                    Some(c) => {
                        let at = Instant::now();
                        let i: usize = c.run.id.trim_start_matches("l-").parse().unwrap();
                        // The commit's instant is written right after enqueue returns;
                        // a claim may answer first, then it waits for it.
                        let from = loop {
                            if let Some(t) = committed.lock().unwrap()[i] {
                                break t;
                            }
                            tokio::task::yield_now().await;
                        };
                        latencies
                            .lock()
                            .unwrap()
                            .push(at.saturating_duration_since(from));
                        store
                            .finish(&c.lease, state::SUCCEEDED, None)
                            .await
                            .unwrap();
                        done.fetch_add(1, Ordering::SeqCst);
                    }
                    None => tokio::select! {
                        () = stop.cancelled() => return,
                        _ = store.wait_for_work(WAIT_AT_MOST) => {}
                    },
                }
            }
        }));
    }
    for i in 0..m {
        let before = Instant::now();
        enqueuer.enqueue(new_run(format!("l-{i}"))).await.unwrap();
        // The commit is somewhere in the enqueue's round trip: its middle.
        let mid = before + before.elapsed() / 2;
        committed.lock().unwrap()[i] = Some(mid);
        tokio::time::sleep(ENQUEUE_PACE).await;
    }
    while done.load(Ordering::SeqCst) < m {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.cancel();
    for t in tasks {
        t.await.unwrap();
    }
    let mut all = latencies.lock().unwrap().clone();
    all.sort();
    (percentile(&all, 0.5), percentile(&all, 0.99))
}

fn main() {
    let Some(cluster) = pg::PgCluster::start() else {
        println!("fleet bench skipped: no PostgreSQL server binaries");
        return;
    };
    let n = env_usize("FLEET_BENCH_RUNS", 2_000);
    let m = env_usize("FLEET_BENCH_LATENCY_RUNS", 300);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    println!("claims: {n} runs per side; enqueue → start: {m} runs, one every {ENQUEUE_PACE:?}");
    println!("| workers | npc claims/s | raw claims/s | ratio | enqueue → start p50 | p99 |");
    println!("|---:|---:|---:|---:|---:|---:|");
    for workers in WORKER_COUNTS {
        let url = cluster.database(&format!("bench{workers}"));
        rt.block_on(async {
            npcagent::store::pg::migrate(&url).await.unwrap();
            let (npc, raw) = throughput(&url, workers, n).await;
            let (p50, p99) = latency(&url, workers, m).await;
            println!(
                "| {workers} | {npc:.0} | {raw:.0} | {:.2} | {:.2} ms | {:.2} ms |",
                npc / raw,
                p50.as_secs_f64() * 1e3,
                p99.as_secs_f64() * 1e3
            );
        });
    }
}
