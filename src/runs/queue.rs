//! The run queue as those who ask for runs see it: [`RunQueue::submit`]
//! turns a [`Submission`] (a trigger's firing, a run by hand) into a
//! committed row of the store's run queue (with a new run id), records
//! `run.queued` or `run.skipped` under the run's component and wakes the
//! executor. Submission order is commit order (the store's writer is one
//! queue), and submissions never wait for each other: concurrent webhooks
//! share group commits. A fleet's run goes to the shared store instead,
//! with the code it starts from ([`RunCode`]: the repository's remote and
//! the commit its worktree's `ref` names here when it is queued).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use serde_json::json;
use tokio::sync::Notify;

use serde::Serialize;

use super::Origin;
use crate::bus::EventBus;
use crate::event::{Event, RunQueued, RunSkipped};
use crate::model::Overlap;
use crate::store::fleet::FleetQueue;
use crate::store::queue::{Enqueued, NewRun, RunCode};
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
    /// The fleet's shared store (`[store] url`) is not reachable yet.
    #[error(
        "the shared store is not reachable: {0}; the daemon keeps retrying, and `npc status` says when it is back"
    )]
    Unreachable(String),
}

/// Where the runs the fleet carries out go: nowhere but here without
/// `[store] url`; else the shared store, once this daemon joined it.
#[derive(Debug, Clone, Default)]
enum Shared {
    #[default]
    Off,
    /// Connecting (the fleet's name once known), or retrying after `error`.
    Joining {
        fleet: Option<String>,
        error: Option<String>,
    },
    Joined {
        fleet: String,
        queue: Arc<dyn FleetQueue>,
        /// The repository's remote without credentials (none without an
        /// `origin`), recorded on every run.
        remote: Option<String>,
    },
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
    /// Times a failed, timed-out or (in a fleet) lost run is tried again:
    /// its trigger's `retries`, written with the row.
    pub retries: u32,
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
            retries: 0,
        }
    }
}

/// The queue side everyone who asks for runs shares.
#[derive(Debug, Clone)]
pub struct RunQueue {
    store: Arc<Store>,
    bus: EventBus,
    wake: Arc<Notify>,
    shared: Arc<Mutex<Shared>>,
    /// What tells which commit a fleet's run starts from.
    executor: Arc<super::executor::Executor>,
}

/// A submission on its way to a store.
type Pending = Pin<Box<dyn Future<Output = Result<Accepted, Refused>> + Send + 'static>>;

impl RunQueue {
    pub fn new(
        store: Arc<Store>,
        bus: EventBus,
        wake: Arc<Notify>,
        executor: Arc<super::executor::Executor>,
    ) -> Self {
        Self {
            store,
            bus,
            wake,
            shared: Arc::default(),
            executor,
        }
    }

    /// From now on the runs of the fleet's origins
    /// ([`Origin::runs_in_fleet`]) go to a fleet's shared store; until
    /// [`joined`](Self::joined) they are refused. `false` when this queue
    /// joins a fleet already.
    pub fn join(&self) -> bool {
        let mut shared = crate::stdx::lock(&self.shared);
        if !matches!(*shared, Shared::Off) {
            return false;
        }
        *shared = Shared::Joining {
            fleet: None,
            error: None,
        };
        true
    }

    /// The shared store of `fleet` answered: submissions go to `queue`,
    /// each with the code it starts from at `remote` (the repository's
    /// `origin` without credentials).
    pub fn joined(&self, fleet: &str, queue: Arc<dyn FleetQueue>, remote: Option<String>) {
        *crate::stdx::lock(&self.shared) = Shared::Joined {
            fleet: fleet.to_string(),
            queue,
            remote,
        };
    }

    /// The last try to reach the shared store of `fleet` failed with `error`.
    pub fn not_joined(&self, fleet: &str, error: String) {
        *crate::stdx::lock(&self.shared) = Shared::Joining {
            fleet: Some(fleet.to_string()),
            error: Some(error),
        };
    }

    /// Which store takes the runs, as `npc status` shows it: `kind`
    /// (`sqlite` or `postgres`) and, for a fleet, its name, `state`
    /// (`connecting`, `unreachable`, `connected`) and the last error.
    pub fn store_status(&self) -> serde_json::Value {
        match &*crate::stdx::lock(&self.shared) {
            Shared::Off => json!({ "kind": "sqlite" }),
            Shared::Joining { fleet, error } => json!({
                "kind": "postgres",
                "fleet": fleet,
                "state": if error.is_some() { "unreachable" } else { "connecting" },
                "error": error,
            }),
            Shared::Joined { fleet, .. } => {
                json!({ "kind": "postgres", "fleet": fleet, "state": "connected" })
            }
        }
    }

    /// Take in `run`, a run another store handed over (a fleet worker's
    /// claim, checked), as a queued row of the same id, trigger, origin,
    /// payload, concurrency key and attempts (an ended row of its id, an
    /// earlier attempt this process carried, queued again: see
    /// [`Store::adopt_run`](crate::store::Store::adopt_run)), and wake the
    /// executor; resolves once committed.
    pub async fn adopt(&self, run: &super::fleet::FleetRun) -> Result<Enqueued, Refused> {
        let row = run.row();
        let outcome = self
            .store
            .adopt_run(NewRun {
                concurrency_key: row.concurrency_key.clone(),
                attempt: row.attempt,
                attempts: row.attempts,
                code: row.code.clone(),
                ..NewRun::new(&row.id, &row.trigger, run.origin(), row.payload.to_string())
            })
            .await
            .map_err(|e| Refused::Store(e.to_string()))?;
        self.wake.notify_one();
        Ok(outcome)
    }

    /// Record `run` under its queue's `overlap` policy. The write is
    /// submitted now; the returned future resolves once it committed.
    /// A run of a fleet's origin goes to the fleet's shared store instead
    /// (see [`join`](Self::join)), answered once committed there; its
    /// `run.queued` goes to the shared event log, and a worker carries it
    /// out.
    pub fn submit(&self, mut run: Submission, overlap: Overlap) -> Pending {
        let run_id = super::new_run_id();
        let new_run = NewRun {
            id: run_id.clone(),
            trigger: run.queue.clone(),
            origin: run.origin,
            dedupe_key: run.dedupe_key.clone(),
            payload: run.payload.to_string(),
            skip_if_active: overlap == Overlap::Skip,
            max_queued: MAX_QUEUED_PER_TRIGGER,
            state: run.state.take(),
            claimed_by: None,
            replay_until_ms: run.replay_until_ms,
            concurrency_key: run.concurrency_key.clone(),
            attempt: 1,
            attempts: run.retries.saturating_add(1),
            // The executor replaces here; in a fleet the shared queue does.
            replace_active: false,
            code: None,
        };
        if run.origin.runs_in_fleet() {
            match &*crate::stdx::lock(&self.shared) {
                Shared::Off => {}
                Shared::Joining { error, .. } => {
                    let why = error
                        .clone()
                        .unwrap_or_else(|| "this daemon is still connecting to it".to_string());
                    return Box::pin(std::future::ready(Err(Refused::Unreachable(why))));
                }
                Shared::Joined { queue, remote, .. } => {
                    let new_run = NewRun {
                        replace_active: overlap == Overlap::Replace,
                        ..new_run
                    };
                    let code = remote
                        .clone()
                        .map(|remote| self.code_of(&new_run, &run.payload, remote));
                    return Box::pin(submit_shared(queue.clone(), new_run, run, code));
                }
            }
        }
        let pending = self.store.enqueue_run(new_run);
        let (bus, wake) = (self.bus.clone(), self.wake.clone());
        Box::pin(async move {
            match pending.await {
                Err(e) => Err(Refused::Store(e.to_string())),
                Ok(Enqueued::Full) => Err(Refused::QueueFull(run.queue.clone())),
                Ok(outcome) => {
                    // Queued before the executor is woken, so a run's
                    // events read `run.queued`, `run.started`, … in order.
                    // The answer does not wait for this event's commit (the
                    // run row it reports is committed already): a webhook's
                    // 202 costs one write, not two.
                    if let Some(event) = queued_event(&run_id, &run, outcome)
                        && let Err(e) = bus.publish_detached(event).await
                    {
                        tracing::warn!("cannot record the run's queueing: {e}");
                    }
                    if outcome == Enqueued::Queued {
                        wake.notify_one();
                    }
                    Ok(Accepted { run_id, outcome })
                }
            }
        })
    }
}

impl RunQueue {
    /// The code `run` starts from at `remote`: the commit the ref its
    /// worktree would start from names in this checkout now (none for a
    /// run in place, or a ref that names nothing here: the worker then
    /// fails the run and says why).
    fn code_of(
        &self,
        run: &NewRun,
        payload: &serde_json::Value,
        remote: String,
    ) -> impl Future<Output = RunCode> + Send + 'static {
        let resolving = self
            .executor
            .start_ref(&run.id, &run.trigger, Some(run.origin), payload)
            .map(|base_ref| base_ref.map(|r| self.executor.resolve_start(r)));
        let id = run.id.clone();
        async move {
            let commit = match resolving {
                None => None,
                Some(resolving) => {
                    let found = match resolving {
                        Ok(resolving) => resolving.await,
                        Err(e) => Err(e),
                    };
                    found
                        .map_err(|e| tracing::warn!("run `{id}`: cannot tell its commit: {e}"))
                        .ok()
                }
            };
            RunCode { remote, commit }
        }
    }
}

/// `run.queued` or `run.skipped` of a submission the queue took, or
/// `None` for a duplicate (nothing was recorded).
fn queued_event(run_id: &str, run: &Submission, outcome: Enqueued) -> Option<NewEvent> {
    let event = match outcome {
        Enqueued::Duplicate | Enqueued::Full => return None,
        Enqueued::Skipped => Event::RunSkipped(RunSkipped {
            run_id: run_id.to_string(),
            trigger: Some(run.queue.clone()),
            origin: Some(run.origin.as_str().to_string()),
            dedupe_key: Some(run.dedupe_key.clone()),
            detail: None,
        }),
        Enqueued::Queued => Event::RunQueued(RunQueued {
            run_id: run_id.to_string(),
            trigger: run.queue.clone(),
            origin: run.origin.to_string(),
            dedupe_key: run.dedupe_key.clone(),
        }),
    };
    Some(event.for_component(super::component(run_id)))
}

/// Record `new_run` in the fleet's shared store, with the code it starts
/// from (`code`, resolved first); its `run.queued` is in the shared log
/// before the answer, so it comes before anything a worker records of the
/// run.
async fn submit_shared(
    queue: Arc<dyn FleetQueue>,
    mut new_run: NewRun,
    run: Submission,
    code: Option<impl Future<Output = RunCode>>,
) -> Result<Accepted, Refused> {
    if let Some(code) = code {
        new_run.code = Some(code.await);
    }
    let run_id = new_run.id.clone();
    match queue.enqueue(new_run).await {
        // An outage after the join reads as before it: unreachable.
        Err(e) if e.is_unreachable() => Err(Refused::Unreachable(e.to_string())),
        Err(e) => Err(Refused::Store(e.to_string())),
        Ok(Enqueued::Full) => Err(Refused::QueueFull(run.queue.clone())),
        Ok(outcome) => {
            if let Some(event) = queued_event(&run_id, &run, outcome)
                && let Err(e) = queue.append_events(vec![event]).await
            {
                tracing::warn!("cannot record the run's queueing in the shared store: {e}");
            }
            Ok(Accepted { run_id, outcome })
        }
    }
}
