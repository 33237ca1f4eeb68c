//! Runs: the one notion of a run. Whatever starts one — a trigger's firing,
//! `npc trigger fire`, the REST API and the dashboard, a prompt of
//! `npc acp`, `npc run` — it is one row of the durable run queue
//! (`store::queue`) with an [`Origin`], moving `queued` → `running` → a
//! final state, and every event it records carries its id under component
//! `run.<id>`. Those who start runs only ask for them; this room owns the
//! rest:
//!
//! - [`queue`]: a request → a committed row (`run.queued`), the executor woken;
//! - [`executor`]: the daemon's one executor, which claims queued rows with
//!   bounded concurrency and each trigger's overlap policy and carries out
//!   their action (a profile through [`agent`], a command through the
//!   supervisor);
//! - [`service`]: [`Runs`], what the daemon's front ends ask (start a run
//!   by hand or for a local front end, cancel one, the applied triggers);
//! - [`here`]: a run carried out in the asking process when no daemon holds
//!   the repository — still a row (recorded `running`, owned by that
//!   process), so `npc runs` lists it like any;
//! - [`follow`]: a run of the daemon followed from the store, for the front
//!   end that asked for it (`npc run`, `npc acp`);
//! - [`agent`]: one agent run, prepared (prompt rendered, MCP config
//!   written, launch planned) and executed (streamed, hooks observed);
//! - [`view`]: the terminal view of a run's agent events.
//!
//! Architecture invariant: nothing here knows which front end asked (no
//! import of `api`, `runtime`, `acp` or `cli`); what a front end adds to a
//! run is typed (`surfaces::runs::LocalRun`), never free-form.

pub mod agent;
pub mod channel;
pub mod executor;
pub mod fleet;
pub mod follow;
pub mod here;
pub mod mirror;
pub mod narrower;
pub mod queue;
pub mod remote;
pub mod sandbox;
pub mod service;
pub mod trust;
pub mod view;
pub mod workspace;

use std::io::Read as _;
use std::path::{Path, PathBuf};

/// The component name of run `id` in the event log (the store queries by it).
pub use crate::store::queue::run_component as component;
pub use agent::{
    AUTH_ENV, DEFAULT_RUN_TIMEOUT, EXIT_SIGNAL_BASE, EXIT_TIMED_OUT, Outcome, POST_EXIT_DRAIN,
    PREPARE_DEADLINE, PreparedRun, PromptChoice, RunError, RunReport, RunRequest, TriggeredBy,
    event_payload, execute, prepare, prepare_blocking,
};
pub use service::{AnswerError, Runs, StartRunError};

use crate::store::queue::state;

/// Subdirectory of the state directory holding one directory per run.
pub const RUNS_DIR: &str = "runs";
/// Prefix of every run id.
pub const RUN_ID_PREFIX: &str = "run-";
/// Random bytes in a run id (after its timestamp).
pub const RUN_ID_RANDOM_BYTES: usize = 4;
/// The queue of runs started by hand (see [`crate::store::queue::MANUAL_QUEUE`]).
pub use crate::store::queue::MANUAL_QUEUE;

/// Who asked for a run (one enum for the manifest, the store and the runs).
pub use crate::model::RunOrigin as Origin;

/// How a run ended: its stored state and a detail.
pub type Ending = (&'static str, Option<String>);

/// The stored end of an agent run that `result` reports.
pub fn ending_of(result: &Result<RunReport, RunError>) -> Ending {
    match result {
        Ok(report) => match &report.outcome {
            Outcome::Succeeded => (state::SUCCEEDED, None),
            Outcome::Blocked { denials } => {
                (state::BLOCKED, Some(agent::denials_in_words(denials)))
            }
            Outcome::NoChanges => (state::FAILED, Some(executor::NO_CHANGES.to_string())),
            Outcome::HookFailed => (
                state::FAILED,
                Some(
                    report
                        .hook_error
                        .clone()
                        .unwrap_or_else(|| "a hook failed".into()),
                ),
            ),
            Outcome::Failed { exit } => (state::FAILED, Some(exit.to_string())),
            Outcome::TimedOut => (state::TIMED_OUT, None),
            Outcome::Cancelled { .. } => (state::CANCELLED, None),
        },
        Err(e) => (state::FAILED, Some(e.to_string())),
    }
}

/// A new run id: `run-` + UTC timestamp to the millisecond + random hex,
/// so ids sort by start time and two runs never share one. The random part
/// comes from a per-process seed read once from `/dev/urandom` and a
/// counter mixed through splitmix64 (a daemon names thousands of webhook
/// runs a second; opening `/dev/urandom` for each cost more than the rest).
pub fn new_run_id() -> String {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEED: OnceLock<u64> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let now = chrono::Utc::now();
    let seed = *SEED.get_or_init(|| {
        let mut bytes = [0u8; 8];
        let filled = std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut bytes))
            .is_ok();
        if filled {
            u64::from_le_bytes(bytes)
        } else {
            u64::from(std::process::id()) << 32 ^ u64::from(now.timestamp_subsec_nanos())
        }
    });
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut z = seed.wrapping_add(n.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    format!(
        "{RUN_ID_PREFIX}{}-{}",
        now.format("%Y%m%dt%H%M%S%3fz"),
        hex::encode(&z.to_le_bytes()[..RUN_ID_RANDOM_BYTES])
    )
}

/// The directory of run `id` under `state_dir`.
pub fn run_dir(state_dir: &Path, id: &str) -> PathBuf {
    state_dir.join(RUNS_DIR).join(id)
}

/// This process as a running row's owner (`supervisor::ProcessRecord::key`).
pub fn this_process() -> Option<String> {
    crate::supervisor::ProcessRecord::current().map(|p| p.key())
}

/// Mark the running rows whose owning process is gone (killed, crashed)
/// `interrupted`: they never run again. Rows of a live process (a daemon,
/// an `npc run` in another terminal) are left alone. Returns the ids.
pub async fn interrupt_orphans(
    store: &std::sync::Arc<crate::store::Store>,
) -> Result<Vec<String>, crate::store::StoreError> {
    let reader = store.clone();
    let running = tokio::task::spawn_blocking(move || reader.running_runs())
        .await
        .unwrap_or_else(|_| Ok(Vec::new()))?;
    let orphans: Vec<(String, Option<String>)> = running
        .into_iter()
        .filter(|(_, owner)| {
            !owner
                .as_deref()
                .and_then(crate::supervisor::ProcessRecord::parse)
                .is_some_and(crate::supervisor::ProcessRecord::alive)
        })
        .collect();
    if orphans.is_empty() {
        return Ok(Vec::new());
    }
    store.interrupt_runs(orphans).await
}
