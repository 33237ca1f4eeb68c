//! The executor: takes runs from the durable queue and carries out their
//! trigger's action, at most [`MAX_CONCURRENT_RUNS`] at once.
//!
//! Each pass looks at the oldest queued run of every trigger. A trigger
//! whose run is still going applies its overlap policy: `queue` waits,
//! `skip` records the new run as skipped, `replace` cancels the running one
//! and starts the new one. A run is marked `running` (committed) before its
//! process starts, and a run found `running` when a daemon starts was cut
//! off by a crash: it becomes `interrupted` and never runs again (at most
//! once). A profile action runs through `npc run`'s path
//! ([`crate::runs::prepare_blocking`], [`crate::runs::execute`]); a command
//! runs through the supervisor with the run id, trigger and payload in its
//! environment. Every event carries the run id, under component `run.<id>`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{MANUAL_QUEUE, ManualRun, Origin};
use crate::acp::daemon::AcpRun;
use crate::bus::EventBus;
use crate::driver::{DriverContext, child_spec};
use crate::model::{Action, CommandSpec, Manifest, Overlap, RestartPolicy, Trigger};
use crate::plan::{ComponentId, Kind};
use crate::runs::{self, PromptChoice, RunRequest, TriggeredBy};
use crate::store::queue::{RUN_HISTORY_LIMIT, RunRow, state};
use crate::store::{NewEvent, Store};

/// Runs carried out at once, over all triggers.
pub const MAX_CONCURRENT_RUNS: usize = 4;
/// How often the executor looks at the queue without being woken (a safety
/// net; every enqueue wakes it).
pub const RESCAN_EVERY: Duration = Duration::from_secs(5);
/// Output lines of a command recorded per run (`run.output`); the rest are
/// counted in `run.finished`.
pub const MAX_OUTPUT_EVENTS: usize = 200;
/// Longest output line recorded, in characters.
pub const MAX_OUTPUT_LINE_CHARS: usize = 4096;
/// Largest payload passed inline as `NPC_TRIGGER_PAYLOAD`; a larger one is
/// written to a private file named by `NPC_TRIGGER_PAYLOAD_FILE` instead.
pub const MAX_PAYLOAD_ENV_BYTES: usize = 64 * 1024;
/// How long a shutdown waits for cancelled runs to record their end.
pub const STOP_WAIT: Duration = Duration::from_secs(10);
/// How often finished runs beyond `store::queue::RUN_HISTORY_LIMIT` are pruned.
pub const PRUNE_EVERY: Duration = Duration::from_secs(60);
/// After a command exits, how long its output pipes may take to close.
pub const POST_EXIT_DRAIN: Duration = Duration::from_secs(2);
/// How long [`Executor::cancel`] waits for a cancelled run to record its
/// end (the process group is killed at once; its output then drains).
pub const CANCEL_WAIT: Duration = Duration::from_secs(10);
/// Why a run cancelled by hand ended.
pub const CANCELLED_BY_HAND: &str = "cancelled by hand";

/// A run being carried out.
#[derive(Debug)]
struct Running {
    trigger: String,
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
    inner: Mutex<Inner>,
    stop: CancellationToken,
}

/// How a run ended: its stored state and a detail.
type Ending = (&'static str, Option<String>);

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
            inner: Mutex::new(Inner::default()),
            stop: CancellationToken::new(),
        })
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Start the loop: first mark runs a crashed daemon left `running` as
    /// interrupted, then dispatch whenever woken (once a manifest is set).
    pub fn spawn(self: &Arc<Self>) {
        let this = self.clone();
        tokio::spawn(async move {
            match this.store.interrupt_running_runs().await {
                Ok(ids) => {
                    for id in ids {
                        this.record(&id, "run.interrupted", json!({ "run_id": id, "detail": "the daemon stopped while it ran; not run again" })).await;
                    }
                }
                Err(e) => tracing::error!("cannot mark interrupted runs: {e}"),
            }
            let mut pruned = Instant::now();
            loop {
                if this.inner().manifest.is_some() {
                    this.dispatch().await;
                }
                if pruned.elapsed() >= PRUNE_EVERY {
                    pruned = Instant::now();
                    if let Err(e) = this.store.prune_runs(RUN_HISTORY_LIMIT).await {
                        tracing::warn!("cannot prune old runs: {e}");
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
            *r.reason.lock().unwrap_or_else(|p| p.into_inner()) =
                Some("the daemon stopped".to_string());
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
                    if inner.running.len() >= MAX_CONCURRENT_RUNS {
                        break;
                    }
                    if row.trigger == MANUAL_QUEUE {
                        // A run started by hand: its own action, no overlap
                        // (each is its queue's head once the one before
                        // started, so they never wait behind each other).
                        match manual_request(&row) {
                            Some(request) => Decision::Start(Action::RunProfile {
                                profile: request.profile,
                                prompt: None,
                                vars: Default::default(),
                            }),
                            None => Decision::Unreadable,
                        }
                    } else {
                        match inner.triggers.get(&row.trigger) {
                            None => Decision::Cancel,
                            Some(t) => {
                                let active: Vec<&Running> = inner
                                    .running
                                    .values()
                                    .filter(|r| r.trigger == row.trigger)
                                    .collect();
                                match (active.is_empty(), t.overlap) {
                                    (true, _) => Decision::Start(t.action.clone()),
                                    (false, Overlap::Queue) => Decision::Wait,
                                    (false, Overlap::Skip) => Decision::Skip,
                                    (false, Overlap::Replace) => {
                                        for r in active {
                                            *r.reason.lock().unwrap_or_else(|p| p.into_inner()) =
                                                Some(format!("replaced by run `{}`", row.id));
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
                    self.inner().running.insert(
                        row.id.clone(),
                        Running {
                            trigger: row.trigger.clone(),
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
                        let detail = format!("trigger `{}` is no longer applied", row.trigger);
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
        if end == state::SKIPPED || end == state::CANCELLED {
            let kind = if end == state::SKIPPED {
                "run.skipped"
            } else {
                "run.cancelled"
            };
            self.record(id, kind, json!({ "run_id": id, "detail": detail }))
                .await;
        }
    }

    async fn record(&self, id: &str, kind: &str, payload: Value) {
        let event = NewEvent::new(kind, payload).for_component(runs::component(id));
        if let Err(e) = self.bus.publish(event).await {
            tracing::warn!("cannot record `{kind}`: {e}");
        }
    }

    /// Mark the run running (committed first, and only if it is still
    /// queued: a cancel may have taken it), then carry it out in its own task.
    async fn start(self: &Arc<Self>, row: RunRow, action: Action) {
        let committed = self
            .store
            .mark_run_if(&row.id, state::QUEUED, state::RUNNING, None)
            .await;
        let (cancel, reason, manifest) = {
            let mut inner = self.inner();
            let Some(running) = inner.running.get(&row.id) else {
                return;
            };
            let handles = (running.cancel.clone(), running.reason.clone());
            if !matches!(committed, Ok(true)) {
                if let Err(e) = &committed {
                    tracing::error!("cannot start run `{}`: {e}", row.id);
                }
                inner.running.remove(&row.id);
                drop(inner);
                self.ended.notify_waiters();
                return;
            }
            (handles.0, handles.1, inner.manifest.clone())
        };
        let this = self.clone();
        tokio::spawn(async move {
            let ending = match &action {
                Action::RunCommand(command) => this.run_command(&row, command, &cancel).await,
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
                        let starter = match acp_request(&row) {
                            Some(acp) => Starter::Acp(Box::new(acp)),
                            None => Starter::Hand,
                        };
                        (manual_prompt(&row), starter)
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
                    this.run_profile(&row, profile, prompt, starter, manifest, &cancel)
                        .await
                }
            };
            let ending = match (
                ending,
                reason.lock().unwrap_or_else(|p| p.into_inner()).clone(),
            ) {
                ((state::CANCELLED, _), Some(why)) => (state::CANCELLED, Some(why)),
                (ending, _) => ending,
            };
            if let Err(e) = this.store.mark_run(&row.id, ending.0, ending.1).await {
                tracing::error!("cannot record the end of run `{}`: {e}", row.id);
            }
            this.inner().running.remove(&row.id);
            this.ended.notify_waiters();
            this.wake.notify_one();
        });
    }

    /// The applied manifest, once one is.
    pub fn manifest(&self) -> Option<Arc<Manifest>> {
        self.inner().manifest.clone()
    }

    /// Cancel run `id`: a queued run never starts; a running one has its
    /// process group killed, and the answer waits (at most [`CANCEL_WAIT`])
    /// until it recorded its end. Returns the run's state after that.
    pub async fn cancel(&self, id: &str) -> Result<String, CancelError> {
        let signal = |inner: &Inner| {
            inner.running.get(id).map(|r| {
                *r.reason.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some(CANCELLED_BY_HAND.to_string());
                r.cancel.cancel();
            })
        };
        let mut signalled = signal(&self.inner()).is_some();
        if !signalled {
            let taken = self
                .store
                .mark_run_if(
                    id,
                    state::QUEUED,
                    state::CANCELLED,
                    Some(CANCELLED_BY_HAND.to_string()),
                )
                .await
                .map_err(|e| CancelError::Store(e.to_string()))?;
            if taken {
                self.record(
                    id,
                    "run.cancelled",
                    json!({ "run_id": id, "detail": CANCELLED_BY_HAND }),
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
        let row = tokio::task::spawn_blocking(move || store.trigger_run(&key))
            .await
            .map_err(|e| CancelError::Store(e.to_string()))?
            .map_err(|e| CancelError::Store(e.to_string()))?;
        match row {
            None => Err(CancelError::NotFound(id.to_string())),
            Some(row) if signalled => Ok(row.state),
            Some(row) => Err(CancelError::Finished {
                id: id.to_string(),
                state: row.state,
            }),
        }
    }

    async fn run_profile(
        &self,
        row: &RunRow,
        profile: &str,
        prompt: PromptChoice,
        starter: Starter,
        manifest: Option<Arc<Manifest>>,
        cancel: &CancellationToken,
    ) -> Ending {
        let Some(manifest) = manifest else {
            return (state::FAILED, Some("no manifest is applied".to_string()));
        };
        let (triggered, acp) = match starter {
            Starter::Trigger(t) => (Some(t), None),
            Starter::Hand => (None, None),
            Starter::Acp(a) => (None, Some(a)),
        };
        let request = RunRequest {
            profile: profile.to_string(),
            prompt,
            timeout: acp.as_ref().map_or(runs::DEFAULT_RUN_TIMEOUT, |a| {
                a.timeout(runs::DEFAULT_RUN_TIMEOUT)
            }),
            cwd: acp.as_ref().and_then(|a| a.cwd.clone()),
            probe_after: crate::providers::STALE_AFTER,
            trigger: triggered,
        };
        let prepared = runs::prepare_blocking(
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
                self.record(&row.id, "run.finished", json!({ "run_id": row.id, "trigger": row.trigger, "outcome": "failed", "error": error })).await;
                return (state::FAILED, Some(error));
            }
        };
        if let Some(acp) = &acp {
            crate::acp::daemon::apply(&mut prepared, acp.resume.as_ref(), acp.approval.as_ref());
        }
        if cancel.is_cancelled() {
            // Cancelled while it was being prepared: it never starts.
            return (state::CANCELLED, None);
        }
        let cancelled = async {
            cancel.cancelled().await;
            nix::sys::signal::Signal::SIGTERM as i32
        };
        // The manifest's hooks (and its plugins') guard a triggered run as
        // they guard `npc run`.
        let hooks = crate::hooks::HookRunner::new(
            crate::hooks::HookSet::for_repository(&self.cx.repo, &manifest),
            self.cx.supervisor.clone(),
            Some(self.bus.clone()),
        );
        match runs::execute(
            &prepared,
            &self.cx.supervisor,
            &self.bus,
            &hooks,
            |_| {},
            cancelled,
        )
        .await
        {
            Ok(report) => match report.outcome {
                runs::Outcome::Succeeded => (state::SUCCEEDED, None),
                runs::Outcome::HookFailed => (
                    state::FAILED,
                    Some(report.hook_error.unwrap_or_else(|| "a hook failed".into())),
                ),
                runs::Outcome::Failed { exit } => (state::FAILED, Some(exit.to_string())),
                runs::Outcome::TimedOut => (state::TIMED_OUT, None),
                runs::Outcome::Cancelled { .. } => (state::CANCELLED, None),
            },
            Err(e) => (state::FAILED, Some(e.to_string())),
        }
    }

    async fn run_command(
        &self,
        row: &RunRow,
        command: &CommandSpec,
        cancel: &CancellationToken,
    ) -> Ending {
        let started = Instant::now();
        let id = ComponentId::new(Kind::Trigger, &row.trigger);
        let mut spec = child_spec(&self.cx, &id, command, RestartPolicy::Never);
        let payload = row.payload.to_string();
        spec.env.insert("NPC_RUN_ID".into(), row.id.clone());
        spec.env.insert("NPC_TRIGGER".into(), row.trigger.clone());
        spec.env
            .insert("NPC_TRIGGER_ORIGIN".into(), row.origin.clone());
        if payload.len() <= MAX_PAYLOAD_ENV_BYTES {
            spec.env.insert("NPC_TRIGGER_PAYLOAD".into(), payload);
        } else {
            let path = runs::run_dir(&self.cx.state_dir, &row.id).join("payload.json");
            let written = crate::repofs::Root::new(&self.cx.repo).and_then(|root| {
                root.write(
                    &path,
                    payload.as_bytes(),
                    crate::repofs::WriteOptions::PRIVATE,
                )
            });
            if let Err(e) = written {
                let error = format!("cannot write the payload file: {e}");
                self.record(
                    &row.id,
                    "run.finished",
                    json!({ "run_id": row.id, "outcome": "failed", "error": error }),
                )
                .await;
                return (state::FAILED, Some(error));
            }
            spec.env.insert(
                "NPC_TRIGGER_PAYLOAD_FILE".into(),
                path.display().to_string(),
            );
        }
        self.record(
            &row.id,
            "run.started",
            json!({
                "run_id": row.id,
                "trigger": row.trigger,
                "origin": row.origin,
                "action": "command",
                "program": command.command,
                "cwd": spec.cwd,
            }),
        )
        .await;
        let finished = |outcome: &str, extra: Value| {
            let mut payload = json!({
                "run_id": row.id,
                "trigger": row.trigger,
                "outcome": outcome,
                "duration_ms": u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            });
            if let (Value::Object(p), Value::Object(e)) = (&mut payload, extra) {
                p.extend(e);
            }
            payload
        };
        let mut child = match self.cx.supervisor.spawn_streaming(&spec) {
            Ok(child) => child,
            Err(e) => {
                let error = e.to_string();
                self.record(
                    &row.id,
                    "run.finished",
                    finished("failed", json!({ "error": error })),
                )
                .await;
                return (state::FAILED, Some(error));
            }
        };
        drop(child.stdin.take());
        let killer = child.killer();
        let (_, empty_out) = tokio::sync::mpsc::channel(1);
        let (_, empty_err) = tokio::sync::mpsc::channel(1);
        let mut stdout = std::mem::replace(&mut child.stdout, empty_out);
        let mut stderr = std::mem::replace(&mut child.stderr, empty_err);
        let (mut out_open, mut err_open) = (true, true);
        let (mut recorded, mut dropped) = (0usize, 0usize);
        let mut exit = None;
        let mut stopped: Option<&'static str> = None;
        let timeout = tokio::time::sleep(runs::DEFAULT_RUN_TIMEOUT);
        tokio::pin!(timeout);
        let drain = tokio::time::sleep(runs::DEFAULT_RUN_TIMEOUT + POST_EXIT_DRAIN);
        tokio::pin!(drain);
        let wait = child.wait();
        tokio::pin!(wait);
        while out_open || err_open || exit.is_none() {
            let line = tokio::select! {
                l = stdout.recv(), if out_open => match l {
                    Some(l) => Some(("stdout", l)),
                    None => { out_open = false; None }
                },
                l = stderr.recv(), if err_open => match l {
                    Some(l) => Some(("stderr", l)),
                    None => { err_open = false; None }
                },
                status = &mut wait, if exit.is_none() => {
                    exit = Some(status.unwrap_or_default());
                    drain.as_mut().reset(tokio::time::Instant::now() + POST_EXIT_DRAIN);
                    None
                }
                () = &mut drain, if exit.is_some() => break,
                () = &mut timeout, if stopped.is_none() && exit.is_none() => {
                    stopped = Some(state::TIMED_OUT);
                    let _ = killer.kill();
                    None
                }
                () = cancel.cancelled(), if stopped.is_none() && exit.is_none() => {
                    stopped = Some(state::CANCELLED);
                    let _ = killer.kill();
                    None
                }
            };
            if let Some((stream, line)) = line {
                if recorded < MAX_OUTPUT_EVENTS {
                    recorded += 1;
                    let text: String = line.text().chars().take(MAX_OUTPUT_LINE_CHARS).collect();
                    self.record(
                        &row.id,
                        "run.output",
                        json!({ "run_id": row.id, "stream": stream, "line": text }),
                    )
                    .await;
                } else {
                    dropped += 1;
                }
            }
        }
        let exit = exit.unwrap_or_default();
        let end = stopped.unwrap_or(if exit.success() {
            state::SUCCEEDED
        } else {
            state::FAILED
        });
        self.record(
            &row.id,
            "run.finished",
            finished(
                end,
                json!({ "exit": exit, "output_lines_dropped": dropped }),
            ),
        )
        .await;
        let detail = (end == state::FAILED).then(|| exit.to_string());
        (end, detail)
    }
}

/// Who started a profile run, with what it brings beyond the prompt.
#[derive(Debug)]
enum Starter {
    /// A trigger's firing (its name and payload reach the templates).
    Trigger(TriggeredBy),
    /// By hand (`POST /api/v1/runs`).
    Hand,
    /// A prompt of `npc acp`: its working directory, timeout, resume and
    /// approval route.
    Acp(Box<AcpRun>),
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
    #[error("the run queue cannot record the cancel: {0}")]
    Store(String),
}

/// The request of a run started by hand, from its queue row (a prompt of
/// `npc acp` carries it inside its [`AcpRun`], checked again: the row is
/// read back from a file in the repository).
fn manual_request(row: &RunRow) -> Option<ManualRun> {
    if row.origin == Origin::Acp.as_str() {
        return acp_request(row).map(|a| a.run);
    }
    serde_json::from_value(row.payload.clone()).ok()
}

/// The [`AcpRun`] of a prompt of `npc acp`, from its queue row; `None` for
/// other rows and for one that does not pass [`AcpRun::check`].
fn acp_request(row: &RunRow) -> Option<AcpRun> {
    if row.origin != Origin::Acp.as_str() {
        return None;
    }
    serde_json::from_value::<AcpRun>(row.payload.clone())
        .ok()
        .filter(|a| a.check().is_ok())
}

/// The prompt of a run started by hand: text as written, a template with
/// its variables, or the profile's own.
fn manual_prompt(row: &RunRow) -> PromptChoice {
    match manual_request(row) {
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
