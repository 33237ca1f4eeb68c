//! The sandbox's costs. Spawning: `true` run directly, through the
//! contained stub (`npc __contain -- true`: PID namespace), and through the
//! stub with a `workspace` sandbox (user, PID and mount namespaces, npc's
//! state bound read-only, the complement walk, Landlock) and a `strict` one (also a network namespace and the
//! forwarder), wall time from spawn to exit. The proxy: one plain HTTP
//! request to a loopback server, direct over TCP against through npc's
//! egress proxy on a unix socket (admission, connect, relay). Prints p50
//! and p99 of each and the added time at p50.

use std::io::{Read as _, Write as _};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use npcagent::model::HostPattern;
use npcagent::supervisor::{Egress, SandboxSpec};
use npcagent::surfaces::egress::{EgressPolicy, serve};

/// Spawns measured per variant.
const SPAWNS: usize = 60;
/// Requests measured per path.
const REQUESTS: usize = 300;

fn pct(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn time_spawns(mut make: impl FnMut() -> Command) -> Vec<f64> {
    (0..SPAWNS)
        .map(|_| {
            let started = Instant::now();
            let status = make()
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .expect("spawn");
            assert!(status.success(), "{status}");
            started.elapsed().as_secs_f64() * 1000.0
        })
        .collect()
}

fn row(name: &str, v: Vec<f64>, base: f64) -> f64 {
    if base == 0.0 {
        let (p50, p99) = (pct(v.clone(), 0.5), pct(v, 0.99));
        println!("| {name} | {p50:.2} ms | {p99:.2} ms | (baseline) |");
        return p50;
    }
    let (p50, p99) = (pct(v.clone(), 0.5), pct(v, 0.99));
    println!(
        "| {name} | {p50:.2} ms | {p99:.2} ms | {:+.2} ms |",
        p50 - base
    );
    p50
}

fn main() {
    let npc = Path::new(env!("CARGO_BIN_EXE_npc"));
    // The hidden home below Cargo's target directory: its siblings are
    // few, as a real home's are (a home below a crowded `/tmp` makes the
    // complement walk grant each of its entries; `SANDBOX_BENCH_IN_TMP=1`
    // measures that).
    let dir = match std::env::var_os("SANDBOX_BENCH_IN_TMP") {
        Some(_) => tempfile::tempdir().unwrap(),
        None => tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap(),
    };
    let home = dir.path().join("home");
    let work = dir.path().join("work");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    // npc's state, bound read-only in the run's mount namespace.
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let workspace = SandboxSpec {
        hidden: vec![home.clone()],
        read: vec![],
        write: vec![work.clone()],
        write_new: vec![],
        read_only: vec![state],
        egress: None,
    };
    let strict = SandboxSpec {
        egress: Some(Egress {
            socket: dir.path().join("egress.sock"),
            port: 3128,
        }),
        ..workspace.clone()
    };
    println!("| spawn `true` | p50 | p99 | added at p50 |");
    println!("|---|---:|---:|---:|");
    let direct = time_spawns(|| Command::new("true"));
    let base = row("directly", direct, 0.0);
    let stub = time_spawns(|| {
        let mut c = Command::new(npc);
        c.args(["__contain", "--", "true"]);
        c
    });
    let stub = row("stub (PID namespace)", stub, base);
    for (name, spec) in [
        ("stub + `workspace`", &workspace),
        ("stub + `strict`", &strict),
    ] {
        let arg = spec.to_arg();
        let v = time_spawns(|| {
            let mut c = Command::new(npc);
            c.arg("__contain")
                .arg("--sandbox")
                .arg(&arg)
                .args(["--", "true"]);
            c
        });
        row(name, v, stub);
    }

    // The proxy.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = server.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in server.incoming() {
            let Ok(mut conn) = conn else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 2048];
                let _ = conn.read(&mut buf);
                let _ = conn.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
                );
            });
        }
    });
    let socket = dir.path().join("proxy.sock");
    let listener = {
        let _enter = rt.enter();
        tokio::net::UnixListener::bind(&socket).unwrap()
    };
    let policy = Arc::new(EgressPolicy {
        allow: vec![HostPattern {
            host: "127.0.0.1".into(),
            subdomains: false,
            port: Some(port),
        }],
    });
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    rt.spawn(serve(listener, policy, tx));
    rt.spawn(async move { while rx.recv().await.is_some() {} });
    let request = |stream: &mut dyn ReadWrite, target: &str| {
        let head = format!("GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
        stream.write_all(head.as_bytes()).unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).unwrap();
        assert!(
            answer.ends_with(b"ok"),
            "{}",
            String::from_utf8_lossy(&answer)
        );
    };
    let time = |f: &dyn Fn()| -> Vec<f64> {
        (0..REQUESTS)
            .map(|_| {
                let started = Instant::now();
                f();
                started.elapsed().as_secs_f64() * 1000.0
            })
            .collect()
    };
    let direct = time(&|| {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        request(&mut s, "/");
    });
    let proxied = time(&|| {
        let mut s = std::os::unix::net::UnixStream::connect(&socket).unwrap();
        request(&mut s, &format!("http://127.0.0.1:{port}/"));
    });
    println!();
    println!("| HTTP request on loopback | p50 | p99 | added at p50 |");
    println!("|---|---:|---:|---:|");
    let base = row("direct", direct, 0.0);
    row("through the egress proxy", proxied, base);
}

trait ReadWrite: std::io::Read + std::io::Write {}
impl<T: std::io::Read + std::io::Write> ReadWrite for T {}
