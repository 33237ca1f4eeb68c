//! A daemon in front of a fleet (`[store] url`): it connects to the fleet's
//! shared PostgreSQL store and, once connected, hands the fleet's runs
//! (triggers' firings, runs started through the API) to it instead of its
//! own queue; `npc worker`s carry them out. Until the store answers those
//! runs are refused (a webhook answers 503), never run here, and the
//! connection is retried with backoff while the daemon serves everything
//! else. The URL holds a password: nothing here prints it.
//!
//! Architecture invariant: this module never claims or carries out a run;
//! the daemon only enqueues into the shared store.

use std::sync::Arc;

use serde_json::json;

use crate::bus::EventBus;
use crate::runs::Runs;
use crate::runs::fleet::{RETRY_INITIAL, RETRY_MAX};
use crate::store::NewEvent;
use crate::store::pg::PgStore;

/// Event: the daemon reached the fleet's shared store (`fleet`).
pub const STORE_CONNECTED_EVENT: &str = "store.connected";
/// Event: the shared store cannot be reached (`fleet`, `error`); once per
/// outage, not once per retry.
pub const STORE_UNREACHABLE_EVENT: &str = "store.unreachable";

/// Connect to the shared store of `fleet` at `url` until it answers, then
/// hand `runs` to it.
pub(super) async fn join(runs: &Arc<Runs>, bus: &EventBus, url: &str, fleet: &str) {
    let mut backoff = RETRY_INITIAL;
    let mut said = false;
    loop {
        match PgStore::connect(url, fleet).await {
            Ok(store) => {
                runs.queue().joined(fleet, Arc::new(store));
                tracing::info!("joined fleet `{}`", crate::stdx::term::printable(fleet));
                publish(bus, STORE_CONNECTED_EVENT, json!({ "fleet": fleet })).await;
                return;
            }
            Err(e) => {
                let error = e.to_string();
                tracing::warn!("cannot reach the shared store: {error}; retrying in {backoff:?}");
                if !said {
                    said = true;
                    let payload = json!({ "fleet": fleet, "error": error });
                    publish(bus, STORE_UNREACHABLE_EVENT, payload).await;
                }
                runs.queue().not_joined(fleet, error);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(RETRY_MAX);
            }
        }
    }
}

async fn publish(bus: &EventBus, kind: &str, payload: serde_json::Value) {
    if let Err(e) = bus.publish(NewEvent::new(kind, payload)).await {
        tracing::warn!("cannot record `{kind}`: {e}");
    }
}
