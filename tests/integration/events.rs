//! The events' published schema: `schemas/events.schema.json` and
//! `docs/events.md` are what `npc schema --events` prints, and every event
//! a full demo run records (daemon, triggers, a worktree run, an MCP call
//! through the gateway, a hook's denial, a pane) validates against it, as
//! `npc events --format json` prints it.

use serde_json::{Value, json};

use crate::support::{
    Daemon, committed_is_generated, npc, repo_root, updating_generated, wait_for,
};

fn printed(args: &[&str]) -> String {
    let out = npc()
        .args(args)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    String::from_utf8(out).unwrap()
}

#[test]
fn committed_events_schema_is_the_generated_one() {
    let generated = npcagent::event::json_schema();
    committed_is_generated(
        "schemas/events.schema.json",
        &serde_json::to_string_pretty(&generated).unwrap(),
    );
    // The binary prints the committed text it carries.
    if !updating_generated() {
        let committed =
            std::fs::read_to_string(repo_root().join("schemas/events.schema.json")).unwrap();
        assert_eq!(
            committed.trim_end(),
            printed(&["schema", "--events"]).trim_end()
        );
    }
}

#[test]
fn committed_events_doc_is_the_generated_one() {
    let doc = npcagent::event::markdown_of(&npcagent::event::json_schema());
    committed_is_generated("docs/events.md", &doc);
    if !updating_generated() {
        let committed = std::fs::read_to_string(repo_root().join("docs/events.md")).unwrap();
        let printed = printed(&["schema", "--events", "--markdown"]);
        assert_eq!(committed.trim_end(), printed.trim_end());
    }
    for kind in npcagent::event::Event::KINDS {
        assert!(
            doc.contains(&format!("## `{kind}`")),
            "`{kind}` is not in docs/events.md"
        );
    }
}

#[test]
fn schema_flags_that_conflict_are_refused() {
    npc()
        .args(["schema", "--openapi", "--events"])
        .assert()
        .failure();
    npc().args(["schema", "--markdown"]).assert().failure();
}

/// The shipped demo (its MCP server, its cron trigger, its shell pane) with
/// a worktree trigger and a hook that denies one of the demo server's tools,
/// in a git repository.
fn demo_repository() -> tempfile::TempDir {
    let demo = repo_root().join("examples/demo");
    let mut manifest = std::fs::read_to_string(demo.join("npcagent.toml"))
        .unwrap()
        .replace("127.0.0.1:8766", "127.0.0.1:0")
        .replace("schedule = \"10s\"", "schedule = \"1s\"");
    manifest.push_str(
        "\n[triggers.tree]\nkind = \"cron\"\nschedule = \"@yearly\"\nworkspace = \"worktree\"\n\
         action = { command = \"sh\", args = [\"-c\", \"echo tree > tree.txt\"] }\n",
    );
    manifest.push_str(&crate::hooks::deny_hook("^hello__add$", "no adding here"));
    let server = std::fs::read_to_string(demo.join("tools/hello_mcp.py")).unwrap();
    crate::worktrees::repository(&manifest, &[("tools/hello_mcp.py", &server)])
}

#[test]
fn every_event_of_a_full_demo_run_validates_against_the_events_schema() {
    if !crate::mcp::python_sdk() {
        return;
    }
    let dir = demo_repository();
    let d = Daemon::start_in(dir.path());
    wait_for("the demo's MCP server to connect", || {
        (d.status_json()["mcp"]["servers"][0]["state"] == "connected").then_some(())
    });
    // A worktree run, fired by hand.
    d.npc(&["trigger", "fire", "tree"]).success();
    wait_for("the worktree run to succeed", || {
        crate::worktrees::runs(d.root())
            .iter()
            .any(|r| r["trigger"] == "tree" && r["state"] == "succeeded")
            .then_some(())
    });
    // An MCP call through the gateway, and one a hook denies.
    let got = crate::mcp::stdio_session_in(
        d.root(),
        json!([
            ["call", "hello__hello", { "name": "npc" }],
            ["call", "hello__add", { "a": 1, "b": 2 }],
        ]),
    );
    assert_eq!(got[0]["is_error"], false, "{got:?}");
    assert_eq!(got[1]["is_error"], true, "{got:?}");
    wait_for("a heartbeat run to succeed", || {
        crate::worktrees::runs(d.root())
            .iter()
            .any(|r| r["trigger"] == "heartbeat" && r["state"] == "succeeded")
            .then_some(())
    });
    let want = [
        "daemon.started",
        "reconcile.applied",
        "component.started",
        "run.queued",
        "run.workspace",
        "run.finished",
        "mcp.tool_call",
        "hook.call",
        "pane.opened",
    ];
    let (events, text) = wait_for("every kind the demo makes, on `npc events`", || {
        let (events, text) = d.cli_events();
        want.iter()
            .all(|k| events.iter().any(|e| e["kind"] == *k))
            .then_some((events, text))
    });
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(repo_root().join("schemas/events.schema.json")).unwrap(),
    )
    .unwrap();
    let validator = jsonschema::validator_for(&schema).expect("the events schema compiles");
    let mut failures = Vec::new();
    for e in &events {
        let row = json!({ "kind": e["kind"], "payload": e["payload"] });
        let errors: Vec<String> = validator.iter_errors(&row).map(|e| e.to_string()).collect();
        if !errors.is_empty() {
            failures.push(format!("{row}: {errors:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(events.len(), text.lines().count(), "every line is an event");
    let denied = events
        .iter()
        .find(|e| e["kind"] == "hook.call" && e["payload"]["decision"] == "deny")
        .unwrap_or_else(|| panic!("no denial in {text}"));
    assert_eq!(denied["payload"]["tool"], "hello__add", "{denied}");
}

/// `npc events --limit N`: the last N events, in order (read from the
/// store once the daemon that wrote them stopped, so none arrives between
/// two reads).
#[test]
fn events_limit_prints_the_last_n() {
    let mut d = Daemon::start("version = 1\n[panes.one]\ncommand = \"sh\"\n");
    d.terminate();
    let all = |args: &[&str]| -> Vec<i64> {
        let mut argv = vec!["events", "--format", "json"];
        argv.extend_from_slice(args);
        String::from_utf8(d.npc(&argv).success().get_output().stdout.clone())
            .unwrap()
            .lines()
            .map(|l| {
                serde_json::from_str::<Value>(l).unwrap()["id"]
                    .as_i64()
                    .unwrap()
            })
            .collect()
    };
    let every = all(&[]);
    assert!(every.len() > 3, "{every:?}");
    let last = all(&["--limit", "3"]);
    assert_eq!(last, every[every.len() - 3..], "{every:?}");
    assert_eq!(all(&["--limit", "100000"]), every);
    assert!(all(&["--limit", "0"]).is_empty());
    // `--since` past the limit's floor wins.
    let since = every[every.len() - 2].to_string();
    assert_eq!(
        all(&["--limit", "3", "--since", &since]),
        every[every.len() - 1..]
    );
}
