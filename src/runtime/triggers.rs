//! The daemon's trigger driver: keeps one running [`TriggerKind`] per
//! applied trigger, pumps its firings into the run service's queue
//! ([`Runs`], which tells its executor each trigger's overlap and action),
//! and owns the webhook [`Listener`] every trigger shares.
//! Starting a trigger sets it up (reading its stored state) and starts it;
//! an edit restarts it in place with its state kept (a cron trigger whose
//! schedule changed recomputes its next fire); removing it tears it down,
//! which forgets its state. A daemon that stops leaves every state stored.
//!
//! In a fleet only the leader fires cron ([`Scheduling`]): a daemon that
//! stands by keeps its cron triggers applied but not started, and starts
//! them when it takes the lead from the fleet's state (`runtime::fleet`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::bus::EventBus;
use crate::driver::{DriverContext, DriverError, TypedDriver};
use crate::model::{FleetRole, Manifest, Trigger, TriggerSource};
use crate::plan::ComponentId;
use crate::runs::queue::{Accepted, Refused};
use crate::runs::{Origin, Runs};
use crate::store::Store;
use crate::triggers::clock::{Clock, SystemClock};
use crate::triggers::cron::CronTrigger;
use crate::triggers::file_watch::FileWatchTrigger;
use crate::triggers::webhook::{Listener, WebhookTrigger};
use crate::triggers::{
    DEFAULT_NEXT_FIRES, Firing, Firings, TriggerContext, TriggerError, TriggerKind,
};

/// An applied trigger.
#[derive(Debug)]
struct Active {
    kind: Box<dyn TriggerKind>,
    config: Trigger,
    /// Firing; `false`: a cron trigger held while this daemon stands by.
    started: bool,
}

/// Who fires this daemon's cron triggers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Scheduling {
    /// One machine: this daemon fires them.
    #[default]
    Local,
    /// In a fleet, another scheduler leads (or none yet): they wait.
    Standby,
    /// In a fleet, this daemon leads: it fires them.
    Leader,
}

/// How a trigger is started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Launch {
    /// Applied, edited, or this daemon (re)started.
    Fresh,
    /// This daemon takes over its fleet's lead: fire times the gone leader
    /// left are owed ([`TriggerKind::take_over`]).
    TakingOver,
}

fn is_cron(t: &Trigger) -> bool {
    matches!(t.source, TriggerSource::Cron { .. })
}

fn is_webhook(t: &Trigger) -> bool {
    matches!(t.source, TriggerSource::Webhook { .. })
}

/// What `npc triggers` shows of one applied trigger.
#[derive(Debug, Clone, Serialize)]
pub struct TriggerView {
    pub name: String,
    pub kind: &'static str,
    pub next_fire_times: Vec<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub route: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
    pub overlap: &'static str,
    /// A cron trigger another scheduler of the fleet fires.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub standby: bool,
}

/// The trigger driver.
#[derive(Debug)]
pub struct TriggerDriver {
    store: Arc<Store>,
    bus: EventBus,
    cx: DriverContext,
    clock: Arc<dyn Clock>,
    runs: Arc<Runs>,
    webhooks: Arc<Listener>,
    active: Mutex<HashMap<String, Active>>,
    /// `[runs] worktrees_dir` of the manifest last loaded (file_watch
    /// triggers ignore it).
    worktrees: Mutex<Option<std::path::PathBuf>>,
    scheduling: Mutex<Scheduling>,
    /// What the daemon does for its fleet (`[store] role`); `None` outside one.
    role: Mutex<Option<FleetRole>>,
    /// The fleet's shared store, once joined: a removed cron trigger's
    /// state is forgotten there too.
    fleet: std::sync::OnceLock<Arc<crate::store::pg::PgStore>>,
}

impl TriggerDriver {
    /// A driver with no triggers, asking `runs` for their runs.
    pub fn new(cx: DriverContext, store: Arc<Store>, bus: EventBus, runs: Arc<Runs>) -> Self {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock::from_env());
        Self {
            webhooks: Listener::new(bus.clone(), clock.clone()),
            store,
            bus,
            cx,
            clock,
            runs,
            active: Mutex::new(HashMap::new()),
            worktrees: Mutex::new(None),
            scheduling: Mutex::new(Scheduling::Local),
            role: Mutex::new(None),
            fleet: std::sync::OnceLock::new(),
        }
    }

    /// The daemon joined its fleet's shared store, where its cron
    /// triggers' state lives from now on.
    pub fn joined(&self, store: Arc<crate::store::pg::PgStore>) {
        let _ = self.fleet.set(store);
    }

    fn active(&self) -> std::sync::MutexGuard<'_, HashMap<String, Active>> {
        crate::stdx::lock(&self.active)
    }

    /// A manifest is about to be applied: the webhook listener's address
    /// follows it (routes start during the apply).
    pub fn manifest_loaded(&self, manifest: &Manifest) {
        *crate::stdx::lock(&self.worktrees) = manifest
            .runs
            .worktrees_dir
            .as_ref()
            .map(|d| self.cx.repo.join(d));
        let remote = manifest.daemon.allow_remote && manifest.daemon.token_env.is_some();
        self.webhooks
            .configure(manifest.daemon.webhook_listen, remote);
    }

    fn context(&self, name: &str) -> TriggerContext {
        TriggerContext {
            name: name.to_string(),
            root: self.cx.repo.clone(),
            state_dir: self.cx.state_dir.clone(),
            ignored: crate::stdx::lock(&self.worktrees).iter().cloned().collect(),
            store: self.store.clone(),
            bus: self.bus.clone(),
            clock: self.clock.clone(),
        }
    }

    fn make(&self, name: &str, t: &Trigger) -> Result<Box<dyn TriggerKind>, TriggerError> {
        Ok(match &t.source {
            TriggerSource::Cron {
                schedule,
                timezone,
                missed,
            } => Box::new(CronTrigger::new(schedule.clone(), timezone.0, *missed)),
            TriggerSource::Webhook { .. } => {
                Box::new(WebhookTrigger::new(name, &t.source, self.webhooks.clone()))
            }
            TriggerSource::FileWatch { .. } => Box::new(FileWatchTrigger::new(&t.source)),
        })
    }

    /// Who fires the cron triggers now.
    pub fn scheduling(&self) -> Scheduling {
        *crate::stdx::lock(&self.scheduling)
    }

    /// What the daemon does for its fleet, when it is in one.
    pub fn role(&self) -> Option<FleetRole> {
        *crate::stdx::lock(&self.role)
    }

    /// The daemon joins a fleet as `role`: cron triggers stand by (until
    /// it leads, if its role schedules at all), and without the ingress
    /// its webhook triggers stop (the listener closes with its last
    /// route), their applied config kept.
    pub fn join_fleet(&self, role: FleetRole) {
        *crate::stdx::lock(&self.role) = Some(role);
        self.stand_by();
        if !role.takes_webhooks() {
            self.relaunch(|a| a.started && is_webhook(&a.config));
            self.webhooks.shutdown();
        }
    }

    /// Stop and start again the triggers `which` picks, as they start now.
    fn relaunch(&self, which: impl Fn(&Active) -> bool) {
        let picked: Vec<(String, Trigger)> = self
            .active()
            .iter()
            .filter(|(_, a)| which(a))
            .map(|(name, a)| (name.clone(), a.config.clone()))
            .collect();
        for (name, config) in picked {
            self.halt(&name, false);
            if let Err(e) = self.launch_as(&name, &config, Launch::TakingOver) {
                tracing::warn!("trigger `{name}`: {e}");
            }
        }
    }

    /// Set up and start trigger `name`, pumping its firings into the queue
    /// (a cron trigger only where this daemon schedules, a webhook only
    /// where it takes webhooks).
    fn launch(&self, name: &str, t: &Trigger) -> Result<(), TriggerError> {
        self.launch_as(name, t, Launch::Fresh)
    }

    /// [`launch`](Self::launch), taking over a fleet's lead or not.
    fn launch_as(&self, name: &str, t: &Trigger, how: Launch) -> Result<(), TriggerError> {
        let mut kind = self.make(name, t)?;
        if how == Launch::TakingOver {
            kind.take_over();
        }
        let waits_for_lead = is_cron(t) && self.scheduling() == Scheduling::Standby;
        let not_ingress = is_webhook(t) && self.role().is_some_and(|r| !r.takes_webhooks());
        let started = !(waits_for_lead || not_ingress);
        if started {
            let tcx = self.context(name);
            kind.setup(&tcx)?;
            let firings = kind.start(&tcx)?;
            tokio::spawn(pump(firings, self.runs.clone()));
        }
        self.runs.set_trigger(name, t);
        self.active().insert(
            name.to_string(),
            Active {
                kind,
                config: t.clone(),
                started,
            },
        );
        Ok(())
    }

    /// The daemon is in a fleet and does not lead its scheduling: cron
    /// triggers stop firing (their applied config stays).
    pub fn stand_by(&self) {
        *crate::stdx::lock(&self.scheduling) = Scheduling::Standby;
        self.relaunch(|a| a.started && is_cron(&a.config));
    }

    /// The daemon leads its fleet's scheduling: each cron trigger starts
    /// from the fleet's stored state (`shared`, by trigger name), firing
    /// each fire time already past once (the gone leader's, owed; its dedupe
    /// key keeps one already fired from running twice). Returns each
    /// started trigger's state, for the fleet.
    pub async fn lead(
        &self,
        shared: &std::collections::BTreeMap<String, serde_json::Value>,
    ) -> Vec<(String, serde_json::Value)> {
        *crate::stdx::lock(&self.scheduling) = Scheduling::Leader;
        let held: Vec<(String, Trigger)> = self
            .active()
            .iter()
            .filter(|(_, a)| !a.started && is_cron(&a.config))
            .map(|(name, a)| (name.clone(), a.config.clone()))
            .collect();
        let mut started = Vec::new();
        for (name, config) in held {
            if let Some(value) = shared.get(&name)
                && let Err(e) = self
                    .store
                    .set_trigger_value(name.clone(), crate::triggers::cron::STATE_KEY, value)
                    .await
            {
                tracing::warn!("trigger `{name}`: cannot take the fleet's state: {e}");
            }
            self.halt(&name, false);
            if let Err(e) = self.launch_as(&name, &config, Launch::TakingOver) {
                tracing::warn!("trigger `{name}`: {e}");
                continue;
            }
            // The trigger's setup queued its state; read it once written.
            if let Err(e) = self.store.flush().await {
                tracing::warn!("trigger `{name}`: {e}");
            }
            let state = self
                .store
                .trigger_state(&name)
                .ok()
                .and_then(|mut s| s.remove(crate::triggers::cron::STATE_KEY));
            if let Some(state) = state {
                started.push((name, state));
            }
        }
        started
    }

    /// Stop trigger `name`; with `teardown`, forget its state too.
    fn halt(&self, name: &str, teardown: bool) {
        if let Some(mut a) = self.active().remove(name) {
            a.kind.stop();
            if teardown {
                a.kind.teardown(&self.context(name));
            }
        }
    }

    /// Fire trigger `name` by hand (`npc trigger fire`), through the queue.
    pub async fn fire(
        &self,
        name: &str,
        payload: serde_json::Value,
    ) -> Result<Accepted, FireError> {
        let Some(overlap) = self.runs.overlap_of(name) else {
            let known = self.runs.trigger_names();
            return Err(FireError::Unknown(TriggerError::UnknownTrigger {
                name: name.to_string(),
                known: crate::model::diagnostics::known_names(&known),
            }));
        };
        let firing = Firing::new(
            name,
            Origin::Manual,
            serde_json::json!({ "trigger": name, "kind": "manual", "payload": payload }),
        );
        self.runs
            .submit(firing.into_submission().0, overlap)
            .await
            .map_err(FireError::Refused)
    }

    /// Each applied trigger, sorted by name.
    pub fn views(&self) -> Vec<TriggerView> {
        let active = self.active();
        let mut views: Vec<TriggerView> = active
            .iter()
            .map(|(name, a)| {
                let (kind, route, paths) = match &a.config.source {
                    TriggerSource::Cron { .. } => ("cron", None, Vec::new()),
                    TriggerSource::Webhook { route, .. } => {
                        ("webhook", Some(route.clone()), Vec::new())
                    }
                    TriggerSource::FileWatch { paths, .. } => ("file_watch", None, paths.clone()),
                };
                let url = route.as_ref().and_then(|r| {
                    self.webhooks
                        .bound()
                        .map(|addr| format!("http://{addr}/webhooks/{r}"))
                });
                TriggerView {
                    name: name.clone(),
                    kind,
                    next_fire_times: a.kind.next_fire_times(DEFAULT_NEXT_FIRES),
                    route,
                    url,
                    paths,
                    overlap: a.config.overlap.as_str(),
                    standby: !a.started,
                }
            })
            .collect();
        views.sort_by(|a, b| a.name.cmp(&b.name));
        views
    }

    /// The daemon stops: every trigger stops (state kept), running runs are
    /// cancelled, the listener closes.
    pub async fn shutdown(&self) {
        let names: Vec<String> = self.active().keys().cloned().collect();
        for name in names {
            self.halt(&name, false);
        }
        self.webhooks.shutdown();
    }
}

/// Why `npc trigger fire` recorded nothing.
#[derive(Debug, thiserror::Error)]
pub enum FireError {
    #[error(transparent)]
    Unknown(TriggerError),
    #[error(transparent)]
    Refused(Refused),
}

/// Move a trigger's firings into the queue. Each submission is issued at
/// once (commit order is firing order) and awaited on its own task, so a
/// burst shares group commits.
async fn pump(mut firings: Firings, runs: Arc<Runs>) {
    while let Some(firing) = firings.recv().await {
        let overlap = runs.overlap_of(&firing.trigger).unwrap_or_default();
        let trigger = firing.trigger.clone();
        let (run, ack) = firing.into_submission();
        let submitted = runs.submit(run, overlap);
        tokio::spawn(async move {
            let result = submitted.await;
            if let Err(e) = &result {
                tracing::warn!("trigger `{trigger}`: {e}");
            }
            if let Some(ack) = ack {
                let _ = ack.send(result);
            }
        });
    }
}

impl TypedDriver for TriggerDriver {
    type Config = Trigger;

    async fn start(
        &self,
        _cx: &DriverContext,
        id: &ComponentId,
        t: &Trigger,
    ) -> Result<Option<u32>, DriverError> {
        self.halt(&id.name, false);
        self.launch(&id.name, t)?;
        Ok(None)
    }

    async fn update(
        &self,
        _cx: &DriverContext,
        id: &ComponentId,
        old: &Trigger,
        new: &Trigger,
    ) -> Result<(), DriverError> {
        // In place: the stored state stays (a new schedule recomputes).
        self.halt(&id.name, false);
        if let Err(e) = self.launch(&id.name, new) {
            // Back to the old config, so the trigger keeps firing.
            let _ = self.launch(&id.name, old);
            return Err(e.into());
        }
        Ok(())
    }

    async fn stop(&self, _cx: &DriverContext, id: &ComponentId) -> Result<(), DriverError> {
        let cron = self
            .active()
            .get(&id.name)
            .is_some_and(|a| is_cron(&a.config));
        self.halt(&id.name, true);
        self.runs.remove_trigger(&id.name);
        // Removed in a fleet: the fleet forgets its state too, so a
        // trigger of that name added later starts afresh, as it does on
        // one machine.
        if cron && let Some(store) = self.fleet.get() {
            let key = crate::triggers::cron::STATE_KEY;
            if let Err(e) = store.forget_trigger_value(&id.name, key).await {
                tracing::warn!("trigger `{}`: the fleet keeps its state: {e}", id.name);
            }
        }
        Ok(())
    }
}
