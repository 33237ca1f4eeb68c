//! Unit tests for the event bus: persist before fan-out, drop-oldest,
//! crash isolation, shutdown, group commit, follow without gaps, secrets.

use std::convert::Infallible;
use std::io::Write;
use std::time::Duration;

use serde_json::json;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use super::*;
use crate::model::Text;

/// Longest a test waits for something that should happen.
const WAIT: Duration = Duration::from_secs(20);

fn new_bus() -> (tempfile::TempDir, EventBus) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Store::open(Store::default_path(dir.path())).expect("open store");
    (dir, EventBus::new(Arc::new(store)))
}

fn ev(kind: &str, n: i64) -> NewEvent {
    NewEvent::untyped(kind, json!({ "n": n }))
}

async fn recv<T>(rx: &mut UnboundedReceiver<T>) -> T {
    tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("timed out waiting for a delivery")
        .expect("channel open")
}

/// A subscriber that forwards every event it handles.
fn forwarder(bus: &EventBus, name: &str) -> (Subscription, UnboundedReceiver<Arc<Event>>) {
    let (tx, rx) = unbounded_channel();
    let sub = bus
        .subscribe(
            name,
            |_| true,
            move |event| {
                let tx = tx.clone();
                async move {
                    let _ = tx.send(event);
                    Ok::<(), Infallible>(())
                }
            },
        )
        .expect("subscribe");
    (sub, rx)
}

/// Captures `tracing` output of the current thread.
#[derive(Clone, Default)]
struct LogBuf(Arc<Mutex<Vec<u8>>>);

impl Write for LogBuf {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogBuf {
    type Writer = LogBuf;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

impl LogBuf {
    /// The process-wide log capture. Fan-out runs on the store's writer
    /// thread, so a thread-local default would miss it; tests tell their
    /// lines apart by their own subscriber names.
    fn global() -> &'static LogBuf {
        static LOGS: std::sync::OnceLock<LogBuf> = std::sync::OnceLock::new();
        LOGS.get_or_init(|| {
            let logs = LogBuf::default();
            let subscriber = tracing_subscriber::fmt()
                .with_writer(logs.clone())
                .with_ansi(false)
                .with_max_level(tracing::Level::INFO)
                .finish();
            tracing::subscriber::set_global_default(subscriber)
                .expect("no other global tracing subscriber in unit tests");
            logs
        })
    }

    /// Captured lines that mention `needle`.
    fn lines_with(&self, needle: &str) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .filter(|line| line.contains(needle))
            .map(str::to_string)
            .collect()
    }
}

#[tokio::test]
async fn published_events_are_durable_and_delivered_in_order() {
    let (_dir, bus) = new_bus();
    let (_sub, mut rx) = forwarder(&bus, "all");
    let first = bus
        .publish(ev("component.started", 1).for_component("mcp_server/fs"))
        .await
        .unwrap();
    let second = bus.publish(ev("component.exited", 2)).await.unwrap();
    assert_eq!((first.id, second.id), (1, 2));
    assert_eq!(recv(&mut rx).await, first);
    assert_eq!(recv(&mut rx).await, second);
    let stored = bus.store().events_since(0, 10).unwrap();
    assert_eq!(stored, vec![(*first).clone(), (*second).clone()]);
    assert_eq!(stored[0].component.as_deref(), Some("mcp_server/fs"));
}

#[tokio::test]
async fn a_failed_persist_reaches_no_subscriber() {
    let (_dir, bus) = new_bus();
    let (_sub, mut rx) = forwarder(&bus, "watcher");
    bus.store().fail_event_inserts(true).await.unwrap();
    let err = bus.publish(ev("lost.event", 1)).await.unwrap_err();
    assert!(matches!(err, BusError::Persist { .. }), "{err}");
    assert!(err.to_string().contains("no subscriber saw it"), "{err}");
    bus.store().fail_event_inserts(false).await.unwrap();
    let kept = bus.publish(ev("kept.event", 2)).await.unwrap();
    // Delivery is in commit order, so had the lost event been fanned out it
    // would arrive before this one.
    assert_eq!(recv(&mut rx).await.kind, "kept.event");
    assert!(rx.try_recv().is_err());
    assert_eq!(
        bus.store().events_since(0, 10).unwrap(),
        vec![(*kept).clone()]
    );
}

#[tokio::test]
async fn a_slow_subscriber_loses_its_oldest_events_and_it_is_logged() {
    let logs = LogBuf::global();
    let (_dir, bus) = new_bus();
    let (seen_tx, mut seen) = unbounded_channel();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let handler_gate = Arc::clone(&gate);
    let slow = bus
        .subscribe(
            "slow-one",
            |_| true,
            move |event: Arc<Event>| {
                let (seen_tx, gate) = (seen_tx.clone(), Arc::clone(&handler_gate));
                async move {
                    let _ = seen_tx.send(event.id);
                    gate.acquire().await.expect("gate open").forget();
                    Ok::<(), Infallible>(())
                }
            },
        )
        .unwrap();
    let (_fast, mut fast_rx) = forwarder(&bus, "fast-one");

    bus.publish(ev("tick", 0)).await.unwrap();
    assert_eq!(recv(&mut seen).await, 1, "the handler holds event 1");
    let extra = 5;
    let total = SUBSCRIBER_QUEUE_CAPACITY as i64 + extra + 1;
    for n in 2..=total {
        bus.publish(ev("tick", n)).await.unwrap();
    }
    // `publish` returns after fan-out, so the count is settled now.
    assert_eq!(slow.dropped(), extra as u64);
    let lines = logs.lines_with("subscriber=slow-one");
    assert!(
        lines.iter().any(
            |l| l.contains("event_bus.subscriber_queue_full") && l.contains("dropped_oldest=1")
        ),
        "{lines:?}"
    );

    gate.add_permits(total as usize);
    // The oldest queued (2..=6) were dropped; the newest survived.
    let mut got = Vec::new();
    while got.len() < SUBSCRIBER_QUEUE_CAPACITY {
        got.push(recv(&mut seen).await);
    }
    assert_eq!(got, ((2 + extra)..=total).collect::<Vec<_>>());
    // The fast subscriber was not affected.
    for id in 1..=total {
        assert_eq!(recv(&mut fast_rx).await.id, id);
    }
}

#[tokio::test]
async fn panics_and_errors_are_isolated_and_logged() {
    let logs = LogBuf::global();
    let (_dir, bus) = new_bus();
    let (tx, mut rx) = unbounded_channel();
    bus.subscribe(
        "fragile",
        |event: &Event| {
            assert_ne!(event.kind, "boom.predicate", "predicate exploded");
            true
        },
        move |event: Arc<Event>| {
            if event.kind == "boom.call" {
                panic!("handler exploded before its future");
            }
            let tx = tx.clone();
            async move {
                match event.kind.as_str() {
                    "boom.future" => panic!("handler future exploded"),
                    "fail.handler" => Err(format!("cannot handle {}", event.id)),
                    _ => {
                        let _ = tx.send(event.kind.clone());
                        Ok(())
                    }
                }
            }
        },
    )
    .unwrap();
    let (_other, mut other_rx) = forwarder(&bus, "bystander");
    for kind in [
        "boom.predicate",
        "boom.call",
        "boom.future",
        "fail.handler",
        "ok.event",
    ] {
        bus.publish(ev(kind, 0)).await.unwrap();
    }
    assert_eq!(
        recv(&mut rx).await,
        "ok.event",
        "the fragile subscriber kept running"
    );
    for id in 1..=5 {
        assert_eq!(
            recv(&mut other_rx).await.id,
            id,
            "other subscribers unaffected"
        );
    }
    bus.publish(ev("still.alive", 0)).await.unwrap();
    assert_eq!(recv(&mut rx).await, "still.alive");
    let log = logs.lines_with("subscriber=fragile").join("\n");
    for line in [
        "event_bus.predicate_raised",
        "event_bus.handler_panicked",
        "handler exploded before its future",
        "handler future exploded",
        "event_bus.handler_raised",
        "cannot handle 4",
    ] {
        assert!(log.contains(line), "missing {line} in {log}");
    }
}

/// Sends on drop: proves a handler future was cancelled.
struct DropSignal(Option<tokio::sync::oneshot::Sender<()>>);

impl Drop for DropSignal {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

#[tokio::test]
async fn shutdown_cancels_subscribers_drains_queued_publishes_and_is_idempotent() {
    let (_dir, bus) = new_bus();
    let (started_tx, mut started) = unbounded_channel();
    let (dropped_tx, dropped) = tokio::sync::oneshot::channel();
    let mut dropped_tx = Some(dropped_tx);
    bus.subscribe(
        "stuck",
        |_| true,
        move |_event| {
            let signal = DropSignal(dropped_tx.take());
            let started_tx = started_tx.clone();
            async move {
                let _signal = signal;
                let _ = started_tx.send(());
                std::future::pending::<Result<(), Infallible>>().await
            }
        },
    )
    .unwrap();
    bus.publish(ev("first", 1)).await.unwrap();
    recv(&mut started).await;
    // Queued (publish enqueues at call time) but not yet persisted.
    let queued = bus.publish(ev("queued", 2));
    let clone = bus.clone();
    tokio::time::timeout(WAIT, async {
        tokio::join!(bus.shutdown(), clone.shutdown())
    })
    .await
    .expect("shutdown finished although a handler never returns");
    tokio::time::timeout(WAIT, dropped)
        .await
        .expect("the stuck handler was cancelled")
        .unwrap();
    assert_eq!(queued.await.unwrap().id, 2, "queued publish was persisted");
    tokio::time::timeout(WAIT, bus.shutdown())
        .await
        .expect("second shutdown returns");
    assert!(matches!(
        bus.publish(ev("late", 3)).await,
        Err(BusError::Closed)
    ));
    assert!(matches!(
        bus.subscribe("late", |_| true, |_| async { Ok::<(), Infallible>(()) }),
        Err(BusError::Closed)
    ));
    assert!(matches!(bus.follow(0), Err(BusError::Closed)));
    assert_eq!(bus.store().last_event_id().unwrap(), 2);
}

#[tokio::test]
async fn concurrent_publishes_share_one_transaction() {
    let (_dir, bus) = new_bus();
    let store = Arc::clone(bus.store());
    let before = store.stats();
    // Hold the writer while 500 publishes queue up behind it.
    let release = store.pause_writer();
    let pending: Vec<_> = (0..500).map(|n| bus.publish(ev("batch.one", n))).collect();
    drop(release);
    let mut ids = Vec::new();
    for p in pending {
        ids.push(p.await.unwrap().id);
    }
    assert_eq!(
        ids,
        (1..=500).collect::<Vec<_>>(),
        "ids follow publish order"
    );
    let after = store.stats();
    // The pause's own transaction (which may have taken a few events along)
    // plus one for the rest: not one transaction per event.
    assert!(
        after.transactions - before.transactions <= 2,
        "{before:?} -> {after:?}"
    );
    assert_eq!(after.jobs - before.jobs, 501);

    // A batch is bounded: more than MAX_JOBS_PER_TRANSACTION splits.
    let n = crate::store::MAX_JOBS_PER_TRANSACTION + 10;
    let release = store.pause_writer();
    let pending: Vec<_> = (0..n)
        .map(|i| bus.publish(ev("batch.two", i as i64)))
        .collect();
    drop(release);
    for p in pending {
        p.await.unwrap();
    }
    let last = store.stats();
    assert!(
        (2..=3).contains(&(last.transactions - after.transactions)),
        "{after:?} -> {last:?}"
    );
    assert_eq!(store.last_event_id().unwrap(), 500 + n as i64);
}

async fn collect_until(rx: &mut mpsc::Receiver<Arc<Event>>, last: i64) -> Vec<i64> {
    let mut ids = Vec::new();
    while ids.last().copied().unwrap_or(i64::MIN) < last {
        let event = tokio::time::timeout(WAIT, rx.recv())
            .await
            .expect("timed out following")
            .expect("follow stream open");
        ids.push(event.id);
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_started_during_concurrent_publishing_has_no_gap_or_duplicate() {
    let (_dir, bus) = new_bus();
    for n in 0..300 {
        bus.publish(ev("before", n)).await.unwrap();
    }
    let (midway_tx, midway) = tokio::sync::oneshot::channel();
    let mut midway_tx = Some(midway_tx);
    let mut publishers = Vec::new();
    for p in 0..4 {
        let bus = bus.clone();
        let signal = if p == 0 { midway_tx.take() } else { None };
        publishers.push(tokio::spawn(async move {
            let mut signal = signal;
            for n in 0..500 {
                bus.publish(ev("during", n)).await.unwrap();
                if n == 50
                    && let Some(tx) = signal.take()
                {
                    let _ = tx.send(());
                }
            }
        }));
    }
    midway.await.unwrap();
    let mut rx = bus.follow(0).unwrap();
    for p in publishers {
        p.await.unwrap();
    }
    let last = bus.store().last_event_id().unwrap();
    assert_eq!(last, 300 + 4 * 500);
    let ids = collect_until(&mut rx, last).await;
    assert_eq!(ids, (1..=last).collect::<Vec<_>>());
    // And it keeps tailing live.
    let next = bus.publish(ev("after", 0)).await.unwrap();
    assert_eq!(collect_until(&mut rx, next.id).await, vec![next.id]);
    bus.shutdown().await;
    assert!(rx.recv().await.is_none(), "the stream ends at shutdown");
}

#[tokio::test]
async fn a_lagging_follower_reads_dropped_events_back_from_the_database() {
    let (_dir, bus) = new_bus();
    for n in 0..200 {
        bus.publish(ev("old", n)).await.unwrap();
    }
    let mut rx = bus.follow(100).unwrap();
    let live = 2 * SUBSCRIBER_QUEUE_CAPACITY as i64 + 500;
    for n in 0..live {
        bus.publish(ev("new", n)).await.unwrap();
    }
    let last = 200 + live;
    let ids = collect_until(&mut rx, last).await;
    assert_eq!(ids, (101..=last).collect::<Vec<_>>());
    let dropped: u64 = bus
        .inner
        .shared
        .queues
        .lock()
        .iter()
        .filter(|q| q.name.starts_with("npcagent.follow"))
        .map(|q| q.dropped())
        .sum();
    assert!(
        dropped > 0,
        "the live queue overflowed, so the re-read was exercised"
    );
    drop(rx);
    tokio::time::timeout(WAIT, async {
        while !bus.inner.shared.queues.lock().is_empty() {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("a dropped follower unregisters its queue");
}

#[tokio::test]
async fn secret_values_never_reach_the_database_or_subscribers() {
    const SECRET: &str = "hunter2-S3CR3T-value";
    let (dir, bus) = new_bus();
    bus.set_secrets([SECRET.to_string(), String::new()]);
    let (_sub, mut rx) = forwarder(&bus, "reader");
    let event = NewEvent::untyped(
        "component.started",
        json!({
            "env": { "TOKEN": format!("Bearer {SECRET}") },
            "list": [SECRET],
            "from_model": Text::secret(SECRET),
        }),
    )
    .for_component("mcp_server/fs");
    let published = bus.publish(event).await.unwrap();
    let delivered = recv(&mut rx).await;
    let stored = bus.store().events_since(0, 10).unwrap().remove(0);
    for seen in [&*published, &*delivered, &stored] {
        let text = serde_json::to_string(seen).unwrap();
        assert!(!text.contains(SECRET), "{text}");
        assert_eq!(seen.payload["env"]["TOKEN"], "Bearer <redacted>");
        assert_eq!(seen.payload["from_model"], "<redacted>");
        assert_eq!(seen.payload["list"][0], "<redacted>");
        assert_eq!(seen.component.as_deref(), Some("mcp_server/fs"));
    }
    bus.shutdown().await;
    let path = bus.store().path().to_path_buf();
    drop(bus);
    // Every byte on disk, database and WAL alike.
    for entry in std::fs::read_dir(path.parent().unwrap()).unwrap() {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        assert!(
            !bytes.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()),
            "secret found on disk"
        );
    }
    drop(dir);
}

#[tokio::test]
async fn predicates_select_and_bad_input_is_refused() {
    let (_dir, bus) = new_bus();
    let (tx, mut rx) = unbounded_channel();
    bus.subscribe(
        "components",
        |e: &Event| e.kind.starts_with("component."),
        move |e: Arc<Event>| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(e.id);
                Ok::<(), Infallible>(())
            }
        },
    )
    .unwrap();
    assert!(matches!(
        bus.subscribe(
            "components",
            |_| true,
            |_| async { Ok::<(), Infallible>(()) }
        ),
        Err(BusError::DuplicateSubscriber { .. })
    ));
    for kind in [
        "reconcile.planned",
        "component.started",
        "manifest.invalid",
        "component.exited",
    ] {
        bus.publish(ev(kind, 0)).await.unwrap();
    }
    assert_eq!(recv(&mut rx).await, 2);
    assert_eq!(recv(&mut rx).await, 4);

    for kind in [
        "",
        "Upper.Case",
        "has space",
        "semi;colon",
        &"k".repeat(MAX_EVENT_KIND_LEN + 1),
    ] {
        let err = bus.publish(ev(kind, 0)).await.unwrap_err();
        assert!(matches!(err, BusError::InvalidKind { .. }), "{kind}: {err}");
    }
    let long = ev("a.b", 0).for_component("c".repeat(MAX_COMPONENT_LEN + 1));
    assert!(matches!(
        bus.publish(long).await,
        Err(BusError::ComponentTooLong { .. })
    ));
    assert_eq!(
        bus.store().last_event_id().unwrap(),
        4,
        "refused events were not stored"
    );
}

#[tokio::test]
async fn an_oversize_payload_is_stored_truncated_with_a_marker_never_dropped() {
    let (_dir, bus) = new_bus();
    let (_sub, mut rx) = forwarder(&bus, "reader");
    // A `manifest.invalid` report of about 3 MB.
    let diagnostics: Vec<serde_json::Value> = (0..1000)
        .map(|i| json!({ "severity": "error", "summary": format!("problem {i}: {}", "v".repeat(3000)) }))
        .collect();
    let payload = json!({ "reason": "manifest changed", "report": { "error_count": 1000, "diagnostics": diagnostics } });
    let original = payload.to_string().len();
    assert!(original > 2 * MAX_PAYLOAD_BYTES, "{original}");
    let published = bus
        .publish(NewEvent::untyped("manifest.invalid", payload))
        .await
        .expect("an oversize event is published, not refused");
    let delivered = recv(&mut rx).await;
    let stored = bus.store().events_since(0, 10).unwrap().remove(0);
    for seen in [&*published, &*delivered, &stored] {
        assert_eq!(seen.kind, "manifest.invalid");
        assert!(seen.payload.to_string().len() <= MAX_PAYLOAD_BYTES);
        assert_eq!(seen.payload[TRUNCATED_FROM_KEY], original);
        assert_eq!(seen.payload["report"]["error_count"], 1000);
        let kept = seen.payload["report"]["diagnostics"].as_array().unwrap();
        assert!(
            kept.len() > 100,
            "the head of the list is kept: {}",
            kept.len()
        );
        assert!(
            kept[0]["summary"]
                .as_str()
                .unwrap()
                .starts_with("problem 0: ")
        );
        assert!(
            kept.last()
                .unwrap()
                .as_str()
                .unwrap()
                .starts_with(TRUNCATED)
        );
    }
}

#[tokio::test]
async fn short_secrets_keys_and_component_ids_are_never_rewritten() {
    let (_dir, bus) = new_bus();
    bus.set_secrets(["e".to_string(), "s1".to_string()]);
    let event = NewEvent::untyped(
        "component.started",
        json!({ "env": { "RT_DEBUG": Text::secret("e") }, "component": "mcp_server.s1", "message": "server started" }),
    )
    .for_component("mcp_server.s1");
    let stored = bus.publish(event).await.unwrap();
    assert_eq!(stored.component.as_deref(), Some("mcp_server.s1"));
    assert_eq!(stored.payload["env"]["RT_DEBUG"], "<redacted>");
    assert_eq!(stored.payload["component"], "mcp_server.s1");
    assert_eq!(stored.payload["message"], "server started");
}
