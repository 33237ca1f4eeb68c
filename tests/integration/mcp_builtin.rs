//! npc's built-in MCP tools through the real gateway (`npc mcp serve`),
//! driven by the Python `mcp` SDK client (`fixtures/mcp/client.py`): the
//! memory group on a real SQLite file in a temporary data directory,
//! `fetch_url` against real HTTP servers on 127.0.0.1, `web_search`
//! without keys, and npc's own read-only tools. Nothing here reaches the
//! network beyond loopback.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use tempfile::TempDir;

use crate::support::{npc, npc_path, repo_root};

/// Longest one client session may take in these tests.
const CLIENT_LIMIT: Duration = Duration::from_secs(90);

use crate::mcp::python_sdk;

/// A repository with `manifest` as its `npcagent.toml`, and a data
/// directory of its own (`XDG_DATA_HOME`).
struct Repo {
    dir: TempDir,
    data: TempDir,
}

fn repo(manifest: &str) -> Repo {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("npcagent.toml"), manifest).unwrap();
    Repo {
        dir,
        data: tempfile::tempdir().unwrap(),
    }
}

/// Environment changes of one session: `Some` sets, `None` removes.
type Env<'a> = &'a [(&'a str, Option<&'a str>)];

/// Run the client's `steps` against `npc mcp serve` on stdio in the repo,
/// with `XDG_DATA_HOME` at the repo's data directory, no search keys, and
/// `env` applied last; one JSON value per step.
fn session(repo: &Repo, env: Env<'_>, steps: Value) -> Vec<Value> {
    let npc = npc_path().display().to_string();
    let client = repo_root().join("fixtures/mcp/client.py");
    let mut cmd = assert_cmd::Command::new("python3");
    cmd.arg(client)
        .arg(steps.to_string())
        .args(["--", &npc, "mcp", "serve"])
        .current_dir(repo.dir.path())
        .env("XDG_DATA_HOME", repo.data.path())
        .env_remove("BRAVE_API_KEY")
        .env_remove("EXA_API_KEY")
        .timeout(CLIENT_LIMIT);
    for (k, v) in env {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    crate::mcp::client_answers(&cmd.output().unwrap())
}

fn call(name: &str, arguments: Value) -> Value {
    json!(["call", name, arguments])
}

fn ok_json(step: &Value) -> Value {
    assert_eq!(step["is_error"], false, "expected a result: {step}");
    serde_json::from_str(step["text"].as_str().unwrap()).unwrap()
}

fn error_text(step: &Value) -> &str {
    assert_eq!(step["is_error"], true, "expected an isError result: {step}");
    step["text"].as_str().unwrap()
}

/// The `mcp.tool_call` events recorded in `dir`.
fn tool_calls(dir: &Path) -> Vec<Value> {
    let out = npc()
        .args(["events", "--format", "json"])
        .current_dir(dir)
        .output()
        .unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["kind"] == "mcp.tool_call")
        .collect()
}

const BUILTINS: [&str; 13] = [
    "memory_write",
    "memory_search",
    "memory_recent",
    "memory_delete",
    "board_post",
    "board_read",
    "fetch_url",
    "web_search",
    "npc_status",
    "npc_plan",
    "npc_events",
    "npc_delegate",
    "npc_progress",
];

#[test]
fn tools_list_is_the_builtins_in_order_then_every_upstream_tool() {
    if !python_sdk() {
        return;
    }
    let misbehave = repo_root().join("fixtures/mcp/misbehave.py");
    let r = repo(&format!(
        "version = 1\n[mcp.servers.bad]\ncommand = \"python3\"\nargs = [{:?}]\n",
        misbehave.display().to_string()
    ));
    let got = session(&r, &[], json!([["list"], call("bad__ok", json!({}))]));
    let tools: Vec<&str> = got[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(tools[..BUILTINS.len()], BUILTINS, "{tools:?}");
    assert!(tools[BUILTINS.len()..].contains(&"bad__ok"), "{tools:?}");
    assert!(
        tools[BUILTINS.len()..]
            .iter()
            .all(|t| t.starts_with("bad__")),
        "{tools:?}"
    );
    assert_eq!(got[1]["text"], "fine", "upstream calls still work");
}

#[test]
fn memory_tools_write_search_and_read_with_the_untrusted_notice() {
    if !python_sdk() {
        return;
    }
    let r = repo("version = 1\n");
    let got = session(
        &r,
        &[],
        json!([
            call(
                "memory_write",
                json!({"text": "The build runs cargo nextest", "tags": ["build"], "writer": "codex ghp_0123456789abcdefABCDEF"})
            ),
            call(
                "memory_write",
                json!({"text": "Deploys go through staging"})
            ),
            call(
                "memory_search",
                json!({"query": "NEAR(\"build\" AND cargo*) OR ) ("})
            ),
            call("memory_recent", json!({"limit": 5})),
            call("memory_write", json!({"text": "x".repeat(16 * 1024 + 1)})),
            call("memory_search", json!({"query": "\"*:^()"})),
            call("memory_delete", json!({"id": 2})),
            call(
                "board_post",
                json!({"text": "taking the parser", "writer": "claude"})
            ),
            call("board_post", json!({"text": "ok", "channel": "../../etc"})),
            call("board_read", json!({})),
            call("memory_recent", json!({"limit": 1000})),
            call("memory_write", json!({"text": "t", "surprise": 1})),
        ]),
    );
    assert_eq!(ok_json(&got[0])["id"], 1);
    let found = ok_json(&got[2]);
    assert!(
        found["notice"].as_str().unwrap().contains("untrusted"),
        "{found}"
    );
    let entries = found["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "FTS syntax is only words: {found}");
    assert_eq!(entries[0]["text"], "The build runs cargo nextest");
    assert_eq!(
        entries[0]["writer"], "codex ghp_01…",
        "a token keeps 6 characters"
    );
    let recent = ok_json(&got[3]);
    assert!(recent["notice"].as_str().unwrap().contains("untrusted"));
    assert_eq!(recent["entries"][0]["text"], "Deploys go through staging");
    assert!(error_text(&got[4]).contains("16384"), "{}", got[4]);
    assert!(error_text(&got[5]).contains("no words"));
    assert_eq!(ok_json(&got[6])["deleted"], true);
    assert_eq!(ok_json(&got[7])["channel"], "general");
    assert!(error_text(&got[8]).contains("channel name"));
    let board = ok_json(&got[9]);
    assert!(board["notice"].as_str().unwrap().contains("untrusted"));
    assert_eq!(board["entries"].as_array().unwrap().len(), 1, "{board}");
    assert_eq!(board["entries"][0]["writer"], "claude");
    assert!(error_text(&got[10]).contains("the most allowed is 50"));
    assert!(error_text(&got[11]).contains("surprise"));

    // The file lives in the data directory, under the project's key; a
    // second session sees what the first wrote (one memory is left).
    let files: Vec<String> = std::fs::read_dir(r.data.path().join("npc/memory"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        files
            .iter()
            .any(|f| f.ends_with(".sqlite3") && !f.contains('/')),
        "{files:?}"
    );
    let again = session(&r, &[], json!([call("memory_recent", json!({}))]));
    assert_eq!(ok_json(&again[0])["entries"].as_array().unwrap().len(), 1);

    // Another repository with the same data directory has its own memory.
    let other = Repo {
        dir: tempfile::tempdir().unwrap(),
        data: r.data,
    };
    std::fs::write(other.dir.path().join("npcagent.toml"), "version = 1\n").unwrap();
    let apart = session(&other, &[], json!([call("memory_recent", json!({}))]));
    assert_eq!(ok_json(&apart[0])["entries"], json!([]));

    // Every call is an event with the built-in server; failures say why.
    let events = tool_calls(r.dir.path());
    assert_eq!(events.len(), 13, "{events:?}");
    let p = &events[0]["payload"];
    assert_eq!(
        (&p["server"], &p["tool"], &p["outcome"], &p["builtin"]),
        (
            &json!("npc"),
            &json!("memory_write"),
            &json!("ok"),
            &json!(true)
        )
    );
    assert_eq!(events[4]["payload"]["outcome"], "tool_error");
}

#[test]
fn memory_without_a_data_directory_lists_its_tools_and_says_what_is_missing() {
    if !python_sdk() {
        return;
    }
    let r = repo("version = 1\n");
    let got = session(
        &r,
        &[("XDG_DATA_HOME", None), ("HOME", None)],
        json!([
            ["list"],
            call("memory_write", json!({"text": "x"})),
            call("board_read", json!({}))
        ]),
    );
    let tools = got[0]["tools"].as_array().unwrap();
    assert!(tools.contains(&json!("memory_write")), "{tools:?}");
    for step in &got[1..] {
        let message = error_text(step);
        assert!(
            message.contains("unavailable") && message.contains("XDG_DATA_HOME"),
            "{message}"
        );
    }
    let events = tool_calls(r.dir.path());
    assert_eq!(events[0]["payload"]["outcome"], "unavailable");
}

/// What the loopback test server answers.
enum Reply {
    Body(&'static str),
    /// A `302` to this location.
    Redirect(String),
    /// A body of this many bytes, written until the client hangs up.
    Huge(usize),
    /// Headers, then one body byte at a time, slowly, until the client
    /// hangs up (slowloris).
    Dribble,
}

/// An HTTP server on a loopback address that counts the connections it
/// accepts and answers each request with `answer(path)`.
struct Server {
    port: u16,
    accepts: Arc<AtomicUsize>,
}

fn serve(ip: &str, answer: impl Fn(&str) -> Reply + Send + Sync + 'static) -> Server {
    let listener = TcpListener::bind((ip, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepts = Arc::new(AtomicUsize::new(0));
    let (count, answer) = (accepts.clone(), Arc::new(answer));
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            count.fetch_add(1, Ordering::SeqCst);
            let answer = answer.clone();
            std::thread::spawn(move || {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && head.len() < 64 * 1024 {
                    match stream.read(&mut byte) {
                        Ok(1) => head.push(byte[0]),
                        _ => return,
                    }
                }
                let head = String::from_utf8_lossy(&head);
                let path = head.split(' ').nth(1).unwrap_or("/").to_string();
                let _ = match answer(&path) {
                    Reply::Body(b) => write!(
                        stream,
                        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{b}",
                        b.len()
                    ),
                    Reply::Redirect(to) => write!(
                        stream,
                        "HTTP/1.1 302 Found\r\nLocation: {to}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    ),
                    Reply::Huge(n) => {
                        let _ = write!(
                            stream,
                            "HTTP/1.1 200 OK\r\nContent-Length: {n}\r\nConnection: close\r\n\r\n"
                        );
                        let chunk = vec![b'x'; 64 * 1024];
                        let mut left = n;
                        while left > 0 {
                            let k = left.min(chunk.len());
                            if stream.write_all(&chunk[..k]).is_err() {
                                break;
                            }
                            left -= k;
                        }
                        Ok(())
                    }
                    Reply::Dribble => {
                        let _ = write!(
                            stream,
                            "HTTP/1.1 200 OK\r\nContent-Length: 100000\r\nConnection: close\r\n\r\n"
                        );
                        // The hostile behaviour itself, not synchronisation.
                        for _ in 0..100_000 {
                            if stream.write_all(b"x").is_err() {
                                break;
                            }
                            std::thread::sleep(Duration::from_millis(50));
                        }
                        Ok(())
                    }
                };
            });
        }
    });
    Server { port, accepts }
}

impl Server {
    fn accepts(&self) -> usize {
        self.accepts.load(Ordering::SeqCst)
    }
}

fn fetch(url: String) -> Value {
    call("fetch_url", json!({ "url": url }))
}

#[test]
fn fetch_url_reaches_loopback_only_with_the_opt_in_and_redacts_the_url() {
    if !python_sdk() {
        return;
    }
    let server = serve("127.0.0.1", |_| Reply::Body("hello from loopback"));
    let url = format!("http://127.0.0.1:{}/page", server.port);

    let strict = repo("version = 1\n");
    let got = session(&strict, &[], json!([fetch(url.clone())]));
    let message = error_text(&got[0]);
    assert!(
        message.contains("loopback") && message.contains("fetch_allow_private"),
        "{message}"
    );
    assert_eq!(server.accepts(), 0, "refused before connecting");

    let open = repo("version = 1\n[mcp.builtins]\nfetch_allow_private = true\n");
    let got = session(&open, &[], json!([fetch(url.clone())]));
    let fetched = ok_json(&got[0]);
    assert_eq!(fetched["body"], "hello from loopback");
    assert_eq!(fetched["status"], 200);
    assert!(fetched["notice"].as_str().unwrap().contains("untrusted"));
    assert_eq!(server.accepts(), 1);

    // A host name is resolved once and the connection pinned to the
    // checked address (reqwest's own resolver refuses every lookup).
    let named = repo("version = 1\n[mcp.builtins]\nfetch_allow_networks = [\"127.0.0.1/32\"]\n");
    let got = session(
        &named,
        &[],
        json!([fetch(format!("http://localhost:{}/page", server.port))]),
    );
    assert_eq!(ok_json(&got[0])["body"], "hello from loopback");
    assert_eq!(server.accepts(), 2);

    for dir in [strict.dir.path(), open.dir.path()] {
        let events = tool_calls(dir);
        assert_eq!(events.len(), 1);
        let p = &events[0]["payload"];
        assert_eq!(p["arguments"]["url"], "<redacted>", "{p}");
        assert!(
            !p.to_string().contains(&server.port.to_string()),
            "the url appears nowhere in the event: {p}"
        );
    }
}

#[test]
fn redirects_are_followed_and_checked_hop_by_hop_without_connecting_to_refused_ones() {
    if !python_sdk() {
        return;
    }
    // The private target: another loopback address, outside the opt-in.
    let target = serve("127.0.0.2", |_| Reply::Body("secret"));
    // Reachable on Linux through 0.0.0.0, which is refused always.
    let local = serve("127.0.0.1", |_| Reply::Body("local"));
    let (t, l) = (target.port, local.port);
    let front = serve("127.0.0.1", move |path| match path {
        "/private" => Reply::Redirect(format!("http://127.0.0.2:{t}/secret")),
        "/mapped" => Reply::Redirect(format!("http://[::ffff:127.0.0.2]:{t}/secret")),
        "/zero" => Reply::Redirect(format!("http://0.0.0.0:{l}/")),
        "/chain" => Reply::Redirect("/chain2".into()),
        "/chain2" => Reply::Redirect("ok".into()),
        "/loop" => Reply::Redirect("/loop".into()),
        "/ok" => Reply::Body("arrived"),
        _ => Reply::Body("?"),
    });
    let base = format!("http://127.0.0.1:{}", front.port);
    let only_front =
        repo("version = 1\n[mcp.builtins]\nfetch_allow_networks = [\"127.0.0.1/32\"]\n");
    let got = session(
        &only_front,
        &[],
        json!([
            fetch(format!("{base}/private")),
            fetch(format!("{base}/mapped")),
            fetch(format!("{base}/chain")),
            fetch(format!("{base}/loop")),
        ]),
    );
    for step in &got[..2] {
        let message = error_text(step);
        assert!(
            message.starts_with("redirect 1 leads to a loopback address"),
            "{message}"
        );
    }
    let chained = ok_json(&got[2]);
    assert_eq!(
        (&chained["body"], &chained["redirects"]),
        (&json!("arrived"), &json!(2))
    );
    assert!(error_text(&got[3]).contains("more than 5 redirects"));

    let everything = repo("version = 1\n[mcp.builtins]\nfetch_allow_private = true\n");
    let got = session(&everything, &[], json!([fetch(format!("{base}/zero"))]));
    assert!(
        error_text(&got[0]).contains("unspecified"),
        "0.0.0.0 is refused even with the opt-in: {}",
        got[0]
    );
    assert_eq!(target.accepts(), 0, "no connection to the refused address");
    assert_eq!(local.accepts(), 0, "no connection through 0.0.0.0");
}

#[test]
fn huge_and_slow_responses_are_capped_in_size_and_time() {
    if !python_sdk() {
        return;
    }
    let server = serve("127.0.0.1", |path| match path {
        "/huge" => Reply::Huge(8 * 1024 * 1024),
        _ => Reply::Dribble,
    });
    let base = format!("http://127.0.0.1:{}", server.port);
    let r =
        repo("version = 1\n[mcp.builtins]\nfetch_allow_private = true\nfetch_timeout_ms = 1500\n");
    let got = session(
        &r,
        &[],
        json!([
            fetch(format!("{base}/huge")),
            call(
                "fetch_url",
                json!({"url": format!("{base}/huge"), "max_bytes": 10})
            ),
            fetch(format!("{base}/slow")),
            call("fetch_url", json!({"url": "file:///etc/passwd"})),
            call(
                "fetch_url",
                json!({"url": format!("{base}/huge"), "max_bytes": 1 << 30})
            ),
        ]),
    );
    let huge = ok_json(&got[0]);
    assert_eq!(
        (&huge["bytes"], &huge["truncated"]),
        (&json!(1024 * 1024), &json!(true))
    );
    assert_eq!(ok_json(&got[1])["body"], "xxxxxxxxxx");
    assert!(
        error_text(&got[2]).contains("did not finish within 1500 ms"),
        "{}",
        got[2]
    );
    assert!(error_text(&got[3]).contains("scheme `file`"));
    assert!(error_text(&got[4]).contains("max_bytes"));
}

#[test]
fn npc_tools_read_status_plan_and_paged_events() {
    if !python_sdk() {
        return;
    }
    let misbehave = repo_root().join("fixtures/mcp/misbehave.py");
    let r = repo(&format!(
        "version = 1\n[mcp.servers.bad]\ncommand = \"python3\"\nargs = [{:?}]\n",
        misbehave.display().to_string()
    ));
    let got = session(
        &r,
        &[],
        json!([
            call("bad__ok", json!({})),
            call("memory_recent", json!({})),
            call("npc_events", json!({"kind": "mcp.tool_call", "limit": 1})),
            call("npc_status", json!({})),
            call("npc_plan", json!({})),
            call("npc_events", json!({"limit": 100_000})),
            call("npc_status", json!({"extra": true})),
            call("npc_delegate", json!({"profile": "x", "prompt": "y"})),
            call("npc_progress", json!({"text": "halfway"})),
        ]),
    );
    // Without a daemon (and from a session of no run) nothing is started
    // and nothing is recorded.
    assert!(
        error_text(&got[7]).contains("`npc_delegate` needs the daemon"),
        "{}",
        got[7]
    );
    assert!(
        error_text(&got[8]).contains("`npc_progress` needs the daemon"),
        "{}",
        got[8]
    );
    let first = ok_json(&got[2]);
    assert!(first["notice"].as_str().unwrap().contains("untrusted"));
    let events = first["events"].as_array().unwrap();
    assert_eq!(events.len(), 1, "{first}");
    assert_eq!(events[0]["payload"]["tool"], "ok");
    let after = first["next_after"].as_i64().unwrap();
    assert_eq!(after, events[0]["id"].as_i64().unwrap());

    let status = ok_json(&got[3]);
    assert!(status["components"].is_array(), "{status}");
    let plan = ok_json(&got[4]);
    assert!(
        plan.to_string().contains("bad"),
        "the server is still to be applied: {plan}"
    );
    assert!(error_text(&got[5]).contains("the most allowed is 500"));
    assert!(error_text(&got[6]).contains("extra"));

    // The next page starts after the first and sees the later calls.
    let next = session(
        &r,
        &[],
        json!([call(
            "npc_events",
            json!({"kind": "mcp.tool_call", "after": after, "limit": 2})
        )]),
    );
    let page = ok_json(&next[0]);
    let tools: Vec<&Value> = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["payload"]["tool"])
        .collect();
    assert_eq!(tools, [&json!("memory_recent"), &json!("npc_events")]);
}

#[test]
fn web_search_without_keys_is_not_configured_naming_both_variables() {
    if !python_sdk() {
        return;
    }
    let r = repo("version = 1\n");
    let got = session(
        &r,
        &[],
        json!([call("web_search", json!({"query": "rust mcp gateway"}))]),
    );
    let message = error_text(&got[0]);
    assert!(
        message.contains("not_configured")
            && message.contains("BRAVE_API_KEY")
            && message.contains("EXA_API_KEY"),
        "{message}"
    );
    assert_eq!(
        tool_calls(r.dir.path())[0]["payload"]["outcome"],
        "unavailable"
    );

    // With a key, calls refused before any request never show it either
    // (no request reaches the real services from tests).
    let key = "brave-key-sentinel-0123456789";
    let got = session(
        &r,
        &[("BRAVE_API_KEY", Some(key)), ("NPC_LOG", Some("debug"))],
        json!([
            call("web_search", json!({"query": "  "})),
            call("web_search", json!({"query": "q".repeat(401)})),
            call("web_search", json!({"query": "x", "limit": 21})),
        ]),
    );
    assert!(error_text(&got[0]).contains("empty"));
    assert!(error_text(&got[1]).contains("401 bytes"));
    assert!(error_text(&got[2]).contains("the most allowed is 20"));
    let events = tool_calls(r.dir.path());
    assert_eq!(events.len(), 4);
    assert!(!Value::Array(events).to_string().contains(key));
}
