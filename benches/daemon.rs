//! Benchmark: the daemon as a user runs it (the release `npc` binary on a
//! temporary repository). Edit-to-applied latency for a one-field change in
//! a 500-component manifest, minus the debounce, beside the in-process cost
//! of loading and planning that manifest (the raw operation); then CPU time
//! and resident memory of the idle daemon.
//!
//! Run: `cargo bench --bench daemon` (`NPC_BENCH_IDLE_SECS` sets the idle
//! window, default 60).

#[path = "common/mod.rs"]
mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use npcagent::disk::ProcessEnv;
use npcagent::plan::{self, ExternalInputs};
use npcagent::runtime::watch::DEBOUNCE;
use npcagent::store::Store;

/// Edits measured.
const EDITS: usize = 20;
/// Components in the manifest.
const COMPONENTS: usize = 500;
/// Longest wait for one reload.
const RELOAD_LIMIT: Duration = Duration::from_secs(30);

fn manifest(edit: usize) -> String {
    let mut s =
        String::from("version = 1\n[mcp.servers.proc]\ncommand = \"sleep\"\nargs = [\"100000\"]\n");
    for i in 0..(COMPONENTS - 3) / 2 {
        let text = if i == 7 {
            format!("edit {edit}")
        } else {
            "steady".to_string()
        };
        s += &format!("[prompts.p{i}]\ntemplate = \"{text} {{{{ project.name }}}}\"\n");
        s += &format!("[providers.v{i}]\nkind = \"codex\"\n");
    }
    s
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn proc_cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(") ").map(|x| x.1).unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    fields
        .get(11)
        .and_then(|u| u.parse::<u64>().ok())
        .unwrap_or(0)
        + fields
            .get(12)
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(0)
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn wait_applied(store: &Store, after: i64) -> (i64, i64) {
    let deadline = Instant::now() + RELOAD_LIMIT;
    let mut last = after;
    loop {
        for e in store
            .wait_for_events_after(last, 1000, Duration::from_millis(200))
            .unwrap()
        {
            last = e.id;
            if e.kind == "reconcile.applied" {
                return (e.id, e.ts_ms);
            }
        }
        assert!(
            Instant::now() < deadline,
            "no reload within {RELOAD_LIMIT:?}"
        );
    }
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let path = root.join("npcagent.toml");
    std::fs::write(&path, manifest(0)).unwrap();

    // The raw operation: load + validate + plan the same manifest in process.
    let raw = {
        let mut samples: Vec<Duration> = (0..EDITS)
            .map(|i| {
                std::fs::write(&path, manifest(i)).unwrap();
                let t = Instant::now();
                let loaded = npcagent::plugins::files::load_path(&path, &ProcessEnv).unwrap();
                let m = loaded.manifest.expect("valid");
                let d = plan::desired(&m, &ExternalInputs::default());
                let _ = plan::plan(&d, &plan::ObservedState::new());
                t.elapsed()
            })
            .collect();
        samples.sort();
        samples[samples.len() / 2]
    };
    std::fs::write(&path, manifest(0)).unwrap();

    let mut daemon = Command::new(common::npc())
        .arg("daemon")
        .current_dir(root)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let db = root.join(".npc/state.db");
    let deadline = Instant::now() + RELOAD_LIMIT;
    // Until the daemon has made its store: a file without tables yet is one
    // it is creating (`NotFound` as well).
    let store = loop {
        match Store::open_read_only(&db) {
            Ok(store) => break store,
            Err(npcagent::store::StoreError::NotFound { .. }) => {
                assert!(Instant::now() < deadline, "daemon did not start");
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("{e}"),
        }
    };
    let (mut mark, _) = wait_applied(&store, 0);

    let mut latencies = Vec::new();
    for i in 1..=EDITS {
        let tmp = root.join(".npcagent.toml.tmp");
        std::fs::write(&tmp, manifest(i)).unwrap();
        let t0 = now_ms();
        std::fs::rename(&tmp, &path).unwrap();
        let (id, ts) = wait_applied(&store, mark);
        mark = id;
        latencies.push(ts - t0 - DEBOUNCE.as_millis() as i64);
    }
    latencies.sort();
    let median = latencies[latencies.len() / 2];
    println!("== edit → applied, {COMPONENTS} components, one prompt edited ({EDITS} edits) ==");
    println!(
        "  debounce                   {:>6} ms (subtracted)",
        DEBOUNCE.as_millis()
    );
    println!(
        "  latency minus debounce     {:>6} ms median, {} ms min, {} ms max",
        median,
        latencies[0],
        latencies[latencies.len() - 1]
    );
    println!(
        "  in-process load+plan       {:>6.2} ms (the raw operation)",
        raw.as_secs_f64() * 1e3
    );
    println!(
        "  ratio                      {:>6.2}x",
        median as f64 / (raw.as_secs_f64() * 1e3)
    );

    let idle: u64 = std::env::var("NPC_BENCH_IDLE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let pid = daemon.id();
    let hz = 100.0; // USER_HZ on Linux
    let before = proc_cpu_ticks(pid);
    std::thread::sleep(Duration::from_secs(idle));
    let after = proc_cpu_ticks(pid);
    println!("== idle daemon over {idle} s ==");
    println!(
        "  CPU time                   {:>6.2} s ({:.3}% of one core)",
        (after - before) as f64 / hz,
        (after - before) as f64 / hz / idle as f64 * 100.0
    );
    println!(
        "  resident memory            {:>6.1} MiB",
        rss_kib(pid) as f64 / 1024.0
    );
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = daemon.wait();
}
