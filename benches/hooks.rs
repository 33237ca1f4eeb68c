//! Hook overheads against spawning the same tiny executable bare, measured
//! in the same run and interleaved call by call: (1) one `before_tool` hook
//! through `HookRunner::before_tool` (envelope, spawn through the
//! supervisor, stdin, answer parsing) vs `tokio::process::Command::output`
//! of the same program — goal: at most 2 ms added at p50; (2) `npc hook run
//! before_tool` end to end (process start, manifest load, one hook, the
//! answer) vs the bare program — goal: at most 10 ms at p50; (3) the same
//! `npc hook run before_tool` with a hook that MATCHES the call (so it runs
//! and its `hook.call` is recorded) and with one whose matcher excludes it,
//! each interleaved call by call with `npc --version` (the process start
//! alone) — goal: the matching path at most 1.25x `--version` (median of
//! the per-pair ratios); the hook program is also started bare in the same
//! loop, and npc's own part of a matching call (the call less that start)
//! is printed over `--version` too. Prints p50/p99 and the ratios.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use npcagent::hooks::{HookRunner, HookSet, HookSource, SourceHooks, ToolCallInfo};
use npcagent::model::{CommandSpec, Hook, HookEvent};
use npcagent::supervisor::{BackoffPolicy, Supervisor};

/// Calls per measurement.
const CALLS: usize = 300;
/// The tiny executable every case runs (answers nothing: continue).
const PROGRAM: &str = "true";

fn pct(mut v: Vec<Duration>, p: f64) -> f64 {
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i].as_secs_f64() * 1e3
}

fn report(name: &str, bare: Vec<Duration>, ours: Vec<Duration>) {
    let (b50, b99, o50, o99) = (
        pct(bare.clone(), 0.5),
        pct(bare, 0.99),
        pct(ours.clone(), 0.5),
        pct(ours, 0.99),
    );
    println!(
        "{name}: bare p50 {b50:.3} ms p99 {b99:.3} ms; with npc p50 {o50:.3} ms p99 {o99:.3} ms; added p50 {:.3} ms; ratio {:.2}",
        o50 - b50,
        o50 / b50
    );
}

fn in_process() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let supervisor = Supervisor::new(tx, BackoffPolicy::default());
        let hook = Hook {
            run: CommandSpec {
                command: PROGRAM.into(),
                args: Vec::new(),
                env: BTreeMap::new(),
                cwd: None,
            },
            timeout_ms: 5_000,
            matcher: None,
        };
        let set = HookSet::build(
            &std::env::temp_dir(),
            &[SourceHooks {
                source: HookSource::Manifest,
                hooks: BTreeMap::from([(HookEvent::BeforeTool, vec![hook])]),
            }],
        );
        let runner = HookRunner::new(set, supervisor, None);
        let call = ToolCallInfo {
            id: "c".into(),
            name: "shell__run".into(),
            arguments: serde_json::json!({"cmd": "git status"}),
        };
        let (mut bare, mut ours) = (Vec::new(), Vec::new());
        for _ in 0..CALLS {
            let t = Instant::now();
            let out = tokio::process::Command::new(PROGRAM)
                .stdin(Stdio::null())
                .output()
                .await
                .expect("runs");
            assert!(out.status.success());
            bare.push(t.elapsed());
            let t = Instant::now();
            runner.before_tool(&call).await.expect("continues");
            ours.push(t.elapsed());
        }
        report("before_tool hook (in process)", bare, ours);
    });
}

fn end_to_end() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("npcagent.toml"),
        format!("version = 1\n[[hooks.before_tool]]\ncommand = \"{PROGRAM}\"\n"),
    )
    .expect("manifest");
    let npc = env!("CARGO_BIN_EXE_npc");
    let input = br#"{"tool_call":{"id":"c","name":"shell__run","arguments":{"cmd":"git status"}}}"#;
    let run = |program: &str, args: &[&str]| {
        let t = Instant::now();
        let mut child = Command::new(program)
            .args(args)
            .current_dir(dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawns");
        let _ = child.stdin.take().expect("piped").write_all(input);
        let out = child.wait_with_output().expect("waits");
        assert!(out.status.success(), "{program}: {out:?}");
        t.elapsed()
    };
    let (mut bare, mut ours) = (Vec::new(), Vec::new());
    for _ in 0..CALLS {
        bare.push(run(PROGRAM, &[]));
        ours.push(run(npc, &["hook", "run", "before_tool"]));
    }
    report("npc hook run before_tool (end to end)", bare, ours);
}

/// `npc hook run before_tool` with a matching hook and with a hook that
/// does not match, each against `npc --version` in the same loop.
fn against_version() {
    let matching = tempfile::tempdir().expect("tempdir");
    let skipped = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        matching.path().join("npcagent.toml"),
        format!(
            "version = 1\n[[hooks.before_tool]]\ncommand = \"{PROGRAM}\"\nmatcher = \"shell__*\"\n"
        ),
    )
    .expect("manifest");
    std::fs::write(
        skipped.path().join("npcagent.toml"),
        format!(
            "version = 1\n[[hooks.before_tool]]\ncommand = \"{PROGRAM}\"\nmatcher = \"fs__*\"\n"
        ),
    )
    .expect("manifest");
    let npc = env!("CARGO_BIN_EXE_npc");
    let input = br#"{"tool_call":{"id":"c","name":"shell__run","arguments":{"cmd":"git status"}}}"#;
    // `program args` in `dir` with the call on stdin, timed to its exit.
    let timed = |program: &str, dir: &std::path::Path, args: &[&str]| {
        let t = Instant::now();
        let mut child = Command::new(program)
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawns");
        let _ = child.stdin.take().expect("piped").write_all(input);
        let out = child.wait_with_output().expect("waits");
        assert!(out.status.success(), "{program} {args:?}: {out:?}");
        t.elapsed()
    };
    let run = |dir: &std::path::Path, args: &[&str]| timed(npc, dir, args);
    // The hook program alone, started the way a test harness starts npc:
    // the part of a matching call that is the hook's, not npc's.
    let bare = |dir: &std::path::Path| timed(PROGRAM, dir, &[]);
    let hook = ["hook", "run", "before_tool"];
    let (mut version, mut hit, mut miss, mut program) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..CALLS {
        version.push(run(matching.path(), &["--version"]));
        hit.push(run(matching.path(), &hook));
        miss.push(run(skipped.path(), &hook));
        program.push(bare(matching.path()));
    }
    let ratios = |ours: &[Duration]| -> Vec<Duration> {
        // Each call over the `--version` next to it, as a duration in ms
        // of ratio (so `pct` takes its median).
        ours.iter()
            .zip(&version)
            .map(|(o, v)| Duration::from_secs_f64(o.as_secs_f64() / v.as_secs_f64() / 1e3))
            .collect()
    };
    let recorded = matching.path().join(".npc");
    assert!(recorded.is_dir(), "the matching hook's calls were recorded");
    for (name, ours) in [("matching hook", &hit), ("no matching hook", &miss)] {
        println!(
            "npc hook run before_tool, {name}: p50 {:.3} ms p99 {:.3} ms; npc --version p50 {:.3} ms; median of pair ratios {:.2}x --version",
            pct(ours.clone(), 0.5),
            pct(ours.clone(), 0.99),
            pct(version.clone(), 0.5),
            pct(ratios(ours), 0.5),
        );
    }
    // npc's own part of a matching call: the call less the hook program's
    // start next to it, over `--version` (what the title of issue 48 asks:
    // a matching hook costs npc no more than a start).
    let own: Vec<Duration> = hit
        .iter()
        .zip(&program)
        .map(|(h, p)| h.saturating_sub(*p))
        .collect();
    println!(
        "npc hook run before_tool, matching hook less the hook program's own start ({PROGRAM} p50 {:.3} ms): p50 {:.3} ms; median of pair ratios {:.2}x --version",
        pct(program.clone(), 0.5),
        pct(own.clone(), 0.5),
        pct(ratios(&own), 0.5),
    );
}

fn main() {
    in_process();
    end_to_end();
    against_version();
}
