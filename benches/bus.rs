//! Event bus throughput: persisted events per second through `EventBus`
//! (group commit, 4 subscribers, 8 concurrent publisher tasks) against a
//! bare rusqlite insert loop on the same schema in the same run.
//!
//! Both sides use a temp directory on disk, WAL and `synchronous=NORMAL`,
//! and serialize the same JSON payload per event. The baseline is the fair
//! raw upper bound for this schema: one prepared statement, one transaction
//! per 1,000 rows, on the calling thread, no subscribers and no async hops.
//!
//! `cargo bench --bench bus`; `BUS_BENCH_EVENTS` overrides the event count.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use npcagent::bus::EventBus;
use npcagent::event::{Event, ProcessStarted};
use npcagent::store::{NewEvent, Store};

/// Publisher tasks.
const PUBLISHERS: usize = 8;
/// Subscribers on the bus.
const SUBSCRIBERS: usize = 4;
/// Events per publisher unless `BUS_BENCH_EVENTS` (total) says otherwise.
const EVENTS_PER_PUBLISHER: usize = 25_000;
/// Rows per transaction in the baseline.
const BASELINE_ROWS_PER_TX: usize = 1000;
/// Publishes one pipelined publisher keeps in flight.
const PIPELINE_WINDOW: usize = 64;
/// Longest the bench waits for subscribers to drain.
const DRAIN_LIMIT: Duration = Duration::from_secs(120);

/// Set to publish the payload this bench published before events were
/// typed (five fields), for same-run comparisons with commits before issue
/// 42 (`benches/scripts/compare_commits.py --env`).
const LEGACY_PAYLOAD_ENV: &str = "NPC_BENCH_LEGACY_PAYLOAD";

fn new_event(publisher: usize, n: usize) -> NewEvent {
    let component = format!("mcp_server/fs-{publisher}");
    if std::env::var_os(LEGACY_PAYLOAD_ENV).is_some() {
        let payload = serde_json::json!({
            "component": component,
            "state": "running",
            "pid": 40_000 + n,
            "restarts": n % 7,
            "detail": "started after config change (args)",
        });
        return NewEvent::relayed("component.started".to_string(), Some(component), payload);
    }
    Event::ComponentStarted(ProcessStarted {
        event: "started".to_string(),
        id: component.clone(),
        pid: 40_000 + u32::try_from(n).unwrap_or(u32::MAX),
    })
    .for_component(component)
}

/// Bare rusqlite: prepared insert, one transaction per 1,000 rows.
fn baseline(dir: &std::path::Path, total: usize) -> f64 {
    let path = dir.join("baseline.db");
    drop(Store::open(&path).expect("create schema")); // same schema via migrations
    let mut conn = rusqlite::Connection::open(&path).expect("open");
    conn.pragma_update(None, "journal_mode", "WAL")
        .expect("wal");
    conn.pragma_update(None, "synchronous", "NORMAL")
        .expect("sync");
    let start = Instant::now();
    let mut written = 0;
    while written < total {
        let tx = conn.transaction().expect("tx");
        {
            let mut insert = tx
                .prepare_cached(
                    "INSERT INTO events (ts_ms, kind, component, payload) VALUES (?1, ?2, ?3, ?4)",
                )
                .expect("prepare");
            for _ in 0..BASELINE_ROWS_PER_TX.min(total - written) {
                let publisher = written % PUBLISHERS;
                let event = new_event(publisher, written);
                let body = event.payload().to_string();
                insert
                    .execute((
                        1_700_000_000_000_i64,
                        event.kind(),
                        event.component(),
                        &body,
                    ))
                    .expect("insert");
                written += 1;
            }
        }
        tx.commit().expect("commit");
    }
    total as f64 / start.elapsed().as_secs_f64()
}

struct BusRun {
    per_sec: f64,
    transactions: u64,
    delivered: u64,
    dropped: u64,
}

/// Through the bus: `PUBLISHERS` tasks, each awaiting every publish
/// (`window == 1`) or keeping `window` publishes in flight.
async fn through_bus(
    dir: &std::path::Path,
    name: &str,
    per_publisher: usize,
    window: usize,
) -> BusRun {
    let store = Arc::new(Store::open(dir.join(format!("{name}.db"))).expect("open store"));
    let bus = EventBus::new(Arc::clone(&store));
    let delivered = Arc::new(AtomicU64::new(0));
    let mut subs = Vec::new();
    for s in 0..SUBSCRIBERS {
        let delivered = Arc::clone(&delivered);
        subs.push(
            bus.subscribe(
                format!("bench-{s}"),
                |e: &npcagent::store::Event| e.kind.starts_with("component."),
                move |_event| {
                    delivered.fetch_add(1, Ordering::Relaxed);
                    async { Ok::<(), std::convert::Infallible>(()) }
                },
            )
            .expect("subscribe"),
        );
    }
    let before = store.stats().transactions;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for p in 0..PUBLISHERS {
        let bus = bus.clone();
        tasks.push(tokio::spawn(async move {
            let mut in_flight = std::collections::VecDeque::with_capacity(window);
            for n in 0..per_publisher {
                in_flight.push_back(bus.publish(new_event(p, n)));
                if in_flight.len() >= window
                    && let Some(oldest) = in_flight.pop_front()
                {
                    oldest.await.expect("publish");
                }
            }
            for pending in in_flight {
                pending.await.expect("publish");
            }
        }));
    }
    for t in tasks {
        t.await.expect("publisher");
    }
    let per_sec = (PUBLISHERS * per_publisher) as f64 / start.elapsed().as_secs_f64();
    let transactions = store.stats().transactions - before;
    let dropped: u64 = subs.iter().map(|s| s.dropped()).sum();
    let expected = (PUBLISHERS * per_publisher * SUBSCRIBERS) as u64 - dropped;
    let deadline = Instant::now() + DRAIN_LIMIT;
    while delivered.load(Ordering::Relaxed) < expected && Instant::now() < deadline {
        tokio::task::yield_now().await;
    }
    bus.shutdown().await;
    BusRun {
        per_sec,
        transactions,
        delivered: delivered.load(Ordering::Relaxed),
        dropped,
    }
}

fn main() {
    let total: usize = std::env::var("BUS_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(PUBLISHERS * EVENTS_PER_PUBLISHER);
    let per_publisher = (total / PUBLISHERS).max(1);
    let total = per_publisher * PUBLISHERS;
    let dir = tempfile::tempdir().expect("temp dir");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");

    let base = baseline(dir.path(), total);
    let awaited = rt.block_on(through_bus(dir.path(), "awaited", per_publisher, 1));
    let piped = rt.block_on(through_bus(
        dir.path(),
        "pipelined",
        per_publisher,
        PIPELINE_WINDOW,
    ));

    println!(
        "bus benchmark: {total} events, {PUBLISHERS} publishers, {SUBSCRIBERS} subscribers, WAL + synchronous=NORMAL on disk"
    );
    let base_label = format!("baseline: rusqlite, {BASELINE_ROWS_PER_TX} rows/tx");
    println!("{base_label:<40}: {base:>10.0} events/s");
    let piped_label = format!("bus, {PIPELINE_WINDOW} publishes in flight/task");
    for (label, run) in [
        ("bus, each publish awaited", &awaited),
        (piped_label.as_str(), &piped),
    ] {
        println!(
            "{label:<40}: {:>10.0} events/s  ratio {:.2}  ({} transactions, {:.1} events/tx, {} delivered, {} dropped)",
            run.per_sec,
            run.per_sec / base,
            run.transactions,
            total as f64 / run.transactions.max(1) as f64,
            run.delivered,
            run.dropped,
        );
    }
}
