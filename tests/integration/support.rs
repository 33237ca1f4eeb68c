//! Helpers shared by the integration tests: the `npc` binary, temporary
//! repositories, and waiting on conditions with a deadline (never a bare sleep).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Longest any test waits for a condition before failing.
pub const WAIT_LIMIT: Duration = Duration::from_secs(20);

/// A `Command` for the `npc` binary under test.
pub fn npc() -> assert_cmd::Command {
    assert_cmd::Command::cargo_bin("npc").expect("npc binary is built")
}

/// Path of the `npc` binary, for spawning long-running processes.
pub fn npc_path() -> PathBuf {
    assert_cmd::cargo::cargo_bin("npc")
}

/// The repository root (where Cargo.toml is).
pub fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Poll `check` until it returns `Some`, or panic after [`WAIT_LIMIT`].
/// The pause between checks is a backoff on a condition, not the
/// synchronisation itself: the test proceeds as soon as the condition holds.
pub fn wait_for<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT_LIMIT;
    let mut pause = Duration::from_millis(5);
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// Whether process `pid` is alive: `/proc/<pid>` exists and it is not a
/// zombie (orphaned zombies are reparented to an init that may never reap
/// them, and hold nothing).
pub fn alive(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .trim_start()
        .chars()
        .next();
    !matches!(state, Some('Z') | None)
}

/// Send SIGTERM to `child` (a daemon under test stops its own children
/// first) and reap it; for `Drop`, so errors are ignored.
pub fn stop_child(child: &mut std::process::Child) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = child.wait();
}

/// Send SIGTERM to `child` and wait (with the usual deadline) for its exit.
pub fn terminate_child(mut child: std::process::Child) -> std::process::ExitStatus {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    wait_for("the daemon to exit", || child.try_wait().unwrap())
}
