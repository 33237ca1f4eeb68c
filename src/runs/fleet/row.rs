//! A claimed row, checked once before anything of it runs: the shared
//! store is written by every machine of the fleet and by anyone who holds
//! its URL, so a row is input, never npc's own. [`FleetRun::check`] is the
//! only way to a [`FleetRun`], and a worker adopts nothing else: its id is
//! a run id npc makes (the only names a worktree path is made of), its
//! origin one a fleet carries ([`Origin::runs_in_fleet`]: never `cli`,
//! `acp` or `file_watch`, whose payloads name a working directory or
//! belong to the machine that asked), its queue the manual queue only when it
//! was started through the API and else a trigger of the worker's own
//! manifest, its key and attempts within bounds, its payload whole, its
//! code the worker's remote and a full object id ([`check_code`]). Where a
//! run works is the worker's to decide (a worktree of its own, or its own
//! checkout), never the row's.

use super::super::Origin;
use super::super::mirror::{MirrorError, check_code, shown};
use crate::store::queue::{MANUAL_QUEUE, RunRow};
use crate::store::untrusted;

/// The most attempts a claimed row may name: a trigger's `retries` at most
/// `model::MAX_RETRIES`, plus its first attempt.
pub const MAX_ATTEMPTS: u32 = crate::model::MAX_RETRIES + 1;

/// Why a claimed row is not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RowRefused {
    #[error(
        "the run's id `{0}` is not a run id npc makes (`run-`, then lowercase letters, digits and `-`); it was not run"
    )]
    Id(String),
    #[error(
        "the run's origin `{0}` never goes to a fleet (only `cron`, `webhook`, `manual` and `api` runs do); it was not run: start it on the machine it belongs to"
    )]
    Origin(String),
    #[error(
        "the run of origin `{origin}` is queued on `{queue}`; only runs started through the API are queued there; it was not run"
    )]
    Queue { origin: String, queue: String },
    #[error(
        "the run's trigger `{0}` is not in this worker's manifest; apply the same manifest on every machine of the fleet"
    )]
    UnknownTrigger(String),
    #[error(
        "the run's concurrency key is {} characters or longer; it was not run",
        untrusted::MAX_NAME_CHARS
    )]
    Key,
    #[error(
        "the run is at attempt {attempt} of {attempts}; a run has 1 to {MAX_ATTEMPTS} attempts; it was not run"
    )]
    Attempts { attempt: u32, attempts: u32 },
    #[error(
        "the run's payload is over {} bytes; it was not run",
        untrusted::MAX_CLAIMED_PAYLOAD_BYTES
    )]
    Payload,
    #[error(transparent)]
    Code(#[from] MirrorError),
}

/// A claimed row that passed [`FleetRun::check`].
#[derive(Debug, Clone, PartialEq)]
pub struct FleetRun {
    row: RunRow,
    origin: Origin,
}

impl FleetRun {
    /// Check `row` (see the module docs) for a worker whose fleet remote is
    /// `remote` and whose manifest has the triggers `triggers`.
    pub fn check(
        row: RunRow,
        remote: Option<&str>,
        triggers: &[String],
    ) -> Result<Self, RowRefused> {
        if !crate::runs::workspace::is_run_id(&row.id) {
            return Err(RowRefused::Id(shown(&row.id)));
        }
        let origin = row
            .origin
            .known()
            .filter(|o| o.runs_in_fleet())
            .ok_or_else(|| RowRefused::Origin(shown(row.origin.as_str())))?;
        let by_hand = row.trigger == MANUAL_QUEUE;
        if by_hand && origin != Origin::Api {
            return Err(RowRefused::Queue {
                origin: origin.as_str().to_string(),
                queue: shown(&row.trigger),
            });
        }
        if !by_hand && !triggers.contains(&row.trigger) {
            return Err(RowRefused::UnknownTrigger(shown(&row.trigger)));
        }
        if row
            .concurrency_key
            .as_deref()
            .is_some_and(|k| k.chars().count() >= untrusted::MAX_NAME_CHARS)
        {
            return Err(RowRefused::Key);
        }
        if row.attempts > MAX_ATTEMPTS || row.attempt > row.attempts {
            return Err(RowRefused::Attempts {
                attempt: row.attempt,
                attempts: row.attempts,
            });
        }
        if untrusted::is_truncated(&row.payload) {
            return Err(RowRefused::Payload);
        }
        check_code(row.code.as_ref(), remote)?;
        Ok(Self { row, origin })
    }

    /// The row as checked.
    pub fn row(&self) -> &RunRow {
        &self.row
    }

    /// Its origin, one a fleet carries.
    pub fn origin(&self) -> Origin {
        self.origin
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(origin: &str, trigger: &str) -> RunRow {
        serde_json::from_value(serde_json::json!({
            "seq": 1,
            "id": "run-20261201t000000000z-0a1b2c3d",
            "trigger": trigger,
            "origin": origin,
            "dedupe_key": null,
            "payload": {},
            "state": "running",
            "enqueued_at_ms": 0,
            "started_at_ms": null,
            "finished_at_ms": null,
            "detail": null,
        }))
        .unwrap()
    }

    fn check(row: RunRow) -> Result<FleetRun, RowRefused> {
        FleetRun::check(row, None, &["nightly".to_string()])
    }

    #[test]
    fn only_origins_a_fleet_carries_pass() {
        assert!(check(row("cron", "nightly")).is_ok());
        assert!(check(row("webhook", "nightly")).is_ok());
        assert!(check(row("manual", "nightly")).is_ok());
        assert!(check(row("api", MANUAL_QUEUE)).is_ok());
        for origin in ["cli", "acp", "file_watch", "workflow", "nope\x1b[2J"] {
            let refused = check(row(origin, MANUAL_QUEUE)).unwrap_err();
            assert!(matches!(refused, RowRefused::Origin(_)), "{refused}");
            assert!(!refused.to_string().contains('\x1b'));
        }
    }

    #[test]
    fn every_other_field_is_checked() {
        let mut r = row("cron", "nightly");
        r.id = "run-../../x".into();
        assert!(matches!(check(r).unwrap_err(), RowRefused::Id(_)));
        assert!(matches!(
            check(row("cron", MANUAL_QUEUE)).unwrap_err(),
            RowRefused::Queue { .. }
        ));
        assert!(matches!(
            check(row("cron", "other")).unwrap_err(),
            RowRefused::UnknownTrigger(_)
        ));
        let mut r = row("cron", "nightly");
        r.concurrency_key = Some("k".repeat(untrusted::MAX_NAME_CHARS));
        assert_eq!(check(r).unwrap_err(), RowRefused::Key);
        let mut r = row("cron", "nightly");
        r.attempts = MAX_ATTEMPTS + 1;
        r.attempt = 1;
        assert!(matches!(check(r).unwrap_err(), RowRefused::Attempts { .. }));
        let mut r = row("cron", "nightly");
        r.payload = serde_json::json!({ untrusted::TRUNCATED_KEY: 1 });
        assert_eq!(check(r).unwrap_err(), RowRefused::Payload);
        let mut r = row("cron", "nightly");
        r.code = Some(crate::store::queue::RunCode {
            remote: "elsewhere".into(),
            commit: None,
        });
        assert!(matches!(check(r).unwrap_err(), RowRefused::Code(_)));
    }
}
