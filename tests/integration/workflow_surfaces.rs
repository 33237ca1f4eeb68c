//! Workflows on the daemon's surfaces beyond the CLI, through the real
//! binary: the REST API lists the declared workflows and their runs,
//! starts one (the same object as `npc workflow show`), cancels one, and
//! answers a hostile name or id with a stable JSON error; the dashboard, in
//! headless Chromium, draws a workflow run as a graph (a node per step in
//! a column by the depth of its `needs`, an arrow per need, each node and
//! each fan-out instance in its state's colour) that follows the run live,
//! its gate's Approve button moves the workflow on, and its Cancel button
//! ends one.

use std::path::Path;

use serde_json::{Value, json};

use crate::api::{Api, api_addr, browse, browser_ready, http, post_json};
use crate::support::{Daemon, npc, wait_for};
use crate::worktrees::repository;

/// `ship`: a plan, a build fanned out over two parts, a review gate, a
/// merge; `slow`: a step that runs until it is cancelled, then another.
const MANIFEST: &str = r#"version = 1
[daemon]
listen = "127.0.0.1:0"

[workflows.ship]
description = "plan, build two parts, review, merge"

[workflows.ship.inputs.goal]
description = "what to build"

[workflows.ship.inputs.size]
default = "big"

[workflows.ship.steps.plan]
command = "true"

[workflows.ship.steps.build]
command = "sh"
args = ["-c", "true"]
needs = ["plan"]
matrix = { part = ["lexer", "parser"] }

[workflows.ship.steps.review]
gate = "approval"
needs = ["build"]

[workflows.ship.steps.merge]
command = "true"
needs = ["review"]

[workflows.slow.steps.wait]
command = "sh"
args = ["-c", "while [ ! -e never ]; do sleep 0.05; done"]

[workflows.slow.steps.after]
command = "true"
needs = ["wait"]
"#;

/// An input a client chose: markup that would run script if the page ever
/// parsed it as HTML.
const HOSTILE_GOAL: &str = "<img src=x onerror=alert(1)>";

/// Colours of the outcome legend (`dashboard.css`), as computed.
const SUCCEEDED: &str = "rgb(46, 125, 50)";
const WAITING: &str = "rgb(249, 168, 37)";
const PENDING: &str = "rgb(230, 230, 230)";
const RUNNING: &str = "rgb(21, 101, 192)";
const CANCELLED: &str = "rgb(141, 141, 141)";

/// `GET /api/v1/workflow-runs/{id}`, which must answer.
fn view(api: &Api, id: &str) -> Value {
    let answer = http(api, "GET", &format!("/api/v1/workflow-runs/{id}"), &[]);
    assert_eq!(answer.status, 200, "{}", answer.json());
    answer.json()
}

/// Wait until workflow run `id` satisfies `check`; the view then.
fn wait_until(api: &Api, id: &str, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    wait_for(what, || Some(view(api, id)).filter(|v| check(v)))
}

fn ended(v: &Value) -> bool {
    matches!(
        v["state"].as_str(),
        Some("succeeded" | "failed" | "cancelled")
    )
}

/// `npc workflow show ID --format json`.
fn cli_show(dir: &Path, id: &str) -> Value {
    let out = npc()
        .current_dir(dir)
        .args(["workflow", "show", id, "--format", "json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// POST `body` to `path`: the status and the error code, if any.
fn refused(api: &Api, path: &str, body: &str) -> (u16, String) {
    let answer = post_json(api, path, body);
    let code = answer.json()["error"]["code"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    (answer.status, code)
}

#[test]
fn workflows_are_listed_started_shown_and_cancelled_through_the_api_with_stable_errors() {
    let dir = repository(MANIFEST, &[]);
    let d = Daemon::start_in(dir.path());
    let api = api_addr(&d);

    // The declared workflows, as `npc workflows --format json` lists them.
    let listed = http(&api, "GET", "/api/v1/workflows", &[]);
    assert_eq!(listed.status, 200);
    let listed = listed.json();
    assert_eq!(
        listed["workflows"],
        json!([
            { "name": "ship", "description": "plan, build two parts, review, merge",
              "inputs": ["goal", "size"], "steps": ["plan", "build", "review", "merge"] },
            { "name": "slow", "description": null, "inputs": [], "steps": ["wait", "after"] },
        ]),
        "{listed:#}"
    );
    assert_eq!(listed["runs"], json!([]));

    // Inputs are checked before anything starts.
    let start = "/api/v1/workflows/ship/runs";
    for (body, status, code) in [
        ("", 422, "workflow.invalid_input"),
        ("{}", 422, "workflow.invalid_input"),
        (
            r#"{"inputs":{"goal":"x","colour":"red"}}"#,
            422,
            "workflow.invalid_input",
        ),
        (r#"{"inputs":{"goal":7}}"#, 422, "invalid_body"),
        (r#"{"inputs":{"goal":"x"},"extra":1}"#, 422, "invalid_body"),
        ("not json", 400, "bad_request"),
    ] {
        assert_eq!(
            refused(&api, start, body),
            (status, code.to_string()),
            "{body}"
        );
    }
    let too_long = json!({ "inputs": { "goal": "x".repeat(70 * 1024) } });
    assert_eq!(
        refused(&api, start, &too_long.to_string()),
        (413, "payload_too_large".to_string()),
        "a body past the API's bound"
    );

    // A hostile name or id is looked up, never used: stable 404s (400 for
    // a path that is not UTF-8), nothing started, nothing read or written.
    let long = "w".repeat(4000);
    for (path, status, code) in [
        ("/api/v1/workflows/ghost/runs", 404, "workflow.not_found"),
        (
            "/api/v1/workflows/..%2F..%2Fetc%2Fpasswd/runs",
            404,
            "workflow.not_found",
        ),
        (
            "/api/v1/workflows/%3Cimg%20src%3Dx%20onerror%3Dalert(1)%3E/runs",
            404,
            "workflow.not_found",
        ),
        (
            "/api/v1/workflows/a%0Ab%00c/runs",
            404,
            "workflow.not_found",
        ),
        (
            &format!("/api/v1/workflows/{long}/runs"),
            404,
            "workflow.not_found",
        ),
        ("/api/v1/workflows/%FF%FE/runs", 400, "bad_request"),
        (
            "/api/v1/workflow-runs/wf-x'%20OR%20'1'='1/cancel",
            404,
            "workflow_run.not_found",
        ),
        (
            "/api/v1/workflow-runs/..%2F..%2F.npc%2Fstate.db/cancel",
            404,
            "workflow_run.not_found",
        ),
    ] {
        assert_eq!(
            refused(&api, path, r#"{"inputs":{"goal":"x"}}"#),
            (status, code.to_string()),
            "{path}"
        );
    }
    for id in ["ghost", "wf-x'%20OR%20'1'='1", "..%2F.npc%2Fstate.db"] {
        let answer = http(&api, "GET", &format!("/api/v1/workflow-runs/{id}"), &[]);
        assert_eq!(answer.status, 404, "{id}");
        assert_eq!(answer.json()["error"]["code"], "workflow_run.not_found");
    }
    let listed = http(&api, "GET", "/api/v1/workflows", &[]).json();
    assert_eq!(listed["runs"], json!([]), "nothing started: {listed:#}");

    // A start: 202 and the workflow run's id; its view is `npc workflow
    // show`'s object.
    let answer = post_json(&api, start, r#"{"inputs":{"goal":"a parser"}}"#);
    assert_eq!(answer.status, 202, "{}", answer.json());
    let id = answer.json()["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("wf-"), "{id}");
    let at_gate = wait_until(&api, &id, "the review gate", |v| {
        v["steps"]["review"]["state"] == "waiting" || ended(v)
    });
    assert_eq!(at_gate["state"], "running", "{at_gate:#}");
    assert_eq!(at_gate["origin"], "api");
    assert_eq!(
        at_gate["inputs"],
        json!({ "goal": "a parser", "size": "big" })
    );
    assert_eq!(at_gate["steps"]["plan"]["state"], "succeeded");
    let instances = at_gate["steps"]["build"]["instances"].as_array().unwrap();
    assert_eq!(instances.len(), 2, "{at_gate:#}");
    assert_eq!(instances[1]["matrix"], json!({ "part": "parser" }));
    assert_eq!(at_gate["steps"]["merge"]["state"], "pending");
    assert_eq!(at_gate["steps"]["merge"]["needs"], json!(["review"]));
    assert_eq!(cli_show(dir.path(), &id), at_gate, "the CLI's object");

    // The gate is answered like any run's approval; the workflow goes on.
    let gate = at_gate["steps"]["review"]["gate_run"].as_str().unwrap();
    let answer = post_json(&api, &format!("/api/v1/runs/{gate}/approve"), "{}");
    assert_eq!(answer.status, 200, "{}", answer.json());
    let done = wait_until(&api, &id, "the workflow's end", ended);
    assert_eq!(done["state"], "succeeded", "{done:#}");
    assert_eq!(done["steps"]["merge"]["state"], "succeeded");
    let cancel = format!("/api/v1/workflow-runs/{id}/cancel");
    assert_eq!(
        refused(&api, &cancel, ""),
        (409, "workflow_run.finished".to_string())
    );

    // A cancel stops the running step's run and ends the rest.
    let answer = post_json(&api, "/api/v1/workflows/slow/runs", "");
    assert_eq!(answer.status, 202, "{}", answer.json());
    let slow = answer.json()["id"].as_str().unwrap().to_string();
    let running = wait_until(&api, &slow, "the slow step's run", |v| {
        v["steps"]["wait"]["state"] == "running" || ended(v)
    });
    let run = running["steps"]["wait"]["run"]
        .as_str()
        .unwrap()
        .to_string();
    let answer = post_json(&api, &format!("/api/v1/workflow-runs/{slow}/cancel"), "");
    assert_eq!(answer.status, 202, "{}", answer.json());
    assert_eq!(answer.json(), json!({ "id": slow, "state": "cancelled" }));
    let cancelled = view(&api, &slow);
    assert_eq!(cancelled["state"], "cancelled", "{cancelled:#}");
    assert_eq!(cancelled["steps"]["wait"]["state"], "cancelled");
    // Never reached: never started.
    assert!(
        cancelled["steps"]["after"]["run"].is_null(),
        "{cancelled:#}"
    );
    let run_state = wait_for("the step's run to end", || {
        let r = http(&api, "GET", &format!("/api/v1/runs/{run}"), &[]).json();
        r["finished_at"].is_string().then_some(r["state"].clone())
    });
    assert_eq!(run_state, "cancelled");

    // The listing has both, newest first.
    let listed = http(&api, "GET", "/api/v1/workflows", &[]).json();
    let runs: Vec<(&str, &str)> = listed["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["id"].as_str().unwrap(), r["state"].as_str().unwrap()))
        .collect();
    assert_eq!(
        runs,
        [(slow.as_str(), "cancelled"), (id.as_str(), "succeeded")]
    );
    assert!(!d.log().contains("api: internal error"), "{}", d.log());
}

#[test]
fn the_dashboard_draws_a_workflow_run_as_a_live_graph_and_its_gate_approves_in_headless_chromium() {
    let dir = repository(MANIFEST, &[]);
    let d = Daemon::start_in(dir.path());
    let api = api_addr(&d);
    if !browser_ready() {
        return;
    }
    let out = npc()
        .current_dir(dir.path())
        .arg("dashboard")
        .output()
        .unwrap();
    let url = String::from_utf8(out.stdout).unwrap();
    assert!(url.contains("/#code="), "{url}");
    let seen = browse(
        "workflows.py",
        &url,
        &[HOSTILE_GOAL],
        "dashboard-workflow.png",
    );
    assert_eq!(seen["csp_violations"], json!([]), "{seen}");
    assert_eq!(seen["dialogs"], json!([]), "no input ran: {seen}");
    assert_eq!(seen["images"], 0, "no input became markup: {seen}");

    // The page started the workflow through the API, with the input as given.
    let id = seen["id"].as_str().unwrap();
    let done = view(&api, id);
    assert_eq!(done["origin"], "api");
    assert_eq!(done["inputs"]["goal"], HOSTILE_GOAL);
    assert!(
        seen["detail"].as_str().unwrap().contains(HOSTILE_GOAL),
        "shown as text: {seen}"
    );

    // At the gate: one node per step, in columns by depth, an arrow per
    // need, each node in its state's colour, the fan-out's instances drawn.
    let waiting = &seen["waiting"];
    let steps: Vec<&String> = waiting.as_object().unwrap().keys().collect();
    assert_eq!(steps.len(), 4, "{seen}");
    assert_eq!(
        seen["edges"],
        json!([["plan", "build"], ["build", "review"], ["review", "merge"]]),
        "{seen}"
    );
    let x = |step: &str| waiting[step]["x"].as_f64().unwrap();
    assert!(
        x("plan") < x("build") && x("build") < x("review") && x("review") < x("merge"),
        "{seen}"
    );
    for (step, state, fill) in [
        ("plan", "succeeded", SUCCEEDED),
        ("build", "succeeded", SUCCEEDED),
        ("review", "waiting", WAITING),
        ("merge", "pending", PENDING),
    ] {
        assert_eq!(
            (&waiting[step]["state"], &waiting[step]["fill"]),
            (&json!(state), &json!(fill)),
            "{step}: {seen}"
        );
    }
    let instances = waiting["build"]["instances"].as_array().unwrap();
    assert_eq!(instances.len(), 2, "{seen}");
    for (instance, part) in instances.iter().zip(["lexer", "parser"]) {
        assert_eq!(instance["state"], "succeeded");
        assert_eq!(instance["fill"], SUCCEEDED);
        assert!(instance["text"].as_str().unwrap().contains(part), "{seen}");
    }
    assert!(waiting["plan"]["run"].as_str().unwrap().starts_with("run-"));
    assert_eq!(waiting["review"]["buttons"], json!(["Approve", "Deny"]));
    assert_eq!(waiting["merge"]["buttons"], json!([]));
    assert_eq!(seen["state_before"], "running");
    assert_eq!(seen["run_row_state"], "running");
    let legend = seen["legend"].as_str().unwrap();
    for state in ["pending", "waiting", "running", "succeeded", "failed"] {
        assert!(legend.contains(state), "{legend}");
    }

    // The approval the page named is the one the gate's run parked.
    let gate = done["steps"]["review"]["gate_run"].as_str().unwrap();
    let events = http(&api, "GET", &format!("/api/v1/runs/{gate}/events"), &[]).json();
    let waiting_event = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "run.waiting")
        .unwrap();
    assert_eq!(
        waiting_event["payload"]["approval_id"], seen["approval_id"],
        "{events:#}"
    );

    // After Approve: the workflow went on and the graph followed it live.
    assert_eq!(done["state"], "succeeded", "{done:#}");
    for step in ["plan", "build", "review", "merge"] {
        assert_eq!(seen["done"][step]["state"], "succeeded", "{step}: {seen}");
        assert_eq!(seen["done"][step]["fill"], SUCCEEDED, "{step}: {seen}");
    }
    assert_eq!(seen["done"]["review"]["buttons"], json!([]), "{seen}");
    assert!(
        seen["result"].as_str().unwrap().contains("allowed"),
        "{seen}"
    );

    // A running step in its colour; the view's Cancel ends the workflow.
    let running = &seen["slow_running"];
    assert_eq!(running["wait"]["state"], "running", "{seen}");
    assert_eq!(running["wait"]["fill"], RUNNING, "{seen}");
    assert_eq!(running["after"]["fill"], PENDING, "{seen}");
    let cancelled = &seen["slow_cancelled"];
    assert_eq!(cancelled["wait"]["state"], "cancelled", "{seen}");
    assert_eq!(cancelled["wait"]["fill"], CANCELLED, "{seen}");
    assert_eq!(seen["cancel_hidden"], true, "{seen}");
    let slow = view(&api, seen["slow_id"].as_str().unwrap());
    assert_eq!(
        (&slow["workflow"], &slow["state"]),
        (&json!("slow"), &json!("cancelled")),
        "{slow:#}"
    );
}
