//! The sandbox of a contained child ([`SandboxSpec`], passed to the stub
//! as `--sandbox JSON`): applied by the stub (see [`super::pidns`]) after it
//! entered its namespaces and before it forks, so pid 1, the program and
//! everything they start are inside.
//!
//! - Files (Landlock): every directory tree is readable except the
//!   `hidden` paths (the home directory, npc's state, other runs'
//!   worktrees): the stub lists the directories above each hidden path and
//!   grants reads on every sibling (a walk of the complement), then grants
//!   the `read` paths (inside hidden ones) and the `write` paths (read and
//!   write). Landlock checks the file's real place at each open, so no
//!   symlink, `/proc/self/root` or hardlink leads to a hidden file, and a
//!   hardlink to a hidden file cannot be made (a link may not widen access,
//!   `LANDLOCK_ACCESS_FS_REFER`). Mounts are refused to a Landlock domain.
//! - npc's own state (`read_only`: the state and runtime directories):
//!   Landlock cannot take a right back below a granted tree (an in-place
//!   run's checkout holds `.npc`), so the stub, in a mount namespace of its
//!   own, binds each such directory read-only over itself ([`protect`]):
//!   nothing inside writes, replaces or removes what is below it (`EROFS`),
//!   and the directory itself cannot be renamed or removed (a mount point
//!   is busy); the run's own writable trees below it (its `tmp`, its
//!   worktree) are bound writable first. The program runs after Landlock,
//!   which refuses `mount` and `umount`, so it cannot undo the binds.
//! - Processes: the stub's user and PID namespaces (a user namespace
//!   always, so the run holds no capability outside it); Landlock's scopes
//!   refuse signals to processes outside the domain and abstract unix
//!   sockets made outside it; ptrace and `/proc/PID/environ` of processes
//!   outside the domain are refused by Landlock itself. `no_new_privs` is
//!   set, so no set-uid program regains anything.
//! - Network (`egress`): a network namespace with loopback only; pid 1
//!   listens on `127.0.0.1:PORT` inside and forwards each connection to the
//!   proxy's unix socket outside (a path crosses network namespaces).

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The stub's option carrying a [`SandboxSpec`] as JSON.
pub const SANDBOX_FLAG: &str = "--sandbox";
/// The stub's probe option: also check that a sandbox can be applied.
pub const SANDBOX_PROBE_FLAG: &str = "--probe-sandbox";
/// The environment variable that, set to [`super::pidns::OFF`], makes the
/// sandbox probe answer "unsupported" (the documented test seam for a
/// kernel without Landlock or user namespaces).
pub const SANDBOX_ENV: &str = "NPC_SANDBOX";
/// Most directory entries the complement walk grants (a directory above a
/// hidden path with more entries is refused rather than half granted).
pub const MAX_WALK_ENTRIES: usize = 16_384;
/// Most connections the in-namespace forwarder carries at once.
pub const MAX_FORWARDED: usize = 256;
/// Longest JSON a `--sandbox` argument may be.
pub const MAX_SPEC_BYTES: usize = 256 * 1024;

/// Devices a sandboxed child may read and write (its terminal, the null
/// device, random numbers, shared memory).
const DEVICES: [&str; 9] = [
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/tty",
    "/dev/urandom",
    "/dev/random",
    "/dev/pts",
    "/dev/ptmx",
    "/dev/shm",
];

/// What a sandboxed child may do.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SandboxSpec {
    /// Never readable (their trees), unless a `read` or `write` tree is
    /// below one (hidden paths below that tree stay hidden).
    pub hidden: Vec<PathBuf>,
    /// Readable trees (inside hidden paths; elsewhere everything is).
    pub read: Vec<PathBuf>,
    /// Readable and writable trees.
    pub write: Vec<PathBuf>,
    /// Writable trees where, also in the directories above hidden paths,
    /// new files may be written (an in-place run's checkout holding npc's
    /// state: a hidden file there can be replaced, never read).
    #[serde(default)]
    pub write_new: Vec<PathBuf>,
    /// Trees bound read-only in the child's mount namespace (npc's state):
    /// no grant of `write` or `write_new` reaches into them, except a
    /// `write` tree below one, which stays writable.
    #[serde(default)]
    pub read_only: Vec<PathBuf>,
    /// `Some`: no network but loopback, and a forwarder to the proxy.
    pub egress: Option<Egress>,
}

/// The network of a `strict` child: one port inside, one socket outside.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Egress {
    /// The proxy's unix socket (outside the namespace).
    pub socket: PathBuf,
    /// The loopback port the forwarder listens on inside.
    pub port: u16,
}

/// Why a sandbox cannot be applied.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error(
        "Landlock is not available on this kernel ({0}); use a kernel with Landlock enabled (`lsm=landlock,…`) or set `sandbox = \"off\"`"
    )]
    NoLandlock(String),
    #[error("cannot apply the Landlock rules: {0}")]
    Landlock(String),
    #[error("cannot list `{}` to hide what is below it: {source}", path.display())]
    Walk {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("`{}` has more than {MAX_WALK_ENTRIES} entries; a sandbox hiding a path below it cannot be made", path.display())]
    TooManyEntries { path: PathBuf },
    #[error("cannot set up the run's network namespace: {0}")]
    Network(String),
    #[error("cannot bind `{}` {how} in the run's mount namespace: {source}; run `npc doctor`, or set `sandbox = \"off\"`", path.display())]
    Mount {
        path: PathBuf,
        how: &'static str,
        #[source]
        source: nix::errno::Errno,
    },
}

impl SandboxSpec {
    /// The spec as the stub's argument.
    pub fn to_arg(&self) -> OsString {
        serde_json::to_string(self).unwrap_or_default().into()
    }

    /// The spec of a `--sandbox` argument.
    pub fn from_arg(arg: &std::ffi::OsStr) -> Option<Self> {
        let text = arg.to_str()?;
        (text.len() <= MAX_SPEC_BYTES)
            .then(|| serde_json::from_str(text).ok())
            .flatten()
    }
}

/// The grantable parts of tree `root`, and the directories walked to
/// find them: `root` itself when no hidden path is strictly below it;
/// else every entry of `root` that is neither hidden nor above a hidden
/// path, and (recursively) the entries of those above.
pub fn tree_without(
    root: &Path,
    hidden: &[PathBuf],
) -> Result<(Vec<PathBuf>, Vec<PathBuf>), SandboxError> {
    let below: Vec<&PathBuf> = hidden
        .iter()
        .filter(|h| h.starts_with(root) && h.as_path() != root)
        .collect();
    if hidden.iter().any(|h| h.as_path() == root) {
        return Ok((Vec::new(), Vec::new()));
    }
    if below.is_empty() {
        return Ok((vec![root.to_path_buf()], Vec::new()));
    }
    let (mut out, mut walked) = (Vec::new(), Vec::new());
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|source| SandboxError::Walk {
            path: dir.clone(),
            source,
        })?;
        for (n, entry) in entries.enumerate() {
            if n >= MAX_WALK_ENTRIES {
                return Err(SandboxError::TooManyEntries { path: dir });
            }
            let Ok(entry) = entry else { continue };
            let path = entry.path();
            if below.iter().any(|h| path.starts_with(h)) {
                continue;
            }
            let above = below.iter().any(|h| h.starts_with(&path));
            // Only a real directory is walked into: a link above a hidden
            // path is granted as what it points to, which Landlock checks.
            let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            if above && is_dir {
                stack.push(path);
            } else {
                out.push(path);
            }
        }
        walked.push(dir);
    }
    Ok((out, walked))
}

/// Apply Landlock: reads of everything but `spec.hidden` (except
/// `spec.read`), writes only of `spec.write` and devices; no signals to, or
/// abstract sockets of, processes outside. Sets `no_new_privs`.
pub fn restrict(spec: &SandboxSpec) -> Result<(), SandboxError> {
    use landlock::{
        ABI, Access, AccessFs, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset, RulesetAttr,
        RulesetCreatedAttr, RulesetStatus, Scope,
    };
    let abi = ABI::V6;
    let err = |e: landlock::RulesetError| SandboxError::Landlock(e.to_string());
    let read = AccessFs::from_read(abi);
    let all = AccessFs::from_all(abi);
    let mut roots = tree_without(Path::new("/"), &spec.hidden)?.0;
    // A readable tree's own directories above hidden paths list their
    // entries (names, not contents); `/`'s do not, so the names in a
    // hidden home stay unlisted.
    let mut listable = Vec::new();
    for tree in &spec.read {
        let (leaves, walked) = tree_without(tree, &spec.hidden)?;
        roots.extend(leaves);
        listable.extend(walked);
    }
    // A writable tree with hidden paths below: its entries are writable,
    // and in the directories above the hidden paths entries may be made
    // and removed (not read or written: what is hidden stays unreadable).
    // npc's state is never granted by a tree above it (its binds are
    // read-only anyway: this keeps Landlock's rules saying so too).
    let unwritable: Vec<PathBuf> = spec.hidden.iter().chain(&spec.read_only).cloned().collect();
    let (mut writable, mut makeable, mut fillable) = (Vec::new(), Vec::new(), Vec::new());
    for tree in &spec.write {
        let (leaves, walked) = tree_without(tree, &unwritable)?;
        writable.extend(leaves);
        makeable.extend(walked);
    }
    for tree in &spec.write_new {
        let (leaves, walked) = tree_without(tree, &unwritable)?;
        writable.extend(leaves);
        fillable.extend(walked);
    }
    let mut rules = Vec::new();
    let mut grant = |path: &Path, access: landlock::BitFlags<AccessFs>| {
        // A path that does not exist (or vanished) grants nothing.
        let Ok(fd) = PathFd::new(path) else { return };
        // Directory-only rights on a file are an error: keep the file's.
        let is_dir = std::fs::metadata(path).is_ok_and(|m| m.is_dir());
        let access = if is_dir {
            access
        } else {
            access & AccessFs::from_file(abi)
        };
        rules.push(PathBeneath::new(fd, access));
    };
    for path in &roots {
        grant(path, read);
    }
    for dev in DEVICES {
        grant(Path::new(dev), all);
    }
    for path in &writable {
        grant(path, all);
    }
    for dir in &listable {
        grant(dir, AccessFs::ReadDir.into());
    }
    for dir in &makeable {
        grant(dir, all & !AccessFs::from_file(abi));
    }
    for dir in &fillable {
        grant(dir, all & !AccessFs::from_read(abi) | AccessFs::ReadDir);
    }
    let ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(all)
        .map_err(err)?
        .scope(Scope::from_all(abi))
        .map_err(err)?
        .create()
        .map_err(err)?
        .add_rules(rules.into_iter().map(Ok::<_, landlock::RulesetError>))
        .map_err(err)?;
    let status = ruleset.no_new_privs(true).restrict_self().map_err(err)?;
    if status.ruleset == RulesetStatus::NotEnforced {
        return Err(SandboxError::NoLandlock(
            "the kernel enforced none of the rules".into(),
        ));
    }
    Ok(())
}

/// In this process's own (new) mount namespace: stop mount events
/// propagating either way, then bind each `spec.read_only` directory
/// read-only over itself, after binding the `spec.write` trees below it
/// writable over themselves (a recursive bind carries them along). A
/// directory that does not exist is skipped (nothing of npc's is there).
pub fn protect(spec: &SandboxSpec) -> Result<(), SandboxError> {
    use nix::mount::{MsFlags, mount};
    let none: Option<&str> = None;
    let fail = |path: &Path, how: &'static str| {
        let path = path.to_path_buf();
        move |source| SandboxError::Mount { path, how, source }
    };
    mount(none, "/", none, MsFlags::MS_REC | MsFlags::MS_PRIVATE, none)
        .map_err(fail(Path::new("/"), "private"))?;
    for dir in &spec.read_only {
        // One below another is carried by the outer bind.
        if spec
            .read_only
            .iter()
            .any(|o| o != dir && dir.starts_with(o))
            || !dir.is_dir()
        {
            continue;
        }
        for tree in spec
            .write
            .iter()
            .filter(|w| w.starts_with(dir) && *w != dir)
        {
            if tree.exists() {
                mount(
                    Some(tree),
                    tree,
                    none,
                    MsFlags::MS_BIND | MsFlags::MS_REC,
                    none,
                )
                .map_err(fail(tree, "writable"))?;
            }
        }
        mount(
            Some(dir),
            dir,
            none,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            none,
        )
        .map_err(fail(dir, "over itself"))?;
        // A remount in a user namespace keeps the flags the mount below
        // was locked with (`nosuid`, `nodev`, …), or it is refused.
        let locked = locked_flags(dir);
        mount(
            none,
            dir,
            none,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | locked,
            none,
        )
        .map_err(fail(dir, "read-only"))?;
    }
    Ok(())
}

/// The per-mount flags of the mount `path` is on, as a remount keeps them.
fn locked_flags(path: &Path) -> nix::mount::MsFlags {
    use nix::mount::MsFlags;
    use nix::sys::statvfs::FsFlags;
    let Ok(stat) = nix::sys::statvfs::statvfs(path) else {
        return MsFlags::empty();
    };
    let flags = stat.flags();
    [
        (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
        (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
        (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
    ]
    .into_iter()
    .filter(|(st, _)| flags.contains(*st))
    .fold(MsFlags::empty(), |acc, (_, ms)| acc | ms)
}

/// Whether Landlock can be enforced here; `Err` says why not. Creates a
/// ruleset without enforcing it.
pub fn landlock_available() -> Result<(), String> {
    use landlock::{ABI, Access, AccessFs, CompatLevel, Compatible, Ruleset, RulesetAttr};
    Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(ABI::V1))
        .and_then(|r| r.create())
        .map(drop)
        .map_err(|e| e.to_string())
}

/// Bring the loopback interface of this (new) network namespace up.
#[allow(unsafe_code)]
pub fn loopback_up() -> Result<(), SandboxError> {
    let sock = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Inet,
        nix::sys::socket::SockType::Datagram,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| SandboxError::Network(format!("socket: {e}")))?;
    // SAFETY: a zeroed `ifreq` is valid; the name fits (`lo` and a NUL).
    let mut req: nix::libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as nix::libc::c_char;
    }
    let fd = std::os::fd::AsRawFd::as_raw_fd(&sock);
    // SAFETY: `SIOCGIFFLAGS`/`SIOCSIFFLAGS` read and write the `ifreq` given.
    unsafe {
        if nix::libc::ioctl(fd, nix::libc::SIOCGIFFLAGS, &mut req) != 0 {
            return Err(SandboxError::Network(format!(
                "SIOCGIFFLAGS: {}",
                io::Error::last_os_error()
            )));
        }
        req.ifr_ifru.ifru_flags |= nix::libc::IFF_UP as nix::libc::c_short;
        if nix::libc::ioctl(fd, nix::libc::SIOCSIFFLAGS, &req) != 0 {
            return Err(SandboxError::Network(format!(
                "SIOCSIFFLAGS: {}",
                io::Error::last_os_error()
            )));
        }
    }
    Ok(())
}

/// Listen on `127.0.0.1:port` inside the namespace.
pub fn listen(port: u16) -> Result<std::net::TcpListener, SandboxError> {
    std::net::TcpListener::bind(("127.0.0.1", port))
        .map_err(|e| SandboxError::Network(format!("cannot listen on 127.0.0.1:{port}: {e}")))
}

/// The forwarder (a process of its own in the namespace): each connection
/// to `listener` is carried to the proxy's unix socket `socket`, at most
/// [`MAX_FORWARDED`] at once. Never returns.
pub fn forward(listener: std::net::TcpListener, socket: &Path) -> ! {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let open = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        let Ok(tcp) = conn else { continue };
        if open.load(Ordering::SeqCst) >= MAX_FORWARDED {
            continue;
        }
        let Ok(unix) = std::os::unix::net::UnixStream::connect(socket) else {
            // The proxy is gone: the connection is refused (closed).
            continue;
        };
        open.fetch_add(1, Ordering::SeqCst);
        let open = open.clone();
        std::thread::spawn(move || {
            let (Ok(mut tcp_r), Ok(mut unix_w)) = (tcp.try_clone(), unix.try_clone()) else {
                open.fetch_sub(1, Ordering::SeqCst);
                return;
            };
            let up = std::thread::spawn(move || {
                let _ = io::copy(&mut tcp_r, &mut unix_w);
                let _ = unix_w.shutdown(std::net::Shutdown::Write);
            });
            let (mut unix_r, mut tcp_w) = (unix, tcp);
            let _ = io::copy(&mut unix_r, &mut tcp_w);
            let _ = tcp_w.shutdown(std::net::Shutdown::Write);
            let _ = up.join();
            open.fetch_sub(1, Ordering::SeqCst);
        });
    }
    std::process::exit(0)
}
