//! Notifications out: the daemon tells a person, through the manifest's
//! `[notify.NAME]` sinks (a webhook, ntfy, Slack, the desktop), that a run
//! waits for an answer, was blocked, failed or finished, or that a pane
//! needs attention. [`Notifier`] subscribes to the bus (its own bounded,
//! drop-oldest queue: the bus never waits on it); for each event it finds
//! the `on` names it stands for ([`topics`], the one mapping), the sinks
//! that want one of them and whose trigger, profile and origin filters
//! the run passes (filters apply to run events; others pass), makes the
//! [`message::Message`] (what started the run, what it asks or why it
//! ended, links) and queues it on each sink's [`sink::Outbox`], whose own
//! task sends, retries and records. A sink that is down costs its own
//! queue, never a run. Secrets of a sink (its URL, token, headers) are
//! `Text` until the request is made, and the bus scrubs them from events.

pub mod message;
pub mod sink;
pub mod topics;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use tokio::task::JoinHandle;

use crate::bus::{BusError, EventBus, Subscription};
use crate::model::{Manifest, NotifySink};
use crate::store::{Event, Store};
use crate::supervisor::Supervisor;
use crate::surfaces::post::{PostClient, PostError};

use message::{Message, RunContext};
use sink::{Outbox, Sender};

/// The bus subscriber's name.
pub const SUBSCRIBER: &str = "notify";

/// A running sink: its settings, queue and task.
#[derive(Debug)]
struct Running {
    sink: NotifySink,
    outbox: Arc<Outbox>,
    task: JoinHandle<()>,
}

/// What the subscriber routes by: the manifest and the sinks' queues.
#[derive(Debug, Default)]
struct Routes {
    manifest: Option<Arc<Manifest>>,
    sinks: BTreeMap<String, (NotifySink, Arc<Outbox>)>,
    /// The API's URL, for links.
    base: Option<String>,
}

/// The daemon's notifier: one per runtime.
#[derive(Debug)]
pub struct Notifier {
    bus: EventBus,
    supervisor: Supervisor,
    cwd: std::path::PathBuf,
    routes: Arc<ArcSwap<Routes>>,
    running: Mutex<BTreeMap<String, Running>>,
    _subscription: Subscription,
}

impl Notifier {
    /// Subscribe to `bus`; no sink until [`Self::set_manifest`].
    pub fn start(
        bus: EventBus,
        store: Arc<Store>,
        supervisor: Supervisor,
        cwd: std::path::PathBuf,
    ) -> Result<Self, BusError> {
        let routes: Arc<ArcSwap<Routes>> = Arc::default();
        let shared = Arc::clone(&routes);
        let subscription = bus.subscribe(
            SUBSCRIBER,
            |event: &Event| topics::KINDS.contains(&event.kind.as_str()),
            move |event: Arc<Event>| {
                let routes = shared.load_full();
                let store = Arc::clone(&store);
                async move {
                    route(&routes, &store, &event).await;
                    Ok::<(), std::convert::Infallible>(())
                }
            },
        )?;
        Ok(Self {
            bus,
            supervisor,
            cwd,
            routes,
            running: Mutex::new(BTreeMap::new()),
            _subscription: subscription,
        })
    }

    /// The links' base: the API's URL, once it listens.
    pub fn set_base(&self, base: &str) {
        let base = base.trim_end_matches('/').to_string();
        self.routes.rcu(|current| Routes {
            manifest: current.manifest.clone(),
            sinks: current.sinks.clone(),
            base: Some(base.clone()),
        });
    }

    /// Follow the applied manifest: a sink whose settings did not change
    /// keeps its queue; a changed one starts afresh; a removed one stops.
    pub fn set_manifest(&self, manifest: &Manifest) {
        let mut running = crate::stdx::lock(&self.running);
        running.retain(|name, r| {
            let keep = manifest
                .notify
                .get(name)
                .is_some_and(|s| s.enabled && *s == r.sink);
            if !keep {
                r.task.abort();
            }
            keep
        });
        for (name, sink) in manifest.notify.iter().filter(|(_, s)| s.enabled) {
            if running.contains_key(name) {
                continue;
            }
            let client = match PostClient::new() {
                Ok(client) => client,
                Err(e) => {
                    tracing::warn!(sink = %name, "notification sink not started: {e}");
                    continue;
                }
            };
            let sender = Sender {
                name: name.clone(),
                sink: sink.clone(),
                client,
                supervisor: Some(self.supervisor.clone()),
                cwd: self.cwd.clone(),
            };
            let outbox = Arc::new(Outbox::default());
            let task = tokio::spawn(sender.serve(Arc::clone(&outbox), self.bus.clone()));
            running.insert(
                name.clone(),
                Running {
                    sink: sink.clone(),
                    outbox,
                    task,
                },
            );
        }
        let sinks: BTreeMap<_, _> = running
            .iter()
            .map(|(n, r)| (n.clone(), (r.sink.clone(), Arc::clone(&r.outbox))))
            .collect();
        let manifest = Arc::new(manifest.clone());
        let listen = format!("http://{}", manifest.daemon.listen);
        self.routes.rcu(|current| Routes {
            manifest: Some(Arc::clone(&manifest)),
            sinks: sinks.clone(),
            base: current.base.clone().or_else(|| Some(listen.clone())),
        });
    }
}

impl Drop for Notifier {
    fn drop(&mut self) {
        for r in crate::stdx::lock(&self.running).values() {
            r.task.abort();
        }
    }
}

/// Whether `sink` filters by trigger, profile or origin.
fn has_filters(sink: &NotifySink) -> bool {
    !(sink.triggers.is_empty() && sink.profiles.is_empty() && sink.origins.is_empty())
}

/// Whether `sink` takes a message about `run` (filters apply to runs only).
fn passes(sink: &NotifySink, run: Option<&RunContext>) -> bool {
    let Some(run) = run else { return true };
    let by = &run.started_by;
    (sink.triggers.is_empty() || sink.triggers.contains(&by.trigger))
        && (sink.profiles.is_empty()
            || run
                .profile
                .as_ref()
                .is_some_and(|p| sink.profiles.contains(p)))
        && (sink.origins.is_empty() || by.origin.known().is_some_and(|o| sink.origins.contains(&o)))
}

/// Queue `event` on every sink that wants it.
async fn route(routes: &Routes, store: &Arc<Store>, event: &Event) {
    let (Some(manifest), false) = (&routes.manifest, routes.sinks.is_empty()) else {
        return;
    };
    let topics = topics::topics(&event.kind, &event.payload);
    let wanted: Vec<_> = routes
        .sinks
        .iter()
        .filter_map(|(name, (sink, outbox))| {
            topics
                .iter()
                .find(|t| sink.on.contains(t))
                .map(|on| (name, sink, outbox, *on))
        })
        .collect();
    if wanted.is_empty() {
        return;
    }
    let about_a_run = topics::run_id(&event.payload);
    let run = match about_a_run {
        Some(id) => run_context(store, id, manifest).await,
        None => None,
    };
    for (_, sink, outbox, on) in wanted {
        // A run whose row cannot be read passes no filter (fail closed).
        let unread = about_a_run.is_some() && run.is_none();
        if unread && has_filters(sink) || !passes(sink, run.as_ref()) {
            continue;
        }
        let message = Message::of_event(
            on,
            &event.payload,
            event.component.as_deref(),
            run.clone(),
            routes.base.as_deref(),
        );
        let key = run.as_ref().map(|r| r.id.clone());
        outbox.push(key, message);
    }
}

/// Run `id` as a message tells of it, from its row (read off the executor).
async fn run_context(store: &Arc<Store>, id: &str, manifest: &Arc<Manifest>) -> Option<RunContext> {
    let (store, id) = (Arc::clone(store), id.to_string());
    let row = tokio::task::spawn_blocking(move || store.run_row(&id))
        .await
        .ok()?
        .ok()??;
    let profile = match manifest.triggers.get(&row.trigger).map(|t| &t.action) {
        Some(crate::model::Action::RunProfile { profile, .. }) => Some(profile.as_str()),
        _ => None,
    };
    Some(RunContext::of_row(
        &row.id,
        &row.trigger,
        &row.origin,
        &row.payload,
        profile,
    ))
}

/// What `npc notify test` reports: the sink's answer, or why it failed.
#[derive(Debug)]
pub struct Tested {
    pub status: Option<u16>,
    pub duration: std::time::Duration,
}

/// Why `npc notify test` failed.
#[derive(Debug, thiserror::Error)]
pub enum TestError {
    #[error("no `[notify.{0}]` in the manifest; declared: {1}")]
    Unknown(String, String),
    #[error(transparent)]
    Client(#[from] PostError),
    #[error("{0}")]
    Send(String),
}

/// Send sink `name` of `manifest` a sample message of its first `on` name,
/// once, without a daemon; `supervisor` runs `notify-send`.
pub async fn send_sample(
    manifest: &Manifest,
    name: &str,
    supervisor: Supervisor,
    cwd: std::path::PathBuf,
) -> Result<Tested, TestError> {
    let Some(sink) = manifest.notify.get(name) else {
        let names: Vec<String> = manifest.notify.keys().map(|k| format!("`{k}`")).collect();
        let names = if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        };
        return Err(TestError::Unknown(name.to_string(), names));
    };
    let on = sink
        .on
        .first()
        .copied()
        .unwrap_or(crate::model::NotifyOn::RunFailed);
    let base = format!("http://{}", manifest.daemon.listen);
    let message = Message::sample(on, Some(&base));
    let sender = Sender {
        name: name.to_string(),
        sink: sink.clone(),
        client: PostClient::new()?,
        supervisor: Some(supervisor),
        cwd,
    };
    let done = sender
        .attempt(&message)
        .await
        .map_err(|e| TestError::Send(e.error))?;
    Ok(Tested {
        status: done.status,
        duration: done.duration,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::RunOrigin;
    use crate::model::{NotifyOn, Sink, Text};

    fn sink(triggers: &[&str], profiles: &[&str], origins: &[RunOrigin]) -> NotifySink {
        NotifySink {
            sink: Sink::Slack {
                url: Text::plain("http://127.0.0.1:1/x"),
            },
            on: vec![NotifyOn::RunFailed],
            triggers: triggers.iter().map(|s| s.to_string()).collect(),
            profiles: profiles.iter().map(|s| s.to_string()).collect(),
            origins: origins.to_vec(),
            attempts: 1,
            timeout_ms: 1000,
            enabled: true,
        }
    }

    #[test]
    fn filters_apply_to_runs_by_trigger_profile_and_origin() {
        let manual = serde_json::json!({ "profile": "dev", "prompt": "hi" });
        let run = RunContext::of_row(
            "run-1",
            "@manual",
            &RunOrigin::Api.into(),
            &manual,
            Some("other"),
        );
        assert_eq!(run.profile.as_deref(), Some("dev"));
        assert!(passes(&sink(&[], &[], &[]), Some(&run)));
        assert!(passes(
            &sink(&["@manual"], &["dev"], &[RunOrigin::Api]),
            Some(&run)
        ));
        assert!(!passes(&sink(&["nightly"], &[], &[]), Some(&run)));
        assert!(!passes(&sink(&[], &["reviewer"], &[]), Some(&run)));
        assert!(!passes(&sink(&[], &[], &[RunOrigin::Cron]), Some(&run)));
        // Events of no run (a pane, the manifest) pass the run filters.
        assert!(passes(
            &sink(&["nightly"], &["reviewer"], &[RunOrigin::Cron]),
            None
        ));
    }
}
