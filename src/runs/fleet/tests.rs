//! Unit tests of the fleet worker's slot loop, on the embedded SQLite
//! queue: what a worker does with a run a claim brought while it was told
//! to stop.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{Worker, WorkerSettings};
use crate::store::fleet::{Claimed, FleetQueue, Lease, Rescued, SqliteQueue, StoreFuture};
use crate::store::queue::{Enqueued, MANUAL_QUEUE, NewRun, RunRow, state};
use crate::store::{Event, NewEvent, Store};

/// How long the worker may take to stop.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);
/// The lease the worker takes (never runs out during the test).
const LEASE: Duration = Duration::from_secs(600);

/// A queue whose claims come back after `stop` was cancelled: the stop
/// arrives while the claim is in flight.
#[derive(Debug)]
struct StopDuringClaim {
    inner: SqliteQueue,
    stop: CancellationToken,
}

impl FleetQueue for StopDuringClaim {
    fn enqueue(&self, run: NewRun) -> StoreFuture<'_, Enqueued> {
        self.inner.enqueue(run)
    }
    fn claim<'a>(&'a self, worker: &'a str, lease: Duration) -> StoreFuture<'a, Option<Claimed>> {
        Box::pin(async move {
            let claimed = self.inner.claim(worker, lease).await;
            self.stop.cancel();
            claimed
        })
    }
    fn heartbeat<'a>(&'a self, lease: &'a Lease, lease_for: Duration) -> StoreFuture<'a, Lease> {
        self.inner.heartbeat(lease, lease_for)
    }
    fn finish<'a>(
        &'a self,
        lease: &'a Lease,
        end: &'static str,
        detail: Option<String>,
        result: Option<serde_json::Value>,
    ) -> StoreFuture<'a, ()> {
        self.inner.finish(lease, end, detail, result)
    }
    fn release<'a>(&'a self, lease: &'a Lease) -> StoreFuture<'a, ()> {
        self.inner.release(lease)
    }
    fn append_fenced<'a>(
        &'a self,
        lease: &'a Lease,
        events: Vec<NewEvent>,
    ) -> StoreFuture<'a, Vec<Event>> {
        self.inner.append_fenced(lease, events)
    }
    fn set_attempt<'a>(&'a self, lease: &'a Lease, attempt: u32) -> StoreFuture<'a, ()> {
        self.inner.set_attempt(lease, attempt)
    }
    fn append_events(&self, events: Vec<NewEvent>) -> StoreFuture<'_, Vec<Event>> {
        self.inner.append_events(events)
    }
    fn rescue_expired(&self) -> StoreFuture<'_, Vec<Rescued>> {
        self.inner.rescue_expired()
    }
    fn stop_requests(&self) -> tokio::sync::broadcast::Receiver<String> {
        self.inner.stop_requests()
    }
    fn run<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<RunRow>> {
        self.inner.run(id)
    }
    fn events_after(&self, after: i64, limit: usize) -> StoreFuture<'_, Vec<Event>> {
        self.inner.events_after(after, limit)
    }
    fn wait_for_work(&self, at_most: Duration) -> StoreFuture<'_, ()> {
        self.inner.wait_for_work(at_most)
    }
    fn answers(&self) -> StoreFuture<'_, ()> {
        self.inner.answers()
    }
}

/// A worker told to stop while its claim was in flight hands the run the
/// claim brought back to the queue, as it was, and never starts it.
#[tokio::test]
async fn a_run_claimed_while_the_worker_stops_is_handed_back_not_started() {
    let dir = tempfile::tempdir().unwrap();
    let stop = CancellationToken::new();
    let fleet = Arc::new(StopDuringClaim {
        inner: SqliteQueue::new(Arc::new(Store::open(dir.path().join("fleet.db")).unwrap())),
        stop: stop.clone(),
    });
    fleet
        .enqueue(NewRun::new(
            "r1",
            MANUAL_QUEUE,
            crate::model::RunOrigin::Api,
            "{}",
        ))
        .await
        .unwrap();
    let local = Arc::new(Store::open(dir.path().join("local.db")).unwrap());
    let (events, _rx) = tokio::sync::mpsc::unbounded_channel();
    let supervisor = crate::supervisor::Supervisor::new(events, Default::default());
    let cx = crate::driver::DriverContext {
        repo: dir.path().to_path_buf(),
        state_dir: dir.path().join(".npc"),
        supervisor: supervisor.clone(),
    };
    let runs = crate::runs::Runs::new(cx, local.clone(), crate::bus::EventBus::new(local.clone()));
    let worker = Worker::new(
        fleet.clone(),
        None,
        local.clone(),
        runs,
        WorkerSettings {
            id: "w1".to_string(),
            host: "test".to_string(),
            lease: LEASE,
            max_concurrent: 1,
            remote: None,
        },
    );
    tokio::time::timeout(STOP_TIMEOUT, worker.serve(stop))
        .await
        .expect("the worker stops");
    let row = fleet.run("r1").await.unwrap().unwrap();
    assert_eq!(
        (row.state.as_str(), row.attempt, row.owner.as_deref()),
        (state::QUEUED, 1, None),
        "the run is queued again, as it was"
    );
    assert!(
        local.run_row("r1").unwrap().is_none(),
        "the worker never took the run in"
    );
    supervisor.shutdown().await;
}
