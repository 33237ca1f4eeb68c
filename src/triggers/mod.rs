//! Triggers that fire: `cron`, `webhook` and `file_watch`. Each kind
//! implements one trait, [`TriggerKind`] — set up, start, stop, tear down,
//! an async stream of [`Firing`]s, and [`TriggerKind::next_fire_times`] —
//! and the daemon's trigger driver (`runtime::triggers`) runs every enabled
//! trigger of the manifest. A trigger only asks for runs: each firing
//! becomes a row of the durable run queue (`runs::queue`) before anyone is
//! told, and the one executor (`runs::executor`) carries it out like every
//! other run.
//!
//! Time comes from a [`clock::Clock`], so tests drive cron with a fake one.

pub mod clock;
pub mod cron;
pub mod file_watch;
pub mod webhook;

use std::path::PathBuf;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use tokio::sync::{mpsc, oneshot};

use crate::bus::EventBus;
use crate::runs::Origin;
use crate::runs::queue::{Accepted, Refused, Submission};
use crate::store::Store;

/// Firings buffered between a trigger and the queue before the trigger waits.
pub const FIRING_QUEUE_DEPTH: usize = 1024;
/// Largest payload a firing by hand carries (`npc trigger fire --payload`,
/// `POST /api/v1/triggers/{name}/fire`), as JSON text.
pub const MAX_MANUAL_PAYLOAD_BYTES: usize = 32 * 1024;
/// Default for [`TriggerKind::next_fire_times`] in listings.
pub const DEFAULT_NEXT_FIRES: usize = 5;

/// One firing of a trigger, on its way to the run queue.
#[derive(Debug)]
pub struct Firing {
    pub trigger: String,
    pub origin: Origin,
    /// What the action sees (`trigger` in a prompt template,
    /// `NPC_TRIGGER_PAYLOAD` for a command).
    pub payload: serde_json::Value,
    /// A firing with a key is stored at most once per trigger.
    pub dedupe_key: Option<String>,
    /// A trigger-state key committed with the firing (cron: its next fire
    /// time), whatever the queue decides.
    pub state: Option<(String, serde_json::Value)>,
    /// Told the outcome once it is committed (a webhook's 202 waits for it).
    pub ack: Option<Ack>,
    /// Until when the dedupe key refuses a later firing even after the row
    /// is pruned (a webhook signature's window; see
    /// `store::queue::NewRun::replay_until_ms`).
    pub replay_until_ms: Option<i64>,
}

impl Firing {
    pub fn new(trigger: &str, origin: Origin, payload: serde_json::Value) -> Self {
        Self {
            trigger: trigger.to_string(),
            origin,
            payload,
            dedupe_key: None,
            state: None,
            ack: None,
            replay_until_ms: None,
        }
    }

    /// The run the firing asks for, and whom to tell what became of it.
    pub fn into_submission(self) -> (Submission, Option<Ack>) {
        let run = Submission {
            queue: self.trigger,
            origin: self.origin,
            payload: self.payload,
            dedupe_key: self.dedupe_key,
            state: self.state,
            replay_until_ms: self.replay_until_ms,
            // Rendered from the trigger's template by the run service.
            concurrency_key: None,
            // The trigger's, set by the run service.
            retries: 0,
        };
        (run, self.ack)
    }
}

/// Told what became of a firing once it is committed.
pub type Ack = oneshot::Sender<Result<Accepted, Refused>>;

/// The async stream of a started trigger's firings.
pub type Firings = mpsc::Receiver<Firing>;

/// What a trigger may use.
#[derive(Debug, Clone)]
pub struct TriggerContext {
    /// The trigger's name.
    pub name: String,
    /// Canonical repository root.
    pub root: PathBuf,
    pub state_dir: PathBuf,
    /// Directories below the root a file_watch trigger never fires for,
    /// besides `.git/` and the state directory: the worktrees of runs
    /// (`[runs] worktrees_dir`), whose writes would fire runs without end.
    pub ignored: Vec<PathBuf>,
    pub store: Arc<Store>,
    pub bus: EventBus,
    pub clock: Arc<dyn clock::Clock>,
}

/// Why a trigger could not be set up, started or fired.
#[derive(Debug, thiserror::Error)]
pub enum TriggerError {
    #[error("schedule `{0}` never fires again; change it")]
    NeverFires(String),
    #[error(
        "webhook route `{route}`: the environment variable `{var}` holding its secret is not set in the daemon's environment; set it there and restart the daemon (a running daemon does not see variables set later, so `npc apply` cannot fix it)"
    )]
    MissingSecret { route: String, var: String },
    #[error("cannot watch `{path}`: {detail}")]
    Watch { path: String, detail: String },
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error(transparent)]
    Listener(#[from] crate::surfaces::webhook::WebhookListenError),
    #[error("no trigger `{name}` is applied; known triggers: {known}")]
    UnknownTrigger { name: String, known: String },
    #[error("the trigger was stopped")]
    Stopped,
}

impl From<TriggerError> for crate::driver::DriverError {
    fn from(e: TriggerError) -> Self {
        Self::Component(Box::new(e))
    }
}

/// One trigger kind's behaviour (the shape seed 000's providers share).
pub trait TriggerKind: Send + Sync + std::fmt::Debug {
    /// Prepare: read the trigger's stored state, check what it needs.
    fn setup(&mut self, cx: &TriggerContext) -> Result<(), TriggerError>;
    /// Begin firing; the stream ends when the trigger stops.
    fn start(&mut self, cx: &TriggerContext) -> Result<Firings, TriggerError>;
    /// Stop firing (the stored state stays: an edit or a restart resumes).
    fn stop(&mut self);
    /// The trigger was removed: forget its stored state.
    fn teardown(&mut self, cx: &TriggerContext);
    /// The next `limit` times the trigger fires by itself (cron only).
    fn next_fire_times(&self, limit: usize) -> Vec<DateTime<Utc>>;
    /// Called before [`setup`](Self::setup) when a fleet's daemon takes
    /// over the lead: past fire times in the stored state are the fleet's
    /// to fire, not missed while no daemon ran (cron only).
    fn take_over(&mut self) {}
}
