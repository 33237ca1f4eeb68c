//! One sink's sender: a bounded queue of messages ([`MAX_QUEUED_MESSAGES`])
//! that coalesces (a message waits [`COALESCE_WINDOW`] from its first
//! event; what its run records meanwhile joins it as one message counting
//! them all; past the bound, messages are counted into one summary), sent
//! one at a time, each tried up to the sink's `attempts`
//! with backoff ([`RETRY_INITIAL`] … [`RETRY_MAX`]) within its
//! `timeout_ms`. Every delivery and every message given up is an event
//! (`notify.delivered`, `notify.failed`). Nothing here waits on the bus:
//! pushing is a lock and a notify, so a sink that is down never slows a run.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::bus::EventBus;
use crate::event::{Event, NotifyDelivered, NotifyFailed};
use crate::model::NotifySink;
use crate::supervisor::{ChildSpec, OutputLimits, Supervisor};
use crate::surfaces::post::{PostClient, PostError};

use super::message::{Message, Request, request};

/// Messages a sink holds at most; more are counted into one summary.
pub const MAX_QUEUED_MESSAGES: usize = 64;
/// How long a message waits for more events of its run before it is sent
/// (it is sent later still when the sink is busy, coalescing more).
pub const COALESCE_WINDOW: Duration = Duration::from_millis(200);
/// The first retry's delay; it doubles up to [`RETRY_MAX`].
pub const RETRY_INITIAL: Duration = Duration::from_millis(250);
/// The longest delay between two attempts.
pub const RETRY_MAX: Duration = Duration::from_secs(30);
/// Most output of `notify-send` read.
const DESKTOP_OUTPUT_BYTES: usize = 4096;

/// A queued message and what it coalesces by (its run).
#[derive(Debug)]
struct Queued {
    key: Option<String>,
    message: Message,
    /// When it may be sent: its first event plus [`COALESCE_WINDOW`].
    due: Instant,
}

#[derive(Debug, Default)]
struct Pending {
    queue: VecDeque<Queued>,
    /// Messages past the bound, counted into one summary.
    overflow: u64,
    overflow_on: Option<String>,
}

/// A sink's queue, shared by its pusher (the bus subscriber) and its task.
#[derive(Debug, Default)]
pub struct Outbox {
    pending: Mutex<Pending>,
    ready: tokio::sync::Notify,
}

impl Outbox {
    /// Queue `message` (of run `key`): merged into a queued message of the
    /// same run, else appended, else counted into the overflow summary.
    pub fn push(&self, key: Option<String>, message: Message) {
        {
            let mut pending = crate::stdx::lock(&self.pending);
            let same = key
                .as_ref()
                .and_then(|k| pending.queue.iter_mut().find(|q| q.key.as_ref() == Some(k)));
            if let Some(queued) = same {
                let events = queued.message.events + message.events;
                queued.message = message.coalesced(events);
            } else if pending.queue.len() < MAX_QUEUED_MESSAGES {
                let due = Instant::now() + COALESCE_WINDOW;
                pending.queue.push_back(Queued { key, message, due });
            } else {
                pending.overflow += message.events;
                pending.overflow_on.get_or_insert(message.on);
            }
        }
        self.ready.notify_one();
    }

    /// The next message, waiting for one and for its window to pass.
    async fn next(&self) -> Message {
        loop {
            let due = {
                let mut pending = crate::stdx::lock(&self.pending);
                match pending.queue.front().map(|q| q.due) {
                    Some(due) if due <= Instant::now() => {
                        if let Some(queued) = pending.queue.pop_front() {
                            return queued.message;
                        }
                        None
                    }
                    due => due,
                }
            };
            if let Some(due) = due {
                tokio::time::sleep_until(due.into()).await;
                continue;
            }
            {
                let mut pending = crate::stdx::lock(&self.pending);
                if pending.overflow > 0 {
                    let events = std::mem::take(&mut pending.overflow);
                    let on = pending.overflow_on.take().unwrap_or_default();
                    return Message {
                        title: "npc: more notifications than the sink could take".into(),
                        text: format!(
                            "{events} notifications ({on}, …) came faster than this sink takes them and were coalesced into this one; see `npc events` or the dashboard"
                        ),
                        on,
                        events,
                        ..Message::default()
                    };
                }
            }
            self.ready.notified().await;
        }
    }
}

/// What a sink needs to send: its settings, HTTP client and (for
/// `desktop`) a supervisor, and where the work happens.
#[derive(Debug, Clone)]
pub struct Sender {
    pub name: String,
    pub sink: NotifySink,
    pub client: PostClient,
    pub supervisor: Option<Supervisor>,
    pub cwd: std::path::PathBuf,
}

/// One attempt's outcome.
#[derive(Debug)]
pub struct Attempt {
    /// The receiver's status (none for `desktop`).
    pub status: Option<u16>,
    pub duration: Duration,
}

/// Why an attempt failed, and whether another may succeed.
#[derive(Debug)]
pub struct AttemptError {
    pub error: String,
    pub retry: bool,
}

impl Sender {
    /// Send `message` once.
    pub async fn attempt(&self, message: &Message) -> Result<Attempt, AttemptError> {
        let started = Instant::now();
        let timeout = Duration::from_millis(self.sink.timeout_ms);
        let fail = |error: String, retry: bool| AttemptError { error, retry };
        match request(&self.sink, message).map_err(|e| fail(e, false))? {
            Request::Post { url, headers, body } => {
                let posted = self
                    .client
                    .post(&url, &headers, body, timeout)
                    .await
                    .map_err(|e| {
                        let retry =
                            matches!(e, PostError::Timeout { .. } | PostError::Request { .. });
                        fail(e.to_string(), retry)
                    })?;
                if !posted.ok() {
                    let retry =
                        posted.status >= 500 || posted.status == 408 || posted.status == 429;
                    let reply =
                        super::message::clean(&posted.reply, super::message::MAX_FIELD_CHARS);
                    return Err(fail(
                        format!("the receiver answered HTTP {}: {reply}", posted.status),
                        retry,
                    ));
                }
                Ok(Attempt {
                    status: Some(posted.status),
                    duration: started.elapsed(),
                })
            }
            Request::Desktop { title, text } => {
                let Some(supervisor) = &self.supervisor else {
                    return Err(fail(
                        "no process may start here to run `notify-send`".into(),
                        false,
                    ));
                };
                if !on_path(NOTIFY_SEND) {
                    return Err(fail(
                        format!(
                            "`{NOTIFY_SEND}` is not installed; install libnotify (`notify-send`) or use another kind of sink"
                        ),
                        false,
                    ));
                }
                let mut spec = ChildSpec::new(NOTIFY_SEND, &self.cwd);
                spec.args = vec!["--app-name=npc".into(), "--".into(), title, text];
                // What `notify-send` needs to reach the session's notification
                // server; the user's own environment, never the repository's.
                for var in DESKTOP_ENV {
                    if let Some(value) = std::env::var_os(var).and_then(|v| v.into_string().ok()) {
                        spec.env.insert(var.to_string(), value);
                    }
                }
                let limits = OutputLimits {
                    stdout: DESKTOP_OUTPUT_BYTES,
                    stderr: DESKTOP_OUTPUT_BYTES,
                };
                let output = supervisor
                    .run_once(&spec, None, timeout, limits)
                    .await
                    .map_err(|e| fail(e.to_string(), true))?;
                if !output.status.success() {
                    return Err(fail(
                        format!("`{NOTIFY_SEND}` failed ({:?})", output.status),
                        true,
                    ));
                }
                Ok(Attempt {
                    status: None,
                    duration: started.elapsed(),
                })
            }
        }
    }

    /// Send `message` up to the sink's attempts with backoff, then record
    /// the delivery or the failure on `bus`.
    async fn deliver(&self, bus: &EventBus, message: Message) {
        let mut delay = RETRY_INITIAL;
        let mut attempt = 0;
        let run_id = message.run.as_ref().map(|r| r.id.clone());
        let event = loop {
            attempt += 1;
            match self.attempt(&message).await {
                Ok(done) => {
                    break Event::NotifyDelivered(NotifyDelivered {
                        sink: self.name.clone(),
                        kind: self.sink.sink.kind().into(),
                        on: message.on.clone(),
                        run_id,
                        events: message.events,
                        attempt,
                        status: done.status,
                        duration_ms: u64::try_from(done.duration.as_millis()).unwrap_or(u64::MAX),
                    });
                }
                Err(e) if e.retry && attempt < self.sink.attempts => {
                    tracing::debug!(sink = %self.name, attempt, error = %e.error, "notify.retry");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(RETRY_MAX);
                }
                Err(e) => {
                    tracing::warn!(sink = %self.name, attempt, error = %e.error, "notify.failed");
                    break Event::NotifyFailed(NotifyFailed {
                        sink: self.name.clone(),
                        kind: self.sink.sink.kind().into(),
                        on: message.on.clone(),
                        run_id,
                        events: message.events,
                        attempts: attempt,
                        error: e.error,
                    });
                }
            }
        };
        if let Err(e) = bus
            .publish_detached(event.for_component(format!("notify/{}", self.name)))
            .await
        {
            tracing::warn!(sink = %self.name, "cannot record a notification: {e}");
        }
    }

    /// The sink's task: take messages from `outbox` one at a time, forever.
    pub async fn serve(self, outbox: Arc<Outbox>, bus: EventBus) {
        loop {
            let message = outbox.next().await;
            self.deliver(&bus, message).await;
        }
    }
}

/// The environment `notify-send` reaches the desktop session through.
const DESKTOP_ENV: [&str; 4] = [
    "DBUS_SESSION_BUS_ADDRESS",
    "DISPLAY",
    "WAYLAND_DISPLAY",
    "XDG_RUNTIME_DIR",
];

/// The desktop notifier's program.
pub const NOTIFY_SEND: &str = "notify-send";

/// Whether `program` is an executable file in a directory of `PATH`.
fn on_path(program: &str) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| {
            std::fs::metadata(dir.join(program))
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(on: &str) -> Message {
        Message {
            on: on.into(),
            events: 1,
            ..Message::default()
        }
    }

    #[tokio::test]
    async fn events_of_one_run_in_the_window_are_one_message_counting_them() {
        let outbox = Outbox::default();
        for _ in 0..9 {
            outbox.push(Some("run-1".into()), message("tool.denied"));
        }
        outbox.push(Some("run-1".into()), message("run.blocked"));
        outbox.push(Some("run-2".into()), message("run.failed"));
        let first = outbox.next().await;
        assert_eq!((first.on.as_str(), first.events), ("run.blocked", 10));
        assert!(first.text.contains("10 events coalesced"), "{}", first.text);
        let second = outbox.next().await;
        assert_eq!((second.on.as_str(), second.events), ("run.failed", 1));
    }

    #[tokio::test]
    async fn past_the_bound_messages_are_counted_into_one_summary() {
        let outbox = Outbox::default();
        for n in 0..MAX_QUEUED_MESSAGES + 30 {
            outbox.push(Some(format!("run-{n}")), message("run.failed"));
        }
        for _ in 0..MAX_QUEUED_MESSAGES {
            assert_eq!(outbox.next().await.events, 1);
        }
        let summary = outbox.next().await;
        assert_eq!(summary.events, 30);
        assert!(
            summary.text.starts_with("30 notifications"),
            "{}",
            summary.text
        );
    }
}
