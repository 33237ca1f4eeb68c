//! Benchmark: `npc validate` against the schema-only checkers a user would
//! otherwise run in CI (`taplo check --schema` on TOML, `check-jsonschema` on
//! JSON), as whole processes on the same documents; plus in-process
//! validation of generated manifests from 500 to 5,000 components, to show
//! the growth is linear. Prints medians and ratios; `benches/RESULTS.md`
//! records a run.
//!
//! Run: `cargo bench --bench validate` (install the peers with
//! `pip install taplo check-jsonschema`; missing peers are reported and skipped).
//! With `NPC_BASELINE_BIN=path/to/another/npc`, that build validates the same
//! documents too, its runs interleaved with this build's, and the ratio is
//! printed (how a change is compared with the commit before it).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use npcagent::disk::DiskFiles;
use npcagent::model::{self, Syntax};

/// Runs of each whole-process command (after warm-up).
const PROCESS_RUNS: usize = 40;
/// Warm-up runs, not measured.
const WARMUP_RUNS: usize = 3;
/// Runs of each in-process measurement.
const IN_PROCESS_RUNS: usize = 15;
/// Component counts of the generated manifests.
const SIZES: [usize; 4] = [500, 1_000, 2_000, 5_000];

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// Medians of `a` and `b` running `args`, their runs interleaved so both see
/// the same load.
fn time_pair(a: &Path, b: &Path, args: &[&str]) -> (Duration, Duration) {
    let run = |program: &Path| {
        let start = Instant::now();
        let out = Command::new(program).args(args).output().expect("runs");
        assert!(
            out.status.success(),
            "{} {args:?} failed",
            program.display()
        );
        start.elapsed()
    };
    for _ in 0..WARMUP_RUNS {
        run(a);
        run(b);
    }
    let (mut xs, mut ys) = (Vec::new(), Vec::new());
    for _ in 0..PROCESS_RUNS {
        xs.push(run(a));
        ys.push(run(b));
    }
    (median(xs), median(ys))
}

fn time_process(program: &Path, args: &[&str], expect_success: bool) -> Option<Duration> {
    let run = || {
        let start = Instant::now();
        let out = Command::new(program).args(args).output().ok()?;
        let elapsed = start.elapsed();
        if out.status.success() != expect_success {
            eprintln!(
                "  {} {:?} exited {} unexpectedly: {}",
                program.display(),
                args,
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
            return None;
        }
        Some(elapsed)
    };
    for _ in 0..WARMUP_RUNS {
        run()?;
    }
    let samples: Option<Vec<Duration>> = (0..PROCESS_RUNS).map(|_| run()).collect();
    Some(median(samples?))
}

/// Find a peer tool: the Python scripts directory first (skipping pyenv's
/// shell shims, which would add their own start-up time), then PATH.
fn find_tool(name: &str) -> Option<PathBuf> {
    let scripts = Command::new("python3")
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_path('scripts'))",
        ])
        .output()
        .ok()
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    let path_dirs = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    scripts
        .into_iter()
        .chain(path_dirs)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// A manifest with `n` components spread over every section.
fn generate(n: usize) -> String {
    let mut s = String::from("version = 1\n[project]\nname = \"bench\"\n");
    let per = n / 5;
    for i in 0..per {
        s += &format!(
            "[mcp.servers.srv-{i}]\ncommand = \"server-{i}\"\nargs = [\"--port\", \"{i}\", \"--log=${{BENCH_LOG:-warn}}\"]\nenv = {{ MODE = \"fast\" }}\nstartup_timeout_ms = 5000\n"
        );
        s += &format!("[providers.prov-{i}]\nkind = \"codex\"\nargs = [\"--quiet\"]\n");
        s += &format!(
            "[prompts.prompt-{i}]\ntemplate = \"Work on {{{{ vars.task }}}} in {{{{ project.name }}}} ({i})\"\nvariables.task = {{ default = \"tests\" }}\n"
        );
        s += &format!(
            "[profiles.prof-{i}]\nprovider = \"prov-{i}\"\ndescription = \"profile {i}\"\nprompt = \"prompt-{i}\"\nmcp_servers = [\"srv-{i}\"]\nallowed_tools = [\"mcp__srv-{i}__*\"]\n"
        );
        s += &format!(
            "[triggers.trig-{i}]\nkind = \"cron\"\nschedule = \"{} {} * * 1-5\"\naction = {{ profile = \"prof-{i}\", prompt = \"prompt-{i}\" }}\n",
            i % 60,
            i % 24
        );
    }
    s
}

fn main() {
    let npc = PathBuf::from(env!("CARGO_BIN_EXE_npc"));
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::env::set_current_dir(root).expect("repository root");
    let schema = root.join("schemas/npcagent.schema.json");
    let schema_url = format!("file://{}", schema.display());
    let dir = tempfile::tempdir().expect("temp dir");

    // The generated 5,000-component document, as TOML and JSON, for the peers too.
    let big_toml = dir.path().join("big.toml");
    let big_json = dir.path().join("big.json");
    let text = generate(5_000);
    std::fs::write(&big_toml, &text).unwrap();
    let value: serde_json::Value = toml::from_str(&text).unwrap();
    std::fs::write(&big_json, serde_json::to_string_pretty(&value).unwrap()).unwrap();

    println!("== whole process (median of {PROCESS_RUNS} runs) ==");
    let taplo = find_tool("taplo");
    let cjs = find_tool("check-jsonschema");
    for (label, toml_doc, json_doc) in [
        (
            "examples/full",
            root.join("examples/full.toml"),
            root.join("examples/full.json"),
        ),
        (
            "generated 5,000 components",
            big_toml.clone(),
            big_json.clone(),
        ),
    ] {
        println!("-- {label}");
        let ours = time_process(&npc, &["validate", toml_doc.to_str().unwrap()], true)
            .expect("npc validate runs");
        let ours_json = time_process(&npc, &["validate", json_doc.to_str().unwrap()], true)
            .expect("npc validate runs");
        println!(
            "  npc validate (toml)         {:>9.2} ms",
            ours.as_secs_f64() * 1e3
        );
        println!(
            "  npc validate (json)         {:>9.2} ms",
            ours_json.as_secs_f64() * 1e3
        );
        if let Some(base) = std::env::var_os("NPC_BASELINE_BIN").map(PathBuf::from) {
            for doc in [&toml_doc, &json_doc] {
                let args = ["validate", doc.to_str().unwrap()];
                // A baseline older than the document's sections cannot
                // validate it: say so rather than time a failure.
                if !Command::new(&base)
                    .args(args)
                    .output()
                    .is_ok_and(|o| o.status.success())
                {
                    println!(
                        "  this build vs baseline ({}): the baseline does not accept this document, skipped",
                        doc.extension().and_then(|e| e.to_str()).unwrap_or("")
                    );
                    continue;
                }
                let (this, then) = time_pair(&npc, &base, &args);
                println!(
                    "  this build vs baseline ({}) {:>7.2} ms vs {:.2} ms   ratio {:.3}",
                    doc.extension().and_then(|e| e.to_str()).unwrap_or(""),
                    this.as_secs_f64() * 1e3,
                    then.as_secs_f64() * 1e3,
                    this.as_secs_f64() / then.as_secs_f64()
                );
            }
        }
        match &taplo {
            Some(t) => match time_process(
                t,
                &[
                    "check",
                    "--no-auto-config",
                    "--schema",
                    &schema_url,
                    toml_doc.to_str().unwrap(),
                ],
                true,
            ) {
                Some(d) => println!(
                    "  taplo check --schema        {:>9.2} ms   npc is {:.2}x taplo's speed",
                    d.as_secs_f64() * 1e3,
                    d.as_secs_f64() / ours.as_secs_f64()
                ),
                None => println!("  taplo check: failed to run"),
            },
            None => println!("  taplo: not installed (pip install taplo), skipped"),
        }
        match &cjs {
            Some(c) => match time_process(
                c,
                &[
                    "--schemafile",
                    schema.to_str().unwrap(),
                    json_doc.to_str().unwrap(),
                ],
                true,
            ) {
                Some(d) => println!(
                    "  check-jsonschema            {:>9.2} ms   npc is {:.1}x check-jsonschema's speed",
                    d.as_secs_f64() * 1e3,
                    d.as_secs_f64() / ours_json.as_secs_f64()
                ),
                None => println!("  check-jsonschema: failed to run"),
            },
            None => println!(
                "  check-jsonschema: not installed (pip install check-jsonschema), skipped"
            ),
        }
    }

    // Honesty check: all three tools must reject the same broken document.
    let broken = dir.path().join("broken.toml");
    std::fs::write(&broken, "version = 1\n[mcp.servers.fs]\ncomand = \"x\"\n").unwrap();
    let rejects = |p: &Path, args: &[&str]| {
        Command::new(p)
            .args(args)
            .output()
            .map(|o| !o.status.success())
            .unwrap_or(false)
    };
    println!(
        "-- a broken manifest is rejected by: npc={} taplo={}",
        rejects(&npc, &["validate", broken.to_str().unwrap()]),
        taplo
            .as_ref()
            .map(|t| rejects(
                t,
                &[
                    "check",
                    "--no-auto-config",
                    "--schema",
                    &schema_url,
                    broken.to_str().unwrap()
                ]
            ))
            .map_or("n/a".into(), |b| b.to_string())
    );

    println!("\n== in process: load + validate (median of {IN_PROCESS_RUNS} runs) ==");
    let env: BTreeMap<String, String> = BTreeMap::new();
    let files = DiskFiles::new(dir.path().to_path_buf());
    let mut first: Option<(usize, Duration)> = None;
    for n in SIZES {
        let text = generate(n);
        let loaded = model::load_bytes("gen.toml", text.as_bytes(), Syntax::Toml, &env, &files);
        assert!(
            loaded.manifest.is_some(),
            "generated manifest must be valid: {:?}",
            loaded.diagnostics.first().map(ToString::to_string)
        );
        let samples = (0..IN_PROCESS_RUNS)
            .map(|_| {
                let start = Instant::now();
                let loaded =
                    model::load_bytes("gen.toml", text.as_bytes(), Syntax::Toml, &env, &files);
                let d = start.elapsed();
                assert!(loaded.manifest.is_some());
                d
            })
            .collect();
        let d = median(samples);
        let per = d.as_secs_f64() * 1e6 / n as f64;
        let growth = first.map_or(String::new(), |(n0, d0)| {
            format!(
                "   x{:.2} time for x{:.0} components",
                d.as_secs_f64() / d0.as_secs_f64(),
                n as f64 / n0 as f64
            )
        });
        println!(
            "  {n:>5} components  {:>8.2} ms  {per:>6.2} µs/component{growth}",
            d.as_secs_f64() * 1e3
        );
        first.get_or_insert((n, d));
    }
}
