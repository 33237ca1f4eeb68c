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

/// A temporary repository with a real `npc daemon`, its stderr in a log
/// outside the repository; SIGTERM on drop. Events are read from the store
/// directly, so they can be read while the daemon cannot answer.
struct HostileDaemon {
    dir: tempfile::TempDir,
    logs: tempfile::TempDir,
    child: Option<std::process::Child>,
}

impl HostileDaemon {
    fn start(manifest: &str) -> Self {
        Self::start_with(manifest, None, &[])
    }

    /// Start the daemon in a repository that also holds `files`, with its
    /// descriptor limit set to `nofile` if given.
    fn start_with(manifest: &str, nofile: Option<u32>, files: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let logs = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("npcagent.toml"), manifest).unwrap();
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        let log = std::fs::File::create(logs.path().join("daemon.log")).unwrap();
        let mut cmd = match nofile {
            Some(n) => {
                let mut c = std::process::Command::new("sh");
                c.arg("-c")
                    .arg(format!("ulimit -n {n} && exec \"$0\" daemon"))
                    .arg(npc_path());
                c
            }
            None => {
                let mut c = std::process::Command::new(npc_path());
                c.arg("daemon");
                c
            }
        };
        let child = cmd
            .current_dir(dir.path())
            .env("NPC_LOG", "info")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let this = Self {
            dir,
            logs,
            child: Some(child),
        };
        // The daemon prints its startup line once the first apply is done
        // and the watcher is up: edits from then on are seen.
        wait_for("the daemon's startup line", || {
            this.log().contains("npc daemon: startup").then_some(())
        });
        this
    }

    fn root(&self) -> &std::path::Path {
        self.dir.path()
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.logs.path().join("daemon.log")).unwrap_or_default()
    }

    fn write_manifest(&self, text: &str) {
        let tmp = self.root().join(".npcagent.toml.tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, self.root().join("npcagent.toml")).unwrap();
    }

    fn events_after(&self, id: i64) -> Vec<serde_json::Value> {
        let db = self.root().join(".npc/state.db");
        if !db.is_file() {
            return Vec::new();
        }
        let Ok(store) = npcagent::store::Store::open_read_only(&db) else {
            return Vec::new();
        };
        store
            .events_since(id, 100_000)
            .unwrap_or_default()
            .iter()
            .map(|e| serde_json::to_value(e).unwrap())
            .collect()
    }

    fn last_event_id(&self) -> i64 {
        self.events_after(0)
            .last()
            .and_then(|e| e["id"].as_i64())
            .unwrap_or(0)
    }

    fn wait_event(&self, after: i64, kind: &str) -> serde_json::Value {
        wait_for(&format!("a `{kind}` event after #{after}"), || {
            self.events_after(after)
                .into_iter()
                .find(|e| e["kind"] == kind)
        })
    }

    fn npc(&self, args: &[&str]) -> std::process::Output {
        npc().current_dir(self.root()).args(args).output().unwrap()
    }

    /// SIGTERM, then wait (with the usual deadline) for the exit.
    fn terminate(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().unwrap();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        wait_for("the daemon to exit", || child.try_wait().unwrap())
    }
}

impl Drop for HostileDaemon {
    fn drop(&mut self) {
        // SIGTERM, so the daemon stops its children before it exits.
        if let Some(mut child) = self.child.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let _ = child.wait();
        }
    }
}

/// A manifest with one prompt whose inline template is `template`.
fn prompt_manifest(template: &str) -> String {
    format!(
        "version = 1\n\n[prompts.task]\ntemplate = {}\n",
        serde_json::Value::String(template.to_string())
    )
}

const LOOP_BOMB: &str =
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";

/// Run `npc ARGS` in `dir`; it must exit 1 and name `needle` at
/// `npcagent.toml:LINE`.
fn assert_refused_at(dir: &std::path::Path, args: &[&str], needle: &str, line: usize) {
    let out = npc().current_dir(dir).args(args).output().unwrap();
    let stderr = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(1), "npc {args:?}: {stderr}");
    assert!(stderr.contains(needle), "npc {args:?}: {stderr}");
    assert!(
        stderr.contains(&format!("npcagent.toml:{line}:")),
        "npc {args:?} names no location: {stderr}"
    );
}

#[test]
fn a_nested_loop_template_bomb_fails_validate_plan_and_render_at_its_line() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("npcagent.toml"), prompt_manifest(LOOP_BOMB)).unwrap();
    for args in [
        &["validate"][..],
        &["plan"][..],
        &["render", "prompt", "task"][..],
        &["apply", "--auto-approve"][..],
    ] {
        assert_refused_at(dir.path(), args, "work budget", 4);
    }
}

#[test]
fn a_string_multiplication_bomb_fails_validation_at_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let manifest =
        "version = 1\n\n[prompts.task]\ntemplate = \"\"\"intro\n{{ 'x' * 10**9 }}\"\"\"\n";
    std::fs::write(dir.path().join("npcagent.toml"), manifest).unwrap();
    assert_refused_at(dir.path(), &["validate"], "work budget", 5);
}

#[test]
fn a_recursive_macro_bomb_fails_validation() {
    let dir = tempfile::tempdir().unwrap();
    let bomb = "{% macro m(n) %}{% if n > 0 %}{{ m(n - 1) }}{{ m(n - 1) }}{% endif %}{% endmacro %}{{ m(40) }}";
    std::fs::write(dir.path().join("npcagent.toml"), prompt_manifest(bomb)).unwrap();
    assert_refused_at(dir.path(), &["validate"], "work budget", 4);
}

#[test]
fn a_huge_output_template_fails_validation_with_the_output_bound() {
    let dir = tempfile::tempdir().unwrap();
    let flood = "{% for i in range(100000) %}0123456789abcdef0123456789abcdef{% endfor %}";
    std::fs::write(dir.path().join("npcagent.toml"), prompt_manifest(flood)).unwrap();
    assert_refused_at(dir.path(), &["validate"], "output passed the limit", 4);
}

/// A bomb that only goes off with the variable's value: validation cannot
/// see it, the render's own bound stops it.
#[test]
fn a_template_bomb_driven_by_a_variable_fails_render_at_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = "version = 1\n\n[prompts.task]\ntemplate = \"{% for i in range(vars.n|int) %}{% for j in range(vars.n|int) %}{% endfor %}{% endfor %}\"\nvariables.n = { default = \"100000\" }\n";
    std::fs::write(dir.path().join("npcagent.toml"), manifest).unwrap();
    npc()
        .current_dir(dir.path())
        .arg("validate")
        .assert()
        .success();
    let out = npc()
        .current_dir(dir.path())
        .args(["render", "prompt", "task"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("prompts.task")
            && stderr.contains("line 1")
            && stderr.contains("work budget"),
        "{stderr}"
    );
}

#[test]
fn many_profiles_of_variable_driven_bombs_share_one_render_budget() {
    let dir = tempfile::tempdir().unwrap();
    let mut manifest = String::from(
        "version = 1\n\n[providers.claude]\nkind = \"claude_code\"\n\n[prompts.task]\ntemplate = \"{% for i in range(vars.n|int) %}{% for j in range(vars.n|int) %}{% endfor %}{% endfor %}\"\nvariables.n = { default = \"100000\" }\n",
    );
    for i in 0..40 {
        manifest.push_str(&format!(
            "\n[profiles.p{i}]\nprovider = \"claude\"\ndescription = \"d\"\nprompt = \"task\"\n"
        ));
    }
    std::fs::write(dir.path().join("npcagent.toml"), manifest).unwrap();
    let out = npc()
        .current_dir(dir.path())
        .args(["plan", "--format", "json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let errors: Vec<String> = plan["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["error"].as_str().map(str::to_string))
        .collect();
    assert_eq!(errors.len(), 40, "{errors:?}");
    let shared = errors
        .iter()
        .filter(|e| e.contains("shared work budget"))
        .count();
    assert!(
        shared >= 30,
        "renders stopped by the shared budget: {shared} of 40"
    );
}

#[test]
fn a_template_bomb_edit_leaves_the_daemon_responsive_and_the_next_edit_applies() {
    let mut d = HostileDaemon::start(&prompt_manifest("hello"));
    d.wait_event(0, "reconcile.applied");
    let mark = d.last_event_id();
    d.write_manifest(&prompt_manifest(LOOP_BOMB));
    let invalid = d.wait_event(mark, "manifest.invalid");
    assert!(invalid.to_string().contains("work budget"), "{invalid}");
    // The control socket answers while and after the bomb was looked at.
    let status = d.npc(&["status", "--format", "json"]);
    assert!(status.status.success(), "{:?}", status);
    // The next good edit is applied.
    let mark = d.last_event_id();
    d.write_manifest(&prompt_manifest("hello again"));
    let applied = d.wait_event(mark, "reconcile.applied");
    assert!(applied.to_string().contains("prompt.task"), "{applied}");
    // And a stop signal still ends it.
    d.write_manifest(&prompt_manifest(LOOP_BOMB));
    let exit = d.terminate();
    assert!(exit.success(), "daemon exit: {exit}");
}

#[test]
fn a_variable_driven_template_bomb_in_a_profile_keeps_the_daemon_serving() {
    let good = "version = 1\n\n[providers.claude]\nkind = \"claude_code\"\n\n[prompts.task]\ntemplate = \"hello\"\n\n[profiles.dev]\nprovider = \"claude\"\ndescription = \"d\"\nprompt = \"task\"\n";
    let mut d = HostileDaemon::start(good);
    d.wait_event(0, "files.written");
    let profile = d.root().join(".npc/profiles/dev.md");
    wait_for("the rendered profile", || {
        std::fs::read_to_string(&profile)
            .ok()
            .filter(|t| t.contains("hello"))
    });
    let mark = d.last_event_id();
    d.write_manifest(&good.replace(
        "template = \"hello\"",
        "template = \"{% for i in range(vars.n|int) %}{% for j in range(vars.n|int) %}{% endfor %}{% endfor %}\"\nvariables.n = { default = \"100000\" }",
    ));
    let written = d.wait_event(mark, "files.written");
    assert!(written.to_string().contains("work budget"), "{written}");
    assert!(
        std::fs::read_to_string(&profile).unwrap().contains("hello"),
        "the last good profile stays"
    );
    assert!(d.npc(&["status"]).status.success());
    let exit = d.terminate();
    assert!(exit.success(), "daemon exit: {exit}");
}

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

/// Descriptors process `pid` has open.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

#[test]
fn idle_connections_beyond_the_cap_do_not_keep_status_from_answering() {
    use npcagent::surfaces::control::MAX_CONNECTIONS;
    let d = HostileDaemon::start(&prompt_manifest("hello"));
    let socket = d.root().join(".npc/daemon.sock");
    let idle: Vec<std::os::unix::net::UnixStream> = (0..MAX_CONNECTIONS + 200)
        .map(|_| std::os::unix::net::UnixStream::connect(&socket).unwrap())
        .collect();
    let out = d.npc(&["status", "--format", "json"]);
    assert!(
        out.status.success(),
        "status with {} idle connections: {}",
        idle.len(),
        String::from_utf8_lossy(&out.stderr)
    );
    let fds = open_fds(d.pid());
    assert!(
        fds < MAX_CONNECTIONS + 64,
        "the daemon holds {fds} descriptors for {} connections",
        idle.len()
    );
    drop(idle);
}

#[test]
fn a_reload_that_fails_for_lack_of_descriptors_is_retried_until_it_applies() {
    const NOFILE: usize = 64;
    let d = HostileDaemon::start_with(&prompt_manifest("hello"), Some(NOFILE as u32), &[]);
    d.wait_event(0, "reconcile.applied");
    // Idle connections use up the daemon's descriptors.
    let socket = d.root().join(".npc/daemon.sock");
    let spare = NOFILE.saturating_sub(open_fds(d.pid())) + 8;
    let idle: Vec<std::os::unix::net::UnixStream> = (0..spare)
        .map(|_| std::os::unix::net::UnixStream::connect(&socket).unwrap())
        .collect();
    wait_for("the daemon to run out of descriptors", || {
        (open_fds(d.pid()) >= NOFILE).then_some(())
    });
    let mark = d.last_event_id();
    d.write_manifest(&prompt_manifest("hello again"));
    let failed = d.wait_event(mark, "reload.failed");
    assert!(
        failed.to_string().contains("Too many open files"),
        "{failed}"
    );
    assert!(
        !d.events_after(mark)
            .iter()
            .any(|e| e["kind"] == "manifest.invalid"),
        "an operational failure is not an invalid manifest"
    );
    // Descriptors come back; the daemon retries by itself, no edit needed.
    drop(idle);
    let applied = d.wait_event(failed["id"].as_i64().unwrap(), "reconcile.applied");
    assert!(applied.to_string().contains("prompt.task"), "{applied}");
}

#[test]
fn a_plugin_at_the_repository_root_does_not_reload_the_daemon_by_itself() {
    let manifest = |greeting: &str| {
        format!(
            "version = 1\n\n[providers.claude]\nkind = \"claude_code\"\n\n[mcp.servers.alpha]\ncommand = \"sleep\"\nargs = [\"1000\"]\n\n[plugins.self]\npath = \".\"\n\n[prompts.task]\ntemplate = \"{greeting}\"\n"
        )
    };
    let d = HostileDaemon::start_with(
        &manifest("one"),
        None,
        &[("plugin.json", r#"{"name": "self", "version": "1.0.0"}"#)],
    );
    d.wait_event(0, "reconcile.applied");
    wait_for("npc's own agent file", || {
        d.root().join(".mcp.json").is_file().then_some(())
    });
    let reloads = |log: &str| log.matches("reloading:").count();
    let before = reloads(&d.log());
    // Two edits, each waited for: a daemon that reloads itself on its own
    // writes shows more reloads (and more reconcile events) than edits.
    for greeting in ["two", "three"] {
        let mark = d.last_event_id();
        d.write_manifest(&manifest(greeting));
        let applied = d.wait_event(mark, "reconcile.applied");
        assert!(applied.to_string().contains("prompt.task"), "{applied}");
    }
    let mark = d.last_event_id();
    d.write_manifest(&manifest("four"));
    d.wait_event(mark, "reconcile.applied");
    let log = d.log();
    assert_eq!(
        reloads(&log) - before,
        3,
        "reloads besides the edits:\n{log}"
    );
    let reconciles = d
        .events_after(0)
        .iter()
        .filter(|e| e["kind"] == "reconcile.applied")
        .count();
    assert_eq!(reconciles, 4, "startup and three edits");
}

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

// ---------------------------------------------------------------------------
// §9. correctness found by the audit
//
// (tests for §9 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------

#[test]
fn after_a_failed_start_the_agent_files_follow_what_runs() {
    let manifest = |alpha: &str, extra: &str| {
        format!(
            "version = 1\n\n[providers.claude]\nkind = \"claude_code\"\n\n[mcp.servers.alpha]\ncommand = \"{alpha}\"\nargs = [\"1000\"]\n{extra}"
        )
    };
    let d = HostileDaemon::start(&manifest("sleep", ""));
    let mcp = d.root().join(".mcp.json");
    wait_for("alpha in .mcp.json", || {
        std::fs::read_to_string(&mcp)
            .ok()
            .filter(|t| t.contains("\"sleep\""))
    });
    // alpha's new command and the new gamma cannot start: alpha rolls back,
    // gamma does not run.
    let broken = "\n[mcp.servers.gamma]\ncommand = \"npc-test-no-such-program\"\n";
    let mark = d.last_event_id();
    d.write_manifest(&manifest("npc-test-no-such-program", broken));
    d.wait_event(mark, "component.rolled_back");
    // A later edit adds delta; once delta is in the file, that reload's
    // files are written.
    let mark = d.last_event_id();
    d.write_manifest(&manifest(
        "npc-test-no-such-program",
        &format!("{broken}\n[mcp.servers.delta]\ncommand = \"sleep\"\nargs = [\"1001\"]\n"),
    ));
    d.wait_event(mark, "reconcile.applied");
    let text = wait_for("delta in .mcp.json", || {
        std::fs::read_to_string(&mcp)
            .ok()
            .filter(|t| t.contains("delta"))
    });
    let file: serde_json::Value = serde_json::from_str(&text).unwrap();
    let servers = &file["mcpServers"];
    assert_eq!(servers["alpha"]["command"], "sleep", "{text}");
    assert!(servers.get("gamma").is_none(), "{text}");
}

#[test]
fn events_follow_through_the_daemon_shows_the_events_npc_run_writes() {
    let agent = repo_root().join("fixtures/clis/fake-agent.py");
    let fixture = repo_root().join("fixtures/clis/claude_code/2.1.197/tool_call.jsonl");
    let manifest = format!(
        "version = 1\n\n[providers.fake]\nkind = \"claude_code\"\ncommand = {}\nargs = [\"--provider\", \"claude_code\", \"--fixture\", {}]\n\n[profiles.dev]\nprovider = \"fake\"\ndescription = \"d\"\n",
        serde_json::Value::String(agent.display().to_string()),
        serde_json::Value::String(fixture.display().to_string()),
    );
    let d = HostileDaemon::start(&manifest);
    d.wait_event(0, "reconcile.applied");
    let mark = d.last_event_id();
    let mut follower = std::process::Command::new(npc_path())
        .args(["events", "--follow", "--format", "json", "--since"])
        .arg(mark.to_string())
        .current_dir(d.root())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = follower.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let run = d.npc(&["run", "dev", "--prompt", "go"]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let stored: Vec<i64> = d
        .events_after(mark)
        .iter()
        .filter(|e| e["kind"].as_str().is_some_and(|k| k.starts_with("run.")))
        .map(|e| e["id"].as_i64().unwrap())
        .collect();
    assert!(!stored.is_empty(), "npc run recorded no run events");
    let mut seen = Vec::new();
    let deadline = std::time::Instant::now() + WAIT_LIMIT;
    while !stored.iter().all(|id| seen.contains(id)) {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let line = rx
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("the follower showed {seen:?}, not all of {stored:?}"));
        let event: serde_json::Value = serde_json::from_str(&line).unwrap();
        seen.push(event["id"].as_i64().unwrap());
    }
    assert!(seen.windows(2).all(|w| w[1] == w[0] + 1), "gap in {seen:?}");
    let _ = follower.kill();
    let _ = follower.wait();
}

// ---------------------------------------------------------------------------
// §10. what the agent CLIs accept
//
// (tests for §10 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------
