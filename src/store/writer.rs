//! The store's single writer: a dedicated OS thread that owns the writable
//! SQLite connection. Callers submit jobs over a channel; the thread drains
//! every job already queued, runs them all in ONE immediate transaction
//! (each inside its own savepoint, so one failing job rolls back only
//! itself), commits once, and then answers every caller. That is group
//! commit: concurrent writers share a transaction and an fsync. A batch of
//! nothing but [`Commit::MayLinger`] jobs (events nobody waits for) waits up
//! to [`LINGER`] for more before it commits, so a steady trickle of them —
//! one per MCP tool call — costs one transaction per few milliseconds rather
//! than one each; any job someone awaits ends the wait at once. While it
//! lingers the writer is parked, not blocked on the channel, so queuing a
//! lingering job costs no wake-up of the writer thread (one per batch, not
//! one per event); queuing a job someone awaits unparks it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::task::{Context, Poll};

use rusqlite::{Connection, TransactionBehavior};
use tokio::sync::oneshot;

use super::{StoreError, sqlite};

/// Most jobs one transaction takes before it commits and starts another.
pub const MAX_JOBS_PER_TRANSACTION: usize = 4096;
/// Longest a batch of [`Commit::MayLinger`] jobs waits for company.
pub const LINGER: std::time::Duration = std::time::Duration::from_millis(2);

/// When a job's transaction may commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commit {
    /// As soon as the writer gets to it (someone waits for the answer).
    Now,
    /// Within [`LINGER`]: nobody waits, so it may share a later transaction.
    MayLinger,
}

/// A unit of work for the writer thread.
pub(super) trait Job: Send {
    /// Whether the job is a single statement. SQLite makes a statement
    /// atomic by itself, so such a job skips the savepoint round trip.
    fn single_statement(&self) -> bool;
    /// When its transaction may commit.
    fn commit(&self) -> Commit;
    /// Run inside the batch's transaction; an error undoes this job only.
    fn run(&mut self, conn: &Connection) -> Result<(), StoreError>;
    /// Answer the caller once the transaction's outcome is known. Runs on
    /// the writer thread, in submission order.
    fn finish(self: Box<Self>, commit: Result<(), StoreError>);
}

/// What a job does with its result: wake an awaiting caller, or run a
/// short callback on the writer thread.
type Then<T> = Box<dyn FnOnce(Result<T, StoreError>) + Send>;

/// A job built from a closure and its continuation.
struct FnJob<T, F> {
    work: Option<F>,
    output: Option<Result<T, StoreError>>,
    then: Then<T>,
    single_statement: bool,
    commit: Commit,
}

impl<T, F> Job for FnJob<T, F>
where
    T: Send,
    F: FnOnce(&Connection) -> Result<T, StoreError> + Send,
{
    fn single_statement(&self) -> bool {
        self.single_statement
    }

    fn commit(&self) -> Commit {
        self.commit
    }

    fn run(&mut self, conn: &Connection) -> Result<(), StoreError> {
        let work = self.work.take().ok_or(StoreError::WriterGone)?;
        let output = work(conn);
        let failed = output.as_ref().err().cloned();
        self.output = Some(output);
        failed.map_or(Ok(()), Err)
    }

    fn finish(self: Box<Self>, commit: Result<(), StoreError>) {
        let answer = match (commit, self.output) {
            (_, Some(Err(job_error))) => Err(job_error),
            (Err(commit_error), _) => Err(commit_error),
            (Ok(()), Some(Ok(value))) => Ok(value),
            (Ok(()), None) => Err(StoreError::WriterGone),
        };
        (self.then)(answer);
    }
}

/// Counters the writer keeps, shared with [`super::Store::stats`].
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub transactions: AtomicU64,
    pub jobs: AtomicU64,
}

/// The sending side of the writer thread.
#[derive(Debug)]
pub(super) struct WriterHandle {
    jobs: Option<mpsc::Sender<Box<dyn Job>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl WriterHandle {
    /// Move `conn` onto a new writer thread; with `durable`, each commit is
    /// synced to disk before its jobs hear of it.
    pub fn spawn(
        conn: Connection,
        counters: Arc<Counters>,
        durable: Option<Durable>,
    ) -> Result<Self, StoreError> {
        let (tx, rx) = mpsc::channel::<Box<dyn Job>>();
        let thread = std::thread::Builder::new()
            .name("npc-store-writer".into())
            .spawn(move || writer_loop(conn, &rx, &counters, durable))
            .map_err(|e| StoreError::WriterThread {
                source: Arc::new(e),
            })?;
        Ok(Self {
            jobs: Some(tx),
            thread: Some(thread),
        })
    }

    /// Queue `work`; the returned [`Pending`] resolves after the commit.
    pub fn submit<T, F>(&self, work: F) -> Pending<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let (reply, rx) = oneshot::channel();
        self.submit_then(false, Commit::Now, work, move |answer| {
            // The caller may have stopped waiting; not the writer's problem.
            let _ = reply.send(answer);
        });
        Pending::waiting(rx)
    }

    /// Queue `work`; `then` runs on the writer thread with the outcome once
    /// the transaction holding it committed (or failed), in submission
    /// order. If the writer is gone, `then` runs at once on this thread.
    pub fn submit_then<T, F, C>(&self, single_statement: bool, commit: Commit, work: F, then: C)
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
        C: FnOnce(Result<T, StoreError>) + Send + 'static,
    {
        let job: Box<dyn Job> = Box::new(FnJob {
            work: Some(work),
            output: None,
            then: Box::new(then),
            single_statement,
            commit,
        });
        let unsent = match &self.jobs {
            Some(jobs) => jobs.send(job).err().map(|e| e.0),
            None => Some(job),
        };
        if let Some(job) = unsent {
            job.finish(Err(StoreError::WriterGone));
        } else if commit == Commit::Now {
            // End a linger at once (a blocked `recv` was woken by the send).
            self.unpark();
        }
    }

    fn unpark(&self) {
        if let Some(thread) = &self.thread {
            thread.thread().unpark();
        }
    }
}

impl Drop for WriterHandle {
    fn drop(&mut self) {
        // Closing the channel lets the thread finish queued work and exit;
        // joining makes "the store is dropped" mean "the database is closed".
        self.jobs.take();
        self.unpark();
        if let Some(thread) = self.thread.take()
            && thread.thread().id() != std::thread::current().id()
        {
            let _ = thread.join();
        }
    }
}

/// What a brief opener ([`super::Store::open_brief`]) syncs after each
/// commit: the WAL (`fdatasync`), and its directory once when the WAL is new.
#[derive(Debug)]
pub(super) struct Durable {
    pub wal: std::path::PathBuf,
    pub sync_dir: bool,
    /// The connection's row changes at the last sync: a batch that wrote
    /// nothing (a flush) needs none.
    pub synced_changes: u64,
}

impl Durable {
    /// Sync what the last commit wrote; a failure is logged (the commit
    /// stands, as it would after a later checkpoint).
    fn sync(&mut self) {
        use std::os::unix::fs::OpenOptionsExt as _;
        // Never a link or a FIFO planted in its place (`O_NOFOLLOW`, `O_NONBLOCK`).
        let synced = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
            .open(&self.wal)
            .and_then(|f| f.sync_data());
        let synced = synced.and_then(|()| {
            if !self.sync_dir {
                return Ok(());
            }
            let dir = self.wal.parent().unwrap_or(std::path::Path::new("."));
            std::fs::File::open(dir).and_then(|d| d.sync_all())?;
            self.sync_dir = false;
            Ok(())
        });
        if let Err(e) = synced {
            tracing::warn!(error = %e, wal = %self.wal.display(), "store: syncing the WAL after a commit failed");
        }
    }

    /// Past [`super::WAL_CHECKPOINT_BYTES`], fold the WAL into the database
    /// and truncate it. Busy (a reader, such as a daemon's, still in the
    /// WAL) leaves it for later: that reader's connection keeps the WAL's
    /// index, so SQLite's own checkpoints restart it.
    fn fold_in_when_large(&self, conn: &Connection) {
        let large = std::fs::symlink_metadata(&self.wal)
            .is_ok_and(|m| m.len() > super::WAL_CHECKPOINT_BYTES);
        if large
            && let Err(e) = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |row| {
                row.get::<_, i64>(0)
            })
        {
            tracing::warn!(error = %e, "store: folding the WAL in failed");
        }
    }
}

fn writer_loop(
    mut conn: Connection,
    jobs: &mpsc::Receiver<Box<dyn Job>>,
    counters: &Counters,
    mut durable: Option<Durable>,
) {
    while let Ok(first) = jobs.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_JOBS_PER_TRANSACTION {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        linger(jobs, &mut batch);
        let outcome = run_batch(&mut conn, &mut batch);
        if outcome.is_ok()
            && let Some(durable) = &mut durable
            && conn.total_changes() != durable.synced_changes
        {
            durable.synced_changes = conn.total_changes();
            durable.sync();
        }
        if outcome.is_ok() {
            counters.transactions.fetch_add(1, Ordering::Relaxed);
            counters
                .jobs
                .fetch_add(batch.len() as u64, Ordering::Relaxed);
        }
        for job in batch {
            // A continuation that panics must not take the writer down with it.
            let finished = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                job.finish(outcome.clone())
            }));
            if finished.is_err() {
                tracing::error!("store.writer_continuation_panicked");
            }
        }
        // After the answers: a brief opener's caller does not wait on it
        // (its process ends with the store, which waits for this thread).
        if outcome.is_ok()
            && let Some(durable) = &durable
        {
            durable.fold_in_when_large(&conn);
        }
    }
}

/// While every job of `batch` may linger, wait (up to [`LINGER`] in all)
/// for more; stop at a job someone awaits, a full batch, or a closed
/// channel. The thread parks meanwhile (a job someone awaits, and the
/// handle's drop, unpark it), so lingering jobs queue without waking it.
fn linger(jobs: &mpsc::Receiver<Box<dyn Job>>, batch: &mut Vec<Box<dyn Job>>) {
    if batch.iter().any(|j| j.commit() == Commit::Now) {
        return;
    }
    let deadline = std::time::Instant::now() + LINGER;
    while batch.len() < MAX_JOBS_PER_TRANSACTION {
        match jobs.try_recv() {
            Ok(job) => {
                let now = job.commit() == Commit::Now;
                batch.push(job);
                if now {
                    return;
                }
            }
            Err(mpsc::TryRecvError::Disconnected) => return,
            Err(mpsc::TryRecvError::Empty) => {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    return;
                }
                std::thread::park_timeout(left);
            }
        }
    }
}

fn run_batch(conn: &mut Connection, batch: &mut [Box<dyn Job>]) -> Result<(), StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(sqlite("begin a write transaction"))?;
    // rusqlite's `Savepoint` parses its SQL each time; these are cached.
    let step = |sql: &str| {
        tx.prepare_cached(sql)
            .and_then(|mut s| s.execute([]))
            .map(drop)
    };
    for job in batch.iter_mut() {
        let outcome = if job.single_statement() {
            job.run(&tx)
        } else {
            step("SAVEPOINT job").map_err(sqlite("open a savepoint"))?;
            let outcome = job.run(&tx);
            if outcome.is_ok() {
                step("RELEASE job").map_err(sqlite("release a savepoint"))?;
            } else if !tx.is_autocommit() {
                // A failed job undoes only its own writes.
                step("ROLLBACK TO job")
                    .and_then(|()| step("RELEASE job"))
                    .map_err(sqlite("roll back a savepoint"))?;
            }
            outcome
        };
        if let Err(error) = outcome
            && tx.is_autocommit()
        {
            // Some errors (I/O, disk full) make SQLite roll back the whole
            // transaction; nothing after this point may run outside it.
            return Err(error);
        }
    }
    tx.commit().map_err(sqlite("commit a write transaction"))
}

/// The answer to a write: `.await` it from async code, or call
/// [`Pending::wait`] from a plain thread. It resolves only after the
/// transaction holding the write committed (or failed).
#[must_use = "a write is only known to be durable once its `Pending` resolves"]
#[derive(Debug)]
pub struct Pending<T> {
    state: PendingState<T>,
}

#[derive(Debug)]
enum PendingState<T> {
    Waiting(oneshot::Receiver<Result<T, StoreError>>),
    Failed(Option<StoreError>),
}

impl<T> Pending<T> {
    pub(super) fn waiting(rx: oneshot::Receiver<Result<T, StoreError>>) -> Self {
        Self {
            state: PendingState::Waiting(rx),
        }
    }

    pub(super) fn failed(error: StoreError) -> Self {
        Self {
            state: PendingState::Failed(Some(error)),
        }
    }

    /// Block the current thread until the write is committed. Do not call
    /// this from inside an async task (it panics there); `.await` instead.
    pub fn wait(self) -> Result<T, StoreError> {
        match self.state {
            PendingState::Waiting(rx) => rx.blocking_recv().unwrap_or(Err(StoreError::WriterGone)),
            PendingState::Failed(error) => Err(error.unwrap_or(StoreError::WriterGone)),
        }
    }
}

impl<T> Future for Pending<T> {
    type Output = Result<T, StoreError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.state {
            PendingState::Waiting(rx) => Pin::new(rx)
                .poll(cx)
                .map(|answer| answer.unwrap_or(Err(StoreError::WriterGone))),
            PendingState::Failed(error) => {
                Poll::Ready(Err(error.take().unwrap_or(StoreError::WriterGone)))
            }
        }
    }
}
