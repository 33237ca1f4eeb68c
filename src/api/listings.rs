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
    /// The trigger that started it; none for a run started by hand.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<String>,
    /// What asked for it: `cron`, `webhook`, `file_watch`, `manual` (a
    /// trigger fired by hand), `api`, `acp` or `cli`.
    pub origin: String,
    /// The key its trigger's overlap policy applies within (rendered from
    /// the trigger's `concurrency_key`), if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency_key: Option<String>,
    /// What started it, as its firing recorded it: a webhook's event,
    /// delivery and the issue or pull request its payload is about, a
    /// file watch's path and event, a cron firing's scheduled time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<RunCause>,
    /// `queued`, `running`, `waiting`, `succeeded`, `blocked` (a denial
    /// stopped what the agent tried), `failed`, `cancelled`, `skipped`,
    /// `timed_out` or `interrupted` (the daemon died while it ran).
    pub state: String,
    /// When it was queued, RFC 3339.
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

/// Longest text a run's cause shows of its firing's payload (an event, a
/// delivery, a path, an issue's title), in characters.
pub const MAX_CAUSE_TEXT_CHARS: usize = 200;
/// Longest link a run's cause shows (an issue's `html_url`), in bytes.
pub const MAX_CAUSE_URL_BYTES: usize = 2048;

/// What started a run, from its firing's payload (a webhook's body is
/// whatever its sender posted: every text here is one bounded printable
/// line, every link an `http(s)` address).
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct RunCause {
    /// A webhook's event (its `X-GitHub-Event` or `X-Npc-Event`), or a
    /// file watch's (`create`, `modify`, `remove`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    /// A webhook's delivery id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery: Option<String>,
    /// A file watch's changed path, relative to the repository.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// A cron firing's scheduled time, RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduled_at: Option<String>,
    /// The issue or pull request a webhook's payload is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<RunSubject>,
}

/// The issue or pull request a webhook's payload names (GitHub's
/// `pull_request` or `issue` object).
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct RunSubject {
    /// `pull_request` or `issue`.
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub number: Option<u64>,
    /// Its title: one line of at most [`MAX_CAUSE_TEXT_CHARS`] characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// Its page (`html_url`), only when an `https://` or `http://`
    /// address of at most [`MAX_CAUSE_URL_BYTES`] without spaces or controls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}

/// Whether `c` is an invisible formatting character (a zero-width space or
/// joiner, a bidirectional override or isolate, a byte order mark) that
/// could make shown text read other than it is.
fn is_format_control(c: char) -> bool {
    matches!(c, '\u{061c}' | '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2069}' | '\u{feff}')
}

/// A string of an untrusted payload as one line a person reads: control
/// characters as spaces, formatting characters dropped, surrounding space
/// trimmed, cut to [`MAX_CAUSE_TEXT_CHARS`] (ending in `…` when cut); none
/// when it is not a string or nothing is left.
pub fn shown_text(value: &Value) -> Option<String> {
    let text = value.as_str()?;
    let mut out = String::new();
    for (count, c) in text
        .chars()
        .filter(|c| !is_format_control(*c))
        .map(|c| if c.is_control() { ' ' } else { c })
        .enumerate()
    {
        if count == MAX_CAUSE_TEXT_CHARS {
            out.push('…');
            break;
        }
        out.push(c);
    }
    let out = out.trim();
    (!out.is_empty()).then(|| out.to_string())
}

/// A link of an untrusted payload, when it is a plain `https://` or
/// `http://` address within [`MAX_CAUSE_URL_BYTES`].
fn shown_url(value: &Value) -> Option<String> {
    let url = value.as_str()?;
    let web = url.starts_with("https://") || url.starts_with("http://");
    let plain = !url.chars().any(|c| {
        c.is_whitespace()
            || c.is_control()
            || is_format_control(c)
            || matches!(c, '"' | '<' | '>' | '\\')
    });
    (web && plain && url.len() <= MAX_CAUSE_URL_BYTES).then(|| url.to_string())
}

/// The issue or pull request of a webhook's `body`: its `pull_request`,
/// else its `issue` (an issue that is a pull request, as a comment's
/// payload names one, counts as a pull request).
fn subject_of(body: &Value) -> Option<RunSubject> {
    let (kind, item) = match (body.get("pull_request"), body.get("issue")) {
        (Some(pr), _) if pr.is_object() => ("pull_request", pr),
        (_, Some(issue)) if issue.is_object() => {
            let pr = issue.get("pull_request").is_some_and(Value::is_object);
            (if pr { "pull_request" } else { "issue" }, issue)
        }
        _ => return None,
    };
    Some(RunSubject {
        kind: kind.to_string(),
        number: item["number"].as_u64(),
        title: shown_text(&item["title"]),
        url: shown_url(&item["html_url"]),
    })
}

/// What started a row's run, from its firing's payload; none when the
/// payload says nothing more than the row's origin.
pub fn cause_of(row: &RunRow) -> Option<RunCause> {
    let p = &row.payload;
    let cause = match p["kind"].as_str() {
        Some("webhook") => RunCause {
            event: shown_text(&p["event"]),
            delivery: shown_text(&p["delivery"]),
            subject: subject_of(&p["body"]),
            ..RunCause::default()
        },
        Some("file_watch") => RunCause {
            event: shown_text(&p["event"]),
            path: shown_text(&p["path"]),
            ..RunCause::default()
        },
        Some("cron") => RunCause {
            scheduled_at: shown_text(&p["scheduled_at"]),
            ..RunCause::default()
        },
        _ => return None,
    };
    (cause != RunCause::default()).then_some(cause)
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
        trigger: (row.trigger != MANUAL_QUEUE).then(|| row.trigger.clone()),
        origin: row.origin.to_string(),
        concurrency_key: row.concurrency_key.clone(),
        cause: cause_of(&row),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn row(trigger: &str, origin: &str, payload: Value) -> RunRow {
        serde_json::from_value(json!({
            "seq": 1, "id": "run-1", "trigger": trigger, "origin": origin,
            "payload": payload, "state": "succeeded", "enqueued_at_ms": 0,
        }))
        .unwrap()
    }

    #[test]
    fn a_webhooks_cause_names_its_event_delivery_and_pull_request() {
        let hook = row(
            "gh",
            "webhook",
            json!({
                "kind": "webhook", "event": "pull_request", "delivery": "d-1",
                "body": { "action": "opened", "pull_request": {
                    "number": 7, "title": "Fix the parser",
                    "html_url": "https://github.com/o/r/pull/7",
                } },
            }),
        );
        let cause = cause_of(&hook).unwrap();
        assert_eq!(cause.event.as_deref(), Some("pull_request"));
        assert_eq!(cause.delivery.as_deref(), Some("d-1"));
        let subject = cause.subject.unwrap();
        assert_eq!(
            (
                subject.kind.as_str(),
                subject.number,
                subject.title.as_deref()
            ),
            ("pull_request", Some(7), Some("Fix the parser"))
        );
        assert_eq!(
            subject.url.as_deref(),
            Some("https://github.com/o/r/pull/7")
        );
        // A comment on a pull request names it as an issue that is one.
        let comment = json!({ "kind": "webhook", "event": "issue_comment", "body": { "issue": {
            "number": 8, "title": "t", "pull_request": { "url": "x" } } } });
        let subject = cause_of(&row("gh", "webhook", comment))
            .unwrap()
            .subject
            .unwrap();
        assert_eq!(
            (subject.kind.as_str(), subject.number),
            ("pull_request", Some(8))
        );
    }

    #[test]
    fn a_hostile_payloads_title_and_link_come_back_one_bounded_line_or_not_at_all() {
        let long = "x".repeat(5 * MAX_CAUSE_TEXT_CHARS);
        let hook = row(
            "gh",
            "webhook",
            json!({
                "kind": "webhook", "event": "issues\u{1b}[2J",
                "body": { "issue": {
                    "number": -1,
                    "title": "<img src=x onerror=alert(1)>\nsecond\u{202e}line\u{7}",
                    "html_url": "javascript:alert(1)",
                } },
            }),
        );
        let cause = cause_of(&hook).unwrap();
        assert_eq!(cause.event.as_deref(), Some("issues [2J"));
        let subject = cause.subject.unwrap();
        // Text stays text (the page writes it as a text node); no control,
        // no newline, no bidirectional override.
        assert_eq!(
            subject.title.as_deref(),
            Some("<img src=x onerror=alert(1)> secondline")
        );
        assert_eq!(subject.number, None);
        assert_eq!(subject.url, None, "only http(s) links");
        for url in [
            "https://x/ onclick=1",
            "http://x/\"><script>",
            "data:text/html,<b>",
        ] {
            assert_eq!(shown_url(&json!(url)), None, "{url}");
        }
        let too_long = format!("https://x/{}", "y".repeat(MAX_CAUSE_URL_BYTES));
        assert_eq!(shown_url(&json!(too_long)), None);
        let cut = shown_text(&json!(long)).unwrap();
        assert_eq!(cut.chars().count(), MAX_CAUSE_TEXT_CHARS + 1);
        assert!(cut.ends_with('…'));
        assert_eq!(shown_text(&json!(" \u{200b} ")), None);
        assert_eq!(shown_text(&json!(42)), None);
    }

    #[test]
    fn a_run_by_hand_has_no_cause_and_a_file_watch_names_its_path() {
        assert_eq!(
            cause_of(&row(MANUAL_QUEUE, "api", json!({"profile": "p"}))),
            None
        );
        let watched = row(
            "w",
            "file_watch",
            json!({ "kind": "file_watch", "path": "src/a.rs", "event": "modify" }),
        );
        let cause = cause_of(&watched).unwrap();
        assert_eq!(
            (cause.path.as_deref(), cause.event.as_deref()),
            (Some("src/a.rs"), Some("modify"))
        );
        let fired = row("t", "manual", json!({ "kind": "manual", "payload": "x" }));
        assert_eq!(cause_of(&fired), None);
    }
}
