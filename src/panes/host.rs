//! The pane host: the daemon's runtime for `[panes.*]` and
//! `[pane_plugins.*]` behind the [`Driver`] trait. It owns every pane slot
//! (by name), the plugin children, the [`Guard`], relaunch holds and the
//! last status per pane, and runs one loop that reacts to pane exits,
//! plugin lines, idleness and hold deadlines. Everything it does is an
//! event on the bus (`pane.*`, `pane_plugin.*`); pane tokens never are.
//!
//! Two paths write to a PTY: [`PaneHost::user_input`] (a person through
//! `npc pane send` or attach) and [`Host::execute`] of an
//! [`Approved::Input`] that only [`Guard::judge`] can make.

use crate::stdx::lock;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::{broadcast, mpsc};

use super::guard::{Approved, Guard, PaneFacts, PluginFacts};
use super::pane::{Pane, PaneEvent, Watch};
use super::plugin::{PluginChild, PluginMsg};
use super::protocol::{HostEvent, PROTOCOL_VERSION};
use super::{
    PANE_GENERATION_ENV, PANE_NAME_ENV, PANE_TOKEN_ENV, PLUGIN_RUNTIME_DIR_ENV, PaneError,
};
use crate::bus::EventBus;
use crate::driver::{DriverContext, DriverError, TypedDriver, child_spec, kind_config};
use crate::event::{self as ev, Event};
use crate::model::{Pane as PaneConfig, PanePlugin as PluginConfig};
use crate::plan::{ComponentId, Config, Kind};
use crate::store::NewEvent;
use crate::supervisor::{PtyExit, PtySpec, Supervisor};

/// How often the host looks for panes that turned idle and holds that expired.
pub const TICK: Duration = Duration::from_millis(50);
/// Rows of a new pane's terminal (until a client resizes it).
pub const DEFAULT_ROWS: u16 = 24;
/// Columns of a new pane's terminal.
pub const DEFAULT_COLS: u16 = 80;
/// Time between SIGHUP/SIGTERM and SIGKILL when a pane is closed.
pub const CLOSE_GRACE: Duration = Duration::from_secs(2);
/// Panes open at once per repository.
pub const MAX_PANES: usize = 64;
/// Bytes of one user input (`npc pane send`, one attach write).
pub const MAX_USER_INPUT_BYTES: usize = 32 * 1024;
/// Status label that becomes a notice for every client.
pub const NEEDS_ATTENTION: &str = "needs_attention";
/// The reason of an `attention` command's notice.
pub const ATTENTION: &str = "attention";
/// Notices buffered for the relay to other repositories; one further
/// behind skips the oldest.
pub const NOTICE_QUEUE: usize = 64;
/// Status reports buffered for attached clients; a client further behind
/// skips the oldest (the next report replaces them anyway).
pub const STATUS_QUEUE: usize = 64;
/// Directory (inside the runtime directory) of the panes' runtime directories.
pub const PANE_RUNTIME_DIR: &str = "panes";

/// One pane slot: the process and how it was launched.
#[derive(Debug)]
struct Slot {
    pane: Arc<Pane>,
    config: PaneConfig,
    /// Exited and held for relaunch until this instant.
    hold: Option<Instant>,
}

#[derive(Debug)]
struct PluginEntry {
    config: PluginConfig,
    child: Option<PluginChild>,
    /// Restarts after exits since the child last ran [`PLUGIN_STABLE_AFTER`].
    restarts: u32,
    started: Instant,
}

/// Restarts of a crashing plugin child before it is left stopped.
pub const MAX_PLUGIN_RESTARTS: u32 = crate::supervisor::DEFAULT_FLAP_MAX_RESTARTS;
/// A plugin child that ran this long has its restart count reset.
pub const PLUGIN_STABLE_AFTER: Duration = Duration::from_secs(60);

#[derive(Debug, Default)]
struct State {
    slots: BTreeMap<String, Slot>,
    configs: BTreeMap<String, PaneConfig>,
    plugins: BTreeMap<String, PluginEntry>,
    guard: Guard,
    /// Last status report per pane name (replayed by `npc pane list`).
    recovery: BTreeMap<String, serde_json::Value>,
    stopping: bool,
}

/// What `npc pane list` shows of a pane.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct PaneInfo {
    pub name: String,
    /// `running`, `idle`, `exited`, `held` (exited, waiting for a
    /// relaunch) or `closed`.
    pub state: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit: Option<PtyExit>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub watcher: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<serde_json::Value>,
    /// The terminal size of an open pane.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cols: Option<u16>,
}

/// A pane needs a person: what the notice relay
/// (`runtime::notices`) tells other repositories. Names and a fixed label only.
#[derive(Debug, Clone)]
pub struct Notice {
    pub pane: String,
    pub plugin: String,
    pub reason: &'static str,
}

/// A pane's status report as attached clients receive it live: a plugin's
/// `status`, or `{"state":"cancelled"}` when a report or hold is cleared.
#[derive(Debug, Clone)]
pub struct StatusUpdate {
    pub pane: String,
    pub report: serde_json::Value,
}

/// What a client attaching to a pane gets.
#[derive(Debug)]
pub struct Attached {
    pub scrollback: Vec<u8>,
    pub output: broadcast::Receiver<Arc<[u8]>>,
    pub pane: Arc<Pane>,
    /// The last status report, if one is cached.
    pub status: Option<serde_json::Value>,
    /// Every later report of every pane (filter by [`StatusUpdate::pane`]),
    /// subscribed under the same lock the cache is read under, so none is
    /// missed or doubled.
    pub statuses: broadcast::Receiver<StatusUpdate>,
}

/// The pane host; cheap to clone.
#[derive(Debug, Clone)]
pub struct PaneHost {
    host: Arc<Host>,
}

#[derive(Debug)]
pub struct Host {
    me: Weak<Host>,
    repo: PathBuf,
    state_dir: PathBuf,
    runtime_dir: PathBuf,
    supervisor: Supervisor,
    bus: EventBus,
    state: Mutex<State>,
    events: mpsc::UnboundedSender<PaneEvent>,
    /// Lines of every plugin child; each child's share is bounded by
    /// [`super::plugin::COMMANDS_IN_FLIGHT`].
    commands: mpsc::UnboundedSender<PluginMsg>,
    /// Status reports for attached clients, sent under the state lock.
    statuses: broadcast::Sender<StatusUpdate>,
    /// Notices for the relay to other repositories.
    notices: broadcast::Sender<Notice>,
    next_id: AtomicU64,
    /// Bus events noted under the state lock, published after it.
    pending: Mutex<Pending>,
    /// Held while publishing, so events keep their order.
    publishing: tokio::sync::Mutex<()>,
    /// Told when a pane's slot is made: the loop ticks only while a slot
    /// exists, so a host without panes does not wake every [`TICK`].
    slot_made: Arc<tokio::sync::Notify>,
}

/// A fresh random pane token (128 bits, hex).
fn new_token() -> String {
    use std::io::Read as _;
    let mut bytes = [0u8; 16];
    let read = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
    if read.is_err() {
        // No urandom: hash what differs between calls.
        use sha2::Digest as _;
        let seed = format!("{:?}{}", Instant::now(), std::process::id());
        bytes.copy_from_slice(&sha2::Sha256::digest(seed.as_bytes())[..16]);
    }
    hex::encode(bytes)
}

/// The launch command as one line for plugins; secret values print redacted.
fn command_line(config: &PaneConfig, extra: &[String]) -> String {
    let mut words = vec![config.run.command.clone()];
    words.extend(config.run.args.iter().map(|a| a.to_string()));
    words.extend(extra.iter().cloned());
    words.join(" ")
}

impl PaneHost {
    /// A host for the repository of `cx`, recording on `bus`; `runtime_dir`
    /// is the repository's fixed runtime directory (`.npc`). Starts its loop.
    pub fn new(cx: &DriverContext, runtime_dir: &std::path::Path, bus: EventBus) -> Self {
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let (commands_tx, commands_rx) = mpsc::unbounded_channel();
        let key = crate::store::memory::ProjectKey::for_repo(&cx.repo);
        let slot_made = Arc::new(tokio::sync::Notify::new());
        let host = Arc::new_cyclic(|me| Host {
            me: me.clone(),
            repo: cx.repo.clone(),
            state_dir: cx.state_dir.clone(),
            runtime_dir: runtime_dir.join(PANE_RUNTIME_DIR).join(key.as_str()),
            supervisor: cx.supervisor.clone(),
            bus,
            state: Mutex::new(State::default()),
            events: events_tx,
            commands: commands_tx,
            statuses: broadcast::channel(STATUS_QUEUE).0,
            notices: broadcast::channel(NOTICE_QUEUE).0,
            next_id: AtomicU64::new(1),
            pending: Mutex::default(),
            publishing: tokio::sync::Mutex::new(()),
            slot_made: slot_made.clone(),
        });
        tokio::spawn(run_loop(
            Arc::downgrade(&host),
            events_rx,
            commands_rx,
            slot_made,
        ));
        Self { host }
    }

    /// Every later notice of every pane (see [`Notice`]).
    pub fn notices(&self) -> broadcast::Receiver<Notice> {
        self.host.notices.subscribe()
    }

    /// Every configured or open pane.
    pub fn list(&self) -> Vec<PaneInfo> {
        self.host.list()
    }

    /// The live state and pid of component `id` (a pane or a pane plugin),
    /// for `npc status`; `None` for other kinds.
    pub fn component_status(&self, id: &ComponentId) -> Option<(String, Option<u32>)> {
        let state = lock(&self.host.state);
        match id.kind {
            Kind::PanePlugin => {
                let entry = state.plugins.get(&id.name)?;
                Some(match &entry.child {
                    Some(c) => ("running".to_string(), Some(c.pid)),
                    None => ("stopped".to_string(), None),
                })
            }
            Kind::Pane => {
                let info = Host::info_of(&state, &id.name);
                Some((info.state, info.pid))
            }
            _ => None,
        }
    }

    /// Open the configured pane `name` (it must not be running).
    pub async fn open(&self, name: &str) -> Result<PaneInfo, PaneError> {
        self.host.open(name)?;
        self.host.flush_events().await;
        Ok(self.host.info(name))
    }

    /// Close pane `name`: hang its process up and forget it.
    pub async fn close(&self, name: &str) -> Result<(), PaneError> {
        self.host.close(name)?;
        self.host.flush_events().await;
        Ok(())
    }

    /// A person typed `bytes` into pane `name`.
    pub fn user_input(&self, name: &str, bytes: &[u8]) -> Result<(), PaneError> {
        self.host.user_input(name, bytes)
    }

    /// Resize pane `name`'s terminal (an operator's request, like attach's).
    pub fn resize(&self, name: &str, rows: u16, cols: u16) -> Result<(), PaneError> {
        let state = lock(&self.host.state);
        if !state.configs.contains_key(name) && !state.slots.contains_key(name) {
            return Err(PaneError::Unknown(name.to_string()));
        }
        let slot = state
            .slots
            .get(name)
            .ok_or_else(|| PaneError::NotOpen(name.to_string()))?;
        if !slot.pane.is_live() {
            return Err(PaneError::Exited(name.to_string()));
        }
        slot.pane
            .resize(rows, cols)
            .map_err(|e| PaneError::Io(e.to_string()))
    }

    /// Whether pane `name` is configured or open.
    pub fn knows(&self, name: &str) -> bool {
        let state = lock(&self.host.state);
        state.configs.contains_key(name) || state.slots.contains_key(name)
    }

    /// Attach to pane `name`: its scrollback, the output that follows, the
    /// pane, and its last status report (replayed to a client that attaches later).
    pub fn attach(&self, name: &str) -> Result<Attached, PaneError> {
        let state = lock(&self.host.state);
        let slot = state
            .slots
            .get(name)
            .ok_or_else(|| PaneError::NotOpen(name.to_string()))?;
        if !slot.pane.is_live() {
            return Err(PaneError::Exited(name.to_string()));
        }
        let (scrollback, output) = slot.pane.subscribe();
        Ok(Attached {
            scrollback,
            output,
            pane: slot.pane.clone(),
            status: state.recovery.get(name).cloned(),
            statuses: self.host.statuses.subscribe(),
        })
    }

    /// A manifest was applied: plugins no longer enabled watch nothing, and
    /// holds of panes whose plugin does not run are discarded.
    pub async fn manifest_applied(&self, manifest: &crate::model::Manifest) {
        self.host.manifest_applied(manifest);
        self.host.flush_events().await;
    }

    /// Stop every plugin and pane (the daemon is stopping).
    pub async fn shutdown(&self) {
        let (plugins, panes) = {
            let mut state = lock(&self.host.state);
            state.stopping = true;
            let plugins: Vec<PluginChild> = state
                .plugins
                .values_mut()
                .filter_map(|p| p.child.take())
                .collect();
            let panes: Vec<Arc<Pane>> = state.slots.values().map(|s| s.pane.clone()).collect();
            (plugins, panes)
        };
        for p in &plugins {
            p.outbox.event(HostEvent::Shutdown {
                v: PROTOCOL_VERSION,
            });
        }
        for pane in &panes {
            pane.hang_up();
        }
        let deadline = tokio::time::Instant::now() + CLOSE_GRACE;
        while panes.iter().any(|p| p.is_live()) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(TICK).await;
        }
        for pane in &panes {
            pane.kill();
        }
        // Plugins get the rest of the grace to read `shutdown` and exit.
        let deadline = tokio::time::Instant::now() + super::plugin::SHUTDOWN_GRACE;
        while plugins.iter().any(PluginChild::is_running) && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(TICK).await;
        }
        for p in &plugins {
            p.kill();
        }
    }
}

/// Events to publish, collected under the state lock and sent after it.
type Pending = Vec<NewEvent>;

impl Host {
    /// Queue a bus event (published by [`Host::flush_events`]).
    fn note(&self, event: Event, pane: Option<&str>) {
        let mut event = NewEvent::from(event);
        if let Some(p) = pane {
            event = event.for_component(ComponentId::new(Kind::Pane, p).to_string());
        }
        lock(&self.pending).push(event);
    }

    /// Send a status report to the clients attached to any pane (call with
    /// the state lock held, beside the cache update).
    fn tell_attached(&self, pane: &str, report: &serde_json::Value) {
        let _ = self.statuses.send(StatusUpdate {
            pane: pane.to_string(),
            report: report.clone(),
        });
    }

    /// Pane `pane` needs a person (`reason`: [`NEEDS_ATTENTION`] or
    /// [`ATTENTION`]): a `pane.notice` event, and a [`Notice`] for the
    /// relay that tells other repositories.
    fn notice(&self, pane: &str, plugin: &str, reason: &'static str) {
        self.note(
            Event::PaneNotice(ev::PaneNotice {
                plugin: plugin.to_string(),
                reason: reason.to_string(),
            }),
            Some(pane),
        );
        let _ = self.notices.send(Notice {
            pane: pane.to_string(),
            plugin: plugin.to_string(),
            reason,
        });
    }

    fn note_plugin(&self, event: Event, plugin: &str) {
        let event = event.for_component(ComponentId::new(Kind::PanePlugin, plugin).to_string());
        lock(&self.pending).push(event);
    }

    /// Publish the queued events, in order.
    async fn flush_events(&self) {
        let _order = self.publishing.lock().await;
        let pending: Pending = std::mem::take(&mut *lock(&self.pending));
        for event in pending {
            let kind = event.kind().to_string();
            if let Err(e) = self.bus.publish(event).await {
                tracing::error!("cannot publish `{kind}`: {e}");
            }
        }
    }

    fn info(&self, name: &str) -> PaneInfo {
        let state = lock(&self.state);
        Self::info_of(&state, name)
    }

    fn info_of(state: &State, name: &str) -> PaneInfo {
        let slot = state.slots.get(name);
        let pane = slot.map(|s| &s.pane);
        let exit = pane.and_then(|p| p.exit());
        let idle_ms = state.configs.get(name).map_or(0, |c| c.idle_ms);
        let status = match (slot, &exit) {
            (None, _) => "closed",
            (Some(s), Some(_)) if s.hold.is_some() => "held",
            (Some(_), Some(_)) => "exited",
            (Some(s), None) if s.pane.quiet_for() >= Duration::from_millis(idle_ms) => "idle",
            (Some(_), None) => "running",
        };
        PaneInfo {
            name: name.to_string(),
            state: status.to_string(),
            id: pane.map(|p| p.id),
            generation: pane.map(|p| p.generation),
            pid: pane.filter(|p| p.is_live()).map(|p| p.pid),
            exit,
            watcher: pane.and_then(|p| state.guard.watcher(&p.token).map(str::to_string)),
            status: state.recovery.get(name).cloned(),
            rows: pane.map(|p| p.size().0),
            cols: pane.map(|p| p.size().1),
        }
    }

    fn list(&self) -> Vec<PaneInfo> {
        let state = lock(&self.state);
        let mut names: Vec<&String> = state.configs.keys().chain(state.slots.keys()).collect();
        names.sort();
        names.dedup();
        names
            .into_iter()
            .map(|n| Self::info_of(&state, n))
            .collect()
    }

    /// Spawn a pane process for `config` with `token` and `generation`.
    fn spawn(
        &self,
        name: &str,
        config: &PaneConfig,
        token: &str,
        generation: u64,
        extra_args: &[String],
        watch: Watch,
    ) -> Result<Arc<Pane>, PaneError> {
        let root = crate::repofs::Root::new(&self.repo).map_err(|e| PaneError::Start {
            name: name.to_string(),
            error: e.to_string(),
        })?;
        root.ensure_state_dir(&self.runtime_dir)
            .map_err(|e| PaneError::Start {
                name: name.to_string(),
                error: e.to_string(),
            })?;
        let id = ComponentId::new(Kind::Pane, name);
        let cx = DriverContext {
            repo: self.repo.clone(),
            state_dir: self.state_dir.clone(),
            supervisor: self.supervisor.clone(),
        };
        let child = child_spec(&cx, &id, &config.run, crate::model::RestartPolicy::Never);
        let mut env = child.env;
        env.insert(PANE_TOKEN_ENV.to_string(), token.to_string());
        env.insert(PANE_NAME_ENV.to_string(), name.to_string());
        env.insert(PANE_GENERATION_ENV.to_string(), generation.to_string());
        env.insert(
            PLUGIN_RUNTIME_DIR_ENV.to_string(),
            self.runtime_dir.display().to_string(),
        );
        let mut args = child.args;
        args.extend(extra_args.iter().cloned());
        let spec = PtySpec {
            program: child.program,
            args,
            env,
            cwd: child.cwd,
            rows: DEFAULT_ROWS,
            cols: DEFAULT_COLS,
        };
        let process = self
            .supervisor
            .spawn_pty(&spec)
            .map_err(|e| PaneError::Start {
                name: name.to_string(),
                error: e.to_string(),
            })?;
        let pane_id = self.next_id.fetch_add(1, Ordering::SeqCst);
        Ok(Pane::run(
            pane_id,
            token.to_string(),
            generation,
            process,
            watch,
            self.events.clone(),
        ))
    }

    /// The outbox of the plugin watching `token`, if it runs.
    fn watcher_outbox(state: &State, token: &str) -> Option<Arc<super::outbox::Outbox>> {
        let plugin = state.guard.watcher(token)?;
        state
            .plugins
            .get(plugin)?
            .child
            .as_ref()
            .map(|c| c.outbox.clone())
    }

    fn tell_watcher(state: &State, token: &str, event: HostEvent) {
        if let Some(outbox) = Self::watcher_outbox(state, token) {
            outbox.event(event);
        }
    }

    fn opened_event(&self, name: &str, slot: &Slot, extra: &[String]) -> HostEvent {
        HostEvent::PaneOpened {
            v: PROTOCOL_VERSION,
            token: slot.pane.token.clone(),
            generation: slot.pane.generation,
            title: Some(name.to_string()),
            command: Some(command_line(&slot.config, extra)),
            cwd: slot
                .config
                .run
                .cwd
                .as_ref()
                .map_or_else(|| self.repo.clone(), |c| self.repo.join(c.expose()))
                .display()
                .to_string(),
        }
    }

    fn open(&self, name: &str) -> Result<(), PaneError> {
        let mut state = lock(&self.state);
        if state.stopping {
            return Err(PaneError::Stopping);
        }
        let config = state
            .configs
            .get(name)
            .cloned()
            .ok_or_else(|| PaneError::Unknown(name.to_string()))?;
        if let Some(slot) = state.slots.get(name)
            && slot.pane.is_live()
        {
            return Err(PaneError::AlreadyOpen(name.to_string()));
        }
        if !state.slots.contains_key(name) && state.slots.len() >= MAX_PANES {
            return Err(PaneError::TooMany);
        }
        // Reopening an exited pane ends its hold.
        if let Some(old) = state.slots.remove(name) {
            self.end_slot(&mut state, name, old, true);
        }
        let token = new_token();
        let watch: Watch = Arc::default();
        if let Some(plugin) = &config.plugin
            && state.plugins.contains_key(plugin)
        {
            state.guard.opt_in(&token, plugin);
        }
        *lock(&watch) = Self::watcher_outbox(&state, &token);
        let pane = self.spawn(name, &config, &token, 1, &[], watch)?;
        let slot = Slot {
            pane,
            config,
            hold: None,
        };
        Self::tell_watcher(&state, &token, self.opened_event(name, &slot, &[]));
        self.note(
            Event::PaneOpened(ev::PaneOpened {
                id: slot.pane.id,
                generation: 1,
                pid: slot.pane.pid,
            }),
            Some(name),
        );
        state.slots.insert(name.to_string(), slot);
        self.slot_made.notify_one();
        Ok(())
    }

    fn close(&self, name: &str) -> Result<(), PaneError> {
        let mut state = lock(&self.state);
        let slot = state
            .slots
            .remove(name)
            .ok_or_else(|| PaneError::NotOpen(name.to_string()))?;
        self.end_slot(&mut state, name, slot, true);
        Ok(())
    }

    /// A slot goes away: stop its process, tell its watcher, end its hold
    /// and clear a cached report.
    fn end_slot(&self, state: &mut State, name: &str, slot: Slot, close_event: bool) {
        let pane = slot.pane.clone();
        if pane.is_live() {
            pane.hang_up();
            let killing = pane.clone();
            tokio::spawn(async move {
                tokio::time::sleep(CLOSE_GRACE).await;
                killing.kill();
            });
        }
        Self::tell_watcher(
            state,
            &pane.token,
            HostEvent::PaneClosed {
                v: PROTOCOL_VERSION,
                token: pane.token.clone(),
                generation: pane.generation,
            },
        );
        *lock(&pane.watch) = None;
        state.guard.forget(&pane.token);
        self.cancel_recovery(state, name, slot.hold.is_some());
        if close_event {
            self.note(
                Event::PaneClosed(ev::PaneInstance {
                    id: pane.id,
                    generation: pane.generation,
                }),
                Some(name),
            );
        }
    }

    /// A hold ended (`held`) or a report may be stale: broadcast
    /// `recovery: cancelled` — always for a hold, else only when a report is cached.
    fn cancel_recovery(&self, state: &mut State, name: &str, held: bool) {
        let cached = state.recovery.remove(name).is_some();
        if held || cached {
            let cancelled = serde_json::json!({ "state": "cancelled" });
            self.tell_attached(name, &cancelled);
            let recovery = ev::PaneRecovery {
                state: "cancelled".to_string(),
            };
            self.note(Event::PaneRecovery(recovery), Some(name));
        }
    }

    fn user_input(&self, name: &str, bytes: &[u8]) -> Result<(), PaneError> {
        if bytes.len() > MAX_USER_INPUT_BYTES {
            return Err(PaneError::InputTooLong);
        }
        let state = lock(&self.state);
        let slot = state
            .slots
            .get(name)
            .ok_or_else(|| PaneError::NotOpen(name.to_string()))?;
        if !slot.pane.is_live() {
            return Err(PaneError::Exited(name.to_string()));
        }
        slot.pane
            .write_pty(bytes)
            .map_err(|e| PaneError::Io(e.to_string()))?;
        Self::tell_watcher(
            &state,
            &slot.pane.token,
            HostEvent::UserInput {
                v: PROTOCOL_VERSION,
                token: slot.pane.token.clone(),
                generation: slot.pane.generation,
            },
        );
        Ok(())
    }

    /// A pane process exited.
    fn exited(&self, id: u64, exit: PtyExit) {
        let mut state = lock(&self.state);
        let Some((name, slot)) = state.slots.iter().find(|(_, s)| s.pane.id == id) else {
            return;
        };
        let name = name.clone();
        let token = slot.pane.token.clone();
        let generation = slot.pane.generation;
        let relaunchable = !super::guard::is_shell(&slot.config.run.command);
        let watched = state.guard.watcher(&token).is_some();
        let stopping = state.stopping;
        let Some(slot) = state.slots.get_mut(&name) else {
            return;
        };
        if watched && relaunchable && !stopping {
            slot.hold = Some(Instant::now() + Duration::from_millis(slot.config.relaunch_ttl_ms));
        }
        self.note(
            Event::PaneExited(ev::PaneExited {
                id,
                generation,
                exit: exit.clone(),
                held: slot.hold.is_some(),
            }),
            Some(&name),
        );
        Self::tell_watcher(
            &state,
            &token,
            HostEvent::PaneExited {
                v: PROTOCOL_VERSION,
                token: token.clone(),
                generation,
            },
        );
        if watched && !relaunchable {
            // A bare shell is never relaunched: it goes to attention.
            self.note(
                Event::PaneAttention(ev::PaneAttention {
                    plugin: None,
                    reason: Some("exited; a shell is not relaunched".to_string()),
                }),
                Some(&name),
            );
        }
    }

    /// Idle panes and expired holds.
    fn tick(&self) {
        let mut state = lock(&self.state);
        let now = Instant::now();
        let mut expired = Vec::new();
        for (name, slot) in &state.slots {
            if let Some(deadline) = slot.hold
                && now >= deadline
            {
                expired.push(name.clone());
                continue;
            }
            let pane = &slot.pane;
            let quiet = pane.quiet_for();
            if pane.is_live()
                && quiet >= Duration::from_millis(slot.config.idle_ms)
                && !pane.idle_reported.swap(true, Ordering::SeqCst)
            {
                Self::tell_watcher(
                    &state,
                    &pane.token,
                    HostEvent::PaneIdle {
                        v: PROTOCOL_VERSION,
                        token: pane.token.clone(),
                        generation: pane.generation,
                        idle_ms: quiet.as_millis() as u64,
                    },
                );
            }
        }
        for name in expired {
            if let Some(slot) = state.slots.remove(&name) {
                self.note(
                    Event::PaneHoldExpired(ev::PaneInstance {
                        id: slot.pane.id,
                        generation: slot.pane.generation,
                    }),
                    Some(&name),
                );
                self.end_slot(&mut state, &name, slot, true);
            }
        }
    }

    /// A line from a plugin: judge it, then carry out what was approved.
    fn plugin_line(
        &self,
        plugin: &str,
        instance: u64,
        line: Result<super::protocol::PluginCommand, super::protocol::DecodeError>,
    ) {
        let mut state = lock(&self.state);
        let Some(entry) = state.plugins.get(plugin) else {
            return;
        };
        if entry.child.as_ref().map(|c| c.instance) != Some(instance) {
            return; // a replaced child's last words
        }
        let command = match line {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("pane plugin `{plugin}` sent a line that was rejected: {e}");
                self.note_plugin(
                    Event::PanePluginRejected(ev::PaneError {
                        error: e.to_string(),
                    }),
                    plugin,
                );
                return;
            }
        };
        let name = command.name();
        let config = entry.config.clone();
        let facts = PluginFacts {
            name: plugin,
            watch_on_signal: config.watch_on_signal,
            allowed_resume_flags: &config.allowed_resume_flags,
        };
        let now = Instant::now();
        let State { slots, guard, .. } = &mut *state;
        let lookup = |token: &str| {
            slots
                .values()
                .find(|s| s.pane.token == token)
                .map(|s| PaneFacts {
                    generation: s.pane.generation,
                    live: s.pane.is_live(),
                    idle: s.pane.quiet_for() >= Duration::from_millis(s.config.idle_ms),
                    held: s.hold.is_some(),
                    program: s.config.run.command.as_str(),
                })
        };
        match guard.judge(&facts, command, lookup, now) {
            Ok(approved) => self.execute(&mut state, plugin, approved),
            Err(refusal) => {
                tracing::warn!("pane plugin `{plugin}`: `{name}` refused: {refusal}");
                self.note_plugin(
                    Event::PanePluginRefused(ev::PanePluginRefused {
                        cmd: name.to_string(),
                        reason: refusal.to_string(),
                    }),
                    plugin,
                );
            }
        }
    }

    fn name_of(state: &State, token: &str) -> Option<String> {
        state
            .slots
            .iter()
            .find(|(_, s)| s.pane.token == token)
            .map(|(n, _)| n.clone())
    }

    /// Carry out a guard-approved command.
    fn execute(&self, state: &mut State, plugin: &str, approved: Approved) {
        match approved {
            Approved::Log { level, message, .. } => {
                tracing::info!("pane plugin `{plugin}` ({level:?}): {message}");
                self.note_plugin(
                    Event::PanePluginLog(ev::PanePluginLog { level, message }),
                    plugin,
                );
            }
            Approved::Input { token, data, .. } => {
                let Some(name) = Self::name_of(state, &token) else {
                    return;
                };
                let slot = &state.slots[&name];
                match slot.pane.write_pty(data.as_bytes()) {
                    Ok(()) => {
                        // Typing makes the pane busy until it is quiet again.
                        slot.pane.idle_reported.store(false, Ordering::SeqCst);
                        self.note(
                            Event::PaneInput(ev::PaneInput {
                                plugin: plugin.to_string(),
                                bytes: data.len(),
                            }),
                            Some(&name),
                        );
                    }
                    Err(e) => tracing::warn!("typing into pane `{name}` failed: {e}"),
                }
            }
            Approved::Watch { token, .. } => {
                let Some(name) = Self::name_of(state, &token) else {
                    return;
                };
                let outbox = Self::watcher_outbox(state, &token);
                let slot = &state.slots[&name];
                *lock(&slot.pane.watch) = outbox.clone();
                if let Some(outbox) = outbox {
                    outbox.event(self.opened_event(&name, slot, &[]));
                }
                self.note(
                    Event::PaneWatched(ev::PaneWatched {
                        plugin: plugin.to_string(),
                    }),
                    Some(&name),
                );
            }
            Approved::Status {
                token,
                state: label,
                detail,
                deadline_epoch,
                attempt,
                ..
            } => {
                let Some(name) = Self::name_of(state, &token) else {
                    return;
                };
                let status = ev::PaneStatus {
                    plugin: plugin.to_string(),
                    state: label.clone(),
                    detail,
                    deadline_epoch,
                    attempt,
                };
                let report = serde_json::to_value(&status).unwrap_or_default();
                let entering = label == NEEDS_ATTENTION
                    && state.recovery.get(&name).and_then(|r| r["state"].as_str())
                        != Some(NEEDS_ATTENTION);
                // Cached and broadcast under the same lock.
                if label == "cancelled" {
                    state.recovery.remove(&name);
                } else {
                    state.recovery.insert(name.clone(), report.clone());
                }
                self.tell_attached(&name, &report);
                self.note(Event::PaneStatus(status), Some(&name));
                if entering {
                    self.notice(&name, plugin, NEEDS_ATTENTION);
                }
            }
            Approved::Attention { token, .. } => {
                let Some(name) = Self::name_of(state, &token) else {
                    return;
                };
                self.note(
                    Event::PaneAttention(ev::PaneAttention {
                        plugin: Some(plugin.to_string()),
                        reason: None,
                    }),
                    Some(&name),
                );
                self.notice(&name, plugin, ATTENTION);
            }
            Approved::Relaunch {
                token,
                generation,
                resume_args,
                ..
            } => {
                let Some(name) = Self::name_of(state, &token) else {
                    return;
                };
                let config = state.slots[&name].config.clone();
                let watch: Watch = Arc::default();
                *lock(&watch) = Self::watcher_outbox(state, &token);
                match self.spawn(&name, &config, &token, generation + 1, &resume_args, watch) {
                    Ok(pane) => {
                        let old = state.slots.insert(
                            name.clone(),
                            Slot {
                                pane,
                                config,
                                hold: None,
                            },
                        );
                        let slot = &state.slots[&name];
                        Self::tell_watcher(
                            state,
                            &token,
                            self.opened_event(&name, slot, &resume_args),
                        );
                        self.note(
                            Event::PaneRelaunched(ev::PaneRelaunched {
                                plugin: plugin.to_string(),
                                id: slot.pane.id,
                                previous_id: old.as_ref().map(|o| o.pane.id),
                                generation: slot.pane.generation,
                                resume_args: resume_args.clone(),
                            }),
                            Some(&name),
                        );
                        // The hold ended with a successful relaunch.
                        self.cancel_recovery(state, &name, true);
                    }
                    Err(e) => {
                        tracing::warn!("relaunching pane `{name}` failed: {e}");
                        self.note(
                            Event::PaneRelaunchFailed(ev::PaneRelaunchFailed {
                                plugin: plugin.to_string(),
                                error: e.to_string(),
                            }),
                            Some(&name),
                        );
                    }
                }
            }
        }
    }

    fn plugin_exited(
        &self,
        plugin: &str,
        instance: u64,
        exit: Option<crate::supervisor::ExitInfo>,
    ) {
        let mut state = lock(&self.state);
        let stopping = state.stopping;
        let Some(entry) = state.plugins.get_mut(plugin) else {
            return;
        };
        if entry.child.as_ref().map(|c| c.instance) != Some(instance) {
            return;
        }
        entry.child = None;
        if entry.started.elapsed() >= PLUGIN_STABLE_AFTER {
            entry.restarts = 0;
        }
        let info = exit.unwrap_or_default();
        let restart = !stopping
            && crate::supervisor::wants_restart(entry.config.restart, &info)
            && entry.restarts < MAX_PLUGIN_RESTARTS;
        self.note_plugin(
            Event::PanePluginExited(ev::PanePluginExited {
                exit: exit.map(|e| e.to_string()),
                restarting: restart,
            }),
            plugin,
        );
        if restart {
            entry.restarts += 1;
            let delay = crate::supervisor::BackoffPolicy::default().delay(entry.restarts);
            let (me, name) = (self.me.clone(), plugin.to_string());
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                if let Some(host) = me.upgrade() {
                    host.restart_plugin(&name);
                    host.flush_events().await;
                }
            });
        }
        // Panes keep running; nobody will relaunch what this plugin held.
        self.discard_holds_of(&mut state, plugin);
    }

    /// Discard the relaunch holds of panes `plugin` watches.
    fn discard_holds_of(&self, state: &mut State, plugin: &str) {
        let tokens = state.guard.watched_by(plugin);
        let held: Vec<String> = state
            .slots
            .iter()
            .filter(|(_, s)| s.hold.is_some() && tokens.contains(&s.pane.token))
            .map(|(n, _)| n.clone())
            .collect();
        for name in held {
            if let Some(slot) = state.slots.remove(&name) {
                self.end_slot(state, &name, slot, true);
            }
        }
    }

    fn start_plugin(&self, name: &str, config: &PluginConfig) -> Result<Option<u32>, DriverError> {
        let id = ComponentId::new(Kind::PanePlugin, name);
        let cx = DriverContext {
            repo: self.repo.clone(),
            state_dir: self.state_dir.clone(),
            supervisor: self.supervisor.clone(),
        };
        let mut spec = child_spec(&cx, &id, &config.run, config.restart);
        spec.stdio = crate::supervisor::StdioSpec::piped();
        let instance = self.next_id.fetch_add(1, Ordering::SeqCst);
        let child = PluginChild::start(
            &self.supervisor,
            name,
            instance,
            &spec,
            self.commands.clone(),
        )?;
        let pid = child.pid;
        let mut state = lock(&self.state);
        let outbox = child.outbox.clone();
        let restarts = state.plugins.get(name).map_or(0, |e| e.restarts);
        state.plugins.insert(
            name.to_string(),
            PluginEntry {
                config: config.clone(),
                child: Some(child),
                restarts,
                started: Instant::now(),
            },
        );
        // Panes whose entry names this plugin and that nobody watches yet.
        let names: Vec<String> = state.slots.keys().cloned().collect();
        for pane_name in names {
            let slot = &state.slots[&pane_name];
            let token = slot.pane.token.clone();
            if state.guard.watcher(&token).is_none()
                && slot.config.plugin.as_deref() == Some(name)
                && slot.pane.is_live()
            {
                state.guard.opt_in(&token, name);
            }
            if state.guard.watcher(&token) == Some(name) {
                let slot = &state.slots[&pane_name];
                *lock(&slot.pane.watch) = Some(outbox.clone());
                outbox.event(self.opened_event(&pane_name, slot, &[]));
            }
        }
        Ok(Some(pid))
    }

    /// Start a plugin child again after it exited (its restart policy wanted it).
    fn restart_plugin(&self, name: &str) {
        let config = {
            let state = lock(&self.state);
            match state.plugins.get(name) {
                Some(entry) if entry.child.is_none() && !state.stopping => entry.config.clone(),
                _ => return,
            }
        };
        if let Err(e) = self.start_plugin(name, &config) {
            self.note_plugin(
                Event::PanePluginFailed(ev::PaneError {
                    error: e.to_string(),
                }),
                name,
            );
        }
    }

    async fn stop_plugin(&self, name: &str) {
        let child = {
            let mut state = lock(&self.state);
            let Some(entry) = state.plugins.get_mut(name) else {
                return;
            };
            let child = entry.child.take();
            // Watchers stay: a replaced plugin keeps its panes (see manifest_applied).
            for slot in state.slots.values() {
                if state.guard.watcher(&slot.pane.token) == Some(name) {
                    *lock(&slot.pane.watch) = None;
                }
            }
            child
        };
        if let Some(child) = child {
            child.stop().await;
        }
    }

    fn manifest_applied(&self, manifest: &crate::model::Manifest) {
        let mut state = lock(&self.state);
        let gone: Vec<String> = state
            .plugins
            .keys()
            .filter(|n| !manifest.pane_plugins.get(*n).is_some_and(|p| p.enabled))
            .cloned()
            .collect();
        for name in gone {
            self.discard_holds_of(&mut state, &name);
            for token in state.guard.release(&name) {
                if let Some(pane) = Self::name_of(&state, &token) {
                    self.cancel_recovery(&mut state, &pane, false);
                }
            }
            state.plugins.remove(&name);
        }
        // An enabled plugin whose (successor) child did not start holds nothing.
        let down: Vec<String> = state
            .plugins
            .iter()
            .filter(|(_, p)| p.child.is_none())
            .map(|(n, _)| n.clone())
            .collect();
        for name in down {
            self.discard_holds_of(&mut state, &name);
        }
    }
}

async fn run_loop(
    host: Weak<Host>,
    mut events: mpsc::UnboundedReceiver<PaneEvent>,
    mut commands: mpsc::UnboundedReceiver<PluginMsg>,
    slot_made: Arc<tokio::sync::Notify>,
) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // Idle panes and expired holds need the tick; without a pane there
        // is nothing to tick until one is opened (or the host is dropped).
        let Some(ticking) = host.upgrade().map(|h| !lock(&h.state).slots.is_empty()) else {
            return;
        };
        tokio::select! {
            () = slot_made.notified(), if !ticking => {}
            Some(event) = events.recv() => {
                let Some(host) = host.upgrade() else { return };
                match event {
                    PaneEvent::Exited { id, exit } => host.exited(id, exit),
                }
                host.flush_events().await;
            }
            Some(msg) = commands.recv() => {
                let Some(host) = host.upgrade() else { return };
                match msg {
                    PluginMsg::Line { plugin, instance, line, permit } => {
                        host.plugin_line(&plugin, instance, line);
                        drop(permit);
                    }
                    PluginMsg::Exited { plugin, instance, exit } => host.plugin_exited(&plugin, instance, exit),
                }
                host.flush_events().await;
            }
            _ = tick.tick(), if ticking => {
                let Some(host) = host.upgrade() else { return };
                host.tick();
                host.flush_events().await;
            }
        }
    }
}

impl Drop for Host {
    /// Wakes the loop, which then finds no host and ends.
    fn drop(&mut self) {
        self.slot_made.notify_one();
    }
}

impl TypedDriver for PaneHost {
    /// Panes and pane plugins: the host serves both kinds.
    type Config = Config;

    async fn start(
        &self,
        _cx: &DriverContext,
        id: &ComponentId,
        config: &Config,
    ) -> Result<Option<u32>, DriverError> {
        let pid = match id.kind {
            Kind::PanePlugin => {
                match self
                    .host
                    .start_plugin(&id.name, kind_config::<PluginConfig>(id, config)?)
                {
                    Ok(pid) => pid,
                    Err(e) => {
                        // No recovery is left without an owner.
                        {
                            let mut state = lock(&self.host.state);
                            self.host.discard_holds_of(&mut state, &id.name);
                        }
                        self.host.flush_events().await;
                        return Err(e);
                    }
                }
            }
            _ => {
                let pane = kind_config::<PaneConfig>(id, config)?.clone();
                lock(&self.host.state).configs.insert(id.name.clone(), pane);
                // A pane that does not start is reported, never a failed reload.
                if let Err(e) = self.host.open(&id.name) {
                    self.host.note(
                        Event::PaneStartFailed(ev::PaneError {
                            error: e.to_string(),
                        }),
                        Some(&id.name),
                    );
                }
                lock(&self.host.state)
                    .slots
                    .get(&id.name)
                    .map(|s| s.pane.pid)
            }
        };
        self.host.flush_events().await;
        Ok(pid)
    }

    async fn update(
        &self,
        _cx: &DriverContext,
        id: &ComponentId,
        _old: &Config,
        new: &Config,
    ) -> Result<(), DriverError> {
        let mut state = lock(&self.host.state);
        match id.kind {
            // `allowed_resume_flags` and `watch_on_signal` apply from the next decision.
            Kind::PanePlugin => {
                let config = kind_config::<PluginConfig>(id, new)?.clone();
                if let Some(entry) = state.plugins.get_mut(&id.name) {
                    entry.config = config;
                }
            }
            _ => {
                let config = kind_config::<PaneConfig>(id, new)?.clone();
                if let Some(slot) = state.slots.get_mut(&id.name) {
                    slot.config.idle_ms = config.idle_ms;
                    slot.config.relaunch_ttl_ms = config.relaunch_ttl_ms;
                    slot.config.plugin = config.plugin.clone();
                }
                state.configs.insert(id.name.clone(), config);
            }
        }
        Ok(())
    }

    async fn stop(&self, _cx: &DriverContext, id: &ComponentId) -> Result<(), DriverError> {
        match id.kind {
            Kind::PanePlugin => self.host.stop_plugin(&id.name).await,
            _ => {
                let _ = self.host.close(&id.name);
                lock(&self.host.state).configs.remove(&id.name);
            }
        }
        self.host.flush_events().await;
        Ok(())
    }
}
