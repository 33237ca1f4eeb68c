//! The executor: the daemon's one executor, which takes runs from the
//! durable queue and carries out their action, at most
//! [`MAX_CONCURRENT_RUNS`] at once.
//!
//! Each pass looks at the oldest queued run of every queue. A trigger
//! whose run is still going applies its overlap policy: `queue` waits,
//! `skip` records the new run as skipped, `replace` cancels the running one
//! and starts the new one; runs started by hand (`@manual`) never wait
//! behind each other. A run is claimed (`running`, owned by this process,
//! committed) before its process starts, and a running row whose owner is
//! gone when a daemon starts was cut off by a crash: it becomes
//! `interrupted` and never runs again (at most once). A profile action runs
//! through [`super::agent`] ([`super::prepare_blocking`],
//! [`super::execute`]); a command runs through the supervisor with the run
//! id, trigger and payload in its environment ([`command`]). Every event
//! carries the run id, under component `run.<id>`.

mod command;
pub use command::NO_CHANGES;
mod worktree;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{
    Ending, MANUAL_QUEUE, Origin, PromptChoice, RunRequest, TriggeredBy, ending_of,
    interrupt_orphans, this_process,
};
use crate::bus::EventBus;
use crate::driver::DriverContext;
use crate::event::{Event, PreviousAttempt, RunCancelled, RunRetry, RunSkipped};
use crate::model::workflow::{StepRunPayload, parse_step_queue};
use crate::model::{Action, Manifest, Overlap, Trigger, WorkspaceMode};
use crate::store::Store;
use crate::store::queue::{RUN_HISTORY_LIMIT, RunRow, state};
use crate::surfaces::runs::{LocalRun, ManualRun};

/// Runs carried out at once, over all queues, unless `[runs]
/// max_concurrent` says otherwise.
pub const MAX_CONCURRENT_RUNS: usize = crate::model::DEFAULT_MAX_CONCURRENT_RUNS;
/// How often the executor looks at the queue without being woken (a safety
/// net; every enqueue wakes it).
pub const RESCAN_EVERY: Duration = Duration::from_secs(5);
/// How long a shutdown waits for cancelled runs to record their end.
pub const STOP_WAIT: Duration = Duration::from_secs(10);
/// How often finished runs beyond `store::queue::RUN_HISTORY_LIMIT` are pruned.
pub const PRUNE_EVERY: Duration = Duration::from_secs(60);
/// How long [`Executor::cancel`] waits for a cancelled run to record its
/// end (the process group is killed at once; its output then drains).
pub const CANCEL_WAIT: Duration = Duration::from_secs(10);
/// The pause before a failed run's first retry; it doubles per retry.
pub const RETRY_BACKOFF_INITIAL: Duration = Duration::from_secs(1);
/// The longest pause before a retry.
pub const RETRY_BACKOFF_MAX: Duration = Duration::from_secs(60);
/// Why a run cancelled by hand ended.
pub const CANCELLED_BY_HAND: &str = "cancelled by hand";
/// What `run.interrupted` says of a run whose process went away.
pub const INTERRUPTED_DETAIL: &str = "the daemon stopped while it ran; not run again";

/// A run being carried out.
#[derive(Debug)]
struct Running {
    trigger: String,
    /// The key its trigger's overlap policy applies within.
    key: Option<String>,
    /// Its `NPC_PORT`, from `[runs] ports`.
    port: Option<u16>,
    cancel: CancellationToken,
    /// Why it was cancelled (`replaced`, the daemon stopped).
    reason: Arc<Mutex<Option<String>>>,
}

#[derive(Debug, Default)]
struct Inner {
    triggers: HashMap<String, Trigger>,
    running: HashMap<String, Running>,
    manifest: Option<Arc<Manifest>>,
}

/// The daemon's executor (one per runtime).
#[derive(Debug)]
pub struct Executor {
    store: Arc<Store>,
    bus: EventBus,
    cx: DriverContext,
    wake: Arc<Notify>,
    /// Signalled whenever a run ends.
    ended: Notify,
    /// Counts the runs that ended and the answers given: what those who
    /// follow runs (the `workflows` engine) wait on.
    changes: tokio::sync::watch::Sender<u64>,
    inner: Mutex<Inner>,
    stop: CancellationToken,
    /// A fleet worker's mirror, which the worktrees of its fleet's runs
    /// come from (`runs::mirror`).
    mirror: std::sync::OnceLock<Arc<super::mirror::Mirror>>,
    /// Who starts a workflow a trigger's action names (the daemon's
    /// workflow engine, above this room).
    starter: std::sync::OnceLock<Arc<dyn WorkflowStarter>>,
}

/// The seam through which a trigger's action starts a workflow: the
/// workflow engine (`workflows`, above `runs`) implements it.
pub trait WorkflowStarter: Send + Sync + std::fmt::Debug {
    /// Start workflow `name` with `inputs`, its steps reading `payload`;
    /// the workflow run's id, or why it did not start.
    fn start_workflow<'a>(
        &'a self,
        name: &'a str,
        inputs: std::collections::BTreeMap<String, String>,
        payload: Value,
        origin: Origin,
    ) -> futures_util::future::BoxFuture<'a, Result<String, String>>;
}

impl Executor {
    pub fn new(
        store: Arc<Store>,
        bus: EventBus,
        cx: DriverContext,
        wake: Arc<Notify>,
    ) -> Arc<Self> {
        Arc::new(Self {
            store,
            bus,
            cx,
            wake,
            ended: Notify::new(),
            changes: tokio::sync::watch::Sender::new(0),
            inner: Mutex::new(Inner::default()),
            stop: CancellationToken::new(),
            mirror: std::sync::OnceLock::new(),
            starter: std::sync::OnceLock::new(),
        })
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        crate::stdx::lock(&self.inner)
    }

    /// A receiver that sees a change whenever a run ended (its row records
    /// the end by then) or an approval was answered.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Tell [`Executor::changes`]'s receivers that something they follow
    /// moved.
    pub fn changed(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Start the loop: first mark runs a crashed daemon left `running` as
    /// interrupted, then dispatch whenever woken (once a manifest is set).
    pub fn spawn(self: &Arc<Self>) {
        let this = self.clone();
        tokio::spawn(async move {
            match interrupt_orphans(&this.store).await {
                Ok(ids) => {
                    for id in ids {
                        this.record(&id, Event::run_interrupted(&id, INTERRUPTED_DETAIL))
                            .await;
                    }
                }
                Err(e) => tracing::error!("cannot mark interrupted runs: {e}"),
            }
            let mut pruned = Instant::now();
            // Worktrees a crash left are kept or removed per the policy,
            // once the first manifest says what it is.
            let mut cleaned = false;
            loop {
                if let Some(manifest) = this.manifest() {
                    if !cleaned {
                        cleaned = true;
                        this.clean_worktrees(&manifest).await;
                    }
                    this.dispatch().await;
                }
                if pruned.elapsed() >= PRUNE_EVERY {
                    pruned = Instant::now();
                    if let Some(manifest) = this.manifest() {
                        this.clean_worktrees(&manifest).await;
                    }
                    if let Err(e) = this.store.prune_runs(RUN_HISTORY_LIMIT).await {
                        tracing::warn!("cannot prune old runs: {e}");
                    }
                    if let Err(e) = this.store.prune_replays().await {
                        tracing::warn!("cannot prune webhook replay keys: {e}");
                    }
                }
                tokio::select! {
                    () = this.wake.notified() => {}
                    () = tokio::time::sleep(RESCAN_EVERY) => {}
                    () = this.stop.cancelled() => return,
                }
            }
        });
    }

    /// The worktrees of runs that name their code (a fleet's runs) come
    /// from `mirror` from now on (once; a later mirror is ignored).
    pub fn set_mirror(&self, mirror: Arc<super::mirror::Mirror>) {
        let _ = self.mirror.set(mirror);
    }

    /// The applied manifest (profile actions render from it); the first
    /// call lets runs start.
    pub fn set_manifest(&self, manifest: &Manifest) {
        self.inner().manifest = Some(Arc::new(manifest.clone()));
        self.wake.notify_one();
    }

    pub fn set_trigger(&self, name: &str, trigger: &Trigger) {
        self.inner()
            .triggers
            .insert(name.to_string(), trigger.clone());
        self.wake.notify_one();
    }

    /// The trigger was removed: its queued runs are cancelled at the next
    /// pass; a running one goes on to its end.
    pub fn remove_trigger(&self, name: &str) {
        self.inner().triggers.remove(name);
        self.wake.notify_one();
    }

    /// Whether trigger `name` is applied, and its overlap policy.
    pub fn overlap_of(&self, name: &str) -> Option<Overlap> {
        self.inner().triggers.get(name).map(|t| t.overlap)
    }

    /// The concurrency key of a firing of trigger `name` with `payload`:
    /// its `concurrency_key` rendered (`None` without one, or when it
    /// renders empty or fails, which is logged: the policy then spans the
    /// trigger).
    pub fn concurrency_key_of(&self, name: &str, payload: &Value) -> Option<String> {
        let template = self.inner().triggers.get(name)?.concurrency_key.clone()?;
        let ctx = crate::runs::workspace::line_context(payload, None);
        match crate::model::template::render_line(&template, ctx) {
            Ok(key) if !key.is_empty() => Some(key),
            Ok(_) => None,
            Err(e) => {
                tracing::warn!("trigger `{name}`: cannot render `concurrency_key`: {e}");
                None
            }
        }
    }

    /// The `retries` of trigger `name` (0 for a run by hand or an unknown
    /// trigger).
    pub fn retries_of(&self, name: &str) -> u32 {
        let inner = self.inner();
        match inner.triggers.get(name) {
            Some(t) => t.retries,
            None => inner
                .manifest
                .as_ref()
                .and_then(|m| m.workflow_step(name))
                .map_or(0, |(_, step)| step.retries),
        }
    }

    /// Names of the applied triggers.
    pub fn trigger_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.inner().triggers.keys().cloned().collect();
        names.sort();
        names
    }

    /// Ids of the runs going on now.
    pub fn running(&self) -> Vec<String> {
        self.inner().running.keys().cloned().collect()
    }

    /// Stop: no new runs; cancel the running ones and wait (at most
    /// [`STOP_WAIT`]) until they recorded their end.
    pub async fn shutdown(&self) {
        self.stop.cancel();
        for r in self.inner().running.values() {
            *crate::stdx::lock(&r.reason) = Some("the daemon stopped".to_string());
            r.cancel.cancel();
        }
        let _ = tokio::time::timeout(STOP_WAIT, async {
            loop {
                let ended = self.ended.notified();
                if self.inner().running.is_empty() {
                    return;
                }
                ended.await;
            }
        })
        .await;
    }

    /// Start what can start, until nothing changes.
    async fn dispatch(self: &Arc<Self>) {
        loop {
            if self.stop.is_cancelled() {
                return;
            }
            let store = self.store.clone();
            let heads =
                match tokio::task::spawn_blocking(move || store.queued_runs(usize::MAX)).await {
                    Ok(Ok(heads)) => heads,
                    Ok(Err(e)) => {
                        tracing::error!("cannot read the run queue: {e}");
                        return;
                    }
                    Err(_) => return,
                };
            let mut progress = false;
            for row in heads {
                let decision = {
                    let inner = self.inner();
                    let limit = inner
                        .manifest
                        .as_ref()
                        .map_or(MAX_CONCURRENT_RUNS, |m| m.runs.max_concurrent);
                    if inner.running.len() >= limit {
                        break;
                    }
                    if row.trigger == MANUAL_QUEUE {
                        // A run started by hand: its own action, no overlap
                        // (each is its queue's head once the one before
                        // started, so they never wait behind each other).
                        match manual_request(&row) {
                            Some((request, _)) => Decision::Start(manual_action(request)),
                            None => Decision::Unreadable,
                        }
                    } else if parse_step_queue(&row.trigger).is_some() {
                        // A workflow step's run: the applied manifest's
                        // action for the step, never the row's; each
                        // instance is a run of its own (no overlap).
                        let action = inner
                            .manifest
                            .as_ref()
                            .and_then(|m| m.workflow_step(&row.trigger))
                            .and_then(|(_, step)| step.action.clone());
                        match action {
                            Some(action) => Decision::Start(action),
                            None => Decision::Cancel,
                        }
                    } else {
                        match inner.triggers.get(&row.trigger) {
                            None => Decision::Cancel,
                            Some(t) => {
                                let active: Vec<&Running> = inner
                                    .running
                                    .values()
                                    .filter(|r| {
                                        r.trigger == row.trigger && r.key == row.concurrency_key
                                    })
                                    .collect();
                                match (active.is_empty(), t.overlap) {
                                    (true, _) => Decision::Start(t.action.clone()),
                                    (false, Overlap::Queue) => Decision::Wait,
                                    (false, Overlap::Skip) => Decision::Skip,
                                    (false, Overlap::Replace) => {
                                        for r in active {
                                            *crate::stdx::lock(&r.reason) =
                                                Some(crate::store::queue::replaced_detail(&row.id));
                                            r.cancel.cancel();
                                        }
                                        Decision::Start(t.action.clone())
                                    }
                                }
                            }
                        }
                    }
                };
                if let Decision::Start(_) = &decision {
                    // Running from the decision on (under the same lock), so
                    // a cancel finds it; `start` commits it or lets it go.
                    let mut inner = self.inner();
                    let port = free_port(&inner);
                    inner.running.insert(
                        row.id.clone(),
                        Running {
                            trigger: row.trigger.clone(),
                            key: row.concurrency_key.clone(),
                            port,
                            cancel: CancellationToken::new(),
                            reason: Arc::new(Mutex::new(None)),
                        },
                    );
                }
                match decision {
                    Decision::Wait => {}
                    Decision::Unreadable => {
                        let detail = "the run's request is unreadable".to_string();
                        self.finish(&row.id, (state::FAILED, Some(detail))).await;
                        progress = true;
                    }
                    Decision::Cancel => {
                        let detail = match parse_step_queue(&row.trigger) {
                            Some((workflow, step)) => format!(
                                "step `{step}` of workflow `{workflow}` is no longer declared"
                            ),
                            None => format!("trigger `{}` is no longer applied", row.trigger),
                        };
                        self.finish(&row.id, (state::CANCELLED, Some(detail))).await;
                        progress = true;
                    }
                    Decision::Skip => {
                        let detail = "a run of the trigger was still going (overlap `skip`)";
                        self.finish(&row.id, (state::SKIPPED, Some(detail.to_string())))
                            .await;
                        progress = true;
                    }
                    Decision::Start(action) => {
                        self.start(row, action).await;
                        progress = true;
                    }
                }
            }
            if !progress {
                return;
            }
        }
    }

    /// Record the end of run `id` (never started, or done).
    async fn finish(&self, id: &str, (end, detail): Ending) {
        if let Err(e) = self.store.mark_run(id, end, detail.clone()).await {
            tracing::error!("cannot record the end of run `{id}`: {e}");
        }
        self.changed();
        if end == state::SKIPPED || end == state::CANCELLED {
            let event = if end == state::SKIPPED {
                Event::RunSkipped(RunSkipped {
                    run_id: id.to_string(),
                    detail: Some(detail),
                    ..RunSkipped::default()
                })
            } else {
                Event::RunCancelled(RunCancelled {
                    run_id: id.to_string(),
                    detail,
                })
            };
            self.record(id, event).await;
        }
    }

    async fn record(&self, id: &str, event: Event) {
        let kind = event.kind();
        let event = event.for_component(super::component(id));
        if let Err(e) = self.bus.publish(event).await {
            tracing::warn!("cannot record `{kind}`: {e}");
        }
    }

    /// Claim the run (committed first, and only if it is still queued: a
    /// cancel may have taken it), then carry it out in its own task.
    async fn start(self: &Arc<Self>, row: RunRow, action: Action) {
        let committed = self.store.claim_run(&row.id, this_process()).await;
        let (cancel, reason, manifest, port) = {
            let mut inner = self.inner();
            let Some(running) = inner.running.get(&row.id) else {
                return;
            };
            let handles = (running.cancel.clone(), running.reason.clone(), running.port);
            if !matches!(committed, Ok(true)) {
                if let Err(e) = &committed {
                    tracing::error!("cannot start run `{}`: {e}", row.id);
                }
                inner.running.remove(&row.id);
                drop(inner);
                self.ended.notify_waiters();
                return;
            }
            (handles.0, handles.1, inner.manifest.clone(), handles.2)
        };
        let this = self.clone();
        tokio::spawn(async move {
            let timeout = {
                let inner = this.inner();
                let of_step = || {
                    inner
                        .manifest
                        .as_ref()
                        .and_then(|m| m.workflow_step(&row.trigger))
                        .and_then(|(_, step)| step.timeout_secs)
                };
                inner
                    .triggers
                    .get(&row.trigger)
                    .and_then(|t| t.timeout_secs)
                    .or_else(of_step)
                    .map_or(super::DEFAULT_RUN_TIMEOUT, Duration::from_secs)
            };
            let started = tokio::time::Instant::now();
            // The run's workspace first: a worktree (with its setup) or
            // the checkout itself.
            let opened = match &manifest {
                Some(m) => {
                    match this.workspace_of(
                        &row.trigger,
                        row.origin.known(),
                        &row.payload,
                        &action,
                        m,
                    ) {
                        (WorkspaceMode::Worktree, spec) => {
                            let profile = match &action {
                                Action::RunProfile { profile, .. } => Some(profile.as_str()),
                                Action::RunCommand(_) | Action::StartWorkflow { .. } => None,
                            };
                            match this
                                .open_worktree(&row, spec, m, port, timeout, profile)
                                .await
                            {
                                Ok(opened) => Some(opened),
                                Err(error) => {
                                    this.record(
                                        &row.id,
                                        Event::run_failed(
                                            &row.id,
                                            Some(&row.trigger),
                                            error.clone(),
                                        ),
                                    )
                                    .await;
                                    this.end(&row, (state::FAILED, Some(error))).await;
                                    return;
                                }
                            }
                        }
                        (WorkspaceMode::InPlace, _) => None,
                    }
                }
                None => None,
            };
            let conclusion = match (&opened, &manifest) {
                (Some(o), Some(m)) => Some(this.conclusion(&row, o, m)),
                _ => None,
            };
            // The attempts the row allows (its trigger's `retries` + 1 at
            // enqueue), from the one it is at: a fleet may have queued it
            // again after a lost attempt. `attempt` counts from 0.
            let retries = row.attempts.max(1) - 1;
            let first = row.attempt.max(1) - 1;
            let mut attempt = first;
            let ending = loop {
                // The first attempt's time includes the setup; a retry gets all of it.
                let left = if attempt == first {
                    timeout.saturating_sub(started.elapsed())
                } else {
                    timeout
                };
                let ending = this
                    .attempt(
                        &row,
                        &action,
                        &cancel,
                        left,
                        opened.as_ref(),
                        conclusion.as_ref(),
                        manifest.clone(),
                    )
                    .await;
                let again = attempt < retries
                    && matches!(ending.0, state::FAILED | state::TIMED_OUT)
                    && !cancel.is_cancelled();
                if !again {
                    break ending;
                }
                attempt += 1;
                if let Err(e) = this.store.set_run_attempt(&row.id, attempt + 1).await {
                    tracing::warn!("cannot record the attempt of run `{}`: {e}", row.id);
                }
                let delay = RETRY_BACKOFF_INITIAL
                    .saturating_mul(1 << (attempt - 1).min(16))
                    .min(RETRY_BACKOFF_MAX);
                this.record(
                    &row.id,
                    Event::RunRetry(RunRetry {
                        run_id: row.id.clone(),
                        attempt: attempt + 1,
                        of: retries + 1,
                        delay_ms: u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                        previous: PreviousAttempt {
                            state: ending.0.to_string(),
                            detail: ending.1.clone(),
                        },
                    }),
                )
                .await;
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = cancel.cancelled() => break (state::CANCELLED, None),
                }
            };
            let ending = match (ending, crate::stdx::lock(&reason).clone()) {
                ((state::CANCELLED, _), Some(why)) => (state::CANCELLED, Some(why)),
                (ending, _) => ending,
            };
            if let Some(opened) = &opened {
                this.close_worktree(&row, opened, conclusion.as_ref(), ending.0)
                    .await;
            }
            this.end(&row, ending).await;
        });
    }

    /// One attempt at run `row`'s action, in its place.
    #[allow(clippy::too_many_arguments)]
    async fn attempt(
        &self,
        row: &RunRow,
        action: &Action,
        cancel: &CancellationToken,
        left: Duration,
        opened: Option<&worktree::Opened>,
        conclusion: Option<&crate::runs::workspace::Conclusion>,
        manifest: Option<Arc<Manifest>>,
    ) -> Ending {
        match action {
            Action::RunCommand(command) => {
                self.run_command(row, command, cancel, left, opened, conclusion)
                    .await
            }
            Action::StartWorkflow { workflow, inputs } => {
                self.start_workflow(row, workflow, inputs).await
            }
            Action::RunProfile {
                profile,
                prompt,
                vars,
            } => {
                let vars = vars
                    .iter()
                    .map(|(k, v)| (k.clone(), v.expose().to_string()))
                    .collect();
                let (prompt, starter) = if row.trigger == MANUAL_QUEUE {
                    let starter = match manual_request(row) {
                        Some((_, Some(local))) => Starter::Local(local),
                        _ => Starter::Hand,
                    };
                    (manual_prompt(row), starter)
                } else if parse_step_queue(&row.trigger).is_some() {
                    // A workflow step: the prompt npc rendered for it (the
                    // step's values reach the profile's own prompt as the
                    // trigger's payload).
                    let rendered = serde_json::from_value::<StepRunPayload>(row.payload.clone())
                        .ok()
                        .and_then(|p| p.prompt);
                    let prompt = match rendered {
                        Some(text) => PromptChoice::Literal { text },
                        None => PromptChoice::Profile,
                    };
                    let triggered = TriggeredBy {
                        name: row.trigger.clone(),
                        payload: row.payload.clone(),
                    };
                    (prompt, Starter::Trigger(triggered))
                } else {
                    let prompt = match prompt {
                        Some(name) => PromptChoice::Template {
                            name: name.clone(),
                            vars,
                        },
                        None => PromptChoice::Profile,
                    };
                    let triggered = TriggeredBy {
                        name: row.trigger.clone(),
                        payload: row.payload.clone(),
                    };
                    (prompt, Starter::Trigger(triggered))
                };
                let place = Place {
                    timeout: left,
                    opened,
                    conclusion: conclusion.cloned(),
                };
                self.run_profile(row, profile, prompt, starter, manifest, cancel, place)
                    .await
            }
        }
    }

    /// A trigger's run whose action starts workflow `workflow`: the
    /// workflow run starts (its steps are runs of their own) and this run
    /// ends `succeeded` naming it, or `failed` saying why it did not.
    async fn start_workflow(
        &self,
        row: &RunRow,
        workflow: &str,
        inputs: &std::collections::BTreeMap<String, crate::model::Text>,
    ) -> Ending {
        let Some(starter) = self.starter.get() else {
            let why = "this process carries out no workflows (they run on the daemon)";
            return (state::FAILED, Some(why.to_string()));
        };
        let inputs = inputs
            .iter()
            .map(|(k, v)| (k.clone(), v.expose().to_string()))
            .collect();
        let payload = crate::model::template::request_payload(&row.payload);
        let origin = row.origin.known().unwrap_or(Origin::Manual);
        match starter
            .start_workflow(workflow, inputs, payload, origin)
            .await
        {
            Ok(id) => (
                state::SUCCEEDED,
                Some(format!("started workflow run `{id}`")),
            ),
            Err(why) => (
                state::FAILED,
                Some(format!("workflow `{workflow}` did not start: {why}")),
            ),
        }
    }

    /// Who starts the workflows of triggers' actions (set once, by the
    /// daemon's composition).
    pub fn set_workflow_starter(&self, starter: Arc<dyn WorkflowStarter>) {
        let _ = self.starter.set(starter);
    }

    /// Record the end of a run that was running here, and let the next start.
    async fn end(&self, row: &RunRow, ending: Ending) {
        if let Err(e) = self.store.mark_run(&row.id, ending.0, ending.1).await {
            tracing::error!("cannot record the end of run `{}`: {e}", row.id);
        }
        self.inner().running.remove(&row.id);
        self.ended.notify_waiters();
        self.changed();
        self.wake.notify_one();
    }

    /// The applied manifest, once one is.
    pub fn manifest(&self) -> Option<Arc<Manifest>> {
        self.inner().manifest.clone()
    }

    /// Cancel run `id`: a queued run never starts; a running one has its
    /// process group killed, and the answer waits (at most [`CANCEL_WAIT`])
    /// until it recorded its end. Returns the run's state after that.
    pub async fn cancel(&self, id: &str) -> Result<String, CancelError> {
        self.cancel_because(id, CANCELLED_BY_HAND.to_string()).await
    }

    /// [`Executor::cancel`], the run's detail saying `why`.
    pub async fn cancel_because(&self, id: &str, why: String) -> Result<String, CancelError> {
        let signal = |inner: &Inner| {
            inner.running.get(id).map(|r| {
                *crate::stdx::lock(&r.reason) = Some(why.clone());
                r.cancel.cancel();
            })
        };
        let mut signalled = signal(&self.inner()).is_some();
        if !signalled {
            let taken = self
                .store
                .mark_run_if(id, state::QUEUED, state::CANCELLED, Some(why.clone()))
                .await
                .map_err(|e| CancelError::Store(e.to_string()))?;
            if taken {
                self.record(
                    id,
                    Event::RunCancelled(RunCancelled {
                        run_id: id.to_string(),
                        detail: Some(why),
                    }),
                )
                .await;
                return Ok(state::CANCELLED.to_string());
            }
            // It may have started in between.
            signalled = signal(&self.inner()).is_some();
        }
        if signalled {
            let _ = tokio::time::timeout(CANCEL_WAIT, async {
                loop {
                    let ended = self.ended.notified();
                    if !self.inner().running.contains_key(id) {
                        return;
                    }
                    ended.await;
                }
            })
            .await;
        }
        let store = self.store.clone();
        let key = id.to_string();
        let row = tokio::task::spawn_blocking(move || store.run_row(&key))
            .await
            .map_err(|e| CancelError::Store(e.to_string()))?
            .map_err(|e| CancelError::Store(e.to_string()))?;
        match row {
            None => Err(CancelError::NotFound(id.to_string())),
            Some(row) if signalled => Ok(row.state),
            Some(row) if row.state == state::RUNNING || row.state == state::WAITING => {
                Err(CancelError::Elsewhere { id: id.to_string() })
            }
            Some(row) => Err(CancelError::Finished {
                id: id.to_string(),
                state: row.state,
            }),
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn run_profile(
        &self,
        row: &RunRow,
        profile: &str,
        prompt: PromptChoice,
        starter: Starter,
        manifest: Option<Arc<Manifest>>,
        cancel: &CancellationToken,
        place: Place<'_>,
    ) -> Ending {
        let Some(manifest) = manifest else {
            return (state::FAILED, Some("no manifest is applied".to_string()));
        };
        let (triggered, local) = match starter {
            Starter::Trigger(t) => (Some(t), None),
            Starter::Hand => (None, None),
            Starter::Local(a) => (None, Some(a)),
        };
        let trigger_name = triggered.as_ref().map(|t| t.name.clone());
        let request = RunRequest {
            profile: profile.to_string(),
            prompt,
            timeout: local
                .as_ref()
                .map_or(place.timeout, |a| a.timeout(super::DEFAULT_RUN_TIMEOUT)),
            cwd: match place.opened {
                Some(opened) => Some(opened.worktree.dir.clone()),
                None => local.as_ref().and_then(|a| a.cwd.clone()),
            },
            probe_after: local.as_ref().map_or(crate::providers::STALE_AFTER, |a| {
                a.probe_after(crate::providers::STALE_AFTER)
            }),
            trigger: triggered,
            provider: local.as_ref().and_then(|a| a.run.provider.clone()),
        };
        let prepared = super::prepare_blocking(
            (*manifest).clone(),
            self.cx.repo.clone(),
            request,
            row.id.clone(),
        )
        .await;
        let mut prepared = match prepared {
            Ok(p) => p,
            Err(e) => {
                let error = e.to_string();
                self.record(
                    &row.id,
                    Event::run_failed(&row.id, Some(&row.trigger), error.clone()),
                )
                .await;
                return (state::FAILED, Some(error));
            }
        };
        // The daemon is up: a person can answer an ACP run's `ask`.
        if let Some(acp) = &mut prepared.acp {
            acp.reach = Some(std::sync::Arc::new(|| Ok(())));
        }
        if let Some(opened) = place.opened {
            // The agent and its tools work in the worktree; npc's state,
            // store and memory stay the repository's.
            prepared.tool_cwd = opened.worktree.dir.clone();
            prepared.spec.env.extend(opened.env.clone());
            prepared.conclusion = place.conclusion;
            prepared.expect_changes = opened.spec.expect_changes == Some(true);
            // The worktree npc made is trusted for the agent CLI, or the
            // run fails at once (`untrusted`).
            prepared.trust = Some(crate::runs::trust::TrustPlan {
                kind: prepared.kind,
                dir: opened.worktree.dir.clone(),
                worktrees: crate::runs::workspace::worktrees_root(
                    &self.cx.repo,
                    &self.cx.state_dir,
                    &manifest.runs,
                ),
                repository: opened.worktree.git.clone(),
            });
        }
        // A fleet worker keeps its runs in a store of its own under the
        // state directory: the run's hooks park their asks there.
        if let Some(own) = self
            .store
            .path()
            .parent()
            .and_then(|dir| dir.strip_prefix(&self.cx.state_dir).ok())
            .filter(|rel| !rel.as_os_str().is_empty())
        {
            prepared.spec.env.insert(
                crate::runs::agent::RUN_STATE_ENV.into(),
                own.display().to_string(),
            );
        }
        if let Some(local) = &local {
            prepared.apply_local(local.resume.as_ref(), local.approval.as_ref());
            // Listed like the runs its front end carries out itself.
            prepared.source = row.origin.known().map(Origin::as_str);
        }
        let places = super::sandbox::Where {
            repo: &self.cx.repo,
            state_dir: &self.cx.state_dir,
            supervisor: &self.cx.supervisor,
        };
        let sandboxed = match super::sandbox::apply(
            &mut prepared,
            &manifest,
            &places,
            trigger_name.as_deref(),
            local.is_none(),
        ) {
            Ok(sandboxed) => sandboxed,
            Err(refused) => {
                let error = refused.to_string();
                self.record(
                    &row.id,
                    Event::run_failed(&row.id, Some(&row.trigger), error.clone()),
                )
                .await;
                return (state::FAILED, Some(error));
            }
        };
        let (_sandbox_tasks, proxy_died) = match sandboxed {
            Some(sandboxed) => {
                // The daemon (or a fleet's API) answers a parked ask.
                let (tasks, died) = super::sandbox::serve(
                    sandboxed,
                    &self.bus,
                    (&row.id, &prepared.profile),
                    manifest.clone(),
                    Arc::new(|| Ok(())),
                );
                (Some(tasks), died)
            }
            None => (None, None),
        };
        if cancel.is_cancelled() {
            // Cancelled while it was being prepared: it never starts.
            return (state::CANCELLED, None);
        }
        let run_id = row.id.clone();
        let cancelled = async move {
            let died = async {
                match proxy_died {
                    // A proxy that stops ends the run: it has no network.
                    Some(died) => match died.await {
                        Ok(why) => {
                            self.record(
                                &run_id,
                                Event::RunEgress(crate::event::RunEgress {
                                    run_id: run_id.clone(),
                                    reason: Some(why),
                                    ..Default::default()
                                }),
                            )
                            .await;
                        }
                        Err(_) => std::future::pending().await,
                    },
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = cancel.cancelled() => {}
                () = died => {}
            }
            nix::sys::signal::Signal::SIGTERM as i32
        };
        // The manifest's hooks (and its plugins') guard a triggered run as
        // they guard `npc run`.
        let hooks = crate::hooks::HookRunner::new(
            crate::hooks::HookSet::for_repository(&self.cx.repo, &manifest),
            self.cx.supervisor.clone(),
            Some(self.bus.clone()),
        );
        let result = super::execute(
            &prepared,
            &self.cx.supervisor,
            &self.bus,
            &hooks,
            |_| {},
            cancelled,
        )
        .await;
        ending_of(&result)
    }
}

/// Where a profile run works and for how long.
#[derive(Debug)]
struct Place<'a> {
    timeout: Duration,
    opened: Option<&'a worktree::Opened>,
    conclusion: Option<crate::runs::workspace::Conclusion>,
}

/// The lowest port of `[runs] ports` no running run holds.
fn free_port(inner: &Inner) -> Option<u16> {
    let (first, last) = inner.manifest.as_ref()?.runs.ports?;
    (first..=last).find(|p| !inner.running.values().any(|r| r.port == Some(*p)))
}

/// Who started a profile run, with what it brings beyond the prompt.
#[derive(Debug)]
enum Starter {
    /// A trigger's firing (its name and payload reach the templates).
    Trigger(TriggeredBy),
    /// By hand (`POST /api/v1/runs`).
    Hand,
    /// A local front end (`npc acp`, `npc run`): its working directory,
    /// timeout, probe silence, resume and approval route.
    Local(Box<LocalRun>),
}

/// What a pass does with the oldest queued run of a trigger.
#[derive(Debug)]
enum Decision {
    Start(Action),
    Wait,
    Skip,
    Cancel,
    /// A run started by hand whose stored request does not parse.
    Unreadable,
}

/// Why [`Executor::cancel`] cancelled nothing.
#[derive(Debug, thiserror::Error)]
pub enum CancelError {
    #[error("no run `{0}` in the daemon's queue; list runs with `npc runs`")]
    NotFound(String),
    #[error("run `{id}` has already ended (`{state}`); nothing to cancel")]
    Finished { id: String, state: String },
    #[error("run `{id}` is carried out by `npc run` in another process; stop it there (Ctrl-C)")]
    Elsewhere { id: String },
    #[error("the run queue cannot record the cancel: {0}")]
    Store(String),
}

/// The request of a run started by hand, from its queue row, with the
/// local front end's extras when one asked (`npc acp`, `npc run`: checked
/// again, the row is read back from a file in the repository). `None` for
/// a row whose request does not parse or pass [`LocalRun::check`].
fn manual_request(row: &RunRow) -> Option<(ManualRun, Option<Box<LocalRun>>)> {
    manual_request_of(row.origin.known(), &row.payload)
}

/// [`manual_request`] of a run of `origin` with `payload`.
/// The request of a run by hand of `origin` (`None`: one no build of npc
/// writes, never a local front end's).
fn manual_request_of(
    origin: Option<Origin>,
    payload: &Value,
) -> Option<(ManualRun, Option<Box<LocalRun>>)> {
    if origin.is_some_and(Origin::is_local) {
        let local = serde_json::from_value::<LocalRun>(payload.clone())
            .ok()
            .filter(|a| a.check().is_ok())?;
        return Some((local.run.clone(), Some(Box::new(local))));
    }
    if origin == Some(Origin::Delegate) {
        let delegated =
            serde_json::from_value::<crate::surfaces::runs::DelegatedRun>(payload.clone()).ok()?;
        return Some((delegated.run, None));
    }
    serde_json::from_value(payload.clone())
        .ok()
        .map(|run| (run, None))
}

/// The action of a run started by hand: its profile, with the prompt the
/// run itself names.
fn manual_action(request: ManualRun) -> Action {
    Action::RunProfile {
        profile: request.profile,
        prompt: None,
        vars: Default::default(),
    }
}

/// The prompt of a run started by hand: text as written, a template with
/// its variables, or the profile's own.
fn manual_prompt(row: &RunRow) -> PromptChoice {
    match manual_request(row).map(|(run, _)| run) {
        Some(ManualRun {
            prompt: Some(text), ..
        }) => PromptChoice::Literal { text },
        Some(ManualRun {
            prompt_template: Some(name),
            vars,
            ..
        }) => PromptChoice::Template { name, vars },
        _ => PromptChoice::Profile,
    }
}
