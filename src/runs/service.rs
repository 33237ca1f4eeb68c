//! [`Runs`]: the daemon's run service, what every front end asks for runs.
//! It owns the queue and the one executor: triggers submit their firings
//! ([`Runs::submit`]), the REST API and the dashboard start runs by hand
//! ([`Runs::start_manual`], origin `api`), `npc acp` and `npc run` start
//! theirs with their extras ([`Runs::start_local`]), and any of them may
//! cancel one ([`Runs::cancel`]). A run by hand is checked against the
//! applied manifest before it is queued; then it is a row like any other,
//! carried out by the same executor.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::Notify;

use super::executor::{CancelError, Executor};
use super::queue::{Accepted, Refused, RunQueue, Submission};
use super::{MANUAL_QUEUE, Origin};
use crate::bus::EventBus;
use crate::driver::DriverContext;
use crate::event::AgentRunStarted;
use crate::model::{Manifest, Overlap, Trigger};
use crate::store::Store;
use crate::surfaces::runs::{LocalRun, LocalRunError, ManualRun};

/// The daemon's run service (one per runtime).
#[derive(Debug)]
pub struct Runs {
    queue: RunQueue,
    executor: Arc<Executor>,
    store: Arc<Store>,
    bus: EventBus,
}

impl Runs {
    /// The service of the repository `cx` names; starts the executor.
    pub fn new(cx: DriverContext, store: Arc<Store>, bus: EventBus) -> Arc<Self> {
        let wake = Arc::new(Notify::new());
        let executor = Executor::new(store.clone(), bus.clone(), cx, wake.clone());
        executor.spawn();
        Arc::new(Self {
            queue: RunQueue::new(store.clone(), bus.clone(), wake, executor.clone()),
            executor,
            store,
            bus,
        })
    }

    /// The applied manifest (profile runs render from it); the first call
    /// lets queued runs start (only now are their triggers known, so a run
    /// queued before a restart is never taken for a removed trigger's).
    pub fn set_manifest(&self, manifest: &Manifest) {
        self.executor.set_manifest(manifest);
    }

    /// A fleet worker's runs that name their code get their worktrees from
    /// `mirror` (see [`super::mirror`]).
    pub fn set_mirror(&self, mirror: Arc<super::mirror::Mirror>) {
        self.executor.set_mirror(mirror);
    }

    /// Trigger `name` is applied with `trigger` (its overlap and action).
    pub fn set_trigger(&self, name: &str, trigger: &Trigger) {
        self.executor.set_trigger(name, trigger);
    }

    /// Trigger `name` was removed: its queued runs are cancelled.
    pub fn remove_trigger(&self, name: &str) {
        self.executor.remove_trigger(name);
    }

    /// Whether trigger `name` is applied, and its overlap policy.
    pub fn overlap_of(&self, name: &str) -> Option<Overlap> {
        self.executor.overlap_of(name)
    }

    /// Names of the applied triggers.
    pub fn trigger_names(&self) -> Vec<String> {
        self.executor.trigger_names()
    }

    /// The applied manifest, once one is.
    pub fn manifest(&self) -> Option<Arc<Manifest>> {
        self.executor.manifest()
    }

    /// Ids of the runs going on now.
    pub fn running(&self) -> Vec<String> {
        self.executor.running()
    }

    /// Queue `run` under `overlap`; resolves once it committed.
    /// The run's concurrency key is rendered from its trigger's
    /// `concurrency_key` here, unless it has one, and its retries are its
    /// trigger's.
    pub fn submit(
        &self,
        mut run: Submission,
        overlap: Overlap,
    ) -> impl Future<Output = Result<Accepted, Refused>> + Send + 'static {
        if run.concurrency_key.is_none() {
            run.concurrency_key = self.executor.concurrency_key_of(&run.queue, &run.payload);
        }
        run.retries = self.executor.retries_of(&run.queue);
        self.queue.submit(run, overlap)
    }

    /// A receiver that sees a change whenever a run ended or an approval
    /// was answered (see [`Executor::changes`]).
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.executor.changes()
    }

    /// Tell [`Runs::changes`]'s receivers that a run they follow moved (a
    /// run carried out outside the executor ended).
    pub fn changed(&self) {
        self.executor.changed();
    }

    /// Who starts the workflows triggers' actions name (see
    /// [`executor::WorkflowStarter`](super::executor::WorkflowStarter)).
    pub fn set_workflow_starter(&self, starter: Arc<dyn super::executor::WorkflowStarter>) {
        self.executor.set_workflow_starter(starter);
    }

    /// The queue side: where runs go (the local store, or a fleet's
    /// shared store once joined, see [`RunQueue::join`]).
    pub fn queue(&self) -> &RunQueue {
        &self.queue
    }

    /// Take in a run a fleet worker claimed from the shared store (see
    /// [`super::queue::RunQueue::adopt`]); the executor carries it out
    /// like any queued run.
    pub async fn adopt(
        &self,
        run: &super::fleet::FleetRun,
    ) -> Result<crate::store::queue::Enqueued, Refused> {
        self.queue.adopt(run).await
    }

    /// Start a profile run by hand (`POST /api/v1/runs`, origin `api`):
    /// checked against the applied manifest, then queued. Returns its id.
    pub async fn start_manual(&self, run: ManualRun) -> Result<String, StartRunError> {
        self.check(&run)?;
        let payload = serde_json::to_value(&run).unwrap_or_default();
        self.submit_manual(Origin::Api, payload).await
    }

    /// Start a run a local front end asks for (`npc acp`'s prompts, origin
    /// `acp`; `npc run`, origin `cli`): its extras (working directory,
    /// timeout, probe silence, resume, approval route) are checked too, and
    /// the executor applies them. Returns its id.
    pub async fn start_local(
        &self,
        origin: Origin,
        run: LocalRun,
    ) -> Result<String, StartRunError> {
        debug_assert!(origin.is_local());
        self.check(&run.run)?;
        run.check().map_err(StartRunError::Local)?;
        let payload = serde_json::to_value(&run).unwrap_or_default();
        self.submit_manual(origin, payload).await
    }

    /// Record what the agent of run `id` reports (the gateway's
    /// `npc_progress`) as its `run.progress`: refused unless `id` is a
    /// running run of this daemon, and past [`MAX_PROGRESS_TEXT_CHARS`],
    /// [`MAX_PROGRESS_OUTPUT_BYTES`] or [`MAX_PROGRESS_OUTPUT_KEYS`].
    pub async fn progress(
        &self,
        id: &str,
        text: String,
        outputs: serde_json::Map<String, serde_json::Value>,
    ) -> Result<(), ProgressRefused> {
        if text.chars().count() > MAX_PROGRESS_TEXT_CHARS {
            return Err(ProgressRefused::TooLong);
        }
        if outputs.len() > MAX_PROGRESS_OUTPUT_KEYS
            || serde_json::to_vec(&outputs).map_or(usize::MAX, |b| b.len())
                > MAX_PROGRESS_OUTPUT_BYTES
        {
            return Err(ProgressRefused::TooLarge);
        }
        let (store, key) = (self.store.clone(), id.to_string());
        let row = tokio::task::spawn_blocking(move || store.run_row(&key))
            .await
            .map_err(|e| ProgressRefused::Store(e.to_string()))?
            .map_err(|e| ProgressRefused::Store(e.to_string()))?;
        if row.is_none_or(|r| r.state != super::state::RUNNING) {
            return Err(ProgressRefused::NotRunning { id: id.to_string() });
        }
        let event = crate::event::Event::RunProgress(crate::event::RunProgress {
            run_id: id.to_string(),
            text,
            outputs,
        });
        self.bus
            .publish(event.for_component(super::component(id)))
            .await
            .map_err(|e| ProgressRefused::Store(e.to_string()))?;
        Ok(())
    }

    /// Start `run` for the agent of run `parent` (the gateway's
    /// `npc_delegate`): a run like any (its own worktree; the asking run's
    /// profile or one no broader, [`super::narrower::broader`]), of origin
    /// `delegate`, refused for a broader profile, past [`MAX_DELEGATION_DEPTH`] runs deep or
    /// [`MAX_DELEGATIONS_PER_RUN`] runs from one parent, or when `parent`
    /// is not a running run of this daemon. Returns its id.
    pub async fn start_delegated(
        &self,
        parent: &str,
        run: ManualRun,
    ) -> Result<String, StartRunError> {
        let store = self.store.clone();
        let key = parent.to_string();
        let (row, children, bracket) = tokio::task::spawn_blocking(move || {
            Ok::<_, crate::store::StoreError>((
                store.run_row(&key)?,
                store.delegated_runs_of(&key)?,
                store.run_bracket(&key)?,
            ))
        })
        .await
        .map_err(|e| StartRunError::Delegation(e.to_string()))?
        .map_err(|e| StartRunError::Delegation(e.to_string()))?;
        let row = row
            .filter(|r| r.state == super::state::RUNNING)
            .ok_or_else(|| {
                StartRunError::Delegation(format!(
                    "run `{parent}` is not a running run of this daemon; only a running run's agent delegates"
                ))
            })?;
        let depth = match row.origin.known() {
            Some(Origin::Delegate) => {
                serde_json::from_value::<crate::surfaces::runs::DelegatedRun>(row.payload)
                    .map_or(u32::MAX, |d| d.depth)
                    .saturating_add(1)
            }
            _ => 1,
        };
        if depth > MAX_DELEGATION_DEPTH {
            return Err(StartRunError::Delegation(format!(
                "run `{parent}` is itself {} delegations deep; a delegated run delegates at most {MAX_DELEGATION_DEPTH} deep",
                depth - 1
            )));
        }
        // The asking run's profile (as its `run.started` says) or one no
        // broader: a delegated run never gets a broader policy than the
        // agent that asked for it.
        let asking = bracket
            .into_iter()
            .find(|e| e.kind == "run.started")
            .and_then(|e| serde_json::from_value::<AgentRunStarted>(e.payload).ok())
            .map(|started| started.profile)
            .ok_or_else(|| {
                StartRunError::Delegation(format!(
                    "run `{parent}` started no agent of a profile; only an agent's run delegates"
                ))
            })?;
        if asking != run.profile {
            let manifest = self.executor.manifest().ok_or(StartRunError::NoManifest)?;
            if let Some(why) = super::narrower::broader(&manifest, &run.profile, &asking) {
                return Err(StartRunError::Delegation(format!(
                    "profile `{}` may do more than profile `{asking}` of run `{parent}` ({why}); a run delegates to its own profile or a narrower one (a delegated run never gets a broader policy than the one asking)",
                    run.profile
                )));
            }
        }
        if children >= MAX_DELEGATIONS_PER_RUN {
            return Err(StartRunError::Delegation(format!(
                "run `{parent}` delegated {children} runs already, the most one run may"
            )));
        }
        self.check(&run)?;
        let delegated = crate::surfaces::runs::DelegatedRun {
            run,
            parent: parent.to_string(),
            depth,
        };
        let payload = serde_json::to_value(&delegated).unwrap_or_default();
        self.submit_manual(Origin::Delegate, payload).await
    }

    async fn submit_manual(
        &self,
        origin: Origin,
        payload: serde_json::Value,
    ) -> Result<String, StartRunError> {
        let accepted = self
            .queue
            .submit(
                Submission::new(MANUAL_QUEUE, origin, payload),
                Overlap::Queue,
            )
            .await
            .map_err(StartRunError::Refused)?;
        Ok(accepted.run_id)
    }

    /// Whether `run` can start with the applied manifest.
    fn check(&self, run: &ManualRun) -> Result<(), StartRunError> {
        let manifest = self.executor.manifest().ok_or(StartRunError::NoManifest)?;
        if !manifest.profiles.contains_key(&run.profile) {
            return Err(StartRunError::UnknownProfile {
                name: run.profile.clone(),
                known: crate::model::diagnostics::known_names(manifest.profiles.keys()),
            });
        }
        if run.prompt.is_some() && run.prompt_template.is_some() {
            return Err(StartRunError::TwoPrompts);
        }
        match &run.prompt_template {
            Some(name) if !manifest.prompts.contains_key(name) => {
                return Err(StartRunError::UnknownTemplate {
                    name: name.clone(),
                    known: crate::model::diagnostics::known_names(manifest.prompts.keys()),
                });
            }
            None if !run.vars.is_empty() => return Err(StartRunError::VarsWithoutTemplate),
            _ => {}
        }
        if run.prompt.is_none()
            && run.prompt_template.is_none()
            && manifest.profiles[&run.profile].prompt.is_none()
        {
            return Err(StartRunError::NoPrompt {
                profile: run.profile.clone(),
            });
        }
        Ok(())
    }

    /// Cancel run `id` (see [`Executor::cancel`]).
    pub async fn cancel(&self, id: &str) -> Result<String, CancelError> {
        self.executor.cancel(id).await
    }

    /// Stop run `id` because run `by` replaced it (overlap `replace` across
    /// a fleet): it ends `cancelled`, saying so.
    /// Answer pending approval `approval` of run `id`, or its oldest one
    /// when `None` (`by`: `cli`, `api`):
    /// the row moves from `pending` in one conditional write, so a second
    /// answer is refused; then `run.approval` (and, for a denial,
    /// `tool.denied` by `approval`) is recorded. The waiting asker reads
    /// the answer and the run goes on.
    pub async fn answer(
        &self,
        id: &str,
        approval: Option<String>,
        answer: crate::store::approvals::Answer,
        by: &'static str,
    ) -> Result<crate::store::approvals::ApprovalRow, AnswerError> {
        let row = self
            .store
            .answer_approval(id, approval, answer, by)
            .await
            .map_err(AnswerError::Store)?
            .map_err(AnswerError::Refused)?;
        self.record_answer(&row).await;
        Ok(row)
    }

    /// Record the answer of approval `row` (just settled here, or read from
    /// a fleet's shared store): `run.approval` and, for a denial,
    /// `tool.denied` by `approval`.
    pub async fn record_answer(&self, row: &crate::store::approvals::ApprovalRow) {
        self.executor.changed();
        use crate::event::{ApprovalDecision, DeniedBy, Event, RunApproval, ToolDenied};
        let by = row.answered_by.clone().unwrap_or_default();
        let denied = row.state == crate::store::approvals::state::DENIED;
        let component = super::component(&row.run_id);
        let approval = Event::RunApproval(RunApproval {
            run_id: row.run_id.clone(),
            approval_id: row.id.clone(),
            tool: row.tool.clone(),
            decision: if denied {
                ApprovalDecision::Deny
            } else {
                ApprovalDecision::Allow
            },
            always: row.always,
            by,
            reason: row.answer.clone(),
        });
        let mut events = vec![approval.for_component(component.clone())];
        if denied {
            events.push(
                Event::ToolDenied(ToolDenied {
                    run_id: Some(row.run_id.clone()),
                    profile: row.profile.clone(),
                    tool: row.tool.clone(),
                    rule: row.rule.clone(),
                    by: DeniedBy::Approval,
                    reason: row.answer.clone(),
                })
                .for_component(component),
            );
        }
        for event in events {
            if let Err(e) = self.bus.publish(event).await {
                tracing::warn!(error = %e, "runs: recording an approval's answer failed");
            }
        }
    }

    /// The store the runs are recorded in.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// The approvals of run `id` (pending and answered), oldest first.
    pub async fn approvals(
        &self,
        id: &str,
    ) -> Result<Vec<crate::store::approvals::ApprovalRow>, crate::store::StoreError> {
        let store = self.store.clone();
        let id = id.to_string();
        tokio::task::spawn_blocking(move || {
            store.run_approvals(&id, crate::store::approvals::MAX_PENDING_PER_RUN * 4)
        })
        .await
        .map_err(|e| crate::store::StoreError::Task(e.to_string()))?
    }

    pub async fn replaced(&self, id: &str, by: &str) -> Result<String, CancelError> {
        let why = crate::store::queue::replaced_detail(by);
        self.executor.cancel_because(id, why).await
    }

    /// The daemon stops: no new runs; running ones are cancelled and
    /// record their end.
    pub async fn shutdown(&self) {
        self.executor.shutdown().await;
    }
}

/// Why a run by hand was not queued.
/// Why an answer to a run's approval was not taken.
#[derive(Debug, thiserror::Error)]
pub enum AnswerError {
    #[error(transparent)]
    Refused(crate::store::approvals::AnswerRefused),
    #[error("cannot record the answer: {0}")]
    Store(crate::store::StoreError),
}

#[derive(Debug, thiserror::Error)]
pub enum StartRunError {
    #[error("the daemon has applied no manifest yet; fix it (see `npc validate`) and retry")]
    NoManifest,
    #[error("no profile `{name}` in the applied manifest; known profiles: {known}")]
    UnknownProfile { name: String, known: String },
    #[error("no prompt template `{name}` in the applied manifest; known prompts: {known}")]
    UnknownTemplate { name: String, known: String },
    #[error("pass `prompt` or `prompt_template`, not both")]
    TwoPrompts,
    #[error(
        "`vars` needs `prompt_template`; `prompt` text and the profile's prompt take no variables"
    )]
    VarsWithoutTemplate,
    #[error("profile `{profile}` has no `prompt`; pass `prompt` or `prompt_template`")]
    NoPrompt { profile: String },
    #[error(transparent)]
    Local(LocalRunError),
    #[error(transparent)]
    Refused(Refused),
    #[error("{0}")]
    Delegation(String),
}

/// Why a run's progress report was not recorded.
#[derive(Debug, thiserror::Error)]
pub enum ProgressRefused {
    #[error(
        "run `{id}` is not a running run of this daemon; only a running run's agent reports progress"
    )]
    NotRunning { id: String },
    #[error("the text is longer than {MAX_PROGRESS_TEXT_CHARS} characters; say it shorter")]
    TooLong,
    #[error(
        "`outputs` has more than {MAX_PROGRESS_OUTPUT_KEYS} keys or {MAX_PROGRESS_OUTPUT_BYTES} bytes of JSON; report less, or write a file"
    )]
    TooLarge,
    #[error("cannot record the report: {0}")]
    Store(String),
}

/// Longest text of one progress report, in characters.
pub const MAX_PROGRESS_TEXT_CHARS: usize = 4_000;
/// Most keys in one progress report's `outputs`.
pub const MAX_PROGRESS_OUTPUT_KEYS: usize = 32;
/// Largest `outputs` of one progress report, as JSON bytes.
pub const MAX_PROGRESS_OUTPUT_BYTES: usize = crate::store::workflows::MAX_STEP_PROGRESS_BYTES;

/// How deep delegations chain: a run an agent delegated may delegate
/// again, up to this many runs deep.
pub const MAX_DELEGATION_DEPTH: u32 = 2;
/// Most runs one run's agent may delegate.
pub const MAX_DELEGATIONS_PER_RUN: usize = 8;
