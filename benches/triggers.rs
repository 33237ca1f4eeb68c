//! Triggers, measured against same-run baselines:
//!
//! 1. Webhooks: `wrk` on loopback against a signed route of a release
//!    `npc daemon` — accepted requests per second (each answered 202 only
//!    after its run row committed; the route's overlap is `skip`, so the
//!    rows are recorded without running anything), and rejected requests
//!    per second (bad signature, 401). Baseline: an axum route in this
//!    process that answers 202 without work, same `wrk` parameters.
//! 2. Cron scheduling cost with [`CRON_TRIGGERS`] triggers: the next-fire
//!    computation for all of them per tick. Baseline: one time-zone
//!    conversion per trigger.
//! 3. file_watch: event-to-enqueue latency minus the debounce (the
//!    `run.queued` event's commit time − the write time − `debounce_ms`).
//!    Baseline: a bare notify watcher in this process seeing the same kind
//!    of write.
//!
//! Needs `wrk` (Debian package `wrk`, installed by `.ci/run`); the webhook
//! part is skipped with a message without it.

#[path = "common/mod.rs"]
mod common;
use common::{WRK_CONNECTIONS, WRK_SECONDS, WRK_THREADS, installed, npc};

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use npcagent::model::schedule::Schedule;
use npcagent::triggers::cron;

/// Triggers in the cron scheduling measurement.
const CRON_TRIGGERS: usize = 10_000;
/// Ticks measured (the median is reported).
const CRON_TICKS: usize = 30;
/// File writes measured.
const WATCH_WRITES: usize = 30;
/// The file_watch debounce used.
const WATCH_DEBOUNCE_MS: u64 = 100;
/// Longest any wait may take.
const LIMIT: Duration = Duration::from_secs(60);

fn wait_for<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + LIMIT;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A daemon on a fresh repository; killed on drop.
struct Daemon {
    dir: tempfile::TempDir,
    child: std::process::Child,
}

impl Daemon {
    fn start(manifest: &str, env: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("npcagent.toml"), manifest).unwrap();
        let log = std::fs::File::create(dir.path().join("daemon.log")).unwrap();
        let child = Command::new(npc())
            .arg("daemon")
            .current_dir(dir.path())
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let d = Self { dir, child };
        wait_for("the daemon's startup", || {
            std::fs::read_to_string(d.dir.path().join("daemon.log"))
                .unwrap_or_default()
                .contains("npc daemon: startup")
                .then_some(())
        });
        d
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    fn store(&self) -> npcagent::store::Store {
        npcagent::store::Store::open_read_only(self.root().join(".npc/state.db")).unwrap()
    }

    fn webhook_addr(&self) -> String {
        wait_for("the webhook listener", || {
            self.store()
                .events_since(0, 10_000)
                .ok()?
                .into_iter()
                .find(|e| e.kind == "webhook.listening")
                .and_then(|e| e.payload["addr"].as_str().map(str::to_string))
        })
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
    }
}

/// A `wrk` script POSTing `body` without a signature, a delivery id unique
/// per request (thread number + counter).
fn unsigned_script(dir: &Path, body: &str) -> PathBuf {
    let text = format!(
        r#"
local counter = 0
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("tid", threads)
end
function request()
  counter = counter + 1
  local headers = {{}}
  headers["Content-Type"] = "application/json"
  headers["X-GitHub-Event"] = "push"
  headers["X-GitHub-Delivery"] = tid .. "-" .. counter
  return wrk.format("POST", nil, headers, {body:?})
end
"#
    );
    let path = dir.join("unsigned.lua");
    std::fs::write(&path, text).unwrap();
    path
}

/// Distinct deliveries prepared per `wrk` thread: more than one thread sends in a run.
const DELIVERIES_PER_THREAD: usize = 200_000;

/// A `wrk` script POSTing distinct signed deliveries: each thread reads
/// `deliveries.<thread>` (lines `signature<TAB>body`, written here with their
/// HMACs precomputed), so no two requests share a body or a signature and none
/// is a replay. The delivery id is a slice of the signature.
fn signed_script(dir: &Path, secret: &str) -> PathBuf {
    for thread in 1..=WRK_THREADS {
        let mut lines = String::new();
        for n in 0..DELIVERIES_PER_THREAD {
            let body = format!(
                r#"{{"ref":"refs/heads/main","n":"{thread}-{n}","repository":{{"full_name":"acme/widget"}}}}"#
            );
            let mac =
                npcagent::triggers::webhook::hmac_sha256(secret.as_bytes(), &[body.as_bytes()]);
            lines.push_str(&format!("sha256={}\t{body}\n", hex::encode(mac)));
        }
        std::fs::write(dir.join(format!("deliveries.{thread}")), lines).unwrap();
    }
    let text = r#"
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("tid", threads)
end
function init()
  sigs = {}
  bodies = {}
  for line in io.lines(PREFIX .. "." .. tid) do
    local tab = line:find("\t", 1, true)
    sigs[#sigs + 1] = line:sub(1, tab - 1)
    bodies[#bodies + 1] = line:sub(tab + 1)
  end
  i = 0
end
function request()
  i = i % #sigs + 1
  local headers = {}
  headers["Content-Type"] = "application/json"
  headers["X-GitHub-Event"] = "push"
  headers["X-GitHub-Delivery"] = sigs[i]:sub(8, 39)
  headers["X-Hub-Signature-256"] = sigs[i]
  return wrk.format("POST", nil, headers, bodies[i])
end
"#
    .replace(
        "PREFIX",
        &format!("{:?}", dir.join("deliveries").display().to_string()),
    );
    let path = dir.join("signed.lua");
    std::fs::write(&path, text).unwrap();
    path
}

fn webhooks() {
    if !installed("wrk") {
        println!("webhooks: skipped (`wrk` is not installed; `apt-get install wrk`)");
        return;
    }
    let secret = "bench-secret";
    let manifest = r#"version = 1
[daemon]
webhook_listen = "127.0.0.1:0"
[triggers.bench]
kind = "webhook"
route = "bench"
secret_env = "BENCH_SECRET"
overlap = "skip"
rate_limit_per_minute = 100000000
action = { command = "sleep", args = ["3600"] }
"#;
    let d = Daemon::start(manifest, &[("BENCH_SECRET", secret)]);
    let addr = d.webhook_addr();
    let body = r#"{"ref":"refs/heads/main","repository":{"full_name":"acme/widget"}}"#;
    let scripts = tempfile::tempdir().unwrap();
    let signed = signed_script(scripts.path(), secret);
    let unsigned = unsigned_script(scripts.path(), body);
    let url = format!("http://{addr}/webhooks/bench");

    // Baseline: axum answering 202 without work, in this process.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let base_addr = listener.local_addr().unwrap();
    rt.spawn(async move {
        let app = axum::Router::new().fallback(|| async { axum::http::StatusCode::ACCEPTED });
        axum::serve(listener, app).await.unwrap();
    });
    let base_url = format!("http://{base_addr}/webhooks/bench");
    let base = common::wrk(&base_url, Some(&signed));
    let (base_rps, base_bad) = (base.requests_per_second, base.non_2xx);
    let before = d.store().run_rows(Some("bench"), 1).unwrap();
    let acc = common::wrk(&url, Some(&signed));
    let (acc_rps, acc_bad, acc_total) = (acc.requests_per_second, acc.non_2xx, acc.requests);
    let rej = common::wrk(&url, Some(&unsigned));
    let (rej_rps, rej_bad, rej_total) = (rej.requests_per_second, rej.non_2xx, rej.requests);
    let rows = wait_for("the committed rows", || {
        let runs = d.store().run_rows(Some("bench"), 1).ok()?;
        Some(runs.first()?.seq - before.first().map_or(0, |r| r.seq))
    });
    println!("webhooks (wrk -t{WRK_THREADS} -c{WRK_CONNECTIONS} -d{WRK_SECONDS}s, loopback):");
    println!("  baseline axum 202, no work:        {base_rps:>10.0} req/s ({base_bad} non-2xx)");
    println!(
        "  signed, accepted (202, committed): {acc_rps:>10.0} req/s ({acc_bad} non-2xx of {acc_total}; {rows} rows committed)  ratio {:.2}",
        acc_rps / base_rps
    );
    println!(
        "  bad signature (401):               {rej_rps:>10.0} req/s ({rej_bad} non-2xx of {rej_total})  ratio {:.2}",
        rej_rps / base_rps
    );
}

fn cron_cost() {
    let exprs = [
        "*/5 * * * *",
        "0 3 * * 1-5",
        "30 2 * * *",
        "15 */2 1,15 * *",
        "@hourly",
        "0 9 * * mon",
        "15m",
        "1h30m",
    ];
    let zones = ["UTC", "Europe/Berlin", "America/New_York", "Asia/Tokyo"];
    let triggers: Vec<(Schedule, chrono_tz::Tz)> = (0..CRON_TRIGGERS)
        .map(|i| {
            (
                exprs[i % exprs.len()].parse().unwrap(),
                zones[i % zones.len()].parse().unwrap(),
            )
        })
        .collect();
    let start = chrono::Utc::now();
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let mut ticks = Vec::new();
    let mut baseline = Vec::new();
    for tick in 0..CRON_TICKS {
        let now = start + chrono::Duration::minutes(tick as i64);
        let t = Instant::now();
        let mut fired = 0usize;
        for (s, tz) in &triggers {
            fired += usize::from(cron::next_after(s, *tz, now).is_some());
        }
        ticks.push(t.elapsed());
        assert_eq!(fired, CRON_TRIGGERS);
        let t = Instant::now();
        let mut n = 0u32;
        for (_, tz) in &triggers {
            n = n.wrapping_add(chrono::Timelike::minute(&now.with_timezone(tz)));
        }
        baseline.push(t.elapsed());
        std::hint::black_box(n);
    }
    let (tick, base) = (median(ticks), median(baseline));
    println!("cron scheduling ({CRON_TRIGGERS} triggers, median of {CRON_TICKS} ticks):");
    println!(
        "  next-fire for all: {:.2} ms per tick ({:.2} µs per trigger)",
        tick.as_secs_f64() * 1e3,
        tick.as_secs_f64() * 1e6 / CRON_TRIGGERS as f64
    );
    println!(
        "  baseline (one zone conversion each): {:.3} ms  ratio {:.1}",
        base.as_secs_f64() * 1e3,
        tick.as_secs_f64() / base.as_secs_f64()
    );
}

fn file_watch_latency() {
    use notify::Watcher as _;
    let manifest = format!(
        "version = 1\n[triggers.w]\nkind = \"file_watch\"\npaths = [\"*.txt\"]\ndebounce_ms = {WATCH_DEBOUNCE_MS}\naction = {{ command = \"true\" }}\n"
    );
    let d = Daemon::start(&manifest, &[]);
    let mut added = Vec::new();
    let mut last_id = d.store().last_event_id().unwrap();
    for i in 0..WATCH_WRITES {
        let wrote_ms = chrono::Utc::now().timestamp_millis();
        std::fs::write(d.root().join(format!("f{i}.txt")), "x").unwrap();
        let event = wait_for("the run.queued event", || {
            d.store()
                .events_since(last_id, 10_000)
                .ok()?
                .into_iter()
                .find(|e| e.kind == "run.queued")
        });
        last_id = event.id;
        added.push(event.ts_ms - wrote_ms - WATCH_DEBOUNCE_MS as i64);
    }
    added.sort_unstable();
    // Baseline: a bare notify watcher seeing a write.
    let (tx, rx) = std::sync::mpsc::channel();
    let bare = tempfile::tempdir().unwrap();
    let mut watcher = notify::recommended_watcher(move |e: notify::Result<notify::Event>| {
        if let Ok(e) = e
            && matches!(e.kind, notify::EventKind::Create(_))
        {
            let _ = tx.send(Instant::now());
        }
    })
    .unwrap();
    watcher
        .watch(bare.path(), notify::RecursiveMode::NonRecursive)
        .unwrap();
    let mut raw = Vec::new();
    for i in 0..WATCH_WRITES {
        let t = Instant::now();
        std::fs::write(bare.path().join(format!("f{i}.txt")), "x").unwrap();
        let seen = rx.recv_timeout(LIMIT).unwrap();
        raw.push(seen.duration_since(t).as_secs_f64() * 1e3);
        while rx.try_recv().is_ok() {}
    }
    raw.sort_by(f64::total_cmp);
    println!("file_watch ({WATCH_WRITES} writes, debounce {WATCH_DEBOUNCE_MS} ms):");
    println!(
        "  event → run.queued committed, minus the debounce: p50 {} ms, max {} ms",
        added[added.len() / 2],
        added[added.len() - 1]
    );
    println!(
        "  baseline, bare notify event: p50 {:.2} ms, max {:.2} ms",
        raw[raw.len() / 2],
        raw[raw.len() - 1]
    );
}

fn main() {
    let only = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let wants = |name: &str| only.as_deref().is_none_or(|o| name.contains(o));
    if wants("cron") {
        cron_cost();
    }
    if wants("file_watch") {
        file_watch_latency();
    }
    if wants("webhooks") {
        webhooks();
    }
}
