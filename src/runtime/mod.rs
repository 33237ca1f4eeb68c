//! The runtime: one object per canonical repository path that composes the
//! store, the event bus and the supervisor, and the reconcile loop that
//! applies plans through the [`drivers`] (rolling a failed component back to
//! its last good config).
//!
//! Reload order follows Vector's topology reload: components that go away
//! or get replaced stop first (all at once, freeing their ports),
//! then new and replaced ones start and live changes apply (start order).

pub mod api;
pub mod daemon;
pub mod drivers;
pub mod files;
mod fleet;
mod inputs;
mod load;
pub mod lock;
pub mod mcp;
pub mod notices;
pub mod npc_tools;
mod paths;
mod state;
pub mod triggers;
pub mod watch;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::mpsc;

use crate::bus::{BusError, EventBus};
use crate::driver::{Driver, DriverContext, DriverError};
use crate::event::{self as ev, Event};
use crate::model::{self, Manifest};
use crate::plan::{self, Action, ComponentId, Config, Desired, ObservedState};
use crate::store::{ComponentRecord, NewEvent, Store, StoreError, now_ms};
use crate::supervisor::{BackoffPolicy, Supervisor, SupervisorEvent};
use drivers::driver_for;
use lock::{LockError, RepoLock};

pub use inputs::{
    MAX_PACKAGE_BYTES, MAX_PACKAGE_ENTRIES, MAX_PACKAGE_FILE_BYTES, MAX_PACKAGE_FILES, NpcOutput,
    checked_external_inputs, external_inputs, npc_output,
};
pub use load::{
    FILES_DEADLINE, LOAD_DEADLINE, PLAN_BASIS_VERSION, STALE_PLAN, Sources, is_operational,
    load_from_disk, load_from_disk_with, load_manifest, load_sourced, load_with, plan_fingerprint,
};
use load::{LoadFailure, OperationalFiles};
pub use paths::{
    DB_FILE, RepoPaths, STORE_SIDE_SUFFIXES, TOKEN_FILE, open_existing_store, open_store,
    open_store_brief, open_store_read_only, state_dir_hint,
};
pub use state::{decode_state, encode_state, record_state, stored_state};

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Bus(#[from] BusError),
    #[error(transparent)]
    Control(#[from] crate::surfaces::control::ControlError),
    #[error("cannot read the manifest `{path}`: {source}")]
    Manifest {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the manifest `{0}` is invalid; run `npc validate` to see why")]
    Invalid(PathBuf),
    #[error("cannot resolve the repository `{path}`: {source}")]
    Repo {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Guard(#[from] crate::repofs::FsError),
    #[error("cannot use the API token `{}`: {reason}", path.display())]
    Token { path: PathBuf, reason: String },
}

pub use crate::plan::outcome::{ComponentResult, Outcome, ReloadOutcome};

/// A manifest loaded for a reload, with what it was computed from.
#[derive(Debug)]
struct Loaded {
    manifest: Manifest,
    desired: Desired,
    sources: load::Sources,
    inputs: plan::ExternalInputs,
}

/// A reload's component result as `reconcile.applied` lists it.
fn component_outcome(result: &ComponentResult) -> ev::ComponentOutcome {
    ev::ComponentOutcome {
        id: result.id.to_string(),
        action: result.action,
        outcome: result.outcome.as_str().to_string(),
        pid: result.pid,
        error: result.error.clone(),
    }
}

/// What [`Runtime::preview`] found.
#[derive(Debug)]
pub enum Preview {
    Plan(plan::Plan),
    /// The manifest is invalid; the payload a `manifest.invalid` event would carry.
    Invalid {
        payload: serde_json::Value,
    },
    /// Loading failed for an operational reason.
    Failed {
        error: String,
    },
}

/// What is applied now: typed configs in start order.
#[derive(Debug, Default)]
struct Applied {
    configs: Desired,
    /// `configs` in the planner's terms, refreshed once per reload.
    observed: ObservedState,
    pids: HashMap<ComponentId, u32>,
    /// Components of the manifest that failed to start and have no config
    /// running, with why: `npc status` shows them as failed (they are in
    /// neither `configs` nor the observed state, so every reload tries
    /// them again).
    failed: BTreeMap<ComponentId, String>,
}

/// One per canonical repository path; see [`Runtime::for_repo`].
#[derive(Debug)]
pub struct Runtime {
    paths: RepoPaths,
    store: Arc<Store>,
    bus: EventBus,
    cx: DriverContext,
    /// The MCP servers' driver and the daemon's upstream pool.
    mcp: mcp::McpDriver,
    /// Panes and pane plugins.
    panes: crate::panes::PaneHost,
    /// The run service: the queue and the one executor every run goes through.
    runs: Arc<crate::runs::Runs>,
    /// The triggers' driver, which asks `runs` for their runs.
    triggers: Arc<triggers::TriggerDriver>,
    /// The workflow engine, which asks `runs` for its steps' runs.
    workflows: Arc<crate::workflows::Workflows>,
    /// The notification sinks (`[notify.NAME]`), fed by the bus.
    notify: Option<crate::notify::Notifier>,
    applied: tokio::sync::Mutex<Applied>,
    shut_down: std::sync::atomic::AtomicBool,
    written: Arc<watch::Written>,
    /// Signalled by every reload that fails for an operational reason, so
    /// the daemon retries reloads that a control request started too.
    failed: tokio::sync::Notify,
    /// The REST API's base URL, once it listens.
    api_url: std::sync::OnceLock<String>,
    /// Whether the API wants a credential (`daemon.auth`), once it listens.
    api_locked: std::sync::OnceLock<bool>,
    /// The dashboard's one-time codes and sessions.
    dashboard: Arc<crate::api::auth::Dashboard>,
    /// The plugin notices of the last applied manifest, so each collision
    /// or dropped plugin is an event once, not on every reload.
    plugin_notices: Mutex<Vec<model::PluginNotice>>,
    /// The fleet's shared store, once this daemon joined it (`[store] url`).
    fleet: Arc<std::sync::OnceLock<Arc<crate::store::pg::PgStore>>>,
    /// Cancelled when the runtime shuts down: ends the fleet's notice relay.
    stopping: tokio_util::sync::CancellationToken,
    /// Whether the last load found the manifest invalid, so the next valid
    /// one says so (`manifest.valid`): the event log and an open dashboard
    /// do not end on an error that is fixed.
    invalid: std::sync::atomic::AtomicBool,
    _lock: RepoLock,
}

static RUNTIMES: Mutex<Option<HashMap<PathBuf, Weak<Runtime>>>> = Mutex::new(None);

impl Runtime {
    /// The runtime of the repository whose manifest is `paths.manifest`. A
    /// second call in this process returns the same object; a second process
    /// fails with the pid of the daemon that holds the repository lock.
    pub fn for_repo(
        paths: RepoPaths,
        backoff: BackoffPolicy,
    ) -> Result<Arc<Runtime>, RuntimeError> {
        let mut registry = crate::stdx::lock(&RUNTIMES);
        let registry = registry.get_or_insert_with(HashMap::new);
        if let Some(existing) = registry.get(&paths.root).and_then(Weak::upgrade) {
            return Ok(existing);
        }
        let lock = RepoLock::acquire(&paths.runtime_dir(), &paths.root)?;
        let store = Arc::new(open_store(&paths)?);
        let bus = EventBus::new(store.clone());
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let supervisor = Supervisor::for_npc(events_tx, backoff, &paths.root, &paths.runtime_dir());
        let cx = DriverContext {
            repo: paths.root.clone(),
            state_dir: paths.state_dir.clone(),
            supervisor,
        };
        let mcp = mcp::McpDriver::new(cx.clone(), &paths, bus.clone());
        let panes = crate::panes::PaneHost::new(&cx, &paths.runtime_dir(), bus.clone());
        let runs = crate::runs::Runs::new(cx.clone(), store.clone(), bus.clone());
        let triggers = Arc::new(triggers::TriggerDriver::new(
            cx.clone(),
            store.clone(),
            bus.clone(),
            runs.clone(),
        ));
        let workflows =
            crate::workflows::Workflows::new(store.clone(), runs.clone(), bus.clone(), cx.clone());
        workflows.spawn();
        runs.set_workflow_starter(workflows.clone());
        mcp.set_runs(runs.clone());
        let notify = crate::notify::Notifier::start(
            bus.clone(),
            store.clone(),
            cx.supervisor.clone(),
            paths.root.clone(),
        )
        .inspect_err(|e| tracing::warn!("notifications are off: {e}"))
        .ok();
        let runtime = Arc::new(Runtime {
            paths: paths.clone(),
            store,
            bus,
            cx,
            mcp,
            panes,
            runs,
            triggers,
            workflows,
            notify,
            applied: tokio::sync::Mutex::new(Applied::default()),
            shut_down: std::sync::atomic::AtomicBool::new(false),
            written: Arc::default(),
            failed: tokio::sync::Notify::new(),
            api_url: std::sync::OnceLock::new(),
            api_locked: std::sync::OnceLock::new(),
            dashboard: Arc::default(),
            plugin_notices: Mutex::new(Vec::new()),
            fleet: Arc::default(),
            stopping: tokio_util::sync::CancellationToken::new(),
            invalid: std::sync::atomic::AtomicBool::new(false),
            _lock: lock,
        });
        tokio::spawn(forward_supervisor_events(
            Arc::downgrade(&runtime),
            events_rx,
        ));
        registry.insert(paths.root, Arc::downgrade(&runtime));
        Ok(runtime)
    }

    pub fn paths(&self) -> &RepoPaths {
        &self.paths
    }

    pub fn bus(&self) -> &EventBus {
        &self.bus
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// The fleet's shared store, once this daemon joined it.
    pub fn fleet_store(&self) -> Option<&Arc<crate::store::pg::PgStore>> {
        self.fleet.get()
    }

    /// The REST API's base URL, once it listens (see `api::start`).
    pub fn api_url(&self) -> Option<&str> {
        self.api_url.get().map(String::as_str)
    }

    /// A URL that opens the dashboard, once the API listens: with a new
    /// one-time code in its fragment when the API wants a credential.
    pub fn dashboard_url(&self) -> Option<String> {
        let url = self.api_url()?;
        if !self.api_locked.get().copied().unwrap_or(true) {
            return Some(format!("{url}/"));
        }
        match self.dashboard.issue_code() {
            Ok(code) => Some(format!("{url}/#code={code}")),
            Err(e) => {
                tracing::warn!("cannot make a dashboard code: {e}");
                None
            }
        }
    }

    /// The MCP driver, which owns the daemon's upstream pool and gateway.
    pub fn mcp(&self) -> &mcp::McpDriver {
        &self.mcp
    }

    /// The pane host (panes and pane plugins).
    pub fn panes(&self) -> &crate::panes::PaneHost {
        &self.panes
    }

    /// The notifier, unless the bus refused its subscription.
    pub fn notify(&self) -> Option<&crate::notify::Notifier> {
        self.notify.as_ref()
    }

    /// The trigger driver.
    pub fn triggers(&self) -> &triggers::TriggerDriver {
        &self.triggers
    }

    /// The run service (queue and executor).
    pub fn runs(&self) -> &Arc<crate::runs::Runs> {
        &self.runs
    }

    /// The workflow engine.
    pub fn workflows(&self) -> &Arc<crate::workflows::Workflows> {
        &self.workflows
    }

    /// Answer pending approval `approval` of run `id` (its oldest when
    /// `None`): in this daemon's
    /// store, or, for a run this daemon does not hold, in its fleet's
    /// shared store (the worker carrying the run reads the answer there).
    pub async fn answer_run(
        &self,
        id: &str,
        approval: Option<String>,
        answer: crate::store::approvals::Answer,
        by: &'static str,
    ) -> Result<crate::store::approvals::ApprovalRow, crate::runs::AnswerError> {
        use crate::runs::AnswerError;
        use crate::store::approvals::{AnswerRefused, ApprovalRow, Settled};
        let local = self
            .runs()
            .answer(id, approval.clone(), answer.clone(), by)
            .await;
        let (Err(AnswerError::Refused(AnswerRefused::NoRun { .. })), Some(fleet)) =
            (&local, self.fleet_store())
        else {
            return local;
        };
        let settled = Settled::of(&answer, by);
        let shared = fleet
            .answer_approval(id, approval.as_deref(), &settled)
            .await
            .map_err(AnswerError::Store)?
            .map_err(AnswerError::Refused)?;
        Ok(ApprovalRow {
            id: shared.id,
            run_id: shared.run_id,
            profile: None,
            tool: shared.tool,
            rule: String::new(),
            reason: None,
            arguments: serde_json::Value::Null,
            state: settled.state,
            always: settled.always,
            answer: settled.answer,
            answered_by: Some(settled.by),
            asked_at_ms: 0,
            deadline_ms: 0,
            answered_at_ms: Some(crate::store::now_ms()),
        })
    }

    /// The driver of `kind`: the runtime's own MCP driver, trigger driver or
    /// pane host, or a stateless one.
    fn driver(&self, kind: plan::Kind) -> &dyn Driver {
        match kind {
            plan::Kind::McpServer => &self.mcp,
            plan::Kind::Trigger => &*self.triggers,
            plan::Kind::Pane | plan::Kind::PanePlugin => &self.panes,
            other => driver_for(other),
        }
    }

    /// Publish an event; failures are logged, never fatal to the caller.
    pub async fn emit(&self, event: Event, component: Option<&ComponentId>) {
        let kind = event.kind();
        let mut event = NewEvent::from(event);
        if let Some(id) = component {
            event = event.for_component(id.to_string());
        }
        if let Err(e) = self.bus.publish(event).await {
            tracing::error!("cannot publish `{kind}`: {e}");
        }
    }

    /// The applied state, in the planner's terms.
    pub async fn observed(&self) -> ObservedState {
        self.applied.lock().await.observed.clone()
    }

    /// The files a reload depends on: the manifest, prompt files, plugin dirs.
    pub fn watch_set(&self, manifest: Option<&Manifest>) -> watch::WatchSet {
        let mut set = watch::WatchSet::default();
        set.files.insert(self.paths.manifest.clone());
        set.own.dirs.insert(self.paths.state_dir.clone());
        if let Some(m) = manifest {
            set.own = npc_output(&m.project.state_dir, &self.paths.root);
            for p in m.prompts.values() {
                if let model::PromptSource::File { path } = &p.source {
                    set.files.insert(self.paths.root.join(path));
                }
            }
            for p in m.plugins.values() {
                set.dirs.insert(self.paths.root.join(&p.path));
            }
        }
        // The user plugin registry: `npc plugin enable` / `disable` reload.
        if let Ok(registry) = crate::plugins::registry::path() {
            if let Some(dir) = registry.parent() {
                // Watched by its directory, which must exist to be watched.
                let _ = std::fs::create_dir_all(dir);
            }
            set.files.insert(registry);
        }
        set
    }

    /// Load, validate, plan and apply the manifest. An invalid manifest, a
    /// refused change or an operational failure leaves everything as it is;
    /// a reload that changes nothing emits nothing, except `manifest.valid`
    /// when the manifest was invalid before.
    pub async fn reload(&self, reason: &str) -> (ReloadOutcome, Option<Manifest>) {
        self.reload_checked(reason, None).await
    }

    /// [`Runtime::reload`], applying only a plan whose fingerprint
    /// ([`load::plan_fingerprint`]) is `expected` when one is given: a plan
    /// computed from anything else (an edit of the manifest or a file it
    /// references, another applied state) is [`ReloadOutcome::Stale`] and
    /// changes nothing.
    pub async fn reload_checked(
        &self,
        reason: &str,
        expected: Option<&str>,
    ) -> (ReloadOutcome, Option<Manifest>) {
        tracing::info!("reloading: {reason}");
        let (manifest, desired) = match self.load().await {
            Ok(loaded) => {
                if let Some(expected) = expected {
                    let observed = self.observed().await;
                    let actual = load::plan_fingerprint(&loaded.sources, &loaded.inputs, &observed);
                    if actual != expected {
                        return (ReloadOutcome::Stale, None);
                    }
                }
                (loaded.manifest, loaded.desired)
            }
            Err(LoadFailure::Operational(error)) => {
                self.report_failure(reason, &error).await;
                return (ReloadOutcome::Failed { error }, None);
            }
            Err(LoadFailure::Invalid {
                mut payload,
                error_count,
            }) => {
                payload.reason = Some(reason.to_string());
                self.invalid
                    .store(true, std::sync::atomic::Ordering::SeqCst);
                self.emit(Event::ManifestInvalid(*payload), None).await;
                return (ReloadOutcome::Invalid { error_count }, None);
            }
        };
        if self
            .invalid
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            let valid = ev::ManifestValid {
                reason: reason.to_string(),
                after: "manifest.invalid".to_string(),
            };
            self.emit(Event::ManifestValid(valid), None).await;
        }
        self.bus.set_secrets(manifest.secret_values());
        self.join_fleet(&manifest);
        self.triggers.manifest_loaded(&manifest);
        let outcome = self.apply(desired, reason).await;
        if let ReloadOutcome::Applied { results } = &outcome {
            // The gateway's built-ins and manifest prompts follow the manifest.
            self.mcp.manifest_applied(&manifest);
            self.panes.manifest_applied(&manifest).await;
            self.runs.set_manifest(&manifest);
            if let Some(notify) = &self.notify {
                notify.set_manifest(&manifest);
            }
            self.plugin_notices_applied(&manifest).await;
            let running = self.as_running(&manifest, results).await;
            if let Err(error) = self.write_files(&running).await {
                self.report_failure(reason, &error).await;
                return (ReloadOutcome::Failed { error }, Some(manifest));
            }
        }
        (outcome, Some(manifest))
    }

    /// With `[store] url`, hand the fleet's runs to its shared store (once:
    /// a new URL takes a restart): until the store answers they are
    /// refused, never run here; the connection is retried with backoff
    /// while the daemon serves everything else. Cron fires only while this
    /// daemon leads the fleet's scheduling, and only a daemon whose
    /// `[store] role` schedules asks for the lead; webhooks are served only
    /// where the role takes them (a new role, like a new URL, takes a
    /// restart). Once joined, its notices go to the fleet's board too, and
    /// the fleet's come back.
    fn join_fleet(&self, manifest: &Manifest) {
        let Some(url) = manifest.store.url.as_ref().map(|u| u.expose().to_string()) else {
            return;
        };
        if !self.runs.queue().join() {
            return;
        }
        let role = manifest.store.role;
        self.triggers.join_fleet(role);
        let (runs, bus, triggers) = (self.runs.clone(), self.bus.clone(), self.triggers.clone());
        let (supervisor, root) = (self.cx.supervisor.clone(), self.paths.root.clone());
        let project = manifest.project.name.clone();
        let lease = std::time::Duration::from_secs(manifest.store.lease_timeout_secs);
        let joined = self.fleet.clone();
        let (local, stop) = (self.panes.notices(), self.stopping.clone());
        tokio::spawn(async move {
            let fleet =
                crate::runs::fleet::fleet_name(&supervisor, &root, project.as_deref()).await;
            let remote = crate::runs::remote::origin_of(&supervisor, &root).await;
            let remote = remote.map(|r| r.shown);
            let store = fleet::join(&runs, &bus, &url, &fleet, remote.clone()).await;
            tokio::spawn(fleet::watch_health(
                store.clone(),
                runs.clone(),
                bus.clone(),
                remote,
            ));
            let _ = joined.set(store.clone());
            triggers.joined(store.clone());
            let board = store.clone() as Arc<dyn crate::store::notices::Notices>;
            let relay = notices::FleetRelay {
                fleet: &fleet,
                repository: root.display().to_string(),
                bus: bus.clone(),
            };
            relay.start(board, local, stop).await;
            if role.schedules() {
                fleet::schedule(&store, &triggers, &bus, lease).await;
            }
        });
    }

    /// Record each plugin notice of `manifest` (a `registry.plugin_collision`
    /// with `policy = "keep_first"`, or a `registry.plugin_dropped`) that
    /// the previous applied manifest did not have.
    async fn plugin_notices_applied(&self, manifest: &Manifest) {
        let new: Vec<model::PluginNotice> = {
            let mut seen = crate::stdx::lock(&self.plugin_notices);
            let new = manifest
                .plugin_notices
                .iter()
                .filter(|n| !seen.contains(n))
                .cloned()
                .collect();
            *seen = manifest.plugin_notices.clone();
            new
        };
        for notice in new {
            tracing::warn!("{}: {notice:?}", notice.event_kind());
            self.emit(plugin_notice_event(notice), None).await;
        }
    }

    /// A reload failed for an operational reason: say so, and wake the
    /// daemon's retry.
    async fn report_failure(&self, reason: &str, error: &str) {
        tracing::warn!("reload failed: {error}");
        let failed = ev::ReloadFailed {
            reason: reason.to_string(),
            error: error.to_string(),
        };
        self.emit(Event::ReloadFailed(failed), None).await;
        self.failed.notify_one();
    }

    /// What a reload would change now, computed like one (same loading,
    /// same deadline) but applying nothing and emitting nothing.
    pub async fn preview(&self) -> Preview {
        match self.load().await {
            Ok(loaded) => Preview::Plan(plan::plan(&loaded.desired, &self.observed().await)),
            Err(LoadFailure::Operational(error)) => Preview::Failed { error },
            Err(LoadFailure::Invalid { payload, .. }) => Preview::Invalid {
                payload: serde_json::to_value(&payload).unwrap_or_default(),
            },
        }
    }

    /// Resolves after a reload failed for an operational reason.
    pub async fn reload_failed(&self) {
        self.failed.notified().await;
    }

    /// Read and validate the manifest and compute the desired state, off the
    /// async executor and within [`LOAD_DEADLINE`] (templates are rendered
    /// and plugin packages read here).
    async fn load(&self) -> Result<Loaded, LoadFailure> {
        let paths = self.paths.clone();
        let work = tokio::task::spawn_blocking(move || {
            let files = OperationalFiles::new(&paths.root);
            let loaded = load::load_with(&paths.manifest, &files);
            let loaded = match (files.failure(), loaded) {
                (Some(error), _) => return Err(LoadFailure::Operational(error)),
                (None, Err(e)) if is_operational(&e) => {
                    return Err(LoadFailure::Operational(format!(
                        "cannot read the manifest `{}`: {e}",
                        paths.manifest.display()
                    )));
                }
                (None, Err(e)) => {
                    let error = RuntimeError::Manifest {
                        path: paths.manifest.clone(),
                        source: e,
                    };
                    return Err(LoadFailure::Invalid {
                        payload: Box::new(ev::ManifestInvalid {
                            error: Some(error.to_string()),
                            ..ev::ManifestInvalid::default()
                        }),
                        error_count: 1,
                    });
                }
                (None, Ok(loaded)) => loaded,
            };
            let (loaded, sources) = loaded;
            let Some(manifest) = loaded.manifest else {
                let report = model::diagnostics::JsonReport::new(&loaded.diagnostics);
                return Err(LoadFailure::Invalid {
                    error_count: report.error_count,
                    payload: Box::new(ev::ManifestInvalid {
                        report: Some(serde_json::to_value(&report).unwrap_or_default()),
                        ..ev::ManifestInvalid::default()
                    }),
                });
            };
            let inputs = checked_external_inputs(&manifest, &paths.root).map_err(|e| {
                LoadFailure::Operational(format!("cannot read a plugin package: {e}"))
            })?;
            let desired = plan::desired(&manifest, &inputs);
            Ok(Loaded {
                manifest,
                desired,
                sources,
                inputs,
            })
        });
        match tokio::time::timeout(LOAD_DEADLINE, work).await {
            Ok(Ok(result)) => result,
            Ok(Err(e)) => Err(LoadFailure::Operational(format!(
                "loading the manifest failed: {e}"
            ))),
            Err(_) => Err(LoadFailure::Operational(format!(
                "loading the manifest took longer than {LOAD_DEADLINE:?}"
            ))),
        }
    }

    /// `manifest` as it actually runs after a reload: an entry whose start
    /// failed is back at its previous config, or gone if it had none, so the
    /// agent files never name a config that does not run.
    async fn as_running(&self, manifest: &Manifest, results: &[ComponentResult]) -> Manifest {
        let mut running = manifest.clone();
        let applied = self.applied.lock().await;
        for r in results
            .iter()
            .filter(|r| matches!(r.outcome, Outcome::Failed | Outcome::RolledBack))
        {
            let name = r.id.name.clone();
            match (r.id.kind, applied.configs.get(&r.id)) {
                (plan::Kind::McpServer, Some(Config::McpServer(old))) => {
                    running.mcp_servers.insert(name, old.clone());
                }
                (plan::Kind::McpServer, _) => {
                    running.mcp_servers.remove(&name);
                }
                (plan::Kind::Prompt, Some(Config::Prompt(old))) => {
                    running.prompts.insert(name, old.clone());
                }
                (plan::Kind::Provider, Some(Config::Provider(old))) => {
                    running.providers.insert(name, old.clone());
                }
                _ => {}
            }
        }
        running
    }

    /// Render profiles and native agent configs, off the async executor and
    /// within [`FILES_DEADLINE`]; record what changed. An `Err` is an
    /// operational failure (the work did not finish).
    async fn write_files(&self, manifest: &Manifest) -> Result<(), String> {
        let (manifest, paths, store) = (manifest.clone(), self.paths.clone(), self.store.clone());
        let work = tokio::task::spawn_blocking(move || {
            let plans = files::plan_files(
                &manifest,
                &paths,
                Some(&store),
                &crate::native::Scope::Project,
            );
            // Plugin skills are copied here too (they follow the plugins).
            let skills = crate::native::skills::plan(&manifest, &paths.root);
            let copied = crate::native::skills::apply(&paths.root, &skills);
            (plans, copied)
        });
        let (plans, copied) = match tokio::time::timeout(FILES_DEADLINE, work).await {
            Ok(Ok(done)) => done,
            Ok(Err(e)) => return Err(format!("planning the agent files failed: {e}")),
            Err(_) => {
                return Err(format!(
                    "planning the agent files took longer than {FILES_DEADLINE:?}"
                ));
            }
        };
        if !plans.iter().any(|p| p.is_change() || p.error.is_some()) && copied.is_empty() {
            return Ok(());
        }
        // Remember what npc writes before writing it, so the watcher knows
        // the change it is about to see is npc's own.
        for plan in plans.iter().filter(|p| p.is_change()) {
            if let Some((path, content)) = plan.content() {
                self.written.record(path, content);
            }
        }
        let mut results = files::write_files(&plans, &self.store, &self.paths.root).await;
        results.extend(copied);
        let files = results
            .into_iter()
            .map(|(path, r)| match r {
                Ok(outcome) => ev::WrittenFile {
                    path,
                    outcome: outcome.to_string(),
                    error: None,
                },
                Err(e) => ev::WrittenFile {
                    path,
                    outcome: "error".to_string(),
                    error: Some(e),
                },
            })
            .collect();
        self.emit(Event::FilesWritten(ev::FilesWritten { files }), None)
            .await;
        Ok(())
    }

    /// The agent files npc wrote, for the watcher to recognise its own writes.
    pub fn written(&self) -> &Arc<watch::Written> {
        &self.written
    }

    /// Apply `desired` against what is applied now.
    pub async fn apply(&self, desired: Desired, reason: &str) -> ReloadOutcome {
        let mut applied = self.applied.lock().await;
        let plan = plan::plan(&desired, &applied.observed);
        if plan.actionable().next().is_none() {
            return ReloadOutcome::Applied {
                results: Vec::new(),
            };
        }
        let refused: Vec<String> = plan
            .changes
            .iter()
            .filter(|c| c.action == Action::Refuse)
            .map(|c| format!("{}: {}", c.id, c.cause))
            .collect();
        if !refused.is_empty() {
            let event = ev::ReloadRefused {
                reason: reason.to_string(),
                refused: refused.clone(),
            };
            self.emit(Event::ReloadRefused(event), None).await;
            return ReloadOutcome::Refused { reasons: refused };
        }
        let changes = plan
            .actionable()
            .map(|c| ev::PlannedChange {
                id: c.id.to_string(),
                action: c.action,
                cause: c.cause.clone(),
            })
            .collect();
        let planned = ev::ReconcilePlanned {
            reason: reason.to_string(),
            summary: plan.summary(),
            changes,
        };
        self.emit(Event::ReconcilePlanned(planned), None).await;

        let mut results = Vec::new();
        // Phase 1: stop what goes away or gets replaced. Supervised processes
        // stop all at once (one grace period in all); the loop then forgets
        // them in reverse start order.
        let leaving: Vec<String> = plan
            .changes
            .iter()
            .filter(|c| matches!(c.action, Action::Remove | Action::Replace))
            .map(|c| c.id.to_string())
            .collect();
        self.cx.supervisor.stop_all(&leaving).await;
        for change in plan
            .changes
            .iter()
            .rev()
            .filter(|c| matches!(c.action, Action::Remove | Action::Replace))
        {
            let id = &change.id;
            if let Err(e) = self.driver(id.kind).stop(&self.cx, id).await {
                tracing::warn!("stopping `{id}` failed: {e}");
            }
            applied.pids.remove(id);
            if change.action == Action::Remove {
                applied.configs.remove(id);
                let removed = ev::ComponentRemoved {
                    cause: change.cause.clone(),
                };
                self.emit(Event::ComponentRemoved(removed), Some(id)).await;
                results.push(ComponentResult {
                    id: id.clone(),
                    action: change.action,
                    outcome: Outcome::Applied,
                    pid: None,
                    error: None,
                });
            }
        }
        // Phase 2: start and update, in start order.
        for change in plan
            .changes
            .iter()
            .filter(|c| matches!(c.action, Action::Add | Action::Replace | Action::Update))
        {
            let id = &change.id;
            let Some(new) = desired.get(id) else { continue };
            let old = applied.configs.get(id).cloned();
            let driver = self.driver(id.kind);
            let attempt = match change.action {
                Action::Update => match &old {
                    Some(old) => driver
                        .update(&self.cx, id, old, new)
                        .await
                        .map(|()| applied.pids.get(id).copied()),
                    None => driver.start(&self.cx, id, new).await,
                },
                _ => driver.start(&self.cx, id, new).await,
            };
            match attempt {
                Ok(pid) => {
                    applied.configs.insert(id.clone(), new.clone());
                    applied.failed.remove(id);
                    if let Some(pid) = pid {
                        applied.pids.insert(id.clone(), pid);
                    }
                    let applied_one = ev::ComponentApplied {
                        cause: change.cause.clone(),
                        pid,
                    };
                    let event = match change.action {
                        Action::Add => Event::ComponentAdded(applied_one),
                        Action::Replace => Event::ComponentReplaced(applied_one),
                        _ => Event::ComponentUpdated(applied_one),
                    };
                    self.emit(event, Some(id)).await;
                    results.push(ComponentResult {
                        id: id.clone(),
                        action: change.action,
                        outcome: Outcome::Applied,
                        pid,
                        error: None,
                    });
                }
                Err(e) => {
                    let result = self
                        .roll_back(&mut applied, id, change.action, old, &e)
                        .await;
                    results.push(result);
                }
            }
        }
        // A failed component the manifest dropped is no longer shown.
        applied.failed.retain(|id, _| desired.contains_key(id));
        let touched: Vec<ComponentId> = plan.actionable().map(|c| c.id.clone()).collect();
        self.persist(&mut applied, &touched).await;
        let outcome = ReloadOutcome::Applied { results };
        if let ReloadOutcome::Applied { results } = &outcome {
            let applied_event = ev::ReconcileApplied {
                outcome: "applied".to_string(),
                results: results.iter().map(component_outcome).collect(),
            };
            self.emit(Event::ReconcileApplied(applied_event), None)
                .await;
        }
        outcome
    }

    /// A start or update failed: go back to the previous config (if there
    /// was one) so the last good state keeps running.
    async fn roll_back(
        &self,
        applied: &mut Applied,
        id: &ComponentId,
        action: Action,
        old: Option<Config>,
        error: &DriverError,
    ) -> ComponentResult {
        let driver = self.driver(id.kind);
        let error_text = error.to_string();
        let Some(old) = old else {
            let failed = ev::ComponentStartFailed {
                error: error_text.clone(),
            };
            self.emit(Event::ComponentStartFailed(failed), Some(id))
                .await;
            let _ = driver.stop(&self.cx, id).await;
            applied.failed.insert(id.clone(), error_text.clone());
            return ComponentResult {
                id: id.clone(),
                action,
                outcome: Outcome::Failed,
                pid: None,
                error: Some(error_text),
            };
        };
        let restored = if action == Action::Update {
            Ok(applied.pids.get(id).copied())
        } else {
            let _ = driver.stop(&self.cx, id).await;
            driver.start(&self.cx, id, &old).await
        };
        match restored {
            Ok(pid) => {
                if let Some(pid) = pid {
                    applied.pids.insert(id.clone(), pid);
                }
                let rolled_back = ev::ComponentRolledBack {
                    error: error_text.clone(),
                    pid,
                    detail: "the new config failed; the previous config runs again".to_string(),
                };
                self.emit(Event::ComponentRolledBack(rolled_back), Some(id))
                    .await;
                ComponentResult {
                    id: id.clone(),
                    action,
                    outcome: Outcome::RolledBack,
                    pid,
                    error: Some(error_text),
                }
            }
            Err(again) => {
                applied.configs.remove(id);
                applied.pids.remove(id);
                applied.failed.insert(
                    id.clone(),
                    format!("{error_text}; rolling back failed too: {again}"),
                );
                let failed = ev::ComponentFailed::RollBack(ev::RollBackFailed {
                    error: error_text.clone(),
                    rollback_error: again.to_string(),
                });
                self.emit(Event::ComponentFailed(failed), Some(id)).await;
                ComponentResult {
                    id: id.clone(),
                    action,
                    outcome: Outcome::Failed,
                    pid: None,
                    error: Some(format!("{error_text}; rolling back failed too: {again}")),
                }
            }
        }
    }

    /// Record the applied state: the canonical observed state and one row per component.
    async fn persist(&self, applied: &mut Applied, touched: &[ComponentId]) {
        applied.observed = plan::observe(&applied.configs);
        // Issue every write before awaiting any, so group commit puts them
        // in one transaction; only the components this reload touched change.
        let manifest = record_state(&self.store, &applied.observed);
        let mut writes = Vec::with_capacity(touched.len());
        for id in touched {
            let Some(config) = applied.configs.get(id) else {
                let removed = self
                    .store
                    .remove_component(id.kind.as_str(), id.name.clone());
                writes.push(Box::pin(async move { removed.await.map(|_| ()) })
                    as futures_util::future::BoxFuture<'static, Result<(), StoreError>>);
                continue;
            };
            let status = self.cx.supervisor.status(&id.to_string());
            let record = ComponentRecord {
                kind: id.kind.as_str().to_string(),
                name: id.name.clone(),
                state: status.as_ref().map_or_else(
                    || crate::plan::Standing::of_kind(id.kind).state().to_string(),
                    |s| s.state.as_str().to_string(),
                ),
                pid: status.as_ref().and_then(|s| s.pid),
                restarts: status.as_ref().map_or(0, |s| s.restarts),
                since_ms: now_ms(),
                config_hash: Some(config.fingerprint()),
                detail: None,
            };
            writes.push(Box::pin(self.store.put_component(record)));
        }
        if let Err(e) = manifest.await {
            tracing::error!("cannot record the applied state: {e}");
        }
        for write in writes {
            if let Err(e) = write.await {
                tracing::error!("cannot record a component: {e}");
            }
        }
    }

    /// Each component with its live state.
    pub async fn status(&self) -> Vec<ComponentStatus> {
        let applied = self.applied.lock().await;
        applied
            .configs
            .keys()
            .map(|id| {
                let status = self.cx.supervisor.status(&id.to_string());
                let pane = self.panes.component_status(id);
                // No process stands for it: the kind's standing, in the
                // words `npc status` uses.
                let (state, detail) = match (&pane, &status) {
                    (Some((state, _)), _) => (state.clone(), None),
                    (None, Some(s)) => (s.state.as_str().to_string(), None),
                    (None, None) => {
                        let standing = crate::plan::Standing::of_kind(id.kind);
                        (
                            standing.state().to_string(),
                            Some(standing.detail().to_string()),
                        )
                    }
                };
                ComponentStatus {
                    id: id.to_string(),
                    kind: id.kind.as_str().to_string(),
                    state,
                    detail,
                    pid: pane
                        .and_then(|p| p.1)
                        .or_else(|| status.as_ref().and_then(|s| s.pid)),
                    restarts: status.as_ref().map_or(0, |s| s.restarts),
                    since: status
                        .as_ref()
                        .map(|s| chrono::DateTime::<chrono::Utc>::from(s.since).to_rfc3339()),
                    error: None,
                }
            })
            .chain(applied.failed.iter().map(|(id, error)| ComponentStatus {
                id: id.to_string(),
                kind: id.kind.as_str().to_string(),
                state: FAILED_STATE.to_string(),
                pid: None,
                restarts: 0,
                since: None,
                error: Some(error.clone()),
                detail: None,
            }))
            .collect()
    }

    /// Stop every component (all at once), then the bus. Idempotent.
    pub async fn shutdown(&self) {
        if self
            .shut_down
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            return;
        }
        self.stopping.cancel();
        self.emit(Event::DaemonStopping(ev::Empty {}), None).await;
        self.panes.shutdown().await;
        self.triggers.shutdown().await;
        self.workflows.shutdown();
        self.runs.shutdown().await;
        self.cx.supervisor.shutdown().await;
        let mut applied = self.applied.lock().await;
        applied.pids.clear();
        self.emit(Event::DaemonStopped(ev::Empty {}), None).await;
        self.bus.shutdown().await;
        let _ = self.store.flush().await;
    }
}

pub use crate::surfaces::control::ComponentStatus;

/// The state `npc status` shows for a component of the manifest that failed
/// to start and runs no config (its error says why).
pub const FAILED_STATE: &str = "failed";

/// Turn supervisor events into bus events.
async fn forward_supervisor_events(
    runtime: Weak<Runtime>,
    mut rx: mpsc::UnboundedReceiver<SupervisorEvent>,
) {
    while let Some(event) = rx.recv().await {
        let Some(rt) = runtime.upgrade() else { return };
        let component = ComponentId::parse(event.id());
        if let (SupervisorEvent::Started { .. }, Some(c)) = (&event, &component)
            && c.kind == plan::Kind::McpServer
        {
            // A (re)started stdio server: its session rides on the new pipes.
            rt.mcp.pool().process_started(&c.name);
        }
        rt.emit(event.into_event(), component.as_ref()).await;
    }
}

/// The `registry.*` event the daemon records for `notice`.
fn plugin_notice_event(notice: model::PluginNotice) -> Event {
    use model::PluginNotice;
    match notice {
        PluginNotice::Collision {
            kind,
            id,
            kept,
            dropped,
            dropped_path,
            policy,
        } => Event::PluginCollision(ev::PluginCollision {
            notice: "collision".into(),
            kind,
            id,
            kept,
            dropped,
            dropped_path,
            policy,
        }),
        PluginNotice::Dropped {
            id,
            source,
            path,
            reason,
        } => Event::PluginDropped(ev::PluginDropped {
            notice: "dropped".into(),
            id,
            source,
            path,
            reason,
        }),
    }
}
