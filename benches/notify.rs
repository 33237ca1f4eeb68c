//! Notifications: state change → sink request, under 100 events/s.
//!
//! In this process: the real store, event bus and `notify::Notifier` with
//! one `webhook` sink on an HTTP receiver on 127.0.0.1 (a thread here).
//! [`EVENTS`] `run.finished` events (outcome `failed`, one run each) are
//! published at [`RATE`] per second; the latency of each is from just
//! before `publish` (the state change) to the receiver reading the
//! request that carries it (persist, fan-out, routing with the run's row
//! looked up, the sink's coalescing window of `COALESCE_WINDOW`, render,
//! POST). Baseline, same run, same receiver, same rate: a raw POST of a
//! small JSON body (`surfaces::post`, connection reused), from the call
//! to the receiver reading it. Printed: p50 and p90 of both and the ratio.
//!
//! `cargo test --bench notify` runs it on a debug build (what the numbers
//! in `benches/RESULTS.md` come from); `NOTIFY_BENCH_EVENTS` overrides the
//! count.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use npcagent::bus::EventBus;
use npcagent::event::Event;
use npcagent::notify::Notifier;
use npcagent::store::Store;
use npcagent::supervisor::{BackoffPolicy, Supervisor};
use npcagent::surfaces::post::PostClient;

/// Events per second.
const RATE: u64 = 100;
/// Events (and baseline posts) unless `NOTIFY_BENCH_EVENTS` says otherwise.
const EVENTS: usize = 300;
/// Longest the bench waits for the last request.
const DRAIN_LIMIT: Duration = Duration::from_secs(60);

/// Serve keep-alive HTTP/1.1 on `listener`, sending (arrival, body) of
/// each request to `tx`.
fn receiver(listener: TcpListener, tx: mpsc::Sender<(Instant, Vec<u8>)>) {
    for stream in listener.incoming() {
        let Ok(stream) = stream else { return };
        let tx = tx.clone();
        std::thread::spawn(move || connection(stream, &tx));
    }
}

fn connection(mut stream: TcpStream, tx: &mpsc::Sender<(Instant, Vec<u8>)>) {
    let _ = stream.set_nodelay(true);
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let (head_end, len) = loop {
            if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..at]).to_ascii_lowercase();
                let len = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length: "))
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .unwrap_or(0);
                break (at + 4, len);
            }
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        while buf.len() < head_end + len {
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let arrived = Instant::now();
        let body = buf[head_end..head_end + len].to_vec();
        buf.drain(..head_end + len);
        let _ = tx.send((arrived, body));
        if stream
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            .is_err()
        {
            return;
        }
    }
}

/// The id a request carries: the run's (in the dashboard link) or the
/// baseline's `id`.
fn id_of(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    if let Some(id) = v["id"].as_str() {
        return Some(id.to_string());
    }
    let link = v["links"]["dashboard"].as_str()?;
    link.rsplit_once("#run=").map(|(_, id)| id.to_string())
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Latencies of `sent` (id → start) against what arrived on `rx`.
fn collect(
    rx: &mpsc::Receiver<(Instant, Vec<u8>)>,
    sent: &HashMap<String, Instant>,
) -> Vec<Duration> {
    let mut out = Vec::new();
    let deadline = Instant::now() + DRAIN_LIMIT;
    while out.len() < sent.len() && Instant::now() < deadline {
        let Ok((arrived, body)) = rx.recv_timeout(Duration::from_secs(5)) else {
            break;
        };
        if let Some(start) = id_of(&body).and_then(|id| sent.get(&id)) {
            out.push(arrived.duration_since(*start));
        }
    }
    out.sort();
    out
}

fn main() {
    let events: usize = std::env::var("NOTIFY_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(EVENTS);
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || receiver(listener, tx));

    let dir = tempfile::tempdir().expect("tempdir");
    let manifest_path = dir.path().join("npcagent.toml");
    std::fs::write(
        &manifest_path,
        format!(
            "version = 1\n[notify.bench]\nkind = \"webhook\"\nurl = \"{url}/in\"\non = [\"run.failed\"]\n"
        ),
    )
    .expect("manifest");
    let loaded = npcagent::runtime::load_from_disk(&manifest_path).expect("load");
    let manifest = loaded.manifest.expect("a valid manifest");

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio");
    let interval = Duration::from_nanos(1_000_000_000 / RATE);

    // The notifier: publish at RATE, latency to the receiver.
    let store = Arc::new(Store::open(dir.path().join("state.db")).expect("store"));
    let notified: HashMap<String, Instant> = rt.block_on(async {
        let bus = EventBus::new(store.clone());
        let (events_tx, _events_rx) = tokio::sync::mpsc::unbounded_channel();
        let supervisor = Supervisor::new(events_tx, BackoffPolicy::default());
        let notifier = Notifier::start(bus.clone(), store, supervisor, dir.path().to_path_buf())
            .expect("subscribe");
        notifier.set_manifest(&manifest);
        let mut sent = HashMap::new();
        let mut tick = tokio::time::interval(interval);
        for n in 0..events {
            tick.tick().await;
            let id = format!("bench-{n}");
            sent.insert(id.clone(), Instant::now());
            let publish = bus.publish(Event::run_failed(&id, Some("gh"), "boom").into());
            tokio::spawn(publish);
        }
        std::mem::forget(notifier);
        sent
    });
    let notify = collect(&rx, &notified);

    // Baseline: a raw POST per tick to the same receiver.
    let posted: HashMap<String, Instant> = rt.block_on(async {
        let client = PostClient::new().expect("client");
        let headers = vec![("Content-Type".to_string(), "application/json".to_string())];
        let mut sent = HashMap::new();
        let mut tick = tokio::time::interval(interval);
        for n in 0..events {
            tick.tick().await;
            let id = format!("raw-{n}");
            let body = serde_json::json!({ "id": id }).to_string().into_bytes();
            sent.insert(id, Instant::now());
            let (client, headers, url) = (client.clone(), headers.clone(), format!("{url}/raw"));
            tokio::spawn(async move {
                let _ = client
                    .post(&url, &headers, body, Duration::from_secs(10))
                    .await;
            });
        }
        sent
    });
    let raw = collect(&rx, &posted);

    assert!(!notify.is_empty() && !raw.is_empty(), "nothing arrived");
    let (n50, n90) = (percentile(&notify, 0.5), percentile(&notify, 0.9));
    let (r50, r90) = (percentile(&raw, 0.5), percentile(&raw, 0.9));
    println!(
        "notify: state change -> sink request at {RATE} events/s, {} of {events} arrived: p50 {:.1} ms, p90 {:.1} ms (includes the {} ms coalescing window)",
        notify.len(),
        n50.as_secs_f64() * 1e3,
        n90.as_secs_f64() * 1e3,
        npcagent::notify::sink::COALESCE_WINDOW.as_millis()
    );
    println!(
        "baseline: raw POST to the same receiver, {} of {events} arrived: p50 {:.2} ms, p90 {:.2} ms",
        raw.len(),
        r50.as_secs_f64() * 1e3,
        r90.as_secs_f64() * 1e3
    );
    let window = npcagent::notify::sink::COALESCE_WINDOW;
    let work = n50.saturating_sub(window);
    println!(
        "ratio p50 notify/raw: {:.1}; without the window: {:.2} ms, ratio {:.1}; goal p50 <= 1000 ms: {}",
        n50.as_secs_f64() / r50.as_secs_f64(),
        work.as_secs_f64() * 1e3,
        work.as_secs_f64() / r50.as_secs_f64(),
        if n50 <= Duration::from_secs(1) {
            "met"
        } else {
            "NOT met"
        }
    );
}
