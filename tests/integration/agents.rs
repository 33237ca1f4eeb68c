//! One MCP registry for every agent CLI, end to end through `npc`: apply
//! writes each declared provider's native config and the rendered profiles,
//! keeps the user's own entries, refuses broken files, never writes secret
//! values, and import → apply → import round-trips.

use crate::support::npc;

const MANIFEST: &str = r#"version = 1
[mcp.servers.fs]
command = "npx"
args = ["-y", "@modelcontextprotocol/server-filesystem", "."]
env = { TOKEN = "${NPC_AGENTS_TEST_SECRET}" }

[mcp.servers.search]
url = "https://mcp.example.com/mcp"
bearer_token_env = "SEARCH_TOKEN"

[providers.claude]
kind = "claude_code"
[providers.codex]
kind = "codex"
[providers.gemini]
kind = "gemini_cli"
[providers.opencode]
kind = "opencode"

[prompts.review]
template = "Review {{ vars.branch }}."
variables.branch = { default = "main" }

[profiles.reviewer]
provider = "claude"
description = "Reviews changes"
prompt = "review"
mcp_servers = ["fs", "search"]
"#;

const SECRET: &str = "s3cr3t-value-never-written";

fn repo(manifest: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("npcagent.toml"), manifest).unwrap();
    dir
}

fn run(dir: &std::path::Path, args: &[&str]) -> assert_cmd::assert::Assert {
    npc()
        .current_dir(dir)
        .env("NPC_AGENTS_TEST_SECRET", SECRET)
        .args(args)
        .assert()
}

#[test]
fn apply_writes_every_native_config_and_profile_without_secrets() {
    let dir = repo(MANIFEST);
    run(dir.path(), &["plan", "--detailed-exitcode"])
        .code(2)
        .stdout(predicates::str::contains("+ .mcp.json"));
    run(dir.path(), &["apply", "--auto-approve"]).success();
    for file in [
        ".mcp.json",
        ".codex/config.toml",
        ".gemini/settings.json",
        "opencode.json",
        ".npc/profiles/reviewer.md",
    ] {
        let text = std::fs::read_to_string(dir.path().join(file))
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(
            !text.contains(SECRET),
            "{file} contains the secret value:\n{text}"
        );
        assert!(
            text.contains("fs") || text.contains("reviewer"),
            "{file}:\n{text}"
        );
    }
    let claude = std::fs::read_to_string(dir.path().join(".mcp.json")).unwrap();
    assert!(claude.contains("${NPC_AGENTS_TEST_SECRET}"), "{claude}");
    assert!(claude.contains("Bearer ${SEARCH_TOKEN}"), "{claude}");
    let opencode = std::fs::read_to_string(dir.path().join("opencode.json")).unwrap();
    assert!(
        opencode.contains("{env:NPC_AGENTS_TEST_SECRET}"),
        "{opencode}"
    );
    // Applied once, nothing left to do.
    run(dir.path(), &["plan", "--detailed-exitcode"]).code(0);
}

#[test]
fn the_users_own_entries_survive_and_broken_files_are_left_alone() {
    let dir = repo(MANIFEST);
    std::fs::write(dir.path().join(".mcp.json"), "{\n  \"mcpServers\": {\n    \"mine\": { \"command\": \"my-server\" }\n  },\n  \"other\": true\n}\n").unwrap();
    run(dir.path(), &["apply", "--auto-approve"]).success();
    let text = std::fs::read_to_string(dir.path().join(".mcp.json")).unwrap();
    assert!(
        text.contains("\"mine\"") && text.contains("\"other\": true") && text.contains("\"fs\""),
        "{text}"
    );

    let broken = "{ \"mcpServers\": { oops } }";
    std::fs::write(dir.path().join(".gemini/settings.json"), broken).unwrap();
    let out = run(dir.path(), &["plan"]).code(1);
    let stdout = String::from_utf8_lossy(&out.get_output().stdout).to_string();
    assert!(
        stdout.contains(".gemini/settings.json") && stdout.contains("error"),
        "{stdout}"
    );
    run(dir.path(), &["apply", "--auto-approve"]).failure();
    assert_eq!(
        std::fs::read_to_string(dir.path().join(".gemini/settings.json")).unwrap(),
        broken
    );
}

#[test]
fn import_apply_import_round_trips() {
    let dir = repo("version = 1\n[providers.claude]\nkind = \"claude_code\"\n");
    std::fs::write(
        dir.path().join("theirs.json"),
        r#"{"mcpServers": {
            "files": {"type": "stdio", "command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "."], "env": {"KEY": "${THEIR_KEY}"}},
            "web": {"type": "http", "url": "https://mcp.example.com/mcp", "headers": {"X-Team": "core"}}
        }}"#,
    )
    .unwrap();
    let first = run(dir.path(), &["import", "theirs.json"])
        .success()
        .get_output()
        .stdout
        .clone();
    run(dir.path(), &["import", "theirs.json", "--write"]).success();
    npc()
        .current_dir(dir.path())
        .env("THEIR_KEY", "k")
        .args(["validate"])
        .assert()
        .success();
    npc()
        .current_dir(dir.path())
        .env("THEIR_KEY", "k")
        .args(["apply", "--auto-approve"])
        .assert()
        .success();
    let second = run(dir.path(), &["import", ".mcp.json"])
        .success()
        .get_output()
        .stdout
        .clone();
    assert_eq!(
        String::from_utf8_lossy(&first),
        String::from_utf8_lossy(&second)
    );
    let written = std::fs::read_to_string(dir.path().join(".mcp.json")).unwrap();
    assert!(
        written.contains("${THEIR_KEY}") && !written.contains("\"k\""),
        "{written}"
    );
}

#[test]
fn import_rejects_garbage_with_a_clear_error() {
    let dir = repo("version = 1\n");
    std::fs::write(dir.path().join(".mcp.json"), b"\x00\x01 not json").unwrap();
    run(dir.path(), &["import", ".mcp.json"])
        .code(1)
        .stderr(predicates::str::contains(".mcp.json"));
}

#[test]
fn user_level_files_only_with_the_flag() {
    let dir = repo(MANIFEST);
    let home = tempfile::tempdir().unwrap();
    npc()
        .current_dir(dir.path())
        .env("HOME", home.path())
        .env("NPC_AGENTS_TEST_SECRET", SECRET)
        .args(["apply", "--auto-approve", "--user"])
        .assert()
        .success();
    let user_file = std::fs::read_to_string(home.path().join(".claude.json")).unwrap();
    assert!(
        user_file.contains("\"fs\"") && !user_file.contains(SECRET),
        "{user_file}"
    );
    assert!(home.path().join(".codex/config.toml").is_file());
    assert!(
        !dir.path().join(".mcp.json").exists(),
        "--user must not write the project file"
    );
}

/// The installed agent CLI `program`, if any, run in `dir` with its own
/// (empty) home so no user config mixes in.
fn agent_cli(
    program: &str,
    dir: &std::path::Path,
    home: &std::path::Path,
) -> Option<std::process::Command> {
    if !crate::support::require(crate::support::Peer::program(
        program,
        "npm install -g @anthropic-ai/claude-code @google/gemini-cli opencode-ai",
    )) {
        return None;
    }
    let mut cmd = std::process::Command::new(program);
    cmd.current_dir(dir)
        .env("HOME", home)
        .env_remove("XDG_CONFIG_HOME")
        .stdin(std::process::Stdio::null());
    Some(cmd)
}

/// Longest an installed agent CLI may take to list its MCP servers.
const CLI_LIST_LIMIT: std::time::Duration = std::time::Duration::from_secs(90);

fn list_output(mut cmd: std::process::Command, args: &[&str]) -> String {
    cmd.args(args);
    let out = assert_cmd::Command::from_std(cmd)
        .timeout(CLI_LIST_LIMIT)
        .output()
        .expect("the agent CLI runs");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Where installed, the agent CLIs themselves read what npc writes: Gemini
/// a settings file with comments and `type = "http"`, Claude the per-server
/// `timeout`, OpenCode `cwd` and `timeout`.
#[test]
fn installed_agent_clis_read_the_files_npc_writes() {
    let dir = repo(
        "version = 1\n[providers.claude]\nkind = \"claude_code\"\n[providers.gemini]\nkind = \"gemini_cli\"\n[providers.opencode]\nkind = \"opencode\"\n\n[mcp.servers.fs]\ncommand = \"true\"\ncwd = \".\"\ntool_timeout_ms = 30000\n\n[mcp.servers.web]\nurl = \"http://127.0.0.1:9/mcp\"\n",
    );
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join(".gemini")).unwrap();
    std::fs::write(
        dir.path().join(".gemini/settings.json"),
        "// kept by hand\n{\n  /* no servers yet */\n}\n",
    )
    .unwrap();
    run(dir.path(), &["apply", "--auto-approve"]).success();
    assert!(
        std::fs::read_to_string(dir.path().join(".gemini/settings.json"))
            .unwrap()
            .contains("// kept by hand")
    );
    if let Some(cmd) = agent_cli("gemini", dir.path(), home.path()) {
        let out = list_output(cmd, &["mcp", "list"]);
        assert!(
            out.contains("fs: true") && out.contains("web: http://127.0.0.1:9/mcp (http)"),
            "{out}"
        );
    }
    if let Some(cmd) = agent_cli("claude", dir.path(), home.path()) {
        let out = list_output(cmd, &["mcp", "get", "fs"]);
        assert!(out.contains("Timeout: 30000ms"), "{out}");
    }
    if let Some(cmd) = agent_cli("opencode", dir.path(), home.path()) {
        let out = list_output(cmd, &["mcp", "list"]);
        assert!(
            out.contains("fs") && out.contains("web") && out.contains("2 server"),
            "{out}"
        );
    }
}
