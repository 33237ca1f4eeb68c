//! Rendering every profile of a multi-profile manifest (frontmatter, the
//! workspace block, the prompt body, scrubbing), against a baseline
//! measured in the same run: plain minijinja rendering the same template
//! text with a plain context and no frontmatter. Prints per-profile times
//! and the ratio.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use npcagent::disk::DiskFiles;
use npcagent::model::{Syntax, load_bytes};
use npcagent::render::{self, RenderContext};

/// Profiles in the benchmark manifest.
const PROFILES: usize = 8;
/// Timed rounds over all profiles (after warm-up).
const ROUNDS: u32 = 2_000;
/// Untimed warm-up rounds.
const WARMUP_ROUNDS: u32 = 100;

const PROMPT: &str = r#"You are {{ profile.name }}, working on {{ project.name }} ({{ project.root }}).
{{ profile.description }}

Focus on {{ vars.focus }} and keep answers under {{ vars.limit }} words.
{% if trigger %}This run was started by {{ trigger.event }}.{% endif %}
Tools you may use:
{% for t in profile.allowed_tools %}- {{ t }}
{% endfor %}
{% for s in profile.mcp_servers %}Server {{ loop.index }}: {{ s }}
{% endfor %}
Checklist:
{% for i in range(5) %}{{ i + 1 }}. step {{ i + 1 }} of the review for {{ vars.focus | upper }}
{% endfor %}
"#;

fn manifest_text() -> String {
    let mut t = String::from(
        "version = 1\n[project]\nname = \"bench\"\n[providers.claude]\nkind = \"claude_code\"\n[providers.codex]\nkind = \"codex\"\n",
    );
    for s in 0..4 {
        t.push_str(&format!(
            "[mcp.servers.s{s}]\ncommand = \"server-{s}\"\nargs = [\"--port\", \"{s}\", \"--mode: x\"]\nenv = {{ TOKEN = \"${{HOME}}\", LEVEL = \"{s}\" }}\n"
        ));
    }
    t.push_str(&format!(
        "[prompts.main]\ntemplate = '''\n{PROMPT}'''\nvariables.focus = {{ default = \"correctness\" }}\nvariables.limit = {{ default = \"300\" }}\n"
    ));
    for p in 0..PROFILES {
        t.push_str(&format!(
            "[profiles.p{p}]\nprovider = \"{}\"\ndescription = \"Profile {p}: does \\\"things\\\" # well\"\nprompt = \"main\"\nmodel = \"model-{p}\"\nmcp_servers = [\"s{}\", \"s{}\"]\nallowed_tools = [\"mcp__s0__read\", \"Bash(git diff:*)\", \"tool-{p}\"]\nskills = [\"review\", \"lint\"]\nfrontmatter = {{ role = \"r{p}\", tags = [\"a\", \"b\"] }}\n",
            if p % 2 == 0 { "claude" } else { "codex" },
            p % 4,
            (p + 1) % 4
        ).replace("", ""));
    }
    t
}

fn time(rounds: u32, mut f: impl FnMut()) -> Duration {
    for _ in 0..WARMUP_ROUNDS {
        f();
    }
    let start = Instant::now();
    for _ in 0..rounds {
        f();
    }
    start.elapsed()
}

fn main() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir_all(dir.path().join(".git")).expect("git dir");
    std::fs::write(dir.path().join(".git/HEAD"), "ref: refs/heads/main\n").expect("HEAD");
    let text = manifest_text();
    let env: BTreeMap<String, String> = [("HOME".to_string(), "/home/bench".to_string())].into();
    let files = DiskFiles::new(dir.path().to_path_buf());
    let loaded = load_bytes("bench.toml", text.as_bytes(), Syntax::Toml, &env, &files);
    let manifest = loaded
        .manifest
        .unwrap_or_else(|| panic!("bench manifest is invalid: {:#?}", loaded.diagnostics));
    assert_eq!(manifest.profiles.len(), PROFILES);
    let names: Vec<&String> = manifest.profiles.keys().collect();

    let capture = time(ROUNDS, || {
        black_box(RenderContext::new(dir.path(), &manifest));
    });
    let ctx = RenderContext::new(dir.path(), &manifest)
        .with_trigger(serde_json::json!({"event": "push"}));

    let npc = time(ROUNDS, || {
        for name in &names {
            black_box(render::profile(&manifest, name, &ctx).expect("renders"));
        }
    });

    // Baseline: the same template text, plain minijinja, plain context.
    let contexts: Vec<minijinja::Value> = names
        .iter()
        .map(|name| {
            let p = &manifest.profiles[*name];
            minijinja::context! {
                vars => minijinja::context! { focus => "correctness", limit => "300" },
                project => minijinja::context! { name => "bench", root => dir.path().display().to_string() },
                profile => minijinja::context! {
                    name => name.as_str(),
                    description => p.description.as_str(),
                    allowed_tools => p.allowed_tools.clone(),
                    mcp_servers => p.mcp_servers.clone(),
                },
                trigger => minijinja::context! { event => "push" },
            }
        })
        .collect();
    let baseline = time(ROUNDS, || {
        for c in &contexts {
            let env = minijinja::Environment::new();
            let t = env.template_from_str(PROMPT).expect("compiles");
            black_box(t.render(c).expect("renders"));
        }
    });

    let per = |d: Duration| d.as_secs_f64() * 1e6 / f64::from(ROUNDS) / PROFILES as f64;
    let sample = render::profile(&manifest, names[0], &ctx).expect("renders");
    println!(
        "render: {PROFILES} profiles x {ROUNDS} rounds, {} bytes per rendered profile",
        sample.len()
    );
    println!("  npc render::profile      {:8.2} us/profile", per(npc));
    println!(
        "  baseline (minijinja)     {:8.2} us/profile",
        per(baseline)
    );
    println!(
        "  ratio npc/baseline       {:8.2}x",
        npc.as_secs_f64() / baseline.as_secs_f64()
    );
    println!(
        "  RenderContext::new       {:8.2} us/run (workspace snapshot, all blocks)",
        capture.as_secs_f64() * 1e6 / f64::from(ROUNDS)
    );
}
