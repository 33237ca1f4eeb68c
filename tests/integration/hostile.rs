//! Regression tests for a hostile repository: everything a repository
//! contains is untrusted input. One test per failure found, named after it,
//! each driving the real `npc` binary. Sections follow the numbered items of
//! the "safe in a hostile repository" issue.

#![allow(unused_imports)]

use crate::support::*;

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

mod no_orphans {
    use std::path::Path;
    use std::process::{Child, Command, Stdio};

    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;

    use crate::support::{alive, npc_path, wait_for};

    /// A `sleep` argument no other test uses, so its copies can be counted.
    fn unique_sleep(offset: u32) -> String {
        (5_000_000 + (std::process::id() % 100_000) * 10 + offset).to_string()
    }

    /// A stdio MCP server whose shell starts a background grandchild, writes
    /// its pid to `grandchild.pid` and waits.
    fn tree_manifest(sleep: &str) -> String {
        format!(
            "version = 1\n[mcp.servers.tree]\ncommand = \"sh\"\nargs = [\"-c\", \"sleep {sleep} & echo $! > grandchild.pid; wait\"]\n"
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
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(dir.join("daemon.log"))
            .unwrap();
        Command::new(npc_path())
            .arg("daemon")
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

    /// The pid in `path` once the file is complete.
    fn wait_pid(path: &Path) -> u32 {
        wait_for(&format!("a pid in {}", path.display()), || {
            let text = std::fs::read_to_string(path).ok()?;
            text.strip_suffix('\n')?.parse().ok()
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

    #[test]
    fn a_starting_daemon_stops_what_a_crashed_daemon_and_its_watchdog_left() {
        let dir = tempfile::tempdir().unwrap();
        let sleep = unique_sleep(2);
        std::fs::write(dir.path().join("npcagent.toml"), tree_manifest(&sleep)).unwrap();
        let pid_file = dir.path().join("grandchild.pid");
        let mut daemon = spawn_daemon(dir.path());
        let grandchild = wait_pid(&pid_file);
        let watchdog = watchdog_of(daemon.id());

        // The watchdog cannot act while stopped, so both die without cleaning up.
        signal(watchdog, Signal::SIGSTOP);
        daemon.kill().unwrap();
        daemon.wait().unwrap();
        signal(watchdog, Signal::SIGKILL);
        wait_for("the watchdog to die", || (!alive(watchdog)).then_some(()));
        assert!(alive(grandchild), "the crash left the grandchild behind");
        let ledgers = std::fs::read_dir(dir.path().join(".npc/groups"))
            .unwrap()
            .count();
        assert_eq!(ledgers, 1, "the crashed daemon's ledger is still there");

        std::fs::remove_file(&pid_file).unwrap();
        let daemon = spawn_daemon(dir.path());
        let again = wait_pid(&pid_file);
        assert!(!alive(grandchild), "stopped before the new start");
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
        let groups = dir.path().join(".npc/groups");
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
        std::fs::write(
            &agent,
            format!("#!/bin/sh\nsleep {sleep} &\necho $! > grandchild.pid\nwait\n"),
        )
        .unwrap();
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

// ---------------------------------------------------------------------------
// §7. redaction that is exact
//
// (tests for §7 go below this header; keep them inside this section so
// merges stay clean)
// ---------------------------------------------------------------------------

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
