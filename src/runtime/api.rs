//! The daemon's side of the REST API: [`DaemonApi`] answers
//! `api` from the runtime, with the same documents the control
//! socket gives `npc status` and `npc apply`, and, in front of a fleet,
//! the fleet's roster, runs and event log from its shared store.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};

use super::{Preview, ReloadOutcome, Runtime};
use crate::bus::EventBus;
use crate::event::{ApiFailed, ApiListening, Event};
use crate::store::Store;
use tokio_util::sync::CancellationToken;

use crate::api::resources::{FireAccepted, PaneAnswer, PaneOp, PaneView, pane_error, pane_view};
use crate::api::terminal::Terminal;
use crate::panes::PaneError;
use futures_util::future::BoxFuture;

use crate::api::auth::ApiAuth;
use crate::api::fleet::{FleetRuns, FleetWorkers};
use crate::api::listings::{self, PluginRow};
use crate::api::workflows::{
    DeclaredWorkflow, WORKFLOW_RUNS_LISTED, WorkflowRunSummary, WorkflowsPage,
    workflow_run_not_found,
};
use crate::api::{Answer, ApiBackend, ApiError, ApiListener};
use crate::runs::executor::CancelError;
use crate::runs::queue::Refused;
use crate::store::fleet::Roster;
use crate::store::pg::PgStore;
use crate::surfaces::runs::ManualRun;
use crate::surfaces::tcp::Access;
use crate::workflows::WorkflowView;
use axum::http::StatusCode;

/// What the plan is compared with, as the API says it.
pub const PLAN_AGAINST: &str = "the running daemon";

/// The status document: the daemon's pid, each component, each MCP server.
pub async fn status_document(runtime: &Runtime) -> Value {
    serde_json::to_value(status_reply(runtime).await).unwrap_or_default()
}

/// [`status_document`], typed: the control channel's answer to `status`.
pub async fn status_reply(runtime: &Runtime) -> crate::surfaces::control::StatusReply {
    let mcp = json!({ "gateway": "daemon", "servers": runtime.mcp().pool().status() });
    crate::surfaces::control::StatusReply {
        pid: std::process::id(),
        components: runtime.status().await,
        mcp,
        api: runtime.api_url().map(str::to_string),
        store: store_document(runtime),
    }
}

/// Which store takes the runs and, in a fleet, this daemon's `role`
/// (`all`, `ingress`, `scheduler`) and, when its role schedules, whether it
/// leads the fleet's cron scheduling (`scheduling`: `standby` or `leader`).
fn store_document(runtime: &Runtime) -> Value {
    let mut store = runtime.runs().queue().store_status();
    if let Some(role) = runtime.triggers().role() {
        store["role"] = json!(role);
        let scheduling = runtime.triggers().scheduling();
        if role.schedules() && scheduling != super::triggers::Scheduling::Local {
            store["scheduling"] = json!(scheduling);
        }
    }
    store
}

/// Start the REST API on `daemon.listen` for `runtime` until `shutdown`.
/// Returns its base URL; a failure to listen is an `api.failed` event and
/// a warning, never the daemon's end (the control socket still serves).
pub async fn start(
    runtime: &Arc<Runtime>,
    daemon: &crate::model::Daemon,
    shutdown: CancellationToken,
) -> Option<String> {
    let access = match runtime.paths().access(daemon) {
        Ok(access) => access,
        Err(e) => return api_off(runtime, daemon, &e).await,
    };
    let locked = matches!(access, Access::Token(_));
    let auth = ApiAuth {
        access,
        dashboard: runtime.dashboard.clone(),
    };
    match ApiListener::bind(daemon.listen, auth).await {
        Ok(listener) => {
            let addr = listener.local_addr()?;
            let url = format!("http://{addr}");
            let _ = runtime.api_url.set(url.clone());
            let _ = runtime.api_locked.set(locked);
            if let Some(notify) = runtime.notify() {
                notify.set_base(&url);
            }
            runtime
                .emit(Event::ApiListening(ApiListening { url: url.clone() }), None)
                .await;
            let backend = Arc::new(DaemonApi {
                runtime: runtime.clone(),
            });
            tokio::spawn(async move {
                if let Err(e) = listener.serve(backend, shutdown).await {
                    tracing::error!("the REST API stopped: {e}");
                }
            });
            Some(url)
        }
        Err(e) => api_off(runtime, daemon, &e).await,
    }
}

/// The REST API does not serve: a warning and an `api.failed` event.
async fn api_off(
    runtime: &Runtime,
    daemon: &crate::model::Daemon,
    e: &dyn std::fmt::Display,
) -> Option<String> {
    tracing::warn!("the REST API is off: {e}");
    runtime
        .emit(
            Event::ApiFailed(ApiFailed {
                listen: daemon.listen.to_string(),
                error: e.to_string(),
            }),
            None,
        )
        .await;
    None
}

/// A reload's outcome as an API answer.
pub fn outcome_answer(outcome: &ReloadOutcome) -> Answer {
    match outcome {
        ReloadOutcome::Invalid { error_count } => Answer::Invalid(json!({
            "error_count": error_count,
            "hint": "the `manifest.invalid` event has every diagnostic; `GET /api/v1/plan` shows them too",
        })),
        ReloadOutcome::Refused { reasons } => Answer::Refused(json!({ "reasons": reasons })),
        ReloadOutcome::Failed { error } => Answer::Failed(error.clone()),
        ReloadOutcome::Stale => Answer::Refused(json!({ "reasons": [super::STALE_PLAN] })),
        ReloadOutcome::Applied { .. } => {
            Answer::Ok(serde_json::to_value(outcome).unwrap_or_default())
        }
    }
}

/// The API backend of a running daemon.
#[derive(Debug, Clone)]
pub struct DaemonApi {
    pub runtime: Arc<Runtime>,
}

impl DaemonApi {
    /// The fleet's shared store, or why there is none to read: no
    /// `[store] url` (404), or not reached yet (503).
    fn fleet(&self) -> Result<Arc<PgStore>, ApiError> {
        if let Some(store) = self.runtime.fleet_store() {
            return Ok(store.clone());
        }
        let status = self.runtime.runs().queue().store_status();
        if status["kind"] != "postgres" {
            return Err(crate::api::fleet::no_fleet());
        }
        let why = status["error"]
            .as_str()
            .unwrap_or("this daemon is still connecting to it");
        Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "store.unreachable",
            Refused::Unreachable(why.to_string()).to_string(),
        ))
    }
}

/// A failed read of the fleet's store: logged, answered in general terms.
fn fleet_failed(e: &crate::store::StoreError) -> ApiError {
    tracing::warn!("api: cannot read the fleet's store: {e}");
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "store.unreachable",
        "the fleet's store did not answer; retry (the daemon's log says why)",
    )
}

impl ApiBackend for DaemonApi {
    fn status(&self) -> BoxFuture<'_, Value> {
        Box::pin(status_document(&self.runtime))
    }

    fn plan(&self) -> BoxFuture<'_, Answer> {
        Box::pin(async move {
            match self.runtime.preview().await {
                Preview::Plan(plan) => Answer::Ok(crate::plan::render_json(&plan, PLAN_AGAINST)),
                Preview::Invalid { payload } => Answer::Invalid(payload),
                Preview::Failed { error } => Answer::Failed(error),
            }
        })
    }

    fn apply(&self, reason: &'static str) -> BoxFuture<'_, Answer> {
        Box::pin(async move {
            let (outcome, _) = self.runtime.reload(reason).await;
            outcome_answer(&outcome)
        })
    }

    fn store(&self) -> Arc<Store> {
        self.runtime.store().clone()
    }

    fn bus(&self) -> EventBus {
        self.runtime.bus().clone()
    }

    fn start_run(&self, run: ManualRun) -> BoxFuture<'_, Result<String, ApiError>> {
        Box::pin(async move {
            use crate::runs::StartRunError as E;
            self.runtime
                .runs()
                .start_manual(run)
                .await
                .map_err(|e| match e {
                    E::NoManifest => ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "unavailable",
                        e.to_string(),
                    ),
                    E::Refused(Refused::QueueFull(_)) => ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "run.queue_full",
                        "too many runs started by hand are waiting; retry once some have run",
                    ),
                    E::Refused(Refused::Store(detail)) => ApiError::internal(detail),
                    E::Refused(e @ Refused::Unreachable(_)) => ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "store.unreachable",
                        e.to_string(),
                    ),
                    other => ApiError::new(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        "run.invalid",
                        other.to_string(),
                    ),
                })
        })
    }

    fn run_diff(
        &self,
        id: String,
    ) -> BoxFuture<'_, Result<crate::api::resources::RunDiff, ApiError>> {
        Box::pin(async move {
            let store = self.runtime.store().clone();
            let key = id.clone();
            let row = tokio::task::spawn_blocking(move || store.run_row(&key))
                .await
                .map_err(|e| ApiError::internal(e.to_string()))?
                .map_err(|e| ApiError::internal(e.to_string()))?
                .ok_or_else(|| crate::api::resources::run_not_found(&id))?;
            let result = crate::runs::workspace::RunResult::of(&row).ok_or_else(|| {
                ApiError::new(
                    StatusCode::NOT_FOUND,
                    "run.no_result",
                    format!("run `{id}` handed back no branch; only worktree runs do"),
                )
            })?;
            let (patch, truncated) = crate::runs::workspace::patch(
                &self.runtime.cx.supervisor,
                &self.runtime.paths().root,
                &result,
            )
            .await
            .map_err(|e| ApiError::internal(e.to_string()))?;
            Ok(crate::api::resources::RunDiff {
                run_id: id,
                branch: result.branch,
                base: result.base,
                head: result.head,
                patch,
                truncated,
            })
        })
    }

    fn answer_run(
        &self,
        id: String,
        approval: Option<String>,
        answer: crate::store::approvals::Answer,
    ) -> BoxFuture<'_, Result<crate::api::resources::RunAnswered, ApiError>> {
        Box::pin(async move {
            use crate::store::approvals::AnswerRefused;
            match self.runtime.answer_run(&id, approval, answer, "api").await {
                Ok(row) => Ok(crate::api::resources::RunAnswered {
                    run_id: row.run_id,
                    approval_id: row.id,
                    tool: row.tool,
                    state: row.state,
                    always: row.always,
                }),
                Err(crate::runs::AnswerError::Refused(AnswerRefused::NoRun { .. })) => {
                    Err(crate::api::resources::run_not_found(&id))
                }
                Err(crate::runs::AnswerError::Refused(e @ AnswerRefused::Ended { .. })) => Err(
                    ApiError::new(StatusCode::CONFLICT, "run.finished", e.to_string()),
                ),
                Err(crate::runs::AnswerError::Refused(
                    e @ (AnswerRefused::NotWaiting { .. } | AnswerRefused::AlreadyAnswered { .. }),
                )) => Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "run.not_waiting",
                    e.to_string(),
                )),
                Err(crate::runs::AnswerError::Refused(e @ AnswerRefused::NoApproval { .. })) => {
                    Err(ApiError::new(
                        StatusCode::NOT_FOUND,
                        "approval.not_found",
                        e.to_string(),
                    ))
                }
                Err(e @ crate::runs::AnswerError::Store(_)) => Err(ApiError::internal(e)),
            }
        })
    }

    fn cancel_run(&self, id: String) -> BoxFuture<'_, Result<String, ApiError>> {
        Box::pin(async move {
            match self.runtime.runs().cancel(&id).await {
                Ok(state) => Ok(state),
                Err(CancelError::Finished { id, state }) => Err(finished(&id, &state)),
                Err(e @ CancelError::Elsewhere { .. }) => Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "run.not_daemon",
                    e.to_string(),
                )),
                Err(CancelError::Store(detail)) => Err(ApiError::internal(detail)),
                Err(CancelError::NotFound(_)) => Err(crate::api::resources::run_not_found(&id)),
            }
        })
    }

    fn panes(&self) -> Vec<PaneView> {
        self.runtime
            .panes()
            .list()
            .into_iter()
            .map(pane_view)
            .collect()
    }

    fn pane(&self, name: String, op: PaneOp) -> BoxFuture<'_, Result<PaneAnswer, ApiError>> {
        Box::pin(async move {
            let panes = self.runtime.panes();
            if !panes.knows(&name) {
                return Err(pane_error(PaneError::Unknown(name)));
            }
            let view = |name: &str| {
                panes
                    .list()
                    .into_iter()
                    .find(|p| p.name == name)
                    .map(pane_view)
            };
            let mut answer = PaneAnswer {
                name: name.clone(),
                sent: None,
                pane: None,
            };
            match op {
                PaneOp::Input(bytes) => {
                    panes.user_input(&name, &bytes).map_err(pane_error)?;
                    answer.sent = Some(bytes.len());
                }
                PaneOp::Resize { rows, cols } => {
                    panes.resize(&name, rows, cols).map_err(pane_error)?;
                    answer.pane = view(&name);
                }
                PaneOp::Close => panes.close(&name).await.map_err(pane_error)?,
                PaneOp::Open => {
                    panes.open(&name).await.map_err(pane_error)?;
                    answer.pane = view(&name);
                }
            }
            Ok(answer)
        })
    }

    fn terminal(&self, name: &str) -> Result<Terminal, ApiError> {
        let panes = self.runtime.panes();
        if !panes.knows(name) {
            return Err(pane_error(PaneError::Unknown(name.to_string())));
        }
        let attached = panes.attach(name).map_err(pane_error)?;
        let pane = attached.pane.clone();
        Ok(Terminal {
            scrollback: attached.scrollback,
            output: attached.output,
            status: attached.status,
            exit: Box::new(move || {
                pane.exit()
                    .map(|e| serde_json::to_value(e).unwrap_or_default())
            }),
        })
    }

    fn triggers(&self) -> BoxFuture<'_, Result<Vec<Value>, ApiError>> {
        Box::pin(async move {
            let Some(manifest) = self.runtime.runs().manifest() else {
                return Err(no_manifest());
            };
            let live: Vec<Value> = self
                .runtime
                .triggers()
                .views()
                .iter()
                .map(|v| serde_json::to_value(v).unwrap_or_default())
                .collect();
            let store = self.runtime.store().clone();
            tokio::task::spawn_blocking(move || {
                listings::trigger_rows(&manifest, &live, Some(&store))
            })
            .await
            .map_err(ApiError::internal)?
            .map_err(ApiError::internal)
        })
    }

    fn fire(&self, name: String, payload: Value) -> BoxFuture<'_, Result<FireAccepted, ApiError>> {
        Box::pin(async move {
            use super::triggers::FireError;
            match self.runtime.triggers().fire(&name, payload).await {
                Ok(accepted) => Ok(FireAccepted {
                    run_id: accepted.run_id,
                    outcome: serde_json::to_value(accepted.outcome)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_default(),
                }),
                Err(FireError::Unknown(e)) => Err(ApiError::new(
                    StatusCode::NOT_FOUND,
                    "trigger.not_found",
                    e.to_string(),
                )),
                Err(FireError::Refused(e @ Refused::QueueFull(_))) => Err(ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "trigger.queue_full",
                    e.to_string(),
                )),
                Err(FireError::Refused(Refused::Store(detail))) => Err(ApiError::internal(detail)),
                Err(FireError::Refused(e @ Refused::Unreachable(_))) => Err(ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "store.unreachable",
                    e.to_string(),
                )),
            }
        })
    }

    fn workflows(&self) -> BoxFuture<'_, Result<WorkflowsPage, ApiError>> {
        Box::pin(async move {
            let Some(manifest) = self.runtime.runs().manifest() else {
                return Err(no_manifest());
            };
            let store = self.runtime.store().clone();
            let rows =
                tokio::task::spawn_blocking(move || store.workflows(false, WORKFLOW_RUNS_LISTED))
                    .await
                    .map_err(ApiError::internal)?
                    .map_err(ApiError::internal)?;
            Ok(WorkflowsPage {
                workflows: manifest
                    .workflows
                    .iter()
                    .map(|(name, w)| DeclaredWorkflow {
                        name: name.clone(),
                        description: w.description.clone(),
                        inputs: w.inputs.keys().cloned().collect(),
                        steps: w.order.clone(),
                    })
                    .collect(),
                runs: rows
                    .into_iter()
                    .map(|r| WorkflowRunSummary {
                        id: r.id,
                        workflow: r.name,
                        state: r.state,
                        created_at_ms: r.created_at_ms,
                        finished_at_ms: r.finished_at_ms,
                    })
                    .collect(),
            })
        })
    }

    fn start_workflow(
        &self,
        name: String,
        inputs: BTreeMap<String, String>,
    ) -> BoxFuture<'_, Result<String, ApiError>> {
        Box::pin(async move {
            use crate::workflows::StartError as E;
            self.runtime
                .workflows()
                .start(&name, inputs, Value::Null, crate::model::RunOrigin::Api)
                .await
                .map_err(|e| match e {
                    E::NoManifest => no_manifest(),
                    E::Unknown { .. } => {
                        ApiError::new(StatusCode::NOT_FOUND, "workflow.not_found", e.to_string())
                    }
                    E::UnknownInput { .. } | E::MissingInput { .. } | E::InputTooLong { .. } => {
                        ApiError::new(
                            StatusCode::UNPROCESSABLE_ENTITY,
                            "workflow.invalid_input",
                            e.to_string(),
                        )
                    }
                    E::TooMany => ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "workflow.too_many",
                        e.to_string(),
                    ),
                    E::Store(detail) => ApiError::internal(detail),
                })
        })
    }

    fn workflow_run(&self, id: String) -> BoxFuture<'_, Result<WorkflowView, ApiError>> {
        Box::pin(async move {
            self.runtime
                .workflows()
                .view(&id)
                .await
                .map_err(ApiError::internal)?
                .ok_or_else(|| workflow_run_not_found(&id))
        })
    }

    fn cancel_workflow(&self, id: String) -> BoxFuture<'_, Result<String, ApiError>> {
        Box::pin(async move {
            use crate::workflows::CancelError as E;
            self.runtime
                .workflows()
                .cancel(&id)
                .await
                .map_err(|e| match e {
                    E::NotFound(_) => workflow_run_not_found(&id),
                    E::Finished { .. } => {
                        ApiError::new(StatusCode::CONFLICT, "workflow_run.finished", e.to_string())
                    }
                    E::Store(detail) => ApiError::internal(detail),
                })
        })
    }

    fn fleet_workers(&self) -> BoxFuture<'_, Result<FleetWorkers, ApiError>> {
        Box::pin(async move {
            let store = self.fleet()?;
            let workers = Roster::workers(store.as_ref())
                .await
                .map_err(|e| fleet_failed(&e))?;
            Ok(FleetWorkers {
                fleet: store.fleet().to_string(),
                workers,
            })
        })
    }

    fn fleet_runs(
        &self,
        limit: usize,
        before: Option<String>,
    ) -> BoxFuture<'_, Result<FleetRuns, ApiError>> {
        Box::pin(async move {
            let store = self.fleet()?;
            let read = async {
                let now_ms = store.now_ms().await?;
                let rows = store.run_page(None, before.as_deref(), limit).await?;
                Ok::<_, crate::store::StoreError>((now_ms, rows))
            };
            let (now_ms, rows) = read.await.map_err(|e| fleet_failed(&e))?;
            Ok(FleetRuns {
                fleet: store.fleet().to_string(),
                now_ms,
                runs: rows.iter().map(listings::RunListing::of).collect(),
            })
        })
    }

    fn fleet_events(
        &self,
        after: i64,
        limit: usize,
        run: Option<String>,
    ) -> BoxFuture<'_, Result<Vec<crate::store::Event>, ApiError>> {
        Box::pin(async move {
            let store = self.fleet()?;
            let component = run.as_deref().map(crate::runs::component);
            store
                .event_page(after, limit, component.as_deref())
                .await
                .map_err(|e| fleet_failed(&e))
        })
    }

    fn plugins(&self) -> BoxFuture<'_, Result<Vec<PluginRow>, ApiError>> {
        Box::pin(async move {
            let manifest = self.runtime.paths().manifest.clone();
            tokio::task::spawn_blocking(move || listings::plugin_rows(Some(&manifest)))
                .await
                .map_err(ApiError::internal)?
                .map(|listing| listing.rows)
                .map_err(|e| {
                    ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "unavailable",
                        e.to_string(),
                    )
                })
        })
    }
}

/// The daemon has applied no manifest yet.
fn no_manifest() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        "the daemon has applied no manifest yet; fix it (see `npc validate`)",
    )
}

fn finished(id: &str, state: &str) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "run.finished",
        format!("run `{id}` has already ended (`{state}`); nothing to cancel"),
    )
}
