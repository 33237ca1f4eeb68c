//! The REST API, measured against same-run baselines:
//!
//! 1. `GET /api/v1/status` of a release `npc daemon` under `wrk` on
//!    loopback (requests/s, every answer a 200). Baseline: an axum route in
//!    this process answering a constant JSON document, same `wrk`
//!    parameters.
//! 2. SSE fan-out: [`SSE_CLIENTS`] streams of the API's router (the same
//!    code the daemon serves, over real loopback sockets) while
//!    [`SSE_EVENTS`] events are published on the bus: deliveries per
//!    second, and a check that every client got every event once, in
//!    order. Baseline: publishing the same events with no stream open.
//!
//! Needs `wrk` (Debian package, installed by `.ci/run`) for part 1, which
//! is skipped with a message without it.

#[path = "common/mod.rs"]
mod common;
use common::{installed, npc};

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use npcagent::api::auth::ApiAuth;
use npcagent::api::listings::PluginRow;
use npcagent::api::resources::{FireAccepted, PaneAnswer, PaneOp, PaneView};
use npcagent::api::terminal::Terminal;
use npcagent::api::{Answer, ApiBackend, ApiError, router};
use npcagent::bus::EventBus;
use npcagent::event::{Event, RunOutput};
use npcagent::store::{NewEvent, Store};
use npcagent::surfaces::runs::ManualRun;
use npcagent::surfaces::tcp::Access;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};

/// Streams in the fan-out measurement.
const SSE_CLIENTS: usize = 100;
/// Events published in the fan-out measurement.
const SSE_EVENTS: usize = 2_000;
/// Longest any wait may take.
const LIMIT: Duration = Duration::from_secs(120);

/// A constant-answer axum server in this process: the baseline.
async fn constant_server() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().route(
        "/api/v1/status",
        axum::routing::get(|| async { axum::Json(json!({ "pid": 1, "components": [] })) }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/api/v1/status")
}

/// A release daemon on a fresh repository, and its API's status URL.
fn daemon() -> (tempfile::TempDir, std::process::Child, String) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("npcagent.toml"),
        "version = 1\n[daemon]\nlisten = \"127.0.0.1:0\"\n",
    )
    .unwrap();
    let mut child = Command::new(npc())
        .arg("daemon")
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the daemon starts");
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    let started = Instant::now();
    let url = loop {
        assert!(started.elapsed() < LIMIT, "the daemon printed no API URL");
        let line = lines.next().expect("a startup line").unwrap();
        if let Some(url) = line.strip_prefix("npc daemon: API ") {
            break url.to_string();
        }
    };
    // Keep draining its log so it never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    (dir, child, url)
}

async fn status_paths() {
    if !installed("wrk") {
        println!("skipped the status measurement: `wrk` is not installed (`apt-get install wrk`)");
        return;
    }
    let baseline_url = constant_server().await;
    let (dir, mut child, url) = daemon();
    let base = tokio::task::spawn_blocking(move || common::wrk(&baseline_url, None))
        .await
        .unwrap();
    // The API answers only a bearer of the repository's token.
    let token = std::fs::read_to_string(dir.path().join(".npc/api.token")).expect("the token file");
    let bearer = vec![format!("Authorization: Bearer {}", token.trim())];
    let api = tokio::task::spawn_blocking(move || common::wrk_with(&url, None, &bearer))
        .await
        .unwrap();
    assert_eq!((base.non_2xx, api.non_2xx), (0, 0), "every answer a 200");
    let (base, api) = (base.requests_per_second, api.requests_per_second);
    println!(
        "status: baseline (constant axum route) {base:.0} req/s | npc daemon GET /api/v1/status {api:.0} req/s (ratio {:.2})",
        api / base
    );
    let _ = child.kill();
    let _ = child.wait();
}

#[derive(Debug)]
struct Bench {
    store: Arc<Store>,
    bus: EventBus,
}

impl ApiBackend for Bench {
    fn status(&self) -> BoxFuture<'_, Value> {
        Box::pin(async { json!({}) })
    }
    fn plan(&self) -> BoxFuture<'_, Answer> {
        Box::pin(async { Answer::Ok(json!({})) })
    }
    fn apply(&self, _reason: &'static str) -> BoxFuture<'_, Answer> {
        Box::pin(async { Answer::Ok(json!({})) })
    }
    fn store(&self) -> Arc<Store> {
        self.store.clone()
    }
    fn bus(&self) -> EventBus {
        self.bus.clone()
    }
    // The benchmark measures status and events only.
    fn start_run(&self, _: ManualRun) -> BoxFuture<'_, Result<String, ApiError>> {
        Box::pin(async { Err(unmeasured()) })
    }
    fn cancel_run(&self, _: String) -> BoxFuture<'_, Result<String, ApiError>> {
        Box::pin(async { Err(unmeasured()) })
    }
    fn answer_run(
        &self,
        _: String,
        _: Option<String>,
        _: npcagent::store::approvals::Answer,
    ) -> BoxFuture<'_, Result<npcagent::api::resources::RunAnswered, ApiError>> {
        Box::pin(async { Err(unmeasured()) })
    }
    fn run_diff(
        &self,
        _: String,
    ) -> BoxFuture<'_, Result<npcagent::api::resources::RunDiff, ApiError>> {
        Box::pin(async { Err(unmeasured()) })
    }
    fn panes(&self) -> Vec<PaneView> {
        Vec::new()
    }
    fn pane(&self, _: String, _: PaneOp) -> BoxFuture<'_, Result<PaneAnswer, ApiError>> {
        Box::pin(async { Err(unmeasured()) })
    }
    fn terminal(&self, _: &str) -> Result<Terminal, ApiError> {
        Err(unmeasured())
    }
    fn triggers(&self) -> BoxFuture<'_, Result<Vec<Value>, ApiError>> {
        Box::pin(async { Ok(Vec::new()) })
    }
    fn fire(&self, _: String, _: Value) -> BoxFuture<'_, Result<FireAccepted, ApiError>> {
        Box::pin(async { Err(unmeasured()) })
    }
    fn plugins(&self) -> BoxFuture<'_, Result<Vec<PluginRow>, ApiError>> {
        Box::pin(async { Ok(Vec::new()) })
    }
}

fn unmeasured() -> ApiError {
    ApiError::new(
        axum::http::StatusCode::NOT_FOUND,
        "not_found",
        "the benchmark's backend has no runs or panes",
    )
}

/// Set to publish the event this bench published before events were typed
/// (`bench.tick` with `{"i": N}`), for same-run comparisons with commits
/// before issue 42 (`benches/scripts/compare_commits.py --env`).
const LEGACY_PAYLOAD_ENV: &str = "NPC_BENCH_LEGACY_PAYLOAD";

/// Publish [`SSE_EVENTS`] events; their ids.
async fn publish_all(bus: &EventBus) -> Vec<i64> {
    let legacy = std::env::var_os(LEGACY_PAYLOAD_ENV).is_some();
    let mut pending = Vec::with_capacity(SSE_EVENTS);
    for i in 0..SSE_EVENTS {
        let event = if legacy {
            NewEvent::relayed("bench.tick".to_string(), None, json!({ "i": i }))
        } else {
            NewEvent::from(Event::RunOutput(RunOutput {
                run_id: "bench".to_string(),
                stream: "stdout".to_string(),
                line: i.to_string(),
            }))
        };
        pending.push(bus.publish(event));
    }
    let mut ids = Vec::with_capacity(SSE_EVENTS);
    for p in pending {
        ids.push(p.await.unwrap().id);
    }
    ids
}

/// One SSE client: the ids it received, until it has `n`.
async fn client(addr: std::net::SocketAddr, after: i64, n: usize) -> Vec<i64> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(
            format!("GET /api/v1/events/stream?after={after} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
    let mut lines = tokio::io::BufReader::new(stream).lines();
    let mut ids = Vec::with_capacity(n);
    while ids.len() < n {
        let line = lines
            .next_line()
            .await
            .unwrap()
            .expect("the stream stays open");
        if let Some(id) = line.strip_prefix("id: ") {
            ids.push(id.parse().unwrap());
        }
    }
    ids
}

async fn fan_out() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(Store::default_path(dir.path())).unwrap());
    let bus = EventBus::new(store.clone());
    // Baseline: the same events published with no stream open.
    let t = Instant::now();
    let warm = publish_all(&bus).await;
    let publish_only = SSE_EVENTS as f64 / t.elapsed().as_secs_f64();
    let after = *warm.last().unwrap();

    let backend = Arc::new(Bench {
        store: store.clone(),
        bus: bus.clone(),
    });
    let app = router(backend, ApiAuth::new(Access::Loopback), false);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..SSE_CLIENTS {
        clients.spawn(client(addr, after, SSE_EVENTS));
    }
    let t = Instant::now();
    let ids = publish_all(&bus).await;
    let mut delivered = 0usize;
    while let Some(got) = tokio::time::timeout(LIMIT, clients.join_next())
        .await
        .expect("every client got every event in time")
    {
        let got = got.unwrap();
        assert_eq!(got, ids, "every event once, in order");
        delivered += got.len();
    }
    let elapsed = t.elapsed().as_secs_f64();
    println!(
        "sse: {SSE_CLIENTS} streams, {SSE_EVENTS} events: {:.0} deliveries/s ({:.0} events/s to every stream), none lost | baseline publish only {publish_only:.0} events/s (ratio {:.2})",
        delivered as f64 / elapsed,
        SSE_EVENTS as f64 / elapsed,
        (SSE_EVENTS as f64 / elapsed) / publish_only
    );
}

fn main() {
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let wanted = |name: &str| filter.is_empty() || filter.iter().any(|f| name.contains(f));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        if wanted("status") {
            status_paths().await;
        }
        if wanted("sse") {
            fan_out().await;
        }
    });
}
