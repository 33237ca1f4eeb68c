//! Benchmark: peak resident memory of `npc validate` on hostile manifests of
//! about 8 MB (the size limit), against the budget of 20 × the file size +
//! 20 MB. Worst cases: an array of millions of ints, tens of thousands of
//! tables, strings at the string bound, deep inline tables, the same shapes
//! just under the item bound, JSON, and large documents with one error at
//! their end (parsed a second time, by the toml crate, for their
//! diagnostics). Baseline in the same run: `npc
//! validate` on `examples/minimal.toml`. Prints, per case, the file size,
//! the peak, the budget, peak / size and the peak over the baseline.
//!
//! Peak memory is the child's `ru_maxrss`: each `npc validate` runs under a
//! fresh copy of this binary (re-executed with [`RUNNER_ENV`]), whose
//! `getrusage(RUSAGE_CHILDREN)` then covers exactly that one child.
//!
//! Run: `cargo bench --bench validate_memory`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use nix::sys::resource::{UsageWho, getrusage};
use npcagent::model::node::{item_limit, toml_item_count, toml_path_fits};

/// Set to a manifest path when this binary runs as the measuring runner.
const RUNNER_ENV: &str = "NPC_BENCH_VALIDATE_MEMORY_RUN";
/// Target size of each generated manifest (the manifest size limit is 8 MiB).
const TARGET_BYTES: usize = 8 * 1024 * 1024 - 4096;
/// The budget: peak ≤ this × file size + [`BUDGET_BASE_BYTES`].
const BUDGET_FACTOR: usize = 20;
const BUDGET_BASE_BYTES: usize = 20 * 1024 * 1024;
/// Runs of each case; the largest peak is reported.
const RUNS: usize = 3;

/// Repeat `unit(i)` after `head` until the text is about [`TARGET_BYTES`].
fn fill(head: &str, tail: &str, mut unit: impl FnMut(usize) -> String) -> String {
    let mut s = String::from(head);
    let mut i = 0;
    loop {
        let next = unit(i);
        if s.len() + next.len() + tail.len() > TARGET_BYTES {
            break;
        }
        s.push_str(&next);
        i += 1;
    }
    s.push_str(tail);
    s
}

/// Add `unit(i)` (text, items it adds) after `head` while the document stays
/// within [`item_limit`] of its own size.
fn under_limit(head: &str, mut unit: impl FnMut(usize) -> (String, usize)) -> String {
    let mut s = String::from(head);
    // `version = 1`.
    let mut items = 2;
    for i in 0.. {
        let (next, n) = unit(i);
        if items + n > item_limit(s.len() + next.len()) {
            break;
        }
        s.push_str(&next);
        items += n;
    }
    s
}

/// Tokens of a piece of TOML text that ends with a newline.
fn tokens(text: &str) -> usize {
    toml_item_count(text).map_or(usize::MAX, |c| c.tokens)
}

/// The largest document of `unit(i)` lines whose errors the toml crate's
/// path still reports (the costliest document that path is given), ending
/// with `tail` (an error).
fn at_toml_threshold(tail: &str, mut unit: impl FnMut(usize) -> String) -> String {
    let mut s = String::from("version = 1\n");
    let mut count = tokens(&s) + tokens(tail);
    for i in 0.. {
        let next = unit(i);
        let n = tokens(&next);
        if !toml_path_fits(s.len() + next.len() + tail.len(), count + n) {
            break;
        }
        s.push_str(&next);
        count += n;
    }
    s.push_str(tail);
    s
}

fn cases() -> Vec<(&'static str, &'static str, String)> {
    let mut out = Vec::new();
    out.push((
        "array of ints `x = [1,1,…]`",
        "toml",
        fill("version = 1\nx = [", "1]\n", |_| "1,".to_string()),
    ));
    out.push((
        "array of ints, JSON",
        "json",
        fill("{\"version\": 1, \"x\": [", "1]}", |_| "1,".to_string()),
    ));
    out.push((
        "empty args `args = [\"\",…]`",
        "toml",
        fill(
            "version = 1\n[mcp.servers.s]\ncommand = \"x\"\nargs = [",
            "\"\"]\n",
            |_| "\"\",".to_string(),
        ),
    ));
    out.push((
        "many tables `[mcp.servers.sN]`",
        "toml",
        fill("version = 1\n", "", |i| {
            format!("[mcp.servers.s{i}]\ncommand = \"x\"\n")
        }),
    ));
    out.push((
        "many keys in one table",
        "toml",
        fill("version = 1\n[x]\n", "", |i| format!("k{i} = 1\n")),
    ));
    // Densest shapes just under the item limit (small files, the hardest
    // for a budget proportional to size).
    // Items per unit: one per scalar, two per empty array or table.
    for (name, unit, items) in [
        ("ints `1,` just under the item limit", "1", 1),
        ("empty arrays `[],` just under the item limit", "[]", 2),
        (
            "empty inline tables `{},` just under the item limit",
            "{}",
            2,
        ),
        ("empty strings just under the item limit", "\"\"", 1),
    ] {
        let row = vec![unit; 4000].join(",");
        // A row is its key, its brackets and 4,000 units.
        let text = under_limit("version = 1\n", |r| {
            (format!("a{r} = [{row}]\n"), 3 + 4000 * items)
        });
        out.push((name, "toml", text));
    }
    out.push((
        "keys `kN = 1` just under the item limit",
        "toml",
        under_limit("version = 1\n", |i| {
            if i % 4000 == 0 {
                (format!("[t{i}]\nk{i} = 1\n"), 5)
            } else {
                (format!("k{i} = 1\n"), 2)
            }
        }),
    ));
    // The same with one redefinition at the very end: a document with an
    // error is parsed again by the toml crate for its diagnostics.
    // Its last line replaced by a redefinition of the line before (same
    // size, same items).
    let keys = out.last().expect("the keys case").2.clone();
    let (head, _) = keys
        .trim_end_matches('\n')
        .rsplit_once('\n')
        .expect("several lines");
    let before = head.rsplit_once('\n').map_or(head, |(_, l)| l);
    let key = before.split(" =").next().expect("a key");
    out.push((
        "keys `kN = 1` under the limit, a redefinition at the end",
        "toml",
        format!("{head}\n{key} = 2\n"),
    ));
    // The costliest documents the toml crate's path still takes: as many
    // items as its measured cost allows, an error at the end.
    out.push((
        "keys `kN = 1` at the toml-path threshold, a duplicate at the end",
        "toml",
        at_toml_threshold("k0 = 2\n", |i| format!("k{i} = 1\n")),
    ));
    out.push((
        "ints `1,` at the toml-path threshold, a duplicate at the end",
        "toml",
        at_toml_threshold("a0 = 1\n", |r| {
            format!("a{r} = [{}]\n", vec!["1"; 400].join(","))
        }),
    ));
    // A run of commas makes the toml crate report an error for each.
    out.push((
        "commas `,,,` at the toml-path threshold",
        "toml",
        at_toml_threshold("]\n", |i| {
            if i == 0 {
                "x = [\n".to_string()
            } else {
                ",,,,,,,,,,,,,,,\n".to_string()
            }
        }),
    ));
    out.push((
        "commas `,,,` in one array (8 MB)",
        "toml",
        fill("version = 1\nx = [", "]\n", |_| ",".repeat(64)),
    ));
    out.push((
        "blank lines in one array (8 MB)",
        "toml",
        fill("version = 1\nx = [", "]\n", |_| "\n".repeat(64)),
    ));
    // A real large manifest for reference: the planner benchmark's 10,000
    // components (valid), whose cost is mostly the model, not parsing.
    let components = (0..5_000).fold(String::from("version = 1\n"), |mut s, i| {
        s.push_str(&format!(
            "[mcp.servers.s{i}]\ncommand = \"srv\"\nargs = [\"--n\", \"0\"]\nenv = {{ A = \"b\" }}\n[triggers.t{i}]\nkind = \"cron\"\nschedule = \"1 * * * *\"\naction = {{ command = \"make\" }}\n"
        ));
        s
    });
    out.push((
        "10,000 components, a redefinition at the end",
        "toml",
        format!("{components}[mcp.servers.s7]\n"),
    ));
    out.push(("10,000 components (valid, reference)", "toml", components));
    // Strings at the string bound: seven prompts of just under 1 MiB each.
    out.push(("long strings (7 × 1 MiB templates)", "toml", {
        let body = "word ".repeat((1024 * 1024 - 64) / 5);
        let mut s = String::from("version = 1\n");
        for i in 0..7 {
            s.push_str(&format!("[prompts.p{i}]\ntemplate = \"{body}\"\n"));
        }
        s
    }));
    out.push((
        "one string past the bound (8 MB)",
        "toml",
        fill("version = 1\n[project]\nname = \"", "\"\n", |_| {
            "y".repeat(4096)
        }),
    ));
    // Deep inline tables: 60 levels each, repeated.
    out.push(("deep inline tables (60 levels)", "toml", {
        let deep = format!("{}1{}", "{a = ".repeat(60), "}".repeat(60));
        fill("version = 1\n[x]\n", "", |i| format!("k{i} = {deep}\n"))
    }));
    out.push(("deep inline tables past the depth bound", "toml", {
        let deep = format!("{}1{}", "{a = ".repeat(100), "}".repeat(100));
        fill("version = 1\n[x]\n", "", |i| format!("k{i} = {deep}\n"))
    }));
    out
}

/// Runner mode: run `npc validate PATH`, print the child's peak RSS in bytes.
fn run_one(npc: &Path, manifest: &str) {
    let status = Command::new(npc)
        .args(["validate", manifest])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("npc runs");
    // `ru_maxrss` is in kilobytes on Linux.
    let usage = getrusage(UsageWho::RUSAGE_CHILDREN).expect("getrusage");
    println!("{} {}", usage.max_rss() * 1024, status.code().unwrap_or(-1));
}

/// Peak RSS (bytes) and exit code of `npc validate manifest`, measured in a
/// fresh runner process.
fn peak(manifest: &Path) -> (usize, i32) {
    let me = std::env::current_exe().expect("own path");
    let mut worst = (0, 0);
    for _ in 0..RUNS {
        let out = Command::new(&me)
            .env(RUNNER_ENV, manifest)
            .output()
            .expect("runner runs");
        let text = String::from_utf8_lossy(&out.stdout);
        let mut parts = text.split_whitespace();
        let rss: usize = parts.next().and_then(|p| p.parse().ok()).expect("rss");
        let code: i32 = parts.next().and_then(|p| p.parse().ok()).expect("code");
        worst = worst.max((rss, code));
    }
    worst
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn main() {
    let npc = PathBuf::from(env!("CARGO_BIN_EXE_npc"));
    if let Ok(manifest) = std::env::var(RUNNER_ENV) {
        run_one(&npc, &manifest);
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (baseline, _) = peak(&root.join("examples/minimal.toml"));
    println!(
        "baseline: npc validate examples/minimal.toml peaks at {:.1} MiB",
        mib(baseline)
    );
    println!(
        "budget: {BUDGET_FACTOR} × file size + {} MiB\n",
        mib(BUDGET_BASE_BYTES)
    );
    println!(
        "| manifest | size | exit | peak RSS | budget | peak / size | peak − baseline | within |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---|");
    let dir = tempfile::tempdir().expect("temp dir");
    let mut all_within = true;
    for (i, (name, ext, text)) in cases().into_iter().enumerate() {
        let path = dir.path().join(format!("case{i}.{ext}"));
        std::fs::write(&path, &text).expect("write manifest");
        let (rss, code) = peak(&path);
        let budget = BUDGET_FACTOR * text.len() + BUDGET_BASE_BYTES;
        let within = rss <= budget;
        all_within &= within;
        println!(
            "| {name} | {:.2} MiB | {code} | {:.1} MiB | {:.1} MiB | {:.1}x | {:.1} MiB | {} |",
            mib(text.len()),
            mib(rss),
            mib(budget),
            rss as f64 / text.len() as f64,
            mib(rss.saturating_sub(baseline)),
            if within { "yes" } else { "NO" }
        );
    }
    println!(
        "\n{}",
        if all_within {
            "every case is within the budget"
        } else {
            "SOME CASES EXCEED THE BUDGET"
        }
    );
}
