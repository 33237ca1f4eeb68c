//! The run queue as those who ask for runs see it: [`RunQueue::submit`]
//! turns a [`Submission`] (a trigger's firing, a run by hand) into a
//! committed row of the store's run queue (with a new run id), records
//! `run.queued` or `run.skipped` under the run's component and wakes the
//! executor. Submission order is commit order (the store's writer is one
//! queue), and submissions never wait for each other: concurrent webhooks
//! share group commits.

use std::future::Future;
use std::sync::Arc;

use serde_json::json;
use tokio::sync::Notify;

use serde::Serialize;

use super::Origin;
use crate::bus::EventBus;
use crate::model::Overlap;
use crate::store::queue::{Enqueued, NewRun};
use crate::store::{NewEvent, Store};

/// Runs of one trigger that may wait in the queue; a firing past it is
/// refused (a webhook answers 503) and nothing is recorded.
pub const MAX_QUEUED_PER_TRIGGER: usize = 1_000;

/// What became of a submission, once the queue committed it (or refused it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Accepted {
    pub run_id: String,
    pub outcome: Enqueued,
}

/// Why the queue recorded nothing for a submission.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("trigger `{0}` has too many queued runs; try again once some have run")]
    QueueFull(String),
    #[error("the run queue cannot record the firing: {0}")]
    Store(String),
}

/// A run asked for, on its way to the queue.
#[derive(Debug, Clone, PartialEq)]
pub struct Submission {
    /// Its queue: the trigger's name, or [`super::MANUAL_QUEUE`].
    pub queue: String,
    pub origin: Origin,
    /// What the action sees (`trigger` in a prompt template,
    /// `NPC_TRIGGER_PAYLOAD` for a command), or a run's request.
    pub payload: serde_json::Value,
    /// A submission with a key is stored at most once per queue.
    pub dedupe_key: Option<String>,
    /// A trigger-state key committed with the row (cron: its next fire
    /// time), whatever the queue decides.
    pub state: Option<(String, serde_json::Value)>,
    /// Until when the dedupe key outlives the row
    /// (`store::queue::NewRun::replay_until_ms`).
    pub replay_until_ms: Option<i64>,
    /// The key the queue's overlap policy applies within (a trigger's
    /// rendered `concurrency_key`).
    pub concurrency_key: Option<String>,
}

impl Submission {
    pub fn new(queue: &str, origin: Origin, payload: serde_json::Value) -> Self {
        Self {
            queue: queue.to_string(),
            origin,
            payload,
            dedupe_key: None,
            state: None,
            replay_until_ms: None,
            concurrency_key: None,
        }
    }
}

/// The queue side everyone who asks for runs shares.
#[derive(Debug, Clone)]
pub struct RunQueue {
    store: Arc<Store>,
    bus: EventBus,
    wake: Arc<Notify>,
}

impl RunQueue {
    pub fn new(store: Arc<Store>, bus: EventBus, wake: Arc<Notify>) -> Self {
        Self { store, bus, wake }
    }

    /// Take in `row`, a run another store handed over (a fleet worker's
    /// claim), as a queued row of the same id, trigger, origin, payload and
    /// concurrency key, and wake the executor; resolves once committed.
    pub async fn adopt(&self, row: &crate::store::queue::RunRow) -> Result<Enqueued, Refused> {
        let outcome = self
            .store
            .enqueue_run(NewRun {
                id: row.id.clone(),
                trigger: row.trigger.clone(),
                origin: row.origin.clone(),
                dedupe_key: None,
                payload: row.payload.to_string(),
                skip_if_active: false,
                max_queued: usize::MAX,
                state: None,
                claimed_by: None,
                replay_until_ms: None,
                concurrency_key: row.concurrency_key.clone(),
            })
            .await
            .map_err(|e| Refused::Store(e.to_string()))?;
        self.wake.notify_one();
        Ok(outcome)
    }

    /// Record `run` under its queue's `overlap` policy. The write is
    /// submitted now; the returned future resolves once it committed.
    pub fn submit(
        &self,
        run: Submission,
        overlap: Overlap,
    ) -> impl Future<Output = Result<Accepted, Refused>> + Send + 'static {
        let run_id = super::new_run_id();
        let pending = self.store.enqueue_run(NewRun {
            id: run_id.clone(),
            trigger: run.queue.clone(),
            origin: run.origin.as_str().to_string(),
            dedupe_key: run.dedupe_key.clone(),
            payload: run.payload.to_string(),
            skip_if_active: overlap == Overlap::Skip,
            max_queued: MAX_QUEUED_PER_TRIGGER,
            state: run.state,
            claimed_by: None,
            replay_until_ms: run.replay_until_ms,
            concurrency_key: run.concurrency_key.clone(),
        });
        let (bus, wake) = (self.bus.clone(), self.wake.clone());
        async move {
            match pending.await {
                Err(e) => Err(Refused::Store(e.to_string())),
                Ok(Enqueued::Full) => Err(Refused::QueueFull(run.queue.clone())),
                Ok(outcome) => {
                    // Queued before the executor is woken, so a run's
                    // events read `run.queued`, `run.started`, … in order.
                    // The answer does not wait for this event's commit (the
                    // run row it reports is committed already): a webhook's
                    // 202 costs one write, not two.
                    if outcome != Enqueued::Duplicate {
                        let kind = match outcome {
                            Enqueued::Skipped => "run.skipped",
                            _ => "run.queued",
                        };
                        let event = NewEvent::new(
                            kind,
                            json!({
                                "run_id": run_id,
                                "trigger": run.queue,
                                "origin": run.origin,
                                "dedupe_key": run.dedupe_key,
                            }),
                        )
                        .for_component(super::component(&run_id));
                        if let Err(e) = bus.publish_detached(event).await {
                            tracing::warn!("cannot record `{kind}`: {e}");
                        }
                    }
                    if outcome == Enqueued::Queued {
                        wake.notify_one();
                    }
                    Ok(Accepted { run_id, outcome })
                }
            }
        }
    }
}
