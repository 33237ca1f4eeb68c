//! A fleet worker (`npc worker`): claims runs from a store many machines
//! share ([`FleetQueue`], PostgreSQL in a fleet) and carries each out
//! exactly as the daemon does, through this process's own [`Runs`] (the
//! one executor: workspace, setup, agent or command, result, `after`). A
//! claimed run is adopted into the worker's local store as a queued row of
//! the same id; its events are relayed to the shared store under the
//! claim's lease and its end is written there with the lease's fencing
//! token. A lease is renewed every third of its length; when a renewal or
//! a relayed write is refused ([`StoreError::Fenced`]: the worker was cut
//! off or paused past its lease and the run was rescued), the run's agent
//! is stopped and nothing more of it is written; so is it, by the worker
//! itself, when no renewal succeeded for all but a sixth of the lease (cut
//! off from the store), before any other worker could take the run over.
//! Every worker also rescues runs whose lease ran out: each is queued again
//! while its trigger's `retries` allow (`run.interrupted`, then
//! `run.retry`, as the executor's own retries read), else it ends
//! `interrupted`; never is it run twice at once. A run that ends while the
//! store is down keeps its end and writes it when the store answers (with
//! backoff, at most [`PENDING_RETRY_MAX`] apart; the store takes it while
//! nobody took the run, even past the lease's time), and a worker rescues
//! only once the store has answered it for a whole lease (at least
//! [`RESCUE_GRACE_MIN`]), so the holder writes first and the run is
//! recorded once. Each loop's failures to
//! reach the store are warned of once, then at most every [`WARN_EVERY`]
//! with a count. A run a newer firing
//! replaced (overlap `replace`) is stopped by its worker as soon as the
//! store says so, and ends `cancelled` naming the run that replaced it.
//!
//! A claimed row is data other machines wrote: it is checked once into a
//! [`FleetRun`] before anything of it runs (its id, an origin a fleet
//! carries, its queue, key, attempts, payload and code: see [`row`]) and
//! fails otherwise, saying why in words that quote the row's text only
//! printable and cut; the worktree of one that names its commit comes from
//! the worker's mirror ([`super::mirror`]). A run this worker carried
//! before and claims again (after a rescue) is queued again in its own
//! store, and only the new attempt's events are relayed.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

use super::Runs;
use crate::event::Event;
use crate::store::fleet::{Claimed, FleetQueue, Handover, Lease, NextClaim, Roster, WorkerInfo};
use crate::store::queue::{Enqueued, state};
use crate::store::{NewEvent, Store, StoreError};

/// The shortest lease a worker takes.
pub const MIN_LEASE: Duration = Duration::from_secs(1);
/// How often a run's events and state are looked at while it runs.
pub const RELAY_EVERY: Duration = Duration::from_millis(50);
/// Events relayed in one write.
pub const MAX_RELAYED_EVENTS: usize = 500;
/// The first pause after the shared store failed; it doubles per failure.
pub const RETRY_INITIAL: Duration = Duration::from_millis(100);
/// The longest pause of a worker's claims and roster after the shared
/// store failed them.
pub const RETRY_MAX: Duration = Duration::from_secs(5);
/// The longest pause between a run's tries of its writes (its events, its
/// end) after the store failed them: well below [`RESCUE_GRACE_MIN`], so
/// a run's end kept through an outage is written before any worker, whatever
/// its lease, may rescue the run.
pub const PENDING_RETRY_MAX: Duration = Duration::from_secs(1);
/// The least time the store must have answered a worker, without a
/// failure, before it rescues runs (the grace is its lease, if longer):
/// see [`Worker::rescue_loop`].
pub const RESCUE_GRACE_MIN: Duration = Duration::from_secs(3);
/// How often at most one of a worker's loops (claims, rescues, the
/// roster, a run's writes) warns that the store keeps failing it, after
/// the first failure's warning.
pub const WARN_EVERY: Duration = Duration::from_secs(10);
/// What a fenced run's local end says.
pub const FENCED_DETAIL: &str = "its lease was lost (the worker was cut off or paused past it)";
/// A worker whose renewals fail stops a run when this fraction of its
/// lease (1/N) is left, so it has stopped before the store could let
/// another worker take the run over.
pub const SELF_FENCE_FRACTION: u32 = 6;

/// Where the host's name is read.
const HOSTNAME_FILE: &str = "/proc/sys/kernel/hostname";
/// The host's name when it cannot be read.
const UNKNOWN_HOST: &str = "localhost";
/// Longest host name kept (the kernel's limit is 64 bytes).
const MAX_HOST_CHARS: usize = 255;

/// This machine's name, as the fleet knows it (a worker on the roster, a
/// notice on the fleet's board, an ACP prompt's run).
pub fn host_name() -> String {
    crate::repofs::read_file_existing(std::path::Path::new(HOSTNAME_FILE), MAX_HOST_CHARS + 1)
        .ok()
        .flatten()
        .map(|h| h.trim().chars().take(MAX_HOST_CHARS).collect::<String>())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| UNKNOWN_HOST.to_string())
}

/// The fleet of the repository at `root`: `PROJECT@REMOTE`, the project's
/// name (else the directory's) and the `origin` remote's URL without its
/// credentials (else the repository's path). Every worker and daemon of
/// one repository names the same fleet.
pub async fn fleet_name(
    supervisor: &crate::supervisor::Supervisor,
    root: &std::path::Path,
    project: Option<&str>,
) -> String {
    let remote = super::remote::origin_of(supervisor, root)
        .await
        .map(|r| r.shown)
        .unwrap_or_else(|| root.display().to_string());
    let project = project.map(str::to_string).unwrap_or_else(|| {
        root.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    });
    format!("{project}@{remote}")
}

/// How a worker works.
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    /// Its name in the fleet (`host/pid:start-time`).
    pub id: String,
    /// The machine it runs on, as the roster shows it.
    pub host: String,
    pub lease: Duration,
    /// Runs carried out at once (`[runs] max_concurrent`).
    pub max_concurrent: usize,
    /// The fleet's remote: the checkout's `origin` without credentials
    /// (none without one). A run naming another is refused.
    pub remote: Option<String>,
}

/// One worker of a fleet.
#[derive(Debug)]
pub struct Worker {
    fleet: Arc<dyn FleetQueue>,
    /// Where it heartbeats for `npc workers`, when the store keeps a roster.
    roster: Option<Arc<dyn Roster>>,
    local: Arc<Store>,
    runs: Arc<Runs>,
    settings: WorkerSettings,
    /// One turn per run id: a run claimed again while an earlier claim of
    /// it is still being wound up here (stopped after its lease was lost)
    /// waits for that one's end, so the two never share the run's row.
    turns: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// The state names a run may end in, as the store's constants.
fn final_state(name: &str) -> Option<&'static str> {
    [
        state::SUCCEEDED,
        state::BLOCKED,
        state::FAILED,
        state::SKIPPED,
        state::CANCELLED,
        state::INTERRUPTED,
        state::TIMED_OUT,
    ]
    .into_iter()
    .find(|s| *s == name)
}

/// Why a run's relay stopped.
enum Relay {
    Ended,
    /// The run ended here but the store refused its end: it holds an end
    /// already, or the run was taken from this worker.
    EndRefused,
    Fenced,
}

/// `call`, failed as [`StoreError::PgUnreachable`] when it has not
/// answered within `deadline`.
async fn within<T>(
    deadline: Duration,
    call: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    tokio::time::timeout(deadline, call)
        .await
        .unwrap_or_else(|_| {
            Err(StoreError::PgUnreachable {
                op: "answer within the lease",
                message: format!("no answer within {deadline:?}"),
            })
        })
}

/// A loop's failures to reach the store, as the log hears them: the first
/// failure of a spell at once (a warning), then at most one warning per
/// [`WARN_EVERY`] counting the failures since, and one info line when the
/// store answers again; never a line per failure, however fast the loop
/// retries.
struct Complaints {
    /// What the lines are about (`run `ID``, `the claim loop`).
    about: String,
    /// Failures since the last warning.
    unsaid: u64,
    /// When the spell's last warning was said; `None` while the store
    /// answers.
    said_at: Option<tokio::time::Instant>,
}

impl Complaints {
    fn new(about: impl Into<String>) -> Self {
        Self {
            about: about.into(),
            unsaid: 0,
            said_at: None,
        }
    }

    /// The store failed `what` with `error` (retried after `retry`, when
    /// known).
    fn failed(&mut self, what: &str, error: &StoreError, retry: Option<Duration>) {
        let now = tokio::time::Instant::now();
        self.unsaid += 1;
        let retrying = retry
            .map(|r| format!("; retrying in {r:?}"))
            .unwrap_or_default();
        match self.said_at {
            None => tracing::warn!("{}: cannot {what}: {error}{retrying}", self.about),
            Some(at) if now.duration_since(at) >= WARN_EVERY => tracing::warn!(
                "{}: cannot {what} ({} failure(s) since the last warning): {error}{retrying}",
                self.about,
                self.unsaid
            ),
            Some(_) => return,
        }
        self.unsaid = 0;
        self.said_at = Some(now);
    }

    /// The store answered.
    fn answered(&mut self) {
        if self.said_at.take().is_some() {
            tracing::info!("{}: the store answers again", self.about);
        }
        self.unsaid = 0;
    }
}

/// The pause after the shared store failed a run's writes: it starts at
/// [`RETRY_INITIAL`] and doubles per failure up to its most (below the
/// lease); the failures are said as [`Complaints`].
struct Backoff {
    pause: Duration,
    /// The longest pause.
    most: Duration,
    until: Option<tokio::time::Instant>,
    complaints: Complaints,
}

impl Backoff {
    fn new(about: String, most: Duration) -> Self {
        Self {
            pause: RETRY_INITIAL.min(most),
            most,
            until: None,
            complaints: Complaints::new(about),
        }
    }

    /// Whether the store may be tried now.
    fn ready(&self) -> bool {
        self.until
            .is_none_or(|until| tokio::time::Instant::now() >= until)
    }

    /// Until the store may be tried again.
    async fn wait(&self) {
        if let Some(until) = self.until {
            tokio::time::sleep_until(until).await;
        }
    }

    fn failed(&mut self, what: &str, error: &StoreError) {
        self.until = Some(tokio::time::Instant::now() + self.pause);
        self.complaints.failed(what, error, Some(self.pause));
        self.pause = (self.pause * 2).min(self.most);
    }

    fn succeeded(&mut self) {
        self.until = None;
        self.complaints.answered();
        self.pause = RETRY_INITIAL.min(self.most);
    }
}

impl Worker {
    /// A worker claiming from `fleet`, carrying runs out through `runs`
    /// (whose store is `local`).
    pub fn new(
        fleet: Arc<dyn FleetQueue>,
        roster: Option<Arc<dyn Roster>>,
        local: Arc<Store>,
        runs: Arc<Runs>,
        mut settings: WorkerSettings,
    ) -> Arc<Self> {
        settings.lease = settings.lease.max(MIN_LEASE);
        settings.max_concurrent = settings.max_concurrent.max(1);
        Arc::new(Self {
            fleet,
            roster,
            local,
            runs,
            settings,
            turns: Default::default(),
        })
    }

    /// Wait for run `id`'s turn here (see [`Worker::turns`]); the turn ends
    /// when the guard is handed to [`Worker::end_turn`].
    async fn turn(&self, id: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let turn = crate::stdx::lock(&self.turns)
            .entry(id.to_string())
            .or_default()
            .clone();
        turn.lock_owned().await
    }

    /// End run `id`'s turn: forgotten once nobody waits for it.
    fn end_turn(&self, id: &str, guard: tokio::sync::OwnedMutexGuard<()>) {
        let mut turns = crate::stdx::lock(&self.turns);
        drop(guard);
        if turns.get(id).is_some_and(|t| Arc::strong_count(t) == 1) {
            turns.remove(id);
        }
    }

    /// Claim and carry out runs until `stop`; then cancel the running ones
    /// (their ends are recorded) and return.
    pub async fn serve(self: &Arc<Self>, stop: CancellationToken) {
        let slots = Arc::new(tokio::sync::Semaphore::new(self.settings.max_concurrent));
        let rescuer = tokio::spawn(self.clone().rescue_loop(stop.clone()));
        let heartbeat = tokio::spawn(self.clone().roster_loop(stop.clone()));
        let mut backoff = RETRY_INITIAL;
        let mut complaints = Complaints::new("the claim loop");
        loop {
            let permit = tokio::select! {
                () = stop.cancelled() => break,
                permit = slots.clone().acquire_owned() => match permit {
                    Ok(p) => p,
                    Err(_) => break,
                },
            };
            // The lease the store grants starts no sooner than the ask.
            let asked = tokio::time::Instant::now();
            match self
                .fleet
                .claim(&self.settings.id, self.settings.lease)
                .await
            {
                Ok(Some(claimed)) => {
                    backoff = RETRY_INITIAL;
                    complaints.answered();
                    let (this, stop) = (self.clone(), stop.clone());
                    // The slot carries runs back to back while each end
                    // brings the next (claimed with it), then frees.
                    tokio::spawn(async move {
                        let mut next = Some((claimed, asked));
                        while let Some((claimed, asked)) = next {
                            if stop.is_cancelled() {
                                // Claimed while the stop came: not started.
                                this.hand_back(&claimed).await;
                                break;
                            }
                            next = this.carry(claimed, asked, &stop).await;
                        }
                        drop(permit);
                    });
                }
                Ok(None) => {
                    backoff = RETRY_INITIAL;
                    complaints.answered();
                    drop(permit);
                    tokio::select! {
                        () = stop.cancelled() => break,
                        _ = self.fleet.wait_for_work(crate::store::fleet::WORK_POLL) => {}
                    }
                }
                Err(e) => {
                    drop(permit);
                    complaints.failed("claim a run", &e, Some(backoff));
                    tokio::select! {
                        () = stop.cancelled() => break,
                        () = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(RETRY_MAX);
                }
            }
        }
        rescuer.abort();
        self.runs.shutdown().await;
        // The cancelled runs' ends are relayed while their leases hold.
        let all = self.settings.max_concurrent as u32;
        drop(tokio::time::timeout(super::executor::STOP_WAIT, slots.acquire_many(all)).await);
        heartbeat.abort();
        if let Some(roster) = &self.roster
            && let Err(e) = roster.leave(&self.settings.id).await
        {
            tracing::warn!("cannot mark this worker stopped on the roster: {e}");
        }
    }

    /// Hand a run this worker claimed but will not start back to the queue,
    /// for another worker; one that cannot be handed back is rescued when
    /// its lease runs out.
    async fn hand_back(&self, claimed: &Claimed) {
        let id = &claimed.run.id;
        match self.fleet.release(&claimed.lease).await {
            Ok(()) => tracing::info!("run `{id}` handed back to the queue: this worker stops"),
            Err(e) => tracing::warn!(
                "cannot hand run `{id}` back: {e}; it is rescued once its lease runs out"
            ),
        }
    }

    /// Join the roster (retrying with backoff), then heartbeat there every
    /// third of a lease until `stop`.
    async fn roster_loop(self: Arc<Self>, stop: CancellationToken) {
        let Some(roster) = self.roster.clone() else {
            return;
        };
        let info = WorkerInfo {
            id: self.settings.id.clone(),
            host: self.settings.host.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            lease_ms: i64::try_from(self.settings.lease.as_millis()).unwrap_or(i64::MAX),
        };
        let mut backoff = RETRY_INITIAL;
        let mut complaints = Complaints::new("the roster");
        while let Err(e) = roster.enlist(&info).await {
            complaints.failed("join the roster", &e, Some(backoff));
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(RETRY_MAX);
        }
        complaints.answered();
        let mut every = tokio::time::interval(self.settings.lease / 3);
        every.tick().await;
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = every.tick() => {}
            }
            match roster.beat(&info.id).await {
                Ok(()) => complaints.answered(),
                Err(e) => complaints.failed("heartbeat on the roster", &e, None),
            }
        }
    }

    /// Every half lease, rescue the fleet's runs whose lease ran out (the
    /// store records their events with them), but only once the store has
    /// answered this worker for a whole lease (at least
    /// [`RESCUE_GRACE_MIN`]) with no failure between (since the worker
    /// started, or since the store last failed it): a lease that ran out
    /// while this worker could not see the store may be one whose holder
    /// could not either, and that holder tries its run's end again at most
    /// [`PENDING_RETRY_MAX`] apart, so its run is not taken from it for an
    /// outage. A gap of
    /// more than a lease between two answers (the worker was paused) counts
    /// as a failure. Until then the loop only asks whether the store
    /// answers ([`FleetQueue::answers`]).
    async fn rescue_loop(self: Arc<Self>, stop: CancellationToken) {
        let lease = self.settings.lease;
        let grace = lease.max(RESCUE_GRACE_MIN);
        let mut every = tokio::time::interval(lease / 2);
        let mut complaints = Complaints::new("the rescue loop");
        // Since when the store has answered without a failure, and when
        // it last answered.
        let mut answering: Option<tokio::time::Instant> = None;
        let mut answered_at: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = every.tick() => {}
            }
            // No answer for over a lease (this worker was paused, or a call
            // hung): the store went unseen meanwhile.
            if answered_at.is_none_or(|at| at.elapsed() > lease) {
                answering = None;
            }
            let answer = if answering.is_some_and(|since| since.elapsed() >= grace) {
                self.fleet.rescue_expired().await.map(|rescued| {
                    for r in &rescued {
                        tracing::info!("rescued run `{}`: {:?}", r.run_id, r.rescue);
                    }
                })
            } else {
                self.fleet.answers().await
            };
            match answer {
                Ok(()) => {
                    let now = tokio::time::Instant::now();
                    complaints.answered();
                    answering.get_or_insert(now);
                    answered_at = Some(now);
                }
                Err(e) => {
                    answering = None;
                    complaints.failed("rescue expired leases", &e, None);
                }
            }
        }
    }

    /// Carry out one claimed run (claimed as asked at `asked`): adopt it,
    /// relay its events and its attempts, renew its lease, stop it when it
    /// was replaced, write its end under the lease. Unless the worker is
    /// stopping, the end asks for the slot's next run
    /// ([`FleetQueue::finish_and_claim`]); that run is returned, with when
    /// it was asked for, to be carried next.
    async fn carry(
        &self,
        claimed: Claimed,
        asked: tokio::time::Instant,
        stop: &CancellationToken,
    ) -> Option<(Claimed, tokio::time::Instant)> {
        let id = claimed.lease.run_id.clone();
        let turn = self.turn(&id).await;
        let next = self.carry_in_turn(claimed, asked, stop).await;
        self.end_turn(&id, turn);
        next
    }

    /// [`Worker::carry`], in the run's turn.
    async fn carry_in_turn(
        &self,
        claimed: Claimed,
        asked: tokio::time::Instant,
        stop: &CancellationToken,
    ) -> Option<(Claimed, tokio::time::Instant)> {
        let Claimed { run, mut lease } = claimed;
        let id = run.id.clone();
        let checked = FleetRun::check(
            run,
            self.settings.remote.as_deref(),
            &self.runs.trigger_names(),
        );
        let run = match checked {
            Ok(run) => run,
            Err(refused) => {
                self.refuse(&lease, &refused.to_string()).await;
                return None;
            }
        };
        let leased = self.settings.lease;
        let renew_every = leased / 3;
        let margin = leased / SELF_FENCE_FRACTION;
        let mut renewed = asked;
        if renewed.elapsed() + margin >= leased {
            // The claim came back too late to count on its lease (this
            // worker was paused, or waited for the run's earlier claim to
            // wind up here): renewed before anything of it runs, so the
            // self-fence counts from an answer the store gave.
            let at = tokio::time::Instant::now();
            match within(renew_every, self.fleet.heartbeat(&lease, leased)).await {
                Ok(held) => {
                    lease = held;
                    renewed = at;
                }
                Err(e) => {
                    tracing::warn!(
                        "run `{id}`: claimed too late to start ({e}); \
                         it is rescued once its lease runs out"
                    );
                    return None;
                }
            }
        }
        let mut stops = Some(self.fleet.stop_requests());
        // Events this store holds of an earlier attempt are not relayed again.
        let mut after = {
            let local = self.local.clone();
            tokio::task::spawn_blocking(move || local.last_event_id())
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or(0)
        };
        match self.runs.adopt(&run).await {
            Ok(Enqueued::Duplicate) => {
                // An earlier attempt has not ended here yet: another worker
                // (or this one, later) carries it.
                self.hand_back(&Claimed {
                    run: run.row().clone(),
                    lease,
                })
                .await;
                return None;
            }
            Ok(_) => {}
            Err(e) => {
                let detail = format!("the worker cannot take the run in: {e}");
                let _ = self
                    .fleet
                    .finish(&lease, state::FAILED, Some(detail), None)
                    .await;
                return None;
            }
        }
        let run = run.row();
        let component = super::component(&id);
        let mut attempt = run.attempt;
        let mut stopping = false;
        let mut tick = tokio::time::interval(RELAY_EVERY);
        // After a failure the store is left alone until then (backoff),
        // never longer than a renewal's span nor `PENDING_RETRY_MAX`: a
        // rescuer waits longer after an outage, so an end kept through it
        // is written first.
        let most = renew_every.min(PENDING_RETRY_MAX);
        let mut store_back = Backoff::new(format!("run `{id}`"), most);
        // The slot's next run, once an end brought one.
        let mut next = None;
        let relay = loop {
            // A stop request for this run (or one maybe missed) renews at once.
            let asked_to_stop = tokio::select! {
                _ = tick.tick() => false,
                heard = stop_request(&mut stops) => heard.is_none_or(|stopped| stopped == id),
            };
            // Every store call while the run runs ends before the lease
            // could lapse: a stalled connection never keeps it running.
            let fence_at = renewed + leased - margin;
            // The row first: events recorded before its end are all read below.
            let row = {
                let local = self.local.clone();
                let key = id.clone();
                tokio::task::spawn_blocking(move || local.run_row(&key))
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .flatten()
            };
            let end = row.as_ref().and_then(|r| final_state(&r.state));
            // While it runs, up to the self-fence; once ended, a renewal's span.
            let deadline = || match end {
                Some(_) => renew_every,
                None => fence_at.saturating_duration_since(tokio::time::Instant::now()),
            };
            let now_at = row.as_ref().map(|r| r.attempt).filter(|a| *a > attempt);
            if let Some(now_at) = now_at.filter(|_| store_back.ready()) {
                match within(deadline(), self.fleet.set_attempt(&lease, now_at)).await {
                    Ok(()) => attempt = now_at,
                    Err(StoreError::Fenced { .. }) => break Relay::Fenced,
                    Err(e) => store_back.failed("record the attempt", &e),
                }
            }
            if store_back.ready() {
                match within(
                    deadline(),
                    self.relay_events(&lease, &component, &mut after),
                )
                .await
                {
                    // Nothing to relay asked nothing of the store.
                    Ok(0) => {}
                    Ok(_) => store_back.succeeded(),
                    Err(StoreError::Fenced { .. }) => break Relay::Fenced,
                    Err(e) => store_back.failed("relay the events", &e),
                }
            }
            // A call parked on an `ask` waits in this worker's store: the
            // fleet sees it, and an answer given on any node reaches it.
            if end.is_none() && store_back.ready() {
                match within(deadline(), self.relay_approvals(&id)).await {
                    Ok(()) => {}
                    Err(StoreError::Fenced { .. }) => break Relay::Fenced,
                    Err(e) => store_back.failed("relay the approvals", &e),
                }
            }
            if let Some(end) = end {
                // The run is over here: nothing of it runs any more, so its
                // end is kept and retried with backoff until the store
                // takes or refuses it.
                if !store_back.ready() {
                    store_back.wait().await;
                    continue;
                }
                let (detail, result) = row.map_or((None, None), |r| (r.detail, r.result));
                let ended = if next.is_some() || stop.is_cancelled() {
                    within(renew_every, self.fleet.finish(&lease, end, detail, result)).await
                } else {
                    let at = tokio::time::Instant::now();
                    let worker = &self.settings.id;
                    let asking = NextClaim {
                        worker,
                        lease: self.settings.lease,
                    };
                    // Bounded like every store call here: a stalled
                    // connection is an unanswered end, retried; a next run
                    // claimed but never heard of is rescued when its lease lapses.
                    let call = self
                        .fleet
                        .finish_and_claim(&lease, end, detail, result, asking);
                    let handover = tokio::time::timeout(renew_every, call)
                        .await
                        .unwrap_or_else(|_| {
                            let unanswered = || StoreError::PgUnreachable {
                                op: "answer within the lease",
                                message: format!("no answer within {renew_every:?}"),
                            };
                            Handover {
                                ended: Err(unanswered()),
                                next: Err(unanswered()),
                            }
                        });
                    match handover.next {
                        Ok(claimed) => next = claimed.map(|c| (c, at)),
                        Err(e) => store_back.complaints.failed("claim the next run", &e, None),
                    }
                    handover.ended
                };
                match ended {
                    Ok(()) => {
                        store_back.succeeded();
                        break Relay::Ended;
                    }
                    Err(StoreError::Fenced { .. }) => break Relay::EndRefused,
                    Err(e) => {
                        store_back.failed("record the end", &e);
                        continue;
                    }
                }
            }
            if asked_to_stop || renewed.elapsed() >= renew_every {
                let at = tokio::time::Instant::now();
                let deadline = fence_at.saturating_duration_since(at);
                match within(deadline, self.fleet.heartbeat(&lease, leased)).await {
                    Ok(held) => {
                        lease = held;
                        renewed = at;
                        store_back.complaints.answered();
                    }
                    Err(StoreError::Fenced { .. }) => break Relay::Fenced,
                    // Tried again at the next tick, until the self-fence.
                    Err(e) => store_back.complaints.failed("renew the lease", &e, None),
                }
            }
            if renewed.elapsed() + margin >= leased {
                // Cut off from the store: stop before another may take it.
                break Relay::Fenced;
            }
            if let Some(by) = lease.replaced_by.clone().filter(|_| !stopping) {
                stopping = true;
                tracing::info!("run `{id}` was replaced by run `{by}`; stopping it");
                let (runs, id) = (self.runs.clone(), id.clone());
                // Its end is relayed by this loop, which goes on renewing.
                tokio::spawn(async move {
                    if let Err(e) = runs.replaced(&id, &by).await {
                        tracing::debug!("run `{id}` was not running here: {e}");
                    }
                });
            }
        };
        match relay {
            Relay::Ended => {}
            Relay::EndRefused => tracing::warn!(
                "run `{id}`: its end was not written: the store has it ended already or \
                 took the run from this worker (rescued after its lease lapsed)"
            ),
            Relay::Fenced => {
                tracing::warn!("run `{id}`: {FENCED_DETAIL}; stopping it");
                if let Err(e) = self.runs.cancel(&id).await {
                    tracing::debug!("run `{id}` was not running here: {e}");
                }
                let _ = self
                    .local
                    .mark_run(&id, state::CANCELLED, Some(FENCED_DETAIL.to_string()))
                    .await;
            }
        }
        next
    }

    /// Fail the run `lease` holds before anything of it ran, for `error`
    /// (a refused row: its words quote the row's text printable and cut),
    /// with the `run.finished` the fleet's readers look for.
    async fn refuse(&self, lease: &Lease, error: &str) {
        let id = &lease.run_id;
        tracing::warn!("run `{}`: {error}", super::mirror::shown(id));
        let finished = Event::run_failed(id, None, error).for_component(super::component(id));
        if let Err(e) = self.fleet.append_fenced(lease, vec![finished]).await {
            tracing::warn!("cannot record the refusal of a run: {e}");
        }
        let _ = self
            .fleet
            .finish(lease, state::FAILED, Some(error.to_string()), None)
            .await;
    }

    /// Share run `id`'s pending approvals with the fleet and settle those
    /// answered there (each answer recorded as this run's `run.approval`).
    /// The shared store is asked only while one is pending.
    async fn relay_approvals(&self, id: &str) -> Result<(), StoreError> {
        use crate::store::approvals::{MAX_PENDING_PER_RUN, state as approval};
        let local = self.local.clone();
        let key = id.to_string();
        let pending: Vec<_> =
            tokio::task::spawn_blocking(move || local.run_approvals(&key, MAX_PENDING_PER_RUN * 4))
                .await
                .map_err(|e| StoreError::Task(e.to_string()))??
                .into_iter()
                .filter(|a| a.state == approval::PENDING)
                .collect();
        if pending.is_empty() {
            return Ok(());
        }
        self.fleet.share_approvals(&pending).await?;
        for answer in self.fleet.shared_answers(id).await? {
            if !pending.iter().any(|p| p.id == answer.id) {
                continue;
            }
            if let Some(row) = self
                .local
                .settle_approval(answer.id, answer.settled)
                .await?
            {
                self.runs.record_answer(&row).await;
            }
        }
        Ok(())
    }

    /// Relay the run's events recorded since `after` under `lease`; how
    /// many (none: the store was not asked).
    async fn relay_events(
        &self,
        lease: &Lease,
        component: &str,
        after: &mut i64,
    ) -> Result<usize, StoreError> {
        let mut relayed_all = 0;
        loop {
            let local = self.local.clone();
            let (key, from) = (component.to_string(), *after);
            let events = tokio::task::spawn_blocking(move || {
                local.component_events(&key, from, MAX_RELAYED_EVENTS)
            })
            .await
            .map_err(|e| StoreError::Task(e.to_string()))??;
            let Some(last) = events.last().map(|e| e.id) else {
                return Ok(relayed_all);
            };
            let full = events.len() == MAX_RELAYED_EVENTS;
            relayed_all += events.len();
            let relayed = events
                .into_iter()
                .map(|e| NewEvent::relayed(e.kind, e.component, e.payload))
                .collect();
            self.fleet.append_fenced(lease, relayed).await?;
            *after = last;
            if !full {
                return Ok(relayed_all);
            }
        }
    }
}

/// The next stop request `stops` hears: `Some(id)`, or `None` when some
/// may have been missed (the subscriber fell behind); never resolves once
/// the store is gone.
async fn stop_request(
    stops: &mut Option<tokio::sync::broadcast::Receiver<String>>,
) -> Option<String> {
    let Some(heard) = stops.as_mut() else {
        return std::future::pending().await;
    };
    match heard.recv().await {
        Ok(id) => Some(id),
        Err(RecvError::Lagged(_)) => None,
        Err(RecvError::Closed) => {
            *stops = None;
            std::future::pending().await
        }
    }
}

mod row;
pub use row::{FleetRun, MAX_ATTEMPTS, RowRefused};

#[cfg(test)]
mod tests;
