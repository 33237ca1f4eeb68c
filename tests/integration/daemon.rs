//! The reconciler end to end: a real `npc daemon` on a temporary repository
//! whose manifest runs real child processes. Every wait is on an observable
//! condition (an event, a pid, a file) with a deadline.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::support::{Daemon, alive, npc, npc_path, wait_for};

const TWO_CHILDREN: &str = r#"version = 1
[mcp.servers.alpha]
command = "sleep"
args = ["1000"]
[pane_plugins.beta]
command = "sleep"
args = ["2000"]
enabled = true
allowed_resume_flags = ["--session"]
"#;

#[test]
fn editing_one_component_restarts_only_it_and_live_fields_restart_nothing() {
    let d = Daemon::start(TWO_CHILDREN);
    let alpha = wait_for("alpha running", || d.pid_of("mcp_server.alpha"));
    let beta = wait_for("beta running", || d.pid_of("pane_plugin.beta"));
    assert!(alive(alpha) && alive(beta));

    // `args` of the pane plugin replace its child; alpha keeps its pid.
    let mark = d.last_event_id();
    d.write_manifest(&TWO_CHILDREN.replace("\"2000\"", "\"2001\""));
    let applied = d.wait_event(mark, "reconcile.applied");
    assert_eq!(
        applied["payload"]["results"].as_array().unwrap().len(),
        1,
        "{applied}"
    );
    let new_beta = wait_for("beta restarted", || {
        d.pid_of("pane_plugin.beta").filter(|p| *p != beta)
    });
    assert_eq!(
        d.pid_of("mcp_server.alpha"),
        Some(alpha),
        "alpha must not restart"
    );
    assert!(alive(alpha) && alive(new_beta) && !alive(beta));

    // `allowed_resume_flags` is live: nothing restarts.
    let mark = d.last_event_id();
    d.write_manifest(
        &TWO_CHILDREN
            .replace("\"2000\"", "\"2001\"")
            .replace("[\"--session\"]", "[\"--session\", \"--last\"]"),
    );
    let applied = d.wait_event(mark, "reconcile.applied");
    let results = applied["payload"]["results"].as_array().unwrap();
    assert_eq!(results.len(), 1);
    assert_eq!(results[0]["action"], "update");
    assert_eq!(d.pid_of("mcp_server.alpha"), Some(alpha));
    assert_eq!(d.pid_of("pane_plugin.beta"), Some(new_beta));
    assert!(
        d.events_after(mark)
            .iter()
            .all(|e| e["kind"] != "component.started"),
        "a live change started a process"
    );

    // A reformatted manifest with the same meaning plans no change at all.
    d.npc(&["plan", "--detailed-exitcode"]).code(0);
}

#[test]
fn an_invalid_manifest_changes_nothing_and_says_where() {
    let d = Daemon::start(TWO_CHILDREN);
    let alpha = wait_for("alpha running", || d.pid_of("mcp_server.alpha"));
    let beta = wait_for("beta running", || d.pid_of("pane_plugin.beta"));
    let mark = d.last_event_id();
    d.write_manifest(
        &TWO_CHILDREN.replace("args = [\"1000\"]", "args = [\"1000\"]\ncomand = \"oops\""),
    );
    let invalid = d.wait_event(mark, "manifest.invalid");
    let diag = &invalid["payload"]["report"]["diagnostics"][0];
    assert_eq!(
        diag["summary"], "unknown field `comand` in `mcp.servers.alpha`",
        "{invalid}"
    );
    assert_eq!(diag["range"]["start"]["line"], 5);
    assert_eq!(diag["range"]["start"]["column"], 1);
    assert_eq!(d.pid_of("mcp_server.alpha"), Some(alpha));
    assert_eq!(d.pid_of("pane_plugin.beta"), Some(beta));
    assert!(
        d.events_after(mark)
            .iter()
            .all(|e| e["kind"] != "reconcile.planned")
    );
    // `npc status` and `npc events` still work while the manifest is broken.
    d.npc(&["status"]).success();
}

/// Fixing an invalid manifest is said (`manifest.valid`), even when the
/// fixed manifest is the one that runs (a reload that changes nothing):
/// `npc events` does not end on an error that is gone.
#[test]
fn a_fixed_manifest_says_it_is_valid_again() {
    let d = Daemon::start(TWO_CHILDREN);
    wait_for("alpha running", || d.pid_of("mcp_server.alpha"));
    assert!(
        d.events().iter().all(|e| e["kind"] != "manifest.valid"),
        "a manifest that was never invalid is not said to be valid again"
    );
    let mark = d.last_event_id();
    d.write_manifest(&format!("{TWO_CHILDREN}comand = \"oops\"\n"));
    let invalid = d.wait_event(mark, "manifest.invalid");
    let after_invalid = invalid["id"].as_i64().unwrap();
    d.write_manifest(TWO_CHILDREN);
    let valid = d.wait_event(after_invalid, "manifest.valid");
    assert_eq!(valid["payload"]["after"], "manifest.invalid", "{valid}");
    let (events, text) = d.cli_events();
    let last = events
        .iter()
        .rev()
        .find(|e| {
            e["kind"]
                .as_str()
                .is_some_and(|k| k.starts_with("manifest."))
        })
        .unwrap_or_else(|| panic!("{text}"));
    assert_eq!(last["kind"], "manifest.valid", "{text}");
    // Nothing else changed: the fixed manifest is the one that ran.
    d.npc(&["plan", "--detailed-exitcode"]).code(0);
}

#[test]
fn a_killed_child_restarts_with_backoff() {
    let d = Daemon::start(TWO_CHILDREN);
    let alpha = wait_for("alpha running", || d.pid_of("mcp_server.alpha"));
    let mark = d.last_event_id();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(alpha as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let restarting = d.wait_event(mark, "component.restarting");
    assert_eq!(restarting["component"], "mcp_server.alpha");
    assert_eq!(restarting["payload"]["attempt"], 1);
    assert!(
        restarting["payload"]["delay_ms"].as_u64().unwrap() >= 1000,
        "{restarting}"
    );
    let new_alpha = wait_for("alpha back", || {
        d.pid_of("mcp_server.alpha").filter(|p| *p != alpha)
    });
    assert!(alive(new_alpha));
    let row = d
        .status()
        .into_iter()
        .find(|c| c["id"] == "mcp_server.alpha")
        .unwrap();
    assert_eq!(row["restarts"], 1);
}

#[test]
fn sigterm_leaves_no_child_behind() {
    let mut d = Daemon::start(TWO_CHILDREN);
    let alpha = wait_for("alpha running", || d.pid_of("mcp_server.alpha"));
    let beta = wait_for("beta running", || d.pid_of("pane_plugin.beta"));
    let status = d.terminate();
    assert!(status.success(), "daemon exit: {status}");
    assert!(!alive(alpha) && !alive(beta), "a child survived the daemon");
    assert!(d.events().iter().any(|e| e["kind"] == "daemon.stopped"));
    assert!(!d.root().join(".npc/daemon.sock").exists());
}

#[test]
fn a_second_daemon_refuses_and_names_the_first() {
    let d = Daemon::start(TWO_CHILDREN);
    let out = npc()
        .current_dir(d.root())
        .arg("daemon")
        .timeout(std::time::Duration::from_secs(30))
        .assert()
        .failure();
    let stderr = String::from_utf8_lossy(&out.get_output().stderr).to_string();
    assert!(stderr.contains(&format!("pid {}", d.pid())), "{stderr}");
    // The same repository through a symlink is the same repository.
    let link = tempfile::tempdir().unwrap();
    let linked: PathBuf = link.path().join("repo");
    std::os::unix::fs::symlink(d.root(), &linked).unwrap();
    let out = npc()
        .current_dir(&linked)
        .arg("daemon")
        .timeout(std::time::Duration::from_secs(30))
        .assert()
        .failure();
    assert!(String::from_utf8_lossy(&out.get_output().stderr).contains("already runs"));
}

#[test]
fn a_component_that_fails_to_start_is_rolled_back() {
    let d = Daemon::start(TWO_CHILDREN);
    let beta = wait_for("beta running", || d.pid_of("pane_plugin.beta"));
    let mark = d.last_event_id();
    d.write_manifest(&TWO_CHILDREN.replace(
        "command = \"sleep\"\nargs = [\"2000\"]",
        "command = \"npc-test-no-such-program\"\nargs = [\"2000\"]",
    ));
    let rolled = d.wait_event(mark, "component.rolled_back");
    assert_eq!(rolled["component"], "pane_plugin.beta");
    let back = wait_for("beta running again", || d.pid_of("pane_plugin.beta"));
    assert!(alive(back));
    assert!(!alive(beta) || back == beta);
    // The manifest still differs from what runs, so the plan still shows it.
    d.npc(&["plan", "--detailed-exitcode"]).code(2);
}

#[test]
fn plan_and_apply_go_through_the_daemon() {
    let d = Daemon::start(TWO_CHILDREN);
    let alpha = wait_for("alpha running", || d.pid_of("mcp_server.alpha"));
    // Edit without the watcher seeing a difference in timing: plan shows it
    // against the daemon, apply carries it out through the daemon.
    let out = d
        .npc(&["plan", "--format", "json"])
        .success()
        .get_output()
        .stdout
        .clone();
    let plan: Value = serde_json::from_slice(&out).unwrap();
    assert!(
        plan["against"]
            .as_str()
            .unwrap()
            .starts_with("the running daemon")
    );
    assert_eq!(plan["summary"]["unchanged"], 4);
    d.npc(&["apply", "--auto-approve"])
        .success()
        .stdout(predicates::str::contains("No changes"));
    assert_eq!(d.pid_of("mcp_server.alpha"), Some(alpha));
    // SIGHUP reloads at once; with nothing changed, the reload emits
    // nothing, so the daemon's log shows it.
    let mark = d.last_event_id();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.pid() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    wait_for("the SIGHUP reload", || {
        d.log().contains("reloading: SIGHUP").then_some(())
    });
    assert!(
        d.events_after(mark).is_empty(),
        "a reload that changes nothing emits nothing"
    );
}

#[test]
fn events_follow_streams_new_events() {
    let d = Daemon::start(TWO_CHILDREN);
    let mark = d.last_event_id();
    let mut follower = Command::new(npc_path())
        .args(["events", "--follow", "--format", "json", "--since"])
        .arg(mark.to_string())
        .current_dir(d.root())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let rx = crate::support::line_channel(follower.stdout.take().unwrap());
    d.write_manifest(&TWO_CHILDREN.replace("\"1000\"", "\"1001\""));
    let mut seen = Vec::new();
    let deadline = std::time::Instant::now() + crate::support::WAIT_LIMIT;
    while !seen
        .iter()
        .any(|e: &Value| e["kind"] == "reconcile.applied")
    {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let line = rx.recv_timeout(left).expect("followed events arrive");
        seen.push(serde_json::from_str(&line).unwrap());
    }
    let ids: Vec<i64> = seen.iter().map(|e| e["id"].as_i64().unwrap()).collect();
    assert!(
        ids.windows(2).all(|w| w[1] == w[0] + 1),
        "gap or duplicate in {ids:?}"
    );
    assert_eq!(ids[0], mark + 1);
    let _ = follower.kill();
    let _ = follower.wait();
}

#[test]
fn apply_without_a_daemon_records_the_state_for_the_next_plan() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("npcagent.toml"), TWO_CHILDREN).unwrap();
    let run = |args: &[&str]| npc().current_dir(dir.path()).args(args).assert();
    run(&["plan", "--detailed-exitcode"])
        .code(2)
        .stdout(predicates::str::contains(
            "compared with nothing applied yet",
        ));
    run(&["apply"])
        .code(1)
        .stderr(predicates::str::contains("--auto-approve"));
    run(&["apply", "--auto-approve"])
        .success()
        .stdout(predicates::str::contains("starts with `npc daemon`"));
    run(&["plan", "--detailed-exitcode"])
        .code(0)
        .stdout(predicates::str::contains("the last applied state"));
    std::fs::write(
        dir.path().join("npcagent.toml"),
        TWO_CHILDREN.replace("\"1000\"", "\"1001\""),
    )
    .unwrap();
    let out = run(&["plan", "--detailed-exitcode"]).code(2);
    let text = String::from_utf8_lossy(&out.get_output().stdout).to_string();
    assert!(text.contains("-/+ mcp_server.alpha"), "{text}");
}

/// One request line on the daemon's control socket, its one answer line.
fn control_line(root: &std::path::Path, line: &str) -> Value {
    use std::io::{BufRead as _, Write as _};
    let mut stream =
        std::os::unix::net::UnixStream::connect(root.join(".npc/daemon.sock")).unwrap();
    writeln!(stream, "{line}").unwrap();
    let mut answer = String::new();
    std::io::BufReader::new(stream)
        .read_line(&mut answer)
        .unwrap();
    serde_json::from_str(&answer).unwrap()
}

#[test]
fn a_cli_and_a_daemon_of_different_control_protocols_name_both_versions() {
    use npcagent::surfaces::control::{PROTOCOL_OVERRIDE_ENV, PROTOCOL_VERSION};
    let d = Daemon::start(TWO_CHILDREN);
    // A CLI that speaks another version (the test seam stands in for an
    // older npc): an error naming both, and what to do.
    let out = npc()
        .current_dir(d.root())
        .env(PROTOCOL_OVERRIDE_ENV, "1")
        .args(["status"])
        .assert()
        .failure();
    insta::assert_snapshot!("control_protocol_skew", crate::support::stderr_of(&out));
    // A client speaking the wire by hand: without a version (as before
    // versions), or with another one, the daemon refuses and says its own.
    for line in [
        r#"{"op":"status"}"#.to_string(),
        r#"{"protocol":99,"op":"state"}"#.to_string(),
    ] {
        let answer = control_line(d.root(), &line);
        assert_eq!(answer["reply"], "error", "{answer}");
        assert_eq!(answer["protocol"], PROTOCOL_VERSION, "{answer}");
        let error = answer["error"].as_str().unwrap();
        assert!(error.contains("restart the daemon"), "{error}");
    }
    // Its own version: a typed answer, the applied state as one object.
    let answer = control_line(
        d.root(),
        &format!(r#"{{"protocol":{PROTOCOL_VERSION},"op":"state"}}"#),
    );
    assert_eq!(answer["reply"], "state", "{answer}");
    assert!(
        answer["components"]["mcp_server.alpha"]["fingerprint"].is_string(),
        "{answer}"
    );
    // The daemon serves on: the CLI of this version still gets its status.
    d.npc(&["status"])
        .success()
        .stdout(predicates::str::contains("mcp_server.alpha"));
}
