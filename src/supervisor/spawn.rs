//! How a child process is built and torn down: the [`ChildSpec`] a caller
//! hands in, the cleared environment (declared `env` plus a few essentials
//! copied from the daemon), stdio wiring (null, pipes, or an append-only log
//! file), its own process group, the parent-death signal, and the
//! process-group kill helpers (TERM, grace, KILL) used by every spawn path.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::time::{Instant, sleep, timeout};

use crate::model::RestartPolicy;

use super::contain::{self, Announcer, Containment};
use super::pidns;
use super::{ExitInfo, SupervisorError};

/// Variables copied from the daemon's environment into every child (when set);
/// everything else is cleared and only the declared `env` is added.
pub const ESSENTIAL_ENV: [&str; 4] = ["PATH", "HOME", "LANG", "TERM"];
/// Default time between SIGTERM and SIGKILL when stopping a child.
pub const DEFAULT_STOP_GRACE: Duration = Duration::from_secs(10);
/// Subdirectory of the state directory holding child log files.
pub const LOG_DIR: &str = "logs";
/// A child log file larger than this is renamed to `<name>.1` when the child
/// (re)starts, so logs stay bounded to about twice this size.
pub const LOG_ROTATE_BYTES: u64 = 16 * 1024 * 1024;
/// First pause while waiting for the rest of a process group to exit.
const GROUP_POLL_MIN: Duration = Duration::from_millis(5);
/// Longest pause while waiting for the rest of a process group to exit.
const GROUP_POLL_MAX: Duration = Duration::from_millis(100);

/// Where a child's stdin comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InputWiring {
    /// `/dev/null`.
    Null,
    /// A pipe the caller takes (see `Supervisor::take_pipes`).
    Piped,
}

/// Where a child's stdout or stderr goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutputWiring {
    /// `/dev/null`.
    Null,
    /// A pipe the caller takes and must keep reading, or the child blocks.
    Piped,
    /// Appended to this file (created with its directories). Nothing blocks.
    AppendTo(PathBuf),
}

/// How a supervised child's three standard streams are wired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StdioSpec {
    pub stdin: InputWiring,
    pub stdout: OutputWiring,
    pub stderr: OutputWiring,
}

impl StdioSpec {
    /// All three streams on `/dev/null`.
    pub fn null() -> Self {
        Self {
            stdin: InputWiring::Null,
            stdout: OutputWiring::Null,
            stderr: OutputWiring::Null,
        }
    }

    /// All three streams piped (e.g. a stdio MCP server).
    pub fn piped() -> Self {
        Self {
            stdin: InputWiring::Piped,
            stdout: OutputWiring::Piped,
            stderr: OutputWiring::Piped,
        }
    }

    /// stdin on `/dev/null`, stdout and stderr appended to `path`.
    pub fn log_to(path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        Self {
            stdin: InputWiring::Null,
            stdout: OutputWiring::AppendTo(path.clone()),
            stderr: OutputWiring::AppendTo(path),
        }
    }
}

/// What to run and how to keep it running. Strings are already resolved:
/// the caller passes `Text::expose()` values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildSpec {
    /// Executable name (looked up on the child's `PATH`) or path.
    pub program: String,
    pub args: Vec<String>,
    /// Declared environment, added to [`ESSENTIAL_ENV`] (and overriding it).
    pub env: BTreeMap<String, String>,
    /// Working directory; must exist.
    pub cwd: PathBuf,
    /// What happens when a supervised child exits (ignored by one-shot runs).
    pub restart: RestartPolicy,
    /// Time between SIGTERM and SIGKILL on stop.
    pub stop_grace: Duration,
    /// Stream wiring for supervised children (one-shot runs always pipe).
    pub stdio: StdioSpec,
    /// The child's sandbox (see [`super::sandbox`]); a child with one is
    /// never started without it.
    pub sandbox: Option<super::sandbox::SandboxSpec>,
}

impl ChildSpec {
    /// `program` with no arguments or declared env, run in `cwd`, never
    /// restarted, stopped with [`DEFAULT_STOP_GRACE`], streams on `/dev/null`.
    pub fn new(program: impl Into<String>, cwd: impl Into<PathBuf>) -> Self {
        Self {
            program: program.into(),
            args: Vec::new(),
            env: BTreeMap::new(),
            cwd: cwd.into(),
            restart: RestartPolicy::Never,
            stop_grace: DEFAULT_STOP_GRACE,
            stdio: StdioSpec::null(),
            sandbox: None,
        }
    }

    /// Replace the arguments.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args = args.into_iter().map(Into::into).collect();
        self
    }
}

/// The log file for child `id` under `state_dir` (`<state_dir>/logs/<id>.log`).
/// Characters other than ASCII letters, digits, `-` and `_` are
/// percent-encoded, so distinct ids never share a file and no id escapes the
/// directory (`mcp_server/fs` → `mcp_server%2Ffs.log`).
pub fn log_path(state_dir: &Path, id: &str) -> PathBuf {
    let mut name = String::with_capacity(id.len() + 4);
    for b in id.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
            name.push(char::from(b));
        } else {
            name.push_str(&format!("%{b:02X}"));
        }
    }
    if name.is_empty() {
        name.push('%');
    }
    name.push_str(".log");
    state_dir.join(LOG_DIR).join(name)
}

/// The environment a child gets: [`ESSENTIAL_ENV`] from `parent` (when set),
/// then the declared `env` on top.
pub fn child_env(
    declared: &BTreeMap<String, String>,
    parent: impl Fn(&str) -> Option<String>,
) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for key in ESSENTIAL_ENV {
        if let Some(v) = parent(key) {
            env.insert(key.to_string(), v);
        }
    }
    env.extend(declared.iter().map(|(k, v)| (k.clone(), v.clone())));
    env
}

/// Open `path` (`<state_dir>/logs/NAME`, see [`log_path`]) for appending,
/// first renaming it to `<path>.1` (replacing an older one) when it is
/// larger than `rotate_at` bytes. Through the guarded layer confined to the
/// state directory: the logs directory is private, the file is owner-only,
/// never opened through a link nor written in place when hard-linked.
fn open_log(path: &Path, rotate_at: u64) -> io::Result<File> {
    let state_dir = path
        .parent()
        .and_then(Path::parent)
        .unwrap_or(Path::new(""));
    let root = crate::repofs::Root::new(state_dir)?;
    Ok(root.open_append(path, rotate_at)?)
}

fn output_stdio(wiring: &OutputWiring) -> io::Result<Stdio> {
    Ok(match wiring {
        OutputWiring::Null => Stdio::null(),
        OutputWiring::Piped => Stdio::piped(),
        OutputWiring::AppendTo(path) => Stdio::from(open_log(path, LOG_ROTATE_BYTES)?),
    })
}

/// Build the command: cleared environment, own process group, parent-death
/// signal, kill on drop; with `contain`, the child announces its group to the
/// watchdog before `exec` (see [`Announcer`]) and, where namespaces are
/// available, runs in a PID namespace of its own through the stub (see
/// [`pidns`]); with [`Report::Program`], the stub's program reports its pid
/// on the returned [`PidReport`].
fn command(
    id: &str,
    spec: &ChildSpec,
    contain: Option<&Arc<Containment>>,
    report: Report,
) -> Result<(Command, Option<PidReport>), SupervisorError> {
    let env = child_env(&spec.env, |k| std::env::var(k).ok());
    let mut pid_report = None;
    let mut cmd = match contain.and_then(|c| c.stub()) {
        Some(stub) => {
            // The stub's own spawn succeeds whatever the program is: what
            // the program's spawn would have said is said here.
            runnable(&spec.program, env.get("PATH"), &spec.cwd)
                .map_err(|e| spawn_error(id, spec, e))?;
            let mut cmd = Command::new(stub);
            cmd.arg(pidns::CONTAIN_COMMAND);
            if report == Report::Program {
                let pair = PidReport::new().map_err(|e| spawn_error(id, spec, e))?;
                pair.hand_over(&mut cmd);
                pid_report = Some(pair);
            }
            if let Some(sandbox) = &spec.sandbox {
                cmd.arg(super::sandbox::SANDBOX_FLAG).arg(sandbox.to_arg());
            }
            cmd.arg("--").arg(&spec.program);
            cmd
        }
        None if spec.sandbox.is_some() => {
            return Err(spawn_error(
                id,
                spec,
                std::io::Error::other(
                    "the run asks for a sandbox and this process cannot contain children (PID namespaces are off or unavailable); run `npc doctor`",
                ),
            ));
        }
        None => Command::new(&spec.program),
    };
    cmd.args(&spec.args)
        .env_clear()
        .envs(env)
        .current_dir(&spec.cwd)
        .process_group(0)
        .kill_on_drop(true);
    set_parent_death_signal(&mut cmd);
    reset_ignored_signals(&mut cmd);
    if let Some(announcer) = contain.and_then(|c| c.announcer()) {
        announce_before_exec(&mut cmd, announcer);
    }
    Ok((cmd, pid_report))
}

/// How long a supervisor waits for a contained component's program to report
/// its pid (it does so right before its `exec`, a few milliseconds after the
/// stub starts); past it, the stub's pid stands for the program's.
pub(super) const PROGRAM_PID_LIMIT: Duration = Duration::from_secs(5);

/// A socket pair on which the program a stub runs reports its pid: the
/// supervisor's end has `SO_PASSCRED`, so the kernel attaches the sender's
/// pid, translated into the supervisor's PID namespace, to the message.
#[derive(Debug)]
struct PidReport {
    ours: OwnedFd,
    theirs: OwnedFd,
}

impl PidReport {
    fn new() -> io::Result<Self> {
        use nix::sys::socket::{
            AddressFamily, SockFlag, SockType, setsockopt, socketpair, sockopt,
        };
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )?;
        setsockopt(&ours, sockopt::PassCred, &true)?;
        Ok(Self { ours, theirs })
    }

    /// Pass the stub's end to the child of `cmd` (`--report FD`); it stays
    /// close-on-exec in this process, so no other child inherits it.
    #[allow(unsafe_code)]
    fn hand_over(&self, cmd: &mut Command) {
        let fd = self.theirs.as_raw_fd();
        cmd.arg(pidns::REPORT_FLAG).arg(fd.to_string());
        // SAFETY: the closure runs in the forked child before exec and makes
        // one async-signal-safe call (fcntl); it allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                if nix::libc::fcntl(fd, nix::libc::F_SETFD, 0) == -1 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }

    /// The program's pid, once it reported it (blocking, up to `limit`);
    /// `None` when the stub ended without a report (the program never ran)
    /// or did not report in time.
    fn program_pid(self, limit: Duration) -> Option<u32> {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        use nix::sys::socket::{ControlMessageOwned, MsgFlags, UnixCredentials, recvmsg};
        drop(self.theirs);
        let deadline = std::time::Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let left = PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX);
            let mut fds = [PollFd::new(self.ours.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, left) {
                Ok(0) => return None,
                Ok(_) => break,
                Err(Errno::EINTR) => continue,
                Err(_) => return None,
            }
        }
        let mut byte = [0u8; 1];
        let mut iov = [io::IoSliceMut::new(&mut byte)];
        let mut space = nix::cmsg_space!(UnixCredentials);
        let msg = recvmsg::<()>(
            self.ours.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .ok()?;
        if msg.bytes == 0 {
            return None;
        }
        msg.cmsgs().ok()?.find_map(|c| match c {
            ControlMessageOwned::ScmCredentials(creds) => {
                u32::try_from(creds.pid()).ok().filter(|p| *p > 0)
            }
            _ => None,
        })
    }
}

/// Search path `execvp` uses when `PATH` is unset.
const DEFAULT_PATH: &str = "/bin:/usr/bin";

/// Whether `program` can be executed by a child whose `PATH` is `path` and
/// whose working directory is `cwd`, the way `execvp` looks it up: a name
/// with a `/` as it is (relative to `cwd`), any other name in each
/// directory of `PATH`. The error is the one the `exec` would fail with.
pub(super) fn runnable(program: &str, path: Option<&String>, cwd: &Path) -> io::Result<()> {
    use nix::unistd::{AccessFlags, access};
    let try_one = |candidate: &Path| -> io::Result<()> {
        let meta = std::fs::metadata(candidate)?;
        if meta.is_dir() {
            return Err(io::Error::from(Errno::EACCES));
        }
        access(candidate, AccessFlags::X_OK).map_err(io::Error::from)
    };
    if program.is_empty() {
        return Err(io::Error::from(Errno::ENOENT));
    }
    if program.contains('/') {
        return try_one(&cwd.join(program));
    }
    let path = path.map_or(DEFAULT_PATH, String::as_str);
    let mut denied = None;
    for dir in std::env::split_paths(path) {
        let dir = if dir.as_os_str().is_empty() {
            cwd.to_path_buf()
        } else {
            cwd.join(dir)
        };
        match try_one(&dir.join(program)) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => denied = Some(e),
            Err(_) => {}
        }
    }
    Err(denied.unwrap_or_else(|| io::Error::from(Errno::ENOENT)))
}

/// Have the child write its own group to the watchdog before `exec`.
#[allow(unsafe_code)]
fn announce_before_exec(cmd: &mut Command, announcer: Announcer) {
    // SAFETY: the closure runs in the forked child before exec (after the
    // group is set); `announce` allocates nothing and takes no lock.
    unsafe {
        cmd.pre_exec(move || {
            announcer.announce();
            Ok(())
        });
    }
}

/// Spawn `cmd`; when it fails, tell the watchdog to drop what a child whose
/// `exec` failed may have announced.
fn spawn_contained(
    id: &str,
    spec: &ChildSpec,
    mut cmd: Command,
    contain: Option<&Arc<Containment>>,
) -> Result<Child, SupervisorError> {
    cmd.spawn().map_err(|e| {
        if let Some(c) = contain {
            c.spawn_failed();
        }
        spawn_error(id, spec, e)
    })
}

/// Start the child with every signal npc's own launcher ignored at its
/// default again (`nohup` ignores SIGHUP, a shell's `&` SIGINT and SIGQUIT;
/// an ignored signal is inherited across `exec`, and a shell cannot even
/// trap one it was started ignoring), as a service manager starts its
/// services: what a child does with a signal is its own choice.
#[allow(unsafe_code)]
fn reset_ignored_signals(cmd: &mut Command) {
    // SAFETY: the closure runs in the forked child before exec and makes
    // only `sigaction` calls (async-signal-safe); it allocates nothing.
    unsafe {
        cmd.pre_exec(|| {
            for signo in 1..nix::libc::SIGRTMIN() {
                if signo == nix::libc::SIGKILL || signo == nix::libc::SIGSTOP {
                    continue;
                }
                let mut old: nix::libc::sigaction = std::mem::zeroed();
                if nix::libc::sigaction(signo, std::ptr::null(), &mut old) == 0
                    && old.sa_sigaction == nix::libc::SIG_IGN
                {
                    let mut default: nix::libc::sigaction = std::mem::zeroed();
                    default.sa_sigaction = nix::libc::SIG_DFL;
                    nix::libc::sigaction(signo, &default, std::ptr::null_mut());
                }
            }
            Ok(())
        });
    }
}

/// Ask the kernel to SIGKILL the child when the daemon dies, even by SIGKILL.
/// The signal fires when the *thread* that forked exits; tokio spawns from
/// runtime worker threads, which live as long as the runtime, so do not call
/// the supervisor from `spawn_blocking` threads.
#[allow(unsafe_code)]
fn set_parent_death_signal(cmd: &mut Command) {
    let parent = nix::unistd::getpid();
    // SAFETY: the closure runs in the forked child before exec and only makes
    // two async-signal-safe system calls (prctl, getppid); it allocates
    // nothing and touches no locks.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(io::Error::from)?;
            // The daemon may have died between fork and prctl.
            if nix::unistd::getppid() != parent {
                return Err(io::Error::from(Errno::ESRCH));
            }
            Ok(())
        });
    }
}

fn spawn_error(id: &str, spec: &ChildSpec, source: io::Error) -> SupervisorError {
    SupervisorError::Spawn {
        id: id.to_string(),
        program: spec.program.clone(),
        source,
    }
}

fn check_cwd(id: &str, spec: &ChildSpec) -> Result<(), SupervisorError> {
    if spec.cwd.is_dir() {
        Ok(())
    } else {
        Err(SupervisorError::Cwd {
            id: id.to_string(),
            cwd: spec.cwd.clone(),
        })
    }
}

/// Which pid of a contained child the supervisor learns. Every contained
/// child runs in a PID namespace of its own through the stub, whose
/// descendants end with it whatever they do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Report {
    /// The stub's only: one-shot and streaming children (a run's agent,
    /// `setup`/`after`, actions, hooks, git), known by their process group.
    Stub,
    /// The program's too: a long-lived component (an MCP server), whose pid
    /// the daemon shows is the program's own.
    Program,
}

/// A supervised child as spawned.
#[derive(Debug)]
pub(super) struct Spawned {
    /// The process the supervisor waits for: the program, or the stub
    /// running it (its exit status is the program's).
    pub(super) child: Child,
    /// The program's pid in this process's PID namespace.
    pub(super) pid: u32,
    /// How a signal reaches the program alone.
    pub(super) signals: Signals,
}

/// How a signal for a supervised child's program alone is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Signals {
    /// `kill` to the program (the child itself).
    Direct,
    /// Queued to the stub (the child), which passes it on (see
    /// [`pidns::queue_signal`]): the program's pid is not this process's
    /// child, and could name another process once the program ended.
    Stub,
}

impl Signals {
    /// Send `signal` to the program `child` runs.
    pub(super) fn send(self, child: &Child, signal: Signal) -> nix::Result<()> {
        let pid = pgid_of(child).ok_or(Errno::ESRCH)?;
        match self {
            Self::Direct => nix::sys::signal::kill(pid, signal),
            Self::Stub => pidns::queue_signal(pid, signal),
        }
    }
}

/// Spawn a supervised child with its declared stdio wiring; with a
/// containment, through the stub, and wait (up to [`PROGRAM_PID_LIMIT`]) for
/// its program's pid.
pub(super) fn spawn_supervised(
    id: &str,
    spec: &ChildSpec,
    contain: Option<&Arc<Containment>>,
) -> Result<Spawned, SupervisorError> {
    check_cwd(id, spec)?;
    let (mut cmd, report) = command(id, spec, contain, Report::Program)?;
    let log_err = |path: &Path, source| SupervisorError::Log {
        id: id.to_string(),
        path: path.to_path_buf(),
        source,
    };
    let wire = |w: &OutputWiring| {
        output_stdio(w).map_err(|e| match w {
            OutputWiring::AppendTo(p) => log_err(p, e),
            _ => spawn_error(id, spec, e),
        })
    };
    cmd.stdin(match spec.stdio.stdin {
        InputWiring::Null => Stdio::null(),
        InputWiring::Piped => Stdio::piped(),
    })
    .stdout(wire(&spec.stdio.stdout)?)
    .stderr(wire(&spec.stdio.stderr)?);
    let child = spawn_contained(id, spec, cmd, contain)?;
    let own = child.id().unwrap_or_default();
    Ok(match report {
        Some(report) => Spawned {
            pid: report.program_pid(PROGRAM_PID_LIMIT).unwrap_or(own),
            child,
            signals: Signals::Stub,
        },
        None => Spawned {
            child,
            pid: own,
            signals: Signals::Direct,
        },
    })
}

/// Spawn a one-shot child with all three streams piped.
pub(super) fn spawn_piped(
    id: &str,
    spec: &ChildSpec,
    contain: Option<&Arc<Containment>>,
) -> Result<Child, SupervisorError> {
    check_cwd(id, spec)?;
    let (mut cmd, _) = command(id, spec, contain, Report::Stub)?;
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    spawn_contained(id, spec, cmd, contain)
}

/// The process group of a child started by this module (its pid).
pub(super) fn pgid_of(child: &Child) -> Option<Pid> {
    child
        .id()
        .and_then(|p| i32::try_from(p).ok())
        .map(Pid::from_raw)
}

/// Send `signal` to every process in group `pgid`. A group that no longer
/// exists is not an error.
pub fn signal_group(pgid: Pid, signal: Signal) -> nix::Result<()> {
    match killpg(pgid, signal) {
        Err(Errno::ESRCH) => Ok(()),
        other => other,
    }
}

/// Whether any live (not zombie) process is still in group `pgid`. Zombies
/// count as gone: a grandchild reparented to an init that does not reap
/// (common in containers) stays a zombie forever but holds nothing.
pub fn group_exists(pgid: Pid) -> bool {
    if matches!(killpg(pgid, None), Err(Errno::ESRCH)) {
        return false;
    }
    contain::processes()
        .iter()
        .any(|(_, s)| s.pgrp == pgid.as_raw() && s.state != 'Z')
}

/// Kill what is left of a group whose leader already exited.
pub(super) fn kill_leftovers(pgid: Pid) {
    let _ = signal_group(pgid, Signal::SIGKILL);
}

/// Stop a child: SIGTERM to its group, wait up to `grace` for the leader,
/// SIGKILL the group if it is still there, reap the leader; then give the
/// rest of the group what remains of `grace` and SIGKILL any stragglers.
pub(super) async fn stop_child(child: &mut Child, grace: Duration) -> ExitInfo {
    let Some(pgid) = pgid_of(child) else {
        // Already reaped.
        return child.wait().await.map(ExitInfo::from).unwrap_or_default();
    };
    let deadline = Instant::now() + grace;
    let _ = signal_group(pgid, Signal::SIGTERM);
    let status = match timeout(grace, child.wait()).await {
        Ok(status) => status,
        Err(_) => {
            let _ = signal_group(pgid, Signal::SIGKILL);
            child.wait().await
        }
    };
    let mut pause = GROUP_POLL_MIN;
    while group_exists(pgid) && Instant::now() < deadline {
        sleep(pause.min(deadline.saturating_duration_since(Instant::now()))).await;
        pause = (pause * 2).min(GROUP_POLL_MAX);
    }
    kill_leftovers(pgid);
    status.map(ExitInfo::from).unwrap_or_default()
}

/// One spawned process group from spawn to its end: records it with the
/// supervisor's [`Containment`] (if any) when created, forgets it when
/// disarmed, and SIGKILLs the group when dropped while still armed — the last
/// line of defence against orphans when a task is cancelled or a handle is
/// dropped.
#[derive(Debug)]
pub(super) struct GroupGuard {
    pgid: Option<Pid>,
    contain: Option<Arc<Containment>>,
}

impl GroupGuard {
    pub(super) fn new(pgid: Option<Pid>, contain: Option<&Arc<Containment>>) -> Self {
        let contain = contain.filter(|_| pgid.is_some()).cloned();
        if let (Some(c), Some(pgid)) = (&contain, pgid) {
            c.track(pgid);
        }
        Self { pgid, contain }
    }

    /// The group was dealt with; dropping the guard does nothing.
    pub(super) fn disarm(&mut self) {
        if let (Some(pgid), Some(c)) = (self.pgid.take(), self.contain.take()) {
            c.untrack(pgid);
        }
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pgid) = self.pgid {
            let _ = signal_group(pgid, Signal::SIGKILL);
        }
        self.disarm();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_path_encodes_ids_unambiguously() {
        let dir = Path::new("/state");
        assert_eq!(
            log_path(dir, "mcp_server/fs"),
            Path::new("/state/logs/mcp_server%2Ffs.log")
        );
        assert_ne!(log_path(dir, "a/b"), log_path(dir, "a_b"));
        assert_ne!(log_path(dir, "a.b"), log_path(dir, "a/b"));
        assert_eq!(log_path(dir, ".."), Path::new("/state/logs/%2E%2E.log"));
        assert_eq!(log_path(dir, ""), Path::new("/state/logs/%.log"));
    }

    proptest::proptest! {
        #[test]
        fn log_path_stays_in_the_log_dir(id in ".{0,64}") {
            let p = log_path(Path::new("/state"), &id);
            proptest::prop_assert_eq!(p.parent(), Some(Path::new("/state/logs")));
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            proptest::prop_assert!(name.ends_with(".log"));
            proptest::prop_assert!(!name.contains('/'));
        }
    }

    #[test]
    fn runnable_looks_programs_up_as_execvp_does() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).expect("bin");
        let exe = bin.join("tool");
        std::fs::write(&exe, "#!/bin/sh\n").expect("write");
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).expect("mode");
        std::fs::write(bin.join("plain"), "").expect("write");
        let path = Some(bin.display().to_string());
        let kind = |program: &str, path: Option<&String>| {
            runnable(program, path, dir.path()).map_err(|e| e.kind())
        };
        assert_eq!(kind("tool", path.as_ref()), Ok(()));
        assert_eq!(
            kind("bin/tool", None),
            Ok(()),
            "a path is relative to `cwd`"
        );
        assert_eq!(
            kind("tool", None),
            Err(io::ErrorKind::NotFound),
            "not on the default path"
        );
        assert_eq!(
            kind("plain", path.as_ref()),
            Err(io::ErrorKind::PermissionDenied)
        );
        assert_eq!(
            kind("bin", Some(&dir.path().display().to_string())),
            Err(io::ErrorKind::PermissionDenied)
        );
        assert_eq!(kind("", path.as_ref()), Err(io::ErrorKind::NotFound));
        assert_eq!(kind("sh", None), Ok(()));
    }

    #[test]
    fn oversized_logs_are_rotated_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("logs").join("x.log");
        let rotated = dir.path().join("logs").join("x.log.1");
        drop(open_log(&path, 4).expect("creates dirs and file"));
        std::fs::write(&path, b"12345").expect("write");
        drop(open_log(&path, 10).expect("below the limit"));
        assert!(!rotated.exists());
        drop(open_log(&path, 4).expect("rotates"));
        assert_eq!(std::fs::read(&rotated).expect("rotated"), b"12345");
        assert_eq!(std::fs::metadata(&path).expect("fresh").len(), 0);
    }

    #[test]
    fn env_is_essentials_plus_declared() {
        let parent = |k: &str| match k {
            "PATH" => Some("/bin".to_string()),
            "HOME" => Some("/home/u".to_string()),
            "SECRET" => Some("leak".to_string()),
            _ => None,
        };
        let declared = BTreeMap::from([
            ("HOME".to_string(), "/override".to_string()),
            ("A".to_string(), "1".to_string()),
        ]);
        let env = child_env(&declared, parent);
        assert_eq!(
            env,
            BTreeMap::from([
                ("A".to_string(), "1".to_string()),
                ("HOME".to_string(), "/override".to_string()),
                ("PATH".to_string(), "/bin".to_string()),
            ])
        );
    }
}
