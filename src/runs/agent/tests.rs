//! Unit tests of agent runs: prompt choice, MCP config preparation, the
//! compact view, run ids and outcomes.

use super::*;
use crate::runs::{RUN_ID_PREFIX, new_run_id};

#[test]
fn run_ids_are_unique_sortable_and_valid_components() {
    let a = new_run_id();
    let b = new_run_id();
    assert_ne!(a, b);
    assert!(a.starts_with(RUN_ID_PREFIX));
    assert!(
        a.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-'),
        "{a}"
    );
    assert_eq!(a.len(), b.len());
}

#[test]
fn outcomes_map_to_exit_codes() {
    assert_eq!(Outcome::Succeeded.exit_code(), 0);
    let exit = ExitInfo {
        code: Some(3),
        signal: None,
    };
    assert_eq!(Outcome::Failed { exit }.exit_code(), 1);
    assert_eq!(Outcome::TimedOut.exit_code(), 124);
    assert_eq!(Outcome::Cancelled { signal: 2 }.exit_code(), 130);
    assert_eq!(Outcome::Cancelled { signal: 15 }.exit_code(), 143);
    let blocked = Outcome::Blocked {
        denials: vec![RunDenial {
            tool: "Bash".into(),
            rule: "permission_denials".into(),
            by: DeniedBy::Cli,
            reason: None,
        }],
    };
    assert_eq!(blocked.exit_code(), EXIT_BLOCKED);
    assert_eq!(blocked.as_str(), "blocked");
    assert_eq!(blocked.reason(), Some("denied"));
    assert_eq!(Outcome::NoChanges.as_str(), "failed");
    assert_eq!(Outcome::NoChanges.reason(), Some("no_changes"));
    assert_eq!(Outcome::NoChanges.exit_code(), 1);
    let Outcome::Blocked { denials } = &blocked else {
        unreachable!()
    };
    assert_eq!(
        denials_in_words(denials),
        "`Bash` denied by cli (permission_denials)"
    );
}

#[test]
fn a_tool_s_names_across_cli_and_gateway_are_one_tool() {
    assert!(same_tool("mcp__npc__everything__echo", "everything__echo"));
    assert!(same_tool("everything__echo", "mcp__npc__everything__echo"));
    assert!(same_tool("Bash", "Bash"));
    assert!(!same_tool("Bash", "NotBash"));
    assert!(!same_tool("", "Bash"));
    assert!(!same_tool("echo", "everything__decho"));
}

#[test]
fn event_payload_carries_type_and_run_id() {
    let e = AgentEvent::Message {
        text: "hi".into(),
        delta: false,
    };
    let v = event_payload("run-1", &e);
    assert_eq!(v["type"], "agent.message");
    assert_eq!(v["run_id"], "run-1");
    assert_eq!(v["text"], "hi");
}

fn manifest(dir: &Path, kind: &str) -> Manifest {
    let text = format!(
        r#"
version = 1
[mcp.servers.fs]
command = "npx"
[mcp.servers.other]
command = "other"
[providers.p]
kind = "{kind}"
env = {{ FROM_MANIFEST = "yes" }}
[profiles.dev]
provider = "p"
description = "d"
mcp_servers = ["fs"]
"#
    );
    let path = dir.join("npcagent.toml");
    std::fs::write(&path, text).unwrap();
    crate::plugins::files::load_path(&path, &crate::disk::ProcessEnv)
        .unwrap()
        .manifest
        .expect("valid manifest")
}

fn request(prompt: PromptChoice) -> RunRequest {
    RunRequest {
        profile: "dev".into(),
        prompt,
        timeout: DEFAULT_RUN_TIMEOUT,
        cwd: None,
        probe_after: crate::providers::STALE_AFTER,
        trigger: None,
        provider: None,
    }
}

#[test]
fn prepare_writes_only_the_profiles_servers_and_keeps_the_plan_env() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let m = manifest(&root, "claude_code");
    let literal = PromptChoice::Literal { text: "hi".into() };
    let run = prepare(&m, &root, &request(literal), "run-x".into()).unwrap();
    let config = run.mcp_config.expect("an MCP config for claude");
    assert!(config.starts_with(root.join(".npc/runs/run-x")));
    let text = std::fs::read_to_string(config).unwrap();
    assert!(
        text.contains("\"fs\"") && !text.contains("\"other\""),
        "{text}"
    );
    assert_eq!(
        run.spec.env.get("FROM_MANIFEST").map(String::as_str),
        Some("yes")
    );
    assert_eq!(run.spec.cwd, root);
    assert!(run.warnings.is_empty());
}

#[test]
fn prepare_hands_codex_its_servers_as_config_overrides() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let m = manifest(&root, "codex");
    let literal = PromptChoice::Literal { text: "hi".into() };
    let run = prepare(&m, &root, &request(literal), "run-y".into()).unwrap();
    assert_eq!(run.mcp_config, None);
    assert!(run.warnings.is_empty(), "{:?}", run.warnings);
    let at = run.spec.args.iter().position(|a| a == "-c").expect("-c");
    assert!(
        run.spec.args[at + 1].starts_with("mcp_servers.fs={ command = \"npx\""),
        "{:?}",
        run.spec.args
    );
    assert_eq!(run.spec.args.iter().filter(|a| *a == "-c").count(), 1);
    assert!(!root.join(".npc/runs/run-y").exists());
}

#[test]
fn a_gemini_run_needs_its_servers_in_the_workspace_settings() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let m = manifest(&root, "gemini_cli");
    let literal = PromptChoice::Literal { text: "hi".into() };
    let err = prepare(&m, &root, &request(literal.clone()), "run-w".into()).unwrap_err();
    assert!(matches!(err, RunError::WorkspaceSettings { .. }), "{err}");
    assert!(err.to_string().contains("`fs`"), "{err}");
    assert!(!root.join(".gemini").exists());
    std::fs::create_dir(root.join(".gemini")).unwrap();
    std::fs::write(
        root.join(".gemini/settings.json"),
        r#"{"mcpServers": {"fs": {"command": "npx"}, "other": {"command": "o"}}}"#,
    )
    .unwrap();
    let run = prepare(&m, &root, &request(literal), "run-w".into()).unwrap();
    assert_eq!(run.mcp_config, Some(root.join(".gemini/settings.json")));
    let at = run
        .spec
        .args
        .iter()
        .position(|a| a == "--allowed-mcp-server-names")
        .expect("the names flag");
    assert_eq!(run.spec.args[at + 1], "fs");
    assert!(!run.spec.env.contains_key("GEMINI_CLI_SYSTEM_SETTINGS_PATH"));
}

#[test]
fn a_gemini_run_in_an_own_worktree_without_settings_gets_them_written() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let m = manifest(&root, "gemini_cli");
    let worktree = root.join(".npc/worktrees/run-t");
    std::fs::create_dir_all(&worktree).unwrap();
    let mut req = request(PromptChoice::Literal { text: "hi".into() });
    req.cwd = Some(worktree.clone());
    let run = prepare(&m, &root, &req, "run-t".into()).unwrap();
    let settings = worktree.join(".gemini/settings.json");
    assert_eq!(run.mcp_config.as_ref(), Some(&settings));
    let text = std::fs::read_to_string(&settings).unwrap();
    let parsed: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(parsed["mcpServers"]["fs"]["command"], "npx", "{text}");
    // Elsewhere (a directory of the user's) nothing is written.
    let elsewhere = root.join("sub");
    std::fs::create_dir(&elsewhere).unwrap();
    req.cwd = Some(elsewhere.clone());
    assert!(prepare(&m, &root, &req, "run-u".into()).is_err());
    assert!(!elsewhere.join(".gemini").exists());
}

#[test]
fn prepare_rejects_a_profile_without_prompt_and_a_missing_cwd() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let m = manifest(&root, "claude_code");
    let err = prepare(&m, &root, &request(PromptChoice::Profile), "run-z".into()).unwrap_err();
    assert!(matches!(err, RunError::NoPrompt { .. }), "{err}");
    let mut req = request(PromptChoice::Literal { text: "hi".into() });
    req.cwd = Some(root.join("missing"));
    let err = prepare(&m, &root, &req, "run-z".into()).unwrap_err();
    assert!(matches!(err, RunError::BadCwd { .. }), "{err}");
}

#[test]
fn in_gateway_mode_a_run_sees_the_gateway_only() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let mut m = manifest(&root, "claude_code");
    m.mcp.gateway = true;
    let literal = PromptChoice::Literal { text: "hi".into() };
    let run = prepare(&m, &root, &request(literal), "run-g".into()).unwrap();
    let text = std::fs::read_to_string(run.mcp_config.expect("an MCP config")).unwrap();
    let config: serde_json::Value = serde_json::from_str(&text).unwrap();
    let servers: Vec<&String> = config["mcpServers"].as_object().unwrap().keys().collect();
    assert_eq!(servers, ["npc"], "{text}");
    assert_eq!(config["mcpServers"]["npc"]["command"], "npc");
    assert_eq!(
        config["mcpServers"]["npc"]["args"],
        serde_json::json!(["mcp", "serve"])
    );
    // Its `npc mcp serve` knows the run.
    assert_eq!(
        run.spec.env.get(RUN_ID_ENV).map(String::as_str),
        Some("run-g")
    );
}

#[test]
fn an_acp_run_leaves_out_a_server_missing_a_value_rather_than_pass_it_empty() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("npcagent.toml");
    std::fs::write(
        &path,
        "version = 1\n[mcp.servers.gh]\ncommand = \"gh-mcp\"\nenv = { TOKEN = \"${NPC_TEST_SURELY_UNSET_TOKEN}\" }\n[mcp.servers.fs]\ncommand = \"fs-mcp\"\n",
    )
    .unwrap();
    let m = crate::plugins::files::load_path(&path, &crate::disk::ProcessEnv)
        .unwrap()
        .manifest
        .expect("an unset server value is a warning");
    let mut warnings = Vec::new();
    let entries = super::acp::mcp_entries(&m, &mut warnings);
    let names: Vec<String> = entries
        .iter()
        .map(|e| match e {
            crate::providers::acp::McpEntry::Stdio { name, .. }
            | crate::providers::acp::McpEntry::Http { name, .. } => name.clone(),
        })
        .collect();
    assert_eq!(names, ["fs"]);
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("`gh` is left out") && w.contains("NPC_TEST_SURELY_UNSET_TOKEN")),
        "{warnings:?}"
    );
}
