//! The kind → driver table: how each component kind starts, changes in
//! place and stops, through the contract in `crate::driver`. Supervised
//! kinds (stdio MCP servers) run as processes through the supervisor;
//! panes and pane plugins are `panes::PaneHost`'s; the MCP pool and the
//! triggers have drivers of their own (`runtime::mcp`, `runtime::triggers`);
//! the other kinds are recorded so the plan and the status show them, and
//! their effects come from other commands.

use futures_util::future::BoxFuture;

use crate::driver::{Driver, DriverContext, DriverError, READY_GRACE, child_spec};
use crate::model::{CommandSpec, McpTransport, RestartPolicy};
use crate::plan::{ComponentId, Config, Kind};

pub use crate::driver::STOP_GRACE;

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
