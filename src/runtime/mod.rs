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
pub mod lock;
pub mod mcp;
pub mod notices;
pub mod npc_tools;
pub mod triggers;
pub mod watch;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::mpsc;

use crate::bus::{BusError, EventBus};
use crate::driver::{Driver, DriverContext, DriverError};
use crate::model::{self, Manifest, ProcessEnv};
use crate::plan::{self, Action, ComponentId, Config, Desired, ExternalInputs, ObservedState};
use crate::store::{ComponentRecord, NewEvent, Store, StoreError, now_ms};
use crate::supervisor::{BackoffPolicy, Supervisor, SupervisorEvent};
use drivers::driver_for;
use lock::{LockError, RepoLock};

/// Name of the SQLite database inside the state directory.
pub const DB_FILE: &str = "state.db";

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
}

/// Where a repository keeps its manifest and state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoPaths {
    /// Canonical repository root (the manifest's directory).
    pub root: PathBuf,
    pub manifest: PathBuf,
    pub state_dir: PathBuf,
}

impl RepoPaths {
    /// Resolve `manifest` (relative, `~` and symlinked directories collapse
    /// to one) and the state directory the manifest names (default `.npc`).
    /// The root is the manifest's directory; the manifest itself need not
    /// exist (`npc status` finds a daemon whose manifest was deleted), and a
    /// manifest that is a link never moves the root elsewhere.
    pub fn resolve(manifest: &Path, state_dir: &str) -> Result<Self, RuntimeError> {
        let expanded = expand_home(manifest);
        let dir = match expanded.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let root = dir.canonicalize().map_err(|source| RuntimeError::Repo {
            path: expanded.clone(),
            source,
        })?;
        let manifest = root.join(expanded.file_name().unwrap_or_default());
        let state_dir = root.join(state_dir);
        Ok(Self {
            root,
            manifest,
            state_dir,
        })
    }

    pub fn db(&self) -> PathBuf {
        self.state_dir.join(DB_FILE)
    }

    /// Where the lock and the control socket live: `<root>/.npc`, whatever
    /// the manifest says (see [`lock::RUNTIME_DIR`]).
    pub fn runtime_dir(&self) -> PathBuf {
        self.root.join(lock::RUNTIME_DIR)
    }

    /// The control socket of the daemon holding the repository, and its
    /// pid; `None` when no daemon runs or the socket is not one (a link
    /// could lead anywhere, so it is never connected to).
    pub fn running_daemon(&self) -> Option<(PathBuf, u32)> {
        let pid = lock::holder(&self.runtime_dir())?;
        let socket = crate::surfaces::control::socket_path(&self.runtime_dir());
        crate::repofs::Root::new(&self.root)
            .and_then(|root| root.socket_check(&socket))
            .ok()?;
        Some((socket, pid))
    }
}

/// Files SQLite keeps beside the database (`state.db-wal`, …), named by
/// these suffixes. SQLite opens them itself, following links, so they are
/// checked through the guarded layer first.
pub const STORE_SIDE_SUFFIXES: [&str; 3] = ["-wal", "-shm", "-journal"];

/// Make the state directory and the database file ready through the
/// guarded layer (private, never links), then open the store.
pub fn open_store(paths: &RepoPaths) -> Result<Store, RuntimeError> {
    let root = crate::repofs::Root::new(&paths.root)?;
    root.ensure_state_dir(&paths.state_dir)?;
    drop(root.open_private(&paths.db())?);
    check_side_files(&root, paths)?;
    Ok(Store::open(paths.db())?)
}

/// Open the existing store read-only (the CLI beside a daemon), after the
/// same checks as [`open_store`]: the database and its side files are
/// regular files, never links.
pub fn open_store_read_only(paths: &RepoPaths) -> Result<Store, RuntimeError> {
    let root = crate::repofs::Root::new(&paths.root)?;
    drop(root.open_existing(&paths.db())?);
    check_side_files(&root, paths)?;
    Ok(Store::open_read_only(paths.db())?)
}

/// Each of SQLite's side files is absent or a regular file in the state
/// directory: a link (to anywhere) or a FIFO there is refused by name.
fn check_side_files(root: &crate::repofs::Root, paths: &RepoPaths) -> Result<(), RuntimeError> {
    for suffix in STORE_SIDE_SUFFIXES {
        let mut name = paths.db().into_os_string();
        name.push(suffix);
        match root.open_existing(Path::new(&name)) {
            Ok(_) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn expand_home(path: &Path) -> PathBuf {
    match (path.strip_prefix("~"), std::env::var_os("HOME")) {
        (Ok(rest), Some(home)) => PathBuf::from(home).join(rest),
        _ => path.to_path_buf(),
    }
}

/// The state directory a manifest names, read leniently so that `npc
/// status` and `npc events` work while the manifest is invalid (that is when
/// the events matter most): `project.state_dir` if the file parses at all,
/// else the default. The manifest is read through the guarded layer with
/// the manifest size cap, so a huge or hostile file costs nothing.
pub fn state_dir_hint(manifest: &Path) -> String {
    let bytes = model::read_manifest(manifest).unwrap_or_default();
    let text = String::from_utf8(bytes).unwrap_or_default();
    let value: Option<serde_json::Value> = if manifest.extension().is_some_and(|e| e == "json") {
        serde_json::from_str(&text).ok()
    } else {
        toml::from_str(&text).ok()
    };
    value
        .as_ref()
        .and_then(|v| v.pointer("/project/state_dir"))
        .and_then(|v| v.as_str())
        .unwrap_or(model::DEFAULT_STATE_DIR)
        .to_string()
}

/// Load the manifest at `path` with the process environment.
pub fn load_manifest(path: &Path) -> Result<model::Loaded, RuntimeError> {
    crate::plugins::files::load_path(path, &ProcessEnv).map_err(|source| RuntimeError::Manifest {
        path: path.to_path_buf(),
        source,
    })
}

/// Digests of files the pure layer cannot read: each enabled plugin's
/// package. A file that cannot be read counts as empty (see
/// [`checked_external_inputs`] for the daemon, which must not plan from that).
pub fn external_inputs(manifest: &Manifest, root: &Path) -> ExternalInputs {
    external_inputs_with(manifest, root, &mut None)
}

/// [`external_inputs`], failing on an operational read error (out of
/// descriptors, say) instead of digesting a package that was not fully read.
pub fn checked_external_inputs(
    manifest: &Manifest,
    root: &Path,
) -> Result<ExternalInputs, std::io::Error> {
    let mut failure = None;
    let inputs = external_inputs_with(manifest, root, &mut failure);
    failure.map_or(Ok(inputs), Err)
}

fn external_inputs_with(
    manifest: &Manifest,
    root: &Path,
    failure: &mut Option<std::io::Error>,
) -> ExternalInputs {
    let skip = npc_output(&manifest.project.state_dir, root);
    let plugin_digests = manifest
        .plugins
        .iter()
        .map(|(name, p)| {
            (
                name.clone(),
                dir_digest(&root.join(&p.path), &skip, failure),
            )
        })
        .collect();
    ExternalInputs { plugin_digests }
}

/// What npc itself writes in a repository, which no digest or watch counts
/// as a change of its inputs (a plugin at `path = "."` would otherwise
/// change with every event npc records): the state directory and the
/// project-level agent config files, whose content follows the manifest.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NpcOutput {
    /// Directories (and everything under them).
    pub dirs: BTreeSet<PathBuf>,
    /// Single files.
    pub files: BTreeSet<PathBuf>,
}

impl NpcOutput {
    /// Whether `path` is something npc writes (or a temporary file beside it).
    pub fn contains(&self, path: &Path) -> bool {
        self.dirs.iter().any(|d| path.starts_with(d))
            || self.files.contains(path)
            || crate::repofs::is_editor_noise(path)
    }
}

/// [`NpcOutput`] of the repository at `root` whose manifest names `state_dir`.
pub fn npc_output(state_dir: &str, root: &Path) -> NpcOutput {
    let files = model::ProviderKind::ALL
        .iter()
        .map(|&kind| {
            crate::native::target_path(
                root,
                &crate::native::Target {
                    kind,
                    scope: crate::native::Scope::Project,
                },
            )
        })
        .collect();
    NpcOutput {
        dirs: BTreeSet::from([root.join(state_dir)]),
        files,
    }
}

/// Files looked at per plugin package when computing its digest.
pub const MAX_PACKAGE_FILES: usize = 10_000;
/// Bytes of one package file read for the digest (a larger file counts as
/// unreadable).
pub const MAX_PACKAGE_FILE_BYTES: usize = 16 * 1024 * 1024;
/// Bytes of all files of one package read for its digest: past this, a
/// file counts by its path and size only. Without it, 10,000 sparse 16 MiB
/// files (no disk space at all) would cost 160 GiB of hashing per reload.
pub const MAX_PACKAGE_BYTES: u64 = 64 * 1024 * 1024;
/// Directory entries looked at per package (the walk stops there), so a
/// package in a huge tree costs a bounded walk.
pub const MAX_PACKAGE_ENTRIES: usize = 100_000;

/// SHA-256 over the relative paths and contents of every regular file
/// under `dir` (each file hashed as it is read, so size costs no memory),
/// except what npc writes itself (`skip`). The first operational read error
/// goes to `failure`.
fn dir_digest(dir: &Path, skip: &NpcOutput, failure: &mut Option<std::io::Error>) -> String {
    use sha2::Digest as _;
    let mut note = |e: std::io::Error| {
        if is_operational(&e) && failure.is_none() {
            *failure = Some(e);
        }
    };
    let guard = match crate::repofs::Root::new(dir) {
        Ok(guard) => guard,
        Err(e) => {
            note(e.into());
            return String::new();
        }
    };
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    let mut entries_seen = 0usize;
    while let Some(d) = stack.pop() {
        if entries_seen >= MAX_PACKAGE_ENTRIES {
            break;
        }
        let entries = match std::fs::read_dir(&d) {
            Ok(entries) => entries,
            Err(e) => {
                note(e);
                continue;
            }
        };
        for e in entries.take(MAX_PACKAGE_ENTRIES - entries_seen) {
            entries_seen += 1;
            let e = match e {
                Ok(e) => e,
                Err(e) => {
                    note(e);
                    continue;
                }
            };
            let p = e.path();
            if skip.contains(&p) {
                continue;
            }
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(p),
                Ok(t) if t.is_file() && files.len() < MAX_PACKAGE_FILES => files.push(p),
                _ => {}
            }
        }
    }
    files.sort();
    let mut bytes_left = MAX_PACKAGE_BYTES;
    let contents: Vec<(String, String)> = files
        .iter()
        .map(|f| {
            let mut hasher = sha2::Sha256::new();
            // Through the guarded layer: a regular file, never a link, opened
            // without blocking (a FIFO swapped in is refused).
            let rel = f.strip_prefix(dir).unwrap_or(f);
            if let Err(e) = guard
                .open_existing(rel)
                .map_err(std::io::Error::from)
                .and_then(|r| {
                    let len = r.metadata()?.len();
                    let budget = (MAX_PACKAGE_FILE_BYTES as u64).min(bytes_left);
                    let read = std::io::copy(&mut std::io::Read::take(r, budget), &mut hasher)?;
                    bytes_left -= read;
                    if read < len && budget < MAX_PACKAGE_FILE_BYTES as u64 {
                        // Cut short by the package budget: the size stands
                        // for the rest.
                        hasher.update(len.to_le_bytes());
                    }
                    Ok(())
                })
            {
                note(e);
            }
            (rel.display().to_string(), hex::encode(hasher.finalize()))
        })
        .collect();
    plan::fingerprint::fingerprint(&contents)
}

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

/// Longest a reload may spend loading and validating the manifest (template
/// probes and plugin digests included) before it counts as an operational
/// failure and is retried.
pub const LOAD_DEADLINE: Duration = Duration::from_secs(30);
/// Longest a reload may spend rendering and planning the agent files.
pub const FILES_DEADLINE: Duration = Duration::from_secs(30);

/// Why a reload's load step did not produce a manifest.
#[derive(Debug)]
enum LoadFailure {
    /// Not the manifest's fault: retried with backoff (`reload.failed`).
    Operational(String),
    /// The manifest is wrong: reported once (`manifest.invalid`).
    Invalid {
        payload: serde_json::Value,
        error_count: usize,
    },
}

/// Whether an I/O error is about the machine (descriptors, memory, an
/// interrupted or busy call) rather than the file: such a reload is retried
/// instead of calling the manifest invalid.
pub fn is_operational(e: &std::io::Error) -> bool {
    use nix::errno::Errno;
    use std::io::ErrorKind;
    let e = crate::repofs::os_error(e);
    const OPERATIONAL: [Errno; 8] = [
        Errno::EMFILE,
        Errno::ENFILE,
        Errno::ENOMEM,
        Errno::EAGAIN,
        Errno::EINTR,
        Errno::ENOBUFS,
        Errno::EIO,
        Errno::ETIMEDOUT,
    ];
    e.raw_os_error()
        .is_some_and(|n| OPERATIONAL.contains(&Errno::from_raw(n)))
        || matches!(
            e.kind(),
            ErrorKind::Interrupted
                | ErrorKind::WouldBlock
                | ErrorKind::TimedOut
                | ErrorKind::OutOfMemory
        )
}

/// The files a manifest references, read from disk, remembering the first
/// operational failure (a prompt file that cannot be opened for lack of
/// descriptors is not an invalid manifest).
struct OperationalFiles {
    disk: crate::plugins::files::PackageFiles,
    failure: Mutex<Option<String>>,
}

impl OperationalFiles {
    fn new(root: &Path) -> Self {
        Self {
            disk: crate::plugins::files::PackageFiles::new(root),
            failure: Mutex::new(None),
        }
    }

    fn failure(&self) -> Option<String> {
        crate::stdx::lock(&self.failure).clone()
    }
}

impl model::Files for OperationalFiles {
    fn read_to_string(&self, path: &Path) -> std::io::Result<String> {
        let read = self.disk.read_to_string(path);
        if let Err(e) = &read
            && is_operational(e)
        {
            let mut failure = crate::stdx::lock(&self.failure);
            failure.get_or_insert_with(|| format!("cannot read `{}`: {e}", path.display()));
        }
        read
    }
    fn is_dir(&self, path: &Path) -> bool {
        self.disk.is_dir(path)
    }
    fn check_dir(&self, path: &Path) -> std::io::Result<()> {
        self.disk.check_dir(path)
    }
    fn package(&self, entry: &str, dir: &Path) -> Option<model::package::PackageView> {
        self.disk.package(entry, dir)
    }
    fn add_user_plugins(&self, manifest: &mut model::Manifest) {
        self.disk.add_user_plugins(manifest);
    }
}

/// The outcome of one component in a reload.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ComponentResult {
    pub id: ComponentId,
    pub action: Action,
    /// `applied`, `failed`, `rolled-back` or `unchanged`.
    pub outcome: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What a reload did.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum ReloadOutcome {
    /// The manifest is invalid: nothing changed.
    Invalid { error_count: usize },
    /// The reload could not run for an operational reason (no file
    /// descriptors, no memory, a deadline): nothing changed, and the daemon
    /// tries again with backoff.
    Failed { error: String },
    /// A change cannot be applied live: nothing changed.
    Refused { reasons: Vec<String> },
    /// The plan was applied (possibly with rollbacks).
    Applied { results: Vec<ComponentResult> },
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
    triggers: triggers::TriggerDriver,
    applied: tokio::sync::Mutex<Applied>,
    shut_down: std::sync::atomic::AtomicBool,
    written: Arc<watch::Written>,
    /// Signalled by every reload that fails for an operational reason, so
    /// the daemon retries reloads that a control request started too.
    failed: tokio::sync::Notify,
    /// The REST API's base URL, once it listens.
    api_url: std::sync::OnceLock<String>,
    /// The plugin notices of the last applied manifest, so each collision
    /// or dropped plugin is an event once, not on every reload.
    plugin_notices: Mutex<Vec<model::PluginNotice>>,
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
        let triggers =
            triggers::TriggerDriver::new(cx.clone(), store.clone(), bus.clone(), runs.clone());
        let runtime = Arc::new(Runtime {
            paths: paths.clone(),
            store,
            bus,
            cx,
            mcp,
            panes,
            runs,
            triggers,
            applied: tokio::sync::Mutex::new(Applied::default()),
            shut_down: std::sync::atomic::AtomicBool::new(false),
            written: Arc::default(),
            failed: tokio::sync::Notify::new(),
            api_url: std::sync::OnceLock::new(),
            plugin_notices: Mutex::new(Vec::new()),
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

    /// The REST API's base URL, once it listens (see `api::start`).
    pub fn api_url(&self) -> Option<&str> {
        self.api_url.get().map(String::as_str)
    }

    /// The MCP driver, which owns the daemon's upstream pool and gateway.
    pub fn mcp(&self) -> &mcp::McpDriver {
        &self.mcp
    }

    /// The pane host (panes and pane plugins).
    pub fn panes(&self) -> &crate::panes::PaneHost {
        &self.panes
    }

    /// The trigger driver.
    pub fn triggers(&self) -> &triggers::TriggerDriver {
        &self.triggers
    }

    /// The run service (queue and executor).
    pub fn runs(&self) -> &Arc<crate::runs::Runs> {
        &self.runs
    }

    /// The driver of `kind`: the runtime's own MCP driver, trigger driver or
    /// pane host, or a stateless one.
    fn driver(&self, kind: plan::Kind) -> &dyn Driver {
        match kind {
            plan::Kind::McpServer => &self.mcp,
            plan::Kind::Trigger => &self.triggers,
            plan::Kind::Pane | plan::Kind::PanePlugin => &self.panes,
            other => driver_for(other),
        }
    }

    /// Publish an event; failures are logged, never fatal to the caller.
    pub async fn emit(
        &self,
        kind: &str,
        component: Option<&ComponentId>,
        payload: serde_json::Value,
    ) {
        let mut event = NewEvent::new(kind, payload);
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
    /// a reload that changes nothing emits nothing.
    pub async fn reload(&self, reason: &str) -> (ReloadOutcome, Option<Manifest>) {
        tracing::info!("reloading: {reason}");
        let (manifest, desired) = match self.load().await {
            Ok(loaded) => loaded,
            Err(LoadFailure::Operational(error)) => {
                self.report_failure(reason, &error).await;
                return (ReloadOutcome::Failed { error }, None);
            }
            Err(LoadFailure::Invalid {
                mut payload,
                error_count,
            }) => {
                payload["reason"] = reason.into();
                self.emit("manifest.invalid", None, payload).await;
                return (ReloadOutcome::Invalid { error_count }, None);
            }
        };
        self.bus.set_secrets(manifest.secret_values());
        self.triggers.manifest_loaded(&manifest);
        let outcome = self.apply(desired, reason).await;
        if let ReloadOutcome::Applied { results } = &outcome {
            // The gateway's built-ins and manifest prompts follow the manifest.
            self.mcp.manifest_applied(&manifest);
            self.panes.manifest_applied(&manifest).await;
            self.runs.set_manifest(&manifest);
            self.plugin_notices_applied(&manifest).await;
            let running = self.as_running(&manifest, results).await;
            if let Err(error) = self.write_files(&running).await {
                self.report_failure(reason, &error).await;
                return (ReloadOutcome::Failed { error }, Some(manifest));
            }
        }
        (outcome, Some(manifest))
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
            self.emit(
                notice.event_kind(),
                None,
                serde_json::to_value(&notice).unwrap_or_default(),
            )
            .await;
        }
    }

    /// A reload failed for an operational reason: say so, and wake the
    /// daemon's retry.
    async fn report_failure(&self, reason: &str, error: &str) {
        tracing::warn!("reload failed: {error}");
        self.emit(
            "reload.failed",
            None,
            serde_json::json!({ "reason": reason, "error": error }),
        )
        .await;
        self.failed.notify_one();
    }

    /// What a reload would change now, computed like one (same loading,
    /// same deadline) but applying nothing and emitting nothing.
    pub async fn preview(&self) -> Preview {
        match self.load().await {
            Ok((_, desired)) => Preview::Plan(plan::plan(&desired, &self.observed().await)),
            Err(LoadFailure::Operational(error)) => Preview::Failed { error },
            Err(LoadFailure::Invalid { payload, .. }) => Preview::Invalid { payload },
        }
    }

    /// Resolves after a reload failed for an operational reason.
    pub async fn reload_failed(&self) {
        self.failed.notified().await;
    }

    /// Read and validate the manifest and compute the desired state, off the
    /// async executor and within [`LOAD_DEADLINE`] (templates are rendered
    /// and plugin packages read here).
    async fn load(&self) -> Result<(Manifest, Desired), LoadFailure> {
        let paths = self.paths.clone();
        let work = tokio::task::spawn_blocking(move || {
            let files = OperationalFiles::new(&paths.root);
            let loaded = model::load_path_with(&paths.manifest, &ProcessEnv, &files);
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
                        payload: serde_json::json!({ "error": error.to_string() }),
                        error_count: 1,
                    });
                }
                (None, Ok(loaded)) => loaded,
            };
            let Some(manifest) = loaded.manifest else {
                let report = model::diagnostics::JsonReport::new(&loaded.diagnostics);
                return Err(LoadFailure::Invalid {
                    error_count: report.error_count,
                    payload: serde_json::json!({ "report": report }),
                });
            };
            let inputs = checked_external_inputs(&manifest, &paths.root).map_err(|e| {
                LoadFailure::Operational(format!("cannot read a plugin package: {e}"))
            })?;
            let desired = plan::desired(&manifest, &inputs);
            Ok((manifest, desired))
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
            .filter(|r| matches!(r.outcome, "failed" | "rolled-back"))
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
        let mut results = files::write_files(&plans, &self.store).await;
        results.extend(copied);
        let lines: Vec<serde_json::Value> = results
            .iter()
            .map(|(path, r)| match r {
                Ok(outcome) => serde_json::json!({ "path": path, "outcome": outcome }),
                Err(e) => serde_json::json!({ "path": path, "outcome": "error", "error": e }),
            })
            .collect();
        self.emit("files.written", None, serde_json::json!({ "files": lines }))
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
            self.emit(
                "reload.refused",
                None,
                serde_json::json!({ "reason": reason, "refused": refused }),
            )
            .await;
            return ReloadOutcome::Refused { reasons: refused };
        }
        let changes: Vec<serde_json::Value> = plan
            .actionable()
            .map(|c| serde_json::json!({ "id": c.id.to_string(), "action": c.action, "cause": c.cause }))
            .collect();
        self.emit(
            "reconcile.planned",
            None,
            serde_json::json!({ "reason": reason, "summary": plan.summary(), "changes": changes }),
        )
        .await;

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
                self.emit(
                    "component.removed",
                    Some(id),
                    serde_json::json!({ "cause": change.cause }),
                )
                .await;
                results.push(ComponentResult {
                    id: id.clone(),
                    action: change.action,
                    outcome: "applied",
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
                    if let Some(pid) = pid {
                        applied.pids.insert(id.clone(), pid);
                    }
                    let kind = match change.action {
                        Action::Add => "component.added",
                        Action::Replace => "component.replaced",
                        _ => "component.updated",
                    };
                    self.emit(
                        kind,
                        Some(id),
                        serde_json::json!({ "cause": change.cause, "pid": pid }),
                    )
                    .await;
                    results.push(ComponentResult {
                        id: id.clone(),
                        action: change.action,
                        outcome: "applied",
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
        let touched: Vec<ComponentId> = plan.actionable().map(|c| c.id.clone()).collect();
        self.persist(&mut applied, &touched).await;
        let outcome = ReloadOutcome::Applied { results };
        self.emit(
            "reconcile.applied",
            None,
            serde_json::to_value(&outcome).unwrap_or_default(),
        )
        .await;
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
            self.emit(
                "component.start_failed",
                Some(id),
                serde_json::json!({ "error": error_text }),
            )
            .await;
            let _ = driver.stop(&self.cx, id).await;
            return ComponentResult {
                id: id.clone(),
                action,
                outcome: "failed",
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
                self.emit("component.rolled_back", Some(id), serde_json::json!({ "error": error_text, "pid": pid, "detail": "the new config failed; the previous config runs again" })).await;
                ComponentResult {
                    id: id.clone(),
                    action,
                    outcome: "rolled-back",
                    pid,
                    error: Some(error_text),
                }
            }
            Err(again) => {
                applied.configs.remove(id);
                applied.pids.remove(id);
                self.emit(
                    "component.failed",
                    Some(id),
                    serde_json::json!({ "error": error_text, "rollback_error": again.to_string() }),
                )
                .await;
                ComponentResult {
                    id: id.clone(),
                    action,
                    outcome: "failed",
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
                state: status
                    .as_ref()
                    .map_or("applied".to_string(), |s| s.state.as_str().to_string()),
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
                ComponentStatus {
                    id: id.to_string(),
                    kind: id.kind.as_str().to_string(),
                    state: pane.as_ref().map(|p| p.0.clone()).unwrap_or_else(|| {
                        status
                            .as_ref()
                            .map_or("applied".to_string(), |s| s.state.as_str().to_string())
                    }),
                    pid: pane
                        .and_then(|p| p.1)
                        .or_else(|| status.as_ref().and_then(|s| s.pid)),
                    restarts: status.as_ref().map_or(0, |s| s.restarts),
                    since: status
                        .as_ref()
                        .map(|s| chrono::DateTime::<chrono::Utc>::from(s.since).to_rfc3339()),
                }
            })
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
        self.emit("daemon.stopping", None, serde_json::json!({}))
            .await;
        self.panes.shutdown().await;
        self.triggers.shutdown().await;
        self.runs.shutdown().await;
        self.cx.supervisor.shutdown().await;
        let mut applied = self.applied.lock().await;
        applied.pids.clear();
        self.emit("daemon.stopped", None, serde_json::json!({}))
            .await;
        self.bus.shutdown().await;
        let _ = self.store.flush().await;
    }
}

/// One row of `npc status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ComponentStatus {
    pub id: String,
    pub kind: String,
    pub state: String,
    pub pid: Option<u32>,
    pub restarts: u32,
    pub since: Option<String>,
}

/// Turn supervisor events into bus events.
async fn forward_supervisor_events(
    runtime: Weak<Runtime>,
    mut rx: mpsc::UnboundedReceiver<SupervisorEvent>,
) {
    while let Some(event) = rx.recv().await {
        let Some(rt) = runtime.upgrade() else { return };
        let (kind, id) = match &event {
            SupervisorEvent::Started { id, .. } => ("component.started", id),
            SupervisorEvent::Exited { id, .. } => ("component.exited", id),
            SupervisorEvent::Restarting { id, .. } => ("component.restarting", id),
            SupervisorEvent::Failed { id, .. } => ("component.failed", id),
            SupervisorEvent::Stopped { id } => ("component.stopped", id),
        };
        let component = ComponentId::parse(id);
        if let (SupervisorEvent::Started { .. }, Some(c)) = (&event, &component)
            && c.kind == plan::Kind::McpServer
        {
            // A (re)started stdio server: its session rides on the new pipes.
            rt.mcp.pool().process_started(&c.name);
        }
        let payload = serde_json::to_value(&event).unwrap_or_default();
        rt.emit(kind, component.as_ref(), payload).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_and_memory_errors_are_operational_missing_files_are_not() {
        for errno in [
            nix::errno::Errno::EMFILE,
            nix::errno::Errno::ENFILE,
            nix::errno::Errno::ENOMEM,
        ] {
            assert!(
                is_operational(&std::io::Error::from_raw_os_error(errno as i32)),
                "{errno}"
            );
        }
        for errno in [
            nix::errno::Errno::ENOENT,
            nix::errno::Errno::EACCES,
            nix::errno::Errno::EISDIR,
        ] {
            assert!(
                !is_operational(&std::io::Error::from_raw_os_error(errno as i32)),
                "{errno}"
            );
        }
    }

    #[test]
    fn npc_output_covers_the_state_dir_agent_files_and_temp_files() {
        let root = Path::new("/repo");
        let own = npc_output(model::DEFAULT_STATE_DIR, root);
        assert!(own.contains(Path::new("/repo/.npc/state.db-wal")));
        assert!(own.contains(Path::new("/repo/./.npc/logs/x.log")));
        assert!(own.contains(Path::new("/repo/.mcp.json")));
        assert!(own.contains(Path::new("/repo/.codex/.config.toml.npc-1-2.tmp")));
        assert!(!own.contains(Path::new("/repo/plugin.json")));
        assert!(!own.contains(Path::new("/repo/npcagent.toml")));
    }

    #[test]
    fn a_plugin_digest_ignores_what_npc_writes() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("plugin.json"), "{}").unwrap();
        let own = npc_output(model::DEFAULT_STATE_DIR, root);
        let before = dir_digest(root, &own, &mut None);
        std::fs::create_dir_all(root.join(".npc")).unwrap();
        std::fs::write(root.join(".npc/state.db"), "x").unwrap();
        std::fs::write(root.join(".mcp.json"), "{}").unwrap();
        assert_eq!(dir_digest(root, &own, &mut None), before);
        std::fs::write(root.join("plugin.json"), "{\"v\": 2}").unwrap();
        assert_ne!(dir_digest(root, &own, &mut None), before);
    }
}
