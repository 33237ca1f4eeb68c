//! `npc mcp serve [--http 127.0.0.1:PORT]`: the MCP gateway (npc's built-in
//! tools, `mcp::builtin`, ahead of the upstream ones). Runs its own
//! upstream pool from the manifest (standalone mode; fronting a running
//! daemon's pool comes later), connects every enabled server at start (all at
//! once, each within its `startup_timeout_ms`), then serves MCP on stdio
//! (stdout carries only protocol frames; logs go to stderr) or streamable
//! HTTP on loopback. Exit codes: 0 clean (stdin closed, SIGINT/SIGTERM),
//! 1 unexpected failure or invalid manifest, 2 usage.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use rmcp::ServiceExt;
use serde_json::json;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

use super::Exit;
use crate::mcp::builtin::{Builtins, npc::NpcContext};
use crate::mcp::{CallPath, Gateway, Pool, pool::IDLE_SWEEP_INTERVAL};
use crate::model::{self, ProcessEnv};
use crate::plan::{ComponentId, Kind};
use crate::store::NewEvent;
use crate::surfaces::mcp_http::{MCP_HTTP_PATH, McpHttpError, McpHttpListener};

/// Event recorded when an upstream server cannot be connected at start.
pub const SERVER_FAILED_EVENT: &str = "mcp.server_failed";

#[derive(Debug, Subcommand)]
pub enum McpCommand {
    /// Serve the repository's MCP servers' tools as one MCP server (stdio by default)
    Serve(ServeArgs),
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Serve streamable HTTP on this loopback address (e.g. 127.0.0.1:8767) instead of stdio
    #[arg(long, value_name = "ADDR")]
    http: Option<SocketAddr>,
    /// Manifest file (default: npcagent.toml, else npcagent.json, in the current directory)
    #[arg(long, short = 'm')]
    manifest: Option<PathBuf>,
}

pub fn run(command: McpCommand) -> anyhow::Result<Exit> {
    match command {
        McpCommand::Serve(args) => serve(args),
    }
}

fn serve(args: ServeArgs) -> anyhow::Result<Exit> {
    if let Some(addr) = args.http
        && !addr.ip().is_loopback()
    {
        errln!(
            "error: `{addr}` is not a loopback address; the gateway serves HTTP on 127.0.0.1 or ::1 only (remote access with a token is not supported yet)"
        );
        return Ok(Exit::Usage);
    }
    let path = super::manifest_path(args.manifest)?;
    let paths = crate::runtime::RepoPaths::resolve(&path, &crate::runtime::state_dir_hint(&path))?;
    let loaded = model::load_path(&paths.manifest, &ProcessEnv)
        .with_context(|| format!("cannot read `{}`", path.display()))?;
    let Some(manifest) = loaded.manifest else {
        for d in &loaded.diagnostics {
            errln!("{d}");
        }
        errln!(
            "error: `{}` is invalid; fix it (see `npc validate`) before serving",
            loaded.source.name()
        );
        return Ok(Exit::Failed);
    };
    // Logs go to stderr only: stdout belongs to the protocol.
    let filter = std::env::var("NPC_LOG").unwrap_or_else(|_| "warn".to_string());
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .log_internal_errors(false)
        .try_init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let result = rt.block_on(async move {
        // Contained like the daemon's: every upstream server's process
        // group dies with the gateway, even when it is killed.
        let (bus, supervisor, _supervisor_events) = super::standalone_recording(&paths, &manifest)?;
        let pool = Arc::new(Pool::new(
            &manifest,
            paths.root.clone(),
            paths.state_dir.clone(),
            supervisor.clone(),
        ));
        for failure in pool.connect_all().await {
            errln!("warning: {failure}");
            let _ = bus
                .publish(
                    NewEvent::new(
                        SERVER_FAILED_EVENT,
                        json!({ "server": failure.server(), "reason": failure.to_string() }),
                    )
                    .for_component(ComponentId::new(Kind::McpServer, failure.server()).to_string()),
                )
                .await;
        }
        let sweeper = {
            let pool = pool.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(IDLE_SWEEP_INTERVAL);
                loop {
                    tick.tick().await;
                    pool.sweep_idle().await;
                }
            })
        };
        let builtins = Arc::new(Builtins::standard(
            &NpcContext {
                paths: paths.clone(),
            },
            &manifest.mcp_builtins,
        ));
        let gateway = Gateway::new(Arc::new(
            CallPath::new(pool.clone(), Some(bus.clone())).with_builtins(builtins),
        ));
        let served = match args.http {
            None => serve_stdio(gateway).await,
            Some(addr) => serve_http(addr, gateway).await,
        };
        sweeper.abort();
        pool.shutdown().await;
        supervisor.shutdown().await;
        bus.shutdown().await;
        served
    });
    match result {
        Ok(exit) => Ok(exit),
        Err(e) => {
            errln!("error: {e:#}");
            Ok(Exit::Failed)
        }
    }
}

/// Ends on SIGINT or SIGTERM.
async fn terminated() -> anyhow::Result<()> {
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    tokio::select! {
        _ = interrupt.recv() => {}
        _ = terminate.recv() => {}
    }
    Ok(())
}

async fn serve_stdio(gateway: Gateway) -> anyhow::Result<Exit> {
    let service = match gateway.serve(rmcp::transport::stdio()).await {
        Ok(service) => service,
        // The client left before initializing: nothing went wrong here.
        Err(rmcp::service::ServerInitializeError::ConnectionClosed(_)) => return Ok(Exit::Ok),
        Err(e) => {
            return Err(anyhow::Error::new(e).context("the MCP client on stdin did not initialize"));
        }
    };
    let cancel = service.cancellation_token();
    tokio::select! {
        quit = service.waiting() => { quit.context("the gateway's session task failed")?; }
        signalled = terminated() => { signalled?; cancel.cancel(); }
    }
    Ok(Exit::Ok)
}

async fn serve_http(addr: SocketAddr, gateway: Gateway) -> anyhow::Result<Exit> {
    let listener = match McpHttpListener::bind(addr).await {
        Ok(l) => l,
        Err(e @ (McpHttpError::NotLoopback { .. } | McpHttpError::Bind { .. })) => {
            errln!("error: {e}");
            return Ok(Exit::Usage);
        }
        Err(e) => return Err(e.into()),
    };
    if let Some(bound) = listener.local_addr() {
        errln!("npc mcp serve: listening on http://{bound}{MCP_HTTP_PATH}");
    }
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(listener.serve(gateway, shutdown.clone()));
    terminated().await?;
    shutdown.cancel();
    server.await??;
    Ok(Exit::Ok)
}
