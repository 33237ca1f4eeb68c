//! Workflows through the real binary and a real daemon on real git
//! repositories: steps run in the order their `needs` give, a matrix fans
//! out, a step works on a branch made from another's result, a gate waits
//! for `npc runs approve`, a failed step fails only what needs it, a cancel
//! stops the rest, and a daemon killed mid-workflow resumes it from the
//! journal without redoing a finished step. `npc validate` reports a bad
//! graph with the usual diagnostics.

use std::path::Path;

use serde_json::Value;

use crate::support::{Daemon, npc, wait_for};
use crate::worktrees::{git, repository};

/// `npc ARGS…` in `dir`: the exit code, stdout and stderr.
fn run_npc(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let out = npc().current_dir(dir).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `npc workflow run NAME ARGS… --format json`: the workflow run's id.
fn start(dir: &Path, name: &str, args: &[&str]) -> String {
    let mut all = vec!["workflow", "run", name, "--format", "json"];
    all.extend_from_slice(args);
    let (code, stdout, stderr) = run_npc(dir, &all);
    assert_eq!(code, 0, "{stdout}{stderr}");
    let doc: Value = serde_json::from_str(&stdout).unwrap();
    doc["id"].as_str().unwrap().to_string()
}

/// `npc workflow show ID --format json`.
fn show(dir: &Path, id: &str) -> Value {
    let (code, stdout, stderr) = run_npc(dir, &["workflow", "show", id, "--format", "json"]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    serde_json::from_str(&stdout).unwrap()
}

/// Wait until workflow run `id` satisfies `check`; the view then.
fn wait_until(dir: &Path, id: &str, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    wait_for(what, || Some(show(dir, id)).filter(|v| check(v)))
}

fn ended(v: &Value) -> bool {
    matches!(
        v["state"].as_str(),
        Some("succeeded" | "failed" | "cancelled")
    )
}

const SHIP: &str = r#"version = 1

[workflows.ship]
description = "plan, build in parallel, review, merge"

[workflows.ship.inputs.goal]
description = "what to build"

[workflows.ship.inputs.size]
default = "big"

[workflows.ship.steps.plan]
command = "sh"
args = ["-c", "printf '{\"tasks\": [\"lexer\", \"parser\", \"printer\"]}' > plan.json"]
workspace = "worktree"
outputs = { file = "plan.json", schema = "plan.schema.json" }

[workflows.ship.steps.build]
command = "sh"
args = ["-c", "printf '%s' \"$NPC_TRIGGER_PAYLOAD\" > build.json"]
workspace = "worktree"
needs = ["plan"]
matrix = { task = "steps.plan.output.tasks" }
base = "{{ steps.plan.head }}"

[workflows.ship.steps.docs]
command = "true"
needs = ["plan"]
when = "inputs.size == 'small'"

[workflows.ship.steps.review]
gate = "approval"
needs = ["build"]

[workflows.ship.steps.merge]
command = "sh"
args = ["-c", "printf '%s' \"$NPC_TRIGGER_PAYLOAD\" > merge.json"]
workspace = "worktree"
needs = ["review"]
base = "{{ steps.plan.head }}"
"#;

const PLAN_SCHEMA: &str = r#"{
  "type": "object",
  "required": ["tasks"],
  "properties": { "tasks": { "type": "array", "items": { "type": "string" } } }
}"#;

#[test]
fn a_workflow_fans_out_from_a_plan_waits_at_its_gate_and_each_step_builds_on_the_one_before() {
    let dir = repository(SHIP, &[("plan.schema.json", PLAN_SCHEMA)]);
    let daemon = Daemon::start_in(dir.path());
    // An input the workflow does not have, or one it needs left out: refused.
    let (code, _, stderr) = run_npc(dir.path(), &["workflow", "run", "ship"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("needs input `goal`"), "{stderr}");
    let (code, _, stderr) = run_npc(
        dir.path(),
        &[
            "workflow",
            "run",
            "ship",
            "--input",
            "goal=x",
            "--input",
            "colour=red",
        ],
    );
    assert_eq!(code, 1);
    assert!(stderr.contains("has no input `colour`"), "{stderr}");
    // The plan, before anything runs.
    let (code, stdout, stderr) = run_npc(dir.path(), &["workflow", "plan", "ship"]);
    assert_eq!(code, 0, "{stderr}");
    insta::assert_snapshot!("workflow_plan", stdout);
    let id = start(dir.path(), "ship", &["--input", "goal=a calculator"]);
    assert!(id.starts_with("wf-"), "{id}");
    let view = wait_until(dir.path(), &id, "the review gate", |v| {
        v["steps"]["review"]["state"] == "waiting" || ended(v)
    });
    assert_eq!(view["state"], "running", "{view:#}");
    // The plan's output file was read and checked against its schema.
    let plan = &view["steps"]["plan"];
    assert_eq!(plan["state"], "succeeded", "{view:#}");
    assert_eq!(
        plan["outputs"]["output"]["tasks"],
        serde_json::json!(["lexer", "parser", "printer"])
    );
    let plan_head = plan["head"].as_str().unwrap();
    // One build per task, each on a branch made from the plan's result.
    let build = &view["steps"]["build"];
    assert_eq!(build["state"], "succeeded", "{view:#}");
    let instances = build["instances"].as_array().unwrap();
    assert_eq!(instances.len(), 3, "{view:#}");
    for (i, task) in ["lexer", "parser", "printer"].iter().enumerate() {
        let b = &instances[i];
        assert_eq!(b["matrix"]["task"], *task);
        let branch = b["branch"].as_str().unwrap();
        git(
            dir.path(),
            &["merge-base", "--is-ancestor", plan_head, branch],
        );
        let payload: Value =
            serde_json::from_str(&git(dir.path(), &["show", &format!("{branch}:build.json")]))
                .unwrap();
        assert_eq!(payload["context"]["matrix"]["task"], *task);
        assert_eq!(payload["context"]["inputs"]["goal"], "a calculator");
        assert_eq!(payload["base"], plan_head);
    }
    // `when` false: skipped, and nothing waits on it.
    assert_eq!(view["steps"]["docs"]["state"], "skipped");
    assert_eq!(view["steps"]["merge"]["state"], "pending");
    // The gate is a run that waits like an ask; `npc runs approve` answers it.
    let gate = view["steps"]["review"]["gate_run"]
        .as_str()
        .unwrap()
        .to_string();
    let (code, human, _) = run_npc(dir.path(), &["workflow", "show", &id]);
    assert_eq!(code, 0);
    assert!(
        human.contains(&format!("npc runs approve {gate}")),
        "{human}"
    );
    let (code, stdout, stderr) = run_npc(dir.path(), &["runs", "approve", &gate]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    let view = wait_until(dir.path(), &id, "the workflow's end", ended);
    assert_eq!(view["state"], "succeeded", "{view:#}");
    assert_eq!(view["steps"]["review"]["state"], "succeeded");
    let merge = view["steps"]["merge"]["branch"].as_str().unwrap();
    let payload: Value =
        serde_json::from_str(&git(dir.path(), &["show", &format!("{merge}:merge.json")])).unwrap();
    assert_eq!(
        payload["context"]["steps"]["build"]["branches"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
    // Every step's run is a run like any, of origin `workflow`.
    let runs = crate::worktrees::runs(dir.path());
    let steps: Vec<&Value> = runs.iter().filter(|r| r["origin"] == "workflow").collect();
    assert_eq!(steps.len(), 1 + 3 + 1 + 1, "{runs:#?}");
    // The events tell the story, in order.
    let events = daemon.events();
    let kinds: Vec<&str> = events
        .iter()
        .filter(|e| e["component"].as_str() == Some(&format!("workflow.{id}")))
        .filter_map(|e| e["kind"].as_str())
        .collect();
    assert_eq!(kinds.first(), Some(&"workflow.started"), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"workflow.finished"), "{kinds:?}");
    // Listed with its state.
    let (code, stdout, _) = run_npc(dir.path(), &["workflows", "--format", "json"]);
    assert_eq!(code, 0);
    let listed: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(listed["workflows"][0]["name"], "ship");
    assert_eq!(listed["runs"][0]["id"], id.as_str());
    assert_eq!(listed["runs"][0]["state"], "succeeded");
}

const FAILING: &str = r#"version = 1

[workflows.branches.steps.a]
command = "true"

[workflows.branches.steps.b]
command = "sh"
args = ["-c", "echo broken; exit 7"]
needs = ["a"]

[workflows.branches.steps.c]
command = "true"
needs = ["b"]

[workflows.branches.steps.d]
command = "true"
needs = ["a"]

[workflows.gated.steps.review]
gate = "approval"

[workflows.gated.steps.after]
command = "true"
needs = ["review"]

[workflows.slow.steps.wait]
command = "sh"
args = ["-c", "while [ ! -e never ]; do sleep 0.05; done"]

[workflows.slow.steps.after]
command = "true"
needs = ["wait"]
"#;

#[test]
fn a_failed_step_fails_what_needs_it_and_nothing_else_a_denied_gate_fails_and_a_cancel_stops_the_rest()
 {
    let dir = repository(FAILING, &[]);
    let _daemon = Daemon::start_in(dir.path());
    let id = start(dir.path(), "branches", &[]);
    let view = wait_until(dir.path(), &id, "the workflow's end", ended);
    assert_eq!(view["state"], "failed", "{view:#}");
    assert!(view["detail"].as_str().unwrap().contains('b'), "{view:#}");
    assert_eq!(view["steps"]["a"]["state"], "succeeded");
    assert_eq!(view["steps"]["b"]["state"], "failed");
    assert!(
        view["steps"]["b"]["detail"]
            .as_str()
            .unwrap()
            .contains("ended `failed`"),
        "{view:#}"
    );
    assert_eq!(view["steps"]["c"]["state"], "failed");
    assert!(
        view["steps"]["c"]["detail"]
            .as_str()
            .unwrap()
            .contains("needs step `b`"),
        "{view:#}"
    );
    assert!(view["steps"]["c"]["run"].is_null(), "c never ran: {view:#}");
    assert_eq!(view["steps"]["d"]["state"], "succeeded", "{view:#}");

    // A denied gate fails its step, and what needs it.
    let id = start(dir.path(), "gated", &[]);
    let view = wait_until(dir.path(), &id, "the gate", |v| {
        v["steps"]["review"]["state"] == "waiting"
    });
    let gate = view["steps"]["review"]["gate_run"]
        .as_str()
        .unwrap()
        .to_string();
    let (code, stdout, stderr) = run_npc(
        dir.path(),
        &["runs", "deny", &gate, "--reason", "not this week"],
    );
    assert_eq!(code, 0, "{stdout}{stderr}");
    let view = wait_until(dir.path(), &id, "the workflow's end", ended);
    assert_eq!(view["state"], "failed", "{view:#}");
    assert!(
        view["steps"]["review"]["detail"]
            .as_str()
            .unwrap()
            .contains("not this week"),
        "{view:#}"
    );
    assert_eq!(view["steps"]["after"]["state"], "failed");

    // A cancel stops the running step's run and ends the rest.
    let id = start(dir.path(), "slow", &[]);
    let view = wait_until(dir.path(), &id, "the slow step's run", |v| {
        v["steps"]["wait"]["state"] == "running"
    });
    let run = view["steps"]["wait"]["run"].as_str().unwrap().to_string();
    let (code, stdout, stderr) = run_npc(dir.path(), &["workflow", "cancel", &id]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("cancelled"), "{stdout}");
    let view = show(dir.path(), &id);
    assert_eq!(view["state"], "cancelled", "{view:#}");
    assert_eq!(view["steps"]["wait"]["state"], "cancelled");
    assert_eq!(view["steps"]["after"]["state"], "cancelled", "{view:#}");
    assert!(view["steps"]["after"]["run"].is_null(), "{view:#}");
    let row = wait_for("the step's run to end", || {
        crate::worktrees::runs(dir.path())
            .into_iter()
            .find(|r| r["id"] == run.as_str() && r["state"] != "running")
    });
    assert_eq!(row["state"], "cancelled", "{row}");
    // Cancelled twice: refused, naming the state.
    let (code, _, stderr) = run_npc(dir.path(), &["workflow", "cancel", &id]);
    assert_eq!(code, 1);
    assert!(stderr.contains("already ended (`cancelled`)"), "{stderr}");
    let (code, _, stderr) = run_npc(dir.path(), &["workflow", "show", "wf-nope"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("no workflow run `wf-nope`"), "{stderr}");
}

#[test]
fn a_daemon_killed_mid_workflow_resumes_it_without_redoing_a_finished_step() {
    let marks = tempfile::tempdir().unwrap();
    let log = marks.path().join("log");
    let go = marks.path().join("go");
    let manifest = format!(
        r#"version = 1

[workflows.resume.steps.first]
command = "sh"
args = ["-c", "echo first >> \"$LOG\""]
env = {{ LOG = "{log}" }}

[workflows.resume.steps.second]
command = "sh"
args = ["-c", "echo second >> \"$LOG\"; while [ ! -e \"$GO\" ]; do sleep 0.05; done"]
env = {{ LOG = "{log}", GO = "{go}" }}
needs = ["first"]

[workflows.resume.steps.third]
command = "sh"
args = ["-c", "echo third >> \"$LOG\""]
env = {{ LOG = "{log}" }}
needs = ["second"]
"#,
        log = log.display(),
        go = go.display()
    );
    let dir = repository(&manifest, &[]);
    let mut daemon = Daemon::start_in(dir.path());
    let id = start(dir.path(), "resume", &[]);
    let lines = || -> Vec<String> {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    };
    wait_for("the second step to start", || {
        lines().contains(&"second".to_string()).then_some(())
    });
    daemon.kill();
    daemon.restart();
    // The interrupted step starts again; the finished one does not.
    wait_for("the second step to start again", || {
        (lines().iter().filter(|l| *l == "second").count() == 2).then_some(())
    });
    std::fs::write(&go, "").unwrap();
    let view = wait_until(dir.path(), &id, "the workflow's end", ended);
    assert_eq!(view["state"], "succeeded", "{view:#}");
    let lines = lines();
    assert_eq!(
        lines.iter().filter(|l| *l == "first").count(),
        1,
        "{lines:?}"
    );
    assert_eq!(
        lines.iter().filter(|l| *l == "third").count(),
        1,
        "{lines:?}"
    );
}

#[test]
fn npc_validate_reports_a_bad_workflow_graph_with_every_problem() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("npcagent.toml"),
        r#"version = 1

[workflows.loop.steps.a]
command = "true"
needs = ["b"]

[workflows.loop.steps.b]
command = "true"
needs = ["a"]

[workflows.reads.inputs.goal]

[workflows.reads.steps.plan]
command = "true"

[workflows.reads.steps.build]
command = "true"
needs = ["plna"]

[workflows.reads.steps.check]
command = "true"
needs = ["plan"]
base = "{{ steps.build.branch }}"
when = "inputs.size == 'big'"
matrix = { part = [] }
gate = "aproval"
"#,
    )
    .unwrap();
    let (code, stdout, stderr) = run_npc(dir.path(), &["validate"]);
    assert_eq!(code, 1, "{stdout}{stderr}");
    let text = format!("{stdout}{stderr}");
    insta::assert_snapshot!("workflow_graph_diagnostics", text);
}

#[test]
fn a_triggers_action_starts_a_workflow_whose_steps_read_the_firings_payload() {
    let dir = repository(
        r#"version = 1

[triggers.issue]
kind = "webhook"
route = "issues"
action = { workflow = "triage", inputs = { label = "bug" } }

[workflows.triage.inputs.label]

[workflows.triage.steps.note]
command = "sh"
args = ["-c", "printf '%s' \"$NPC_TRIGGER_PAYLOAD\" > note.json"]
workspace = "worktree"
"#,
        &[],
    );
    let _daemon = Daemon::start_in(dir.path());
    let (code, stdout, stderr) = run_npc(
        dir.path(),
        &[
            "trigger",
            "fire",
            "issue",
            "--payload",
            r#"{"issue": {"number": 42}}"#,
            "--format",
            "json",
        ],
    );
    assert_eq!(code, 0, "{stdout}{stderr}");
    let fired: Value = serde_json::from_str(&stdout).unwrap();
    let run = fired["run_id"].as_str().unwrap().to_string();
    let row = wait_for("the trigger's run to end", || {
        crate::worktrees::runs(dir.path())
            .into_iter()
            .find(|r| r["id"] == run.as_str() && r["state"] != "queued" && r["state"] != "running")
    });
    assert_eq!(row["state"], "succeeded", "{row}");
    let detail = row["detail"].as_str().unwrap();
    let id = detail
        .split('`')
        .find(|s| s.starts_with("wf-"))
        .unwrap_or_else(|| panic!("{detail}"))
        .to_string();
    let view = wait_until(dir.path(), &id, "the workflow's end", ended);
    assert_eq!(view["state"], "succeeded", "{view:#}");
    assert_eq!(view["origin"], "manual");
    assert_eq!(view["inputs"]["label"], "bug");
    let branch = view["steps"]["note"]["branch"].as_str().unwrap();
    let payload: Value =
        serde_json::from_str(&git(dir.path(), &["show", &format!("{branch}:note.json")])).unwrap();
    assert_eq!(payload["context"]["payload"]["issue"]["number"], 42);
    assert_eq!(payload["context"]["inputs"]["label"], "bug");
}

#[test]
fn a_trigger_naming_an_unknown_workflow_or_leaving_out_an_input_is_invalid() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("npcagent.toml"),
        r#"version = 1

[triggers.a]
kind = "webhook"
route = "a"
action = { workflow = "triag" }

[triggers.b]
kind = "webhook"
route = "b"
action = { workflow = "triage", inputs = { labl = "x" }, command = "true" }

[workflows.triage.inputs.label]

[workflows.triage.steps.note]
command = "true"
"#,
    )
    .unwrap();
    let (code, stdout, stderr) = run_npc(dir.path(), &["validate"]);
    assert_eq!(code, 1, "{stdout}{stderr}");
    let text = format!("{stdout}{stderr}");
    insta::assert_snapshot!("workflow_trigger_diagnostics", text);
}

/// A step that writes `part-TASK.txt` (or, with `same`, one file every
/// instance writes differently) from its matrix value.
const PART: &str = "import json, os; t = json.loads(os.environ['NPC_TRIGGER_PAYLOAD'])['context']['matrix']['task']; open(os.environ['NAME'].replace('TASK', t), 'w').write(t)";

#[test]
fn a_step_merges_the_branches_of_a_fan_out_into_its_base_and_a_conflict_names_the_files() {
    let manifest = format!(
        r#"version = 1

[workflows.join.steps.parts]
command = "python3"
args = ["-c", "{PART}"]
env = {{ NAME = "part-TASK.txt" }}
workspace = "worktree"
matrix = {{ task = ["x", "y", "z"] }}

[workflows.join.steps.all]
command = "sh"
args = ["-c", "test -f part-x.txt && test -f part-y.txt && test -f part-z.txt && echo joined > all.txt"]
workspace = "worktree"
merge = ["parts"]

[workflows.clash.steps.parts]
command = "python3"
args = ["-c", "{PART}"]
env = {{ NAME = "same.txt" }}
workspace = "worktree"
matrix = {{ task = ["x", "y"] }}

[workflows.clash.steps.all]
command = "true"
workspace = "worktree"
merge = ["parts"]
"#
    );
    let dir = repository(&manifest, &[]);
    let _daemon = Daemon::start_in(dir.path());
    let id = start(dir.path(), "join", &[]);
    let view = wait_until(dir.path(), &id, "the workflow's end", ended);
    assert_eq!(view["state"], "succeeded", "{view:#}");
    let branch = view["steps"]["all"]["branch"].as_str().unwrap();
    for part in view["steps"]["parts"]["instances"].as_array().unwrap() {
        let theirs = part["branch"].as_str().unwrap();
        git(dir.path(), &["merge-base", "--is-ancestor", theirs, branch]);
    }
    assert_eq!(
        git(dir.path(), &["show", &format!("{branch}:all.txt")]).trim(),
        "joined"
    );
    // Two instances that wrote one file differently: the step fails,
    // naming the file, and never runs.
    let id = start(dir.path(), "clash", &[]);
    let view = wait_until(dir.path(), &id, "the workflow's end", ended);
    assert_eq!(view["state"], "failed", "{view:#}");
    let all = &view["steps"]["all"];
    assert!(all["run"].is_null(), "{view:#}");
    let detail = all["detail"].as_str().unwrap();
    assert!(detail.contains("conflicts in `same.txt`"), "{detail}");
}

#[test]
fn what_a_step_hands_on_is_data_a_ref_that_reads_as_an_option_or_an_oversized_output_fails_its_step()
 {
    let dir = repository(
        r#"version = 1

[workflows.hostile.steps.plan]
command = "python3"
args = ["-c", "import json; json.dump({'ref': '--output=/tmp/npc-pwned', 'note': '{{ 7 * 7 }}'}, open('plan.json', 'w'))"]
workspace = "worktree"
outputs = { file = "plan.json" }

[workflows.hostile.steps.build]
command = "true"
workspace = "worktree"
needs = ["plan"]
base = "{{ steps.plan.output.ref }}"

[workflows.hostile.steps.echo]
command = "sh"
args = ["-c", "printf '%s' \"$NPC_TRIGGER_PAYLOAD\" > echo.json"]
workspace = "worktree"
needs = ["plan"]

[workflows.big.steps.huge]
command = "python3"
args = ["-c", "open('out.json', 'w').write('[' + '1,' * 700000 + '1]')"]
workspace = "worktree"
outputs = { file = "out.json" }
"#,
        &[],
    );
    let _daemon = Daemon::start_in(dir.path());
    let id = start(dir.path(), "hostile", &[]);
    let view = wait_until(dir.path(), &id, "the workflow's end", ended);
    assert_eq!(view["state"], "failed", "{view:#}");
    let build = &view["steps"]["build"];
    assert_eq!(build["state"], "failed", "{view:#}");
    let detail = build["detail"].as_str().unwrap();
    assert!(detail.contains("--output=/tmp/npc-pwned"), "{detail}");
    assert!(!Path::new("/tmp/npc-pwned").exists());
    // The text a step wrote is handed on as it is, never rendered again.
    let branch = view["steps"]["echo"]["branch"].as_str().unwrap();
    let payload: Value =
        serde_json::from_str(&git(dir.path(), &["show", &format!("{branch}:echo.json")])).unwrap();
    assert_eq!(
        payload["context"]["steps"]["plan"]["output"]["note"],
        "{{ 7 * 7 }}"
    );
    // An output file past the bound fails its step, read no further.
    let id = start(dir.path(), "big", &[]);
    let view = wait_until(dir.path(), &id, "the workflow's end", ended);
    assert_eq!(view["state"], "failed", "{view:#}");
    let detail = view["steps"]["huge"]["detail"].as_str().unwrap();
    assert!(detail.contains("larger than"), "{detail}");
}
