//! Regression tests for a hostile repository: everything a repository
//! contains is untrusted input. One test per failure found, named after it,
//! each driving the real `npc` binary. Sections follow the numbered items of
//! the "safe in a hostile repository" issue.

#![allow(unused_imports)]

use crate::support::*;

/// A repository holding `manifest` as `npcagent.toml`.
fn hostile_repo(manifest: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("npcagent.toml"), manifest).unwrap();
    dir
}

fn read(dir: &tempfile::TempDir, file: &str) -> String {
    std::fs::read_to_string(dir.path().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

fn stdout_of(a: &assert_cmd::assert::Assert) -> String {
    String::from_utf8_lossy(&a.get_output().stdout).into_owned()
}

fn stderr_of(a: &assert_cmd::assert::Assert) -> String {
    String::from_utf8_lossy(&a.get_output().stderr).into_owned()
}

// ---------------------------------------------------------------------------
// §1. one guarded layer for every file npc touches on a repository's behalf
//
// (tests for §1 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// §2. templates cannot hang or exhaust the daemon
//
// (tests for §2 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// §3. `npc import` never turns data into configuration
//
// (tests for §3 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------

const CLAUDE_ONLY: &str = "version = 1\n[providers.claude]\nkind = \"claude_code\"\n";

/// The top-level keys of a TOML text, which must parse.
fn toml_top_keys(text: &str) -> Vec<String> {
    let doc: toml::Table = text.parse().unwrap_or_else(|e| panic!("{e}\n{text}"));
    doc.keys().cloned().collect()
}

#[test]
fn import_name_with_newlines_cannot_declare_a_daemon_listen_address() {
    let dir = hostile_repo(CLAUDE_ONLY);
    std::fs::write(
        dir.path().join("theirs.json"),
        r#"{"mcpServers": {"x\n[daemon]\nlisten = \"0.0.0.0:8080\"\n#": {"command": "c"}}}"#,
    )
    .unwrap();
    let printed = stdout_of(
        &npc()
            .current_dir(dir.path())
            .args(["import", "theirs.json"])
            .assert()
            .success(),
    );
    assert_eq!(toml_top_keys(&printed), ["mcp"], "{printed}");
    npc()
        .current_dir(dir.path())
        .args(["import", "theirs.json", "--write"])
        .assert()
        .success();
    let manifest = read(&dir, "npcagent.toml");
    let mut top = toml_top_keys(&manifest);
    top.sort();
    assert_eq!(top, ["mcp", "providers", "version"], "{manifest}");
    assert!(!manifest.contains("\n[daemon]"), "{manifest}");
}

#[test]
fn import_command_with_newlines_cannot_declare_a_before_tool_hook() {
    let dir = hostile_repo(CLAUDE_ONLY);
    // A command holding a reference gets a note that quotes it.
    std::fs::write(
        dir.path().join("theirs.json"),
        r#"{"mcpServers": {"ok": {"command": "${X}\n[hooks.h]\nevent = \"before_tool\"\nrun = \"sh -c evil\""}}}"#,
    )
    .unwrap();
    let printed = stdout_of(
        &npc()
            .current_dir(dir.path())
            .args(["import", "theirs.json"])
            .assert()
            .success(),
    );
    assert_eq!(toml_top_keys(&printed), ["mcp"], "{printed}");
    assert!(printed.contains("# command `${X}\\n[hooks.h]"), "{printed}");
    npc()
        .current_dir(dir.path())
        .args(["import", "theirs.json", "--write"])
        .assert()
        .success();
    let manifest = read(&dir, "npcagent.toml");
    assert!(
        !toml_top_keys(&manifest).contains(&"hooks".to_string()),
        "{manifest}"
    );
}

const KEPT: &str = r#"version = 1
[providers.claude]
kind = "claude_code"

[mcp.servers.fs]
command = "npx"
args = ["-y", "server-filesystem"]
tool_timeout_ms = 30000
startup_timeout_ms = 2500
"#;

#[test]
fn import_write_of_a_file_npc_keeps_in_step_is_not_a_conflict() {
    let dir = hostile_repo(KEPT);
    npc()
        .current_dir(dir.path())
        .args(["apply", "--auto-approve"])
        .assert()
        .success();
    let out = npc()
        .current_dir(dir.path())
        .args(["import", ".mcp.json", "--write"])
        .assert()
        .success();
    assert!(
        stdout_of(&out).contains("unchanged: `fs`"),
        "{}",
        stdout_of(&out)
    );
    // The startup timeout `.mcp.json` cannot express is not a difference.
    assert_eq!(read(&dir, "npcagent.toml"), KEPT);
}

#[test]
fn import_write_of_a_differing_entry_shows_a_diff_and_replace_takes_it() {
    let dir = hostile_repo(KEPT);
    npc()
        .current_dir(dir.path())
        .args(["apply", "--auto-approve"])
        .assert()
        .success();
    let edited = read(&dir, ".mcp.json").replace("server-filesystem", "server-other");
    std::fs::write(dir.path().join(".mcp.json"), edited).unwrap();
    let out = npc()
        .current_dir(dir.path())
        .args(["import", ".mcp.json", "--write"])
        .assert()
        .code(1);
    let err = stderr_of(&out);
    assert!(
        err.contains("`fs`")
            && err.contains("-args = [\"-y\", \"server-filesystem\"]")
            && err.contains("+args = [\"-y\", \"server-other\"]")
            && err.contains("--replace"),
        "{err}"
    );
    assert_eq!(read(&dir, "npcagent.toml"), KEPT);
    npc()
        .current_dir(dir.path())
        .args(["import", ".mcp.json", "--write", "--replace"])
        .assert()
        .success()
        .stdout(predicates::str::contains("replaced: `fs`"));
    let manifest = read(&dir, "npcagent.toml");
    assert!(
        manifest.contains("server-other") && !manifest.contains("server-filesystem"),
        "{manifest}"
    );
}

#[test]
fn imported_entry_becomes_managed_so_the_next_manifest_edit_reaches_it() {
    let dir = hostile_repo(CLAUDE_ONLY);
    std::fs::write(
        dir.path().join(".mcp.json"),
        r#"{"mcpServers": {"tools": {"command": "tool-a"}}}"#,
    )
    .unwrap();
    npc()
        .current_dir(dir.path())
        .args(["import", ".mcp.json", "--write"])
        .assert()
        .success();
    let manifest = read(&dir, "npcagent.toml").replace("tool-a", "tool-b");
    std::fs::write(dir.path().join("npcagent.toml"), manifest).unwrap();
    let plan = stdout_of(
        &npc()
            .current_dir(dir.path())
            .args(["plan"])
            .assert()
            .success(),
    );
    assert!(!plan.contains("onflict"), "{plan}");
    npc()
        .current_dir(dir.path())
        .args(["apply", "--auto-approve"])
        .assert()
        .success();
    let written = read(&dir, ".mcp.json");
    assert!(
        written.contains("tool-b") && !written.contains("tool-a"),
        "{written}"
    );
}

#[test]
fn export_conflict_shows_in_the_human_plan_and_detailed_exitcode_returns_2() {
    let dir = hostile_repo(KEPT);
    let theirs = "{\"mcpServers\": {\"fs\": {\"command\": \"their-fs\"}}}\n";
    std::fs::write(dir.path().join(".mcp.json"), theirs).unwrap();
    // Record the rest so the only thing left is the conflict.
    npc()
        .current_dir(dir.path())
        .args(["apply", "--auto-approve"])
        .assert()
        .success();
    assert_eq!(read(&dir, ".mcp.json"), theirs);
    let out = npc()
        .current_dir(dir.path())
        .args(["plan", "--detailed-exitcode"])
        .assert()
        .code(2);
    let plan = stdout_of(&out);
    assert!(
        plan.contains("Conflicts")
            && plan.contains(".mcp.json: `fs`")
            && plan.contains("--force-agent-files"),
        "{plan}"
    );
    insta::assert_snapshot!("export_conflict_human_plan", plan);
    npc()
        .current_dir(dir.path())
        .args(["plan", "--force-agent-files"])
        .assert()
        .success()
        .stdout(predicates::str::contains("+      \"command\": \"npx\""));
    npc()
        .current_dir(dir.path())
        .args(["apply", "--auto-approve", "--force-agent-files"])
        .assert()
        .success();
    assert!(read(&dir, ".mcp.json").contains("\"npx\""));
    npc()
        .current_dir(dir.path())
        .args(["plan", "--detailed-exitcode"])
        .assert()
        .code(0);
}

#[test]
fn force_agent_files_replaces_a_conflicting_entry_while_a_daemon_runs() {
    let dir = hostile_repo(KEPT);
    let theirs = "{\"mcpServers\": {\"fs\": {\"command\": \"their-fs\"}}}\n";
    std::fs::write(dir.path().join(".mcp.json"), theirs).unwrap();
    let log = std::fs::File::create(dir.path().join("daemon.log")).unwrap();
    let child = std::process::Command::new(npc_path())
        .arg("daemon")
        .current_dir(dir.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    struct Stop(std::process::Child);
    impl Drop for Stop {
        fn drop(&mut self) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.0.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let _ = self.0.wait();
        }
    }
    let _daemon = Stop(child);
    wait_for("the daemon to hold the repository", || {
        let out = npc()
            .current_dir(dir.path())
            .args(["status"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .contains("daemon pid")
            .then_some(())
    });
    assert_eq!(
        read(&dir, ".mcp.json"),
        theirs,
        "the daemon replaced an entry it did not write"
    );
    npc()
        .current_dir(dir.path())
        .args(["plan", "--detailed-exitcode"])
        .assert()
        .code(2)
        .stdout(predicates::str::contains("Conflicts"));
    npc()
        .current_dir(dir.path())
        .args(["apply", "--auto-approve", "--force-agent-files"])
        .assert()
        .success();
    assert!(
        read(&dir, ".mcp.json").contains("\"npx\""),
        "{}",
        read(&dir, ".mcp.json")
    );
    npc()
        .current_dir(dir.path())
        .args(["plan", "--detailed-exitcode"])
        .assert()
        .code(0);
}

// ---------------------------------------------------------------------------
// §4. the daemon keeps serving and keeps converging
//
// (tests for §4 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// §5. no orphans, fast shutdown
//
// (tests for §5 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// §6. bounded memory on every input
//
// (tests for §6 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// §7. redaction that is exact
//
// (tests for §7 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------

#[test]
fn plan_diff_redacts_a_secret_a_cli_resolved_into_the_file() {
    const SECRET: &str = "resolved-Secret-9f8e7d";
    let dir = hostile_repo(
        "version = 1\n[providers.gemini]\nkind = \"gemini_cli\"\n[mcp.servers.api]\ncommand = \"api-server\"\nenv = { API_TOKEN = \"${NPC_HOSTILE_TOKEN}\" }\n",
    );
    let run = |args: &[&str]| {
        npc()
            .current_dir(dir.path())
            .env("NPC_HOSTILE_TOKEN", SECRET)
            .args(args)
            .assert()
    };
    run(&["apply", "--auto-approve"]).success();
    // What `gemini mcp add` leaves: the reference resolved to its value.
    let resolved = read(&dir, ".gemini/settings.json").replace("${NPC_HOSTILE_TOKEN}", SECRET);
    std::fs::write(dir.path().join(".gemini/settings.json"), resolved).unwrap();
    for format in ["human", "json"] {
        let out = run(&["plan", "--format", format]).success();
        let text = stdout_of(&out);
        assert!(
            !text.contains(SECRET),
            "{format} plan prints the secret:\n{text}"
        );
        assert!(text.contains("<redacted>"), "{format}:\n{text}");
    }
}

// ---------------------------------------------------------------------------
// §8. output and errors a user can act on
//
// (tests for §8 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// §9. correctness found by the audit
//
// (tests for §9 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// §10. what the agent CLIs accept
//
// (tests for §10 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------

const ALL_KINDS: &str = r#"version = 1
[providers.claude]
kind = "claude_code"
[providers.codex]
kind = "codex"
[providers.gemini]
kind = "gemini_cli"
[providers.opencode]
kind = "opencode"

[mcp.servers.fs]
command = "fs-server"
cwd = "tools"
tool_timeout_ms = 30000

[mcp.servers.off]
command = "off-server"
enabled = false

[mcp.servers.web]
url = "https://mcp.example.com/mcp"
"#;

#[test]
fn gemini_settings_with_comments_are_applied_with_their_comments_kept() {
    let dir = hostile_repo(ALL_KINDS);
    std::fs::create_dir_all(dir.path().join(".gemini")).unwrap();
    let commented = "// my settings\n{\n  /* look */\n  \"theme\": \"dark\",\n  \"mcpServers\": {\n    // mine\n    \"mine\": { \"command\": \"m\" }\n  }\n}\n";
    std::fs::write(dir.path().join(".gemini/settings.json"), commented).unwrap();
    npc()
        .current_dir(dir.path())
        .args(["apply", "--auto-approve"])
        .assert()
        .success();
    let written = read(&dir, ".gemini/settings.json");
    for kept in [
        "// my settings",
        "/* look */",
        "// mine",
        "\"mine\"",
        "\"theme\": \"dark\"",
        "\"fs-server\"",
    ] {
        assert!(written.contains(kept), "{kept} missing:\n{written}");
    }
    npc()
        .current_dir(dir.path())
        .args(["plan", "--detailed-exitcode"])
        .assert()
        .code(0);
}

#[test]
fn one_broken_agent_file_is_left_alone_and_the_others_are_written() {
    let dir = hostile_repo(ALL_KINDS);
    let broken = "{ \"mcpServers\": { oops } }";
    std::fs::write(dir.path().join(".mcp.json"), broken).unwrap();
    let out = npc()
        .current_dir(dir.path())
        .args(["apply", "--auto-approve"])
        .assert()
        .code(1);
    assert!(
        stderr_of(&out).contains("everything else was applied"),
        "{}",
        stderr_of(&out)
    );
    assert_eq!(read(&dir, ".mcp.json"), broken);
    for file in [
        ".codex/config.toml",
        ".gemini/settings.json",
        "opencode.json",
    ] {
        assert!(read(&dir, file).contains("fs-server"), "{file} not written");
    }
}

#[test]
fn opencode_and_claude_files_get_cwd_enabled_and_timeout() {
    let dir = hostile_repo(ALL_KINDS);
    npc()
        .current_dir(dir.path())
        .args(["apply", "--auto-approve"])
        .assert()
        .success();
    let opencode: serde_json::Value = serde_json::from_str(&read(&dir, "opencode.json")).unwrap();
    assert_eq!(opencode["mcp"]["fs"]["cwd"], "tools");
    assert_eq!(opencode["mcp"]["fs"]["timeout"], 30000);
    assert_eq!(opencode["mcp"]["off"]["enabled"], false);
    let claude: serde_json::Value = serde_json::from_str(&read(&dir, ".mcp.json")).unwrap();
    assert_eq!(claude["mcpServers"]["fs"]["timeout"], 30000);
    assert!(claude["mcpServers"]["web"].get("timeout").is_none());
}

#[test]
fn gemini_gets_type_http_with_url_and_no_timeout_the_manifest_did_not_set() {
    let dir = hostile_repo(ALL_KINDS);
    npc()
        .current_dir(dir.path())
        .args(["apply", "--auto-approve"])
        .assert()
        .success();
    let gemini: serde_json::Value =
        serde_json::from_str(&read(&dir, ".gemini/settings.json")).unwrap();
    let web = &gemini["mcpServers"]["web"];
    assert_eq!(web["type"], "http");
    assert_eq!(web["url"], "https://mcp.example.com/mcp");
    assert!(
        web.get("httpUrl").is_none() && web.get("timeout").is_none(),
        "{web}"
    );
    assert_eq!(gemini["mcpServers"]["fs"]["timeout"], 30000);
}

#[test]
fn gemini_import_labels_type_http_entries_as_http() {
    let dir = hostile_repo("version = 1\n");
    std::fs::create_dir_all(dir.path().join(".gemini")).unwrap();
    std::fs::write(
        dir.path().join(".gemini/settings.json"),
        r#"{"mcpServers": {"h": {"type": "http", "url": "https://h.example/mcp"}, "s": {"type": "sse", "url": "https://s.example/sse"}}}"#,
    )
    .unwrap();
    let printed = stdout_of(
        &npc()
            .current_dir(dir.path())
            .args(["import", ".gemini/settings.json"])
            .assert()
            .success(),
    );
    let h = printed.find("[mcp.servers.h]").unwrap();
    let s = printed.find("[mcp.servers.s]").unwrap();
    let sse = printed
        .find("# `s`: SSE")
        .or_else(|| printed.find("# SSE"))
        .unwrap();
    assert!(
        h < s && sse > h,
        "only `s` carries the SSE note:\n{printed}"
    );
    assert_eq!(printed.matches("SSE").count(), 1, "{printed}");
}
