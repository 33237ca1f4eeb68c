//! A fleet's pending approvals (migration 10): a worker copies each
//! pending approval of the runs it carries from its own store into
//! `npc_approvals` ([`PgStore::share_approvals_of`]); any node's API answers
//! the run's oldest pending one there, in one conditional write from
//! `pending` ([`PgStore::answer_approval`]); the worker reads the answers
//! of its runs back ([`PgStore::answers_of`]) and settles its own rows,
//! where the parked call waits. Rows are other machines' input: every text
//! read back is cut in SQL (`left`) and made printable.

use super::{PgStore, pg_error};
use crate::store::StoreError;
use crate::store::approvals::{AnswerRefused, ApprovalRow, Settled, bounded_arguments, state};
use crate::store::queue::state as run_state;
use crate::store::untrusted::{MAX_NAME_CHARS, MAX_TEXT_CHARS};

/// The schema step that adds the table (applied by `schema`).
pub(super) const MIGRATION: &str = r#"
    CREATE TABLE npc_approvals (
        fleet          text    NOT NULL,
        id             text    NOT NULL,
        run_id         text    NOT NULL,
        profile        text,
        tool           text    NOT NULL,
        rule           text    NOT NULL,
        arguments      text    NOT NULL,
        state          text    NOT NULL,
        always         boolean NOT NULL DEFAULT false,
        answer         text,
        answered_by    text,
        asked_at_ms    bigint  NOT NULL,
        answered_at_ms bigint,
        PRIMARY KEY (fleet, id)
    );
    CREATE INDEX npc_approvals_by_run ON npc_approvals (fleet, run_id, state, asked_at_ms);
"#;

/// Answers read back per run in one call.
pub const MAX_ANSWERS_PER_READ: i64 = 64;

fn printable(s: String) -> String {
    crate::stdx::term::printable(&s).into_owned()
}

/// What an answer in the shared store settled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedAnswer {
    pub id: String,
    pub run_id: String,
    pub tool: String,
    pub settled: Settled,
}

impl PgStore {
    /// Copy `rows` (pending approvals of a run this worker carries) into the
    /// shared store; a row already there is left as it is.
    pub async fn share_approvals_of(&self, rows: &[ApprovalRow]) -> Result<(), StoreError> {
        let client = self.client().await?;
        for row in rows.iter().filter(|r| r.state == state::PENDING) {
            client
                .execute(
                    "INSERT INTO npc_approvals (fleet, id, run_id, profile, tool, rule, arguments,
                     state, asked_at_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, 'pending', $8)
                     ON CONFLICT (fleet, id) DO NOTHING",
                    &[
                        &self.fleet(),
                        &row.id,
                        &row.run_id,
                        &row.profile,
                        &row.tool,
                        &row.rule,
                        &bounded_arguments(&row.arguments).to_string(),
                        &row.asked_at_ms,
                    ],
                )
                .await
                .map_err(pg_error("share an approval"))?;
        }
        Ok(())
    }

    /// The answered approvals of run `run_id` (at most [`MAX_ANSWERS_PER_READ`]).
    pub async fn answers_of(&self, run_id: &str) -> Result<Vec<SharedAnswer>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                &format!(
                    "SELECT left(id, {n}), left(run_id, {n}), left(tool, {n}), left(state, {n}),
                     always, left(answer, {t}), left(answered_by, {n}) FROM npc_approvals
                     WHERE fleet = $1 AND run_id = $2 AND state <> 'pending'
                     ORDER BY answered_at_ms DESC LIMIT $3",
                    n = MAX_NAME_CHARS,
                    t = MAX_TEXT_CHARS
                ),
                &[&self.fleet(), &run_id, &MAX_ANSWERS_PER_READ],
            )
            .await
            .map_err(pg_error("read approvals' answers"))?;
        Ok(rows
            .iter()
            .map(|r| SharedAnswer {
                id: printable(r.get(0)),
                run_id: printable(r.get(1)),
                tool: printable(r.get(2)),
                settled: Settled {
                    state: printable(r.get(3)),
                    always: r.get(4),
                    answer: r.get::<_, Option<String>>(5).map(printable),
                    by: r
                        .get::<_, Option<String>>(6)
                        .map(printable)
                        .unwrap_or_default(),
                },
            })
            .collect())
    }

    /// Answer pending approval `approval` of run `run_id` in the shared
    /// store, or its oldest pending one when `None` (one conditional write:
    /// of two answers one wins); what it settled, or why nothing was
    /// answered.
    pub async fn answer_approval(
        &self,
        run_id: &str,
        approval: Option<&str>,
        settled: &Settled,
    ) -> Result<Result<SharedAnswer, AnswerRefused>, StoreError> {
        let id = printable(run_id.chars().take(MAX_NAME_CHARS).collect());
        // The run first: one that ended waits for nothing.
        match self.run_state(run_id).await? {
            None => return Ok(Err(AnswerRefused::NoRun { id })),
            Some(s) if s != run_state::RUNNING && s != run_state::QUEUED => {
                return Ok(Err(AnswerRefused::Ended { id, state: s }));
            }
            Some(_) => {}
        }
        let client = self.client().await?;
        let row = client
            .query_opt(
                &format!(
                    "UPDATE npc_approvals SET state = $3, always = $4, answer = $5,
                     answered_by = $6, answered_at_ms = npc_now_ms()
                     WHERE fleet = $1 AND state = 'pending' AND run_id = $2 AND id = COALESCE($7, (
                         SELECT id FROM npc_approvals WHERE fleet = $1 AND run_id = $2
                         AND state = 'pending' ORDER BY asked_at_ms, id LIMIT 1
                         FOR UPDATE SKIP LOCKED))
                     RETURNING left(id, {n}), left(tool, {n})",
                    n = MAX_NAME_CHARS
                ),
                &[
                    &self.fleet(),
                    &run_id,
                    &settled.state,
                    &settled.always,
                    &settled.answer,
                    &settled.by,
                    &approval,
                ],
            )
            .await
            .map_err(pg_error("answer an approval"))?;
        if let Some(r) = row {
            return Ok(Ok(SharedAnswer {
                id: printable(r.get(0)),
                run_id: run_id.to_string(),
                tool: printable(r.get(1)),
                settled: settled.clone(),
            }));
        }
        let Some(approval) = approval else {
            return Ok(Err(AnswerRefused::NotWaiting { id }));
        };
        let state = client
            .query_opt(
                &format!(
                    "SELECT left(state, {MAX_NAME_CHARS}) FROM npc_approvals
                     WHERE fleet = $1 AND run_id = $2 AND id = $3"
                ),
                &[&self.fleet(), &run_id, &approval],
            )
            .await
            .map_err(pg_error("read an approval"))?;
        let shown = printable(approval.chars().take(MAX_NAME_CHARS).collect());
        Ok(Err(match state {
            None => AnswerRefused::NoApproval {
                run: id,
                approval: shown,
            },
            Some(r) => AnswerRefused::AlreadyAnswered {
                run: id,
                approval: shown,
                state: printable(r.get(0)),
            },
        }))
    }

    async fn run_state(&self, run_id: &str) -> Result<Option<String>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                &format!(
                    "SELECT left(state, {MAX_NAME_CHARS}) FROM npc_runs WHERE fleet = $1 AND id = $2"
                ),
                &[&self.fleet(), &run_id],
            )
            .await
            .map_err(pg_error("read a run"))?;
        Ok(row.map(|r| printable(r.get(0))))
    }
}
