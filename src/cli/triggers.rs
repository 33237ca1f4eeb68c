//! `npc triggers`, `npc trigger fire NAME [--payload JSON]`, `npc runs` and
//! `npc runs show ID`: the triggers with their next fire times, routes and
//! watched paths and recent runs; a firing by hand through the daemon's run
//! queue; the runs of triggers and of `npc run`, and one run's events.
//! Listings read the store (and the daemon, when one runs); firing needs
//! the daemon, because only the daemon carries runs out.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::output::OutputError;
use super::reconcile::daemon_socket;
use super::{Exit, Format};
use crate::runtime::{self, RepoPaths};
use crate::stdx::term::printable;
use crate::store::Store;
use crate::surfaces::control::{Client, ControlError, Reply, Request};

/// Largest `--payload` accepted (it travels in one control request).
pub use crate::triggers::MAX_MANUAL_PAYLOAD_BYTES;
/// Runs `npc runs` lists unless `--limit` says otherwise.
pub const DEFAULT_RUNS_LIMIT: u64 = 50;
/// Events `npc runs show` prints at most.
pub const MAX_SHOWN_EVENTS: usize = 10_000;

#[derive(Debug, Subcommand)]
pub enum TriggerCommand {
    /// Fire a trigger by hand, through the daemon's run queue
    Fire {
        /// Trigger name (a `[triggers.NAME]` entry)
        name: String,
        /// JSON the action sees as the payload's `payload`
        #[arg(long, value_name = "JSON")]
        payload: Option<String>,
        /// Manifest file (default: npcagent.toml, else npcagent.json, in the current directory or the nearest one above it in the repository; or `NPC_MANIFEST`)
        #[arg(long, short = 'm')]
        manifest: Option<PathBuf>,
        /// Output: `human` (sentences and columns) or `json` (the exact data, for scripts)
        #[arg(long, value_enum, default_value_t)]
        format: Format,
    },
}

#[derive(Debug, Args)]
pub struct RunsArgs {
    #[command(subcommand)]
    show: Option<RunsCommand>,
    /// Only runs of this trigger
    #[arg(long, value_name = "NAME")]
    trigger: Option<String>,
    /// How many runs to list (newest first)
    #[arg(long, default_value_t = DEFAULT_RUNS_LIMIT, value_parser = clap::value_parser!(u64).range(1..=1000))]
    limit: u64,
    /// The fleet's runs from the shared store `[store] url` names (every
    /// worker's), each with the worker that holds or held it; with `show`,
    /// a run of the fleet and its events there
    #[arg(long, global = true)]
    fleet: bool,
    /// Manifest file (default: npcagent.toml, else npcagent.json, in the current directory or the nearest one above it in the repository; or `NPC_MANIFEST`)
    #[arg(long, short = 'm', global = true)]
    manifest: Option<PathBuf>,
    /// Output: `human` (sentences and columns) or `json` (the exact data, for scripts)
    #[arg(long, value_enum, default_value_t, global = true)]
    format: Format,
}

#[derive(Debug, Subcommand)]
enum RunsCommand {
    /// One run's events
    Show {
        /// The run id (`run-…`)
        id: String,
    },
    /// The patch a worktree run handed back: its branch against its base
    Diff {
        /// The run id (`run-…`)
        id: String,
    },
    /// Allow the tool call run ID waits on (its oldest pending approval);
    /// the run goes on
    Approve {
        /// The run id (`run-…`)
        id: String,
        /// The approval to answer (`approval_id` of its `run.waiting`
        /// event); answered already, nothing is answered
        #[arg(long, value_name = "APPROVAL")]
        approval: Option<String>,
        /// Also allow the run's later identical calls (same tool, equal
        /// arguments) without asking
        #[arg(long)]
        always: bool,
    },
    /// Deny the tool call run ID waits on (its oldest pending approval);
    /// the run goes on without it and ends `blocked`
    Deny {
        /// The run id (`run-…`)
        id: String,
        /// The approval to answer (`approval_id` of its `run.waiting`
        /// event); answered already, nothing is answered
        #[arg(long, value_name = "APPROVAL")]
        approval: Option<String>,
        /// Why (the agent and the run's `tool.denied` event show it)
        #[arg(long, value_name = "TEXT")]
        reason: Option<String>,
    },
    /// Remove the kept worktrees of finished runs past `[runs] keep_failed`
    /// or beyond `max_kept_worktrees` (their branches stay)
    Clean {
        /// Every kept worktree of a finished run, now
        #[arg(long)]
        all: bool,
    },
}

fn tokio() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

fn paths_of(manifest: Option<PathBuf>) -> anyhow::Result<RepoPaths> {
    let path = super::manifest_path(manifest)?;
    Ok(RepoPaths::resolve(&path, &runtime::state_dir_hint(&path))?)
}

/// The store, read-only, if it exists.
fn store_of(paths: &RepoPaths) -> anyhow::Result<Option<Store>> {
    Ok(runtime::open_existing_store(paths)?)
}

/// Print one human line quoting names, paths, details and payloads the
/// manifest, the daemon and the runs' agents wrote, controls escaped.
fn say(line: &str) -> Result<(), OutputError> {
    outln!("{}", printable(line))
}

use super::human::{span, when as time};

/// `npc triggers`.
pub fn list(manifest: Option<PathBuf>, format: Format) -> anyhow::Result<Exit> {
    let path = super::manifest_path(manifest)?;
    let loaded = runtime::load_manifest(&path)?;
    let Some(model) = loaded.manifest else {
        for d in &loaded.diagnostics {
            errln!("{d}");
        }
        errln!(
            "error: `{}` is invalid; fix it (see `npc validate`)",
            path.display()
        );
        return Ok(Exit::Failed);
    };
    let paths = RepoPaths::resolve(&path, &model.project.state_dir)?;
    let daemon = daemon_socket(&paths);
    let from_daemon: Vec<Value> = match &daemon {
        Some((socket, _)) => match tokio()?.block_on(Client::call(socket, &Request::Triggers))? {
            Reply::Triggers { triggers } => triggers,
            other => return Err(ControlError::unexpected(&other).into()),
        },
        None => Vec::new(),
    };
    let store = store_of(&paths)?;
    let rows = crate::api::listings::trigger_rows(&model, &from_daemon, store.as_ref())?;
    let source = match &daemon {
        Some((_, pid)) => format!("daemon pid {pid}"),
        None => "no daemon running; triggers fire only while `npc daemon` runs".to_string(),
    };
    match format {
        Format::Json => {
            outln!(
                "{}",
                serde_json::to_string_pretty(&json!({ "source": source, "triggers": rows }))?
            )?;
        }
        Format::Human => {
            outln!("{source}")?;
            if rows.is_empty() {
                outln!("no triggers; declare them under `[triggers.NAME]`")?;
            }
            for r in &rows {
                let state = match (r["enabled"].as_bool(), r["armed"].as_bool()) {
                    (Some(false), _) => "disabled",
                    _ if r["standby"] == true => "standby (another daemon of the fleet serves it)",
                    (_, Some(true)) => "armed",
                    _ => "not armed",
                };
                say(&format!(
                    "{}  {}  {state}  overlap {}",
                    r["name"].as_str().unwrap_or(""),
                    r["kind"].as_str().unwrap_or(""),
                    r["overlap"].as_str().unwrap_or("")
                ))?;
                match r["kind"].as_str() {
                    Some("cron") => {
                        say(&format!(
                            "    schedule  {} ({})",
                            r["schedule"].as_str().unwrap_or(""),
                            r["timezone"].as_str().unwrap_or("")
                        ))?;
                        let next: Vec<&str> = r["next_fire_times"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(|v| v.as_str())
                            .collect();
                        say(&format!(
                            "    next      {}",
                            if next.is_empty() {
                                "never".to_string()
                            } else {
                                next.join(", ")
                            }
                        ))?;
                    }
                    Some("webhook") => {
                        let url = r["url"]
                            .as_str()
                            .map_or_else(|| "(listener not bound)".to_string(), str::to_string);
                        say(&format!(
                            "    route     POST /webhooks/{}  {url}",
                            r["route"].as_str().unwrap_or("")
                        ))?;
                    }
                    _ => {
                        let watched: Vec<&str> = r["paths"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(|v| v.as_str())
                            .collect();
                        say(&format!("    watches   {}", watched.join(", ")))?;
                    }
                }
                for run in r["recent_runs"].as_array().into_iter().flatten() {
                    say(&format!(
                        "    run       {}  {}  {}",
                        run["id"].as_str().unwrap_or(""),
                        run["state"].as_str().unwrap_or(""),
                        time(run["enqueued_at_ms"].as_i64())
                    ))?;
                }
            }
        }
    }
    Ok(Exit::Ok)
}

/// `npc trigger …`.
pub fn trigger(command: TriggerCommand) -> anyhow::Result<Exit> {
    let TriggerCommand::Fire {
        name,
        payload,
        manifest,
        format,
    } = command;
    let payload = match payload {
        None => None,
        Some(text) if text.len() > MAX_MANUAL_PAYLOAD_BYTES => {
            errln!(
                "error: `--payload` is {} bytes; at most {MAX_MANUAL_PAYLOAD_BYTES} are accepted",
                text.len()
            );
            return Ok(Exit::Usage);
        }
        Some(text) => match serde_json::from_str::<Value>(&text) {
            Ok(v) => Some(v),
            Err(e) => {
                errln!(
                    "error: `--payload` is not JSON: {e}; pass a JSON value such as '{{\"ref\": \"main\"}}'"
                );
                return Ok(Exit::Usage);
            }
        },
    };
    let paths = paths_of(manifest)?;
    let Some((socket, pid)) = daemon_socket(&paths) else {
        errln!(
            "error: no daemon runs for this repository; start `npc daemon`, then fire `{name}` again"
        );
        return Ok(Exit::Failed);
    };
    let answer = match tokio()?.block_on(Client::call(
        &socket,
        &Request::FireTrigger {
            name: name.clone(),
            payload,
        },
    )) {
        Ok(Reply::Fired { fired }) => fired,
        Ok(other) => return Err(ControlError::unexpected(&other).into()),
        // The daemon answered with an error (an unknown trigger, a full queue).
        Err(ControlError::Refused(error)) => {
            errln!("error: {error}");
            return Ok(Exit::Failed);
        }
        Err(e) => {
            return Err(e).with_context(|| format!("the daemon (pid {pid}) did not answer"));
        }
    };
    match format {
        Format::Json => outln!("{answer}")?,
        Format::Human => say(&format!(
            "run {} {}",
            answer["run_id"].as_str().unwrap_or("?"),
            answer["outcome"].as_str().unwrap_or("?")
        ))?,
    }
    Ok(Exit::Ok)
}

/// `npc runs` and `npc runs show ID`.
pub fn runs(args: RunsArgs) -> anyhow::Result<Exit> {
    match args.show {
        Some(RunsCommand::Approve {
            id,
            approval,
            always,
        }) => {
            return answer(
                args.manifest,
                Request::ApproveRun {
                    id,
                    always,
                    approval,
                },
                args.format,
            );
        }
        Some(RunsCommand::Deny {
            id,
            approval,
            reason,
        }) => {
            return answer(
                args.manifest,
                Request::DenyRun {
                    id,
                    approval,
                    reason,
                },
                args.format,
            );
        }
        _ => {}
    }
    if args.fleet {
        return fleet_runs(args);
    }
    let paths = paths_of(args.manifest)?;
    let Some(store) = store_of(&paths)? else {
        if let Some(RunsCommand::Show { id } | RunsCommand::Diff { id }) = &args.show {
            errln!("error: no run `{id}`; nothing was recorded in this repository yet");
            return Ok(Exit::Failed);
        }
        if let Some(RunsCommand::Clean { .. }) = &args.show {
            match args.format {
                Format::Json => outln!("{}", json!({ "removed": [] }))?,
                Format::Human => outln!("no kept worktrees")?,
            }
            return Ok(Exit::Ok);
        }
        match args.format {
            Format::Json => outln!("[]")?,
            Format::Human => outln!("no runs yet")?,
        }
        return Ok(Exit::Ok);
    };
    match args.show {
        Some(RunsCommand::Show { id }) => return show(&store, &id, args.format),
        Some(RunsCommand::Diff { id }) => return diff(&paths, &store, &id),
        Some(RunsCommand::Clean { all }) => return clean(&paths, all, args.format),
        Some(RunsCommand::Approve { .. } | RunsCommand::Deny { .. }) | None => {}
    }
    let limit = usize::try_from(args.limit).unwrap_or(usize::MAX);
    // Every run is a row of the queue, whatever started it (`npc run`'s
    // too: origin `cli`).
    let rows = store.run_rows(args.trigger.as_deref(), limit)?;
    list_runs(
        &crate::api::listings::run_listings(&store, &rows)?,
        args.format,
    )
}

/// `npc runs approve ID` / `npc runs deny ID`: the answer goes through the
/// daemon (which owns the run and records the answer).
fn answer(manifest: Option<PathBuf>, request: Request, format: Format) -> anyhow::Result<Exit> {
    let paths = paths_of(manifest)?;
    let Some((socket, pid)) = daemon_socket(&paths) else {
        errln!(
            "error: no daemon runs for this repository, so no run waits for an answer here; start `npc daemon` (a fleet's runs: answer through any node's API, `POST /api/v1/runs/ID/approve`)"
        );
        return Ok(Exit::Failed);
    };
    match tokio()?.block_on(Client::call(&socket, &request)) {
        Ok(Reply::Answered {
            run_id,
            approval_id,
            tool,
            state,
        }) => {
            match format {
                Format::Json => outln!(
                    "{}",
                    json!({ "run_id": run_id, "approval_id": approval_id, "tool": tool, "state": state })
                )?,
                Format::Human => say(&format!("run {run_id}: `{tool}` {state} ({approval_id})"))?,
            }
            Ok(Exit::Ok)
        }
        Ok(other) => Err(ControlError::unexpected(&other).into()),
        Err(ControlError::Refused(error)) => {
            errln!("error: {error}");
            Ok(Exit::Failed)
        }
        Err(e) => Err(e).with_context(|| format!("the daemon (pid {pid}) did not answer")),
    }
}

/// `npc runs --fleet` and `npc runs show ID --fleet`: the fleet's shared store.
fn fleet_runs(args: RunsArgs) -> anyhow::Result<Exit> {
    match args.show {
        None => {
            let limit = usize::try_from(args.limit).unwrap_or(usize::MAX);
            let rows = super::worker::fleet_runs(args.manifest, args.trigger.as_deref(), limit)?;
            rows.map_or(Ok(Exit::Failed), |rows| {
                let listings: Vec<_> = rows
                    .iter()
                    .map(crate::api::listings::RunListing::of)
                    .collect();
                list_runs(&listings, args.format)
            })
        }
        Some(RunsCommand::Show { id }) => {
            match super::worker::fleet_run(args.manifest, &id, MAX_SHOWN_EVENTS)? {
                Some((row, events)) => show_run(&id, row, &events, args.format),
                None => Ok(Exit::Failed),
            }
        }
        Some(
            RunsCommand::Diff { .. }
            | RunsCommand::Clean { .. }
            | RunsCommand::Approve { .. }
            | RunsCommand::Deny { .. },
        ) => {
            errln!(
                "error: `--fleet` lists runs and shows one; `npc runs diff` and `npc runs clean` act on this machine's worktrees (run them where the run ran)"
            );
            Ok(Exit::Failed)
        }
    }
}

/// Narrowest and widest the TRIGGER column of `npc runs` is.
const MIN_TRIGGER_COLUMN: usize = 20;
const MAX_TRIGGER_COLUMN: usize = 48;
/// Most characters of a run's detail one line of `npc runs` shows.
const MAX_LISTED_DETAIL_CHARS: usize = 100;

/// The listing of `npc runs` (and `npc runs --fleet`, whose rows name
/// their worker as `owner`): a run that did not succeed says why.
fn list_runs(runs: &[crate::api::listings::RunListing], format: Format) -> anyhow::Result<Exit> {
    let rows: Vec<Value> = runs
        .iter()
        .map(serde_json::to_value)
        .collect::<Result<_, _>>()?;
    match format {
        Format::Json => outln!("{}", serde_json::to_string_pretty(&rows)?)?,
        Format::Human => {
            // As wide as the longest queue shown (a workflow step's
            // `@workflow/NAME/STEP` is longer than a trigger's name).
            let tw = rows
                .iter()
                .map(|r| r["trigger"].as_str().unwrap_or("-").chars().count())
                .max()
                .unwrap_or(0)
                .clamp(MIN_TRIGGER_COLUMN, MAX_TRIGGER_COLUMN);
            if rows.is_empty() {
                outln!("no runs yet")?;
            } else {
                outln!(
                    "{:<36}  {:<tw$}  {:<10}  {:<11}  {:<30}  {:>7}  {:>7}  WHY",
                    "RUN",
                    "TRIGGER",
                    "ORIGIN",
                    "STATE",
                    "QUEUED",
                    "WAITED",
                    "TOOK"
                )?;
            }
            for r in &rows {
                let why: String = r["detail"]
                    .as_str()
                    .unwrap_or("")
                    .chars()
                    .take(MAX_LISTED_DETAIL_CHARS)
                    .collect();
                let at = |key: &str| r[key].as_i64();
                let between = |from: Option<i64>, to: Option<i64>| match (from, to) {
                    (Some(from), Some(to)) => span(to - from),
                    _ => "-".to_string(),
                };
                say(format!(
                    "{:<36}  {:<tw$}  {:<10}  {:<11}  {:<30}  {:>7}  {:>7}  {why}",
                    r["id"].as_str().unwrap_or(""),
                    r["trigger"].as_str().unwrap_or("-"),
                    r["origin"].as_str().unwrap_or(""),
                    r["state"].as_str().unwrap_or(""),
                    time(at("enqueued_at_ms")),
                    between(at("enqueued_at_ms"), at("started_at_ms")),
                    between(at("started_at_ms"), at("finished_at_ms")),
                )
                .trim_end())?;
            }
        }
    }
    Ok(Exit::Ok)
}

fn show(store: &Store, id: &str, format: Format) -> anyhow::Result<Exit> {
    let row = store.run_row(id)?;
    let events = store.component_events(&crate::runs::component(id), 0, MAX_SHOWN_EVENTS)?;
    show_run(id, row, &events, format)
}

/// `npc runs show ID`: run `id`'s row (if stored) and its events.
fn show_run(
    id: &str,
    row: Option<crate::store::queue::RunRow>,
    events: &[crate::store::Event],
    format: Format,
) -> anyhow::Result<Exit> {
    if row.is_none() && events.is_empty() {
        errln!("error: no run `{id}`; list them with `npc runs` (a fleet's: `npc runs --fleet`)");
        return Ok(Exit::Failed);
    }
    match format {
        Format::Json => {
            outln!(
                "{}",
                serde_json::to_string_pretty(&json!({ "run": row, "events": events }))?
            )?;
        }
        Format::Human => {
            if let Some(r) = &row {
                say(&format!(
                    "run {}  trigger `{}` ({})  {}",
                    r.id, r.trigger, r.origin, r.state
                ))?;
                say(&format!(
                    "queued {}  started {}  finished {}",
                    time(Some(r.enqueued_at_ms)),
                    time(r.started_at_ms),
                    time(r.finished_at_ms)
                ))?;
                if let Some(d) = &r.detail {
                    say(&format!("detail: {d}"))?;
                }
                let finished = events.iter().rev().find(|e| e.kind == "run.finished");
                if let Some(f) = finished {
                    if let Some(reason) = f.payload["reason"].as_str() {
                        say(&format!("outcome: {} ({reason})", r.state))?;
                    }
                    for d in crate::api::listings::denials_of(&f.payload) {
                        let by = serde_json::to_value(d.by).unwrap_or_default();
                        say(&format!(
                            "denied: `{}` by {} (rule `{}`){}",
                            d.tool,
                            by.as_str().unwrap_or("?"),
                            d.rule,
                            d.reason.map(|r| format!(": {r}")).unwrap_or_default()
                        ))?;
                    }
                }
                let unchanged = r.result.as_ref().is_some_and(|x| x["unchanged"] == true);
                if let Some(result) = r.result.as_ref().filter(|_| unchanged) {
                    say(&format!(
                        "branch {} ({}): no changes, the run changed no file",
                        result["branch"].as_str().unwrap_or("?"),
                        short(result["base"].as_str()),
                    ))?;
                } else if let Some(result) = &r.result {
                    say(&format!(
                        "branch {} ({} → {}): {} files changed, {} insertions, {} deletions (`npc runs diff {}`)",
                        result["branch"].as_str().unwrap_or("?"),
                        short(result["base"].as_str()),
                        short(result["head"].as_str()),
                        result["files"].as_u64().unwrap_or(0),
                        result["insertions"].as_u64().unwrap_or(0),
                        result["deletions"].as_u64().unwrap_or(0),
                        r.id
                    ))?;
                }
                if let Some(w) = &r.worktree {
                    say(&format!(
                        "worktree kept: {w} (`npc runs clean --all` removes it)"
                    ))?;
                }
            } else {
                outln!("run {id} (events only)")?;
            }
            for e in events {
                say(format!(
                    "{}  {:<16}  {}",
                    time(Some(e.ts_ms)),
                    e.kind,
                    super::human::fields(&e.payload)
                )
                .trim_end())?;
            }
        }
    }
    Ok(Exit::Ok)
}

/// The first 12 hex digits of a commit.
fn short(sha: Option<&str>) -> String {
    sha.unwrap_or("?").chars().take(12).collect()
}

/// A supervisor for the git commands of `npc runs diff` and `npc runs clean`.
fn supervisor() -> crate::supervisor::Supervisor {
    let (events, _) = tokio::sync::mpsc::unbounded_channel();
    crate::supervisor::Supervisor::new(events, crate::supervisor::BackoffPolicy::default())
}

/// `npc runs diff ID`: `git diff BASE HEAD` of the run's result, its
/// control characters escaped like all text of others.
fn diff(paths: &RepoPaths, store: &Store, id: &str) -> anyhow::Result<Exit> {
    let Some(row) = store.run_row(id)? else {
        errln!("error: no run `{id}`; list them with `npc runs`");
        return Ok(Exit::Failed);
    };
    let result = crate::runs::workspace::RunResult::of(&row);
    let Some(result) = result else {
        errln!(
            "error: run `{id}` handed back no branch; only worktree runs do (`workspace = \"worktree\"`)"
        );
        return Ok(Exit::Failed);
    };
    let repo = paths.root.clone();
    let (patch, cut) = tokio()?
        .block_on(async { crate::runs::workspace::patch(&supervisor(), &repo, &result).await })?;
    out!("{}", printable(&patch))?;
    if cut {
        errln!(
            "warning: the patch is longer than {} bytes and was cut; see `git diff {} {}`",
            crate::runs::workspace::MAX_DIFF_BYTES,
            result.base,
            result.head
        );
    }
    Ok(Exit::Ok)
}

/// `npc runs clean [--all]`.
fn clean(paths: &RepoPaths, all: bool, format: Format) -> anyhow::Result<Exit> {
    let manifest = super::valid_manifest(&paths.manifest, "before cleaning worktrees")?;
    let Some(manifest) = manifest else {
        return Ok(Exit::Failed);
    };
    let store = std::sync::Arc::new(runtime::open_store(paths)?);
    let root =
        crate::runs::workspace::worktrees_root(&paths.root, &paths.state_dir, &manifest.runs);
    let policy = crate::runs::workspace::KeepPolicy::of(&manifest.runs, all);
    let repo = paths.root.clone();
    let removed = tokio()?.block_on(async {
        crate::runs::workspace::clean(&store, &supervisor(), &repo, &root, policy).await
    })?;
    match format {
        Format::Json => outln!("{}", json!({ "removed": removed }))?,
        Format::Human if removed.is_empty() => outln!("no kept worktree to remove")?,
        Format::Human => {
            for id in &removed {
                say(&format!("removed the worktree of {id}"))?;
            }
        }
    }
    Ok(Exit::Ok)
}
