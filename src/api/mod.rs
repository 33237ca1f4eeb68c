//! The daemon's REST API (`daemon.listen`, 127.0.0.1:8766 by default): the
//! same runtime the control socket and the MCP gateway see, over HTTP/JSON,
//! plus the event log as a live Server-Sent Events stream that resumes from
//! `Last-Event-ID` without a gap ([`events`]).
//!
//! Two layers of protection run before any handler: a trusted-host check
//! (the `Host` header must name `localhost`, `127.0.0.1` or `[::1]`, which
//! stops DNS-rebinding pages in a browser) and, when `daemon.token_env`
//! names a set variable, `Authorization: Bearer <token>` compared in
//! constant time. A non-loopback address is bound only with a token (the
//! manifest's `allow_remote`), and then the host check gives way to it.
//!
//! The handlers know nothing of the runtime: they call an [`ApiBackend`]
//! (the daemon's is `runtime::api`), so each endpoint is testable with
//! `tower::ServiceExt::oneshot` against a fake. Every route is declared
//! once in [`ROUTES`], which also generates the OpenAPI document
//! ([`openapi`], kept in `schemas/openapi.json`). Errors are JSON
//! `{"error": {"code", "message"}}` with a stable code; internal details go
//! to the log, not to the client.

pub mod assets;
pub mod auth;
pub mod events;
pub mod fleet;
pub mod listings;
pub mod openapi;
pub mod resources;
pub mod terminal;
pub mod workflows;

pub use assets::{DASHBOARD_ASSETS, DASHBOARD_CSP};

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Query, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::api::listings::PluginRow;
use crate::bus::EventBus;
use crate::store::Store;
use crate::surfaces::runs::ManualRun;
use auth::ApiAuth;
use resources::{FireAccepted, PaneAnswer, PaneOp, PaneView};
use terminal::Terminal;

pub use crate::surfaces::http::{TRUSTED_HOSTS, trusted_host};
/// Largest request body any endpoint reads.
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Events one page of `GET /api/v1/events` returns when `limit` is absent.
pub const DEFAULT_EVENTS_LIMIT: usize = 100;
/// Most events one page of `GET /api/v1/events` returns.
pub const MAX_EVENTS_LIMIT: usize = 1000;
/// Prefix of every API route.
pub const API_PREFIX: &str = "/api/v1";

use futures_util::future::BoxFuture;

/// What the API asks of the runtime.
pub trait ApiBackend: Send + Sync + 'static {
    /// Components, MCP servers and the daemon's pid, as `npc status --format json`.
    fn status(&self) -> BoxFuture<'_, Value>;
    /// What applying the manifest on disk would change, without applying it.
    fn plan(&self) -> BoxFuture<'_, Answer>;
    /// Load the manifest and apply it (`reason` is recorded with the reload).
    fn apply(&self, reason: &'static str) -> BoxFuture<'_, Answer>;
    /// The repository's event log.
    fn store(&self) -> Arc<Store>;
    /// The daemon's event bus (live events wake the streams).
    fn bus(&self) -> EventBus;
    /// Queue a profile run by hand; its run id.
    fn start_run(&self, run: ManualRun) -> BoxFuture<'_, Result<String, ApiError>>;
    /// Cancel run `id`; its state afterwards.
    fn cancel_run(&self, id: String) -> BoxFuture<'_, Result<String, ApiError>>;
    /// Answer pending approval `approval` of run `id`, or its oldest when
    /// `None` (the run parked on an `ask`); the approval answered.
    fn answer_run(
        &self,
        id: String,
        approval: Option<String>,
        answer: crate::store::approvals::Answer,
    ) -> BoxFuture<'_, Result<resources::RunAnswered, ApiError>>;
    /// The patch of worktree run `id`'s result, and whether it was cut.
    fn run_diff(&self, id: String) -> BoxFuture<'_, Result<resources::RunDiff, ApiError>>;
    /// Every configured or open pane.
    fn panes(&self) -> Vec<PaneView>;
    /// An operator's operation on pane `name` (the path `npc pane` takes).
    fn pane(&self, name: String, op: PaneOp) -> BoxFuture<'_, Result<PaneAnswer, ApiError>>;
    /// Attach a terminal client to pane `name`.
    fn terminal(&self, name: &str) -> Result<Terminal, ApiError>;
    /// The objects of `npc triggers --format json`.
    fn triggers(&self) -> BoxFuture<'_, Result<Vec<Value>, ApiError>>;
    /// Fire trigger `name` by hand through the run queue.
    fn fire(&self, name: String, payload: Value) -> BoxFuture<'_, Result<FireAccepted, ApiError>>;
    /// The objects of `npc plugin list --format json`.
    fn plugins(&self) -> BoxFuture<'_, Result<Vec<PluginRow>, ApiError>>;
    /// The applied manifest's workflows and the latest workflow runs.
    fn workflows(&self) -> BoxFuture<'_, Result<workflows::WorkflowsPage, ApiError>> {
        Box::pin(async { Err(workflows::no_workflows()) })
    }
    /// Start workflow `name` with `inputs`; the workflow run's id.
    fn start_workflow(
        &self,
        _name: String,
        _inputs: std::collections::BTreeMap<String, String>,
    ) -> BoxFuture<'_, Result<String, ApiError>> {
        Box::pin(async { Err(workflows::no_workflows()) })
    }
    /// Workflow run `id` with each step's state, branch and run.
    fn workflow_run(
        &self,
        _id: String,
    ) -> BoxFuture<'_, Result<crate::workflows::WorkflowView, ApiError>> {
        Box::pin(async { Err(workflows::no_workflows()) })
    }
    /// Cancel workflow run `id`; its state afterwards.
    fn cancel_workflow(&self, _id: String) -> BoxFuture<'_, Result<String, ApiError>> {
        Box::pin(async { Err(workflows::no_workflows()) })
    }
    /// The roster of the fleet this daemon fronts (`[store] url`); a
    /// backend in no fleet answers [`fleet::no_fleet`], as by default.
    fn fleet_workers(&self) -> BoxFuture<'_, Result<fleet::FleetWorkers, ApiError>> {
        Box::pin(async { Err(fleet::no_fleet()) })
    }
    /// The fleet's runs, newest first: at most `limit` queued before run
    /// `before`.
    fn fleet_runs(
        &self,
        _limit: usize,
        _before: Option<String>,
    ) -> BoxFuture<'_, Result<fleet::FleetRuns, ApiError>> {
        Box::pin(async { Err(fleet::no_fleet()) })
    }
    /// The fleet's shared event log after `after` (of run `run` only),
    /// oldest first, at most `limit`.
    fn fleet_events(
        &self,
        _after: i64,
        _limit: usize,
        _run: Option<String>,
    ) -> BoxFuture<'_, Result<Vec<crate::store::Event>, ApiError>> {
        Box::pin(async { Err(fleet::no_fleet()) })
    }
}

/// A backend's answer: a document, or why there is none.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    Ok(Value),
    /// The manifest on disk is invalid; the payload of its
    /// `manifest.invalid` event (diagnostics with line:column).
    Invalid(Value),
    /// The change cannot be applied while the daemon runs.
    Refused(Value),
    /// An operational failure (retried by the daemon); the message is the
    /// daemon's own, already fit for the user.
    Failed(String),
}

/// An error answer: status, stable code, message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

/// The JSON body of every error.
#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ErrorDetail {
    /// Stable, machine-readable: `unauthorized`, `untrusted_host`,
    /// `untrusted_origin`, `not_found`, `bad_request`, `invalid_body`,
    /// `payload_too_large`, `request_timeout`, `unsupported_media_type`, `upgrade_required`,
    /// `manifest_invalid`, `refused`, `unavailable`, `internal`,
    /// `too_many_streams`, `too_many_terminals`, and per resource
    /// `run.not_found`, `run.finished`, `run.not_daemon`, `run.invalid`,
    /// `pane.not_found`, `pane.not_open`, `pane.exited`,
    /// `pane.already_open`, `pane.too_many`, `pane.input_too_long`,
    /// `trigger.not_found`, `trigger.queue_full`, `fleet.none`,
    /// `store.unreachable`, `workflow.not_found`, `workflow.invalid_input`,
    /// `workflow.too_many`, `workflow_run.not_found`, `workflow_run.finished`.
    pub code: String,
    pub message: String,
    /// Structured detail where the code has some (the diagnostics of
    /// `manifest_invalid`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<Value>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    /// An internal failure: logged in full, answered in general terms.
    pub fn internal(detail: impl std::fmt::Display) -> Self {
        tracing::error!(error = %detail, "api: internal error");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "the daemon failed to answer; see its log",
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({ "error": { "code": self.code, "message": self.message } });
        let mut response = (self.status, Json(body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, "Bearer".parse().expect("static"));
        }
        response
    }
}

/// An [`Answer`] as an HTTP response.
fn respond(answer: Answer) -> Response {
    match answer {
        Answer::Ok(doc) => Json(doc).into_response(),
        Answer::Invalid(detail) => (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(json!({ "error": {
                "code": "manifest_invalid",
                "message": "the manifest is invalid; nothing was changed (see `detail`, or run `npc validate`)",
                "detail": detail,
            }})),
        )
            .into_response(),
        Answer::Refused(detail) => (
            StatusCode::CONFLICT,
            Json(json!({ "error": {
                "code": "refused",
                "message": "the plan has changes the daemon cannot apply while it runs; nothing was changed (restart the daemon to apply them)",
                "detail": detail,
            }})),
        )
            .into_response(),
        Answer::Failed(message) => {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message).into_response()
        }
    }
}

/// The router's state, shared: every request's handler gets the one copy.
#[derive(Debug, Clone)]
pub struct ApiState(Arc<Shared>);

impl std::ops::Deref for ApiState {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// What [`ApiState`] shares.
pub struct Shared {
    backend: Arc<dyn ApiBackend>,
    live: events::Live,
    /// The listener is bound beyond loopback.
    remote: bool,
    /// Open terminals (see [`terminal::MAX_TERMINALS`]).
    terminals: Arc<tokio::sync::Semaphore>,
    /// The credential wanted, and the dashboard's sessions.
    auth: ApiAuth,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiState").finish_non_exhaustive()
    }
}

/// Where a parameter goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum In {
    Path,
    Query,
}

/// A path or query parameter.
#[derive(Debug, Clone, Copy)]
pub struct Param {
    pub name: &'static str,
    pub location: In,
    pub description: &'static str,
    /// `integer` (non-negative) or `string`.
    pub kind: &'static str,
}

const fn query(name: &'static str, description: &'static str, kind: &'static str) -> Param {
    Param {
        name,
        location: In::Query,
        description,
        kind,
    }
}

const fn path(name: &'static str, description: &'static str) -> Param {
    Param {
        name,
        location: In::Path,
        description,
        kind: "string",
    }
}

/// One route: method, path, summary, parameters, body and answer schemas,
/// its error statuses. The OpenAPI document is built from this table, and
/// a test checks that the router serves each entry.
#[derive(Debug, Clone, Copy)]
pub struct Route {
    pub method: &'static str,
    pub path: &'static str,
    pub operation: &'static str,
    pub summary: &'static str,
    pub params: &'static [Param],
    /// The JSON request body, if the route reads one.
    pub body: Option<fn() -> schemars::Schema>,
    /// Whether the body may be left out.
    pub body_optional: bool,
    /// The success status.
    pub status: u16,
    /// The success body: a JSON Schema generator, or `None` for an event
    /// stream (200) or a WebSocket (101).
    pub answer: Option<fn() -> schemars::Schema>,
    /// Route-specific error statuses (400, 401 and 403 apply to all).
    pub errors: &'static [(u16, &'static str)],
}

fn any_object() -> schemars::Schema {
    schemars::json_schema!({ "type": "object" })
}

/// The JSON Schema of `T` with every subschema inlined (no `$defs`, whose
/// references would not resolve inside the OpenAPI document).
pub fn schema_of<T: schemars::JsonSchema>() -> schemars::Schema {
    let mut schema = schemars::generate::SchemaSettings::draft2020_12()
        .with(|s| s.inline_subschemas = true)
        .into_generator()
        .into_root_schema_for::<T>();
    if let Some(object) = schema.as_object_mut() {
        object.remove("$schema");
    }
    schema
}

const INVALID: (u16, &str) = (
    422,
    "The manifest on disk is invalid (`detail` has the diagnostics)",
);
const FAILED: (u16, &str) = (503, "An operational failure; the daemon retries by itself");
const BODY: [(u16, &str); 3] = [
    (413, "The body is too large"),
    (415, "The body is not `application/json`"),
    (
        422,
        "The body does not fit the schema or names nothing known",
    ),
];
const PANE_ERRORS: [(u16, &str); 2] = [
    (404, "No such pane in the manifest (`pane.not_found`)"),
    (
        409,
        "The pane is not open, has exited, or is open already (`pane.not_open`, `pane.exited`, `pane.already_open`)",
    ),
];

/// The paging of an event log (`/events`, `/fleet/events`).
const EVENTS_AFTER: Param = query(
    "after",
    "Only events with an id above this (default 0)",
    "integer",
);
const EVENTS_LIMIT: Param = query(
    "limit",
    "Most events returned (default 100, at most 1000)",
    "integer",
);
const FLEET_ERRORS: [(u16, &str); 2] = [
    (
        404,
        "This daemon is in no fleet: its manifest has no `[store] url` (`fleet.none`)",
    ),
    (
        503,
        "The fleet's store does not answer yet; the daemon keeps retrying (`store.unreachable`)",
    ),
];

/// Every route of the API.
pub const ROUTES: &[Route] = &[
    Route {
        method: "post",
        path: "/api/v1/session",
        operation: "startSession",
        summary: "Redeem the dashboard's one-time code (the `#code=` of the URL `npc dashboard` prints) for an `HttpOnly; SameSite=Strict` session cookie; needs no other credential",
        params: &[],
        body: Some(schema_of::<auth::SessionRequest>),
        body_optional: false,
        status: 204,
        answer: None,
        errors: &[
            BODY[0],
            BODY[1],
            (422, "The body does not fit the schema"),
            (
                401,
                "The code was not issued, was used already or expired (`bad_code`)",
            ),
        ],
    },
    Route {
        method: "get",
        path: "/api/v1/status",
        operation: "getStatus",
        summary: "Components (state, pid, restarts, since), MCP servers and the daemon's pid",
        params: &[],
        body: None,
        body_optional: false,
        status: 200,
        answer: Some(any_object),
        errors: &[],
    },
    Route {
        method: "get",
        path: "/api/v1/plan",
        operation: "getPlan",
        summary: "What applying the manifest on disk would change (plan JSON format 1)",
        params: &[],
        body: None,
        body_optional: false,
        status: 200,
        answer: Some(any_object),
        errors: &[INVALID, FAILED],
    },
    Route {
        method: "post",
        path: "/api/v1/apply",
        operation: "apply",
        summary: "Load the manifest and apply it; per-component results",
        params: &[],
        body: None,
        body_optional: false,
        status: 200,
        answer: Some(any_object),
        errors: &[
            INVALID,
            FAILED,
            (409, "The change cannot be applied while the daemon runs"),
        ],
    },
    Route {
        method: "post",
        path: "/api/v1/reload",
        operation: "reload",
        summary: "Reload the manifest now, as after a file change (same answer as apply)",
        params: &[],
        body: None,
        body_optional: false,
        status: 200,
        answer: Some(any_object),
        errors: &[
            INVALID,
            FAILED,
            (409, "The change cannot be applied while the daemon runs"),
        ],
    },
    Route {
        method: "get",
        path: "/api/v1/events",
        operation: "listEvents",
        summary: "A page of the event log, oldest first, after an id",
        params: &[
            EVENTS_AFTER,
            EVENTS_LIMIT,
            query("kind", "Only events of this kind", "string"),
        ],
        body: None,
        body_optional: false,
        status: 200,
        answer: Some(schema_of::<EventsPage>),
        errors: &[],
    },
    Route {
        method: "get",
        path: "/api/v1/events/stream",
        operation: "streamEvents",
        summary: "Live events as Server-Sent Events (`id` = event id, `event` = kind); resumes after `Last-Event-ID` or `after`",
        params: &[query(
            "after",
            "Resume after this id when no `Last-Event-ID` header is sent",
            "integer",
        )],
        body: None,
        body_optional: false,
        status: 200,
        answer: None,
        errors: &[(503, "Too many open streams")],
    },
    Route {
        method: "get",
        path: "/api/v1/runs",
        operation: "listRuns",
        summary: "Runs, newest first: started through the API (`manual`), by triggers (`trigger:NAME`), by `npc run` (`cli`)",
        params: &[
            query(
                "limit",
                "Most runs returned (default 50, at most 1000)",
                "integer",
            ),
            query(
                "before",
                "Only runs whose id sorts below this run id (the next page)",
                "string",
            ),
        ],
        body: None,
        body_optional: false,
        status: 200,
        answer: Some(schema_of::<resources::RunsPage>),
        errors: &[],
    },
    Route {
        method: "post",
        path: "/api/v1/runs",
        operation: "startRun",
        summary: "Start a profile run inside the daemon (queued and recorded like a triggered profile run); `prompt` or `prompt_template` with `vars`, else the profile's own prompt",
        params: &[],
        body: Some(schema_of::<ManualRun>),
        body_optional: false,
        status: 202,
        answer: Some(schema_of::<resources::RunAccepted>),
        errors: &[
            BODY[0],
            BODY[1],
            (
                422,
                "The body does not fit, or names a profile or prompt the applied manifest lacks (`run.invalid`)",
            ),
            (503, "No manifest is applied yet, or the queue is full"),
        ],
    },
    Route {
        method: "get",
        path: "/api/v1/runs/{id}",
        operation: "getRun",
        summary: "One run (the same object as in the list)",
        params: &[path("id", "A run id (`run-…`)")],
        body: None,
        body_optional: false,
        status: 200,
        answer: Some(schema_of::<crate::api::listings::RunSummary>),
        errors: &[(404, "No such run (`run.not_found`)")],
    },
    Route {
        method: "get",
        path: "/api/v1/runs/{id}/events",
        operation: "listRunEvents",
        summary: "One run's events, oldest first, parsed agent events included (the same objects as `/events`)",
        params: &[
            path("id", "A run id (`run-…`)"),
            query(
                "since",
                "Only events with an id above this (default 0)",
                "integer",
            ),
            query(
                "limit",
                "Most events returned (default 500, at most 1000)",
                "integer",
            ),
        ],
        body: None,
        body_optional: false,
        status: 200,
        answer: Some(schema_of::<resources::RunEvents>),
        errors: &[(404, "No such run (`run.not_found`)")],
    },
    Route {
        method: "get",
        path: "/api/v1/runs/{id}/diff",
        operation: "getRunDiff",
        summary: "The patch a worktree run handed back: its branch against its base (`git diff BASE HEAD`, at most 16 MiB)",
        params: &[path("id", "A run id (`run-…`)")],
        body: None,
        body_optional: false,
        status: 200,
        answer: Some(schema_of::<resources::RunDiff>),
        errors: &[
            (
                404,
                "No such run (`run.not_found`), or it handed back no branch (`run.no_result`)",
            ),
            (500, "git could not make the patch"),
        ],
    },
    Route {
        method: "post",
        path: "/api/v1/runs/{id}/cancel",
        operation: "cancelRun",
        summary: "Cancel a run: a queued one never starts, a running one has its process group killed; answers once it ended (`state`)",
        params: &[path("id", "A run id (`run-…`)")],
        body: None,
        body_optional: false,
        status: 202,
        answer: Some(schema_of::<resources::RunCancelled>),
        errors: &[
            (404, "No such run in the daemon's queue (`run.not_found`)"),
            (
                409,
                "The run has ended (`run.finished`), or `npc run` runs it in another process (`run.not_daemon`)",
            ),
        ],
    },
    Route {
        method: "post",
        path: "/api/v1/runs/{id}/approve",
        operation: "approveRun",
        summary: "Allow the tool call a run waits on (its oldest pending approval); the run goes on. `always`: the run's later identical calls (same tool, equal arguments) are allowed too (the body may be empty)",
        params: &[path("id", "A run id (`run-…`)")],
        body: Some(schema_of::<resources::ApproveRequest>),
        body_optional: true,
        status: 200,
        answer: Some(schema_of::<resources::RunAnswered>),
        errors: &[
            (404, "No such run (`run.not_found`)"),
            BODY[0],
            BODY[2],
            (
                409,
                "The run waits for no approval: answered already, never asked (`run.not_waiting`), or it ended (`run.finished`)",
            ),
        ],
    },
    Route {
        method: "post",
        path: "/api/v1/runs/{id}/deny",
        operation: "denyRun",
        summary: "Deny the tool call a run waits on (its oldest pending approval) with an optional `reason`; the run goes on without it (the body may be empty)",
        params: &[path("id", "A run id (`run-…`)")],
        body: Some(schema_of::<resources::DenyRequest>),
        body_optional: true,
        status: 200,
        answer: Some(schema_of::<resources::RunAnswered>),
        errors: &[
            (404, "No such run (`run.not_found`)"),
            BODY[0],
            BODY[2],
            (
                409,
                "The run waits for no approval: answered already, never asked (`run.not_waiting`), or it ended (`run.finished`)",
            ),
        ],
    },
    Route {
        method: "get",
        path: "/api/v1/panes",
        operation: "listPanes",
        summary: "Every configured or open pane: state, size, last plugin status, attention",
        params: &[],
        body: None,
        body_optional: false,
        status: 200,
        answer: Some(schema_of::<resources::PanesPage>),
        errors: &[],
    },
    Route {
        method: "post",
        path: "/api/v1/panes/{name}/input",
        operation: "paneInput",
        summary: "Type text into a pane (at most 8 KiB), as `npc pane send`",
        params: &[path("name", "A pane name")],
        body: Some(schema_of::<resources::PaneInput>),
        body_optional: false,
        status: 202,
        answer: Some(schema_of::<resources::PaneAnswer>),
        errors: &[PANE_ERRORS[0], PANE_ERRORS[1], BODY[0], BODY[1], BODY[2]],
    },
    Route {
        method: "post",
        path: "/api/v1/panes/{name}/resize",
        operation: "paneResize",
        summary: "Resize a pane's terminal (1 to 1000 columns and rows)",
        params: &[path("name", "A pane name")],
        body: Some(schema_of::<resources::PaneSize>),
        body_optional: false,
        status: 200,
        answer: Some(schema_of::<resources::PaneAnswer>),
        errors: &[PANE_ERRORS[0], PANE_ERRORS[1], BODY[0], BODY[1], BODY[2]],
    },
    Route {
        method: "post",
        path: "/api/v1/panes/{name}/close",
        operation: "paneClose",
        summary: "Close a pane (its process group is hung up), as `npc pane close`",
        params: &[path("name", "A pane name")],
        body: None,
        body_optional: false,
        status: 200,
        answer: Some(schema_of::<resources::PaneAnswer>),
        errors: &[PANE_ERRORS[0], PANE_ERRORS[1]],
    },
    Route {
        method: "post",
        path: "/api/v1/panes/{name}/open",
        operation: "paneOpen",
        summary: "Start a configured pane that is closed or has exited, as `npc pane open`",
        params: &[path("name", "A pane name")],
        body: None,
        body_optional: false,
        status: 200,
        answer: Some(schema_of::<resources::PaneAnswer>),
        errors: &[
            PANE_ERRORS[0],
            PANE_ERRORS[1],
            (503, "The daemon is stopping"),
        ],
    },
    Route {
        method: "get",
        path: "/api/v1/panes/{name}/terminal",
        operation: "paneTerminal",
        summary: "The pane's terminal as a WebSocket: offer subprotocol `npc.v1` (echoed) and, with a token, `npc.bearer.<token>`; `Origin` must match `Host`. Scrollback then live output as binary frames; text frames `{\"type\":\"status\"|\"exited\",…}`. Send binary input, or text `{\"type\":\"input\",\"data\"}` / `{\"type\":\"resize\",\"cols\",\"rows\"}`; anything else closes with 1008",
        params: &[path("name", "A pane name")],
        body: None,
        body_optional: false,
        status: 101,
        answer: None,
        errors: &[
            PANE_ERRORS[0],
            PANE_ERRORS[1],
            (426, "Not a WebSocket upgrade"),
            (503, "Too many open terminals"),
        ],
    },
    Route {
        method: "get",
        path: "/api/v1/triggers",
        operation: "listTriggers",
        summary: "The applied manifest's triggers, as `npc triggers --format json`: kind, next fire times, route, paths, recent runs",
        params: &[],
        body: None,
        body_optional: false,
        status: 200,
        answer: Some(schema_of::<resources::TriggersPage>),
        errors: &[(503, "No manifest is applied yet")],
    },
    Route {
        method: "post",
        path: "/api/v1/triggers/{name}/fire",
        operation: "fireTrigger",
        summary: "Fire a trigger by hand through the run queue, as `npc trigger fire` (the body may be empty)",
        params: &[path("name", "A trigger name")],
        body: Some(schema_of::<resources::FireRequest>),
        body_optional: true,
        status: 202,
        answer: Some(schema_of::<resources::FireAccepted>),
        errors: &[
            (404, "No such applied trigger (`trigger.not_found`)"),
            BODY[0],
            BODY[2],
            (503, "The trigger's queue is full (`trigger.queue_full`)"),
        ],
    },
    Route {
        method: "get",
        path: "/api/v1/plugins",
        operation: "listPlugins",
        summary: "The plugins of the manifest and the user registry, as `npc plugin list --format json` (servers, skills, hooks)",
        params: &[],
        body: None,
        body_optional: false,
        status: 200,
        answer: Some(schema_of::<resources::PluginsPage>),
        errors: &[],
    },
    Route {
        method: "get",
        path: "/api/v1/workflows",
        operation: "listWorkflows",
        summary: "The applied manifest's workflows (inputs, steps in order) and the latest workflow runs, as `npc workflows --format json`",
        params: &[],
        body: None,
        body_optional: false,
        status: 200,
        answer: Some(schema_of::<workflows::WorkflowsPage>),
        errors: &[(503, "No manifest is applied yet")],
    },
    Route {
        method: "post",
        path: "/api/v1/workflows/{name}/runs",
        operation: "startWorkflow",
        summary: "Start a workflow, as `npc workflow run NAME --input KEY=VALUE`; answers its workflow run's `id` (the body may be empty: the declared defaults)",
        params: &[path("name", "A workflow name (`[workflows.NAME]`)")],
        body: Some(schema_of::<workflows::StartWorkflow>),
        body_optional: true,
        status: 202,
        answer: Some(schema_of::<workflows::WorkflowAccepted>),
        errors: &[
            (
                404,
                "No such workflow in the applied manifest (`workflow.not_found`)",
            ),
            BODY[0],
            (
                422,
                "The body does not fit, names an input the workflow lacks, leaves out one it needs, or gives one too long (`workflow.invalid_input`)",
            ),
            (
                503,
                "No manifest is applied yet, or too many workflow runs are under way (`workflow.too_many`)",
            ),
        ],
    },
    Route {
        method: "get",
        path: "/api/v1/workflow-runs/{id}",
        operation: "getWorkflowRun",
        summary: "One workflow run, as `npc workflow show ID --format json`: its state, inputs and, under `steps` in the order they run, each step's state, run, gate run, branch, needs and outputs (a fan-out's under `instances`)",
        params: &[path("id", "A workflow run id (`wf-…`)")],
        body: None,
        body_optional: false,
        status: 200,
        answer: Some(schema_of::<crate::workflows::WorkflowView>),
        errors: &[(404, "No such workflow run (`workflow_run.not_found`)")],
    },
    Route {
        method: "post",
        path: "/api/v1/workflow-runs/{id}/cancel",
        operation: "cancelWorkflowRun",
        summary: "Cancel a workflow run, as `npc workflow cancel ID`: its running steps' runs are cancelled, its gates denied, its unfinished steps end `cancelled`",
        params: &[path("id", "A workflow run id (`wf-…`)")],
        body: None,
        body_optional: false,
        status: 202,
        answer: Some(schema_of::<workflows::WorkflowCancelled>),
        errors: &[
            (404, "No such workflow run (`workflow_run.not_found`)"),
            (409, "The workflow run has ended (`workflow_run.finished`)"),
        ],
    },
    Route {
        method: "get",
        path: "/api/v1/fleet/workers",
        operation: "listFleetWorkers",
        summary: "The roster of the fleet this daemon fronts (`[store] url`), as `npc workers --format json`: host, version, heartbeat age, the runs each holds; `lost` past its lease, `stopped` after a clean stop",
        params: &[],
        body: None,
        body_optional: false,
        status: 200,
        answer: Some(schema_of::<fleet::FleetWorkers>),
        errors: &[FLEET_ERRORS[0], FLEET_ERRORS[1]],
    },
    Route {
        method: "get",
        path: "/api/v1/fleet/runs",
        operation: "listFleetRuns",
        summary: "The fleet's runs, every worker's, newest first, as `npc runs --fleet --format json`: state, owner (the worker), queued, started and finished times on the store's clock (`now_ms`)",
        params: &[
            query(
                "limit",
                "Most runs returned (default 100, at most 1000)",
                "integer",
            ),
            query(
                "before",
                "Only runs queued before this run id (the next page)",
                "string",
            ),
        ],
        body: None,
        body_optional: false,
        status: 200,
        answer: Some(schema_of::<fleet::FleetRuns>),
        errors: &[FLEET_ERRORS[0], FLEET_ERRORS[1]],
    },
    Route {
        method: "get",
        path: "/api/v1/fleet/events",
        operation: "listFleetEvents",
        summary: "A page of the fleet's shared event log (every worker's and daemon's events in the store's one order), oldest first, after an id, as `npc events --fleet`",
        params: &[
            EVENTS_AFTER,
            EVENTS_LIMIT,
            query("run", "Only the events of this run id", "string"),
        ],
        body: None,
        body_optional: false,
        status: 200,
        answer: Some(schema_of::<EventsPage>),
        errors: &[FLEET_ERRORS[0], FLEET_ERRORS[1]],
    },
    Route {
        method: "get",
        path: "/api/v1/openapi.json",
        operation: "getOpenApi",
        summary: "This API's OpenAPI 3.1 document",
        params: &[],
        body: None,
        body_optional: false,
        status: 200,
        answer: Some(any_object),
        errors: &[],
    },
];

/// One page of events.
#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct EventsPage {
    pub events: Vec<Value>,
    /// Pass as `after` for the next page.
    pub next_after: i64,
}

impl EventsPage {
    /// The page of `events`, read after `after`.
    pub fn of(events: &[crate::store::Event], after: i64) -> Self {
        Self {
            next_after: events.last().map_or(after, |e| e.id),
            events: events
                .iter()
                .map(|e| serde_json::to_value(e).unwrap_or_default())
                .collect(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EventsQuery {
    after: Option<i64>,
    limit: Option<usize>,
    kind: Option<String>,
}

/// The API's router over `backend`, protected for `access`. `remote` says
/// the listener is bound beyond loopback (then a token is required and
/// the host check gives way to it).
pub fn router(backend: Arc<dyn ApiBackend>, auth: ApiAuth, remote: bool) -> Router {
    let live = events::Live::start(backend.store(), backend.bus());
    let state = ApiState(Arc::new(Shared {
        backend,
        live,
        remote,
        terminals: Arc::new(tokio::sync::Semaphore::new(terminal::MAX_TERMINALS)),
        auth: auth.clone(),
    }));
    let mut api = Router::new();
    for (path, content_type, body) in DASHBOARD_ASSETS {
        api = api.route(
            path,
            get(move || async move {
                (
                    [
                        (header::CONTENT_TYPE, content_type),
                        (header::CONTENT_SECURITY_POLICY, DASHBOARD_CSP),
                        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
                        (header::X_FRAME_OPTIONS, "DENY"),
                        (header::REFERRER_POLICY, "no-referrer"),
                    ],
                    body,
                )
            }),
        );
    }
    let api = api
        .route("/api/v1/session", post(start_session))
        .route("/api/v1/status", get(status))
        .route("/api/v1/plan", get(plan))
        .route("/api/v1/apply", post(apply))
        .route("/api/v1/reload", post(reload))
        .route("/api/v1/events", get(list_events))
        .route("/api/v1/events/stream", get(events::stream))
        .route(
            "/api/v1/runs",
            get(resources::list_runs).post(resources::start_run),
        )
        .route("/api/v1/runs/{id}", get(resources::get_run))
        .route("/api/v1/runs/{id}/events", get(resources::run_events))
        .route("/api/v1/runs/{id}/diff", get(resources::run_diff))
        .route("/api/v1/runs/{id}/cancel", post(resources::cancel_run))
        .route("/api/v1/runs/{id}/approve", post(resources::approve_run))
        .route("/api/v1/runs/{id}/deny", post(resources::deny_run))
        .route("/api/v1/panes", get(resources::list_panes))
        .route("/api/v1/panes/{name}/input", post(resources::pane_input))
        .route("/api/v1/panes/{name}/resize", post(resources::pane_resize))
        .route("/api/v1/panes/{name}/close", post(resources::pane_close))
        .route("/api/v1/panes/{name}/open", post(resources::pane_open))
        .route("/api/v1/panes/{name}/terminal", get(terminal::terminal))
        .route("/api/v1/triggers", get(resources::list_triggers))
        .route(
            "/api/v1/triggers/{name}/fire",
            post(resources::fire_trigger),
        )
        .route("/api/v1/plugins", get(resources::list_plugins))
        .route("/api/v1/workflows", get(workflows::list))
        .route("/api/v1/workflows/{name}/runs", post(workflows::start))
        .route("/api/v1/workflow-runs/{id}", get(workflows::show))
        .route("/api/v1/workflow-runs/{id}/cancel", post(workflows::cancel))
        .route("/api/v1/fleet/workers", get(fleet::workers))
        .route("/api/v1/fleet/runs", get(fleet::runs))
        .route("/api/v1/fleet/events", get(fleet::events))
        .route("/api/v1/openapi.json", get(openapi_doc))
        .fallback(not_found)
        .with_state(state)
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES));
    let auth = Arc::new(auth);
    api.layer(axum::middleware::from_fn(
        move |request: Request, next: Next| {
            let auth = auth.clone();
            async move {
                if let Err(e) = guard(&request, &auth, remote) {
                    return e.into_response();
                }
                // A body is read whole before any handler, within its
                // bounds, so no handler waits on a slow client.
                let body = axum::body::HttpBody::size_hint(request.body()).lower() > 0
                    || auth::has_body(request.headers());
                let request = if body {
                    match crate::surfaces::http::buffer_body(request, MAX_BODY_BYTES).await {
                        Ok(request) => request,
                        Err(refusal) => {
                            use crate::surfaces::http::BodyRefusal as R;
                            let code = match refusal {
                                R::TooLarge => "payload_too_large",
                                R::TooSlow => "request_timeout",
                                R::Busy => "unavailable",
                                R::Broken => "bad_request",
                            };
                            return ApiError::new(
                                refusal.status(),
                                code,
                                refusal.message(MAX_BODY_BYTES),
                            )
                            .into_response();
                        }
                    }
                } else {
                    request
                };
                next.run(request).await
            }
        },
    ))
}

/// Where the dashboard redeems its one-time code (needs no credential).
pub const SESSION_PATH: &str = "/api/v1/session";

/// The checks before any handler, in order: trusted host (unless remote),
/// the same origin for anything that changes state and for WebSockets, a
/// credential (not for the dashboard's page and scripts, nor to redeem a
/// code), and JSON for any body.
fn guard(request: &Request, auth: &ApiAuth, remote: bool) -> Result<(), ApiError> {
    let headers = request.headers();
    let path = request.uri().path();
    if !remote && !trusted_host(headers.get(header::HOST).map(|v| v.as_bytes())) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "untrusted_host",
            "the `Host` header must be localhost, 127.0.0.1 or [::1]; open the API by one of those names",
        ));
    }
    let websocket =
        path.ends_with(terminal::PATH_SUFFIX) && headers.contains_key(header::SEC_WEBSOCKET_KEY);
    if auth::changes_state(request.method()) || websocket {
        auth::same_origin(headers, remote)?;
    }
    let open = path == SESSION_PATH || DASHBOARD_ASSETS.iter().any(|(p, _, _)| *p == path);
    let from_protocol = websocket
        .then(|| terminal::bearer_from_protocols(headers))
        .flatten();
    if !open && !auth::authorized(headers, auth, from_protocol) {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "this API needs `Authorization: Bearer <token>` (the repository's token in `STATE_DIR/api.token`, or the one `daemon.token_env` names; a terminal WebSocket: the subprotocol `npc.bearer.<token>`) or the dashboard's session: open the dashboard with `npc dashboard`",
        ));
    }
    let body = axum::body::HttpBody::size_hint(request.body()).lower() > 0;
    if (body || auth::has_body(headers)) && !auth::is_json(headers) {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "send the body as `Content-Type: application/json`",
        ));
    }
    Ok(())
}

/// `POST /api/v1/session`: the dashboard's one-time code for a session cookie.
async fn start_session(
    State(state): State<ApiState>,
    body: Result<Json<auth::SessionRequest>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let Ok(Json(asked)) = body else {
        return ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
            "send `{\"code\": \"…\"}`, the code of the dashboard's URL",
        )
        .into_response();
    };
    match state.auth.dashboard.redeem(&asked.code) {
        Some(session) => (
            StatusCode::NO_CONTENT,
            [
                (header::SET_COOKIE, auth::session_cookie(&session)),
                (header::CACHE_CONTROL, "no-store".to_string()),
            ],
        )
            .into_response(),
        None => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "bad_code",
            "this code was not issued by the daemon, was used already or expired; open the dashboard again with `npc dashboard`",
        )
        .into_response(),
    }
}

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        "no such endpoint; see /api/v1/openapi.json",
    )
}

async fn status(State(state): State<ApiState>) -> Response {
    Json(state.backend.status().await).into_response()
}

async fn plan(State(state): State<ApiState>) -> Response {
    respond(state.backend.plan().await)
}

async fn apply(State(state): State<ApiState>) -> Response {
    respond(state.backend.apply("api apply").await)
}

async fn reload(State(state): State<ApiState>) -> Response {
    respond(state.backend.apply("api reload").await)
}

async fn openapi_doc() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        openapi::DOCUMENT_TEXT,
    )
        .into_response()
}

async fn list_events(
    State(state): State<ApiState>,
    query: Result<Query<EventsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<EventsPage>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::bad_request(format!("bad query: {e}")))?;
    let limit = query.limit.unwrap_or(DEFAULT_EVENTS_LIMIT);
    if limit == 0 || limit > MAX_EVENTS_LIMIT {
        return Err(ApiError::bad_request(format!(
            "`limit` must be between 1 and {MAX_EVENTS_LIMIT}"
        )));
    }
    let after = query.after.unwrap_or(0).max(0);
    let store = state.backend.store();
    let kind = query.kind;
    let events = tokio::task::spawn_blocking(move || match kind {
        Some(kind) => store.events_of_kind_since(after, &kind, limit),
        None => store.events_since(after, limit),
    })
    .await
    .map_err(ApiError::internal)?
    .map_err(ApiError::internal)?;
    Ok(Json(EventsPage::of(&events, after)))
}

/// A bound, not yet serving, API listener.
#[derive(Debug)]
pub struct ApiListener {
    listener: tokio::net::TcpListener,
    auth: ApiAuth,
}

/// Why the API did not start.
#[derive(Debug, thiserror::Error)]
pub enum ApiBindError {
    #[error(
        "`{addr}` is not a loopback address; the API can run agents and change files, so serving it beyond this machine needs `daemon.allow_remote = true` and a token in the variable `daemon.token_env` names"
    )]
    NotLoopback { addr: SocketAddr },
    #[error("cannot listen on `{addr}`: {source}; free the port or set another `daemon.listen`")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

impl ApiListener {
    /// Bind `addr` for `auth`: a non-loopback address only with a token.
    pub async fn bind(addr: SocketAddr, auth: ApiAuth) -> Result<Self, ApiBindError> {
        let remote_allowed = matches!(auth.access, crate::surfaces::tcp::Access::Token(_));
        let listener = crate::surfaces::tcp::bind(addr, remote_allowed).map_err(|e| match e {
            crate::surfaces::tcp::BindError::NotLoopback { addr } => {
                ApiBindError::NotLoopback { addr }
            }
            crate::surfaces::tcp::BindError::Bind { addr, source } => {
                ApiBindError::Bind { addr, source }
            }
        })?;
        Ok(Self { listener, auth })
    }

    /// The address actually bound (port 0 picks a free one).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// Serve `backend` until `shutdown` is cancelled.
    pub async fn serve(
        self,
        backend: Arc<dyn ApiBackend>,
        shutdown: CancellationToken,
    ) -> std::io::Result<()> {
        let remote = self
            .listener
            .local_addr()
            .is_ok_and(|a| !a.ip().is_loopback());
        let router = router(backend, self.auth, remote);
        crate::surfaces::tcp::serve(self.listener, router, shutdown).await;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
