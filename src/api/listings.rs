//! The listings the CLI and the REST API both show, built in one place so
//! they cannot drift: triggers (`npc triggers --format json`,
//! `GET /api/v1/triggers`), plugins (`npc plugin list --format json`,
//! `GET /api/v1/plugins`) and runs (`npc runs`, `GET /api/v1/runs`: the
//! run queue's rows, whatever started them, newest first; a fleet's rows as
//! [`RunListing`]s for `npc runs --fleet` and `GET /api/v1/fleet/runs`).

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{Value, json};

use crate::event::RunDenial;
use crate::model::{Manifest, TriggerSource};
use crate::plugins::registry::{Collision, RegistryError};
use crate::runs::{MANUAL_QUEUE, Origin};
use crate::store::queue::{MAX_RUNS_PER_READ, RunRow};
use crate::store::{Event, Store, StoreError};
use crate::triggers::{DEFAULT_NEXT_FIRES, cron};

/// Recent runs shown per trigger.
pub const RECENT_RUNS: usize = 3;

/// One object per trigger of `manifest`: its kind and schedule, route or
/// watched paths, whether the daemon armed it (`live` are the daemon's
/// trigger views, empty without a daemon) and its recent runs.
pub fn trigger_rows(
    manifest: &Manifest,
    live: &[Value],
    store: Option<&Store>,
) -> Result<Vec<Value>, StoreError> {
    let now = chrono::Utc::now();
    let mut rows = Vec::new();
    for (name, t) in &manifest.triggers {
        let live = live.iter().find(|v| v["name"] == name.as_str());
        let (kind, mut detail) = match &t.source {
            TriggerSource::Cron {
                schedule, timezone, ..
            } => {
                let next: Vec<Value> = match live {
                    Some(v) => v["next_fire_times"].as_array().cloned().unwrap_or_default(),
                    None => {
                        let tz = timezone.0;
                        let first = cron::next_after(schedule, tz, now);
                        cron::fire_times(schedule, tz, first, DEFAULT_NEXT_FIRES)
                            .iter()
                            .map(|t| json!(t.to_rfc3339()))
                            .collect()
                    }
                };
                (
                    "cron",
                    json!({ "schedule": schedule.to_string(), "timezone": timezone.name(), "next_fire_times": next }),
                )
            }
            TriggerSource::Webhook { route, .. } => (
                "webhook",
                json!({ "route": route, "url": live.and_then(|v| v.get("url")).cloned() }),
            ),
            TriggerSource::FileWatch {
                paths,
                ignore,
                events,
                ..
            } => (
                "file_watch",
                json!({ "paths": paths, "ignore": ignore, "events": events }),
            ),
        };
        let recent: Vec<Value> = match store {
            Some(s) => s
                .run_rows(Some(name), RECENT_RUNS)?
                .iter()
                .map(
                    |r| json!({ "id": r.id, "state": r.state, "enqueued_at_ms": r.enqueued_at_ms }),
                )
                .collect(),
            None => Vec::new(),
        };
        detail["name"] = json!(name);
        detail["kind"] = json!(kind);
        detail["enabled"] = json!(t.enabled);
        detail["overlap"] = json!(t.overlap.as_str());
        detail["armed"] = json!(live.is_some());
        if live.is_some_and(|v| v["standby"] == true) {
            // In a fleet, another daemon schedules it.
            detail["standby"] = json!(true);
        }
        detail["recent_runs"] = json!(recent);
        rows.push(detail);
    }
    Ok(rows)
}

/// One plugin of `npc plugin list`.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct PluginRow {
    pub kind: &'static str,
    pub id: String,
    pub version: Option<String>,
    /// `manifest` or `user`: where it is registered.
    pub source: &'static str,
    pub path: PathBuf,
    /// `enabled` / `disabled`: what is saved.
    pub saved: &'static str,
    /// `valid` / `invalid`.
    pub package: &'static str,
    /// The package's MCP servers.
    pub servers: Vec<String>,
    pub skills: Vec<String>,
    /// How many hooks the package declares.
    pub hooks: usize,
}

/// Every plugin in discovery order, and what discovery noticed.
#[derive(Debug)]
pub struct PluginListing {
    pub rows: Vec<PluginRow>,
    /// The same plugin registered twice (the first is kept).
    pub collisions: Vec<Collision>,
    /// The manifest did not load, so its plugins are not listed.
    pub invalid_manifest: Option<PathBuf>,
}

/// Every plugin of the manifest at `manifest` (if any) and of the user
/// registry, deduplicated, each validated statically (nothing runs).
pub fn plugin_rows(manifest: Option<&Path>) -> Result<PluginListing, RegistryError> {
    use crate::plugins::registry::{self, Found, Source};
    let mut found = Vec::new();
    let mut invalid_manifest = None;
    if let Some(path) = manifest
        && let Ok(loaded) = crate::plugins::files::load_path(path, &crate::disk::ProcessEnv)
    {
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        match &loaded.manifest {
            Some(m) => {
                for (name, p) in &m.plugins {
                    found.push(Found {
                        kind: "plugin",
                        id: name.clone(),
                        source: Source::Manifest,
                        path: dir.join(&p.path),
                        enabled: p.enabled,
                    });
                }
            }
            None => invalid_manifest = Some(path.to_path_buf()),
        }
    }
    for (name, e) in registry::load()?.plugins {
        found.push(Found {
            kind: "plugin",
            id: name,
            source: Source::User,
            path: e.path,
            enabled: e.enabled,
        });
    }
    let (kept, collisions) = registry::dedup(found);
    let rows = kept
        .into_iter()
        .map(|f| {
            let report = crate::plugins::validate(&f.path).ok();
            let pkg = report.as_ref().and_then(|r| r.package.as_ref());
            PluginRow {
                kind: f.kind,
                id: f.id,
                version: pkg.and_then(|p| p.manifest.version.clone()),
                source: f.source.as_str(),
                path: f.path,
                saved: if f.enabled { "enabled" } else { "disabled" },
                package: if report
                    .as_ref()
                    .is_some_and(crate::plugins::Report::is_valid)
                {
                    "valid"
                } else {
                    "invalid"
                },
                servers: pkg
                    .map(|p| p.servers.iter().map(|s| s.name.clone()).collect())
                    .unwrap_or_default(),
                skills: pkg
                    .map(|p| p.skills.iter().map(|s| s.name.clone()).collect())
                    .unwrap_or_default(),
                hooks: pkg
                    .and_then(|p| p.hooks.as_ref())
                    .map_or(0, crate::plugins::hooks::HooksFile::len),
            }
        })
        .collect();
    Ok(PluginListing {
        rows,
        collisions,
        invalid_manifest,
    })
}

/// One row of a run queue as `npc runs` (`--format json`, and `--fleet`)
/// and `GET /api/v1/fleet/runs` list it: times in unix milliseconds of the
/// queue's clock (the database's, in a fleet), and who holds or held it.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct RunListing {
    pub id: String,
    /// The run's queue: a trigger's name, or `@manual` for runs started by
    /// hand.
    pub trigger: String,
    /// What asked for it: `cron`, `webhook`, `file_watch`, `manual`, `api`,
    /// `acp` or `cli`.
    pub origin: String,
    /// `queued`, `running`, `waiting`, `succeeded`, `blocked`, `failed`,
    /// `cancelled`, `skipped`, `timed_out` or `interrupted`.
    pub state: String,
    pub profile: Option<String>,
    pub enqueued_at_ms: i64,
    pub started_at_ms: Option<i64>,
    pub finished_at_ms: Option<i64>,
    /// Why it ended as it did, when the queue says.
    pub detail: Option<String>,
    /// The process that holds or held it: in a fleet, its worker
    /// (`host/pid:start-time`); none while it waits.
    pub owner: Option<String>,
    /// What stopped a `blocked` run: each denial's tool, rule and who
    /// applied it (its `run.finished`'s `denials`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub denials: Vec<RunDenial>,
}

/// The denials a `run.finished` payload lists (none when it lists none or
/// is not one).
pub fn denials_of(finished: &Value) -> Vec<RunDenial> {
    finished
        .get("denials")
        .and_then(|d| serde_json::from_value(d.clone()).ok())
        .unwrap_or_default()
}

/// The listings of `rows`, a `blocked` row's with its denials (read from
/// its `run.finished` in `store`).
pub fn run_listings(store: &Store, rows: &[RunRow]) -> Result<Vec<RunListing>, StoreError> {
    rows.iter()
        .map(|row| {
            let mut listing = RunListing::of(row);
            if row.state == crate::store::queue::state::BLOCKED {
                let (_, finished) = bracket(store, &row.id)?;
                listing.denials = finished.map(|f| denials_of(&f.payload)).unwrap_or_default();
            }
            Ok(listing)
        })
        .collect()
}

impl RunListing {
    pub fn of(row: &RunRow) -> Self {
        Self {
            id: row.id.clone(),
            trigger: row.trigger.clone(),
            origin: row.origin.to_string(),
            state: row.state.clone(),
            profile: profile_of(row),
            enqueued_at_ms: row.enqueued_at_ms,
            started_at_ms: row.started_at_ms,
            finished_at_ms: row.finished_at_ms,
            detail: row.detail.clone(),
            owner: row.owner.clone(),
            denials: Vec::new(),
        }
    }
}

/// One run as the API lists it.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct RunSummary {
    pub id: String,
    /// `manual` (started through the API), `acp` (a prompt of `npc acp`
    /// the daemon ran), `trigger:NAME`, `cli` (`npc run`), or the `source`
    /// a `run.started` event names.
    pub source: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// The program of a command action.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// `queued`, `running`, `waiting`, `succeeded`, `blocked` (a denial
    /// stopped what the agent tried), `failed`, `cancelled`, `skipped`,
    /// `timed_out` or `interrupted` (the daemon died while it ran).
    pub state: String,
    /// RFC 3339.
    pub created_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// The process's exit (`run.finished`'s `exit`), once it ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit: Option<Value>,
    /// Why it ended as it did, when the queue says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Why it ended as it did, as a word (`run.finished`'s `reason`:
    /// `denied`, `no_changes`, `untrusted`, `exit_status`, `timeout`, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What stopped a `blocked` run: each denial's tool, rule and who
    /// applied it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub denials: Vec<RunDenial>,
    /// What a worktree run handed back: its branch, base and head commits
    /// and diff stat (its patch: `GET /api/v1/runs/{id}/diff`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<crate::runs::workspace::RunResult>,
    /// The run's worktree while it is kept (a run that did not succeed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worktree: Option<String>,
}

fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// `run.started` / `run.finished` of a run, if recorded.
fn bracket(store: &Store, id: &str) -> Result<(Option<Event>, Option<Event>), StoreError> {
    let mut started = None;
    let mut finished = None;
    for e in store.run_bracket(id)? {
        match e.kind.as_str() {
            "run.started" => started = Some(e),
            _ => finished = Some(e),
        }
    }
    Ok((started, finished))
}

/// What started a row's run, as listings name it: `manual` (the API),
/// `acp`, `cli` (`npc run`), or `trigger:NAME`.
pub fn source_of(row: &RunRow) -> String {
    if row.trigger != MANUAL_QUEUE {
        return format!("trigger:{}", row.trigger);
    }
    match row.origin.known() {
        Some(o @ (Origin::Acp | Origin::Cli)) => o.as_str().to_string(),
        _ => "manual".to_string(),
    }
}

/// The profile a row's run runs, if its request names one (a local front
/// end's request holds its manual run under `run`).
pub fn profile_of(row: &RunRow) -> Option<String> {
    let local = row.origin.known().is_some_and(Origin::is_local);
    let request = if local {
        &row.payload["run"]
    } else {
        &row.payload
    };
    request["profile"].as_str().map(str::to_string)
}

fn from_row(store: &Store, row: RunRow) -> Result<RunSummary, StoreError> {
    let (started, finished) = bracket(store, &row.id)?;
    let profile = profile_of(&row).or_else(|| {
        started
            .as_ref()
            .and_then(|e| e.payload["profile"].as_str().map(str::to_string))
    });
    let command = started.as_ref().and_then(|e| {
        (e.payload["action"] == "command")
            .then(|| e.payload["program"].as_str().map(str::to_string))
            .flatten()
    });
    let result = crate::runs::workspace::RunResult::of(&row);
    Ok(RunSummary {
        source: source_of(&row),
        id: row.id,
        profile,
        command,
        state: row.state,
        created_at: rfc3339(row.enqueued_at_ms),
        started_at: row.started_at_ms.map(rfc3339),
        finished_at: row.finished_at_ms.map(rfc3339),
        exit: finished
            .as_ref()
            .and_then(|e| e.payload.get("exit").cloned()),
        reason: finished
            .as_ref()
            .and_then(|e| e.payload["reason"].as_str().map(str::to_string)),
        denials: finished
            .as_ref()
            .map(|e| denials_of(&e.payload))
            .unwrap_or_default(),
        detail: row.detail,
        result,
        worktree: row.worktree,
    })
}

/// The newest `limit` runs created before run `before` (in queue order;
/// an id the queue does not know pages by id, which sorts by creation
/// time), newest first. Looks at most [`MAX_RUNS_PER_READ`] rows.
pub fn run_summaries(
    store: &Store,
    limit: usize,
    before: Option<&str>,
) -> Result<Vec<RunSummary>, StoreError> {
    let cursor = match before {
        Some(id) => store.run_row(id)?.map(|r| r.seq),
        None => None,
    };
    let below = |r: &RunRow| match (cursor, before) {
        (Some(seq), _) => r.seq < seq,
        (None, Some(id)) => r.id.as_str() < id,
        (None, None) => true,
    };
    store
        .run_rows(None, MAX_RUNS_PER_READ)?
        .into_iter()
        .filter(below)
        .take(limit)
        .map(|row| from_row(store, row))
        .collect()
}

/// One run by id, as [`run_summaries`] lists it.
pub fn run_summary(store: &Store, id: &str) -> Result<Option<RunSummary>, StoreError> {
    store
        .run_row(id)?
        .map(|row| from_row(store, row))
        .transpose()
}
