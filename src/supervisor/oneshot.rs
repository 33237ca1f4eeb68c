//! Processes that run once rather than being kept alive: [`run_once`] (hooks,
//! render helpers) with bounded output capture and a timeout that kills the
//! process group, and [`spawn_streaming`] (agent runs) that hands out stdout
//! and stderr line by line with a bounded line length, tolerating invalid
//! UTF-8, and can be cancelled by killing the group.

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::contain::Containment;
use super::spawn::{self, ChildSpec, GroupGuard};
use super::{ExitInfo, SupervisorError, lock};

/// Default cap on captured stdout of a one-shot run.
pub const DEFAULT_STDOUT_LIMIT: usize = 1024 * 1024;
/// Default cap on captured stderr of a one-shot run.
pub const DEFAULT_STDERR_LIMIT: usize = 256 * 1024;
/// After the leader exits (and its group is killed), how long readers may
/// still drain pipes held open by a process that escaped the group.
pub const POST_EXIT_DRAIN: Duration = Duration::from_secs(2);
/// Longest line handed out by a streaming child; the rest is dropped and the
/// line is marked truncated.
pub const MAX_LINE_BYTES: usize = 1024 * 1024;
/// Lines buffered per stream before the reader waits for the consumer.
pub const STREAM_QUEUE_DEPTH: usize = 256;
/// Read chunk size for pipes.
const READ_CHUNK: usize = 64 * 1024;

/// Caps on what a one-shot run captures; output beyond them is read and
/// discarded so the child never blocks on a full pipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputLimits {
    pub stdout: usize,
    pub stderr: usize,
}

impl Default for OutputLimits {
    fn default() -> Self {
        Self {
            stdout: DEFAULT_STDOUT_LIMIT,
            stderr: DEFAULT_STDERR_LIMIT,
        }
    }
}

/// The result of a one-shot run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    pub status: ExitInfo,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// More stdout was written than [`OutputLimits::stdout`].
    pub stdout_truncated: bool,
    /// More stderr was written than [`OutputLimits::stderr`].
    pub stderr_truncated: bool,
    /// The run outlived its timeout and its process group was killed.
    pub timed_out: bool,
}

#[derive(Debug, Default)]
struct Captured {
    bytes: Vec<u8>,
    truncated: bool,
}

async fn capture(mut reader: impl AsyncRead + Unpin, limit: usize, into: Arc<Mutex<Captured>>) {
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        let n = match reader.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let mut c = lock(&into);
        let room = limit.saturating_sub(c.bytes.len());
        c.bytes.extend_from_slice(&buf[..n.min(room)]);
        if n > room {
            c.truncated = true;
        }
    }
}

fn capture_task(
    reader: Option<impl AsyncRead + Unpin + Send + 'static>,
    limit: usize,
) -> (Arc<Mutex<Captured>>, Option<JoinHandle<()>>) {
    let slot = Arc::new(Mutex::new(Captured::default()));
    let task = reader.map(|r| tokio::spawn(capture(r, limit, slot.clone())));
    (slot, task)
}

async fn finish(slot: Arc<Mutex<Captured>>, task: Option<JoinHandle<()>>) -> Captured {
    if let Some(task) = task {
        let abort = task.abort_handle();
        if tokio::time::timeout(POST_EXIT_DRAIN, task).await.is_err() {
            abort.abort();
        }
    }
    std::mem::take(&mut *lock(&slot))
}

fn io_error(spec: &ChildSpec, source: std::io::Error) -> SupervisorError {
    SupervisorError::Io {
        id: spec.program.clone(),
        source,
    }
}

/// See `Supervisor::run_once`.
pub(super) async fn run_once(
    spec: &ChildSpec,
    stdin: Option<Vec<u8>>,
    timeout: Duration,
    limits: OutputLimits,
    contain: Option<&Arc<Containment>>,
) -> Result<Output, SupervisorError> {
    let mut child = spawn::spawn_piped(&spec.program, spec, contain)?;
    let pgid = spawn::pgid_of(&child);
    let mut guard = GroupGuard::new(pgid, contain);
    let pipe = child.stdin.take();
    let writer = tokio::spawn(async move {
        if let (Some(mut pipe), Some(data)) = (pipe, stdin) {
            // A child that exits without reading makes this fail; that is its choice.
            let _ = pipe.write_all(&data).await;
        }
    });
    let (out_slot, out_task) = capture_task(child.stdout.take(), limits.stdout);
    let (err_slot, err_task) = capture_task(child.stderr.take(), limits.stderr);
    let (status, timed_out) = match tokio::time::timeout(timeout, child.wait()).await {
        Ok(status) => (status, false),
        Err(_) => {
            if let Some(pgid) = pgid {
                let _ = spawn::signal_group(pgid, Signal::SIGKILL);
            }
            (child.wait().await, true)
        }
    };
    if let Some(pgid) = pgid {
        spawn::kill_leftovers(pgid);
    }
    guard.disarm();
    writer.abort();
    let status = status.map_err(|e| io_error(spec, e))?;
    let out = finish(out_slot, out_task).await;
    let err = finish(err_slot, err_task).await;
    Ok(Output {
        status: ExitInfo::from(status),
        stdout: out.bytes,
        stderr: err.bytes,
        stdout_truncated: out.truncated,
        stderr_truncated: err.truncated,
        timed_out,
    })
}

/// One line of a streaming child's output, without its `\n` (or `\r\n`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// The raw bytes, at most [`MAX_LINE_BYTES`].
    pub bytes: Vec<u8>,
    /// The line was longer than [`MAX_LINE_BYTES`]; the rest was dropped.
    pub truncated: bool,
}

impl Line {
    /// The line as text; invalid UTF-8 becomes U+FFFD.
    pub fn text(&self) -> Cow<'_, str> {
        String::from_utf8_lossy(&self.bytes)
    }
}

/// Split `reader` into lines of at most `max` bytes and send them to `tx`.
/// If the receiver is dropped the stream is still drained (and discarded),
/// so the child never blocks on a full pipe.
async fn read_lines(reader: impl AsyncRead + Unpin, max: usize, tx: mpsc::Sender<Line>) {
    use crate::stdx::lines::{self, LineReader, Overlong, Splitter};
    let mut reader = LineReader::with_capacity(
        READ_CHUNK,
        reader,
        Splitter::new(max, Overlong::Truncate).trim_cr(),
    );
    let mut open = true;
    while let Ok(Some(line)) = reader.next().await {
        let line = match line {
            lines::Line::Line(bytes) => Line {
                bytes,
                truncated: false,
            },
            lines::Line::Truncated(bytes) => Line {
                bytes,
                truncated: true,
            },
            lines::Line::TooLong { .. } => continue, // not under `Truncate`
        };
        if open && tx.send(line).await.is_err() {
            open = false;
        }
    }
}

/// Kills a streaming child's process group; cloneable, so a Ctrl-C handler
/// can hold one while another task awaits [`StreamingChild::wait`].
#[derive(Debug, Clone)]
pub struct GroupKiller {
    pgid: Option<Pid>,
    reaped: Arc<AtomicBool>,
}

impl GroupKiller {
    /// Send `signal` to the whole process group (no-op once reaped).
    pub fn signal(&self, signal: Signal) -> Result<(), SupervisorError> {
        match self.pgid {
            Some(pgid) if !self.reaped.load(Ordering::SeqCst) => spawn::signal_group(pgid, signal)
                .map_err(|source| SupervisorError::Signal {
                    id: pgid.to_string(),
                    source,
                }),
            _ => Ok(()),
        }
    }

    /// SIGKILL the whole process group (no-op once reaped).
    pub fn kill(&self) -> Result<(), SupervisorError> {
        self.signal(Signal::SIGKILL)
    }
}

/// A process whose output is consumed line by line while it runs. Dropping
/// it kills the process group.
#[derive(Debug)]
pub struct StreamingChild {
    pid: u32,
    child: Child,
    killer: GroupKiller,
    guard: GroupGuard,
    exit: Option<ExitInfo>,
    /// The child's stdin; drop it to send EOF.
    pub stdin: Option<ChildStdin>,
    /// stdout lines; dropping the receiver discards the rest of the stream.
    pub stdout: mpsc::Receiver<Line>,
    /// stderr lines; dropping the receiver discards the rest of the stream.
    pub stderr: mpsc::Receiver<Line>,
}

impl StreamingChild {
    /// Pid of the process (also its process group id).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// A handle that can kill the group while [`StreamingChild::wait`] runs.
    pub fn killer(&self) -> GroupKiller {
        self.killer.clone()
    }

    /// SIGKILL the process group (for Ctrl-C cancellation); then `wait`.
    pub fn kill_group(&self) -> Result<(), SupervisorError> {
        self.killer.kill()
    }

    /// Wait for the process to exit, then kill whatever it left in its
    /// group. Calling it again returns the same status.
    pub async fn wait(&mut self) -> Result<ExitInfo, SupervisorError> {
        if let Some(exit) = self.exit {
            return Ok(exit);
        }
        let status = self
            .child
            .wait()
            .await
            .map_err(|source| SupervisorError::Io {
                id: self.pid.to_string(),
                source,
            })?;
        if let Some(pgid) = self.killer.pgid {
            spawn::kill_leftovers(pgid);
        }
        self.killer.reaped.store(true, Ordering::SeqCst);
        self.guard.disarm();
        let exit = ExitInfo::from(status);
        self.exit = Some(exit);
        Ok(exit)
    }
}

impl Drop for StreamingChild {
    /// The guard kills the group; the killer's clones (a Ctrl-C handler, a
    /// plugin's handle) must not signal its number afterwards, when it may
    /// name another group (pids are reused).
    fn drop(&mut self) {
        self.killer.reaped.store(true, Ordering::SeqCst);
    }
}

/// See `Supervisor::spawn_streaming`.
pub(super) fn spawn_streaming(
    spec: &ChildSpec,
    max_line: usize,
    contain: Option<&Arc<Containment>>,
) -> Result<StreamingChild, SupervisorError> {
    let mut child = spawn::spawn_piped(&spec.program, spec, contain)?;
    let pid = child.id().unwrap_or_default();
    let pgid = spawn::pgid_of(&child);
    let (out_tx, stdout) = mpsc::channel(STREAM_QUEUE_DEPTH);
    let (err_tx, stderr) = mpsc::channel(STREAM_QUEUE_DEPTH);
    if let Some(out) = child.stdout.take() {
        tokio::spawn(read_lines(out, max_line, out_tx));
    }
    if let Some(err) = child.stderr.take() {
        tokio::spawn(read_lines(err, max_line, err_tx));
    }
    Ok(StreamingChild {
        pid,
        stdin: child.stdin.take(),
        child,
        killer: GroupKiller {
            pgid,
            reaped: Arc::new(AtomicBool::new(false)),
        },
        guard: GroupGuard::new(pgid, contain),
        exit: None,
        stdout,
        stderr,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn lines_of(input: &[u8], max: usize) -> Vec<Line> {
        let (tx, mut rx) = mpsc::channel(STREAM_QUEUE_DEPTH);
        read_lines(input, max, tx).await;
        let mut out = Vec::new();
        while let Some(l) = rx.recv().await {
            out.push(l);
        }
        out
    }

    fn line(s: &[u8], truncated: bool) -> Line {
        Line {
            bytes: s.to_vec(),
            truncated,
        }
    }

    #[tokio::test]
    async fn splits_lines_and_keeps_a_trailing_partial_line() {
        let got = lines_of(b"a\r\nbb\n\nccc", 16).await;
        assert_eq!(
            got,
            [
                line(b"a", false),
                line(b"bb", false),
                line(b"", false),
                line(b"ccc", false)
            ]
        );
    }

    #[tokio::test]
    async fn long_lines_are_truncated_and_marked() {
        let got = lines_of(b"0123456789\nok\n", 4).await;
        assert_eq!(got, [line(b"0123", true), line(b"ok", false)]);
    }

    #[tokio::test]
    async fn invalid_utf8_is_tolerated() {
        let got = lines_of(b"\xff\xfeok\n", 16).await;
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].text(), "\u{fffd}\u{fffd}ok");
    }

    proptest::proptest! {
        #[test]
        fn lines_never_exceed_the_bound(input in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..4096), max in 1usize..64) {
            let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
            let got = rt.block_on(lines_of(&input, max));
            let newlines = input.iter().filter(|&&b| b == b'\n').count();
            proptest::prop_assert!(got.len() == newlines || got.len() == newlines + 1);
            for l in &got {
                proptest::prop_assert!(l.bytes.len() <= max);
                proptest::prop_assert!(!l.bytes.contains(&b'\n'));
            }
            let untruncated: Vec<u8> = got.iter().filter(|l| !l.truncated).flat_map(|l| l.bytes.clone()).collect();
            proptest::prop_assert!(untruncated.len() <= input.len());
        }
    }
}
