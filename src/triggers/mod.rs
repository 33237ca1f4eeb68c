//! Triggers that fire: `cron`, `webhook` and `file_watch`. Each kind
//! implements one trait, [`TriggerKind`] — set up, start, stop, tear down,
//! an async stream of [`Firing`]s, and [`TriggerKind::next_fire_times`] —
//! and the daemon's trigger driver (`runtime::triggers`) runs every enabled
//! trigger of the manifest. A firing becomes a row of the durable run queue
//! ([`queue`], over `store::queue`) before anyone is told; the [`executor`]
//! takes runs from it with bounded concurrency and each trigger's overlap
//! policy, and carries out the action (a profile through the `npc run`
//! path, or a command through the supervisor), recording every event with
//! the run id (component `run.<id>`, the same as `npc run`'s runs).
//!
//! Time comes from a [`clock::Clock`], so tests drive cron with a fake one.

pub mod clock;
pub mod cron;
pub mod executor;
pub mod file_watch;
pub mod queue;
pub mod webhook;

use std::path::PathBuf;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio::sync::{mpsc, oneshot};

use crate::bus::EventBus;
use crate::store::Store;
use crate::store::queue::Enqueued;

/// Firings buffered between a trigger and the queue before the trigger waits.
pub const FIRING_QUEUE_DEPTH: usize = 1024;
/// Largest payload a firing by hand carries (`npc trigger fire --payload`,
/// `POST /api/v1/triggers/{name}/fire`), as JSON text.
pub const MAX_MANUAL_PAYLOAD_BYTES: usize = 32 * 1024;
/// Default for [`TriggerKind::next_fire_times`] in listings.
pub const DEFAULT_NEXT_FIRES: usize = 5;

/// Where a firing came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    Cron,
    Webhook,
    FileWatch,
    /// `npc trigger fire NAME`.
    Manual,
    /// A profile run started through the REST API (`POST /api/v1/runs`).
    Api,
    /// A prompt of `npc acp` run by the daemon (`acp::daemon::AcpRun`).
    Acp,
}

impl Origin {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cron => "cron",
            Self::Webhook => "webhook",
            Self::FileWatch => "file_watch",
            Self::Manual => "manual",
            Self::Api => "api",
            Self::Acp => "acp",
        }
    }
}

/// The queue name of profile runs started by hand through the API. It is
/// not a valid trigger name (`[a-z0-9][a-z0-9_-]*`), so no trigger shares
/// it; its runs never wait behind each other (overlap does not apply).
pub const MANUAL_QUEUE: &str = "@manual";

/// A profile run started by hand (`POST /api/v1/runs`): the request body,
/// and the queue row's payload the executor runs it from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ManualRun {
    /// A `[profiles.NAME]` of the applied manifest.
    pub profile: String,
    /// The task prompt, used as written (instead of the profile's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// A `[prompts.NAME]` to render instead (with `vars`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_template: Option<String>,
    /// Variables for `prompt_template`.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub vars: std::collections::BTreeMap<String, String>,
}

/// What became of a firing, once the queue committed it (or refused it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Accepted {
    pub run_id: String,
    pub outcome: Enqueued,
}

/// Why the queue recorded nothing for a firing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("trigger `{0}` has too many queued runs; try again once some have run")]
    QueueFull(String),
    #[error("the run queue cannot record the firing: {0}")]
    Store(String),
}

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
    pub ack: Option<oneshot::Sender<Result<Accepted, Refused>>>,
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
        }
    }
}

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
    pub store: Arc<Store>,
    pub bus: EventBus,
    pub clock: Arc<dyn clock::Clock>,
}

/// Why a trigger could not be set up, started or fired.
#[derive(Debug, thiserror::Error)]
pub enum TriggerError {
    #[error("unknown time zone `{0}`; use an IANA name such as `Europe/Berlin`")]
    TimeZone(String),
    #[error("schedule `{0}` never fires again; change it")]
    NeverFires(String),
    #[error(
        "webhook route `{route}`: the environment variable `{var}` holding its secret is not set; set it and reload (`npc apply`)"
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
}
