//! Triggers through the real `npc daemon`: cron (with the clock seam
//! `NPC_CLOCK_OFFSET_SECS`), webhooks on a real loopback socket, file
//! watches on real files, the durable run queue and its executor, and the
//! CLI (`npc triggers`, `npc trigger fire`, `npc runs`, `npc runs show`).
//! The reliability tests SIGKILL the daemon and count runs.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read as _, Write as _};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{Daemon, DaemonSetup, npc, npc_path, repo_root, wait_for};

/// A command action appending the payload (one JSON line) to `file`.
fn append_payload(file: &str) -> String {
    format!(
        r#"{{ command = "sh", args = ["-c", "printf '%s %s\\n' \"$NPC_RUN_ID\" \"$NPC_TRIGGER_PAYLOAD\" >> {file}"] }}"#
    )
}

/// `(run id, payload)` of each complete line `append_payload` wrote.
fn lines(root: &Path, file: &str) -> Vec<(String, Value)> {
    std::fs::read_to_string(root.join(file))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (id, json) = l.split_once(' ')?;
            Some((id.to_string(), serde_json::from_str(json).ok()?))
        })
        .collect()
}

pub(crate) fn json_of(out: &std::process::Output) -> Value {
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn runs(root: &Path) -> Vec<Value> {
    let out = npc()
        .current_dir(root)
        .args(["runs", "--format", "json", "--limit", "1000"])
        .output()
        .unwrap();
    json_of(&out).as_array().unwrap().clone()
}

fn run_state(root: &Path, id: &str) -> Option<String> {
    runs(root)
        .into_iter()
        .find(|r| r["id"] == id)
        .and_then(|r| r["state"].as_str().map(str::to_string))
}

fn triggers(root: &Path) -> Vec<Value> {
    let out = npc()
        .current_dir(root)
        .args(["triggers", "--format", "json"])
        .output()
        .unwrap();
    json_of(&out)["triggers"].as_array().unwrap().clone()
}

fn fire(root: &Path, name: &str, payload: &str) -> Value {
    let out = npc()
        .current_dir(root)
        .args([
            "trigger",
            "fire",
            name,
            "--payload",
            payload,
            "--format",
            "json",
        ])
        .output()
        .unwrap();
    json_of(&out)
}

fn trigger_state(root: &Path, name: &str) -> BTreeMap<String, Value> {
    npcagent::store::Store::open_read_only(root.join(".npc/state.db"))
        .unwrap()
        .trigger_state(name)
        .unwrap()
}

#[test]
fn cron_fires_through_the_queue_and_runs_show_each_run() {
    let d = Daemon::start(&format!(
        "version = 1\n[triggers.tick]\nkind = \"cron\"\nschedule = \"1s\"\naction = {}\n",
        append_payload("fired.log")
    ));
    let fired = wait_for("two cron runs", || {
        let l = lines(d.root(), "fired.log");
        (l.len() >= 2).then_some(l)
    });
    assert_eq!(fired[0].1["kind"], "cron");
    assert_eq!(fired[0].1["trigger"], "tick");
    let listed = wait_for("the runs listed as succeeded", || {
        let r = runs(d.root());
        let done: Vec<Value> = r
            .into_iter()
            .filter(|r| r["state"] == "succeeded" && r["origin"] == "cron")
            .collect();
        (done.len() >= 2).then_some(done)
    });
    let id = listed[0]["id"].as_str().unwrap();
    let shown = json_of(
        &npc()
            .current_dir(d.root())
            .args(["runs", "show", id, "--format", "json"])
            .output()
            .unwrap(),
    );
    let kinds: Vec<&str> = shown["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["run.queued", "run.started", "run.finished"],
        "{shown}"
    );
    assert!(
        shown["events"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["payload"]["run_id"] == id)
    );
    let t = &triggers(d.root())[0];
    assert_eq!(t["armed"], true);
    assert_eq!(t["next_fire_times"].as_array().unwrap().len(), 5, "{t}");
    // `npc status` says what is true of a trigger the daemon runs.
    let status = d.status();
    let row = status.iter().find(|c| c["id"] == "trigger.tick").unwrap();
    assert_eq!(row["state"], "armed");
    // An unknown run is an error that says where to look.
    let out = d.npc_output(&["runs", "show", "run-nope"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("npc runs"));
}

#[test]
fn trigger_fire_goes_through_the_same_queue_with_its_payload() {
    let manifest = format!(
        "version = 1\n[triggers.deploy]\nkind = \"cron\"\nschedule = \"@yearly\"\naction = {}\n",
        append_payload("fired.log")
    );
    // Without a daemon nothing can run it: a clear error.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("npcagent.toml"), &manifest).unwrap();
    let out = npc()
        .current_dir(dir.path())
        .args(["trigger", "fire", "deploy"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("start `npc daemon`"));
    let d = Daemon::start_in(dir.path());
    let answer = fire(d.root(), "deploy", r#"{"ref": "main"}"#);
    let id = answer["run_id"].as_str().unwrap().to_string();
    assert_eq!(answer["outcome"], "queued");
    let fired = wait_for("the manual run", || {
        lines(d.root(), "fired.log")
            .into_iter()
            .find(|(r, _)| *r == id)
    });
    assert_eq!(fired.1["kind"], "manual");
    assert_eq!(fired.1["payload"]["ref"], "main");
    wait_for("the run to succeed", || {
        (run_state(d.root(), &id).as_deref() == Some("succeeded")).then_some(())
    });
    let out = d.npc_output(&["trigger", "fire", "nope"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no trigger `nope`"));
    let out = d.npc_output(&["trigger", "fire", "deploy", "--payload", "{bad"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not JSON"));
}

const OVERLAP: &str = r#"version = 1
[triggers.skip]
kind = "cron"
schedule = "@yearly"
overlap = "skip"
action = { command = "sh", args = ["-c", "echo start $NPC_RUN_ID >> skip.log; while [ ! -e release-skip ]; do sleep 0.02; done"] }
[triggers.queue]
kind = "cron"
schedule = "@yearly"
overlap = "queue"
action = { command = "sh", args = ["-c", "echo start $NPC_RUN_ID >> queue.log; while [ ! -e release-queue ]; do sleep 0.02; done"] }
[triggers.replace]
kind = "cron"
schedule = "@yearly"
overlap = "replace"
action = { command = "sh", args = ["-c", "echo start $NPC_RUN_ID >> replace.log; while [ ! -e release-replace ]; do sleep 0.02; done"] }
"#;

fn started(root: &Path, log: &str, id: &str) -> bool {
    std::fs::read_to_string(root.join(log))
        .unwrap_or_default()
        .lines()
        .any(|l| l == format!("start {id}"))
}

#[test]
fn overlap_policies_skip_queue_and_replace() {
    let d = Daemon::start(OVERLAP);
    let root = d.root();
    let first = |name: &str| {
        let id = fire(root, name, "{}")["run_id"]
            .as_str()
            .unwrap()
            .to_string();
        wait_for(&format!("`{name}`'s first run to start"), || {
            started(root, &format!("{name}.log"), &id).then_some(())
        });
        id
    };
    // skip: the second firing is recorded as skipped, never run.
    let a = first("skip");
    let b = fire(root, "skip", "{}");
    assert_eq!(b["outcome"], "skipped");
    assert_eq!(
        run_state(root, b["run_id"].as_str().unwrap()).as_deref(),
        Some("skipped")
    );
    // queue: the second waits for the first, then runs.
    let qa = first("queue");
    let qb = fire(root, "queue", "{}")["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(run_state(root, &qb).as_deref(), Some("queued"));
    std::fs::write(root.join("release-queue"), "").unwrap();
    wait_for("the queued run to run after the first", || {
        (run_state(root, &qb).as_deref() == Some("succeeded")).then_some(())
    });
    assert_eq!(run_state(root, &qa).as_deref(), Some("succeeded"));
    // replace: the first is cancelled, the second runs.
    let ra = first("replace");
    let rb = fire(root, "replace", "{}")["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    wait_for("the replacing run to start", || {
        started(root, "replace.log", &rb).then_some(())
    });
    wait_for("the replaced run to be cancelled", || {
        (run_state(root, &ra).as_deref() == Some("cancelled")).then_some(())
    });
    let row = runs(root).into_iter().find(|r| r["id"] == ra).unwrap();
    assert!(row["detail"].as_str().unwrap().contains(&rb), "{row}");
    std::fs::write(root.join("release-skip"), "").unwrap();
    std::fs::write(root.join("release-replace"), "").unwrap();
    wait_for("the first skip run to end", || {
        (run_state(root, &a).as_deref() == Some("succeeded")).then_some(())
    });
}

fn missed_manifest(policy: &str) -> String {
    format!(
        "version = 1\n[triggers.hourly]\nkind = \"cron\"\nschedule = \"1h\"\nmissed = \"{policy}\"\naction = {}\n",
        append_payload("fired.log")
    )
}

/// Start a daemon on `root` whose trigger clock is `offset` seconds ahead.
fn daemon_ahead(root: &Path, offset: &str) -> Daemon {
    Daemon::start_in_with(
        root,
        DaemonSetup {
            only_env: Some(&[("NPC_CLOCK_OFFSET_SECS", offset)]),
            ..DaemonSetup::default()
        },
    )
}

#[test]
fn a_missed_fire_runs_once_on_start_or_is_skipped() {
    for policy in ["run_once", "skip"] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("npcagent.toml"), missed_manifest(policy)).unwrap();
        let mut d = Daemon::start_in(dir.path());
        wait_for("the stored next fire time", || {
            trigger_state(dir.path(), "hourly")
                .contains_key("cron")
                .then_some(())
        });
        d.terminate();
        // Three hours later: three fires were missed.
        let d = daemon_ahead(dir.path(), "10800");
        if policy == "run_once" {
            let fired = wait_for("the catch-up run", || {
                let l = lines(d.root(), "fired.log");
                (!l.is_empty()).then_some(l)
            });
            assert_eq!(fired.len(), 1, "{fired:?}");
            assert_eq!(fired[0].1["missed"], true);
        } else {
            assert!(lines(d.root(), "fired.log").is_empty());
            assert!(runs(d.root()).is_empty());
        }
        // Either way the next fire is an hour after the (shifted) start.
        let next = triggers(d.root())[0]["next_fire_times"][0]
            .as_str()
            .unwrap()
            .to_string();
        let next = chrono::DateTime::parse_from_rfc3339(&next).unwrap();
        assert!(
            next > chrono::Utc::now() + chrono::Duration::seconds(10800),
            "{next}"
        );
    }
}

#[test]
fn editing_a_schedule_keeps_the_trigger_and_removing_it_forgets_its_state() {
    let manifest = |schedule: &str| {
        format!(
            "version = 1\n[triggers.nightly]\nkind = \"cron\"\nschedule = \"{schedule}\"\ntimezone = \"Europe/Berlin\"\naction = {{ command = \"true\" }}\n"
        )
    };
    let d = Daemon::start(&manifest("0 3 * * *"));
    wait_for("the stored state", || {
        (trigger_state(d.root(), "nightly").get("cron")?["schedule"] == "0 3 * * *").then_some(())
    });
    let after = d.last_event_id();
    d.write_manifest(&manifest("0 4 * * *"));
    let updated = d.wait_event(after, "component.updated");
    assert_eq!(updated["component"], "trigger.nightly");
    wait_for("the new schedule's state", || {
        (trigger_state(d.root(), "nightly")["cron"]["schedule"] == "0 4 * * *").then_some(())
    });
    let next = triggers(d.root())[0]["next_fire_times"][0]
        .as_str()
        .unwrap()
        .to_string();
    // 04:00 in Berlin is 02:00 or 03:00 UTC.
    assert!(
        next.contains("T02:00:00") || next.contains("T03:00:00"),
        "{next}"
    );
    let after = d.last_event_id();
    d.write_manifest("version = 1\n");
    d.wait_event(after, "component.removed");
    wait_for("the removed trigger's state to go", || {
        trigger_state(d.root(), "nightly").is_empty().then_some(())
    });
}

#[test]
fn validate_names_both_readings_of_a_star_step_day_field() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("npcagent.toml"),
        "version = 1\n[triggers.odd]\nkind = \"cron\"\nschedule = \"0 0 */2 * 1\"\naction = { command = \"true\" }\n",
    )
    .unwrap();
    let out = npc()
        .current_dir(dir.path())
        .arg("validate")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("cron dialects read `0 0 */2 * 1` differently"),
        "{text}"
    );
    assert!(text.contains("BOTH") && text.contains("EITHER"), "{text}");
}

// ----- webhooks ---------------------------------------------------------

/// One HTTP/1.1 request on a fresh connection: the status and body.
pub(crate) fn http(
    url: &str,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
    body: &[u8],
) -> (u16, String) {
    let addr = url
        .strip_prefix("http://")
        .and_then(|r| r.split('/').next())
        .unwrap();
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    // A refused request may close before reading all of a large body.
    let _ = stream.write_all(body);
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP status in {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

pub(crate) fn webhook_url(root: &Path, name: &str) -> String {
    wait_for("the webhook listener's address", || {
        triggers(root)
            .into_iter()
            .find(|t| t["name"] == name)
            .and_then(|t| t["url"].as_str().map(str::to_string))
    })
}

pub(crate) fn sign(secret: &[u8], body: &[u8]) -> String {
    format!(
        "sha256={}",
        hex::encode(npcagent::triggers::webhook::hmac_sha256(secret, &[body]))
    )
}

const WEBHOOK: &str = r#"version = 1
[daemon]
webhook_listen = "127.0.0.1:0"
[triggers.gh]
kind = "webhook"
route = "github"
secret_env = "HOOK_SECRET"
events = ["push"]
max_body_bytes = 1024
rate_limit_per_minute = 5
action = { command = "true" }
"#;

#[test]
fn every_gauntlet_rejection_has_its_status_and_event_and_enqueues_nothing() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("npcagent.toml"), WEBHOOK).unwrap();
    let d = Daemon::start_in_with(
        dir.path(),
        DaemonSetup {
            only_env: Some(&[("HOOK_SECRET", "s3cret")]),
            ..DaemonSetup::default()
        },
    );
    let url = webhook_url(d.root(), "gh");
    let path = "/webhooks/github";
    let json = ("Content-Type", "application/json".to_string());
    let push = ("X-GitHub-Event", "push".to_string());
    let delivery = |id: &str| ("X-GitHub-Delivery", id.to_string());
    let body = br#"{"ref":"refs/heads/main"}"#;
    let signed = |b: &[u8]| ("X-Hub-Signature-256", sign(b"s3cret", b));
    let after = d.last_event_id();
    let cases: Vec<(u16, &str, (u16, String))> = vec![
        (
            405,
            "webhook.method_not_allowed",
            http(&url, "GET", path, &[], b""),
        ),
        (
            404,
            "webhook.unknown_route",
            http(
                &url,
                "POST",
                "/webhooks/nope",
                std::slice::from_ref(&json),
                body,
            ),
        ),
        (
            413,
            "webhook.too_large",
            http(
                &url,
                "POST",
                path,
                std::slice::from_ref(&json),
                &[b'x'; 4096],
            ),
        ),
        (
            415,
            "webhook.unsupported_media_type",
            http(
                &url,
                "POST",
                path,
                &[("Content-Type", "text/plain".into())],
                body,
            ),
        ),
        (
            401,
            "webhook.bad_signature",
            http(&url, "POST", path, &[json.clone(), push.clone()], body),
        ),
        (
            401,
            "webhook.bad_signature",
            http(
                &url,
                "POST",
                path,
                &[json.clone(), push.clone(), signed(b"other")],
                body,
            ),
        ),
    ];
    for (want, kind, (status, text)) in &cases {
        assert_eq!(status, want, "{kind}: {text}");
        assert!(text.contains(kind), "{text}");
    }
    assert!(runs(d.root()).is_empty(), "a rejection enqueued a run");
    // Accepted: 202 with the run id, which `npc runs` knows.
    let (status, text) = http(
        &url,
        "POST",
        path,
        &[json.clone(), push.clone(), signed(body), delivery("d1")],
        body,
    );
    assert_eq!(status, 202, "{text}");
    let accepted: Value = serde_json::from_str(&text).unwrap();
    let id = accepted["run_id"].as_str().unwrap().to_string();
    assert!(
        runs(d.root())
            .iter()
            .any(|r| r["id"] == id && r["origin"] == "webhook")
    );
    // Replay, then the rest of the gauntlet in order (each delivery its
    // own body: a signed body is a replay whatever id comes with it).
    let bad_json = b"{not json";
    let issue = br#"{"issue":1}"#;
    let more: Vec<(u16, &str, (u16, String))> = vec![
        (
            409,
            "webhook.replayed",
            http(
                &url,
                "POST",
                path,
                &[json.clone(), push.clone(), signed(body), delivery("d1")],
                body,
            ),
        ),
        (
            400,
            "webhook.bad_json",
            http(
                &url,
                "POST",
                path,
                &[json.clone(), push.clone(), signed(bad_json), delivery("d2")],
                bad_json,
            ),
        ),
        (
            200,
            "webhook.ignored",
            http(
                &url,
                "POST",
                path,
                &[
                    json.clone(),
                    ("X-GitHub-Event", "issues".into()),
                    signed(issue),
                    delivery("d3"),
                ],
                issue,
            ),
        ),
    ];
    for (want, kind, (status, text)) in &more {
        assert_eq!(status, want, "{kind}: {text}");
        assert!(text.contains(kind), "{text}");
    }
    // Five tokens a minute: d1, d2, d3 took three; two more pass, then 429.
    let own = |id: &str| format!("{{\"ref\":\"{id}\"}}").into_bytes();
    for id in ["d4", "d5"] {
        let own = own(id);
        let (status, text) = http(
            &url,
            "POST",
            path,
            &[json.clone(), push.clone(), signed(&own), delivery(id)],
            &own,
        );
        assert_eq!(status, 202, "{text}");
    }
    let d6 = own("d6");
    let (status, text) = http(
        &url,
        "POST",
        path,
        &[json.clone(), push.clone(), signed(&d6), delivery("d6")],
        &d6,
    );
    assert_eq!(status, 429, "{text}");
    assert!(text.contains("webhook.rate_limited"));
    // A replay still answers 409 before the rate limit.
    let (status, _) = http(
        &url,
        "POST",
        path,
        &[json.clone(), push.clone(), signed(body), delivery("d1")],
        body,
    );
    assert_eq!(status, 409);
    let webhook_runs: Vec<Value> = runs(d.root())
        .into_iter()
        .filter(|r| r["origin"] == "webhook")
        .collect();
    assert_eq!(webhook_runs.len(), 3, "{webhook_runs:?}");
    let kinds: BTreeSet<String> = d
        .events_after(after)
        .iter()
        .filter_map(|e| {
            e["kind"]
                .as_str()
                .filter(|k| k.starts_with("webhook."))
                .map(str::to_string)
        })
        .collect();
    for kind in [
        "webhook.method_not_allowed",
        "webhook.unknown_route",
        "webhook.too_large",
        "webhook.unsupported_media_type",
        "webhook.bad_signature",
        "webhook.replayed",
        "webhook.bad_json",
        "webhook.ignored",
        "webhook.rate_limited",
    ] {
        assert!(kinds.contains(kind), "no `{kind}` event in {kinds:?}");
    }
    // The secret never reaches an event.
    assert!(!d.events().iter().any(|e| e.to_string().contains("s3cret")));
}

/// A webhook whose secret variable is not set when the daemon starts: the
/// failure names the variable and says what works (a restart with it set;
/// the running daemon's environment does not change), and `npc status`
/// keeps the trigger, failed with its reason, until a restart fixes it.
#[test]
fn a_route_whose_secret_is_unset_fails_to_start_and_says_which_variable() {
    let mut d = Daemon::start_with(
        WEBHOOK,
        DaemonSetup {
            only_env: Some(&[]),
            ..DaemonSetup::default()
        },
    );
    let failed = d
        .events()
        .into_iter()
        .find(|e| e["kind"] == "component.start_failed" && e["component"] == "trigger.gh")
        .expect("a start failure");
    let error = failed["payload"]["error"].as_str().unwrap();
    assert!(error.contains("`HOOK_SECRET`"), "{failed}");
    assert!(error.contains("restart the daemon"), "{failed}");
    let shown = d
        .status()
        .into_iter()
        .find(|c| c["id"] == "trigger.gh")
        .expect("the failed trigger stays in `npc status`");
    assert_eq!(shown["state"], "failed", "{shown}");
    assert_eq!(shown["error"], error, "{shown}");
    let human = crate::support::stdout_of(&d.npc(&["status"]).success());
    assert!(
        human.contains("trigger.gh") && human.contains("`HOOK_SECRET`"),
        "{human}"
    );
    // What the error says works: a restart with the variable set.
    d.terminate();
    d.restart_with(DaemonSetup {
        only_env: Some(&[("HOOK_SECRET", "s3cret")]),
        ..DaemonSetup::default()
    });
    let shown = d
        .status()
        .into_iter()
        .find(|c| c["id"] == "trigger.gh")
        .expect("the trigger after the restart");
    assert_eq!(shown["state"], "armed", "{shown}");
    assert!(shown.get("error").is_none(), "{shown}");
}

#[test]
fn a_202_is_committed_before_it_is_sent_even_across_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("npcagent.toml"),
        "version = 1\n[daemon]\nwebhook_listen = \"127.0.0.1:0\"\n[triggers.in]\nkind = \"webhook\"\nroute = \"in\"\naction = { command = \"true\" }\n",
    )
    .unwrap();
    let mut accepted = Vec::new();
    for round in 0..8 {
        // A child forked at the moment of the kill may hold the lock's open
        // file for an instant; the next daemon starts once it is free.
        wait_for("the killed daemon's lock to be free", || {
            npcagent::runtime::lock::holder(&dir.path().join(".npc"))
                .is_none()
                .then_some(())
        });
        let d = Daemon::start_in(dir.path());
        let url = webhook_url(d.root(), "in");
        let (status, text) = http(
            &url,
            "POST",
            "/webhooks/in",
            &[("Content-Type", "application/json".into())],
            format!("{{\"round\": {round}}}").as_bytes(),
        );
        assert_eq!(status, 202, "{text}");
        // Killed at once: the run was committed before the answer.
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(d.pid() as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        accepted.push(v["run_id"].as_str().unwrap().to_string());
        drop(d);
    }
    let listed: BTreeSet<String> = runs(dir.path())
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_string())
        .collect();
    for id in &accepted {
        assert!(listed.contains(id), "accepted run `{id}` was lost");
    }
    // A daemon on the repository carries out what was still queued: each
    // accepted run ends as run or cut off by a kill, never cancelled.
    wait_for("the killed daemon's lock to be free", || {
        npcagent::runtime::lock::holder(&dir.path().join(".npc"))
            .is_none()
            .then_some(())
    });
    let _d = Daemon::start_in(dir.path());
    for id in &accepted {
        let state = wait_for(&format!("run `{id}` to end"), || {
            run_state(dir.path(), id).filter(|s| s != "queued" && s != "running")
        });
        assert!(
            state == "succeeded" || state == "interrupted",
            "run `{id}` ended `{state}`"
        );
    }
}

/// A profile action renders its prompt with the payload, looked up
/// leniently: a missing key is empty.
#[test]
fn a_webhook_profile_run_renders_the_payload_leniently() {
    let dir = tempfile::tempdir().unwrap();
    let argv_file = dir.path().join("argv.json");
    let agent = repo_root().join("fixtures/clis/fake-agent.py");
    let fixture = repo_root().join("fixtures/clis/claude_code/2.1.197/tool_call.jsonl");
    let s = |v: &str| Value::String(v.to_string()).to_string();
    std::fs::write(
        dir.path().join("npcagent.toml"),
        format!(
            r#"version = 1
[daemon]
webhook_listen = "127.0.0.1:0"
[providers.fake]
kind = "claude_code"
command = {agent}
args = ["--provider", "claude_code", "--fixture", {fixture}]
env = {{ FAKE_AGENT_ARGV_FILE = {argv} }}
[prompts.review]
template = "Review {{{{ payload.pull_request.title }}}} by [{{{{ trigger.body.missing.user }}}}] via {{{{ run.trigger }}}}"
[profiles.reviewer]
provider = "fake"
description = "reviews pull requests"
[triggers.pr]
kind = "webhook"
route = "pr"
action = {{ profile = "reviewer", prompt = "review" }}
"#,
            agent = s(&agent.display().to_string()),
            fixture = s(&fixture.display().to_string()),
            argv = s(&argv_file.display().to_string()),
        ),
    )
    .unwrap();
    // `payload` is the one name; the old `trigger.body` works, with a warning.
    let validated = crate::support::npc()
        .current_dir(dir.path())
        .arg("validate")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&validated.stderr).into_owned()
        + &String::from_utf8_lossy(&validated.stdout);
    assert!(validated.status.success(), "{said}");
    assert!(
        said.contains("the old name of the payload")
            && said.contains("write `payload.missing.user` instead")
            && !said.contains("`payload.pull_request.title`"),
        "{said}"
    );
    let d = Daemon::start_in(dir.path());
    let url = webhook_url(d.root(), "pr");
    let (status, text) = http(
        &url,
        "POST",
        "/webhooks/pr",
        &[("Content-Type", "application/json".into())],
        br#"{"pull_request": {"title": "Fix the bug"}}"#,
    );
    assert_eq!(status, 202, "{text}");
    let id = serde_json::from_str::<Value>(&text).unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    wait_for("the profile run to succeed", || {
        (run_state(d.root(), &id).as_deref() == Some("succeeded")).then_some(())
    });
    let argv: Vec<String> =
        serde_json::from_str(&std::fs::read_to_string(&argv_file).unwrap()).unwrap();
    assert!(
        argv.contains(&"Review Fix the bug by [] via pr".to_string()),
        "{argv:?}"
    );
    // The agent's events carry the queue's run id.
    let shown = json_of(&d.npc_output(&["runs", "show", &id, "--format", "json"]));
    let kinds: Vec<&str> = shown["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["kind"].as_str())
        .collect();
    assert!(
        kinds.contains(&"run.started") && kinds.contains(&"run.finished"),
        "{kinds:?}"
    );
}

// ----- file_watch ---------------------------------------------------------

fn watch_manifest(debounce: u64) -> String {
    format!(
        "version = 1\n[triggers.docs]\nkind = \"file_watch\"\npaths = [\"**/*.md\"]\nignore = [\"drafts/**\"]\ndebounce_ms = {debounce}\naction = {}\n",
        append_payload("fired.log")
    )
}

fn watch_runs(root: &Path, path: &str) -> Vec<Value> {
    lines(root, "fired.log")
        .into_iter()
        .map(|(_, p)| p)
        .filter(|p| p["path"] == path)
        .collect()
}

/// Write `name` and wait for its run: every window that opened before it
/// has closed and fired by then.
fn sentinel(root: &Path, name: &str) {
    std::fs::write(root.join(name), "x").unwrap();
    wait_for(&format!("the run of `{name}`"), || {
        (!watch_runs(root, name).is_empty()).then_some(())
    });
}

#[test]
fn an_editor_style_save_is_one_run_and_ignored_paths_are_never_runs() {
    let d = Daemon::start_with(
        &watch_manifest(300),
        DaemonSetup {
            files: &[
                ("docs/a.md", "one\n"),
                (".git/HEAD", "ref: refs/heads/main\n"),
            ],
            ..DaemonSetup::default()
        },
    );
    let root = d.root();
    // vim-style: swap file, backup rename, write the new file.
    std::fs::write(root.join("docs/.a.md.swp"), "swap").unwrap();
    std::fs::write(root.join("docs/4913"), "").unwrap();
    std::fs::remove_file(root.join("docs/4913")).unwrap();
    std::fs::rename(root.join("docs/a.md"), root.join("docs/a.md~")).unwrap();
    std::fs::write(root.join("docs/a.md.tmp"), "two\n").unwrap();
    std::fs::rename(root.join("docs/a.md.tmp"), root.join("docs/a.md")).unwrap();
    std::fs::remove_file(root.join("docs/a.md~")).unwrap();
    std::fs::remove_file(root.join("docs/.a.md.swp")).unwrap();
    // Ignored: git's directory and npc's state directory.
    std::fs::write(root.join(".git/notes.md"), "x").unwrap();
    std::fs::write(root.join(".npc/notes.md"), "x").unwrap();
    // Ignored by the trigger's own `ignore`.
    std::fs::create_dir_all(root.join("drafts")).unwrap();
    std::fs::write(root.join("drafts/wip.md"), "x").unwrap();
    sentinel(root, "docs/zz.md");
    assert!(watch_runs(root, "drafts/wip.md").is_empty());
    let saved = watch_runs(root, "docs/a.md");
    assert_eq!(saved.len(), 1, "{saved:?}");
    assert_eq!(saved[0]["event"], "modified");
    assert!(watch_runs(root, ".git/notes.md").is_empty());
    assert!(watch_runs(root, ".npc/notes.md").is_empty());
    // Directories made after start are watched, however fast they nest,
    // and each of their files is created once.
    let mut dir = String::from("docs/new");
    for level in 0..8 {
        std::fs::create_dir_all(root.join(&dir)).unwrap();
        std::fs::write(root.join(format!("{dir}/f{level}.md")), "f").unwrap();
        dir.push_str("/deeper");
    }
    std::fs::create_dir_all(root.join("docs/new/deeper")).unwrap();
    std::fs::write(root.join("docs/new/deeper/c.md"), "c").unwrap();
    let created = wait_for("the new directory's file", || {
        watch_runs(root, "docs/new/deeper/c.md").into_iter().next()
    });
    assert_eq!(created["event"], "created");
    let mut dir = String::from("docs/new");
    for level in 0..8 {
        let path = format!("{dir}/f{level}.md");
        let runs = wait_for("a nested directory's file", || {
            Some(watch_runs(root, &path)).filter(|r| !r.is_empty())
        });
        assert_eq!(runs.len(), 1, "{path}: {runs:?}");
        assert_eq!(runs[0]["event"], "created", "{path}");
        dir.push_str("/deeper");
    }
    std::fs::remove_file(root.join("docs/new/deeper/c.md")).unwrap();
    wait_for("the deletion", || {
        watch_runs(root, "docs/new/deeper/c.md")
            .into_iter()
            .find(|p| p["event"] == "deleted")
    });
}

#[test]
fn a_burst_of_writes_is_one_run_per_debounce_window() {
    let debounce = 400;
    let d = Daemon::start_with(
        &watch_manifest(debounce),
        DaemonSetup {
            files: &[("b.md", "0")],
            ..DaemonSetup::default()
        },
    );
    let root = d.root();
    let started = Instant::now();
    for i in 0..1000 {
        std::fs::write(root.join("b.md"), i.to_string()).unwrap();
    }
    let burst = started.elapsed();
    sentinel(root, "zz.md");
    // Every window of `b.md` opened after the burst began and closed before
    // the sentinel fired, one after another: that bounds their number
    // (however late notify delivered the events).
    let span = started.elapsed();
    let fired = watch_runs(root, "b.md");
    let windows = span.as_millis() as usize / debounce as usize + 1;
    assert!(
        !fired.is_empty() && fired.len() <= windows,
        "{} runs for a burst of {burst:?} ({windows} windows in {span:?})",
        fired.len()
    );
}

// ----- reliability -----------------------------------------------------------

/// A tiny deterministic generator for kill points.
fn next_random(state: &mut u64) -> u64 {
    *state = state
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *state >> 33
}

#[test]
fn sigkill_at_random_points_never_duplicates_a_cron_run() {
    const ROUNDS: usize = 150;
    const BUDGET: Duration = Duration::from_secs(120);
    let dir = tempfile::tempdir().unwrap();
    let manifest = format!(
        "version = 1\n[triggers.a]\nkind = \"cron\"\nschedule = \"1s\"\nmissed = \"run_once\"\naction = {}\n[triggers.b]\nkind = \"cron\"\nschedule = \"1s\"\nmissed = \"run_once\"\naction = {}\n",
        append_payload("fired.log"),
        append_payload("fired.log")
    );
    std::fs::write(dir.path().join("npcagent.toml"), manifest).unwrap();
    let started = Instant::now();
    let mut seed = 0x5eed_u64;
    let mut rounds = 0;
    while rounds < ROUNDS && started.elapsed() < BUDGET {
        rounds += 1;
        let mut child = std::process::Command::new(npc_path())
            .arg("daemon")
            .current_dir(dir.path())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // A random kill point: during startup, mid-fire, mid-run.
        std::thread::sleep(Duration::from_millis(next_random(&mut seed) % 600));
        let _ = child.kill();
        let _ = child.wait();
    }
    // One clean run at the end lets interrupted runs be marked.
    let d = Daemon::start_in(dir.path());
    let fired = lines(d.root(), "fired.log");
    assert!(
        fired.len() >= 10,
        "only {} runs in {rounds} rounds",
        fired.len()
    );
    let mut ids = BTreeSet::new();
    let mut fires = BTreeSet::new();
    for (id, payload) in &fired {
        assert!(ids.insert(id.clone()), "run `{id}` ran twice");
        let key = (
            payload["trigger"].to_string(),
            payload["scheduled_at"].to_string(),
        );
        assert!(fires.insert(key.clone()), "fire {key:?} ran twice");
    }
    drop(d);
}

#[test]
fn routes_change_live_without_dropping_the_listener() {
    let route = |name: &str| {
        format!(
            "[triggers.{name}]\nkind = \"webhook\"\nroute = \"{name}\"\naction = {{ command = \"true\" }}\n"
        )
    };
    let head = "version = 1\n[daemon]\nwebhook_listen = \"127.0.0.1:0\"\n";
    let d = Daemon::start(&format!("{head}{}", route("one")));
    let url = webhook_url(d.root(), "one");
    let json = [("Content-Type", "application/json".to_string())];
    assert_eq!(http(&url, "POST", "/webhooks/one", &json, b"{}").0, 202);
    let after = d.last_event_id();
    d.write_manifest(&format!("{head}{}", route("two")));
    d.wait_event(after, "component.removed");
    wait_for("the new route", || {
        (http(&url, "POST", "/webhooks/two", &json, b"{}").0 == 202).then_some(())
    });
    assert_eq!(http(&url, "POST", "/webhooks/one", &json, b"{}").0, 404);
    assert_eq!(webhook_url(d.root(), "two"), url.replace("/one", "/two"));
    // One listener all along.
    let listening = d
        .events()
        .iter()
        .filter(|e| e["kind"] == "webhook.listening")
        .count();
    assert_eq!(listening, 1);
}

#[test]
fn a_webhook_filter_lets_through_only_what_it_is_true_of() {
    let secret = b"s3cret";
    let manifest = r#"version = 1
[daemon]
listen = "127.0.0.1:0"
webhook_listen = "127.0.0.1:0"

[triggers.comment]
kind = "webhook"
route = "github"
secret_env = "HOOK_SECRET"
filter = 'payload.action == "created" and "@npc" in payload.comment.body'
overlap = "skip"
action = { command = "true" }
"#;
    let d = Daemon::start_with(
        manifest,
        crate::support::DaemonSetup {
            only_env: Some(&[("HOOK_SECRET", "s3cret")]),
            ..Default::default()
        },
    );
    let url = webhook_url(d.root(), "comment");
    let post = |body: &str| {
        http(
            &url,
            "POST",
            "/webhooks/github",
            &[
                ("Content-Type", "application/json".to_string()),
                ("X-Hub-Signature-256", sign(secret, body.as_bytes())),
            ],
            body.as_bytes(),
        )
    };
    // Not true (another action, no mention, a missing key): 200, ignored.
    for body in [
        r#"{"action":"deleted","comment":{"body":"@npc fix it"}}"#,
        r#"{"action":"created","comment":{"body":"looks good"}}"#,
        r#"{"action":"created"}"#,
    ] {
        let (status, answer) = post(body);
        assert_eq!(status, 200, "{body}: {answer}");
        assert!(answer.contains("webhook.filtered"), "{answer}");
    }
    let (status, answer) = post(r#"{"action":"created","comment":{"body":"@npc fix it"}}"#);
    assert_eq!(status, 202, "{answer}");
    let runs = runs(d.root());
    assert_eq!(runs.len(), 1, "{runs:?}");
    // A filter that does not compile is an error of `npc validate`.
    std::fs::write(
        d.root().join("bad.toml"),
        manifest.replace("filter = 'payload.action", "filter = 'payload.action =="),
    )
    .unwrap();
    let out = npc()
        .current_dir(d.root())
        .args(["validate", "bad.toml"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("`filter` is not a valid expression"),
        "{said}"
    );
}

#[test]
fn a_failed_run_is_tried_again_per_retries_each_attempt_recorded() {
    let manifest = r#"version = 1
[daemon]
listen = "127.0.0.1:0"
webhook_listen = "127.0.0.1:0"

[triggers.flaky]
kind = "cron"
schedule = "@yearly"
retries = 2
action = { command = "sh", args = ["-c", "echo x >> attempts.txt; test $(wc -l < attempts.txt) -ge 3"] }
"#;
    let d = Daemon::start(manifest);
    let fired = fire(d.root(), "flaky", "{}");
    let id = fired["run_id"].as_str().unwrap().to_string();
    let state = wait_for("the run's end", || {
        run_state(d.root(), &id).filter(|s| s != "queued" && s != "running")
    });
    assert_eq!(state, "succeeded");
    let retries: Vec<Value> = d
        .events()
        .into_iter()
        .filter(|e| e["kind"] == "run.retry")
        .collect();
    assert_eq!(retries.len(), 2, "{retries:?}");
    assert_eq!(retries[0]["payload"]["attempt"], 2);
    assert_eq!(retries[1]["payload"]["attempt"], 3);
    assert!(
        retries[1]["payload"]["delay_ms"].as_u64() > retries[0]["payload"]["delay_ms"].as_u64()
    );
    let attempts = std::fs::read_to_string(d.root().join("attempts.txt")).unwrap();
    assert_eq!(attempts.lines().count(), 3);
}

#[test]
fn a_command_reads_the_payload_by_its_one_name_inline_or_from_a_file() {
    let secret = b"s3cret";
    // The command copies `NPC_PAYLOAD` (or the file `NPC_PAYLOAD_FILE`
    // names) to `payload-<run>.json`, and the whole firing likewise.
    let manifest = r#"version = 1
[daemon]
listen = "127.0.0.1:0"
webhook_listen = "127.0.0.1:0"

[triggers.issue]
kind = "webhook"
route = "github"
secret_env = "HOOK_SECRET"
max_body_bytes = 1048576
action = { command = "sh", args = ["-c", "if [ -n \"$NPC_PAYLOAD_FILE\" ]; then cat \"$NPC_PAYLOAD_FILE\"; else printf '%s' \"$NPC_PAYLOAD\"; fi > payload-$NPC_RUN_ID.json; if [ -n \"$NPC_TRIGGER_PAYLOAD_FILE\" ]; then cat \"$NPC_TRIGGER_PAYLOAD_FILE\"; else printf '%s' \"$NPC_TRIGGER_PAYLOAD\"; fi > firing-$NPC_RUN_ID.json"] }
"#;
    let d = Daemon::start_with(
        manifest,
        crate::support::DaemonSetup {
            only_env: Some(&[("HOOK_SECRET", "s3cret")]),
            ..Default::default()
        },
    );
    let url = webhook_url(d.root(), "issue");
    let small = serde_json::json!({"action": "opened", "issue": {"number": 7}});
    let large = serde_json::json!({"action": "opened", "pad": "x".repeat(100 * 1024)});
    for body in [small, large] {
        let text = body.to_string();
        let (status, answer) = http(
            &url,
            "POST",
            "/webhooks/github",
            &[
                ("Content-Type", "application/json".to_string()),
                ("X-GitHub-Event", "issues".to_string()),
                ("X-Hub-Signature-256", sign(secret, text.as_bytes())),
            ],
            text.as_bytes(),
        );
        assert_eq!(status, 202, "{answer}");
        let id = serde_json::from_str::<Value>(&answer).unwrap()["run_id"]
            .as_str()
            .unwrap()
            .to_string();
        wait_for("the run to succeed", || {
            (run_state(d.root(), &id).as_deref() == Some("succeeded")).then_some(())
        });
        let read = |name: &str| -> Value {
            let text = std::fs::read_to_string(d.root().join(format!("{name}-{id}.json")))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}: {text:.200}"))
        };
        // `payload` is the body, as in a filter or a prompt; the firing
        // carries it under `body` beside the event.
        assert_eq!(read("payload"), body);
        let firing = read("firing");
        assert_eq!(firing["body"], body);
        assert_eq!(firing["event"], "issues", "{firing:.300}");
    }
}
