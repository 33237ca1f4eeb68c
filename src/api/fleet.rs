//! The fleet's one view over the API, for a daemon in front of a fleet
//! (`[store] url`): its roster (`GET /api/v1/fleet/workers`), its runs,
//! every worker's, with who holds or held each and when it was queued,
//! started and finished (`GET /api/v1/fleet/runs`), and its shared event
//! log in the store's order (`GET /api/v1/fleet/events`), each a bounded
//! page the [`ApiBackend`](super::ApiBackend) reads from the shared store.
//! A daemon without `[store] url` answers `404 fleet.none`; one whose store
//! does not answer yet `503 store.unreachable`.

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};

use super::listings::RunListing;
use super::resources::{limit, query};
use super::{ApiError, ApiState, DEFAULT_EVENTS_LIMIT, EventsPage, MAX_EVENTS_LIMIT};
use crate::store::fleet::WorkerRow;

/// Runs one page of `GET /api/v1/fleet/runs` lists when `limit` is absent.
pub const DEFAULT_FLEET_RUNS_LIMIT: usize = 100;
/// Most runs one page of the fleet's runs lists.
pub const MAX_FLEET_RUNS_LIMIT: usize = super::resources::MAX_RUNS_LIMIT;

/// `GET /api/v1/fleet/workers`.
#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FleetWorkers {
    /// The fleet's name: the manifest's project name and the repository's
    /// remote URL.
    pub fleet: String,
    /// Newest first; a worker whose heartbeat is older than its lease is
    /// `lost`, one that stopped cleanly `stopped`.
    pub workers: Vec<WorkerRow>,
}

/// `GET /api/v1/fleet/runs`.
#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FleetRuns {
    pub fleet: String,
    /// The store's clock now, unix milliseconds: the end of a running
    /// run's bar, on the clock its times are in.
    pub now_ms: i64,
    /// Newest first (in queue order).
    pub runs: Vec<RunListing>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FleetRunsQuery {
    limit: Option<usize>,
    before: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FleetEventsQuery {
    after: Option<i64>,
    limit: Option<usize>,
    run: Option<String>,
}

/// Why a daemon without `[store] url` has no fleet to show.
pub fn no_fleet() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "fleet.none",
        "this daemon is in no fleet: its manifest has no `[store] url` (see docs/guide/fleet.md); its own runs are at /api/v1/runs",
    )
}

/// `GET /api/v1/fleet/workers`.
pub(super) async fn workers(State(state): State<ApiState>) -> Result<Json<FleetWorkers>, ApiError> {
    state.backend.fleet_workers().await.map(Json)
}

/// `GET /api/v1/fleet/runs`.
pub(super) async fn runs(
    State(state): State<ApiState>,
    q: Result<Query<FleetRunsQuery>, QueryRejection>,
) -> Result<Json<FleetRuns>, ApiError> {
    let q = query(q)?;
    let limit = limit(q.limit, DEFAULT_FLEET_RUNS_LIMIT, MAX_FLEET_RUNS_LIMIT)?;
    state.backend.fleet_runs(limit, q.before).await.map(Json)
}

/// `GET /api/v1/fleet/events`.
pub(super) async fn events(
    State(state): State<ApiState>,
    q: Result<Query<FleetEventsQuery>, QueryRejection>,
) -> Result<Json<EventsPage>, ApiError> {
    let q = query(q)?;
    let limit = limit(q.limit, DEFAULT_EVENTS_LIMIT, MAX_EVENTS_LIMIT)?;
    let after = q.after.unwrap_or(0).max(0);
    let events = state.backend.fleet_events(after, limit, q.run).await?;
    Ok(Json(EventsPage::of(&events, after)))
}
