//! Drivers: how each component kind starts, changes in place and stops.
//! Adding a kind to the runtime means implementing [`Driver`] for it.
//! Supervised kinds (stdio MCP servers) run as processes through the
//! supervisor; panes and pane plugins are `panes::PaneHost`'s; the other kinds are recorded so the plan and the
//! status show them, and their effects come from other commands.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::Duration;

use crate::model::{CommandSpec, McpTransport, RestartPolicy};
use crate::plan::{ComponentId, Config, Kind};
use crate::supervisor::{
    ChildSpec, InputWiring, OutputWiring, StdioSpec, Supervisor, SupervisorError, log_path,
};

/// A boxed future, for object-safe async trait methods.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// How long a started child must stay up before its start counts as good.
pub const READY_GRACE: Duration = Duration::from_millis(300);
/// Time between SIGTERM and SIGKILL when stopping a component's process.
pub const STOP_GRACE: Duration = Duration::from_secs(5);

/// What drivers may use.
#[derive(Debug, Clone)]
pub struct DriverContext {
    pub repo: PathBuf,
    pub state_dir: PathBuf,
    pub supervisor: Supervisor,
}

#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error(transparent)]
    Supervisor(#[from] SupervisorError),
    #[error("`{id}` was given a config of another kind")]
    WrongConfig { id: String },
    #[error(transparent)]
    Trigger(#[from] crate::triggers::TriggerError),
}

/// One component kind's behaviour.
pub trait Driver: Send + Sync {
    /// Bring the component up with `config`. Returns its pid when it is a process.
    fn start<'a>(
        &'a self,
        cx: &'a DriverContext,
        id: &'a ComponentId,
        config: &'a Config,
    ) -> BoxFuture<'a, Result<Option<u32>, DriverError>>;

    /// Apply a live change. The default records it (the new config is read
    /// at the next use).
    fn update<'a>(
        &'a self,
        _cx: &'a DriverContext,
        _id: &'a ComponentId,
        _old: &'a Config,
        _new: &'a Config,
    ) -> BoxFuture<'a, Result<(), DriverError>> {
        Box::pin(async { Ok(()) })
    }

    /// Take the component down.
    fn stop<'a>(
        &'a self,
        cx: &'a DriverContext,
        id: &'a ComponentId,
    ) -> BoxFuture<'a, Result<(), DriverError>>;
}

/// Kinds whose effect is their recorded config (providers, prompts, …).
#[derive(Debug, Default)]
pub struct Recorded;

impl Driver for Recorded {
    fn start<'a>(
        &'a self,
        _: &'a DriverContext,
        _: &'a ComponentId,
        _: &'a Config,
    ) -> BoxFuture<'a, Result<Option<u32>, DriverError>> {
        Box::pin(async { Ok(None) })
    }
    fn stop<'a>(
        &'a self,
        _: &'a DriverContext,
        _: &'a ComponentId,
    ) -> BoxFuture<'a, Result<(), DriverError>> {
        Box::pin(async { Ok(()) })
    }
}

/// Kinds that run as a supervised process: stdio MCP servers.
#[derive(Debug, Default)]
pub struct Process;

/// The program a config runs, if it runs one.
fn command_of(config: &Config) -> Option<(&CommandSpec, RestartPolicy)> {
    match config {
        Config::McpServer(s) => match &s.transport {
            McpTransport::Stdio(c) => Some((c, s.restart)),
            McpTransport::Http { .. } => None,
        },
        _ => None,
    }
}

/// Resolve a command spec to what the supervisor runs. Secrets are exposed
/// here, and only here, because the child needs their values.
pub fn child_spec(
    cx: &DriverContext,
    id: &ComponentId,
    command: &CommandSpec,
    restart: RestartPolicy,
) -> ChildSpec {
    let cwd = command
        .cwd
        .as_ref()
        .map_or_else(|| cx.repo.clone(), |c| cx.repo.join(c.expose()));
    let log = log_path(&cx.state_dir, &id.to_string());
    ChildSpec {
        program: resolve_program(&cx.repo, &command.command),
        args: command
            .args
            .iter()
            .map(|a| a.expose().to_string())
            .collect(),
        env: command
            .env
            .iter()
            .map(|(k, v)| (k.clone(), v.expose().to_string()))
            .collect(),
        cwd,
        restart,
        stop_grace: STOP_GRACE,
        // stdin stays open (a closed stdin ends most protocol children);
        // output goes to the component's log so nothing blocks.
        stdio: StdioSpec {
            stdin: InputWiring::Piped,
            stdout: OutputWiring::AppendTo(log.clone()),
            stderr: OutputWiring::AppendTo(log),
        },
    }
}

/// A relative program path with a slash (`./bin/x`) is relative to the repository.
fn resolve_program(repo: &Path, program: &str) -> String {
    if program.contains('/') && !Path::new(program).is_absolute() {
        repo.join(program).display().to_string()
    } else {
        program.to_string()
    }
}

impl Driver for Process {
    fn start<'a>(
        &'a self,
        cx: &'a DriverContext,
        id: &'a ComponentId,
        config: &'a Config,
    ) -> BoxFuture<'a, Result<Option<u32>, DriverError>> {
        Box::pin(async move {
            let Some((command, restart)) = command_of(config) else {
                return Ok(None); // an HTTP MCP server: nothing to run
            };
            let spec = child_spec(cx, id, command, restart);
            let key = id.to_string();
            // A record left by an earlier run of this id (stopped or failed) is replaced.
            let _ = cx.supervisor.remove(&key).await;
            let pid = cx
                .supervisor
                .start_and_wait_ready(&key, spec, READY_GRACE)
                .await?;
            Ok(Some(pid))
        })
    }

    fn stop<'a>(
        &'a self,
        cx: &'a DriverContext,
        id: &'a ComponentId,
    ) -> BoxFuture<'a, Result<(), DriverError>> {
        Box::pin(async move {
            let key = id.to_string();
            if cx.supervisor.status(&key).is_some() {
                cx.supervisor.remove(&key).await?;
            }
            Ok(())
        })
    }
}

/// The driver of each kind.
pub fn driver_for(kind: Kind) -> &'static dyn Driver {
    static RECORDED: Recorded = Recorded;
    static PROCESS: Process = Process;
    match kind {
        Kind::McpServer => &PROCESS,
        Kind::Project
        | Kind::Daemon
        | Kind::Provider
        | Kind::Prompt
        | Kind::Plugin
        | Kind::Hooks
        | Kind::Profile
        | Kind::Pane
        | Kind::PanePlugin
        | Kind::Trigger => &RECORDED,
    }
}
