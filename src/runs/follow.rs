//! Following a run the daemon carries out, for the front end that asked
//! for it (`npc run`, a prompt of `npc acp`): its events are read from the
//! store (component `run.<id>`), page by page, until its `run.finished`; a
//! quiet run is polled with a backoff up to [`FOLLOW_POLL_MAX`], and every
//! [`FOLLOW_CHECK_EVERY`] of quiet the follower looks whether the run's
//! row ended without a `run.finished` (cancelled while queued, refused) or
//! the daemon went away (the run is then `interrupted`: never run again).

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::store::queue::state;
use crate::store::{Event, Store, StoreError, TAIL_POLL_INITIAL};

/// Events read from the store per page.
pub const FOLLOW_PAGE: usize = 500;
/// Longest pause between two reads of a quiet run (the pause starts at
/// `store::TAIL_POLL_INITIAL` and doubles).
pub const FOLLOW_POLL_MAX: Duration = Duration::from_millis(20);
/// How often a quiet run's row and the daemon are looked at.
pub const FOLLOW_CHECK_EVERY: Duration = Duration::from_millis(250);
/// Why a run whose daemon went away ended.
pub const DAEMON_GONE: &str = "the daemon stopped while the run went on; it is not run again";

/// What [`Follower::next`] found.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// The run's next events, in order.
    Events(Vec<Event>),
    /// The run ended.
    Ended(Ended),
}

/// How a followed run ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Ended {
    /// `run.finished`'s outcome, else the row's final state.
    pub outcome: String,
    /// Why it did not succeed, when something says.
    pub why: Option<String>,
    /// The `run.finished` payload, when the run recorded one.
    pub finished: Option<Value>,
}

/// A run of the daemon followed from the store.
#[derive(Debug)]
pub struct Follower {
    store: Arc<Store>,
    run_id: String,
    component: String,
    after: i64,
    pause: Duration,
    checked: tokio::time::Instant,
    ended: Option<Ended>,
}

impl Follower {
    pub fn new(store: Arc<Store>, run_id: &str) -> Self {
        Self {
            store,
            component: super::component(run_id),
            run_id: run_id.to_string(),
            after: 0,
            pause: TAIL_POLL_INITIAL,
            checked: tokio::time::Instant::now(),
            ended: None,
        }
    }

    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// The run's next events (waiting while it is quiet), or its end once
    /// every event before it was returned. `daemon_up` says whether the
    /// daemon still holds the repository. Cancel-safe: a call dropped while
    /// it waits loses no event.
    pub async fn next(
        &mut self,
        daemon_up: &(dyn Fn() -> bool + Sync),
    ) -> Result<Step, StoreError> {
        if let Some(ended) = self.ended.clone() {
            return Ok(Step::Ended(ended));
        }
        loop {
            let page = self.page(self.after).await?;
            if let Some(last) = page.last() {
                self.after = last.id;
                self.ended = page
                    .iter()
                    .find(|e| e.kind == "run.finished")
                    .map(|e| finished(&e.payload));
                self.pause = TAIL_POLL_INITIAL;
                return Ok(Step::Events(page));
            }
            if self.checked.elapsed() >= FOLLOW_CHECK_EVERY {
                self.checked = tokio::time::Instant::now();
                if let Some(ended) = self.row_ended(daemon_up).await? {
                    self.ended = Some(ended.clone());
                    return Ok(Step::Ended(ended));
                }
            }
            tokio::time::sleep(self.pause).await;
            self.pause = (self.pause * 2).min(FOLLOW_POLL_MAX);
        }
    }

    async fn page(&self, after: i64) -> Result<Vec<Event>, StoreError> {
        let (store, key) = (self.store.clone(), self.component.clone());
        tokio::task::spawn_blocking(move || store.component_events(&key, after, FOLLOW_PAGE))
            .await
            .map_err(|e| StoreError::Task(e.to_string()))?
    }

    /// Whether the run ended without a `run.finished` (its row is final and
    /// no such event follows) or its daemon went away.
    async fn row_ended(
        &self,
        daemon_up: &(dyn Fn() -> bool + Sync),
    ) -> Result<Option<Ended>, StoreError> {
        let (store, id) = (self.store.clone(), self.run_id.clone());
        let row = tokio::task::spawn_blocking(move || store.run_row(&id))
            .await
            .map_err(|e| StoreError::Task(e.to_string()))??;
        if let Some(row) = row
            && !matches!(
                row.state.as_str(),
                state::QUEUED | state::RUNNING | state::WAITING
            )
        {
            // A `run.finished` recorded just after the read above is the
            // better word on the run's end.
            if self
                .page(self.after)
                .await?
                .iter()
                .any(|e| e.kind == "run.finished")
            {
                return Ok(None);
            }
            return Ok(Some(Ended {
                outcome: row.state,
                why: row.detail,
                finished: None,
            }));
        }
        if !daemon_up() {
            return Ok(Some(Ended {
                outcome: state::INTERRUPTED.to_string(),
                why: Some(DAEMON_GONE.to_string()),
                finished: None,
            }));
        }
        Ok(None)
    }
}

/// The end a `run.finished` payload reports.
fn finished(payload: &Value) -> Ended {
    let outcome = payload["outcome"].as_str().unwrap_or("failed").to_string();
    let why = payload["error"].as_str().map(str::to_string).or_else(|| {
        (outcome == "failed").then(|| format!("the agent failed (exit {})", payload["exit"]))
    });
    Ended {
        outcome,
        why,
        finished: Some(payload.clone()),
    }
}
