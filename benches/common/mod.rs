//! Helpers the benchmarks share (each bench includes this file with
//! `#[path = "common/mod.rs"] mod common;`): the `npc` binary under test,
//! whether a peer tool is installed, and one `wrk` run on loopback.

#![allow(dead_code)] // each bench uses only some of these

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// How long each `wrk` run lasts.
pub const WRK_SECONDS: u32 = 8;
/// `wrk` connections.
pub const WRK_CONNECTIONS: u32 = 64;
/// `wrk` threads.
pub const WRK_THREADS: u32 = 2;

/// The `npc` under test: this build's, or [`OTHER_NPC_ENV`]'s when set, so
/// one bench binary (one harness) can measure another commit's `npc` —
/// alternate the two in the same run to compare them.
pub fn npc() -> PathBuf {
    std::env::var_os(OTHER_NPC_ENV)
        .filter(|p| !p.is_empty())
        .map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_npc")), PathBuf::from)
}

/// Names another `npc` for [`npc`] to return.
pub const OTHER_NPC_ENV: &str = "NPC_BENCH_NPC";

/// Whether `program` is on `PATH`.
pub fn installed(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// What one `wrk` run printed.
#[derive(Debug, Clone, Copy)]
pub struct WrkRun {
    pub requests_per_second: f64,
    pub non_2xx: u64,
    pub requests: u64,
}

/// One `wrk` run against `url` (with the Lua `script`, if any), with
/// [`WRK_THREADS`] threads, [`WRK_CONNECTIONS`] connections for [`WRK_SECONDS`].
pub fn wrk(url: &str, script: Option<&Path>) -> WrkRun {
    wrk_with(url, script, &[])
}

/// [`wrk`] with extra request `headers` (`"Name: value"` each).
pub fn wrk_with(url: &str, script: Option<&Path>, headers: &[String]) -> WrkRun {
    let mut args = vec![
        "-t".to_string(),
        WRK_THREADS.to_string(),
        "-c".to_string(),
        WRK_CONNECTIONS.to_string(),
        "-d".to_string(),
        format!("{WRK_SECONDS}s"),
    ];
    for header in headers {
        args.extend(["-H".to_string(), header.clone()]);
    }
    if let Some(script) = script {
        args.extend(["-s".to_string(), script.display().to_string()]);
    }
    args.push(url.to_string());
    let out = Command::new("wrk").args(&args).output().expect("wrk runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let number = |prefix: &str| -> Option<f64> {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(prefix))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
    };
    WrkRun {
        requests_per_second: number("Requests/sec:").unwrap_or_else(|| panic!("no rate in {text}")),
        non_2xx: number("Non-2xx or 3xx responses:").unwrap_or(0.0) as u64,
        requests: text
            .lines()
            .find(|l| l.contains("requests in"))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0),
    }
}
