//! The API's resources beyond status and events: runs (list, start, one
//! run, its events, cancel), panes (list, input, resize, close, open),
//! triggers (list, fire) and plugins (list). Handlers check and bound what
//! the client sent, then call the [`ApiBackend`](super::ApiBackend); runs
//! are read from the store through the same listing the CLI uses.
//! Every answer and body type here derives its JSON Schema, which the
//! OpenAPI document embeds.

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{ApiError, ApiState};
use crate::api::listings::{self, PluginRow, RunSummary};
use crate::panes::{NEEDS_ATTENTION, PaneError, PaneInfo};
use crate::store::Event;
use crate::surfaces::runs::ManualRun;
use crate::triggers::MAX_MANUAL_PAYLOAD_BYTES;

/// Runs one page of `GET /api/v1/runs` lists when `limit` is absent.
pub const DEFAULT_RUNS_LIMIT: usize = 50;
/// Most runs one page lists.
pub const MAX_RUNS_LIMIT: usize = crate::store::queue::MAX_RUNS_PER_READ;
/// Events one page of `GET /api/v1/runs/{id}/events` returns when `limit` is absent.
pub const DEFAULT_RUN_EVENTS_LIMIT: usize = 500;
/// Most events one page of a run's events returns.
pub const MAX_RUN_EVENTS_LIMIT: usize = 1000;
/// Largest `data` of `POST /api/v1/panes/{name}/input`.
pub const MAX_PANE_INPUT_BYTES: usize = 8 * 1024;
/// Largest terminal dimension a resize accepts (rows or columns).
pub const MAX_TERMINAL_DIM: u16 = 1000;

/// `GET /api/v1/runs`.
#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RunsPage {
    /// Newest first.
    pub runs: Vec<RunSummary>,
    /// The daemon's clock when it read them, in unix milliseconds (what a
    /// running run's bar of the dashboard's timeline runs up to).
    pub now_ms: i64,
}

/// `POST /api/v1/runs` accepted a run.
#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RunAccepted {
    pub run_id: String,
}

/// `GET /api/v1/runs/{id}/events`.
#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RunEvents {
    /// The run's events, oldest first (the same objects as `/events`).
    pub events: Vec<Value>,
}

/// The patch of a worktree run (`GET /api/v1/runs/{id}/diff`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct RunDiff {
    pub run_id: String,
    pub branch: String,
    pub base: String,
    pub head: String,
    /// `git diff BASE HEAD`.
    pub patch: String,
    /// The patch was longer than 16 MiB and is cut there.
    pub truncated: bool,
}

/// `GET /api/v1/runs/{id}/diff`.
pub(super) async fn run_diff(
    State(state): State<ApiState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<RunDiff>, ApiError> {
    let id = path(id)?;
    state.backend.run_diff(id).await.map(Json)
}

/// `POST /api/v1/runs/{id}/cancel`.
#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RunCancelled {
    pub run_id: String,
    /// The run's state once the cancel took effect (`cancelled`, or the
    /// state it reached first).
    pub state: String,
}

/// `POST /api/v1/runs/{id}/approve` (the body may be empty).
#[derive(Debug, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ApproveRequest {
    /// Also allow the run's later identical calls (same tool, equal
    /// arguments) without asking.
    #[serde(default)]
    pub always: bool,
    /// The approval answered (`approval_id` of its `run.waiting` event):
    /// answered already, the request is refused rather than answering the
    /// run's next question. Without it, the run's oldest pending approval.
    #[serde(default)]
    pub approval_id: Option<String>,
}

/// `POST /api/v1/runs/{id}/deny` (the body may be empty).
#[derive(Debug, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DenyRequest {
    /// Why (the agent and the run's `tool.denied` event show it; cut to
    /// 1,000 characters).
    #[serde(default)]
    pub reason: Option<String>,
    /// The approval answered, as for `approve`.
    #[serde(default)]
    pub approval_id: Option<String>,
}

/// The approval an answer settled.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RunAnswered {
    pub run_id: String,
    pub approval_id: String,
    /// The tool the call was for.
    pub tool: String,
    /// `allowed` or `denied`.
    pub state: String,
    pub always: bool,
}

/// One pane.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PaneView {
    pub name: String,
    /// Unique per process (a relaunch gets a new one); absent when closed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    /// `running`, `idle`, `exited`, `held` (exited, a relaunch pending) or `closed`.
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    pub cols: u16,
    pub rows: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<Value>,
    /// The last status its plugin reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Value>,
    /// The last status says `needs_attention`.
    pub attention: bool,
}

/// `GET /api/v1/panes`.
#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PanesPage {
    pub panes: Vec<PaneView>,
}

/// `POST /api/v1/panes/{name}/input`.
#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PaneInput {
    /// Typed text, at most 8 KiB (UTF-8).
    pub data: String,
}

/// `POST /api/v1/panes/{name}/resize`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PaneSize {
    /// 1 to 1000.
    pub cols: u16,
    /// 1 to 1000.
    pub rows: u16,
}

/// What a pane operation answered.
#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PaneAnswer {
    pub name: String,
    /// Bytes written (input).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent: Option<usize>,
    /// The pane after the operation (open, resize).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pane: Option<PaneView>,
}

/// `GET /api/v1/triggers`: the objects of `npc triggers --format json`.
#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TriggersPage {
    pub triggers: Vec<Value>,
}

/// `POST /api/v1/triggers/{name}/fire` (the body may be empty).
#[derive(Debug, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FireRequest {
    /// What the action sees as the payload's `payload` (at most 32 KiB as JSON).
    #[serde(default)]
    pub payload: Option<Value>,
}

/// A firing the queue recorded.
#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FireAccepted {
    pub run_id: String,
    /// `queued`, `skipped` (overlap `skip`) or `duplicate`.
    pub outcome: String,
}

/// `GET /api/v1/plugins`: the objects of `npc plugin list --format json`.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct PluginsPage {
    pub plugins: Vec<PluginRow>,
}

/// An operation on a pane, as the backend carries it out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PaneOp {
    Input(Vec<u8>),
    Resize { rows: u16, cols: u16 },
    Close,
    Open,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RunsQuery {
    limit: Option<usize>,
    before: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RunEventsQuery {
    since: Option<i64>,
    limit: Option<usize>,
}

/// A body parsed as JSON, its failure as a stable error.
pub(super) fn body<T>(parsed: Result<Json<T>, JsonRejection>) -> Result<T, ApiError> {
    match parsed {
        Ok(Json(value)) => Ok(value),
        Err(rejection) => Err(match rejection {
            JsonRejection::JsonDataError(e) => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_body",
                format!("the body does not fit this endpoint: {}", e.body_text()),
            ),
            JsonRejection::JsonSyntaxError(e) => {
                ApiError::bad_request(format!("the body is not JSON: {}", e.body_text()))
            }
            JsonRejection::MissingJsonContentType(_) => ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "send the body as `Content-Type: application/json`",
            ),
            other if other.status() == StatusCode::PAYLOAD_TOO_LARGE => too_large(),
            other => ApiError::bad_request(format!("cannot read the body: {}", other.body_text())),
        }),
    }
}

fn too_large() -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        format!(
            "the body is larger than {} bytes; send less",
            super::MAX_BODY_BYTES
        ),
    )
}

pub(super) fn query<T>(parsed: Result<Query<T>, QueryRejection>) -> Result<T, ApiError> {
    parsed
        .map(|Query(q)| q)
        .map_err(|e| ApiError::bad_request(format!("bad query: {}", e.body_text())))
}

pub(super) fn path<T>(parsed: Result<Path<T>, PathRejection>) -> Result<T, ApiError> {
    parsed
        .map(|Path(p)| p)
        .map_err(|e| ApiError::bad_request(format!("bad path: {}", e.body_text())))
}

pub(super) fn limit(given: Option<usize>, default: usize, max: usize) -> Result<usize, ApiError> {
    let limit = given.unwrap_or(default);
    if limit == 0 || limit > max {
        return Err(ApiError::bad_request(format!(
            "`limit` must be between 1 and {max}"
        )));
    }
    Ok(limit)
}

/// Run blocking store work off the async executor.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, crate::store::StoreError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(ApiError::internal)?
        .map_err(ApiError::internal)
}

pub(super) fn accepted<T: Serialize>(value: T) -> Response {
    (StatusCode::ACCEPTED, Json(value)).into_response()
}

pub fn run_not_found(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "run.not_found",
        format!("no run `{id}`; list runs with `GET /api/v1/runs`"),
    )
}

/// `GET /api/v1/runs`.
pub(super) async fn list_runs(
    State(state): State<ApiState>,
    q: Result<Query<RunsQuery>, QueryRejection>,
) -> Result<Json<RunsPage>, ApiError> {
    let q = query(q)?;
    let limit = limit(q.limit, DEFAULT_RUNS_LIMIT, MAX_RUNS_LIMIT)?;
    let store = state.backend.store();
    let runs =
        blocking(move || listings::run_summaries(&store, limit, q.before.as_deref())).await?;
    Ok(Json(RunsPage {
        runs,
        now_ms: chrono::Utc::now().timestamp_millis(),
    }))
}

/// `POST /api/v1/runs`.
pub(super) async fn start_run(
    State(state): State<ApiState>,
    run: Result<Json<ManualRun>, JsonRejection>,
) -> Result<Response, ApiError> {
    let run = body(run)?;
    let run_id = state.backend.start_run(run).await?;
    Ok(accepted(RunAccepted { run_id }))
}

/// `GET /api/v1/runs/{id}`.
pub(super) async fn get_run(
    State(state): State<ApiState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<RunSummary>, ApiError> {
    let id = path(id)?;
    let store = state.backend.store();
    let key = id.clone();
    blocking(move || listings::run_summary(&store, &key))
        .await?
        .map(Json)
        .ok_or_else(|| run_not_found(&id))
}

/// `GET /api/v1/runs/{id}/events`.
pub(super) async fn run_events(
    State(state): State<ApiState>,
    id: Result<Path<String>, PathRejection>,
    q: Result<Query<RunEventsQuery>, QueryRejection>,
) -> Result<Json<RunEvents>, ApiError> {
    let id = path(id)?;
    let q = query(q)?;
    let limit = limit(q.limit, DEFAULT_RUN_EVENTS_LIMIT, MAX_RUN_EVENTS_LIMIT)?;
    let since = q.since.unwrap_or(0).max(0);
    let store = state.backend.store();
    let key = id.clone();
    let (known, events): (bool, Vec<Event>) = blocking(move || {
        let component = crate::runs::component(&key);
        let events = store.component_events(&component, since, limit)?;
        let known = !events.is_empty()
            || store.run_row(&key)?.is_some()
            || !store.component_events(&component, 0, 1)?.is_empty();
        Ok((known, events))
    })
    .await?;
    if !known {
        return Err(run_not_found(&id));
    }
    Ok(Json(RunEvents {
        events: events
            .iter()
            .map(|e| serde_json::to_value(e).unwrap_or_default())
            .collect(),
    }))
}

/// A JSON body that may be empty (then `T::default()`).
pub(super) fn optional_body<T: Default + serde::de::DeserializeOwned>(
    raw: &[u8],
) -> Result<T, ApiError> {
    if raw.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    let value: Value = serde_json::from_slice(raw)
        .map_err(|e| ApiError::bad_request(format!("the body is not JSON: {e}")))?;
    serde_json::from_value(value).map_err(|e| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
            format!("the body does not fit this endpoint: {e}"),
        )
    })
}

/// `POST /api/v1/runs/{id}/approve`.
pub(super) async fn approve_run(
    State(state): State<ApiState>,
    id: Result<Path<String>, PathRejection>,
    raw: Bytes,
) -> Result<Json<RunAnswered>, ApiError> {
    let id = path(id)?;
    let request: ApproveRequest = optional_body(&raw)?;
    let answer = crate::store::approvals::Answer::Allow {
        always: request.always,
    };
    state
        .backend
        .answer_run(id, request.approval_id, answer)
        .await
        .map(Json)
}

/// `POST /api/v1/runs/{id}/deny`.
pub(super) async fn deny_run(
    State(state): State<ApiState>,
    id: Result<Path<String>, PathRejection>,
    raw: Bytes,
) -> Result<Json<RunAnswered>, ApiError> {
    let id = path(id)?;
    let request: DenyRequest = optional_body(&raw)?;
    let answer = crate::store::approvals::Answer::Deny {
        reason: request.reason,
    };
    state
        .backend
        .answer_run(id, request.approval_id, answer)
        .await
        .map(Json)
}

/// `POST /api/v1/runs/{id}/cancel`.
pub(super) async fn cancel_run(
    State(state): State<ApiState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let id = path(id)?;
    let state_after = state.backend.cancel_run(id.clone()).await?;
    Ok(accepted(RunCancelled {
        run_id: id,
        state: state_after,
    }))
}

/// `GET /api/v1/panes`.
pub(super) async fn list_panes(State(state): State<ApiState>) -> Json<PanesPage> {
    Json(PanesPage {
        panes: state.backend.panes(),
    })
}

async fn pane_op(state: &ApiState, name: String, op: PaneOp) -> Result<PaneAnswer, ApiError> {
    state.backend.pane(name, op).await
}

/// `POST /api/v1/panes/{name}/input`.
pub(super) async fn pane_input(
    State(state): State<ApiState>,
    name: Result<Path<String>, PathRejection>,
    input: Result<Json<PaneInput>, JsonRejection>,
) -> Result<Response, ApiError> {
    let name = path(name)?;
    let input = body(input)?;
    if input.data.len() > MAX_PANE_INPUT_BYTES {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "pane.input_too_long",
            format!(
                "`data` is {} bytes; send at most {MAX_PANE_INPUT_BYTES} at a time",
                input.data.len()
            ),
        ));
    }
    let answer = pane_op(&state, name, PaneOp::Input(input.data.into_bytes())).await?;
    Ok(accepted(answer))
}

/// `POST /api/v1/panes/{name}/resize`.
pub(super) async fn pane_resize(
    State(state): State<ApiState>,
    name: Result<Path<String>, PathRejection>,
    size: Result<Json<PaneSize>, JsonRejection>,
) -> Result<Json<PaneAnswer>, ApiError> {
    let name = path(name)?;
    let size = checked_size(body(size)?)?;
    Ok(Json(
        pane_op(
            &state,
            name,
            PaneOp::Resize {
                rows: size.rows,
                cols: size.cols,
            },
        )
        .await?,
    ))
}

/// A terminal size within bounds.
pub(super) fn checked_size(size: PaneSize) -> Result<PaneSize, ApiError> {
    let ok = |d: u16| (1..=MAX_TERMINAL_DIM).contains(&d);
    if ok(size.cols) && ok(size.rows) {
        Ok(size)
    } else {
        Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
            format!("`cols` and `rows` must be between 1 and {MAX_TERMINAL_DIM}"),
        ))
    }
}

/// `POST /api/v1/panes/{name}/close`.
pub(super) async fn pane_close(
    State(state): State<ApiState>,
    name: Result<Path<String>, PathRejection>,
) -> Result<Json<PaneAnswer>, ApiError> {
    let name = path(name)?;
    Ok(Json(pane_op(&state, name, PaneOp::Close).await?))
}

/// `POST /api/v1/panes/{name}/open`.
pub(super) async fn pane_open(
    State(state): State<ApiState>,
    name: Result<Path<String>, PathRejection>,
) -> Result<Json<PaneAnswer>, ApiError> {
    let name = path(name)?;
    Ok(Json(pane_op(&state, name, PaneOp::Open).await?))
}

/// `GET /api/v1/triggers`.
pub(super) async fn list_triggers(
    State(state): State<ApiState>,
) -> Result<Json<TriggersPage>, ApiError> {
    Ok(Json(TriggersPage {
        triggers: state.backend.triggers().await?,
    }))
}

/// `POST /api/v1/triggers/{name}/fire`; an empty body fires with no payload.
pub(super) async fn fire_trigger(
    State(state): State<ApiState>,
    name: Result<Path<String>, PathRejection>,
    raw: Bytes,
) -> Result<Response, ApiError> {
    let name = path(name)?;
    let request: FireRequest = optional_body(&raw)?;
    let payload = request.payload.unwrap_or(Value::Null);
    let size = payload.to_string().len();
    if size > MAX_MANUAL_PAYLOAD_BYTES {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!(
                "`payload` is {size} bytes as JSON; at most {MAX_MANUAL_PAYLOAD_BYTES} are accepted"
            ),
        ));
    }
    let fired = state.backend.fire(name, payload).await?;
    Ok(accepted(fired))
}

/// `GET /api/v1/plugins`.
pub(super) async fn list_plugins(
    State(state): State<ApiState>,
) -> Result<Json<PluginsPage>, ApiError> {
    Ok(Json(PluginsPage {
        plugins: state.backend.plugins().await?,
    }))
}

/// A pane as the API shows it.
pub fn pane_view(info: PaneInfo) -> PaneView {
    let attention = info
        .status
        .as_ref()
        .is_some_and(|s| s["state"] == NEEDS_ATTENTION);
    PaneView {
        name: info.name,
        id: info.id,
        generation: info.generation,
        state: info.state,
        pid: info.pid,
        cols: info.cols.unwrap_or(crate::panes::DEFAULT_COLS),
        rows: info.rows.unwrap_or(crate::panes::DEFAULT_ROWS),
        exit: info
            .exit
            .map(|e| serde_json::to_value(e).unwrap_or_default()),
        status: info.status,
        attention,
    }
}

/// A pane operation's failure as a stable API error.
pub fn pane_error(e: PaneError) -> ApiError {
    let (status, code) = match &e {
        PaneError::Unknown(_) => (StatusCode::NOT_FOUND, "pane.not_found"),
        PaneError::AlreadyOpen(_) => (StatusCode::CONFLICT, "pane.already_open"),
        PaneError::NotOpen(_) => (StatusCode::CONFLICT, "pane.not_open"),
        PaneError::Exited(_) => (StatusCode::CONFLICT, "pane.exited"),
        PaneError::TooMany => (StatusCode::CONFLICT, "pane.too_many"),
        PaneError::InputTooLong => (StatusCode::PAYLOAD_TOO_LARGE, "pane.input_too_long"),
        PaneError::Start { .. } => (StatusCode::SERVICE_UNAVAILABLE, "pane.start_failed"),
        PaneError::Stopping => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
        PaneError::Io(_) => (StatusCode::SERVICE_UNAVAILABLE, "pane.io"),
    };
    ApiError::new(status, code, e.to_string())
}
