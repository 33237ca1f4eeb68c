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
//!
//! With `NPC_BASELINE_BIN=path/to/another/npc`, that build's gateway is a
//! third path of the same run (its own repository), its calls interleaved
//! with the other two, the two gateways' order swapped every call: the
//! same-run comparison of two builds under the same load.

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
/// the paths alternating call by call so that all see the same machine (a
/// load spike costs each, not one). The first path (direct) goes first; the
/// others' order rotates every call, so none pays for its place.
async fn sequential(paths: &[(&Client, &str)]) -> Vec<Vec<Duration>> {
    for _ in 0..WARMUP {
        for (client, tool) in paths {
            call(client, tool).await;
        }
    }
    let mut times = vec![Vec::with_capacity(CALLS); paths.len()];
    let others = paths.len() - 1;
    for i in 0..CALLS {
        let order = std::iter::once(0).chain((0..others).map(|k| 1 + (k + i) % others.max(1)));
        for path in order {
            let (client, tool) = paths[path];
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

/// One path a call can take: its name, its clients and the tool's name there.
struct Route {
    name: &'static str,
    clients: Vec<Arc<Client>>,
    tool: &'static str,
}

/// Every path: sequential latencies (interleaved), then calls/s with one
/// and with every caller, path after path.
async fn measure(routes: &[Route]) -> Vec<Measured> {
    let firsts: Vec<(&Client, &str)> = routes
        .iter()
        .map(|r| (r.clients[0].as_ref(), r.tool))
        .collect();
    let seqs = sequential(&firsts).await;
    let mut out = Vec::new();
    for (route, seq) in routes.iter().zip(seqs) {
        let one = throughput(&route.clients[..1], route.tool).await;
        let many = throughput(&route.clients, route.tool).await;
        out.push(Measured { seq, one, many });
    }
    out
}

/// The first route is the direct one; every other is a gateway.
fn report(transport: &str, routes: &[Route], measured: &[Measured]) {
    let direct = &measured[0];
    let (d50, d99) = (pct(&direct.seq, 0.5), pct(&direct.seq, 0.99));
    for (route, gateway) in routes.iter().zip(measured).skip(1) {
        let name = route.name;
        let (g50, g99) = (pct(&gateway.seq, 0.5), pct(&gateway.seq, 0.99));
        println!(
            "{transport}: direct p50 {:.3} ms p99 {:.3} ms | {name} p50 {:.3} ms p99 {:.3} ms | added p50 {:.3} ms p99 {:.3} ms",
            ms(d50),
            ms(d99),
            ms(g50),
            ms(g99),
            ms(g50) - ms(d50),
            ms(g99) - ms(d99)
        );
        println!(
            "{transport}: calls/s 1 caller direct {:.0} {name} {:.0} (ratio {:.2}) | {CONCURRENT} callers direct {:.0} {name} {:.0} (ratio {:.2})",
            direct.one,
            gateway.one,
            gateway.one / direct.one,
            direct.many,
            gateway.many,
            gateway.many / direct.many
        );
    }
}

/// The gateways to measure: this build's, and `NPC_BASELINE_BIN`'s when set.
fn gateways() -> Vec<(&'static str, std::path::PathBuf)> {
    let mut out = vec![("gateway", npc())];
    if let Some(base) = std::env::var_os("NPC_BASELINE_BIN") {
        out.push(("baseline", base.into()));
    }
    out
}

/// A repository whose manifest is `manifest`.
fn repo(manifest: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a temp dir");
    std::fs::write(dir.path().join("npcagent.toml"), manifest).expect("a manifest");
    dir
}

fn gateway_command(bin: &Path, dir: &Path, http: Option<&str>) -> Command {
    let mut command = Command::new(bin);
    command.args(["mcp", "serve"]).current_dir(dir);
    if let Some(addr) = http {
        command.args(["--http", addr]);
    }
    command
}

/// One stdio session shared by every concurrent caller (stdio has one pipe).
fn shared<T>(client: T) -> Vec<Arc<T>> {
    let client = Arc::new(client);
    (0..CONCURRENT).map(|_| Arc::clone(&client)).collect()
}

async fn stdio_paths() {
    let (client, _direct) = stdio_client(Command::new("mcp-server-everything")).await;
    let mut routes = vec![Route {
        name: "direct",
        clients: shared(client),
        tool: "echo",
    }];
    let mut kept = Vec::new();
    for (name, bin) in gateways() {
        let dir =
            repo("version = 1\n[mcp.servers.everything]\ncommand = \"mcp-server-everything\"\n");
        let (client, child) = stdio_client(gateway_command(&bin, dir.path(), None)).await;
        kept.push((dir, child));
        routes.push(Route {
            name,
            clients: shared(client),
            tool: "everything__echo",
        });
    }
    let measured = measure(&routes).await;
    report("stdio", &routes, &measured);
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
    let mut routes = vec![Route {
        name: "direct",
        clients: direct_clients,
        tool: "echo",
    }];
    let mut kept = Vec::new();
    for (name, bin) in gateways() {
        let dir = repo(&format!(
            "version = 1\n[mcp.servers.everything]\nurl = \"{url}\"\n"
        ));
        let mut gateway = gateway_command(&bin, dir.path(), Some("127.0.0.1:0"))
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
        kept.push((dir, gateway));
        routes.push(Route {
            name,
            clients,
            tool: "everything__echo",
        });
    }
    let measured = measure(&routes).await;
    report("http", &routes, &measured);
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
        let (client, child) = stdio_client(gateway_command(&npc(), dir.path(), None)).await;
        runs.push(t.elapsed());
        // Every server's tools are offered (beside npc's own built-ins).
        let tools = client.peer().list_all_tools().await.expect("tools");
        for i in 0..servers {
            let prefix = format!("s{i}__");
            assert!(
                tools.iter().any(|t| t.name.starts_with(&prefix)),
                "server `s{i}` connected"
            );
        }
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
    // The client's runtime: two workers unless `MCP_BENCH_CLIENT_THREADS` says
    // otherwise (1: a current-thread runtime, whose client never wakes a
    // second worker that competes with the gateway for the cores).
    let threads: usize = std::env::var("MCP_BENCH_CLIENT_THREADS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(2);
    let rt = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
            .expect("a runtime")
    };
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
