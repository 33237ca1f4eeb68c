//! `npc acp [--profile NAME]`: npc as an Agent Client Protocol agent on
//! stdio for editors (see `crate::acp`). stdout carries only protocol
//! frames; errors before the protocol starts and every log line go to
//! stderr (`NPC_LOG` sets the filter). Ends with 0 when the editor closes
//! stdin or on SIGINT/SIGTERM (running prompts are cancelled, their agents'
//! process groups killed).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use tokio::signal::unix::{SignalKind, signal};

use super::Exit;

#[derive(Debug, Args)]
pub struct AcpArgs {
    /// The profile sessions run (default: the manifest's only profile, or one named `default`)
    #[arg(long, value_name = "NAME")]
    profile: Option<String>,
    /// Stop each prompt's run after this many seconds (default 1800)
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=u64::from(u32::MAX)))]
    timeout: Option<u64>,
    /// Manifest file (default: npcagent.toml, else npcagent.json, in the current directory or the nearest one above it in the repository; or `NPC_MANIFEST`)
    #[arg(long, short = 'm')]
    manifest: Option<PathBuf>,
}

/// Where the sessions live: with `[store] url`, the fleet's PostgreSQL
/// (every machine of the fleet shares them; unreachable, `npc acp` does
/// not start), else this repository's store.
async fn sessions_store(
    manifest: &crate::model::Manifest,
    paths: &crate::runtime::RepoPaths,
    supervisor: &crate::supervisor::Supervisor,
    store: &Arc<crate::store::Store>,
) -> anyhow::Result<Arc<dyn crate::store::acp::AcpSessions>> {
    let Some(url) = manifest.store.url.as_ref() else {
        return Ok(store.clone());
    };
    let project = manifest.project.name.as_deref();
    let fleet = crate::runs::fleet::fleet_name(supervisor, &paths.root, project).await;
    match crate::store::pg::PgStore::connect(url.expose(), &fleet).await {
        Ok(shared) => Ok(Arc::new(shared)),
        Err(e) => Err(anyhow::anyhow!(
            "cannot reach the fleet's store, where the sessions of `npc acp` live with `[store] url`: {e}"
        )),
    }
}

pub fn run(args: AcpArgs) -> anyhow::Result<Exit> {
    let path = super::manifest_path(args.manifest.clone())?;
    let paths = crate::runtime::RepoPaths::resolve(&path, &crate::runtime::state_dir_hint(&path))?;
    let Some(manifest) = super::valid_manifest(&paths.manifest, "before serving ACP")? else {
        return Ok(Exit::Failed);
    };
    let profile = match crate::acp::choose_profile(&manifest, args.profile.as_deref()) {
        Ok(p) => p,
        Err(e) => {
            errln!("error: {e}");
            return Ok(Exit::Usage);
        }
    };
    // Logs go to stderr only: stdout belongs to the protocol.
    super::log_to_stderr("warn");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let result = rt.block_on(async move {
        let mut interrupt = signal(SignalKind::interrupt())?;
        let mut terminate = signal(SignalKind::terminate())?;
        // Contained like `npc run`'s: every agent's process group dies with
        // npc, even when it is killed.
        let (bus, supervisor, _supervisor_events) = super::standalone_recording(&paths, &manifest)?;
        let store = bus.store().clone();
        let sessions = sessions_store(&manifest, &paths, &supervisor, &store).await?;
        let hooks = Arc::new(crate::hooks::HookRunner::new(
            crate::hooks::HookSet::for_repository(&paths.root, &manifest),
            supervisor.clone(),
            Some(bus.clone()),
        ));
        let config = crate::acp::Config {
            manifest,
            root: paths.root.clone(),
            profile,
            store,
            sessions,
            host: crate::runs::fleet::host_name(),
            bus: bus.clone(),
            supervisor,
            hooks,
            timeout: args
                .timeout
                .map_or(crate::runs::DEFAULT_RUN_TIMEOUT, Duration::from_secs),
            daemon: Some(paths.clone()),
        };
        let (stdin, stdout) = crate::surfaces::stdio::std_streams();
        // A signal stops serving the way a closed stdin does: running
        // prompts are cancelled first (a daemon's runs too, through it).
        let stop = async move {
            tokio::select! {
                _ = interrupt.recv() => {}
                _ = terminate.recv() => {}
            }
        };
        let served = crate::acp::serve(config, stdin, stdout, stop).await;
        bus.shutdown().await;
        served.map_err(anyhow::Error::from)
    });
    // A read of stdin may still be blocked in the runtime's pool.
    rt.shutdown_background();
    match result {
        Ok(()) => Ok(Exit::Ok),
        Err(e) => {
            errln!("error: {e:#}");
            Ok(Exit::Failed)
        }
    }
}
