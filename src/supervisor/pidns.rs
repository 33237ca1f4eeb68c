//! A PID namespace per child: what leaves a child's process group
//! (`setsid`, a double fork, `nohup`, `disown`) still dies with it. A
//! contained child runs as the `npc` binary with `__contain -- PROGRAM ARGS…`
//! ([`CONTAIN_COMMAND`]). The stub moves its children into a new PID
//! namespace (inside a user namespace that maps the caller's own ids when
//! it may not create one otherwise) and forks the namespace's pid 1, which
//! forks and execs the program. When the program ends, pid 1 exits with its
//! status and the kernel kills everything left in the namespace. Pid 1 dies
//! with the stub and the stub with its supervisor (`PR_SET_PDEATHSIG`), so a
//! supervisor killed with SIGKILL takes every namespace with it.
//!
//! Signals: the stub, pid 1 and the program share the process group npc
//! signals, so a signal to the group reaches the program directly; the two
//! stub processes block every signal and drop what reaches them that way.
//! A signal queued to the stub alone with `sigqueue` (`SI_QUEUE`, what
//! `Supervisor::signal` sends) is passed on to the program. The stub ends as
//! the program did: the same exit code, or killed by the same signal.
//!
//! The program's pid: with [`REPORT_FLAG`] (a long-lived component), the
//! program's process sends one message on the given socket just before its
//! `exec`; the supervisor's end has `SO_PASSCRED`, so the kernel names the
//! sender's pid in the supervisor's namespace. With [`TTY_FLAG`] (a pane),
//! the stub, session leader on the terminal, gives it up (`TIOCNOTTY`) and
//! the program's process takes it (`setsid`, `TIOCSCTTY`): a job-control
//! shell then owns its session and groups inside the namespace, and the
//! terminal's session (`TIOCGSID` on the master) is the program's pid;
//! queued signals go to the program's group.
//!
//! Inside, `$$` and `getpid()` are namespace pids; `/proc` is the host's, so
//! `/proc/self/stat` names the host pid. Where namespaces cannot be created
//! ([`probe`] says why), or `NPC_PID_NAMESPACES=off` is set, children are
//! spawned directly and contained by their process group and the watchdog
//! only.

use std::ffi::{OsStr, OsString};
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, ExitCode, Stdio};

use nix::errno::Errno;
use nix::sched::{CloneFlags, unshare};
use nix::sys::signal::{Signal, kill};
use nix::sys::signalfd::{SfdFlags, SigSet, SignalFd};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, fork, getpid};

use super::sandbox::{self, SANDBOX_ENV, SANDBOX_FLAG, SANDBOX_PROBE_FLAG, SandboxSpec};

/// The hidden `npc` subcommand that runs a program in a PID namespace.
pub const CONTAIN_COMMAND: &str = "__contain";
/// The stub's flag that only checks whether a namespace can be created.
pub const PROBE_FLAG: &str = "--probe";
/// The stub's option naming the descriptor of a socket on which the
/// program's process reports itself before its `exec` (see [`report_pid`]).
pub const REPORT_FLAG: &str = "--report";
/// The stub's flag for a program on a terminal: the program becomes the
/// session leader with the terminal as its controlling terminal, as a
/// program a terminal emulator starts is (see [`take_terminal`]).
pub const TTY_FLAG: &str = "--tty";
/// The environment variable that, set to [`OFF`], turns PID namespaces off
/// for a supervising process (the fallback: process groups and the watchdog).
pub const NAMESPACES_ENV: &str = "NPC_PID_NAMESPACES";
/// The value of [`NAMESPACES_ENV`] that turns namespaces off.
pub const OFF: &str = "off";
/// Exit code when the program is not found (as a shell does).
const NOT_FOUND: u8 = 127;
/// Exit code when the program is found but cannot be run, or the namespace
/// cannot be set up after it was created.
const CANNOT_RUN: u8 = 126;
/// Exit code offset for a death by signal that cannot be reproduced.
const SIGNAL_BASE: i32 = 128;
/// Longest explanation the probe's stderr contributes to a warning.
const MAX_PROBE_REASON: usize = 512;

/// How the program ended, as pid 1 reports it to the stub: one byte of
/// kind and one of value on a pipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    Code(u8),
    Signal(u8),
}

impl Ended {
    fn from_status(status: WaitStatus) -> Option<Self> {
        match status {
            WaitStatus::Exited(_, code) => Some(Self::Code(u8::try_from(code & 0xff).ok()?)),
            WaitStatus::Signaled(_, signal, _) => {
                Some(Self::Signal(u8::try_from(signal as i32).ok()?))
            }
            _ => None,
        }
    }

    fn bytes(self) -> [u8; 2] {
        match self {
            Self::Code(c) => [0, c],
            Self::Signal(s) => [1, s],
        }
    }

    fn parse(bytes: &[u8]) -> Option<Self> {
        match bytes {
            [0, c] => Some(Self::Code(*c)),
            [1, s] => Some(Self::Signal(*s)),
            _ => None,
        }
    }
}

/// Run the stub when `args` (the whole command line) is the `npc` binary with `__contain …`;
/// `None` for any other command line. Call it first thing in `main`: the
/// stub must be single-threaded to create a user namespace and to fork.
pub fn stub_main(args: &[OsString]) -> Option<ExitCode> {
    if args.get(1).map(OsString::as_os_str) != Some(OsStr::new(CONTAIN_COMMAND)) {
        return None;
    }
    Some(match args.get(2).and_then(|a| a.to_str()) {
        Some(SANDBOX_PROBE_FLAG) => match enter_sandboxed(false)
            .and_then(|()| sandbox::protect(&SandboxSpec::default()).map_err(|e| e.to_string()))
            .and_then(|()| sandbox::landlock_available())
            .and_then(|()| probe_fork())
        {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        },
        Some(PROBE_FLAG) => match enter()
            .map_err(|e| e.to_string())
            .and_then(|()| probe_fork())
        {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        },
        _ => match Options::parse(&args[2..]) {
            Some((options, program, rest)) => run(options, program, rest),
            None => {
                eprintln!(
                    "usage: npc {CONTAIN_COMMAND} [{REPORT_FLAG} FD] [{TTY_FLAG}] -- PROGRAM [ARGS…]"
                );
                ExitCode::from(2)
            }
        },
    })
}

/// The stub's options, before `--`.
#[derive(Debug, Default)]
struct Options {
    /// The socket to send one message on from the program's process just
    /// before its `exec` ([`REPORT_FLAG`]).
    report: Option<OwnedFd>,
    /// The program runs on a terminal (a pane) as its session leader
    /// ([`TTY_FLAG`]).
    tty: bool,
    /// The program runs in a sandbox ([`SANDBOX_FLAG`]).
    sandbox: Option<SandboxSpec>,
}

impl Options {
    /// The options, the program and its arguments of `args` (what follows
    /// [`CONTAIN_COMMAND`]); `None` for a malformed command line.
    #[allow(unsafe_code)]
    fn parse(args: &[OsString]) -> Option<(Self, &OsString, &[OsString])> {
        let mut options = Self::default();
        let mut rest = args;
        loop {
            match rest.first()?.to_str() {
                Some("--") => break,
                Some(REPORT_FLAG) => {
                    let fd: std::os::fd::RawFd = rest.get(1)?.to_str()?.parse().ok()?;
                    // Only descriptors the supervisor handed over: not the
                    // standard streams, and open.
                    if fd <= 2
                        || nix::fcntl::fcntl(fd_ref(fd)?, nix::fcntl::FcntlArg::F_GETFD).is_err()
                    {
                        return None;
                    }
                    // SAFETY: the descriptor is open (checked above) and
                    // nothing else in this process owns it.
                    let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
                    // The program must not inherit it.
                    let _ = nix::fcntl::fcntl(
                        &fd,
                        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
                    );
                    options.report = Some(fd);
                    rest = &rest[2..];
                }
                Some(TTY_FLAG) => {
                    options.tty = true;
                    rest = &rest[1..];
                }
                Some(SANDBOX_FLAG) => {
                    options.sandbox = Some(SandboxSpec::from_arg(rest.get(1)?)?);
                    rest = &rest[2..];
                }
                _ => return None,
            }
        }
        let program = rest.get(1)?;
        Some((options, program, &rest[2..]))
    }
}

/// A borrowed view of descriptor `fd` (a number from the command line).
#[allow(unsafe_code)]
fn fd_ref(fd: std::os::fd::RawFd) -> Option<std::os::fd::BorrowedFd<'static>> {
    // SAFETY: only used for `fcntl(F_GETFD)`, which fails cleanly on a
    // descriptor that is not open.
    (fd >= 0).then(|| unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) })
}

/// Tell the supervisor, on `report`, which process is about to `exec` the
/// program: the kernel attaches this process's credentials to the message
/// and translates its pid into the receiver's PID namespace (the receiving
/// socket has `SO_PASSCRED`), so the supervisor learns the program's pid in
/// its own namespace.
fn report_pid(report: Option<&OwnedFd>) {
    if let Some(fd) = report {
        let _ = nix::unistd::write(fd, &[1]);
    }
}

/// Whether this process can run children in PID namespaces; `Err` says why
/// not. Runs `program` (the `npc` binary) with [`PROBE_FLAG`].
pub fn probe(program: &Path) -> Result<(), String> {
    if std::env::var(NAMESPACES_ENV).is_ok_and(|v| v == OFF) {
        return Err(format!("turned off by `{NAMESPACES_ENV}={OFF}`"));
    }
    run_probe(program, PROBE_FLAG)
}

/// Whether this process can run children in a sandbox (user, PID and
/// network namespaces and Landlock); `Err` says why not. `NPC_SANDBOX=off`
/// answers "not here" (the test seam for a kernel without them).
pub fn probe_sandbox(program: &Path) -> Result<(), String> {
    if std::env::var(SANDBOX_ENV).is_ok_and(|v| v == OFF) {
        return Err(format!("turned off by `{SANDBOX_ENV}={OFF}`"));
    }
    probe(program)?;
    run_probe(program, SANDBOX_PROBE_FLAG)
}

/// Run `program __contain FLAG` in an empty environment: `Ok` when it
/// succeeds, else what it said (at most [`MAX_PROBE_REASON`] characters)
/// or how it ended.
fn run_probe(program: &Path, flag: &str) -> Result<(), String> {
    let out = Command::new(program)
        .args([CONTAIN_COMMAND, flag])
        .env_clear()
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| format!("cannot run `{}`: {e}", program.display()))?;
    if out.status.success() {
        return Ok(());
    }
    let reason = String::from_utf8_lossy(&out.stderr);
    let reason: String = reason.trim().chars().take(MAX_PROBE_REASON).collect();
    Err(if reason.is_empty() {
        format!("the probe ended with {}", out.status)
    } else {
        reason
    })
}

/// [`probe_sandbox`], once per process.
pub fn probe_sandbox_once(program: &Path) -> Result<(), String> {
    static PROBED: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    PROBED.get_or_init(|| probe_sandbox(program)).clone()
}

/// [`probe`], once per process: every supervisor of a process shares the
/// answer (the binary and the kernel do not change while it runs).
pub(super) fn probe_once(program: &Path) -> Result<(), String> {
    static PROBED: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    PROBED.get_or_init(|| probe(program)).clone()
}

/// Queue `signal` to the stub `pid` with `sigqueue`, so the stub passes it
/// on to its program (a plain `kill` is taken for a group signal and dropped).
#[allow(unsafe_code)]
pub(super) fn queue_signal(pid: Pid, signal: Signal) -> nix::Result<()> {
    let value = nix::libc::sigval {
        sival_ptr: std::ptr::null_mut(),
    };
    // SAFETY: `sigqueue` only reads its plain-value arguments.
    let rc = unsafe { nix::libc::sigqueue(pid.as_raw(), signal as i32, value) };
    Errno::result(rc).map(drop)
}

/// Why no namespace was entered.
#[derive(Debug)]
enum EnterError {
    /// Nothing changed: the program can run without a namespace.
    Refused(String),
    /// A user namespace was created but its ids cannot be mapped.
    Unmapped(String),
}

impl std::fmt::Display for EnterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Refused(why) | Self::Unmapped(why) => f.write_str(why),
        }
    }
}

/// Move this process's future children into a new PID namespace: directly
/// when allowed, else inside a new user namespace mapping our own ids.
fn enter() -> Result<(), EnterError> {
    let Err(direct) = unshare(CloneFlags::CLONE_NEWPID) else {
        return Ok(());
    };
    let (uid, gid) = (nix::unistd::getuid(), nix::unistd::getgid());
    unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWPID).map_err(|e| {
        EnterError::Refused(format!(
            "cannot create a PID namespace ({direct}) nor a user namespace with one ({e}); allow unprivileged user namespaces (`sysctl user.max_user_namespaces`, `kernel.unprivileged_userns_clone=1`) or give npc `CAP_SYS_ADMIN`"
        ))
    })?;
    // Our own ids map to themselves: the program runs as the same user.
    let write = |file: &str, text: String| {
        std::fs::write(format!("/proc/self/{file}"), text)
            .map_err(|e| EnterError::Unmapped(format!("cannot write `/proc/self/{file}`: {e}")))
    };
    write("setgroups", "deny".into())?;
    write("uid_map", format!("{uid} {uid} 1\n"))?;
    write("gid_map", format!("{gid} {gid} 1\n"))
}

/// Move this process's future children into new user and PID namespaces
/// (a user namespace always, so nothing inside holds a capability outside
/// it), this process into a mount namespace of its own (where npc's state
/// is bound read-only, [`sandbox::protect`]) and, with `network`, a
/// network namespace with only loopback.
fn enter_sandboxed(network: bool) -> Result<(), String> {
    let (uid, gid) = (nix::unistd::getuid(), nix::unistd::getgid());
    let mut flags = CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWPID | CloneFlags::CLONE_NEWNS;
    if network {
        flags |= CloneFlags::CLONE_NEWNET;
    }
    unshare(flags).map_err(|e| {
        format!("cannot create the sandbox's user, PID and mount namespaces ({e}); allow unprivileged user namespaces (`sysctl user.max_user_namespaces`, `kernel.unprivileged_userns_clone=1`) or set `sandbox = \"off\"`")
    })?;
    let write = |file: &str, text: String| {
        std::fs::write(format!("/proc/self/{file}"), text)
            .map_err(|e| format!("cannot write `/proc/self/{file}`: {e}"))
    };
    write("setgroups", "deny".into())?;
    write("uid_map", format!("{uid} {uid} 1\n"))?;
    write("gid_map", format!("{gid} {gid} 1\n"))?;
    if network {
        sandbox::loopback_up().map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Fork once into the new namespace and wait: namespaces that can be
/// created but not entered (a nesting limit) fail here.
#[allow(unsafe_code)]
fn probe_fork() -> Result<(), String> {
    // SAFETY: the stub is single-threaded; the child only exits.
    match unsafe { fork() } {
        Ok(ForkResult::Child) => std::process::exit(0),
        Ok(ForkResult::Parent { child }) => match waitpid(child, None) {
            Ok(WaitStatus::Exited(_, 0)) => Ok(()),
            other => Err(format!(
                "a process in a new PID namespace ended with {other:?}"
            )),
        },
        Err(e) => Err(format!("cannot fork into a new PID namespace: {e}")),
    }
}

/// The stub: block every signal, enter a namespace, fork its pid 1, wait for
/// it and end as the program did. Without a namespace, exec the program.
#[allow(unsafe_code)]
fn run(options: Options, program: &OsString, args: &[OsString]) -> ExitCode {
    if let Some(spec) = &options.sandbox {
        // A sandbox is never skipped: without it the program does not run.
        let applied = SigSet::all()
            .thread_block()
            .map_err(|e| e.to_string())
            .and_then(|()| enter_sandboxed(spec.egress.is_some()))
            .and_then(|()| sandbox::protect(spec).map_err(|e| e.to_string()))
            .and_then(|()| sandbox::restrict(spec).map_err(|e| e.to_string()));
        if let Err(why) = applied {
            eprintln!("npc: sandbox: {why}");
            return ExitCode::from(CANNOT_RUN);
        }
    } else if SigSet::all().thread_block().is_err() {
        report_pid(options.report.as_ref());
        exec(program, args);
    }
    match options.sandbox.as_ref().map_or_else(enter, |_| Ok(())) {
        Ok(()) => {}
        Err(EnterError::Refused(_)) => {
            report_pid(options.report.as_ref());
            exec(program, args)
        }
        Err(EnterError::Unmapped(why)) => {
            eprintln!("npc: {why}");
            return ExitCode::from(CANNOT_RUN);
        }
    }
    if options.tty {
        give_up_terminal();
    }
    let Ok((report_read, report_write)) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) else {
        return ExitCode::from(CANNOT_RUN);
    };
    // SAFETY: the stub is single-threaded (it runs first thing in `main`).
    match unsafe { fork() } {
        Ok(ForkResult::Child) => {
            drop(report_read);
            namespace_init(report_write, options, program, args)
        }
        Ok(ForkResult::Parent { child }) => {
            drop(report_write);
            drop(options.report);
            let _ = let_go_of_stdio();
            outer(child, report_read)
        }
        Err(e) => {
            eprintln!("npc: cannot fork into a PID namespace: {e}");
            ExitCode::from(CANNOT_RUN)
        }
    }
}

/// The stub, session leader on a terminal: give the terminal up so that the
/// program can take it (its SIGHUP and SIGCONT to the stub's group are
/// blocked and dropped).
#[allow(unsafe_code)]
fn give_up_terminal() {
    // SAFETY: `TIOCNOTTY` takes no argument.
    let _ = unsafe { nix::libc::ioctl(0, nix::libc::TIOCNOTTY) };
}

/// The program's process before its `exec` on a terminal: a session of its
/// own, with the terminal (its stdin) as controlling terminal, so that a
/// shell does job control as under a terminal emulator.
#[allow(unsafe_code)]
fn take_terminal() {
    let _ = nix::unistd::setsid();
    // SAFETY: `TIOCSCTTY` takes an int (0: do not steal the terminal).
    if unsafe { nix::libc::ioctl(0, nix::libc::TIOCSCTTY, 0) } == -1 {
        eprintln!(
            "npc: cannot make the terminal the controlling terminal: {}",
            io::Error::last_os_error()
        );
    }
}

/// Replace this process with the program, with no signal blocked and
/// SIGPIPE at its default (Rust ignores it) as any child of npc starts; on
/// failure, say why and exit as a shell would.
#[allow(unsafe_code)]
fn exec(program: &OsString, args: &[OsString]) -> ! {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, sigaction};
    let default = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
    // SAFETY: restores the default disposition; no handler is installed.
    let _ = unsafe { sigaction(Signal::SIGPIPE, &default) };
    let _ = SigSet::all().thread_unblock();
    let err = Command::new(program).args(args).exec();
    eprintln!("npc: cannot run `{}`: {err}", program.to_string_lossy());
    let code = if err.kind() == io::ErrorKind::NotFound {
        NOT_FOUND
    } else {
        CANNOT_RUN
    };
    std::process::exit(i32::from(code))
}

/// Put `/dev/null` on this process's standard streams, so the program's
/// pipes end when the program's processes close them, as without the stub.
fn let_go_of_stdio() -> io::Result<()> {
    let null = std::fs::File::options()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    nix::unistd::dup2_stdin(&null)?;
    nix::unistd::dup2_stdout(&null)?;
    nix::unistd::dup2_stderr(&null)?;
    Ok(())
}

fn signals() -> Option<SignalFd> {
    SignalFd::with_flags(&SigSet::all(), SfdFlags::SFD_CLOEXEC).ok()
}

/// Whether a signal read from a signalfd was queued with `sigqueue`.
fn queued(info: &nix::sys::signalfd::siginfo) -> bool {
    info.ssi_code == nix::libc::SI_QUEUE
}

/// Pid 1 of the namespace: dies with the stub, runs the program as its
/// child, reaps what is orphaned into it, passes queued signals on, and
/// when the program ends reports how and exits (the kernel then kills
/// everything left in the namespace).
#[allow(unsafe_code)]
fn namespace_init(
    report: OwnedFd,
    options: Options,
    program: &OsString,
    args: &[OsString],
) -> ExitCode {
    let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL);
    // The stub may have died before the line above: its read end is closed then.
    let mut poll = [nix::poll::PollFd::new(
        std::os::fd::AsFd::as_fd(&report),
        nix::poll::PollFlags::empty(),
    )];
    let gone = nix::poll::poll(&mut poll, nix::poll::PollTimeout::ZERO).is_ok()
        && poll[0]
            .revents()
            .is_some_and(|r| r.contains(nix::poll::PollFlags::POLLERR));
    let Some(signals) = signals().filter(|_| !gone) else {
        return ExitCode::from(CANNOT_RUN);
    };
    if let Some(egress) = options.sandbox.as_ref().and_then(|s| s.egress.as_ref()) {
        let listener = match sandbox::listen(egress.port) {
            Ok(listener) => listener,
            Err(e) => {
                eprintln!("npc: sandbox: {e}");
                return ExitCode::from(CANNOT_RUN);
            }
        };
        // SAFETY: pid 1 is single-threaded.
        match unsafe { fork() } {
            Ok(ForkResult::Child) => {
                drop(signals);
                drop(report);
                let _ = let_go_of_stdio();
                sandbox::forward(listener, &egress.socket)
            }
            Ok(ForkResult::Parent { .. }) => drop(listener),
            Err(_) => return ExitCode::from(CANNOT_RUN),
        }
    }
    // SAFETY: pid 1 is single-threaded.
    let program_pid = match unsafe { fork() } {
        Ok(ForkResult::Child) => {
            drop(signals);
            drop(report);
            if options.tty {
                take_terminal();
            }
            report_pid(options.report.as_ref());
            exec(program, args)
        }
        Ok(ForkResult::Parent { child }) => child,
        Err(_) => return ExitCode::from(CANNOT_RUN),
    };
    drop(options.report);
    let _ = let_go_of_stdio();
    loop {
        let info = match signals.read_signal() {
            Ok(Some(info)) => info,
            Ok(None) | Err(Errno::EINTR) => continue,
            // Nothing can be waited for any more: end the namespace.
            Err(_) => return ExitCode::from(CANNOT_RUN),
        };
        let Ok(signal) = Signal::try_from(i32::try_from(info.ssi_signo).unwrap_or(0)) else {
            continue;
        };
        if signal != Signal::SIGCHLD {
            if queued(&info) {
                // On a terminal, to the program's group, as to a pane's
                // group without the stub.
                let _ = if options.tty {
                    nix::sys::signal::killpg(program_pid, signal)
                } else {
                    kill(program_pid, signal)
                };
            }
            continue;
        }
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(status) if status.pid() == Some(program_pid) => {
                    if let Some(ended) = Ended::from_status(status) {
                        let _ = std::fs::File::from(report).write_all(&ended.bytes());
                    }
                    return ExitCode::SUCCESS;
                }
                Ok(_) => {}
            }
        }
    }
}

/// The stub's part after the fork: wait for pid 1, pass queued signals on to
/// it, and end as the program did.
fn outer(init: Pid, report: OwnedFd) -> ExitCode {
    let Some(signals) = signals() else {
        let _ = kill(init, Signal::SIGKILL);
        return ExitCode::from(CANNOT_RUN);
    };
    let status = loop {
        let info = match signals.read_signal() {
            Ok(Some(info)) => info,
            Ok(None) | Err(Errno::EINTR) => continue,
            Err(_) => break waitpid(init, None).ok(),
        };
        let Ok(signal) = Signal::try_from(i32::try_from(info.ssi_signo).unwrap_or(0)) else {
            continue;
        };
        if signal != Signal::SIGCHLD {
            if queued(&info) {
                let _ = queue_signal(init, signal);
            }
            continue;
        }
        match waitpid(init, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => {}
            Ok(status) => break Some(status),
            Err(_) => break None,
        }
    };
    let mut bytes = Vec::new();
    let _ = std::fs::File::from(report).read_to_end(&mut bytes);
    let ended = Ended::parse(&bytes).or_else(|| status.and_then(Ended::from_status));
    match ended {
        Some(Ended::Code(c)) => ExitCode::from(c),
        Some(Ended::Signal(s)) => die_by(s),
        None => ExitCode::from(CANNOT_RUN),
    }
}

/// End this process by signal `number` (without a core dump), as the program
/// did; a signal that does not end it leaves the shell's code `128 + number`.
#[allow(unsafe_code)]
fn die_by(number: u8) -> ExitCode {
    use nix::sys::resource::{Resource, setrlimit};
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, sigaction};
    if let Ok(signal) = Signal::try_from(i32::from(number)) {
        let _ = setrlimit(Resource::RLIMIT_CORE, 0, 0);
        let default = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
        // SAFETY: restores the default disposition; no handler is installed.
        let _ = unsafe { sigaction(signal, &default) };
        let _ = kill(getpid(), signal);
        let mut one = SigSet::empty();
        one.add(signal);
        let _ = one.thread_unblock();
    }
    ExitCode::from(u8::try_from(SIGNAL_BASE + i32::from(number)).unwrap_or(CANNOT_RUN))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endings_round_trip_through_their_bytes() {
        for ended in [Ended::Code(0), Ended::Code(255), Ended::Signal(15)] {
            assert_eq!(Ended::parse(&ended.bytes()), Some(ended));
        }
        assert_eq!(Ended::parse(&[]), None);
        assert_eq!(Ended::parse(&[2, 0]), None);
        assert_eq!(Ended::parse(&[0, 1, 2]), None);
    }

    #[test]
    fn the_stub_takes_only_well_formed_options() {
        use std::os::fd::IntoRawFd;
        let args = |a: &[&str]| a.iter().map(OsString::from).collect::<Vec<_>>();
        let parsed = |a: &[&str]| {
            let a = args(a);
            Options::parse(&a)
                .map(|(o, p, rest)| (o.tty, o.report.is_some(), p.clone(), rest.len()))
        };
        assert_eq!(
            parsed(&["--tty", "--", "sh", "-c", "x"]),
            Some((true, false, OsString::from("sh"), 2))
        );
        assert_eq!(
            parsed(&["--", "sh"]),
            Some((false, false, OsString::from("sh"), 0))
        );
        // A standard stream, a descriptor that is not open, no number, an
        // unknown flag, no `--`, no program: refused.
        for bad in [
            &["--report", "1", "--", "sh"][..],
            &["--report", "99999", "--", "sh"],
            &["--report", "-4", "--", "sh"],
            &["--report", "--", "sh"],
            &["--bogus", "--", "sh"],
            &["--sandbox", "not json", "--", "sh"],
            &["--sandbox", "--", "sh"],
            &["sh"],
            &["--"],
            &[],
        ] {
            assert!(parsed(bad).is_none(), "{bad:?}");
        }
        let (read, write) = nix::unistd::pipe().expect("pipe");
        drop(read);
        let fd = write.into_raw_fd().to_string();
        assert_eq!(
            parsed(&["--report", &fd, "--tty", "--", "sh"]),
            Some((true, true, OsString::from("sh"), 0)),
            "the descriptor is taken (and closed with the options)"
        );
    }

    #[test]
    fn other_command_lines_are_not_the_stub() {
        let args = |a: &[&str]| a.iter().map(OsString::from).collect::<Vec<_>>();
        assert!(stub_main(&args(&["npc", "status"])).is_none());
        assert!(stub_main(&args(&["npc"])).is_none());
        assert!(stub_main(&args(&["npc", "x", CONTAIN_COMMAND])).is_none());
    }
}
