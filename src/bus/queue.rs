//! A subscriber's bounded queue. When it is full the OLDEST item is dropped
//! to make room, so a slow subscriber loses its own backlog and never slows
//! the publisher or any other subscriber. Drops are counted and logged.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::Notify;

use crate::store::Event;

/// After the first drop of a queue, log again every this many drops.
pub const DROP_LOG_INTERVAL: u64 = 100;

#[derive(Debug)]
pub(super) struct Queue {
    pub id: u64,
    pub name: String,
    capacity: usize,
    items: Mutex<VecDeque<Arc<Event>>>,
    ready: Notify,
    dropped: AtomicU64,
}

impl Queue {
    pub fn new(id: u64, name: String, capacity: usize) -> Self {
        Self {
            id,
            name,
            capacity,
            items: Mutex::new(VecDeque::with_capacity(capacity.min(64))),
            ready: Notify::new(),
            dropped: AtomicU64::new(0),
        }
    }

    /// Enqueue, dropping the oldest item if full. Never blocks on the consumer.
    pub fn push(&self, event: Arc<Event>) {
        let dropped_one = {
            let mut items = crate::stdx::lock(&self.items);
            let full = items.len() >= self.capacity;
            if full {
                items.pop_front();
            }
            items.push_back(event);
            full
        };
        if dropped_one {
            let total = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if total == 1 || total.is_multiple_of(DROP_LOG_INTERVAL) {
                tracing::warn!(
                    subscriber = %self.name,
                    dropped_oldest = total,
                    capacity = self.capacity,
                    "event_bus.subscriber_queue_full"
                );
            }
        }
        self.ready.notify_one();
    }

    /// Wait for and take the oldest item.
    pub async fn pop(&self) -> Arc<Event> {
        loop {
            if let Some(event) = crate::stdx::lock(&self.items).pop_front() {
                return event;
            }
            // `notify_one` stores a permit when nobody waits, so a push
            // between the check above and this await is not lost.
            self.ready.notified().await;
        }
    }

    /// Items dropped since the queue was created.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}
