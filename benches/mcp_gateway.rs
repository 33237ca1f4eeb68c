//! The MCP gateway's cost, measured in one run against its same-run
//! baseline: `tools/call` of server-everything's `echo` directly (client →
//! server-everything) and through `npc mcp serve` (client → gateway →
//! server-everything), over stdio and over streamable HTTP, the two paths'
//! sequential calls alternating so both see the same load. Prints p50/p99
//! per call, the added latency, and calls/s with 1 and [`CONCURRENT`]
//! concurrent callers (stdio: callers sharing the one session a stdio
//! server has; HTTP: one session each). Then the gateway's start-up to
//! ready (its `initialize` answer) with [`STARTUP_SERVERS`] upstream stdio
//! servers that each take [`START_DELAY_MS`] to initialize, against one such
//! server: the ratio shows start-up is bounded by the slowest server, not
//! the sum.
//!
//! The client is rmcp's, in this process. server-everything comes from npm
//! (`.ci/run`); its HTTP transport is bound to 127.0.0.1 by
//! `fixtures/mcp/loopback.cjs`. Skips with a message when it is missing.

#[path = "common/mod.rs"]
mod common;
use common::{installed, npc};

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use npcagent::surfaces::mcp_http::client_transport;
use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::{RoleClient, ServiceExt};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Calls measured one after another per path.
const CALLS: usize = 2000;
/// Calls before measuring (JIT warm-up of the node server, connection set-up).
const WARMUP: usize = 300;
/// Concurrent callers in the throughput measurement.
const CONCURRENT: usize = 16;
/// Calls per caller in the throughput measurement.
const CALLS_PER_CALLER: usize = 250;
/// Upstream servers in the start-up measurement.
const STARTUP_SERVERS: usize = 20;
/// How long each start-up server takes to answer `initialize`.
const START_DELAY_MS: u64 = 500;
/// Start-up runs per configuration (the median is reported).
const STARTUP_RUNS: usize = 3;
/// Longest any step may take.
const LIMIT: Duration = Duration::from_secs(120);

type Client = RunningService<RoleClient, ()>;

fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A client of the stdio server `command` runs (killed with the child).
async fn stdio_client(mut command: Command) -> (Client, Child) {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("the server starts");
    let io = (
        child.stdout.take().expect("piped"),
        child.stdin.take().expect("piped"),
    );
    let client = tokio::time::timeout(LIMIT, ().serve(io))
        .await
        .expect("initialize in time")
        .expect("initialize");
    (client, child)
}

async fn http_client(url: &str, bearer: Option<String>) -> Client {
    let transport = client_transport(url, &BTreeMap::new(), bearer).expect("a transport");
    tokio::time::timeout(LIMIT, ().serve(transport))
        .await
        .expect("initialize in time")
        .expect("initialize")
}

fn echo(tool: &str) -> CallToolRequestParams {
    let mut args = serde_json::Map::new();
    args.insert("message".into(), "hello".into());
    CallToolRequestParams::new(tool.to_string()).with_arguments(args)
}

async fn call(client: &Client, tool: &str) {
    let result = client.peer().call_tool(echo(tool)).await.expect("a result");
    assert_ne!(result.is_error, Some(true), "{result:?}");
}

/// Per-call latencies of [`CALLS`] sequential calls on each path, sorted,
/// the two paths alternating call by call so that both see the same
/// machine (a load spike costs both, not one).
async fn sequential(direct: (&Client, &str), gateway: (&Client, &str)) -> [Vec<Duration>; 2] {
    for _ in 0..WARMUP {
        call(direct.0, direct.1).await;
        call(gateway.0, gateway.1).await;
    }
    let mut times = [Vec::with_capacity(CALLS), Vec::with_capacity(CALLS)];
    for _ in 0..CALLS {
        for (path, (client, tool)) in [direct, gateway].into_iter().enumerate() {
            let t = Instant::now();
            call(client, tool).await;
            times[path].push(t.elapsed());
        }
    }
    for path in &mut times {
        path.sort();
    }
    times
}

/// Calls per second of [`CONCURRENT`] callers, each on its own client.
async fn throughput(clients: &[Arc<Client>], tool: &str) -> f64 {
    let t = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for client in clients {
        let (client, tool) = (client.clone(), tool.to_string());
        tasks.spawn(async move {
            for _ in 0..CALLS_PER_CALLER {
                call(&client, &tool).await;
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("a caller finished");
    }
    (clients.len() * CALLS_PER_CALLER) as f64 / t.elapsed().as_secs_f64()
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

struct Measured {
    seq: Vec<Duration>,
    one: f64,
    many: f64,
}

/// Both paths: sequential latencies (interleaved), then calls/s with one
/// and with every caller, path after path.
async fn measure(
    direct: (Vec<Arc<Client>>, &str),
    gateway: (Vec<Arc<Client>>, &str),
) -> [Measured; 2] {
    let [direct_seq, gateway_seq] =
        sequential((&direct.0[0], direct.1), (&gateway.0[0], gateway.1)).await;
    let mut out = Vec::new();
    for ((clients, tool), seq) in [(direct, direct_seq), (gateway, gateway_seq)] {
        let one = throughput(&clients[..1], tool).await;
        let many = throughput(&clients, tool).await;
        out.push(Measured { seq, one, many });
    }
    let gateway = out.pop().expect("two paths");
    let direct = out.pop().expect("two paths");
    [direct, gateway]
}

fn report(transport: &str, direct: &Measured, gateway: &Measured) {
    let (d50, d99) = (pct(&direct.seq, 0.5), pct(&direct.seq, 0.99));
    let (g50, g99) = (pct(&gateway.seq, 0.5), pct(&gateway.seq, 0.99));
    println!(
        "{transport}: direct p50 {:.3} ms p99 {:.3} ms | gateway p50 {:.3} ms p99 {:.3} ms | added p50 {:.3} ms p99 {:.3} ms",
        ms(d50),
        ms(d99),
        ms(g50),
        ms(g99),
        ms(g50) - ms(d50),
        ms(g99) - ms(d99)
    );
    println!(
        "{transport}: calls/s 1 caller direct {:.0} gateway {:.0} (ratio {:.2}) | {CONCURRENT} callers direct {:.0} gateway {:.0} (ratio {:.2})",
        direct.one,
        gateway.one,
        gateway.one / direct.one,
        direct.many,
        gateway.many,
        gateway.many / direct.many
    );
}

/// A repository whose manifest is `manifest`.
fn repo(manifest: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a temp dir");
    std::fs::write(dir.path().join("npcagent.toml"), manifest).expect("a manifest");
    dir
}

fn gateway_command(dir: &Path, http: Option<&str>) -> Command {
    let mut command = Command::new(npc());
    command.args(["mcp", "serve"]).current_dir(dir);
    if let Some(addr) = http {
        command.args(["--http", addr]);
    }
    command
}

async fn stdio_paths() {
    let clients = |n| async move {
        let mut out = Vec::new();
        let (client, child) = stdio_client(Command::new("mcp-server-everything")).await;
        let client = Arc::new(client);
        for _ in 0..n {
            out.push(client.clone());
        }
        (out, child)
    };
    let (direct_clients, _direct) = clients(CONCURRENT).await;
    let dir = repo("version = 1\n[mcp.servers.everything]\ncommand = \"mcp-server-everything\"\n");
    let (client, _gateway) = stdio_client(gateway_command(dir.path(), None)).await;
    let client = Arc::new(client);
    let [direct, gateway] = measure(
        (direct_clients, "echo"),
        (vec![client; CONCURRENT], "everything__echo"),
    )
    .await;
    report("stdio", &direct, &gateway);
}

/// A free loopback port (bound, then released for the server to take).
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    listener.local_addr().expect("an address").port()
}

/// Wait for a stderr line containing `marker`; the rest of the line after it.
async fn line_after(child: &mut Child, marker: &str) -> String {
    let mut lines = BufReader::new(child.stderr.take().expect("piped")).lines();
    let found = tokio::time::timeout(LIMIT, async {
        while let Some(line) = lines.next_line().await.expect("stderr") {
            if let Some((_, rest)) = line.split_once(marker) {
                return rest.trim().to_string();
            }
        }
        panic!("the server exited before `{marker}`")
    })
    .await
    .expect("the server listens in time");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    found
}

async fn http_paths() {
    let port = free_port();
    let preload = repo_root().join("fixtures/mcp/loopback.cjs");
    let mut server = Command::new("mcp-server-everything")
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .env("NODE_OPTIONS", format!("--require {}", preload.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("server-everything starts");
    line_after(&mut server, "listening on port").await;
    let url = format!("http://127.0.0.1:{port}/mcp");
    let mut direct_clients = Vec::new();
    for _ in 0..CONCURRENT {
        direct_clients.push(Arc::new(http_client(&url, None).await));
    }
    let dir = repo(&format!(
        "version = 1\n[mcp.servers.everything]\nurl = \"{url}\"\n"
    ));
    let mut gateway = gateway_command(dir.path(), Some("127.0.0.1:0"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the gateway starts");
    let gateway_url = line_after(&mut gateway, "listening on ").await;
    // The gateway wants the repository's token (made when it started).
    let token = std::fs::read_to_string(dir.path().join(".npc/api.token"))
        .expect("the gateway's token")
        .trim()
        .to_string();
    let mut clients = Vec::new();
    for _ in 0..CONCURRENT {
        clients.push(Arc::new(
            http_client(&gateway_url, Some(token.clone())).await,
        ));
    }
    let [direct, through] = measure((direct_clients, "echo"), (clients, "everything__echo")).await;
    report("http", &direct, &through);
}

/// Spawn to `initialize` answered, for a gateway with `servers` slow servers.
async fn startup(servers: usize) -> Duration {
    let hostile = repo_root().join("fixtures/mcp/hostile.py");
    let mut manifest = String::from("version = 1\n");
    for i in 0..servers {
        manifest.push_str(&format!(
            "[mcp.servers.s{i}]\ncommand = \"python3\"\nargs = [{:?}]\nenv = {{ HOSTILE_START_DELAY_MS = \"{START_DELAY_MS}\" }}\n",
            hostile.display().to_string()
        ));
    }
    let dir = repo(&manifest);
    let mut runs = Vec::new();
    for _ in 0..STARTUP_RUNS {
        let t = Instant::now();
        let (client, child) = stdio_client(gateway_command(dir.path(), None)).await;
        runs.push(t.elapsed());
        let tools = client.peer().list_all_tools().await.expect("tools");
        assert_eq!(tools.len(), servers * 8, "every server connected");
        drop(client);
        drop(child);
    }
    runs.sort();
    runs[runs.len() / 2]
}

/// Baseline: the same `servers` slow servers started directly, all at
/// once, each initialized by its own client in this process.
async fn direct_startup(servers: usize) -> Duration {
    let hostile = repo_root().join("fixtures/mcp/hostile.py");
    let mut runs = Vec::new();
    for _ in 0..STARTUP_RUNS {
        let t = Instant::now();
        let mut starting = tokio::task::JoinSet::new();
        for _ in 0..servers {
            let mut command = Command::new("python3");
            command
                .arg(&hostile)
                .env("HOSTILE_START_DELAY_MS", START_DELAY_MS.to_string());
            starting.spawn(stdio_client(command));
        }
        let started = starting.join_all().await;
        runs.push(t.elapsed());
        drop(started);
    }
    runs.sort();
    runs[runs.len() / 2]
}

async fn startup_paths() {
    let one = startup(1).await;
    let many = startup(STARTUP_SERVERS).await;
    let direct = direct_startup(STARTUP_SERVERS).await;
    println!(
        "startup: gateway with 1 server ({START_DELAY_MS} ms to initialize) {:.0} ms | with {STARTUP_SERVERS} servers {:.0} ms | ratio {:.2} (the sum would be {STARTUP_SERVERS})",
        ms(one),
        ms(many),
        many.as_secs_f64() / one.as_secs_f64(),
    );
    println!(
        "startup: the {STARTUP_SERVERS} servers started directly, all at once: {:.0} ms | gateway vs direct ratio {:.2}",
        ms(direct),
        many.as_secs_f64() / direct.as_secs_f64()
    );
}

fn main() {
    // `cargo bench` passes `--bench`; any other argument filters like a name.
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
        if wanted("startup") {
            startup_paths().await;
        }
        if !installed("mcp-server-everything") {
            println!(
                "skipped the call paths: `mcp-server-everything` is not installed (`npm install -g @modelcontextprotocol/server-everything`)"
            );
            return;
        }
        if wanted("stdio") {
            stdio_paths().await;
        }
        if wanted("http") {
            http_paths().await;
        }
    });
}
