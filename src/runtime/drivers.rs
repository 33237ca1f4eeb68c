//! The kind → driver table: how each component kind starts, changes in
//! place and stops, through the contract in `crate::driver`. Supervised
//! kinds (stdio MCP servers) run as processes through the supervisor;
//! panes and pane plugins are `panes::PaneHost`'s; the MCP pool and the
//! triggers have drivers of their own (`runtime::mcp`, `runtime::triggers`);
//! the other kinds are recorded so the plan and the status show them, and
//! their effects come from other commands.

use crate::driver::{
    Driver, DriverContext, DriverError, TypedDriver, child_spec, start_child, stop_child,
};
use crate::model::{McpServer, McpTransport};
use crate::plan::{ComponentId, Config, Kind};

pub use crate::driver::STOP_GRACE;

/// Kinds whose effect is their recorded config (providers, prompts, …).
#[derive(Debug, Default)]
pub struct Recorded;

impl TypedDriver for Recorded {
    type Config = Config;

    async fn start(
        &self,
        _: &DriverContext,
        _: &ComponentId,
        _: &Config,
    ) -> Result<Option<u32>, DriverError> {
        Ok(None)
    }

    async fn stop(&self, _: &DriverContext, _: &ComponentId) -> Result<(), DriverError> {
        Ok(())
    }
}

/// Kinds that run as a supervised process: stdio MCP servers.
#[derive(Debug, Default)]
pub struct Process;

impl TypedDriver for Process {
    type Config = McpServer;

    async fn start(
        &self,
        cx: &DriverContext,
        id: &ComponentId,
        server: &McpServer,
    ) -> Result<Option<u32>, DriverError> {
        let McpTransport::Stdio(command) = &server.transport else {
            return Ok(None); // an HTTP MCP server: nothing to run
        };
        server
            .check_start()
            .map_err(|e| DriverError::Component(Box::new(e)))?;
        let spec = child_spec(cx, id, command, server.restart);
        Ok(Some(start_child(cx, id, spec).await?))
    }

    async fn stop(&self, cx: &DriverContext, id: &ComponentId) -> Result<(), DriverError> {
        stop_child(cx, id).await
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
