//! The fleet's claim path on PostgreSQL against a raw SQL `SKIP LOCKED`
//! claim loop, in the same run, on one throwaway cluster (the tests'
//! `pg::PgCluster`), with 1, 4 and 16 workers:
//!
//! - claims per second: N queued runs drained by W workers, each a
//!   `PgStore` of its own (its own pool and `LISTEN` connection, as
//!   separate `npc worker` processes have) ending each run as `npc worker`
//!   does, asking for the next with the end (`finish_and_claim`: both
//!   statements in one round trip), against W raw connections running a
//!   plain `SKIP LOCKED` claim and an end, one after the other, without
//!   npc's code. npc ending, then claiming (`finish`, then `claim`) is
//!   measured too. Each side drains in a database of its own with rows of
//!   the same shape (a concurrency key per run), so every table holds as
//!   much history as the others, and each table is `VACUUM ANALYZE`d
//!   between rounds, as autovacuum keeps a fleet's table (a raw loop whose
//!   statements were planned on a young table otherwise reads every row of
//!   its fleet per claim). The ratio is the median over rounds of each
//!   round's claims/s (the sides of a round drain back to back), with the
//!   lowest and highest;
//! - enqueue → start: runs enqueued one at a time (`PgStore::enqueue`, its
//!   `NOTIFY` committed with the row) while W workers wait for work as
//!   `npc worker` does (`wait_for_work`, then claim); the latency is from
//!   the enqueue's commit to the claim's answer. The raw baseline polls
//!   without pause (its lower bound: no wake-up at all).
//!
//! - ingress: signed webhook deliveries posted one at a time to a real
//!   `npc daemon` (`target/release/npc`, or `NPC`) whose manifest has `[store] url`,
//!   each answered 202 only after its row committed in PostgreSQL, against
//!   the same daemon and manifest without `[store]` (the embedded SQLite
//!   queue) as the baseline: the answer's p50 / p99 and their ratio.
//!
//! `cargo bench --bench fleet`; `FLEET_BENCH_RUNS` overrides N (10,000),
//! `FLEET_BENCH_ROUNDS` the alternating rounds of each side's drain (5),
//! `FLEET_BENCH_LATENCY_RUNS` the latency sample (300),
//! `FLEET_BENCH_WORKERS` the worker counts (`1,4,16`);
//! `FLEET_BENCH_NO_INGRESS` skips the ingress part. Needs Debian's
//! `postgresql` (or `NPC_TEST_PG_BIN`); skips without it.

#[path = "../tests/integration/pg.rs"]
#[allow(dead_code)]
mod pg;
// pg.rs decides through `support::require` what a missing PostgreSQL means.
#[path = "../tests/integration/support.rs"]
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use npcagent::store::fleet::{Claimed, FleetQueue, NextClaim};
use npcagent::store::pg::PgStore;
use npcagent::store::queue::{NewRun, state};

/// Worker counts measured.
const WORKER_COUNTS: [usize; 3] = [1, 4, 16];
/// The lease every claim takes (never runs out during the bench).
const LEASE: Duration = Duration::from_secs(600);
/// The pause between two enqueues of the latency sample.
const ENQUEUE_PACE: Duration = Duration::from_millis(5);
/// Runs per worker and side of the round that is not measured.
const WARM_UP_RUNS_PER_WORKER: usize = 20;
/// How long a waiting worker waits before it looks again.
const WAIT_AT_MOST: Duration = Duration::from_millis(500);
const FLEET: &str = "bench@fleet";
const RAW_FLEET: &str = "raw@fleet";

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Run `id`, of a concurrency key of its own: a trigger's runs of one key
/// run one at a time, so a key per run lets every worker claim at once.
fn new_run(id: String) -> NewRun {
    NewRun {
        concurrency_key: Some(id.clone()),
        ..NewRun::new(id, "t", npcagent::model::RunOrigin::Api, "{}")
    }
}

/// The raw claim: the oldest queued row, `SKIP LOCKED`, over the same table
/// and index as npc's claim (`seq + 0` is `npc_runs_claim_order`'s order
/// and `seq > 0` its predicate, as npc's claim names them, so neither walks
/// the history by the primary key).
const RAW_CLAIM: &str = "WITH next AS (
        SELECT seq FROM npc_runs WHERE fleet = $1 AND state = 'queued' AND seq > 0
        ORDER BY seq + 0 LIMIT 1 FOR UPDATE SKIP LOCKED)
    UPDATE npc_runs r SET state = 'running', owner = $2, lease_token = r.lease_token + 1,
        started_at_ms = npc_now_ms(), lease_expires_at_ms = npc_now_ms() + 600000
    FROM next WHERE r.seq = next.seq RETURNING r.id, r.lease_token";
/// The raw end: the run by its fleet and id under its token, its lease
/// cleared (the table's check: only a running run holds a lease).
const RAW_FINISH: &str = "UPDATE npc_runs SET state = 'succeeded', finished_at_ms = npc_now_ms(),
        lease_expires_at_ms = NULL
    WHERE fleet = $1 AND id = $2 AND lease_token = $3 AND state = 'running'";

async fn raw_client(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    client
}

/// `n` queued rows for the raw loop, each of a concurrency key of its own as
/// npc's runs are ([`new_run`]), so both sides' tables and indexes hold
/// rows of the same shape.
async fn raw_fill(url: &str, round: usize, n: usize) {
    let client = raw_client(url).await;
    client
        .execute(
            "INSERT INTO npc_runs (fleet, id, trigger, origin, payload, state, enqueued_at_ms,
                 concurrency_key)
             SELECT $1, id, 't', 'api', '{}', 'queued', npc_now_ms(), id
             FROM (SELECT 'raw-' || $2 || '-' || g AS id FROM generate_series(1, $3::bigint) g) ids",
            &[&RAW_FLEET, &round.to_string(), &(n as i64)],
        )
        .await
        .unwrap();
}

/// One round of one side: `n` runs drained by the side's workers in its
/// own database.
struct Drain<'a> {
    url: &'a str,
    postmaster: u32,
    round: usize,
    n: usize,
}

/// The wall time and CPU of running the tasks `spawn` starts to their end.
async fn timed(postmaster: u32, spawn: impl FnOnce() -> Vec<tokio::task::JoinHandle<()>>) -> Side {
    let cpu = Cpu::now(postmaster);
    let started = Instant::now();
    for task in spawn() {
        task.await.unwrap();
    }
    let wall = started.elapsed();
    Side {
        wall,
        cpu: Cpu::now(postmaster).since(cpu),
    }
}

/// How npc's workers of a drain ask for their next run.
#[derive(Clone, Copy)]
enum Asking {
    /// With each run's end, in one round trip, as `npc worker` does
    /// (`FleetQueue::finish_and_claim`).
    WithTheEnd,
    /// After each run's end (`finish`, then `claim`).
    AfterTheEnd,
}

/// End `claimed` as `npc worker` does, asking for `me`'s next run with the
/// end; that run, if any.
async fn end_bringing_next(store: &PgStore, claimed: &Claimed, me: &str) -> Option<Claimed> {
    let asked = NextClaim {
        worker: me,
        lease: LEASE,
    };
    let handover = store
        .finish_and_claim(&claimed.lease, state::SUCCEEDED, None, None, asked)
        .await;
    handover.ended.unwrap();
    handover.next.unwrap()
}

/// npc's claim and end: the time and CPU the drain took.
async fn npc_drain(drain: &Drain<'_>, stores: &[Arc<PgStore>], asking: Asking) -> Side {
    let filler = PgStore::connect(drain.url, FLEET).await.unwrap();
    for i in 0..drain.n {
        filler
            .enqueue(new_run(format!("t-{}-{i}-{}", drain.round, asking as u8)))
            .await
            .unwrap();
    }
    timed(drain.postmaster, || {
        stores
            .iter()
            .cloned()
            .enumerate()
            .map(|(w, store)| {
                tokio::spawn(async move {
                    let me = format!("w{w}");
                    let mut next = store.claim(&me, LEASE).await.unwrap();
                    while let Some(c) = next {
                        next = match asking {
                            Asking::WithTheEnd => end_bringing_next(&store, &c, &me).await,
                            Asking::AfterTheEnd => {
                                store
                                    .finish(&c.lease, state::SUCCEEDED, None, None)
                                    .await
                                    .unwrap();
                                store.claim(&me, LEASE).await.unwrap()
                            }
                        };
                    }
                })
            })
            .collect()
    })
    .await
}

/// A worker of the raw loop: its connection and its two statements.
struct RawWorker {
    client: tokio_postgres::Client,
    claim: tokio_postgres::Statement,
    finish: tokio_postgres::Statement,
}

impl RawWorker {
    async fn connect(url: &str) -> Arc<RawWorker> {
        let client = raw_client(url).await;
        let claim = client.prepare(RAW_CLAIM).await.unwrap();
        let finish = client.prepare(RAW_FINISH).await.unwrap();
        Arc::new(RawWorker {
            client,
            claim,
            finish,
        })
    }
}

/// The raw loop's claim and end.
async fn raw_drain(drain: &Drain<'_>, workers: &[Arc<RawWorker>]) -> Side {
    raw_fill(drain.url, drain.round, drain.n).await;
    timed(drain.postmaster, || {
        workers
            .iter()
            .cloned()
            .enumerate()
            .map(|(w, worker)| {
                tokio::spawn(async move {
                    let me = format!("raw{w}");
                    let RawWorker {
                        client,
                        claim,
                        finish,
                    } = &*worker;
                    while let Some(row) = client.query_opt(claim, &[&RAW_FLEET, &me]).await.unwrap()
                    {
                        let (id, token): (String, i64) = (row.get(0), row.get(1));
                        client
                            .execute(finish, &[&RAW_FLEET, &id, &token])
                            .await
                            .unwrap();
                    }
                })
            })
            .collect()
    })
    .await
}

/// The kernel's unit of a process's times in `/proc/PID/stat`.
const USER_HZ: u64 = 100;

/// CPU time spent so far by this process (the claimers) and by the server
/// (the postmaster, its live backends and the ones it reaped).
#[derive(Clone, Copy, Default)]
struct Cpu {
    client: Duration,
    server: Duration,
}

impl Cpu {
    fn now(postmaster: u32) -> Cpu {
        let usage =
            nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF).unwrap();
        let time = |t: nix::sys::time::TimeVal| {
            Duration::from_micros(t.tv_sec() as u64 * 1_000_000 + t.tv_usec() as u64)
        };
        let mut ticks = 0;
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            let Some((head, fields)) = stat.rsplit_once(')') else {
                continue;
            };
            let fields: Vec<u64> = fields
                .split_whitespace()
                .map(|f| f.parse().unwrap_or(0))
                .collect();
            let pid: u64 = head.split_whitespace().next().unwrap().parse().unwrap();
            // Fields 4 (ppid) and 14–17 (utime, stime, cutime, cstime),
            // counted from the state (field 3).
            if pid == u64::from(postmaster) || fields[1] == u64::from(postmaster) {
                ticks += fields[11..15].iter().sum::<u64>();
            }
        }
        Cpu {
            client: time(usage.user_time()) + time(usage.system_time()),
            server: Duration::from_millis(ticks * 1000 / USER_HZ),
        }
    }

    fn since(self, before: Cpu) -> Cpu {
        Cpu {
            client: self.client - before.client,
            server: self.server - before.server,
        }
    }
}

/// One side's drains: their wall time and CPU.
#[derive(Default)]
struct Side {
    wall: Duration,
    cpu: Cpu,
}

impl std::ops::AddAssign for Side {
    fn add_assign(&mut self, other: Side) {
        self.wall += other.wall;
        self.cpu.client += other.cpu.client;
        self.cpu.server += other.cpu.server;
    }
}

impl Side {
    /// Claims per second, and CPU microseconds per claim of the claimers
    /// and of the server.
    fn per_claim(&self, claims: usize) -> (f64, f64, f64) {
        let per = |d: Duration| d.as_secs_f64() * 1e6 / claims as f64;
        (
            claims as f64 / self.wall.as_secs_f64(),
            per(self.cpu.client),
            per(self.cpu.server),
        )
    }
}

/// What one worker count measured: npc's drains with the next claim
/// sent with each end and after it, and the raw loop's.
#[derive(Default)]
struct Throughput {
    with_the_end: Side,
    after_the_end: Side,
    raw: Side,
    /// Each round's claims/s of npc's two paths over the raw loop's.
    ratios: Vec<[f64; 2]>,
}

impl Throughput {
    /// The median over rounds of path `which`'s ratio to the raw loop, and
    /// the lowest and highest: the sides of one round drain back to back,
    /// so a change of the machine's load between rounds leaves the ratio
    /// of that round alone.
    fn ratio(&self, which: usize) -> (f64, f64, f64) {
        let mut all: Vec<f64> = self.ratios.iter().map(|r| r[which]).collect();
        all.sort_by(f64::total_cmp);
        let median = if all.len() % 2 == 1 {
            all[all.len() / 2]
        } else {
            (all[all.len() / 2 - 1] + all[all.len() / 2]) / 2.0
        };
        (median, all[0], all[all.len() - 1])
    }
}

/// The databases of one worker count: each side drains in its own, so each
/// table holds that side's history alone, as much of it as the others'
/// (one drain a round), and neither side's rows sit at the end of an index
/// the other's fill in the middle of.
struct Databases {
    with_the_end: String,
    after_the_end: String,
    raw: String,
}

impl Databases {
    /// `VACUUM ANALYZE` each side's table between rounds, as autovacuum
    /// does in a fleet that runs a while (its every minute is longer than
    /// a round): each round starts with its table in the same state, its
    /// dead rows gone, its statistics fresh. Statements a connection
    /// prepared on a young table keep the plan made then: the raw claim's,
    /// planned without statistics on a few hundred rows, sorts every row of
    /// its fleet through the unique index of dedupe keys, so without this
    /// the raw loop slows with its history, round after round (npc's
    /// statements name indexes no other plan can take; the plan test holds
    /// them to it). The cached plans are made again after this.
    async fn vacuum(&self) {
        for url in [&self.with_the_end, &self.after_the_end, &self.raw] {
            raw_client(url)
                .await
                .batch_execute("VACUUM ANALYZE npc_runs")
                .await
                .unwrap();
        }
    }

    /// Three fresh databases on `cluster`, migrated, named after `workers`.
    async fn create(cluster: &pg::PgCluster, workers: usize) -> Databases {
        let [with_the_end, after_the_end, raw] =
            ["npc", "apart", "raw"].map(|side| cluster.database(&format!("bench{workers}_{side}")));
        for url in [&with_the_end, &after_the_end, &raw] {
            npcagent::store::pg::migrate(url).await.unwrap();
        }
        Databases {
            with_the_end,
            after_the_end,
            raw,
        }
    }
}

/// npc's paths and the raw loop, with `workers`: `rounds` of `n` runs
/// each, the sides alternating, so a change of the machine's load weighs
/// on all. Each side's workers connect once and drain every round, as
/// long-lived worker processes do, after a round of
/// [`WARM_UP_RUNS_PER_WORKER`] runs each that is not measured (a new
/// server connection's first statements are parsed and planned afresh).
async fn throughput(
    databases: &Databases,
    postmaster: u32,
    workers: usize,
    rounds: usize,
    n: usize,
) -> Throughput {
    let mut with_the_end = Vec::new();
    let mut after_the_end = Vec::new();
    let mut raw = Vec::new();
    for _ in 0..workers {
        for (stores, url) in [
            (&mut with_the_end, &databases.with_the_end),
            (&mut after_the_end, &databases.after_the_end),
        ] {
            stores.push(Arc::new(PgStore::connect(url, FLEET).await.unwrap()));
        }
        raw.push(RawWorker::connect(&databases.raw).await);
    }
    let mut all = Throughput::default();
    for round in 0..=rounds {
        let drain = |url| Drain {
            url,
            postmaster,
            round,
            n: if round == 0 {
                workers * WARM_UP_RUNS_PER_WORKER
            } else {
                n
            },
        };
        let npc = npc_drain(
            &drain(&databases.with_the_end),
            &with_the_end,
            Asking::WithTheEnd,
        )
        .await;
        let raw = raw_drain(&drain(&databases.raw), &raw).await;
        let apart = npc_drain(
            &drain(&databases.after_the_end),
            &after_the_end,
            Asking::AfterTheEnd,
        )
        .await;
        if round > 0 {
            let rate = |side: &Side| n as f64 / side.wall.as_secs_f64();
            let (npc_rate, raw_rate, apart_rate) = (rate(&npc), rate(&raw), rate(&apart));
            println!(
                "  {workers} workers, round {round}: npc {npc_rate:.0}, raw {raw_rate:.0}, \
                 npc claiming after the end {apart_rate:.0} claims/s; ratios {:.2}, {:.2}",
                npc_rate / raw_rate,
                apart_rate / raw_rate
            );
            all.ratios
                .push([npc_rate / raw_rate, apart_rate / raw_rate]);
            all.with_the_end += npc;
            all.raw += raw;
            all.after_the_end += apart;
        }
        databases.vacuum().await;
    }
    all
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Enqueue → start of npc's waiting workers: (p50, p99).
async fn latency(url: &str, workers: usize, m: usize) -> (Duration, Duration) {
    let enqueuer = PgStore::connect(url, FLEET).await.unwrap();
    let committed: Arc<std::sync::Mutex<Vec<Option<Instant>>>> =
        Arc::new(std::sync::Mutex::new(vec![None; m]));
    let latencies = Arc::new(std::sync::Mutex::new(Vec::with_capacity(m)));
    let done = Arc::new(AtomicUsize::new(0));
    let stop = tokio_util::sync::CancellationToken::new();
    let mut tasks = Vec::new();
    for w in 0..workers {
        let store = Arc::new(PgStore::connect(url, FLEET).await.unwrap());
        let (committed, latencies, done, stop) = (
            committed.clone(),
            latencies.clone(),
            done.clone(),
            stop.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let me = format!("l{w}");
            let mut held = None;
            loop {
                let c = match held.take() {
                    Some(c) => c,
                    None => match store.claim(&me, LEASE).await.unwrap() {
                        Some(c) => c,
                        None => {
                            tokio::select! {
                                () = stop.cancelled() => return,
                                _ = store.wait_for_work(WAIT_AT_MOST) => {}
                            }
                            continue;
                        }
                    },
                };
                let at = Instant::now();
                let i: usize = c.run.id.trim_start_matches("l-").parse().unwrap();
                // The commit's instant is written right after enqueue returns;
                // a claim may answer first, then it waits for it.
                let from = loop {
                    if let Some(t) = committed.lock().unwrap()[i] {
                        break t;
                    }
                    tokio::task::yield_now().await;
                };
                latencies
                    .lock()
                    .unwrap()
                    .push(at.saturating_duration_since(from));
                held = end_bringing_next(&store, &c, &me).await;
                done.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    for i in 0..m {
        let before = Instant::now();
        enqueuer.enqueue(new_run(format!("l-{i}"))).await.unwrap();
        // The commit is somewhere in the enqueue's round trip: its middle.
        let mid = before + before.elapsed() / 2;
        committed.lock().unwrap()[i] = Some(mid);
        tokio::time::sleep(ENQUEUE_PACE).await;
    }
    while done.load(Ordering::SeqCst) < m {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.cancel();
    for t in tasks {
        t.await.unwrap();
    }
    let mut all = latencies.lock().unwrap().clone();
    all.sort();
    (percentile(&all, 0.5), percentile(&all, 0.99))
}

/// Deliveries the ingress side posts per store.
const INGRESS_DELIVERIES: usize = 300;
/// How long the daemon may take to start and join its store.
const INGRESS_READY: Duration = Duration::from_secs(60);
/// The webhook secret of the ingress side.
const INGRESS_SECRET: &str = "bench-secret";

/// `npc ARGS` in `repo` with the store URL; its stdout.
fn npc_out(repo: &std::path::Path, url: &str, args: &[&str]) -> String {
    let out = std::process::Command::new(npc_bin())
        .args(args)
        .current_dir(repo)
        .env("NPC_STORE_URL", url)
        .output()
        .expect("run npc");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn npc_bin() -> std::path::PathBuf {
    std::env::var_os("NPC").map_or_else(
        || std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/npc"),
        Into::into,
    )
}

/// Wait (bounded) until `check` says yes.
fn poll_until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + INGRESS_READY;
    while !check() {
        assert!(Instant::now() < deadline, "{what} within {INGRESS_READY:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One signed delivery on a fresh connection; its status and the time to
/// the whole answer.
fn deliver(addr: &str, body: &str) -> (u16, Duration) {
    use std::io::{Read as _, Write as _};
    let sig = hex::encode(npcagent::triggers::webhook::hmac_sha256(
        INGRESS_SECRET.as_bytes(),
        &[body.as_bytes()],
    ));
    let started = Instant::now();
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_nodelay(true).unwrap();
    write!(
        stream,
        "POST /webhooks/bench HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nX-Hub-Signature-256: sha256={sig}\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).unwrap();
    let took = started.elapsed();
    let text = String::from_utf8_lossy(&answer);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, took)
}

/// p50 and p99 of webhook answers from a daemon on a fresh repository,
/// with `[store] url` when `url` is given.
fn ingress(url: Option<&str>) -> (Duration, Duration) {
    let repo = tempfile::tempdir().unwrap();
    let store = if url.is_some() {
        "[store]\nurl = \"${NPC_STORE_URL}\"\n"
    } else {
        ""
    };
    let manifest = format!(
        "version = 1\n[project]\nname = \"bench\"\n{store}[daemon]\nwebhook_listen = \"127.0.0.1:0\"\n\
         [triggers.bench]\nkind = \"webhook\"\nroute = \"bench\"\nsecret_env = \"HOOK_SECRET\"\n\
         rate_limit_per_minute = 1000000\naction = {{ command = \"true\" }}\n"
    );
    std::fs::write(repo.path().join("npcagent.toml"), manifest).unwrap();
    let url = url.unwrap_or("");
    if !url.is_empty() {
        npc_out(repo.path(), url, &["store", "migrate"]);
    }
    let mut daemon = std::process::Command::new(npc_bin())
        .arg("daemon")
        .current_dir(repo.path())
        .env("NPC_STORE_URL", url)
        .env("HOOK_SECRET", INGRESS_SECRET)
        .env("XDG_DATA_HOME", repo.path().join(".data"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start npc daemon");
    let mut addr = String::new();
    poll_until("the daemon's webhook listener", || {
        let Ok(out) = std::process::Command::new(npc_bin())
            .args(["triggers", "--format", "json"])
            .current_dir(repo.path())
            .env("NPC_STORE_URL", url)
            .output()
        else {
            return false;
        };
        let found: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let hook = found["triggers"][0]["url"].as_str().unwrap_or("");
        addr = hook
            .strip_prefix("http://")
            .and_then(|r| r.split('/').next())
            .unwrap_or("")
            .to_string();
        !addr.is_empty()
    });
    if !url.is_empty() {
        poll_until("the daemon to join its store", || {
            npc_out(repo.path(), url, &["status", "--format", "json"]).contains("\"connected\"")
        });
    }
    let mut took: Vec<Duration> = (0..INGRESS_DELIVERIES)
        .map(|i| {
            let (status, took) = deliver(&addr, &format!("{{\"n\":{i}}}"));
            assert_eq!(status, 202, "delivery {i}");
            took
        })
        .collect();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = daemon.wait();
    took.sort();
    (percentile(&took, 0.5), percentile(&took, 0.99))
}

fn main() {
    let Some(cluster) = pg::PgCluster::start() else {
        println!("fleet bench skipped: no PostgreSQL server binaries");
        return;
    };
    let n = env_usize("FLEET_BENCH_RUNS", 10_000);
    let rounds = env_usize("FLEET_BENCH_ROUNDS", 5);
    let m = env_usize("FLEET_BENCH_LATENCY_RUNS", 300);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    println!(
        "claims: {rounds} alternating rounds of {n} runs per side; enqueue → start: {m} runs, one every {ENQUEUE_PACE:?}"
    );
    let postmaster = cluster.server_pid().expect("the cluster runs");
    let counts: Vec<usize> = std::env::var("FLEET_BENCH_WORKERS")
        .map(|list| list.split(',').map(|w| w.trim().parse().unwrap()).collect())
        .unwrap_or_else(|_| WORKER_COUNTS.to_vec());
    let mut table = vec![
        "| workers | npc claims/s | raw claims/s | ratio, median of rounds (range) \
         | npc, claim after the end | ratio | CPU µs per claim, npc (claimers + server) | raw \
         | enqueue → start p50 | p99 |"
            .to_string(),
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|".to_string(),
    ];
    for workers in counts {
        rt.block_on(async {
            let databases = Databases::create(&cluster, workers).await;
            let all = throughput(&databases, postmaster, workers, rounds, n).await;
            let (npc, npc_client, npc_server) = all.with_the_end.per_claim(rounds * n);
            let (apart, _, _) = all.after_the_end.per_claim(rounds * n);
            let (raw, raw_client, raw_server) = all.raw.per_claim(rounds * n);
            let (p50, p99) = latency(&databases.with_the_end, workers, m).await;
            let ((with, with_low, with_high), (after, after_low, after_high)) =
                (all.ratio(0), all.ratio(1));
            table.push(format!(
                "| {workers} | {npc:.0} | {raw:.0} | {with:.2} ({with_low:.2}–{with_high:.2}) \
                 | {apart:.0} | {after:.2} ({after_low:.2}–{after_high:.2}) \
                 | {npc_client:.0} + {npc_server:.0} | {raw_client:.0} + {raw_server:.0} \
                 | {:.2} ms | {:.2} ms |",
                p50.as_secs_f64() * 1e3,
                p99.as_secs_f64() * 1e3
            ));
        });
    }
    for line in table {
        println!("{line}");
    }
    if std::env::var_os("FLEET_BENCH_NO_INGRESS").is_some() {
        return;
    }
    let url = cluster.database("ingress");
    let (shared50, shared99) = ingress(Some(&url));
    let (local50, local99) = ingress(None);
    println!(
        "ingress ({INGRESS_DELIVERIES} signed webhooks, one at a time, each on a new connection):"
    );
    println!("| store | 202 p50 | p99 |");
    println!("|---|---:|---:|");
    for (name, p50, p99) in [
        ("PostgreSQL (`[store] url`)", shared50, shared99),
        ("SQLite (embedded)", local50, local99),
    ] {
        println!(
            "| {name} | {:.2} ms | {:.2} ms |",
            p50.as_secs_f64() * 1e3,
            p99.as_secs_f64() * 1e3
        );
    }
    println!(
        "PostgreSQL / SQLite: p50 {:.2}, p99 {:.2}",
        shared50.as_secs_f64() / local50.as_secs_f64(),
        shared99.as_secs_f64() / local99.as_secs_f64()
    );
}
