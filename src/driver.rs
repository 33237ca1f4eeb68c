//! The reconciler's component contract: what every component kind
//! implements ([`Driver`]: start, change in place, stop) and what it may use
//! ([`DriverContext`]); [`child_spec`] turns a manifest command into what
//! the supervisor runs. The runtime drives components only through this
//! contract, and implementors (the MCP and trigger drivers, `panes::PaneHost`)
//! depend on it, never on the runtime.
//!
//! Architecture invariant: this room knows no component kind's insides and
//! nothing above it; a kind's own error reaches the runtime as
//! [`DriverError::Component`], in the kind's words.

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures_util::future::BoxFuture;

use crate::model::{CommandSpec, RestartPolicy};
use crate::plan::{ComponentId, Config};
use crate::supervisor::{
    ChildSpec, InputWiring, OutputWiring, StdioSpec, Supervisor, SupervisorError, log_path,
};

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
    /// A kind's own failure (a trigger's, …), in its own words.
    #[error(transparent)]
    Component(Box<dyn std::error::Error + Send + Sync>),
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
