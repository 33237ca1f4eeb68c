//! Approve → the tool call proceeds, through the binary: a daemon holds a
//! repository whose profile `dev` asks before `Bash` (`ask_tools`); `npc
//! hook run before_tool` (as an agent CLI's hook runs it, in run `R` of
//! profile `dev`) parks the call; once its approval is pending, `npc runs
//! approve R` answers and the clock stops when the hook process exits with
//! its allow. Baseline, interleaved in the same run: `npc hook run
//! before_tool` for a call nothing asks about (an allow decided without
//! parking, what every tool call of an agent pays). Goal: p50 ≤ 200 ms.
//! Prints p50/p99 of both and the ratio.

#[path = "common/mod.rs"]
mod common;

use std::io::Write as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Answers measured.
const ROUNDS: usize = 40;
/// Longest wait for the daemon, a parked call or a hook's exit.
const WAIT: Duration = Duration::from_secs(30);

fn pct(mut v: Vec<Duration>, p: f64) -> f64 {
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i].as_secs_f64() * 1e3
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let until = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// `npc hook run before_tool` in run `run` for `tool` with `arguments`, started.
fn hook(root: &Path, run: &str, tool: &str, arguments: serde_json::Value) -> Child {
    let mut child = Command::new(common::npc())
        .args(["hook", "run", "before_tool"])
        .current_dir(root)
        .env("NPC_RUN_ID", run)
        .env("NPC_PROFILE", "dev")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("npc hook run starts");
    let input = serde_json::json!({"tool_call": {"id": "c", "name": tool, "arguments": arguments}});
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.to_string().as_bytes())
        .unwrap();
    child
}

/// The hook's exit, which must be an allow.
fn allowed(child: Child) {
    let out = child.wait_with_output().unwrap();
    let answer = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && answer.contains("continue"),
        "not an allow: {answer}"
    );
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::write(
        root.join("npcagent.toml"),
        "version = 1\n[providers.p]\nkind = \"claude_code\"\n[profiles.dev]\nprovider = \"p\"\ndescription = \"asks before Bash\"\nask_tools = [\"Bash\"]\n",
    )
    .unwrap();
    let mut daemon = Command::new(common::npc())
        .arg("daemon")
        .current_dir(root)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until("the daemon", || {
        Command::new(common::npc())
            .arg("status")
            .current_dir(root)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
            && root.join(".npc/daemon.sock").exists()
    });
    // A running run of the repository's queue, as `npc run` records one.
    let store = npcagent::store::Store::open(root.join(".npc/state.db")).unwrap();
    let run = npcagent::runs::new_run_id();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let row = npcagent::store::queue::NewRun::new(
            &run,
            npcagent::runs::MANUAL_QUEUE,
            npcagent::model::RunOrigin::Cli,
            "{}",
        );
        store.enqueue_run(row).await.unwrap();
        assert!(store.claim_run(&run, None).await.unwrap());
    });
    let pending = || {
        store
            .run_approvals(&run, 64)
            .unwrap()
            .iter()
            .any(|a| a.state == "pending")
    };
    let (mut parked, mut bare) = (Vec::new(), Vec::new());
    for i in 0..ROUNDS {
        // An allow decided without parking.
        let t = Instant::now();
        allowed(hook(root, &run, "Read", serde_json::json!({ "path": i })));
        bare.push(t.elapsed());
        // A parked call (arguments differ each time: never `--always`d).
        let child = hook(
            root,
            &run,
            "Bash",
            serde_json::json!({ "command": format!("echo {i}") }),
        );
        wait_until("a pending approval", pending);
        let t = Instant::now();
        let answered = Command::new(common::npc())
            .args(["runs", "approve", &run])
            .current_dir(root)
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(answered.success());
        allowed(child);
        parked.push(t.elapsed());
    }
    let _ = daemon.kill();
    let _ = daemon.wait();
    let (b50, b99, p50, p99) = (
        pct(bare.clone(), 0.5),
        pct(bare, 0.99),
        pct(parked.clone(), 0.5),
        pct(parked, 0.99),
    );
    println!(
        "approve → the tool call proceeds ({ROUNDS} answers): p50 {p50:.1} ms p99 {p99:.1} ms (goal p50 ≤ 200 ms); baseline `npc hook run` allow without parking: p50 {b50:.1} ms p99 {b99:.1} ms; ratio {:.2}",
        p50 / b50
    );
}
