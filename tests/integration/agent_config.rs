//! Every kind of agent config through the real `npc` binary: the
//! `[instructions]` block in the rules files, command prompts as slash
//! commands, profiles as subagents (a profile's tool patterns reach its
//! CLI per run, never the repository's settings) — shown by `npc plan`, written by
//! `npc apply` and the daemon, the user's own files and entries kept,
//! npc's removed when the manifest drops them, nothing written outside the
//! repository through a link.

use std::os::unix::fs::symlink;
use std::path::Path;

use crate::support::{Daemon, npc, stdout_of, wait_for};

const MANIFEST: &str = r#"version = 1
[project]
name = "demo"

[instructions]
template = "Run `cargo test` before you commit.\nThe project is {{ project.name }}."

[providers.claude]
kind = "claude_code"
[providers.codex]
kind = "codex"
[providers.gemini]
kind = "gemini_cli"
[providers.opencode]
kind = "opencode"

[prompts.review]
command = true
description = "Review a change"
template = "Review {{ vars.target }} for bugs."
variables.target = { description = "what to review", default = "HEAD" }

[prompts.reviewer]
template = "You review changes."

[profiles.dev]
provider = "claude"
description = "Develops"
prompt = "reviewer"
allowed_tools = ["Read", "Bash(git diff:*)"]
ask_tools = ["Bash(git push:*)"]
denied_tools = ["WebFetch"]

[profiles.helper]
provider = "opencode"
description = "Helps"
allowed_tools = ["Read"]
"#;

/// The same repository without any of the new sections.
const BARE: &str = r#"version = 1
[providers.claude]
kind = "claude_code"
[providers.opencode]
kind = "opencode"
"#;

const USER_CLAUDE_MD: &str = "# My rules\n\nBe nice.";
const USER_SETTINGS: &str = "{\n  \"permissions\": {\n    \"allow\": [\n      \"Read\"\n    ]\n  },\n  \"model\": \"opus\"\n}\n";
const USER_COMMAND: &str = "---\ndescription: mine\n---\n\nMine.\n";

fn repo(manifest: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("npcagent.toml"), manifest).unwrap();
    dir
}

fn read(dir: &Path, file: &str) -> String {
    std::fs::read_to_string(dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

fn run(dir: &Path, args: &[&str]) -> assert_cmd::assert::Assert {
    npc().current_dir(dir).args(args).assert()
}

/// The plan's text with the temporary directory named `[REPO]`.
fn shown(dir: &Path, text: &str) -> String {
    text.replace(&dir.display().to_string(), "[REPO]")
}

#[test]
fn plan_and_apply_write_every_kind_and_keep_the_users_files() {
    let dir = repo(MANIFEST);
    let root = dir.path();
    std::fs::write(root.join("CLAUDE.md"), USER_CLAUDE_MD).unwrap();
    std::fs::create_dir_all(root.join(".claude/commands")).unwrap();
    std::fs::write(root.join(".claude/settings.json"), USER_SETTINGS).unwrap();
    std::fs::write(root.join(".claude/commands/mine.md"), USER_COMMAND).unwrap();

    let plan = run(root, &["plan", "--detailed-exitcode"]).code(2);
    let plan = shown(root, &stdout_of(&plan));
    let files = plan
        .split_once("Files npc writes for the agents:")
        .map(|(_, files)| files)
        .unwrap_or_else(|| panic!("{plan}"));
    insta::assert_snapshot!("agent_config_plan", files);

    run(root, &["apply", "--auto-approve"]).success();
    // The rules block goes first; the user's text follows byte for byte.
    let claude_md = read(root, "CLAUDE.md");
    assert!(
        claude_md.ends_with(&format!("<!-- npc:end -->\n\n{USER_CLAUDE_MD}")),
        "{claude_md}"
    );
    for file in ["AGENTS.md", "GEMINI.md"] {
        assert!(read(root, file).contains("The project is demo."), "{file}");
    }
    for file in [
        ".claude/commands/review.md",
        ".gemini/commands/review.toml",
        ".opencode/commands/review.md",
        ".claude/agents/dev.md",
        ".opencode/agents/helper.md",
    ] {
        assert!(read(root, file).contains("# Managed by npc"), "{file}");
    }
    assert!(
        !root.join(".codex/prompts").exists(),
        "no Codex command in the repository"
    );
    // The user's permissions as they were: no profile's patterns (they
    // reach Claude Code per run, `--settings`).
    let settings: serde_json::Value =
        serde_json::from_str(&read(root, ".claude/settings.json")).unwrap();
    assert_eq!(
        settings["permissions"],
        serde_json::json!({"allow": ["Read"]})
    );
    assert_eq!(settings["model"], "opus");
    assert_eq!(read(root, ".claude/commands/mine.md"), USER_COMMAND);
    // In step: nothing left to do.
    run(root, &["plan", "--detailed-exitcode"]).code(0);

    // The manifest drops every new section: npc's files and entries go, the
    // user's come back as they were.
    std::fs::write(root.join("npcagent.toml"), BARE).unwrap();
    let plan = stdout_of(&run(root, &["plan"]).success());
    assert!(plan.contains("  - .claude/commands/review.md"), "{plan}");
    run(root, &["apply", "--auto-approve"]).success();
    assert_eq!(read(root, "CLAUDE.md"), USER_CLAUDE_MD);
    for gone in [
        "AGENTS.md",
        "GEMINI.md",
        ".claude/commands/review.md",
        ".gemini/commands/review.toml",
        ".opencode/commands/review.md",
        ".claude/agents/dev.md",
        ".opencode/agents/helper.md",
    ] {
        assert!(!root.join(gone).exists(), "{gone} is still there");
    }
    assert_eq!(read(root, ".claude/commands/mine.md"), USER_COMMAND);
    let settings: serde_json::Value =
        serde_json::from_str(&read(root, ".claude/settings.json")).unwrap();
    assert_eq!(
        settings,
        serde_json::from_str::<serde_json::Value>(USER_SETTINGS).unwrap()
    );
    run(root, &["plan", "--detailed-exitcode"]).code(0);
}

#[test]
fn a_user_file_with_a_commands_name_is_left_alone_with_a_note() {
    let dir = repo(MANIFEST);
    let root = dir.path();
    std::fs::create_dir_all(root.join(".claude/commands")).unwrap();
    std::fs::write(root.join(".claude/commands/review.md"), USER_COMMAND).unwrap();
    let plan = stdout_of(&run(root, &["plan"]).success());
    assert!(plan.contains("is not npc's; it is left alone"), "{plan}");
    run(root, &["apply", "--auto-approve"]).success();
    assert_eq!(read(root, ".claude/commands/review.md"), USER_COMMAND);
    std::fs::write(root.join("npcagent.toml"), BARE).unwrap();
    run(root, &["apply", "--auto-approve"]).success();
    assert_eq!(read(root, ".claude/commands/review.md"), USER_COMMAND);
}

#[test]
fn the_daemon_keeps_the_files_in_step_with_the_manifest() {
    let mut daemon = Daemon::start(BARE);
    let root = daemon.root().to_path_buf();
    daemon.write_manifest(MANIFEST);
    wait_for("the rules block and the command", || {
        let agents = std::fs::read_to_string(root.join("AGENTS.md")).ok()?;
        let command = std::fs::read_to_string(root.join(".claude/commands/review.md")).ok()?;
        (agents.contains("The project is demo.") && command.contains("Review")).then_some(())
    });
    daemon.write_manifest(BARE);
    wait_for("npc's files to go", || {
        (!root.join("AGENTS.md").exists() && !root.join(".claude/commands/review.md").exists())
            .then_some(())
    });
    daemon.terminate();
}

#[test]
fn import_takes_a_clis_command_and_agent_into_the_manifest() {
    let dir = repo(BARE);
    let root = dir.path();
    std::fs::create_dir_all(root.join(".claude/commands")).unwrap();
    std::fs::create_dir_all(root.join(".claude/agents")).unwrap();
    std::fs::write(
        root.join(".claude/commands/fix.md"),
        "---\ndescription: Fix an issue\n---\n\nFix issue $ARGUMENTS; keep {{ braces }}.\n",
    )
    .unwrap();
    std::fs::write(
        root.join(".claude/agents/tester.md"),
        "---\nname: tester\ndescription: Runs tests\ntools: Read, Bash(cargo test:*)\n---\n\nYou run the tests.\n",
    )
    .unwrap();
    let shown = stdout_of(&run(root, &["import", ".claude/commands/fix.md"]).success());
    assert!(
        shown.contains("[prompts.fix]") && shown.contains("command = true"),
        "{shown}"
    );
    run(root, &["import", ".claude/commands/fix.md", "--write"]).success();
    run(root, &["import", ".claude/agents/tester.md", "--write"]).success();
    let manifest = read(root, "npcagent.toml");
    assert!(
        manifest.starts_with(BARE),
        "the manifest's own text is kept:\n{manifest}"
    );
    assert!(manifest.contains("[profiles.tester]"), "{manifest}");
    assert!(manifest.contains("provider = \"claude\""), "{manifest}");
    run(root, &["validate"]).success();
    // Importing again changes nothing.
    let again = stdout_of(&run(root, &["import", ".claude/commands/fix.md", "--write"]).success());
    assert!(again.contains("unchanged"), "{again}");
    // The user's files stay theirs until they delete them; then npc
    // writes the same command from the manifest.
    let plan = stdout_of(&run(root, &["plan"]).success());
    assert!(plan.contains("is not npc's; it is left alone"), "{plan}");
    std::fs::remove_file(root.join(".claude/commands/fix.md")).unwrap();
    run(root, &["apply", "--auto-approve"]).success();
    let written = read(root, ".claude/commands/fix.md");
    assert!(
        written.ends_with("\nFix issue $ARGUMENTS; keep {{ braces }}.\n"),
        "{written}"
    );
    // npc's own file is not imported back.
    run(root, &["import", ".claude/commands/fix.md"]).failure();
}

mod hostile {
    use super::*;

    /// A directory outside the repository holding one file, and a check
    /// that it is as it was.
    struct Outside(tempfile::TempDir);

    const SECRET: &str = "TOP-SECRET-VALUE\n";

    impl Outside {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("secret.md"), SECRET).unwrap();
            Self(dir)
        }

        fn untouched(&self) {
            let names: Vec<_> = std::fs::read_dir(self.0.path())
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(
                names,
                ["secret.md"],
                "npc created files outside the repository"
            );
            assert_eq!(
                std::fs::read_to_string(self.0.path().join("secret.md")).unwrap(),
                SECRET
            );
        }
    }

    #[test]
    fn a_commands_or_agents_folder_linked_outside_is_not_written_through() {
        let outside = Outside::new();
        let dir = repo(MANIFEST);
        let root = dir.path();
        std::fs::create_dir_all(root.join(".claude")).unwrap();
        std::fs::create_dir_all(root.join(".opencode")).unwrap();
        symlink(outside.0.path(), root.join(".claude/commands")).unwrap();
        symlink(outside.0.path(), root.join(".opencode/agents")).unwrap();
        let a = npc()
            .current_dir(root)
            .args(["apply", "--auto-approve"])
            .assert()
            .failure();
        let out = stdout_of(&a);
        assert!(out.contains("symbolic link"), "{out}");
        assert!(!out.contains("TOP-SECRET-VALUE"), "{out}");
        outside.untouched();
        // The other files are still written.
        assert!(root.join(".gemini/commands/review.toml").is_file(), "{out}");
        // Dropped from the manifest: nothing outside is removed either.
        std::fs::write(root.join("npcagent.toml"), BARE).unwrap();
        npc()
            .current_dir(root)
            .args(["apply", "--auto-approve"])
            .assert()
            .success();
        outside.untouched();
    }

    #[test]
    fn a_rules_file_linked_outside_is_neither_shown_nor_written() {
        let outside = Outside::new();
        let dir = repo(MANIFEST);
        let root = dir.path();
        symlink(outside.0.path().join("secret.md"), root.join("CLAUDE.md")).unwrap();
        let a = npc().current_dir(root).args(["plan"]).assert();
        let out = stdout_of(&a);
        assert!(!out.contains("TOP-SECRET-VALUE"), "{out}");
        assert!(out.contains("`CLAUDE.md` is a symbolic link"), "{out}");
        npc()
            .current_dir(root)
            .args(["apply", "--auto-approve"])
            .assert()
            .failure();
        outside.untouched();
        assert!(root.join("AGENTS.md").is_file());
    }

    #[test]
    fn a_rules_file_linked_outside_is_no_error_when_there_is_nothing_to_write() {
        let outside = Outside::new();
        let dir = repo(BARE);
        let root = dir.path();
        symlink(outside.0.path().join("secret.md"), root.join("CLAUDE.md")).unwrap();
        npc()
            .current_dir(root)
            .args(["apply", "--auto-approve"])
            .assert()
            .success();
        outside.untouched();
    }

    #[test]
    fn claude_md_linked_to_agents_md_holds_one_block() {
        let dir = repo(MANIFEST);
        let root = dir.path();
        std::fs::write(root.join("AGENTS.md"), USER_CLAUDE_MD).unwrap();
        symlink("AGENTS.md", root.join("CLAUDE.md")).unwrap();
        npc()
            .current_dir(root)
            .args(["apply", "--auto-approve"])
            .assert()
            .success();
        let text = read(root, "AGENTS.md");
        assert_eq!(text.matches("<!-- npc:end -->").count(), 1, "{text}");
        assert!(text.ends_with(USER_CLAUDE_MD), "{text}");
        assert!(
            std::fs::symlink_metadata(root.join("CLAUDE.md"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
        npc()
            .current_dir(root)
            .args(["plan", "--detailed-exitcode"])
            .assert()
            .code(0);
        // Only Claude Code reads it now: the block stays, through the link.
        let claude_only = "version = 1\n[instructions]\ntemplate = \"Only Claude.\"\n[providers.claude]\nkind = \"claude_code\"\n";
        std::fs::write(root.join("npcagent.toml"), claude_only).unwrap();
        npc()
            .current_dir(root)
            .args(["apply", "--auto-approve"])
            .assert()
            .success();
        let text = read(root, "AGENTS.md");
        assert!(
            text.contains("Only Claude.") && text.ends_with(USER_CLAUDE_MD),
            "{text}"
        );
    }

    #[test]
    fn an_instructions_file_linked_outside_is_refused_and_nothing_rendered() {
        let outside = Outside::new();
        let manifest = MANIFEST.replace(
            "template = \"Run `cargo test` before you commit.\\nThe project is {{ project.name }}.\"",
            "file = \"rules.md\"",
        );
        assert!(manifest.contains("file = \"rules.md\""));
        let dir = repo(&manifest);
        let root = dir.path();
        symlink(outside.0.path().join("secret.md"), root.join("rules.md")).unwrap();
        let a = npc().current_dir(root).args(["plan"]).assert().failure();
        let out = stdout_of(&a) + &crate::support::stderr_of(&a);
        assert!(!out.contains("TOP-SECRET-VALUE"), "{out}");
        assert!(out.contains("rules.md"), "{out}");
        npc()
            .current_dir(root)
            .args(["apply", "--auto-approve"])
            .assert()
            .failure();
        assert!(!root.join("AGENTS.md").exists());
        outside.untouched();
    }

    #[test]
    fn a_command_file_that_is_a_link_is_never_npcs() {
        let outside = Outside::new();
        let dir = repo(MANIFEST);
        let root = dir.path();
        std::fs::create_dir_all(root.join(".claude/commands")).unwrap();
        // A link dressed as npc's file: neither followed, replaced nor removed.
        symlink(
            outside.0.path().join("secret.md"),
            root.join(".claude/commands/old.md"),
        )
        .unwrap();
        std::fs::write(
            outside.0.path().join("secret.md"),
            format!("---\n{}\n---\n", npcagent::native::managed::MANAGED_LINE),
        )
        .unwrap();
        npc()
            .current_dir(root)
            .args(["apply", "--auto-approve"])
            .assert()
            .success();
        assert!(
            std::fs::symlink_metadata(root.join(".claude/commands/old.md"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
        std::fs::write(outside.0.path().join("secret.md"), SECRET).unwrap();
        outside.untouched();
    }
}

/// Instructions that quote npc's own marker lines converge: a second apply
/// changes nothing, the rules files do not grow and the plan has nothing to do.
#[test]
fn instructions_quoting_npcs_markers_converge() {
    let manifest = format!(
        "{}\n{}",
        "version = 1\n[providers.claude]\nkind = \"claude_code\"\n[providers.codex]\nkind = \"codex\"\n",
        "[instructions]\ntemplate = \"\"\"\nBefore.\n<!-- npc:end -->\n<!-- npc:begin (managed by npc from the manifest's [instructions]; edit it there) -->\nAfter.\n\"\"\"\n",
    );
    let dir = repo(&manifest);
    let root = dir.path();
    std::fs::write(root.join("CLAUDE.md"), USER_CLAUDE_MD).unwrap();
    run(root, &["apply", "--auto-approve"]).success();
    let first: Vec<String> = ["AGENTS.md", "CLAUDE.md"]
        .iter()
        .map(|f| read(root, f))
        .collect();
    assert!(first[1].ends_with(USER_CLAUDE_MD), "{}", first[1]);
    assert!(first[1].contains("After."), "{}", first[1]);
    let plan = run(root, &["plan", "--detailed-exitcode"]).code(0);
    assert!(
        stdout_of(&plan).contains("No changes."),
        "{}",
        stdout_of(&plan)
    );
    run(root, &["apply", "--auto-approve"]).success();
    for (file, before) in ["AGENTS.md", "CLAUDE.md"].iter().zip(&first) {
        assert_eq!(
            &read(root, file),
            before,
            "{file} changed on a second apply"
        );
    }
    // Dropping the instructions gives the user's file back byte for byte.
    std::fs::write(
        root.join("npcagent.toml"),
        manifest.split("[instructions]").next().unwrap(),
    )
    .unwrap();
    run(root, &["apply", "--auto-approve"]).success();
    assert_eq!(read(root, "CLAUDE.md"), USER_CLAUDE_MD);
    assert!(!root.join("AGENTS.md").exists());
}

/// First steps where the user is: `npc init` in a repository with agent
/// configs names them and the `npc import` that brings their servers in;
/// importing a CLI's file into a manifest without that CLI's provider says
/// npc will not write it until one is declared.
#[test]
fn init_offers_import_and_import_says_when_a_file_is_not_written() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::write(
        root.join(".mcp.json"),
        r#"{"mcpServers":{"fs":{"command":"npx","args":["-y","x"]}}}"#,
    )
    .unwrap();
    std::fs::create_dir(root.join(".codex")).unwrap();
    std::fs::write(
        root.join(".codex/config.toml"),
        "[mcp_servers.web]\ncommand = \"web-mcp\"\n",
    )
    .unwrap();
    // A config a link leads to outside the repository is not offered, nor
    // one under a directory that links out.
    symlink("/etc/hostname", root.join("opencode.json")).unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("settings.json"), "{}").unwrap();
    symlink(outside.path(), root.join(".gemini")).unwrap();
    let said = stdout_of(&run(root, &["init", "."]).success());
    assert!(
        said.contains("found .mcp.json") && said.contains("npc import .mcp.json --write"),
        "{said}"
    );
    assert!(
        said.contains("npc import .codex/config.toml --write"),
        "{said}"
    );
    assert!(!said.contains("opencode.json"), "{said}");
    assert!(!said.contains(".gemini"), "{said}");
    // The starter declares no Codex provider: npc says it will not write
    // `.codex/config.toml` until one is declared.
    let said = stdout_of(&run(root, &["import", ".codex/config.toml", "--write"]).success());
    assert!(
        said.contains("declares no provider of kind `codex`"),
        "{said}"
    );
    assert!(said.contains("[providers.codex]"), "{said}");
}
