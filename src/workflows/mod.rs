//! Workflows: several steps toward one goal, each step a run of the one
//! executor (origin `workflow`, queue `@workflow/NAME/STEP`). A workflow
//! run is a row of the store; its steps' rows are the journal
//! (`store::workflows`). The engine advances every workflow under way
//! whenever a run ends or an approval is answered while one is under way
//! (and then at least every [`TICK`]; with none under way only a start
//! wakes it): a step whose needs succeeded is reached (its `when` read, its
//! matrix expanded into instances), an instance is started (its gate first:
//! a run that waits on an approval, answered with `npc runs approve`), a
//! finished run's outputs are taken into the journal. A step recorded
//! `succeeded` is never started again, so a daemon killed mid-workflow
//! resumes from the journal; a run the kill interrupted is started again
//! (at most [`MAX_STEP_STARTS`] times). A failed step fails the steps that
//! need it and nothing else.
//!
//! Architecture invariant: the engine asks `runs` for runs and answers; it
//! never carries one out itself, and a step's action, workspace and limits
//! come from the applied manifest, never from a row.

pub mod values;

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::bus::EventBus;
use crate::driver::DriverContext;
use crate::event::{Event, WorkflowFinished, WorkflowStarted, WorkflowStep};
use crate::model::workflow::{MAX_OUTPUT_FILE_BYTES, StepRunPayload, step_queue};
use crate::model::{Manifest, Overlap, RunOrigin};
use crate::model::{Step, Workflow};
use crate::runs::Runs;
use crate::runs::queue::Submission;
use crate::store::Store;
use crate::store::queue::{NewRun, RunRow, state as run_state};
use crate::store::workflows::{StepRow, WorkflowRow, state};

/// Prefix of a workflow run's id.
pub const WORKFLOW_ID_PREFIX: &str = "wf-";
/// The longest the engine waits between two passes over the workflows
/// under way (a run's end or an answer wakes it at once).
pub const TICK: Duration = Duration::from_secs(1);
/// How often one step instance's run (or gate) is started: a run a daemon
/// kill interrupted is started again until this many starts.
pub const MAX_STEP_STARTS: u32 = 3;
/// Workflow runs under way at once; a start past it is refused.
pub const MAX_ACTIVE_WORKFLOWS: usize = 256;
/// Longest value of one input, in bytes.
pub const MAX_INPUT_BYTES: usize = 64 * 1024;
/// What a step's gate asks, as the approval's tool name.
pub const GATE_TOOL: &str = "gate";

/// Why a workflow did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("no manifest is applied yet; start `npc daemon` with a valid manifest")]
    NoManifest,
    #[error("no workflow `{name}`; the manifest declares {known}")]
    Unknown { name: String, known: String },
    #[error("workflow `{workflow}` has no input `{input}`; it takes {known}")]
    UnknownInput {
        workflow: String,
        input: String,
        known: String,
    },
    #[error("workflow `{workflow}` needs input `{input}`; give it with `--input {input}=VALUE`")]
    MissingInput { workflow: String, input: String },
    #[error("input `{input}` is longer than {MAX_INPUT_BYTES} bytes")]
    InputTooLong { input: String },
    #[error(
        "{MAX_ACTIVE_WORKFLOWS} workflow runs are under way already; wait for some to end, or cancel one with `npc workflow cancel ID`"
    )]
    TooMany,
    #[error("the store cannot record the workflow run: {0}")]
    Store(String),
}

/// Why a cancel cancelled nothing.
#[derive(Debug, thiserror::Error)]
pub enum CancelError {
    #[error("no workflow run `{0}`; list them with `npc workflows`")]
    NotFound(String),
    #[error("workflow run `{id}` has already ended (`{state}`); nothing to cancel")]
    Finished { id: String, state: String },
    #[error("the store cannot record the cancel: {0}")]
    Store(String),
}

/// The daemon's workflow engine (one per runtime).
#[derive(Debug)]
pub struct Workflows {
    store: Arc<Store>,
    runs: Arc<Runs>,
    bus: EventBus,
    cx: DriverContext,
    wake: Notify,
    stop: CancellationToken,
    /// One pass (or a cancel) at a time: the journal has one writer.
    advancing: tokio::sync::Mutex<()>,
    /// The gates whose approval a task of this process waits on.
    gates: Arc<Mutex<HashSet<String>>>,
}

impl Workflows {
    pub fn new(store: Arc<Store>, runs: Arc<Runs>, bus: EventBus, cx: DriverContext) -> Arc<Self> {
        Arc::new(Self {
            store,
            runs,
            bus,
            cx,
            wake: Notify::new(),
            stop: CancellationToken::new(),
            advancing: tokio::sync::Mutex::new(()),
            gates: Arc::default(),
        })
    }

    /// Start the engine's loop (it stops with [`Workflows::shutdown`]).
    pub fn spawn(self: &Arc<Self>) {
        let this = self.clone();
        let mut changes = self.runs.changes();
        tokio::spawn(async move {
            loop {
                // With no workflow under way nothing moves until one starts
                // (a wake): an idle daemon does no pass, and the runs a busy
                // queue ends (none of them a step) cost the engine nothing.
                let under_way = this.pass().await;
                tokio::select! {
                    () = this.stop.cancelled() => return,
                    () = this.wake.notified() => {}
                    changed = changes.changed(), if under_way => {
                        if changed.is_err() {
                            tokio::time::sleep(TICK).await;
                        }
                    }
                    () = tokio::time::sleep(TICK), if under_way => {}
                }
            }
        });
    }

    /// Stop the loop (runs and gates already started go on as runs).
    pub fn shutdown(&self) {
        self.stop.cancel();
    }

    /// Start workflow `name` with `given` inputs (the declared defaults
    /// fill in the rest) and `payload` (what started it: a trigger's
    /// firing); its id.
    pub async fn start(
        &self,
        name: &str,
        given: BTreeMap<String, String>,
        payload: Value,
        origin: RunOrigin,
    ) -> Result<String, StartError> {
        let manifest = self.runs.manifest().ok_or(StartError::NoManifest)?;
        let Some(decl) = manifest.workflows.get(name) else {
            let known: Vec<&str> = manifest.workflows.keys().map(String::as_str).collect();
            return Err(StartError::Unknown {
                name: name.to_string(),
                known: listed(&known, "no workflows"),
            });
        };
        let inputs = inputs_of(name, decl, given)?;
        let store = self.store.clone();
        let active =
            tokio::task::spawn_blocking(move || store.workflows(true, MAX_ACTIVE_WORKFLOWS + 1))
                .await
                .map_err(|e| StartError::Store(e.to_string()))?
                .map_err(|e| StartError::Store(e.to_string()))?;
        if active.len() >= MAX_ACTIVE_WORKFLOWS {
            return Err(StartError::TooMany);
        }
        let id = new_workflow_id();
        let now = crate::store::now_ms();
        let row = WorkflowRow {
            id: id.clone(),
            name: name.to_string(),
            origin: origin.as_str().to_string(),
            inputs: inputs.clone(),
            payload,
            state: state::RUNNING.to_string(),
            detail: None,
            created_at_ms: now,
            updated_at_ms: now,
            finished_at_ms: None,
        };
        self.store
            .create_workflow(row)
            .await
            .map_err(|e| StartError::Store(e.to_string()))?;
        self.publish(
            &id,
            Event::WorkflowStarted(WorkflowStarted {
                workflow_run: id.clone(),
                workflow: name.to_string(),
                inputs,
                origin: origin.as_str().to_string(),
            }),
        )
        .await;
        self.wake.notify_one();
        Ok(id)
    }

    /// Cancel workflow run `id`: its running step runs are cancelled, its
    /// gates denied, its unfinished steps end `cancelled`; its state after.
    pub async fn cancel(&self, id: &str) -> Result<String, CancelError> {
        let _one = self.advancing.lock().await;
        let key = id.to_string();
        let wf = self
            .read(move |s| s.workflow(&key))
            .await
            .map_err(CancelError::Store)?
            .ok_or_else(|| CancelError::NotFound(id.to_string()))?;
        if state::is_final(&wf.state) {
            return Err(CancelError::Finished {
                id: wf.id,
                state: wf.state,
            });
        }
        let key = id.to_string();
        let rows = self
            .read(move |s| s.workflow_steps(&key))
            .await
            .map_err(CancelError::Store)?;
        let mut moved = Vec::new();
        // The steps never reached end `cancelled` too, so the journal says
        // what became of every declared step.
        let reached: HashSet<String> = rows.iter().map(|r| r.step.clone()).collect();
        if let Some(decl) = self
            .runs
            .manifest()
            .and_then(|m| m.workflows.get(&wf.name).cloned())
        {
            for step in decl.order.iter().filter(|s| !reached.contains(*s)) {
                let mut row = StepRow::new(&wf.id, step, 0, state::CANCELLED);
                row.detail = Some("the workflow run was cancelled before it was reached".into());
                moved.push(row);
            }
        }
        for mut row in rows.into_iter().filter(|r| !state::is_final(&r.state)) {
            if let Some(run) = &row.run_id {
                // Ended already, or not this daemon's: nothing to stop.
                let _ = self.runs.cancel(run).await;
            }
            if let Some(gate) = &row.gate_run_id {
                let deny = crate::store::approvals::Answer::Deny {
                    reason: Some(format!("workflow run `{id}` was cancelled")),
                };
                let _ = self.runs.answer(gate, None, deny, "workflow").await;
            }
            row.state = state::CANCELLED.to_string();
            row.detail = Some("the workflow run was cancelled".to_string());
            moved.push(row);
        }
        self.record_steps(&wf, moved).await;
        self.finish(&wf, state::CANCELLED, Some("cancelled by hand".to_string()))
            .await;
        Ok(state::CANCELLED.to_string())
    }

    /// Workflow run `id` as `npc workflow show` shows it.
    pub async fn view(&self, id: &str) -> Result<Option<WorkflowView>, String> {
        let key = id.to_string();
        let Some(wf) = self.read(move |s| s.workflow(&key)).await? else {
            return Ok(None);
        };
        let key = id.to_string();
        let rows = self.read(move |s| s.workflow_steps(&key)).await?;
        let decl = self
            .runs
            .manifest()
            .and_then(|m| m.workflows.get(&wf.name).cloned());
        Ok(Some(WorkflowView::of(wf, rows, decl.as_ref())))
    }

    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Store) -> Result<T, crate::store::StoreError> + Send + 'static,
    ) -> Result<T, String> {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || f(&store))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())
    }

    /// One pass over every workflow run under way.
    /// Whether another pass is due within [`TICK`]: a workflow is under
    /// way, or the journal could not be read yet (no manifest is applied,
    /// the store failed).
    async fn pass(&self) -> bool {
        let _one = self.advancing.lock().await;
        let Some(manifest) = self.runs.manifest() else {
            return true;
        };
        let active = match self.read(|s| s.workflows(true, MAX_ACTIVE_WORKFLOWS)).await {
            Ok(active) => active,
            Err(e) => {
                tracing::warn!("workflows: cannot read the workflow runs: {e}");
                return true;
            }
        };
        let under_way = !active.is_empty();
        for wf in active {
            self.advance(&wf, &manifest).await;
        }
        under_way
    }

    /// Move workflow run `wf` as far as its journal and its runs allow.
    async fn advance(&self, wf: &WorkflowRow, manifest: &Arc<Manifest>) {
        let Some(decl) = manifest.workflows.get(&wf.name) else {
            let why = format!(
                "workflow `{}` is no longer declared in the manifest",
                wf.name
            );
            self.finish(wf, state::FAILED, Some(why)).await;
            return;
        };
        let id = wf.id.clone();
        let rows = match self.read(move |s| s.workflow_steps(&id)).await {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!("workflows: cannot read the steps of `{}`: {e}", wf.id);
                return;
            }
        };
        let mut journal: BTreeMap<String, Vec<StepRow>> = BTreeMap::new();
        for row in rows {
            journal.entry(row.step.clone()).or_default().push(row);
        }
        let mut moved = Vec::new();
        for id in &decl.order {
            let Some(step) = decl.steps.get(id) else {
                continue;
            };
            if !journal.contains_key(id)
                && let Some(reached) = reach(wf, id, step, &journal)
            {
                moved.extend(reached.iter().cloned());
                journal.insert(id.clone(), reached);
            }
            // The context only for a step with an instance still to move
            // (built for every step, a pass cost steps × finished steps).
            let open = journal
                .get(id)
                .is_some_and(|rows| rows.iter().any(|r| !state::is_final(&r.state)));
            if !open {
                continue;
            }
            let ctx = values::context(wf, &journal);
            let Some(instances) = journal.get_mut(id) else {
                continue;
            };
            for row in instances.iter_mut() {
                if state::is_final(&row.state) {
                    continue;
                }
                if let Some(next) = self.step_move(wf, id, step, row, &ctx, manifest).await {
                    *row = next;
                    if let Some(i) = moved
                        .iter()
                        .position(|m: &StepRow| m.step == row.step && m.instance == row.instance)
                    {
                        moved[i] = row.clone();
                    } else {
                        moved.push(row.clone());
                    }
                }
            }
        }
        self.record_steps(wf, moved).await;
        if let Some(end) = values::ended(decl, &journal) {
            let detail = (end == state::FAILED).then(|| failed_steps(&journal));
            self.finish(wf, end, detail).await;
        }
    }

    /// What instance `row` of step `id` becomes now, if it moves.
    async fn step_move(
        &self,
        wf: &WorkflowRow,
        id: &str,
        step: &Step,
        row: &StepRow,
        ctx: &Value,
        manifest: &Arc<Manifest>,
    ) -> Option<StepRow> {
        let mut next = row.clone();
        match row.state.as_str() {
            state::PENDING => {
                if step.gate.is_some() && row.gate_run_id.is_none() {
                    return Some(self.open_gate(wf, id, next, manifest).await);
                }
                Some(self.start_run(wf, id, step, next, ctx).await)
            }
            state::WAITING => {
                let gate = row.gate_run_id.clone()?;
                if crate::stdx::lock(&self.gates).contains(&gate) {
                    return None;
                }
                let run = self.run_row(&gate).await?;
                match run.state.as_str() {
                    run_state::QUEUED | run_state::RUNNING => None,
                    run_state::SUCCEEDED if step.action.is_some() => {
                        Some(self.start_run(wf, id, step, next, ctx).await)
                    }
                    run_state::SUCCEEDED => {
                        next.state = state::SUCCEEDED.to_string();
                        next.detail = Some("approved".to_string());
                        Some(next)
                    }
                    run_state::INTERRUPTED if row.starts < MAX_STEP_STARTS => {
                        // The daemon that waited is gone: ask again.
                        next.gate_run_id = None;
                        Some(self.open_gate(wf, id, next, manifest).await)
                    }
                    other => {
                        next.state = state::FAILED.to_string();
                        next.detail = Some(format!(
                            "the gate ended `{other}`: {}",
                            run.detail.unwrap_or_else(|| "not approved".to_string())
                        ));
                        Some(next)
                    }
                }
            }
            state::RUNNING => {
                let run_id = row.run_id.clone()?;
                let run = self.run_row(&run_id).await?;
                match run.state.as_str() {
                    run_state::QUEUED | run_state::RUNNING => None,
                    run_state::SUCCEEDED => {
                        match self.outputs(step, &run).await {
                            Ok(outputs) => {
                                next.state = state::SUCCEEDED.to_string();
                                next.outputs = Some(outputs);
                            }
                            Err(why) => {
                                next.state = state::FAILED.to_string();
                                next.detail = Some(why);
                            }
                        }
                        Some(next)
                    }
                    run_state::INTERRUPTED if row.starts < MAX_STEP_STARTS => {
                        Some(self.start_run(wf, id, step, next, ctx).await)
                    }
                    run_state::CANCELLED => {
                        next.state = state::CANCELLED.to_string();
                        next.detail = Some(format!("run `{run_id}` was cancelled"));
                        Some(next)
                    }
                    other => {
                        next.state = state::FAILED.to_string();
                        next.detail = Some(match run.detail {
                            Some(d) => format!("run `{run_id}` ended `{other}`: {d}"),
                            None => format!("run `{run_id}` ended `{other}`"),
                        });
                        Some(next)
                    }
                }
            }
            _ => None,
        }
    }

    async fn run_row(&self, id: &str) -> Option<RunRow> {
        let id = id.to_string();
        match self.read(move |s| s.run_row(&id)).await {
            Ok(row) => row,
            Err(e) => {
                tracing::warn!("workflows: cannot read a step's run: {e}");
                None
            }
        }
    }

    /// Queue the run of instance `row` of step `id`: its prompt and base
    /// rendered now, from the journal as it stands.
    async fn start_run(
        &self,
        wf: &WorkflowRow,
        id: &str,
        step: &Step,
        mut row: StepRow,
        ctx: &Value,
    ) -> StepRow {
        let ctx = values::with_matrix(ctx, row.matrix.as_ref());
        let rendered = values::prompt(step, &ctx).and_then(|p| Ok((p, values::base(step, &ctx)?)));
        let (prompt, mut base) = match rendered {
            Ok(r) => r,
            Err(why) => return failed(row, why),
        };
        if !step.merge.is_empty() {
            // Fan-in: the branches of the merged steps (every instance of a
            // fan-out), merged into the base first.
            let branches = merged_branches(&step.merge, &ctx);
            let onto = base.clone().unwrap_or_else(|| "HEAD".to_string());
            match crate::runs::workspace::merge_branches(
                &self.cx.supervisor,
                &self.cx.repo,
                &onto,
                &branches,
            )
            .await
            {
                Ok(commit) => base = Some(commit),
                Err(e) => return failed(row, e.to_string()),
            }
        }
        let payload = StepRunPayload {
            workflow_run: wf.id.clone(),
            workflow: wf.name.clone(),
            step: id.to_string(),
            instance: row.instance,
            prompt,
            base,
            context: ctx,
        };
        let payload = match serde_json::to_value(&payload) {
            Ok(p) => p,
            Err(e) => return failed(row, e.to_string()),
        };
        let submission = Submission::new(&step_queue(&wf.name, id), RunOrigin::Workflow, payload);
        match self.runs.submit(submission, Overlap::Queue).await {
            Ok(accepted) => {
                row.run_id = Some(accepted.run_id);
                row.starts = row.starts.saturating_add(1);
                row.state = state::RUNNING.to_string();
                row.detail = None;
                row
            }
            Err(e) => failed(row, format!("the step's run could not be queued: {e}")),
        }
    }

    /// Open the gate of instance `row` of step `id`: a run of its own
    /// (recorded `running`, owned by this process) parks an approval that
    /// `npc runs approve RUN` answers; a task waits for the answer and ends
    /// the gate's run `succeeded` or `blocked`.
    async fn open_gate(
        &self,
        wf: &WorkflowRow,
        id: &str,
        mut row: StepRow,
        manifest: &Arc<Manifest>,
    ) -> StepRow {
        let gate = crate::runs::new_run_id();
        let payload = json!({
            "workflow_run": wf.id,
            "workflow": wf.name,
            "step": id,
            "instance": row.instance,
            "gate": "approval",
        });
        let new = NewRun {
            claimed_by: Some(crate::runs::this_process().unwrap_or_default()),
            ..NewRun::new(
                &gate,
                step_queue(&wf.name, id),
                RunOrigin::Workflow,
                payload.to_string(),
            )
        };
        if let Err(e) = self.store.enqueue_run(new).await {
            return failed(row, format!("the gate could not be recorded: {e}"));
        }
        crate::stdx::lock(&self.gates).insert(gate.clone());
        let request = crate::surfaces::approval::ApprovalRequest {
            hook: format!("workflow `{}` step `{id}` gate", wf.name),
            reason: Some(format!(
                "workflow run `{}` waits for a person before step `{id}`",
                wf.id
            )),
            tool_call: crate::surfaces::approval::ToolCallInfo {
                id: gate.clone(),
                name: GATE_TOOL.to_string(),
                arguments: payload,
            },
        };
        let approver = crate::hooks::park::ParkApprover::new(
            self.store.clone(),
            Some(self.bus.clone()),
            gate.clone(),
            None,
            manifest.clone(),
            Arc::new(|| Ok(())),
        );
        let (store, runs, gates) = (self.store.clone(), self.runs.clone(), self.gates.clone());
        let waiting = gate.clone();
        tokio::spawn(async move {
            use crate::hooks::{Approval, Approve};
            let (end, detail) = match approver.approve(request).await {
                Approval::Allow => (run_state::SUCCEEDED, None),
                Approval::Deny { reason } => (run_state::BLOCKED, Some(reason)),
            };
            if let Err(e) = store.mark_run(&waiting, end, detail).await {
                tracing::warn!("workflows: cannot record the end of gate `{waiting}`: {e}");
            }
            crate::stdx::lock(&gates).remove(&waiting);
            runs.changed();
        });
        row.gate_run_id = Some(gate);
        row.starts = row.starts.saturating_add(1);
        row.state = state::WAITING.to_string();
        row.detail = Some("waits for a person: `npc runs approve` its gate's run".to_string());
        row
    }

    /// What a succeeded run of `step` hands on: its branch, head, base and
    /// diff (a worktree run), its final message, what its agent reported
    /// through `npc_progress` (`progress`), and the step's output file,
    /// read and checked against its schema.
    async fn outputs(&self, step: &Step, run: &RunRow) -> Result<Value, String> {
        let mut out = serde_json::Map::new();
        let result = run
            .result
            .as_ref()
            .and_then(|r| serde_json::from_value::<crate::event::RunResult>(r.clone()).ok());
        if let Some(r) = &result {
            out.insert("branch".into(), json!(r.branch));
            out.insert("head".into(), json!(r.head));
            out.insert("base".into(), json!(r.base));
            out.insert(
                "diff".into(),
                json!({ "files": r.files, "insertions": r.insertions, "deletions": r.deletions }),
            );
        }
        let run_id = run.id.clone();
        if let Ok(Some(message)) = self.read(move |s| s.last_message_of_run(&run_id)).await {
            out.insert("message".into(), json!(message));
        }
        let run_id = run.id.clone();
        if let Ok(progress) = self.read(move |s| s.progress_of_run(&run_id)).await
            && !progress.is_empty()
        {
            out.insert("progress".into(), Value::Object(progress));
        }
        if let Some(spec) = &step.outputs {
            let text = match &result {
                Some(r) => {
                    if !r.head.bytes().all(|b| b.is_ascii_hexdigit()) {
                        return Err(format!("run `{}` recorded an unreadable head", run.id));
                    }
                    let (text, cut) = crate::runs::workspace::git_output(
                        &self.cx.supervisor,
                        &self.cx.repo,
                        &["show", &format!("{}:{}", r.head, spec.file)],
                        MAX_OUTPUT_FILE_BYTES,
                    )
                    .await
                    .map_err(|e| {
                        format!(
                            "the step wrote no output file `{}` on its branch: {e}",
                            spec.file
                        )
                    })?;
                    if cut {
                        return Err(format!(
                            "output file `{}` is larger than {MAX_OUTPUT_FILE_BYTES} bytes",
                            spec.file
                        ));
                    }
                    text
                }
                None => {
                    let root =
                        crate::repofs::Root::new(&self.cx.repo).map_err(|e| e.to_string())?;
                    let bytes = root
                        .read(Path::new(&spec.file), MAX_OUTPUT_FILE_BYTES)
                        .map_err(|e| format!("the step's output file cannot be read: {e}"))?;
                    String::from_utf8(bytes)
                        .map_err(|_| format!("output file `{}` is not UTF-8", spec.file))?
                }
            };
            let output: Value = serde_json::from_str(&text)
                .map_err(|e| format!("output file `{}` is not JSON: {e}", spec.file))?;
            if let Some(schema) = &spec.schema {
                let schema: Value = serde_json::from_str(schema).map_err(|e| e.to_string())?;
                let validator = jsonschema::validator_for(&schema).map_err(|e| e.to_string())?;
                if let Some(error) = validator.iter_errors(&output).next() {
                    return Err(format!(
                        "output file `{}` does not match its schema: {error} (at `{}`)",
                        spec.file,
                        error.instance_path()
                    ));
                }
            }
            out.insert("output".into(), output);
        }
        Ok(Value::Object(out))
    }

    /// Write the moved step rows and record each move.
    async fn record_steps(&self, wf: &WorkflowRow, moved: Vec<StepRow>) {
        if moved.is_empty() {
            return;
        }
        if let Err(e) = self.store.put_steps(moved.clone()).await {
            tracing::error!("workflows: cannot record the steps of `{}`: {e}", wf.id);
            return;
        }
        for row in moved {
            let run_id = match row.state.as_str() {
                state::WAITING => row.gate_run_id.clone(),
                _ => row.run_id.clone(),
            };
            self.publish(
                &wf.id,
                Event::WorkflowStep(WorkflowStep {
                    workflow_run: wf.id.clone(),
                    workflow: wf.name.clone(),
                    step: row.step,
                    instance: row.instance,
                    state: row.state,
                    run_id,
                    detail: row.detail,
                }),
            )
            .await;
        }
    }

    /// End workflow run `wf` in `end` (once: a run that ended stays so).
    async fn finish(&self, wf: &WorkflowRow, end: &'static str, detail: Option<String>) {
        match self
            .store
            .set_workflow_state(wf.id.clone(), end, detail.clone())
            .await
        {
            Ok(true) => {
                let kept = crate::store::workflows::WORKFLOW_HISTORY_LIMIT;
                if let Err(e) = self.store.prune_workflows(kept).await {
                    tracing::warn!("workflows: cannot prune old workflow runs: {e}");
                }
                self.publish(
                    &wf.id,
                    Event::WorkflowFinished(WorkflowFinished {
                        workflow_run: wf.id.clone(),
                        workflow: wf.name.clone(),
                        state: end.to_string(),
                        detail,
                    }),
                )
                .await;
            }
            Ok(false) => {}
            Err(e) => tracing::error!("workflows: cannot record the end of `{}`: {e}", wf.id),
        }
    }

    async fn publish(&self, id: &str, event: Event) {
        let kind = event.kind();
        let event = event.for_component(component(id));
        if let Err(e) = self.bus.publish(event).await {
            tracing::warn!("workflows: cannot record `{kind}`: {e}");
        }
    }
}

impl crate::runs::executor::WorkflowStarter for Workflows {
    fn start_workflow<'a>(
        &'a self,
        name: &'a str,
        inputs: BTreeMap<String, String>,
        payload: Value,
        origin: RunOrigin,
    ) -> futures_util::future::BoxFuture<'a, Result<String, String>> {
        Box::pin(async move {
            self.start(name, inputs, payload, origin)
                .await
                .map_err(|e| e.to_string())
        })
    }
}

/// The component workflow run `id`'s events are recorded under.
pub fn component(id: &str) -> String {
    format!("workflow.{id}")
}

/// A new workflow run id: [`WORKFLOW_ID_PREFIX`] and a run id's time and
/// randomness.
fn new_workflow_id() -> String {
    let run = crate::runs::new_run_id();
    let tail = run.strip_prefix(crate::runs::RUN_ID_PREFIX).unwrap_or(&run);
    format!("{WORKFLOW_ID_PREFIX}{tail}")
}

/// The inputs of a start of workflow `name`: every one declared, given or
/// defaulted; an unknown, missing or oversized one refused.
fn inputs_of(
    name: &str,
    decl: &Workflow,
    given: BTreeMap<String, String>,
) -> Result<Value, StartError> {
    let known = || {
        let names: Vec<&str> = decl.inputs.keys().map(String::as_str).collect();
        listed(&names, "no inputs")
    };
    for (input, value) in &given {
        if !decl.inputs.contains_key(input) {
            return Err(StartError::UnknownInput {
                workflow: name.to_string(),
                input: input.clone(),
                known: known(),
            });
        }
        if value.len() > MAX_INPUT_BYTES {
            return Err(StartError::InputTooLong {
                input: input.clone(),
            });
        }
    }
    let mut out = serde_json::Map::new();
    for (input, declared) in &decl.inputs {
        let value = given
            .get(input)
            .or(declared.default.as_ref())
            .ok_or_else(|| StartError::MissingInput {
                workflow: name.to_string(),
                input: input.clone(),
            })?;
        out.insert(input.clone(), json!(value));
    }
    Ok(Value::Object(out))
}

fn listed(names: &[&str], none: &str) -> String {
    if names.is_empty() {
        none.to_string()
    } else {
        names
            .iter()
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The branches of steps `merge` as `ctx` holds them: a step's `branch`,
/// or a fan-out's `branches`, in order.
fn merged_branches(merge: &[String], ctx: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for id in merge {
        let step = &ctx["steps"][id];
        if let Some(branch) = step["branch"].as_str() {
            out.push(branch.to_string());
        }
        out.extend(
            step["branches"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(str::to_string),
        );
    }
    out
}

fn failed(mut row: StepRow, why: String) -> StepRow {
    row.state = state::FAILED.to_string();
    row.detail = Some(why);
    row
}

/// The rows of step `id` once it is reached (every step it needs ended),
/// or `None` while it is not: `failed` or `skipped` after a need that
/// failed or was skipped, `skipped` when its `when` is false, else one
/// `pending` row per instance of its matrix.
fn reach(
    wf: &WorkflowRow,
    id: &str,
    step: &Step,
    journal: &BTreeMap<String, Vec<StepRow>>,
) -> Option<Vec<StepRow>> {
    let mut failed_need = None;
    let mut skipped_need = None;
    for need in &step.needs {
        let rows = journal.get(need)?;
        let whole = values::aggregate(rows.iter().map(|r| r.state.as_str()));
        if !state::is_final(whole) {
            return None;
        }
        match whole {
            state::FAILED | state::CANCELLED => failed_need = Some(need),
            state::SKIPPED => skipped_need = Some(need),
            _ => {}
        }
    }
    let one = |st: &str, detail: String| {
        let mut row = StepRow::new(&wf.id, id, 0, st);
        row.detail = Some(detail);
        Some(vec![row])
    };
    if let Some(need) = failed_need {
        return one(
            state::FAILED,
            format!("needs step `{need}`, which did not succeed"),
        );
    }
    if let Some(need) = skipped_need {
        return one(
            state::SKIPPED,
            format!("needs step `{need}`, which was skipped"),
        );
    }
    let ctx = values::context(wf, journal);
    match values::when(step, &ctx) {
        Ok(true) => {}
        Ok(false) => return one(state::SKIPPED, "its `when` is false".to_string()),
        Err(why) => return one(state::FAILED, why),
    }
    match values::instances(step, &ctx) {
        Ok(list) => Some(
            list.into_iter()
                .enumerate()
                .map(|(i, matrix)| StepRow {
                    matrix,
                    ..StepRow::new(
                        &wf.id,
                        id,
                        u32::try_from(i).unwrap_or(u32::MAX),
                        state::PENDING,
                    )
                })
                .collect(),
        ),
        Err(why) => one(state::FAILED, why),
    }
}

/// The steps that failed, for a failed workflow's detail.
fn failed_steps(journal: &BTreeMap<String, Vec<StepRow>>) -> String {
    let names: Vec<&str> = journal
        .iter()
        .filter(|(_, rows)| {
            rows.iter()
                .any(|r| r.state == state::FAILED || r.state == state::CANCELLED)
        })
        .map(|(id, _)| id.as_str())
        .collect();
    format!("steps that did not succeed: {}", names.join(", "))
}

/// A workflow run as `npc workflow show` and the API show it.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct WorkflowView {
    pub id: String,
    pub workflow: String,
    pub state: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    pub origin: String,
    pub inputs: Value,
    pub created_at_ms: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at_ms: Option<i64>,
    /// Every step, keyed by id, in the order they run (`pending` before
    /// they are reached).
    pub steps: indexmap::IndexMap<String, StepView>,
}

/// A step of a [`WorkflowView`]: one instance's fields, or for a fan-out
/// the whole's state with each instance under `instances`.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct StepView {
    pub state: String,
    /// The run carrying it out.
    pub run: Option<String>,
    /// The run its gate waits (or waited) in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gate_run: Option<String>,
    /// Its result's branch (a worktree run).
    pub branch: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub head: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The steps it needs.
    pub needs: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub matrix: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outputs: Option<Value>,
    /// A fan-out's instances.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub instances: Vec<StepView>,
}

impl StepView {
    fn of(row: &StepRow, needs: Vec<String>) -> Self {
        let field = |k: &str| {
            row.outputs
                .as_ref()
                .and_then(|o| o.get(k))
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        Self {
            state: row.state.clone(),
            run: row.run_id.clone(),
            gate_run: row.gate_run_id.clone(),
            branch: field("branch"),
            head: field("head"),
            detail: row.detail.clone(),
            needs,
            matrix: row.matrix.clone(),
            outputs: row.outputs.clone(),
            instances: Vec::new(),
        }
    }
}

impl WorkflowView {
    pub fn of(wf: WorkflowRow, rows: Vec<StepRow>, decl: Option<&Workflow>) -> Self {
        let mut journal: BTreeMap<String, Vec<StepRow>> = BTreeMap::new();
        for row in rows {
            journal.entry(row.step.clone()).or_default().push(row);
        }
        let order: Vec<String> = match decl {
            Some(d) => d.order.clone(),
            None => journal.keys().cloned().collect(),
        };
        let needs_of = |id: &str| {
            decl.and_then(|d| d.steps.get(id))
                .map(|s| s.needs.clone())
                .unwrap_or_default()
        };
        let mut steps = indexmap::IndexMap::new();
        for id in order {
            let needs = needs_of(&id);
            let view = match journal.get(&id).map(Vec::as_slice) {
                None | Some([]) => StepView {
                    state: state::PENDING.to_string(),
                    run: None,
                    gate_run: None,
                    branch: None,
                    head: None,
                    detail: None,
                    needs,
                    matrix: None,
                    outputs: None,
                    instances: Vec::new(),
                },
                Some([only]) if only.matrix.is_none() => StepView::of(only, needs),
                Some(many) => StepView {
                    state: values::aggregate(many.iter().map(|r| r.state.as_str())).to_string(),
                    run: None,
                    gate_run: None,
                    branch: None,
                    head: None,
                    detail: None,
                    needs: needs.clone(),
                    matrix: None,
                    outputs: None,
                    instances: many.iter().map(|r| StepView::of(r, Vec::new())).collect(),
                },
            };
            steps.insert(id, view);
        }
        Self {
            id: wf.id,
            workflow: wf.name,
            state: wf.state,
            detail: wf.detail,
            origin: wf.origin,
            inputs: wf.inputs,
            created_at_ms: wf.created_at_ms,
            finished_at_ms: wf.finished_at_ms,
            steps,
        }
    }
}
