//! The supervisor: the ONLY place in npc that spawns processes. It starts,
//! stops (SIGTERM to the process group, SIGKILL after a grace period),
//! restarts and signals named long-running children under a restart policy
//! with exponential backoff and flap detection, and runs one-shot and
//! streaming processes (hooks, agent runs) with bounded output. Every child
//! gets a cleared environment and its own process group, so stopping a child
//! stops its whole tree, and nothing outlives the daemon.
//!
//! State changes go out as [`SupervisorEvent`]s on the channel passed to
//! [`Supervisor::new`]; the runtime forwards them to the event bus.

mod backoff;
mod contain;
mod monitor;
mod oneshot;
mod pidns;
mod pty;
mod sandbox;
mod spawn;

use crate::stdx::lock;
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use nix::sys::signal::Signal;
use serde::{Serialize, Serializer};
use tokio::process::{ChildStderr, ChildStdin, ChildStdout};
use tokio::sync::{mpsc, oneshot as once};

pub use backoff::{
    BackoffPolicy, DEFAULT_BACKOFF_FACTOR, DEFAULT_BACKOFF_INITIAL, DEFAULT_BACKOFF_MAX,
    DEFAULT_BACKOFF_RESET_AFTER, DEFAULT_FLAP_MAX_RESTARTS, DEFAULT_FLAP_WINDOW, Decision,
    RestartTracker, wants_restart,
};
pub use contain::{
    ContainError, Containment, GroupRecord, LEDGER_DIR, Ledger, MAX_LEDGER_BYTES, MAX_LEDGER_FILES,
    MAX_TRACKED_GROUPS, ProcessRecord, REAP_GRACE, WATCHDOG_COMMAND, ledger_dir, reap,
    reap_leftovers, run_watchdog,
};
pub use oneshot::{
    DEFAULT_STDERR_LIMIT, DEFAULT_STDOUT_LIMIT, GroupKiller, Line, MAX_LINE_BYTES, Output,
    OutputLimits, POST_EXIT_DRAIN, STREAM_QUEUE_DEPTH, StreamingChild,
};
pub use pidns::{
    CONTAIN_COMMAND, NAMESPACES_ENV, OFF, PROBE_FLAG, probe as probe_pid_namespaces, probe_sandbox,
    probe_sandbox_once, stub_main,
};
pub use pty::{PTY_TERM, PtyControl, PtyExit, PtyProcess, PtySpec, PtyWaiter};
pub use sandbox::{Egress, SANDBOX_ENV, SandboxSpec};
pub use spawn::{
    ChildSpec, DEFAULT_STOP_GRACE, ESSENTIAL_ENV, InputWiring, LOG_DIR, LOG_ROTATE_BYTES,
    OutputWiring, StdioSpec, child_env, group_exists, log_path, signal_group,
};

/// How long a freshly started child must stay up to count as "running".
pub const DEFAULT_READY_GRACE: Duration = Duration::from_millis(500);

/// Errors from the supervisor.
#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    #[error(
        "cannot start `{id}`: `{program}` failed to spawn: {source}; check that the program exists on `PATH` and is executable"
    )]
    Spawn {
        id: String,
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "cannot start `{id}`: working directory `{}` does not exist; create it or fix `cwd`",
        cwd.display()
    )]
    Cwd { id: String, cwd: PathBuf },
    #[error(
        "cannot open log file `{}` for `{id}`: {source}; check that the state directory is writable",
        path.display()
    )]
    Log {
        id: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("child `{id}` is active (state `{state}`); stop it first or use `restart`")]
    AlreadyRunning { id: String, state: ChildState },
    #[error("no child `{id}` is supervised; start it first")]
    UnknownChild { id: String },
    #[error("child `{id}` is not running (state `{state}`); start it first")]
    NotRunning { id: String, state: ChildState },
    #[error("child `{id}` did not come up: {reason}; check its log and command")]
    NotReady { id: String, reason: String },
    #[error("cannot signal `{id}`: {source}")]
    Signal {
        id: String,
        #[source]
        source: nix::Error,
    },
    #[error("cannot talk to `{id}`: {source}")]
    Io {
        id: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the supervisor is shutting down; no new processes are started")]
    ShuttingDown,
}

pub use crate::event::ExitInfo;

impl From<ExitStatus> for ExitInfo {
    fn from(status: ExitStatus) -> Self {
        use std::os::unix::process::ExitStatusExt;
        Self {
            code: status.code(),
            signal: status.signal(),
        }
    }
}

impl fmt::Display for ExitInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.code, self.signal) {
            (Some(c), _) => write!(f, "exit code {c}"),
            (None, Some(s)) => match Signal::try_from(s) {
                Ok(sig) => write!(f, "killed by signal {s} ({})", sig.as_str()),
                Err(_) => write!(f, "killed by signal {s}"),
            },
            (None, None) => f.write_str("unknown exit status"),
        }
    }
}

/// Lifecycle state of a supervised child.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ChildState {
    /// Spawned, still within its readiness grace.
    Starting,
    /// Up for at least its readiness grace.
    Running,
    /// Exited; waiting out the backoff delay before a restart.
    Backoff,
    /// Stopped on request.
    Stopped,
    /// Exited and its restart policy does not restart it.
    Exited,
    /// Gave up: flapping, failed readiness, or a restart that could not spawn.
    Failed,
}

impl ChildState {
    /// Starting, running or waiting to restart.
    pub fn is_active(self) -> bool {
        matches!(self, Self::Starting | Self::Running | Self::Backoff)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Starting => "starting",
            Self::Running => "running",
            Self::Backoff => "backoff",
            Self::Stopped => "stopped",
            Self::Exited => "exited",
            Self::Failed => "failed",
        }
    }
}

impl fmt::Display for ChildState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

fn ser_time<S: Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&chrono::DateTime::<chrono::Utc>::from(*t).to_rfc3339())
}

fn ser_millis<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Observable state of one supervised child.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChildStatus {
    pub id: String,
    pub state: ChildState,
    /// Pid of the current process (also its process group), if one is alive.
    pub pid: Option<u32>,
    /// Automatic restarts since the last `start`.
    pub restarts: u32,
    /// When `state` last changed (RFC 3339 when serialised).
    #[serde(serialize_with = "ser_time")]
    pub since: SystemTime,
    /// How the previous process ended.
    pub last_exit: Option<ExitInfo>,
}

/// What happened to a supervised child.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum SupervisorEvent {
    Started {
        id: String,
        pid: u32,
    },
    /// The process ended (on its own or because it was stopped).
    Exited {
        id: String,
        pid: u32,
        code: Option<i32>,
        signal: Option<i32>,
    },
    /// A restart is scheduled after `delay` (serialised as `delay_ms`).
    Restarting {
        id: String,
        attempt: u32,
        #[serde(rename = "delay_ms", serialize_with = "ser_millis")]
        delay: Duration,
    },
    /// The supervisor gave up on the child; `reason` says why.
    Failed {
        id: String,
        reason: String,
    },
    /// The child was stopped on request and its process group is gone.
    /// A stop of a live process emits `Exited` first, then `Stopped`.
    Stopped {
        id: String,
    },
}

impl SupervisorEvent {
    /// The supervised child it is about (`kind/name`).
    pub fn id(&self) -> &str {
        match self {
            Self::Started { id, .. }
            | Self::Exited { id, .. }
            | Self::Restarting { id, .. }
            | Self::Failed { id, .. }
            | Self::Stopped { id } => id,
        }
    }

    /// The `component.*` event it is recorded as; the payload keeps
    /// `event` (`started`, `exited`, …) and `id` first.
    pub fn into_event(self) -> crate::event::Event {
        use crate::event::{self as ev, Event};
        match self {
            Self::Started { id, pid } => Event::ComponentStarted(ev::ProcessStarted {
                event: "started".into(),
                id,
                pid,
            }),
            Self::Exited {
                id,
                pid,
                code,
                signal,
            } => Event::ComponentExited(ev::ProcessExited {
                event: "exited".into(),
                id,
                pid,
                code,
                signal,
            }),
            Self::Restarting { id, attempt, delay } => {
                Event::ComponentRestarting(ev::ProcessRestarting {
                    event: "restarting".into(),
                    id,
                    attempt,
                    delay_ms: u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                })
            }
            Self::Failed { id, reason } => {
                Event::ComponentFailed(ev::ComponentFailed::Supervisor(ev::ProcessFailed {
                    event: "failed".into(),
                    id,
                    reason,
                }))
            }
            Self::Stopped { id } => Event::ComponentStopped(ev::ProcessStopped {
                event: "stopped".into(),
                id,
            }),
        }
    }
}

/// The pipes of the current process of a child started with piped stdio.
#[derive(Debug)]
pub struct ChildPipes {
    pub pid: u32,
    pub stdin: Option<ChildStdin>,
    pub stdout: Option<ChildStdout>,
    pub stderr: Option<ChildStderr>,
}

/// A request to a child's monitor task.
#[derive(Debug)]
enum Control {
    Stop {
        done: once::Sender<()>,
    },
    Signal {
        signal: Signal,
        done: once::Sender<Result<(), SupervisorError>>,
    },
}

/// Shared between a child's record and its monitor task.
#[derive(Debug)]
struct Shared {
    status: Mutex<ChildStatus>,
    pipes: Mutex<Option<ChildPipes>>,
}

impl Shared {
    fn status(&self) -> ChildStatus {
        lock(&self.status).clone()
    }

    fn update(&self, f: impl FnOnce(&mut ChildStatus)) {
        f(&mut lock(&self.status));
    }

    fn set_state(&self, state: ChildState) {
        self.update(|s| {
            s.state = state;
            s.since = SystemTime::now();
        });
    }
}

#[derive(Debug)]
struct Record {
    /// Start order, for reverse-order shutdown.
    seq: u64,
    shared: Arc<Shared>,
    control: mpsc::UnboundedSender<Control>,
}

#[derive(Debug)]
struct Inner {
    events: mpsc::UnboundedSender<SupervisorEvent>,
    backoff: BackoffPolicy,
    children: Mutex<BTreeMap<String, Record>>,
    next_seq: AtomicU64,
    shutting_down: AtomicBool,
    /// Records process groups so they die with this process (see [`Containment`]).
    contain: Option<Arc<Containment>>,
}

/// Owns every long-running child. Cheap to clone (all clones share state).
/// Dropping the last clone without [`Supervisor::shutdown`] SIGKILLs every
/// child's process group; `PR_SET_PDEATHSIG` covers the daemon's direct
/// children when it is killed, and a [`Containment`] (see
/// [`Supervisor::contained`]) their descendants.
#[derive(Debug, Clone)]
pub struct Supervisor {
    inner: Arc<Inner>,
}

impl Supervisor {
    /// A supervisor sending its events to `events` and spacing restarts by
    /// `backoff`. Must be created and used inside a tokio runtime.
    pub fn new(events: mpsc::UnboundedSender<SupervisorEvent>, backoff: BackoffPolicy) -> Self {
        Self::build(events, backoff, None)
    }

    /// Like [`Supervisor::new`], and every process group it spawns (long-running
    /// or one-shot) is recorded with `contain`, so the whole tree of every
    /// child dies with this process even when it is killed with SIGKILL.
    pub fn contained(
        events: mpsc::UnboundedSender<SupervisorEvent>,
        backoff: BackoffPolicy,
        contain: Arc<Containment>,
    ) -> Self {
        Self::build(events, backoff, Some(contain))
    }

    /// The supervisor of an `npc` process (the daemon, `npc run`): contained
    /// by a watchdog started from this executable, with its ledger under
    /// `runtime_dir` (the repository `root`'s fixed runtime directory), after
    /// stopping what crashed supervisors left there (this may wait up to
    /// [`REAP_GRACE`]). When containment cannot start, a warning is logged
    /// and children still die with this process through the parent-death
    /// signal, but not their descendants.
    pub fn for_npc(
        events: mpsc::UnboundedSender<SupervisorEvent>,
        backoff: BackoffPolicy,
        root: &std::path::Path,
        runtime_dir: &std::path::Path,
    ) -> Self {
        let contain = std::env::current_exe()
            .map_err(|source| ContainError::Watchdog {
                program: PathBuf::from("npc"),
                source,
            })
            .and_then(|program| Containment::start(&program, root, runtime_dir));
        match contain {
            Ok(contain) => Self::contained(events, backoff, contain),
            Err(e) => {
                tracing::warn!("{e}");
                Self::new(events, backoff)
            }
        }
    }

    fn build(
        events: mpsc::UnboundedSender<SupervisorEvent>,
        backoff: BackoffPolicy,
        contain: Option<Arc<Containment>>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                events,
                backoff,
                children: Mutex::new(BTreeMap::new()),
                next_seq: AtomicU64::new(0),
                shutting_down: AtomicBool::new(false),
                contain,
            }),
        }
    }

    /// Whether this supervisor can start sandboxed children; `Err` says
    /// why not (no PID namespaces, no user namespaces, no Landlock, or
    /// `NPC_SANDBOX=off`).
    pub fn sandbox_support(&self) -> Result<(), String> {
        if std::env::var(SANDBOX_ENV).is_ok_and(|v| v == OFF) {
            return Err(format!("turned off by `{SANDBOX_ENV}={OFF}`"));
        }
        match self.inner.contain.as_ref().and_then(|c| c.stub()) {
            Some(stub) => probe_sandbox_once(stub),
            None => Err(
                "this process runs its children without PID namespaces (see `npc doctor`)".into(),
            ),
        }
    }

    /// The containment this supervisor records its groups with, if any.
    pub fn containment(&self) -> Option<&Arc<Containment>> {
        self.inner.contain.as_ref()
    }

    /// Spawn child `id` and supervise it. Returns its pid once spawned;
    /// spawn failures (program not found, missing `cwd`) are reported here.
    /// A child that exits within [`DEFAULT_READY_GRACE`] is handled by its
    /// restart policy like any other exit.
    pub fn start(&self, id: &str, spec: ChildSpec) -> Result<u32, SupervisorError> {
        self.launch(id, spec, DEFAULT_READY_GRACE, None)
    }

    /// Like [`Supervisor::start`], then wait until the child has stayed up
    /// for `grace`. If it exits during `grace` the child is marked `failed`
    /// (not restarted) and `Err(NotReady)` says how it ended.
    pub async fn start_and_wait_ready(
        &self,
        id: &str,
        spec: ChildSpec,
        grace: Duration,
    ) -> Result<u32, SupervisorError> {
        let (tx, rx) = once::channel();
        let pid = self.launch(id, spec, grace, Some(tx))?;
        match rx.await {
            Ok(Ok(())) => Ok(pid),
            Ok(Err(exit)) => Err(SupervisorError::NotReady {
                id: id.to_string(),
                reason: format!("it exited during the {grace:?} readiness grace with {exit}"),
            }),
            Err(_) => Err(SupervisorError::NotReady {
                id: id.to_string(),
                reason: "it was stopped before its readiness grace ended".to_string(),
            }),
        }
    }

    fn launch(
        &self,
        id: &str,
        spec: ChildSpec,
        ready_grace: Duration,
        ready: Option<once::Sender<Result<(), ExitInfo>>>,
    ) -> Result<u32, SupervisorError> {
        if self.inner.shutting_down.load(Ordering::SeqCst) {
            return Err(SupervisorError::ShuttingDown);
        }
        let mut children = lock(&self.inner.children);
        if let Some(rec) = children.get(id) {
            let state = rec.shared.status().state;
            if state.is_active() {
                return Err(SupervisorError::AlreadyRunning {
                    id: id.to_string(),
                    state,
                });
            }
        }
        let mut spawned = spawn::spawn_supervised(id, &spec, self.inner.contain.as_ref())?;
        let guard =
            spawn::GroupGuard::new(spawn::pgid_of(&spawned.child), self.inner.contain.as_ref());
        let pid = spawned.pid;
        let shared = Arc::new(Shared {
            status: Mutex::new(ChildStatus {
                id: id.to_string(),
                state: ChildState::Starting,
                pid: Some(pid),
                restarts: 0,
                since: SystemTime::now(),
                last_exit: None,
            }),
            pipes: Mutex::new(None),
        });
        monitor::stash_pipes(&shared, &mut spawned);
        let (control, control_rx) = mpsc::unbounded_channel();
        let _ = self.inner.events.send(SupervisorEvent::Started {
            id: id.to_string(),
            pid,
        });
        let seq = self.inner.next_seq.fetch_add(1, Ordering::SeqCst);
        children.insert(
            id.to_string(),
            Record {
                seq,
                shared: shared.clone(),
                control,
            },
        );
        drop(children);
        let monitor = monitor::Monitor {
            id: id.to_string(),
            spec,
            ready_grace,
            ready,
            events: self.inner.events.clone(),
            shared,
            control: control_rx,
            tracker: RestartTracker::new(self.inner.backoff),
            contain: self.inner.contain.clone(),
        };
        tokio::spawn(monitor.run(spawned, guard));
        Ok(pid)
    }

    /// Stop child `id`: SIGTERM its process group, SIGKILL after the spec's
    /// `stop_grace`, reap it. Cancels a pending restart. Stopping a child that
    /// is not active is a no-op. The record stays (state `stopped`).
    pub async fn stop(&self, id: &str) -> Result<(), SupervisorError> {
        let control = {
            let children = lock(&self.inner.children);
            let rec = children
                .get(id)
                .ok_or_else(|| SupervisorError::UnknownChild { id: id.to_string() })?;
            rec.control.clone()
        };
        let (done, wait) = once::channel();
        if control.send(Control::Stop { done }).is_ok() {
            // A monitor that ends without answering has already finished.
            let _ = wait.await;
        }
        Ok(())
    }

    /// Stop child `id` if active and forget it.
    pub async fn remove(&self, id: &str) -> Result<(), SupervisorError> {
        self.stop(id).await?;
        lock(&self.inner.children).remove(id);
        Ok(())
    }

    /// Stop child `id` (if supervised) and start it again with `spec`.
    pub async fn restart(&self, id: &str, spec: ChildSpec) -> Result<u32, SupervisorError> {
        match self.stop(id).await {
            Ok(()) | Err(SupervisorError::UnknownChild { .. }) => {}
            Err(e) => return Err(e),
        }
        self.start(id, spec)
    }

    /// Send `signal` to the current process of child `id` (not its group).
    pub async fn signal(&self, id: &str, signal: Signal) -> Result<(), SupervisorError> {
        let (control, state) = {
            let children = lock(&self.inner.children);
            let rec = children
                .get(id)
                .ok_or_else(|| SupervisorError::UnknownChild { id: id.to_string() })?;
            (rec.control.clone(), rec.shared.status().state)
        };
        let not_running = || SupervisorError::NotRunning {
            id: id.to_string(),
            state,
        };
        let (done, wait) = once::channel();
        control
            .send(Control::Signal { signal, done })
            .map_err(|_| not_running())?;
        wait.await.map_err(|_| not_running())?
    }

    /// Status of child `id`, if supervised.
    pub fn status(&self, id: &str) -> Option<ChildStatus> {
        lock(&self.inner.children)
            .get(id)
            .map(|rec| rec.shared.status())
    }

    /// Status of every supervised child, in start order.
    pub fn list(&self) -> Vec<ChildStatus> {
        let children = lock(&self.inner.children);
        let mut recs: Vec<&Record> = children.values().collect();
        recs.sort_by_key(|r| r.seq);
        recs.iter().map(|r| r.shared.status()).collect()
    }

    /// Take the pipes of child `id`'s current process (stdio wired `Piped`).
    /// Each process's pipes can be taken once; after a restart (see the
    /// `Started` event) the new process's pipes are available.
    pub fn take_pipes(&self, id: &str) -> Option<ChildPipes> {
        let shared = lock(&self.inner.children).get(id)?.shared.clone();
        lock(&shared.pipes).take()
    }

    /// Stop every child and wait for all of them, then release the
    /// containment (its watchdog exits and the ledger is removed). Refuses
    /// new starts afterwards. Calling it again is a no-op.
    pub async fn shutdown(&self) {
        self.inner.shutting_down.store(true, Ordering::SeqCst);
        let ids: Vec<String> = lock(&self.inner.children).keys().cloned().collect();
        self.stop_all(&ids).await;
        if let Some(contain) = self.inner.contain.clone() {
            let _ = tokio::task::spawn_blocking(move || contain.finish()).await;
        }
    }

    /// Stop the children `ids` concurrently: each gets SIGTERM at once and its
    /// own grace period, so stopping many stubborn children takes about one
    /// grace period, not one per child. Unknown ids are skipped.
    pub async fn stop_all(&self, ids: &[String]) {
        let controls: Vec<mpsc::UnboundedSender<Control>> = {
            let children = lock(&self.inner.children);
            ids.iter()
                .filter_map(|id| children.get(id).map(|rec| rec.control.clone()))
                .collect()
        };
        // Every stop request goes out before any is awaited.
        let waits: Vec<once::Receiver<()>> = controls
            .into_iter()
            .filter_map(|control| {
                let (done, wait) = once::channel();
                control.send(Control::Stop { done }).ok().map(|()| wait)
            })
            .collect();
        for wait in waits {
            // A monitor that ends without answering has already finished.
            let _ = wait.await;
        }
    }

    /// Run `spec` to completion (restart policy and stdio wiring ignored):
    /// write `stdin` (if any) then close it, capture stdout and stderr up to
    /// `limits`, and SIGKILL the process group if it outlives `timeout`.
    /// Processes the leader left behind are killed when it exits.
    pub async fn run_once(
        &self,
        spec: &ChildSpec,
        stdin: Option<Vec<u8>>,
        timeout: Duration,
        limits: OutputLimits,
    ) -> Result<Output, SupervisorError> {
        if self.inner.shutting_down.load(Ordering::SeqCst) {
            return Err(SupervisorError::ShuttingDown);
        }
        oneshot::run_once(spec, stdin, timeout, limits, self.inner.contain.as_ref()).await
    }

    /// Spawn `spec` with piped streams and hand out its output line by line
    /// (for agent runs). Dropping the handle kills the process group.
    pub fn spawn_streaming(&self, spec: &ChildSpec) -> Result<StreamingChild, SupervisorError> {
        if self.inner.shutting_down.load(Ordering::SeqCst) {
            return Err(SupervisorError::ShuttingDown);
        }
        oneshot::spawn_streaming(spec, MAX_LINE_BYTES, self.inner.contain.as_ref())
    }

    /// [`Supervisor::spawn_streaming`] with lines of at most `max_line`
    /// bytes (a longer line arrives cut and marked `truncated`).
    pub fn spawn_streaming_lines(
        &self,
        spec: &ChildSpec,
        max_line: usize,
    ) -> Result<StreamingChild, SupervisorError> {
        if self.inner.shutting_down.load(Ordering::SeqCst) {
            return Err(SupervisorError::ShuttingDown);
        }
        oneshot::spawn_streaming(spec, max_line, self.inner.contain.as_ref())
    }

    /// Spawn `spec` in a new pseudo-terminal (for panes); its process group
    /// is contained like every other child's.
    pub fn spawn_pty(&self, spec: &PtySpec) -> Result<PtyProcess, SupervisorError> {
        if self.inner.shutting_down.load(Ordering::SeqCst) {
            return Err(SupervisorError::ShuttingDown);
        }
        pty::spawn_pty(spec, self.inner.contain.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_info_reads_well() {
        let code = ExitInfo {
            code: Some(3),
            signal: None,
        };
        let killed = ExitInfo {
            code: None,
            signal: Some(9),
        };
        assert_eq!(code.to_string(), "exit code 3");
        assert_eq!(killed.to_string(), "killed by signal 9 (SIGKILL)");
        assert!(!code.success() && !killed.success());
        assert!(
            ExitInfo {
                code: Some(0),
                signal: None
            }
            .success()
        );
    }

    #[test]
    fn events_serialise_with_a_tag_and_milliseconds() {
        let ev = SupervisorEvent::Restarting {
            id: "mcp_server/fs".into(),
            attempt: 2,
            delay: Duration::from_millis(1500),
        };
        assert_eq!(
            serde_json::to_value(&ev).expect("serialises"),
            serde_json::json!({"event": "restarting", "id": "mcp_server/fs", "attempt": 2, "delay_ms": 1500})
        );
    }

    #[test]
    fn error_messages_name_the_child_and_the_fix() {
        let err = SupervisorError::AlreadyRunning {
            id: "a".into(),
            state: ChildState::Backoff,
        };
        assert_eq!(
            err.to_string(),
            "child `a` is active (state `backoff`); stop it first or use `restart`"
        );
    }
}
