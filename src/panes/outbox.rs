//! A plugin's outbound queue: host events in order, with pane output
//! coalesced into few `pane_output` messages. It is bounded both ways: at
//! most [`MAX_OUTBOUND_EVENTS`] events (newer ones are dropped and counted)
//! and [`MAX_PENDING_OUTPUT_BYTES`] of output text (the oldest text is
//! dropped and counted), so a slow or stuck plugin never holds memory and
//! never slows a pane down.

use crate::stdx::lock;
use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::Notify;

use super::protocol::{HostEvent, MAX_OUTPUT_TEXT_BYTES, PROTOCOL_VERSION};

/// Host events (other than output) queued per plugin.
pub const MAX_OUTBOUND_EVENTS: usize = 1024;
/// Output text queued per plugin.
pub const MAX_PENDING_OUTPUT_BYTES: usize = 1024 * 1024;

#[derive(Debug)]
enum Item {
    Event(HostEvent),
    Output {
        token: String,
        generation: u64,
        text: String,
    },
}

#[derive(Debug, Default)]
struct Queue {
    items: VecDeque<Item>,
    events: usize,
    output_bytes: usize,
    closed: bool,
}

/// See the module documentation.
#[derive(Debug, Default)]
pub struct Outbox {
    queue: Mutex<Queue>,
    ready: Notify,
    /// Events refused because the queue was full.
    pub dropped_events: AtomicU64,
    /// Output bytes dropped because the queue was full.
    pub dropped_output_bytes: AtomicU64,
}

impl Outbox {
    /// Queue an event; `false` when the queue is full (the event is dropped).
    pub fn event(&self, event: HostEvent) -> bool {
        let mut q = lock(&self.queue);
        if q.closed {
            return false;
        }
        if q.events >= MAX_OUTBOUND_EVENTS {
            self.dropped_events.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        q.events += 1;
        q.items.push_back(Item::Event(event));
        drop(q);
        self.ready.notify_one();
        true
    }

    /// Queue output text of a pane, appending to the last queued output of
    /// the same pane when nothing came between.
    pub fn output(&self, token: &str, generation: u64, text: &str) {
        let mut q = lock(&self.queue);
        if q.closed {
            return;
        }
        q.output_bytes += text.len();
        let merged = match q.items.back_mut() {
            Some(Item::Output {
                token: t,
                generation: g,
                text: queued,
            }) if t == token && *g == generation && queued.len() < MAX_OUTPUT_TEXT_BYTES => {
                queued.push_str(text);
                true
            }
            _ => false,
        };
        if !merged {
            q.items.push_back(Item::Output {
                token: token.to_string(),
                generation,
                text: text.to_string(),
            });
        }
        // Over the bound: drop the oldest output (events stay).
        while q.output_bytes > MAX_PENDING_OUTPUT_BYTES {
            let Some(i) = q
                .items
                .iter()
                .position(|i| matches!(i, Item::Output { .. }))
            else {
                break;
            };
            if let Some(Item::Output { text, .. }) = q.items.remove(i) {
                q.output_bytes -= text.len();
                self.dropped_output_bytes
                    .fetch_add(text.len() as u64, Ordering::Relaxed);
            }
        }
        drop(q);
        self.ready.notify_one();
    }

    /// No more messages are queued; the writer ends after the queued ones.
    pub fn close(&self) {
        lock(&self.queue).closed = true;
        self.ready.notify_one();
    }

    /// The next messages to write, waiting for some; `None` once closed and
    /// empty. Output text is cut into messages of at most
    /// [`MAX_OUTPUT_TEXT_BYTES`].
    pub async fn next_batch(&self) -> Option<Vec<HostEvent>> {
        loop {
            let notified = self.ready.notified();
            {
                let mut q = lock(&self.queue);
                if !q.items.is_empty() {
                    let items: Vec<Item> = q.items.drain(..).collect();
                    q.events = 0;
                    q.output_bytes = 0;
                    drop(q);
                    let mut out = Vec::with_capacity(items.len());
                    for item in items {
                        match item {
                            Item::Event(e) => out.push(e),
                            Item::Output {
                                token,
                                generation,
                                text,
                            } => {
                                for piece in split_text(&text, MAX_OUTPUT_TEXT_BYTES) {
                                    out.push(HostEvent::PaneOutput {
                                        v: PROTOCOL_VERSION,
                                        token: token.clone(),
                                        generation,
                                        text: piece.to_string(),
                                    });
                                }
                            }
                        }
                    }
                    return Some(out);
                }
                if q.closed {
                    return None;
                }
            }
            notified.await;
        }
    }
}

/// `text` in pieces of at most `max` bytes, cut at character boundaries.
pub fn split_text(text: &str, max: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while rest.len() > max {
        let mut cut = max;
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        let (head, tail) = rest.split_at(cut);
        out.push(head);
        rest = tail;
    }
    if !rest.is_empty() {
        out.push(rest);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn output_coalesces_keeps_order_and_stays_bounded() {
        let o = Outbox::default();
        o.output("t", 1, "a");
        o.output("t", 1, "b");
        o.event(HostEvent::PaneExited {
            v: 3,
            token: "t".into(),
            generation: 1,
        });
        let batch = o.next_batch().await.unwrap();
        assert_eq!(batch.len(), 2);
        assert!(matches!(&batch[0], HostEvent::PaneOutput { text, .. } if text == "ab"));
        assert!(matches!(&batch[1], HostEvent::PaneExited { .. }));
        let chunk = "x".repeat(64 * 1024);
        for _ in 0..40 {
            o.output("t", 1, &chunk);
        }
        let kept: usize = o
            .next_batch()
            .await
            .unwrap()
            .iter()
            .map(|e| match e {
                HostEvent::PaneOutput { text, .. } => text.len(),
                _ => 0,
            })
            .sum();
        assert!(kept <= MAX_PENDING_OUTPUT_BYTES + MAX_OUTPUT_TEXT_BYTES + chunk.len());
        assert!(o.dropped_output_bytes.load(Ordering::Relaxed) > 0);
        o.close();
        assert!(o.next_batch().await.is_none());
    }

    #[test]
    fn split_text_respects_characters() {
        assert_eq!(split_text("aé", 2), vec!["a", "é"]);
        assert_eq!(split_text("", 2), Vec::<&str>::new());
    }
}
