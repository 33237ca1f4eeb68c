//! Benchmark of planning a native MCP file: `plan_text` on a large user
//! file (a `~/.claude.json` with many projects, a Codex config with many
//! tables), against the baseline of parsing and printing the same file
//! with the same library, which any edit-in-place must pay.

use std::collections::{BTreeMap, BTreeSet};
use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use npcagent::disk::DiskFiles;
use npcagent::model::{ProviderKind, Syntax, load_bytes};
use npcagent::native::{Extra, PlanOptions, plan_text};

/// Projects in the synthetic `~/.claude.json`.
const PROJECTS: usize = 2_000;
/// Unrelated tables in the synthetic Codex config.
const CODEX_TABLES: usize = 2_000;
/// Servers in the manifest.
const SERVERS: usize = 20;
/// Timed iterations per measurement.
const ITERATIONS: u32 = 20;

fn time(mut f: impl FnMut()) -> Duration {
    f();
    let start = Instant::now();
    for _ in 0..ITERATIONS {
        f();
    }
    start.elapsed() / ITERATIONS
}

fn main() {
    let mut manifest = String::from("version = 1\n");
    for i in 0..SERVERS {
        manifest.push_str(&format!(
            "[mcp.servers.s{i}]\ncommand = \"srv\"\nargs = [\"--n\", \"{i}\"]\nenv = {{ KEY = \"${{KEY}}\" }}\n"
        ));
    }
    let env: BTreeMap<String, String> = [("KEY".to_string(), "v".to_string())].into();
    let files = DiskFiles::new(PathBuf::from("."));
    let m = load_bytes(
        "npcagent.toml",
        manifest.as_bytes(),
        Syntax::Toml,
        &env,
        &files,
    )
    .manifest
    .expect("bench manifest loads");
    let managed: BTreeSet<String> = BTreeSet::new();
    let secrets = m.secret_values();

    let mut projects = serde_json::Map::new();
    for i in 0..PROJECTS {
        projects.insert(
            format!("/home/u/src/project-{i}"),
            serde_json::json!({"allowedTools": ["Bash", "Edit"], "history": [{"display": "fix the build", "pastedContents": {}}], "mcpServers": {}}),
        );
    }
    let claude =
        serde_json::to_string_pretty(&serde_json::json!({"numStartups": 3, "projects": projects}))
            .unwrap();
    let claude_base = time(|| {
        let v: serde_json::Value = serde_json::from_str(black_box(&claude)).unwrap();
        black_box(serde_json::to_string_pretty(&v).unwrap());
    });
    let claude_plan = time(|| {
        black_box(
            plan_text(
                PathBuf::from("/home/u/.claude.json"),
                ProviderKind::ClaudeCode,
                Some(claude.clone()),
                &m,
                &managed,
                PlanOptions::default(),
                Extra {
                    secrets: &secrets,
                    ..Extra::default()
                },
            )
            .unwrap(),
        );
    });

    let mut codex = String::from("model = \"o3\"\n");
    for i in 0..CODEX_TABLES {
        codex.push_str(&format!(
            "\n# project {i}\n[projects.\"/home/u/src/p{i}\"]\ntrust_level = \"trusted\"\n"
        ));
    }
    let codex_base = time(|| {
        let d: toml_edit::DocumentMut = black_box(&codex).parse().unwrap();
        black_box(d.to_string());
    });
    let codex_plan = time(|| {
        black_box(
            plan_text(
                PathBuf::from("/home/u/.codex/config.toml"),
                ProviderKind::Codex,
                Some(codex.clone()),
                &m,
                &managed,
                PlanOptions::default(),
                Extra {
                    secrets: &secrets,
                    ..Extra::default()
                },
            )
            .unwrap(),
        );
    });

    println!("native plan, {SERVERS} servers, mean of {ITERATIONS} runs");
    for (what, size, base, plan) in [
        (
            "claude ~/.claude.json",
            claude.len(),
            claude_base,
            claude_plan,
        ),
        ("codex config.toml", codex.len(), codex_base, codex_plan),
    ] {
        println!(
            "{what:<24} {:>8} KiB  parse+print {:>9.2?}  plan_text {:>9.2?}  ratio {:.2}x",
            size / 1024,
            base,
            plan,
            plan.as_secs_f64() / base.as_secs_f64()
        );
    }
}
