//! The supervisor against real processes: spawn failures, process-group
//! stop with TERM then KILL, restart policies with backoff and flap
//! detection, signals, readiness, reverse-order shutdown, drop safety, the
//! cleared environment, log files, one-shot runs and streaming runs. Every
//! wait is on an event or a condition with a deadline; survivors are checked
//! through `/proc`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use nix::sys::signal::Signal;
use npcagent::model::RestartPolicy;
use npcagent::supervisor::{
    BackoffPolicy, ChildSpec, ChildState, OutputLimits, StdioSpec, Supervisor, SupervisorError,
    SupervisorEvent, log_path,
};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;
use tokio::time::timeout;

use crate::support::{WAIT_LIMIT, alive};

/// Backoff small enough that restart tests finish at once.
fn fast_backoff() -> BackoffPolicy {
    BackoffPolicy {
        initial: Duration::from_millis(1),
        factor: 2,
        max: Duration::from_millis(5),
        reset_after: Duration::from_secs(3600),
        flap_window: Duration::from_secs(3600),
        flap_max_restarts: 3,
    }
}

fn supervisor() -> (Supervisor, mpsc::UnboundedReceiver<SupervisorEvent>) {
    let (tx, rx) = mpsc::unbounded_channel();
    (Supervisor::new(tx, fast_backoff()), rx)
}

fn sh(script: &str) -> ChildSpec {
    let mut spec = ChildSpec::new("sh", std::env::temp_dir()).args(["-c", script]);
    spec.stop_grace = Duration::from_secs(5);
    spec
}

async fn next(rx: &mut mpsc::UnboundedReceiver<SupervisorEvent>) -> SupervisorEvent {
    timeout(WAIT_LIMIT, rx.recv())
        .await
        .expect("an event arrives in time")
        .expect("the event channel is open")
}

/// Skip events until one matches.
async fn until(
    rx: &mut mpsc::UnboundedReceiver<SupervisorEvent>,
    want: impl Fn(&SupervisorEvent) -> bool,
) -> SupervisorEvent {
    loop {
        let ev = next(rx).await;
        if want(&ev) {
            return ev;
        }
    }
}

/// Wait (with a deadline) until `pid` is dead; the pause is a backoff on the
/// condition, never the synchronisation itself.
async fn wait_dead(pid: u32) {
    let mut pause = Duration::from_millis(2);
    let waited = timeout(WAIT_LIMIT, async {
        while alive(pid) {
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    })
    .await;
    assert!(waited.is_ok(), "process {pid} is still alive");
}

/// Read one line from the stdout pipe of supervised child `id`.
async fn first_stdout_line(sup: &Supervisor, id: &str) -> String {
    let pipes = sup.take_pipes(id).expect("piped child has pipes");
    let mut lines = BufReader::new(pipes.stdout.expect("stdout is piped")).lines();
    timeout(WAIT_LIMIT, lines.next_line())
        .await
        .expect("a line arrives in time")
        .expect("read works")
        .expect("a line before EOF")
}

#[tokio::test]
async fn missing_program_and_cwd_fail_synchronously() {
    let (sup, _rx) = supervisor();
    let spec = ChildSpec::new("npc-test-no-such-program", std::env::temp_dir());
    let err = sup.start("x", spec).expect_err("spawn must fail");
    assert!(matches!(err, SupervisorError::Spawn { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("`npc-test-no-such-program`"), "{msg}");
    assert!(msg.contains("`x`"), "{msg}");
    assert!(sup.status("x").is_none(), "a failed start leaves no record");

    let spec = ChildSpec::new("sh", "/nonexistent/npc-test-dir");
    let err = sup.start("y", spec).expect_err("missing cwd must fail");
    assert!(matches!(err, SupervisorError::Cwd { .. }), "{err:?}");
}

#[tokio::test]
async fn stop_kills_the_whole_process_group() {
    let (sup, mut rx) = supervisor();
    let mut spec = sh("sleep 1000 & echo $!; wait");
    spec.stdio = StdioSpec::piped();
    let pid = sup.start("tree", spec).expect("starts");
    assert_eq!(
        next(&mut rx).await,
        SupervisorEvent::Started {
            id: "tree".into(),
            pid
        }
    );
    let grandchild: u32 = first_stdout_line(&sup, "tree")
        .await
        .parse()
        .expect("a pid");
    assert!(alive(grandchild));
    sup.stop("tree").await.expect("stops");
    // The leader is reaped by the time stop returns.
    assert!(!Path::new(&format!("/proc/{pid}")).exists());
    wait_dead(grandchild).await;
    let status = sup.status("tree").expect("record kept");
    assert_eq!(status.state, ChildState::Stopped);
    assert_eq!(status.pid, None);
    assert!(matches!(
        until(&mut rx, |e| matches!(e, SupervisorEvent::Exited { .. })).await,
        SupervisorEvent::Exited {
            signal: Some(15),
            ..
        }
    ));
    assert_eq!(
        next(&mut rx).await,
        SupervisorEvent::Stopped { id: "tree".into() }
    );
}

#[tokio::test]
async fn stop_escalates_to_kill_when_term_is_ignored() {
    let (sup, mut rx) = supervisor();
    let mut spec = sh("trap '' TERM; echo ready; while :; do sleep 1; done");
    spec.stdio = StdioSpec::piped();
    spec.stop_grace = Duration::from_millis(200);
    let pid = sup.start("stubborn", spec).expect("starts");
    assert_eq!(first_stdout_line(&sup, "stubborn").await, "ready");
    sup.stop("stubborn").await.expect("stops");
    assert!(!alive(pid));
    let exited = until(&mut rx, |e| matches!(e, SupervisorEvent::Exited { .. })).await;
    assert_eq!(
        exited,
        SupervisorEvent::Exited {
            id: "stubborn".into(),
            pid,
            code: None,
            signal: Some(9)
        }
    );
    let last = sup.status("stubborn").and_then(|s| s.last_exit);
    assert_eq!(last.and_then(|e| e.signal), Some(9));
}

#[tokio::test]
async fn on_failure_restarts_with_backoff_then_flapping_marks_failed() {
    let (sup, mut rx) = supervisor();
    let mut spec = sh("exit 3");
    spec.restart = RestartPolicy::OnFailure;
    sup.start("crashy", spec).expect("starts");
    let mut attempts = Vec::new();
    let reason = loop {
        match next(&mut rx).await {
            SupervisorEvent::Restarting { attempt, delay, .. } => {
                assert!(delay <= fast_backoff().max);
                attempts.push(attempt);
            }
            SupervisorEvent::Exited { code, .. } => assert_eq!(code, Some(3)),
            SupervisorEvent::Failed { reason, .. } => break reason,
            SupervisorEvent::Started { .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(attempts, [1, 2, 3]);
    assert!(reason.contains("restarted 3 times"), "{reason}");
    assert!(reason.contains("limit 3"), "{reason}");
    let status = sup.status("crashy").expect("record");
    assert_eq!(status.state, ChildState::Failed);
    assert_eq!(status.restarts, 3);
    assert_eq!(status.last_exit.and_then(|e| e.code), Some(3));
}

#[tokio::test]
async fn never_policy_leaves_the_child_exited_and_on_failure_ignores_success() {
    let (sup, mut rx) = supervisor();
    let mut spec = sh("exit 0");
    spec.restart = RestartPolicy::OnFailure;
    sup.start("clean", spec).expect("starts");
    let mut spec = sh("exit 1");
    spec.restart = RestartPolicy::Never;
    sup.start("never", spec).expect("starts");
    let mut exited = BTreeMap::new();
    while exited.len() < 2 {
        if let SupervisorEvent::Exited { id, code, .. } = next(&mut rx).await {
            exited.insert(id, code);
        }
    }
    assert_eq!(exited["clean"], Some(0));
    assert_eq!(exited["never"], Some(1));
    for id in ["clean", "never"] {
        let status = sup.status(id).expect("record");
        assert_eq!(status.state, ChildState::Exited, "{id}");
        assert_eq!(status.restarts, 0, "{id}");
    }
    // Starting an exited child again is allowed.
    sup.start("never", sh("exit 0")).expect("restartable");
}

#[tokio::test]
async fn always_policy_restarts_after_a_clean_exit() {
    let (sup, mut rx) = supervisor();
    let mut spec = sh("exit 0");
    spec.restart = RestartPolicy::Always;
    let first = sup.start("loop", spec).expect("starts");
    let second = until(
        &mut rx,
        |e| matches!(e, SupervisorEvent::Started { pid, .. } if *pid != first),
    )
    .await;
    assert!(matches!(second, SupervisorEvent::Started { .. }));
    sup.shutdown().await;
}

#[tokio::test]
async fn stop_during_backoff_cancels_the_restart() {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let sup = Supervisor::new(
        tx,
        BackoffPolicy {
            initial: Duration::from_secs(3600),
            max: Duration::from_secs(3600),
            ..fast_backoff()
        },
    );
    let mut spec = sh("exit 1");
    spec.restart = RestartPolicy::OnFailure;
    sup.start("slow", spec).expect("starts");
    until(&mut rx, |e| matches!(e, SupervisorEvent::Restarting { .. })).await;
    assert_eq!(
        sup.status("slow").map(|s| s.state),
        Some(ChildState::Backoff)
    );
    let err = sup
        .signal("slow", Signal::SIGHUP)
        .await
        .expect_err("no process");
    assert!(matches!(err, SupervisorError::NotRunning { .. }), "{err:?}");
    sup.stop("slow").await.expect("stops");
    assert_eq!(
        next(&mut rx).await,
        SupervisorEvent::Stopped { id: "slow".into() }
    );
    assert_eq!(
        sup.status("slow").map(|s| s.state),
        Some(ChildState::Stopped)
    );
}

#[tokio::test]
async fn signal_reaches_the_child() {
    let (sup, mut rx) = supervisor();
    let mut spec =
        sh("trap 'echo hup; exit 7' HUP; echo ready; while :; do sleep 1 & wait $!; done");
    spec.stdio = StdioSpec::piped();
    sup.start("hup", spec).expect("starts");
    let pipes = sup.take_pipes("hup").expect("pipes");
    let mut lines = BufReader::new(pipes.stdout.expect("stdout")).lines();
    let ready = timeout(WAIT_LIMIT, lines.next_line()).await;
    assert_eq!(
        ready.ok().and_then(|l| l.ok()).flatten().as_deref(),
        Some("ready")
    );
    sup.signal("hup", Signal::SIGHUP).await.expect("signals");
    let hup = timeout(WAIT_LIMIT, lines.next_line()).await;
    assert_eq!(
        hup.ok().and_then(|l| l.ok()).flatten().as_deref(),
        Some("hup")
    );
    let exited = until(&mut rx, |e| matches!(e, SupervisorEvent::Exited { .. })).await;
    assert!(matches!(
        exited,
        SupervisorEvent::Exited { code: Some(7), .. }
    ));
    let err = sup
        .signal("nobody", Signal::SIGHUP)
        .await
        .expect_err("unknown");
    assert!(matches!(err, SupervisorError::UnknownChild { .. }));
    sup.shutdown().await;
}

#[tokio::test]
async fn readiness_succeeds_for_a_long_runner_and_fails_for_a_quick_exit() {
    let (sup, mut rx) = supervisor();
    let pid = sup
        .start_and_wait_ready("up", sh("exec sleep 1000"), Duration::from_millis(50))
        .await
        .expect("comes up");
    let status = sup.status("up").expect("record");
    assert_eq!(status.state, ChildState::Running);
    assert_eq!(status.pid, Some(pid));
    let err = sup
        .start_and_wait_ready("up", sh("exec sleep 1000"), Duration::from_millis(50))
        .await
        .expect_err("already running");
    assert!(matches!(err, SupervisorError::AlreadyRunning { .. }));

    let mut spec = sh("exit 2");
    spec.restart = RestartPolicy::Always;
    let err = sup
        .start_and_wait_ready("down", spec, Duration::from_secs(60))
        .await
        .expect_err("exits during grace");
    let msg = err.to_string();
    assert!(matches!(err, SupervisorError::NotReady { .. }), "{err:?}");
    assert!(msg.contains("exit code 2"), "{msg}");
    assert_eq!(
        sup.status("down").map(|s| s.state),
        Some(ChildState::Failed)
    );
    let failed = until(&mut rx, |e| matches!(e, SupervisorEvent::Failed { .. })).await;
    assert!(matches!(failed, SupervisorEvent::Failed { ref id, .. } if id == "down"));
    // A failed readiness is not restarted even under `always`.
    sup.shutdown().await;
    while let Ok(ev) = rx.try_recv() {
        assert!(
            !matches!(ev, SupervisorEvent::Restarting { ref id, .. } if id == "down"),
            "{ev:?}"
        );
    }
    assert!(!alive(pid));
}

#[tokio::test]
async fn shutdown_stops_every_child_and_is_idempotent() {
    let (sup, mut rx) = supervisor();
    let mut pids = Vec::new();
    for id in ["a", "b", "c"] {
        pids.push(sup.start(id, sh("exec sleep 1000")).expect("starts"));
    }
    sup.shutdown().await;
    let mut stopped = Vec::new();
    while let Ok(ev) = rx.try_recv() {
        if let SupervisorEvent::Stopped { id } = ev {
            stopped.push(id);
        }
    }
    // Children stop concurrently, so the order of their events is free.
    stopped.sort();
    assert_eq!(stopped, ["a", "b", "c"]);
    for pid in pids {
        assert!(!Path::new(&format!("/proc/{pid}")).exists(), "{pid} reaped");
    }
    sup.shutdown().await;
    assert!(rx.try_recv().is_err(), "a second shutdown does nothing");
    let err = sup.start("d", sh("exit 0")).expect_err("refused");
    assert!(matches!(err, SupervisorError::ShuttingDown));
}

#[tokio::test]
async fn dropping_the_supervisor_kills_process_groups() {
    let (sup, _rx) = supervisor();
    let mut spec = sh("sleep 1000 & echo $!; wait");
    spec.stdio = StdioSpec::piped();
    let pid = sup.start("orphan", spec).expect("starts");
    let grandchild: u32 = first_stdout_line(&sup, "orphan")
        .await
        .parse()
        .expect("a pid");
    drop(sup);
    wait_dead(pid).await;
    wait_dead(grandchild).await;
}

#[tokio::test]
async fn restart_replaces_the_running_process() {
    let (sup, _rx) = supervisor();
    let old = sup.start("svc", sh("exec sleep 1000")).expect("starts");
    let new = sup
        .restart("svc", sh("exec sleep 1000"))
        .await
        .expect("restarts");
    assert_ne!(old, new);
    assert!(!alive(old));
    assert!(alive(new));
    sup.shutdown().await;
    assert!(!alive(new));
}

#[tokio::test]
async fn children_get_a_cleared_environment_and_their_cwd() {
    let (sup, _rx) = supervisor();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut spec = ChildSpec::new("sh", dir.path()).args(["-c", "env; echo cwd=$(pwd -P)"]);
    spec.env.insert("NPC_DECLARED".into(), "yes".into());
    let out = sup
        .run_once(&spec, None, WAIT_LIMIT, OutputLimits::default())
        .await
        .expect("runs");
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let allowed = [
        "PATH",
        "HOME",
        "LANG",
        "TERM",
        "NPC_DECLARED",
        "PWD",
        "SHLVL",
        "_",
        "OLDPWD",
    ];
    for line in text.lines().filter(|l| !l.starts_with("cwd=")) {
        let key = line.split('=').next().unwrap_or_default();
        assert!(allowed.contains(&key), "leaked variable {line}");
    }
    assert!(text.lines().any(|l| l == "NPC_DECLARED=yes"), "{text}");
    // cargo sets CARGO_* for the test process; none may reach the child.
    assert!(std::env::var("CARGO_MANIFEST_DIR").is_ok());
    assert!(!text.contains("CARGO_"), "{text}");
    let cwd = dir.path().canonicalize().expect("canonical");
    assert!(text.contains(&format!("cwd={}", cwd.display())), "{text}");
}

#[tokio::test]
async fn output_can_be_appended_to_a_log_file() {
    let (sup, mut rx) = supervisor();
    let state = tempfile::tempdir().expect("tempdir");
    let log = log_path(state.path(), "mcp_server/fs");
    let mut spec = sh("echo out; echo err >&2");
    spec.stdio = StdioSpec::log_to(&log);
    for _ in 0..2 {
        sup.start("mcp_server/fs", spec.clone()).expect("starts");
        until(&mut rx, |e| matches!(e, SupervisorEvent::Exited { .. })).await;
    }
    let text = std::fs::read_to_string(&log).expect("log written");
    assert_eq!(text.matches("out\n").count(), 2, "{text}");
    assert_eq!(text.matches("err\n").count(), 2, "{text}");
}

#[tokio::test]
async fn run_once_feeds_stdin_and_bounds_output() {
    let (sup, _rx) = supervisor();
    let cat = ChildSpec::new("cat", std::env::temp_dir());
    let out = sup
        .run_once(
            &cat,
            Some(b"hello\n".to_vec()),
            WAIT_LIMIT,
            OutputLimits::default(),
        )
        .await
        .expect("runs");
    assert_eq!(out.stdout, b"hello\n");
    assert!(out.status.success());
    assert!(!out.timed_out && !out.stdout_truncated);

    let big = sh("head -c 100000 /dev/zero; head -c 5000 /dev/zero >&2; exit 4");
    let limits = OutputLimits {
        stdout: 1000,
        stderr: 10,
    };
    let out = sup
        .run_once(&big, None, WAIT_LIMIT, limits)
        .await
        .expect("runs");
    assert_eq!(out.stdout.len(), 1000);
    assert_eq!(out.stderr.len(), 10);
    assert!(out.stdout_truncated && out.stderr_truncated);
    assert_eq!(out.status.code, Some(4));
}

#[tokio::test]
async fn run_once_timeout_kills_the_group() {
    let (sup, _rx) = supervisor();
    let spec = sh("sleep 1000 & echo $!; wait");
    let out = sup
        .run_once(
            &spec,
            None,
            Duration::from_millis(200),
            OutputLimits::default(),
        )
        .await
        .expect("runs");
    assert!(out.timed_out);
    assert_eq!(out.status.signal, Some(9));
    let grandchild: u32 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("a pid");
    wait_dead(grandchild).await;
}

#[tokio::test]
async fn run_once_does_not_wait_for_background_leftovers() {
    let (sup, _rx) = supervisor();
    let spec = sh("sleep 1000 & echo $!");
    let out = sup
        .run_once(&spec, None, WAIT_LIMIT, OutputLimits::default())
        .await
        .expect("runs");
    assert!(!out.timed_out);
    assert!(out.status.success());
    let leftover: u32 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("a pid");
    wait_dead(leftover).await;
}

#[tokio::test]
async fn streaming_hands_out_lines_and_the_exit_status() {
    let (sup, _rx) = supervisor();
    let spec = sh("printf 'a\\nb\\377\\n'; echo oops >&2; exit 4");
    let mut child = sup.spawn_streaming(&spec).expect("spawns");
    let mut out = Vec::new();
    while let Some(line) = timeout(WAIT_LIMIT, child.stdout.recv())
        .await
        .expect("in time")
    {
        out.push(line.text().into_owned());
    }
    assert_eq!(out, ["a", "b\u{fffd}"]);
    let err = timeout(WAIT_LIMIT, child.stderr.recv())
        .await
        .expect("in time");
    assert_eq!(err.map(|l| l.bytes), Some(b"oops".to_vec()));
    assert_eq!(child.wait().await.expect("waits").code, Some(4));
}

#[tokio::test]
async fn streaming_kill_group_cancels_the_run() {
    let (sup, _rx) = supervisor();
    let mut child = sup
        .spawn_streaming(&sh("sleep 1000 & echo $!; wait"))
        .expect("spawns");
    let line = timeout(WAIT_LIMIT, child.stdout.recv())
        .await
        .expect("in time")
        .expect("a line");
    let grandchild: u32 = line.text().parse().expect("a pid");
    let killer = child.killer();
    let wait = child.wait();
    killer.kill().expect("kills");
    let exit = timeout(WAIT_LIMIT, wait)
        .await
        .expect("in time")
        .expect("waits");
    assert_eq!(exit.signal, Some(9));
    wait_dead(grandchild).await;
    // After reaping, killing again is a harmless no-op.
    child.kill_group().expect("no-op");
}

#[tokio::test]
async fn dropping_a_streaming_child_kills_its_group() {
    let (sup, _rx) = supervisor();
    let mut child = sup
        .spawn_streaming(&sh("sleep 1000 & echo $!; wait"))
        .expect("spawns");
    let pid = child.pid();
    let line = timeout(WAIT_LIMIT, child.stdout.recv())
        .await
        .expect("in time")
        .expect("a line");
    let grandchild: u32 = line.text().parse().expect("a pid");
    drop(child);
    wait_dead(grandchild).await;
    wait_dead(pid).await;
}

/// Environment variable that turns [`helper_supervise_and_block`] on.
const HELPER_ENV: &str = "NPC_SUPERVISOR_TEST_HELPER";
/// Line prefix the helper prints before its supervised child's pid.
const HELPER_PID_PREFIX: &str = "SUPERVISED_PID=";

/// Not a test: the body of the daemon process in
/// [`children_die_when_the_daemon_is_killed`]. It supervises a sleeper,
/// prints its pid, and blocks until killed.
#[tokio::test]
#[ignore = "helper process for children_die_when_the_daemon_is_killed"]
async fn helper_supervise_and_block() {
    if std::env::var_os(HELPER_ENV).is_none() {
        return;
    }
    let (sup, _rx) = supervisor();
    let pid = sup.start("sleeper", sh("exec sleep 1000")).expect("starts");
    println!("{HELPER_PID_PREFIX}{pid}");
    std::future::pending::<()>().await;
}

#[test]
fn children_die_when_the_daemon_is_killed() {
    use std::io::BufRead;
    let exe = std::env::current_exe().expect("test binary path");
    let mut daemon = std::process::Command::new(exe)
        .args([
            "--exact",
            "supervisor::helper_supervise_and_block",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(HELPER_ENV, "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("helper starts");
    let stdout = daemon.stdout.take().expect("piped");
    let pid: u32 = std::io::BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        // libtest prints the test name on the same line, before the marker.
        .find_map(|l| {
            l.split_once(HELPER_PID_PREFIX)
                .map(|(_, p)| p.trim().to_owned())
        })
        .expect("helper reports its child's pid")
        .parse()
        .expect("a pid");
    assert!(alive(pid));
    daemon.kill().expect("SIGKILL the daemon");
    daemon.wait().expect("reap the daemon");
    crate::support::wait_for("the child of a killed daemon to die", || {
        (!alive(pid)).then_some(())
    });
}
