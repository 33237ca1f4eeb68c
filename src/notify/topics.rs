//! The one place `on` names meet events: which of the names a person cares
//! about ([`NotifyOn`]) a recorded event stands for, most specific first
//! (a `run.finished` whose outcome is `blocked` is `run.blocked`, then
//! `run.finished`). Events are read back as the typed [`Event`]; a sink
//! takes the first name of the list it subscribes to, so one event is one
//! message per sink.

use serde_json::{Value, json};

use crate::event::{Event, RunFinished};
use crate::model::NotifyOn;

/// The kind of the event a run records when it parks on a question
/// (approvals, issue 43 §3). Matched by kind until the typed variant is
/// in this tree; its payload names `run_id` and, where known, `tool`,
/// `arguments` and `question`.
pub const RUN_WAITING_KIND: &str = "run.waiting";

/// Every event kind some [`NotifyOn`] name stands for: the subscription's
/// cheap predicate.
pub const KINDS: [&str; 9] = [
    "run.finished",
    "run.queued",
    "run.cancelled",
    "run.interrupted",
    "tool.denied",
    "pane.attention",
    "component.failed",
    "manifest.invalid",
    RUN_WAITING_KIND,
];

/// Outcomes of `run.finished` that are no failure of the run.
const NOT_FAILED: [&str; 4] = ["succeeded", "blocked", "cancelled", "skipped"];

/// The names event `kind` with `payload` stands for, most specific first
/// (empty: none).
pub fn topics(kind: &str, payload: &Value) -> Vec<NotifyOn> {
    use NotifyOn::*;
    let typed = serde_json::from_value::<Event>(json!({ "kind": kind, "payload": payload }));
    match typed {
        Ok(Event::RunFinished(finished)) => match outcome(&finished) {
            "succeeded" => vec![RunSucceeded, RunFinished],
            "blocked" => vec![RunBlocked, RunFinished],
            other if NOT_FAILED.contains(&other) => vec![RunFinished],
            _ => vec![RunFailed, RunFinished],
        },
        Ok(Event::RunInterrupted(_)) => vec![RunFailed, RunFinished],
        Ok(Event::RunQueued(_)) => vec![RunQueued],
        Ok(Event::RunCancelled(_)) => vec![RunCancelled],
        Ok(Event::ToolDenied(_)) => vec![ToolDenied],
        Ok(Event::PaneAttention(_)) => vec![PaneAttention],
        Ok(Event::ComponentFailed(_)) => vec![ComponentFailed],
        Ok(Event::ManifestInvalid(_)) => vec![ManifestInvalid],
        _ if kind == RUN_WAITING_KIND => vec![RunWaiting],
        _ => Vec::new(),
    }
}

/// A run's end: its outcome word.
pub fn outcome(finished: &RunFinished) -> &str {
    match finished {
        RunFinished::Agent(f) => &f.outcome,
        RunFinished::Command(f) => &f.outcome,
        RunFinished::NotStarted(f) => &f.outcome,
        RunFinished::Failed(f) => &f.outcome,
    }
}

/// The run an event of `payload` concerns (`run_id`), if it names one.
pub fn run_id(payload: &Value) -> Option<&str> {
    payload.get("run_id").and_then(Value::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_an_event_kind_or_the_waiting_one() {
        for kind in KINDS {
            assert!(
                Event::KINDS.contains(&kind) || kind == RUN_WAITING_KIND,
                "`{kind}` is no event kind"
            );
        }
    }

    #[test]
    fn every_name_stands_for_some_event() {
        let mut seen: Vec<NotifyOn> = Vec::new();
        for event in Event::examples() {
            let topics = topics(event.kind(), &event.payload());
            assert_eq!(
                !topics.is_empty(),
                KINDS.contains(&event.kind()),
                "`{}` and `KINDS` disagree",
                event.kind()
            );
            seen.extend(topics);
        }
        seen.extend(topics(RUN_WAITING_KIND, &json!({ "run_id": "run-1" })));
        for outcome in ["succeeded", "blocked", "failed", "timed_out"] {
            let finished = json!({ "run_id": "r", "outcome": outcome, "error": "x" });
            seen.extend(topics("run.finished", &finished));
        }
        for name in NotifyOn::ALL {
            assert!(
                seen.contains(&name),
                "`{}` stands for no event",
                name.as_str()
            );
        }
    }

    #[test]
    fn a_blocked_end_is_blocked_first_then_finished() {
        let blocked = json!({ "run_id": "r", "outcome": "blocked", "error": "denied" });
        assert_eq!(
            topics("run.finished", &blocked),
            [NotifyOn::RunBlocked, NotifyOn::RunFinished]
        );
        let timed_out = json!({ "run_id": "r", "outcome": "timed_out", "error": "late" });
        assert_eq!(topics("run.finished", &timed_out)[0], NotifyOn::RunFailed);
        assert!(topics("agent.message", &json!({})).is_empty());
    }
}
