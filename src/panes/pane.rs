//! One running pane: a child in a PTY (started through the supervisor), a
//! blocking reader thread that keeps the raw output in a bounded scrollback
//! ring, fans it out to attached clients and hands escape-stripped text to
//! the pane's watcher, and a waiter thread that records the exit status.
//! Idleness is the time since the last output byte.

use crate::stdx::lock;
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{broadcast, mpsc};

use super::ansi::Stripper;
use super::outbox::Outbox;
use crate::supervisor::{PtyControl, PtyExit, PtyProcess};

/// Bytes of raw output kept per pane for clients that attach later.
pub const SCROLLBACK_BYTES: usize = 256 * 1024;
/// Output chunks queued per attached client; a client further behind
/// misses chunks (it is told so) rather than holding memory.
pub const ATTACH_QUEUE: usize = 1024;
/// Bytes read from a PTY at once.
pub const READ_CHUNK: usize = 16 * 1024;
/// After a pane's process exited, how long its reader may still drain
/// output before the exit is reported anyway (a process that left the
/// group can hold the terminal open).
pub const POST_EXIT_DRAIN: Duration = Duration::from_secs(2);

/// A bounded ring of the most recent bytes.
#[derive(Debug, Default)]
pub struct Scrollback {
    bytes: VecDeque<u8>,
}

impl Scrollback {
    pub fn push(&mut self, chunk: &[u8]) {
        let chunk = &chunk[chunk.len().saturating_sub(SCROLLBACK_BYTES)..];
        let over = (self.bytes.len() + chunk.len()).saturating_sub(SCROLLBACK_BYTES);
        self.bytes.drain(..over);
        self.bytes.extend(chunk);
    }

    pub fn snapshot(&self) -> Vec<u8> {
        self.bytes.iter().copied().collect()
    }

    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

/// Something that happened to a pane, for the host's loop.
#[derive(Debug)]
pub enum PaneEvent {
    Exited { id: u64, exit: PtyExit },
}

/// Where the reader thread sends stripped text: the watcher's outbox.
pub type Watch = Arc<Mutex<Option<Arc<Outbox>>>>;

/// A running (or exited) pane process.
pub struct Pane {
    /// Unique per process: a relaunch gets a new id.
    pub id: u64,
    pub token: String,
    pub generation: u64,
    pub pid: u32,
    pub started: Instant,
    writer: Mutex<Box<dyn Write + Send>>,
    control: Arc<PtyControl>,
    ring: Mutex<Scrollback>,
    output: broadcast::Sender<Arc<[u8]>>,
    /// Milliseconds after `started` of the last output byte.
    last_output_ms: AtomicU64,
    /// `pane_idle` was reported since the last output.
    pub idle_reported: AtomicBool,
    exit: Mutex<Option<PtyExit>>,
    /// The terminal size: rows, columns.
    size: Mutex<(u16, u16)>,
    /// The watcher's outbox, set by the host.
    pub watch: Watch,
}

impl std::fmt::Debug for Pane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pane")
            .field("id", &self.id)
            .field("generation", &self.generation)
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

impl Pane {
    /// Take over a started PTY process: start its reader and waiter threads.
    pub fn run(
        id: u64,
        token: String,
        generation: u64,
        process: PtyProcess,
        watch: Watch,
        events: mpsc::UnboundedSender<PaneEvent>,
    ) -> Arc<Self> {
        let PtyProcess {
            pid,
            reader,
            writer,
            control,
            waiter,
        } = process;
        let (output, _) = broadcast::channel(ATTACH_QUEUE);
        let pane = Arc::new(Self {
            id,
            token,
            generation,
            pid,
            started: Instant::now(),
            writer: Mutex::new(writer),
            control,
            ring: Mutex::new(Scrollback::default()),
            output,
            last_output_ms: AtomicU64::new(0),
            idle_reported: AtomicBool::new(false),
            exit: Mutex::new(None),
            size: Mutex::new((super::DEFAULT_ROWS, super::DEFAULT_COLS)),
            watch,
        });
        let (drained_tx, drained_rx) = std::sync::mpsc::channel::<()>();
        let reading = pane.clone();
        let _ = std::thread::Builder::new()
            .name(format!("pane-{id}-reader"))
            .spawn(move || {
                reading.read_loop(reader);
                // An empty chunk tells attached clients the output ended.
                let _ = reading.output.send(Arc::from(&[][..]));
                let _ = drained_tx.send(());
            });
        let waiting = Arc::downgrade(&pane);
        let _ = std::thread::Builder::new()
            .name(format!("pane-{id}-waiter"))
            .spawn(move || {
                let exit = waiter.wait();
                let _ = drained_rx.recv_timeout(POST_EXIT_DRAIN);
                if let Some(pane) = waiting.upgrade() {
                    *lock(&pane.exit) = Some(exit.clone());
                }
                let _ = events.send(PaneEvent::Exited { id, exit });
            });
        pane
    }

    fn read_loop(&self, mut reader: Box<dyn Read + Send>) {
        let mut buf = vec![0u8; READ_CHUNK];
        let mut stripper = Stripper::new();
        let mut text = String::new();
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) | Err(_) => return, // EIO once the child side is gone
                Ok(n) => n,
            };
            let chunk = &buf[..n];
            self.last_output_ms
                .store(self.started.elapsed().as_millis() as u64, Ordering::SeqCst);
            self.idle_reported.store(false, Ordering::SeqCst);
            {
                // Ring and broadcast under one lock: an attaching client's
                // snapshot plus subscription misses and repeats nothing.
                let mut ring = lock(&self.ring);
                ring.push(chunk);
                let _ = self.output.send(Arc::from(chunk));
            }
            let watcher = lock(&self.watch).clone();
            if let Some(outbox) = watcher {
                text.clear();
                stripper.feed(chunk, &mut text);
                if !text.is_empty() {
                    outbox.output(&self.token, self.generation, &text);
                }
            }
        }
    }

    /// How long the pane has printed nothing.
    pub fn quiet_for(&self) -> Duration {
        let last = Duration::from_millis(self.last_output_ms.load(Ordering::SeqCst));
        self.started.elapsed().saturating_sub(last)
    }

    pub fn exit(&self) -> Option<PtyExit> {
        lock(&self.exit).clone()
    }

    pub fn is_live(&self) -> bool {
        self.exit().is_none()
    }

    /// Write bytes to the PTY. The callers are the host's two input paths:
    /// a user's (`npc pane send`, attach) and a guard-approved plugin input.
    pub(super) fn write_pty(&self, bytes: &[u8]) -> std::io::Result<()> {
        let mut w = lock(&self.writer);
        w.write_all(bytes)?;
        w.flush()
    }

    pub fn resize(&self, rows: u16, cols: u16) -> std::io::Result<()> {
        self.control.resize(rows, cols)?;
        *lock(&self.size) = (rows, cols);
        Ok(())
    }

    /// The terminal size: rows, columns.
    pub fn size(&self) -> (u16, u16) {
        *lock(&self.size)
    }

    /// SIGHUP then (after `grace`) SIGKILL the pane's process group.
    pub fn hang_up(&self) {
        self.control.signal(nix::sys::signal::Signal::SIGHUP);
        self.control.signal(nix::sys::signal::Signal::SIGTERM);
    }

    pub fn kill(&self) {
        self.control.signal(nix::sys::signal::Signal::SIGKILL);
    }

    /// The scrollback and a subscription to what follows it.
    pub fn subscribe(&self) -> (Vec<u8>, broadcast::Receiver<Arc<[u8]>>) {
        let ring = lock(&self.ring);
        (ring.snapshot(), self.output.subscribe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_newest_bytes_within_its_bound() {
        let mut ring = Scrollback::default();
        ring.push(&vec![b'a'; SCROLLBACK_BYTES - 2]);
        ring.push(b"bcde");
        assert_eq!(ring.len(), SCROLLBACK_BYTES);
        assert!(ring.snapshot().ends_with(b"abcde"));
        ring.push(&vec![b'z'; SCROLLBACK_BYTES * 2]);
        assert_eq!(ring.len(), SCROLLBACK_BYTES);
        assert!(ring.snapshot().iter().all(|&b| b == b'z'));
    }
}
