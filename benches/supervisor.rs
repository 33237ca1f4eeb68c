//! Supervisor overheads against plain spawning, measured in the same run:
//! a one-shot `true` through `run_once` vs `tokio::process::Command::output`,
//! streaming 200,000 lines through `spawn_streaming` vs a plain
//! `BufReader::lines` over the child's stdout, and the cost of a PID
//! namespace per child: `true` through the `npc __contain` stub vs `true`
//! alone, and `run_once(true)` through a contained supervisor (watchdog and
//! stub) vs the plain one, and `start` of a long-lived component through a
//! contained supervisor (stub, namespace, the program's pid reported) vs
//! the plain one. Prints each ratio.

use std::process::Stdio;
use std::time::{Duration, Instant};

use npcagent::supervisor::{
    BackoffPolicy, CONTAIN_COMMAND, ChildSpec, Containment, OutputLimits, Supervisor,
};
use tokio::io::{AsyncBufReadExt, BufReader};

/// One-shot runs per measurement.
const RUNS: u32 = 200;
/// Lines streamed per measurement.
const LINES: u32 = 200_000;
/// Generous timeout for each benchmarked process.
const TIMEOUT: Duration = Duration::from_secs(60);

fn report(name: &str, baseline: Duration, ours: Duration, unit: &str, n: u32) {
    println!(
        "{name}: baseline {:.1} {unit}, supervisor {:.1} {unit}, ratio {:.2}",
        baseline.as_secs_f64() * 1e6 / f64::from(n),
        ours.as_secs_f64() * 1e6 / f64::from(n),
        ours.as_secs_f64() / baseline.as_secs_f64()
    );
}

async fn one_shot(sup: &Supervisor) {
    let spec = ChildSpec::new("true", std::env::temp_dir());
    let t = Instant::now();
    for _ in 0..RUNS {
        let out = tokio::process::Command::new("true")
            .output()
            .await
            .expect("true runs");
        assert!(out.status.success());
    }
    let baseline = t.elapsed();
    let t = Instant::now();
    for _ in 0..RUNS {
        let out = sup
            .run_once(&spec, None, TIMEOUT, OutputLimits::default())
            .await
            .expect("true runs");
        assert!(out.status.success());
    }
    report("run_once(true)", baseline, t.elapsed(), "µs/run", RUNS);
}

async fn streaming(sup: &Supervisor) {
    let script = format!("seq 1 {LINES}");
    let t = Instant::now();
    let mut child = tokio::process::Command::new("sh")
        .args(["-c", &script])
        .stdout(Stdio::piped())
        .spawn()
        .expect("sh runs");
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    let mut n = 0u32;
    while lines.next_line().await.expect("reads").is_some() {
        n += 1;
    }
    child.wait().await.expect("waits");
    assert_eq!(n, LINES);
    let baseline = t.elapsed();

    let spec = ChildSpec::new("sh", std::env::temp_dir()).args(["-c", &script]);
    let t = Instant::now();
    let mut child = sup.spawn_streaming(&spec).expect("spawns");
    let mut n = 0u32;
    while child.stdout.recv().await.is_some() {
        n += 1;
    }
    child.wait().await.expect("waits");
    assert_eq!(n, LINES);
    report(
        "spawn_streaming lines",
        baseline,
        t.elapsed(),
        "µs/line",
        LINES,
    );
}

/// The `npc` binary the stub is.
const NPC: &str = env!("CARGO_BIN_EXE_npc");

/// `true` through the stub (a PID namespace) vs `true` alone.
async fn stub() {
    let time = |stubbed: bool| async move {
        let t = Instant::now();
        for _ in 0..RUNS {
            let mut cmd = if stubbed {
                let mut c = tokio::process::Command::new(NPC);
                c.args([CONTAIN_COMMAND, "--", "true"]);
                c
            } else {
                tokio::process::Command::new("true")
            };
            let out = cmd.output().await.expect("true runs");
            assert!(out.status.success());
        }
        t.elapsed()
    };
    let baseline = time(false).await;
    let ours = time(true).await;
    report("`npc __contain -- true`", baseline, ours, "µs/run", RUNS);
}

/// `run_once(true)` through a contained supervisor vs the plain one.
async fn contained(plain: &Supervisor) {
    let dir = tempfile::tempdir().expect("tempdir");
    let contain = Containment::start(
        std::path::Path::new(NPC),
        dir.path(),
        &dir.path().join(".npc"),
    )
    .expect("containment starts");
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let sup = Supervisor::contained(tx, BackoffPolicy::default(), contain);
    let spec = ChildSpec::new("true", std::env::temp_dir());
    let time = |sup: &Supervisor| {
        let (sup, spec) = (sup.clone(), spec.clone());
        async move {
            let t = Instant::now();
            for _ in 0..RUNS {
                let out = sup
                    .run_once(&spec, None, TIMEOUT, OutputLimits::default())
                    .await
                    .expect("true runs");
                assert!(out.status.success());
            }
            t.elapsed()
        }
    };
    let baseline = time(plain).await;
    let ours = time(&sup).await;
    report("contained run_once(true)", baseline, ours, "µs/run", RUNS);
    sup.shutdown().await;
}

/// Component starts per measurement (each is stopped again, untimed).
const STARTS: u32 = 50;

/// `Supervisor::start` of a long-lived component (`sleep`) through a
/// contained supervisor (the stub, a PID namespace, and the wait for the
/// program's pid) vs the plain one. Each is stopped outside the timing.
async fn component_start(plain: &Supervisor) {
    let dir = tempfile::tempdir().expect("tempdir");
    let contain = Containment::start(
        std::path::Path::new(NPC),
        dir.path(),
        &dir.path().join(".npc"),
    )
    .expect("containment starts");
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let sup = Supervisor::contained(tx, BackoffPolicy::default(), contain);
    let mut spec = ChildSpec::new("sleep", std::env::temp_dir()).args(["1000"]);
    spec.stop_grace = Duration::from_secs(5);
    let time = |sup: &Supervisor| {
        let (sup, spec) = (sup.clone(), spec.clone());
        async move {
            let mut spent = Duration::ZERO;
            for _ in 0..STARTS {
                let t = Instant::now();
                let pid = sup.start("component", spec.clone()).expect("starts");
                spent += t.elapsed();
                assert!(pid > 0);
                sup.remove("component").await.expect("stops");
            }
            spent
        }
    };
    let baseline = time(plain).await;
    let ours = time(&sup).await;
    report(
        "contained component start",
        baseline,
        ours,
        "µs/start",
        STARTS,
    );
    sup.shutdown().await;
}

fn main() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let sup = Supervisor::new(tx, BackoffPolicy::default());
        one_shot(&sup).await;
        streaming(&sup).await;
        stub().await;
        contained(&sup).await;
        component_start(&sup).await;
    });
}
