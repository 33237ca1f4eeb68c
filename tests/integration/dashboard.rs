//! The dashboard's pictures of a real daemon's runs, in headless Chromium:
//! the runs timeline (a lane per trigger and concurrency key, one bar per
//! run in its outcome's colour, a bar opening its run), the runs table's
//! start, wait and duration and what started each run (a webhook's event
//! and the issue it is about, a hostile title shown as text, its link an
//! `https` address only), the URL to paste into GitHub on a webhook
//! trigger, a worktree run's diff coloured line by line, and no raw JSON
//! in what a person sees before opening anything.

use std::path::Path;

use serde_json::{Value, json};

use crate::api::{Api, api_addr, browse, browser_ready, http, post_json};
use crate::support::{Daemon, DaemonSetup, npc, repo_root, wait_for};

/// An issue title a webhook's sender chose: markup that would run script
/// if the page ever parsed it as HTML.
const HOSTILE_TITLE: &str = "<img src=x onerror=alert(1)>";
/// The issue the webhook's payload names.
const ISSUE: u64 = 5;
const ISSUE_URL: &str = "https://github.com/o/r/issues/5";
/// A second delivery's issue: its title a newline and a bidirectional
/// override, its link a script.
const OTHER_ISSUE: u64 = 6;
const TWISTED_TITLE: &str = "first\nsecond\u{202e}third";
const SCRIPT_URL: &str = "javascript:alert(2)";
/// The webhook's secret (`HOOK_SECRET`).
const SECRET: &str = "s3cret";

/// A repository (one commit of `notes.txt`) whose daemon listens for its
/// API and webhooks on free ports: trigger `ok` runs a command in a
/// worktree that changes `notes.txt` and adds `added.txt` (succeeds),
/// `bad` a command that exits 3 (fails), webhook `gh` (route `github`,
/// signed with [`SECRET`]) a command keyed by the issue number; profile `dev` replays a
/// Claude Code transcript (the run by hand).
fn repository() -> tempfile::TempDir {
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
    let manifest = format!(
        r#"version = 1
[daemon]
listen = "127.0.0.1:0"
webhook_listen = "127.0.0.1:0"
[providers.fake]
kind = "claude_code"
command = {agent}
args = ["--provider", "claude_code", "--fixture", {fixture}]
[profiles.dev]
provider = "fake"
description = "replays a transcript with a tool call"
[triggers.ok]
kind = "cron"
schedule = "0 0 1 1 *"
workspace = "worktree"
action = {{ command = "bash", args = ["-c", "printf 'new\n' > notes.txt && printf 'more\n' > added.txt"] }}
[triggers.bad]
kind = "cron"
schedule = "0 0 1 1 *"
action = {{ command = "bash", args = ["-c", "exit 3"] }}
[triggers.gh]
kind = "webhook"
route = "github"
secret_env = "HOOK_SECRET"
concurrency_key = "{{{{ payload.issue.number }}}}"
action = {{ command = "true" }}
"#
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("npcagent.toml"), manifest).unwrap();
    std::fs::write(dir.path().join("notes.txt"), "old\n").unwrap();
    for args in [
        &["init", "--quiet", "--initial-branch=main"][..],
        &["add", "--all"],
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "--quiet",
            "-m",
            "start",
        ],
    ] {
        let out = std::process::Command::new("git")
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    dir
}

/// Fire trigger `name` through the API: its run's id.
fn fire(api: &Api, name: &str) -> String {
    let answer = post_json(api, &format!("/api/v1/triggers/{name}/fire"), "{}");
    assert_eq!(answer.status, 202, "{}", answer.json());
    answer.json()["run_id"].as_str().unwrap().to_string()
}

/// Deliver a signed GitHub `issues` event for issue `number` (its `title`
/// and `html_url`) to route `github` as delivery `id`: its run's id.
fn deliver(root: &Path, id: &str, number: u64, title: &str, html_url: &str) -> String {
    let url = crate::triggers::webhook_url(root, "gh");
    let body = json!({
        "action": "opened",
        "issue": { "number": number, "title": title, "html_url": html_url },
    })
    .to_string();
    let (status, answer) = crate::triggers::http(
        &url,
        "POST",
        "/webhooks/github",
        &[
            ("Content-Type", "application/json".to_string()),
            ("X-GitHub-Event", "issues".to_string()),
            ("X-GitHub-Delivery", id.to_string()),
            (
                "X-Hub-Signature-256",
                crate::triggers::sign(SECRET.as_bytes(), body.as_bytes()),
            ),
        ],
        body.as_bytes(),
    );
    assert_eq!(status, 202, "{answer}");
    let answer: Value = serde_json::from_str(&answer).unwrap();
    answer["run_id"].as_str().unwrap().to_string()
}

/// The runs API's listing once every run of `ids` has ended.
fn ended(api: &Api, ids: &[&str]) -> Vec<Value> {
    wait_for("every run to end", || {
        let page = http(api, "GET", "/api/v1/runs", &[]).json();
        let runs = page["runs"].as_array()?.clone();
        ids.iter()
            .all(|id| {
                runs.iter()
                    .any(|r| r["id"] == *id && r["finished_at"].is_string())
            })
            .then_some(runs)
    })
}

#[test]
fn the_dashboard_draws_every_run_on_a_timeline_and_says_what_started_it_in_headless_chromium() {
    let repo = repository();
    let home = std::env::var("HOME").unwrap_or_default();
    let d = Daemon::start_in_with(
        repo.path(),
        DaemonSetup {
            only_env: Some(&[("HOME", home.as_str()), ("HOOK_SECRET", SECRET)]),
            ..DaemonSetup::default()
        },
    );
    let api = api_addr(&d);
    let ok = fire(&api, "ok");
    let bad = fire(&api, "bad");
    let answer = post_json(
        &api,
        "/api/v1/runs",
        r#"{"profile":"dev","prompt":"list the files","workspace":"in_place"}"#,
    );
    assert_eq!(answer.status, 202, "{}", answer.json());
    let hand = answer.json()["run_id"].as_str().unwrap().to_string();
    let hook = deliver(repo.path(), "delivery-1", ISSUE, HOSTILE_TITLE, ISSUE_URL);
    let hostile = deliver(
        repo.path(),
        "delivery-2",
        OTHER_ISSUE,
        TWISTED_TITLE,
        SCRIPT_URL,
    );
    let runs = ended(&api, &[&ok, &bad, &hand, &hook, &hostile]);
    let run = |id: &str| runs.iter().find(|r| r["id"] == id).unwrap().clone();

    // The listing says what started each run, the payload's text bounded.
    let listed = run(&hook);
    assert_eq!(listed["trigger"], "gh", "{listed}");
    assert_eq!(listed["origin"], "webhook");
    assert_eq!(listed["concurrency_key"], ISSUE.to_string());
    assert_eq!(
        listed["cause"],
        json!({ "event": "issues", "delivery": "delivery-1", "subject": {
            "kind": "issue", "number": ISSUE, "title": HOSTILE_TITLE, "url": ISSUE_URL,
        } })
    );
    // One line, no override, no link that is not the web's.
    assert_eq!(
        run(&hostile)["cause"]["subject"],
        json!({ "kind": "issue", "number": OTHER_ISSUE, "title": "first secondthird" })
    );
    assert_eq!(run(&ok)["state"], "succeeded", "{}", d.log());
    assert_eq!(run(&bad)["state"], "failed");
    assert_eq!(run(&hand)["state"], "succeeded", "{}", d.log());
    assert_eq!(run(&hand)["origin"], "api");
    assert!(run(&hand).get("trigger").is_none());

    if !browser_ready() {
        return;
    }
    let out = npc()
        .current_dir(repo.path())
        .arg("dashboard")
        .output()
        .unwrap();
    let url = String::from_utf8(out.stdout).unwrap();
    assert!(url.contains("/#code="), "{url}");
    let seen = browse(
        "runs.py",
        &url,
        &[&ok, &bad, &hand, &hook, &hostile],
        "dashboard-runs.png",
    );
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    assert_eq!(seen["csp_violations"], json!([]), "{seen}");
    assert_eq!(seen["dialogs"], json!([]), "no payload ran: {seen}");
    assert_eq!(seen["images"], 0, "no payload became markup: {seen}");
    assert_eq!(seen["javascript_links"], 0, "{seen}");
    assert_eq!(seen["hostile_links"], 1, "only the run's own link: {seen}");

    // One bar per run, in its lane, in its outcome's colour.
    assert_eq!(seen["bars"], 5, "{seen}");
    for (name, lane, state, fill) in [
        ("ok", "ok", "succeeded", "rgb(46, 125, 50)"),
        ("bad", "bad", "failed", "rgb(198, 40, 40)"),
        ("hand", "by hand (api)", "succeeded", "rgb(46, 125, 50)"),
        ("hook", "gh · 5", "succeeded", "rgb(46, 125, 50)"),
        ("hostile", "gh · 6", "succeeded", "rgb(46, 125, 50)"),
    ] {
        let bar = &seen[format!("{name}_bar")];
        assert_eq!(
            (text(&bar["lane"]), text(&bar["state"]), text(&bar["fill"])),
            (lane.to_string(), state.to_string(), fill.to_string()),
            "{name}: {seen}"
        );
        assert!(text(&bar["title"]).contains("queued"), "{seen}");
        // The table's row: its state, when it started, how long it waited
        // and ran (seconds, as a person reads them).
        let row = &seen[format!("{name}_row")];
        assert_eq!(text(&row["state"]), state, "{seen}");
        // When it started, as the command line says times: local, and how
        // long ago (`cli::human::when_at`), whatever the browser's locale.
        let id = [("ok", &ok), ("bad", &bad), ("hand", &hand), ("hook", &hook)]
            .into_iter()
            .find(|(n, _)| *n == name)
            .map_or(&hostile, |(_, id)| id);
        let started = chrono::DateTime::parse_from_rfc3339(text(&run(id)["started_at"]).as_str())
            .unwrap()
            .with_timezone(&chrono::Local)
            .format("%Y-%m-%d %H:%M:%S");
        let shown = text(&row["start"]);
        assert!(
            shown.starts_with(&format!("{started} ("))
                && (shown.ends_with(" ago)") || shown.ends_with("(just now)")),
            "{name}: {shown} (started {started})"
        );
        for cell in ["wait", "duration"] {
            let shown = text(&row[cell]);
            assert!(
                shown.ends_with('s') && shown.chars().next().unwrap().is_ascii_digit(),
                "{name} {cell}: {shown}"
            );
        }
    }
    let lanes: Vec<String> = seen["lanes"].as_array().unwrap().iter().map(text).collect();
    assert_eq!(
        lanes,
        ["bad", "gh · 5", "gh · 6", "ok", "by hand (api)"],
        "{seen}"
    );
    assert!(text(&seen["legend"]).contains("succeeded"), "{seen}");

    // What started each run; the hostile title is text, its link the issue.
    assert_eq!(text(&seen["ok_row"]["started_by"]), "ok (manual)", "{seen}");
    assert_eq!(text(&seen["hand_row"]["started_by"]), "by hand (api)");
    let hook_started = text(&seen["hook_row"]["started_by"]);
    assert_eq!(
        hook_started,
        format!("gh (webhook) · issues · issue #{ISSUE} {HOSTILE_TITLE}"),
        "{seen}"
    );
    assert_eq!(seen["hook_link"]["href"], ISSUE_URL, "{seen}");
    assert_eq!(
        text(&seen["hook_link"]["text"]),
        format!("issue #{ISSUE} {HOSTILE_TITLE}")
    );
    assert_eq!(
        text(&seen["hostile_row"]["started_by"]),
        format!("gh (webhook) · issues · issue #{OTHER_ISSUE} first secondthird"),
        "{seen}"
    );
    // The webhook trigger's URL, the listener's own.
    let hook_url = crate::triggers::webhook_url(repo.path(), "gh");
    assert_eq!(text(&seen["webhook_url"]), hook_url, "{seen}");
    assert!(hook_url.ends_with("/webhooks/github"), "{hook_url}");

    // One word per state on every surface: the status panel says what
    // `npc status` says, and what it means.
    let status = npc()
        .current_dir(repo.path())
        .args(["status", "--format", "json"])
        .output()
        .unwrap();
    let status: Value = serde_json::from_slice(&status.stdout).unwrap();
    let api_status = http(&api, "GET", "/api/v1/status", &[]).json();
    let components = status["components"].as_array().unwrap();
    assert!(components.len() >= 6, "{status}");
    for c in components {
        let id = text(&c["id"]);
        let api_row = api_status["components"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == c["id"])
            .unwrap();
        assert_eq!(api_row["state"], c["state"], "{id}: {api_status}");
        assert_eq!(api_row["detail"], c["detail"], "{id}: {api_status}");
        let shown = &seen["components"][&id];
        assert_eq!(
            text(&shown["state"]),
            text(&c["state"]).replace('_', " "),
            "{id}: {seen}"
        );
        assert_eq!(shown["detail"], c["detail"], "{id}: {seen}");
    }
    let state = |id: &str| text(&seen["components"][id]["state"]);
    assert_eq!(state("trigger.gh"), "armed", "{seen}");
    assert_eq!(state("profile.dev"), "ready", "{seen}");
    assert_eq!(state("daemon.api"), "recorded", "{seen}");
    assert!(
        !seen["components"].to_string().contains("applied"),
        "{seen}"
    );

    // No raw JSON in what a person sees first, the events panel included
    // (its lines name each event's fields in words).
    let main = text(&seen["main_text"]);
    assert!(main.contains("run.finished"), "{main}");
    assert!(main.contains(&format!("run_id {hook}")), "{main}");
    for json in ["{\"", "\":", "[{", "\"}"] {
        assert!(!main.contains(json), "{json} in {main}");
    }

    // A bar opened its run: the worktree's diff, line by line in colour.
    assert!(text(&seen["run_state"]).contains("succeeded"), "{seen}");
    assert_eq!(text(&seen["run_cause"]), "started by ok (manual)", "{seen}");
    let diff = &seen["diff"];
    let added: Vec<String> = diff["add"].as_array().unwrap().iter().map(text).collect();
    let removed: Vec<String> = diff["del"].as_array().unwrap().iter().map(text).collect();
    assert!(added.contains(&"+new\n".to_string()), "{diff}");
    assert!(added.contains(&"+more\n".to_string()), "{diff}");
    assert_eq!(removed, ["-old\n"], "{diff}");
    assert!(diff["hunks"].as_u64().unwrap() >= 2, "{diff}");
    assert_eq!(diff["add_colour"], "rgb(27, 94, 32)", "{diff}");
    assert_eq!(diff["del_colour"], "rgb(183, 28, 28)", "{diff}");
    assert!(
        text(&diff["text"]).contains("diff --git a/notes.txt"),
        "{diff}"
    );
}
