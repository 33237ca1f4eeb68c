//! Workflows over the API: the declared workflows and their recent runs
//! (`GET /api/v1/workflows`, the objects of `npc workflows --format
//! json`), a start (`POST /api/v1/workflows/{name}/runs`, as `npc workflow
//! run`), one workflow run with each step's state, branch and run (`GET
//! /api/v1/workflow-runs/{id}`, the JSON of `npc workflow show`), and a
//! cancel. Handlers check what the client sent, then call the
//! [`ApiBackend`](super::ApiBackend), which asks the daemon's workflow
//! engine; a name or id from the path is only ever looked up (in the
//! applied manifest, or as a bound parameter of the store's query), never
//! used as a file path.

use std::collections::BTreeMap;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::{Deserialize, Serialize};

use super::resources::{accepted, optional_body, path};
use super::{ApiError, ApiState};
use crate::workflows::WorkflowView;

/// Workflow runs `GET /api/v1/workflows` lists, newest first.
pub const WORKFLOW_RUNS_LISTED: usize = 50;

/// `GET /api/v1/workflows`.
#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct WorkflowsPage {
    /// The applied manifest's `[workflows.NAME]`, by name.
    pub workflows: Vec<DeclaredWorkflow>,
    /// The latest workflow runs, newest first (at most 50).
    pub runs: Vec<WorkflowRunSummary>,
}

/// A declared workflow.
#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct DeclaredWorkflow {
    pub name: String,
    pub description: Option<String>,
    /// Its inputs' names.
    pub inputs: Vec<String>,
    /// Its steps, each after the steps it needs.
    pub steps: Vec<String>,
}

/// A workflow run as the listing shows it.
#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct WorkflowRunSummary {
    /// `wf-…`.
    pub id: String,
    pub workflow: String,
    /// `running`, `succeeded`, `failed` or `cancelled`.
    pub state: String,
    pub created_at_ms: i64,
    pub finished_at_ms: Option<i64>,
}

/// `POST /api/v1/workflows/{name}/runs` (the body may be empty).
#[derive(Debug, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StartWorkflow {
    /// The workflow's inputs by name (the declared defaults fill in the
    /// rest), as `--input KEY=VALUE`.
    #[serde(default)]
    pub inputs: BTreeMap<String, String>,
}

/// A workflow run the engine recorded.
#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct WorkflowAccepted {
    /// The workflow run (`wf-…`).
    pub id: String,
}

/// `POST /api/v1/workflow-runs/{id}/cancel`.
#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct WorkflowCancelled {
    pub id: String,
    /// `cancelled`.
    pub state: String,
}

/// No workflow run `id`.
pub fn workflow_run_not_found(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "workflow_run.not_found",
        format!("no workflow run `{id}`; list them with `GET /api/v1/workflows`"),
    )
}

/// `GET /api/v1/workflows`.
pub(super) async fn list(State(state): State<ApiState>) -> Result<Json<WorkflowsPage>, ApiError> {
    state.backend.workflows().await.map(Json)
}

/// `POST /api/v1/workflows/{name}/runs`.
pub(super) async fn start(
    State(state): State<ApiState>,
    name: Result<Path<String>, PathRejection>,
    raw: Bytes,
) -> Result<Response, ApiError> {
    let name = path(name)?;
    let request: StartWorkflow = optional_body(&raw)?;
    let id = state.backend.start_workflow(name, request.inputs).await?;
    Ok(accepted(WorkflowAccepted { id }))
}

/// `GET /api/v1/workflow-runs/{id}`.
pub(super) async fn show(
    State(state): State<ApiState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<WorkflowView>, ApiError> {
    let id = path(id)?;
    state.backend.workflow_run(id).await.map(Json)
}

/// `POST /api/v1/workflow-runs/{id}/cancel`.
pub(super) async fn cancel(
    State(state): State<ApiState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let id = path(id)?;
    let state_after = state.backend.cancel_workflow(id.clone()).await?;
    Ok(accepted(WorkflowCancelled {
        id,
        state: state_after,
    }))
}

/// What a backend that runs no workflows answers.
pub fn no_workflows() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        "this backend runs no workflows; ask the daemon (`npc daemon`)",
    )
}
