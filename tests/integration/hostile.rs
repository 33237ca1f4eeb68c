//! Regression tests for a hostile repository: everything a repository
//! contains is untrusted input. One test per failure found, named after it,
//! each driving the real `npc` binary. Sections follow the numbered items of
//! the "safe in a hostile repository" issue.

#![allow(unused_imports)]

use crate::support::*;

// ---------------------------------------------------------------------------
// §1. one guarded layer for every file npc touches on a repository's behalf
//
// (tests for §1 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// §2. templates cannot hang or exhaust the daemon
//
// (tests for §2 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// §3. `npc import` never turns data into configuration
//
// (tests for §3 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// §4. the daemon keeps serving and keeps converging
//
// (tests for §4 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// §5. no orphans, fast shutdown
//
// (tests for §5 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// §6. bounded memory on every input
//
// (tests for §6 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// §7. redaction that is exact
//
// (tests for §7 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// §8. output and errors a user can act on
//
// (tests for §8 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------

/// A temporary repository holding `manifest` as `npcagent.toml`.
fn s8_repo(manifest: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("npcagent.toml"), manifest).unwrap();
    dir
}

/// `npc ARGS` in `dir` with stdout a pipe whose reader is already gone, so
/// the first write fails with EPIPE (what `npc events | head -1` meets once
/// `head` has exited).
fn s8_into_closed_pipe(dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    let (read, write) = nix::unistd::pipe().unwrap();
    drop(read);
    std::process::Command::new(npc_path())
        .args(args)
        .current_dir(dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::from(write))
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap()
}

const S8_EVENTFUL: &str =
    "version = 1\n[mcp.servers.alpha]\ncommand = \"sleep\"\nargs = [\"1000\"]\n";

#[test]
fn events_into_a_closed_pipe_ends_quietly_without_a_panic() {
    let dir = s8_repo(S8_EVENTFUL);
    {
        // through the daemon, following too: the first write meets EPIPE
        let _daemon = S8Daemon::start(dir.path());
        for args in [&["events"][..], &["events", "--follow"], &["status"]] {
            let out = s8_into_closed_pipe(dir.path(), args);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                !stderr.contains("panicked"),
                "npc {args:?} panicked: {stderr}"
            );
            assert_eq!(out.status.code(), Some(0), "npc {args:?}: {stderr}");
            assert!(stderr.is_empty(), "npc {args:?} is not quiet: {stderr}");
        }
    }
    // without a daemon, from the store the daemon left
    let listed = npc()
        .current_dir(dir.path())
        .args(["events", "--format", "json"])
        .output()
        .unwrap();
    assert!(!listed.stdout.is_empty(), "the store holds events to print");
    for args in [
        &["events"][..],
        &["events", "--format", "json"],
        &["events", "--follow"],
        &["schema"],
        &["validate"],
        &["validate", "--format", "json"],
        &["plan"],
        &["status"],
        &["completions", "bash"],
        &["--help"],
        &["--version"],
        &["render", "profile", "nope"],
    ] {
        let out = s8_into_closed_pipe(dir.path(), args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !stderr.contains("panicked"),
            "npc {args:?} panicked: {stderr}"
        );
        assert_ne!(out.status.code(), Some(101), "npc {args:?}: {stderr}");
        if args != ["render", "profile", "nope"] {
            assert_eq!(out.status.code(), Some(0), "npc {args:?}: {stderr}");
            assert!(stderr.is_empty(), "npc {args:?} is not quiet: {stderr}");
        }
    }
}

#[test]
fn run_into_a_closed_pipe_lets_the_agent_finish_and_records_it() {
    let repo = s9_fake_agent_repo("codex", "codex/0.171.0/tool_call.jsonl", &[]);
    for format in ["json", "human"] {
        let out = s8_into_closed_pipe(
            repo.path(),
            &["run", "dev", "--prompt", "go", "--format", format],
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert_eq!(
            out.status.code(),
            Some(0),
            "the run's own outcome: {stderr}"
        );
    }
    let finished: Vec<serde_json::Value> = s9_recorded_events(repo.path())
        .into_iter()
        .filter(|e| e["kind"] == "run.finished")
        .collect();
    assert_eq!(finished.len(), 2);
    assert!(
        finished
            .iter()
            .all(|e| e["payload"]["outcome"] == "succeeded")
    );
}

#[test]
fn events_piped_into_head_exits_zero_under_pipefail() {
    let dir = s8_repo(S8_EVENTFUL);
    npc()
        .current_dir(dir.path())
        .args(["apply", "--auto-approve"])
        .assert()
        .success();
    // `npc schema` is longer than a pipe buffer, so `head -1` closes the pipe
    // while npc still writes.
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg("set -o pipefail; \"$NPC\" schema | head -1 >/dev/null && \"$NPC\" events | head -1 >/dev/null")
        .env("NPC", npc_path())
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
}

#[test]
fn output_to_a_full_disk_is_an_error_message_and_exit_1() {
    let dir = s8_repo(S8_EVENTFUL);
    for args in [
        &["schema"][..],
        &["validate", "--format", "json"],
        &["plan"],
        &["completions", "zsh"],
        &["--help"],
    ] {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let out = std::process::Command::new(npc_path())
            .args(args)
            .current_dir(dir.path())
            .stdout(full)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !stderr.contains("panicked"),
            "npc {args:?} panicked: {stderr}"
        );
        assert_eq!(out.status.code(), Some(1), "npc {args:?}: {stderr}");
        assert!(
            stderr.contains("cannot write to stdout") && stderr.contains("No space left on device"),
            "npc {args:?}: {stderr}"
        );
    }
}

#[test]
fn a_closed_stderr_does_not_panic_either() {
    // The error for a missing manifest goes to stderr, whose reader is gone:
    // the exit status stays the usage error it is, not a panic's 101.
    let dir = tempfile::tempdir().unwrap();
    let (read, write) = nix::unistd::pipe().unwrap();
    drop(read);
    let out = std::process::Command::new(npc_path())
        .args(["validate", "missing.toml"])
        .current_dir(dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::from(write))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn hints_name_only_commands_that_exist() {
    // The unit test `cli::tests::every_npc_command_named_in_src_exists`
    // checks every hint in the source; through the binary, the plugin hint
    // validate gives for a missing package names no command npc lacks.
    let dir = s8_repo("version = 1\n[plugins.lint]\npath = \"plugins/lint\"\n");
    let out = npc()
        .current_dir(dir.path())
        .arg("validate")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("plugins/lint") || stderr.contains("plugins/lint"),
        "{stdout}{stderr}"
    );
    assert!(
        !stdout.contains("npc plugin") && !stderr.contains("npc plugin"),
        "{stdout}{stderr}"
    );
}

/// A daemon on `dir`, stopped with SIGTERM on drop.
struct S8Daemon(std::process::Child);

impl S8Daemon {
    fn start(dir: &std::path::Path) -> Self {
        let child = std::process::Command::new(npc_path())
            .arg("daemon")
            .current_dir(dir)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let daemon = Self(child);
        wait_for("the daemon's first apply", || {
            let out = npc()
                .current_dir(dir)
                .args(["events", "--format", "json"])
                .output()
                .ok()?;
            String::from_utf8_lossy(&out.stdout)
                .contains("\"reconcile.applied\"")
                .then_some(())
        });
        daemon
    }
}

impl Drop for S8Daemon {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.0.wait();
    }
}

const S8_UNRUN_KINDS: &str = r#"version = 1
[mcp.servers.remote]
url = "https://mcp.example.com/mcp"
[providers.claude]
kind = "claude_code"
[[hooks.on_agent_end]]
command = "true"
[triggers.poll]
kind = "cron"
schedule = "15m"
action = { command = "true" }
"#;

#[test]
fn apply_says_declared_for_kinds_nothing_runs() {
    let dir = s8_repo(S8_UNRUN_KINDS);
    let out = npc()
        .current_dir(dir.path())
        .args(["apply", "--auto-approve"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let line = |id: &str| {
        text.lines()
            .find(|l| l.contains(&format!(" {id}: ")))
            .unwrap_or_else(|| panic!("no `{id}` in {text}"))
            .to_string()
    };
    assert!(
        line("trigger.poll").ends_with("declared (not run yet)"),
        "{text}"
    );
    assert!(
        line("hooks.on_agent_end").ends_with("declared (not run yet)"),
        "{text}"
    );
    assert!(line("mcp_server.remote").ends_with("configured"), "{text}");
    assert!(!text.contains(": applied"), "{text}");
    // removing a declared trigger says so
    std::fs::write(
        dir.path().join("npcagent.toml"),
        S8_UNRUN_KINDS.split("[triggers.poll]").next().unwrap(),
    )
    .unwrap();
    let out = npc()
        .current_dir(dir.path())
        .args(["apply", "--auto-approve"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines().any(|l| l.contains("trigger.poll: removed")),
        "{text}"
    );
}

#[test]
fn status_shows_triggers_and_hooks_as_declared_not_applied() {
    let dir = s8_repo(S8_UNRUN_KINDS);
    let _daemon = S8Daemon::start(dir.path());
    let out = npc()
        .current_dir(dir.path())
        .args(["status", "--format", "json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = doc["components"].as_array().unwrap();
    let state = |id: &str| {
        rows.iter()
            .find(|c| c["id"] == id)
            .unwrap_or_else(|| panic!("no `{id}` in {doc}"))["state"]
            .clone()
    };
    assert_eq!(state("trigger.poll"), "declared");
    assert_eq!(state("hooks.on_agent_end"), "declared");
    assert_eq!(state("mcp_server.remote"), "configured");
    assert_eq!(state("provider.claude"), "ready");
    assert!(rows.iter().all(|c| c["state"] != "applied"), "{doc}");
    assert!(
        rows.iter()
            .filter(|c| c["state"] == "declared")
            .all(|c| c["detail"]
                .as_str()
                .is_some_and(|d| d.contains("nothing runs it"))),
        "{doc}"
    );
    let human = npc()
        .current_dir(dir.path())
        .arg("status")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&human.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("trigger.poll"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("declared (not run yet)"), "{text}");
    assert!(!text.contains("applied"), "{text}");
}

// ---------------------------------------------------------------------------
// §9. correctness found by the audit
//
// (tests for §9 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------

/// A repository whose profile `dev` runs a copy of the fake agent as
/// `kind`, replaying a copy of `fixture` (relative to `fixtures/clis`),
/// with nothing pointing into the source tree.
fn s9_fake_agent_repo(kind: &str, fixture: &str, extra_env: &[(&str, &str)]) -> tempfile::TempDir {
    let text = std::fs::read(repo_root().join("fixtures/clis").join(fixture)).unwrap();
    s9_fake_agent_repo_replaying(kind, &text, extra_env)
}

/// [`s9_fake_agent_repo`] replaying `transcript` as given.
fn s9_fake_agent_repo_replaying(
    kind: &str,
    transcript: &[u8],
    extra_env: &[(&str, &str)],
) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let agent = dir.path().join("fake-agent.py");
    std::fs::copy(repo_root().join("fixtures/clis/fake-agent.py"), &agent).unwrap();
    let transcript_path = dir.path().join("transcript.jsonl");
    std::fs::write(&transcript_path, transcript).unwrap();
    let transcript = transcript_path;
    let quote = |s: &str| serde_json::Value::String(s.to_string()).to_string();
    let env: Vec<String> = extra_env
        .iter()
        .map(|(k, v)| format!("{k} = {}", quote(v)))
        .collect();
    let manifest = format!(
        "version = 1\n[providers.fake]\nkind = \"{kind}\"\ncommand = {}\nargs = [\"--provider\", \"{kind}\", \"--fixture\", {}]\nenv = {{ {} }}\n[profiles.dev]\nprovider = \"fake\"\ndescription = \"replays a transcript\"\n",
        quote(&agent.display().to_string()),
        quote(&transcript.display().to_string()),
        env.join(", "),
    );
    std::fs::write(dir.path().join("npcagent.toml"), manifest).unwrap();
    dir
}

/// The agent events `npc run --format json` printed.
fn s9_json_lines(stdout: &[u8]) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

#[test]
fn drift_detection_works_from_a_binary_installed_outside_the_source_tree() {
    let install = tempfile::tempdir().unwrap();
    let npc_copy = install.path().join("npc");
    std::fs::copy(npc_path(), &npc_copy).unwrap();
    // The binary names no file in the source tree's fixtures…
    let binary = std::fs::read(&npc_copy).unwrap();
    let source_fixtures = repo_root().join("fixtures/clis");
    let needle = source_fixtures.to_str().unwrap().as_bytes();
    assert!(
        !binary.windows(needle.len()).any(|w| w == needle),
        "the binary still refers to {}",
        source_fixtures.display()
    );
    // …and, run with the source fixtures hidden (an empty tmpfs over them in
    // a private mount namespace, where the system allows one), it still
    // notices that Codex's old `{id, msg}` output is not the 0.171.0 format.
    let repo = s9_fake_agent_repo("codex", "codex/0.9.0/idle.jsonl", &[]);
    let hide = std::process::Command::new("unshare")
        .args(["-m", "sh", "-c", "mount -t tmpfs tmpfs \"$1\"", "sh"])
        .arg(&source_fixtures)
        .status()
        .is_ok_and(|s| s.success());
    let mut cmd = if hide {
        let mut c = std::process::Command::new("unshare");
        c.args([
            "-m",
            "sh",
            "-c",
            "mount -t tmpfs tmpfs \"$1\" && shift && exec \"$@\"",
            "sh",
        ])
        .arg(&source_fixtures)
        .arg(&npc_copy);
        c
    } else {
        eprintln!(
            "note: no private mount namespace here; running the copy with the source tree visible"
        );
        std::process::Command::new(&npc_copy)
    };
    let out = cmd
        .args(["run", "dev", "--prompt", "go", "--format", "json"])
        .env_remove("CARGO_MANIFEST_DIR")
        .current_dir(repo.path())
        .output()
        .unwrap();
    let events = s9_json_lines(&out.stdout);
    let drift = events
        .iter()
        .find(|e| e["type"] == "cli_detection.drift_detected")
        .unwrap_or_else(|| {
            panic!(
                "no drift event: {events:#?}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    assert_eq!(drift["fixture_version"], "0.171.0");
    assert_eq!(drift["provider"], "codex");
    assert!(
        !events
            .iter()
            .any(|e| e["type"] == "agent.error" && e["kind"] == "detection"),
        "{events:#?}"
    );
}

#[test]
fn opencode_seed_shaped_transcript_parses_through_npc_run() {
    let repo = s9_fake_agent_repo("opencode", "opencode/seed-000/kinds.jsonl", &[]);
    let out = npc()
        .current_dir(repo.path())
        .args(["run", "dev", "--prompt", "go", "--format", "json"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    // Unlike the newest recording, so the guard may report drift once; the
    // next strategy reads the same JSON.
    let events: Vec<serde_json::Value> = s9_json_lines(&out.stdout)
        .into_iter()
        .filter(|e| e["type"] != "cli_detection.drift_detected")
        .collect();
    let types: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(
        types,
        [
            "agent.message",
            "agent.tool_call",
            "agent.tool_result",
            "agent.tool_call",
            "agent.tool_result",
            "agent.message",
            "agent.usage",
            "agent.idle"
        ],
        "{events:#?}"
    );
    assert!(
        !events.iter().any(|e| e["kind"] == "unknown_event"),
        "{events:#?}"
    );
    assert_eq!(events[1]["name"], "bash");
    assert_eq!(events[4]["is_error"], true);
}

/// Recorded events of the repository, as JSON.
fn s9_recorded_events(dir: &std::path::Path) -> Vec<serde_json::Value> {
    let out = npc()
        .current_dir(dir)
        .args(["events", "--format", "json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    s9_json_lines(&out.stdout)
}

#[test]
fn gemini_idle_probe_is_sent_by_npc_run_when_the_agent_goes_quiet() {
    // The agent starts a turn, then says nothing until it is probed; the
    // probe's newline makes it finish the turn.
    let first = concat!(
        r#"{"type":"init","session_id":"g-1","model":"gemini-2.5-pro"}"#,
        "\n",
        r#"{"type":"message","role":"user","content":"go"}"#,
        "\n"
    );
    let rest = concat!(
        r#"{"type":"message","role":"assistant","content":"Still here.","delta":true}"#,
        "\n",
        r#"{"type":"result","status":"success","stats":{"input_tokens":3,"output_tokens":2}}"#,
        "\n"
    );
    let scratch = tempfile::tempdir().unwrap();
    let after = scratch.path().join("after.jsonl");
    std::fs::write(&after, rest).unwrap();
    let stdin_file = scratch.path().join("stdin.bin");
    let repo = s9_fake_agent_repo_replaying(
        "gemini_cli",
        first.as_bytes(),
        &[
            ("FAKE_AGENT_AFTER_PROBE", after.to_str().unwrap()),
            ("FAKE_AGENT_STDIN_FILE", stdin_file.to_str().unwrap()),
        ],
    );
    let out = npc()
        .current_dir(repo.path())
        .args([
            "run",
            "dev",
            "--prompt",
            "go",
            "--format",
            "json",
            "--probe-after",
            "1",
            "--timeout",
            "60",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(
        std::fs::read(&stdin_file).unwrap(),
        b"\n",
        "the probe is a newline"
    );
    let printed = s9_json_lines(&out.stdout);
    assert!(
        printed
            .iter()
            .any(|e| e["type"] == "agent.idle" && e["status"] == "success"),
        "{printed:#?}"
    );
    let kinds: Vec<String> = s9_recorded_events(repo.path())
        .iter()
        .filter_map(|e| e["kind"].as_str().map(str::to_string))
        .filter(|k| k.starts_with("run.probe") || k == "agent.idle")
        .collect();
    assert_eq!(
        kinds,
        ["run.probe_sent", "run.probe_answered", "agent.idle"],
        "one probe, answered, then the turn ends"
    );
}

#[test]
fn agents_that_are_not_probed_get_their_stdin_closed_at_once() {
    // The same fake agent as a Claude Code provider: stdin is EOF at once,
    // so it exits 3 without waiting for a probe that never comes.
    let after = tempfile::NamedTempFile::new().unwrap();
    let repo = s9_fake_agent_repo(
        "claude_code",
        "claude_code/2.1.197/boot.jsonl",
        &[("FAKE_AGENT_AFTER_PROBE", after.path().to_str().unwrap())],
    );
    let out = npc()
        .current_dir(repo.path())
        .args([
            "run",
            "dev",
            "--prompt",
            "go",
            "--format",
            "json",
            "--probe-after",
            "1",
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !s9_recorded_events(repo.path()).iter().any(|e| e["kind"]
            .as_str()
            .is_some_and(|k| k.starts_with("run.probe"))),
        "no probe for a provider without probe_on_stale"
    );
}

// ---------------------------------------------------------------------------
// §10. what the agent CLIs accept
//
// (tests for §10 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------
