//! Pending approvals (migration 11): one row per `ask` of a run that waits
//! for a person. The process that asks (`npc hook run` inside the agent,
//! or the daemon's gateway) parks the call here ([`Store::park_approval`])
//! and polls its row; whoever answers (`npc runs approve` / `deny` through
//! the daemon, the REST API, the dashboard) moves it from `pending` to
//! `allowed` or `denied` in one conditional write
//! ([`Store::answer_approval`]), so of two answers exactly one wins and the
//! other is refused; the asker moves an unanswered row to `timed_out` the
//! same way ([`Store::expire_approval`]). Rows live in the repository's
//! store, so a pending approval survives a daemon restart. A run with a
//! pending row reads as `waiting` (the `runs` row itself stays `running`:
//! the run holds its slot and its lease). What a row holds of the call is
//! what the `run.waiting` event shows: arguments with secrets redacted, cut
//! to [`MAX_ARGUMENTS_BYTES`]; identical calls are recognised by a
//! fingerprint of the whole call ([`call_fingerprint`]).

use rusqlite::{Connection, OptionalExtension};
use serde::{Deserialize, Serialize};

use super::queue::state as run_state;
use super::untrusted::{MAX_NAME_CHARS, MAX_TEXT_CHARS};
use super::{Pending, Store, StoreError, now_ms, sqlite};

/// Longest arguments text a row keeps (redacted JSON); longer arguments
/// are stored as `{"truncated_from_bytes": N}`.
pub const MAX_ARGUMENTS_BYTES: usize = 16 * 1024;
/// Pending approvals one run may hold at once (an agent asking in a loop
/// is refused past it, which denies the call).
pub const MAX_PENDING_PER_RUN: usize = 16;
/// Longest reason kept with an answer, in characters.
pub const MAX_REASON_CHARS: usize = 1_000;

/// The states of an approval row.
pub mod state {
    pub const PENDING: &str = "pending";
    pub const ALLOWED: &str = "allowed";
    pub const DENIED: &str = "denied";
    pub const TIMED_OUT: &str = "timed_out";
}

/// The schema step that adds the table (applied by `schema`).
pub(super) const MIGRATION: &str = r#"
    CREATE TABLE approvals (
        id             TEXT    PRIMARY KEY,
        run_id         TEXT    NOT NULL,
        profile        TEXT,
        tool           TEXT    NOT NULL,
        rule           TEXT    NOT NULL,
        reason         TEXT,
        arguments      TEXT    NOT NULL,
        fingerprint    TEXT    NOT NULL,
        state          TEXT    NOT NULL,
        always         INTEGER NOT NULL DEFAULT 0,
        answer         TEXT,
        answered_by    TEXT,
        asked_at_ms    INTEGER NOT NULL,
        deadline_ms    INTEGER NOT NULL,
        answered_at_ms INTEGER
    );
    CREATE INDEX approvals_by_run ON approvals (run_id, state, asked_at_ms);
"#;

/// The fingerprint of a call: "identical" calls (for `--always`) are those
/// of the same tool name with equal arguments (JSON values compared whole,
/// object keys in any order).
pub fn call_fingerprint(tool: &str, arguments: &serde_json::Value) -> String {
    use sha2::Digest as _;
    // `serde_json::Value`'s objects are ordered maps: its text is canonical.
    let text = serde_json::to_string(arguments).unwrap_or_default();
    let mut hash = sha2::Sha256::new();
    hash.update(tool.as_bytes());
    hash.update([0]);
    hash.update(text.as_bytes());
    hex::encode(hash.finalize())
}

/// A call to park.
#[derive(Debug, Clone)]
pub struct NewApproval {
    pub id: String,
    pub run_id: String,
    pub profile: Option<String>,
    pub tool: String,
    pub rule: String,
    pub reason: Option<String>,
    /// Redacted arguments (cut to [`MAX_ARGUMENTS_BYTES`] here).
    pub arguments: serde_json::Value,
    /// [`call_fingerprint`] of the unredacted call.
    pub fingerprint: String,
    pub deadline_ms: i64,
}

/// What parking a call came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parked {
    /// The row is pending.
    Waiting,
    /// An identical call of the run was allowed with `--always`: no row.
    AlwaysAllowed,
    /// The run holds [`MAX_PENDING_PER_RUN`] pending approvals already.
    TooMany,
}

/// One approval as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRow {
    pub id: String,
    pub run_id: String,
    pub profile: Option<String>,
    pub tool: String,
    pub rule: String,
    pub reason: Option<String>,
    pub arguments: serde_json::Value,
    pub state: String,
    pub always: bool,
    /// The deny reason (a person's or the timeout's).
    pub answer: Option<String>,
    pub answered_by: Option<String>,
    pub asked_at_ms: i64,
    pub deadline_ms: i64,
    pub answered_at_ms: Option<i64>,
}

/// A person's answer to the oldest pending approval of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Allow { always: bool },
    Deny { reason: Option<String> },
}

/// Why an answer was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerRefused {
    #[error("no run `{id}`; list runs with `npc runs`")]
    NoRun { id: String },
    #[error(
        "run `{id}` is {state}: nothing waits for an answer (a run that ended or was interrupted cannot be answered)"
    )]
    Ended { id: String, state: String },
    #[error(
        "run `{id}` waits for no approval (already answered, or it never asked); see `npc runs show {id}`"
    )]
    NotWaiting { id: String },
    #[error("run `{run}` has no approval `{approval}`; see `npc runs show {run}`")]
    NoApproval { run: String, approval: String },
    #[error(
        "approval `{approval}` was already answered ({state}); nothing was answered now, see `npc runs show {run}`"
    )]
    AlreadyAnswered {
        run: String,
        approval: String,
        state: String,
    },
}

const ROW_COLUMNS: &str = "id, run_id, profile, tool, rule, reason, arguments, state, always, \
     answer, answered_by, asked_at_ms, deadline_ms, answered_at_ms";

/// A row as read back: every text cut to its bound (another process wrote
/// it), the arguments parsed (text that is not JSON reads as a string).
fn row_of(r: &rusqlite::Row<'_>) -> rusqlite::Result<ApprovalRow> {
    let name = |i: usize| -> rusqlite::Result<String> {
        let s: String = r.get(i)?;
        Ok(cut(&s, MAX_NAME_CHARS))
    };
    let text = |i: usize| -> rusqlite::Result<Option<String>> {
        let s: Option<String> = r.get(i)?;
        Ok(s.map(|s| cut(&s, MAX_TEXT_CHARS)))
    };
    let arguments: String = r.get(6)?;
    let arguments = if arguments.len() > MAX_ARGUMENTS_BYTES + 64 {
        serde_json::json!({ "truncated_from_bytes": arguments.len() })
    } else {
        serde_json::from_str(&arguments).unwrap_or(serde_json::Value::String(arguments))
    };
    Ok(ApprovalRow {
        id: name(0)?,
        run_id: name(1)?,
        profile: r
            .get::<_, Option<String>>(2)?
            .map(|s| cut(&s, MAX_NAME_CHARS)),
        tool: name(3)?,
        rule: cut(&r.get::<_, String>(4)?, MAX_TEXT_CHARS),
        reason: text(5)?,
        arguments,
        state: name(7)?,
        always: r.get::<_, i64>(8)? != 0,
        answer: text(9)?,
        answered_by: r
            .get::<_, Option<String>>(10)?
            .map(|s| cut(&s, MAX_NAME_CHARS)),
        asked_at_ms: r.get(11)?,
        deadline_ms: r.get(12)?,
        answered_at_ms: r.get(13)?,
    })
}

fn cut(s: &str, chars: usize) -> String {
    crate::stdx::term::printable(&s.chars().take(chars).collect::<String>()).into_owned()
}

/// Arguments as stored: their JSON text, or a marker when longer than
/// [`MAX_ARGUMENTS_BYTES`].
pub fn bounded_arguments(arguments: &serde_json::Value) -> serde_json::Value {
    let text = serde_json::to_string(arguments).unwrap_or_default();
    if text.len() > MAX_ARGUMENTS_BYTES {
        serde_json::json!({ "truncated_from_bytes": text.len() })
    } else {
        arguments.clone()
    }
}

fn park(conn: &Connection, new: &NewApproval) -> Result<Parked, StoreError> {
    let failed = sqlite("park an approval");
    let always: Option<i64> = conn
        .prepare_cached(
            "SELECT 1 FROM approvals WHERE run_id = ?1 AND fingerprint = ?2
             AND state = 'allowed' AND always = 1 LIMIT 1",
        )
        .and_then(|mut s| {
            s.query_row((&new.run_id, &new.fingerprint), |r| r.get(0))
                .optional()
        })
        .map_err(&failed)?;
    if always.is_some() {
        return Ok(Parked::AlwaysAllowed);
    }
    let pending: i64 = conn
        .prepare_cached("SELECT COUNT(*) FROM approvals WHERE run_id = ?1 AND state = 'pending'")
        .and_then(|mut s| s.query_row([&new.run_id], |r| r.get(0)))
        .map_err(&failed)?;
    if usize::try_from(pending).unwrap_or(usize::MAX) >= MAX_PENDING_PER_RUN {
        return Ok(Parked::TooMany);
    }
    conn.prepare_cached(
        "INSERT INTO approvals (id, run_id, profile, tool, rule, reason, arguments,
         fingerprint, state, asked_at_ms, deadline_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 'pending', ?9, ?10)",
    )
    .and_then(|mut s| {
        s.execute((
            &new.id,
            &new.run_id,
            &new.profile,
            &new.tool,
            &new.rule,
            &new.reason,
            bounded_arguments(&new.arguments).to_string(),
            &new.fingerprint,
            now_ms(),
            new.deadline_ms,
        ))
    })
    .map_err(&failed)?;
    Ok(Parked::Waiting)
}

fn answer(
    conn: &Connection,
    run_id: &str,
    approval: Option<&str>,
    answer: &Answer,
    by: &str,
) -> Result<Result<ApprovalRow, AnswerRefused>, StoreError> {
    let failed = sqlite("answer an approval");
    // The run first: a run that ended (or was interrupted with its agent)
    // waits for nothing, whatever rows it left pending.
    let run: Option<String> = conn
        .prepare_cached("SELECT state FROM runs WHERE id = ?1")
        .and_then(|mut s| s.query_row([run_id], |r| r.get(0)).optional())
        .map_err(&failed)?;
    let shown = cut(run_id, MAX_NAME_CHARS);
    match run {
        None => return Ok(Err(AnswerRefused::NoRun { id: shown })),
        Some(s) if s != run_state::RUNNING && s != run_state::QUEUED => {
            return Ok(Err(AnswerRefused::Ended {
                id: shown,
                state: cut(&s, MAX_NAME_CHARS),
            }));
        }
        Some(_) => {}
    }
    let id = if let Some(approval) = approval {
        // The question a person saw: answered already, it is not the next
        // one that gets this answer.
        let state: Option<String> = conn
            .prepare_cached("SELECT state FROM approvals WHERE id = ?1 AND run_id = ?2")
            .and_then(|mut s| s.query_row([approval, run_id], |r| r.get(0)).optional())
            .map_err(&failed)?;
        let approval_shown = cut(approval, MAX_NAME_CHARS);
        match state {
            None => {
                return Ok(Err(AnswerRefused::NoApproval {
                    run: shown,
                    approval: approval_shown,
                }));
            }
            Some(s) if s != state::PENDING => {
                return Ok(Err(AnswerRefused::AlreadyAnswered {
                    run: shown,
                    approval: approval_shown,
                    state: cut(&s, MAX_NAME_CHARS),
                }));
            }
            Some(_) => approval.to_string(),
        }
    } else {
        let oldest: Option<String> = conn
            .prepare_cached(
                "SELECT id FROM approvals WHERE run_id = ?1 AND state = 'pending'
                 ORDER BY asked_at_ms, id LIMIT 1",
            )
            .and_then(|mut s| s.query_row([run_id], |r| r.get(0)).optional())
            .map_err(&failed)?;
        let Some(id) = oldest else {
            return Ok(Err(AnswerRefused::NotWaiting { id: shown }));
        };
        id
    };
    settle(conn, &id, &Settled::of(answer, by))?;
    let row = conn
        .prepare_cached(&format!(
            "SELECT {ROW_COLUMNS} FROM approvals WHERE id = ?1"
        ))
        .and_then(|mut s| s.query_row([&id], row_of))
        .map_err(&failed)?;
    Ok(Ok(row))
}

/// An answer as it moves a row from `pending` (a person's, or one read
/// from a fleet's shared store).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled {
    /// `allowed` or `denied` (anything else is taken as `denied`).
    pub state: String,
    pub always: bool,
    pub answer: Option<String>,
    pub by: String,
}

impl Settled {
    /// A person's `answer`, given through `by` (`cli`, `api`); a deny
    /// reason is cut to [`MAX_REASON_CHARS`].
    pub fn of(answer: &Answer, by: &str) -> Self {
        let (state, always, answer) = match answer {
            Answer::Allow { always } => (state::ALLOWED, *always, None),
            Answer::Deny { reason } => (
                state::DENIED,
                false,
                Some(
                    reason
                        .as_deref()
                        .map(|r| r.chars().take(MAX_REASON_CHARS).collect::<String>())
                        .unwrap_or_else(|| "denied by a person".to_string()),
                ),
            ),
        };
        Self {
            state: state.to_string(),
            always,
            answer,
            by: by.to_string(),
        }
    }
}

/// Move approval `id` from `pending` as `settled` says; whether it moved.
fn settle(conn: &Connection, id: &str, settled: &Settled) -> Result<bool, StoreError> {
    let to = if settled.state == state::ALLOWED {
        state::ALLOWED
    } else {
        state::DENIED
    };
    conn.prepare_cached(
        "UPDATE approvals SET state = ?2, always = ?3, answer = ?4, answered_by = ?5,
         answered_at_ms = ?6 WHERE id = ?1 AND state = 'pending'",
    )
    .and_then(|mut s| {
        s.execute((
            id,
            to,
            settled.always && to == state::ALLOWED,
            &settled.answer,
            &settled.by,
            now_ms(),
        ))
    })
    .map(|n| n > 0)
    .map_err(sqlite("answer an approval"))
}

impl Store {
    /// Park a call of a run (see [`Parked`]).
    pub fn park_approval(&self, new: NewApproval) -> Pending<Parked> {
        self.write(move |conn| park(conn, &new))
    }

    /// Answer pending approval `approval` of run `run_id`, or its oldest
    /// pending one when `None` (`by`: who, such as `cli` or `api`); the
    /// answered row, or why nothing was answered.
    pub fn answer_approval(
        &self,
        run_id: impl Into<String>,
        approval: Option<String>,
        reply: Answer,
        by: &'static str,
    ) -> Pending<Result<ApprovalRow, AnswerRefused>> {
        let run_id = run_id.into();
        self.write(move |conn| answer(conn, &run_id, approval.as_deref(), &reply, by))
    }

    /// Settle pending approval `id` with an answer given elsewhere (a
    /// fleet's shared store); the row, when this moved it.
    pub fn settle_approval(
        &self,
        id: impl Into<String>,
        settled: Settled,
    ) -> Pending<Option<ApprovalRow>> {
        let id = id.into();
        self.write(move |conn| {
            if !settle(conn, &id, &settled)? {
                return Ok(None);
            }
            conn.prepare_cached(&format!(
                "SELECT {ROW_COLUMNS} FROM approvals WHERE id = ?1"
            ))
            .and_then(|mut s| s.query_row([&id], row_of))
            .map(Some)
            .map_err(sqlite("answer an approval"))
        })
    }

    /// Move approval `id` from `pending` to `timed_out` with `reason`;
    /// resolves to whether it moved (an answer that came first wins).
    pub fn expire_approval(&self, id: impl Into<String>, reason: String) -> Pending<bool> {
        let id = id.into();
        self.write(move |conn| {
            conn.prepare_cached(
                "UPDATE approvals SET state = 'timed_out', answer = ?2, answered_by = 'timeout',
                 answered_at_ms = ?3 WHERE id = ?1 AND state = 'pending'",
            )
            .and_then(|mut s| s.execute((&id, &reason, now_ms())))
            .map(|n| n > 0)
            .map_err(sqlite("expire an approval"))
        })
    }

    /// Approval `id`, if stored.
    pub fn approval(&self, id: &str) -> Result<Option<ApprovalRow>, StoreError> {
        self.read("read an approval", |conn| {
            conn.prepare_cached(&format!(
                "SELECT {ROW_COLUMNS} FROM approvals WHERE id = ?1"
            ))?
            .query_row([id], row_of)
            .optional()
        })
    }

    /// The approvals of run `run_id`, oldest first (at most
    /// [`MAX_PENDING_PER_RUN`] pending and the latest answered ones, up to
    /// `limit`).
    pub fn run_approvals(
        &self,
        run_id: &str,
        limit: usize,
    ) -> Result<Vec<ApprovalRow>, StoreError> {
        self.read("read a run's approvals", |conn| {
            conn.prepare_cached(&format!(
                "SELECT {ROW_COLUMNS} FROM (SELECT * FROM approvals WHERE run_id = ?1
                 ORDER BY asked_at_ms DESC, id DESC LIMIT ?2) ORDER BY asked_at_ms, id"
            ))?
            .query_map((run_id, limit as i64), row_of)?
            .collect()
        })
    }
}
