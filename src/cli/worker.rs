//! `npc worker` and `npc store migrate`: a machine of a fleet. A worker
//! joins the fleet of the repository it is started in (the manifest's
//! project name and the repository's remote URL) on the store `[store] url`
//! names, and carries out the runs it claims there through this process's
//! own executor (`runs::fleet::Worker`), up to `[runs] max_concurrent` at
//! once, until SIGINT or SIGTERM. `npc store migrate` brings that store's
//! schema to this npc's version; every other command refuses another
//! version. `npc workers` lists the fleet's roster, `npc runs --fleet` its
//! runs and `npc events --fleet` its shared event log. The store's URL
//! holds a password: nothing here prints it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

use super::{Exit, Format};
use crate::runs::fleet::{Worker, WorkerSettings};
use crate::runtime::RepoPaths;
use crate::store::Event;
use crate::store::pg::PgStore;
use crate::store::queue::RunRow;

/// Where a worker's own store lives, under the state directory.
pub const WORKERS_DIR: &str = "workers";
/// How long `npc events --fleet --follow` waits for an append's
/// notification before it reads the log again (what a lost one costs), and
/// its pause after a failed read.
pub const FLEET_FOLLOW_POLL: Duration = Duration::from_secs(1);

#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// Manifest file (default: npcagent.toml, else npcagent.json, in the current directory or the nearest one above it in the repository; or `NPC_MANIFEST`)
    #[arg(long, short = 'm')]
    manifest: Option<PathBuf>,
    /// How long a claim holds without a heartbeat (a worker that stops
    /// renewing loses its runs after it); default: the manifest's
    /// `[store] lease_timeout`
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=crate::model::MAX_LEASE_TIMEOUT_SECS))]
    lease_secs: Option<u64>,
}

#[derive(Debug, Subcommand)]
pub enum StoreCommand {
    /// Bring the PostgreSQL store `[store] url` names to this npc's schema version
    Migrate {
        /// Manifest file (default: npcagent.toml, else npcagent.json, in the current directory or the nearest one above it in the repository; or `NPC_MANIFEST`)
        #[arg(long, short = 'm')]
        manifest: Option<PathBuf>,
    },
}

/// The store URL of the manifest at `path`, or `None` (after saying why).
fn store_url(
    path: &std::path::Path,
    before: &str,
) -> anyhow::Result<Option<(crate::model::Manifest, String)>> {
    let Some(manifest) = super::valid_manifest(path, before)? else {
        return Ok(None);
    };
    let Some(url) = manifest.store.url.as_ref().map(|u| u.expose().to_string()) else {
        errln!(
            "error: `{}` has no `[store] url`; add `[store]` with `url = \"${{NPC_STORE_URL}}\"` naming a PostgreSQL store",
            path.display()
        );
        return Ok(None);
    };
    Ok(Some((manifest, url)))
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

pub fn store(command: StoreCommand) -> anyhow::Result<Exit> {
    let StoreCommand::Migrate { manifest } = command;
    let path = super::manifest_path(manifest)?;
    let Some((_, url)) = store_url(&path, "before migrating its store")? else {
        return Ok(Exit::Failed);
    };
    match runtime()?.block_on(crate::store::pg::migrate(&url)) {
        Ok((from, to)) if from == to => {
            outln!("the store is at schema version {to}; nothing to do")?;
            Ok(Exit::Ok)
        }
        Ok((from, to)) => {
            outln!("the store was migrated from schema version {from} to {to}")?;
            Ok(Exit::Ok)
        }
        Err(e) => {
            errln!("error: {e}");
            Ok(Exit::Failed)
        }
    }
}

pub fn worker(args: WorkerArgs) -> anyhow::Result<Exit> {
    super::log_to_stderr("info");
    let path = super::manifest_path(args.manifest)?;
    let Some((manifest, url)) = store_url(&path, "before starting a worker")? else {
        return Ok(Exit::Failed);
    };
    let paths = RepoPaths::resolve(&path, &manifest.project.state_dir)?;
    let process = crate::runs::this_process().unwrap_or_else(|| std::process::id().to_string());
    let host = crate::runs::fleet::host_name();
    let rt = runtime()?;
    rt.block_on(async move {
        let (bus, supervisor, mut supervisor_events) = {
            let own = RepoPaths {
                state_dir: paths
                    .state_dir
                    .join(WORKERS_DIR)
                    .join(process.replace(':', "-")),
                ..paths.clone()
            };
            super::standalone_recording(&own, &manifest)?
        };
        tokio::spawn(async move { while supervisor_events.recv().await.is_some() {} });
        let fleet = crate::runs::fleet::fleet_name(
            &supervisor,
            &paths.root,
            manifest.project.name.as_deref(),
        )
        .await;
        let store = match PgStore::connect(&url, &fleet).await {
            Ok(store) => Arc::new(store),
            Err(e) => {
                errln!("error: cannot join the fleet: {e}");
                return Ok(Exit::Failed);
            }
        };
        let local = bus.store().clone();
        let cx = crate::driver::DriverContext {
            repo: paths.root.clone(),
            state_dir: paths.state_dir.clone(),
            supervisor,
        };
        let mirror =
            crate::runs::mirror::Mirror::of(cx.supervisor.clone(), &paths.root, &paths.state_dir)
                .await
                .map(Arc::new);
        let remote = mirror.as_ref().map(|m| m.remote().to_string());
        let runs = crate::runs::Runs::new(cx, local.clone(), bus);
        if let Some(mirror) = mirror {
            runs.set_mirror(mirror);
        }
        runs.set_manifest(&manifest);
        for (name, trigger) in &manifest.triggers {
            runs.set_trigger(name, trigger);
        }
        let id = format!("{host}/{process}");
        let worker = Worker::new(
            store.clone(),
            Some(store as Arc<dyn crate::store::fleet::Roster>),
            local,
            runs,
            WorkerSettings {
                id: id.clone(),
                host,
                lease: Duration::from_secs(
                    args.lease_secs.unwrap_or(manifest.store.lease_timeout_secs),
                ),
                max_concurrent: manifest.runs.max_concurrent,
                remote,
            },
        );
        let stop = CancellationToken::new();
        let mut interrupt = signal(SignalKind::interrupt())?;
        let mut terminate = signal(SignalKind::terminate())?;
        let stopping = stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = interrupt.recv() => {}
                _ = terminate.recv() => {}
            }
            stopping.cancel();
        });
        errln!(
            "worker `{}` joined fleet `{}`",
            crate::stdx::term::printable(&id),
            crate::stdx::term::printable(&fleet)
        );
        worker.serve(stop).await;
        errln!("worker `{}` stopped", crate::stdx::term::printable(&id));
        Ok(Exit::Ok)
    })
}

/// The shared store of the fleet of the manifest at `manifest` (after
/// saying why not: no `[store] url`, unreachable), the fleet's name, and
/// the runtime to ask it on.
fn open_fleet(
    manifest: Option<PathBuf>,
    before: &str,
) -> anyhow::Result<Option<(tokio::runtime::Runtime, String, PgStore)>> {
    let path = super::manifest_path(manifest)?;
    let Some((manifest, url)) = store_url(&path, before)? else {
        return Ok(None);
    };
    let paths = RepoPaths::resolve(&path, &manifest.project.state_dir)?;
    let rt = runtime()?;
    let opened = rt.block_on(async {
        let (events, _) = tokio::sync::mpsc::unbounded_channel();
        let supervisor = crate::supervisor::Supervisor::new(events, Default::default());
        let project = manifest.project.name.as_deref();
        let fleet = crate::runs::fleet::fleet_name(&supervisor, &paths.root, project).await;
        PgStore::connect(&url, &fleet)
            .await
            .map(|store| (fleet, store))
    });
    match opened {
        Ok((fleet, store)) => Ok(Some((rt, fleet, store))),
        Err(e) => {
            errln!("error: cannot reach the fleet's store: {e}");
            Ok(None)
        }
    }
}

/// `npc runs --fleet`: the fleet's runs from its shared store (of
/// `trigger` only, when given), newest first; `None` after saying why not.
pub fn fleet_runs(
    manifest: Option<PathBuf>,
    trigger: Option<&str>,
    limit: usize,
) -> anyhow::Result<Option<Vec<RunRow>>> {
    let Some((rt, _, store)) = open_fleet(manifest, "before listing the fleet's runs")? else {
        return Ok(None);
    };
    match rt.block_on(store.run_rows(trigger, limit)) {
        Ok(rows) => Ok(Some(rows)),
        Err(e) => {
            errln!("error: cannot read the fleet's runs: {e}");
            Ok(None)
        }
    }
}

/// `npc runs show ID --fleet`: run `id` of the fleet's shared store and its
/// events there (at most `max_events`); `None` after saying why not.
pub fn fleet_run(
    manifest: Option<PathBuf>,
    id: &str,
    max_events: usize,
) -> anyhow::Result<Option<(Option<RunRow>, Vec<Event>)>> {
    let Some((rt, _, store)) = open_fleet(manifest, "before showing a run of the fleet")? else {
        return Ok(None);
    };
    let component = crate::runs::component(id);
    let read = rt.block_on(async {
        let row = crate::store::fleet::FleetQueue::run(&store, id).await?;
        let events = store.event_page(0, max_events, Some(&component)).await?;
        Ok::<_, crate::store::StoreError>((row, events))
    });
    match read {
        Ok(found) => Ok(Some(found)),
        Err(e) => {
            errln!("error: cannot read the fleet's run: {e}");
            Ok(None)
        }
    }
}

/// `npc events --fleet`: the fleet's shared event log after `since`, in
/// the store's order (every worker's and daemon's events); with `follow`,
/// then each event appended, woken by `LISTEN/NOTIFY` (a lost notification
/// costs [`FLEET_FOLLOW_POLL`]), through outages of the store, until
/// interrupted.
pub fn fleet_events(
    manifest: Option<PathBuf>,
    since: Option<i64>,
    follow: bool,
    format: Format,
) -> anyhow::Result<Exit> {
    let Some((rt, _, store)) = open_fleet(manifest, "before reading the fleet's events")? else {
        return Ok(Exit::Failed);
    };
    let page = crate::runtime::daemon::EVENTS_PAGE;
    let mut after = since.unwrap_or(0).max(0);
    let mut failing = false;
    rt.block_on(async {
        loop {
            let read = if follow {
                store.wait_for_events(after, page, FLEET_FOLLOW_POLL).await
            } else {
                store.event_page(after, page, None).await
            };
            let events = match read {
                Ok(events) => events,
                Err(e) if follow => {
                    if !failing {
                        errln!("warning: cannot read the fleet's events: {e}; retrying");
                    }
                    failing = true;
                    tokio::time::sleep(FLEET_FOLLOW_POLL).await;
                    continue;
                }
                Err(e) => {
                    errln!("error: cannot read the fleet's events: {e}");
                    return Ok(Exit::Failed);
                }
            };
            if failing {
                errln!("the fleet's store answers again");
                failing = false;
            }
            if events.is_empty() && !follow {
                return Ok(Exit::Ok);
            }
            for event in &events {
                after = event.id;
                super::reconcile::print_event(&serde_json::to_value(event)?, format)?;
            }
        }
    })
}

/// `npc workers`: the roster of this repository's fleet.
pub fn workers(manifest: Option<PathBuf>, format: Format) -> anyhow::Result<Exit> {
    let Some((rt, fleet, store)) = open_fleet(manifest, "before listing its workers")? else {
        return Ok(Exit::Failed);
    };
    let rows = match rt.block_on(crate::store::fleet::Roster::workers(&store)) {
        Ok(rows) => rows,
        Err(e) => {
            errln!("error: cannot read the fleet's workers: {e}");
            return Ok(Exit::Failed);
        }
    };
    match format {
        Format::Json => outln!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "fleet": fleet, "workers": rows }))?
        )?,
        Format::Human => {
            outln!("fleet {}", crate::stdx::term::printable(&fleet))?;
            if rows.is_empty() {
                outln!("no workers; start one with `npc worker`")?;
            }
            for w in &rows {
                let state = match w.state {
                    crate::store::fleet::WorkerState::Alive => "alive",
                    crate::store::fleet::WorkerState::Lost => "LOST",
                    crate::store::fleet::WorkerState::Stopped => "stopped",
                };
                let running = if w.running.is_empty() {
                    "idle".to_string()
                } else {
                    format!("running {}", w.running.join(", "))
                };
                outln!(
                    "{}  {state}  host {}  npc {}  heartbeat {:.1}s ago  {running}",
                    crate::stdx::term::printable(&w.id),
                    crate::stdx::term::printable(&w.host),
                    crate::stdx::term::printable(&w.version),
                    w.heartbeat_age_ms as f64 / 1000.0,
                )?;
            }
        }
    }
    Ok(Exit::Ok)
}
