//! Notification sinks through the real binary: a daemon whose runs end
//! tells HTTP receivers on 127.0.0.1 (a small server in this file) in the
//! webhook, ntfy and Slack formats; a 500 is retried, N failures give up
//! with `notify.failed`; a receiver that hangs never holds a run or the
//! daemon; `npc notify test NAME` sends a sample without a daemon; hostile
//! payloads (a huge title, control characters, template text) arrive as
//! cleaned, cut data, and a receiver answering 100 MB costs a bounded read.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use serde_json::Value;

use super::support::*;
use super::triggers::{http, webhook_url};

/// How the receiver answers.
#[derive(Debug, Clone, Copy)]
enum Mode {
    /// 200 with a small body.
    Ok,
    /// 500 for the first `n` requests, then 200.
    FailFirst(usize),
    /// Reads the request and never answers (until the client leaves).
    Hang,
    /// 200 with a 100 MB body.
    Huge,
}

/// One request the receiver got.
#[derive(Debug, Clone)]
struct Got {
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Got {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// An HTTP/1.1 receiver on 127.0.0.1 (keep-alive, one thread per
/// connection) that records every request.
struct Receiver {
    url: String,
    got: Arc<Mutex<Vec<Got>>>,
}

impl Receiver {
    fn start(mode: Mode) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let got: Arc<Mutex<Vec<Got>>> = Arc::default();
        let seen = Arc::clone(&got);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let seen = Arc::clone(&seen);
                std::thread::spawn(move || serve(stream, mode, &seen));
            }
        });
        Self { url, got }
    }

    fn got(&self) -> Vec<Got> {
        self.got.lock().unwrap().clone()
    }

    /// A request to `path` came, after a short wait for one.
    fn wait_briefly(&self, path: &str) -> Option<()> {
        poll_within(std::time::Duration::from_secs(2), || {
            self.got().iter().any(|g| g.path == path).then_some(())
        })
    }

    /// Wait until `n` requests came (to `path`, if given).
    fn wait(&self, n: usize, path: &str) -> Vec<Got> {
        wait_for(&format!("{n} requests to `{path}`"), || {
            let got: Vec<Got> = self.got().into_iter().filter(|g| g.path == path).collect();
            (got.len() >= n).then_some(got)
        })
    }
}

fn serve(mut stream: TcpStream, mode: Mode, seen: &Mutex<Vec<Got>>) {
    loop {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            match stream.read(&mut byte) {
                Ok(1) => head.push(byte[0]),
                _ => return,
            }
        }
        let head = String::from_utf8_lossy(&head).into_owned();
        let mut lines = head.split("\r\n");
        let path = lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .unwrap_or("")
            .to_string();
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(": "))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let len: usize = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0u8; len];
        if stream.read_exact(&mut body).is_err() {
            return;
        }
        let n = {
            let mut seen = seen.lock().unwrap();
            seen.push(Got {
                path,
                headers,
                body,
            });
            seen.len()
        };
        let answer = |status: &str| {
            format!("HTTP/1.1 {status}\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok")
        };
        let written = match mode {
            Mode::Ok => stream.write_all(answer("200 OK").as_bytes()),
            Mode::FailFirst(k) if n <= k => {
                stream.write_all(answer("500 Internal Server Error").as_bytes())
            }
            Mode::FailFirst(_) => stream.write_all(answer("200 OK").as_bytes()),
            Mode::Hang => {
                // Held until the client gives up and closes.
                let _ = stream.read(&mut [0u8; 1]);
                return;
            }
            Mode::Huge => {
                let size = 100 * 1024 * 1024;
                let chunk = vec![b'x'; 64 * 1024];
                let mut sent = stream.write_all(
                    format!("HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n\r\n").as_bytes(),
                );
                let mut left = size;
                while sent.is_ok() && left > 0 {
                    sent = stream.write_all(&chunk);
                    left -= chunk.len();
                }
                return;
            }
        };
        if written.is_err() {
            return;
        }
    }
}

/// A manifest with a webhook trigger `gh` whose command action runs
/// `action` (`true` or `false`), and `sinks` appended.
fn manifest(action: &str, sinks: &str) -> String {
    format!(
        r#"version = 1
[daemon]
listen = "127.0.0.1:0"
webhook_listen = "127.0.0.1:0"
[triggers.gh]
kind = "webhook"
route = "gh"
action = {{ command = "{action}" }}
{sinks}"#
    )
}

/// POST a GitHub `issues` delivery with `body` to trigger `gh`; the run id.
fn deliver(d: &Daemon, body: &str) -> String {
    let url = webhook_url(d.root(), "gh");
    let (status, text) = http(
        &url,
        "POST",
        "/webhooks/gh",
        &[
            ("Content-Type", "application/json".into()),
            ("X-GitHub-Event", "issues".into()),
        ],
        body.as_bytes(),
    );
    assert_eq!(status, 202, "{text}");
    serde_json::from_str::<Value>(&text).unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_string()
}

fn events_of(d: &Daemon, kind: &str) -> Vec<Value> {
    d.events()
        .into_iter()
        .filter(|e| e["kind"] == kind)
        .collect()
}

fn wait_events(d: &Daemon, kind: &str, n: usize) -> Vec<Value> {
    wait_for(&format!("{n} `{kind}` events"), || {
        let found = events_of(d, kind);
        (found.len() >= n).then_some(found)
    })
}

fn run_state(d: &Daemon, id: &str) -> Option<String> {
    let out = d.npc_output(&["runs", "--format", "json"]);
    let runs: Value = serde_json::from_slice(&out.stdout).ok()?;
    runs.as_array()?
        .iter()
        .find(|r| r["id"] == id)
        .and_then(|r| r["state"].as_str().map(str::to_string))
}

const ISSUE: &str = r#"{"action": "opened", "issue": {"number": 7, "title": "The build is red"}}"#;

/// A failed run of a GitHub issue reaches a webhook (its `body` template),
/// an ntfy topic and a Slack incoming webhook, each in its own format,
/// with what started the run, why it failed and a link; the token in a
/// header reaches the receiver and never the event log or the daemon's log.
#[test]
fn a_failed_run_reaches_webhook_ntfy_and_slack_in_their_formats() {
    let r = Receiver::start(Mode::Ok);
    let token = "notify-token-5f1c9a7e3b";
    let sinks = format!(
        r#"
[notify.hook]
kind = "webhook"
url = "{u}/hook"
headers = {{ Authorization = "${{NOTIFY_TOKEN:-none}}" }}
body = '{{"what": {{{{ message.title }}}}, "issue": {{{{ message.run.started_by.number }}}}, "text": {{{{ message.text }}}}}}'
on = ["run.failed"]
[notify.phone]
kind = "ntfy"
url = "{u}/topic"
on = ["run.finished"]
[notify.chat]
kind = "slack"
url = "{u}/slack"
on = ["run.failed"]
triggers = ["gh"]
origins = ["webhook"]
[notify.elsewhere]
kind = "slack"
url = "{u}/never"
on = ["run.failed"]
origins = ["cron"]
"#,
        u = r.url
    );
    let d = Daemon::start_with(
        &manifest("false", &sinks),
        DaemonSetup {
            only_env: Some(&[("NOTIFY_TOKEN", &format!("Bearer {token}"))]),
            ..DaemonSetup::default()
        },
    );
    let id = deliver(&d, ISSUE);
    let hook = &r.wait(1, "/hook")[0];
    let body = hook.json();
    assert_eq!(body["issue"], 7, "{body}");
    assert!(body["what"].as_str().unwrap().contains(&id), "{body}");
    let text = body["text"].as_str().unwrap();
    assert!(text.contains("issue #7: The build is red"), "{text}");
    assert!(
        text.contains("trigger `gh`") && text.contains("event `issues`"),
        "{text}"
    );
    assert!(text.contains(&format!("/#run={id}")), "{text}");
    assert_eq!(
        hook.header("authorization"),
        Some(format!("Bearer {token}").as_str())
    );
    assert_eq!(hook.header("content-type"), Some("application/json"));

    let ntfy = &r.wait(1, "/topic")[0];
    assert!(
        ntfy.header("title").unwrap().contains(&id),
        "{:?}",
        ntfy.headers
    );
    assert_eq!(ntfy.header("priority"), Some("default"));
    assert!(ntfy.header("click").unwrap().contains(&id));
    assert!(ntfy.text().contains("The build is red"), "{}", ntfy.text());

    let slack = r.wait(1, "/slack")[0].json();
    let said = slack["text"].as_str().unwrap();
    assert!(
        said.starts_with("*npc: run ") && said.contains("issue #7"),
        "{said}"
    );

    let delivered = wait_events(&d, "notify.delivered", 3);
    let sinks: Vec<&str> = delivered
        .iter()
        .filter_map(|e| e["payload"]["sink"].as_str())
        .collect();
    for sink in ["hook", "phone", "chat"] {
        assert!(sinks.contains(&sink), "{sinks:?}");
    }
    assert!(
        delivered
            .iter()
            .all(|e| e["payload"]["run_id"] == id.as_str())
    );
    // The origin filter kept the cron-only sink quiet.
    assert!(r.got().iter().all(|g| g.path != "/never"));
    let log = d.npc_output(&["events", "--format", "json"]);
    assert!(!String::from_utf8_lossy(&log.stdout).contains(token));
    assert!(!d.log().contains(token));
}

/// A 500 is retried (delivered on the second attempt); a receiver that
/// always fails is given up after `attempts` with `notify.failed`, and the
/// run's own outcome is untouched.
#[test]
fn a_500_is_retried_and_n_failures_give_up_with_an_event() {
    let flaky = Receiver::start(Mode::FailFirst(1));
    let down = Receiver::start(Mode::FailFirst(usize::MAX));
    let sinks = format!(
        r#"
[notify.flaky]
kind = "webhook"
url = "{f}/in"
on = ["run.succeeded"]
[notify.down]
kind = "webhook"
url = "{d}/in"
on = ["run.finished"]
attempts = 3
"#,
        f = flaky.url,
        d = down.url
    );
    let d = Daemon::start(&manifest("true", &sinks));
    let id = deliver(&d, ISSUE);
    let failed = wait_events(&d, "notify.failed", 1);
    let failed = &failed[0]["payload"];
    assert_eq!(failed["sink"], "down");
    assert_eq!(failed["attempts"], 3);
    assert!(
        failed["error"].as_str().unwrap().contains("HTTP 500"),
        "{failed}"
    );
    assert_eq!(down.got().len(), 3);
    let delivered = wait_events(&d, "notify.delivered", 1);
    assert_eq!(delivered[0]["payload"]["sink"], "flaky");
    assert_eq!(delivered[0]["payload"]["attempt"], 2);
    assert_eq!(flaky.got().len(), 2);
    assert_eq!(run_state(&d, &id).as_deref(), Some("succeeded"));
}

/// A receiver that never answers holds no run and not the daemon: runs
/// fired meanwhile all end, and the daemon answers, while the sink's
/// request still waits for its timeout.
#[test]
fn a_hanging_receiver_never_blocks_a_run() {
    let r = Receiver::start(Mode::Hang);
    let sinks = format!(
        r#"
[notify.stuck]
kind = "webhook"
url = "{u}/in"
on = ["run.finished", "run.queued"]
timeout_ms = 60000
attempts = 1
"#,
        u = r.url
    );
    let d = Daemon::start(&manifest("true", &sinks));
    let ids: Vec<String> = (0..5).map(|_| deliver(&d, ISSUE)).collect();
    r.wait(1, "/in");
    for id in &ids {
        wait_for(&format!("run `{id}` to end"), || {
            (run_state(&d, id).as_deref() == Some("succeeded")).then_some(())
        });
    }
    d.npc(&["status"]).success();
    // The first request still hangs: nothing was given up or delivered.
    assert!(events_of(&d, "notify.failed").is_empty());
    assert!(events_of(&d, "notify.delivered").is_empty());
}

/// `npc notify test NAME` sends a sample without a daemon: exit 0 and what
/// the sink answered; a sink that is down is exit 1 with the reason; an
/// unknown name lists the declared ones.
#[test]
fn npc_notify_test_sends_a_sample() {
    let r = Receiver::start(Mode::Ok);
    let closed = free_port();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("npcagent.toml"),
        format!(
            r#"version = 1
[notify.ops]
kind = "webhook"
url = "{u}/ops"
on = ["run.waiting"]
[notify.gone]
kind = "slack"
url = "http://127.0.0.1:{closed}/x"
on = ["run.failed"]
"#,
            u = r.url
        ),
    )
    .unwrap();
    let npc_in = |args: &[&str]| npc().current_dir(dir.path()).args(args).output().unwrap();
    let ok = npc_in(&["notify", "test", "ops"]);
    let out = String::from_utf8_lossy(&ok.stdout);
    assert!(
        ok.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(
        out.contains("sent a sample to `ops` (webhook): HTTP 200"),
        "{out}"
    );
    let sample = r.wait(1, "/ops")[0].json();
    assert_eq!(sample["on"], "run.waiting");
    assert!(
        sample["links"]["approve"]
            .as_str()
            .unwrap()
            .ends_with("/api/v1/runs/run-sample/approve"),
        "{sample}"
    );
    assert_eq!(sample["run"]["started_by"]["number"], 42);
    let down = npc_in(&["notify", "test", "gone"]);
    assert_eq!(down.status.code(), Some(1));
    let err = String::from_utf8_lossy(&down.stderr);
    assert!(
        err.contains("the sample to `gone` was not delivered"),
        "{err}"
    );
    assert!(
        !err.contains(&closed.to_string()),
        "the URL is not quoted: {err}"
    );
    let unknown = npc_in(&["notify", "test", "nope"]);
    assert_eq!(unknown.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("`ops`"));
}

/// What a run's payload carries reaches a sink as cleaned, cut data: a
/// huge title with control characters and template text is one line of
/// bounded length, `{{ … }}` is not evaluated; a receiver that answers
/// 100 MB is read only to a bound and counts as delivered.
#[test]
fn hostile_payloads_and_a_huge_reply_stay_bounded() {
    let r = Receiver::start(Mode::Ok);
    let huge = Receiver::start(Mode::Huge);
    let sinks = format!(
        r#"
[notify.hook]
kind = "webhook"
url = "{u}/hook"
body = '{{"title": {{{{ message.run.started_by.title }}}}, "text": {{{{ message.text }}}}}}'
on = ["run.failed"]
[notify.big]
kind = "webhook"
url = "{h}/big"
on = ["run.failed"]
attempts = 1
"#,
        u = r.url,
        h = huge.url
    );
    let d = Daemon::start(&manifest("false", &sinks));
    let title = format!(
        "{{{{ 7 * 7 }}}}\u{1b}]52;c;AAAA\u{7}\r\nX-Injected: 1\n{}",
        "A".repeat(200_000)
    );
    let body = serde_json::json!({ "issue": { "number": 1, "title": title } }).to_string();
    deliver(&d, &body);
    let got = r.wait(1, "/hook")[0].json();
    let shown = got["title"].as_str().unwrap();
    assert!(
        shown.starts_with("{{ 7 * 7 }}"),
        "not evaluated: {shown:.80}"
    );
    assert!(!shown.contains("49"));
    assert!(!shown.chars().any(char::is_control), "{shown:?}");
    assert!(
        shown.chars().count() <= 301 && shown.ends_with('…'),
        "{}",
        shown.len()
    );
    assert!(got["text"].as_str().unwrap().len() < 10_000);
    let delivered = wait_events(&d, "notify.delivered", 2);
    assert!(
        delivered.iter().any(|e| e["payload"]["sink"] == "big"),
        "{delivered:?}"
    );
    d.npc(&["status"]).success();
}

/// `[notify.NAME]` mistakes are diagnostics with suggestions, all at once.
#[test]
fn notify_mistakes_are_diagnostics_with_suggestions() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("npcagent.toml");
    std::fs::write(
        &path,
        r#"version = 1
[notify.a]
kind = "webhok"
url = "https://example.com/x"
on = ["run.wating"]
[notify.b]
kind = "ntfy"
topic = "alerts"
on = ["run.blocked", "pane.atention"]
origins = ["crom"]
profiles = ["ghost"]
[notify.c]
kind = "webhook"
url = "http://example.com/x"
body = '{"x": {{ run.id }}}'
on = ["run.failed"]
"#,
    )
    .unwrap();
    let out = npc().arg("validate").arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for want in [
        "did you mean `webhook`?",
        "did you mean `run.waiting`?",
        "did you mean `pane.attention`?",
        "did you mean `cron`?",
        "unknown profile `ghost`",
        "plain `http` to `example.com`",
        "reads `run`, which a notification does not have",
    ] {
        assert!(err.contains(want), "{want}:\n{err}");
    }
}

/// A `desktop` sink runs `notify-send` (a stand-in on `PATH` here) with the
/// title and text after `--`, so a title is never an option; without
/// `notify-send` on `PATH` the test says what to install, exit 1.
#[test]
fn a_desktop_sink_runs_notify_send_when_present() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("npcagent.toml"),
        "version = 1\n[notify.desk]\nkind = \"desktop\"\non = [\"run.blocked\"]\n",
    )
    .unwrap();
    let bin = tempfile::tempdir().unwrap();
    let argv = bin.path().join("argv.txt");
    let script = bin.path().join("notify-send");
    std::fs::write(
        &script,
        format!("#!/bin/sh\nprintf '%s\\n' \"$@\" > '{}'\n", argv.display()),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        bin.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let sent = npc()
        .current_dir(dir.path())
        .env("PATH", &path)
        .args(["notify", "test", "desk"])
        .output()
        .unwrap();
    assert!(
        sent.status.success(),
        "{}",
        String::from_utf8_lossy(&sent.stderr)
    );
    let args = std::fs::read_to_string(&argv).unwrap();
    let mut lines = args.lines();
    assert_eq!(lines.next(), Some("--app-name=npc"));
    assert_eq!(lines.next(), Some("--"));
    assert_eq!(lines.next(), Some("npc: run run-sample was blocked"));
    let empty = tempfile::tempdir().unwrap();
    let missing = npc()
        .current_dir(dir.path())
        .env("PATH", empty.path())
        .args(["notify", "test", "desk"])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(1));
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(err.contains("`notify-send` is not installed"), "{err}");
}

/// Sinks follow the manifest while the daemon runs: after an edit points
/// the sink elsewhere, runs reach the new receiver.
#[test]
fn sinks_follow_the_manifest_on_reload() {
    let old = Receiver::start(Mode::Ok);
    let new = Receiver::start(Mode::Ok);
    let sink = |url: &str| {
        format!("\n[notify.ops]\nkind = \"slack\"\nurl = \"{url}/in\"\non = [\"run.failed\"]\n")
    };
    let d = Daemon::start(&manifest("false", &sink(&old.url)));
    deliver(&d, ISSUE);
    old.wait(1, "/in");
    d.write_manifest(&manifest("false", &sink(&new.url)));
    // Runs fired until one reaches the new receiver (the reload is applied
    // in between; a run before it still goes to the old one).
    wait_for("a run's message at the new receiver", || {
        deliver(&d, ISSUE);
        new.wait_briefly("/in")
    });
}
