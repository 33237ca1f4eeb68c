//! The run queue as triggers see it: [`RunQueue::submit`] turns a
//! [`Firing`] into a committed row of the store's run queue (with a new run
//! id in `npc run`'s format), records `run.queued` or `run.skipped` under
//! the run's component, wakes the executor, and answers the firing's `ack`.
//! Submission order is commit order (the store's writer is one queue), and
//! submissions never wait for each other: concurrent webhooks share group
//! commits.

use std::future::Future;
use std::sync::Arc;

use serde_json::json;
use tokio::sync::Notify;

use super::{Accepted, Firing, Refused};
use crate::bus::EventBus;
use crate::model::Overlap;
use crate::store::queue::{Enqueued, NewRun};
use crate::store::{NewEvent, Store};

/// Runs of one trigger that may wait in the queue; a firing past it is
/// refused (a webhook answers 503) and nothing is recorded.
pub const MAX_QUEUED_PER_TRIGGER: usize = 1_000;

/// The queue side the triggers and `npc trigger fire` share.
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

    /// Record `firing` under the trigger's `overlap` policy. The write is
    /// submitted now; the returned future resolves once it committed (the
    /// ack is answered too).
    pub fn submit(
        &self,
        mut firing: Firing,
        overlap: Overlap,
    ) -> impl Future<Output = Result<Accepted, Refused>> + Send + 'static {
        let run_id = crate::runs::new_run_id();
        let pending = self.store.enqueue_run(NewRun {
            id: run_id.clone(),
            trigger: firing.trigger.clone(),
            origin: firing.origin.as_str().to_string(),
            dedupe_key: firing.dedupe_key.clone(),
            payload: firing.payload.to_string(),
            skip_if_active: overlap == Overlap::Skip,
            max_queued: MAX_QUEUED_PER_TRIGGER,
            state: firing.state.take(),
        });
        let (bus, wake) = (self.bus.clone(), self.wake.clone());
        let ack = firing.ack.take();
        async move {
            let result = match pending.await {
                Err(e) => Err(Refused::Store(e.to_string())),
                Ok(Enqueued::Full) => Err(Refused::QueueFull(firing.trigger.clone())),
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
                                "trigger": firing.trigger,
                                "origin": firing.origin,
                                "dedupe_key": firing.dedupe_key,
                            }),
                        )
                        .for_component(crate::runs::component(&run_id));
                        if let Err(e) = bus.publish_detached(event).await {
                            tracing::warn!("cannot record `{kind}`: {e}");
                        }
                    }
                    if outcome == Enqueued::Queued {
                        wake.notify_one();
                    }
                    Ok(Accepted { run_id, outcome })
                }
            };
            if let Some(ack) = ack {
                let _ = ack.send(result.clone());
            }
            result
        }
    }
}
