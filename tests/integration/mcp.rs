//! The MCP gateway (`npc mcp serve`) through the real binary, driven by a
//! real MCP client (the Python `mcp` SDK, `fixtures/mcp/client.py`), in
//! front of real upstream servers: the reference `server-everything` (npm)
//! and `fixtures/mcp/misbehave.py`, which crashes, hangs or writes garbage
//! on request. `.ci/run` installs both SDK and server; tests skip with a
//! message only where they are missing.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use tempfile::TempDir;

use crate::support::{Peer, npc, npc_path, repo_root, require, wait_for};

/// Longest one client session may take in these tests.
const CLIENT_LIMIT: Duration = Duration::from_secs(90);

/// Whether the Python MCP SDK is importable ([`require`]).
pub(crate) fn python_sdk() -> bool {
    require(Peer::python_module("mcp", "pip install mcp"))
}

/// Whether `mcp-server-everything` is on `PATH` ([`require`]).
pub(crate) fn server_everything() -> bool {
    require(Peer::program(
        "mcp-server-everything",
        "npm install -g @modelcontextprotocol/server-everything",
    ))
}

fn misbehave() -> String {
    repo_root()
        .join("fixtures/mcp/misbehave.py")
        .display()
        .to_string()
}

/// A repository with `manifest` as its `npcagent.toml`.
pub(crate) fn repo(manifest: &str) -> TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("npcagent.toml"), manifest).unwrap();
    dir
}

fn bad_server(tool_timeout_ms: u64) -> String {
    format!(
        "[mcp.servers.bad]\ncommand = \"python3\"\nargs = [{:?}]\ntool_timeout_ms = {tool_timeout_ms}\n",
        misbehave()
    )
}

/// Run the client's `steps` against `npc mcp serve` on stdio in `dir`; one
/// JSON value per step.
pub(crate) fn stdio_session(dir: &TempDir, steps: Value) -> Vec<Value> {
    stdio_session_in(dir.path(), steps)
}

/// [`stdio_session`] in the repository at `root`.
pub(crate) fn stdio_session_in(root: &std::path::Path, steps: Value) -> Vec<Value> {
    stdio_session_env(root, steps, &[])
}

/// [`stdio_session_in`] with variables of the environment set (`Some`) or
/// removed (`None`).
pub(crate) fn stdio_session_env(
    root: &std::path::Path,
    steps: Value,
    env: &[(&str, Option<&str>)],
) -> Vec<Value> {
    let mut client = assert_cmd::Command::new("python3");
    for (name, value) in env {
        match value {
            Some(value) => client.env(name, value),
            None => client.env_remove(name),
        };
    }
    let out = client
        .arg(repo_root().join("fixtures/mcp/client.py"))
        .arg(steps.to_string())
        .args(["--", &npc_path().display().to_string(), "mcp", "serve"])
        .current_dir(root)
        .timeout(CLIENT_LIMIT)
        .output()
        .unwrap();
    client_answers(&out)
}

/// The answers (one JSON line a step) of a client run that must succeed.
pub(crate) fn client_answers(out: &std::process::Output) -> Vec<Value> {
    assert!(
        out.status.success(),
        "client failed: {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A `list` step's tools without npc's built-ins (which have no `__`).
pub(crate) fn upstream_tools(step: &Value) -> Vec<Value> {
    step["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t.as_str().is_some_and(|t| t.contains("__")))
        .cloned()
        .collect()
}

pub(crate) fn call(name: &str, arguments: Value) -> Value {
    json!(["call", name, arguments])
}

pub(crate) fn ok_text(step: &Value) -> &str {
    assert_eq!(step["is_error"], false, "expected a result: {step}");
    step["text"].as_str().unwrap()
}

pub(crate) fn error_text(step: &Value) -> &str {
    assert_eq!(step["is_error"], true, "expected an isError result: {step}");
    step["text"].as_str().unwrap()
}

/// The `mcp.tool_call` events recorded in `dir`.
pub(crate) fn tool_call_events(dir: &TempDir) -> Vec<Value> {
    events_of_kind(dir, "mcp.tool_call")
}

/// The events of `kind` recorded in `dir`.
pub(crate) fn events_of_kind(dir: &TempDir, kind: &str) -> Vec<Value> {
    events_of_kind_in(dir.path(), kind)
}

/// The events of `kind` recorded for the repository at `root`.
pub(crate) fn events_of_kind_in(root: &std::path::Path, kind: &str) -> Vec<Value> {
    let out = npc()
        .args(["events", "--format", "json"])
        .current_dir(root)
        .output()
        .unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["kind"] == kind)
        .collect()
}

#[test]
fn gateway_lists_server_everything_tools_namespaced_and_calls_echo() {
    if !python_sdk() || !server_everything() {
        return;
    }
    let dir = repo(
        "version = 1\n[mcp.servers.everything]\ncommand = \"mcp-server-everything\"\ndisabled_tools = [\"get-env\"]\n",
    );
    let got = stdio_session(
        &dir,
        json!([
            ["list"],
            call("everything__echo", json!({"message": "hello gateway"})),
            call("everything__get-env", json!({}))
        ]),
    );
    let upstream = upstream_tools(&got[0]);
    let tools: Vec<&str> = upstream.iter().map(|t| t.as_str().unwrap()).collect();
    assert!(tools.contains(&"everything__echo"), "{tools:?}");
    assert!(tools.contains(&"everything__get-sum"), "{tools:?}");
    assert!(
        !tools.contains(&"everything__get-env"),
        "`disabled_tools` hides it: {tools:?}"
    );
    assert!(tools.iter().all(|t| t.starts_with("everything__")));
    assert_eq!(ok_text(&got[1]), "Echo: hello gateway");
    assert!(
        error_text(&got[2]).contains("no tool `everything__get-env`"),
        "a disabled tool cannot be called either"
    );
    let events = tool_call_events(&dir);
    assert_eq!(events.len(), 2, "{events:?}");
    let p = &events[0]["payload"];
    assert_eq!(
        (&p["server"], &p["tool"], &p["outcome"]),
        (&json!("everything"), &json!("echo"), &json!("ok"))
    );
    assert!(p["duration_ms"].as_f64().is_some(), "{p}");
    assert_eq!(events[0]["component"], "mcp_server.everything");
}

#[test]
fn server_crashing_mid_call_costs_one_error_result_and_a_reconnect() {
    if !python_sdk() {
        return;
    }
    let dir = repo(&format!("version = 1\n{}", bad_server(60_000)));
    let got = stdio_session(
        &dir,
        json!([call("bad__crash", json!({})), call("bad__ok", json!({}))]),
    );
    let message = error_text(&got[0]);
    assert!(
        message.contains("`bad`") && message.contains("reconnected"),
        "{message}"
    );
    assert_eq!(ok_text(&got[1]), "fine", "the next call reconnects");
    let outcomes: Vec<Value> = tool_call_events(&dir)
        .iter()
        .map(|e| e["payload"]["outcome"].clone())
        .collect();
    assert_eq!(outcomes, [json!("lost"), json!("ok")]);
}

#[test]
fn server_hanging_past_tool_timeout_is_an_error_naming_server_and_limit() {
    if !python_sdk() {
        return;
    }
    let dir = repo(&format!("version = 1\n{}", bad_server(700)));
    let got = stdio_session(
        &dir,
        json!([call("bad__hang", json!({})), call("bad__ok", json!({}))]),
    );
    let message = error_text(&got[0]);
    assert!(
        message.contains("`bad`") && message.contains("`tool_timeout_ms` of 700 ms"),
        "{message}"
    );
    assert_eq!(ok_text(&got[1]), "fine", "the gateway keeps serving");
}

#[test]
fn server_printing_garbage_is_an_error_result_and_the_gateway_keeps_serving() {
    if !python_sdk() {
        return;
    }
    let dir = repo(&format!("version = 1\n{}", bad_server(1500)));
    let got = stdio_session(
        &dir,
        json!([
            call("bad__garbage", json!({})),
            call("bad__ok", json!({})),
            ["list"]
        ]),
    );
    assert!(error_text(&got[0]).contains("`bad`"));
    assert_eq!(ok_text(&got[1]), "fine");
    assert_eq!(
        Value::Array(upstream_tools(&got[2])),
        json!([
            "bad__ok",
            "bad__pid",
            "bad__grow",
            "bad__flood",
            "bad__crash",
            "bad__hang",
            "bad__garbage"
        ])
    );
}

#[test]
fn upstream_tool_list_change_refreshes_the_cache_and_notifies_clients() {
    if !python_sdk() {
        return;
    }
    let dir = repo(&format!("version = 1\n{}", bad_server(60_000)));
    let got = stdio_session(
        &dir,
        json!([
            ["list"],
            call("bad__grow", json!({})),
            ["wait_list_changed"],
            ["list"],
            call("bad__extra", json!({}))
        ]),
    );
    assert!(
        !got[0]["tools"]
            .as_array()
            .unwrap()
            .contains(&json!("bad__extra"))
    );
    assert_eq!(got[2]["list_changed"], true, "the gateway told its client");
    assert!(
        got[3]["tools"]
            .as_array()
            .unwrap()
            .contains(&json!("bad__extra")),
        "{}",
        got[3]
    );
    assert_eq!(ok_text(&got[4]), "fine", "the new tool is callable");
}

#[test]
fn flood_of_list_changed_notifications_leaves_the_gateway_serving() {
    if !python_sdk() {
        return;
    }
    let dir = repo(&format!("version = 1\n{}", bad_server(60_000)));
    let got = stdio_session(
        &dir,
        json!([
            call("bad__flood", json!({})),
            call("bad__ok", json!({})),
            ["list"]
        ]),
    );
    assert_eq!(ok_text(&got[0]), "fine");
    assert_eq!(ok_text(&got[1]), "fine");
    assert_eq!(upstream_tools(&got[2]).len(), 7, "{}", got[2]);
}

#[test]
fn endless_tool_pages_are_cut_at_the_page_limit() {
    if !python_sdk() {
        return;
    }
    let dir = repo(&format!(
        "version = 1\n{}env = {{ MISBEHAVE_ENDLESS_PAGES = \"1\" }}\n",
        bad_server(60_000)
    ));
    let got = stdio_session(&dir, json!([["list"], call("bad__p0", json!({}))]));
    let tools = upstream_tools(&got[0]);
    assert_eq!(tools.len(), 64, "MAX_TOOL_PAGES pages of one tool each");
    assert_eq!(tools[0], "bad__p0");
    assert_eq!(ok_text(&got[1]), "fine", "the server still serves calls");
}

#[test]
fn idle_session_is_closed_and_reconnected_on_the_next_call() {
    if !python_sdk() {
        return;
    }
    let dir = repo(&format!(
        "version = 1\n{}idle_timeout = 1\n",
        bad_server(60_000)
    ));
    let got = stdio_session(
        &dir,
        json!([
            call("bad__pid", json!({})),
            ["wait_gone"],
            call("bad__pid", json!({}))
        ]),
    );
    let first = ok_text(&got[0]).to_string();
    assert_eq!(got[1]["gone"], true, "the idle server process was stopped");
    assert_ne!(
        ok_text(&got[2]),
        first,
        "the next call started a new process"
    );
}

/// `npc mcp serve` driven frame by frame, its stdout read on a thread.
struct RawSession {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    lines: std::sync::mpsc::Receiver<Value>,
}

impl RawSession {
    fn start(dir: &TempDir) -> Self {
        Self::open(dir, Some("2025-06-18"))
    }

    /// A session that initializes with `version`, or none that does not
    /// (2026-07-28: each request names its version in `_meta`).
    fn open(dir: &TempDir, version: Option<&str>) -> Self {
        let mut child = Command::new(npc_path())
            .args(["mcp", "serve"])
            .current_dir(dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                // Every line on stdout is a JSON-RPC frame.
                let frame: Value = serde_json::from_str(&line).expect("stdout carries only JSON");
                if tx.send(frame).is_err() {
                    break;
                }
            }
        });
        let mut session = Self {
            child,
            stdin,
            lines,
        };
        let Some(version) = version else {
            return session;
        };
        session.send(
            &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": version, "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"}}}),
        );
        let answer = session.next();
        assert_eq!(answer["id"], 0);
        assert_eq!(answer["result"]["protocolVersion"], version, "{answer}");
        session.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        session
    }

    fn send_raw(&mut self, bytes: &[u8]) {
        use std::io::Write as _;
        self.stdin.write_all(bytes).unwrap();
        self.stdin.write_all(b"\n").unwrap();
        self.stdin.flush().unwrap();
    }

    fn send(&mut self, frame: &Value) {
        self.send_raw(frame.to_string().as_bytes());
    }

    fn call(&mut self, id: Value, name: &str) {
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": name, "arguments": {}}}));
    }

    fn next(&mut self) -> Value {
        self.lines
            .recv_timeout(CLIENT_LIMIT)
            .expect("the gateway answers in time")
    }
}

impl Drop for RawSession {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `_meta` of a 2026-07-28 request: the version, capabilities and client
/// every request carries when there is no `initialize`.
fn per_request_meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
    })
}

#[test]
fn protocol_versions_2025_06_18_2025_11_25_and_2026_07_28_reach_an_upstream() {
    let dir = repo(&format!("version = 1\n{}", bad_server(5000)));
    for version in ["2025-06-18", "2025-11-25"] {
        let mut session = RawSession::open(&dir, Some(version));
        session.call(json!(1), "bad__ok");
        let answer = session.next();
        assert_eq!(
            answer["result"]["content"][0]["text"], "fine",
            "{version}: {answer}"
        );
        session.send(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}));
        let listed = session.next();
        assert!(
            listed["result"]["tools"]
                .as_array()
                .is_some_and(|t| !t.is_empty())
                && listed["result"].get("ttlMs").is_none(),
            "{version} lists tools without 2026-07-28's cache hints: {listed}"
        );
    }
    // 2026-07-28: no handshake; the server says what it speaks, and requests
    // naming the version in their `_meta` get that version's answers.
    let mut session = RawSession::open(&dir, None);
    session.send(
        &json!({"jsonrpc": "2.0", "id": 1, "method": "server/discover",
        "params": {"_meta": per_request_meta()}}),
    );
    let discovered = session.next();
    let versions = discovered["result"]["supportedVersions"].clone();
    for version in ["2025-06-18", "2025-11-25", "2026-07-28"] {
        assert!(
            versions.as_array().unwrap().contains(&json!(version)),
            "{discovered}"
        );
    }
    session.send(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "bad__ok", "arguments": {}, "_meta": per_request_meta()}}));
    let answer = session.next();
    assert_eq!(answer["id"], 2);
    assert_eq!(answer["result"]["content"][0]["text"], "fine", "{answer}");
    session.send(&json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list",
        "params": {"_meta": per_request_meta()}}));
    let listed = session.next();
    assert_eq!(
        (&listed["result"]["resultType"], &listed["result"]["ttlMs"]),
        (&json!("complete"), &json!(0)),
        "2026-07-28 answers carry its cache hints: {listed}"
    );
    // A version npc does not know is answered with one it does.
    let mut session = RawSession::open(&dir, None);
    session.send(
        &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "1999-01-01", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}}}),
    );
    let answer = session.next();
    assert_eq!(
        answer["result"]["protocolVersion"], "2025-11-25",
        "{answer}"
    );
}

/// `fixtures/mcp/modern_server.py`: the official Python SDK serving only
/// protocol 2026-07-28 (it refuses `initialize`), over stdio or, with
/// `--http PORT`, streamable HTTP.
fn modern_server() -> String {
    repo_root()
        .join("fixtures/mcp/modern_server.py")
        .display()
        .to_string()
}

impl RawSession {
    /// The frames up to the answer to request `id`: what came before it,
    /// and the answer.
    fn until_answer(&mut self, id: &Value) -> (Vec<Value>, Value) {
        let mut before = Vec::new();
        loop {
            let frame = self.next();
            if frame.get("method").is_none() && &frame["id"] == id {
                return (before, frame);
            }
            before.push(frame);
        }
    }

    fn request(&mut self, id: Value, method: &str, params: Value) -> (Vec<Value>, Value) {
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        self.until_answer(&id)
    }
}

#[test]
fn an_upstream_speaking_only_2026_07_28_is_reached_without_a_handshake_over_stdio_and_http() {
    if !python_sdk() {
        return;
    }
    let port = crate::support::free_port();
    let _http = crate::support::Stopped::new(
        Command::new("python3")
            .arg(modern_server())
            .args(["--http", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for("the 2026-07-28 server to listen", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).ok()
    });
    let dir = repo(&format!(
        "version = 1\n[mcp.servers.local]\ncommand = \"python3\"\nargs = [{:?}]\nstartup_timeout_ms = 60000\n[mcp.servers.remote]\nurl = \"http://127.0.0.1:{port}/mcp\"\n",
        modern_server()
    ));
    // A client of 2025-06-18 in front: the gateway bridges the two eras.
    let mut session = RawSession::start(&dir);
    for (n, server) in ["local", "remote"].into_iter().enumerate() {
        let id = |k: usize| json!(format!("{server}-{}", n * 10 + k));
        let (_, whoami) = session.request(
            id(1),
            "tools/call",
            json!({"name": format!("{server}__whoami"), "arguments": {}}),
        );
        let said: Value = whoami["result"]["content"][0]["text"]
            .as_str()
            .and_then(|text| serde_json::from_str(text).ok())
            .unwrap_or_else(|| panic!("{server}: {whoami}"));
        assert_eq!(said["protocolVersion"], "2026-07-28", "{server}: {said}");
        for key in [
            "io.modelcontextprotocol/protocolVersion",
            "io.modelcontextprotocol/clientInfo",
            "io.modelcontextprotocol/clientCapabilities",
        ] {
            assert!(
                said["meta"].as_array().unwrap().contains(&json!(key)),
                "{server}: each request carries `{key}`: {said}"
            );
        }
        assert_eq!(
            whoami["result"].get("resultType"),
            None,
            "{server}: the answer keeps the client's 2025-06-18 shape: {whoami}"
        );
        // Progress under the client's own token, before the answer.
        let token = format!("progress-{server}");
        let (before, counted) = session.request(
            id(2),
            "tools/call",
            json!({"name": format!("{server}__count"), "arguments": {"to": 2},
                   "_meta": {"progressToken": token}}),
        );
        assert_eq!(
            counted["result"]["content"][0]["text"], "counted 2",
            "{server}: {counted}"
        );
        let progress: Vec<&Value> = before
            .iter()
            .filter(|f| f["method"] == "notifications/progress")
            .map(|f| &f["params"])
            .collect();
        assert_eq!(progress.len(), 2, "{server}: {before:?}");
        assert!(
            progress
                .iter()
                .enumerate()
                .all(|(i, p)| p["progressToken"] == token
                    && p["progress"].as_f64() == Some((i + 1) as f64)),
            "{server}: {progress:?}"
        );
        let (_, read) = session.request(
            id(3),
            "resources/read",
            json!({"uri": format!("npc://{server}/modern://note")}),
        );
        assert_eq!(
            read["result"]["contents"][0]["text"], "spoken in 2026",
            "{server}: {read}"
        );
        let (_, prompt) = session.request(
            id(4),
            "prompts/get",
            json!({"name": format!("{server}__greet"), "arguments": {"name": "Ada"}}),
        );
        assert_eq!(
            prompt["result"]["messages"][0]["content"]["text"], "Hello, Ada.",
            "{server}: {prompt}"
        );
    }
    // Every call went through the one call path, and was recorded.
    let recorded = wait_for("the calls' records", || {
        let events = tool_call_events(&dir);
        (events.len() >= 4).then_some(events)
    });
    for server in ["local", "remote"] {
        assert!(
            recorded
                .iter()
                .any(|e| e["payload"]["server"] == server && e["payload"]["outcome"] == "ok"),
            "{server}: {recorded:?}"
        );
    }
}

#[test]
fn malformed_oversized_and_cancelled_client_frames_cost_only_themselves() {
    let dir = repo(&format!("version = 1\n{}", bad_server(1500)));
    let mut session = RawSession::start(&dir);
    // Not JSON: dropped (as rmcp does); a frame over the bound: a parse
    // error with no id, read and dropped without holding it.
    session.send_raw(b"this is not json");
    let oversized = vec![b'x'; 16 * 1024 * 1024 + 1];
    session.send_raw(&oversized);
    let error = session.next();
    assert_eq!(
        (&error["id"], &error["error"]["code"]),
        (&Value::Null, &json!(-32700)),
        "{error}"
    );
    // A malformed call goes to rmcp, which answers it with an error.
    session.send_raw(br#"{"jsonrpc":"2.0","id":"bad","method":"tools/call","params":{"name":7}}"#);
    let bad = session.next();
    assert_eq!(bad["id"], "bad");
    assert!(bad["error"].is_object(), "{bad}");
    // Answers keep the shape of the protocol version the client chose.
    session.call(json!(1), "bad__ok");
    let ok = session.next();
    assert_eq!(ok["id"], 1, "{ok}");
    assert!(ok["result"]["content"].is_array(), "{ok}");
    assert_eq!(
        ok["result"].get("resultType"),
        None,
        "2025-06-18 shape: {ok}"
    );
    // A cancelled call stops, is recorded as cancelled, and is not answered.
    session.call(json!("slow"), "bad__hang");
    session.send(
        &json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": "slow", "reason": "changed my mind"}}),
    );
    let record = wait_for("the cancelled call's record", || {
        tool_call_events(&dir)
            .into_iter()
            .find(|e| e["payload"]["tool"] == "hang")
    });
    assert_eq!(record["payload"]["outcome"], "cancelled", "{record}");
    session.send(&json!({"jsonrpc": "2.0", "id": 3, "method": "ping"}));
    let pong = session.next();
    assert_eq!(
        pong["id"], 3,
        "no answer to the cancelled call came first: {pong}"
    );
}

#[test]
fn a_session_stops_reading_while_its_calls_in_flight_are_at_the_bound() {
    // `npcagent::mcp::server::session::MAX_CALLS_IN_FLIGHT`.
    const BOUND: usize = 64;
    let dir = repo(&format!("version = 1\n{}", bad_server(1000)));
    let mut session = RawSession::start(&dir);
    for i in 0..BOUND {
        session.call(json!(i), "bad__hang");
    }
    session.send(&json!({"jsonrpc": "2.0", "id": "ping", "method": "ping"}));
    // The ping is read only once a call has ended and been answered.
    let first = session.next();
    assert!(first["id"].is_u64(), "a call's answer comes first: {first}");
    assert!(
        first["result"]["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("tool_timeout_ms")),
        "{first}"
    );
    let mut answered = 1;
    loop {
        let frame = session.next();
        if frame["id"] == "ping" {
            break;
        }
        answered += 1;
        assert!(answered <= BOUND, "every call answered, and the ping too");
    }
}

#[test]
fn unknown_tool_and_unreachable_server_are_error_results() {
    if !python_sdk() {
        return;
    }
    let dir = repo(&format!(
        "version = 1\n{}[mcp.servers.gone]\ncommand = \"npc-test-no-such-program\"\n",
        bad_server(60_000)
    ));
    let got = stdio_session(
        &dir,
        json!([call("nope__x", json!({})), call("bad__ok", json!({}))]),
    );
    assert!(error_text(&got[0]).contains("no tool `nope__x`"));
    assert_eq!(
        ok_text(&got[1]),
        "fine",
        "a failing server costs only itself"
    );
}

#[test]
fn recorded_calls_redact_secret_and_sensitive_arguments() {
    if !python_sdk() {
        return;
    }
    let secret = "npc-mcp-test-secret-4f1a";
    let manifest = format!(
        "version = 1\n{}env = {{ KEY = \"${{NPC_MCP_TEST_SECRET}}\" }}\n",
        bad_server(60_000)
    );
    let dir = repo(&manifest);
    let npc = npc_path().display().to_string();
    let steps = json!([call(
        "bad__ok",
        json!({"q": secret, "api_token": "tok-123456789"})
    )]);
    let out = assert_cmd::Command::new("python3")
        .arg(repo_root().join("fixtures/mcp/client.py"))
        .arg(steps.to_string())
        .args(["--", &npc, "mcp", "serve"])
        .env("NPC_MCP_TEST_SECRET", secret)
        .current_dir(dir.path())
        .timeout(CLIENT_LIMIT)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events = tool_call_events(&dir);
    let text = serde_json::to_string(&events).unwrap();
    assert_eq!(events.len(), 1, "{text}");
    assert!(
        !text.contains(secret),
        "a secret value reached the event log: {text}"
    );
    assert!(
        !text.contains("tok-123456789"),
        "a token argument was recorded: {text}"
    );
    assert_eq!(events[0]["payload"]["arguments"]["api_token"], "<redacted>");
}

/// The credential of the HTTP gateway serving the repository at `root`:
/// its token (`.npc/api.token`, made when the gateway started).
pub(crate) fn gateway_token(root: &std::path::Path) -> String {
    std::fs::read_to_string(root.join(".npc/api.token"))
        .unwrap()
        .trim()
        .to_string()
}

/// server-everything over `transport` (`streamableHttp`, or `sse`, the
/// deprecated HTTP+SSE) on a free loopback port, bound to 127.0.0.1 by the
/// loopback preload, once it listens: the process (stopped when dropped)
/// and its port.
pub(crate) fn everything_listening(transport: &str) -> (crate::support::Stopped, u16) {
    let port = crate::support::free_port();
    let preload = repo_root().join("fixtures/mcp/loopback.cjs");
    let server = Command::new("mcp-server-everything")
        .arg(transport)
        .env("PORT", port.to_string())
        .env("NODE_OPTIONS", format!("--require {}", preload.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let server = crate::support::Stopped::new(server);
    wait_for("server-everything to listen", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).ok()
    });
    (server, port)
}

/// `npc mcp serve --http 127.0.0.1:0` in `dir`, and the URL it listens on.
pub(crate) fn spawn_http_gateway(dir: &TempDir) -> (std::process::Child, String) {
    spawn_http_gateway_in(dir.path(), &[])
}

/// [`spawn_http_gateway`] in the repository at `root`, with `env` set.
pub(crate) fn spawn_http_gateway_in(
    root: &std::path::Path,
    env: &[(&str, &str)],
) -> (std::process::Child, String) {
    let mut gateway = Command::new(npc_path())
        .args(["mcp", "serve", "--http", "127.0.0.1:0"])
        .envs(env.iter().copied())
        .current_dir(root)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = gateway.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let url = wait_for("the gateway's listening line", || {
        rx.try_recv()
            .ok()
            .and_then(|l| l.split("listening on ").nth(1).map(str::to_string))
    });
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    (gateway, url)
}

pub(crate) fn sigterm_exits_0(mut gateway: std::process::Child) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(gateway.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = wait_for("the gateway to exit", || gateway.try_wait().unwrap());
    assert_eq!(status.code(), Some(0));
}

#[test]
fn http_gateway_serves_on_loopback_and_exits_cleanly_on_sigterm() {
    if !python_sdk() {
        return;
    }
    let dir = repo(&format!("version = 1\n{}", bad_server(60_000)));
    let (gateway, url) = spawn_http_gateway(&dir);
    let steps = json!([call("bad__crash", json!({})), call("bad__ok", json!({}))]);
    // Without the token the gateway answers 401 and the session never starts.
    let anonymous = assert_cmd::Command::new("python3")
        .arg(repo_root().join("fixtures/mcp/client.py"))
        .arg(steps.to_string())
        .args(["--http", &url])
        .timeout(CLIENT_LIMIT)
        .output()
        .unwrap();
    assert!(!anonymous.status.success());
    let out = assert_cmd::Command::new("python3")
        .arg(repo_root().join("fixtures/mcp/client.py"))
        .arg(steps.to_string())
        .args(["--http", &url])
        .env("MCP_BEARER", gateway_token(dir.path()))
        .timeout(CLIENT_LIMIT)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(error_text(&got[0]).contains("`bad`"));
    assert_eq!(ok_text(&got[1]), "fine");
    sigterm_exits_0(gateway);
}

#[test]
fn http_upstream_is_pooled_like_a_stdio_one() {
    if !python_sdk() {
        return;
    }
    // Upstream: another gateway, over streamable HTTP on loopback.
    let upstream = repo(&format!("version = 1\n{}", bad_server(60_000)));
    let (upstream_gateway, url) = spawn_http_gateway(&upstream);
    let dir = repo(&format!(
        "version = 1\n[mcp.servers.remote]\nurl = \"{url}\"\nheaders = {{ X-Team = \"web\", Authorization = \"Bearer {}\" }}\n",
        gateway_token(upstream.path())
    ));
    let got = stdio_session(
        &dir,
        json!([
            ["list"],
            call("remote__bad__ok", json!({})),
            call("remote__bad__crash", json!({})),
            call("remote__bad__ok", json!({}))
        ]),
    );
    assert!(
        got[0]["tools"]
            .as_array()
            .unwrap()
            .contains(&json!("remote__bad__ok")),
        "{}",
        got[0]
    );
    assert_eq!(ok_text(&got[1]), "fine");
    assert!(
        error_text(&got[2]).contains("`bad`"),
        "the upstream's error passes through"
    );
    assert_eq!(ok_text(&got[3]), "fine");
    sigterm_exits_0(upstream_gateway);
}

#[test]
fn non_loopback_http_address_is_refused_as_usage() {
    let dir = repo("version = 1\n");
    let out = npc()
        .args(["mcp", "serve", "--http", "0.0.0.0:8767"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not a loopback address"), "{stderr}");
}

#[test]
fn invalid_manifest_exits_1_and_stdout_stays_clean() {
    let dir = repo("version = 1\n[mcp.servers.x]\nidle_timeout = -1\ncommand = \"x\"\n");
    let out = npc()
        .args(["mcp", "serve"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty(), "stdout carries only protocol frames");
    assert!(String::from_utf8_lossy(&out.stderr).contains("`idle_timeout` `-1` is out of range"));
}

#[test]
fn client_leaving_before_initialize_is_a_clean_exit() {
    let dir = repo("version = 1\n");
    let out = npc()
        .args(["mcp", "serve"])
        .current_dir(dir.path())
        .write_stdin("")
        .timeout(CLIENT_LIMIT)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout.is_empty());
}

/// Architecture invariant: `src/mcp` binds and connects no socket itself
/// (the HTTP listener lives in `surfaces`; the built-in `fetch_url` and
/// `web_search` connect only through reqwest) and starts servers only
/// through the supervisor.
#[test]
fn mcp_module_binds_no_socket_and_spawns_nothing_itself() {
    let mut files = vec![repo_root().join("src/mcp")];
    while let Some(path) = files.pop() {
        if path.is_dir() {
            files.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for needle in [
                "tokio::net",
                "std::net::Tcp",
                "UnixListener",
                "UnixStream",
                "Command::new",
                "process::Command",
            ] {
                assert!(
                    !code.contains(needle),
                    "{}:{}: `{needle}` in src/mcp",
                    path.display(),
                    i + 1
                );
            }
        }
    }
}

/// An MCP server imported from an agent CLI's file with a `${VAR}` the CLI
/// expands at its own run time: unset, `npc validate` and `npc plan` work
/// and say what is missing, `npc apply` writes the reference (never an
/// empty value) into the agent file, and the daemon and the gateway refuse
/// to start the server, saying why, until the variable is set.
#[test]
fn an_imported_servers_unset_variable_is_a_warning_and_refuses_only_its_start() {
    let dir = repo("version = 1\n\n[providers.claude]\nkind = \"claude_code\"\n");
    crate::worktrees::git(dir.path(), &["init", "--quiet"]);
    let native = json!({"mcpServers": {"github": {
        "command": "python3",
        "args": [misbehave()],
        "env": {"GITHUB_TOKEN": "${GITHUB_TOKEN}"}
    }}});
    std::fs::write(dir.path().join(".mcp.json"), native.to_string()).unwrap();
    let unset = |args: &[&str]| {
        npc()
            .current_dir(dir.path())
            .env_remove("GITHUB_TOKEN")
            .args(args)
            .output()
            .unwrap()
    };
    let said = |out: &std::process::Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    let missing = "environment variable `GITHUB_TOKEN` is not set: MCP server `github` cannot start without it";
    let import = unset(&["import", ".mcp.json", "--write"]);
    assert!(import.status.success(), "{}", said(&import));
    let validate = unset(&["validate"]);
    assert_eq!(validate.status.code(), Some(0), "{}", said(&validate));
    assert!(said(&validate).contains(missing), "{}", said(&validate));
    assert!(
        said(&validate).contains("valid with 1 warning"),
        "{}",
        said(&validate)
    );
    let plan = unset(&["plan"]);
    assert_eq!(plan.status.code(), Some(0), "{}", said(&plan));
    assert!(said(&plan).contains("mcp_server.github"), "{}", said(&plan));
    assert!(said(&plan).contains(missing), "{}", said(&plan));
    let apply = unset(&["apply", "--auto-approve"]);
    assert_eq!(apply.status.code(), Some(0), "{}", said(&apply));
    let written: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join(".mcp.json")).unwrap())
            .unwrap();
    assert_eq!(
        written["mcpServers"]["github"]["env"]["GITHUB_TOKEN"], "${GITHUB_TOKEN}",
        "{written:#}"
    );
    // A daemon without the variable starts everything else and reports
    // that server failed, naming the variable; no process of it is started.
    let daemon = crate::support::Daemon::start_in_with(
        dir.path(),
        crate::support::DaemonSetup {
            only_env: Some(&[]),
            ..Default::default()
        },
    );
    let github = daemon
        .status()
        .into_iter()
        .find(|c| c["id"] == "mcp_server.github")
        .unwrap();
    assert_eq!(github["state"], "failed", "{github:#}");
    assert_eq!(github["pid"], Value::Null, "{github:#}");
    assert!(
        github["error"]
            .as_str()
            .unwrap()
            .starts_with("it needs `GITHUB_TOKEN`"),
        "{github:#}"
    );
    drop(daemon);
    if !python_sdk() {
        return;
    }
    let got = stdio_session_env(
        dir.path(),
        json!([call("github__ok", json!({}))]),
        &[("GITHUB_TOKEN", None)],
    );
    let refused = error_text(&got[0]);
    assert!(
        refused.contains("MCP server `github` did not start: it needs `GITHUB_TOKEN`"),
        "{refused}"
    );
    let got = stdio_session_env(
        dir.path(),
        json!([call("github__ok", json!({}))]),
        &[("GITHUB_TOKEN", Some("npc-test-token"))],
    );
    assert_eq!(ok_text(&got[0]), "fine");
}
