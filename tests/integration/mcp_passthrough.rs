//! What crosses the gateway besides calls, through the real binary: the
//! Python `mcp` SDK as the client (`fixtures/mcp/passthrough.py`, which
//! answers sampling, elicitation and roots and records progress, log
//! messages and resource updates) in front of server-everything, with the
//! same steps run directly against the server and through `npc mcp serve`
//! (stdio and `--http`, standalone and in front of a daemon); and in front of
//! `fixtures/mcp/passthrough_server.py`, a server that asks for what the
//! client lacks, answers ids it was never sent, floods progress and
//! `list_changed`, and sends an oversized elicitation.

use std::time::Duration;

use serde_json::{Value, json};
use tempfile::TempDir;

use crate::mcp::{
    events_of_kind, gateway_token, python_sdk, repo, server_everything, sigterm_exits_0,
    spawn_http_gateway, spawn_http_gateway_in,
};
use crate::support::{Daemon, npc_path, repo_root};

/// Longest one client run may take in these tests.
const CLIENT_LIMIT: Duration = Duration::from_secs(90);
/// `mcp::passthrough::MAX_ELICITATION_SCHEMA_BYTES`.
const MAX_ELICITATION_SCHEMA_BYTES: usize = 64 * 1024;
/// `mcp::call::MAX_PASSED_ERROR_MESSAGE_BYTES`.
const MAX_PASSED_ERROR_MESSAGE_BYTES: usize = 4096;

/// Where the client connects.
enum Target<'a> {
    /// Runs this command itself (the server, directly).
    Command(&'a [&'a str]),
    /// `npc mcp serve` on stdio in this repository.
    Gateway(&'a std::path::Path),
    /// A streamable HTTP URL, with the gateway's token.
    Http { url: &'a str, token: String },
}

/// Run `steps` with the passthrough client declaring `caps` (all when
/// `None`); one JSON value per step.
fn run(target: Target<'_>, caps: Option<&str>, steps: &Value) -> Vec<Value> {
    let mut cmd = assert_cmd::Command::new("python3");
    cmd.arg(repo_root().join("fixtures/mcp/passthrough.py"))
        .arg(steps.to_string())
        .timeout(CLIENT_LIMIT);
    if let Some(caps) = caps {
        cmd.args(["--caps", caps]);
    }
    match target {
        Target::Command(command) => {
            cmd.arg("--").args(command);
        }
        Target::Gateway(root) => {
            cmd.args(["--", &npc_path().display().to_string(), "mcp", "serve"])
                .current_dir(root);
        }
        Target::Http { url, token } => {
            cmd.args(["--http", url]).env("MCP_BEARER", token);
        }
    }
    let out = cmd.output().unwrap();
    crate::mcp::client_answers(&out)
}

fn everything_repo() -> TempDir {
    repo(
        "version = 1\n[mcp]\nprefix = \"on_conflict\"\n[mcp.servers.everything]\ncommand = \"mcp-server-everything\"\n",
    )
}

fn fixture() -> String {
    repo_root()
        .join("fixtures/mcp/passthrough_server.py")
        .display()
        .to_string()
}

fn hostile_repo() -> TempDir {
    repo(&format!(
        "version = 1\n[mcp]\nprefix = \"on_conflict\"\n[mcp.servers.hostile]\ncommand = \"python3\"\nargs = [{:?}]\n",
        fixture()
    ))
}

/// The steps that make server-everything ask back: sampling, roots, a form
/// elicitation, a URL elicitation, and progress.
fn asking_steps() -> Value {
    json!([
        ["call", "trigger-sampling-request", {"prompt": "hi", "maxTokens": 5}],
        ["call", "get-roots-list", {}],
        ["call", "trigger-elicitation-request", {}],
        ["call", "trigger-url-elicitation", {"url": "https://example.com/consent", "elicitationId": "e-1"}],
        ["call", "trigger-long-running-operation", {"duration": 0.3, "steps": 3}],
        ["asked"]
    ])
}

/// `text` of a call step, as JSON.
fn text_json(step: &Value) -> Value {
    serde_json::from_str(step["text"].as_str().unwrap()).unwrap()
}

#[test]
fn every_tool_of_server_everything_is_there_behind_the_gateway() {
    if !python_sdk() || !server_everything() {
        return;
    }
    let dir = everything_repo();
    let steps = json!([["tools"]]);
    let direct = run(Target::Command(&["mcp-server-everything"]), None, &steps);
    let through = run(Target::Gateway(dir.path()), None, &steps);
    let listed: Vec<&Value> = through[0]["tools"].as_array().unwrap().iter().collect();
    let direct = direct[0]["tools"].as_array().unwrap();
    // Those it offers only to clients that sample, elicit or list roots too.
    for conditional in [
        "trigger-sampling-request",
        "trigger-elicitation-request",
        "trigger-url-elicitation",
        "get-roots-list",
    ] {
        assert!(direct.contains(&json!(conditional)), "{direct:?}");
    }
    for tool in direct {
        assert!(listed.contains(&tool), "{tool} is missing behind npc");
    }
}

#[test]
fn server_requests_and_progress_behave_the_same_directly_and_through_the_gateway() {
    if !python_sdk() || !server_everything() {
        return;
    }
    let dir = everything_repo();
    let steps = asking_steps();
    let direct = run(Target::Command(&["mcp-server-everything"]), None, &steps);
    assert_eq!(
        direct[5],
        json!({"sampling": 1, "elicitation": ["form", "url"], "roots": 1})
    );
    assert_eq!(
        direct[4]["progress"],
        json!([[1.0, 3.0], [2.0, 3.0], [3.0, 3.0]])
    );
    let stdio = run(Target::Gateway(dir.path()), None, &steps);
    assert_eq!(stdio, direct, "stdio");
    let (gateway, url) = spawn_http_gateway(&dir);
    let token = gateway_token(dir.path());
    let http = run(Target::Http { url: &url, token }, None, &steps);
    assert_eq!(http, direct, "http");
    sigterm_exits_0(gateway);
    // Each sampling and elicitation request is recorded: what was asked,
    // never what was answered.
    let requests = events_of_kind(&dir, "mcp.request");
    let methods: Vec<&str> = requests
        .iter()
        .map(|e| e["payload"]["method"].as_str().unwrap())
        .collect();
    assert_eq!(
        methods
            .iter()
            .filter(|m| **m == "sampling/createMessage")
            .count(),
        2,
        "{requests:?}"
    );
    assert_eq!(
        methods
            .iter()
            .filter(|m| **m == "elicitation/create")
            .count(),
        4,
        "{requests:?}"
    );
    for e in &requests {
        assert_eq!(e["payload"]["server"], "everything");
        assert_eq!(e["payload"]["outcome"], "ok", "{e}");
        assert!(
            !e.to_string().contains("Ada"),
            "an answer was recorded: {e}"
        );
    }
}

/// A call's observation with the server's random `elicitationId`s blanked,
/// so two runs compare.
fn without_elicitation_ids(mut step: Value) -> Value {
    if let Some(elicitations) = step["data"]["elicitations"].as_array_mut() {
        for e in elicitations {
            if e.get("elicitationId").is_some_and(Value::is_string) {
                e["elicitationId"] = json!("<id>");
            }
        }
    }
    step
}

#[test]
fn a_url_elicitation_required_error_reaches_the_client_as_that_error_and_is_recorded() {
    if !python_sdk() || !server_everything() {
        return;
    }
    let dir = everything_repo();
    // `errorPath`: server-everything answers `-32042` with the URL to open
    // in `data.elicitations` instead of asking.
    let steps = json!([
        ["call", "trigger-url-elicitation", {"url": "https://example.com/consent", "errorPath": true}],
        ["asked"]
    ]);
    let observe =
        |got: Vec<Value>| -> Vec<Value> { got.into_iter().map(without_elicitation_ids).collect() };
    let direct = observe(run(
        Target::Command(&["mcp-server-everything"]),
        None,
        &steps,
    ));
    assert_eq!(direct[0]["code"], -32042, "{direct:?}");
    assert_eq!(
        direct[0]["data"]["elicitations"][0]["url"], "https://modelcontextprotocol.io",
        "{direct:?}"
    );
    let stdio = observe(run(Target::Gateway(dir.path()), None, &steps));
    assert_eq!(stdio, direct, "stdio");
    let (gateway, url) = spawn_http_gateway(&dir);
    let token = gateway_token(dir.path());
    let http = observe(run(Target::Http { url: &url, token }, None, &steps));
    sigterm_exits_0(gateway);
    assert_eq!(http, direct, "http");
    // Recorded with the server's code, once per transport.
    let calls = events_of_kind(&dir, "mcp.tool_call");
    let refused: Vec<&Value> = calls
        .iter()
        .filter(|e| e["payload"]["name"] == "trigger-url-elicitation")
        .collect();
    assert_eq!(refused.len(), 2, "{calls:?}");
    for e in refused {
        assert_eq!(e["payload"]["outcome"], "protocol_error", "{e}");
        assert_eq!(e["payload"]["error_code"], -32042, "{e}");
    }
}

#[test]
fn an_oversized_upstream_error_passes_with_its_code_its_message_cut_and_its_data_left_out() {
    if !python_sdk() {
        return;
    }
    let dir = hostile_repo();
    let steps = json!([
        ["call", "refuse", {"message_bytes": 10, "data_bytes": 10}],
        ["call", "refuse", {"message_bytes": 100_000, "data_bytes": 200_000}],
        ["call", "lists", {}]
    ]);
    let got = run(Target::Gateway(dir.path()), None, &steps);
    // Small: passed as it came.
    assert_eq!(got[0]["code"], -32042, "{got:?}");
    assert_eq!(got[0]["data"], json!({"blob": "dddddddddd"}));
    // Large: the code kept, the message cut at the bound, the data dropped.
    assert_eq!(got[1]["code"], -32042, "{:?}", got[1]["code"]);
    assert_eq!(got[1]["data"], Value::Null);
    let message = got[1]["error"].as_str().unwrap();
    assert!(
        message.len() <= MAX_PASSED_ERROR_MESSAGE_BYTES,
        "{}",
        message.len()
    );
    assert!(message.starts_with("mmm"));
    // The session is fine: an error answer is no transport failure.
    assert!(got[2].get("text").is_some(), "{got:?}");
    let calls = events_of_kind(&dir, "mcp.tool_call");
    let refused = calls
        .iter()
        .filter(|e| e["payload"]["name"] == "refuse")
        .count();
    assert_eq!(refused, 2, "{calls:?}");
}

#[test]
fn changed_roots_reach_the_server_through_the_gateway_as_directly() {
    if !python_sdk() || !server_everything() {
        return;
    }
    let dir = everything_repo();
    // server-everything asks `roots/list` during the first call, then again
    // on each `notifications/roots/list_changed`, outside any call.
    let changed = "file:///tmp/passthrough-changed-root";
    let steps = json!([
        ["call", "get-roots-list", {}],
        ["set_roots", [changed]],
        ["call_until", "get-roots-list", {}, changed],
        ["asked"]
    ]);
    let direct = run(Target::Command(&["mcp-server-everything"]), None, &steps);
    assert!(
        direct[2]["text"].as_str().unwrap().contains(changed),
        "{direct:?}"
    );
    assert_eq!(direct[3]["roots"], 2, "{direct:?}");
    let stdio = run(Target::Gateway(dir.path()), None, &steps);
    assert_eq!(stdio, direct, "stdio");
    let (gateway, url) = spawn_http_gateway(&dir);
    let token = gateway_token(dir.path());
    let http = run(Target::Http { url: &url, token }, None, &steps);
    sigterm_exits_0(gateway);
    assert_eq!(http, direct, "http");
}

#[test]
fn sessions_sharing_a_server_give_it_the_union_of_their_roots() {
    if !python_sdk() || !server_everything() {
        return;
    }
    let dir = everything_repo();
    let (gateway, url) = spawn_http_gateway(&dir);
    let (changed, beside) = (
        "file:///tmp/passthrough-changed-root",
        "file:///tmp/passthrough-beside-root",
    );
    // The other session's stream for requests outside a call may open
    // after the first change is announced (the SDK opens it in the
    // background): announce again until the server has heard from both.
    let steps = json!([
        ["call", "get-roots-list", {}],
        ["set_roots", [changed]],
        ["call_until", "get-roots-list", {}, changed],
        ["renotify_until", "get-roots-list", {}, beside],
        ["asked"]
    ]);
    // A second session of the same gateway stays open all along.
    let out = assert_cmd::Command::new("python3")
        .arg(repo_root().join("fixtures/mcp/passthrough.py"))
        .arg(steps.to_string())
        .args(["--beside", beside, "--http", &url])
        .env("MCP_BEARER", gateway_token(dir.path()))
        .timeout(CLIENT_LIMIT)
        .output()
        .unwrap();
    let got = crate::mcp::client_answers(&out);
    sigterm_exits_0(gateway);
    // During its call, the server asked the caller alone.
    let first = got[0]["text"].as_str().unwrap();
    assert!(
        first.contains("passthrough-root") && !first.contains(beside),
        "{first}"
    );
    // Outside any call, every session's roots: the caller's and the other's.
    let after = got[3]["text"].as_str().unwrap();
    assert!(after.contains(changed) && after.contains(beside), "{after}");
    assert!(after.contains("(2 total)"), "{after}");
}

#[test]
fn log_messages_and_resource_updates_reach_the_session_that_asked_for_them() {
    if !python_sdk() || !server_everything() {
        return;
    }
    let dir = everything_repo();
    let uri = "npc://everything/demo://resource/static/document/architecture.md";
    let steps = json!([
        ["set_level", "debug"],
        ["call", "toggle-simulated-logging", {}],
        ["wait_log"],
        ["subscribe", uri],
        ["call", "toggle-subscriber-updates", {}],
        ["wait_updated"]
    ]);
    let got = run(Target::Gateway(dir.path()), None, &steps);
    assert_eq!(got[0], json!({"set_level": "debug"}));
    // The server's name is the logger.
    assert_eq!(got[2]["log"]["logger"], "everything", "{got:?}");
    assert_eq!(got[3], json!({"subscribed": uri}));
    assert_eq!(got[5], json!({"updated": uri}));
}

#[test]
fn a_cancelled_call_stops_at_the_upstream() {
    if !python_sdk() {
        return;
    }
    let dir = hostile_repo();
    let got = run(Target::Gateway(dir.path()), None, &cancel_steps());
    cancelled_at_the_upstream(&dir, &got);
}

/// The steps that cancel the hostile server's `slow` and then ask it what
/// it heard.
fn cancel_steps() -> Value {
    json!([["cancel", "slow", {}, 0.5], ["call", "cancelled", {}]])
}

/// After [`cancel_steps`]: the client gave up, the upstream heard of it
/// under the id npc gave the call, and the call is recorded as cancelled.
fn cancelled_at_the_upstream(dir: &TempDir, got: &[Value]) {
    assert_eq!(got[0], json!({"cancelled": true}));
    let cancelled = text_json(&got[1]);
    let ids = cancelled.as_array().unwrap();
    assert_eq!(ids.len(), 1, "{cancelled}");
    assert!(ids[0].as_str().unwrap().starts_with("npc-"), "{cancelled}");
    let calls = events_of_kind(dir, "mcp.tool_call");
    let slow = calls.iter().find(|e| e["payload"]["name"] == "slow");
    assert_eq!(
        slow.unwrap()["payload"]["outcome"],
        "cancelled",
        "{calls:?}"
    );
}

#[test]
fn requests_a_client_cannot_answer_get_the_specs_error_at_once() {
    if !python_sdk() {
        return;
    }
    let dir = hostile_repo();
    let steps = json!([
        ["call", "sample", {}],
        ["call", "sample_later", {}],
        ["call", "stray", {}],
        ["call", "big_elicit", {"bytes": MAX_ELICITATION_SCHEMA_BYTES + 1024}],
        ["call", "big_elicit", {"bytes": 1000}],
        ["call", "later", {}],
        ["asked"]
    ]);
    // A client that elicits but does not sample.
    let got = run(Target::Gateway(dir.path()), Some("elicitation"), &steps);
    // Sampling for a client without it: -32601, as that client answers.
    assert_eq!(text_json(&got[0])["error"]["code"], -32601, "{got:?}");
    // Answers to ids never sent are dropped; the gateway still serves.
    assert_eq!(got[2]["text"], "strayed");
    // An elicitation over the schema bound: -32602, and a counted drop.
    let big = text_json(&got[3]);
    assert_eq!(big["error"]["code"], -32602, "{big}");
    assert!(
        big["error"]["message"].as_str().unwrap().contains("bound"),
        "{big}"
    );
    assert_eq!(text_json(&got[4])["action"], "accept");
    // Sampling with no call in flight (the session that caused it is done):
    // -32601 at once, never a hang.
    assert_eq!(text_json(&got[5])["error"]["code"], -32601, "{got:?}");
    assert_eq!(
        got[6],
        json!({"sampling": 0, "elicitation": ["form"], "roots": 0})
    );
    let dropped = events_of_kind(&dir, "mcp.dropped");
    assert!(
        dropped
            .iter()
            .any(|e| e["payload"]["what"] == "elicitation_schema"),
        "{dropped:?}"
    );
    let requests = events_of_kind(&dir, "mcp.request");
    let mut outcomes: Vec<&str> = requests
        .iter()
        .map(|e| e["payload"]["outcome"].as_str().unwrap())
        .collect();
    outcomes.sort_unstable();
    assert_eq!(outcomes, ["error", "error", "error", "ok"], "{requests:?}");
}

#[test]
fn a_progress_flood_costs_a_bounded_queue_and_every_drop_is_counted() {
    if !python_sdk() {
        return;
    }
    let dir = hostile_repo();
    let sent = 20_000;
    let got = run(
        Target::Gateway(dir.path()),
        None,
        &json!([["call", "storm", {"n": sent}], ["call", "lists", {}]]),
    );
    assert_eq!(got[0]["text"], "stormed");
    let delivered = got[0]["progress"].as_array().unwrap().len() as u64;
    let dropped: u64 = events_of_kind(&dir, "mcp.dropped")
        .iter()
        .filter(|e| e["payload"]["what"] == "notifications")
        .map(|e| e["payload"]["count"].as_u64().unwrap())
        .sum();
    assert_eq!(
        delivered + dropped,
        sent,
        "delivered {delivered}, dropped {dropped}"
    );
    // What arrived arrived in order.
    let progress: Vec<f64> = got[0]["progress"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p[0].as_f64().unwrap())
        .collect();
    assert!(progress.windows(2).all(|w| w[0] < w[1]));
}

#[test]
fn a_list_changed_every_millisecond_is_debounced() {
    if !python_sdk() {
        return;
    }
    let dir = hostile_repo();
    let storm = 200;
    let got = run(
        Target::Gateway(dir.path()),
        None,
        &json!([["call", "list_storm", {"n": storm}], ["call", "lists", {}], ["tools"]]),
    );
    assert_eq!(got[0]["text"], "changed");
    let lists: u64 = got[1]["text"].as_str().unwrap().parse().unwrap();
    // The handshake's, then at most one per debounce window.
    assert!(
        lists >= 1 && lists < storm / 10,
        "{lists} lists for {storm} changes"
    );
    assert!(
        got[2]["tools"]
            .as_array()
            .unwrap()
            .contains(&json!("storm"))
    );
}

#[test]
fn in_front_of_the_daemon_server_requests_progress_and_cancellation_pass_too() {
    if !python_sdk() || !server_everything() {
        return;
    }
    let manifest = format!(
        "version = 1\n[mcp]\nprefix = \"on_conflict\"\n[mcp.servers.everything]\ncommand = \"mcp-server-everything\"\n[mcp.servers.hostile]\ncommand = \"python3\"\nargs = [{:?}]\n",
        fixture()
    );
    let d = Daemon::start(&manifest);
    let direct = run(
        Target::Command(&["mcp-server-everything"]),
        None,
        &asking_steps(),
    );
    let through = run(Target::Gateway(d.root()), None, &asking_steps());
    assert_eq!(through, direct, "stdio");
    let (gateway, url) = spawn_http_gateway_in(d.root(), &[]);
    let token = gateway_token(d.root());
    let http = run(Target::Http { url: &url, token }, None, &asking_steps());
    // The daemon's server-everything is one session for every client, and
    // it keeps the roots the first session gave it: this one is not asked.
    assert_eq!(http[..5], direct[..5], "http");
    assert_eq!(
        http[5],
        json!({"sampling": 1, "elicitation": ["form", "url"], "roots": 0})
    );
    sigterm_exits_0(gateway);
    let got = run(Target::Gateway(d.root()), None, &cancel_steps());
    assert_eq!(text_json(&got[1]).as_array().unwrap().len(), 1, "{got:?}");
}

#[test]
fn one_sessions_flood_leaves_another_session_of_the_daemon_unaffected() {
    if !python_sdk() {
        return;
    }
    let server = |name: &str| {
        format!(
            "[mcp.servers.{name}]\ncommand = \"python3\"\nargs = [{:?}]\n",
            fixture()
        )
    };
    let d = Daemon::start(&format!(
        "version = 1\n[mcp]\nprefix = \"on_conflict\"\n{}{}",
        server("flooded"),
        server("quiet")
    ));
    let root = d.root().to_path_buf();
    let flood = std::thread::spawn(move || {
        run(
            Target::Gateway(&root),
            None,
            &json!([["call", "flooded__storm", {"n": 50_000}]]),
        )
    });
    // Both names clash, so both servers' tools are prefixed.
    let got = run(
        Target::Gateway(d.root()),
        None,
        &json!([
            ["call", "quiet__sample", {}],
            ["call", "quiet__stray", {}],
            ["call", "quiet__sample", {}]
        ]),
    );
    for sampled in [&got[0], &got[2]] {
        assert_eq!(
            text_json(sampled)["content"]["text"],
            "sampled: hello",
            "{got:?}"
        );
    }
    assert_eq!(got[1]["text"], "strayed");
    let flooded = flood.join().unwrap();
    assert_eq!(flooded[0]["text"], "stormed");
}

#[test]
fn an_http_upstreams_calls_pass_server_requests_and_progress_like_rmcps() {
    if !python_sdk() || !server_everything() {
        return;
    }
    // The pool's calls to an HTTP upstream are its own posts on rmcp's
    // session (`mcp::client::pool::http_wire`): what the upstream sends on a call's
    // stream must still reach the client that called, as directly.
    let (_server, port) = crate::mcp::everything_listening("streamableHttp");
    let upstream = format!("http://127.0.0.1:{port}/mcp");
    let dir = repo(&format!(
        "version = 1\n[mcp]\nprefix = \"on_conflict\"\n[mcp.servers.everything]\nurl = \"{upstream}\"\n"
    ));
    let steps = asking_steps();
    let direct = run(
        Target::Http {
            url: &upstream,
            token: String::new(),
        },
        None,
        &steps,
    );
    assert_eq!(
        direct[5],
        json!({"sampling": 1, "elicitation": ["form", "url"], "roots": 1})
    );
    let through = run(Target::Gateway(dir.path()), None, &steps);
    assert_eq!(through, direct);
    // A client that can answer nothing, over the HTTP gateway, where its
    // calls are answered by the gateway's shortcut (`mcp::shortcut`):
    // progress on the call's own stream, and the spec's error for sampling.
    let (gateway, url) = spawn_http_gateway(&dir);
    let token = gateway_token(dir.path());
    let plain = run(
        Target::Http { url: &url, token },
        Some(""),
        &json!([
            ["call", "echo", {"message": "lean"}],
            ["call", "trigger-long-running-operation", {"duration": 0.3, "steps": 3}],
            ["asked"]
        ]),
    );
    sigterm_exits_0(gateway);
    assert_eq!(plain[0]["text"], "Echo: lean", "{plain:?}");
    assert_eq!(
        plain[1]["progress"],
        json!([[1.0, 3.0], [2.0, 3.0], [3.0, 3.0]]),
        "{plain:?}"
    );
    assert_eq!(
        plain[2],
        json!({"sampling": 0, "elicitation": [], "roots": 0})
    );
    let calls = events_of_kind(&dir, "mcp.tool_call");
    assert!(
        calls
            .iter()
            .any(|e| e["payload"]["name"] == "echo" && e["payload"]["outcome"] == "ok"),
        "{calls:?}"
    );
}

#[test]
fn over_http_a_plain_clients_cancel_stops_the_call_at_the_upstream() {
    if !python_sdk() {
        return;
    }
    let dir = hostile_repo();
    let (gateway, url) = spawn_http_gateway(&dir);
    let token = gateway_token(dir.path());
    let got = run(Target::Http { url: &url, token }, Some(""), &cancel_steps());
    sigterm_exits_0(gateway);
    cancelled_at_the_upstream(&dir, &got);
}

/// One HTTP/1.1 response: status, headers (lowercase names), body.
struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A connection to the gateway at `addr` whose reads give up after
/// [`CLIENT_LIMIT`] (a stalled gateway fails the test, never hangs it).
fn connect(addr: &str) -> std::net::TcpStream {
    let stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(CLIENT_LIMIT)).unwrap();
    stream
}

/// POST `body` on `stream` (kept open for the next request) with the
/// gateway's `token` and `session`; the whole response, chunked or not.
fn post(
    stream: &mut std::net::TcpStream,
    token: &str,
    session: Option<&str>,
    body: &Value,
) -> Response {
    use std::io::{BufRead, Read, Write};
    let body = body.to_string();
    let mut request = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some(session) = session {
        request.push_str(&format!(
            "Mcp-Session-Id: {session}\r\nMcp-Protocol-Version: 2025-11-25\r\n"
        ));
    }
    request.push_str("\r\n");
    request.push_str(&body);
    stream.write_all(request.as_bytes()).unwrap();
    let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    let status = line.split(' ').nth(1).unwrap().parse().unwrap();
    let mut headers = Vec::new();
    loop {
        line.clear();
        reader.read_line(&mut line).unwrap();
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        let (name, value) = header.split_once(':').unwrap();
        headers.push((name.to_ascii_lowercase(), value.trim().to_string()));
    }
    let mut response = Response {
        status,
        headers,
        body: Vec::new(),
    };
    if let Some(length) = response.header("content-length") {
        let mut body = vec![0; length.parse().unwrap()];
        reader.read_exact(&mut body).unwrap();
        response.body = body;
    } else if response.header("transfer-encoding") == Some("chunked") {
        loop {
            line.clear();
            reader.read_line(&mut line).unwrap();
            let size = usize::from_str_radix(line.trim_end(), 16).unwrap();
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk).unwrap();
            if size == 0 {
                break;
            }
            response.body.extend_from_slice(&chunk[..size]);
        }
    }
    response
}

/// The JSON-RPC messages of an event stream's body.
fn events_in(body: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(body)
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| !d.is_empty())
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

/// A session of the HTTP gateway at `addr`, initialized declaring
/// `capabilities`: its id.
fn http_session(addr: &str, token: &str, capabilities: Value) -> String {
    let mut stream = connect(addr);
    let init = post(
        &mut stream,
        token,
        None,
        &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": capabilities,
            "clientInfo": {"name": "raw", "version": "1"}}}),
    );
    assert_eq!(init.status, 200);
    let session = init.header("mcp-session-id").unwrap().to_string();
    let initialized = post(
        &mut stream,
        token,
        Some(&session),
        &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );
    assert_eq!(initialized.status, 202);
    session
}

#[test]
fn over_http_a_call_is_one_json_body_on_a_kept_connection_and_progress_an_event_stream() {
    if !server_everything() {
        return;
    }
    let dir = everything_repo();
    let (gateway, url) = spawn_http_gateway(&dir);
    let token = gateway_token(dir.path());
    let addr = url
        .strip_prefix("http://")
        .and_then(|u| u.strip_suffix("/mcp"))
        .unwrap()
        .to_string();
    let session = http_session(&addr, &token, json!({}));
    let call = |id: u64, name: &str, arguments: Value, meta: Option<Value>| {
        let mut params = json!({"name": name, "arguments": arguments});
        if let Some(meta) = meta {
            params["_meta"] = meta;
        }
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
    };
    // Two calls on one connection: each answered as one JSON body, and the
    // connection still there for the next.
    let mut stream = connect(&addr);
    for id in [1, 2] {
        let message = format!("kept {id}");
        let answer = post(
            &mut stream,
            &token,
            Some(&session),
            &call(id, "echo", json!({"message": message}), None),
        );
        assert_eq!(answer.status, 200);
        assert_eq!(answer.header("content-type"), Some("application/json"));
        let answer: Value = serde_json::from_slice(&answer.body).unwrap();
        assert_eq!(answer["id"], id);
        assert_eq!(
            answer["result"]["content"][0]["text"],
            format!("Echo: {message}")
        );
    }
    // Progress asked and sent: an event stream, the progress in order under
    // the client's token, then the answer.
    let long = post(
        &mut stream,
        &token,
        Some(&session),
        &call(
            3,
            "trigger-long-running-operation",
            json!({"duration": 0.2, "steps": 2}),
            Some(json!({"progressToken": "p-3"})),
        ),
    );
    assert_eq!(long.header("content-type"), Some("text/event-stream"));
    let messages = events_in(&long.body);
    assert_eq!(messages.len(), 3, "{messages:?}");
    for (message, step) in messages.iter().zip([1.0, 2.0]) {
        assert_eq!(message["method"], "notifications/progress");
        assert_eq!(message["params"]["progressToken"], "p-3");
        assert_eq!(message["params"]["progress"], step);
    }
    assert_eq!(messages[2]["id"], 3);
    // Progress asked, none sent: still one JSON body.
    let quick = post(
        &mut stream,
        &token,
        Some(&session),
        &call(
            4,
            "echo",
            json!({"message": "quick"}),
            Some(json!({"progressToken": 4})),
        ),
    );
    assert_eq!(quick.header("content-type"), Some("application/json"));
    // A client that can sample is served by rmcp's session (an event
    // stream), where an upstream's request can reach it and come back.
    let capable = http_session(&addr, &token, json!({"sampling": {}}));
    let answer = post(
        &mut stream,
        &token,
        Some(&capable),
        &call(5, "echo", json!({"message": "rmcp"}), None),
    );
    assert_eq!(answer.header("content-type"), Some("text/event-stream"));
    let messages = events_in(&answer.body);
    assert_eq!(
        messages.last().unwrap()["result"]["content"][0]["text"],
        "Echo: rmcp"
    );
    // An unknown session is rmcp's to refuse.
    let unknown = post(
        &mut stream,
        &token,
        Some("no-such-session"),
        &call(6, "echo", json!({"message": "x"}), None),
    );
    assert_eq!(unknown.status, 404);
    sigterm_exits_0(gateway);
}
