//! `cron` triggers: crontab expressions (Vixie semantics, macros) and
//! duration shortcuts, in a time zone per trigger.
//!
//! State lives in the store (`trigger_state`, key [`STATE_KEY`]): the next
//! fire time and the schedule it belongs to. At most once is structural:
//! a firing carries the following fire time, committed in the same store
//! job as the run row, and its fire time is the run's dedupe key — a crash
//! can lose a fire, never repeat one. On start, a stored fire time already
//! past was missed while no daemon ran: `missed = "skip"` forgets it,
//! `"run_once"` fires once for it (however many were missed). A fleet's
//! daemon taking over the lead ([`TriggerKind::take_over`]) owes instead
//! every fire time from the stored one to now (the fleet fired none of
//! them: its leader was gone), up to [`MAX_OWED_FIRES`], each once by its
//! dedupe key, whatever `missed` says. Editing the schedule keeps the
//! trigger and recomputes the next fire from now.
//!
//! Time zones and DST: the next fire is computed in the trigger's zone by
//! wall-clock time. A local time that a spring-forward gap skips does not
//! exist, so it does not fire that day (`30 2 * * *` in `Europe/Berlin`
//! skips the last Sunday of March); a local time that a fall-back overlap
//! repeats fires once, at its first occurrence. Interval schedules (`15m`)
//! count elapsed time and ignore zones; they keep their grid: after a late
//! fire the next is the first of `due + k × interval` still ahead, so a
//! fleet's schedulers agree on every fire time however late each wakes.

use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use serde_json::json;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{
    FIRING_QUEUE_DEPTH, Firing, Firings, Origin, TriggerContext, TriggerError, TriggerKind,
};
use crate::model::Missed;
use crate::model::schedule::Schedule;

/// The `trigger_state` key of a cron trigger.
pub const STATE_KEY: &str = "cron";
/// Most fire times one [`TriggerKind::next_fire_times`] call computes.
pub const MAX_NEXT_FIRES: usize = 100;
/// Most past fire times a daemon taking over a fleet's lead fires; older
/// ones beyond this are skipped (and said so).
pub const MAX_OWED_FIRES: usize = 256;

/// What a stored fire time already past means at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PastFires {
    /// Missed while no daemon ran: the `missed` policy decides.
    Missed,
    /// Owed by a fleet whose leader was gone: each one fires.
    Owed,
}

/// A cron trigger.
#[derive(Debug)]
pub struct CronTrigger {
    schedule: Schedule,
    tz: Tz,
    missed: Missed,
    /// The next fire time (`None`: never again).
    next: Arc<Mutex<Option<DateTime<Utc>>>>,
    /// What a stored fire time already past means.
    past: PastFires,
    /// Past fire times to fire at start, oldest first.
    catch_up: Vec<DateTime<Utc>>,
    stop: Option<CancellationToken>,
}

/// The first fire of `schedule` in `tz` strictly after `after`.
pub fn next_after(schedule: &Schedule, tz: Tz, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
    schedule
        .next_after(&after.with_timezone(&tz))
        .map(|t| t.with_timezone(&Utc))
}

/// The fire after `due` once it fired at `now` (late, perhaps): a crontab
/// expression goes on from now; an interval the first point of its grid
/// (`due + k × interval`) after now.
fn following(
    schedule: &Schedule,
    tz: Tz,
    due: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    match schedule {
        Schedule::Every { seconds, .. } => {
            let step = i64::try_from(*seconds).ok()?.max(1).checked_mul(1_000)?;
            let behind = (now - due).num_milliseconds().max(0);
            let steps = behind / step + 1;
            due.checked_add_signed(chrono::Duration::milliseconds(steps.checked_mul(step)?))
        }
        Schedule::Cron(_) => next_after(schedule, tz, due.max(now)),
    }
}

/// Up to `limit` fire times from `first` on (`first` included).
pub fn fire_times(
    schedule: &Schedule,
    tz: Tz,
    first: Option<DateTime<Utc>>,
    limit: usize,
) -> Vec<DateTime<Utc>> {
    let mut out = Vec::new();
    let mut at = first;
    while let Some(t) = at {
        if out.len() >= limit.min(MAX_NEXT_FIRES) {
            break;
        }
        out.push(t);
        at = next_after(schedule, tz, t);
    }
    out
}

/// The stored state: the next fire time and what it was computed for.
fn state_value(
    next: Option<DateTime<Utc>>,
    schedule: &Schedule,
    timezone: &str,
) -> serde_json::Value {
    json!({
        "next_fire_ms": next.map(|t| t.timestamp_millis()),
        "schedule": schedule.to_string(),
        "timezone": timezone,
    })
}

impl CronTrigger {
    pub fn new(schedule: Schedule, tz: Tz, missed: Missed) -> Self {
        Self {
            schedule,
            tz,
            missed,
            next: Arc::new(Mutex::new(None)),
            past: PastFires::Missed,
            catch_up: Vec::new(),
            stop: None,
        }
    }

    fn next(&self) -> Option<DateTime<Utc>> {
        *crate::stdx::lock(&self.next)
    }
}

impl TriggerKind for CronTrigger {
    fn setup(&mut self, cx: &TriggerContext) -> Result<(), TriggerError> {
        let now = cx.clock.now();
        let from_now = next_after(&self.schedule, self.tz, now)
            .ok_or_else(|| TriggerError::NeverFires(self.schedule.to_string()))?;
        let stored = cx.store.trigger_state(&cx.name)?.remove(STATE_KEY);
        let stored_next = stored.as_ref().and_then(|s| {
            let same =
                s["schedule"] == self.schedule.to_string() && s["timezone"] == self.tz.name();
            same.then(|| s["next_fire_ms"].as_i64())
                .flatten()
                .and_then(DateTime::<Utc>::from_timestamp_millis)
        });
        let next = match stored_next {
            Some(t) if t > now => t,
            Some(missed_at) if self.past == PastFires::Owed => {
                let owed = fire_times_upto(&self.schedule, self.tz, missed_at, now);
                if owed.len() == MAX_OWED_FIRES {
                    tracing::warn!(
                        "trigger `{}`: more than {MAX_OWED_FIRES} fire times passed without a leader; the later ones are skipped",
                        cx.name
                    );
                }
                // After the owed fires, on as a late fire goes on (an
                // interval keeps the fleet's grid).
                let last = owed.last().copied().unwrap_or(missed_at);
                self.catch_up = owed;
                following(&self.schedule, self.tz, last, now).unwrap_or(from_now)
            }
            Some(missed_at) => {
                if self.missed == Missed::RunOnce {
                    self.catch_up = vec![missed_at];
                }
                from_now
            }
            None => from_now,
        };
        *crate::stdx::lock(&self.next) = Some(next);
        if self.catch_up.is_empty() {
            // Committed before anything fires; a catch-up firing carries
            // the same state itself.
            drop(cx.store.set_trigger_value(
                cx.name.clone(),
                STATE_KEY,
                &state_value(Some(next), &self.schedule, self.tz.name()),
            ));
        }
        Ok(())
    }

    fn start(&mut self, cx: &TriggerContext) -> Result<Firings, TriggerError> {
        let (tx, rx) = mpsc::channel(FIRING_QUEUE_DEPTH);
        let stop = CancellationToken::new();
        self.stop = Some(stop.clone());
        let (schedule, tz, timezone) = (self.schedule.clone(), self.tz, self.tz.name());
        let (next, clock, name) = (self.next.clone(), cx.clock.clone(), cx.name.clone());
        let catch_up = std::mem::take(&mut self.catch_up);
        let late_is_missed = self.past == PastFires::Missed;
        let firing = move |due: DateTime<Utc>, following: Option<DateTime<Utc>>, missed: bool| {
            let mut f = Firing::new(
                &name,
                Origin::Cron,
                json!({
                    "trigger": name,
                    "kind": "cron",
                    "scheduled_at": due.to_rfc3339(),
                    "schedule": schedule.to_string(),
                    "timezone": timezone,
                    "missed": missed,
                }),
            );
            f.dedupe_key = Some(due.timestamp_millis().to_string());
            f.state = Some((
                STATE_KEY.to_string(),
                state_value(following, &schedule, timezone),
            ));
            f
        };
        let schedule = self.schedule.clone();
        tokio::spawn(async move {
            for (i, late) in catch_up.iter().enumerate() {
                let following = match catch_up.get(i + 1) {
                    Some(t) => Some(*t),
                    None => *crate::stdx::lock(&next),
                };
                if tx
                    .send(firing(*late, following, late_is_missed))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            loop {
                let Some(due) = *crate::stdx::lock(&next) else {
                    return;
                };
                tokio::select! {
                    () = clock.sleep_until(due) => {}
                    () = stop.cancelled() => return,
                }
                // Late (a suspended machine, a busy daemon): fire once for
                // `due`, then go on from now.
                let following = following(&schedule, tz, due, clock.now());
                *crate::stdx::lock(&next) = following;
                if tx.send(firing(due, following, false)).await.is_err() {
                    return;
                }
            }
        });
        Ok(rx)
    }

    fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            stop.cancel();
        }
    }

    fn teardown(&mut self, cx: &TriggerContext) {
        drop(cx.store.clear_trigger_state(cx.name.clone()));
    }

    fn next_fire_times(&self, limit: usize) -> Vec<DateTime<Utc>> {
        fire_times(&self.schedule, self.tz, self.next(), limit)
    }

    fn take_over(&mut self) {
        self.past = PastFires::Owed;
    }
}

/// The fire times from `first` (included) up to `now` (included), at most
/// [`MAX_OWED_FIRES`].
fn fire_times_upto(
    schedule: &Schedule,
    tz: Tz,
    first: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Vec<DateTime<Utc>> {
    let mut out = Vec::new();
    let mut at = Some(first);
    while let Some(t) = at.filter(|t| *t <= now) {
        if out.len() >= MAX_OWED_FIRES {
            break;
        }
        out.push(t);
        at = next_after(schedule, tz, t);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::triggers::clock::FakeClock;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn cx(dir: &std::path::Path, clock: Arc<FakeClock>) -> TriggerContext {
        let store = Arc::new(crate::store::Store::open(dir.join("state.db")).unwrap());
        TriggerContext {
            name: "nightly".into(),
            root: dir.to_path_buf(),
            state_dir: dir.to_path_buf(),
            ignored: Vec::new(),
            bus: crate::bus::EventBus::new(store.clone()),
            store,
            clock,
        }
    }

    fn times(expr: &str, tz: &str, from: &str, n: usize) -> Vec<String> {
        let s: Schedule = expr.parse().unwrap();
        let tz: Tz = tz.parse().unwrap();
        let first = next_after(&s, tz, at(from));
        fire_times(&s, tz, first, n)
            .iter()
            .map(|t| t.to_rfc3339())
            .collect()
    }

    #[test]
    fn a_local_time_in_a_dst_gap_does_not_fire_that_day() {
        // Europe/Berlin springs from 02:00 to 03:00 on 2026-03-29.
        assert_eq!(
            times("30 2 * * *", "Europe/Berlin", "2026-03-27T12:00:00Z", 3),
            [
                "2026-03-28T01:30:00+00:00",
                "2026-03-30T00:30:00+00:00",
                "2026-03-31T00:30:00+00:00"
            ]
        );
    }

    #[test]
    fn a_repeated_local_time_in_a_dst_overlap_fires_once() {
        // Europe/Berlin falls from 03:00 back to 02:00 on 2026-10-25.
        assert_eq!(
            times("30 2 * * *", "Europe/Berlin", "2026-10-24T12:00:00Z", 3),
            [
                "2026-10-25T00:30:00+00:00",
                "2026-10-26T01:30:00+00:00",
                "2026-10-27T01:30:00+00:00"
            ]
        );
    }

    #[test]
    fn zones_shift_fire_times() {
        assert_eq!(
            times("0 9 * * *", "America/New_York", "2026-11-29T00:00:00Z", 1),
            ["2026-11-29T14:00:00+00:00"]
        );
        assert_eq!(
            times("15m", "UTC", "2026-11-29T00:00:00Z", 2),
            ["2026-11-29T00:15:00+00:00", "2026-11-29T00:30:00+00:00"]
        );
    }

    async fn next_firing(rx: &mut Firings) -> Firing {
        tokio::time::timeout(std::time::Duration::from_secs(10), rx.recv())
            .await
            .expect("a firing in time")
            .expect("the stream is open")
    }

    #[tokio::test]
    async fn fires_on_the_fake_clock_and_carries_its_next_fire_time() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(FakeClock::new(at("2026-11-29T10:00:30Z")));
        let cx = cx(dir.path(), clock.clone());
        let mut cron = CronTrigger::new("* * * * *".parse().unwrap(), chrono_tz::UTC, Missed::Skip);
        cron.setup(&cx).unwrap();
        assert_eq!(
            cron.next_fire_times(2),
            [at("2026-11-29T10:01:00Z"), at("2026-11-29T10:02:00Z")]
        );
        let mut rx = cron.start(&cx).unwrap();
        clock.set(at("2026-11-29T10:01:00Z"));
        let f = next_firing(&mut rx).await;
        assert_eq!(f.payload["scheduled_at"], "2026-11-29T10:01:00+00:00");
        assert_eq!(
            f.dedupe_key.as_deref(),
            Some(
                at("2026-11-29T10:01:00Z")
                    .timestamp_millis()
                    .to_string()
                    .as_str()
            )
        );
        assert_eq!(
            f.state.unwrap().1["next_fire_ms"],
            at("2026-11-29T10:02:00Z").timestamp_millis()
        );
        // Late by five minutes: one firing for the due minute, then from now.
        clock.set(at("2026-11-29T10:07:10Z"));
        let f = next_firing(&mut rx).await;
        assert_eq!(f.payload["scheduled_at"], "2026-11-29T10:02:00+00:00");
        assert_eq!(cron.next_fire_times(1), [at("2026-11-29T10:08:00Z")]);
        cron.stop();
        assert!(rx.recv().await.is_none(), "the stream ends on stop");
    }

    #[test]
    fn an_interval_woken_late_keeps_its_grid_and_a_crontab_goes_on_from_now() {
        let every: Schedule = "10s".parse().unwrap();
        let due = at("2026-11-29T10:00:00Z");
        let tz = chrono_tz::UTC;
        // 2 ms late: the next is 10 s after the due time, not after now.
        let late = due + chrono::Duration::milliseconds(2);
        assert_eq!(
            following(&every, tz, due, late),
            Some(at("2026-11-29T10:00:10Z"))
        );
        // Exactly on the next point, and past several: the first still ahead.
        let on = at("2026-11-29T10:00:10Z");
        assert_eq!(
            following(&every, tz, due, on),
            Some(at("2026-11-29T10:00:20Z"))
        );
        let far = at("2026-11-29T10:00:35Z");
        assert_eq!(
            following(&every, tz, due, far),
            Some(at("2026-11-29T10:00:40Z"))
        );
        let minutely: Schedule = "* * * * *".parse().unwrap();
        let now = at("2026-11-29T10:07:10Z");
        assert_eq!(
            following(&minutely, tz, due, now),
            Some(at("2026-11-29T10:08:00Z"))
        );
    }

    #[tokio::test]
    async fn missed_fires_follow_the_policy_and_edits_recompute() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(FakeClock::new(at("2026-11-29T10:00:30Z")));
        let cx = cx(dir.path(), clock.clone());
        let hourly: Schedule = "@hourly".parse().unwrap();
        let mut first = CronTrigger::new(hourly.clone(), chrono_tz::UTC, Missed::Skip);
        first.setup(&cx).unwrap();
        cx.store.flush().await.unwrap();
        // Three hours later, no daemon ran in between.
        clock.set(at("2026-11-29T13:20:00Z"));
        let mut skip = CronTrigger::new(hourly.clone(), chrono_tz::UTC, Missed::Skip);
        skip.setup(&cx).unwrap();
        assert!(skip.catch_up.is_empty());
        assert_eq!(skip.next_fire_times(1), [at("2026-11-29T14:00:00Z")]);
        // The stored next fire is 11:00 again (skip stored 14:00; go back).
        cx.store
            .set_trigger_value(
                "nightly",
                STATE_KEY,
                &state_value(Some(at("2026-11-29T11:00:00Z")), &hourly, "UTC"),
            )
            .await
            .unwrap();
        let mut once = CronTrigger::new(hourly.clone(), chrono_tz::UTC, Missed::RunOnce);
        once.setup(&cx).unwrap();
        let mut rx = once.start(&cx).unwrap();
        let f = next_firing(&mut rx).await;
        assert_eq!(f.payload["missed"], true);
        assert_eq!(f.payload["scheduled_at"], "2026-11-29T11:00:00+00:00");
        once.stop();
        // An edited schedule does not inherit the old next fire time.
        let mut edited = CronTrigger::new(
            "0 0 * * *".parse().unwrap(),
            chrono_tz::UTC,
            Missed::RunOnce,
        );
        edited.setup(&cx).unwrap();
        assert!(edited.catch_up.is_empty());
        assert_eq!(edited.next_fire_times(1), [at("2026-11-30T00:00:00Z")]);
    }

    /// A daemon taking over a fleet's lead fires every fire time the gone
    /// leader left, each once and in order, each carrying the next as its
    /// state, then goes on; `missed = "skip"` does not drop them.
    #[tokio::test]
    async fn a_daemon_taking_over_the_lead_fires_every_owed_fire_time_once() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(FakeClock::new(at("2026-11-29T10:00:00Z")));
        let cx = cx(dir.path(), clock.clone());
        let every: Schedule = "2s".parse().unwrap();
        let stored = at("2026-11-29T10:00:02Z");
        cx.store
            .set_trigger_value(
                "nightly",
                STATE_KEY,
                &state_value(Some(stored), &every, "UTC"),
            )
            .await
            .unwrap();
        // The old leader died before 10:00:02; the lead moves at 10:00:07.
        clock.set(at("2026-11-29T10:00:07Z"));
        let mut leader = CronTrigger::new(every.clone(), chrono_tz::UTC, Missed::Skip);
        leader.take_over();
        leader.setup(&cx).unwrap();
        let mut rx = leader.start(&cx).unwrap();
        let mut fired = Vec::new();
        for _ in 0..3 {
            let f = next_firing(&mut rx).await;
            assert_eq!(f.payload["missed"], false);
            fired.push((
                f.payload["scheduled_at"].as_str().unwrap().to_string(),
                f.dedupe_key.clone().unwrap(),
                f.state.clone().unwrap().1["next_fire_ms"].as_i64().unwrap(),
            ));
        }
        let ms = |s: &str| at(s).timestamp_millis();
        assert_eq!(
            fired,
            [
                (
                    "2026-11-29T10:00:02+00:00".to_string(),
                    ms("2026-11-29T10:00:02Z").to_string(),
                    ms("2026-11-29T10:00:04Z")
                ),
                (
                    "2026-11-29T10:00:04+00:00".to_string(),
                    ms("2026-11-29T10:00:04Z").to_string(),
                    ms("2026-11-29T10:00:06Z")
                ),
                (
                    "2026-11-29T10:00:06+00:00".to_string(),
                    ms("2026-11-29T10:00:06Z").to_string(),
                    leader.next().unwrap().timestamp_millis()
                ),
            ]
        );
        assert!(leader.next().unwrap() > at("2026-11-29T10:00:07Z"));
        leader.stop();
        // A restart of one machine (no take-over) still follows `missed`.
        cx.store
            .set_trigger_value(
                "nightly",
                STATE_KEY,
                &state_value(Some(stored), &every, "UTC"),
            )
            .await
            .unwrap();
        let mut restarted = CronTrigger::new(every, chrono_tz::UTC, Missed::Skip);
        restarted.setup(&cx).unwrap();
        assert!(restarted.catch_up.is_empty());
    }
}
