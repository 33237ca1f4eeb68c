//! The threat model's two actors beyond the repository, tried through the
//! real binary: another local account on the same machine (a second uid,
//! `setpriv --reuid=65534 --regid=65534 --clear-groups`, where the tests
//! run as root as CI does) and a web page the user's browser opens (a
//! request carrying another page's `Origin`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{Daemon, npc, stop_child};

const API_ANY_PORT: &str = "version = 1\n[daemon]\nlisten = \"127.0.0.1:0\"\n";

/// The system's Python, which another account may run (a user's own
/// Python, under their home, is often unreadable to others).
const SYSTEM_PYTHON: &str = "/usr/bin/python3";

/// Whether another account can be borrowed here (root, `setpriv`, and a
/// Python every account may run).
fn can_switch_user() -> bool {
    nix::unistd::getuid().is_root()
        && Path::new(SYSTEM_PYTHON).exists()
        && std::process::Command::new("setpriv")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
}

/// `python3 -c script args…` as uid/gid 65534 with no groups: its stdout.
fn as_nobody(script: &str, args: &[&str]) -> String {
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .args([SYSTEM_PYTHON, "-c", script])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The daemon's API address, from its `api.listening` event.
fn api_of(d: &Daemon) -> String {
    let event = d.wait_event(0, "api.listening");
    let url = event["payload"]["url"].as_str().unwrap();
    url.strip_prefix("http://").unwrap().to_string()
}

/// One raw HTTP/1.1 request to `addr`: the status.
fn status_of(addr: &str, request: &str) -> u16 {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).unwrap();
    String::from_utf8_lossy(&head[9..12]).parse().unwrap()
}

/// A POST of `body` with `headers` (each ending in CRLF).
fn post(addr: &str, path: &str, headers: &str, body: &str) -> u16 {
    status_of(
        addr,
        &format!(
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    )
}

fn token_of(root: &Path) -> String {
    std::fs::read_to_string(root.join(".npc/api.token"))
        .unwrap()
        .trim()
        .to_string()
}

/// What another account tries, from Python: read the token file, use the
/// API (type into a pane, read the status) and open an MCP session over
/// HTTP. Prints one JSON object of what each attempt got.
const INTRUDER: &str = r#"
import json, sys, urllib.request, urllib.error
root, api, mcp = sys.argv[1], sys.argv[2], sys.argv[3]
got = {}
try:
    open(root + "/.npc/api.token").read()
    got["token_file"] = "read"
except OSError as e:
    got["token_file"] = type(e).__name__
def status(url, data=None, headers={}):
    req = urllib.request.Request(url, data=data, headers=headers)
    try:
        return urllib.request.urlopen(req, timeout=30).status
    except urllib.error.HTTPError as e:
        return e.code
got["pane_input"] = status("http://" + api + "/api/v1/panes/shell/input",
    json.dumps({"data": "touch /tmp/npc-intruder\r"}).encode(),
    {"Content-Type": "application/json"})
got["status"] = status("http://" + api + "/api/v1/status")
got["mcp_initialize"] = status(mcp, json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {},
               "clientInfo": {"name": "x", "version": "1"}}}).encode(),
    {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"})
print(json.dumps(got))
"#;

#[test]
fn another_account_gets_nothing_from_the_api_the_dashboard_or_the_http_gateway() {
    if !crate::support::require(crate::support::Peer::condition(
        "root, setpriv and the system python3 (to act as another account)",
        can_switch_user(),
        "run the suite as root, as CI does; apt-get install util-linux python3",
    )) {
        return;
    }
    let d = Daemon::start(&format!(
        "{API_ANY_PORT}[panes.shell]\ncommand = \"bash\"\nargs = [\"--norc\", \"-i\"]\n"
    ));
    // A checkout others may read, as in a shared home directory.
    std::fs::set_permissions(d.root(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let api = api_of(&d);
    let (mut gateway, mcp) = crate::mcp::spawn_http_gateway_in(d.root(), &[]);
    let got: Value = serde_json::from_str(&as_nobody(
        INTRUDER,
        &[d.root().to_str().unwrap(), &api, &mcp],
    ))
    .unwrap();
    assert_eq!(
        got,
        json!({
            "token_file": "PermissionError",
            "pane_input": 401,
            "status": 401,
            "mcp_initialize": 401,
        })
    );
    assert!(!Path::new("/tmp/npc-intruder").exists());
    // The owner, with the repository's token, is served.
    let token = token_of(d.root());
    let owner = status_of(
        &api,
        &format!(
            "GET /api/v1/status HTTP/1.1\r\nHost: {api}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
        ),
    );
    assert_eq!(owner, 200);
    let mode = std::fs::metadata(d.root().join(".npc/api.token"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    stop_child(&mut gateway);
}

#[test]
fn a_web_page_changes_nothing_even_with_the_owners_credential() {
    let d = Daemon::start(&format!(
        "{API_ANY_PORT}[triggers.t]\nkind = \"cron\"\nschedule = \"0 0 1 1 *\"\naction = {{ command = \"true\" }}\n"
    ));
    let api = api_of(&d);
    let token = token_of(d.root());
    let bearer = format!("Authorization: Bearer {token}\r\n");
    let evil = "Origin: http://evil.example\r\n";
    // A form post of `text/plain` from another origin, and body-less posts.
    let fire = post(
        &api,
        "/api/v1/triggers/t/fire",
        &format!("{bearer}{evil}Content-Type: text/plain\r\n"),
        "{\"payload\": 1}",
    );
    assert_eq!(fire, 403);
    for path in [
        "/api/v1/apply",
        "/api/v1/reload",
        "/api/v1/runs/run-x/cancel",
    ] {
        assert_eq!(
            post(&api, path, &format!("{bearer}{evil}"), ""),
            403,
            "{path}"
        );
    }
    // A cross-site request without an `Origin` still says where it is from.
    assert_eq!(
        post(
            &api,
            "/api/v1/apply",
            &format!("{bearer}Sec-Fetch-Site: cross-site\r\n"),
            ""
        ),
        403
    );
    // A body that is not JSON is refused even from no page at all.
    assert_eq!(
        post(
            &api,
            "/api/v1/triggers/t/fire",
            &format!("{bearer}Content-Type: text/plain\r\n"),
            "{}"
        ),
        415
    );
    assert!(
        d.events().iter().all(|e| e["kind"] != "run.queued"),
        "nothing was fired"
    );
    // The same rule on the MCP HTTP gateway (the transport says servers
    // must validate `Origin`).
    let (mut gateway, mcp) = crate::mcp::spawn_http_gateway_in(d.root(), &[]);
    let rest = mcp.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_once('/').unwrap();
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}})
    .to_string();
    let mcp_headers = format!(
        "{bearer}Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
    );
    assert_eq!(
        post(
            host,
            &format!("/{path}"),
            &format!("{mcp_headers}{evil}"),
            &body
        ),
        403
    );
    assert_eq!(post(host, &format!("/{path}"), &mcp_headers, &body), 200);
    stop_child(&mut gateway);
}

#[test]
fn opting_out_of_the_token_is_explicit_loopback_only_and_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("npcagent.toml");
    std::fs::write(&manifest, "version = 1\n[daemon]\nauth = \"none\"\n").unwrap();
    let out = npc().arg("validate").arg(&manifest).output().unwrap();
    assert!(out.status.success());
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("any local account and any web page"),
        "{text}"
    );
    std::fs::write(
        &manifest,
        "version = 1\n[daemon]\nauth = \"none\"\nallow_remote = true\ntoken_env = \"T\"\nlisten = \"0.0.0.0:8766\"\n",
    )
    .unwrap();
    let out = npc().arg("validate").arg(&manifest).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("cannot serve a non-loopback"), "{text}");
}

/// A signed webhook route, on a webhook listener of its own port.
const SIGNED_ROUTE: &str = r#"version = 1
[daemon]
webhook_listen = "127.0.0.1:0"
listen = "127.0.0.1:0"
[triggers.gh]
kind = "webhook"
route = "github"
secret_env = "HOOK_SECRET"
max_body_bytes = 16777216
rate_limit_per_minute = 100000
action = { command = "true" }
"#;

/// The daemon's webhook listener address, from its `webhook.listening` event.
fn webhook_of(d: &Daemon) -> String {
    d.wait_event(0, "webhook.listening")["payload"]["addr"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Open descriptors of process `pid`.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// Resident memory of process `pid`, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb * 1024
}

/// A flood from Python (another account where one can be borrowed): open
/// `count` connections to `addr`, send each `head` and then `body_bytes` of
/// body, and hold them; print `ready SENT STATUSES` (the statuses answered
/// meanwhile, as JSON), then hold until stdin closes.
const FLOODER: &str = r#"
import json, resource, select, socket, sys
addr, count, head, body_bytes = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
host, port = addr.rsplit(":", 1)
socks, statuses = [], {}
for _ in range(count):
    s = socket.create_connection((host, int(port)), timeout=30)
    s.setblocking(True)
    try:
        s.sendall(head.replace("\\r\\n", "\r\n").encode())
        sent = 0
        while sent < body_bytes:
            n = min(65536, body_bytes - sent)
            s.sendall(b"x" * n)
            sent += n
    except OSError:
        pass
    socks.append(s)
poller = select.poll()
by_fd = {s.fileno(): s for s in socks}
for fd in by_fd:
    poller.register(fd, select.POLLIN)
for fd, _ in poller.poll(2000):
    s = by_fd[fd]
    try:
        line = s.recv(64).split(b"\r\n", 1)[0].decode()
        code = line.split(" ")[1] if line.startswith("HTTP/") else "closed"
    except OSError:
        code = "reset"
    statuses[code] = statuses.get(code, 0) + 1
print("ready", len(socks), json.dumps(statuses), flush=True)
sys.stdin.read()
"#;

/// Start [`FLOODER`]; returns the child, once it reported `ready`, and its line.
fn flood(addr: &str, count: usize, head: &str, body_bytes: usize) -> (std::process::Child, String) {
    let python = if can_switch_user() {
        SYSTEM_PYTHON
    } else {
        "python3"
    };
    let mut cmd = if can_switch_user() {
        let mut c = std::process::Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", python]);
        c
    } else {
        std::process::Command::new(python)
    };
    let mut child = cmd
        .args([
            "-c",
            FLOODER,
            addr,
            &count.to_string(),
            head,
            &body_bytes.to_string(),
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert!(line.starts_with("ready"), "{line}");
    (child, line)
}

#[test]
fn half_open_connections_cost_their_listener_never_the_daemon() {
    let d = Daemon::start_with(
        SIGNED_ROUTE,
        crate::support::DaemonSetup {
            // The report's machine: 1024 descriptors, soft and hard.
            nofile: Some(1024),
            only_env: Some(&[("HOOK_SECRET", "s3cret")]),
            ..Default::default()
        },
    );
    let hook = webhook_of(&d);
    let before = open_fds(d.pid());
    let (mut flooder, ready) = flood(
        &hook,
        1100,
        "POST /webhooks/github HTTP/1.1\\r\\nHost: x\\r\\n",
        0,
    );
    // The daemon holds at most its cap of them; the control socket, the
    // store and `npc status` keep working.
    let held = open_fds(d.pid()) - before;
    assert!(
        held <= npcagent::surfaces::tcp::MAX_CONNECTIONS + 16,
        "{held} descriptors for the flood ({ready})"
    );
    let status = d.npc_output(&["status", "--format", "json"]);
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let api = api_of(&d);
    assert_eq!(
        status_of(
            &api,
            &format!(
                "GET /api/v1/status HTTP/1.1\r\nHost: {api}\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n",
                token_of(d.root())
            )
        ),
        200,
        "the API's listener is not the webhook's"
    );
    drop(flooder.stdin.take());
    flooder.wait().unwrap();
    // Once the flood is gone, the route answers again.
    crate::support::wait_for("the webhook route to answer again", || {
        let code = post(
            &hook,
            "/webhooks/github",
            "Content-Type: application/json\r\n",
            "{}",
        );
        (code == 401).then_some(())
    });
    assert!(!d.log().contains("Too many open files"), "{}", d.log());
}

#[test]
fn unsigned_bodies_in_flight_are_bounded_over_every_route() {
    let d = Daemon::start_with(
        SIGNED_ROUTE,
        crate::support::DaemonSetup {
            only_env: Some(&[("HOOK_SECRET", "s3cret")]),
            ..Default::default()
        },
    );
    let hook = webhook_of(&d);
    let before = rss(d.pid());
    // 200 bodies of 1 MiB declared, 768 KiB of each sent, then held: 150
    // MiB if each were buffered before its signature is checked.
    let (mut flooder, ready) = flood(
        &hook,
        200,
        "POST /webhooks/github HTTP/1.1\\r\\nHost: x\\r\\nContent-Type: application/json\\r\\nContent-Length: 1048576\\r\\n\\r\\n",
        768 * 1024,
    );
    let grew = rss(d.pid()).saturating_sub(before);
    let budget = npcagent::triggers::webhook::MAX_UNVERIFIED_BODY_BYTES as u64;
    assert!(
        grew < budget * 3,
        "the daemon grew {} MiB under the flood ({ready})",
        grew / (1024 * 1024)
    );
    assert!(
        ready.contains("\"503\""),
        "bodies past the budget are refused: {ready}"
    );
    drop(flooder.stdin.take());
    flooder.wait().unwrap();
    let busy = d.wait_event(0, "webhook.busy");
    assert_eq!(busy["payload"]["route"], "github", "{busy}");
}

#[test]
fn the_http_gateways_sessions_are_capped_below_the_daemons_and_stdio_still_connects() {
    let d = Daemon::start(API_ANY_PORT);
    let (mut gateway, mcp) = crate::mcp::spawn_http_gateway_in(d.root(), &[]);
    let token = crate::mcp::gateway_token(d.root());
    let rest = mcp.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_once('/').unwrap();
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}})
    .to_string();
    let headers = format!(
        "Authorization: Bearer {token}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
    );
    let cap = npcagent::surfaces::mcp_http::MAX_SESSIONS;
    for i in 0..cap {
        assert_eq!(
            post(host, &format!("/{path}"), &headers, &body),
            200,
            "session {i}"
        );
    }
    assert_eq!(post(host, &format!("/{path}"), &headers, &body), 503);
    // The agents' stdio gateway, a front to the same daemon, still finds room.
    if crate::mcp::python_sdk() {
        let got = crate::mcp::stdio_session_in(d.root(), json!([["list"]]));
        assert!(got[0]["tools"].as_array().is_some_and(|t| !t.is_empty()));
    }
    stop_child(&mut gateway);
}

#[test]
fn a_captured_signed_delivery_never_replays_under_a_new_id_even_after_a_restart() {
    let mut d = Daemon::start_with(
        SIGNED_ROUTE,
        crate::support::DaemonSetup {
            only_env: Some(&[("HOOK_SECRET", "s3cret")]),
            ..Default::default()
        },
    );
    let body = r#"{"ref":"refs/heads/main"}"#;
    let sig = format!(
        "sha256={}",
        hex::encode(npcagent::triggers::webhook::hmac_sha256(
            b"s3cret",
            &[body.as_bytes()]
        ))
    );
    let deliver = |hook: &str, id: &str| {
        post(
            hook,
            "/webhooks/github",
            &format!(
                "Content-Type: application/json\r\nX-Hub-Signature-256: {sig}\r\nX-GitHub-Delivery: {id}\r\n"
            ),
            body,
        )
    };
    let hook = webhook_of(&d);
    assert_eq!(deliver(&hook, "d-1"), 202);
    for id in ["d-2", "d-3", "d-4"] {
        assert_eq!(deliver(&hook, id), 409, "a replay as {id}");
    }
    let after = d.last_event_id();
    d.terminate();
    d.restart_with(crate::support::DaemonSetup {
        only_env: Some(&[("HOOK_SECRET", "s3cret")]),
        ..Default::default()
    });
    let hook = d.wait_event(after, "webhook.listening")["payload"]["addr"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        deliver(&hook, "d-5"),
        409,
        "the replay table outlives the daemon"
    );
    let runs: Vec<Value> =
        serde_json::from_slice(&d.npc_output(&["runs", "--format", "json"]).stdout).unwrap();
    assert_eq!(runs.len(), 1, "one run for one delivery: {runs:?}");
}

/// Every stored event of the repository at `root`, read from its store.
fn stored_events(root: &Path) -> Vec<Value> {
    let Ok(store) = npcagent::store::Store::open_read_only(root.join(".npc/state.db")) else {
        return Vec::new();
    };
    store
        .events_since(0, 100_000)
        .unwrap_or_default()
        .iter()
        .map(|e| serde_json::to_value(e).unwrap())
        .collect()
}

#[test]
fn a_daemon_logging_into_its_own_plugin_package_does_not_reload_itself() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let data = tempfile::tempdir().unwrap();
    let plugin = |description: &str| {
        json!({
            "$schema": npcagent::plugins::PLUGIN_SCHEMA_URL,
            "name": "kit",
            "description": description,
        })
        .to_string()
    };
    std::fs::write(root.join("plugin.json"), plugin("one")).unwrap();
    std::fs::write(
        root.join("npcagent.toml"),
        format!("{API_ANY_PORT}[plugins.kit]\npath = \".\"\n"),
    )
    .unwrap();
    // `npc daemon >> daemon.log` in the package's own folder, logging at info.
    let daemon = std::process::Command::new("sh")
        .arg("-c")
        .arg("exec \"$0\" daemon >> daemon.log 2>&1")
        .arg(crate::support::npc_path())
        .env("NPC_LOG", "info")
        .env("XDG_DATA_HOME", data.path())
        .current_dir(&root)
        .spawn()
        .map(crate::support::Stopped::new)
        .unwrap();
    crate::support::wait_for("the daemon's startup line", || {
        std::fs::read_to_string(root.join("daemon.log"))
            .ok()?
            .contains("npc daemon: startup")
            .then_some(())
    });
    // Two edits of the package's declaration, one after the other's reload:
    // every reload between them would be one the log started.
    let planned = |root: &Path| -> Vec<String> {
        stored_events(root)
            .into_iter()
            .filter(|e| e["kind"] == "reconcile.planned" && e["payload"]["reason"] != "startup")
            .map(|e| e["payload"]["reason"].as_str().unwrap_or("").to_string())
            .collect()
    };
    for (n, description) in ["two", "three"].iter().enumerate() {
        std::fs::write(root.join("plugin.json"), plugin(description)).unwrap();
        crate::support::wait_for("the edit's reload", || {
            (planned(&root).len() > n).then_some(())
        });
    }
    let reasons = planned(&root);
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    assert!(
        reasons
            .iter()
            .all(|r| r.contains("plugin.json") && !r.contains("daemon.log")),
        "{reasons:?}"
    );
    assert!(
        stored_events(&root)
            .iter()
            .all(|e| e["kind"] != "reload.damped"),
        "no loop to damp"
    );
    assert!(daemon.terminate().success());
}

#[test]
fn a_reload_loop_of_any_cause_is_damped_with_one_event() {
    // The loop: a pane rewrites the prompt file the manifest names, again
    // and again, so every reload is followed by another change.
    let d = Daemon::start_with(
        &format!(
            "{API_ANY_PORT}[prompts.p]\nfile = \"p.md\"\n[panes.churn]\ncommand = \"sh\"\nargs = [\"-c\", \"while :; do date +%N > p.md; sleep 0.2; done\"]\n"
        ),
        crate::support::DaemonSetup {
            files: &[("p.md", "hello")],
            ..Default::default()
        },
    );
    let damped = d.wait_event(0, "reload.damped");
    assert_eq!(
        damped["payload"]["reloads"],
        npcagent::runtime::daemon::RELOAD_LOOP_LIMIT
    );
    assert!(
        damped["payload"]["changed"]
            .as_str()
            .unwrap()
            .contains("p.md"),
        "{damped}"
    );
    // Damped, the daemon still answers at once.
    assert!(d.npc_output(&["status"]).status.success());
    let episodes = d
        .events()
        .iter()
        .filter(|e| e["kind"] == "reload.damped")
        .count();
    assert_eq!(episodes, 1, "one event per episode");
}
