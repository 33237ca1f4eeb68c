//! Children in a pseudo-terminal (`portable-pty`): the agent CLIs that
//! panes host. A PTY child gets the same cleared environment as every other
//! child (essentials plus its declared `env`), its own session and process
//! group (`setsid`, with the PTY as controlling terminal), and is recorded
//! with the supervisor's containment, so its whole tree dies with npc; when
//! npc dies the master side closes and the kernel hangs the session up too.
//! With a containment that has PID namespaces, the child is the stub with
//! `--tty` (see [`pidns`]): the program is the session leader inside a
//! namespace of its own, so what it starts ends with it even after `setsid`.
//!
//! The caller gets the blocking halves: a reader (for a dedicated reader
//! thread), a writer, the master for resizing, and a waiter that blocks
//! until the child exits and then kills whatever it left in its group.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::Arc;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use portable_pty::{CommandBuilder, MasterPty, PtySize, native_pty_system};

use super::contain::Containment;
use super::pidns;
use super::spawn::{
    GroupGuard, PROGRAM_PID_LIMIT, Signals, child_env, kill_leftovers, runnable, signal_group,
};
use super::{SupervisorError, lock};

/// `TERM` of a PTY child when its declared environment sets none.
pub const PTY_TERM: &str = "xterm-256color";

/// What to run in a PTY.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PtySpec {
    pub program: String,
    pub args: Vec<String>,
    /// Declared environment (added to the essentials of a cleared environment).
    pub env: BTreeMap<String, String>,
    pub cwd: PathBuf,
    pub rows: u16,
    pub cols: u16,
}

pub use crate::event::PtyExit;

impl std::fmt::Display for PtyExit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.signal, self.code) {
            (Some(s), _) => write!(f, "killed by {s}"),
            (None, Some(c)) => write!(f, "exit code {c}"),
            (None, None) => f.write_str("unknown exit status"),
        }
    }
}

/// The master side of a PTY child, for resizing and signalling.
pub struct PtyControl {
    master: std::sync::Mutex<Box<dyn MasterPty + Send>>,
    pgid: Option<Pid>,
    /// How a signal reaches the program's group: directly (`pgid` is the
    /// program's), or queued to the stub (`pgid` is the stub's), which
    /// passes it on to the program's group.
    signals: Signals,
    /// Set once the child is reaped: its group id may then name another
    /// group (pids are reused), so nothing is sent to it any more.
    reaped: Arc<AtomicBool>,
}

impl std::fmt::Debug for PtyControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PtyControl")
            .field("pgid", &self.pgid)
            .finish_non_exhaustive()
    }
}

impl PtyControl {
    /// Set the terminal size (the child gets SIGWINCH).
    pub fn resize(&self, rows: u16, cols: u16) -> std::io::Result<()> {
        lock(&self.master)
            .resize(PtySize {
                rows,
                cols,
                pixel_width: 0,
                pixel_height: 0,
            })
            .map_err(std::io::Error::other)
    }

    /// Signal the child's whole process group (no-op once it is reaped: a
    /// pane closed long after its process ended must not hang up whatever
    /// group has its number by then).
    pub fn signal(&self, signal: Signal) {
        if let Some(pgid) = self.pgid.filter(|_| !self.reaped.load(Ordering::SeqCst)) {
            // SIGKILL to the stub's group ends its namespace, and with it
            // every process of the pane.
            let _ = match self.signals {
                Signals::Stub if signal != Signal::SIGKILL => pidns::queue_signal(pgid, signal),
                Signals::Direct | Signals::Stub => signal_group(pgid, signal),
            };
        }
    }
}

/// Blocks until the child exits; see [`PtyWaiter::wait`].
pub struct PtyWaiter {
    child: Box<dyn portable_pty::Child + Send + Sync>,
    pgid: Option<Pid>,
    guard: GroupGuard,
    /// Shared with [`PtyControl`].
    reaped: Arc<AtomicBool>,
}

impl std::fmt::Debug for PtyWaiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PtyWaiter")
            .field("pgid", &self.pgid)
            .finish_non_exhaustive()
    }
}

impl PtyWaiter {
    /// Wait (blocking) for the child to exit, then kill what it left in its
    /// group and forget the group.
    pub fn wait(mut self) -> PtyExit {
        let status = self.child.wait();
        if let Some(pgid) = self.pgid {
            kill_leftovers(pgid);
        }
        self.reaped.store(true, Ordering::SeqCst);
        self.guard.disarm();
        match status {
            Ok(s) => PtyExit {
                code: s.signal().is_none().then(|| s.exit_code()),
                signal: s.signal().map(str::to_string),
            },
            Err(_) => PtyExit {
                code: None,
                signal: None,
            },
        }
    }
}

/// A child running in a PTY, split into its parts.
pub struct PtyProcess {
    pub pid: u32,
    /// The child's output (blocking reads; ends when every holder of the
    /// slave side is gone).
    pub reader: Box<dyn Read + Send>,
    /// The child's input.
    pub writer: Box<dyn Write + Send>,
    pub control: Arc<PtyControl>,
    pub waiter: PtyWaiter,
}

impl std::fmt::Debug for PtyProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PtyProcess")
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

fn pty_error(spec: &PtySpec, e: impl std::fmt::Display) -> SupervisorError {
    SupervisorError::Spawn {
        id: spec.program.clone(),
        program: spec.program.clone(),
        source: std::io::Error::other(e.to_string()),
    }
}

/// See `Supervisor::spawn_pty`.
pub(super) fn spawn_pty(
    spec: &PtySpec,
    contain: Option<&Arc<Containment>>,
) -> Result<PtyProcess, SupervisorError> {
    if !spec.cwd.is_dir() {
        return Err(SupervisorError::Cwd {
            id: spec.program.clone(),
            cwd: spec.cwd.clone(),
        });
    }
    let pair = native_pty_system()
        .openpty(PtySize {
            rows: spec.rows,
            cols: spec.cols,
            pixel_width: 0,
            pixel_height: 0,
        })
        .map_err(|e| pty_error(spec, e))?;
    let mut env = child_env(&spec.env, |k| std::env::var(k).ok());
    env.entry("TERM".to_string())
        .or_insert_with(|| PTY_TERM.to_string());
    let stub = contain.and_then(|c| c.stub());
    let mut cmd = match stub {
        Some(stub) => {
            // What the program's spawn would have said is said here.
            runnable(&spec.program, env.get("PATH"), &spec.cwd).map_err(|e| pty_error(spec, e))?;
            let mut cmd = CommandBuilder::new(stub);
            cmd.args([pidns::CONTAIN_COMMAND, pidns::TTY_FLAG, "--"]);
            cmd.arg(&spec.program);
            cmd
        }
        None => CommandBuilder::new(&spec.program),
    };
    cmd.args(&spec.args);
    cmd.env_clear();
    for (k, v) in &env {
        cmd.env(k, v);
    }
    cmd.cwd(&spec.cwd);
    let child = pair
        .slave
        .spawn_command(cmd)
        .map_err(|e| pty_error(spec, e))?;
    // Only the child keeps the slave side: reads end when it is gone.
    drop(pair.slave);
    let mut child = child;
    let own = child.process_id().unwrap_or_default();
    // `setsid` in the child made it a session and group leader.
    let pgid = i32::try_from(own)
        .ok()
        .filter(|p| *p > 0)
        .map(Pid::from_raw);
    let guard = GroupGuard::new(pgid, contain);
    let (pid, signals) = match (stub, pgid) {
        (Some(program), Some(stub)) => (
            session_of_program(pair.master.as_ref(), stub, program, child.as_mut()).unwrap_or(own),
            Signals::Stub,
        ),
        _ => (own, Signals::Direct),
    };
    let reader = pair
        .master
        .try_clone_reader()
        .map_err(|e| pty_error(spec, e))?;
    let writer = pair.master.take_writer().map_err(|e| pty_error(spec, e))?;
    let reaped = Arc::new(AtomicBool::new(false));
    Ok(PtyProcess {
        pid,
        reader,
        writer,
        control: Arc::new(PtyControl {
            master: std::sync::Mutex::new(pair.master),
            pgid,
            signals,
            reaped: reaped.clone(),
        }),
        waiter: PtyWaiter {
            child,
            pgid,
            guard,
            reaped,
        },
    })
}

/// First pause while waiting for a contained program to take its terminal.
const SESSION_POLL_MIN: Duration = Duration::from_millis(1);
/// Longest pause while waiting for a contained program to take its terminal.
const SESSION_POLL_MAX: Duration = Duration::from_millis(20);

/// The pid of the program the stub `stub` runs on the terminal of `master`:
/// the program becomes the session leader of the terminal (see
/// [`pidns::TTY_FLAG`]), and the session the master reports (`TIOCGSID`) is
/// named in this process's PID namespace. `None` when the stub ends first,
/// runs the program itself (it could not create a namespace: its executable
/// is no longer `stub_exe`), or the program does not take the terminal
/// within [`PROGRAM_PID_LIMIT`].
#[allow(unsafe_code)]
fn session_of_program(
    master: &(dyn MasterPty + Send),
    stub: Pid,
    stub_exe: &std::path::Path,
    child: &mut (dyn portable_pty::Child + Send + Sync),
) -> Option<u32> {
    let exe = format!("/proc/{stub}/exe");
    let stub_exe = std::fs::canonicalize(stub_exe).unwrap_or_else(|_| stub_exe.to_path_buf());
    let fd = master.as_raw_fd()?;
    let deadline = Instant::now() + PROGRAM_PID_LIMIT;
    let mut pause = SESSION_POLL_MIN;
    loop {
        let mut sid: nix::libc::pid_t = 0;
        // SAFETY: `TIOCGSID` writes one `pid_t` to the pointer given.
        let rc = unsafe { nix::libc::ioctl(fd, nix::libc::TIOCGSID, &raw mut sid) };
        if rc == 0 && sid > 0 && sid != stub.as_raw() {
            return u32::try_from(sid).ok();
        }
        let replaced = rc == 0
            && sid == stub.as_raw()
            && std::fs::read_link(&exe).is_ok_and(|p| p != stub_exe);
        if replaced || !matches!(child.try_wait(), Ok(None)) || Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(SESSION_POLL_MAX);
    }
}
