//! Sessions of `npc acp` (migration 3): one row per session in
//! `acp_sessions` (its profile, working directory, title, the session it was
//! forked from) and one row per prompt in `acp_session_runs` (the run the
//! prompt started and the prompt's text). What a session streamed is not
//! copied here: it is the runs' own events (component `run.<id>`), which
//! `session/load` replays. This module only reads and writes rows.
//!
//! [`AcpSessions`] is the seam `npc acp` keeps its sessions through: this
//! machine's store, or, with `[store] url`, the fleet's PostgreSQL
//! (`store::pg`), where every machine of the fleet lists, loads, resumes
//! and forks them; there a run's agent events are copied once its prompt
//! ended ([`AcpSessions::keep_agent_events`]), since the run itself is
//! recorded on the machine that carried it out.

use std::fmt::Debug;

use rusqlite::{OptionalExtension, Row};

use super::fleet::StoreFuture;
use super::{Event, Pending, Store, StoreError, now_ms, sqlite};

/// Most sessions one listing returns.
pub const MAX_SESSIONS_PER_READ: usize = 1_000;
/// Most runs of one session read back (oldest first).
pub const MAX_RUNS_PER_SESSION: usize = 1_000;
/// Most events of one run replayed by `session/load`.
pub const MAX_REPLAYED_EVENTS_PER_RUN: usize = super::MAX_EVENTS_PER_READ;

/// A stored ACP session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcpSession {
    pub id: String,
    pub profile: String,
    /// The working directory the client gave (`session/new`'s `cwd`).
    pub cwd: String,
    pub title: Option<String>,
    /// The session this one was forked from.
    pub forked_from: Option<String>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
}

/// One prompt of a session: the run it started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcpSessionRun {
    pub seq: i64,
    pub run_id: String,
    pub prompt: String,
    /// The host the run ran on, where sessions are shared by a fleet
    /// (`None` in one machine's store).
    pub host: Option<String>,
}

/// A prompt's run to add to a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewAcpRun {
    pub session_id: String,
    pub run_id: String,
    pub prompt: String,
    /// The session's title if it has none yet.
    pub title: String,
    /// The host the run runs on.
    pub host: String,
}

/// Where `npc acp` keeps its sessions (see the module docs).
pub trait AcpSessions: Send + Sync + Debug {
    /// Record a new session (its runs are copied from `forked_from`'s, when
    /// given).
    fn create(&self, session: AcpSession) -> StoreFuture<'_, ()>;
    /// Append a prompt's run to its session, which becomes the most
    /// recently updated; the first prompt names an untitled session.
    fn add_run(&self, run: NewAcpRun) -> StoreFuture<'_, ()>;
    /// Session `id`, if recorded.
    fn session<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<AcpSession>>;
    /// Up to `limit` sessions, most recently updated first, after the
    /// cursor `before`; with `cwd`, only sessions of that directory.
    fn sessions<'a>(
        &'a self,
        cwd: Option<&'a str>,
        before: Option<(i64, &'a str)>,
        limit: usize,
    ) -> StoreFuture<'a, Vec<AcpSession>>;
    /// The runs of session `id`, oldest first.
    fn runs<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Vec<AcpSessionRun>>;
    /// The agent events of run `run_id` (kinds `agent.*`), oldest first.
    fn agent_events<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Vec<Event>>;
    /// Keep run `run_id`'s agent events (oldest first, at most
    /// [`MAX_REPLAYED_EVENTS_PER_RUN`]) where every reader of these
    /// sessions finds them; again is a no-op.
    fn keep_agent_events<'a>(&'a self, run_id: &'a str, events: Vec<Event>) -> StoreFuture<'a, ()>;
    /// Whether other machines read these sessions (a fleet's).
    fn shared(&self) -> bool;
}

fn session_row(row: &Row<'_>) -> rusqlite::Result<AcpSession> {
    Ok(AcpSession {
        id: row.get(0)?,
        profile: row.get(1)?,
        cwd: row.get(2)?,
        title: row.get(3)?,
        forked_from: row.get(4)?,
        created_at_ms: row.get(5)?,
        updated_at_ms: row.get(6)?,
    })
}

const SESSION_COLUMNS: &str = "id, profile, cwd, title, forked_from, created_at_ms, updated_at_ms";

impl Store {
    /// Record a new session (its runs are copied from `forked_from`'s, when given).
    pub fn create_acp_session(&self, session: AcpSession) -> Pending<()> {
        self.write(move |conn| {
            let failed = sqlite("record an acp session");
            conn.execute(
                "INSERT INTO acp_sessions (id, profile, cwd, title, forked_from, created_at_ms, updated_at_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                (
                    &session.id,
                    &session.profile,
                    &session.cwd,
                    &session.title,
                    &session.forked_from,
                    session.created_at_ms,
                    session.updated_at_ms,
                ),
            )
            .map_err(&failed)?;
            if let Some(parent) = &session.forked_from {
                conn.execute(
                    "INSERT INTO acp_session_runs (session_id, seq, run_id, prompt)
                     SELECT ?1, seq, run_id, prompt FROM acp_session_runs WHERE session_id = ?2",
                    (&session.id, parent),
                )
                .map_err(&failed)?;
            }
            Ok(())
        })
    }

    /// Append run `run_id` (started by `prompt`) to session `session_id`,
    /// which becomes the most recently updated; the first prompt names an
    /// untitled session.
    pub fn add_acp_session_run(
        &self,
        session_id: impl Into<String>,
        run_id: impl Into<String>,
        prompt: impl Into<String>,
        title: impl Into<String>,
    ) -> Pending<()> {
        let (session_id, run_id, prompt, title) = (
            session_id.into(),
            run_id.into(),
            prompt.into(),
            title.into(),
        );
        self.write(move |conn| {
            let failed = sqlite("record an acp session's run");
            conn.execute(
                "INSERT INTO acp_session_runs (session_id, seq, run_id, prompt)
                 VALUES (?1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM acp_session_runs WHERE session_id = ?1), ?2, ?3)",
                (&session_id, &run_id, &prompt),
            )
            .map_err(&failed)?;
            conn.execute(
                "UPDATE acp_sessions SET updated_at_ms = ?2, title = COALESCE(title, ?3) WHERE id = ?1",
                (&session_id, now_ms(), &title),
            )
            .map_err(&failed)?;
            Ok(())
        })
    }

    /// Session `id`, if recorded.
    pub fn acp_session(&self, id: &str) -> Result<Option<AcpSession>, StoreError> {
        self.read("read an acp session", |conn| {
            conn.query_row(
                &format!("SELECT {SESSION_COLUMNS} FROM acp_sessions WHERE id = ?1"),
                [id],
                session_row,
            )
            .optional()
        })
    }

    /// Up to `limit` sessions, most recently updated first, after the cursor
    /// `before` (the `(updated_at_ms, id)` of the last one a page listed);
    /// with `cwd`, only sessions of that directory.
    pub fn acp_sessions(
        &self,
        cwd: Option<&str>,
        before: Option<(i64, &str)>,
        limit: usize,
    ) -> Result<Vec<AcpSession>, StoreError> {
        let limit = limit.min(MAX_SESSIONS_PER_READ) as i64;
        let (before_ms, before_id) = before.map_or((None, ""), |(ms, id)| (Some(ms), id));
        self.read("list acp sessions", |conn| {
            conn.prepare_cached(&format!(
                "SELECT {SESSION_COLUMNS} FROM acp_sessions
                 WHERE (?1 IS NULL OR cwd = ?1)
                   AND (?2 IS NULL OR (updated_at_ms, id) < (?2, ?3))
                 ORDER BY updated_at_ms DESC, id DESC LIMIT ?4"
            ))?
            .query_map((cwd, before_ms, before_id, limit), session_row)?
            .collect()
        })
    }

    /// The runs of session `id`, oldest first.
    pub fn acp_session_runs(&self, id: &str) -> Result<Vec<AcpSessionRun>, StoreError> {
        self.read("read an acp session's runs", |conn| {
            conn.prepare_cached(
                "SELECT seq, run_id, prompt FROM acp_session_runs WHERE session_id = ?1
                 ORDER BY seq LIMIT ?2",
            )?
            .query_map((id, MAX_RUNS_PER_SESSION as i64), |row| {
                Ok(AcpSessionRun {
                    seq: row.get(0)?,
                    run_id: row.get(1)?,
                    prompt: row.get(2)?,
                    host: None,
                })
            })?
            .collect()
        })
    }

    /// The agent's own session id of run `run_id` (its first
    /// `agent.started` that names one), cut to [`MAX_AGENT_SESSION_BYTES`]
    /// and refused when it holds control characters (a row is input).
    pub fn agent_session_of_run(&self, run_id: &str) -> Result<Option<String>, StoreError> {
        let events = self.events_where(
            "component = ?1 AND kind = 'agent.started' ORDER BY id LIMIT ?2",
            (super::queue::run_component(run_id), 16i64),
        )?;
        Ok(events.into_iter().find_map(|e| {
            let id = e.payload.get("session_id")?.as_str()?;
            (!id.is_empty()
                && id.len() <= MAX_AGENT_SESSION_BYTES
                && !id.chars().any(char::is_control))
            .then(|| id.to_string())
        }))
    }

    /// The recorded agent events of run `run_id` (kinds `agent.*`), oldest first.
    pub fn run_agent_events(&self, run_id: &str) -> Result<Vec<Event>, StoreError> {
        self.events_where(
            "component = ?1 AND kind >= 'agent.' AND kind < 'agent/' ORDER BY id LIMIT ?2",
            (
                super::queue::run_component(run_id),
                MAX_REPLAYED_EVENTS_PER_RUN as i64,
            ),
        )
    }
}

/// Longest agent session id npc continues (`npc run --resume`).
pub const MAX_AGENT_SESSION_BYTES: usize = 256;

/// One machine's sessions: rows of this store, the runs' events already
/// in it.
impl AcpSessions for Store {
    fn create(&self, session: AcpSession) -> StoreFuture<'_, ()> {
        Box::pin(self.create_acp_session(session))
    }

    fn add_run(&self, run: NewAcpRun) -> StoreFuture<'_, ()> {
        Box::pin(self.add_acp_session_run(run.session_id, run.run_id, run.prompt, run.title))
    }

    fn session<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<AcpSession>> {
        Box::pin(std::future::ready(self.acp_session(id)))
    }

    fn sessions<'a>(
        &'a self,
        cwd: Option<&'a str>,
        before: Option<(i64, &'a str)>,
        limit: usize,
    ) -> StoreFuture<'a, Vec<AcpSession>> {
        Box::pin(std::future::ready(self.acp_sessions(cwd, before, limit)))
    }

    fn runs<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Vec<AcpSessionRun>> {
        Box::pin(std::future::ready(self.acp_session_runs(id)))
    }

    fn agent_events<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Vec<Event>> {
        Box::pin(std::future::ready(self.run_agent_events(run_id)))
    }

    fn keep_agent_events<'a>(
        &'a self,
        _run_id: &'a str,
        _events: Vec<Event>,
    ) -> StoreFuture<'a, ()> {
        Box::pin(std::future::ready(Ok(())))
    }

    fn shared(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(id: &str, cwd: &str, at: i64, forked_from: Option<&str>) -> AcpSession {
        AcpSession {
            id: id.into(),
            profile: "dev".into(),
            cwd: cwd.into(),
            title: None,
            forked_from: forked_from.map(str::to_string),
            created_at_ms: at,
            updated_at_ms: at,
        }
    }

    #[test]
    fn sessions_and_their_runs_round_trip_and_a_fork_copies_the_runs() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("state.db")).unwrap();
        store
            .create_acp_session(session("a", "/w", 1, None))
            .wait()
            .unwrap();
        store
            .create_acp_session(session("b", "/other", 2, None))
            .wait()
            .unwrap();
        store
            .add_acp_session_run("a", "run-1", "first", "first title")
            .wait()
            .unwrap();
        store
            .add_acp_session_run("a", "run-2", "second", "second title")
            .wait()
            .unwrap();
        let a = store.acp_session("a").unwrap().unwrap();
        assert_eq!(a.title.as_deref(), Some("first title"));
        let runs = store.acp_session_runs("a").unwrap();
        assert_eq!(
            runs.iter().map(|r| r.run_id.as_str()).collect::<Vec<_>>(),
            ["run-1", "run-2"]
        );
        store
            .create_acp_session(session("c", "/w", 3, Some("a")))
            .wait()
            .unwrap();
        assert_eq!(store.acp_session_runs("c").unwrap(), runs);
        let listed: Vec<String> = store
            .acp_sessions(Some("/w"), None, 10)
            .unwrap()
            .into_iter()
            .map(|s| s.id)
            .collect();
        assert_eq!(listed, ["a", "c"]);
        assert!(store.acp_session("missing").unwrap().is_none());
    }
}
