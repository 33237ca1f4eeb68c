//! `npc acp` prompt latency: from the moment a `session/prompt` frame is
//! written to `npc acp`'s stdin to the first `session/update` read from its
//! stdout, against the fake agent's own first output in the same run (the
//! agent, `fixtures/acp/timed-agent.py`, stamps CLOCK_MONOTONIC as it writes
//! its first line; the bench reads the same clock). The difference is what
//! npc adds on top of the agent: reading the pipe, parsing the provider's
//! line, mapping it to an ACP update and writing the frame. Both are
//! measured from the prompt, so the agent's figure includes preparing the
//! run and starting the agent. Prints p50/p99 of both, the added time and
//! the ratio — once with the run in `npc acp` itself, then with a daemon
//! holding the repository (the run is the daemon's, its events followed in
//! the store by `npc acp`).

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

/// Prompts measured (one `npc acp` process, one session).
const PROMPTS: usize = 40;

fn now_ns() -> i128 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("monotonic clock");
    i128::from(t.tv_sec()) * 1_000_000_000 + i128::from(t.tv_nsec())
}

fn pct(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // The `npc` binary Cargo built for this bench (release with `cargo bench`).
    let npc = Path::new(env!("CARGO_BIN_EXE_npc"));
    let dir = tempfile::tempdir().unwrap();
    let stamp = dir.path().join("first-output");
    let manifest = format!(
        r#"version = 1
[daemon]
listen = "127.0.0.1:0"
[providers.timed]
kind = "claude_code"
command = {agent}
env = {{ TIMED_AGENT_FILE = {stamp}, TIMED_AGENT_FIXTURE = {fixture} }}
[profiles.bench]
provider = "timed"
description = "latency"
"#,
        agent = json!(root.join("fixtures/acp/timed-agent.py")),
        stamp = json!(stamp),
        fixture = json!(root.join("fixtures/clis/claude_code/2.1.197/tool_call.jsonl")),
    );
    std::fs::write(dir.path().join("npcagent.toml"), manifest).unwrap();
    let (agent_ms, update_ms) = measure(npc, dir.path(), &stamp, "acp");
    report("in npc acp", npc, agent_ms, update_ms);
    // The same prompts with a daemon holding the repository: each is the
    // daemon's run, followed by `npc acp` in the store.
    let log = dir.path().join("daemon.log");
    let mut daemon = Command::new(npc)
        .arg("daemon")
        .current_dir(dir.path())
        .env("XDG_DATA_HOME", dir.path().join("data"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("npc daemon: startup")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the daemon did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let (agent_ms, update_ms) = measure(npc, dir.path(), &stamp, "daemon");
    report("in the daemon", npc, agent_ms, update_ms);
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = daemon.wait();
}

/// [`PROMPTS`] prompts in one session of a new `npc acp` in `dir`, each of
/// which must have run where `ran_in` says: the agent's first output and
/// the first update, in ms after the prompt was written.
fn measure(npc: &Path, dir: &Path, stamp: &Path, ran_in: &str) -> (Vec<f64>, Vec<f64>) {
    let mut child = Command::new(npc)
        .args(["acp", "--profile", "bench"])
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut send = move |v: Value| {
        stdin.write_all(format!("{v}\n").as_bytes()).unwrap();
        stdin.flush().unwrap();
    };
    let mut read = || -> Value {
        let mut line = String::new();
        assert!(stdout.read_line(&mut line).unwrap() > 0, "npc acp ended");
        serde_json::from_str(&line).unwrap()
    };
    send(json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}}));
    while read()["id"] != 0 {}
    send(
        json!({"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":dir,"mcpServers":[]}}),
    );
    let session = loop {
        let v = read();
        if v["id"] == 1 {
            break v["result"]["sessionId"].as_str().unwrap().to_string();
        }
    };
    let (mut agent_ms, mut update_ms) = (Vec::new(), Vec::new());
    for i in 0..PROMPTS {
        let id = 100 + i as i64;
        let _ = std::fs::remove_file(stamp);
        let sent = now_ns();
        send(json!({"jsonrpc":"2.0","id":id,"method":"session/prompt",
            "params":{"sessionId":session,"prompt":[{"type":"text","text":"list"}]}}));
        let mut first: Option<i128> = None;
        loop {
            let v = read();
            if first.is_none()
                && v["method"] == "session/update"
                && v["params"]["update"]["sessionUpdate"] != "available_commands_update"
            {
                first = Some(now_ns());
            }
            if v["id"] == id {
                assert_eq!(v["result"]["_meta"]["npc"]["ranIn"], ran_in, "{v}");
                break;
            }
        }
        let agent: i128 = std::fs::read_to_string(stamp)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        agent_ms.push((agent - sent) as f64 / 1e6);
        update_ms.push((first.expect("an update") - sent) as f64 / 1e6);
    }
    drop(send);
    let _ = child.wait();
    (agent_ms, update_ms)
}

fn report(label: &str, npc: &Path, agent_ms: Vec<f64>, update_ms: Vec<f64>) {
    let (a50, a99, u50, u99) = (
        pct(agent_ms.clone(), 0.5),
        pct(agent_ms, 0.99),
        pct(update_ms.clone(), 0.5),
        pct(update_ms, 0.99),
    );
    println!(
        "acp prompt→first update, run {label} ({PROMPTS} prompts, {}): agent's own first output p50 {a50:.2} ms p99 {a99:.2} ms; first session/update p50 {u50:.2} ms p99 {u99:.2} ms; npc adds p50 {:.2} ms; ratio {:.3}",
        npc.display(),
        u50 - a50,
        u50 / a50
    );
}
