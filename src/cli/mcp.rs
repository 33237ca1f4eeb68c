//! `npc mcp serve [--http ADDR]`: the MCP gateway (npc's built-in tools,
//! `mcp::builtin`, ahead of the upstream ones). When a daemon runs for
//! the repository it is a thin front to the daemon's pool: on stdio it pipes
//! MCP frames over an upgraded control connection, with `--http` it serves
//! HTTP and relays each session over its own upgraded connection (no second
//! copy of any server; the daemon records every call). Without a daemon it
//! runs its own pool from the manifest, connecting every enabled server at
//! start (all at once, each within its `startup_timeout_ms`). Stdout carries
//! only protocol frames; logs go to stderr. HTTP listens on loopback; a
//! non-loopback address needs `daemon.allow_remote = true` and
//! `daemon.token_env` naming a set variable, and then (as whenever that
//! token is set) every request needs `Authorization: Bearer <token>`.
//! Exit codes: 0 clean (stdin closed, SIGINT/SIGTERM), 1 unexpected failure
//! or invalid manifest, 2 usage.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

use super::Exit;
use crate::mcp::builtin::Builtins;
use crate::mcp::client::pool::IDLE_SWEEP_INTERVAL;
use crate::mcp::server::catalog::ManifestPrompts;
use crate::mcp::server::relay;
use crate::mcp::server::shortcut::HttpSessions;
use crate::mcp::{CallPath, Gateway, Pool};
use crate::model;
use crate::runtime::npc_tools::{NpcContext, NpcGroup};
use crate::surfaces::control::connect_mcp;
use crate::surfaces::mcp_http::{Access, MCP_HTTP_PATH, McpHttpError, McpHttpListener, Shortcut};
use tokio::io::AsyncWriteExt as _;

#[derive(Debug, Subcommand)]
pub enum McpCommand {
    /// Serve the repository's MCP servers' tools as one MCP server (stdio by default)
    Serve(ServeArgs),
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Serve streamable HTTP on this address (e.g. 127.0.0.1:8767) instead of stdio; non-loopback needs `daemon.allow_remote` and `daemon.token_env`
    #[arg(long, value_name = "ADDR")]
    http: Option<SocketAddr>,
    /// Manifest file (default: npcagent.toml, else npcagent.json, in the current directory or the nearest one above it in the repository; or `NPC_MANIFEST`)
    #[arg(long, short = 'm')]
    manifest: Option<PathBuf>,
    /// Name upstream tools and prompts `always` SERVER__NAME, or only `on_conflict` (overrides `mcp.prefix`; needs no daemon running)
    #[arg(long, value_name = "WHEN", value_parser = ["always", "on_conflict"])]
    prefix: Option<String>,
    /// List `all` tools, or only `search` (`search_tools` and `call_tool`; overrides `mcp.tools`; needs no daemon running)
    #[arg(long, value_name = "WHICH", value_parser = ["all", "search"])]
    tools: Option<String>,
}

pub fn run(command: McpCommand) -> anyhow::Result<Exit> {
    match command {
        McpCommand::Serve(args) => serve(args),
    }
}

/// Who may use the HTTP gateway: the repository's credential
/// (`RepoPaths::access`: its token, or the one `daemon.token_env` names; none
/// with `daemon.auth = "none"`), and beyond loopback only where the manifest
/// allows remote access and names a token.
fn http_access(
    addr: SocketAddr,
    daemon: &model::Daemon,
    paths: &crate::runtime::RepoPaths,
) -> Result<Access, String> {
    if !addr.ip().is_loopback() {
        if !daemon.allow_remote {
            return Err(format!(
                "`{addr}` is not a loopback address, and the manifest does not allow remote access; serving MCP beyond this machine needs `daemon.allow_remote = true` and `daemon.token_env` in the manifest, or listen on 127.0.0.1"
            ));
        }
        match &daemon.token_env {
            None => {
                return Err(format!(
                    "`{addr}` is not a loopback address and no token is configured; set `daemon.token_env` to the variable holding the bearer token clients must send"
                ));
            }
            Some(var) if !matches!(Access::from_token_env(Some(var)), Access::Token(_)) => {
                return Err(format!(
                    "`{addr}` is not a loopback address and `{var}` (named by `daemon.token_env`) is not set; export the bearer token in it before serving"
                ));
            }
            Some(_) => {}
        }
    }
    paths.access(daemon).map_err(|e| e.to_string())
}

/// The repository a worktree run's processes belong to (npc sets it): the
/// gateway an agent starts in a worktree is the repository's.
use crate::runs::agent::REPO_ROOT_ENV;
/// The run an agent's `npc mcp serve` belongs to (npc sets it on every
/// process of a run).
use crate::runs::agent::RUN_ID_ENV;

fn serve(args: ServeArgs) -> anyhow::Result<Exit> {
    // An agent working in a run's worktree starts its gateway there; the
    // manifest, the daemon and the state are the repository's.
    let manifest = args.manifest.or_else(|| {
        let root = PathBuf::from(std::env::var_os(REPO_ROOT_ENV)?);
        crate::model::MANIFEST_NAMES
            .iter()
            .map(|name| root.join(name))
            .find(|p| p.is_file())
    });
    let path = super::manifest_path(manifest)?;
    let paths = crate::runtime::RepoPaths::resolve(&path, &crate::runtime::state_dir_hint(&path))?;
    let Some(mut manifest) = super::valid_manifest(&paths.manifest, "before serving")? else {
        return Ok(Exit::Failed);
    };
    let one_off = args.prefix.is_some() || args.tools.is_some();
    if let Some(prefix) = args.prefix.as_deref().and_then(model::Prefix::parse) {
        manifest.mcp.prefix = prefix;
    }
    if let Some(tools) = args.tools.as_deref().and_then(model::ToolListing::parse) {
        manifest.mcp.tools = tools;
    }
    let access = match args
        .http
        .map(|addr| http_access(addr, &manifest.daemon, &paths))
    {
        Some(Err(refusal)) => {
            errln!("error: {refusal}");
            return Ok(Exit::Usage);
        }
        Some(Ok(access)) => Some(access),
        None => None,
    };
    // Logs go to stderr only: stdout belongs to the protocol.
    super::log_to_stderr("warn");
    if args.http.is_some() {
        crate::runtime::daemon::raise_open_files_limit();
    }
    // One thread runs the sessions (over stdio one, over HTTP many) and the
    // upstream sessions they wait on, so no answer crosses threads and no
    // worker wakes another to share a call: over HTTP that halves the
    // context switches per call (`benches/scripts/http_floor.py`). Built-ins
    // do their blocking work on the blocking pool.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    if let Some((socket, pid)) = super::reconcile::daemon_socket(&paths) {
        if one_off {
            errln!(
                "error: the daemon (pid {pid}) serves this repository's gateway with the manifest's `[mcp] prefix` and `tools`; set them there (the daemon applies the change), or stop the daemon to use `--prefix` and `--tools`"
            );
            return Ok(Exit::Usage);
        }
        let result = rt.block_on(async move {
            match (args.http, access) {
                (Some(addr), Some(access)) => front_http(addr, access, socket).await,
                _ => front_stdio(&socket, pid).await,
            }
        });
        // A read of stdin may still be blocked in the runtime's pool.
        rt.shutdown_background();
        return match result {
            Ok(exit) => Ok(exit),
            Err(e) => {
                errln!("error: {e:#}");
                Ok(Exit::Failed)
            }
        };
    }
    let result = rt.block_on(async move {
        // Contained like the daemon's: every upstream server's process
        // group dies with the gateway, even when it is killed.
        // In a sandboxed run npc's state is read-only: what the gateway
        // records goes over the run's channel (`surfaces::channel`).
        let (bus, supervisor, _supervisor_events, _spool) = match sandboxed_channel()? {
            Some(client) => channel_recording(&paths, &manifest, client)?,
            None => {
                let (bus, supervisor, events) = super::standalone_recording(&paths, &manifest)?;
                (bus, supervisor, events, None)
            }
        };
        // The upstream servers' logs go to the state directory, which a
        // sandboxed run cannot write: there they go to the run's `TMPDIR`.
        let log_root = match &_spool {
            Some(spool) => spool.logs(),
            None => paths.state_dir.clone(),
        };
        let pool = Arc::new(
            Pool::new(
                &manifest,
                paths.root.clone(),
                log_root,
                supervisor.clone(),
            )
            .with_events(bus.clone()),
        );
        // Each failure is also an `mcp.server_failed` event (the pool records it).
        for failure in pool.connect_all().await {
            errln!("warning: {failure}");
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
            &paths.root,
            &manifest.mcp_builtins,
            Arc::new(NpcGroup::new(NpcContext::new(paths.clone()))),
        ));
        let mut hooks = crate::hooks::HookRunner::new(
            crate::hooks::HookSet::for_repository(&paths.root, &manifest),
            supervisor.clone(),
            Some(bus.clone()),
        );
        // A gateway an agent of `npc acp` started asks its editor on `ask`.
        // Without one (no daemon behind this gateway), an ask is a recorded denial.
        match crate::hooks::approve::SocketApprover::from_env() {
            Some(approver) => hooks = hooks.with_approver(Arc::new(approver)),
            None => {
                hooks = hooks.with_approver(Arc::new(crate::hooks::park::NoOneToAsk {
                    bus: Some(bus.clone()),
                    run_id: std::env::var(RUN_ID_ENV)
                        .ok()
                        .filter(|r| crate::runs::workspace::is_run_id(r)),
                    profile: std::env::var(crate::hooks::policy::PROFILE_ENV).ok(),
                    why: "no daemon runs for this repository, so nobody can be asked; start `npc daemon` (then `npc runs approve ID` answers), run the agent through `npc acp`, or change the rule that asks".to_string(),
                }));
            }
        }
        // A gateway an agent of a profile started applies its `ask_tools`.
        if let Some(policy) = crate::hooks::policy::ToolPolicy::from_env(&manifest) {
            hooks = hooks.with_policy(policy);
        }
        let hooks = Arc::new(hooks);
        let gateway = Gateway::new(Arc::new(
            CallPath::new(pool.clone(), Some(bus.clone()))
                .with_builtins(builtins)
                .with_listing(manifest.mcp.tools)
                .with_stage(Arc::new(crate::hooks::stage::HookStage::new(hooks))),
        ))
        .with_manifest_prompts(ManifestPrompts {
            manifest: Arc::new(manifest.clone()),
            root: paths.root.clone(),
        });
        let served = match (args.http, access) {
            (Some(addr), Some(access)) => serve_http(addr, access, gateway).await,
            _ => serve_stdio(gateway).await,
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

/// The channel of the sandboxed run this gateway serves; `None` outside one.
fn sandboxed_channel() -> anyhow::Result<Option<crate::surfaces::channel::ChannelClient>> {
    use crate::surfaces::channel::{ChannelClient, ChannelError};
    if !ChannelClient::given() {
        return Ok(None);
    }
    let run = std::env::var(RUN_ID_ENV)
        .ok()
        .filter(|r| crate::runs::workspace::is_run_id(r))
        .ok_or(ChannelError::Unset)?;
    Ok(Some(ChannelClient::from_env(&run)?))
}

/// A gateway's spool in a sandboxed run's temporary directory: its events
/// are recorded here first, then sent to the run's owner; removed when
/// dropped.
struct Spool(PathBuf);

impl Spool {
    /// Where the upstream servers of a sandboxed gateway log (`logs/`
    /// below it), beside the spool in the run's `TMPDIR`.
    fn logs(&self) -> PathBuf {
        use std::os::unix::fs::DirBuilderExt as _;
        let mut dir = self.0.clone().into_os_string();
        dir.push(".state");
        let dir = PathBuf::from(dir);
        // Private, and made here (the guarded layer opens logs below an
        // existing root); a failure shows when a server's log cannot open.
        let _ = std::fs::DirBuilder::new().mode(0o700).create(&dir);
        dir
    }
}

impl Drop for Spool {
    fn drop(&mut self) {
        for side in ["", "-wal", "-shm", "-journal"] {
            let mut path = self.0.clone().into_os_string();
            path.push(side);
            let _ = std::fs::remove_file(path);
        }
    }
}

/// The kinds a sandboxed gateway sends its run's owner (what the owner
/// takes, `runs::channel`).
const SENT_KINDS: [&str; 3] = ["mcp.tool_call", "hook.call", "tool.denied"];

/// Recording for a gateway in a sandboxed run: a bus over a spool in the
/// run's `TMPDIR`, each event of [`SENT_KINDS`] sent on to the run's owner
/// over `client`.
#[allow(clippy::type_complexity)]
fn channel_recording(
    paths: &crate::runtime::RepoPaths,
    manifest: &crate::model::Manifest,
    client: crate::surfaces::channel::ChannelClient,
) -> anyhow::Result<(
    crate::bus::EventBus,
    crate::supervisor::Supervisor,
    tokio::sync::mpsc::UnboundedReceiver<crate::supervisor::SupervisorEvent>,
    Option<Spool>,
)> {
    let spool = Spool(std::env::temp_dir().join(format!("npc-mcp-{}.db", std::process::id())));
    let store = Arc::new(
        crate::store::Store::open(&spool.0)
            .with_context(|| format!("cannot open the spool `{}`", spool.0.display()))?,
    );
    let bus = crate::bus::EventBus::new(store);
    bus.set_secrets(manifest.secret_values());
    bus.subscribe(
        "npcagent.run_channel",
        |e| SENT_KINDS.contains(&e.kind.as_str()),
        move |e: Arc<crate::store::Event>| {
            let client = client.clone();
            async move {
                let event: crate::event::Event = serde_json::from_value(
                    serde_json::json!({"kind": e.kind, "payload": e.payload}),
                )
                .map_err(|e| format!("an event cut for size is not sent: {e}"))?;
                client
                    .record(vec![event])
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            }
        },
    )?;
    let (events, receiver) = tokio::sync::mpsc::unbounded_channel();
    let supervisor = crate::supervisor::Supervisor::for_npc(
        events,
        crate::supervisor::BackoffPolicy::default(),
        &paths.root,
        &paths.runtime_dir(),
    );
    Ok((bus, supervisor, receiver, Some(spool)))
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
    let (stdin, stdout) = crate::surfaces::stdio::std_streams();
    // A task, not the `block_on` future: the current-thread runtime polls
    // that future only after a zero-timeout poll of the driver whenever a
    // task wakes it, which would cost a syscall per upstream answer.
    let run = std::env::var(RUN_ID_ENV)
        .ok()
        .filter(|r| crate::runs::workspace::is_run_id(r));
    let session = crate::mcp::server::session::serve(gateway, stdin, stdout, None);
    let mut session = tokio::spawn(crate::mcp::call::for_run(run, session));
    tokio::select! {
        served = &mut session => {
            served
                .context("the MCP session's task failed")?
                .context("the MCP session on stdin/stdout failed")?;
        }
        signalled = terminated() => {
            session.abort();
            signalled?;
        }
    }
    Ok(Exit::Ok)
}

/// Bind the HTTP listener for `access`; `Err(exit)` when the address is refused.
async fn bind_http(
    addr: SocketAddr,
    access: Access,
) -> anyhow::Result<Result<McpHttpListener, Exit>> {
    let listener = match McpHttpListener::bind_with(addr, access).await {
        Ok(l) => l,
        Err(e @ (McpHttpError::NotLoopback { .. } | McpHttpError::Bind { .. })) => {
            errln!("error: {e}");
            return Ok(Err(Exit::Usage));
        }
        Err(e) => return Err(e.into()),
    };
    if let Some(bound) = listener.local_addr() {
        errln!("npc mcp serve: listening on http://{bound}{MCP_HTTP_PATH}");
    }
    Ok(Ok(listener))
}

async fn serve_http(addr: SocketAddr, access: Access, gateway: Gateway) -> anyhow::Result<Exit> {
    let listener = match bind_http(addr, access).await? {
        Ok(l) => l,
        Err(exit) => return Ok(exit),
    };
    let shutdown = CancellationToken::new();
    let sessions = Arc::new(HttpSessions::new(gateway.call_path().clone()));
    let gateway = gateway.with_http_sessions(sessions.clone());
    let shortcut: Arc<dyn Shortcut> = sessions;
    let server = tokio::spawn(listener.serve_with(
        move || gateway.clone(),
        Some(shortcut),
        shutdown.clone(),
    ));
    terminated().await?;
    shutdown.cancel();
    server.await??;
    Ok(Exit::Ok)
}

/// The MCP upgrade, naming the `npc acp` and the profile of the agent that
/// started this gateway (from its environment), so the daemon's hooks ask
/// that editor and apply that profile's `ask_tools`.
fn upgrade_request() -> crate::surfaces::control::Request {
    crate::surfaces::control::Request::Mcp {
        approval: crate::surfaces::runs::ApprovalRoute::from_env(),
        profile: std::env::var(crate::hooks::policy::PROFILE_ENV).ok(),
        run: std::env::var(RUN_ID_ENV)
            .ok()
            .filter(|r| crate::runs::workspace::is_run_id(r)),
        secret: crate::surfaces::channel::RunSecret::from_env(),
        confined: false,
    }
}

/// Front the daemon's pool on stdio: MCP frames are copied between this
/// process's stdin/stdout and an upgraded control connection.
async fn front_stdio(socket: &std::path::Path, pid: u32) -> anyhow::Result<Exit> {
    let (mut from_daemon, mut to_daemon) = connect_mcp(socket, &upgrade_request())
        .await
        .with_context(|| {
            format!("the daemon (pid {pid}) holds the repository but did not accept an MCP session")
        })?;
    tracing::info!("fronting the daemon's pool (pid {pid})");
    // When the client closes stdin, the daemon ends the session and then
    // its side of the connection, which ends `down`.
    let (mut stdin, mut stdout) = crate::surfaces::stdio::std_streams();
    let up = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut stdin, &mut to_daemon).await;
        let _ = to_daemon.shutdown().await;
    });
    let down = async {
        let _ = tokio::io::copy(&mut from_daemon, &mut stdout).await;
        let _ = stdout.flush().await;
    };
    tokio::select! {
        () = down => {}
        signalled = terminated() => signalled?,
    }
    up.abort();
    Ok(Exit::Ok)
}

/// Front the daemon's pool over HTTP: each HTTP session is relayed over its
/// own upgraded control connection.
async fn front_http(addr: SocketAddr, access: Access, socket: PathBuf) -> anyhow::Result<Exit> {
    let listener = match bind_http(addr, access).await? {
        Ok(l) => l,
        Err(exit) => return Ok(exit),
    };
    let connect: relay::Connect = Arc::new(move || {
        let socket = socket.clone();
        Box::pin(async move {
            let (read, write) = connect_mcp(&socket, &upgrade_request())
                .await
                .map_err(|e| e.to_string())?;
            Ok::<relay::Stream, String>((Box::new(read), Box::new(write)))
        })
    });
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(listener.serve_with(
        move || relay::Relay::new(connect.clone()),
        None,
        shutdown.clone(),
    ));
    terminated().await?;
    shutdown.cancel();
    server.await??;
    Ok(Exit::Ok)
}
