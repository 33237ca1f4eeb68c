//! Parser throughput: MB/s of recorded transcript per provider, through
//! `providers::Parser` in 64 KiB chunks, against a baseline measured in the
//! same run over the same bytes (split lines, `serde_json::from_slice` each
//! into a `serde_json::Value`). Prints the ratio parser / baseline.

use std::hint::black_box;
use std::time::{Duration, Instant};

use npcagent::model::ProviderKind;
use npcagent::providers::{Parser, source_fixtures_root};

/// Size of the generated transcript per provider.
const TRANSCRIPT_BYTES: usize = 16 * 1024 * 1024;
/// Chunk size fed to the parser (a typical pipe read).
const CHUNK_BYTES: usize = 64 * 1024;
/// Timed repetitions; the best is reported.
const ROUNDS: usize = 5;

fn transcript(kind: ProviderKind, version: &str) -> Vec<u8> {
    let dir = source_fixtures_root().join(kind.as_str()).join(version);
    let mut lines = Vec::new();
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .expect("fixture dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    names.sort();
    for p in names {
        lines.extend(std::fs::read(p).expect("fixture"));
    }
    let mut out = Vec::with_capacity(TRANSCRIPT_BYTES + lines.len());
    while out.len() < TRANSCRIPT_BYTES {
        out.extend_from_slice(&lines);
    }
    out
}

fn best(mut f: impl FnMut() -> usize) -> (Duration, usize) {
    let mut best = Duration::MAX;
    let mut count = 0;
    for _ in 0..ROUNDS {
        let t = Instant::now();
        count = black_box(f());
        best = best.min(t.elapsed());
    }
    (best, count)
}

fn mbps(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e6
}

fn main() {
    println!("provider     parser MB/s  baseline MB/s  ratio  events");
    for (kind, version) in [
        (ProviderKind::ClaudeCode, "2.1.197"),
        (ProviderKind::Codex, "0.171.0"),
        (ProviderKind::GeminiCli, "0.61.0"),
        (ProviderKind::Opencode, "1.18.33"),
    ] {
        let data = transcript(kind, version);
        let (base, _) = best(|| {
            let mut n = 0;
            for line in data.split(|b| *b == b'\n') {
                if !line.is_empty() {
                    let v: serde_json::Value = serde_json::from_slice(line).expect("json");
                    n += usize::from(v.is_object());
                }
            }
            n
        });
        let (parse, events) = best(|| {
            let mut p = Parser::new(kind, Some(source_fixtures_root()));
            let mut n = 0;
            for chunk in data.chunks(CHUNK_BYTES) {
                n += p.feed(chunk).len();
            }
            n + p.finish().len()
        });
        let (p, b) = (mbps(data.len(), parse), mbps(data.len(), base));
        println!(
            "{:<12} {p:>11.1}  {b:>13.1}  {:>5.2}  {events}",
            kind.as_str(),
            p / b
        );
    }
}
