//! `npc render`: the real binary rendering profiles and prompts of a
//! manifest in a temporary git repository.

use std::path::Path;

use crate::support::npc;

const MANIFEST: &str = r##"
version = 1

[project]
name = "demo"

[mcp.servers.fs]
command = "npx"
args = ["-y", "@modelcontextprotocol/server-filesystem", "."]
env = { API_TOKEN = "${NPC_RENDER_TEST_TOKEN}" }

[mcp.servers.search]
url = "https://mcp.example.com/mcp"
bearer_token_env = "SEARCH_TOKEN"
disabled_tools = ["delete"]

[providers.claude]
kind = "claude_code"

[prompts.review]
template = """
Review {{ vars.branch }} of {{ project.name }} for {{ profile.name }}.
{% if trigger %}Event: {{ trigger.event }}{% endif %}<memory>notes from last run</memory>
"""
variables.branch = { default = "main" }

[prompts.needs]
template = "Deploy\nto {{ vars.target }}\n"
variables.target = { description = "where to deploy" }

[profiles.reviewer]
provider = "claude"
description = "Reviews: changes \"before\" they merge # carefully"
prompt = "review"
model = "claude-sonnet-4-5"
mcp_servers = ["fs", "search"]
allowed_tools = ["mcp__fs__read_file", "Bash(git diff:*)"]
denied_tools = ["mcp__fs__write_file"]
skills = ["code-review"]
frontmatter = { role = "reviewer", tags = ["ci", "- review"] }
"##;

fn repo() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join(".git")).unwrap();
    std::fs::write(
        dir.path().join(".git/HEAD"),
        "ref: refs/heads/feature/render\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("npcagent.toml"), MANIFEST).unwrap();
    dir
}

fn render(dir: &Path, args: &[&str]) -> assert_cmd::assert::Assert {
    npc()
        .current_dir(dir)
        .env("NPC_RENDER_TEST_TOKEN", "hunter2-do-not-print")
        .arg("render")
        .args(args)
        .assert()
}

fn stdout(a: &assert_cmd::assert::Assert) -> String {
    String::from_utf8(a.get_output().stdout.clone()).unwrap()
}

fn stderr(a: &assert_cmd::assert::Assert) -> String {
    String::from_utf8(a.get_output().stderr.clone()).unwrap()
}

#[test]
fn renders_a_profile() {
    let dir = repo();
    let a = render(dir.path(), &["profile", "reviewer"]).success();
    let out = stdout(&a);
    assert!(!out.contains("hunter2"), "secret leaked:\n{out}");
    assert!(!out.contains("<memory"), "memory tag kept:\n{out}");
    let root = dir.path().canonicalize().unwrap();
    let shown = out.replace(&root.display().to_string(), "[ROOT]");
    insta::assert_snapshot!(shown);

    // The frontmatter is valid YAML with the expected values.
    let front = out
        .strip_prefix("---\n")
        .and_then(|r| r.split_once("---\n"))
        .map(|(f, _)| f)
        .unwrap();
    let parsed: serde_json::Value = serde_norway::from_str(front).unwrap();
    assert_eq!(
        parsed["description"],
        "Reviews: changes \"before\" they merge # carefully"
    );
    assert_eq!(
        parsed["mcpServers"]["fs"]["env"]["API_TOKEN"],
        "${NPC_RENDER_TEST_TOKEN}"
    );

    // Same manifest, same bytes.
    let again = render(dir.path(), &["profile", "reviewer"]).success();
    assert_eq!(stdout(&again), out);
}

#[test]
fn write_puts_the_profile_under_the_state_dir() {
    let dir = repo();
    let printed = stdout(&render(dir.path(), &["profile", "reviewer"]).success());
    render(dir.path(), &["profile", "reviewer", "--write"]).success();
    let written = std::fs::read_to_string(dir.path().join(".npc/profiles/reviewer.md")).unwrap();
    assert_eq!(written, printed);
}

#[test]
fn renders_a_prompt_with_vars_profile_and_trigger() {
    let dir = repo();
    let a = render(
        dir.path(),
        &[
            "prompt",
            "review",
            "--var",
            "branch=topic",
            "--profile",
            "reviewer",
            "--trigger",
            r#"{"event": "push"}"#,
        ],
    )
    .success();
    assert_eq!(
        stdout(&a),
        "Review topic of demo for reviewer.\nEvent: push\n"
    );
}

#[test]
fn a_missing_variable_names_template_line_and_variable() {
    let dir = repo();
    let a = render(dir.path(), &["prompt", "needs"]).code(1);
    let err = stderr(&a);
    assert!(
        err.contains("undefined value `vars.target` in template `prompts.needs` line 2"),
        "{err}"
    );
    assert!(err.contains("--var target=VALUE"), "{err}");
    let ok = render(dir.path(), &["prompt", "needs", "--var", "target=prod"]).success();
    assert_eq!(stdout(&ok), "Deploy\nto prod\n");
}

#[test]
fn unknown_names_and_bad_vars_fail() {
    let dir = repo();
    let a = render(dir.path(), &["profile", "nobody"]).code(1);
    assert!(stderr(&a).contains("no profile `nobody` in the manifest; known profiles: `reviewer`"));
    let a = render(dir.path(), &["prompt", "review", "--var", "nope=1"]).code(1);
    assert!(stderr(&a).contains("prompt `review` has no variable `nope`"));
    render(dir.path(), &["prompt", "review", "--var", "novalue"]).code(2);
}

#[test]
fn an_invalid_manifest_prints_diagnostics_and_fails() {
    let dir = repo();
    std::fs::write(
        dir.path().join("npcagent.toml"),
        "version = 1\n[profiles.x]\nprovider = \"missing\"\ndescription = \"d\"\n",
    )
    .unwrap();
    let a = render(dir.path(), &["profile", "x"]).code(1);
    assert!(stdout(&a).is_empty());
    let err = stderr(&a);
    assert!(err.contains("missing"), "{err}");
    assert!(err.contains("is invalid"), "{err}");
}
