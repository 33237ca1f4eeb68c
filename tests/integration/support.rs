//! Helpers shared by the integration tests: the `npc` binary, temporary
//! repositories, and waiting on conditions with a deadline (never a bare sleep).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Longest any test waits for a condition before failing.
pub const WAIT_LIMIT: Duration = Duration::from_secs(20);

/// A `Command` for the `npc` binary under test.
pub fn npc() -> assert_cmd::Command {
    assert_cmd::Command::cargo_bin("npc").expect("npc binary is built")
}

/// Path of the `npc` binary, for spawning long-running processes.
pub fn npc_path() -> PathBuf {
    assert_cmd::cargo::cargo_bin("npc")
}

/// The repository root (where Cargo.toml is).
pub fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Set to rewrite the generated files the binary carries from what the
/// library generates (`NPC_UPDATE_GENERATED=1 cargo test --test integration
/// committed_`), the way `INSTA_UPDATE` rewrites snapshots.
pub const UPDATE_GENERATED_ENV: &str = "NPC_UPDATE_GENERATED";

/// Whether this run rewrites the generated files ([`UPDATE_GENERATED_ENV`]);
/// then the binary, built before, still carries the old ones.
pub fn updating_generated() -> bool {
    std::env::var_os(UPDATE_GENERATED_ENV).is_some()
}

/// Holds the committed generated file `rel` (under the repository) equal to
/// `generated`, or rewrites it when [`UPDATE_GENERATED_ENV`] is set; the
/// binary carries the committed text, so a stale one is what it prints.
pub fn committed_is_generated(rel: &str, generated: &str) {
    let path = repo_root().join(rel);
    if updating_generated() {
        std::fs::write(&path, format!("{}\n", generated.trim_end())).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap();
    assert!(
        committed.trim_end() == generated.trim_end(),
        "`{rel}` is stale: run `{UPDATE_GENERATED_ENV}=1 cargo test --test integration committed_`, then build again (the binary carries the file)"
    );
}

/// A free loopback port (bound, then released for a server to take).
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// Poll `check` until it returns `Some`, or panic after [`WAIT_LIMIT`].
/// The pause between checks is a backoff on a condition, not the
/// synchronisation itself: the test proceeds as soon as the condition holds.
pub fn wait_for<T>(what: &str, check: impl FnMut() -> Option<T>) -> T {
    wait_for_within(what, WAIT_LIMIT, check)
}

/// [`wait_for`] with its own deadline, for work that takes long by design
/// (a thousand runs through a fleet).
pub fn wait_for_within<T>(what: &str, limit: Duration, check: impl FnMut() -> Option<T>) -> T {
    poll_within(limit, check).unwrap_or_else(|| panic!("timed out waiting for {what}"))
}

/// Poll `check` until it returns `Some`, or `None` after `limit` (the
/// same backoff as [`wait_for`]), for a condition that may not come.
pub fn poll_within<T>(limit: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    let mut pause = Duration::from_millis(5);
    loop {
        if let Some(v) = check() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// The process group of `pid` (field 5 of its stat), if it exists.
pub fn process_group(pid: u32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_ascii_whitespace().nth(2)?.parse().ok()
}

/// Whether process `pid` is alive: `/proc/<pid>` exists and it is not a
/// zombie (orphaned zombies are reparented to an init that may never reap
/// them, and hold nothing).
pub fn alive(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .trim_start()
        .chars()
        .next();
    !matches!(state, Some('Z') | None)
}

/// Send SIGTERM to `child` (a daemon under test stops its own children
/// first) and reap it; for `Drop`, so errors are ignored.
pub fn stop_child(child: &mut std::process::Child) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = child.wait();
}

/// A child stopped ([`stop_child`]) when the test ends, even by a panic, so
/// a failing test leaves nothing running.
#[derive(Debug)]
pub struct Stopped(Option<std::process::Child>);

impl Stopped {
    pub fn new(child: std::process::Child) -> Self {
        Self(Some(child))
    }

    /// The child's pid.
    pub fn pid(&self) -> u32 {
        self.0.as_ref().expect("the child runs").id()
    }

    /// Kill it now (SIGKILL) and reap it.
    pub fn kill(mut self) {
        let mut child = self.0.take().expect("the child runs");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// Stop it now (SIGTERM), waiting with the usual deadline for its exit.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        terminate_child(self.0.take().expect("the child runs"))
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            stop_child(&mut child);
        }
    }
}

/// Send SIGTERM to `child` and wait (with the usual deadline) for its exit.
pub fn terminate_child(mut child: std::process::Child) -> std::process::ExitStatus {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    wait_for("the daemon to exit", || child.try_wait().unwrap())
}

/// The lines `stream` gives (a child's stdout), sent on a channel by a
/// thread of their own, so a test waits for each with a timeout.
pub fn line_channel(
    stream: impl std::io::Read + Send + 'static,
) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stream)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// What a command printed on stdout, lossily decoded.
pub fn stdout_of(a: &assert_cmd::assert::Assert) -> String {
    String::from_utf8_lossy(&a.get_output().stdout).into_owned()
}

/// What a command printed on stderr, lossily decoded.
pub fn stderr_of(a: &assert_cmd::assert::Assert) -> String {
    String::from_utf8_lossy(&a.get_output().stderr).into_owned()
}

/// How a [`Daemon`] under test is started, beyond its manifest.
#[derive(Debug, Default, Clone, Copy)]
pub struct DaemonSetup<'a> {
    /// Files written into the repository (relative path, content) first.
    pub files: &'a [(&'a str, &'a str)],
    /// The daemon's descriptor limit (`ulimit -n`), if not inherited.
    pub nofile: Option<u32>,
    /// When set, the daemon's environment is cleared but for `PATH` and
    /// these variables.
    pub only_env: Option<&'a [(&'a str, &'a str)]>,
    /// The user's data directory (`XDG_DATA_HOME`: the notice board, plugin
    /// data, memory files). Unless set here or in `only_env`, each daemon
    /// gets its own, so tests never write to the real home or hear each
    /// other's notices; so does Claude Code's config (`CLAUDE_CONFIG_DIR`)
    /// unless `only_env` is set.
    pub data_home: Option<&'a Path>,
    /// Log as a user's daemon does (no `NPC_LOG`/`RUST_LOG`: npc's lines at
    /// info, libraries' at warn) instead of everything at info.
    pub default_log: bool,
    /// Start the daemon ignoring SIGHUP, SIGINT and SIGQUIT, as `nohup npc
    /// daemon &` in a script does.
    pub ignoring_signals: bool,
}

/// A real `npc daemon` on a repository, its stderr in a log outside the
/// repository, stopped with SIGTERM on drop (it stops its children first).
/// Ready once it printed its startup line: the first apply is done, the
/// watcher is up and the control socket answers, so a test's edits are seen.
/// Events are read from the store directly, so they can be read while the
/// daemon cannot answer.
pub struct Daemon {
    /// The repository, when the daemon owns it.
    dir: Option<tempfile::TempDir>,
    root: PathBuf,
    logs: tempfile::TempDir,
    child: Option<std::process::Child>,
}

impl Daemon {
    /// A daemon on a fresh repository holding `manifest` as `npcagent.toml`.
    pub fn start(manifest: &str) -> Self {
        Self::start_with(manifest, DaemonSetup::default())
    }

    /// [`Daemon::start`] with files, limits or environment of `setup`.
    pub fn start_with(manifest: &str, setup: DaemonSetup<'_>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("npcagent.toml"), manifest).unwrap();
        for (name, text) in setup.files {
            let path = dir.path().join(name);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).unwrap();
            }
            std::fs::write(path, text).unwrap();
        }
        let root = dir.path().to_path_buf();
        Self::spawn(Some(dir), root, setup)
    }

    /// A daemon on the existing repository `root` (owned by the caller).
    pub fn start_in(root: &Path) -> Self {
        Self::spawn(None, root.to_path_buf(), DaemonSetup::default())
    }

    /// [`Daemon::start_in`] with the limits or environment of `setup` (its
    /// `files` are not written).
    pub fn start_in_with(root: &Path, setup: DaemonSetup<'_>) -> Self {
        Self::spawn(None, root.to_path_buf(), setup)
    }

    fn spawn(dir: Option<tempfile::TempDir>, root: PathBuf, setup: DaemonSetup<'_>) -> Self {
        let logs = tempfile::tempdir().unwrap();
        let log = std::fs::File::create(logs.path().join("daemon.log")).unwrap();
        let mut cmd = match setup.nofile {
            None if setup.ignoring_signals => {
                let mut c = std::process::Command::new("sh");
                c.arg("-c")
                    .arg("trap '' HUP INT QUIT && exec \"$0\" daemon")
                    .arg(npc_path());
                c
            }
            Some(n) => {
                let mut c = std::process::Command::new("sh");
                c.arg("-c")
                    .arg(format!("ulimit -n {n} && exec \"$0\" daemon"))
                    .arg(npc_path());
                c
            }
            None => {
                let mut c = std::process::Command::new(npc_path());
                c.arg("daemon");
                c
            }
        };
        if let Some(env) = setup.only_env {
            cmd.env_clear()
                .env("PATH", std::env::var_os("PATH").unwrap_or_default())
                .envs(env.iter().copied());
        }
        let own_data = logs.path().join("data");
        let data_home = setup.data_home.unwrap_or(&own_data);
        if !setup
            .only_env
            .is_some_and(|env| env.iter().any(|(k, _)| *k == "XDG_DATA_HOME"))
        {
            cmd.env("XDG_DATA_HOME", data_home);
        }
        // Claude Code's user config, whose trust of a repository a worktree
        // run checks: the daemon's own, never the real home's.
        if setup.only_env.is_none() {
            let claude = logs.path().join("claude");
            std::fs::create_dir_all(&claude).unwrap();
            cmd.env("CLAUDE_CONFIG_DIR", claude);
        }
        if setup.default_log {
            cmd.env_remove("NPC_LOG").env_remove("RUST_LOG");
        } else {
            cmd.env("NPC_LOG", "info");
        }
        let child = cmd
            .current_dir(&root)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut this = Self {
            dir,
            root,
            logs,
            child: Some(child),
        };
        wait_for("the daemon's startup line", || {
            if let Some(status) = this.child.as_mut().and_then(|c| c.try_wait().unwrap()) {
                panic!(
                    "the daemon exited ({status}) before it started:\n{}",
                    this.log()
                );
            }
            this.log().contains("npc daemon: startup").then_some(())
        });
        this
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("the daemon runs").id()
    }

    /// What the daemon wrote on stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.logs.path().join("daemon.log")).unwrap_or_default()
    }

    /// Replace the manifest the way editors save: a temp file renamed over it.
    pub fn write_manifest(&self, text: &str) {
        let tmp = self.root.join(".npcagent.toml.tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, self.root.join("npcagent.toml")).unwrap();
    }

    /// `npc ARGS` in the repository.
    pub fn npc(&self, args: &[&str]) -> assert_cmd::assert::Assert {
        npc().current_dir(&self.root).args(args).assert()
    }

    /// `npc ARGS` in the repository, its output whatever the exit.
    pub fn npc_output(&self, args: &[&str]) -> std::process::Output {
        npc().current_dir(&self.root).args(args).output().unwrap()
    }

    /// The stored events after `id`, read from the store.
    pub fn events_after(&self, id: i64) -> Vec<serde_json::Value> {
        let db = self.root.join(".npc/state.db");
        if !db.is_file() {
            return Vec::new();
        }
        let Ok(store) = npcagent::store::Store::open_read_only(&db) else {
            return Vec::new();
        };
        store
            .events_since(id, 100_000)
            .unwrap_or_default()
            .iter()
            .map(|e| serde_json::to_value(e).unwrap())
            .collect()
    }

    /// Every stored event.
    pub fn events(&self) -> Vec<serde_json::Value> {
        self.events_after(0)
    }

    pub fn last_event_id(&self) -> i64 {
        self.events()
            .last()
            .and_then(|e| e["id"].as_i64())
            .unwrap_or(0)
    }

    /// Wait for an event of `kind` after `id`.
    pub fn wait_event(&self, after: i64, kind: &str) -> serde_json::Value {
        wait_for(&format!("a `{kind}` event after #{after}"), || {
            self.events_after(after)
                .into_iter()
                .find(|e| e["kind"] == kind)
        })
    }

    /// `npc events --format json` as the user sees it: the events and the raw text.
    pub fn cli_events(&self) -> (Vec<serde_json::Value>, String) {
        let out = npc()
            .current_dir(&self.root)
            .args(["events", "--format", "json"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let events = text
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        (events, text)
    }

    /// `npc status --format json`.
    pub fn status_json(&self) -> serde_json::Value {
        let a = self.npc(&["status", "--format", "json"]).success();
        serde_json::from_slice(&a.get_output().stdout).unwrap()
    }

    /// The components of `npc status --format json`.
    pub fn status(&self) -> Vec<serde_json::Value> {
        self.status_json()["components"].as_array().unwrap().clone()
    }

    /// The pid `npc status` shows for component `id`.
    pub fn pid_of(&self, id: &str) -> Option<u32> {
        self.status()
            .iter()
            .find(|c| c["id"] == id)
            .and_then(|c| c["pid"].as_u64())
            .map(|p| p as u32)
    }

    /// SIGTERM, then wait (with the usual deadline) for the exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        terminate_child(self.child.take().expect("the daemon runs"))
    }

    /// SIGKILL, as a crash: no cleanup; then reap it.
    pub fn kill(&mut self) {
        let mut child = self.child.take().expect("the daemon runs");
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Start the daemon again on the same repository after [`Daemon::terminate`].
    pub fn restart(&mut self) {
        self.restart_with(DaemonSetup::default());
    }

    /// [`Daemon::restart`] with the limits or environment of `setup`.
    pub fn restart_with(&mut self, setup: DaemonSetup<'_>) {
        assert!(self.child.is_none(), "the daemon still runs");
        let dir = self.dir.take();
        let mut next = Self::spawn(dir, self.root.clone(), setup);
        self.child = next.child.take();
        self.dir = next.dir.take();
        self.logs = std::mem::replace(&mut next.logs, tempfile::tempdir().unwrap());
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop_child(&mut child);
        }
    }
}

/// Whether the suite runs in CI (`CI=true`, as `.ci/run` is run): there a
/// missing peer fails its test instead of skipping it.
pub fn in_ci() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

/// Where `program` is on `PATH`, if anywhere.
pub fn on_path(program: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// Something a test needs from the machine rather than from this crate (the
/// Python MCP SDK, an agent CLI, PostgreSQL, Chromium…): `.ci/run` installs
/// each one. Checked once, when built; see [`require`].
#[derive(Debug, Clone)]
pub struct Peer {
    /// What the peer is, as the skip line and the failure name it.
    what: String,
    /// How to install it.
    install: String,
    /// Whether it is there.
    present: bool,
}

impl Peer {
    /// A program on `PATH`.
    pub fn program(name: &str, install: &str) -> Self {
        Self::condition(
            &format!("the program `{name}`"),
            on_path(name).is_some(),
            install,
        )
    }

    /// A module `python3` imports.
    pub fn python_module(module: &str, install: &str) -> Self {
        let present = std::process::Command::new("python3")
            .args(["-c", &format!("import {module}")])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        Self::condition(&format!("the Python module `{module}`"), present, install)
    }

    /// A file another package installs (a global npm package's entry point,
    /// a server binary off `PATH`).
    pub fn file(what: &str, path: &Path, install: &str) -> Self {
        Self::condition(
            &format!("{what} ({})", path.display()),
            path.is_file(),
            install,
        )
    }

    /// Anything else the machine must provide (`holds` says whether it does).
    pub fn condition(what: &str, holds: bool, install: &str) -> Self {
        Self {
            what: what.to_string(),
            install: install.to_string(),
            present: holds,
        }
    }
}

/// The one policy for a missing peer: `true` when `peer` is there. When it is
/// missing, under `CI=true` the calling test fails (a green CI means the
/// tests ran: `.ci/run` installs every peer and stops when an install
/// fails); elsewhere it prints a skip line and returns `false`, and the
/// caller returns at once.
#[must_use]
pub fn require(peer: Peer) -> bool {
    if peer.present {
        return true;
    }
    let Peer { what, install, .. } = peer;
    assert!(
        !in_ci(),
        "{what} is missing under CI=true: install it ({install}); `.ci/run` installs it"
    );
    eprintln!("skipped: {what} is missing (install it: {install}; `.ci/run` installs it)");
    false
}

/// Let npc make the state directory `.npc` of the repository `root` (so it
/// is provably npc's own: `docs/security.md`), then empty it but for its
/// owner file. What a test plants there afterwards sits inside npc's own
/// directory, where only npc, the user or an agent's run could put it.
pub fn npc_made_state_dir(root: &Path) -> PathBuf {
    // `npc apply` of an empty manifest in the repository claims its state
    // directory; the repository's own manifest is put back after.
    let manifest = root.join("npcagent.toml");
    let kept = std::fs::read(&manifest).ok();
    std::fs::write(&manifest, "version = 1\n").unwrap();
    npc()
        .current_dir(root)
        .args(["apply", "--auto-approve"])
        .assert()
        .success();
    match kept {
        Some(text) => std::fs::write(&manifest, text).unwrap(),
        None => std::fs::remove_file(&manifest).unwrap(),
    }
    let state = root.join(".npc");
    for entry in std::fs::read_dir(&state).unwrap().flatten() {
        if entry.file_name() == "npc.owner" {
            continue;
        }
        let path = entry.path();
        if entry.file_type().unwrap().is_dir() {
            std::fs::remove_dir_all(path).unwrap();
        } else {
            std::fs::remove_file(path).unwrap();
        }
    }
    state
}
