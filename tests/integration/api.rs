//! The REST API end to end: a real `npc daemon` listening on loopback,
//! spoken to over real TCP with hand-written HTTP/1.1 (so a test can send
//! any `Host`), and its event stream resumed across reconnects.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::Value;

use crate::support::{Daemon, DaemonSetup, npc, repo_root};

const LISTEN_ANY_PORT: &str = "version = 1\n[daemon]\nlisten = \"127.0.0.1:0\"\n";

/// The daemon's API: `host:port` and the repository's token every request
/// of [`http_with`] carries (unless it names its own `Authorization`).
#[derive(Debug, Clone)]
pub(crate) struct Api {
    addr: String,
    token: String,
}

impl std::fmt::Display for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.addr)
    }
}

/// An `Authorization` line that sends none (the request goes anonymous).
pub(crate) const ANONYMOUS: &str = "Authorization: -";

/// The daemon's API, from its `api.listening` event and its token file.
pub(crate) fn api_addr(d: &Daemon) -> Api {
    let event = d.wait_event(0, "api.listening");
    let url = event["payload"]["url"].as_str().unwrap().to_string();
    let token = std::fs::read_to_string(d.root().join(".npc/api.token")).unwrap_or_default();
    Api {
        addr: url.strip_prefix("http://").unwrap().to_string(),
        token: token.trim().to_string(),
    }
}

pub(crate) struct Answer {
    pub(crate) status: u16,
    head: String,
    body: String,
}

impl Answer {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

/// One request; `headers` are extra lines. `Host` is 127.0.0.1 unless given.
pub(crate) fn http(addr: &Api, method: &str, path: &str, headers: &[&str]) -> Answer {
    http_with(addr, method, path, headers, b"")
}

/// A POST of `body` as JSON.
pub(crate) fn post_json(addr: &Api, path: &str, body: &str) -> Answer {
    http_with(
        addr,
        "POST",
        path,
        &["Content-Type: application/json"],
        body.as_bytes(),
    )
}

/// [`http`] with a body.
fn http_with(addr: &Api, method: &str, path: &str, headers: &[&str], body: &[u8]) -> Answer {
    let mut stream = TcpStream::connect(&addr.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !headers
        .iter()
        .any(|h| h.to_ascii_lowercase().starts_with("host:"))
    {
        request.push_str(&format!("Host: {addr}\r\n"));
    }
    if !headers
        .iter()
        .any(|h| h.to_ascii_lowercase().starts_with("authorization:"))
    {
        request.push_str(&format!("Authorization: Bearer {}\r\n", addr.token));
    }
    for h in headers.iter().filter(|h| **h != ANONYMOUS) {
        request.push_str(h);
        request.push_str("\r\n");
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    let raw = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    Answer {
        status,
        head: head.to_string(),
        body,
    }
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        body = &rest[n + 2..];
    }
    out
}

#[test]
fn status_plan_apply_and_events_answer_from_the_running_daemon() {
    let d = Daemon::start(LISTEN_ANY_PORT);
    let addr = api_addr(&d);
    assert!(
        d.log()
            .contains(&format!("API http://{addr}/api/v1/status")),
        "the daemon prints its API URL:\n{}",
        d.log()
    );
    let status = http(&addr, "GET", "/api/v1/status", &[]);
    assert_eq!(status.status, 200, "{}", status.body);
    assert_eq!(status.json()["pid"], d.pid());
    assert_eq!(status.json()["api"], format!("http://{addr}"));
    // `npc status` shows the same API URL.
    assert_eq!(d.status_json()["api"], format!("http://{addr}"));

    let plan = http(&addr, "GET", "/api/v1/plan", &[]);
    assert_eq!(plan.status, 200, "{}", plan.body);
    assert_eq!(plan.json()["format_version"], "1");
    assert_eq!(plan.json()["summary"]["add"], 0, "{}", plan.body);

    // An invalid manifest: the plan says where, and apply changes nothing.
    let before = d.last_event_id();
    d.write_manifest(&format!("{LISTEN_ANY_PORT}[mcp.servers.x]\ncommand = 7\n"));
    d.wait_event(before, "manifest.invalid");
    let plan = http(&addr, "GET", "/api/v1/plan", &[]);
    assert_eq!(plan.status, 422, "{}", plan.body);
    let doc = plan.json();
    assert_eq!(doc["error"]["code"], "manifest_invalid");
    let diagnostics = doc["error"]["detail"]["report"]["diagnostics"].to_string();
    assert!(diagnostics.contains("\"line\":5"), "{diagnostics}");
    let apply = http(&addr, "POST", "/api/v1/apply", &[]);
    assert_eq!(apply.status, 422, "{}", apply.body);

    // Fixed: apply answers with the reload's results.
    d.write_manifest(LISTEN_ANY_PORT);
    let apply = http(&addr, "POST", "/api/v1/reload", &[]);
    assert_eq!(apply.status, 200, "{}", apply.body);

    let page = http(&addr, "GET", "/api/v1/events?limit=1000", &[]).json();
    let ids: Vec<i64> = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_i64().unwrap())
        .collect();
    let stored: Vec<i64> = d
        .events()
        .iter()
        .map(|e| e["id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, stored[..ids.len()], "the API pages the store's log");
    assert!(
        page["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["kind"] == "manifest.invalid")
    );
    let missing = http(&addr, "GET", "/api/v1/nothing", &[]);
    assert_eq!(
        (missing.status, missing.json()["error"]["code"].as_str()),
        (404, Some("not_found"))
    );
}

#[test]
fn untrusted_hosts_and_missing_tokens_are_refused() {
    let manifest = format!("{LISTEN_ANY_PORT}token_env = \"NPC_TEST_API_TOKEN\"\n");
    let d = Daemon::start_with(
        &manifest,
        DaemonSetup {
            only_env: Some(&[("NPC_TEST_API_TOKEN", "correct-horse-battery")]),
            ..DaemonSetup::default()
        },
    );
    let addr = api_addr(&d);
    let auth = "Authorization: Bearer correct-horse-battery";
    assert_eq!(http(&addr, "GET", "/api/v1/status", &[auth]).status, 200);
    let missing = http(&addr, "GET", "/api/v1/status", &[]);
    assert_eq!(missing.status, 401);
    assert_eq!(missing.json()["error"]["code"], "unauthorized");
    assert!(
        missing
            .head
            .to_ascii_lowercase()
            .contains("www-authenticate: bearer")
    );
    let wrong = http(
        &addr,
        "GET",
        "/api/v1/status",
        &["Authorization: Bearer correct-horse"],
    );
    assert_eq!(wrong.status, 401);
    // A DNS-rebinding page sends its own name as Host, even with a token.
    let rebound = http(
        &addr,
        "POST",
        "/api/v1/apply",
        &[auth, "Host: attacker.example:8766"],
    );
    assert_eq!(rebound.status, 403);
    assert_eq!(rebound.json()["error"]["code"], "untrusted_host");
    assert!(
        !d.log().contains("correct-horse-battery"),
        "the token never reaches the log"
    );
}

#[test]
fn a_busy_api_port_costs_the_api_not_the_daemon() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let d = Daemon::start(&format!(
        "version = 1\n[daemon]\nlisten = \"127.0.0.1:{port}\"\n"
    ));
    let failed = d.wait_event(0, "api.failed");
    assert!(
        failed["payload"]["error"]
            .as_str()
            .unwrap()
            .contains("free the port or set another `daemon.listen`"),
        "{failed}"
    );
    // The control socket still answers.
    let status = d.status_json();
    assert_eq!(status["source"], format!("daemon pid {}", d.pid()));
    assert_eq!(status["api"], Value::Null);
}

/// Read SSE frames from `reader` until `n` event ids arrived.
fn read_ids(reader: &mut BufReader<TcpStream>, n: usize) -> Vec<i64> {
    let mut ids = Vec::new();
    let mut line = String::new();
    while ids.len() < n {
        line.clear();
        assert!(reader.read_line(&mut line).unwrap() > 0, "the stream ended");
        // Chunked framing: size lines and SSE lines arrive interleaved.
        if let Some(id) = line.trim_end().strip_prefix("id: ") {
            ids.push(id.parse().unwrap());
        }
    }
    ids
}

fn open_stream(addr: &Api, last_event_id: Option<i64>) -> BufReader<TcpStream> {
    let mut stream = TcpStream::connect(&addr.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let resume = last_event_id.map_or(String::new(), |id| format!("Last-Event-ID: {id}\r\n"));
    write!(
        stream,
        "GET /api/v1/events/stream HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\n{resume}\r\n",
        addr.token
    )
    .unwrap();
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    assert!(line.starts_with("HTTP/1.1 200"), "{line}");
    reader
}

#[test]
fn the_event_stream_resumes_across_reconnects_without_gap_or_duplicate() {
    let d = Daemon::start(LISTEN_ANY_PORT);
    let addr = api_addr(&d);
    let mut seen: Vec<i64> = Vec::new();
    let mut stream = open_stream(&addr, None);
    seen.extend(read_ids(&mut stream, d.last_event_id() as usize));
    for round in 0..5 {
        // Events are published while no stream is open ...
        drop(stream);
        let before = d.last_event_id();
        d.write_manifest(&format!(
            "{LISTEN_ANY_PORT}[mcp.servers.x]\ncommand = {round}\n"
        ));
        d.wait_event(before, "manifest.invalid");
        // ... and while the client reconnects.
        let between = d.last_event_id();
        stream = open_stream(&addr, seen.last().copied());
        d.write_manifest(&format!(
            "{LISTEN_ANY_PORT}[mcp.servers.y]\ncommand = {round}\n"
        ));
        d.wait_event(between, "manifest.invalid");
        let target = d.last_event_id();
        let want = (target - seen.last().unwrap()) as usize;
        seen.extend(read_ids(&mut stream, want));
    }
    let stored: Vec<i64> = d
        .events()
        .iter()
        .map(|e| e["id"].as_i64().unwrap())
        .collect();
    assert_eq!(seen, stored[..seen.len()], "every event once, in order");
}

#[test]
fn the_committed_openapi_document_is_the_generated_one() {
    let generated = npcagent::api::openapi::document();
    crate::support::committed_is_generated(
        "schemas/openapi.json",
        &serde_json::to_string_pretty(&generated).unwrap(),
    );
    if crate::support::updating_generated() {
        return;
    }
    // The binary prints (and serves) the committed text it carries.
    let committed = std::fs::read_to_string(repo_root().join("schemas/openapi.json")).unwrap();
    let printed = npc()
        .args(["schema", "--openapi"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    assert_eq!(
        committed.trim_end(),
        String::from_utf8(printed).unwrap().trim_end()
    );
}

#[test]
fn npc_dashboard_prints_the_page_the_daemon_serves() {
    let d = Daemon::start(LISTEN_ANY_PORT);
    let addr = api_addr(&d);
    let out = d.npc_output(&["dashboard"]);
    assert!(out.status.success());
    let url = String::from_utf8(out.stdout).unwrap();
    let code = url
        .trim_end()
        .strip_prefix(&format!("http://{addr}/#code="))
        .unwrap_or_else(|| panic!("{url}"));
    assert_eq!(code.len(), 32, "{url}");
    let page = http(&addr, "GET", "/", &[]);
    assert_eq!(page.status, 200);
    assert!(page.body.contains("<title>npc dashboard</title>"));
    let script = http(&addr, "GET", "/dashboard.js", &[]);
    assert!(script.body.contains("/events/stream"));
}

fn playwright() -> bool {
    let chromium = ["chromium", "chromium-browser"].iter().any(|c| {
        std::process::Command::new("sh")
            .args(["-c", &format!("command -v {c}")])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    chromium
        && std::process::Command::new("python3")
            .args(["-c", "import playwright"])
            .output()
            .is_ok_and(|o| o.status.success())
}

/// Whether the browser tests can run: Chromium and the Python playwright
/// package ([`require`](crate::support::require)).
pub(crate) fn browser_ready() -> bool {
    crate::support::require(crate::support::Peer::condition(
        "chromium or the Python playwright package",
        playwright(),
        "apt-get install chromium; pip install playwright",
    ))
}

/// Drive the dashboard at `url` with the Playwright script
/// `fixtures/dashboard/SCRIPT` (`SCRIPT URL ARGS… SCREENSHOT`), the
/// screenshot kept as `target/artifacts/SCREENSHOT`; what it saw (the JSON
/// it prints).
pub(crate) fn browse(script: &str, url: &str, args: &[&str], screenshot: &str) -> Value {
    let artifacts = repo_root().join("target/artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    let screenshot = artifacts.join(screenshot);
    let _ = std::fs::remove_file(&screenshot);
    let out = std::process::Command::new("python3")
        .arg(repo_root().join("fixtures/dashboard").join(script))
        .arg(url.trim_end())
        .args(args)
        .arg(&screenshot)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(std::fs::metadata(&screenshot).unwrap().len() > 0);
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The repository the browser test drives (its API needs the repository's
/// token, or the dashboard's session): the demo's MCP server `hello`
/// (two tools), a profile `dev` replaying a
/// Claude Code transcript with a tool call, a profile `hang` whose agent
/// never ends, a cron trigger `review` (once a year) running `dev`, and a
/// bash pane `shell` that appends every line it runs to `shell-history`,
/// watched by the scripted pane plugin `rec` (it sends what is appended to
/// `rec.cmds`).
fn dashboard_manifest() -> String {
    let quote = |s: &str| Value::String(s.to_string()).to_string();
    let agent = quote(
        &repo_root()
            .join("fixtures/clis/fake-agent.py")
            .display()
            .to_string(),
    );
    let fixture = quote(
        &repo_root()
            .join("fixtures/clis/claude_code/2.1.197/tool_call.jsonl")
            .display()
            .to_string(),
    );
    let mcp_server = quote(
        &repo_root()
            .join("examples/demo/tools/hello_mcp.py")
            .display()
            .to_string(),
    );
    let pane_plugin = quote(
        &repo_root()
            .join("fixtures/panes/scripted_plugin.py")
            .display()
            .to_string(),
    );
    format!(
        r#"{LISTEN_ANY_PORT}
[mcp.servers.hello]
command = "python3"
args = [{mcp_server}]
[providers.fake]
kind = "claude_code"
command = {agent}
args = ["--provider", "claude_code", "--fixture", {fixture}]
[providers.stuck]
kind = "claude_code"
command = {agent}
args = ["--provider", "claude_code", "--fixture", {fixture}]
env = {{ FAKE_AGENT_HANG = "1" }}
[prompts.review]
template = "list the files"
[profiles.dev]
provider = "fake"
description = "replays a transcript with a tool call"
[profiles.hang]
provider = "stuck"
description = "never ends on its own"
[triggers.review]
kind = "cron"
schedule = "0 0 1 1 *"
action = {{ profile = "dev", prompt = "review" }}
[pane_plugins.rec]
command = "python3"
args = [{pane_plugin}]
enabled = true
env = {{ PLUGIN_LOG = "rec.log", PLUGIN_CMDS = "rec.cmds" }}
[panes.shell]
plugin = "rec"
command = "bash"
args = ["--norc", "--noprofile", "-i"]
env = {{ HISTFILE = "shell-history", PROMPT_COMMAND = "history -a", PS1 = "$ " }}
"#
    )
}

/// The dashboard in a real browser: live stream, `manifest.invalid` with
/// its line, a component appearing after an edit, a trigger fired from the
/// page and its run's parsed events, runs started and cancelled from the
/// page, a shell pane's live terminal taking input, and `/status`,
/// `/relaunch` and `/restart` handled by the page without reaching the
/// shell; the screenshot is kept under `target/artifacts/`.
#[test]
fn the_dashboard_shows_live_state_in_headless_chromium() {
    if !browser_ready() {
        return;
    }
    let manifest = dashboard_manifest();
    let home = std::env::var("HOME").unwrap_or_default();
    let d = Daemon::start_with(
        &manifest,
        DaemonSetup {
            only_env: Some(&[("HOME", home.as_str())]),
            ..DaemonSetup::default()
        },
    );
    let addr = api_addr(&d);
    // The API wants a credential; the page redeems the one-time code of the
    // URL `npc dashboard` prints for a session cookie, which its requests,
    // its event stream and its terminal WebSocket then carry.
    assert_eq!(
        http(&addr, "GET", "/api/v1/panes", &[ANONYMOUS]).status,
        401
    );
    let url = String::from_utf8(d.npc_output(&["dashboard"]).stdout).unwrap();
    assert!(url.contains("/#code="), "{url}");
    // The plugin knows the pane (so the page can make it report).
    crate::support::wait_for("the plugin to see the pane open", || {
        std::fs::read_to_string(d.root().join("rec.log"))
            .ok()?
            .contains("pane_opened")
            .then_some(())
    });
    let root = d.root().display().to_string();
    let seen = browse("browse.py", &url, &[&root], "dashboard.png");
    let text = |key: &str| seen[key].as_str().unwrap_or_default().to_string();
    assert_eq!(seen["daemon"], format!("daemon pid {}", d.pid()));
    assert_eq!(
        seen["csp_violations"],
        serde_json::json!([]),
        "the page and xterm.js run under the CSP"
    );
    // The broken line is the second one appended to the manifest.
    let broken_line = manifest.lines().count() + 2;
    assert_eq!(seen["diagnostic_line"], broken_line.to_string(), "{seen}");
    assert!(
        text("diagnostic").contains("mcp.servers.broken.command"),
        "{seen}"
    );
    assert!(
        text("component_row").contains("mcp_server.sleeper"),
        "{seen}"
    );
    // Fixed back to what runs, the banner went away (`manifest.valid`).
    assert_eq!(seen["banner_cleared"], true, "{seen}");
    assert!(seen["events_shown"].as_u64().unwrap() > 0);
    // The plugin's `needs_attention` report: a notice, and the pane's row.
    assert!(text("notice").contains("needs_attention"), "{seen}");
    assert!(text("attention_row").contains("needs attention"), "{seen}");
    let mcp_row = text("mcp_row");
    // Connected, with its tools by the names clients call them.
    assert!(mcp_row.starts_with("helloconnected"), "{mcp_row}");
    assert!(
        mcp_row.contains("hello__hello") && mcp_row.contains("hello__add"),
        "{mcp_row}"
    );

    // The trigger row names its schedule and next fire time (1 January).
    assert!(text("trigger_row").contains("0 0 1 1 *"), "{seen}");
    let fired_id = text("fired").rsplit(' ').next().unwrap().to_string();
    assert!(text("fired_run_title").contains(&fired_id), "{seen}");
    let kinds: Vec<&str> = seen["fired_run_kinds"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for kind in [
        "run.started",
        "agent.message",
        "agent.tool_call",
        "run.finished",
    ] {
        assert!(kinds.contains(&kind), "{kind} in {kinds:?}");
    }
    // The tool call and its result, joined in one entry, as the transcript has them.
    assert!(text("tool_call").contains("Bash"), "{seen}");
    assert!(text("tool_result").contains("Cargo.toml"), "{seen}");
    assert!(text("outcome").contains("succeeded"), "{seen}");
    assert!(text("form_run_outcome").contains("succeeded"), "{seen}");
    assert!(text("hang_outcome").contains("cancelled"), "{seen}");
    // The page's runs are the daemon's runs.
    let runs = d.npc_output(&["runs", "--format", "json"]);
    let runs = String::from_utf8_lossy(&runs.stdout);
    for id in [&fired_id, &text("form_run"), &text("hang_run")] {
        assert!(runs.contains(id.as_str()), "{id} in {runs}");
    }

    // The pane: the shell ran what was typed, and never saw `/status`.
    assert!(text("pane_status").contains("state running"), "{seen}");
    assert!(text("pane_row").contains("shell"), "{seen}");
    let terminal = text("terminal");
    assert!(terminal.contains("npc-42-echo"), "{terminal}");
    assert!(!terminal.contains("/status"), "{terminal}");
    let history = crate::support::wait_for("the shell to record its last line", || {
        let history = std::fs::read_to_string(d.root().join("shell-history")).ok()?;
        history.contains("echo after-").then_some(history)
    });
    assert!(history.contains("echo npc-$((6*7))-echo"), "{history}");
    assert!(!history.contains("/status"), "{history}");
    // `/restart`: a new shell (another pid) took the next line; after
    // `exit`, `/relaunch` another one; no slash command reached a shell.
    assert!(text("relaunch_refused").contains("/restart"), "{seen}");
    let pid_line = |key: &str| {
        text(key)
            .lines()
            .find(|l| l.contains(" pid "))
            .unwrap_or_default()
            .to_string()
    };
    assert_ne!(
        pid_line("pane_status"),
        pid_line("pane_status_after_restart")
    );
    assert!(
        text("pane_status_after_restart").contains("state running"),
        "{seen}"
    );
    let history = crate::support::wait_for("the new shell to record its line", || {
        let history = std::fs::read_to_string(d.root().join("shell-history")).ok()?;
        history.contains("echo relaunched-").then_some(history)
    });
    for command in ["/status", "/restart", "/relaunch"] {
        assert!(!history.contains(command), "{command} in {history}");
        assert!(!text("terminal_after_restart").contains(command), "{seen}");
    }
}

/// Runs the shipped demo's heartbeat (every 10 s) makes in a minute.
const DEMO_HEARTBEATS_PER_MINUTE: usize = 6;

/// The README's first command: the daemon on the shipped demo brings up
/// its MCP server, fires its cron trigger and hosts its shell pane. Run on
/// a copy (API on a free port, the trigger every second).
#[test]
fn the_shipped_demo_comes_up_and_its_trigger_fires() {
    let demo = repo_root().join("examples/demo");
    let manifest = std::fs::read_to_string(demo.join("npcagent.toml"))
        .unwrap()
        .replace("127.0.0.1:8766", "127.0.0.1:0")
        .replace("schedule = \"10s\"", "schedule = \"1s\"");
    let server = std::fs::read_to_string(demo.join("tools/hello_mcp.py")).unwrap();
    let d = Daemon::start_with(
        &manifest,
        DaemonSetup {
            files: &[("tools/hello_mcp.py", &server)],
            default_log: true,
            ..DaemonSetup::default()
        },
    );
    api_addr(&d);
    let status = crate::support::wait_for("the demo's MCP server to connect", || {
        let status = d.status_json();
        (status["mcp"]["servers"][0]["state"] == "connected").then_some(status)
    });
    assert_eq!(status["mcp"]["servers"][0]["tools"], 2, "{status}");
    // As many heartbeats as the shipped demo (every 10 s) makes in a
    // minute: the daemon's log below covers a minute of the demo's work.
    crate::support::wait_for("a minute's worth of heartbeat runs to succeed", || {
        let out = d.npc_output(&["runs", "--format", "json"]);
        let runs: Value = serde_json::from_slice(&out.stdout).ok()?;
        let succeeded = runs
            .as_array()?
            .iter()
            .filter(|r| r["state"] == "succeeded")
            .count();
        (succeeded >= DEMO_HEARTBEATS_PER_MINUTE).then_some(())
    });
    let panes = d.npc_output(&["pane", "list"]);
    assert!(
        String::from_utf8_lossy(&panes.stdout).contains("shell"),
        "{}",
        String::from_utf8_lossy(&panes.stdout)
    );
    assert!(d.root().join("heartbeat.log").is_file());
    // The human views read as words and columns, never raw JSON.
    let events = crate::support::stdout_of(&d.npc(&["events"]).success());
    assert!(events.contains("run.started"), "{events}");
    assert!(
        !events.contains("{\""),
        "raw JSON in `npc events`: {events}"
    );
    assert!(
        events.contains(" ago)") || events.contains("(just now)"),
        "{events}"
    );
    let runs = crate::support::stdout_of(&d.npc(&["runs"]).success());
    let header = runs.lines().next().unwrap_or_default();
    for column in ["RUN", "STATE", "QUEUED", "WAITED", "TOOK"] {
        assert!(header.contains(column), "{runs}");
    }
    // The terminal (here a file) reads as sentences: the start-up in words,
    // no escape code, no library's line below `warn`.
    let log = d.log();
    assert!(log.contains("npc daemon: startup: "), "{log}");
    assert!(!log.contains('\u{1b}'), "{log}");
    for line in log.lines() {
        let library = [" INFO ", " DEBUG ", " TRACE "]
            .iter()
            .any(|level| line.contains(level) && !line.contains(&format!("{level}npcagent")));
        assert!(
            !library,
            "a library's line in the daemon's log: {line}\n{log}"
        );
    }
}

// ----- runs, panes, triggers, plugins ---------------------------------------

/// A manifest quoting `v` as a TOML string.
fn q(v: &std::path::Path) -> String {
    Value::String(v.display().to_string()).to_string()
}

/// A daemon with a fake-agent profile (`reviewer`, replays a transcript),
/// one that hangs until killed (`hanger`, its pid in `agent.pid`), a cron
/// trigger running a command, and a shell pane that answers each line with
/// the line and its terminal size.
fn resource_daemon() -> Daemon {
    let agent = repo_root().join("fixtures/clis/fake-agent.py");
    let fixture = repo_root().join("fixtures/clis/claude_code/2.1.197/tool_call.jsonl");
    let manifest = format!(
        r#"{LISTEN_ANY_PORT}
[providers.fake]
kind = "claude_code"
command = {agent}
args = ["--provider", "claude_code", "--fixture", {fixture}]
[providers.hang]
kind = "claude_code"
command = {agent}
args = ["--provider", "claude_code", "--fixture", {fixture}]
env = {{ FAKE_AGENT_HANG = "1", FAKE_AGENT_PID_FILE = "agent.pid" }}
[prompts.review]
template = "Review the change"
[profiles.reviewer]
provider = "fake"
description = "reviews"
prompt = "review"
[profiles.hanger]
provider = "hang"
description = "never ends"
prompt = "review"
[triggers.beat]
kind = "cron"
schedule = "1h"
action = {{ command = "sh", args = ["-c", "echo \"beat $NPC_TRIGGER_PAYLOAD\" >> beat.log"] }}
[panes.shell]
command = "sh"
args = ["-c", "while read l; do echo \"got $l $(stty size)\"; done"]
"#,
        agent = q(&agent),
        fixture = q(&fixture),
    );
    Daemon::start(&manifest)
}

fn run_state(addr: &Api, id: &str) -> String {
    let run = http(addr, "GET", &format!("/api/v1/runs/{id}"), &[]);
    assert_eq!(run.status, 200, "{}", run.body);
    run.json()["state"].as_str().unwrap().to_string()
}

#[test]
fn a_profile_run_started_through_the_api_is_recorded_with_its_agent_events() {
    let d = resource_daemon();
    let addr = api_addr(&d);
    let started = post_json(
        &addr,
        "/api/v1/runs",
        r#"{"profile":"reviewer","prompt":"look at it"}"#,
    );
    assert_eq!(started.status, 202, "{}", started.body);
    let id = started.json()["run_id"].as_str().unwrap().to_string();
    crate::support::wait_for("the run to succeed", || {
        (run_state(&addr, &id) == "succeeded").then_some(())
    });
    let events = http(&addr, "GET", &format!("/api/v1/runs/{id}/events"), &[]).json();
    let kinds: Vec<&str> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds.first(), Some(&"run.queued"), "{kinds:?}");
    for kind in ["run.started", "agent.tool_call", "run.finished"] {
        assert!(kinds.contains(&kind), "{kind} in {kinds:?}");
    }
    let list = http(&addr, "GET", "/api/v1/runs", &[]).json();
    let run = &list["runs"][0];
    assert_eq!(
        (
            run["id"].as_str(),
            run["source"].as_str(),
            run["profile"].as_str()
        ),
        (Some(id.as_str()), Some("manual"), Some("reviewer"))
    );
    assert_eq!(run["exit"]["code"], 0, "{run}");
    // The same run in `npc runs`, and its events through the SSE log.
    let cli = d.npc_output(&["runs", "--format", "json"]);
    assert!(String::from_utf8_lossy(&cli.stdout).contains(&id));
    // What the applied manifest lacks is refused and nothing is queued.
    for (body, code) in [
        (r#"{"profile":"ghost"}"#, "run.invalid"),
        (
            r#"{"profile":"reviewer","prompt_template":"ghost"}"#,
            "run.invalid",
        ),
        (
            r#"{"profile":"reviewer","prompt":"a","prompt_template":"review"}"#,
            "run.invalid",
        ),
        (r#"{"profile":"reviewer","vars":{"a":"b"}}"#, "run.invalid"),
        (
            r#"{"profile":"reviewer","command":"rm -rf ~"}"#,
            "invalid_body",
        ),
    ] {
        let refused = post_json(&addr, "/api/v1/runs", body);
        assert_eq!(
            (refused.status, refused.json()["error"]["code"].as_str()),
            (422, Some(code)),
            "{body}"
        );
    }
    assert_eq!(
        http(&addr, "GET", "/api/v1/runs", &[]).json()["runs"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

#[test]
fn cancelling_a_long_run_kills_its_process_group() {
    let d = resource_daemon();
    let addr = api_addr(&d);
    let started = post_json(&addr, "/api/v1/runs", r#"{"profile":"hanger"}"#);
    assert_eq!(started.status, 202, "{}", started.body);
    let id = started.json()["run_id"].as_str().unwrap().to_string();
    let pid: i32 = crate::support::wait_for("the agent's pid", || {
        std::fs::read_to_string(d.root().join("agent.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    });
    assert_eq!(run_state(&addr, &id), "running");
    let group = crate::support::process_group(pid as u32).expect("the agent runs");
    let group = nix::unistd::Pid::from_raw(group);
    assert!(
        nix::sys::signal::killpg(group, None).is_ok(),
        "the agent's group exists"
    );
    let cancelled = http(&addr, "POST", &format!("/api/v1/runs/{id}/cancel"), &[]);
    assert_eq!(cancelled.status, 202, "{}", cancelled.body);
    assert_eq!(
        cancelled.json(),
        serde_json::json!({ "run_id": id, "state": "cancelled" })
    );
    crate::support::wait_for("the process group to be gone", || {
        (nix::sys::signal::killpg(group, None) == Err(nix::errno::Errno::ESRCH)).then_some(())
    });
    let run = http(&addr, "GET", &format!("/api/v1/runs/{id}"), &[]).json();
    assert_eq!(
        (run["state"].as_str(), run["detail"].as_str()),
        (Some("cancelled"), Some("cancelled by hand"))
    );
    let again = http(&addr, "POST", &format!("/api/v1/runs/{id}/cancel"), &[]);
    assert_eq!(
        (again.status, again.json()["error"]["code"].as_str()),
        (409, Some("run.finished"))
    );
    let unknown = http(&addr, "POST", "/api/v1/runs/run-nope/cancel", &[]);
    assert_eq!(
        (unknown.status, unknown.json()["error"]["code"].as_str()),
        (404, Some("run.not_found"))
    );
}

type Ws = tokio_tungstenite::tungstenite::WebSocket<TcpStream>;

/// Open pane `name`'s terminal as the dashboard does.
fn terminal(addr: &Api, name: &str, origin: &str) -> Result<Ws, u16> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
    let mut req = format!("ws://{addr}/api/v1/panes/{name}/terminal")
        .into_client_request()
        .unwrap();
    req.headers_mut().insert("origin", origin.parse().unwrap());
    let protocols = format!("npc.v1, npc.bearer.{}", addr.token);
    req.headers_mut()
        .insert("sec-websocket-protocol", protocols.parse().unwrap());
    let stream = TcpStream::connect(&addr.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    match tokio_tungstenite::tungstenite::client(req, stream) {
        Ok((ws, _)) => Ok(ws),
        Err(tokio_tungstenite::tungstenite::HandshakeError::Failure(
            tokio_tungstenite::tungstenite::Error::Http(response),
        )) => Err(response.status().as_u16()),
        Err(e) => panic!("{e}"),
    }
}

/// Terminal output until it contains `want`; text frames are collected too.
fn read_until(ws: &mut Ws, want: &str, texts: &mut Vec<Value>) -> String {
    use tokio_tungstenite::tungstenite::Message;
    let mut seen = String::new();
    while !seen.contains(want) {
        match ws.read().unwrap() {
            Message::Binary(b) => seen.push_str(&String::from_utf8_lossy(&b)),
            Message::Text(t) => texts.push(serde_json::from_str(t.as_str()).unwrap()),
            Message::Close(frame) => panic!("closed ({frame:?}) before {want:?}; saw {seen:?}"),
            _ => {}
        }
    }
    seen
}

#[test]
fn pane_input_and_resize_reach_the_pty_and_echo_through_the_websocket() {
    use tokio_tungstenite::tungstenite::Message;
    let d = resource_daemon();
    let addr = api_addr(&d);
    let origin = format!("http://{addr}");
    let panes = http(&addr, "GET", "/api/v1/panes", &[]).json();
    assert_eq!(panes["panes"][0]["name"], "shell");
    assert_eq!(
        (
            panes["panes"][0]["cols"].as_u64(),
            panes["panes"][0]["rows"].as_u64()
        ),
        (Some(80), Some(24))
    );

    let mut a = terminal(&addr, "shell", &origin).unwrap();
    let mut b = terminal(&addr, "shell", &origin).unwrap();
    let mut texts = Vec::new();
    a.send(Message::Text(r#"{"type":"input","data":"hello\n"}"#.into()))
        .unwrap();
    for ws in [&mut a, &mut b] {
        read_until(ws, "got hello 24 80", &mut texts);
    }
    // REST input echoes to every terminal; a resize changes the real PTY.
    let sent = post_json(&addr, "/api/v1/panes/shell/input", r#"{"data":"rest\n"}"#);
    assert_eq!(sent.status, 202, "{}", sent.body);
    read_until(&mut b, "got rest 24 80", &mut texts);
    a.send(Message::Text(
        r#"{"type":"resize","cols":100,"rows":33}"#.into(),
    ))
    .unwrap();
    a.send(Message::Binary(b"sized\n".to_vec().into())).unwrap();
    read_until(&mut a, "got sized 33 100", &mut texts);
    let resized = post_json(
        &addr,
        "/api/v1/panes/shell/resize",
        r#"{"cols":90,"rows":20}"#,
    );
    assert_eq!(resized.status, 200, "{}", resized.body);
    assert_eq!(resized.json()["pane"]["cols"], 90);
    post_json(&addr, "/api/v1/panes/shell/input", r#"{"data":"again\n"}"#);
    read_until(&mut b, "got again 20 90", &mut texts);

    // Foreign pages and unknown panes never get a terminal.
    assert_eq!(
        terminal(&addr, "shell", "http://evil.example").err(),
        Some(403)
    );
    assert_eq!(terminal(&addr, "ghost", &origin).err(), Some(404));

    // Closing the pane ends every terminal with its exit.
    assert_eq!(
        http(&addr, "POST", "/api/v1/panes/shell/close", &[]).status,
        200
    );
    read_until_exit(&mut a);
    let closed = post_json(&addr, "/api/v1/panes/shell/input", r#"{"data":"x\n"}"#);
    assert_eq!(
        (closed.status, closed.json()["error"]["code"].as_str()),
        (409, Some("pane.not_open"))
    );
    assert_eq!(terminal(&addr, "shell", &origin).err(), Some(409));
    assert_eq!(
        http(&addr, "POST", "/api/v1/panes/shell/open", &[]).status,
        200
    );
    let mut c = terminal(&addr, "shell", &origin).unwrap();
    c.send(Message::Binary(b"back\n".to_vec().into())).unwrap();
    read_until(&mut c, "got back", &mut texts);
}

fn read_until_exit(ws: &mut Ws) {
    use tokio_tungstenite::tungstenite::Message;
    loop {
        match ws.read().unwrap() {
            Message::Text(t) if t.as_str().contains("\"exited\"") => return,
            Message::Close(frame) => panic!("closed ({frame:?}) without an exited frame"),
            _ => {}
        }
    }
}

#[test]
fn triggers_and_plugins_are_the_cli_objects_and_a_fire_runs_through_the_queue() {
    let d = resource_daemon();
    let addr = api_addr(&d);
    let listed = http(&addr, "GET", "/api/v1/triggers", &[]);
    assert_eq!(listed.status, 200, "{}", listed.body);
    let cli = d.npc_output(&["triggers", "--format", "json"]);
    let cli: Value = serde_json::from_slice(&cli.stdout).unwrap();
    assert_eq!(
        listed.json()["triggers"],
        cli["triggers"],
        "the same objects as `npc triggers`"
    );
    assert_eq!(
        listed.json()["triggers"][0]["next_fire_times"]
            .as_array()
            .unwrap()
            .len(),
        5
    );

    let fired = post_json(
        &addr,
        "/api/v1/triggers/beat/fire",
        r#"{"payload":{"ref":"main"}}"#,
    );
    assert_eq!(fired.status, 202, "{}", fired.body);
    let id = fired.json()["run_id"].as_str().unwrap().to_string();
    crate::support::wait_for("the fired run to succeed", || {
        (run_state(&addr, &id) == "succeeded").then_some(())
    });
    let run = http(&addr, "GET", &format!("/api/v1/runs/{id}"), &[]).json();
    assert_eq!(
        (run["source"].as_str(), run["command"].as_str()),
        (Some("trigger:beat"), Some("sh"))
    );
    let log = std::fs::read_to_string(d.root().join("beat.log")).unwrap();
    assert!(log.contains("\"ref\":\"main\""), "{log}");
    let ghost = http(&addr, "POST", "/api/v1/triggers/ghost/fire", &[]);
    assert_eq!(
        (ghost.status, ghost.json()["error"]["code"].as_str()),
        (404, Some("trigger.not_found"))
    );

    let plugins = http(&addr, "GET", "/api/v1/plugins", &[]);
    assert_eq!(plugins.status, 200, "{}", plugins.body);
    let cli = d.npc_output(&["plugin", "list", "--format", "json"]);
    let cli: Value = serde_json::from_slice(&cli.stdout).unwrap();
    assert_eq!(
        plugins.json()["plugins"],
        cli,
        "the same objects as `npc plugin list`"
    );
}

#[test]
fn hostile_requests_to_the_new_endpoints_get_stable_errors() {
    let d = resource_daemon();
    let addr = api_addr(&d);
    let huge = format!(r#"{{"data":"{}"}}"#, "x".repeat(70 * 1024));
    for (path, body, status) in [
        ("/api/v1/panes/shell/input", huge.as_str(), 413),
        ("/api/v1/panes/shell/input", "{\"data\":", 400),
        ("/api/v1/panes/ghost/input", r#"{"data":"x"}"#, 404),
        ("/api/v1/runs", r#"{"profile":7}"#, 422),
        ("/api/v1/triggers/beat/fire", "not json", 400),
    ] {
        let answer = post_json(&addr, path, body);
        assert_eq!(answer.status, status, "{path}: {}", answer.body);
        assert!(answer.json()["error"]["code"].is_string());
    }
    assert!(!d.root().join("beat.log").exists(), "nothing fired");
}

/// Schemathesis (PyPI, pinned in `.ci/run`) against the live daemon's
/// OpenAPI document: no request it generates gets a 5xx. The event stream
/// and the terminal are left out (endless, and a WebSocket).
#[test]
fn schemathesis_finds_no_server_error() {
    if !crate::support::require(crate::support::Peer::program(
        "schemathesis",
        "pip install schemathesis==4.32.5",
    )) {
        return;
    }
    let d = resource_daemon();
    let addr = api_addr(&d);
    let out = std::process::Command::new("schemathesis")
        .args(["run", &format!("http://{addr}/api/v1/openapi.json")])
        .args(["--url", &format!("http://{addr}")])
        .args(["--checks", "not_a_server_error"])
        .args(["--header", &format!("Authorization: Bearer {}", addr.token)])
        .args(["--max-examples", "25", "--seed", "7", "--no-shrink"])
        .args(["--phases", "examples,coverage,fuzzing"])
        .args(["--exclude-path", "/api/v1/events/stream"])
        .args(["--exclude-path", "/api/v1/panes/{name}/terminal"])
        .env("NO_COLOR", "1")
        .current_dir(d.root())
        .output()
        .unwrap();
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("passed"), "{text}");
    assert!(!d.log().contains("api: internal error"), "{}", d.log());
}
