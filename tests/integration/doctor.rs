//! `npc doctor` through the real binary, with stand-in agent CLIs (scripts
//! that print a version) on `PATH` and a throwaway `HOME`: a missing CLI,
//! a version other than npc's recorded one, agent files out of step,
//! Codex's and Gemini CLI's trust of the repository, the `npc` the agent
//! files call, the CLIs' logins and the MCP servers' commands — each a
//! problem (or a warning) with its fix until the fix is made.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use serde_json::Value;

use crate::support::npc;

const MANIFEST: &str = "version = 1\n[mcp.servers.fs]\ncommand = \"true\"\n[providers.claude]\nkind = \"claude_code\"\n[providers.codex]\nkind = \"codex\"\n[providers.gemini]\nkind = \"gemini_cli\"\n[providers.opencode]\nkind = \"opencode\"\n";

/// An executable `name` in `dir` that prints `version`.
fn stand_in(dir: &Path, name: &str, version: &str) {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\necho '{version}'\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// `npc doctor --format json` in `root`: exit code and reports by kind.
fn doctor(root: &Path, bin: &Path, home: &Path) -> (i32, Vec<Value>) {
    let out = npc()
        .current_dir(root)
        .args(["doctor", "--format", "json"])
        .env("PATH", bin)
        .env("HOME", home)
        .env_remove("CODEX_HOME")
        .env_remove("CLAUDE_CONFIG_DIR")
        .env_remove("GEMINI_CLI_TRUSTED_FOLDERS_PATH")
        .env_remove("XDG_DATA_HOME")
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("OPENAI_API_KEY")
        .env_remove("GEMINI_API_KEY")
        .output()
        .unwrap();
    let reports: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (
        out.status.code().unwrap(),
        reports.as_array().unwrap().clone(),
    )
}

/// The check `name` of `kind`'s report (`kind` may be `mcp_server NAME`).
fn check<'a>(reports: &'a [Value], kind: &str, name: &str) -> &'a Value {
    let report = reports
        .iter()
        .find(|r| match kind.strip_prefix("mcp_server ") {
            Some(server) => r["kind"] == "mcp_server" && r["server"] == server,
            None => r["kind"] == kind,
        })
        .unwrap_or_else(|| panic!("no report of {kind}: {reports:#?}"));
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == name)
        .unwrap_or_else(|| panic!("no {name} check for {kind}: {report:#}"))
}

#[test]
fn doctor_names_each_problem_with_its_fix_until_it_is_fixed() {
    let repo = tempfile::tempdir().unwrap();
    let root = repo.path().canonicalize().unwrap();
    let bin = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    std::fs::write(root.join("npcagent.toml"), MANIFEST).unwrap();
    stand_in(bin.path(), "claude", "2.1.197 (Claude Code)");
    stand_in(bin.path(), "codex", "codex-cli 0.171.0");
    stand_in(bin.path(), "gemini", "99.0.0");

    let (code, reports) = doctor(&root, bin.path(), home.path());
    assert_eq!(code, 1);
    let missing = check(&reports, "opencode", "installed");
    assert_eq!(missing["status"], "problem");
    assert_eq!(missing["fix"], "`npm install -g opencode-ai`");
    let claude = check(&reports, "claude_code", "version");
    assert_eq!(claude["status"], "ok", "{claude}");
    let newer = check(&reports, "gemini_cli", "version");
    assert_eq!(newer["status"], "warn", "{newer}");
    assert!(
        newer["fix"]
            .as_str()
            .unwrap()
            .contains("@google/gemini-cli@0.61.0"),
        "{newer}"
    );
    let files = check(&reports, "claude_code", "agent_files");
    assert_eq!(files["status"], "problem", "{files}");
    assert_eq!(files["fix"], "`npc apply`");
    let codex = check(&reports, "codex", "project_trust");
    assert_eq!(codex["status"], "problem");
    assert!(
        codex["fix"]
            .as_str()
            .unwrap()
            .contains(&format!("[projects.\"{}\"]", root.display())),
        "{codex}"
    );
    let claude_trust = check(&reports, "claude_code", "workspace_trust");
    assert_eq!(claude_trust["status"], "problem", "{claude_trust}");
    assert!(
        claude_trust["fix"].as_str().unwrap().contains(&format!(
            "projects[\"{}\"].hasTrustDialogAccepted",
            root.display()
        )),
        "{claude_trust}"
    );
    let gemini = check(&reports, "gemini_cli", "folder_trust");
    assert_eq!(gemini["status"], "problem");
    assert!(
        gemini["fix"].as_str().unwrap().contains("TRUST_FOLDER"),
        "{gemini}"
    );
    // The npc the agent files call, the CLIs' logins, the servers' commands.
    let on_path = check(&reports, "npc", "on_path");
    assert_eq!(on_path["status"], "problem", "{on_path}");
    assert!(
        on_path["fix"].as_str().unwrap().contains("ln -sf"),
        "{on_path}"
    );
    let login = check(&reports, "claude_code", "login");
    assert_eq!(login["status"], "warn", "{login}");
    let server = check(&reports, "mcp_server fs", "command");
    assert_eq!(server["status"], "problem", "{server}");
    // Another npc first on PATH is not this npc.
    stand_in(bin.path(), "npc", "npc 0.0.1");
    let (_, reports) = doctor(&root, bin.path(), home.path());
    let other = check(&reports, "npc", "on_path");
    assert_eq!(other["status"], "problem", "{other}");
    assert!(
        other["detail"].as_str().unwrap().contains("0.0.1"),
        "{other}"
    );

    // The fixes the report gives.
    stand_in(bin.path(), "opencode", "1.18.33");
    std::fs::remove_file(bin.path().join("npc")).unwrap();
    std::os::unix::fs::symlink(crate::support::npc_path(), bin.path().join("npc")).unwrap();
    stand_in(bin.path(), "true", "");
    std::fs::create_dir_all(home.path().join(".claude")).unwrap();
    std::fs::write(home.path().join(".claude/.credentials.json"), "{}").unwrap();
    std::fs::create_dir_all(home.path().join(".codex")).unwrap();
    std::fs::write(
        home.path().join(".codex/config.toml"),
        format!(
            "[projects.\"{}\"]\ntrust_level = \"trusted\"\n",
            root.display()
        ),
    )
    .unwrap();
    std::fs::create_dir_all(home.path().join(".gemini")).unwrap();
    std::fs::write(
        home.path().join(".gemini/trustedFolders.json"),
        serde_json::json!({ root.to_string_lossy(): "TRUST_FOLDER" }).to_string(),
    )
    .unwrap();
    std::fs::write(
        home.path().join(".claude.json"),
        serde_json::json!({ "projects": { root.to_string_lossy(): { "hasTrustDialogAccepted": true } } })
            .to_string(),
    )
    .unwrap();
    let applied = npc()
        .current_dir(&root)
        .args(["apply", "--auto-approve"])
        .env("HOME", home.path())
        .output()
        .unwrap();
    assert!(applied.status.success());
    let (code, reports) = doctor(&root, bin.path(), home.path());
    let problems: Vec<&Value> = reports
        .iter()
        .flat_map(|r| r["checks"].as_array().unwrap())
        .filter(|c| c["status"] == "problem")
        .collect();
    assert!(problems.is_empty(), "{problems:#?}");
    assert_eq!(check(&reports, "npc", "on_path")["status"], "ok");
    assert_eq!(check(&reports, "claude_code", "login")["status"], "ok");
    assert_eq!(check(&reports, "mcp_server fs", "command")["status"], "ok");
    assert_eq!(code, 0, "a warning alone does not fail");
    // Every CLI's trust is checked, OpenCode's too (it has none).
    for (kind, name) in [
        ("claude_code", "workspace_trust"),
        ("codex", "project_trust"),
        ("gemini_cli", "folder_trust"),
        ("opencode", "workspace_trust"),
    ] {
        assert_eq!(check(&reports, kind, name)["status"], "ok", "{kind}");
    }
}

/// A provider `command` that is a path into the repository is the
/// repository's own program: `npc doctor` on a fresh clone never runs it,
/// and says so.
#[test]
fn doctor_runs_no_program_the_repository_names() {
    let repo = tempfile::tempdir().unwrap();
    let bin = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let marker = repo.path().join("ran");
    std::fs::write(
        repo.path().join("npcagent.toml"),
        "version = 1\n[providers.claude]\nkind = \"claude_code\"\ncommand = \"./agent\"\n",
    )
    .unwrap();
    let agent = repo.path().join("agent");
    std::fs::write(
        &agent,
        format!("#!/bin/sh\ntouch '{}'\necho '2.1.197'\n", marker.display()),
    )
    .unwrap();
    std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (_, reports) = doctor(repo.path(), bin.path(), home.path());
    let installed = check(&reports, "claude_code", "installed");
    assert_eq!(installed["status"], "warn", "{installed}");
    assert!(installed.to_string().contains("not checked"), "{installed}");
    assert!(!marker.exists(), "npc doctor ran the repository's program");
    // A relative `PATH` entry would find the repository's own `npc` (or
    // CLI): never looked in, so never run.
    for name in ["npc", "claude"] {
        std::fs::copy(&agent, repo.path().join(name)).unwrap();
    }
    let path = format!(".:{}", bin.path().display());
    let out = npc()
        .current_dir(repo.path())
        .args(["doctor", "--format", "json"])
        .env("PATH", path)
        .env("HOME", home.path())
        .output()
        .unwrap();
    let reports: Value = serde_json::from_slice(&out.stdout).unwrap();
    let on_path = check(reports.as_array().unwrap(), "npc", "on_path");
    assert_eq!(on_path["status"], "problem", "{on_path}");
    assert!(
        !marker.exists(),
        "npc doctor ran a program of a relative PATH entry"
    );
}

/// An MCP server's command that is a path is looked up only inside the
/// repository: one that leaves it (`../`, an absolute path) is not looked
/// at (a warning), a link out of it is no file of it, one inside is found.
#[test]
fn doctor_looks_up_a_servers_path_only_inside_the_repository() {
    let outer = tempfile::tempdir().unwrap();
    let root = outer.path().join("repo");
    std::fs::create_dir(&root).unwrap();
    let bin = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    stand_in(outer.path(), "outside", "1");
    stand_in(&root, "inside", "1");
    std::os::unix::fs::symlink(outer.path().join("outside"), root.join("link")).unwrap();
    std::fs::write(
        root.join("npcagent.toml"),
        "version = 1\n[providers.claude]\nkind = \"claude_code\"\n\
         [mcp.servers.up]\ncommand = \"../outside\"\n\
         [mcp.servers.abs]\ncommand = \"/bin/sh\"\n\
         [mcp.servers.link]\ncommand = \"./link\"\n\
         [mcp.servers.ok]\ncommand = \"./inside\"\n",
    )
    .unwrap();
    let (_, reports) = doctor(&root, bin.path(), home.path());
    // A path outside is not looked at (a warning says so); a link out of
    // the repository is no file of it.
    for (name, status) in [("up", "warn"), ("abs", "warn"), ("link", "problem")] {
        let c = check(&reports, &format!("mcp_server {name}"), "command");
        assert_eq!(c["status"], status, "{name}: {c}");
    }
    let ok = check(&reports, "mcp_server ok", "command");
    assert_eq!(ok["status"], "ok", "{ok}");
}

/// A provider with `driver = "acp"` gets a check of its ACP program: a
/// problem with the adapter's install line until it is on `PATH` (it is
/// not run: it would wait for a client), beside the CLI's own report.
#[test]
fn doctor_checks_an_acp_providers_program() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let bin = root.join("bin");
    let home = root.join("home");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(
        root.join("npcagent.toml"),
        "version = 1\n[providers.claude]\nkind = \"claude_code\"\n[providers.claude_acp]\nkind = \"claude_code\"\ndriver = \"acp\"\n",
    )
    .unwrap();
    stand_in(&bin, "claude", "2.1.197 (Claude Code)");
    let acp_check = |reports: &[Value]| -> Value {
        reports
            .iter()
            .find(|r| r["program"] == "claude-agent-acp")
            .unwrap_or_else(|| panic!("no report of the ACP program: {reports:#?}"))["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["check"] == "acp_program")
            .unwrap()
            .clone()
    };
    let (code, reports) = doctor(root, &bin, &home);
    assert_eq!(code, 1, "{reports:#?}");
    let missing = acp_check(&reports);
    assert_eq!(missing["status"], "problem", "{missing}");
    assert!(
        missing["fix"]
            .as_str()
            .unwrap()
            .contains("@agentclientprotocol/claude-agent-acp"),
        "{missing}"
    );
    // The program that would only wait for a client is found, not run.
    std::fs::write(
        bin.join("claude-agent-acp"),
        "#!/bin/sh\ntouch ran\nsleep 1000\n",
    )
    .unwrap();
    std::fs::set_permissions(
        bin.join("claude-agent-acp"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let (_, reports) = doctor(root, &bin, &home);
    assert_eq!(acp_check(&reports)["status"], "ok");
    assert!(!root.join("ran").exists(), "doctor ran the ACP program");
}
