//! [`AcpSessions`] over PostgreSQL: `npc acp`'s sessions shared by every
//! machine of the fleet (`npc_acp_sessions`, `npc_acp_session_runs` with
//! the host each prompt's run ran on), and the runs' agent events that
//! `session/load` replays, copied from the machine that carried the run
//! out (`npc_acp_events`, at most `MAX_REPLAYED_EVENTS_PER_RUN` a run).
//! Times are the database's clock, so sessions order the same whichever
//! machine touched them last.

use std::sync::LazyLock;

use tokio_postgres::Row;

use super::{PgStore, pg_error};
use crate::store::acp::{
    AcpSession, AcpSessionRun, AcpSessions, MAX_REPLAYED_EVENTS_PER_RUN, MAX_RUNS_PER_SESSION,
    MAX_SESSIONS_PER_READ, NewAcpRun,
};
use crate::store::fleet::StoreFuture;
use crate::store::queue::run_component;
use crate::store::{Event, StoreError, json_error, untrusted};

/// A session's columns as read: other machines wrote them, so each is cut
/// to its bound ([`untrusted`]) and made printable by [`session_of`].
static SESSION_COLUMNS: LazyLock<String> = LazyLock::new(|| {
    let name = |col: &str| {
        format!(
            "{} AS {col}",
            untrusted::pg_text(col, untrusted::MAX_NAME_CHARS)
        )
    };
    let text = |col: &str| {
        format!(
            "{} AS {col}",
            untrusted::pg_text(col, untrusted::MAX_TEXT_CHARS)
        )
    };
    [
        name("id"),
        name("profile"),
        text("cwd"),
        text("title"),
        name("forked_from"),
        "created_at_ms".to_string(),
        "updated_at_ms".to_string(),
    ]
    .join(", ")
});

/// A session's runs, `$1` the fleet, `$2` the session, `$3` the most: each
/// text cut to its bound.
static SESSION_RUNS_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT seq, {}, {}, {} FROM npc_acp_session_runs
         WHERE fleet = $1 AND session_id = $2 ORDER BY seq LIMIT $3",
        untrusted::pg_text("run_id", untrusted::MAX_NAME_CHARS),
        untrusted::pg_text("prompt", untrusted::MAX_PROMPT_CHARS),
        untrusted::pg_text("host", untrusted::MAX_NAME_CHARS),
    )
});

/// A run's agent events, `$1` the fleet, `$2` the run, `$3` the most: each
/// kind and payload cut to its bound, the page to
/// [`untrusted::MAX_PAGE_BYTES`].
static REPLAYED_SQL: LazyLock<String> = LazyLock::new(|| {
    untrusted::pg_budgeted(
        &format!(
            "SELECT seq, ts_ms, {} AS kind, {} AS payload,
                 {} AS bytes
             FROM npc_acp_events WHERE fleet = $1 AND run_id = $2 ORDER BY seq LIMIT $3",
            untrusted::pg_text("kind", untrusted::MAX_KIND_CHARS),
            untrusted::pg_json("payload", untrusted::MAX_EVENT_PAYLOAD_BYTES),
            untrusted::pg_size("payload", untrusted::MAX_EVENT_PAYLOAD_BYTES),
        ),
        "seq, ts_ms, kind, payload",
        "seq",
    )
});

fn session_of(row: &Row) -> AcpSession {
    AcpSession {
        id: untrusted::text(row.get("id")),
        profile: untrusted::text(row.get("profile")),
        cwd: untrusted::text(row.get("cwd")),
        title: untrusted::opt_text(row.get("title")),
        forked_from: untrusted::opt_text(row.get("forked_from")),
        created_at_ms: row.get("created_at_ms"),
        updated_at_ms: row.get("updated_at_ms"),
    }
}

impl PgStore {
    async fn create_session(&self, session: AcpSession) -> Result<(), StoreError> {
        let failed = pg_error("record an acp session");
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(&failed)?;
        tx.execute(
            "INSERT INTO npc_acp_sessions (fleet, id, profile, cwd, title, forked_from,
             created_at_ms, updated_at_ms)
             VALUES ($1, $2, $3, $4, $5, $6, npc_now_ms(), npc_now_ms())",
            &[
                &self.fleet(),
                &session.id,
                &session.profile,
                &session.cwd,
                &session.title,
                &session.forked_from,
            ],
        )
        .await
        .map_err(&failed)?;
        if let Some(parent) = &session.forked_from {
            tx.execute(
                "INSERT INTO npc_acp_session_runs (fleet, session_id, seq, run_id, prompt, host)
                 SELECT fleet, $2, seq, run_id, prompt, host FROM npc_acp_session_runs
                 WHERE fleet = $1 AND session_id = $3",
                &[&self.fleet(), &session.id, parent],
            )
            .await
            .map_err(&failed)?;
        }
        tx.commit().await.map_err(&failed)
    }

    async fn add_session_run(&self, run: NewAcpRun) -> Result<(), StoreError> {
        let failed = pg_error("record an acp session's run");
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(&failed)?;
        // The session's row lock orders two prompts' `seq`.
        let updated = tx
            .execute(
                "UPDATE npc_acp_sessions SET updated_at_ms = npc_now_ms(),
                 title = COALESCE(title, $3) WHERE fleet = $1 AND id = $2",
                &[&self.fleet(), &run.session_id, &run.title],
            )
            .await
            .map_err(&failed)?;
        if updated == 0 {
            return Err(StoreError::Postgres {
                op: "record an acp session's run",
                message: "the session is not in the fleet's store".into(),
            });
        }
        tx.execute(
            "INSERT INTO npc_acp_session_runs (fleet, session_id, seq, run_id, prompt, host)
             VALUES ($1, $2, (SELECT COALESCE(MAX(seq), 0) + 1 FROM npc_acp_session_runs
                              WHERE fleet = $1 AND session_id = $2), $3, $4, $5)",
            &[
                &self.fleet(),
                &run.session_id,
                &run.run_id,
                &run.prompt,
                &run.host,
            ],
        )
        .await
        .map_err(&failed)?;
        tx.commit().await.map_err(&failed)
    }

    async fn session_row(&self, id: &str) -> Result<Option<AcpSession>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                &format!(
                    "SELECT {} FROM npc_acp_sessions WHERE fleet = $1 AND id = $2",
                    *SESSION_COLUMNS
                ),
                &[&self.fleet(), &id],
            )
            .await
            .map_err(pg_error("read an acp session"))?;
        Ok(row.as_ref().map(session_of))
    }

    async fn session_rows(
        &self,
        cwd: Option<&str>,
        before: Option<(i64, &str)>,
        limit: usize,
    ) -> Result<Vec<AcpSession>, StoreError> {
        let client = self.client().await?;
        let limit = i64::try_from(limit.min(MAX_SESSIONS_PER_READ)).unwrap_or(i64::MAX);
        let (before_ms, before_id) = before.map_or((None, ""), |(ms, id)| (Some(ms), id));
        let rows = client
            .query(
                &format!(
                    "SELECT {} FROM npc_acp_sessions
                     WHERE fleet = $1 AND ($2::text IS NULL OR cwd = $2)
                       AND ($3::bigint IS NULL OR (updated_at_ms, id) < ($3, $4))
                     ORDER BY updated_at_ms DESC, id DESC LIMIT $5",
                    *SESSION_COLUMNS
                ),
                &[&self.fleet(), &cwd, &before_ms, &before_id, &limit],
            )
            .await
            .map_err(pg_error("list acp sessions"))?;
        Ok(rows.iter().map(session_of).collect())
    }

    async fn session_runs(&self, id: &str) -> Result<Vec<AcpSessionRun>, StoreError> {
        let client = self.client().await?;
        let limit = i64::try_from(MAX_RUNS_PER_SESSION).unwrap_or(i64::MAX);
        let rows = client
            .query(&*SESSION_RUNS_SQL, &[&self.fleet(), &id, &limit])
            .await
            .map_err(pg_error("read an acp session's runs"))?;
        Ok(rows
            .iter()
            .map(|row| AcpSessionRun {
                seq: row.get(0),
                run_id: untrusted::text(row.get(1)),
                prompt: untrusted::text(row.get(2)),
                host: untrusted::opt_text(row.get(3)),
            })
            .collect())
    }

    async fn replayed_events(&self, run_id: &str) -> Result<Vec<Event>, StoreError> {
        let client = self.client().await?;
        let limit = i64::try_from(MAX_REPLAYED_EVENTS_PER_RUN).unwrap_or(i64::MAX);
        let rows = client
            .query(&*REPLAYED_SQL, &[&self.fleet(), &run_id, &limit])
            .await
            .map_err(pg_error("read a run's agent events"))?;
        rows.iter()
            .map(|row| {
                let payload: String = row.get(3);
                Ok(Event {
                    id: row.get(0),
                    ts_ms: row.get(1),
                    kind: untrusted::text(row.get(2)),
                    component: Some(run_component(run_id)),
                    payload: untrusted::json(
                        serde_json::from_str(&payload).map_err(json_error("event payload"))?,
                    ),
                })
            })
            .collect()
    }

    async fn keep_events(&self, run_id: &str, events: Vec<Event>) -> Result<(), StoreError> {
        let failed = pg_error("copy a run's agent events");
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(&failed)?;
        let insert = tx
            .prepare(
                "INSERT INTO npc_acp_events (fleet, run_id, seq, ts_ms, kind, payload)
                 VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
            )
            .await
            .map_err(&failed)?;
        let agent = events.iter().filter(|e| e.kind.starts_with("agent."));
        for (seq, event) in agent.take(MAX_REPLAYED_EVENTS_PER_RUN).enumerate() {
            let seq = i64::try_from(seq).unwrap_or(i64::MAX);
            tx.execute(
                &insert,
                &[
                    &self.fleet(),
                    &run_id,
                    &seq,
                    &event.ts_ms,
                    &event.kind,
                    &event.payload.to_string(),
                ],
            )
            .await
            .map_err(&failed)?;
        }
        tx.commit().await.map_err(&failed)
    }
}

impl AcpSessions for PgStore {
    fn create(&self, session: AcpSession) -> StoreFuture<'_, ()> {
        Box::pin(self.create_session(session))
    }

    fn add_run(&self, run: NewAcpRun) -> StoreFuture<'_, ()> {
        Box::pin(self.add_session_run(run))
    }

    fn session<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<AcpSession>> {
        Box::pin(self.session_row(id))
    }

    fn sessions<'a>(
        &'a self,
        cwd: Option<&'a str>,
        before: Option<(i64, &'a str)>,
        limit: usize,
    ) -> StoreFuture<'a, Vec<AcpSession>> {
        Box::pin(self.session_rows(cwd, before, limit))
    }

    fn runs<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Vec<AcpSessionRun>> {
        Box::pin(self.session_runs(id))
    }

    fn agent_events<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Vec<Event>> {
        Box::pin(self.replayed_events(run_id))
    }

    fn keep_agent_events<'a>(&'a self, run_id: &'a str, events: Vec<Event>) -> StoreFuture<'a, ()> {
        Box::pin(self.keep_events(run_id, events))
    }

    fn shared(&self) -> bool {
        true
    }
}
