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

mod guarded_files {
    use std::os::unix::fs::{PermissionsExt as _, symlink};
    use std::path::{Path, PathBuf};
    use std::process::{Child, Command, Stdio};
    use std::time::Duration;

    use crate::support::{npc, npc_path, wait_for};

    /// Longest a command may take before it counts as hanging.
    const HANG: Duration = Duration::from_secs(30);

    /// A manifest with an MCP server, two agent CLIs, a prompt read from
    /// `prompts/p.md` and a profile rendering it.
    const MANIFEST: &str = r#"version = 1
[mcp.servers.fs]
command = "sleep"
args = ["1000"]
[providers.claude]
kind = "claude_code"
[providers.codex]
kind = "codex"
[prompts.p]
file = "prompts/p.md"
[profiles.dev]
provider = "claude"
description = "develops"
prompt = "p"
mcp_servers = ["fs"]
"#;

    /// A repository (with `prompts/p.md`) and a directory outside it
    /// holding a `secret` file.
    pub(super) struct Repo {
        pub dir: tempfile::TempDir,
        pub outside: tempfile::TempDir,
    }

    impl Repo {
        pub fn new(manifest: &str) -> Self {
            let dir = tempfile::tempdir().unwrap();
            let outside = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("npcagent.toml"), manifest).unwrap();
            std::fs::create_dir_all(dir.path().join("prompts")).unwrap();
            std::fs::write(dir.path().join("prompts/p.md"), "Be careful.\n").unwrap();
            std::fs::write(outside.path().join("secret"), "TOP-SECRET-VALUE\n").unwrap();
            Self { dir, outside }
        }

        pub fn standard() -> Self {
            Self::new(MANIFEST)
        }

        pub fn path(&self, rel: &str) -> PathBuf {
            self.dir.path().join(rel)
        }

        pub fn secret(&self) -> PathBuf {
            self.outside.path().join("secret")
        }

        pub fn npc(&self, args: &[&str]) -> assert_cmd::assert::Assert {
            npc()
                .current_dir(self.dir.path())
                .args(args)
                .timeout(HANG)
                .assert()
        }

        pub fn outside_untouched(&self) {
            assert_eq!(
                std::fs::read_to_string(self.secret()).unwrap(),
                "TOP-SECRET-VALUE\n",
                "the file outside the repository changed"
            );
            let names: Vec<_> = std::fs::read_dir(self.outside.path())
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(
                names,
                ["secret"],
                "npc created files outside the repository"
            );
        }
    }

    pub(super) fn stderr(a: &assert_cmd::assert::Assert) -> String {
        String::from_utf8_lossy(&a.get_output().stderr).into_owned()
    }

    pub(super) fn stdout(a: &assert_cmd::assert::Assert) -> String {
        String::from_utf8_lossy(&a.get_output().stdout).into_owned()
    }

    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path)
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    }

    fn is_link(path: &Path) -> bool {
        std::fs::symlink_metadata(path)
            .map(|m| m.file_type().is_symlink())
            .unwrap_or(false)
    }

    /// The pid of a process that has exited (and was reaped).
    fn dead_pid() -> u32 {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        pid
    }

    /// A daemon on `repo`, stopped with SIGTERM on drop.
    pub(super) struct Daemon {
        child: Child,
    }

    impl Daemon {
        pub fn start(repo: &Repo) -> Self {
            let log = std::fs::File::create(repo.path("daemon.log")).unwrap();
            let child = Command::new(npc_path())
                .arg("daemon")
                .current_dir(repo.dir.path())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap();
            let daemon = Self { child };
            let pid = daemon.pid();
            wait_for("the daemon to answer `npc status`", || {
                let a = repo.npc(&["status"]);
                stdout(&a)
                    .contains(&format!("daemon pid {pid}"))
                    .then_some(())
            });
            daemon
        }

        pub fn pid(&self) -> u32 {
            self.child.id()
        }
    }

    impl Drop for Daemon {
        fn drop(&mut self) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let _ = self.child.wait();
        }
    }

    #[test]
    fn lock_symlink_outside_is_refused_and_the_outside_file_untouched() {
        let repo = Repo::standard();
        std::fs::create_dir(repo.path(".npc")).unwrap();
        symlink(repo.secret(), repo.path(".npc/daemon.lock")).unwrap();
        let a = repo.npc(&["apply", "--auto-approve"]).failure();
        let err = stderr(&a);
        assert!(err.contains("daemon.lock"), "{err}");
        assert!(err.contains(&repo.secret().display().to_string()), "{err}");
        repo.outside_untouched();
    }

    #[test]
    fn prompt_file_symlink_to_a_secret_outside_is_refused_and_nothing_rendered() {
        let repo = Repo::standard();
        std::fs::remove_file(repo.path("prompts/p.md")).unwrap();
        symlink(repo.secret(), repo.path("prompts/p.md")).unwrap();
        let a = repo.npc(&["validate"]).code(1);
        let err = stdout(&a) + &stderr(&a);
        assert!(err.contains("prompts/p.md"), "{err}");
        assert!(err.contains(&repo.secret().display().to_string()), "{err}");
        assert!(!err.contains("TOP-SECRET-VALUE"), "{err}");
        let a = repo.npc(&["apply", "--auto-approve"]).failure();
        assert!(!stdout(&a).contains("TOP-SECRET-VALUE"));
        assert!(!repo.path(".npc/profiles/dev.md").exists());
        let a = repo.npc(&["render", "profile", "dev"]).failure();
        assert!(!stdout(&a).contains("TOP-SECRET-VALUE"));
        repo.outside_untouched();
    }

    #[test]
    fn prompt_directory_symlink_outside_is_refused() {
        let repo = Repo::standard();
        std::fs::remove_dir_all(repo.path("prompts")).unwrap();
        std::fs::write(repo.outside.path().join("p.md"), "outside prompt\n").unwrap();
        symlink(repo.outside.path(), repo.path("prompts")).unwrap();
        let a = repo.npc(&["validate"]).code(1);
        let err = stdout(&a) + &stderr(&a);
        assert!(err.contains("`prompts` is a symbolic link to"), "{err}");
    }

    #[test]
    fn prompt_file_linked_to_dev_zero_is_refused_without_reading_it() {
        let repo = Repo::standard();
        std::fs::remove_file(repo.path("prompts/p.md")).unwrap();
        symlink("/dev/zero", repo.path("prompts/p.md")).unwrap();
        // Under a 1 GB address-space limit: reading /dev/zero up to the
        // old 2 GB would fail, refusing it costs nothing.
        let a = npc_limited(repo.dir.path(), "validate").code(1);
        let err = stdout(&a) + &stderr(&a);
        assert!(err.contains("/dev/zero"), "{err}");
    }

    /// `npc ARGS` under a 1 GB address-space limit and the hang deadline.
    pub(super) fn npc_limited(dir: &Path, args: &str) -> assert_cmd::assert::Assert {
        assert_cmd::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "ulimit -v 1048576 && exec \"{}\" {args}",
                crate::support::npc_path().display()
            ))
            .current_dir(dir)
            .timeout(HANG)
            .assert()
    }

    #[test]
    fn fifo_as_manifest_does_not_hang_validate() {
        let repo = Repo::standard();
        std::fs::remove_file(repo.path("npcagent.toml")).unwrap();
        nix::unistd::mkfifo(
            &repo.path("npcagent.toml"),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        let a = repo.npc(&["validate", "npcagent.toml"]).failure();
        assert!(stderr(&a).contains("FIFO"), "{}", stderr(&a));
        let a = repo.npc(&["status"]);
        assert!(a.get_output().status.code().is_some(), "status hung");
    }

    #[test]
    fn fifo_as_prompt_file_does_not_hang_validate() {
        let repo = Repo::standard();
        std::fs::remove_file(repo.path("prompts/p.md")).unwrap();
        nix::unistd::mkfifo(
            &repo.path("prompts/p.md"),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        let a = repo.npc(&["validate"]).code(1);
        let err = stdout(&a) + &stderr(&a);
        assert!(err.contains("prompt file `prompts/p.md`"), "{err}");
        assert!(err.contains("FIFO"), "{err}");
    }

    #[test]
    fn codex_dir_symlink_outside_is_not_written_through() {
        let repo = Repo::standard();
        symlink(repo.outside.path(), repo.path(".codex")).unwrap();
        let a = repo.npc(&["apply", "--auto-approve"]).failure();
        let out = stdout(&a) + &stderr(&a);
        assert!(out.contains("`.codex` is a symbolic link to"), "{out}");
        repo.outside_untouched();
        // The other files are still written normally (§10: one broken agent
        // file is reported and left alone; it does not abort the others).
        assert!(repo.path(".mcp.json").is_file(), "{out}");
    }

    #[test]
    fn mcp_json_symlink_outside_is_neither_shown_nor_replaced() {
        let repo = Repo::standard();
        std::fs::write(
            repo.secret(),
            "{\"mcpServers\":{\"leak\":{\"command\":\"TOP-SECRET-VALUE\"}}}\n",
        )
        .unwrap();
        symlink(repo.secret(), repo.path(".mcp.json")).unwrap();
        let a = repo.npc(&["plan"]);
        let out = stdout(&a) + &stderr(&a);
        assert!(!out.contains("TOP-SECRET-VALUE"), "{out}");
        assert!(out.contains("`.mcp.json` is a symbolic link to"), "{out}");
        let a = repo.npc(&["plan", "--format", "json"]);
        assert!(!stdout(&a).contains("TOP-SECRET-VALUE"));
        repo.npc(&["apply", "--auto-approve"]).failure();
        assert!(is_link(&repo.path(".mcp.json")), "the link was replaced");
        assert_eq!(
            std::fs::read_to_string(repo.secret()).unwrap(),
            "{\"mcpServers\":{\"leak\":{\"command\":\"TOP-SECRET-VALUE\"}}}\n"
        );
    }

    #[test]
    fn mcp_json_symlink_inside_the_repository_is_written_through() {
        let repo = Repo::standard();
        std::fs::create_dir(repo.path("config")).unwrap();
        std::fs::write(repo.path("config/mcp.json"), "{}\n").unwrap();
        symlink("config/mcp.json", repo.path(".mcp.json")).unwrap();
        repo.npc(&["apply", "--auto-approve"]).success();
        assert!(is_link(&repo.path(".mcp.json")), "the link is kept");
        let text = std::fs::read_to_string(repo.path("config/mcp.json")).unwrap();
        assert!(text.contains("\"fs\""), "{text}");
    }

    #[test]
    fn npc_dir_symlink_outside_is_refused() {
        let repo = Repo::standard();
        std::fs::remove_file(repo.secret()).unwrap();
        symlink(repo.outside.path(), repo.path(".npc")).unwrap();
        let a = repo.npc(&["apply", "--auto-approve"]).failure();
        let out = stdout(&a) + &stderr(&a);
        assert!(out.contains("`.npc` is a symbolic link to"), "{out}");
        let names: Vec<_> = std::fs::read_dir(repo.outside.path()).unwrap().collect();
        assert!(
            names.is_empty(),
            "npc wrote into the linked directory: {names:?}"
        );
    }

    #[test]
    fn profiles_dir_symlink_outside_is_not_written_through() {
        let repo = Repo::standard();
        std::fs::create_dir(repo.path(".npc")).unwrap();
        symlink(repo.outside.path(), repo.path(".npc/profiles")).unwrap();
        let a = repo.npc(&["apply", "--auto-approve"]).failure();
        let out = stdout(&a) + &stderr(&a);
        assert!(
            out.contains("`.npc/profiles` is a symbolic link to"),
            "{out}"
        );
        repo.outside_untouched();
        repo.npc(&["render", "profile", "dev", "--write"]).failure();
        repo.outside_untouched();
    }

    #[test]
    fn rendered_profile_symlink_is_refused_not_followed() {
        let repo = Repo::standard();
        std::fs::create_dir_all(repo.path(".npc/profiles")).unwrap();
        symlink(repo.secret(), repo.path(".npc/profiles/dev.md")).unwrap();
        let a = repo.npc(&["plan"]);
        let out = stdout(&a) + &stderr(&a);
        assert!(!out.contains("TOP-SECRET-VALUE"), "{out}");
        repo.npc(&["apply", "--auto-approve"]).failure();
        repo.outside_untouched();
    }

    #[test]
    fn plugin_path_symlink_outside_is_refused() {
        let repo = Repo::new(&format!("{MANIFEST}[plugins.x]\npath = \"plug\"\n"));
        std::fs::write(repo.outside.path().join("plugin.json"), "{}").unwrap();
        symlink(repo.outside.path(), repo.path("plug")).unwrap();
        let a = repo.npc(&["validate"]).code(1);
        let out = stdout(&a) + &stderr(&a);
        assert!(out.contains("`plug` is a symbolic link to"), "{out}");
    }

    #[test]
    fn manifest_symlink_outside_is_refused() {
        let repo = Repo::standard();
        std::fs::rename(
            repo.path("npcagent.toml"),
            repo.outside.path().join("npcagent.toml"),
        )
        .unwrap();
        symlink(
            repo.outside.path().join("npcagent.toml"),
            repo.path("npcagent.toml"),
        )
        .unwrap();
        let a = repo.npc(&["validate", "npcagent.toml"]).failure();
        assert!(
            stderr(&a).contains("is a symbolic link to"),
            "{}",
            stderr(&a)
        );
    }

    #[test]
    fn control_socket_symlink_is_not_followed() {
        let repo = Repo::new("version = 1\n");
        std::fs::create_dir(repo.path(".npc")).unwrap();
        symlink(repo.secret(), repo.path(".npc/daemon.sock")).unwrap();
        let a = repo.npc(&["daemon"]).failure();
        assert!(stderr(&a).contains("daemon.sock"), "{}", stderr(&a));
        repo.outside_untouched();
        assert!(is_link(&repo.path(".npc/daemon.sock")));
    }

    #[test]
    fn log_file_symlink_outside_is_not_written_through() {
        let repo = Repo::standard();
        std::fs::create_dir_all(repo.path(".npc/logs")).unwrap();
        symlink(repo.secret(), repo.path(".npc/logs/mcp_server%2Efs.log")).unwrap();
        let daemon = Daemon::start(&repo);
        let a = repo.npc(&["events", "--format", "json"]).success();
        assert!(
            stdout(&a).contains("is a symbolic link to"),
            "{}",
            stdout(&a)
        );
        drop(daemon);
        repo.outside_untouched();
    }

    #[test]
    fn state_files_are_private_and_git_ignored() {
        let repo = Repo::standard();
        std::fs::create_dir(repo.path(".npc")).unwrap();
        std::fs::set_permissions(repo.path(".npc"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        repo.npc(&["apply", "--auto-approve"]).success();
        assert_eq!(mode(&repo.path(".npc")), 0o700, ".npc is tightened");
        for file in ["state.db", "daemon.lock", "profiles/dev.md", ".gitignore"] {
            assert_eq!(mode(&repo.path(&format!(".npc/{file}"))), 0o600, "{file}");
        }
        assert_eq!(mode(&repo.path(".npc/profiles")), 0o700);
        assert_eq!(
            std::fs::read_to_string(repo.path(".npc/.gitignore")).unwrap(),
            "*\n"
        );
    }

    #[test]
    fn stale_temp_files_of_a_killed_npc_are_removed_on_the_next_run() {
        let repo = Repo::standard();
        let pid = dead_pid();
        std::fs::create_dir_all(repo.path(".npc/profiles")).unwrap();
        // Temp files live beside their target, named `.NAME.npc-PID-N.tmp`.
        let stale = [
            format!(".npc/profiles/.dev.md.npc-{pid}-0.tmp"),
            format!(".npc/.gone.md.npc-{pid}-7.tmp"),
            format!("..mcp.json.npc-{pid}-1.tmp"),
        ];
        let not_ours = repo.path("notes.npc-1-0.txt");
        std::fs::write(&not_ours, "keep").unwrap();
        for s in &stale {
            std::fs::write(repo.path(s), "half-written").unwrap();
        }
        repo.npc(&["apply", "--auto-approve"]).success();
        for s in &stale {
            assert!(!repo.path(s).exists(), "{s} was left behind");
        }
        assert!(not_ours.exists(), "a file npc did not write was removed");
    }
}

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

mod one_lock_per_repository {
    use super::guarded_files::{Daemon, Repo, stderr, stdout};

    const MANIFEST: &str = "version = 1\n[providers.claude]\nkind = \"claude_code\"\n";

    fn finds_the_daemon(repo: &Repo, daemon: &Daemon) {
        let a = repo.npc(&["status"]).success();
        assert!(
            stdout(&a).contains(&format!("daemon pid {}", daemon.pid())),
            "{}{}",
            stdout(&a),
            stderr(&a)
        );
        let a = repo.npc(&["events", "--format", "json"]).success();
        assert!(stdout(&a).contains("daemon.started"), "{}", stdout(&a));
    }

    #[test]
    fn second_daemon_refused_after_state_dir_change() {
        let repo = Repo::new(MANIFEST);
        let daemon = Daemon::start(&repo);
        std::fs::write(
            repo.path("npcagent.toml"),
            format!("{MANIFEST}[project]\nstate_dir = \"elsewhere\"\n"),
        )
        .unwrap();
        let a = repo.npc(&["daemon"]).failure();
        assert!(
            stderr(&a).contains(&format!("another npc daemon (pid {})", daemon.pid())),
            "{}",
            stderr(&a)
        );
        // `apply` goes to the running daemon instead of applying alone.
        let a = repo.npc(&["apply", "--auto-approve"]);
        assert!(
            !stdout(&a).contains("Applied without a daemon"),
            "{}",
            stdout(&a)
        );
        finds_the_daemon(&repo, &daemon);
    }

    #[test]
    fn status_and_events_find_the_daemon_with_an_invalid_manifest() {
        let repo = Repo::new(MANIFEST);
        let daemon = Daemon::start(&repo);
        // Invalid, and naming another state directory: the lock is found
        // where it always is, not where the broken manifest points.
        std::fs::write(
            repo.path("npcagent.toml"),
            "version = 2\n[project]\nstate_dir = \"elsewhere\"\n",
        )
        .unwrap();
        finds_the_daemon(&repo, &daemon);
    }

    #[test]
    fn status_and_events_find_the_daemon_with_the_manifest_deleted() {
        let repo = Repo::new(MANIFEST);
        let daemon = Daemon::start(&repo);
        std::fs::remove_file(repo.path("npcagent.toml")).unwrap();
        finds_the_daemon(&repo, &daemon);
    }
}

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

mod bounded_manifest_reads {
    use super::guarded_files::{Repo, npc_limited, stdout};

    #[test]
    fn huge_manifest_to_status_and_events_is_refused_fast() {
        let repo = Repo::new("");
        // 50 MB of `[1,1,…]`: an unbounded read and parse took 20 s and
        // 5 GB; under a 1 GB address-space limit it cannot be parsed at all.
        let mut text = String::from("version = 1\nx = [");
        text.push_str(&"1,".repeat(25 * 1024 * 1024));
        text.push_str("1]\n");
        std::fs::write(repo.path("npcagent.toml"), text).unwrap();
        let a = npc_limited(repo.dir.path(), "status").success();
        assert!(stdout(&a).contains("no daemon running"), "{}", stdout(&a));
        npc_limited(repo.dir.path(), "events").success();
        let a = npc_limited(repo.dir.path(), "validate").code(1);
        assert!(
            stdout(&a).contains("larger than the limit"),
            "{}",
            stdout(&a)
        );
    }
}

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
