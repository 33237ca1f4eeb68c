//! Planner tests: a table of before/after manifests and the plan between
//! them, snapshot-tested.

use std::collections::BTreeMap;

use super::*;
use crate::model::{self, Syntax};

struct NoFiles;
impl model::Files for NoFiles {
    fn read_to_string(&self, path: &std::path::Path) -> std::io::Result<String> {
        match path.to_str() {
            Some("prompts/a.md") => Ok("A {{ vars.x }}".into()),
            Some("prompts/b.md") => Ok("B {{ vars.x }}".into()),
            _ => Err(std::io::ErrorKind::NotFound.into()),
        }
    }
    fn is_dir(&self, _: &std::path::Path) -> bool {
        false
    }
}

fn manifest(text: &str, env: &[(&str, &str)]) -> model::Manifest {
    let env: BTreeMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let loaded = model::load_bytes("t.toml", text.as_bytes(), Syntax::Toml, &env, &NoFiles);
    loaded.manifest.unwrap_or_else(|| {
        panic!(
            "invalid: {:?}",
            loaded
                .diagnostics
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
        )
    })
}

fn desired_of(text: &str) -> Desired {
    desired(&manifest(text, &[]), &ExternalInputs::default())
}

fn plan_between(before: &str, after: &str) -> Plan {
    plan(&desired_of(after), &observe(&desired_of(before)))
}

const BASE: &str = r#"
version = 1
[mcp.servers.fs]
command = "srv"
args = ["--root", "."]
disabled_tools = ["write"]
[providers.claude]
kind = "claude_code"
[prompts.p]
file = "prompts/a.md"
variables.x = { default = "1" }
[profiles.r]
provider = "claude"
description = "d"
prompt = "p"
mcp_servers = ["fs"]
[pane_plugins.rec]
command = "rec"
enabled = true
allowed_resume_flags = ["--session"]
[triggers.t]
kind = "cron"
schedule = "0 3 * * *"
action = { command = "make" }
[[hooks.before_tool]]
command = "check"
"#;

fn edit(from: &str, to: &str) -> String {
    assert!(BASE.contains(from), "{from}");
    BASE.replacen(from, to, 1)
}

/// One planner case: name, manifest after the edit, expected action per
/// changed component.
type Case = (&'static str, String, Vec<(&'static str, Action)>);

fn table() -> Vec<Case> {
    vec![
        ("nothing changed", BASE.to_string(), vec![]),
        (
            "reformatted only",
            BASE.replace(
                "args = [\"--root\", \".\"]",
                "args = [ \"--root\" , \".\" ]",
            ),
            vec![],
        ),
        (
            "stdio args replace the server, and the profile that embeds it updates",
            edit("args = [\"--root\", \".\"]", "args = [\"--root\", \"src\"]"),
            vec![
                ("mcp_server.fs", Action::Replace),
                ("profile.r", Action::Update),
            ],
        ),
        (
            "tool filters are live",
            edit(
                "disabled_tools = [\"write\"]",
                "disabled_tools = [\"write\", \"move\"]",
            ),
            vec![
                ("mcp_server.fs", Action::Update),
                ("profile.r", Action::Update),
            ],
        ),
        (
            "pane plugin command replaces",
            edit("command = \"rec\"", "command = \"rec2\""),
            vec![("pane_plugin.rec", Action::Replace)],
        ),
        (
            "pane plugin resume flags are live",
            edit(
                "allowed_resume_flags = [\"--session\"]",
                "allowed_resume_flags = [\"--session\", \"--last\"]",
            ),
            vec![("pane_plugin.rec", Action::Update)],
        ),
        (
            "disabling a pane plugin removes it",
            edit("enabled = true", "enabled = false"),
            vec![("pane_plugin.rec", Action::Remove)],
        ),
        (
            "schedule updates in place",
            edit("schedule = \"0 3 * * *\"", "schedule = \"0 4 * * *\""),
            vec![("trigger.t", Action::Update)],
        ),
        (
            "same schedule spelled differently is no change",
            edit("schedule = \"0 3 * * *\"", "schedule = \"0 3 * * 0-6\""),
            vec![],
        ),
        (
            "trigger kind change replaces",
            edit(
                "kind = \"cron\"\nschedule = \"0 3 * * *\"",
                "kind = \"webhook\"\nroute = \"gh\"\nsecret_env = \"S\"",
            ),
            vec![("trigger.t", Action::Replace)],
        ),
        (
            "template file edit marks prompt and profile",
            edit("file = \"prompts/a.md\"", "file = \"prompts/b.md\""),
            vec![("prompt.p", Action::Update), ("profile.r", Action::Update)],
        ),
        (
            "hook list swaps in place",
            edit("command = \"check\"", "command = \"check2\""),
            vec![("hooks.before_tool", Action::Update)],
        ),
        (
            "new server is added",
            format!("{BASE}\n[mcp.servers.gh]\nurl = \"https://x.example/mcp\"\n"),
            vec![("mcp_server.gh", Action::Add)],
        ),
        (
            "state_dir cannot change live",
            format!("{BASE}\n[project]\nstate_dir = \"elsewhere\"\n"),
            vec![("project.project", Action::Refuse)],
        ),
        (
            "listen address rebinds",
            format!("{BASE}\n[daemon]\nlisten = \"127.0.0.1:9999\"\n"),
            vec![("daemon.api", Action::Replace)],
        ),
        (
            "log level is live",
            format!("{BASE}\n[daemon]\nlog_level = \"debug\"\n"),
            vec![("daemon.api", Action::Update)],
        ),
    ]
}

#[test]
fn planner_table() {
    for (name, after, expected) in table() {
        let plan = plan_between(BASE, &after);
        let got: Vec<(String, Action)> = plan
            .changes
            .iter()
            .filter(|c| c.action != Action::NoOp)
            .map(|c| (c.id.to_string(), c.action))
            .collect();
        let expected: Vec<(String, Action)> = expected
            .into_iter()
            .map(|(id, a)| (id.to_string(), a))
            .collect();
        assert_eq!(
            got,
            expected,
            "case: {name}\n{}",
            render_human(&plan, "test")
        );
    }
}

#[test]
fn plan_output_snapshots() {
    let after = edit("args = [\"--root\", \".\"]", "args = [\"--root\", \"src\"]").replace(
        "allowed_resume_flags = [\"--session\"]",
        "allowed_resume_flags = [\"--session\", \"--last\"]",
    ) + "\n[mcp.servers.gh]\nurl = \"https://x.example/mcp\"\n";
    let plan = plan_between(BASE, &after);
    insta::assert_snapshot!("plan_human", render_human(&plan, "the last applied state"));
    insta::assert_json_snapshot!("plan_json", render_json(&plan, "the last applied state"));
}

#[test]
fn secrets_change_the_fingerprint_but_never_print() {
    let text = "version = 1\n[mcp.servers.s]\ncommand = \"srv\"\nenv = { TOKEN = \"${T}\" }\n";
    let a = desired(
        &manifest(text, &[("T", "first-secret")]),
        &ExternalInputs::default(),
    );
    let b = desired(
        &manifest(text, &[("T", "second-secret")]),
        &ExternalInputs::default(),
    );
    let plan = plan(&b, &observe(&a));
    let change = plan
        .changes
        .iter()
        .find(|c| c.id.to_string() == "mcp_server.s")
        .unwrap();
    assert_eq!(change.action, Action::Replace);
    let shown = format!("{}{}", render_human(&plan, "x"), render_json(&plan, "x"));
    assert!(
        !shown.contains("first-secret") && !shown.contains("second-secret"),
        "{shown}"
    );
    assert!(change.cause.contains("secret"));
}

#[test]
fn flip_undoes_a_plan() {
    let before = observe(&desired_of(BASE));
    let after_text = format!("{BASE}\n[mcp.servers.gh]\nurl = \"https://x.example/mcp\"\n");
    let plan = plan(&desired_of(&after_text), &before);
    let flipped = plan.flip();
    let gh = flipped.changes.iter().find(|c| c.id.name == "gh").unwrap();
    assert_eq!(gh.action, Action::Remove);
    assert!(gh.cause.starts_with("roll back"));
}

#[test]
fn plugin_package_digest_counts() {
    // The test `Files` has no directories, so the plugin is added by hand.
    let m = model::Manifest {
        plugins: [(
            "k".to_string(),
            model::Plugin {
                path: "k".into(),
                enabled: true,
                source: model::PluginSource::Manifest,
                parts: None,
            },
        )]
        .into(),
        ..manifest("version = 1\n", &[])
    };
    let a = desired(
        &m,
        &ExternalInputs {
            plugin_digests: [("k".to_string(), "d1".to_string())].into(),
        },
    );
    let b = desired(
        &m,
        &ExternalInputs {
            plugin_digests: [("k".to_string(), "d2".to_string())].into(),
        },
    );
    let plan = plan(&b, &observe(&a));
    assert_eq!(
        plan.changes
            .iter()
            .find(|c| c.id.name == "k")
            .unwrap()
            .action,
        Action::Replace
    );
}

#[test]
fn against_nothing_every_component_is_added_once() {
    let mut text = String::from("version = 1\n");
    for i in 0..300 {
        text += &format!("[mcp.servers.s{i}]\ncommand = \"srv\"\n");
    }
    let p = plan(&desired_of(&text), &ObservedState::new());
    // 300 servers + the project + the API listener, each exactly once, in order.
    assert_eq!(p.summary().add, 302);
    assert_eq!(p.changes.len(), 302);
    assert!(p.changes.windows(2).all(|w| w[0].id < w[1].id));
    // And applied, the same manifest plans to nothing.
    let again = plan(&desired_of(&text), &observe(&desired_of(&text)));
    assert!(!again.has_changes());
}
