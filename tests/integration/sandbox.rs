//! The sandbox of unattended runs through the real binary: a daemon with a
//! fake home (a temporary directory holding a fake `~/.ssh/id_ed25519`)
//! fires a trigger whose agent is a shell script that tries to get out,
//! one attempt per line of its report; every attempt must fail. Also: a
//! sandbox asked for on a machine that cannot provide it refuses the run
//! (`NPC_SANDBOX=off`, the documented test seam), and bad `[runs.sandbox]`
//! entries are errors of `npc validate`.

use std::path::Path;

use crate::support::{Daemon, DaemonSetup, npc, wait_for};
use crate::worktrees::{ended, fire, git};

/// The escaping agent: each attempt prints `NAME escaped` when it got
/// out, `NAME refused` when it did not, into `$TMPDIR/report`.
const ESCAPE: &str = r#"#!/bin/sh
r="$TMPDIR/report"
try() { name="$1"; shift; if "$@" >/dev/null 2>&1; then echo "$name escaped" >> "$r"; else echo "$name refused" >> "$r"; fi; }
key="$HOME/.ssh/id_ed25519"
try read_direct cat "$key"
ln -s "$key" link 2>/dev/null
try read_symlink cat link
try read_hardlink sh -c "ln '$key' hard && cat hard"
try read_proc_root cat "/proc/self/root$key"
try write_bashrc sh -c "echo pwned >> '$HOME/.bashrc'"
try write_beside_worktree sh -c "echo pwned > ../beside.txt"
try read_store sh -c "ls '$NPC_REPO_ROOT/.npc' | grep -q ."
try read_other_worktree sh -c "ls '$NPC_REPO_ROOT/.npc/worktrees' | grep -q ."
try read_daemon_environ sh -c "cat /proc/[0-9]*/environ 2>/dev/null | tr '\0' '\n' | grep -q DAEMON_MARKER=secret"
try kill_daemon sh -c "kill -0 $(cat '$NPC_REPO_ROOT/daemon.pid')"
try unshare_root unshare -r true
try unshare_mount unshare -rm sh -c "mount -t tmpfs none /mnt"
try write_home_ssh sh -c "echo pwned > '$HOME/.ssh/authorized_keys'"
setsid sh -c 'cut -d" " -f1 /proc/self/stat > "$TMPDIR/setsid.pid"; exec sleep 300' </dev/null >/dev/null 2>&1 &
for _ in 1 2 3 4 5 6 7 8 9 10; do [ -s "$TMPDIR/setsid.pid" ] && break; sleep 0.1; done
echo done >> "$r"
echo "in the worktree" > made.txt
"#;

fn manifest(extra: &str) -> String {
    format!(
        r#"version = 1
[daemon]
listen = "127.0.0.1:0"
webhook_listen = "127.0.0.1:0"
{extra}
[providers.escape]
kind = "claude_code"
command = "./escape.sh"

[prompts.task]
template = "get out"

[profiles.dev]
provider = "escape"
description = "tries to get out"
prompt = "task"

[triggers.agent]
kind = "cron"
schedule = "@yearly"
action = {{ profile = "dev" }}
"#
    )
}

/// A repository with the escaping agent, and a fake home beside it.
fn setup(extra: &str) -> (tempfile::TempDir, tempfile::TempDir) {
    let dir = crate::worktrees::repository(&manifest(extra), &[("escape.sh", ESCAPE)]);
    std::fs::set_permissions(
        dir.path().join("escape.sh"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    git(dir.path(), &["add", "escape.sh"]);
    git(dir.path(), &["commit", "--quiet", "-m", "mode"]);
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(home.path().join(".ssh")).unwrap();
    std::fs::write(home.path().join(".ssh/id_ed25519"), "PRIVATE KEY").unwrap();
    std::fs::write(home.path().join(".bashrc"), "# bashrc\n").unwrap();
    (dir, home)
}

fn start(dir: &Path, home: &Path, extra_env: &[(&str, &str)]) -> Daemon {
    let home_s = home.display().to_string();
    let claude = home.join(".claude").display().to_string();
    let data = home.join(".local/share").display().to_string();
    let mut env: Vec<(&str, &str)> = vec![
        ("HOME", &home_s),
        ("CLAUDE_CONFIG_DIR", &claude),
        ("XDG_DATA_HOME", &data),
        ("DAEMON_MARKER", "secret"),
    ];
    env.extend_from_slice(extra_env);
    let daemon = Daemon::start_in_with(
        dir,
        DaemonSetup {
            only_env: Some(&env),
            ..DaemonSetup::default()
        },
    );
    std::fs::write(dir.join("daemon.pid"), daemon.pid().to_string()).unwrap();
    daemon
}

#[test]
fn every_escape_of_an_unattended_run_fails_and_the_run_still_works_in_its_worktree() {
    let (dir, home) = setup("");
    let daemon = start(dir.path(), home.path(), &[]);
    let id = fire(dir.path(), "agent", "{}");
    ended(dir.path(), 1);
    let run_dir = dir.path().join(".npc/runs").join(&id);
    let report = std::fs::read_to_string(run_dir.join("tmp/report"))
        .unwrap_or_else(|e| panic!("no report ({e}):\n{}", daemon.log()));
    assert!(report.ends_with("done\n"), "{report}");
    let escaped: Vec<&str> = report.lines().filter(|l| l.ends_with("escaped")).collect();
    assert!(escaped.is_empty(), "escaped: {escaped:?}\n{report}");
    assert_eq!(
        report.lines().filter(|l| l.ends_with("refused")).count(),
        13,
        "{report}"
    );
    // Nothing was written outside.
    assert_eq!(
        std::fs::read_to_string(home.path().join(".bashrc")).unwrap(),
        "# bashrc\n"
    );
    assert!(!home.path().join(".ssh/authorized_keys").exists());
    assert!(crate::support::alive(daemon.pid()));
    // The setsid process ended with the run.
    let pid: u32 = std::fs::read_to_string(run_dir.join("tmp/setsid.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    wait_for("the setsid process to end with its run", || {
        (!crate::support::alive(pid)).then_some(())
    });
    // Its work in the worktree is there (kept or on its branch).
    let on_branch = std::process::Command::new("git")
        .args(["show", &format!("npc/{id}:made.txt")])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let kept = dir.path().join(".npc/worktrees").join(&id).join("made.txt");
    assert!(
        on_branch.status.success() || kept.is_file(),
        "the agent could not write in its worktree:\n{}",
        daemon.log()
    );
}

#[test]
fn a_sandbox_asked_for_where_the_machine_cannot_provide_it_refuses_the_run() {
    let (dir, home) = setup("[runs]\nsandbox = \"workspace\"\n");
    let _daemon = start(dir.path(), home.path(), &[("NPC_SANDBOX", "off")]);
    let id = fire(dir.path(), "agent", "{}");
    let rows = ended(dir.path(), 1);
    assert_eq!(rows[0]["state"], "failed", "{rows:#?}");
    let detail = rows[0].to_string();
    assert!(
        detail.contains("cannot provide it") && detail.contains("NPC_SANDBOX=off"),
        "{detail}"
    );
    assert!(
        !dir.path()
            .join(".npc/runs")
            .join(&id)
            .join("tmp/report")
            .exists()
    );
}

#[test]
fn bad_sandbox_entries_are_errors_of_validate() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("npcagent.toml"),
        "version = 1\n[runs.sandbox]\nmode = \"strict\"\nwritable = [\"/etc\", \"~/.ssh\", \"../up\"]\nallow_hosts = [\"https://example.com/x\", \"*.*.com\", \"ok.example.com:443\", \"h:0\"]\n",
    )
    .unwrap();
    let out = npc()
        .current_dir(dir.path())
        .arg("validate")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stdout);
    for expected in [
        "`writable` entry `/etc` is outside the home directory and the repository",
        "writable_outside",
        "`writable` entry `~/.ssh` opens `~/.ssh`",
        "climbs with `..`",
        "`allow_hosts` entry `https://example.com/x` is not a host: a URL",
        "`allow_hosts` entry `*.*.com` is not a host",
        "`allow_hosts` entry `h:0` is not a host",
        "6 errors",
    ] {
        assert!(said.contains(expected), "{expected}\n{said}");
    }
    assert!(!said.contains("entry `ok.example.com"), "{said}");
}
