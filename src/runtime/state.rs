//! The observed state as the store keeps it: encoded with the applied
//! manifest at every apply, decoded for planning against it.

use std::collections::BTreeMap;

use crate::plan::{self, ComponentId, ObservedState};
use crate::store::Store;

use super::RuntimeError;

/// The observed state as stored by the last apply (`None` if never applied).
pub fn stored_state(store: &Store) -> Result<Option<ObservedState>, RuntimeError> {
    let Some(last) = store.last_manifest()? else {
        return Ok(None);
    };
    Ok(Some(decode_state(&last.canonical)))
}

/// Serialize an observed state for the store (keys as `kind.name`).
pub fn encode_state(state: &ObservedState) -> String {
    let map: BTreeMap<String, &plan::Observed> =
        state.iter().map(|(id, o)| (id.to_string(), o)).collect();
    serde_json::to_string(&map).unwrap_or_default()
}

/// Record `state` as the last applied state (canonical JSON + a hash of the
/// component fingerprints). The write is queued when called.
pub fn record_state(
    store: &Store,
    state: &ObservedState,
) -> crate::store::Pending<crate::store::AppliedManifest> {
    let hash = plan::fingerprint::fingerprint(
        &state
            .values()
            .map(|o| o.fingerprint.as_str())
            .collect::<Vec<_>>(),
    );
    store.record_manifest(hash, encode_state(state))
}

/// Parse what [`encode_state`] wrote; unknown kinds are skipped.
pub fn decode_state(text: &str) -> ObservedState {
    let map: BTreeMap<String, plan::Observed> = serde_json::from_str(text).unwrap_or_default();
    map.into_iter()
        .filter_map(|(k, v)| ComponentId::parse(&k).map(|id| (id, v)))
        .collect()
}
