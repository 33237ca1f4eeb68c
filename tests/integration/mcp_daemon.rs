//! The daemon owns the MCP pool: a real `npc daemon` whose manifest lists
//! stdio servers (`fixtures/mcp/misbehave.py`) and HTTP ones, driven by the
//! Python `mcp` SDK client (`fixtures/mcp/client.py`) through `npc mcp serve`
//! (stdio and `--http`), which fronts the daemon's pool. Editing one server
//! reconnects only it; the supervisor's restart reconnects the session;
//! `npc status` shows each server; every call is an event in the daemon's
//! store. Also the HTTP gateway's remote-access refusal and bearer check
//! (on 127.0.0.1 only), and hostile MCP upgrades on the control socket.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{Daemon, npc, npc_path, repo_root, stop_child, wait_for};

/// `surfaces::control::MAX_MCP_SESSIONS`.
const MAX_MCP_SESSIONS: usize = 64;

/// Longest one client session may take in these tests.
const CLIENT_LIMIT: Duration = Duration::from_secs(90);

use crate::mcp::python_sdk;

/// A stdio server `name` running misbehave.py, with extra `args`.
fn misbehave(name: &str, args: &[&str]) -> String {
    let script = repo_root().join("fixtures/mcp/misbehave.py");
    let mut all = vec![format!("{:?}", script.display().to_string())];
    all.extend(args.iter().map(|a| format!("{a:?}")));
    format!(
        "[mcp.servers.{name}]\ncommand = \"python3\"\nargs = [{}]\ntool_timeout_ms = 5000\n",
        all.join(", ")
    )
}

/// What these tests ask a daemon about its MCP pool.
trait McpStatus {
    /// The pool's row for `server` in `npc status`.
    fn server(&self, server: &str) -> Value;
    /// The pid of `server`'s process.
    fn mcp_pid(&self, server: &str) -> Option<u64>;
    /// Wait until `server` is connected; its process's pid.
    fn wait_connected(&self, server: &str) -> u64;
}

impl McpStatus for Daemon {
    fn server(&self, server: &str) -> Value {
        self.status_json()["mcp"]["servers"]
            .as_array()
            .and_then(|s| s.iter().find(|s| s["name"] == server).cloned())
            .unwrap_or(Value::Null)
    }

    fn mcp_pid(&self, server: &str) -> Option<u64> {
        self.pid_of(&format!("mcp_server.{server}")).map(u64::from)
    }

    fn wait_connected(&self, server: &str) -> u64 {
        wait_for(&format!("`{server}` connected"), || {
            (self.server(server)["state"] == "connected")
                .then(|| self.mcp_pid(server))
                .flatten()
        })
    }
}

fn call(name: &str) -> Value {
    json!(["call", name, {}])
}

use crate::mcp::{
    client_answers, spawn_http_gateway_in as spawn_http, stdio_session_in as stdio_session,
};

/// A client session running in the background; its answers arrive line by line.
struct LiveSession {
    child: Child,
    lines: std::sync::mpsc::Receiver<Value>,
}

impl LiveSession {
    fn start(dir: &Path, steps: Value) -> Self {
        let mut child = Command::new("python3")
            .arg(repo_root().join("fixtures/mcp/client.py"))
            .arg(steps.to_string())
            .args(["--", &npc_path().display().to_string(), "mcp", "serve"])
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(serde_json::from_str(&line).unwrap_or(Value::Null));
            }
        });
        Self { child, lines }
    }

    fn next(&self) -> Value {
        wait_for("the client's next answer", || self.lines.try_recv().ok())
    }

    fn finish(mut self) {
        let status = wait_for("the client to exit", || self.child.try_wait().unwrap());
        assert!(status.success(), "client failed: {status}");
    }
}

#[test]
fn editing_one_server_reconnects_only_it_and_clients_hear_of_each_change() {
    if !python_sdk() {
        return;
    }
    let both = format!(
        "version = 1\n{}{}",
        misbehave("a", &[]),
        misbehave("b", &[])
    );
    let d = Daemon::start(&both);
    let a_pid = d.wait_connected("a");
    let b_pid = d.wait_connected("b");

    // A session open across the edit: `a` answers from the same process.
    let live = LiveSession::start(
        d.root(),
        json!([call("a__pid"), ["wait_list_changed"], call("a__pid")]),
    );
    assert_eq!(live.next()["text"], a_pid.to_string());
    d.write_manifest(&format!(
        "version = 1\n{}{}",
        misbehave("a", &[]),
        misbehave("b", &["edited"])
    ));
    assert_eq!(live.next(), json!({"list_changed": true}));
    assert_eq!(
        live.next()["text"],
        a_pid.to_string(),
        "`a`'s session and process were untouched"
    );
    live.finish();
    let new_b = wait_for("`b` reconnected on a new process", || {
        let pid = d.wait_connected("b");
        (pid != b_pid).then_some(pid)
    });
    assert_eq!(d.mcp_pid("a"), Some(a_pid));
    let got = stdio_session(d.root(), json!([call("b__pid")]));
    assert_eq!(got[0]["text"], new_b.to_string());

    // Removing `b` disconnects it; the client hears of it and lists without it.
    let live = LiveSession::start(
        d.root(),
        json!([call("a__ok"), ["wait_list_changed"], ["list"]]),
    );
    // An answer means the session is initialized (and subscribed).
    assert_eq!(live.next()["text"], "fine");
    d.write_manifest(&format!("version = 1\n{}", misbehave("a", &[])));
    assert_eq!(live.next(), json!({"list_changed": true}));
    let tools = live.next()["tools"].clone();
    let names: Vec<&str> = tools
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(names.contains(&"a__ok"), "{names:?}");
    assert!(!names.iter().any(|n| n.starts_with("b__")), "{names:?}");
    live.finish();
    wait_for("`b` left the pool", || {
        d.server("b").is_null().then_some(())
    });
    assert_eq!(d.mcp_pid("a"), Some(a_pid));
}

#[test]
fn status_shows_each_server_and_one_failing_server_fails_alone() {
    if !python_sdk() {
        return;
    }
    let manifest = format!(
        "version = 1\n{}[mcp.servers.mute]\ncommand = \"sleep\"\nargs = [\"1000\"]\nstartup_timeout_ms = 300\n[mcp.servers.gone]\nurl = \"http://127.0.0.1:9/mcp\"\nstartup_timeout_ms = 2000\n",
        misbehave("a", &[])
    );
    let d = Daemon::start(&manifest);
    d.wait_connected("a");
    let failed = |name: &str| {
        wait_for(&format!("`{name}` failed"), || {
            let s = d.server(name);
            (s["state"] == "failed").then_some(s)
        })
    };
    let mute = failed("mute");
    assert!(
        mute["reason"]
            .as_str()
            .unwrap()
            .contains("startup_timeout_ms"),
        "{mute}"
    );
    let gone = failed("gone");
    assert_eq!(gone["transport"], "http");
    assert!(
        gone["reason"].as_str().unwrap().contains("`gone`"),
        "{gone}"
    );
    let failures: Vec<Value> = d
        .events()
        .into_iter()
        .filter(|e| e["kind"] == "mcp.server_failed")
        .collect();
    assert!(failures.iter().any(|e| e["payload"]["server"] == "mute"));
    assert!(failures.iter().any(|e| e["payload"]["server"] == "gone"));

    // The others' failure costs `a` nothing; its last call shows.
    let a = d.server("a");
    assert_eq!(a["tools"], 7, "{a}");
    assert!(a["last_call"].is_null(), "{a}");
    let got = stdio_session(d.root(), json!([call("a__ok")]));
    assert_eq!(got[0]["text"], "fine");
    let a = d.server("a");
    assert_eq!(a["last_call"]["tool"], "ok", "{a}");
    assert!(a["last_call"]["at"].as_str().unwrap().contains('T'), "{a}");
    assert_eq!(d.status_json()["mcp"]["gateway"], "daemon");

    let human = npc().current_dir(d.root()).arg("status").output().unwrap();
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(text.contains("MCP gateway: the daemon's pool"), "{text}");
    assert!(text.contains("failed: "), "{text}");
    let a_row = text
        .lines()
        .find(|l| l.starts_with("a "))
        .unwrap_or_else(|| panic!("no row for `a`: {text}"));
    assert!(
        a_row.contains("connected") && a_row.contains(" ok"),
        "{a_row}"
    );
}

#[test]
fn status_without_a_daemon_says_the_gateway_runs_its_own_pool() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("npcagent.toml"),
        format!("version = 1\n{}", misbehave("a", &[])),
    )
    .unwrap();
    let out = npc()
        .current_dir(dir.path())
        .args(["status", "--format", "json"])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["mcp"]["gateway"], "standalone");
    let human = npc()
        .current_dir(dir.path())
        .arg("status")
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&human.stdout)
            .contains("standalone (`npc mcp serve` runs its own pool)")
    );
}

#[test]
fn the_front_uses_the_daemons_process_and_the_daemon_records_each_call() {
    if !python_sdk() {
        return;
    }
    let d = Daemon::start(&format!("version = 1\n{}", misbehave("a", &[])));
    let pid = d.wait_connected("a");
    let got = stdio_session(d.root(), json!([["list"], call("a__pid"), call("a__nope")]));
    assert!(
        got[0]["tools"]
            .as_array()
            .unwrap()
            .contains(&json!("a__ok"))
    );
    assert_eq!(got[1]["text"], pid.to_string(), "no second copy of `a`");
    assert_eq!(got[2]["is_error"], true);
    // Tool-call events are written behind the answers: wait for both.
    let calls: Vec<Value> = wait_for("both tool-call events", || {
        let calls: Vec<Value> = d
            .events()
            .into_iter()
            .filter(|e| e["kind"] == "mcp.tool_call")
            .collect();
        (calls.len() >= 2).then_some(calls)
    });
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!(calls[0]["payload"]["server"], "a");
    assert_eq!(calls[0]["payload"]["outcome"], "ok");
    assert_eq!(calls[1]["payload"]["outcome"], "unknown_tool");
    // Still one process of `a`: the supervisor's.
    assert_eq!(d.mcp_pid("a"), Some(pid));
}

#[test]
fn a_gateway_started_in_a_runs_worktree_is_the_repositorys_and_records_the_run() {
    if !python_sdk() {
        return;
    }
    let d = Daemon::start(&format!("version = 1\n{}", misbehave("a", &[])));
    let pid = d.wait_connected("a");
    // An agent of a worktree run starts `npc mcp serve` in its worktree,
    // with the variables npc gives every process of the run.
    let worktree = tempfile::tempdir().unwrap();
    let run = "run-20261201t000000000z-0a1b2c3d";
    let out = assert_cmd::Command::new("python3")
        .arg(repo_root().join("fixtures/mcp/client.py"))
        .arg(json!([call("a__pid")]).to_string())
        .args(["--", &npc_path().display().to_string(), "mcp", "serve"])
        .current_dir(worktree.path())
        .env("NPC_REPO_ROOT", d.root())
        .env("NPC_RUN_ID", run)
        .timeout(std::time::Duration::from_secs(60))
        .output()
        .unwrap();
    let got = client_answers(&out);
    assert_eq!(got[0]["text"], pid.to_string(), "the daemon's `a`");
    let call = wait_for("the tool-call event", || {
        d.events()
            .into_iter()
            .find(|e| e["kind"] == "mcp.tool_call")
    });
    assert_eq!(call["payload"]["run_id"], run, "{call}");
}

#[test]
fn a_supervisor_restart_reconnects_the_session() {
    if !python_sdk() {
        return;
    }
    let d = Daemon::start(&format!(
        "version = 1\n{}restart = \"on-failure\"\n",
        misbehave("a", &[])
    ));
    let pid = d.wait_connected("a");
    let got = stdio_session(d.root(), json!([call("a__crash")]));
    assert_eq!(got[0]["is_error"], true, "{got:?}");
    let restarted = wait_for("`a` restarted and reconnected", || {
        let now = d.wait_connected("a");
        (now != pid).then_some(now)
    });
    let got = stdio_session(d.root(), json!([call("a__pid")]));
    assert_eq!(got[0]["text"], restarted.to_string());
}

#[test]
fn the_http_front_relays_each_session_to_the_daemons_pool() {
    if !python_sdk() {
        return;
    }
    let d = Daemon::start(&format!("version = 1\n{}", misbehave("a", &[])));
    let pid = d.wait_connected("a");
    let (mut gateway, url) = spawn_http(d.root(), &[]);
    let out = assert_cmd::Command::new("python3")
        .arg(repo_root().join("fixtures/mcp/client.py"))
        .arg(
            json!([
                call("a__pid"),
                call("a__grow"),
                ["wait_list_changed"],
                ["list"]
            ])
            .to_string(),
        )
        .args(["--http", &url])
        .env("MCP_BEARER", crate::mcp::gateway_token(d.root()))
        .timeout(CLIENT_LIMIT)
        .output()
        .unwrap();
    let got = client_answers(&out);
    assert_eq!(got[0]["text"], pid.to_string());
    assert_eq!(
        got[2],
        json!({"list_changed": true}),
        "the daemon's notification reached the HTTP client"
    );
    assert!(
        got[3]["tools"]
            .as_array()
            .unwrap()
            .contains(&json!("a__extra"))
    );
    let recorded = wait_for("the tool-call events", || {
        let n = d
            .events()
            .iter()
            .filter(|e| e["kind"] == "mcp.tool_call")
            .count();
        (n >= 2).then_some(n)
    });
    assert_eq!(recorded, 2);
    stop_child(&mut gateway);
}

/// POST an MCP `initialize` to `url` with `authorization`; the status code.
fn post_initialize(url: &str, authorization: Option<&str>) -> u16 {
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_once('/').unwrap();
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-03-26", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}})
    .to_string();
    let mut stream = std::net::TcpStream::connect(host).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let auth = authorization.map_or(String::new(), |a| format!("Authorization: {a}\r\n"));
    write!(
        stream,
        "POST /{path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).unwrap();
    String::from_utf8_lossy(&head[9..12]).parse().unwrap()
}

#[test]
fn with_a_token_set_the_http_gateway_answers_only_the_bearer() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("npcagent.toml"),
        "version = 1\n[daemon]\ntoken_env = \"NPC_TEST_MCP_TOKEN\"\n",
    )
    .unwrap();
    let (mut gateway, url) = spawn_http(dir.path(), &[("NPC_TEST_MCP_TOKEN", "s3cret-token-1")]);
    assert_eq!(post_initialize(&url, None), 401);
    assert_eq!(post_initialize(&url, Some("Bearer wrong")), 401);
    assert_eq!(post_initialize(&url, Some("Bearer s3cret-token-")), 401);
    assert_eq!(post_initialize(&url, Some("Bearer s3cret-token-1")), 200);
    stop_child(&mut gateway);
}

#[test]
fn a_non_loopback_address_is_refused_without_remote_access_and_a_token() {
    // 192.0.2.1 is TEST-NET-1: the refusal comes before any bind is tried.
    let cases = [
        ("", "daemon.allow_remote = true"),
        ("[daemon]\nallow_remote = true\n", "`daemon.token_env`"),
        (
            "[daemon]\nallow_remote = true\ntoken_env = \"NPC_TEST_UNSET_TOKEN\"\n",
            "`NPC_TEST_UNSET_TOKEN`",
        ),
    ];
    for (daemon, says) in cases {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("npcagent.toml"),
            format!("version = 1\n{daemon}"),
        )
        .unwrap();
        let out = npc()
            .current_dir(dir.path())
            .args(["mcp", "serve", "--http", "192.0.2.1:8767"])
            .env_remove("NPC_TEST_UNSET_TOKEN")
            .timeout(CLIENT_LIMIT)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("not a loopback address"), "{err}");
        assert!(err.contains(says), "{daemon}: {err}");
        assert!(out.stdout.is_empty());
    }
}

/// A connection to `socket` upgraded to MCP, once the daemon accepts one.
fn upgraded(socket: &Path) -> UnixStream {
    wait_for("an MCP upgrade to be accepted", || {
        let mut s = UnixStream::connect(socket).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
        s.write_all(b"{\"protocol\":2,\"op\":\"mcp\"}\n").ok()?;
        // One byte at a time: nothing after the answer line is consumed.
        let mut line = Vec::new();
        let mut byte = [0u8; 1];
        while byte[0] != b'\n' {
            s.read_exact(&mut byte).ok()?;
            line.push(byte[0]);
        }
        let answer: Value = serde_json::from_slice(&line).ok()?;
        (answer == json!({"reply": "upgraded", "upgraded": "mcp"})).then_some(s)
    })
}

#[test]
fn garbage_and_oversized_mcp_upgrades_leave_the_daemon_serving() {
    if !python_sdk() {
        return;
    }
    let d = Daemon::start(&format!("version = 1\n{}", misbehave("a", &[])));
    let pid = d.wait_connected("a");
    let socket = d.root().join(".npc/daemon.sock");
    // Upgrades that never initialize hold at most MAX_MCP_SESSIONS places:
    // the next is refused, and control requests still find room.
    let held: Vec<UnixStream> = (0..MAX_MCP_SESSIONS)
        .map(|_| {
            let mut s = UnixStream::connect(&socket).unwrap();
            s.write_all(b"{\"protocol\":2,\"op\":\"mcp\"}\n").unwrap();
            let mut line = String::new();
            BufReader::new(s.try_clone().unwrap())
                .read_line(&mut line)
                .unwrap();
            assert!(line.contains("upgraded"), "{line}");
            s
        })
        .collect();
    let mut over = UnixStream::connect(&socket).unwrap();
    over.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    over.write_all(b"{\"protocol\":2,\"op\":\"mcp\"}\n")
        .unwrap();
    let mut answer = String::new();
    let _ = over.read_to_string(&mut answer);
    assert!(answer.contains("MCP sessions already"), "{answer}");
    assert_eq!(d.server("a")["state"], "connected");
    drop(held);
    // An upgrade (once the closed sessions freed their places) followed by
    // garbage frames, binary junk and a huge line.
    let mut s = upgraded(&socket);
    s.write_all(b"not json\n\xff\xfe\x00junk\n").unwrap();
    let huge = vec![b'x'; 20 << 20];
    let _ = s.write_all(&huge);
    drop(s);
    // A misspelt upgrade, and an oversized unterminated request.
    for bad in [
        b"{\"protocol\":2,\"op\":\"mcpx\"}\n".to_vec(),
        vec![b'{'; 70 * 1024],
    ] {
        let mut s = UnixStream::connect(&socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let _ = s.write_all(&bad);
        let _ = s.shutdown(std::net::Shutdown::Write);
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        assert!(answer.contains("error"), "{answer}");
    }
    // MCP is served again, from the same process.
    drop(upgraded(&socket));
    let got = stdio_session(d.root(), json!([call("a__pid")]));
    assert_eq!(got[0]["text"], pid.to_string());
}

/// An installed agent CLI `program` run in `dir` with its own `home` and
/// `npc` (this build) first on `PATH`; `None` (skipped) when not installed.
fn agent_cli(program: &str, dir: &Path, home: &Path) -> Option<assert_cmd::Command> {
    if !crate::support::require(crate::support::Peer::program(
        program,
        "npm install -g @anthropic-ai/claude-code @openai/codex @google/gemini-cli opencode-ai",
    )) {
        return None;
    }
    let mut cmd = assert_cmd::Command::new(program);
    cmd.current_dir(dir)
        .env("HOME", home)
        .env("CODEX_HOME", home.join(".codex"))
        .env("PATH", agent_path())
        .env_remove("XDG_CONFIG_HOME")
        .timeout(CLIENT_LIMIT);
    Some(cmd)
}

fn cli_output(cmd: Option<assert_cmd::Command>, args: &[&str]) -> Option<String> {
    let mut cmd = cmd?;
    let out = cmd.args(args).output().unwrap();
    Some(format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}

#[test]
fn gateway_mode_writes_one_npc_entry_that_every_agent_cli_lists_and_connects_to() {
    if !python_sdk() {
        return;
    }
    let servers = format!(
        "{}{}[providers.claude]\nkind = \"claude_code\"\n[providers.codex]\nkind = \"codex\"\n[providers.gemini]\nkind = \"gemini_cli\"\n[providers.opencode]\nkind = \"opencode\"\n[profiles.checker]\nprovider = \"codex\"\ndescription = \"Checks\"\nallowed_tools = [\"mcp__a__ok\", \"mcp__b__pid\"]\n",
        misbehave("a", &[]),
        misbehave("b", &[])
    );
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    std::fs::write(
        root.join("npcagent.toml"),
        format!("version = 1\n{servers}"),
    )
    .unwrap();
    let apply = || {
        let out = npc()
            .current_dir(&root)
            .args(["apply", "--auto-approve"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    };
    apply();
    let claude = || -> Value {
        serde_json::from_str(&std::fs::read_to_string(root.join(".mcp.json")).unwrap()).unwrap()
    };
    assert!(claude()["mcpServers"]["a"].is_object());

    // The switch: one entry per file, the per-server ones gone.
    std::fs::write(
        root.join("npcagent.toml"),
        format!("version = 1\n[mcp]\ngateway = true\n{servers}"),
    )
    .unwrap();
    apply();
    let entries = claude()["mcpServers"].as_object().unwrap().clone();
    assert_eq!(entries.keys().collect::<Vec<_>>(), ["npc"], "{entries:?}");
    assert_eq!(entries["npc"]["command"], "npc");
    assert_eq!(entries["npc"]["args"], json!(["mcp", "serve"]));
    let codex = std::fs::read_to_string(root.join(".codex/config.toml")).unwrap();
    assert!(
        codex.contains("[mcp_servers.npc]") && !codex.contains("[mcp_servers.a]"),
        "{codex}"
    );
    // No profile's tools in the repository's entry (a run's own entry
    // carries its profile's; the gateway applies the profile it serves).
    assert!(!codex.contains("enabled_tools"), "{codex}");
    let gemini = std::fs::read_to_string(root.join(".gemini/settings.json")).unwrap();
    assert!(
        gemini.contains("\"npc\"") && !gemini.contains("\"a\""),
        "{gemini}"
    );
    let opencode = std::fs::read_to_string(root.join("opencode.json")).unwrap();
    assert!(
        opencode.contains("\"npc\"") && !opencode.contains("\"a\""),
        "{opencode}"
    );

    // Each installed CLI lists the one entry and (where it can check) connects.
    let home = tempfile::tempdir().unwrap();
    let home = home.path();
    // The CLIs load project servers only in folders the user trusted.
    std::fs::write(
        home.join(".claude.json"),
        json!({"projects": {root.display().to_string(): {"hasTrustDialogAccepted": true, "enabledMcpjsonServers": ["npc"]}}}).to_string(),
    )
    .unwrap();
    std::fs::create_dir_all(home.join(".gemini")).unwrap();
    std::fs::write(
        home.join(".gemini/trustedFolders.json"),
        json!({root.display().to_string(): "TRUST_FOLDER"}).to_string(),
    )
    .unwrap();
    std::fs::create_dir_all(home.join(".codex")).unwrap();
    std::fs::write(
        home.join(".codex/config.toml"),
        format!(
            "[projects.{:?}]\ntrust_level = \"trusted\"\n",
            root.display().to_string()
        ),
    )
    .unwrap();
    if let Some(out) = cli_output(agent_cli("claude", &root, home), &["mcp", "list"]) {
        assert!(out.contains("npc: npc mcp serve - ✔ Connected"), "{out}");
        assert!(!out.contains("a: "), "{out}");
    }
    if let Some(out) = cli_output(agent_cli("gemini", &root, home), &["mcp", "list"]) {
        assert!(
            out.contains("npc: npc mcp serve (stdio) - Connected"),
            "{out}"
        );
    }
    if let Some(out) = cli_output(agent_cli("opencode", &root, home), &["mcp", "list"]) {
        assert!(
            out.contains("npc") && out.contains("connected") && out.contains("1 server"),
            "{out}"
        );
    }
    if let Some(out) = cli_output(agent_cli("codex", &root, home), &["mcp", "list"]) {
        // Codex lists without connecting (`codex mcp` has no health check).
        let row = out
            .lines()
            .find(|l| l.starts_with("npc "))
            .unwrap_or_else(|| panic!("{out}"));
        assert!(
            row.contains("mcp serve") && row.contains("enabled"),
            "{row}"
        );
        // `codex mcp` has no health check, but a `codex exec` session starts
        // its MCP servers before it asks the model (here a closed loopback
        // port, so nothing leaves the machine): the gateway records Codex's
        // handshake.
        let mut codex = Command::new("codex")
            .args(["exec", "--skip-git-repo-check", "-c", "model_provider=local", "-c"])
            .arg(r#"model_providers.local={name="local",base_url="http://127.0.0.1:9/v1",wire_api="responses"}"#)
            .arg("say hi")
            .current_dir(&root)
            .env("HOME", home)
            .env("CODEX_HOME", home.join(".codex"))
            .env("PATH", agent_path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let connected = wait_for("Codex's handshake with the gateway", || {
            crate::mcp::events_of_kind_in(&root, "mcp.client_connected")
                .into_iter()
                .find(|e| e["payload"]["client"] == "codex-mcp-client")
        });
        stop_child(&mut codex);
        assert!(connected["payload"]["version"].is_string(), "{connected}");
    }
}

/// `PATH` for the agent CLIs: the `npc` under test first.
fn agent_path() -> std::ffi::OsString {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs = vec![npc_path().parent().unwrap().to_path_buf()];
    dirs.extend(std::env::split_paths(&path));
    std::env::join_paths(dirs).unwrap()
}

#[test]
fn an_http_upstream_joins_the_daemons_pool_without_a_process() {
    if !python_sdk() {
        return;
    }
    // The upstream: a standalone gateway over HTTP in another repository.
    let other = tempfile::tempdir().unwrap();
    std::fs::write(
        other.path().join("npcagent.toml"),
        format!("version = 1\n{}", misbehave("b", &[])),
    )
    .unwrap();
    let (mut upstream, url) = spawn_http(other.path(), &[]);
    let d = Daemon::start(&format!(
        "version = 1\n[mcp.servers.up]\nurl = \"{url}\"\nheaders = {{ Authorization = \"Bearer {}\" }}\n",
        crate::mcp::gateway_token(other.path())
    ));
    wait_for("`up` connected", || {
        (d.server("up")["state"] == "connected").then_some(())
    });
    let up = d.server("up");
    assert_eq!(up["transport"], "http");
    // Every tool the upstream lists (its built-ins and `b`'s seven).
    let listed = stdio_session(other.path(), json!([["list"]]))[0]["tools"]
        .as_array()
        .unwrap()
        .len();
    assert!(listed > 7);
    assert_eq!(up["tools"], listed, "{up}");
    assert!(d.mcp_pid("up").is_none(), "an HTTP server has no process");
    let got = stdio_session(d.root(), json!([call("up__b__ok")]));
    assert_eq!(got[0]["text"], "fine");
    assert_eq!(d.server("up")["last_call"]["tool"], "b__ok");
    stop_child(&mut upstream);
}

#[test]
fn the_daemons_gateway_serves_the_builtins_and_follows_the_manifests_prompts() {
    if !python_sdk() {
        return;
    }
    let manifest = |greeting: &str| {
        format!(
            "version = 1\n{}\n[prompts.greet]\ntemplate = \"{greeting} {{{{ vars.who }}}}\"\nvariables = {{ who = {{ default = \"team\" }} }}\n",
            misbehave("a", &[])
        )
    };
    let d = Daemon::start(&manifest("hello"));
    d.wait_connected("a");
    let session = LiveSession::start(
        d.root(),
        json!([
            ["list"],
            ["call", "npc_status", {}],
            ["prompt", "greet", {}],
            ["wait_prompts_changed"],
            ["prompt", "greet", {}],
        ]),
    );
    let tools = session.next();
    let names = tools["tools"].as_array().unwrap();
    assert_eq!(names[0], "memory_write", "built-ins first: {tools}");
    assert!(names.contains(&json!("a__ok")), "{tools}");
    let status = session.next();
    assert_eq!(status["is_error"], false, "{status}");
    assert_eq!(session.next()["messages"][0], "hello team");
    // An edit of the prompt reaches the connected client: told, then served.
    let mark = d.last_event_id();
    d.write_manifest(&manifest("goodbye"));
    d.wait_event(mark, "reconcile.applied");
    assert_eq!(session.next()["prompts_changed"], true);
    assert_eq!(session.next()["messages"][0], "goodbye team");
    session.finish();
    let builtin_call = wait_for("the daemon's record of the built-in call", || {
        d.events()
            .into_iter()
            .find(|e| e["kind"] == "mcp.tool_call" && e["payload"]["tool"] == "npc_status")
    });
    assert_eq!(builtin_call["payload"]["server"], "npc");
    let gets: Vec<Value> = d
        .events()
        .into_iter()
        .filter(|e| e["kind"] == "mcp.prompt_get")
        .collect();
    assert_eq!(gets.len(), 2, "{gets:?}");
    assert_eq!(gets[0]["payload"]["name"], "greet");
    assert_eq!(gets[0]["payload"]["outcome"], "ok");
}

#[test]
fn the_daemons_gateway_names_on_conflict_and_serves_tool_search() {
    if !python_sdk() {
        return;
    }
    let d = Daemon::start(&format!(
        "version = 1\n[mcp]\nprefix = \"on_conflict\"\ntools = \"search\"\n{}{}",
        misbehave("a", &[]),
        misbehave("b", &[])
    ));
    let pid = d.wait_connected("a");
    d.wait_connected("b");
    let got = stdio_session(
        d.root(),
        json!([
            ["list"],
            ["call", "search_tools", {"query": "pid"}],
            ["call", "call_tool", {"name": "a__pid", "arguments": {}}]
        ]),
    );
    assert_eq!(got[0]["tools"], json!(["search_tools", "call_tool"]));
    let found: Value = serde_json::from_str(got[1]["text"].as_str().unwrap()).unwrap();
    let names: Vec<&str> = found["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    // Both servers list `pid`: both prefixed.
    assert_eq!(names[..2], ["a__pid", "b__pid"], "{found}");
    assert_eq!(got[2]["text"], pid.to_string(), "{}", got[2]);
    let calls: Vec<Value> = wait_for("both tool-call events", || {
        let calls: Vec<Value> = d
            .events()
            .into_iter()
            .filter(|e| e["kind"] == "mcp.tool_call")
            .collect();
        (calls.len() >= 2).then_some(calls)
    });
    assert_eq!(calls[1]["payload"]["name"], "a__pid");
    assert_eq!(calls[1]["payload"]["server"], "a");
    // One-off flags would change what the daemon serves to everyone.
    let out = npc()
        .args(["mcp", "serve", "--tools", "all"])
        .current_dir(d.root())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("`[mcp] prefix` and `tools`"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_supervised_upstream_speaking_only_2026_07_28_is_reached_on_its_own_pipes() {
    if !python_sdk() {
        return;
    }
    let modern = repo_root()
        .join("fixtures/mcp/modern_server.py")
        .display()
        .to_string();
    let d = Daemon::start(&format!(
        "version = 1\n[mcp.servers.m]\ncommand = \"python3\"\nargs = [{modern:?}]\nstartup_timeout_ms = 60000\n"
    ));
    // Its refused `initialize` left the pipes to `server/discover`: the
    // session rides on the process the supervisor started, not a restart.
    let pid = d.wait_connected("m");
    let got = stdio_session(
        d.root(),
        json!([call("m__whoami"), ["read", "npc://m/modern://note"]]),
    );
    let said: Value = serde_json::from_str(got[0]["text"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("{e}: {}", got[0]));
    assert_eq!(said["protocolVersion"], "2026-07-28", "{said}");
    assert_eq!(
        got[1]["contents"][0]["text"], "spoken in 2026",
        "{}",
        got[1]
    );
    assert_eq!(d.mcp_pid("m"), Some(pid), "the same process throughout");
}
