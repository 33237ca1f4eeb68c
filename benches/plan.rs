//! Benchmark: planning over 100, 1,000 and 10,000 components, to show the
//! planner grows linearly and stays in tens of milliseconds at 10,000.
//! Baseline in the same run: serializing every desired component to JSON
//! once (the least any planner that looks at each component must do).
//!
//! Run: `cargo bench --bench plan`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use npcagent::model::{self, Syntax};
use npcagent::plan::{self, ExternalInputs};

/// Runs per size.
const RUNS: usize = 15;
/// Component counts.
const SIZES: [usize; 3] = [100, 1_000, 10_000];

struct NoFiles;
impl model::Files for NoFiles {
    fn read_to_string(&self, _: &std::path::Path) -> std::io::Result<String> {
        Err(std::io::ErrorKind::NotFound.into())
    }
    fn is_dir(&self, _: &std::path::Path) -> bool {
        false
    }
}

fn manifest(n: usize, variant: usize) -> model::Manifest {
    let mut s = String::from("version = 1\n");
    for i in 0..n / 2 {
        // Every tenth server differs between the two variants.
        let arg = if i % 10 == 0 { variant } else { 0 };
        s += &format!(
            "[mcp.servers.s{i}]\ncommand = \"srv\"\nargs = [\"--n\", \"{arg}\"]\nenv = {{ A = \"b\" }}\n"
        );
        s += &format!(
            "[triggers.t{i}]\nkind = \"cron\"\nschedule = \"{} * * * *\"\naction = {{ command = \"make\" }}\n",
            i % 60
        );
    }
    let env: BTreeMap<String, String> = BTreeMap::new();
    model::load_bytes("bench.toml", s.as_bytes(), Syntax::Toml, &env, &NoFiles)
        .manifest
        .expect("valid")
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    println!(
        "== plan (median of {RUNS} runs): desired() + plan() against an applied state with 10% changed =="
    );
    let mut first: Option<(usize, Duration)> = None;
    for n in SIZES {
        let before = plan::observe(&plan::desired(&manifest(n, 1), &ExternalInputs::default()));
        let after_model = manifest(n, 2);
        let timed = median(
            (0..RUNS)
                .map(|_| {
                    let t = Instant::now();
                    let desired = plan::desired(&after_model, &ExternalInputs::default());
                    let p = plan::plan(&desired, &before);
                    let d = t.elapsed();
                    assert!(p.has_changes());
                    d
                })
                .collect(),
        );
        let desired = plan::desired(&after_model, &ExternalInputs::default());
        let baseline = median(
            (0..RUNS)
                .map(|_| {
                    let t = Instant::now();
                    let total: usize = desired
                        .values()
                        .map(|c| c.to_json().to_string().len())
                        .sum();
                    let d = t.elapsed();
                    assert!(total > 0);
                    d
                })
                .collect(),
        );
        let growth = first.map_or(String::new(), |(n0, d0)| {
            format!(
                "  x{:.1} time for x{} components",
                timed.as_secs_f64() / d0.as_secs_f64(),
                n / n0
            )
        });
        println!(
            "  {n:>6} components  plan {:>8.2} ms  ({:.2} µs/component)  baseline json {:>8.2} ms  ratio {:.2}{growth}",
            timed.as_secs_f64() * 1e3,
            timed.as_secs_f64() * 1e6 / n as f64,
            baseline.as_secs_f64() * 1e3,
            timed.as_secs_f64() / baseline.as_secs_f64()
        );
        first.get_or_insert((n, timed));
    }
}
