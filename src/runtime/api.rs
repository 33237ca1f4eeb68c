//! The daemon's side of the REST API: [`DaemonApi`] answers
//! `surfaces::api` from the runtime, with the same documents the control
//! socket gives `npc status` and `npc apply`.

use std::sync::Arc;

use serde_json::{Value, json};

use super::{Preview, ReloadOutcome, Runtime};
use crate::bus::EventBus;
use crate::store::Store;
use tokio_util::sync::CancellationToken;

use crate::surfaces::api::{Answer, ApiBackend, ApiListener, BoxFuture};
use crate::surfaces::mcp_http::Access;

/// Event: the REST API listens (`url`).
pub const API_LISTENING_EVENT: &str = "api.listening";
/// Event: the REST API could not listen (`listen`, `error`).
pub const API_FAILED_EVENT: &str = "api.failed";

/// What the plan is compared with, as the API says it.
pub const PLAN_AGAINST: &str = "the running daemon";

/// The status document: the daemon's pid, each component, each MCP server.
pub async fn status_document(runtime: &Runtime) -> Value {
    let mcp = json!({ "gateway": "daemon", "servers": runtime.mcp().pool().status() });
    json!({
        "pid": std::process::id(),
        "components": runtime.status().await,
        "mcp": mcp,
        "api": runtime.api_url(),
    })
}

/// Start the REST API on `daemon.listen` for `runtime` until `shutdown`.
/// Returns its base URL; a failure to listen is an `api.failed` event and
/// a warning, never the daemon's end (the control socket still serves).
pub async fn start(
    runtime: &Arc<Runtime>,
    daemon: &crate::model::Daemon,
    shutdown: CancellationToken,
) -> Option<String> {
    let access = Access::from_token_env(daemon.token_env.as_deref());
    match ApiListener::bind(daemon.listen, access).await {
        Ok(listener) => {
            let addr = listener.local_addr()?;
            let url = format!("http://{addr}");
            let _ = runtime.api_url.set(url.clone());
            runtime
                .emit(API_LISTENING_EVENT, None, json!({ "url": url }))
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
        Err(e) => {
            tracing::warn!("the REST API is off: {e}");
            runtime
                .emit(
                    API_FAILED_EVENT,
                    None,
                    json!({ "listen": daemon.listen.to_string(), "error": e.to_string() }),
                )
                .await;
            None
        }
    }
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
}
