//! Workflow runs (migration 12): one row per run of a workflow in
//! `workflow_runs` (its name, inputs, state) and one row per step instance
//! in `workflow_steps` (its state, the run carrying it out, what it handed
//! on). The step rows are the workflow's journal: a step recorded
//! `succeeded` is never started again, so a daemon killed mid-workflow
//! resumes from them. This module only reads and writes rows; the
//! `workflows` engine decides what they become.

use rusqlite::{OptionalExtension, Row};
use serde::{Deserialize, Serialize};

use super::untrusted::{MAX_NAME_CHARS, MAX_TEXT_CHARS};
use super::{Pending, Store, StoreError, now_ms, sqlite};

/// Most workflow runs one listing returns.
pub const MAX_WORKFLOWS_PER_READ: usize = 1_000;
/// Most step rows of one workflow run read back.
pub const MAX_STEPS_PER_WORKFLOW: usize = 4_096;
/// Finished workflow runs kept; older finished ones (and their steps) are
/// pruned when a workflow run ends.
pub const WORKFLOW_HISTORY_LIMIT: usize = 1_000;
/// Longest JSON text a row keeps (inputs, a step's outputs); longer is cut
/// to a marker when written.
pub const MAX_ROW_JSON_BYTES: usize = 1024 * 1024;
/// The newest progress reports of a run read for its step's `progress`
/// output ([`Store::progress_of_run`]).
pub const MAX_PROGRESS_REPORTS_READ: usize = 64;
/// The most JSON a step's `progress` output holds (and one report's
/// `outputs` may carry): the newest values that fit.
pub const MAX_STEP_PROGRESS_BYTES: usize = 16 * 1024;

/// The schema step that adds the tables (applied by `schema`).
pub(super) const MIGRATION: &str = r#"
    CREATE TABLE workflow_runs (
        id             TEXT    PRIMARY KEY,
        name           TEXT    NOT NULL,
        origin         TEXT    NOT NULL,
        inputs         TEXT    NOT NULL,
        payload        TEXT    NOT NULL,
        state          TEXT    NOT NULL,
        detail         TEXT,
        created_at_ms  INTEGER NOT NULL,
        updated_at_ms  INTEGER NOT NULL,
        finished_at_ms INTEGER
    );
    CREATE INDEX workflow_runs_by_state ON workflow_runs (state, created_at_ms);
    CREATE TABLE workflow_steps (
        workflow_id   TEXT    NOT NULL,
        step          TEXT    NOT NULL,
        instance      INTEGER NOT NULL,
        matrix        TEXT,
        state         TEXT    NOT NULL,
        run_id        TEXT,
        gate_run_id   TEXT,
        starts        INTEGER NOT NULL DEFAULT 0,
        outputs       TEXT,
        detail        TEXT,
        updated_at_ms INTEGER NOT NULL,
        PRIMARY KEY (workflow_id, step, instance)
    );
    CREATE INDEX workflow_steps_by_run ON workflow_steps (run_id);
"#;

/// The states of a workflow run and of a step.
pub mod state {
    /// A step reached but not started yet.
    pub const PENDING: &str = "pending";
    /// A step whose gate waits for a person.
    pub const WAITING: &str = "waiting";
    /// A step whose run is queued or running; a workflow under way.
    pub const RUNNING: &str = "running";
    pub const SUCCEEDED: &str = "succeeded";
    pub const FAILED: &str = "failed";
    /// A step whose `when` was false, or that needs a skipped step.
    pub const SKIPPED: &str = "skipped";
    pub const CANCELLED: &str = "cancelled";

    /// Whether a step or workflow in `state` has ended.
    pub fn is_final(state: &str) -> bool {
        matches!(state, SUCCEEDED | FAILED | SKIPPED | CANCELLED)
    }
}

/// A workflow run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkflowRow {
    /// `wf-…`.
    pub id: String,
    pub name: String,
    /// What started it (`cli`, `api`, a trigger's origin).
    pub origin: String,
    /// The inputs, defaults filled in.
    pub inputs: serde_json::Value,
    /// What started it handed on (a trigger's payload), read as `payload`.
    pub payload: serde_json::Value,
    pub state: String,
    pub detail: Option<String>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    pub finished_at_ms: Option<i64>,
}

/// One instance of a step of a workflow run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRow {
    pub workflow_id: String,
    pub step: String,
    /// 0 without a matrix; else the instance's place in the fan-out.
    pub instance: u32,
    /// The instance's matrix values.
    pub matrix: Option<serde_json::Value>,
    pub state: String,
    /// The run carrying out the step's action (the latest, once restarted).
    pub run_id: Option<String>,
    /// The run its gate waits in.
    pub gate_run_id: Option<String>,
    /// How often a run of it was started (an interrupted one is started
    /// again, up to a bound).
    pub starts: u32,
    /// What it handed on: `branch`, `head`, `base`, `diff`, `message`,
    /// `output`.
    pub outputs: Option<serde_json::Value>,
    pub detail: Option<String>,
    pub updated_at_ms: i64,
}

impl StepRow {
    /// Instance `instance` of step `step` of workflow run `workflow_id`,
    /// in `state`, with nothing else yet.
    pub fn new(workflow_id: &str, step: &str, instance: u32, state: &str) -> Self {
        Self {
            workflow_id: workflow_id.to_string(),
            step: step.to_string(),
            instance,
            matrix: None,
            state: state.to_string(),
            run_id: None,
            gate_run_id: None,
            starts: 0,
            outputs: None,
            detail: None,
            updated_at_ms: now_ms(),
        }
    }
}

const WORKFLOW_COLUMNS: &str = "id, name, origin, inputs, payload, state, detail, \
     created_at_ms, updated_at_ms, finished_at_ms";
const STEP_COLUMNS: &str = "workflow_id, step, instance, matrix, state, run_id, gate_run_id, \
     starts, outputs, detail, updated_at_ms";

fn cut(s: &str, chars: usize) -> String {
    crate::stdx::term::printable(&s.chars().take(chars).collect::<String>()).into_owned()
}

/// JSON text as read back: a value, or the text as a string when it is not
/// JSON (another process may have written it).
fn json_of(text: Option<String>) -> Option<serde_json::Value> {
    text.map(|t| serde_json::from_str(&t).unwrap_or(serde_json::Value::String(t)))
}

/// A value's JSON text as written: cut to a marker past [`MAX_ROW_JSON_BYTES`].
fn json_text(value: &serde_json::Value) -> String {
    let text = value.to_string();
    if text.len() > MAX_ROW_JSON_BYTES {
        serde_json::json!({ "truncated_from_bytes": text.len() }).to_string()
    } else {
        text
    }
}

fn workflow_row(r: &Row<'_>) -> rusqlite::Result<WorkflowRow> {
    let name =
        |i: usize| -> rusqlite::Result<String> { Ok(cut(&r.get::<_, String>(i)?, MAX_NAME_CHARS)) };
    Ok(WorkflowRow {
        id: name(0)?,
        name: name(1)?,
        origin: name(2)?,
        inputs: json_of(Some(r.get(3)?)).unwrap_or_default(),
        payload: json_of(Some(r.get(4)?)).unwrap_or_default(),
        state: name(5)?,
        detail: r
            .get::<_, Option<String>>(6)?
            .map(|d| cut(&d, MAX_TEXT_CHARS)),
        created_at_ms: r.get(7)?,
        updated_at_ms: r.get(8)?,
        finished_at_ms: r.get(9)?,
    })
}

fn step_row(r: &Row<'_>) -> rusqlite::Result<StepRow> {
    let name =
        |i: usize| -> rusqlite::Result<String> { Ok(cut(&r.get::<_, String>(i)?, MAX_NAME_CHARS)) };
    let opt_name = |i: usize| -> rusqlite::Result<Option<String>> {
        Ok(r.get::<_, Option<String>>(i)?
            .map(|s| cut(&s, MAX_NAME_CHARS)))
    };
    Ok(StepRow {
        workflow_id: name(0)?,
        step: name(1)?,
        instance: u32::try_from(r.get::<_, i64>(2)?).unwrap_or(u32::MAX),
        matrix: json_of(r.get(3)?),
        state: name(4)?,
        run_id: opt_name(5)?,
        gate_run_id: opt_name(6)?,
        starts: u32::try_from(r.get::<_, i64>(7)?).unwrap_or(u32::MAX),
        outputs: json_of(r.get(8)?),
        detail: r
            .get::<_, Option<String>>(9)?
            .map(|d| cut(&d, MAX_TEXT_CHARS)),
        updated_at_ms: r.get(10)?,
    })
}

impl Store {
    /// Record a new workflow run.
    pub fn create_workflow(&self, row: WorkflowRow) -> Pending<()> {
        self.write(move |conn| {
            conn.prepare_cached(
                "INSERT INTO workflow_runs (id, name, origin, inputs, payload, state, detail,
                 created_at_ms, updated_at_ms, finished_at_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            )
            .and_then(|mut s| {
                s.execute((
                    &row.id,
                    &row.name,
                    &row.origin,
                    json_text(&row.inputs),
                    json_text(&row.payload),
                    &row.state,
                    &row.detail,
                    row.created_at_ms,
                    row.updated_at_ms,
                    row.finished_at_ms,
                ))
            })
            .map(|_| ())
            .map_err(sqlite("record a workflow run"))
        })
    }

    /// Move workflow run `id` to `state` (a final one records when); a
    /// workflow that has ended stays as it ended. Resolves to whether it
    /// moved.
    pub fn set_workflow_state(
        &self,
        id: impl Into<String>,
        state: &'static str,
        detail: Option<String>,
    ) -> Pending<bool> {
        let id = id.into();
        self.write(move |conn| {
            let now = now_ms();
            let finished = state::is_final(state).then_some(now);
            conn.prepare_cached(
                "UPDATE workflow_runs SET state = ?2, detail = COALESCE(?3, detail),
                 updated_at_ms = ?4, finished_at_ms = COALESCE(?5, finished_at_ms)
                 WHERE id = ?1 AND state NOT IN ('succeeded', 'failed', 'cancelled')",
            )
            .and_then(|mut s| s.execute((&id, state, &detail, now, finished)))
            .map(|n| n > 0)
            .map_err(sqlite("record a workflow run's state"))
        })
    }

    /// Write step rows (each new, or replacing the row of its step and
    /// instance) in one transaction.
    pub fn put_steps(&self, rows: Vec<StepRow>) -> Pending<()> {
        self.write(move |conn| {
            let failed = sqlite("record a workflow step");
            let mut insert = conn
                .prepare_cached(&format!(
                    "INSERT OR REPLACE INTO workflow_steps ({STEP_COLUMNS})
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"
                ))
                .map_err(&failed)?;
            for row in rows {
                insert
                    .execute((
                        &row.workflow_id,
                        &row.step,
                        i64::from(row.instance),
                        row.matrix.as_ref().map(json_text),
                        &row.state,
                        &row.run_id,
                        &row.gate_run_id,
                        i64::from(row.starts),
                        row.outputs.as_ref().map(json_text),
                        &row.detail,
                        now_ms(),
                    ))
                    .map_err(&failed)?;
            }
            Ok(())
        })
    }

    /// Workflow run `id`, if recorded.
    pub fn workflow(&self, id: &str) -> Result<Option<WorkflowRow>, StoreError> {
        self.read("read a workflow run", |conn| {
            conn.prepare_cached(&format!(
                "SELECT {WORKFLOW_COLUMNS} FROM workflow_runs WHERE id = ?1"
            ))?
            .query_row([id], workflow_row)
            .optional()
        })
    }

    /// Up to `limit` workflow runs, newest first; with `active`, only the
    /// ones under way.
    pub fn workflows(&self, active: bool, limit: usize) -> Result<Vec<WorkflowRow>, StoreError> {
        let limit = limit.min(MAX_WORKFLOWS_PER_READ) as i64;
        self.read("list workflow runs", |conn| {
            conn.prepare_cached(&format!(
                "SELECT {WORKFLOW_COLUMNS} FROM workflow_runs
                 WHERE (?1 = 0 OR state = 'running')
                 ORDER BY created_at_ms DESC, id DESC LIMIT ?2"
            ))?
            .query_map((i64::from(active), limit), workflow_row)?
            .collect()
        })
    }

    /// The step rows of workflow run `id`, by step and instance.
    pub fn workflow_steps(&self, id: &str) -> Result<Vec<StepRow>, StoreError> {
        self.read("read a workflow's steps", |conn| {
            conn.prepare_cached(&format!(
                "SELECT {STEP_COLUMNS} FROM workflow_steps WHERE workflow_id = ?1
                 ORDER BY step, instance LIMIT {MAX_STEPS_PER_WORKFLOW}"
            ))?
            .query_map([id], step_row)?
            .collect()
        })
    }
}

impl Store {
    /// The last thing run `id` said: its agent's last message, else a
    /// command's last line of output (cut to [`MAX_TEXT_CHARS`]).
    pub fn last_message_of_run(&self, id: &str) -> Result<Option<String>, StoreError> {
        let component = super::queue::run_component(id);
        for (kind, field) in [("agent.message", "text"), ("run.output", "line")] {
            let found = self.events_where(
                "component = ?1 AND kind = ?2 ORDER BY id DESC LIMIT 1",
                (&component, kind),
            )?;
            if let Some(text) = found
                .first()
                .and_then(|e| e.payload.get(field))
                .and_then(serde_json::Value::as_str)
            {
                return Ok(Some(cut(text, MAX_TEXT_CHARS)));
            }
        }
        Ok(None)
    }

    /// The values run `id`'s agent reported through `npc_progress` (its
    /// `run.progress` events' `outputs`, the newest
    /// [`MAX_PROGRESS_REPORTS_READ`] of them), a later report's key
    /// replacing an earlier one's, at most [`MAX_STEP_PROGRESS_BYTES`] of
    /// them (the newest keys that fit).
    pub fn progress_of_run(
        &self,
        id: &str,
    ) -> Result<serde_json::Map<String, serde_json::Value>, StoreError> {
        let component = super::queue::run_component(id);
        // Newest first: a key already taken was replaced by a later report.
        let reports = self.events_where(
            "component = ?1 AND kind = ?2 ORDER BY id DESC LIMIT ?3",
            (
                &component,
                "run.progress",
                i64::try_from(MAX_PROGRESS_REPORTS_READ).unwrap_or(i64::MAX),
            ),
        )?;
        let mut merged = serde_json::Map::new();
        let mut bytes = 0;
        for report in reports {
            let Some(outputs) = report.payload.get("outputs").and_then(|o| o.as_object()) else {
                continue;
            };
            for (key, value) in outputs {
                if merged.contains_key(key) {
                    continue;
                }
                let size = key.len() + value.to_string().len();
                if bytes + size <= MAX_STEP_PROGRESS_BYTES {
                    bytes += size;
                    merged.insert(key.clone(), value.clone());
                }
            }
        }
        Ok(merged)
    }

    /// Forget finished workflow runs (and their steps) beyond the newest
    /// `keep` ones; how many went.
    pub fn prune_workflows(&self, keep: usize) -> Pending<usize> {
        self.write(move |conn| {
            let failed = sqlite("prune workflow runs");
            const OLD: &str = "SELECT id FROM workflow_runs
                 WHERE state NOT IN ('running') AND id NOT IN (
                     SELECT id FROM workflow_runs WHERE state NOT IN ('running')
                     ORDER BY created_at_ms DESC, id DESC LIMIT ?1)";
            conn.execute(
                &format!("DELETE FROM workflow_steps WHERE workflow_id IN ({OLD})"),
                [keep as i64],
            )
            .map_err(&failed)?;
            conn.execute(
                &format!("DELETE FROM workflow_runs WHERE id IN ({OLD})"),
                [keep as i64],
            )
            .map_err(&failed)
        })
    }
}
