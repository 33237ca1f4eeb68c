//! Containment of every descendant, through the real binary: processes that
//! leave their process group the ways daemonizing tools do (`setsid`, a
//! double fork, `nohup`, a shell's `&` + `disown`), started by a run's
//! `setup` and action, a stdio MCP server (a supervised component) and a
//! pane, are gone when the run ends, the component is restarted or stopped,
//! the pane is closed, the daemon is stopped with SIGTERM, and when it is
//! killed with SIGKILL; `npc status` and `npc pane list` show the program's
//! own pid. Each escapee writes its host pid (the first field of
//! the host's `/proc/self/stat`: inside a child's PID namespace `$$` is
//! another number) and becomes `sleep`; each is asserted alive before the
//! event and gone (or its pid another process's) within the deadline after.

use std::path::{Path, PathBuf};

use crate::support::{Daemon, DaemonSetup, alive, npc, wait_for};
use crate::worktrees::git;
use npcagent::supervisor::{NAMESPACES_ENV, OFF};

/// The four ways out of a process group. `$1` is the directory for the pid
/// files (`self.pid` is the script's own host pid); with `hold` as `$2` the
/// script stays, else it ends once the test has seen every escapee (and
/// said so with the file `go`).
const ESCAPE: &str = r#"#!/bin/bash
d=$1
mkdir -p "$d"
read -r me _ </proc/self/stat
echo "$me" > "$d/self.tmp"; mv "$d/self.tmp" "$d/self.pid"
become='read -r p _ </proc/self/stat; echo "$p" > "$0.tmp"; mv "$0.tmp" "$0"; exec sleep 3000'
setsid sh -c "$become" "$d/setsid.pid" &
( sh -c "$become" "$d/double_fork.pid" & )
nohup sh -c "$become" "$d/nohup.pid" >/dev/null 2>&1 &
sh -c "$become" "$d/disown.pid" &
disown
for f in setsid double_fork nohup disown; do
  while [ ! -s "$d/$f.pid" ]; do sleep 0.02; done
done
if [ "$2" = hold ]; then exec sleep 3000; fi
while [ ! -e "$d/go" ]; do sleep 0.02; done
"#;

/// The escapes, as the names of their pid files.
const ESCAPES: [&str; 4] = ["setsid", "double_fork", "nohup", "disown"];

/// A process as it was seen: its pid and start time (pids are reused).
#[derive(Debug, Clone, Copy)]
struct Seen {
    pid: u32,
    start: u64,
    escape: &'static str,
}

impl Seen {
    fn gone(&self) -> bool {
        !alive(self.pid) || start_time(self.pid) != Some(self.start)
    }
}

/// Field 22 of `/proc/<pid>/stat`: the start time in clock ticks.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_ascii_whitespace().nth(19)?.parse().ok()
}

/// Wait for the four escapees of `dir` and check that they run.
fn escapees(dir: &Path) -> Vec<Seen> {
    ESCAPES
        .iter()
        .map(|escape| {
            let file = dir.join(format!("{escape}.pid"));
            let pid: u32 = wait_for(&format!("{}", file.display()), || {
                std::fs::read_to_string(&file).ok()?.trim().parse().ok()
            });
            let start = start_time(pid).expect("the escapee runs");
            let seen = Seen { pid, start, escape };
            assert!(!seen.gone(), "{}: the escapee runs", seen.escape);
            seen
        })
        .collect()
}

fn all_gone(what: &str, seen: &[Seen]) {
    wait_for(what, || seen.iter().all(Seen::gone).then_some(()));
}

/// What a test repository runs besides its trigger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Extra {
    /// Nothing.
    Nothing,
    /// A stdio MCP server `tree` (a supervised component) running the
    /// escapes into `<pids>/server`.
    Server,
    /// A stdio MCP server `tree` and a pane `tree` (a PTY child) running the
    /// escapes into `<pids>/server` and `<pids>/pane`.
    ServerAndPane,
}

/// A git repository with `escape.sh` and a manifest: a trigger `run` whose
/// `setup` and command each start the escapes (into `<pids>/setup` and
/// `<pids>/action`), and `extra`. `hold` keeps every script running.
fn repository(pids: &Path, extra: Extra, hold: bool) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let hold = if hold { " hold" } else { "" };
    let script = dir.path().join("escape.sh");
    let at = |name: &str| format!("{} {}{hold}", script.display(), pids.join(name).display());
    let mut manifest = format!(
        "version = 1\n[daemon]\nlisten = \"127.0.0.1:0\"\nwebhook_listen = \"127.0.0.1:0\"\n\n\
         [triggers.run]\nkind = \"cron\"\nschedule = \"@yearly\"\nworkspace = \"worktree\"\n\
         timeout = \"10m\"\nsetup = [{}]\naction = {{ command = \"bash\", args = [\"-c\", {}] }}\n",
        toml_string(&format!("bash {}", at("setup"))),
        toml_string(&format!("exec bash {}", at("action"))),
    );
    if extra != Extra::Nothing {
        manifest.push_str(&server_entry(&script, &pids.join("server")));
    }
    if extra == Extra::ServerAndPane {
        manifest.push_str(&format!(
            "\n[panes.tree]\ncommand = \"bash\"\nargs = [{}, {}, \"hold\"]\n",
            toml_string(&script.display().to_string()),
            toml_string(&pids.join("pane").display().to_string()),
        ));
    }
    std::fs::write(dir.path().join("npcagent.toml"), manifest).unwrap();
    std::fs::write(&script, ESCAPE).unwrap();
    git(dir.path(), &["init", "--quiet", "--initial-branch=main"]);
    git(dir.path(), &["add", "--all"]);
    git(dir.path(), &["commit", "--quiet", "-m", "start"]);
    dir
}

/// The MCP server `tree`: `script` holding its escapees in `pids`.
fn server_entry(script: &Path, pids: &Path) -> String {
    format!(
        "\n[mcp.servers.tree]\ncommand = \"bash\"\nargs = [{}, {}, \"hold\"]\n",
        toml_string(&script.display().to_string()),
        toml_string(&pids.display().to_string()),
    )
}

/// The host pid the script writing into `dir` reported for itself.
fn own_pid(dir: &Path) -> u32 {
    let file = dir.join("self.pid");
    wait_for(&format!("{}", file.display()), || {
        std::fs::read_to_string(&file).ok()?.trim().parse().ok()
    })
}

fn toml_string(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

fn fire(dir: &Path) {
    let out = npc()
        .current_dir(dir)
        .args(["trigger", "fire", "run", "--format", "json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The run's state once it left `queued` and `running`.
fn ended(dir: &Path) -> String {
    wait_for("the run to end", || {
        let out = npc()
            .current_dir(dir)
            .args(["runs", "--format", "json"])
            .output()
            .unwrap();
        let rows: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        let state = rows.as_array()?.first()?["state"].as_str()?.to_string();
        (!matches!(state.as_str(), "queued" | "running")).then_some(state)
    })
}

fn pids_dir() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().to_path_buf();
    (tmp, path)
}

#[test]
fn what_leaves_the_group_of_a_runs_setup_or_action_ends_with_the_process() {
    let (_tmp, pids) = pids_dir();
    let repo = repository(&pids, Extra::Nothing, false);
    let daemon = Daemon::start_in(repo.path());
    fire(repo.path());
    for step in ["setup", "action"] {
        let dir = pids.join(step);
        let seen = escapees(&dir);
        std::fs::write(dir.join("go"), "").unwrap();
        all_gone(&format!("the {step}'s escapees to end with it"), &seen);
    }
    assert_eq!(ended(repo.path()), "succeeded", "{}", daemon.log());
}

/// A daemon with a run whose `setup` holds, an MCP server and a pane, every
/// escapee of the three running.
fn holding() -> (tempfile::TempDir, tempfile::TempDir, Daemon, Vec<Seen>) {
    let (tmp, pids) = pids_dir();
    let repo = repository(&pids, Extra::ServerAndPane, true);
    let daemon = Daemon::start_in(repo.path());
    fire(repo.path());
    let seen = ["setup", "server", "pane"]
        .iter()
        .flat_map(|part| escapees(&pids.join(part)))
        .collect();
    (tmp, repo, daemon, seen)
}

#[test]
fn what_leaves_the_group_of_a_child_ends_with_a_daemon_stopped_by_sigterm() {
    let (_tmp, _repo, mut daemon, seen) = holding();
    daemon.terminate();
    all_gone("every escapee to end with the daemon", &seen);
}

#[test]
fn what_leaves_the_group_of_a_child_ends_with_a_daemon_killed_by_sigkill() {
    let (_tmp, _repo, mut daemon, seen) = holding();
    daemon.kill();
    all_gone("every escapee to end with the killed daemon", &seen);
}

#[test]
fn what_leaves_a_components_group_ends_when_it_is_restarted_and_stopped() {
    let (_tmp, pids) = pids_dir();
    let repo = repository(&pids, Extra::Server, true);
    let script = repo.path().join("escape.sh");
    let daemon = Daemon::start_in(repo.path());
    let first = escapees(&pids.join("server"));
    // `npc status` shows the program's own pid, not the stub's.
    let own = own_pid(&pids.join("server"));
    assert_eq!(
        daemon.pid_of("mcp_server.tree"),
        Some(own),
        "{}",
        daemon.log()
    );
    // An edited server is restarted: what the old process left is gone.
    let manifest = std::fs::read_to_string(repo.path().join("npcagent.toml")).unwrap();
    let (head, _) = manifest.split_once("\n[mcp.servers.tree]").unwrap();
    daemon.write_manifest(&format!(
        "{head}{}",
        server_entry(&script, &pids.join("again"))
    ));
    let second = escapees(&pids.join("again"));
    all_gone("the restarted server's escapees to end", &first);
    let own = own_pid(&pids.join("again"));
    wait_for("the restarted server's pid in `npc status`", || {
        (daemon.pid_of("mcp_server.tree") == Some(own)).then_some(())
    });
    // A removed server is stopped: the same.
    daemon.write_manifest(head);
    all_gone("the stopped server's escapees to end", &second);
}

#[test]
fn what_leaves_a_panes_group_ends_when_it_is_closed() {
    let (_tmp, pids) = pids_dir();
    let repo = repository(&pids, Extra::ServerAndPane, true);
    let daemon = Daemon::start_in(repo.path());
    let seen = escapees(&pids.join("pane"));
    let own = own_pid(&pids.join("pane"));
    let listed = || {
        let out = daemon.npc_output(&["pane", "list", "--format", "json"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        v["panes"]
            .as_array()?
            .iter()
            .find(|p| p["name"] == "tree")?["pid"]
            .as_u64()
    };
    assert_eq!(
        wait_for("the pane's pid", listed),
        u64::from(own),
        "the pane's pid is its program's"
    );
    daemon.npc(&["pane", "close", "tree"]).success();
    all_gone("the closed pane's escapees to end", &seen);
}

#[test]
fn without_namespaces_the_daemon_and_doctor_say_what_is_not_contained() {
    let (_tmp, pids) = pids_dir();
    let repo = repository(&pids, Extra::Server, true);
    let daemon = Daemon::start_in_with(
        repo.path(),
        DaemonSetup {
            only_env: Some(&[(NAMESPACES_ENV, OFF)]),
            ..DaemonSetup::default()
        },
    );
    // The component still runs, on its process group alone.
    let seen = escapees(&pids.join("server"));
    let warning = "cannot run in PID namespaces (turned off by `NPC_PID_NAMESPACES=off`)";
    assert!(daemon.log().contains(warning), "{}", daemon.log());
    let out = npc()
        .current_dir(repo.path())
        .env(NAMESPACES_ENV, OFF)
        .arg("doctor")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains(warning), "{said}");
    let out = npc()
        .current_dir(repo.path())
        .arg("doctor")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!said.contains("PID namespaces"), "{said}");
    drop(daemon);
    // What left the group outlives the daemon here: the test ends it.
    for s in seen.iter().filter(|s| !s.gone()) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(s.pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// A supervisor contained like the daemon's: watchdog, ledger, and a PID
/// namespace per child through the real `npc` binary.
fn contained_supervisor(
    root: &Path,
) -> (
    npcagent::supervisor::Supervisor,
    tokio::sync::mpsc::UnboundedReceiver<npcagent::supervisor::SupervisorEvent>,
) {
    use npcagent::supervisor::{BackoffPolicy, Containment, Supervisor};
    let contain = Containment::start(&crate::support::npc_path(), root, &root.join(".npc"))
        .expect("containment starts");
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    (
        Supervisor::contained(tx, BackoffPolicy::default(), contain),
        rx,
    )
}

#[tokio::test]
async fn through_the_stub_exit_codes_signals_streams_and_spawn_errors_are_the_programs() {
    use npcagent::supervisor::{ChildSpec, OutputLimits, StdioSpec, SupervisorError};
    use tokio::io::{AsyncBufReadExt, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let (sup, _rx) = contained_supervisor(dir.path());
    let sh = |script: &str| ChildSpec::new("sh", dir.path()).args(["-c", script]);
    let limit = crate::support::WAIT_LIMIT;
    let once = |spec: ChildSpec, stdin: Option<Vec<u8>>| {
        let sup = sup.clone();
        async move {
            sup.run_once(&spec, stdin, limit, OutputLimits::default())
                .await
                .expect("runs")
        }
    };

    let out = once(sh("cat; echo err >&2; exit 3"), Some(b"in\n".to_vec())).await;
    assert_eq!((out.status.code, out.status.signal), (Some(3), None));
    assert_eq!(
        (&out.stdout[..], &out.stderr[..]),
        (&b"in\n"[..], &b"err\n"[..])
    );
    let out = once(sh("kill -TERM $$"), None).await;
    assert_eq!((out.status.code, out.status.signal), (None, Some(15)));
    // The program is pid 2 of its namespace (1 is the stub's reaper), and
    // `/proc/self/stat` still names its host pid.
    let out = once(sh("read -r p _ </proc/self/stat; echo $$ $p"), None).await;
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    let (inner, host) = said.trim().split_once(' ').expect("two pids");
    assert_eq!(inner, "2", "{said}");
    assert_ne!(host, "2", "{said}");

    let missing = ChildSpec::new("no-such-program-npc", dir.path());
    let err = sup
        .run_once(&missing, None, limit, OutputLimits::default())
        .await
        .expect_err("a missing program fails its spawn");
    assert!(matches!(err, SupervisorError::Spawn { .. }), "{err:?}");

    // `Supervisor::signal` reaches the program once, a group signal too.
    let mut spec = sh(
        "trap 'echo hup' HUP; trap 'echo term; exit 7' TERM; echo ready; \
                       while :; do sleep 1 & wait $!; done",
    );
    spec.stdio = StdioSpec::piped();
    sup.start("svc", spec).expect("starts");
    let pipes = sup.take_pipes("svc").expect("pipes");
    let mut lines = BufReader::new(pipes.stdout.expect("stdout")).lines();
    async fn next(
        lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    ) -> Option<String> {
        let line = tokio::time::timeout(crate::support::WAIT_LIMIT, lines.next_line()).await;
        line.expect("a line or the end in time").expect("reads")
    }
    assert_eq!(next(&mut lines).await.as_deref(), Some("ready"));
    sup.signal("svc", nix::sys::signal::Signal::SIGHUP)
        .await
        .expect("signals");
    assert_eq!(next(&mut lines).await.as_deref(), Some("hup"));
    sup.stop("svc").await.expect("stops");
    assert_eq!(next(&mut lines).await.as_deref(), Some("term"));
    assert_eq!(
        next(&mut lines).await,
        None,
        "one `hup`, one `term`: nothing passed on twice"
    );
    let status = sup.status("svc").expect("record");
    assert_eq!(status.last_exit.and_then(|e| e.code), Some(7));
    sup.shutdown().await;
}

/// Job control in a contained pane works as under a terminal emulator: an
/// interactive bash has its monitor mode, a background job runs, `fg`
/// brings it to the terminal's foreground, Ctrl-Z stops it, and `kill`
/// ends it; the shell, typed into through `npc pane send`, says so in files.
#[test]
fn a_shell_in_a_contained_pane_does_job_control() {
    let daemon = Daemon::start(
        "version = 1\n[panes.sh]\ncommand = \"bash\"\nargs = [\"--norc\", \"--noprofile\", \"-i\"]\n",
    );
    let root = daemon.root().to_path_buf();
    let said = |file: &str, what: &str| {
        let path = root.join(file);
        wait_for(&format!("`{what}` in {file}"), || {
            let text = std::fs::read_to_string(&path).ok()?;
            text.contains(what).then_some(())
        });
    };
    let send = |text: &str| {
        daemon.npc(&["pane", "send", "sh", text]).success();
    };
    let shell = wait_for("the pane", || {
        let out = daemon.npc_output(&["pane", "list", "--format", "json"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        v["panes"].as_array()?.iter().find(|p| p["name"] == "sh")?["pid"].as_u64()
    });
    send("case $- in *m*) echo monitor > m.txt;; esac");
    said("m.txt", "monitor");
    send("sleep 100 &");
    send("jobs > running.txt");
    said("running.txt", "Running");
    // The job: the shell's `sleep` child, with its group and the
    // terminal's foreground group.
    let job = || {
        std::fs::read_dir("/proc")
            .ok()?
            .flatten()
            .find_map(|entry| {
                let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
                let (comm, rest) = stat.rsplit_once(')')?;
                let f: Vec<&str> = rest.split_ascii_whitespace().collect();
                // After the name: state, ppid, pgrp, session, tty, tpgid.
                let ours = comm.ends_with("(sleep") && f.get(1)? == &shell.to_string().as_str();
                ours.then(|| {
                    (
                        f.get(2).copied() == f.get(5).copied(),
                        f.first().copied() == Some("Z"),
                    )
                })
            })
    };
    // `fg`, then Ctrl-Z once the job is the terminal's foreground group.
    send("fg");
    wait_for("the job in the terminal's foreground", || {
        job().filter(|(foreground, _)| *foreground)
    });
    daemon
        .npc(&["pane", "send", "--no-enter", "sh", "\u{1a}"])
        .success();
    send("jobs > stopped.txt");
    said("stopped.txt", "Stopped");
    send("kill -9 %1");
    wait_for("the killed job to be gone", || match job() {
        None | Some((_, true)) => Some(()),
        Some(_) => None,
    });
}

/// A daemon started ignoring SIGHUP, SIGINT and SIGQUIT (`nohup npc daemon
/// &` in a script) starts its children with every signal at its default:
/// a run's command sees nothing ignored, and a shell there can trap SIGHUP.
#[test]
fn a_daemon_started_under_nohup_starts_its_children_with_no_signal_ignored() {
    let daemon = Daemon::start_with(
        "version = 1\n[triggers.run]\nkind = \"webhook\"\nroute = \"r\"\naction = { command = \"sh\", args = [\"-c\", \"grep SigIgn /proc/self/status > ignored.txt\"] }\n",
        DaemonSetup {
            ignoring_signals: true,
            ..Default::default()
        },
    );
    // The daemon itself still ignores what it does not handle (SIGQUIT;
    // it handles SIGHUP and SIGINT itself), as it was started.
    let own = std::fs::read_to_string(format!("/proc/{}/status", daemon.pid())).unwrap();
    let ignored = own.lines().find(|l| l.starts_with("SigIgn:")).unwrap();
    let mask = u64::from_str_radix(ignored.split_whitespace().nth(1).unwrap(), 16).unwrap();
    let sigquit = 1 << (nix::libc::SIGQUIT - 1);
    assert_ne!(
        mask & sigquit,
        0,
        "the daemon was started ignoring SIGQUIT: {ignored}"
    );
    fire(daemon.root());
    let seen = wait_for("the run's file", || {
        std::fs::read_to_string(daemon.root().join("ignored.txt"))
            .ok()
            .filter(|t| t.ends_with('\n'))
    });
    let mask = u64::from_str_radix(seen.split_whitespace().nth(1).unwrap(), 16).unwrap();
    // The standard signals (1–31); the C library's own real-time ones
    // (32, 33) are not the program's to set and are left as they came.
    assert_eq!(mask & 0x7fff_ffff, 0, "{seen}");
}
