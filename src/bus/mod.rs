//! The event bus. Three properties matter for correctness:
//!
//! 1. **Persist before fan-out.** [`EventBus::publish`] hands the event to
//!    the store; subscribers get it only after the transaction holding it
//!    committed. If persisting fails, no subscriber sees it and `publish`
//!    returns the error. The durable log is never behind the live view.
//! 2. **Per-subscriber bounded queues, drop-oldest.** Each subscriber has its
//!    own queue of [`SUBSCRIBER_QUEUE_CAPACITY`] events and its own tokio
//!    task (running in a `npcagent.bus` span with `subscriber = <name>`;
//!    tokio task names need `tokio_unstable`). On overflow the oldest queued
//!    event is dropped and `event_bus.subscriber_queue_full` is logged with
//!    the subscriber's name and the `dropped_oldest` count.
//! 3. **Crash isolation.** A predicate or handler that panics, or a handler
//!    that returns an error, is logged (`event_bus.predicate_raised`,
//!    `event_bus.handler_raised`, `event_bus.handler_panicked`); the
//!    subscriber and the bus keep running.
//!
//! Publishing is group-committed: each publish is a job for the store's
//! writer thread, which drains every queued job (up to
//! [`crate::store::MAX_JOBS_PER_TRANSACTION`]), commits them in one
//! transaction, and then, still on that thread and in id order, fans each
//! event out and answers its publisher. At most [`MAX_PENDING_PUBLISHES`]
//! publishes wait at once; more wait for room.
//! Before anything is persisted, every string value in the payload is
//! scrubbed of the bus's known secret values ([`redact_json`]); object keys
//! and the component id are names from the manifest and are never touched,
//! and values shorter than [`MIN_SCRUBBED_SECRET_CHARS`] are not searched for
//! (they print as `<redacted>` in their own fields through `Text`). A payload
//! over [`MAX_PAYLOAD_BYTES`] is cut to fit with markers ([`truncate_payload`]);
//! no event is dropped for its size. [`EventBus::follow`] gives a gap-free,
//! duplicate-free stream: replay from the database, then the live tail.

mod queue;
mod redact;
mod truncate;

use std::fmt::Display;
use std::future::{Future, poll_fn};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use arc_swap::ArcSwap;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::store::{Commit, EncodedEvent, Event, NewEvent, Store, StoreError};

pub use queue::DROP_LOG_INTERVAL;
pub use redact::{MIN_SCRUBBED_SECRET_CHARS, redact_json, redact_str};
pub use truncate::{TRUNCATED, TRUNCATED_FROM_KEY, truncate_payload};

use queue::Queue;

/// Events a subscriber may have queued before the oldest is dropped.
pub const SUBSCRIBER_QUEUE_CAPACITY: usize = 1000;
/// Publishes queued for the writer before `publish` waits for room.
pub const MAX_PENDING_PUBLISHES: usize = 16_384;
/// Longest event kind, in bytes.
pub const MAX_EVENT_KIND_LEN: usize = 128;
/// Longest component name, in bytes.
pub const MAX_COMPONENT_LEN: usize = 512;
/// Largest serialized payload, in bytes; a larger one is cut to fit.
pub const MAX_PAYLOAD_BYTES: usize = 1024 * 1024;
/// Events a [`EventBus::follow`] receiver buffers.
pub const FOLLOW_CHANNEL_CAPACITY: usize = 1000;
/// Events [`EventBus::follow`] reads from the database per query.
pub const FOLLOW_REPLAY_PAGE: usize = 1000;

/// Why an event was not published or a subscription not made.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BusError {
    #[error("the event was not persisted, so no subscriber saw it: {source}")]
    Persist {
        #[source]
        source: StoreError,
    },
    #[error("the event bus is shut down; publish and subscribe before `shutdown`")]
    Closed,
    #[error(
        "event kind `{kind}` is invalid: use 1 to {MAX_EVENT_KIND_LEN} characters from `a-z0-9_.-`"
    )]
    InvalidKind { kind: String },
    #[error("component name of {len} bytes is longer than {MAX_COMPONENT_LEN}; shorten it")]
    ComponentTooLong { len: usize },
    #[error("a subscriber named `{name}` already exists; give each subscriber its own name")]
    DuplicateSubscriber { name: String },
}

/// The fan-out list: every subscriber and follow queue.
#[derive(Debug, Default)]
struct Queues(Mutex<Vec<Arc<Queue>>>);

impl Queues {
    fn lock(&self) -> MutexGuard<'_, Vec<Arc<Queue>>> {
        crate::stdx::lock(&self.0)
    }

    fn fan_out(&self, event: &Arc<Event>) {
        for queue in self.lock().iter() {
            queue.push(Arc::clone(event));
        }
    }
}

/// State follow tasks share with the bus (no back reference to the bus
/// itself, so dropping the bus ends them).
#[derive(Debug)]
struct Shared {
    store: Arc<Store>,
    queues: Arc<Queues>,
}

#[derive(Debug)]
struct Inner {
    shared: Arc<Shared>,
    pending: Arc<Semaphore>,
    secrets: ArcSwap<Vec<String>>,
    next_queue_id: AtomicU64,
    closed: AtomicBool,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    shutdown_done: tokio::sync::Mutex<bool>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Dropped without `shutdown`: do not leave subscriber tasks behind.
        for task in self
            .tasks
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            task.abort();
        }
    }
}

/// The per-repository event bus; cheap to clone, publish from anywhere.
#[derive(Debug, Clone)]
pub struct EventBus {
    inner: Arc<Inner>,
}

/// A live subscription, for observing it.
#[derive(Debug, Clone)]
pub struct Subscription {
    queue: Arc<Queue>,
}

impl Subscription {
    pub fn name(&self) -> &str {
        &self.queue.name
    }

    /// Events dropped from this subscriber's queue because it was full.
    pub fn dropped(&self) -> u64 {
        self.queue.dropped()
    }
}

impl EventBus {
    /// A bus persisting into `store`.
    pub fn new(store: Arc<Store>) -> Self {
        Self {
            inner: Arc::new(Inner {
                shared: Arc::new(Shared {
                    store,
                    queues: Arc::default(),
                }),
                pending: Arc::new(Semaphore::new(MAX_PENDING_PUBLISHES)),
                secrets: ArcSwap::from_pointee(Vec::new()),
                next_queue_id: AtomicU64::new(1),
                closed: AtomicBool::new(false),
                tasks: Mutex::new(Vec::new()),
                shutdown_done: tokio::sync::Mutex::new(false),
            }),
        }
    }

    /// The store events are persisted into.
    pub fn store(&self) -> &Arc<Store> {
        &self.inner.shared.store
    }

    /// The secret values redacted from every event (for a caller that
    /// stores or shows a value outside an event the same way).
    pub fn secrets(&self) -> Arc<Vec<String>> {
        self.inner.secrets.load_full()
    }

    /// Replace the secret values scrubbed from every published event (call
    /// it whenever the manifest's resolved secrets change). Values shorter
    /// than [`MIN_SCRUBBED_SECRET_CHARS`] are kept out of the scrub list.
    pub fn set_secrets(&self, secrets: impl IntoIterator<Item = String>) {
        let secrets: Vec<String> = secrets
            .into_iter()
            .filter(|s| s.chars().count() >= MIN_SCRUBBED_SECRET_CHARS)
            .collect();
        self.inner.secrets.store(Arc::new(secrets));
    }

    /// Publish `event`: scrub secrets, persist, then deliver to subscribers.
    /// The event is queued when `publish` is CALLED (so one caller's events
    /// keep their order even if the futures are awaited later); the future
    /// resolves once it is durable and handed to every subscriber queue.
    pub fn publish(
        &self,
        event: NewEvent,
    ) -> impl Future<Output = Result<Arc<Event>, BusError>> + Send + 'static {
        let (reply, answer) = oneshot::channel();
        let inner = Arc::clone(&self.inner);
        let queued = self.encode(event).map(|encoded| {
            match Arc::clone(&inner.pending).try_acquire_owned() {
                Ok(permit) => {
                    submit(&inner.shared, encoded, Commit::Now, permit, reply);
                    None
                }
                Err(_) => Some((encoded, reply)),
            }
        });
        async move {
            if let Some((encoded, reply)) = queued? {
                let permit = Arc::clone(&inner.pending)
                    .acquire_owned()
                    .await
                    .map_err(|_| BusError::Closed)?;
                if inner.closed.load(Ordering::Acquire) {
                    return Err(BusError::Closed);
                }
                submit(&inner.shared, encoded, Commit::Now, permit, reply);
            }
            answer.await.unwrap_or(Err(BusError::Closed))
        }
    }

    /// Publish `event` without waiting for it to be durable: it is queued
    /// now, in order with every other publish, and the writer persists and
    /// fans it out (a failure is logged there). The future waits only while
    /// [`MAX_PENDING_PUBLISHES`] events are in flight, so a flood of
    /// publishers is held back rather than buffered. Its commit may wait up
    /// to [`crate::store::LINGER`] to share a transaction with the next
    /// ones. For hot paths whose answer must not wait for a commit (the MCP
    /// gateway's tool calls, a webhook's `run.queued`);
    /// [`Store::flush`](crate::store::Store::flush) orders a later read after it.
    pub async fn publish_detached(&self, event: NewEvent) -> Result<(), BusError> {
        let encoded = self.encode(event)?;
        let inner = &self.inner;
        let permit = match Arc::clone(&inner.pending).try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                let permit = Arc::clone(&inner.pending)
                    .acquire_owned()
                    .await
                    .map_err(|_| BusError::Closed)?;
                if inner.closed.load(Ordering::Acquire) {
                    return Err(BusError::Closed);
                }
                permit
            }
        };
        // Nobody awaits the answer: the writer's outcome is only logged.
        let (reply, _) = oneshot::channel();
        submit(&inner.shared, encoded, Commit::MayLinger, permit, reply);
        Ok(())
    }

    /// Validate, scrub, serialize and (when oversize) truncate an event for the store.
    fn encode(&self, mut event: NewEvent) -> Result<EncodedEvent, BusError> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(BusError::Closed);
        }
        if !valid_kind(event.kind()) {
            return Err(BusError::InvalidKind {
                kind: event.kind().to_string(),
            });
        }
        let secrets = self.inner.secrets.load();
        if let Some(component) = event.component()
            && component.len() > MAX_COMPONENT_LEN
        {
            return Err(BusError::ComponentTooLong {
                len: component.len(),
            });
        }
        redact_json(event.payload_mut(), &secrets);
        let encoded = EncodedEvent::encode(event);
        let size = encoded.payload_json.len();
        if size <= MAX_PAYLOAD_BYTES {
            return Ok(encoded);
        }
        let mut event = encoded.event;
        truncate_payload(event.payload_mut(), size, MAX_PAYLOAD_BYTES);
        tracing::warn!(
            kind = %event.kind(),
            size,
            limit = MAX_PAYLOAD_BYTES,
            "event_bus.payload_truncated"
        );
        Ok(EncodedEvent::encode(event))
    }

    /// Add a subscriber. `predicate` picks the events it wants (it runs on
    /// the subscriber's task, not the publisher's); `handler` runs for each,
    /// one at a time, in id order. Both are crash-isolated.
    pub fn subscribe<P, H, Fut, E>(
        &self,
        name: impl Into<String>,
        predicate: P,
        handler: H,
    ) -> Result<Subscription, BusError>
    where
        P: Fn(&Event) -> bool + Send + 'static,
        H: FnMut(Arc<Event>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Display + Send + 'static,
    {
        let name = name.into();
        let queue = self.register(name.clone())?;
        let span = tracing::info_span!("npcagent.bus", subscriber = %name);
        let task = run_subscriber(Arc::clone(&queue), predicate, handler).instrument(span);
        self.spawn_tracked(task)
            .inspect_err(|_| self.unregister(queue.id))?;
        Ok(Subscription { queue })
    }

    /// A gap-free, duplicate-free stream of every event with
    /// `id > after_id`: past events replayed from the database, then live
    /// ones, strictly increasing by id. The live queue is registered before
    /// this returns, so nothing published after the call is missed; if the
    /// receiver lags so far that its live queue overflows, the missing range
    /// is read back from the database. The stream ends when the receiver is
    /// dropped or the bus shuts down.
    pub fn follow(&self, after_id: i64) -> Result<mpsc::Receiver<Arc<Event>>, BusError> {
        let id = self.inner.next_queue_id.load(Ordering::Relaxed);
        let queue = self.register(format!("npcagent.follow[{id}]"))?;
        let (tx, rx) = mpsc::channel(FOLLOW_CHANNEL_CAPACITY);
        let shared = Arc::clone(&self.inner.shared);
        let span = tracing::info_span!("npcagent.bus", subscriber = %queue.name);
        let queue_id = queue.id;
        self.spawn_tracked(run_follow(shared, queue, after_id, tx).instrument(span))
            .inspect_err(|_| self.unregister(queue_id))?;
        Ok(rx)
    }

    fn register(&self, name: String) -> Result<Arc<Queue>, BusError> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(BusError::Closed);
        }
        let mut queues = self.inner.shared.queues.lock();
        if queues.iter().any(|q| q.name == name) {
            return Err(BusError::DuplicateSubscriber { name });
        }
        let id = self.inner.next_queue_id.fetch_add(1, Ordering::Relaxed);
        let queue = Arc::new(Queue::new(id, name, SUBSCRIBER_QUEUE_CAPACITY));
        queues.push(Arc::clone(&queue));
        Ok(queue)
    }

    fn unregister(&self, id: u64) {
        self.inner.shared.queues.lock().retain(|q| q.id != id);
    }

    fn spawn_tracked(
        &self,
        task: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), BusError> {
        let mut tasks = crate::stdx::lock(&self.inner.tasks);
        // Checked under the task lock: `shutdown` sets `closed` before it
        // takes this lock, so a task spawned here is always awaited by it.
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(BusError::Closed);
        }
        tasks.retain(|t| !t.is_finished());
        tasks.push(tokio::spawn(task));
        Ok(())
    }

    /// Stop the bus: refuse new publishes, let the ones already queued be
    /// persisted and delivered, then cancel every subscriber and follow task
    /// and wait for them. Idempotent; a second call (even a concurrent one)
    /// returns once the first has finished.
    pub async fn shutdown(&self) {
        let mut done = self.inner.shutdown_done.lock().await;
        if *done {
            return;
        }
        self.inner.closed.store(true, Ordering::Release);
        // Writes apply in order: once this resolves, every publish queued
        // before it has been committed and fanned out. A read-only store
        // refuses it, and had nothing queued.
        let _ = self.inner.shared.store.flush().await;
        let tasks = std::mem::take(&mut *crate::stdx::lock(&self.inner.tasks));
        for task in &tasks {
            task.abort();
        }
        for task in tasks {
            let _ = task.await;
        }
        self.inner.shared.queues.lock().clear();
        *done = true;
    }
}

fn valid_kind(kind: &str) -> bool {
    !kind.is_empty()
        && kind.len() <= MAX_EVENT_KIND_LEN
        && kind.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'.' | b'-')
        })
}

/// Hand one event to the store's writer; after the commit, on the writer
/// thread, fan it out and answer the publisher. Holds only the queue list,
/// never the store (see [`Store::append_events_then`]).
fn submit(
    shared: &Shared,
    event: EncodedEvent,
    commit: Commit,
    permit: OwnedSemaphorePermit,
    reply: oneshot::Sender<Result<Arc<Event>, BusError>>,
) {
    let queues = Arc::clone(&shared.queues);
    shared
        .store
        .append_events_then(vec![event], commit, move |stored| {
            let answer = match stored.map(|mut events| events.pop()) {
                Ok(Some(event)) => {
                    let event = Arc::new(event);
                    queues.fan_out(&event);
                    Ok(event)
                }
                Ok(None) => Err(BusError::Persist {
                    source: StoreError::WriterGone,
                }),
                Err(source) => {
                    tracing::error!(error = %source, "event_bus.persist_failed");
                    Err(BusError::Persist { source })
                }
            };
            let _ = reply.send(answer);
            drop(permit);
        });
}

async fn run_subscriber<P, H, Fut, E>(queue: Arc<Queue>, predicate: P, mut handler: H)
where
    P: Fn(&Event) -> bool,
    H: FnMut(Arc<Event>) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: Display,
{
    loop {
        let event = queue.pop().await;
        match catch_unwind(AssertUnwindSafe(|| predicate(&event))) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(panic) => {
                tracing::error!(
                    subscriber = %queue.name,
                    event_id = event.id,
                    panic = panic_message(panic.as_ref()),
                    "event_bus.predicate_raised"
                );
                continue;
            }
        }
        let event_id = event.id;
        let outcome = match catch_unwind(AssertUnwindSafe(|| handler(event))) {
            Ok(future) => {
                let mut future = pin!(future);
                poll_fn(
                    |cx| match catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx))) {
                        Ok(std::task::Poll::Pending) => std::task::Poll::Pending,
                        Ok(std::task::Poll::Ready(result)) => std::task::Poll::Ready(Ok(result)),
                        Err(panic) => std::task::Poll::Ready(Err(panic)),
                    },
                )
                .await
            }
            Err(panic) => Err(panic),
        };
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::warn!(
                subscriber = %queue.name,
                event_id,
                error = %error,
                "event_bus.handler_raised"
            ),
            Err(panic) => tracing::error!(
                subscriber = %queue.name,
                event_id,
                panic = panic_message(panic.as_ref()),
                "event_bus.handler_panicked"
            ),
        }
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("non-string panic")
}

/// Removes a follow queue from the fan-out list when its task ends.
struct Unregister {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for Unregister {
    fn drop(&mut self) {
        self.shared.queues.lock().retain(|q| q.id != self.id);
    }
}

async fn run_follow(
    shared: Arc<Shared>,
    queue: Arc<Queue>,
    mut cursor: i64,
    tx: mpsc::Sender<Arc<Event>>,
) {
    let _unregister = Unregister {
        shared: Arc::clone(&shared),
        id: queue.id,
    };
    let mut drops_seen = queue.dropped();
    loop {
        // Replay everything durable after the cursor. The live queue was
        // registered first, so whatever commits after this read is in it.
        loop {
            let store = Arc::clone(&shared.store);
            let after = cursor;
            let page =
                tokio::task::spawn_blocking(move || store.events_since(after, FOLLOW_REPLAY_PAGE))
                    .await;
            let events = match page {
                Ok(Ok(events)) => events,
                Ok(Err(error)) => {
                    tracing::error!(error = %error, "event_bus.follow_replay_failed");
                    return;
                }
                Err(join) => {
                    tracing::error!(error = %join, "event_bus.follow_replay_failed");
                    return;
                }
            };
            if events.is_empty() {
                break;
            }
            for event in events {
                cursor = event.id;
                if tx.send(Arc::new(event)).await.is_err() {
                    return;
                }
            }
        }
        // Live tail, skipping what the replay already sent.
        loop {
            let event = tokio::select! {
                event = queue.pop() => event,
                _ = tx.closed() => return,
            };
            let drops = queue.dropped();
            if drops != drops_seen {
                // Some events between the cursor and this one were dropped
                // from the live queue; they are durable, so read them back.
                drops_seen = drops;
                break;
            }
            if event.id <= cursor {
                continue;
            }
            cursor = event.id;
            if tx.send(event).await.is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests;
