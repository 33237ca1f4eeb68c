//! Containment: nothing a supervised child starts outlives the process that
//! supervises it, even when that process is killed with SIGKILL. Every child
//! leads its own process group; [`Containment`] records each group as
//! `(pgid, start time)` (the leader's `/proc/<pid>/stat` field 22, in clock
//! ticks since boot) in two places:
//!
//! - a watchdog process (`npc __watchdog`, in its own session) that reads the
//!   groups from a pipe. When the pipe reaches end of file — the supervising
//!   process exited or died — it stops every recorded group (SIGTERM,
//!   [`REAP_GRACE`], SIGKILL) and exits. `PR_SET_PDEATHSIG` only reaches
//!   direct children; the watchdog reaches their descendants. Each child
//!   also announces its own group on that pipe before `exec` ([`Announcer`]),
//!   so a supervisor killed between `fork` and its own record leaves nothing
//!   unknown (children on a PTY, started by `portable-pty`, have no such
//!   hook and are recorded only after their spawn).
//! - a ledger file per supervising process under `<repo>/.npc/groups/` (the
//!   fixed runtime directory, beside the lock: a `project.state_dir` change
//!   between a crash and the next start cannot hide it), so a later start
//!   cleans up what a crashed process and its watchdog left. Ledgers are
//!   read, written and removed only through [`crate::repofs`] (owner-only,
//!   never through a link, never outside the repository).
//!
//! A recorded group is only signalled while it is provably the same group:
//! when its leader is alive, the leader's start time must equal the record
//! (a reused pid has another start time and is never signalled); when the
//! leader is gone, each member must still be in the group and have started
//! no earlier than the leader did. A ledger from another boot (the boot id
//! differs) is discarded without signalling anything, so a ledger a
//! repository ships cannot name processes to kill.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};

use crate::repofs::{Links, Root, WriteOptions};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

/// The hidden `npc` subcommand that runs the watchdog.
pub const WATCHDOG_COMMAND: &str = "__watchdog";
/// Subdirectory of the runtime directory holding one ledger file per
/// supervising process.
pub const LEDGER_DIR: &str = "groups";
/// Time between SIGTERM and SIGKILL when the watchdog or a starting process
/// stops groups whose supervisor is gone.
pub const REAP_GRACE: Duration = Duration::from_secs(2);
/// Longest ledger file read at start; a longer one is removed unread.
pub const MAX_LEDGER_BYTES: usize = 1024 * 1024;
/// Ledger files looked at per start; the rest wait for the next start.
pub const MAX_LEDGER_FILES: usize = 1024;
/// Groups one supervisor records at once; more are still supervised but not
/// recorded (and a warning is logged).
pub const MAX_TRACKED_GROUPS: usize = 65_536;
/// Longest line the watchdog accepts on its pipe.
const MAX_WATCHDOG_LINE: usize = 128;
/// Rounds of SIGKILL while members of a group are still being found (a
/// member forking while it is killed); bounds a fork bomb's hold on us.
const MAX_KILL_ROUNDS: usize = 16;
/// Pause between looks at whether stopped groups are gone.
const POLL: Duration = Duration::from_millis(20);
/// Longest wait, after SIGKILL, for the killed members to be gone (the
/// kernel delivers the signal asynchronously), so a reap returns only once
/// what it stopped has stopped.
const KILL_WAIT: Duration = Duration::from_secs(1);
/// How long a supervisor waits for its watchdog to exit after closing the pipe.
const WATCHDOG_EXIT_WAIT: Duration = Duration::from_secs(1);

/// Errors from containment.
#[derive(Debug, thiserror::Error)]
pub enum ContainError {
    #[error(
        "cannot start the watchdog `{}`: {source}; the `npc` binary must stay where it was started from",
        program.display()
    )]
    Watchdog {
        program: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot read `/proc/self/stat`; npc needs Linux procfs to contain its children")]
    NoProcfs,
    /// The runtime directory holding the ledgers is refused or unusable.
    #[error("cannot keep the process-group ledger: {0}")]
    Ledger(crate::repofs::FsError),
}

/// The fields npc reads from `/proc/<pid>/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ProcStat {
    pub(super) state: char,
    pub(super) pgrp: i32,
    /// Start time in clock ticks after boot (field 22).
    pub(super) start: u64,
}

/// Parse the text of `/proc/<pid>/stat`. The command name is in parentheses
/// and may itself contain spaces and parentheses, so fields are counted from
/// the last `)`.
pub(super) fn parse_stat(stat: &str) -> Option<ProcStat> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    // Field 3 is the state; the start time is field 22, 19 fields later.
    let state = fields.next()?.chars().next()?;
    let _ppid = fields.next()?;
    let pgrp = fields.next()?.parse().ok()?;
    let start = fields.nth(16)?.parse().ok()?;
    Some(ProcStat { state, pgrp, start })
}

/// `/proc/<pid>/stat` of a process, if it exists.
pub(super) fn read_stat(pid: i32) -> Option<ProcStat> {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| parse_stat(&s))
}

/// Every process as `(pid, stat)`; processes that vanish while listed are skipped.
pub(super) fn processes() -> Vec<(i32, ProcStat)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| Some((pid, read_stat(pid)?)))
        .collect()
}

/// This boot's id; start times only compare within one boot.
fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_string())
}

/// One process group as recorded: its id and its leader's start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupRecord {
    pub pgid: i32,
    /// The leader's start time in clock ticks after boot.
    pub start: u64,
}

/// A process as recorded: its pid and start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessRecord {
    pub pid: i32,
    pub start: u64,
}

impl ProcessRecord {
    /// Whether this exact process (same pid and start time) is alive.
    pub fn alive(self) -> bool {
        read_stat(self.pid).is_some_and(|s| s.start == self.start && s.state != 'Z')
    }

    /// This process.
    pub fn current() -> Option<Self> {
        let pid = i32::try_from(std::process::id()).ok()?;
        Some(Self {
            pid,
            start: read_stat(pid)?.start,
        })
    }

    /// The record as one word, `pid:start` (a run's owner in the store).
    pub fn key(self) -> String {
        format!("{}:{}", self.pid, self.start)
    }

    /// A record from [`ProcessRecord::key`]'s word; `None` for anything else.
    pub fn parse(key: &str) -> Option<Self> {
        let (pid, start) = key.split_once(':')?;
        Some(Self {
            pid: pid.parse().ok().filter(|p: &i32| *p > 0)?,
            start: start.parse().ok()?,
        })
    }
}

/// The members of recorded group `g` still alive (see the module docs for
/// when a process counts as a member). Empty when the pid was reused.
fn members(g: GroupRecord, all: &[(i32, ProcStat)]) -> Vec<i32> {
    let me = i32::try_from(std::process::id()).unwrap_or(0);
    if g.pgid <= 1 || g.pgid == nix::unistd::getpgrp().as_raw() {
        return Vec::new();
    }
    if let Some((_, leader)) = all.iter().find(|(pid, _)| *pid == g.pgid)
        && leader.start != g.start
    {
        return Vec::new();
    }
    all.iter()
        .filter(|(pid, s)| *pid != me && s.pgrp == g.pgid && s.start >= g.start && s.state != 'Z')
        .map(|(pid, _)| *pid)
        .collect()
}

/// Send `signal` to every member of every group in `groups`; returns how
/// many processes were signalled.
fn signal_groups(groups: &[GroupRecord], signal: Signal) -> usize {
    let all = processes();
    let mut sent = 0;
    for g in groups {
        for pid in members(*g, &all) {
            // Checked again right before the signal: a member that exited
            // since the listing may have left its pid to someone else.
            let still = read_stat(pid).is_some_and(|s| s.pgrp == g.pgid && s.start >= g.start);
            if still && kill(Pid::from_raw(pid), signal).is_ok() {
                sent += 1;
            }
        }
    }
    sent
}

/// Stop recorded groups whose supervisor is gone: SIGTERM to every member of
/// every group at once, up to `grace` for them to exit, then SIGKILL what is
/// left. Returns how many processes were found at the start.
pub fn reap(groups: &[GroupRecord], grace: Duration) -> usize {
    let found = signal_groups(groups, Signal::SIGTERM);
    if found == 0 {
        return 0;
    }
    let deadline = Instant::now() + grace;
    let all_gone = || {
        let all = processes();
        groups.iter().all(|g| members(*g, &all).is_empty())
    };
    while !all_gone() && Instant::now() < deadline {
        std::thread::sleep(POLL);
    }
    for _ in 0..MAX_KILL_ROUNDS {
        if signal_groups(groups, Signal::SIGKILL) == 0 {
            break;
        }
    }
    let deadline = Instant::now() + KILL_WAIT;
    while !all_gone() && Instant::now() < deadline {
        std::thread::sleep(POLL);
    }
    found
}

/// What a ledger file holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ledger {
    /// `/proc/sys/kernel/random/boot_id` when it was written.
    pub boot_id: String,
    /// The supervising process.
    pub owner: ProcessRecord,
    pub groups: Vec<GroupRecord>,
}

/// The ledger directory of the runtime directory `runtime_dir`.
pub fn ledger_dir(runtime_dir: &Path) -> PathBuf {
    runtime_dir.join(LEDGER_DIR)
}

/// Stop the groups recorded under `runtime_dir` (inside `root`) by
/// supervising processes that are gone, and remove their ledgers and any
/// temporary file a killed writer left. Ledgers of live owners stay;
/// ledgers from another boot are removed unread; what is not a ledger (a
/// link, a FIFO, an oversized or unparsable file) is left alone. A ledger
/// directory that leaves the repository is not looked at. Returns how many
/// processes were stopped.
pub fn reap_leftovers(root: &Root, runtime_dir: &Path) -> usize {
    let dir = ledger_dir(runtime_dir);
    // Names only: every read and removal below goes through `root`.
    let Ok(real) = root.real_path(&dir) else {
        return 0;
    };
    let Ok(entries) = std::fs::read_dir(&real) else {
        return 0;
    };
    let _ = root.sweep_temp(&real);
    let boot = boot_id();
    let mut stale = Vec::new();
    let mut groups = Vec::new();
    for entry in entries.flatten().take(MAX_LEDGER_FILES) {
        let path = real.join(entry.file_name());
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let Some(ledger) = read_ledger(root, &path) else {
            continue;
        };
        if boot.as_deref() != Some(ledger.boot_id.as_str()) {
            stale.push(path); // another boot: nothing it names can be alive
        } else if !ledger.owner.alive() {
            groups.extend(ledger.groups);
            stale.push(path);
        }
    }
    let stopped = reap(&groups, REAP_GRACE);
    for path in stale {
        let _ = root.remove_file(&path);
    }
    stopped
}

fn read_ledger(root: &Root, path: &Path) -> Option<Ledger> {
    let bytes = root.read_with(path, MAX_LEDGER_BYTES, Links::Refuse).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// One group the watchdog holds: its leader's start time, and whether the
/// supervisor confirmed it (`+`) or only the child announced it (`?`).
#[derive(Debug, Clone, Copy)]
struct Held {
    start: u64,
    confirmed: bool,
}

/// The watchdog's main loop: read lines from `input` until end of file, then
/// stop every group still held and remove `ledger` inside the repository
/// `root` (its groups are gone). The lines:
///
/// - `? <pgid> <start>`: a child announces its own group, before `exec`
///   (see [`Announcer`]), so a supervisor killed before it could record the
///   child leaves nothing behind;
/// - `+ <pgid> <start>`: the supervisor records (or confirms) a group;
/// - `- <pgid>`: the group is gone;
/// - `prune`: a spawn failed after its child announced itself; announced
///   groups never confirmed whose leader is no longer alive are dropped.
pub fn run_watchdog(input: impl Read, root: &Path, ledger: &Path) {
    let mut groups: BTreeMap<i32, Held> = BTreeMap::new();
    use crate::stdx::lines::{BlockingLineReader, Line, Overlong, Splitter};
    let mut lines =
        BlockingLineReader::new(input, Splitter::new(MAX_WATCHDOG_LINE, Overlong::Skip));
    loop {
        let line = match lines.next_line() {
            Ok(Some(Line::Line(line))) => line,
            Ok(Some(_)) => continue, // an overlong line is no command
            Ok(None) | Err(_) => break,
        };
        let text = String::from_utf8_lossy(&line);
        let mut words = text.split_ascii_whitespace();
        let verb = words.next();
        let pgid = words.next().and_then(|p| p.parse::<i32>().ok());
        let start = words.next().and_then(|s| s.parse::<u64>().ok());
        match (verb, pgid, start) {
            (Some(verb @ ("+" | "?")), Some(pgid), Some(start)) => {
                let confirmed = verb == "+";
                if let Some(held) = groups.get_mut(&pgid) {
                    // An announcement never undoes a confirmation.
                    held.confirmed |= confirmed;
                    held.start = start;
                } else if groups.len() < MAX_TRACKED_GROUPS {
                    groups.insert(pgid, Held { start, confirmed });
                }
            }
            (Some("-"), Some(pgid), _) => {
                groups.remove(&pgid);
            }
            (Some("prune"), None, None) => groups.retain(|&pgid, held| {
                held.confirmed
                    || (ProcessRecord {
                        pid: pgid,
                        start: held.start,
                    })
                    .alive()
            }),
            _ => {}
        }
    }
    let records: Vec<GroupRecord> = groups
        .into_iter()
        .map(|(pgid, held)| GroupRecord {
            pgid,
            start: held.start,
        })
        .collect();
    reap(&records, REAP_GRACE);
    if let Ok(root) = Root::new(root) {
        let _ = root.remove_file(ledger);
    }
}

/// Longest `/proc/self/stat` an [`Announcer`] reads (the command name is at
/// most 16 bytes; the line is about 300).
const MAX_OWN_STAT: usize = 1024;

/// The write end of the watchdog's pipe, duplicated for one spawn. The
/// forked child writes its own group to it before `exec`: the supervisor can
/// only record a child after `spawn` returns, and a SIGKILL between the two
/// would otherwise leave the child's descendants unknown to the watchdog
/// (the kernel's parent-death signal reaches only the child itself).
#[derive(Debug)]
pub(super) struct Announcer(std::os::fd::OwnedFd);

impl Announcer {
    /// Runs in the forked child before `exec`: write `? <pgid> <start>` when
    /// the child leads its own group. Async-signal-safe in what it does: a
    /// read of `/proc/self/stat` into a stack buffer, formatting into another,
    /// one `write` of less than `PIPE_BUF` bytes (atomic, so it never
    /// interleaves with the supervisor's lines), with SIGPIPE ignored around
    /// it (a watchdog that died must not kill the child). No allocation, no
    /// lock; every failure only leaves the recording to the supervisor.
    pub(super) fn announce(&self) {
        use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, sigaction};
        let mut stat = [0u8; MAX_OWN_STAT];
        let Some(own) = read_own_stat(&mut stat) else {
            return;
        };
        let pid = nix::unistd::getpid().as_raw();
        if own.pgrp != pid {
            return;
        }
        let mut line = [0u8; MAX_WATCHDOG_LINE];
        let mut rest = &mut line[..];
        if writeln!(rest, "? {pid} {}", own.start).is_err() {
            return;
        }
        let len = MAX_WATCHDOG_LINE - rest.len();
        let ignore = SigAction::new(SigHandler::SigIgn, SaFlags::empty(), SigSet::empty());
        // SAFETY: called in the single-threaded child between fork and exec;
        // the disposition is restored right after the write.
        #[allow(unsafe_code)]
        let before = unsafe { sigaction(Signal::SIGPIPE, &ignore) };
        let _ = nix::unistd::write(&self.0, &line[..len]);
        if let Ok(before) = before {
            // SAFETY: as above.
            #[allow(unsafe_code)]
            let _ = unsafe { sigaction(Signal::SIGPIPE, &before) };
        }
    }
}

/// This process's stat, read into `buf` without allocating.
fn read_own_stat(buf: &mut [u8]) -> Option<ProcStat> {
    let mut file = std::fs::File::open("/proc/self/stat").ok()?;
    let mut len = 0;
    while len < buf.len() {
        match file.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    parse_stat(std::str::from_utf8(&buf[..len]).ok()?)
}

/// The running watchdog and the write end of its pipe.
#[derive(Debug)]
struct Watchdog {
    child: Child,
    pipe: ChildStdin,
}

#[derive(Debug)]
struct State {
    groups: BTreeMap<i32, u64>,
    watchdog: Option<Watchdog>,
    /// [`Containment::finish`] ran: no watchdog is started again.
    finished: bool,
}

/// Records the process groups of one supervising process with its watchdog
/// and in its ledger. Create one with [`Containment::start`] and hand it to
/// `Supervisor::contained`.
#[derive(Debug)]
pub struct Containment {
    program: PathBuf,
    /// The repository every ledger path is confined to.
    root: Root,
    /// This process's ledger file, `<runtime_dir>/groups/<pid>-<start>.json`.
    ledger: PathBuf,
    boot_id: String,
    owner: ProcessRecord,
    /// Children run in a PID namespace each (see [`super::pidns`]).
    namespaces: bool,
    state: Mutex<State>,
}

impl Containment {
    /// Clean up what crashed supervisors left under `runtime_dir` (the
    /// repository `root`'s runtime directory; see [`reap_leftovers`]; this
    /// may wait up to [`REAP_GRACE`]), then start a watchdog by running
    /// `program` (the `npc` binary) with [`WATCHDOG_COMMAND`].
    pub fn start(
        program: &Path,
        root: &Path,
        runtime_dir: &Path,
    ) -> Result<Arc<Self>, ContainError> {
        let owner = ProcessRecord::current().ok_or(ContainError::NoProcfs)?;
        let boot_id = boot_id().ok_or(ContainError::NoProcfs)?;
        let root = Root::new(root).map_err(ContainError::Ledger)?;
        root.ensure_state_dir(runtime_dir)
            .map_err(ContainError::Ledger)?;
        let stopped = reap_leftovers(&root, runtime_dir);
        if stopped > 0 {
            tracing::warn!(
                "stopped {stopped} process(es) left behind by a supervisor that did not exit cleanly"
            );
        }
        let ledger = ledger_dir(runtime_dir).join(format!("{}-{}.json", owner.pid, owner.start));
        let watchdog =
            spawn_watchdog(program, &root, &ledger).map_err(|source| ContainError::Watchdog {
                program: program.to_path_buf(),
                source,
            })?;
        let namespaces = match super::pidns::probe_once(program) {
            Ok(()) => true,
            Err(why) => {
                tracing::warn!(
                    "children cannot run in PID namespaces ({why}); what a child moves out of its process group (`setsid`) is not stopped with it; see `npc doctor`"
                );
                false
            }
        };
        Ok(Arc::new(Self {
            program: program.to_path_buf(),
            root,
            ledger,
            boot_id,
            owner,
            namespaces,
            state: Mutex::new(State {
                groups: BTreeMap::new(),
                watchdog: Some(watchdog),
                finished: false,
            }),
        }))
    }

    /// The `npc` binary that runs each child in a PID namespace
    /// ([`super::pidns::CONTAIN_COMMAND`]); `None` where namespaces are
    /// unavailable.
    pub(super) fn stub(&self) -> Option<&Path> {
        self.namespaces.then_some(self.program.as_path())
    }

    /// Pid of the current watchdog, if one runs.
    pub fn watchdog_pid(&self) -> Option<u32> {
        let state = super::lock(&self.state);
        state.watchdog.as_ref().map(|w| w.child.id())
    }

    /// Record group `pgid` (just spawned; its leader is `pgid`).
    pub(super) fn track(&self, pgid: Pid) {
        let Some(stat) = read_stat(pgid.as_raw()) else {
            // Already reaped: nothing of it can outlive us through this
            // record; the watchdog forgets what the child announced.
            let mut state = super::lock(&self.state);
            self.tell(&mut state, &format!("- {}\n", pgid.as_raw()));
            return;
        };
        let mut state = super::lock(&self.state);
        if state.groups.len() >= MAX_TRACKED_GROUPS {
            tracing::warn!(
                "more than {MAX_TRACKED_GROUPS} process groups at once; group {pgid} is not recorded"
            );
            return;
        }
        state.groups.insert(pgid.as_raw(), stat.start);
        self.tell(&mut state, &format!("+ {} {}\n", pgid.as_raw(), stat.start));
        self.write_ledger(&state);
    }

    /// A duplicate of the watchdog pipe for the next spawn's child to
    /// announce itself on; `None` when no watchdog runs.
    pub(super) fn announcer(&self) -> Option<Announcer> {
        use std::os::fd::AsFd;
        let state = super::lock(&self.state);
        let pipe = state.watchdog.as_ref()?.pipe.as_fd().try_clone_to_owned();
        pipe.map(Announcer).ok()
    }

    /// A spawn failed: its child may have announced itself before its `exec`
    /// failed; the watchdog drops announced groups that are gone.
    pub(super) fn spawn_failed(&self) {
        let mut state = super::lock(&self.state);
        self.tell(&mut state, "prune\n");
    }

    /// Forget group `pgid` (it is gone).
    pub(super) fn untrack(&self, pgid: Pid) {
        let mut state = super::lock(&self.state);
        if state.groups.remove(&pgid.as_raw()).is_none() {
            return;
        }
        self.tell(&mut state, &format!("- {}\n", pgid.as_raw()));
        self.write_ledger(&state);
    }

    /// Send `line` to the watchdog; replace a watchdog that died or stopped
    /// reading, and replay every recorded group to the new one.
    fn tell(&self, state: &mut State, line: &str) {
        let healthy = match state.watchdog.as_mut() {
            Some(w) => {
                matches!(w.child.try_wait(), Ok(None)) && w.pipe.write_all(line.as_bytes()).is_ok()
            }
            None => false,
        };
        if healthy || state.finished {
            return;
        }
        if let Some(mut old) = state.watchdog.take() {
            let _ = old.child.kill();
            let _ = old.child.wait();
        }
        match spawn_watchdog(&self.program, &self.root, &self.ledger) {
            Ok(mut w) => {
                let replay: String = state
                    .groups
                    .iter()
                    .map(|(pgid, start)| format!("+ {pgid} {start}\n"))
                    .collect();
                if let Err(e) = w.pipe.write_all(replay.as_bytes()) {
                    tracing::warn!("the new watchdog does not read: {e}");
                }
                state.watchdog = Some(w);
            }
            Err(e) => tracing::warn!(
                "cannot restart the watchdog `{}`: {e}; children's descendants may outlive a crash until the next start",
                self.program.display()
            ),
        }
    }

    /// Replace the ledger file atomically (temp file + rename).
    fn write_ledger(&self, state: &State) {
        let ledger = Ledger {
            boot_id: self.boot_id.clone(),
            owner: self.owner,
            groups: state
                .groups
                .iter()
                .map(|(&pgid, &start)| GroupRecord { pgid, start })
                .collect(),
        };
        let bytes = serde_json::to_vec(&ledger).unwrap_or_default();
        if let Err(e) = self.root.write(&self.ledger, &bytes, WriteOptions::PRIVATE) {
            tracing::warn!("cannot record process groups: {e}");
        }
    }

    /// Every group is stopped: close the watchdog's pipe, wait briefly for it
    /// to exit, and remove the ledger.
    pub(super) fn finish(&self) {
        let mut state = super::lock(&self.state);
        state.finished = true;
        if let Some(mut w) = state.watchdog.take() {
            drop(w.pipe);
            let deadline = Instant::now() + WATCHDOG_EXIT_WAIT;
            while matches!(w.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(POLL);
            }
        }
        if state.groups.is_empty() {
            let _ = self.root.remove_file(&self.ledger);
        }
    }
}

/// Start `program __watchdog --root <root> --ledger <ledger>` in its own
/// session (so nothing aimed at the supervisor's group or terminal reaches
/// it) with a non-blocking pipe on its stdin.
#[allow(unsafe_code)]
fn spawn_watchdog(program: &Path, root: &Root, ledger: &Path) -> io::Result<Watchdog> {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(program);
    cmd.arg(WATCHDOG_COMMAND)
        .arg("--root")
        .arg(root.path())
        .arg("--ledger")
        .arg(ledger)
        .env_clear()
        // Holds nothing of the repository open (its directory can go away).
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: setsid is async-signal-safe; the closure allocates nothing.
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid().map_err(io::Error::from)?;
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    let Some(pipe) = child.stdin.take() else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(io::Error::other("the watchdog has no stdin pipe"));
    };
    // A stopped watchdog must never block the supervisor: a full pipe is an
    // error that replaces it.
    let flags = nix::fcntl::fcntl(&pipe, nix::fcntl::FcntlArg::F_GETFL).map_err(io::Error::from)?;
    let flags = nix::fcntl::OFlag::from_bits_truncate(flags) | nix::fcntl::OFlag::O_NONBLOCK;
    nix::fcntl::fcntl(&pipe, nix::fcntl::FcntlArg::F_SETFL(flags)).map_err(io::Error::from)?;
    Ok(Watchdog { child, pipe })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    #[test]
    fn stat_parsing_reads_group_and_start_time() {
        let line = "42 (a) b) (c) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(
            parse_stat(line),
            Some(ProcStat {
                state: 'S',
                pgrp: 42,
                start: 987_654
            })
        );
        assert_eq!(parse_stat("7 (sleep) Z 1 5 5"), None);
        assert_eq!(parse_stat("no parens"), None);
        assert_eq!(parse_stat("7 (x) S 1 notanumber"), None);
    }

    #[test]
    fn own_stat_is_readable_and_stable() {
        let me = ProcessRecord::current().expect("procfs");
        assert!(me.alive());
        let other = ProcessRecord {
            pid: me.pid,
            start: me.start + 1,
        };
        assert!(!other.alive(), "another start time is another process");
    }

    proptest::proptest! {
        #[test]
        fn stat_parsing_never_panics(s in ".{0,300}") {
            let _ = parse_stat(&s);
        }
    }

    #[test]
    fn a_group_whose_leader_started_at_another_time_has_no_members() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .expect("sleep");
        let pid = i32::try_from(child.id()).expect("pid");
        let start = read_stat(pid).expect("stat").start;
        let all = processes();
        let reused = GroupRecord {
            pgid: pid,
            start: start + 1,
        };
        assert!(members(reused, &all).is_empty());
        assert_eq!(members(GroupRecord { pgid: pid, start }, &all), [pid]);
        assert_eq!(reap(&[reused], Duration::ZERO), 0);
        assert!(matches!(child.try_wait(), Ok(None)), "never signalled");
        assert_eq!(reap(&[GroupRecord { pgid: pid, start }], REAP_GRACE), 1);
        assert!(child.wait().is_ok());
    }

    #[test]
    fn ledgers_from_another_boot_are_removed_without_signalling() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .expect("sleep");
        let pid = i32::try_from(child.id()).expect("pid");
        let start = read_stat(pid).expect("stat").start;
        let ledgers = dir.path().join(LEDGER_DIR);
        std::fs::create_dir_all(&ledgers).expect("dir");
        let ledger = Ledger {
            boot_id: "another-boot".into(),
            owner: ProcessRecord { pid: 1, start: 0 },
            groups: vec![GroupRecord { pgid: pid, start }],
        };
        let path = ledgers.join("x.json");
        std::fs::write(&path, serde_json::to_vec(&ledger).expect("json")).expect("write");
        let root = Root::new(dir.path()).expect("root");
        assert_eq!(reap_leftovers(&root, dir.path()), 0);
        assert!(!path.exists());
        assert!(matches!(child.try_wait(), Ok(None)), "never signalled");
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn ledgers_are_never_read_or_removed_through_a_link_and_foreign_files_stay() {
        let dir = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("outside");
        let state = dir.path().join("state");
        std::fs::create_dir(&state).expect("state");
        let other_boot = serde_json::json!({
            "boot_id": "another-boot", "owner": { "pid": 1, "start": 0 }, "groups": []
        });
        let victim = outside.path().join("settings.json");
        std::fs::write(&victim, other_boot.to_string()).expect("write");
        std::os::unix::fs::symlink(outside.path(), state.join(LEDGER_DIR)).expect("link");
        let root = Root::new(dir.path()).expect("root");
        reap_leftovers(&root, &state);
        assert!(
            victim.exists(),
            "nothing is removed through a linked ledger dir"
        );

        std::fs::remove_file(state.join(LEDGER_DIR)).expect("unlink");
        std::fs::create_dir(state.join(LEDGER_DIR)).expect("dir");
        let foreign = state.join(LEDGER_DIR).join("notes.json");
        std::fs::write(&foreign, b"{ not a ledger").expect("write");
        reap_leftovers(&root, &state);
        assert!(foreign.exists(), "what is not a ledger is left alone");
    }

    #[test]
    fn the_watchdog_loop_stops_what_is_recorded_at_end_of_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ledger = dir.path().join("l.json");
        std::fs::write(&ledger, b"{}").expect("write");
        let mut kept = std::process::Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .expect("sleep");
        let mut killed = std::process::Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .expect("sleep");
        let (k, x) = (kept.id(), killed.id());
        let start = |pid: u32| {
            read_stat(i32::try_from(pid).expect("pid"))
                .expect("stat")
                .start
        };
        let input = format!(
            "+ {k} {}\n+ {x} {}\ngarbage\n- {k}\n+ 1\n",
            start(k),
            start(x)
        );
        run_watchdog(input.as_bytes(), dir.path(), &ledger);
        assert!(killed.wait().is_ok());
        assert!(
            matches!(kept.try_wait(), Ok(None)),
            "removed groups are left alone"
        );
        assert!(!ledger.exists());
        let _ = kept.kill();
        let _ = kept.wait();
    }

    /// A group whose leader exited while one member lives on.
    fn group_outliving_its_leader() -> (GroupRecord, i32) {
        let mut leader = std::process::Command::new("sh")
            .args(["-c", "sleep 30 >/dev/null 2>&1 & exit 0"])
            .process_group(0)
            .spawn()
            .expect("sh");
        let pgid = i32::try_from(leader.id()).expect("pid");
        let start = read_stat(pgid).expect("stat").start;
        assert!(leader.wait().expect("wait").success());
        let group = GroupRecord { pgid, start };
        let members = members(group, &processes());
        assert_eq!(
            members.len(),
            1,
            "the backgrounded sleep stays in the group"
        );
        (group, members[0])
    }

    #[test]
    fn an_announced_group_is_stopped_at_end_of_file_unless_pruned_after_its_leader_went() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ledger = dir.path().join("l.json");
        let alive = |pid: i32| read_stat(pid).is_some_and(|s| s.state != 'Z');

        let (group, member) = group_outliving_its_leader();
        let input = format!("? {} {}\n", group.pgid, group.start);
        run_watchdog(input.as_bytes(), dir.path(), &ledger);
        assert!(
            !alive(member),
            "an announced group is stopped like a recorded one"
        );

        let (group, member) = group_outliving_its_leader();
        let input = format!("? {} {}\nprune\n", group.pgid, group.start);
        run_watchdog(input.as_bytes(), dir.path(), &ledger);
        assert!(
            alive(member),
            "an announced group whose leader went is pruned"
        );
        let _ = kill(Pid::from_raw(member), Signal::SIGKILL);

        let (group, member) = group_outliving_its_leader();
        let input = format!(
            "? {pgid} {start}\n+ {pgid} {start}\n? {pgid} {start}\nprune\n",
            pgid = group.pgid,
            start = group.start
        );
        run_watchdog(input.as_bytes(), dir.path(), &ledger);
        assert!(!alive(member), "a confirmed group is never pruned");
    }

    /// Spawn `sleep 30` with `announcer` in its `pre_exec`, in a group of its
    /// own or not.
    #[allow(unsafe_code)]
    fn spawn_announcing(announcer: Announcer, own_group: bool) -> std::process::Child {
        let mut cmd = std::process::Command::new("sleep");
        cmd.arg("30");
        if own_group {
            cmd.process_group(0);
        }
        // SAFETY: `announce` is async-signal-safe (see its docs).
        unsafe {
            cmd.pre_exec(move || {
                announcer.announce();
                Ok(())
            });
        }
        cmd.spawn().expect("sleep")
    }

    fn pipe() -> (std::fs::File, Announcer) {
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).expect("pipe");
        let flags = nix::fcntl::OFlag::O_NONBLOCK;
        nix::fcntl::fcntl(&read, nix::fcntl::FcntlArg::F_SETFL(flags)).expect("nonblock");
        (std::fs::File::from(read), Announcer(write))
    }

    #[test]
    fn a_child_announces_its_own_group_before_spawn_returns() {
        let (mut read, announcer) = pipe();
        let mut child = spawn_announcing(announcer, true);
        let pid = i32::try_from(child.id()).expect("pid");
        // Non-blocking: the line is there as soon as `spawn` returned.
        let line = written(&mut read);
        let start = read_stat(pid).expect("stat").start;
        assert_eq!(String::from_utf8_lossy(&line), format!("? {pid} {start}\n"));
        let _ = child.kill();
        let _ = child.wait();

        let (mut read, announcer) = pipe();
        let mut child = spawn_announcing(announcer, false);
        assert_eq!(
            written(&mut read),
            b"",
            "a child in its supervisor's group announces nothing"
        );
        let _ = child.kill();
        let _ = child.wait();
    }

    /// What is in the non-blocking pipe `read` now. Not "until its end": a
    /// child another test forks meanwhile may hold its write end until that
    /// child's `exec`.
    fn written(read: &mut std::fs::File) -> Vec<u8> {
        let mut out = Vec::new();
        let mut buf = [0_u8; 256];
        loop {
            match read.read(&mut buf) {
                Ok(0) => return out,
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return out,
                Err(e) => panic!("cannot read the pipe: {e}"),
            }
        }
    }

    #[test]
    fn a_watchdog_gone_does_not_kill_the_announcing_child() {
        let (read, announcer) = pipe();
        drop(read);
        let mut child = spawn_announcing(announcer, true);
        assert!(matches!(child.try_wait(), Ok(None)), "the child runs");
        let _ = child.kill();
        let status = child.wait().expect("wait");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            status.signal(),
            Some(Signal::SIGKILL as i32),
            "killed by us, not by SIGPIPE"
        );
    }
}
