//! `npc acp`: the real binary driven by a real ACP client — the ACP Python
//! SDK (PyPI `agent-client-protocol`, installed by `.ci/run`) through
//! `fixtures/acp/client.py` — over stdio, with the fake agent fixtures as
//! the profile's agent CLI: initialize, a new session, a prompt streaming
//! updates, cancel mid-stream (the agent's process group is gone), a hook's
//! `ask` answered allow and deny in the editor, list/load/resume/fork after
//! a restart. A raw test reads every stdout line as JSON-RPC while sending
//! hostile frames.

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use nix::sys::signal::kill;
use nix::unistd::Pid;
use serde_json::{Value, json};

use crate::support::{Daemon, npc, npc_path, repo_root, wait_for};

const CLAUDE_TOOL_CALL: &str = "claude_code/2.1.197/tool_call.jsonl";
/// The Claude session id recorded in [`CLAUDE_TOOL_CALL`].
pub(crate) const CLAUDE_SESSION: &str = "5f0c-aa";

fn toml_str(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

/// The MCP server profile `dev` names (a daemon would start it; the
/// daemon's tests leave it out with [`daemon_repo`]).
const FS_SERVER: &str = r#"
[mcp.servers.fs]
command = "npx"
args = ["-y", "@modelcontextprotocol/server-filesystem", "."]
"#;

/// [`repo`] without the MCP server, and with the daemon's API on a free
/// loopback port, for a daemon to hold.
fn daemon_repo(env: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = repo(env);
    let path = dir.path().join("npcagent.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let text = text
        .replacen(FS_SERVER, "\n[daemon]\nlisten = \"127.0.0.1:0\"\n", 1)
        .replacen("mcp_servers = [\"fs\"]\n", "", 1);
    std::fs::write(&path, text).unwrap();
    dir
}

/// A repository whose profile `dev` runs the fake agent replaying
/// [`CLAUDE_TOOL_CALL`] with `env`, and whose profile `hooked` runs
/// `fixtures/acp/hooked-agent.py` under a `before_tool` hook answering `ask`.
pub(crate) fn repo(env: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let agent = repo_root().join("fixtures/clis/fake-agent.py");
    let hooked = repo_root().join("fixtures/acp/hooked-agent.py");
    let fixture = repo_root().join("fixtures/clis").join(CLAUDE_TOOL_CALL);
    let env: Vec<String> = env
        .iter()
        .map(|(k, v)| format!("{k} = {}", toml_str(v)))
        .collect();
    let manifest = format!(
        r#"
version = 1
{FS_SERVER}
[providers.fake]
kind = "claude_code"
command = {agent}
args = ["--provider", "claude_code", "--fixture", {fixture}]
env = {{ {env} }}

[providers.hooked]
kind = "claude_code"
command = {hooked}
env = {{ NPC_BIN = {npc} }}

[prompts.review]
template = "Review {{{{ vars.branch }}}} carefully"
variables.branch = {{ default = "main" }}

[[hooks.before_tool]]
command = "sh"
args = ["-c", "cat >/dev/null; echo '{{\"decision\":\"ask\",\"reason\":\"it runs a shell\"}}'"]
matcher = "^Bash$"

[profiles.dev]
provider = "fake"
description = "development"
mcp_servers = ["fs"]

[profiles.hooked]
provider = "hooked"
description = "asks before tools"
"#,
        agent = toml_str(&agent.display().to_string()),
        hooked = toml_str(&hooked.display().to_string()),
        fixture = toml_str(&fixture.display().to_string()),
        npc = toml_str(&npc_path().display().to_string()),
        env = env.join(", "),
    );
    std::fs::write(dir.path().join("npcagent.toml"), manifest).unwrap();
    dir
}

/// Whether the ACP Python SDK is importable ([`require`](crate::support::require)).
pub(crate) fn python_sdk() -> bool {
    crate::support::require(crate::support::Peer::python_module(
        "acp",
        "pip install agent-client-protocol==0.12.1",
    ))
}

/// Run `fixtures/acp/client.py SCENARIO` against `npc acp --profile PROFILE` in `dir`.
fn client(dir: &Path, profile: &str, scenario: &str, args: &[&str]) -> Value {
    client_with(dir, profile, scenario, args, &[])
}

/// [`client`] with `env` in `npc acp`'s environment.
pub(crate) fn client_with(
    dir: &Path,
    profile: &str,
    scenario: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> Value {
    let out = Command::new("python3")
        .arg(repo_root().join("fixtures/acp/client.py"))
        .arg(scenario)
        .arg(npc_path())
        .arg(dir)
        .args(args)
        .env("ACP_PROFILE", profile)
        .env(
            "ACP_AGENT_ENV",
            Value::Object(
                env.iter()
                    .map(|(k, v)| (k.to_string(), Value::String(v.to_string())))
                    .collect(),
            )
            .to_string(),
        )
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "client {scenario} failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The `update` objects a client saw, of session `id`.
fn updates<'a>(seen: &'a Value, id: &str) -> Vec<&'a Value> {
    seen["updates"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|u| u["sessionId"] == id)
        .map(|u| &u["update"])
        .collect()
}

/// The `tool_call_update` the client saw in its session.
fn tool_result(seen: &Value) -> Value {
    let id = seen["session_id"].as_str().unwrap();
    updates(seen, id)
        .into_iter()
        .find(|u| u["sessionUpdate"] == "tool_call_update")
        .expect("a tool_call_update")
        .clone()
}

/// The client was asked once, answered `answer`, and the tool call ended
/// `status` with `text` in its output; the permission request it saw.
fn the_editor_decided(seen: &Value, answer: &str, status: &str, text: &str) -> Value {
    let asked = seen["permissions"].as_array().unwrap();
    assert_eq!(asked.len(), 1, "asked once: {seen}");
    assert_eq!(asked[0]["sessionId"], seen["session_id"]);
    let result = tool_result(seen);
    assert_eq!(result["status"], status, "{answer}: {result}");
    assert!(
        result["rawOutput"].as_str().unwrap().contains(text),
        "{answer}: {result}"
    );
    asked[0].clone()
}

/// The prompt streamed an update, then ended cancelled.
fn cancelled_after_an_update(seen: &Value) {
    assert_eq!(seen["stop_reason"], "cancelled");
    assert_eq!(seen["meta"]["npc"]["outcome"], "cancelled");
    let id = seen["session_id"].as_str().unwrap();
    assert!(
        updates(seen, id)
            .iter()
            .any(|u| u["sessionUpdate"] == "agent_message_chunk"),
        "an update streamed before the cancel"
    );
}

/// Wait until the agent whose (host) pid is in `pid_file` is gone: it runs
/// in a PID namespace of its own, which ends with it.
fn agent_group_gone(pid_file: &Path) {
    let pid: u32 = std::fs::read_to_string(pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    wait_for("the agent to be gone", || {
        (!crate::support::alive(pid)).then_some(())
    });
}

pub(crate) fn kinds(updates: &[&Value]) -> Vec<String> {
    updates
        .iter()
        .map(|u| u["sessionUpdate"].as_str().unwrap().to_string())
        .collect()
}

fn events(dir: &Path) -> Vec<Value> {
    let out = npc()
        .current_dir(dir)
        .args(["events", "--format", "json"])
        .output()
        .unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Have the fake agent of the repository at `dir` record its arguments;
/// the file it writes them to.
pub(crate) fn record_argv(dir: &Path) -> PathBuf {
    let argv_file = dir.join("argv.json");
    let manifest = std::fs::read_to_string(dir.join("npcagent.toml")).unwrap();
    std::fs::write(
        dir.join("npcagent.toml"),
        manifest.replacen(
            "env = {  }",
            &format!(
                "env = {{ FAKE_AGENT_ARGV_FILE = {} }}",
                toml_str(&argv_file.display().to_string())
            ),
            1,
        ),
    )
    .unwrap();
    argv_file
}

pub(crate) fn argv(file: &Path) -> Vec<String> {
    serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap()
}

#[test]
fn a_prompt_streams_the_runs_updates_advertises_commands_and_is_recorded() {
    if !python_sdk() {
        return;
    }
    let dir = repo(&[]);
    let seen = client(dir.path(), "dev", "prompt", &["list the files"]);
    let caps = &seen["init"]["agentCapabilities"];
    assert_eq!(caps["loadSession"], true);
    for cap in ["list", "resume", "fork"] {
        assert!(caps["sessionCapabilities"][cap].is_object(), "{caps}");
    }
    assert_eq!(caps["_meta"]["npc"]["mcpServers"], json!(["fs"]));
    assert_eq!(seen["session_meta"]["npc"]["mcpServers"], json!(["fs"]));
    let id = seen["session_id"].as_str().unwrap();
    assert!(id.starts_with("acp-"), "{id}");
    let ups = updates(&seen, id);
    let commands = ups
        .iter()
        .find(|u| u["sessionUpdate"] == "available_commands_update")
        .expect("the manifest's prompts as slash commands");
    assert_eq!(commands["availableCommands"][0]["name"], "review");
    let stream: Vec<&Value> = ups
        .into_iter()
        .filter(|u| u["sessionUpdate"] != "available_commands_update")
        .collect();
    assert_eq!(
        kinds(&stream),
        [
            "agent_message_chunk",
            "tool_call",
            "tool_call_update",
            "agent_message_chunk"
        ]
    );
    assert_eq!(stream[0]["content"]["text"], "Listing files.");
    assert_eq!(stream[1]["toolCallId"], "toolu_01");
    assert_eq!(stream[1]["kind"], "execute");
    assert_eq!(stream[1]["status"], "in_progress");
    assert_eq!(stream[2]["toolCallId"], "toolu_01");
    assert_eq!(stream[2]["status"], "completed");
    assert_eq!(stream[3]["content"]["text"], "Two entries.");
    assert_eq!(seen["stop_reason"], "end_turn");
    // No daemon holds the repository: the run ran in `npc acp` itself.
    assert_eq!(seen["meta"]["npc"]["ranIn"], "acp");
    // The prompt was an `npc run`: its events are in the log under its id.
    let run_id = seen["meta"]["npc"]["runId"].as_str().unwrap();
    let finished = events(dir.path())
        .into_iter()
        .find(|e| e["kind"] == "run.finished")
        .expect("run.finished");
    assert_eq!(finished["payload"]["run_id"], run_id);
    assert_eq!(finished["payload"]["outcome"], "succeeded");
    // Listed as a prompt of `npc acp`, like one the daemon runs.
    let out = npc()
        .current_dir(dir.path())
        .args(["runs", "--format", "json"])
        .output()
        .unwrap();
    let runs: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let run = runs.iter().find(|r| r["id"] == run_id).expect("listed");
    assert_eq!(run["origin"], "acp", "{run}");
}

#[test]
fn a_slash_command_renders_the_manifests_prompt_and_a_second_prompt_resumes_the_conversation() {
    if !python_sdk() {
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let argv_file = scratch.path().join("argv.json");
    let dir = repo(&[("FAKE_AGENT_ARGV_FILE", &argv_file.display().to_string())]);
    slash_command_and_resume(dir.path(), &argv_file, "acp");
}

#[test]
fn with_a_daemon_up_a_slash_command_and_the_resume_of_a_conversation_pass_through_the_daemon() {
    if !python_sdk() {
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let argv_file = scratch.path().join("argv.json");
    let dir = daemon_repo(&[("FAKE_AGENT_ARGV_FILE", &argv_file.display().to_string())]);
    let _daemon = Daemon::start_in(dir.path());
    slash_command_and_resume(dir.path(), &argv_file, "daemon");
}

/// Two prompts of one session in `dir`, run where `ran_in` says: the first
/// a slash command, the second resuming the conversation the first
/// recorded (the fake agent writes its arguments to `argv_file`).
fn slash_command_and_resume(dir: &Path, argv_file: &Path, ran_in: &str) {
    let seen = client(dir, "dev", "twice", &["/review branch=topic"]);
    assert_eq!(seen["stop_reason"], "end_turn");
    assert_eq!(seen["meta"]["npc"]["ranIn"], ran_in, "{seen}");
    assert_eq!(seen["second_meta"]["npc"]["ranIn"], ran_in, "{seen}");
    // The second run continued the Claude conversation the first recorded.
    let args = argv(argv_file);
    assert_eq!(&args[..2], ["--resume", CLAUDE_SESSION], "{args:?}");
    assert!(
        args.iter().any(|a| a == "Review topic carefully"),
        "{args:?}"
    );
}

#[test]
fn cancel_mid_stream_ends_the_prompt_cancelled_and_kills_the_agents_process_group() {
    if !python_sdk() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("agent.pid");
    let repo = repo(&[
        ("FAKE_AGENT_HANG", "1"),
        ("FAKE_AGENT_PID_FILE", &pid_file.display().to_string()),
    ]);
    let seen = client(repo.path(), "dev", "cancel", &["go on forever"]);
    cancelled_after_an_update(&seen);
    // Nothing of the agent is left.
    agent_group_gone(&pid_file);
    let finished = events(repo.path())
        .into_iter()
        .find(|e| e["kind"] == "run.finished")
        .unwrap();
    assert_eq!(finished["payload"]["cancelled"], true);
}

#[test]
fn a_hooks_ask_is_a_permission_request_and_the_editors_answer_decides() {
    if !python_sdk() {
        return;
    }
    let dir = repo(&[]);
    for (answer, status, text) in [
        ("allow", "completed", "ran: ls"),
        ("deny", "failed", "denied in the editor"),
    ] {
        let seen = client(dir.path(), "hooked", "permission", &[answer]);
        let asked = the_editor_decided(&seen, answer, status, text);
        let call = &asked["toolCall"];
        assert_eq!(call["toolCallId"], "toolu_hooked");
        assert_eq!(call["rawInput"], json!({"command": "ls"}));
        assert!(
            call["title"].as_str().unwrap().contains("it runs a shell"),
            "{call}"
        );
        let kinds: Vec<&str> = asked["options"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["kind"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["allow_once", "reject_once"]);
        assert_eq!(seen["stop_reason"], "end_turn");
    }
    // Each answer is on record as the hook call's decision.
    let asks: Vec<String> = events(dir.path())
        .into_iter()
        .filter(|e| e["kind"] == "hook.call" && e["payload"]["decision"] == "ask")
        .map(|e| e["payload"]["detail"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(asks.len(), 2, "{asks:?}");
    assert_eq!(asks[0], "allowed by the user");
    assert!(asks[1].starts_with("denied"), "{asks:?}");
}

#[test]
fn an_ask_without_an_editor_is_denied() {
    // `npc hook run` outside `npc acp`: nobody to ask, so the call is blocked.
    let dir = repo(&[]);
    let out = npc()
        .current_dir(dir.path())
        .args(["hook", "run", "before_tool", "--agent", "claude"])
        .write_stdin(r#"{"tool_name":"Bash","tool_use_id":"t","tool_input":{"command":"ls"}}"#)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nobody can be asked"));
}

#[test]
fn sessions_survive_a_restart_list_load_resume_and_fork() {
    if !python_sdk() {
        return;
    }
    let dir = repo(&[]);
    let first = client(dir.path(), "dev", "prompt", &["list the files"]);
    let id = first["session_id"].as_str().unwrap();
    let argv_file = record_argv(dir.path());
    // A new `npc acp` process.
    let seen = client(dir.path(), "dev", "reload", &[id]);
    let listed = seen["listed"]["sessions"].as_array().unwrap();
    let entry = listed.iter().find(|s| s["sessionId"] == id).unwrap();
    assert_eq!(entry["title"], "list the files");
    assert_eq!(
        PathBuf::from(entry["cwd"].as_str().unwrap()),
        dir.path().to_path_buf()
    );
    let loaded: Vec<&Value> = seen["loaded"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|u| u["sessionId"] == id)
        .map(|u| &u["update"])
        .filter(|u| u["sessionUpdate"] != "available_commands_update")
        .collect();
    assert_eq!(
        kinds(&loaded),
        [
            "user_message_chunk",
            "agent_message_chunk",
            "tool_call",
            "tool_call_update",
            "agent_message_chunk"
        ]
    );
    assert_eq!(loaded[0]["content"]["text"], "list the files");
    assert_eq!(loaded[2]["toolCallId"], "toolu_01");
    // The fork's first prompt branches off the recorded Claude conversation.
    let fork = seen["fork"].as_str().unwrap();
    assert_ne!(fork, id);
    assert_eq!(seen["stop_reason"], "end_turn");
    let args = argv(&argv_file);
    assert_eq!(
        &args[..3],
        ["--resume", CLAUDE_SESSION, "--fork-session"],
        "{args:?}"
    );
}

/// Send `frames` to a raw `npc acp`, then wait for the response to `last_id`
/// and close stdin; every stdout line, parsed.
fn raw_session(dir: &Path, frames: &[Vec<u8>], last_id: i64) -> Vec<Value> {
    let mut child = Command::new(npc_path())
        .args(["acp", "--profile", "dev"])
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let frames = frames.to_vec();
    let writer = std::thread::spawn(move || {
        for f in frames {
            stdin.write_all(&f).unwrap();
            stdin.write_all(b"\n").unwrap();
        }
        stdin
    });
    let mut lines = Vec::new();
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    loop {
        let mut line = String::new();
        assert!(
            reader.read_line(&mut line).unwrap() > 0,
            "stdout ended early"
        );
        let v: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("a stdout line that is not JSON ({e}): {line:?}"));
        assert_eq!(v["jsonrpc"], "2.0", "{v}");
        let done = v["id"] == last_id && v.get("method").is_none();
        lines.push(v);
        if done {
            break;
        }
    }
    drop(writer.join().unwrap());
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut reader, &mut rest).unwrap();
    for line in rest.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["jsonrpc"], "2.0");
        lines.push(v);
    }
    let status = child.wait().unwrap();
    assert!(status.success(), "npc acp exited with {status}");
    lines
}

#[test]
fn stdout_carries_only_json_rpc_frames_and_hostile_frames_get_errors() {
    let dir = repo(&[]);
    let line = |v: Value| v.to_string().into_bytes();
    let mut oversized = vec![b'{'; npcagent::acp::frame::MAX_LINE_BYTES + 10];
    oversized.push(b'}');
    let frames = vec![
        oversized,
        b"this is not json".to_vec(),
        b"[1,2,3]".to_vec(),
        line(json!({"jsonrpc":"2.0","id":1,"method":"no/such/method"})),
        line(
            json!({"jsonrpc":"2.0","id":2,"method":"session/prompt","params":{"sessionId":"acp-missing","prompt":[{"type":"text","text":"x"}]}}),
        ),
        line(json!({"jsonrpc":"2.0","id":3,"method":"session/new","params":{"cwd": 5}})),
        line(json!({"jsonrpc":"2.0","id":4,"method":"initialize","params":{"protocolVersion":1}})),
        line(
            json!({"jsonrpc":"2.0","id":5,"method":"session/new","params":{"cwd": dir.path(), "mcpServers": []}}),
        ),
    ];
    let lines = raw_session(dir.path(), &frames, 5);
    // Frames that are not requests are answered in order, with a null id.
    let unaddressed: Vec<i64> = lines
        .iter()
        .filter(|l| l["id"].is_null() && l.get("error").is_some())
        .map(|l| l["error"]["code"].as_i64().unwrap())
        .collect();
    assert_eq!(unaddressed, [-32600, -32700, -32600], "{lines:#?}");
    // Requests are answered concurrently; each gets its own error.
    let code = |id: i64| {
        lines
            .iter()
            .find(|l| l["id"] == id)
            .unwrap_or_else(|| panic!("no answer to {id}: {lines:#?}"))["error"]["code"]
            .as_i64()
    };
    assert_eq!(code(1), Some(-32601));
    assert_eq!(code(2), Some(-32002));
    assert_eq!(code(3), Some(-32602));
    assert_eq!(code(4), None);
    let session = lines.iter().find(|l| l["id"] == 5).unwrap()["result"]["sessionId"]
        .as_str()
        .unwrap()
        .to_string();
    // The same process still serves a full prompt after the garbage.
    let frames = vec![line(
        json!({"jsonrpc":"2.0","id":9,"method":"session/prompt",
        "params":{"sessionId": session,"prompt":[{"type":"text","text":"list"}]}}),
    )];
    let lines = raw_session(dir.path(), &frames, 9);
    let updates: Vec<&Value> = lines
        .iter()
        .filter(|l| l["method"] == "session/update")
        .collect();
    assert!(updates.len() >= 4, "{lines:#?}");
    let done = lines.iter().find(|l| l["id"] == 9).unwrap();
    assert_eq!(done["result"]["stopReason"], "end_turn", "{done}");
}

/// The daemon's runs as `npc runs --format json` lists them.
fn daemon_runs(daemon: &Daemon) -> Vec<Value> {
    let out = daemon.npc_output(&["runs", "--format", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `GET path` on the daemon's REST API, as JSON.
fn api_get(daemon: &Daemon, path: &str) -> Value {
    use std::io::Read as _;
    let event = daemon.wait_event(0, "api.listening");
    let addr = event["payload"]["url"].as_str().unwrap();
    let addr = addr.strip_prefix("http://").unwrap();
    let token = std::fs::read_to_string(daemon.root().join(".npc/api.token")).unwrap();
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n",
        token.trim()
    )
    .unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    assert!(head.contains(" 200 "), "{head}");
    serde_json::from_str(body).unwrap()
}

#[test]
fn with_a_daemon_up_a_prompt_is_a_run_of_the_daemon_listed_with_source_acp() {
    if !python_sdk() {
        return;
    }
    let dir = daemon_repo(&[]);
    let daemon = Daemon::start_in(dir.path());
    let seen = client(dir.path(), "dev", "prompt", &["list the files"]);
    assert_eq!(seen["meta"]["npc"]["ranIn"], "daemon", "{seen}");
    assert_eq!(seen["stop_reason"], "end_turn");
    let id = seen["session_id"].as_str().unwrap();
    let stream: Vec<&Value> = updates(&seen, id)
        .into_iter()
        .filter(|u| u["sessionUpdate"] != "available_commands_update")
        .collect();
    assert_eq!(
        kinds(&stream),
        [
            "agent_message_chunk",
            "tool_call",
            "tool_call_update",
            "agent_message_chunk"
        ]
    );
    assert_eq!(stream[0]["content"]["text"], "Listing files.");
    assert_eq!(stream[2]["status"], "completed");
    let run_id = seen["meta"]["npc"]["runId"].as_str().unwrap();
    // The daemon's queue carried it out: `npc runs`, the API, `npc events`.
    let runs = daemon_runs(&daemon);
    let run = runs.iter().find(|r| r["id"] == run_id).expect("listed");
    assert_eq!(run["origin"], "acp", "{run}");
    assert_eq!(run["trigger"], "@manual");
    assert_eq!(run["state"], "succeeded");
    let listed = api_get(&daemon, "/api/v1/runs");
    let run = listed["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == run_id)
        .unwrap_or_else(|| panic!("{listed}"));
    assert_eq!(run["source"], "acp", "{run}");
    assert_eq!(run["profile"], "dev");
    let component = format!("run.{run_id}");
    let kinds_of_run: Vec<String> = events(dir.path())
        .into_iter()
        .filter(|e| e["component"] == component.as_str())
        .map(|e| e["kind"].as_str().unwrap().to_string())
        .collect();
    for kind in ["run.queued", "run.started", "agent.message", "run.finished"] {
        assert!(
            kinds_of_run.iter().any(|k| k == kind),
            "{kind} in {kinds_of_run:?}"
        );
    }
}

#[test]
fn with_a_daemon_up_cancel_mid_stream_has_the_daemon_kill_the_agents_group() {
    if !python_sdk() {
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let pid_file = scratch.path().join("agent.pid");
    let dir = daemon_repo(&[
        ("FAKE_AGENT_HANG", "1"),
        ("FAKE_AGENT_PID_FILE", &pid_file.display().to_string()),
    ]);
    let daemon = Daemon::start_in(dir.path());
    let seen = client(dir.path(), "dev", "cancel", &["go on forever"]);
    assert_eq!(seen["meta"]["npc"]["ranIn"], "daemon", "{seen}");
    cancelled_after_an_update(&seen);
    agent_group_gone(&pid_file);
    let run_id = seen["meta"]["npc"]["runId"].as_str().unwrap();
    let runs = daemon_runs(&daemon);
    let run = runs.iter().find(|r| r["id"] == run_id).expect("listed");
    assert_eq!(run["state"], "cancelled", "{run}");
    assert_eq!(run["detail"], "cancelled by hand");
}

#[test]
fn with_a_daemon_up_a_hooks_ask_from_the_daemons_agent_reaches_the_editor() {
    if !python_sdk() {
        return;
    }
    let dir = daemon_repo(&[]);
    let _daemon = Daemon::start_in(dir.path());
    for (answer, status, text) in [
        ("allow", "completed", "ran: ls"),
        ("deny", "failed", "denied in the editor"),
    ] {
        let seen = client(dir.path(), "hooked", "permission", &[answer]);
        assert_eq!(seen["meta"]["npc"]["ranIn"], "daemon", "{seen}");
        let asked = the_editor_decided(&seen, answer, status, text);
        assert_eq!(asked["toolCall"]["toolCallId"], "toolu_hooked");
    }
}

#[test]
fn with_a_daemon_up_an_ask_in_the_daemons_gateway_reaches_the_editor_of_the_agent_behind_it() {
    if !python_sdk() {
        return;
    }
    let dir = daemon_repo(&[]);
    // An agent whose MCP server is npc's gateway: its `npc mcp serve` fronts
    // the daemon, and a hook there asks about `npc_status`.
    let extra = format!(
        r#"
[providers.gatewayed]
kind = "claude_code"
command = {hooked}
env = {{ NPC_BIN = {npc}, HOOKED_AGENT_VIA = "mcp" }}

[profiles.gatewayed]
provider = "gatewayed"
description = "calls npc's tools through the gateway"

[[hooks.before_tool]]
command = "sh"
args = ["-c", "cat >/dev/null; echo '{{\"decision\":\"ask\",\"reason\":\"it reads npc\"}}'"]
matcher = "^npc_status$"
"#,
        hooked = toml_str(
            &repo_root()
                .join("fixtures/acp/hooked-agent.py")
                .display()
                .to_string()
        ),
        npc = toml_str(&npc_path().display().to_string()),
    );
    let manifest = dir.path().join("npcagent.toml");
    let text = std::fs::read_to_string(&manifest).unwrap() + &extra;
    std::fs::write(&manifest, text).unwrap();
    let _daemon = Daemon::start_in(dir.path());
    for (answer, status, text) in [
        ("allow", "completed", "ran: npc_status"),
        ("deny", "failed", "denied in the editor"),
    ] {
        let seen = client(dir.path(), "gatewayed", "permission", &[answer]);
        assert_eq!(seen["meta"]["npc"]["ranIn"], "daemon", "{seen}");
        // The daemon's gateway asked the editor of the agent behind it.
        let asked = the_editor_decided(&seen, answer, status, text);
        assert_eq!(
            asked["toolCall"]["title"]
                .as_str()
                .map(|t| t.contains("it reads npc")),
            Some(true),
            "{asked}"
        );
    }
}

/// One request on the daemon's control socket in `dir`, its one answer line.
fn control(dir: &Path, request: &Value) -> Value {
    let mut stream = std::os::unix::net::UnixStream::connect(dir.join(".npc/daemon.sock")).unwrap();
    let mut request = request.clone();
    request["protocol"] = npcagent::surfaces::control::PROTOCOL_VERSION.into();
    writeln!(stream, "{request}").unwrap();
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap()
}

#[test]
fn the_daemon_takes_only_typed_bounded_extras_for_a_prompt_of_npc_acp() {
    let dir = daemon_repo(&[]);
    let _daemon = Daemon::start_in(dir.path());
    let run = json!({"profile": "dev", "prompt": "hi"});
    let socket = format!("npc-acp-approval-{}", "a".repeat(32));
    let refused = [
        // No way to set other variables or raw arguments.
        json!({"op": "acp_run", "run": {"run": run, "env": {"LD_PRELOAD": "/x.so"}}}),
        json!({"op": "acp_run", "run": {"run": run, "args": ["--dangerously-skip-permissions"]}}),
        json!({"op": "acp_run", "run": {"run": run, "resume": {"session": "--yolo", "fork": false}}}),
        json!({"op": "acp_run", "run": {"run": run, "approval": {"socket": "/tmp/x", "session": "acp-1"}}}),
        json!({"op": "acp_run", "run": {"run": run, "approval": {"socket": socket, "session": "acp-1\nX=1"}}}),
        json!({"op": "acp_run", "run": {"run": run, "cwd": "relative/dir"}}),
        json!({"op": "acp_run", "run": {"run": {"profile": "nope", "prompt": "hi"}}}),
    ];
    for request in refused {
        let answer = control(dir.path(), &request);
        assert!(answer["error"].is_string(), "{request} → {answer}");
    }
    // Nothing was queued.
    let out = npc()
        .current_dir(dir.path())
        .args(["runs", "--format", "json"])
        .output()
        .unwrap();
    let runs: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert!(runs.is_empty(), "{runs:?}");
    // Cancelling a run the daemon does not know is an error, not a crash.
    let answer = control(
        dir.path(),
        &json!({"op": "cancel_run", "id": "run-missing"}),
    );
    assert!(
        answer["error"].as_str().unwrap().contains("no run"),
        "{answer}"
    );
}

/// A repository without hooks whose profiles run `fixtures/acp/hooked-agent.py`
/// under `ask_tools = ["Bash(git push:*)"]`: `push` calls Bash with `git
/// push origin main` (asked), `list` with `ls` (not asked).
fn policy_repo() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let hooked = toml_str(
        &repo_root()
            .join("fixtures/acp/hooked-agent.py")
            .display()
            .to_string(),
    );
    let npc = toml_str(&npc_path().display().to_string());
    let manifest = format!(
        r#"
version = 1

[daemon]
listen = "127.0.0.1:0"

[providers.pusher]
kind = "claude_code"
command = {hooked}
env = {{ NPC_BIN = {npc}, HOOKED_AGENT_COMMAND = "git push origin main" }}

[providers.lister]
kind = "claude_code"
command = {hooked}
env = {{ NPC_BIN = {npc}, HOOKED_AGENT_COMMAND = "ls" }}

[profiles.push]
provider = "pusher"
description = "pushes"
ask_tools = ["Bash(git push:*)"]

[profiles.list]
provider = "lister"
description = "lists"
ask_tools = ["Bash(git push:*)"]
"#
    );
    std::fs::write(dir.path().join("npcagent.toml"), manifest).unwrap();
    dir
}

/// The `push` profile's Bash call is asked about in the editor and each
/// answer decides; the `list` profile's runs unasked. `ran_in` says where
/// the runs ran.
fn ask_tools_ask_the_editor(dir: &Path, ran_in: &str) {
    for (answer, status, text) in [
        ("allow", "completed", "ran: git push origin main"),
        ("deny", "failed", "denied in the editor"),
    ] {
        let seen = client(dir, "push", "permission", &[answer]);
        assert_eq!(seen["meta"]["npc"]["ranIn"], ran_in, "{seen}");
        let asked = the_editor_decided(&seen, answer, status, text);
        let call = &asked["toolCall"];
        assert_eq!(call["rawInput"], json!({"command": "git push origin main"}));
        let title = call["title"].as_str().unwrap();
        assert!(
            title.contains("ask_tools") && title.contains("git push:*"),
            "{title}"
        );
    }
    let seen = client(dir, "list", "permission", &["deny"]);
    assert!(seen["permissions"].as_array().unwrap().is_empty(), "{seen}");
    let result = tool_result(&seen);
    assert_eq!(result["status"], "completed", "{result}");
    // Each answer is on record as the policy's decision.
    let asks: Vec<Value> = events(dir)
        .into_iter()
        .filter(|e| e["kind"] == "hook.call" && e["payload"]["decision"] == "ask")
        .map(|e| e["payload"].clone())
        .collect();
    assert_eq!(asks.len(), 2, "{asks:?}");
    assert_eq!(asks[0]["hook"], "profile `push` ask_tools");
    assert_eq!(asks[0]["pattern"], "Bash(git push:*)");
    assert_eq!(asks[0]["detail"], "allowed by the user");
    assert!(
        asks[1]["detail"].as_str().unwrap().starts_with("denied"),
        "{asks:?}"
    );
}

#[test]
fn a_profiles_ask_tools_is_a_permission_request_and_the_editors_answer_decides() {
    if !python_sdk() {
        return;
    }
    let dir = policy_repo();
    ask_tools_ask_the_editor(dir.path(), "acp");
}

#[test]
fn with_a_daemon_up_a_profiles_ask_tools_reaches_the_editor_from_the_daemons_agent() {
    if !python_sdk() {
        return;
    }
    let dir = policy_repo();
    let _daemon = Daemon::start_in(dir.path());
    ask_tools_ask_the_editor(dir.path(), "daemon");
}

#[test]
fn ask_tools_without_an_editor_deny_the_calls_they_match_and_only_those() {
    let dir = policy_repo();
    let hook = |profile: Option<&str>, command: &str| {
        let mut cmd = npc();
        cmd.current_dir(dir.path())
            .env_remove("NPC_PROFILE")
            .env_remove("NPC_ACP_APPROVAL_SOCKET")
            .args(["hook", "run", "before_tool", "--agent", "claude"])
            .write_stdin(
                json!({"tool_name": "Bash", "tool_use_id": "t", "tool_input": {"command": command}})
                    .to_string(),
            );
        if let Some(p) = profile {
            cmd.env("NPC_PROFILE", p);
        }
        cmd.output().unwrap()
    };
    let denied = hook(Some("push"), "git push origin main");
    assert_eq!(denied.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&denied.stderr);
    assert!(
        stderr.contains("nobody can be asked") && stderr.contains("ask_tools"),
        "{stderr}"
    );
    // Other commands, and an agent no profile run started, pass.
    assert_eq!(hook(Some("push"), "git status").status.code(), Some(0));
    assert_eq!(hook(None, "git push origin main").status.code(), Some(0));
    assert_eq!(
        hook(Some("no-such-profile"), "git push").status.code(),
        Some(0)
    );
}

#[test]
fn a_malformed_ask_tools_pattern_is_a_manifest_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("npcagent.toml"),
        "version = 1\n[providers.p]\nkind = \"claude_code\"\n[profiles.dev]\nprovider = \"p\"\ndescription = \"d\"\nask_tools = [\"Bash(git push\"]\n",
    )
    .unwrap();
    let out = npc()
        .current_dir(dir.path())
        .args(["validate"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("ask_tools"), "{text}");
}

#[test]
fn with_a_daemon_up_sigterm_to_npc_acp_has_the_daemon_cancel_the_running_prompt() {
    let scratch = tempfile::tempdir().unwrap();
    let pid_file = scratch.path().join("agent.pid");
    let dir = daemon_repo(&[
        ("FAKE_AGENT_HANG", "1"),
        ("FAKE_AGENT_PID_FILE", &pid_file.display().to_string()),
    ]);
    let daemon = Daemon::start_in(dir.path());
    let mut acp = Command::new(npc_path())
        .args(["acp", "--profile", "dev"])
        .current_dir(dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = acp.stdin.take().unwrap();
    let mut stdout = BufReader::new(acp.stdout.take().unwrap());
    // The answer to `frame`; `None` once npc acp closed its stdout.
    let mut answer = move |frame: Value| -> Option<Value> {
        writeln!(stdin, "{frame}").ok()?;
        let id = frame["id"].clone();
        loop {
            let mut line = String::new();
            if stdout.read_line(&mut line).ok()? == 0 {
                return None;
            }
            let v: Value = serde_json::from_str(&line).unwrap();
            if v["id"] == id && v.get("method").is_none() {
                return Some(v);
            }
        }
    };
    answer(json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}))
        .unwrap();
    let session = answer(
        json!({"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd": dir.path(), "mcpServers": []}}),
    )
    .unwrap()["result"]["sessionId"]
        .clone();
    // The prompt is not answered until the run ends; send it and let it run.
    let prompt = json!({"jsonrpc":"2.0","id":3,"method":"session/prompt",
        "params":{"sessionId": session,"prompt":[{"type":"text","text":"go on forever"}]}});
    std::thread::spawn(move || answer(prompt));
    let pid: i32 = wait_for("the daemon's agent to start", || {
        std::fs::read_to_string(&pid_file).ok()?.trim().parse().ok()
    });
    let run = wait_for("the daemon's run", || {
        daemon_runs(&daemon)
            .into_iter()
            .find(|r| r["origin"] == "acp" && r["state"] == "running")
    });
    kill(
        Pid::from_raw(acp.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = wait_for("npc acp to exit", || acp.try_wait().unwrap());
    assert!(status.success(), "{status}");
    wait_for("the agent to be gone", || {
        (!crate::support::alive(pid as u32)).then_some(())
    });
    let state = wait_for("the run to end", || {
        daemon_runs(&daemon)
            .into_iter()
            .find(|r| r["id"] == run["id"] && r["state"] != "running")
    });
    assert_eq!(state["state"], "cancelled", "{state}");
}
