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

    use crate::support::{Daemon, npc, npc_made_state_dir, npc_path, stop_child, wait_for};

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

    pub(super) use crate::support::{stderr_of as stderr, stdout_of as stdout};

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

    #[test]
    fn lock_symlink_outside_is_refused_and_the_outside_file_untouched() {
        let repo = Repo::standard();
        npc_made_state_dir(repo.dir.path());
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
    fn npc_dir_symlink_outside_is_moved_aside_never_followed() {
        let repo = Repo::standard();
        std::fs::remove_file(repo.secret()).unwrap();
        symlink(repo.outside.path(), repo.path(".npc")).unwrap();
        let a = repo.npc(&["apply", "--auto-approve"]).success();
        let out = stdout(&a) + &stderr(&a);
        assert!(out.contains("moved aside unread"), "{out}");
        assert!(!is_link(&repo.path(".npc")), "npc made its own");
        let names: Vec<_> = std::fs::read_dir(repo.outside.path()).unwrap().collect();
        assert!(
            names.is_empty(),
            "npc wrote into the linked directory: {names:?}"
        );
    }

    #[test]
    fn profiles_dir_symlink_outside_is_not_written_through() {
        let repo = Repo::standard();
        npc_made_state_dir(repo.dir.path());
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
        npc_made_state_dir(repo.dir.path());
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
        npc_made_state_dir(repo.dir.path());
        symlink(repo.secret(), repo.path(".npc/daemon.sock")).unwrap();
        let a = repo.npc(&["daemon"]).failure();
        assert!(stderr(&a).contains("daemon.sock"), "{}", stderr(&a));
        repo.outside_untouched();
        assert!(is_link(&repo.path(".npc/daemon.sock")));
    }

    #[test]
    fn log_file_symlink_outside_is_not_written_through() {
        let repo = Repo::standard();
        npc_made_state_dir(repo.dir.path());
        std::fs::create_dir_all(repo.path(".npc/logs")).unwrap();
        symlink(repo.secret(), repo.path(".npc/logs/mcp_server%2Efs.log")).unwrap();
        let daemon = Daemon::start_in(repo.dir.path());
        let a = repo.npc(&["events", "--format", "json"]).success();
        assert!(
            stdout(&a).contains("is a symbolic link to"),
            "{}",
            stdout(&a)
        );
        drop(daemon);
        repo.outside_untouched();
    }

    /// SQLite opens the files beside its database itself; a link planted
    /// at any of them is refused by name before SQLite sees it, for the
    /// commands that write the store and those that only read it.
    #[test]
    fn sqlite_side_file_symlinks_are_refused_by_name() {
        for side in ["state.db-wal", "state.db-shm", "state.db-journal"] {
            let repo = Repo::standard();
            repo.npc(&["apply", "--auto-approve"]).success();
            let planted = repo.path(&format!(".npc/{side}"));
            let _ = std::fs::remove_file(&planted);
            symlink(repo.secret(), &planted).unwrap();
            for args in [
                &["apply", "--auto-approve"][..],
                &["events"][..],
                &["status"][..],
            ] {
                let a = repo.npc(args).failure();
                let err = stderr(&a);
                assert!(err.contains(side), "npc {args:?}: {err}");
                assert!(
                    err.contains(&repo.secret().display().to_string()),
                    "npc {args:?}: {err}"
                );
            }
            repo.outside_untouched();
        }
    }

    #[test]
    fn state_files_are_private_and_git_ignored() {
        let repo = Repo::standard();
        npc_made_state_dir(repo.dir.path());
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
        npc_made_state_dir(repo.dir.path());
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

mod trigger_watches {
    use std::os::unix::fs::symlink;

    use crate::support::*;

    /// A `file_watch` trigger never watches through a link out of the
    /// repository: changes in the linked directory fire nothing.
    #[test]
    fn a_watched_directory_linked_outside_the_repository_fires_nothing() {
        let outside = tempfile::tempdir().unwrap();
        let dir = tempfile::tempdir().unwrap();
        symlink(outside.path(), dir.path().join("docs")).unwrap();
        std::fs::write(
            dir.path().join("npcagent.toml"),
            "version = 1\n[triggers.docs]\nkind = \"file_watch\"\npaths = [\"docs/**/*.md\", \"*.md\"]\ndebounce_ms = 100\naction = { command = \"sh\", args = [\"-c\", \"echo \\\"$NPC_TRIGGER_PAYLOAD\\\" >> fired.log\"] }\n",
        )
        .unwrap();
        let d = Daemon::start_in(dir.path());
        std::fs::create_dir_all(outside.path().join("sub")).unwrap();
        std::fs::write(outside.path().join("secret.md"), "x").unwrap();
        std::fs::write(outside.path().join("sub/more.md"), "x").unwrap();
        std::fs::write(dir.path().join("zz.md"), "x").unwrap();
        let log = wait_for("the sentinel's run", || {
            let log = std::fs::read_to_string(d.root().join("fired.log")).unwrap_or_default();
            log.contains("zz.md").then_some(log)
        });
        assert!(
            !log.contains("secret.md") && !log.contains("more.md"),
            "{log}"
        );
    }
}

// ---------------------------------------------------------------------------
// §2. templates cannot hang or exhaust the daemon
//
// (tests for §2 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------

/// A manifest with one prompt whose inline template is `template`.
fn prompt_manifest(template: &str) -> String {
    format!(
        "version = 1\n\n[prompts.task]\ntemplate = {}\n",
        serde_json::Value::String(template.to_string())
    )
}

const LOOP_BOMB: &str =
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";

/// Run `npc ARGS` in `dir`; it must exit 1 and name `needle` at
/// `npcagent.toml:LINE`.
fn assert_refused_at(dir: &std::path::Path, args: &[&str], needle: &str, line: usize) {
    let out = npc().current_dir(dir).args(args).output().unwrap();
    let stderr = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(1), "npc {args:?}: {stderr}");
    assert!(stderr.contains(needle), "npc {args:?}: {stderr}");
    assert!(
        stderr.contains(&format!("npcagent.toml:{line}:")),
        "npc {args:?} names no location: {stderr}"
    );
}

#[test]
fn a_nested_loop_template_bomb_fails_validate_plan_and_render_at_its_line() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("npcagent.toml"), prompt_manifest(LOOP_BOMB)).unwrap();
    for args in [
        &["validate"][..],
        &["plan"][..],
        &["render", "prompt", "task"][..],
        &["apply", "--auto-approve"][..],
    ] {
        assert_refused_at(dir.path(), args, "work budget", 4);
    }
}

#[test]
fn a_string_multiplication_bomb_fails_validation_at_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let manifest =
        "version = 1\n\n[prompts.task]\ntemplate = \"\"\"intro\n{{ 'x' * 10**9 }}\"\"\"\n";
    std::fs::write(dir.path().join("npcagent.toml"), manifest).unwrap();
    assert_refused_at(dir.path(), &["validate"], "work budget", 5);
}

#[test]
fn a_recursive_macro_bomb_fails_validation() {
    let dir = tempfile::tempdir().unwrap();
    let bomb = "{% macro m(n) %}{% if n > 0 %}{{ m(n - 1) }}{{ m(n - 1) }}{% endif %}{% endmacro %}{{ m(40) }}";
    std::fs::write(dir.path().join("npcagent.toml"), prompt_manifest(bomb)).unwrap();
    assert_refused_at(dir.path(), &["validate"], "work budget", 4);
}

#[test]
fn a_huge_output_template_fails_validation_with_the_output_bound() {
    let dir = tempfile::tempdir().unwrap();
    let flood = "{% for i in range(100000) %}0123456789abcdef0123456789abcdef{% endfor %}";
    std::fs::write(dir.path().join("npcagent.toml"), prompt_manifest(flood)).unwrap();
    assert_refused_at(dir.path(), &["validate"], "output passed the limit", 4);
}

/// A bomb that only goes off with the variable's value: validation cannot
/// see it, the render's own bound stops it.
#[test]
fn a_template_bomb_driven_by_a_variable_fails_render_at_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = "version = 1\n\n[prompts.task]\ntemplate = \"{% for i in range(vars.n|int) %}{% for j in range(vars.n|int) %}{% endfor %}{% endfor %}\"\nvariables.n = { default = \"100000\" }\n";
    std::fs::write(dir.path().join("npcagent.toml"), manifest).unwrap();
    npc()
        .current_dir(dir.path())
        .arg("validate")
        .assert()
        .success();
    let out = npc()
        .current_dir(dir.path())
        .args(["render", "prompt", "task"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("prompts.task")
            && stderr.contains("line 1")
            && stderr.contains("work budget"),
        "{stderr}"
    );
}

#[test]
fn many_profiles_of_variable_driven_bombs_share_one_render_budget() {
    let dir = tempfile::tempdir().unwrap();
    let mut manifest = String::from(
        "version = 1\n\n[providers.claude]\nkind = \"claude_code\"\n\n[prompts.task]\ntemplate = \"{% for i in range(vars.n|int) %}{% for j in range(vars.n|int) %}{% endfor %}{% endfor %}\"\nvariables.n = { default = \"100000\" }\n",
    );
    for i in 0..40 {
        manifest.push_str(&format!(
            "\n[profiles.p{i}]\nprovider = \"claude\"\ndescription = \"d\"\nprompt = \"task\"\n"
        ));
    }
    std::fs::write(dir.path().join("npcagent.toml"), manifest).unwrap();
    let out = npc()
        .current_dir(dir.path())
        .args(["plan", "--format", "json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // Each profile fails twice: its rendering and its Claude Code agent
    // file, all on the one budget.
    let errors: Vec<String> = plan["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["error"].as_str().map(str::to_string))
        .collect();
    assert_eq!(errors.len(), 80, "{errors:?}");
    let shared = errors
        .iter()
        .filter(|e| e.contains("shared work budget"))
        .count();
    assert!(
        shared >= 70,
        "renders stopped by the shared budget: {shared} of 80"
    );
}

#[test]
fn a_template_bomb_edit_leaves_the_daemon_responsive_and_the_next_edit_applies() {
    let mut d = Daemon::start(&prompt_manifest("hello"));
    d.wait_event(0, "reconcile.applied");
    let mark = d.last_event_id();
    d.write_manifest(&prompt_manifest(LOOP_BOMB));
    let invalid = d.wait_event(mark, "manifest.invalid");
    assert!(invalid.to_string().contains("work budget"), "{invalid}");
    // The control socket answers while and after the bomb was looked at.
    let status = d.npc_output(&["status", "--format", "json"]);
    assert!(status.status.success(), "{:?}", status);
    // The next good edit is applied.
    let mark = d.last_event_id();
    d.write_manifest(&prompt_manifest("hello again"));
    let applied = d.wait_event(mark, "reconcile.applied");
    assert!(applied.to_string().contains("prompt.task"), "{applied}");
    // And a stop signal still ends it.
    d.write_manifest(&prompt_manifest(LOOP_BOMB));
    let exit = d.terminate();
    assert!(exit.success(), "daemon exit: {exit}");
}

#[test]
fn a_variable_driven_template_bomb_in_a_profile_keeps_the_daemon_serving() {
    let good = "version = 1\n\n[providers.claude]\nkind = \"claude_code\"\n\n[prompts.task]\ntemplate = \"hello\"\n\n[profiles.dev]\nprovider = \"claude\"\ndescription = \"d\"\nprompt = \"task\"\n";
    let mut d = Daemon::start(good);
    d.wait_event(0, "files.written");
    let profile = d.root().join(".npc/profiles/dev.md");
    wait_for("the rendered profile", || {
        std::fs::read_to_string(&profile)
            .ok()
            .filter(|t| t.contains("hello"))
    });
    let mark = d.last_event_id();
    d.write_manifest(&good.replace(
        "template = \"hello\"",
        "template = \"{% for i in range(vars.n|int) %}{% for j in range(vars.n|int) %}{% endfor %}{% endfor %}\"\nvariables.n = { default = \"100000\" }",
    ));
    let written = d.wait_event(mark, "files.written");
    assert!(written.to_string().contains("work budget"), "{written}");
    assert!(
        std::fs::read_to_string(&profile).unwrap().contains("hello"),
        "the last good profile stays"
    );
    assert!(d.npc_output(&["status"]).status.success());
    let exit = d.terminate();
    assert!(exit.success(), "daemon exit: {exit}");
}

/// A repository whose profile `dev` runs Claude Code with the prompt `task`,
/// a nested loop over the variable `n`.
fn run_bomb_repo() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("npcagent.toml"),
        "version = 1\n\n[providers.claude]\nkind = \"claude_code\"\n\n[prompts.task]\ntemplate = \"{% for i in range(vars.n|int) %}{% for j in range(vars.n|int) %}{% endfor %}{% endfor %}\"\nvariables.n = { default = \"1\" }\n\n[profiles.dev]\nprovider = \"claude\"\ndescription = \"d\"\nprompt = \"task\"\n",
    )
    .unwrap();
    dir
}

const RUN_BOMB_ARGS: [&str; 6] = [
    "run",
    "dev",
    "--prompt-template",
    "task",
    "--var",
    "n=100000",
];

#[test]
fn npc_run_with_a_variable_driven_template_bomb_exits_1_with_the_template_error() {
    let dir = run_bomb_repo();
    let out = npc()
        .current_dir(dir.path())
        .args(RUN_BOMB_ARGS)
        .timeout(std::time::Duration::from_secs(60))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("prompts.task") && stderr.contains("work budget"),
        "{stderr}"
    );
}

#[test]
fn sigint_still_ends_npc_run_while_its_prompt_renders() {
    use std::process::Stdio;
    let dir = run_bomb_repo();
    let mut child = std::process::Command::new(npc_path())
        .current_dir(dir.path())
        .args(RUN_BOMB_ARGS)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = wait_for("npc run to end after SIGINT", || child.try_wait().unwrap());
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    // Interrupted (130) while rendering, the template error (1) if the
    // render had already failed, or killed by the signal before the
    // handlers were installed; never a panic or a run that goes on.
    use std::os::unix::process::ExitStatusExt as _;
    assert!(
        matches!(status.code(), Some(1 | 130)) || status.signal() == Some(2),
        "{status:?}: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// Expressions that nest without brackets, each long enough to overflow a
/// thread's stack in the template compiler if it were compiled.
fn deep_chains() -> Vec<String> {
    vec![
        format!("{{{{ 1{} }}}}", "|upper".repeat(20_000)),
        format!("{{{{ vars{} }}}}", ".a".repeat(20_000)),
        format!("{{{{ {}1 }}}}", "not ".repeat(20_000)),
        format!("{{{{ {}1 }}}}", "-".repeat(20_000)),
        format!("{{{{ 1{} }}}}", "~1".repeat(20_000)),
        format!("{{{{ x{} }}}}", "[0]".repeat(20_000)),
    ]
}

#[test]
fn a_deeply_chained_template_expression_is_an_error_not_a_stack_overflow() {
    for chain in deep_chains() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("npcagent.toml"), prompt_manifest(&chain)).unwrap();
        assert_refused_at(dir.path(), &["validate"], "more than 512 tokens", 4);
        // A prompt file is refused the same way, at its own line.
        let file = "version = 1\n\n[prompts.task]\nfile = \"task.md\"\n";
        std::fs::write(dir.path().join("npcagent.toml"), file).unwrap();
        std::fs::write(dir.path().join("task.md"), format!("intro\n{chain}\n")).unwrap();
        for args in [&["validate"][..], &["render", "prompt", "task"][..]] {
            let out = npc().current_dir(dir.path()).args(args).output().unwrap();
            let said = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(out.status.code(), Some(1), "npc {args:?}: {said:.300}");
            assert!(said.contains("more than 512 tokens"), "{said:.300}");
        }
    }
}

#[test]
fn a_deeply_chained_template_edit_leaves_the_daemon_running() {
    let mut d = Daemon::start(&prompt_manifest("hello"));
    d.wait_event(0, "reconcile.applied");
    for chain in deep_chains() {
        let mark = d.last_event_id();
        d.write_manifest(&prompt_manifest(&chain));
        let invalid = d.wait_event(mark, "manifest.invalid");
        assert!(invalid.to_string().contains("512 tokens"), "{invalid:.300}");
    }
    let status = d.npc_output(&["status", "--format", "json"]);
    assert!(status.status.success(), "{:?}", status);
    let mark = d.last_event_id();
    d.write_manifest(&prompt_manifest("hello again"));
    d.wait_event(mark, "reconcile.applied");
    let exit = d.terminate();
    assert!(exit.success(), "daemon exit: {exit}");
}

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
    let _daemon = crate::support::Stopped::new(child);
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
    use super::guarded_files::{Repo, stderr, stdout};
    use crate::support::Daemon;

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
        let daemon = Daemon::start_in(repo.dir.path());
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

    /// `git clean -fdx` removes the git-ignored `.npc` with the lock file
    /// in it; the running daemon still holds the repository.
    #[test]
    fn second_daemon_refused_after_the_runtime_directory_is_removed() {
        let repo = Repo::new(MANIFEST);
        let _daemon = Daemon::start_in(repo.dir.path());
        std::fs::remove_dir_all(repo.path(".npc")).unwrap();
        let a = repo.npc(&["daemon"]).failure();
        assert!(stderr(&a).contains("another npc daemon"), "{}", stderr(&a));
        let a = repo.npc(&["apply", "--auto-approve"]).failure();
        assert!(
            stderr(&a).contains("another npc daemon"),
            "{}{}",
            stdout(&a),
            stderr(&a)
        );
    }

    #[test]
    fn status_and_events_find_the_daemon_with_an_invalid_manifest() {
        let repo = Repo::new(MANIFEST);
        let daemon = Daemon::start_in(repo.dir.path());
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
        let daemon = Daemon::start_in(repo.dir.path());
        std::fs::remove_file(repo.path("npcagent.toml")).unwrap();
        finds_the_daemon(&repo, &daemon);
    }
}

/// Sockets process `pid` has open.
fn open_sockets(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| {
        d.filter_map(Result::ok)
            .filter(|e| {
                std::fs::read_link(e.path())
                    .is_ok_and(|t| t.to_string_lossy().starts_with("socket:"))
            })
            .count()
    })
}

/// Descriptors process `pid` has open.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

#[test]
fn idle_connections_beyond_the_cap_do_not_keep_status_from_answering() {
    use npcagent::surfaces::control::MAX_CONNECTIONS;
    let d = Daemon::start(&prompt_manifest("hello"));
    let socket = d.root().join(".npc/daemon.sock");
    let idle: Vec<std::os::unix::net::UnixStream> = (0..MAX_CONNECTIONS + 200)
        .map(|_| std::os::unix::net::UnixStream::connect(&socket).unwrap())
        .collect();
    let out = d.npc_output(&["status", "--format", "json"]);
    assert!(
        out.status.success(),
        "status with {} idle connections: {}",
        idle.len(),
        String::from_utf8_lossy(&out.stderr)
    );
    // Evictions catch up with the accept queue: the daemon settles below
    // the cap (plus its own descriptors) while every client stays connected.
    wait_for("the daemon to hold at most the connection cap", || {
        (open_fds(d.pid()) < MAX_CONNECTIONS + 64).then_some(())
    });
    drop(idle);
}

/// The watcher compares an agent file with what npc last wrote to it; a
/// FIFO swapped in for the file must not block it (opening a FIFO waits for
/// a writer), so later edits still reach the daemon.
#[test]
fn a_fifo_swapped_in_for_an_agent_file_does_not_stop_the_watcher() {
    let manifest = |text: &str| {
        format!(
            "{}\n[mcp.servers.fs]\ncommand = \"sleep\"\nargs = [\"1000\"]\n[providers.claude]\nkind = \"claude_code\"\n",
            prompt_manifest(text)
        )
    };
    let d = Daemon::start(&manifest("hello"));
    let agent_file = d.root().join(".mcp.json");
    wait_for("npc to write .mcp.json", || {
        agent_file.is_file().then_some(())
    });
    std::fs::remove_file(&agent_file).unwrap();
    nix::unistd::mkfifo(&agent_file, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let mark = d.last_event_id();
    d.write_manifest(&manifest("edited"));
    let applied = d.wait_event(mark, "reconcile.applied");
    assert!(applied.to_string().contains("prompt.task"), "{applied}");
}

/// Followers that went away (killed, or `npc events --follow | head -1`
/// after its line) hold no place under the connection cap: their
/// connections end when they close, not at the next event.
#[test]
fn closed_event_followers_do_not_fill_the_connection_cap() {
    use npcagent::surfaces::control::MAX_CONNECTIONS;
    use std::io::Write as _;
    let d = Daemon::start(&prompt_manifest("hello"));
    d.wait_event(0, "reconcile.applied");
    let socket = d.root().join(".npc/daemon.sock");
    let before = open_sockets(d.pid());
    for _ in 0..MAX_CONNECTIONS + 20 {
        let mut follower = std::os::unix::net::UnixStream::connect(&socket).unwrap();
        follower
            .write_all(b"{\"protocol\":2,\"op\":\"events\",\"since\":null,\"follow\":true}\n")
            .unwrap();
        drop(follower);
    }
    wait_for("`npc status` to answer", || {
        d.npc_output(&["status", "--format", "json"])
            .status
            .success()
            .then_some(())
    });
    // Every follower's connection is released. (Only sockets are counted:
    // SQLite keeps the descriptors of closed read connections for reuse
    // while the writer holds its lock, a cache bounded by how many reads
    // ran at once.)
    wait_for("the closed followers' connections to be released", || {
        (open_sockets(d.pid()) <= before).then_some(())
    });
}

#[test]
fn a_reload_that_fails_for_lack_of_descriptors_is_retried_until_it_applies() {
    const NOFILE: usize = 64;
    let d = Daemon::start_with(
        &prompt_manifest("hello"),
        DaemonSetup {
            nofile: Some(NOFILE as u32),
            ..DaemonSetup::default()
        },
    );
    d.wait_event(0, "reconcile.applied");
    // Idle connections use up the daemon's descriptors.
    let socket = d.root().join(".npc/daemon.sock");
    let spare = NOFILE.saturating_sub(open_fds(d.pid())) + 8;
    let idle: Vec<std::os::unix::net::UnixStream> = (0..spare)
        .map(|_| std::os::unix::net::UnixStream::connect(&socket).unwrap())
        .collect();
    wait_for("the daemon to run out of descriptors", || {
        (open_fds(d.pid()) >= NOFILE).then_some(())
    });
    let mark = d.last_event_id();
    d.write_manifest(&prompt_manifest("hello again"));
    let failed = d.wait_event(mark, "reload.failed");
    assert!(
        failed.to_string().contains("Too many open files"),
        "{failed}"
    );
    assert!(
        !d.events_after(mark)
            .iter()
            .any(|e| e["kind"] == "manifest.invalid"),
        "an operational failure is not an invalid manifest"
    );
    // Descriptors come back; the daemon retries by itself, no edit needed.
    drop(idle);
    let applied = d.wait_event(failed["id"].as_i64().unwrap(), "reconcile.applied");
    assert!(applied.to_string().contains("prompt.task"), "{applied}");
}

#[test]
fn a_plugin_at_the_repository_root_does_not_reload_the_daemon_by_itself() {
    let manifest = |greeting: &str| {
        format!(
            "version = 1\n\n[providers.claude]\nkind = \"claude_code\"\n\n[mcp.servers.alpha]\ncommand = \"sleep\"\nargs = [\"1000\"]\n\n[plugins.self]\npath = \".\"\n\n[prompts.task]\ntemplate = \"{greeting}\"\n"
        )
    };
    let d = Daemon::start_with(
        &manifest("one"),
        DaemonSetup {
            files: &[(
                "plugin.json",
                r#"{"$schema": "https://agent-plugins.org/schemas/1.0.0/plugin.schema.json", "name": "self", "version": "1.0.0"}"#,
            )],
            ..DaemonSetup::default()
        },
    );
    d.wait_event(0, "reconcile.applied");
    wait_for("npc's own agent file", || {
        d.root().join(".mcp.json").is_file().then_some(())
    });
    let reloads = |log: &str| log.matches("reloading:").count();
    let before = reloads(&d.log());
    // Two edits, each waited for: a daemon that reloads itself on its own
    // writes shows more reloads (and more reconcile events) than edits.
    for greeting in ["two", "three"] {
        let mark = d.last_event_id();
        d.write_manifest(&manifest(greeting));
        let applied = d.wait_event(mark, "reconcile.applied");
        assert!(applied.to_string().contains("prompt.task"), "{applied}");
    }
    let mark = d.last_event_id();
    d.write_manifest(&manifest("four"));
    d.wait_event(mark, "reconcile.applied");
    let log = d.log();
    assert_eq!(
        reloads(&log) - before,
        3,
        "reloads besides the edits:\n{log}"
    );
    let reconciles = d
        .events_after(0)
        .iter()
        .filter(|e| e["kind"] == "reconcile.applied")
        .count();
    assert_eq!(reconciles, 4, "startup and three edits");
}

/// A plugin package of sparse files (no disk space, 32 GiB to read) costs
/// a bounded digest: `plan` (and every daemon reload) finishes.
#[test]
fn a_plugin_package_of_huge_sparse_files_is_digested_within_a_bound() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("npcagent.toml"),
        "version = 1\n[plugins.x]\npath = \"plug\"\n",
    )
    .unwrap();
    let plug = dir.path().join("plug");
    std::fs::create_dir(&plug).unwrap();
    std::fs::write(
        plug.join("plugin.json"),
        r#"{"$schema": "https://agent-plugins.org/schemas/1.0.0/plugin.schema.json", "name": "x"}"#,
    )
    .unwrap();
    for i in 0..2_000 {
        let f = std::fs::File::create(plug.join(format!("f{i}"))).unwrap();
        f.set_len(npcagent::runtime::MAX_PACKAGE_FILE_BYTES as u64)
            .unwrap();
    }
    npc()
        .current_dir(dir.path())
        .arg("plan")
        .timeout(std::time::Duration::from_secs(60))
        .assert()
        .success();
}

// ---------------------------------------------------------------------------
// §5. no orphans, fast shutdown
//
// (tests for §5 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------

mod no_orphans {
    use std::path::Path;
    use std::process::{Child, Command, Stdio};

    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;

    use crate::support::{alive, npc_made_state_dir, npc_path, wait_for};

    /// A `sleep` argument no other test uses, so its copies can be counted.
    fn unique_sleep(offset: u32) -> String {
        (5_000_000 + (std::process::id() % 100_000) * 10 + offset).to_string()
    }

    /// A shell line that starts `sleep <sleep>` in the background after
    /// writing its host pid to `grandchild.pid` (in the child's PID
    /// namespace `$!` is another number; `/proc` is the host's).
    fn grandchild(sleep: &str) -> String {
        format!(
            "sh -c 'read -r p _ </proc/self/stat; echo \"$p\" > grandchild.pid; exec sleep {sleep}' &"
        )
    }

    /// A stdio MCP server whose shell starts a background grandchild, writes
    /// its pid to `grandchild.pid` and waits.
    fn tree_manifest(sleep: &str) -> String {
        let script = format!("{} wait", grandchild(sleep));
        format!(
            "version = 1\n[mcp.servers.tree]\ncommand = \"sh\"\nargs = [\"-c\", {}]\n",
            serde_json::Value::String(script)
        )
    }

    /// A child process killed and reaped on drop, so a failing test leaves nothing running.
    struct Killed(Child);

    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    impl std::ops::Deref for Killed {
        type Target = Child;
        fn deref(&self) -> &Child {
            &self.0
        }
    }

    impl std::ops::DerefMut for Killed {
        fn deref_mut(&mut self) -> &mut Child {
            &mut self.0
        }
    }

    fn spawn_daemon(dir: &Path) -> Killed {
        spawn_daemon_with(dir, &[])
    }

    /// A daemon without PID namespaces: its children's descendants outlive
    /// a crash until the next start, which the ledger is for.
    fn spawn_daemon_on_groups(dir: &Path) -> Killed {
        spawn_daemon_with(
            dir,
            &[(
                npcagent::supervisor::NAMESPACES_ENV,
                npcagent::supervisor::OFF,
            )],
        )
    }

    fn spawn_daemon_with(dir: &Path, env: &[(&str, &str)]) -> Killed {
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(dir.join("daemon.log"))
            .unwrap();
        Command::new(npc_path())
            .arg("daemon")
            .envs(env.iter().copied())
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map(Killed)
            .unwrap()
    }

    fn signal(pid: u32, sig: Signal) {
        kill(Pid::from_raw(pid as i32), sig).unwrap();
    }

    fn terminate(mut daemon: Killed) {
        signal(daemon.id(), Signal::SIGTERM);
        wait_for("the daemon to exit", || daemon.try_wait().unwrap());
    }

    /// The pid in `path` once the file is complete and the process it names
    /// runs `sleep` (it writes its pid, then becomes `sleep`).
    fn wait_pid(path: &Path) -> u32 {
        wait_for(&format!("a pid in {}", path.display()), || {
            let text = std::fs::read_to_string(path).ok()?;
            let pid = text.strip_suffix('\n')?.parse().ok()?;
            (cmdline(pid).first().map(String::as_str) == Some("sleep")).then_some(pid)
        })
    }

    fn cmdline(pid: u32) -> Vec<String> {
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .unwrap_or_default()
            .split(|&b| b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect()
    }

    fn pids() -> Vec<u32> {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .collect()
    }

    /// Live processes running `sleep <arg>`.
    fn copies(arg: &str) -> usize {
        pids()
            .into_iter()
            .filter(|&pid| alive(pid) && cmdline(pid) == ["sleep", arg])
            .count()
    }

    /// Field `n` (1-based, `n >= 3`) of `/proc/<pid>/stat`, if the process exists.
    fn stat_field(pid: u32, n: usize) -> Option<u64> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let rest = &stat[stat.rfind(')')? + 1..];
        rest.split_ascii_whitespace().nth(n - 3)?.parse().ok()
    }

    /// Whether the process `pid` that started at `start` (clock ticks after
    /// boot, field 22 of its stat) is alive: under a loaded test run its
    /// pid may already belong to another process.
    fn still_alive(pid: u32, start: u64) -> bool {
        alive(pid) && stat_field(pid, 22) == Some(start)
    }

    /// The watchdog the daemon `daemon` started.
    fn watchdog_of(daemon: u32) -> u32 {
        wait_for("the daemon's watchdog", || {
            pids().into_iter().find(|&pid| {
                stat_field(pid, 4) == Some(u64::from(daemon))
                    && cmdline(pid).iter().any(|a| a == "__watchdog")
            })
        })
    }

    #[test]
    fn kill_9_of_the_daemon_leaves_no_grandchildren_and_no_second_copy() {
        let dir = tempfile::tempdir().unwrap();
        let sleep = unique_sleep(1);
        std::fs::write(dir.path().join("npcagent.toml"), tree_manifest(&sleep)).unwrap();
        let pid_file = dir.path().join("grandchild.pid");
        let mut daemon = spawn_daemon(dir.path());
        let grandchild = wait_pid(&pid_file);
        assert!(alive(grandchild));

        daemon.kill().unwrap();
        daemon.wait().unwrap();
        wait_for("the grandchild to die with the daemon", || {
            (!alive(grandchild)).then_some(())
        });

        std::fs::remove_file(&pid_file).unwrap();
        let daemon = spawn_daemon(dir.path());
        let again = wait_pid(&pid_file);
        assert_ne!(again, grandchild);
        assert_eq!(copies(&sleep), 1, "one copy after the restart");
        terminate(daemon);
        wait_for("the grandchild to stop with the daemon", || {
            (copies(&sleep) == 0).then_some(())
        });
    }

    /// SIGKILL the daemon and its watchdog; the watchdog cannot act while
    /// stopped, so both die without cleaning up.
    fn crash_with_its_watchdog(daemon: &mut std::process::Child) {
        let watchdog = watchdog_of(daemon.id());
        signal(watchdog, Signal::SIGSTOP);
        daemon.kill().unwrap();
        daemon.wait().unwrap();
        signal(watchdog, Signal::SIGKILL);
        wait_for("the watchdog to die", || (!alive(watchdog)).then_some(()));
    }

    #[test]
    fn a_starting_daemon_stops_what_a_crashed_daemon_and_its_watchdog_left() {
        let dir = tempfile::tempdir().unwrap();
        let sleep = unique_sleep(2);
        std::fs::write(dir.path().join("npcagent.toml"), tree_manifest(&sleep)).unwrap();
        let pid_file = dir.path().join("grandchild.pid");
        let mut daemon = spawn_daemon_on_groups(dir.path());
        let grandchild = wait_pid(&pid_file);
        let started = stat_field(grandchild, 22).expect("the grandchild runs");
        crash_with_its_watchdog(&mut daemon);
        assert!(
            still_alive(grandchild, started),
            "the crash left the grandchild behind"
        );
        let ledgers = std::fs::read_dir(dir.path().join(".npc/groups"))
            .unwrap()
            .count();
        assert_eq!(ledgers, 1, "the crashed daemon's ledger is still there");

        std::fs::remove_file(&pid_file).unwrap();
        let daemon = spawn_daemon(dir.path());
        let again = wait_pid(&pid_file);
        assert!(
            !still_alive(grandchild, started),
            "stopped before the new start"
        );
        assert_ne!(again, grandchild);
        assert_eq!(copies(&sleep), 1, "one copy after the restart");
        terminate(daemon);
    }

    #[test]
    fn a_state_dir_change_after_a_crash_does_not_hide_leftovers() {
        let dir = tempfile::tempdir().unwrap();
        let sleep = unique_sleep(7);
        std::fs::write(dir.path().join("npcagent.toml"), tree_manifest(&sleep)).unwrap();
        let pid_file = dir.path().join("grandchild.pid");
        let mut daemon = spawn_daemon_on_groups(dir.path());
        let grandchild = wait_pid(&pid_file);
        let started = stat_field(grandchild, 22).expect("the grandchild runs");
        crash_with_its_watchdog(&mut daemon);
        assert!(
            still_alive(grandchild, started),
            "the crash left the grandchild behind"
        );

        // The next start reads another state directory; the ledger is not there.
        std::fs::write(
            dir.path().join("npcagent.toml"),
            format!(
                "{}[project]\nstate_dir = \"elsewhere\"\n",
                tree_manifest(&sleep)
            ),
        )
        .unwrap();
        std::fs::remove_file(&pid_file).unwrap();
        let daemon = spawn_daemon(dir.path());
        let again = wait_pid(&pid_file);
        assert!(
            !still_alive(grandchild, started),
            "stopped before the new start"
        );
        assert_ne!(again, grandchild);
        assert_eq!(copies(&sleep), 1, "one copy after the restart");
        terminate(daemon);
    }

    #[test]
    fn a_linked_ledger_directory_is_neither_read_nor_written() {
        use std::os::unix::fs::DirBuilderExt;

        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("npcagent.toml"),
            tree_manifest(&unique_sleep(6)),
        )
        .unwrap();
        let state = dir.path().join(".npc");
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&state)
            .unwrap();
        std::os::unix::fs::symlink(outside.path(), state.join("groups")).unwrap();
        // Parses as nothing npc knows: must survive any cleanup.
        let victim = outside.path().join("settings.json");
        std::fs::write(&victim, "{ \"keep\": true }").unwrap();

        let names = || -> Vec<String> {
            std::fs::read_dir(outside.path())
                .unwrap()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        };
        let daemon = spawn_daemon(dir.path());
        // The group is recorded before its shell can write the pid.
        wait_pid(&dir.path().join("grandchild.pid"));
        assert_eq!(
            names(),
            ["settings.json"],
            "nothing written through the link"
        );
        terminate(daemon);
        assert_eq!(
            names(),
            ["settings.json"],
            "nothing removed through the link"
        );
        assert_eq!(
            std::fs::read_to_string(&victim).unwrap(),
            "{ \"keep\": true }"
        );
    }

    #[test]
    fn a_recorded_group_whose_pid_was_reused_is_never_signalled() {
        use std::os::unix::fs::DirBuilderExt;
        use std::os::unix::process::CommandExt;

        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("npcagent.toml"), "version = 1\n").unwrap();
        let groups = npc_made_state_dir(dir.path()).join("groups");
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&groups)
            .unwrap();
        let group_leader = |arg: String| {
            Command::new("sleep")
                .arg(arg)
                .process_group(0)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map(Killed)
                .unwrap()
        };
        // The pid of a recorded leader, now an unrelated process that started later.
        let mut unrelated = group_leader(unique_sleep(3));
        // A genuine leftover: same pid and start time as recorded.
        let mut leftover = group_leader(unique_sleep(4));
        let start = |child: &Killed| stat_field(child.id(), 22).unwrap();
        let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
        let ledger = serde_json::json!({
            "boot_id": boot_id.trim(),
            // This test process with another start time: an owner that is gone.
            "owner": { "pid": std::process::id(), "start": 0 },
            "groups": [
                { "pgid": unrelated.id(), "start": start(&unrelated) - 1 },
                { "pgid": leftover.id(), "start": start(&leftover) },
            ],
        });
        let planted = groups.join("crashed.json");
        std::fs::write(&planted, ledger.to_string()).unwrap();

        let daemon = spawn_daemon(dir.path());
        wait_for("the leftover group to be stopped", || {
            leftover.try_wait().unwrap()
        });
        wait_for("the crashed daemon's ledger to be removed", || {
            (!planted.exists()).then_some(())
        });
        assert!(
            unrelated.try_wait().unwrap().is_none(),
            "a reused pid was signalled"
        );
        terminate(daemon);
        assert!(unrelated.try_wait().unwrap().is_none());
    }

    /// Each server traps SIGTERM: it marks that it got it, then waits until
    /// all ten got theirs before marking `all`, and keeps running (only
    /// SIGKILL ends it). Stopped one after another, no server would ever see
    /// all ten marks.
    const STUBBORN: &str = r#"trap 'touch marks/term.$1; until [ "$(ls marks | grep -c "^term")" -ge 10 ]; do sleep 0.02; done; touch marks/all.$1' TERM
touch marks/up.$1
while :; do sleep 0.05; done"#;

    /// Ten stdio servers running [`STUBBORN`].
    fn stubborn_manifest() -> String {
        let mut manifest = String::from("version = 1\n");
        for i in 0..10 {
            manifest.push_str(&format!(
                "[mcp.servers.s{i}]\ncommand = \"sh\"\nargs = [\"-c\", '''{STUBBORN}''', \"sh\", \"{i}\"]\n"
            ));
        }
        manifest
    }

    /// Files in `marks` whose names start with `prefix`.
    fn marks_with(marks: &Path, prefix: &str) -> usize {
        std::fs::read_dir(marks)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
            .count()
    }

    #[test]
    fn sigterm_stops_ten_stubborn_children_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let marks = dir.path().join("marks");
        std::fs::create_dir(&marks).unwrap();
        std::fs::write(dir.path().join("npcagent.toml"), stubborn_manifest()).unwrap();
        let count = |prefix: &str| marks_with(&marks, prefix);
        let mut daemon = spawn_daemon(dir.path());
        wait_for("ten stubborn servers", || {
            (count("up.") == 10).then_some(())
        });

        signal(daemon.id(), Signal::SIGTERM);
        let status = wait_for("the daemon to stop", || daemon.try_wait().unwrap());
        assert!(status.success(), "{status}");
        assert_eq!(count("term."), 10, "every server got SIGTERM");
        assert_eq!(
            count("all."),
            10,
            "every server got SIGTERM before any was killed"
        );
    }

    #[test]
    fn a_reload_that_removes_ten_stubborn_children_stops_them_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let marks = dir.path().join("marks");
        std::fs::create_dir(&marks).unwrap();
        std::fs::write(dir.path().join("npcagent.toml"), stubborn_manifest()).unwrap();
        let count = |prefix: &str| marks_with(&marks, prefix);
        let daemon = spawn_daemon(dir.path());
        wait_for("ten stubborn servers", || {
            (count("up.") == 10).then_some(())
        });
        // The watcher starts once the first apply is done.
        wait_for("the first apply", || {
            let out = crate::support::npc()
                .current_dir(dir.path())
                .args(["events", "--format", "json"])
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout)
                .contains("\"reconcile.applied\"")
                .then_some(())
        });

        let tmp = dir.path().join(".npcagent.toml.tmp");
        std::fs::write(&tmp, "version = 1\n").unwrap();
        std::fs::rename(&tmp, dir.path().join("npcagent.toml")).unwrap();
        wait_for("every server to see all ten SIGTERMs", || {
            (count("all.") == 10).then_some(())
        });
        terminate(daemon);
    }

    #[test]
    fn kill_9_of_npc_run_leaves_no_grandchildren_of_the_agent() {
        use std::os::unix::fs::PermissionsExt;

        let dir = tempfile::tempdir().unwrap();
        let sleep = unique_sleep(5);
        let agent = dir.path().join("agent.sh");
        std::fs::write(&agent, format!("#!/bin/sh\n{}\nwait\n", grandchild(&sleep))).unwrap();
        std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755)).unwrap();
        let manifest = format!(
            "version = 1\n[providers.fake]\nkind = \"claude_code\"\ncommand = {}\n[profiles.dev]\nprovider = \"fake\"\ndescription = \"d\"\n",
            serde_json::Value::String(agent.display().to_string())
        );
        std::fs::write(dir.path().join("npcagent.toml"), manifest).unwrap();
        let mut run = Command::new(npc_path())
            .args(["run", "dev", "--prompt", "go"])
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map(Killed)
            .unwrap();
        let grandchild = wait_pid(&dir.path().join("grandchild.pid"));
        assert!(alive(grandchild));
        run.kill().unwrap();
        run.wait().unwrap();
        wait_for("the agent's grandchild to die with `npc run`", || {
            (!alive(grandchild)).then_some(())
        });
    }
}

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

/// `npc validate --format json` on `text` written as `name` in a fresh
/// directory, with `env` as the whole environment: exit code and report.
fn validate_json(name: &str, text: &[u8], env: &[(&str, &str)]) -> (i32, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    let out = npc()
        .current_dir(dir.path())
        .env_clear()
        .envs(env.iter().copied())
        .args(["validate", "--format", "json"])
        .arg(&path)
        .output()
        .unwrap();
    let code = out.status.code().expect("npc exited");
    let report = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    (code, report)
}

/// Summaries of a validate report.
fn report_summaries(report: &serde_json::Value) -> Vec<String> {
    report["diagnostics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["summary"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn an_8_mb_array_of_ints_is_refused_by_the_item_cap() {
    let ones = "1,".repeat((8 * 1024 * 1024 - 64) / 2);
    let text = format!("version = 1\nx = [{ones}1]\n");
    let (code, report) = validate_json("npcagent.toml", text.as_bytes(), &[]);
    assert_eq!(code, 1);
    let summaries = report_summaries(&report);
    assert_eq!(
        summaries,
        [
            "the manifest has more items (keys, values, brackets) than 60000 plus one per 8 bytes of text (at most 200000)"
        ]
    );
    assert_eq!(report["diagnostics"][0]["range"]["start"]["line"], 2);
}

#[test]
fn millions_of_empty_args_are_refused() {
    // As many empty arguments as fit in the size limit (2.8 M)…
    let many = "\"\",".repeat((8 * 1024 * 1024 - 128) / 3);
    let text = format!("version = 1\n[mcp.servers.s]\ncommand = \"x\"\nargs = [{many}\"\"]\n");
    let (code, report) = validate_json("npcagent.toml", text.as_bytes(), &[]);
    assert_eq!(code, 1);
    assert_eq!(
        report_summaries(&report),
        [
            "the manifest has more items (keys, values, brackets) than 60000 plus one per 8 bytes of text (at most 200000)"
        ]
    );
    // …and any list past the per-array bound, in TOML and JSON alike.
    let args = vec!["\"\""; 4097].join(",");
    for (name, text) in [
        (
            "npcagent.toml",
            format!("version = 1\n[mcp.servers.s]\ncommand = \"x\"\nargs = [{args}]\n"),
        ),
        (
            "npcagent.json",
            format!(
                r#"{{"version": 1, "mcp": {{"servers": {{"s": {{"command": "x", "args": [{args}]}}}}}}}}"#
            ),
        ),
    ] {
        let (code, report) = validate_json(name, text.as_bytes(), &[]);
        assert_eq!(code, 1, "{name}");
        assert_eq!(
            report_summaries(&report),
            ["this array has more than 4096 items"],
            "{name}"
        );
    }
}

#[test]
fn a_string_past_the_bound_is_refused_in_both_syntaxes() {
    let long = "s".repeat(1024 * 1024 + 1);
    for (name, text) in [
        (
            "npcagent.toml",
            format!("version = 1\n[project]\nname = \"{long}\"\n"),
        ),
        (
            "npcagent.json",
            format!(r#"{{"version": 1, "project": {{"name": "{long}"}}}}"#),
        ),
    ] {
        let (code, report) = validate_json(name, text.as_bytes(), &[]);
        assert_eq!(code, 1, "{name}");
        assert_eq!(
            report_summaries(&report),
            ["this string is longer than 1048576 bytes"],
            "{name}"
        );
    }
}

#[test]
fn a_3_mb_diagnostics_report_is_stored_not_dropped() {
    let d = Daemon::start_with(
        "version = 1\n",
        DaemonSetup {
            only_env: Some(&[]),
            ..DaemonSetup::default()
        },
    );
    let mark = d.last_event_id();
    // 1,200 unknown fields, each named by a 3,000-character key: quoted in
    // full, the report was 3.6 MB and the event over the payload limit.
    let manifest: String = std::iter::once("version = 1\n".to_string())
        .chain((0..1200).map(|i| {
            format!(
                "[mcp.servers.s{i}]\ncommand = \"x\"\n{}{i} = 1\n",
                "k".repeat(3000)
            )
        }))
        .collect();
    d.write_manifest(&manifest);
    let invalid = d.wait_event(mark, "manifest.invalid");
    let payload = &invalid["payload"];
    assert!(
        payload.to_string().len() <= 1024 * 1024,
        "stored payload is {} bytes",
        payload.to_string().len()
    );
    let report = &payload["report"];
    assert!(
        report["error_count"].as_u64().unwrap() >= 1000,
        "{}",
        report["error_count"]
    );
    let diagnostics = report["diagnostics"].as_array().unwrap();
    let first = diagnostics[0]["summary"].as_str().unwrap();
    assert!(
        first.starts_with("unknown field `kkkk") && first.contains('…'),
        "{first}"
    );
    assert!(
        diagnostics.iter().all(|d| d.to_string().len() < 2000),
        "every diagnostic quotes a bounded prefix"
    );
}

/// The planner benchmark's 10,000 components (5,000 servers, 5,000
/// triggers): about 150,000 items in 750 KB.
fn ten_thousand_components() -> String {
    (0..5_000).fold(String::from("version = 1\n"), |mut s, i| {
        s.push_str(&format!(
            "[mcp.servers.s{i}]\ncommand = \"srv\"\nargs = [\"--n\", \"0\"]\nenv = {{ A = \"b\" }}\n[triggers.t{i}]\nkind = \"cron\"\nschedule = \"1 * * * *\"\naction = {{ command = \"make\" }}\n"
        ));
        s
    })
}

#[test]
fn a_large_valid_manifest_validates_and_its_errors_are_still_reported() {
    let text = ten_thousand_components();
    let (code, report) = validate_json("npcagent.toml", text.as_bytes(), &[]);
    assert_eq!(code, 0, "{:?}", report_summaries(&report));
    assert_eq!(report["error_count"], 0);
    // The same document with one redefinition at its very end: the toml
    // crate's diagnostic, at the redefinition.
    let broken = format!("{text}[mcp.servers.s7]\n");
    let (code, report) = validate_json("npcagent.toml", broken.as_bytes(), &[]);
    assert_eq!(code, 1);
    let summaries = report_summaries(&report);
    assert_eq!(
        summaries,
        ["invalid TOML: duplicate key `s7`"],
        "{summaries:?}"
    );
    let last_line = text.lines().count() + 1;
    assert_eq!(
        report["diagnostics"][0]["range"]["start"]["line"]
            .as_u64()
            .unwrap() as usize,
        last_line
    );
}

/// Line and column (1-based) where diagnostic `i` of a report starts.
fn diagnostic_at(report: &serde_json::Value, i: usize) -> (u64, u64) {
    let start = &report["diagnostics"][i]["range"]["start"];
    (
        start["line"].as_u64().unwrap(),
        start["column"].as_u64().unwrap(),
    )
}

#[test]
fn a_large_document_with_errors_reports_them_without_the_toml_crate() {
    use npcagent::model::node::{toml_item_count, toml_path_fits};
    // Too many items for the toml crate's path to fit the memory budget:
    // npc's own builder reports the errors, in toml's words.
    let text = ten_thousand_components();
    let tokens = toml_item_count(&text).unwrap().tokens;
    assert!(!toml_path_fits(text.len(), tokens), "{tokens} tokens");
    let lines = text.lines().count() as u64;
    // A duplicate key in the middle, a redefinition at the very end: both,
    // in document order, at the key the caret points at.
    let broken = text.replacen(
        "[mcp.servers.s100]\ncommand = \"srv\"\n",
        "[mcp.servers.s100]\ncommand = \"srv\"\ncommand = \"again\"\n",
        1,
    ) + "[mcp.servers.s7]\n";
    let (code, report) = validate_json("npcagent.toml", broken.as_bytes(), &[]);
    assert_eq!(code, 1);
    assert_eq!(
        report_summaries(&report),
        [
            "invalid TOML: duplicate key `command`",
            "invalid TOML: duplicate key `s7`"
        ]
    );
    let first = text[..text.find("[mcp.servers.s100]\n").unwrap()]
        .lines()
        .count() as u64;
    assert_eq!(diagnostic_at(&report, 0), (first + 3, 1));
    assert_eq!(diagnostic_at(&report, 1), (lines + 2, 14));
    // A syntax error at the end: the parser's message and place.
    let broken = format!("{text}z = = 1\n");
    let (code, report) = validate_json("npcagent.toml", broken.as_bytes(), &[]);
    assert_eq!(code, 1);
    let summaries = report_summaries(&report);
    assert_eq!(
        summaries[0], "invalid TOML: extra `=`, expected nothing",
        "{summaries:?}"
    );
    for i in 0..summaries.len() {
        assert_eq!(diagnostic_at(&report, i).0, lines + 1, "{summaries:?}");
    }
}

#[test]
fn the_item_limit_holds_at_its_edge() {
    use npcagent::model::node::item_limit;
    const LIMIT_SUMMARY: &str = "the manifest has more items (keys, values, brackets) than 60000 plus one per 8 bytes of text (at most 200000)";
    // `kN = 1` lines, 1,000 to a table, up to exactly the limit of the
    // document's own size (`version = 1` is 2 items, a header 3, a key 2).
    let mut text = String::from("version = 1\n");
    let mut items = 2;
    for i in 0.. {
        let next = if i % 1000 == 0 {
            format!("[t{i}]\nk{i} = 1\n")
        } else {
            format!("k{i} = 1\n")
        };
        let n = if i % 1000 == 0 { 5 } else { 2 };
        if items + n > item_limit(text.len() + next.len()) {
            break;
        }
        text.push_str(&next);
        items += n;
    }
    assert!(items > 150_000, "{items}");
    // At the limit: parsed (the unknown sections are the only errors).
    let (code, report) = validate_json("npcagent.toml", text.as_bytes(), &[]);
    assert_eq!(code, 1);
    let summaries = report_summaries(&report);
    assert!(
        !summaries.iter().any(|s| s == LIMIT_SUMMARY),
        "{summaries:?}"
    );
    assert!(
        summaries.iter().all(|s| s.starts_with("unknown")),
        "{summaries:?}"
    );
    // Past it by a few items in few bytes: refused before parsing.
    text.push_str("z = [1,1,1,1,1,1,1,1,1,1]\n");
    let (code, report) = validate_json("npcagent.toml", text.as_bytes(), &[]);
    assert_eq!(code, 1);
    assert_eq!(report_summaries(&report), [LIMIT_SUMMARY]);
}

mod bounded_imports {
    use super::guarded_files::{Repo, npc_limited};

    fn stderr(a: &assert_cmd::assert::Assert) -> String {
        String::from_utf8_lossy(&a.get_output().stderr).into_owned()
    }

    /// Just under the 16 MB read cap.
    const NEAR_CAP: usize = 15 * 1024 * 1024;

    #[test]
    fn a_15_mb_codex_config_of_ints_is_refused_by_import() {
        let repo = Repo::new("");
        std::fs::create_dir_all(repo.path(".codex")).unwrap();
        let ones = "1,".repeat(NEAR_CAP / 2);
        let toml = format!("[mcp_servers.s]\ncommand = \"x\"\nx = [{ones}1]\n");
        std::fs::write(repo.path(".codex/config.toml"), &toml).unwrap();
        // The same bulk in every JSON kind, and in a file whose kind comes
        // from its shape: parsing either took about 1 GB.
        let json = format!(r#"{{"mcpServers": {{"s": {{"command": "x"}}}}, "x": [{ones}1]}}"#);
        std::fs::write(repo.path(".mcp.json"), &json).unwrap();
        std::fs::write(repo.path("opencode.json"), &json).unwrap();
        std::fs::write(repo.path("unnamed"), &json).unwrap();
        std::fs::write(repo.path("unnamed-toml"), &toml).unwrap();
        for file in [
            ".codex/config.toml",
            ".mcp.json",
            "opencode.json",
            "unnamed",
            "unnamed-toml",
        ] {
            let a = npc_limited(repo.dir.path(), &format!("import {file}")).code(1);
            let err = stderr(&a);
            assert!(
                err.contains(file) && err.contains("more items (keys, values, brackets)"),
                "{file}: {err}"
            );
        }
    }

    #[test]
    fn thousands_of_codex_server_tables_are_refused_by_import() {
        let repo = Repo::new("");
        std::fs::create_dir_all(repo.path(".codex")).unwrap();
        let table = |i: usize| format!("[mcp_servers.s{i}]\ncommand = \"x\"\n");
        // Past the server cap but well within the item bound…
        let few: String = (0..2000).map(table).collect();
        std::fs::write(repo.path(".codex/config.toml"), few).unwrap();
        let a = npc_limited(repo.dir.path(), "import .codex/config.toml").code(1);
        assert!(
            stderr(&a).contains("declares 2000 MCP servers, more than the limit of 1024"),
            "{}",
            stderr(&a)
        );
        // …and as many tables as fit under the read cap.
        let mut many = String::new();
        let mut i = 0;
        while many.len() < NEAR_CAP {
            many.push_str(&table(i));
            i += 1;
        }
        std::fs::write(repo.path(".codex/config.toml"), many).unwrap();
        let a = npc_limited(repo.dir.path(), "import .codex/config.toml").code(1);
        assert!(
            stderr(&a).contains("more items (keys, values, brackets)"),
            "{}",
            stderr(&a)
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

#[test]
fn a_one_character_secret_does_not_mangle_keys_or_ids_in_stored_events() {
    const TOKEN: &str = "tok-9f3a7c51e2";
    let manifest = r#"version = 1
[mcp.servers.s1]
command = "sleep"
args = ["1000", "${LONG_TOKEN}"]
env = { RT_DEBUG = "${RT_DEBUG}", SERVER_TOKEN = "${LONG_TOKEN}" }
"#;
    let d = Daemon::start_with(
        manifest,
        DaemonSetup {
            only_env: Some(&[("RT_DEBUG", "e"), ("LONG_TOKEN", TOKEN)]),
            ..DaemonSetup::default()
        },
    );
    let started = d.wait_event(0, "component.started");
    assert_eq!(started["component"], "mcp_server.s1", "{started}");
    let (events, text) = d.cli_events();
    assert!(events.len() >= 2);
    assert!(
        !text.contains(TOKEN),
        "a real secret is never stored: {text}"
    );
    assert!(
        !text.contains("s<redacted>") && !text.contains("<redacted>rv"),
        "a one-character value was scrubbed inside other words: {text}"
    );
    for event in &events {
        // Keys and ids come back as written.
        for key in ["id", "kind", "payload"] {
            assert!(event.get(key).is_some(), "{event}");
        }
        let kind = event["kind"].as_str().unwrap();
        assert!(!kind.contains("redacted"), "{event}");
        if let Some(component) = event["component"].as_str() {
            assert!(!component.contains("redacted"), "{event}");
        }
    }
}

// ---------------------------------------------------------------------------
// §8. output and errors a user can act on
//
// (tests for §8 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------

/// A temporary repository holding `manifest` as `npcagent.toml`.
fn s8_repo(manifest: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("npcagent.toml"), manifest).unwrap();
    dir
}

/// `npc ARGS` in `dir` with stdout a pipe whose reader is already gone, so
/// the first write fails with EPIPE (what `npc events | head -1` meets once
/// `head` has exited).
fn s8_into_closed_pipe(dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    let (read, write) = nix::unistd::pipe().unwrap();
    drop(read);
    std::process::Command::new(npc_path())
        .args(args)
        .current_dir(dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::from(write))
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap()
}

const S8_EVENTFUL: &str =
    "version = 1\n[mcp.servers.alpha]\ncommand = \"sleep\"\nargs = [\"1000\"]\n";

#[test]
fn events_into_a_closed_pipe_ends_quietly_without_a_panic() {
    let dir = s8_repo(S8_EVENTFUL);
    {
        // through the daemon, following too: the first write meets EPIPE
        let _daemon = Daemon::start_in(dir.path());
        for args in [&["events"][..], &["events", "--follow"], &["status"]] {
            let out = s8_into_closed_pipe(dir.path(), args);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                !stderr.contains("panicked"),
                "npc {args:?} panicked: {stderr}"
            );
            assert_eq!(out.status.code(), Some(0), "npc {args:?}: {stderr}");
            assert!(stderr.is_empty(), "npc {args:?} is not quiet: {stderr}");
        }
    }
    // without a daemon, from the store the daemon left
    let listed = npc()
        .current_dir(dir.path())
        .args(["events", "--format", "json"])
        .output()
        .unwrap();
    assert!(!listed.stdout.is_empty(), "the store holds events to print");
    for args in [
        &["events"][..],
        &["events", "--format", "json"],
        &["events", "--follow"],
        &["schema"],
        &["validate"],
        &["validate", "--format", "json"],
        &["plan"],
        &["status"],
        &["completions", "bash"],
        &["--help"],
        &["--version"],
        &["render", "profile", "nope"],
    ] {
        let out = s8_into_closed_pipe(dir.path(), args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !stderr.contains("panicked"),
            "npc {args:?} panicked: {stderr}"
        );
        assert_ne!(out.status.code(), Some(101), "npc {args:?}: {stderr}");
        if args != ["render", "profile", "nope"] {
            assert_eq!(out.status.code(), Some(0), "npc {args:?}: {stderr}");
            assert!(stderr.is_empty(), "npc {args:?} is not quiet: {stderr}");
        }
    }
}

#[test]
fn run_into_a_closed_pipe_lets_the_agent_finish_and_records_it() {
    let repo = s9_fake_agent_repo("codex", "codex/0.171.0/tool_call.jsonl", &[]);
    for format in ["json", "human"] {
        let out = s8_into_closed_pipe(
            repo.path(),
            &["run", "dev", "--prompt", "go", "--format", format],
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert_eq!(
            out.status.code(),
            Some(0),
            "the run's own outcome: {stderr}"
        );
    }
    let finished: Vec<serde_json::Value> = s9_recorded_events(repo.path())
        .into_iter()
        .filter(|e| e["kind"] == "run.finished")
        .collect();
    assert_eq!(finished.len(), 2);
    assert!(
        finished
            .iter()
            .all(|e| e["payload"]["outcome"] == "succeeded")
    );
}

#[test]
fn events_piped_into_head_exits_zero_under_pipefail() {
    let dir = s8_repo(S8_EVENTFUL);
    npc()
        .current_dir(dir.path())
        .args(["apply", "--auto-approve"])
        .assert()
        .success();
    // `npc schema` is longer than a pipe buffer, so `head -1` closes the pipe
    // while npc still writes.
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg("set -o pipefail; \"$NPC\" schema | head -1 >/dev/null && \"$NPC\" events | head -1 >/dev/null")
        .env("NPC", npc_path())
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
}

#[test]
fn output_to_a_full_disk_is_an_error_message_and_exit_1() {
    let dir = s8_repo(S8_EVENTFUL);
    for args in [
        &["schema"][..],
        &["validate", "--format", "json"],
        &["plan"],
        &["completions", "zsh"],
        &["--help"],
    ] {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let out = std::process::Command::new(npc_path())
            .args(args)
            .current_dir(dir.path())
            .stdout(full)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !stderr.contains("panicked"),
            "npc {args:?} panicked: {stderr}"
        );
        assert_eq!(out.status.code(), Some(1), "npc {args:?}: {stderr}");
        assert!(
            stderr.contains("cannot write to stdout") && stderr.contains("No space left on device"),
            "npc {args:?}: {stderr}"
        );
    }
}

#[test]
fn a_closed_stderr_does_not_panic_either() {
    // The error for a missing manifest goes to stderr, whose reader is gone:
    // the exit status stays the usage error it is, not a panic's 101.
    let dir = tempfile::tempdir().unwrap();
    let (read, write) = nix::unistd::pipe().unwrap();
    drop(read);
    let out = std::process::Command::new(npc_path())
        .args(["validate", "missing.toml"])
        .current_dir(dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::from(write))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn hints_name_only_commands_that_exist() {
    // The unit test `cli::tests::every_npc_command_named_in_src_exists`
    // checks every hint in the source; through the binary, the plugin hint
    // validate gives for a missing package names no command npc lacks.
    let dir = s8_repo("version = 1\n[plugins.lint]\npath = \"plugins/lint\"\n");
    let out = npc()
        .current_dir(dir.path())
        .arg("validate")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("plugins/lint") || stderr.contains("plugins/lint"),
        "{stdout}{stderr}"
    );
    assert!(
        !stdout.contains("npc plugin") && !stderr.contains("npc plugin"),
        "{stdout}{stderr}"
    );
}

const S8_UNRUN_KINDS: &str = r#"version = 1
[mcp.servers.remote]
url = "https://mcp.example.com/mcp"
[providers.claude]
kind = "claude_code"
[[hooks.on_agent_end]]
command = "true"
[triggers.poll]
kind = "cron"
schedule = "15m"
action = { command = "true" }
"#;

#[test]
fn apply_says_declared_for_kinds_nothing_runs() {
    let dir = s8_repo(S8_UNRUN_KINDS);
    let out = npc()
        .current_dir(dir.path())
        .args(["apply", "--auto-approve"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let line = |id: &str| {
        text.lines()
            .find(|l| l.contains(&format!(" {id}: ")))
            .unwrap_or_else(|| panic!("no `{id}` in {text}"))
            .to_string()
    };
    assert!(
        line("trigger.poll").ends_with("recorded; it fires while `npc daemon` runs"),
        "{text}"
    );
    assert!(
        line("hooks.on_agent_end").ends_with("per call (no process of its own)"),
        "{text}"
    );
    assert!(line("mcp_server.remote").ends_with("configured"), "{text}");
    assert!(!text.contains(": applied"), "{text}");
    // removing a declared trigger says so
    std::fs::write(
        dir.path().join("npcagent.toml"),
        S8_UNRUN_KINDS.split("[triggers.poll]").next().unwrap(),
    )
    .unwrap();
    let out = npc()
        .current_dir(dir.path())
        .args(["apply", "--auto-approve"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines().any(|l| l.contains("trigger.poll: removed")),
        "{text}"
    );
}

#[test]
fn status_shows_triggers_and_hooks_as_declared_not_applied() {
    let dir = s8_repo(S8_UNRUN_KINDS);
    let _daemon = Daemon::start_in(dir.path());
    let out = npc()
        .current_dir(dir.path())
        .args(["status", "--format", "json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = doc["components"].as_array().unwrap();
    let state = |id: &str| {
        rows.iter()
            .find(|c| c["id"] == id)
            .unwrap_or_else(|| panic!("no `{id}` in {doc}"))["state"]
            .clone()
    };
    assert_eq!(state("trigger.poll"), "armed");
    assert_eq!(state("hooks.on_agent_end"), "per_call");
    assert_eq!(state("mcp_server.remote"), "configured");
    assert_eq!(state("provider.claude"), "ready");
    assert!(rows.iter().all(|c| c["state"] != "applied"), "{doc}");
    assert!(
        rows.iter()
            .filter(|c| c["state"] == "declared")
            .all(|c| c["detail"]
                .as_str()
                .is_some_and(|d| d.contains("nothing runs it"))),
        "{doc}"
    );
    let human = npc()
        .current_dir(dir.path())
        .arg("status")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&human.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("hooks.on_agent_end"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("per call (no process of its own)"), "{text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("trigger.poll"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("armed"), "{text}");
    assert!(!text.contains("applied"), "{text}");
}

#[test]
fn a_nul_byte_in_an_argument_is_refused_by_validate() {
    for (what, manifest, summary) in [
        (
            "args",
            "version = 1\n[mcp.servers.s]\ncommand = \"x\"\nargs = [\"a\\u0000b\"]\n",
            "argument 1 contains a NUL byte",
        ),
        (
            "command",
            "version = 1\n[panes.p]\ncommand = \"x\\u0000y\"\n",
            "`command` contains a NUL byte",
        ),
        (
            "env",
            "version = 1\n[pane_plugins.p]\ncommand = \"x\"\nenv = { K = \"a\\u0000\" }\n",
            "environment value of `K` contains a NUL byte",
        ),
        (
            "cwd",
            "version = 1\n[mcp.servers.s]\ncommand = \"x\"\ncwd = \"d\\u0000\"\n",
            "`cwd` contains a NUL byte",
        ),
    ] {
        let (code, report) = validate_json("npcagent.toml", manifest.as_bytes(), &[]);
        assert_eq!(code, 1, "{what}");
        assert_eq!(report_summaries(&report), [summary], "{what}");
    }
}

#[test]
fn an_argument_list_longer_than_the_os_allows_is_refused_by_validate() {
    // One argument past MAX_ARG_STRLEN (131072 bytes with its NUL).
    let long = "a".repeat(131_072);
    let manifest = format!("version = 1\n[mcp.servers.s]\ncommand = \"x\"\nargs = [\"{long}\"]\n");
    let (code, report) = validate_json("npcagent.toml", manifest.as_bytes(), &[]);
    assert_eq!(code, 1);
    assert_eq!(
        report_summaries(&report),
        ["argument 1 is 131072 bytes, more than the 131071 the OS passes in one argument"]
    );
    // Many arguments, each allowed, together past what a program can be given.
    let arg = format!("\"{}\"", "a".repeat(100_000));
    let args = vec![arg; 20].join(",");
    let manifest = format!("version = 1\n[providers.p]\nkind = \"codex\"\nargs = [{args}]\n");
    let (code, report) = validate_json("npcagent.toml", manifest.as_bytes(), &[]);
    assert_eq!(code, 1);
    let summaries = report_summaries(&report);
    assert_eq!(summaries.len(), 1, "{summaries:?}");
    assert!(
        summaries[0].starts_with("the arguments and environment of `codex` take "),
        "{summaries:?}"
    );
}

#[test]
fn an_unset_variable_and_another_error_in_the_same_entry_are_both_reported() {
    let manifest = "version = 1\n[[hooks.before_tool]]\ncommand = \"x\"\nargs = [\"${UNSET_VAR}\"]\ncwd = \"../outside\"\nenv = { K = \"a\\u0000\" }\n";
    let (code, report) = validate_json("npcagent.toml", manifest.as_bytes(), &[]);
    assert_eq!(code, 1);
    assert_eq!(
        report_summaries(&report),
        [
            "environment variable `UNSET_VAR` is not set",
            "`cwd` leaves the repository",
            "environment value of `K` contains a NUL byte",
        ]
    );
}

#[test]
fn an_env_derived_url_with_a_bad_scheme_is_reported_with_the_value_redacted() {
    let manifest = "version = 1\n[mcp.servers.s]\nurl = \"${MCP_URL}\"\n";
    for (value, problem) in [
        (
            "ftp://secret-place.example/token",
            "unsupported scheme `<redacted>`",
        ),
        (
            "http://192.168.7.7/secret-place",
            "plain `http` to `<redacted>`, which is not loopback",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("npcagent.toml"), manifest).unwrap();
        let out = npc()
            .current_dir(dir.path())
            .env_clear()
            .env("MCP_URL", value)
            .arg("validate")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        let shown = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            shown.contains(&format!(
                "invalid MCP server URL from `${{MCP_URL}}`: {problem}"
            )),
            "{shown}"
        );
        assert!(
            !shown.contains("secret-place") && !shown.contains("192.168"),
            "{shown}"
        );
    }
}

mod closed_stderr {
    use std::process::{Command, Stdio};

    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;

    use crate::support::{npc, npc_path, wait_for};

    /// `npc daemon` in `dir` with stderr redirected by `redirect` (`2>&-`,
    /// `2>/dev/full`), stdout to a file.
    fn daemon_with(dir: &std::path::Path, redirect: &str) -> std::process::Child {
        let out = std::fs::File::create(dir.join("daemon.out")).unwrap();
        Command::new("sh")
            .arg("-c")
            .arg(format!(
                "exec \"{}\" daemon {redirect}",
                npc_path().display()
            ))
            .current_dir(dir)
            .env("NPC_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(out)
            .spawn()
            .unwrap()
    }

    fn daemon_without_stderr(dir: &std::path::Path) -> std::process::Child {
        daemon_with(dir, "2>&-")
    }

    #[test]
    fn a_daemon_with_stderr_closed_applies_and_stops_cleanly() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("npcagent.toml"),
            "version = 1\n[mcp.servers.s]\ncommand = \"sleep\"\nargs = [\"1000\"]\n",
        )
        .unwrap();
        let mut daemon = daemon_without_stderr(dir.path());
        wait_for("the daemon to apply", || {
            let out = npc()
                .current_dir(dir.path())
                .args(["events", "--format", "json"])
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout)
                .contains("reconcile.applied")
                .then_some(())
        });
        kill(Pid::from_raw(daemon.id() as i32), Signal::SIGTERM).unwrap();
        let status = wait_for("the daemon to exit", || daemon.try_wait().unwrap());
        assert_eq!(status.code(), Some(0), "no panic (101), a clean exit");
        // No file the daemon opened took the place of its stderr.
        for entry in walkdir(dir.path()) {
            let text = String::from_utf8_lossy(&std::fs::read(&entry).unwrap()).into_owned();
            assert!(
                !text.contains("npc daemon:") && !text.contains("DEBUG"),
                "log lines written into {}",
                entry.display()
            );
        }
        // The store is intact.
        npc()
            .current_dir(dir.path())
            .arg("events")
            .assert()
            .success();
    }

    #[test]
    fn an_invalid_manifest_with_stderr_failing_exits_1_without_a_panic() {
        // `eprint!` panicked (exit 101) on a stderr that fails to write; a
        // closed one (EBADF) std ignores.
        for redirect in ["2>/dev/full", "2>&-"] {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("npcagent.toml"), "version = 1\nbogus = 1\n").unwrap();
            let mut daemon = daemon_with(dir.path(), redirect);
            let status = wait_for("the daemon to exit", || daemon.try_wait().unwrap());
            assert_eq!(status.code(), Some(1), "{redirect}");
        }
    }

    #[test]
    fn a_daemon_with_stderr_on_a_full_disk_applies_and_stops_cleanly() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("npcagent.toml"),
            "version = 1\n[mcp.servers.s]\ncommand = \"sleep\"\nargs = [\"1000\"]\n",
        )
        .unwrap();
        let mut daemon = daemon_with(dir.path(), "2>/dev/full");
        wait_for("the daemon to apply", || {
            let out = npc()
                .current_dir(dir.path())
                .args(["events", "--format", "json"])
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout)
                .contains("reconcile.applied")
                .then_some(())
        });
        kill(Pid::from_raw(daemon.id() as i32), Signal::SIGTERM).unwrap();
        let status = wait_for("the daemon to exit", || daemon.try_wait().unwrap());
        assert_eq!(status.code(), Some(0), "no panic (101), a clean exit");
    }

    /// Every regular file under `dir`.
    fn walkdir(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
        let mut files = Vec::new();
        let mut todo = vec![dir.to_path_buf()];
        while let Some(d) = todo.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                let t = e.file_type().unwrap();
                if t.is_dir() {
                    todo.push(e.path());
                } else if t.is_file() {
                    files.push(e.path());
                }
            }
        }
        files
    }
}

/// A refusal of the guarded layer while taking the lock is said once, not
/// repeated by the error chain.
#[test]
fn a_refused_lock_is_reported_once() {
    let dir = s8_repo("version = 1\n");
    let state = crate::support::npc_made_state_dir(dir.path());
    std::fs::create_dir(state.join("daemon.lock")).unwrap();
    let out = npc()
        .current_dir(dir.path())
        .args(["apply", "--auto-approve"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(
        stderr.matches("not a regular file").count(),
        1,
        "said more than once: {stderr}"
    );
}

#[test]
fn a_header_value_with_a_line_break_is_refused_without_quoting_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("npcagent.toml"),
        "version = 1\n[mcp.servers.web]\nurl = \"https://example.com/mcp\"\nheaders = { X-Api = \"${S8_HEADER}\" }\n",
    )
    .unwrap();
    let out = npc()
        .current_dir(dir.path())
        .env("S8_HEADER", "abc\r\nX-Injected: 1")
        .arg("validate")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("header `X-Api` contains a line break"),
        "{text}"
    );
    assert!(
        !text.contains("X-Injected"),
        "the value is never quoted: {text}"
    );
}

// ---------------------------------------------------------------------------
// §9. correctness found by the audit
//
// (tests for §9 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------

/// A repository whose profile `dev` runs a copy of the fake agent as
/// `kind`, replaying a copy of `fixture` (relative to `fixtures/clis`),
/// with nothing pointing into the source tree.
fn s9_fake_agent_repo(kind: &str, fixture: &str, extra_env: &[(&str, &str)]) -> tempfile::TempDir {
    let text = std::fs::read(repo_root().join("fixtures/clis").join(fixture)).unwrap();
    s9_fake_agent_repo_replaying(kind, &text, extra_env)
}

/// [`s9_fake_agent_repo`] replaying `transcript` as given.
fn s9_fake_agent_repo_replaying(
    kind: &str,
    transcript: &[u8],
    extra_env: &[(&str, &str)],
) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let agent = dir.path().join("fake-agent.py");
    std::fs::copy(repo_root().join("fixtures/clis/fake-agent.py"), &agent).unwrap();
    let transcript_path = dir.path().join("transcript.jsonl");
    std::fs::write(&transcript_path, transcript).unwrap();
    let transcript = transcript_path;
    let quote = |s: &str| serde_json::Value::String(s.to_string()).to_string();
    let env: Vec<String> = extra_env
        .iter()
        .map(|(k, v)| format!("{k} = {}", quote(v)))
        .collect();
    let manifest = format!(
        "version = 1\n[providers.fake]\nkind = \"{kind}\"\ncommand = {}\nargs = [\"--provider\", \"{kind}\", \"--fixture\", {}]\nenv = {{ {} }}\n[profiles.dev]\nprovider = \"fake\"\ndescription = \"replays a transcript\"\n",
        quote(&agent.display().to_string()),
        quote(&transcript.display().to_string()),
        env.join(", "),
    );
    std::fs::write(dir.path().join("npcagent.toml"), manifest).unwrap();
    dir
}

/// The agent events `npc run --format json` printed.
fn s9_json_lines(stdout: &[u8]) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

#[test]
fn drift_detection_works_from_a_binary_installed_outside_the_source_tree() {
    let install = tempfile::tempdir().unwrap();
    let npc_copy = install.path().join("npc");
    std::fs::copy(npc_path(), &npc_copy).unwrap();
    // The binary names no file in the source tree's fixtures…
    let binary = std::fs::read(&npc_copy).unwrap();
    let source_fixtures = repo_root().join("fixtures/clis");
    let needle = source_fixtures.to_str().unwrap().as_bytes();
    assert!(
        !binary.windows(needle.len()).any(|w| w == needle),
        "the binary still refers to {}",
        source_fixtures.display()
    );
    // …and, run with the source fixtures hidden (an empty tmpfs over them in
    // a private mount namespace, where the system allows one), it still
    // notices that Codex's old `{id, msg}` output is not the 0.171.0 format.
    let repo = s9_fake_agent_repo("codex", "codex/0.9.0/idle.jsonl", &[]);
    let hide = std::process::Command::new("unshare")
        .args(["-m", "sh", "-c", "mount -t tmpfs tmpfs \"$1\"", "sh"])
        .arg(&source_fixtures)
        .status()
        .is_ok_and(|s| s.success());
    let mut cmd = if hide {
        let mut c = std::process::Command::new("unshare");
        c.args([
            "-m",
            "sh",
            "-c",
            "mount -t tmpfs tmpfs \"$1\" && shift && exec \"$@\"",
            "sh",
        ])
        .arg(&source_fixtures)
        .arg(&npc_copy);
        c
    } else {
        eprintln!(
            "note: no private mount namespace here; running the copy with the source tree visible"
        );
        std::process::Command::new(&npc_copy)
    };
    let out = cmd
        .args(["run", "dev", "--prompt", "go", "--format", "json"])
        .env_remove("CARGO_MANIFEST_DIR")
        .current_dir(repo.path())
        .output()
        .unwrap();
    let events = s9_json_lines(&out.stdout);
    let drift = events
        .iter()
        .find(|e| e["type"] == "cli_detection.drift_detected")
        .unwrap_or_else(|| {
            panic!(
                "no drift event: {events:#?}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    assert_eq!(drift["fixture_version"], "0.171.0");
    assert_eq!(drift["provider"], "codex");
    assert!(
        !events
            .iter()
            .any(|e| e["type"] == "agent.error" && e["kind"] == "detection"),
        "{events:#?}"
    );
}

#[test]
fn opencode_seed_shaped_transcript_parses_through_npc_run() {
    let repo = s9_fake_agent_repo("opencode", "opencode/seed-000/kinds.jsonl", &[]);
    let out = npc()
        .current_dir(repo.path())
        .args(["run", "dev", "--prompt", "go", "--format", "json"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    // Unlike the newest recording, so the guard may report drift once; the
    // next strategy reads the same JSON.
    let events: Vec<serde_json::Value> = s9_json_lines(&out.stdout)
        .into_iter()
        .filter(|e| e["type"] != "cli_detection.drift_detected")
        .collect();
    let types: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(
        types,
        [
            "agent.message",
            "agent.tool_call",
            "agent.tool_result",
            "agent.tool_call",
            "agent.tool_result",
            "agent.message",
            "agent.usage",
            "agent.idle"
        ],
        "{events:#?}"
    );
    assert!(
        !events.iter().any(|e| e["kind"] == "unknown_event"),
        "{events:#?}"
    );
    assert_eq!(events[1]["name"], "bash");
    assert_eq!(events[4]["is_error"], true);
}

/// Recorded events of the repository, as JSON.
fn s9_recorded_events(dir: &std::path::Path) -> Vec<serde_json::Value> {
    let out = npc()
        .current_dir(dir)
        .args(["events", "--format", "json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    s9_json_lines(&out.stdout)
}

/// A fake agent's repository ([`s9_fake_agent_repo`]) whose profile `dev`
/// names the server `fs`, with the manifest's `servers` (TOML) added.
fn s9_repo_with_servers(
    kind: &str,
    fixture: &str,
    extra_env: &[(&str, &str)],
    servers: &str,
) -> tempfile::TempDir {
    let repo = s9_fake_agent_repo(kind, fixture, extra_env);
    let manifest_path = repo.path().join("npcagent.toml");
    let manifest = std::fs::read_to_string(&manifest_path).unwrap().replace(
        "description = \"replays a transcript\"\n",
        "description = \"replays a transcript\"\nmcp_servers = [\"fs\"]\n",
    );
    std::fs::write(&manifest_path, format!("{manifest}{servers}")).unwrap();
    repo
}

/// `npc run dev` in `repo`, which must succeed; then its `run.started`.
fn s9_run_started(repo: &std::path::Path) -> serde_json::Value {
    let out = npc()
        .current_dir(repo)
        .args([
            "run",
            "dev",
            "--prompt",
            "go",
            "--format",
            "json",
            "--timeout",
            "60",
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events = s9_recorded_events(repo);
    events
        .iter()
        .find(|e| e["kind"] == "run.started")
        .cloned()
        .unwrap_or_else(|| panic!("no run.started in {events:#?}"))
}

const S9_FS_SERVER: &str =
    "[mcp.servers.fs]\ncommand = \"npx\"\nargs = [\"server-filesystem\", \".\"]\n";

#[test]
fn a_codex_run_switches_off_the_project_servers_it_does_not_name() {
    // Codex merges a trusted project's `.codex/config.toml` under a run's
    // `-c` overrides: the run names its own server and switches the
    // others off, so its profile's servers are all it sees.
    let scratch = tempfile::tempdir().unwrap();
    let argv_file = scratch.path().join("argv.json");
    let repo = s9_repo_with_servers(
        "codex",
        "codex/0.171.0/idle.jsonl",
        &[("FAKE_AGENT_ARGV_FILE", argv_file.to_str().unwrap())],
        &format!("{S9_FS_SERVER}[mcp.servers.web]\ncommand = \"npx\"\nargs = [\"server-fetch\"]\n"),
    );
    let apply = npc()
        .current_dir(repo.path())
        .args(["apply", "--auto-approve"])
        .output()
        .unwrap();
    assert!(
        apply.status.success(),
        "{}",
        String::from_utf8_lossy(&apply.stderr)
    );
    // The repository adds a server of its own, one Codex cannot be told about.
    let project = repo.path().join(".codex/config.toml");
    let mut config = std::fs::read_to_string(&project).unwrap();
    assert!(config.contains("[mcp_servers.web]"), "{config}");
    config.push_str("\n[mcp_servers.\"odd.name\"]\ncommand = \"sh\"\n");
    std::fs::write(&project, config).unwrap();
    let started = s9_run_started(repo.path());
    let argv: Vec<String> =
        serde_json::from_str(&std::fs::read_to_string(&argv_file).unwrap()).unwrap();
    let overrides: Vec<&str> = argv
        .windows(2)
        .filter(|w| w[0] == "-c")
        .map(|w| w[1].as_str())
        .filter(|o| o.starts_with("mcp_servers."))
        .collect();
    assert!(
        overrides.iter().any(|o| o.starts_with("mcp_servers.fs={")),
        "{overrides:?}"
    );
    assert!(
        overrides.contains(&"mcp_servers.web.enabled=false"),
        "{overrides:?}"
    );
    assert!(
        !overrides.iter().any(|o| o.starts_with("mcp_servers.fs.")),
        "{overrides:?}"
    );
    assert!(
        started["payload"]["warnings"]
            .to_string()
            .contains("odd.name"),
        "{started:#}"
    );
}

#[test]
fn a_gemini_run_warns_when_the_workspace_settings_run_another_program_for_its_server() {
    // The repository's own `.gemini/settings.json` declares the run's
    // server `fs` with another program: Gemini CLI would use that one, so
    // the run says so instead of passing it off as the manifest's.
    let repo = s9_repo_with_servers(
        "gemini_cli",
        "gemini_cli/0.61.0/idle.jsonl",
        &[],
        S9_FS_SERVER,
    );
    std::fs::create_dir_all(repo.path().join(".gemini")).unwrap();
    std::fs::write(
        repo.path().join(".gemini/settings.json"),
        r#"{"mcpServers": {"fs": {"command": "sh", "args": ["-c", "exit 0"]}}}"#,
    )
    .unwrap();
    let started = s9_run_started(repo.path());
    let warnings = started["payload"]["warnings"].to_string();
    assert!(
        warnings.contains("`fs`") && warnings.contains("npc apply"),
        "{started:#}"
    );
    // The user's file is left as it was.
    assert!(
        std::fs::read_to_string(repo.path().join(".gemini/settings.json"))
            .unwrap()
            .contains("exit 0")
    );
}

#[test]
fn gemini_idle_probe_is_sent_by_npc_run_when_the_agent_goes_quiet() {
    // The agent starts a turn, then says nothing until it is probed; the
    // probe's newline makes it finish the turn.
    let first = concat!(
        r#"{"type":"init","session_id":"g-1","model":"gemini-2.5-pro"}"#,
        "\n",
        r#"{"type":"message","role":"user","content":"go"}"#,
        "\n"
    );
    let rest = concat!(
        r#"{"type":"message","role":"assistant","content":"Still here.","delta":true}"#,
        "\n",
        r#"{"type":"result","status":"success","stats":{"input_tokens":3,"output_tokens":2}}"#,
        "\n"
    );
    let scratch = tempfile::tempdir().unwrap();
    let after = scratch.path().join("after.jsonl");
    std::fs::write(&after, rest).unwrap();
    let stdin_file = scratch.path().join("stdin.bin");
    let repo = s9_fake_agent_repo_replaying(
        "gemini_cli",
        first.as_bytes(),
        &[
            ("FAKE_AGENT_AFTER_PROBE", after.to_str().unwrap()),
            ("FAKE_AGENT_STDIN_FILE", stdin_file.to_str().unwrap()),
        ],
    );
    let out = npc()
        .current_dir(repo.path())
        .args([
            "run",
            "dev",
            "--prompt",
            "go",
            "--format",
            "json",
            "--probe-after",
            "1",
            "--timeout",
            "60",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(
        std::fs::read(&stdin_file).unwrap(),
        b"\n",
        "the probe is a newline"
    );
    let printed = s9_json_lines(&out.stdout);
    assert!(
        printed
            .iter()
            .any(|e| e["type"] == "agent.idle" && e["status"] == "success"),
        "{printed:#?}"
    );
    let kinds: Vec<String> = s9_recorded_events(repo.path())
        .iter()
        .filter_map(|e| e["kind"].as_str().map(str::to_string))
        .filter(|k| k.starts_with("run.probe") || k == "agent.idle")
        .collect();
    assert_eq!(
        kinds,
        ["run.probe_sent", "run.probe_answered", "agent.idle"],
        "one probe, answered, then the turn ends"
    );
}

#[test]
fn agents_that_are_not_probed_get_their_stdin_closed_at_once() {
    // The same fake agent as a Claude Code provider: stdin is EOF at once,
    // so it exits 3 without waiting for a probe that never comes.
    let after = tempfile::NamedTempFile::new().unwrap();
    let repo = s9_fake_agent_repo(
        "claude_code",
        "claude_code/2.1.197/boot.jsonl",
        &[("FAKE_AGENT_AFTER_PROBE", after.path().to_str().unwrap())],
    );
    let out = npc()
        .current_dir(repo.path())
        .args([
            "run",
            "dev",
            "--prompt",
            "go",
            "--format",
            "json",
            "--probe-after",
            "1",
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !s9_recorded_events(repo.path()).iter().any(|e| e["kind"]
            .as_str()
            .is_some_and(|k| k.starts_with("run.probe"))),
        "no probe for a provider without probe_on_stale"
    );
}

#[test]
fn after_a_failed_start_the_agent_files_follow_what_runs() {
    let manifest = |alpha: &str, extra: &str| {
        format!(
            "version = 1\n\n[providers.claude]\nkind = \"claude_code\"\n\n[mcp.servers.alpha]\ncommand = \"{alpha}\"\nargs = [\"1000\"]\n{extra}"
        )
    };
    let d = Daemon::start(&manifest("sleep", ""));
    let mcp = d.root().join(".mcp.json");
    wait_for("alpha in .mcp.json", || {
        std::fs::read_to_string(&mcp)
            .ok()
            .filter(|t| t.contains("\"sleep\""))
    });
    // alpha's new command and the new gamma cannot start: alpha rolls back,
    // gamma does not run.
    let broken = "\n[mcp.servers.gamma]\ncommand = \"npc-test-no-such-program\"\n";
    let mark = d.last_event_id();
    d.write_manifest(&manifest("npc-test-no-such-program", broken));
    d.wait_event(mark, "component.rolled_back");
    // A later edit adds delta; once delta is in the file, that reload's
    // files are written.
    let mark = d.last_event_id();
    d.write_manifest(&manifest(
        "npc-test-no-such-program",
        &format!("{broken}\n[mcp.servers.delta]\ncommand = \"sleep\"\nargs = [\"1001\"]\n"),
    ));
    d.wait_event(mark, "reconcile.applied");
    let text = wait_for("delta in .mcp.json", || {
        std::fs::read_to_string(&mcp)
            .ok()
            .filter(|t| t.contains("delta"))
    });
    let file: serde_json::Value = serde_json::from_str(&text).unwrap();
    let servers = &file["mcpServers"];
    assert_eq!(servers["alpha"]["command"], "sleep", "{text}");
    assert!(servers.get("gamma").is_none(), "{text}");
}

#[test]
fn events_follow_through_the_daemon_shows_the_events_npc_run_writes() {
    let agent = repo_root().join("fixtures/clis/fake-agent.py");
    let fixture = repo_root().join("fixtures/clis/claude_code/2.1.197/tool_call.jsonl");
    let manifest = format!(
        "version = 1\n\n[providers.fake]\nkind = \"claude_code\"\ncommand = {}\nargs = [\"--provider\", \"claude_code\", \"--fixture\", {}]\n\n[profiles.dev]\nprovider = \"fake\"\ndescription = \"d\"\n",
        serde_json::Value::String(agent.display().to_string()),
        serde_json::Value::String(fixture.display().to_string()),
    );
    let d = Daemon::start(&manifest);
    d.wait_event(0, "reconcile.applied");
    let mark = d.last_event_id();
    let mut follower = std::process::Command::new(npc_path())
        .args(["events", "--follow", "--format", "json", "--since"])
        .arg(mark.to_string())
        .current_dir(d.root())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let rx = crate::support::line_channel(follower.stdout.take().unwrap());
    let run = d.npc_output(&["run", "dev", "--prompt", "go"]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let stored: Vec<i64> = d
        .events_after(mark)
        .iter()
        .filter(|e| e["kind"].as_str().is_some_and(|k| k.starts_with("run.")))
        .map(|e| e["id"].as_i64().unwrap())
        .collect();
    assert!(!stored.is_empty(), "npc run recorded no run events");
    let mut seen = Vec::new();
    let deadline = std::time::Instant::now() + WAIT_LIMIT;
    while !stored.iter().all(|id| seen.contains(id)) {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let line = rx
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("the follower showed {seen:?}, not all of {stored:?}"));
        let event: serde_json::Value = serde_json::from_str(&line).unwrap();
        seen.push(event["id"].as_i64().unwrap());
    }
    assert!(seen.windows(2).all(|w| w[1] == w[0] + 1), "gap in {seen:?}");
    let _ = follower.kill();
    let _ = follower.wait();
}

/// A prompt of `npc acp` queued in a store the repository brought along
/// (`.npc/state.db`) whose extras do not pass the daemon's checks — here an
/// approval session smuggling a variable assignment — is never run: the
/// daemon reads each queued `acp` row back through `AcpRun::check`.
#[test]
fn s9_a_queued_acp_run_with_a_forged_extra_in_the_repositorys_store_never_runs() {
    let scratch = tempfile::tempdir().unwrap();
    let pid_file = scratch.path().join("agent.pid");
    let agent = repo_root().join("fixtures/clis/fake-agent.py");
    let fixture = repo_root().join("fixtures/clis/claude_code/2.1.197/tool_call.jsonl");
    let manifest = format!(
        "version = 1\n[daemon]\nlisten = \"127.0.0.1:0\"\n[providers.fake]\nkind = \"claude_code\"\ncommand = {}\nargs = [\"--provider\", \"claude_code\", \"--fixture\", {}]\nenv = {{ FAKE_AGENT_PID_FILE = {} }}\n[profiles.dev]\nprovider = \"fake\"\ndescription = \"d\"\n",
        serde_json::json!(agent),
        serde_json::json!(fixture),
        serde_json::json!(pid_file),
    );
    let dir = hostile_repo(&manifest);
    let paths =
        npcagent::runtime::RepoPaths::resolve(&dir.path().join("npcagent.toml"), ".npc").unwrap();
    let store = npcagent::runtime::open_store(&paths).unwrap();
    let payload = serde_json::json!({
        "run": {"profile": "dev", "prompt": "hi"},
        "approval": {
            "socket": format!("npc-acp-approval-{}", "a".repeat(32)),
            "session": "acp-1\nLD_PRELOAD=/tmp/x.so",
        },
    });
    store
        .enqueue_run(npcagent::store::queue::NewRun::new(
            "run-20260101t000000000z-0badf00d",
            "@manual",
            npcagent::model::RunOrigin::Acp,
            payload.to_string(),
        ))
        .wait()
        .unwrap();
    drop(store);
    let daemon = Daemon::start_in(dir.path());
    let run = wait_for("the forged run to be taken off the queue", || {
        let out = daemon.npc_output(&["runs", "--format", "json"]);
        let runs: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).ok()?;
        runs.into_iter()
            .find(|r| r["origin"] == "acp" && r["state"] != "queued")
    });
    assert_eq!(run["state"], "failed", "{run}");
    assert!(
        run["detail"].as_str().unwrap().contains("unreadable"),
        "{run}"
    );
    assert!(!pid_file.exists(), "the agent was started");
}

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
