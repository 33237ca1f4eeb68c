//! The ACP client's cost per `session/update` under a flood: the four real
//! agents' recorded updates (`fixtures/acp/recorded/*-turn.jsonl`, the
//! frames they sent during a turn), repeated to [`UPDATES`], fed line by
//! line to `providers::acp::Client` (classify, typed parse, map to agent
//! events), against a baseline over the same bytes in the same run:
//! `serde_json::from_slice` of each line into a `serde_json::Value`.
//! Prints ns per update for both and the ratio client / baseline.

use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use npcagent::providers::acp::{Client, Start};
use serde_json::{Value, json};

/// Updates fed per round.
const UPDATES: usize = 200_000;
/// Timed repetitions; the best is reported.
const ROUNDS: usize = 5;

/// The recorded `session/update` frames of the agents' turns, with their
/// session ids made `bench`.
fn updates() -> Vec<Vec<u8>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/acp/recorded");
    let mut frames = Vec::new();
    for agent in ["claude", "codex", "gemini", "opencode"] {
        let text =
            std::fs::read_to_string(dir.join(format!("{agent}-turn.jsonl"))).expect("recording");
        for line in text.lines() {
            let record: Value = serde_json::from_str(line).expect("record");
            let mut frame = record["frame"].clone();
            if record["dir"] == "in" && frame["method"] == "session/update" {
                frame["params"]["sessionId"] = json!("bench");
                frames.push(serde_json::to_vec(&frame).expect("frame"));
            }
        }
    }
    assert!(!frames.is_empty());
    frames.iter().cycle().take(UPDATES).cloned().collect()
}

/// A client with session `bench` open, prompting.
fn client() -> Client {
    let mut c = Client::new(Start {
        cwd: PathBuf::from("/repo"),
        prompt: "bench".to_string(),
        mcp_servers: Vec::new(),
        resume: None,
        mode: None,
        model: None,
        tool_for_kind: Default::default(),
    });
    c.begin();
    let init =
        json!({"jsonrpc":"2.0","id":1,"result":{"protocolVersion":1,"agentCapabilities":{}}});
    c.feed(&serde_json::to_vec(&init).unwrap());
    let new = json!({"jsonrpc":"2.0","id":2,"result":{"sessionId":"bench"}});
    c.feed(&serde_json::to_vec(&new).unwrap());
    c
}

fn best(mut f: impl FnMut() -> usize) -> (Duration, usize) {
    let mut best = Duration::MAX;
    let mut count = 0;
    for _ in 0..ROUNDS {
        let t = Instant::now();
        count = f();
        best = best.min(t.elapsed());
    }
    (best, count)
}

fn main() {
    let lines = updates();
    let (base, parsed) = best(|| {
        lines
            .iter()
            .filter(|l| serde_json::from_slice::<Value>(black_box(l)).is_ok())
            .count()
    });
    let (ours, events) = best(|| {
        let mut c = client();
        lines
            .iter()
            .map(|l| black_box(c.feed(black_box(l))).len())
            .sum()
    });
    let per = |d: Duration| d.as_nanos() as f64 / lines.len() as f64;
    println!(
        "acp client: {} updates ({} events): {:.0} ns/update; baseline serde_json::Value {:.0} ns/update ({parsed} parsed); ratio {:.2}",
        lines.len(),
        events,
        per(ours),
        per(base),
        per(ours) / per(base)
    );
}
