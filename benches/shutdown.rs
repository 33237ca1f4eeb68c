//! Daemon shutdown with stubborn children, through the real `npc` binary:
//! the time from SIGTERM to the daemon's exit with ten stdio servers that
//! ignore SIGTERM (so each one waits out the full stop grace and is killed),
//! against the same-run baseline of one such server. Children stop
//! concurrently, so the ratio should be close to 1 (one grace period), not
//! 10 (one grace period per child, as when they were stopped in turn).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Measurements per child count; the median is reported.
const RUNS: usize = 3;
/// Children in the measured case.
const MANY: usize = 10;
/// Longest wait for the daemon to bring its children up or to exit.
const LIMIT: Duration = Duration::from_secs(120);

/// A stdio server that ignores SIGTERM (as do the `sleep`s it runs) and says
/// it is up by creating `up.<n>`.
const STUBBORN: &str = "trap '' TERM; touch up.$1; while :; do sleep 0.05; done";

fn manifest(children: usize) -> String {
    let mut text = String::from("version = 1\n");
    for i in 0..children {
        text.push_str(&format!(
            "[mcp.servers.s{i}]\ncommand = \"sh\"\nargs = [\"-c\", \"{STUBBORN}\", \"sh\", \"{i}\"]\n"
        ));
    }
    text
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + LIMIT;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn ups(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("up."))
                .count()
        })
        .unwrap_or(0)
}

/// Start a daemon with `children` stubborn servers, then time SIGTERM → exit.
fn shutdown_time(children: usize) -> Duration {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("npcagent.toml"), manifest(children)).expect("manifest");
    let mut daemon: Child = Command::new(env!("CARGO_BIN_EXE_npc"))
        .arg("daemon")
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("npc daemon starts");
    wait_until("the children to come up", || ups(dir.path()) == children);
    let t = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(daemon.id()).expect("pid")),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    wait_until("the daemon to exit", || {
        matches!(daemon.try_wait(), Ok(Some(_)))
    });
    t.elapsed()
}

fn median(children: usize) -> Duration {
    let mut times: Vec<Duration> = (0..RUNS).map(|_| shutdown_time(children)).collect();
    times.sort();
    times[RUNS / 2]
}

fn main() {
    let one = median(1);
    let many = median(MANY);
    println!(
        "daemon shutdown, stubborn children: 1 child {:.2} s, {MANY} children {:.2} s, ratio {:.2}",
        one.as_secs_f64(),
        many.as_secs_f64(),
        many.as_secs_f64() / one.as_secs_f64()
    );
}
