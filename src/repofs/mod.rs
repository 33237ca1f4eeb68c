//! The guarded file layer: every file npc reads or writes on a repository's
//! behalf goes through here (the store keeps its SQLite files, opened on a
//! path this layer prepared). A [`Root`] is a directory nothing may leave:
//! every path is resolved one component at a time from an open directory
//! descriptor (`openat` with `O_NOFOLLOW`), symbolic links are followed by
//! this code, not the kernel, and only while they stay inside the root; one
//! that points out is refused with an error naming the link and its target.
//!
//! Reads take only regular files: the entry is checked with `lstat` before
//! it is opened (so a FIFO or a device is never opened at all), opened
//! `O_NONBLOCK | O_NOFOLLOW`, checked again with `fstat`, and read with the
//! size cap enforced while reading. Writes of whole files go to a temporary
//! file beside the target (`.NAME.npc-PID-N.tmp`, created `O_EXCL |
//! O_NOFOLLOW`) renamed over it, so a link or a hard link at the target is
//! replaced, never written through; temporary files a killed process left
//! are removed the next time npc writes in that directory. Files npc keeps
//! open and writes in place (the lock, logs) are opened `O_NOFOLLOW`, must
//! be regular files with one link, and are owner-only.
//!
//! What a repository's own symbolic links may do: agent files (`.mcp.json`,
//! `.codex/config.toml`, …), prompt files and plugin directories may be
//! links that stay inside the repository ([`Links::Follow`]); the target is
//! read, and replaced atomically on write, keeping the link. npc's own files
//! under the state directory are never links ([`Links::Refuse`]). A hard
//! link cannot be told from the file it links to, so a hard link to a file
//! outside is read like any file (git and archives cannot create one; only
//! a local user can); writes replace the name by rename and never reach the
//! other file, and in-place writes refuse files with more than one link.

mod claim;
mod noise;
mod user;
mod walk;

#[cfg(test)]
mod tests;

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{Read as _, Write as _};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, RenameFlags, openat, readlinkat, renameat, renameat2};
use nix::sys::stat::{FileStat, Mode, SFlag, fchmod, fstat, fstatat};
use nix::unistd::{UnlinkatFlags, unlinkat};

pub use claim::{Claim, OWNER_FILE, UNTRUSTED_MARK};
pub use noise::is_editor_noise;
pub use user::user_data_dir;
use walk::Walk;

/// Most symbolic links followed while resolving one path (Linux's `MAXSYMLINKS`).
pub const MAX_LINK_HOPS: usize = 40;
/// Marker inside the names of npc's temporary files: `.NAME.npc-PID-N.tmp`.
pub const TEMP_MARKER: &str = ".npc-";
/// Suffix of npc's temporary files.
pub const TEMP_SUFFIX: &str = ".tmp";
/// File npc keeps in each state directory so git never shows it as untracked.
pub const GITIGNORE_FILE: &str = ".gitignore";
/// What that file says: ignore everything in the directory.
pub const GITIGNORE_TEXT: &str = "*\n";
/// Permission bits of npc's own directories (state directory, logs, profiles).
pub const PRIVATE_DIR_MODE: u32 = 0o700;
/// Permission bits of npc's own files (database, logs, profiles, lock, socket).
pub const PRIVATE_FILE_MODE: u32 = 0o600;
/// Permission bits asked for new shared files and directories (agent
/// files); the process umask takes away from them, as for any program.
pub const SHARED_MODE: u32 = 0o777;
/// The same for new shared files (no execute bits).
pub const SHARED_FILE_MODE: u32 = 0o666;

/// Whether a symbolic link at the last component is followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Links {
    /// Follow links whose target stays inside the root (agent files, prompt
    /// files); a link leaving it is refused.
    Follow,
    /// Refuse any link (npc's own files).
    Refuse,
}

/// Who may read what npc creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Perms {
    /// Owner only: directories 0700, files 0600, tightened when they exist
    /// looser (npc's own state).
    Private,
    /// New files and directories as any program makes them (umask applies);
    /// an existing file keeps its mode (agent files in the repository).
    Shared,
}

/// How [`Root::write`] writes a whole file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteOptions {
    pub links: Links,
    pub perms: Perms,
}

impl WriteOptions {
    /// An agent file in the repository: in-repository links followed, mode kept.
    pub const SHARED: Self = Self {
        links: Links::Follow,
        perms: Perms::Shared,
    };
    /// One of npc's own files: never a link, owner-only.
    pub const PRIVATE: Self = Self {
        links: Links::Refuse,
        perms: Perms::Private,
    };
}

/// Whether a write may replace what is at its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Replace {
    Yes,
    No,
}

/// A refused or failed file operation: the path (relative to the root when
/// inside it) and why.
#[derive(Debug, thiserror::Error)]
#[error("`{}` {reason}", path.display())]
pub struct FsError {
    pub path: PathBuf,
    pub reason: Reason,
}

/// Why a file operation was refused or failed; reads after the path.
#[derive(Debug, thiserror::Error)]
pub enum Reason {
    #[error(
        "leaves `{}`: `{}` is a symbolic link to `{}`; npc never reads or writes outside it; replace the link with the file itself",
        root.display(), link.display(), target.display()
    )]
    Escapes {
        root: PathBuf,
        link: PathBuf,
        target: PathBuf,
    },
    #[error("is outside `{}`; npc never reads or writes outside it", root.display())]
    Outside { root: PathBuf },
    #[error(
        "is a symbolic link to `{}`; npc does not follow links among its own files; remove it and run again",
        target.display()
    )]
    Link { target: PathBuf },
    #[error("is {what}, not a regular file; npc reads only regular files; replace it with a file")]
    NotRegular { what: &'static str },
    #[error(
        "has {links} hard links; npc writes in place only to a file with one link; remove it and run again"
    )]
    HardLinked { links: u64 },
    #[error("is larger than the limit of {limit} bytes; check the path")]
    TooLarge { limit: usize },
    #[error("does not exist")]
    NotFound,
    #[error("is not a directory; remove it or fix the path")]
    NotDir,
    #[error("goes through more than {MAX_LINK_HOPS} symbolic links; fix the links")]
    TooManyLinks,
    #[error("is not valid UTF-8; save it as UTF-8 and try again")]
    NotUtf8,
    #[error(
        "is the repository itself; `project.state_dir` must name a directory inside it, such as `.npc`"
    )]
    StateDirIsRoot,
    #[error("is not a socket npc left; remove it and run again")]
    NotSocket,
    #[error(
        "is not a file npc made here ({why}); npc never adopts it: remove it and npc makes its own"
    )]
    NotOwn { why: &'static str },
    #[error("could not be {op}: {source}; check it and its permissions")]
    Io {
        op: &'static str,
        source: std::io::Error,
    },
}

impl FsError {
    pub fn is_not_found(&self) -> bool {
        matches!(self.reason, Reason::NotFound)
    }

    /// `path` does not exist (for a caller that looked for it another way).
    pub fn not_found(path: impl Into<PathBuf>) -> Self {
        Self::new(path, Reason::NotFound)
    }

    /// The file is there but is not provably npc's (see [`Root::read_own`]).
    pub fn is_not_own(&self) -> bool {
        matches!(self.reason, Reason::NotOwn { .. })
    }

    /// As an `std::io::Error` whose message is only the reason, for callers
    /// that name the path themselves ("prompt file `x` {reason}").
    pub fn into_reason(self) -> std::io::Error {
        let kind = self.io_kind();
        std::io::Error::new(kind, ReasonOnly(self))
    }

    /// The operating system's error underneath, if the reason is one.
    pub fn os_error(&self) -> Option<&std::io::Error> {
        match &self.reason {
            Reason::Io { source, .. } => Some(source),
            _ => None,
        }
    }

    fn io_kind(&self) -> std::io::ErrorKind {
        match &self.reason {
            Reason::NotFound => std::io::ErrorKind::NotFound,
            Reason::Io { source, .. } => source.kind(),
            _ => std::io::ErrorKind::InvalidInput,
        }
    }

    fn new(path: impl Into<PathBuf>, reason: Reason) -> Self {
        Self {
            path: path.into(),
            reason,
        }
    }

    fn io(path: impl Into<PathBuf>, op: &'static str, errno: Errno) -> Self {
        let reason = if errno == Errno::ENOENT {
            Reason::NotFound
        } else {
            Reason::Io {
                op,
                source: std::io::Error::from(errno),
            }
        };
        Self::new(path, reason)
    }
}

/// An [`FsError`] that displays only its reason (see
/// [`FsError::into_reason`]); the error itself stays reachable.
#[derive(Debug)]
struct ReasonOnly(FsError);

impl std::fmt::Display for ReasonOnly {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.reason.fmt(f)
    }
}

impl std::error::Error for ReasonOnly {}

/// The operating system's error inside an `std::io::Error` made from an
/// [`FsError`] (by `From` or [`FsError::into_reason`]), else `e` itself: how
/// callers tell "out of descriptors" from "refused by the guard".
pub fn os_error(e: &std::io::Error) -> &std::io::Error {
    let fs = e.get_ref().and_then(|inner| {
        inner
            .downcast_ref::<FsError>()
            .or_else(|| inner.downcast_ref::<ReasonOnly>().map(|r| &r.0))
    });
    fs.and_then(FsError::os_error).unwrap_or(e)
}

/// For traits that speak `std::io`: not-found stays `NotFound`, and the
/// message is the whole error.
impl From<FsError> for std::io::Error {
    fn from(e: FsError) -> Self {
        let kind = e.io_kind();
        std::io::Error::new(kind, e)
    }
}

/// A directory nothing may leave. Cheap to make; holds no descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Root {
    /// Canonical absolute path.
    dir: PathBuf,
    /// As the caller spelled it, to accept absolute paths spelled the same way.
    given: PathBuf,
}

impl Root {
    /// The root at `dir` (which must exist; an empty path is the current
    /// directory). The root itself may be reached through links: the
    /// caller chose it.
    pub fn new(dir: &Path) -> Result<Self, FsError> {
        let given = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        let canonical = given.canonicalize().map_err(|e| {
            FsError::new(
                given,
                Reason::Io {
                    op: "opened",
                    source: e,
                },
            )
        })?;
        Ok(Self {
            dir: canonical,
            given: given.to_path_buf(),
        })
    }

    /// The canonical path of the root.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    fn open_root(&self) -> Result<OwnedFd, FsError> {
        openat(
            nix::fcntl::AT_FDCWD,
            &self.dir,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| FsError::io(&self.dir, "opened", e))
    }

    /// `path` relative to the root, for messages.
    fn shown(&self, path: &Path) -> PathBuf {
        path.strip_prefix(&self.dir)
            .or_else(|_| path.strip_prefix(&self.given))
            .map(Path::to_path_buf)
            .unwrap_or_else(|_| path.to_path_buf())
    }

    /// Where `path` really is: every link resolved (each one inside).
    pub fn real_path(&self, path: &Path) -> Result<PathBuf, FsError> {
        let mut walk = Walk::new(self, path)?;
        let name = walk.locate(None, Links::Follow)?;
        Ok(match name {
            Some(name) => walk.here().join(name),
            None => walk.here(),
        })
    }

    /// The directory `path` inside this root as a root of its own, found
    /// with one walk (each link followed inside this root); nothing is
    /// resolved again to make it.
    pub fn sub_root(&self, path: &Path) -> Result<Root, FsError> {
        let mut walk = Walk::new(self, path)?;
        walk.push_end_marker();
        walk.locate(None, Links::Follow)?;
        let dir = walk.here();
        Ok(Root {
            given: dir.clone(),
            dir,
        })
    }

    /// Whether `path` is a directory inside the root (links inside followed).
    pub fn is_dir(&self, path: &Path) -> bool {
        self.dir_check(path).is_ok()
    }

    /// `Ok` when `path` is a directory inside the root; else why not.
    pub fn dir_check(&self, path: &Path) -> Result<(), FsError> {
        let mut walk = Walk::new(self, path)?;
        let Some(name) = walk.locate(None, Links::Follow)? else {
            return Ok(());
        };
        let st = walk.stat(&name)?;
        if kind(&st) == SFlag::S_IFDIR {
            Ok(())
        } else {
            Err(FsError::new(walk.shown_entry(&name), Reason::NotDir))
        }
    }

    /// Read the regular file at `path`, at most `limit` bytes (a longer
    /// file is refused once `limit + 1` bytes were read). Links inside
    /// the root are followed.
    pub fn read(&self, path: &Path, limit: usize) -> Result<Vec<u8>, FsError> {
        self.read_with(path, limit, Links::Follow)
    }

    /// [`read`](Self::read), choosing whether a link at the last component
    /// is followed (inside the root) or refused.
    pub fn read_with(&self, path: &Path, limit: usize, links: Links) -> Result<Vec<u8>, FsError> {
        let (fd, shown, st) = self.open_regular(path, links)?;
        read_open(fd, &shown, &st, limit)
    }

    /// Open the regular file at `path` read-only (a link at the last
    /// component followed inside the root or refused, as `links` says):
    /// its descriptor, its name for messages, and what `stat` said of it
    /// before it was opened.
    fn open_regular(
        &self,
        path: &Path,
        links: Links,
    ) -> Result<(OwnedFd, PathBuf, FileStat), FsError> {
        let mut walk = Walk::new(self, path)?;
        let Some(name) = walk.locate(None, links)? else {
            return Err(FsError::new(
                self.shown(path),
                Reason::NotRegular {
                    what: "a directory",
                },
            ));
        };
        let shown = walk.shown_entry(&name);
        let st = walk.stat(&name)?;
        if kind(&st) == SFlag::S_IFLNK {
            return Err(FsError::new(
                &shown,
                Reason::Link {
                    target: walk.link_target(&name),
                },
            ));
        }
        regular(&shown, &st)?;
        let fd = open_entry_read_only(&walk, &name, &shown)?;
        Ok((fd, shown, st))
    }

    /// Read one of npc's own files (never through a link), only when it is
    /// private to this user as npc makes its files: owned by it, no group
    /// or other permission bits, one link. A file a clone brought (git
    /// writes `0644`) or another account wrote is refused
    /// ([`FsError::is_not_own`]), never read.
    pub fn read_own(&self, path: &Path, limit: usize) -> Result<Vec<u8>, FsError> {
        let (fd, shown, st) = self.open_regular(path, Links::Refuse)?;
        own(&shown, &st)?;
        read_open(fd, &shown, &st, limit)
    }

    /// [`read`](Self::read) as UTF-8 text.
    pub fn read_string(&self, path: &Path, limit: usize) -> Result<String, FsError> {
        let bytes = self.read(path, limit)?;
        String::from_utf8(bytes).map_err(|_| FsError::new(self.shown(path), Reason::NotUtf8))
    }

    /// A UTF-8 file read with [`read_with`](Self::read_with), `None` when
    /// it does not exist.
    pub fn read_existing(
        &self,
        path: &Path,
        limit: usize,
        links: Links,
    ) -> Result<Option<String>, FsError> {
        match self.read_with(path, limit, links) {
            Ok(bytes) => String::from_utf8(bytes)
                .map(Some)
                .map_err(|_| FsError::new(self.shown(path), Reason::NotUtf8)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Create the directory `path` and its missing parents (inside the
    /// root); returns its real path. With [`Perms::Private`] the last
    /// directory is owner-only, tightened if it exists looser.
    pub fn create_dir_all(&self, path: &Path, perms: Perms) -> Result<PathBuf, FsError> {
        let mut walk = Walk::new(self, path)?;
        walk.push_end_marker();
        walk.locate(Some(perms), Links::Follow)?;
        if perms == Perms::Private {
            tighten(walk.dir(), &walk.here(), PRIVATE_DIR_MODE)?;
        }
        Ok(walk.here())
    }

    /// Make `path` npc's state directory: one npc made here, provably (see
    /// [`claim`]: anything else at that name is moved aside unread and a new
    /// one made), owner-only (tightened, never loosened), holding a
    /// `.gitignore` of `*`, and cleared of temporary files a killed npc
    /// left. Refuses the root itself. Returns its real path.
    pub fn ensure_state_dir(&self, path: &Path) -> Result<PathBuf, FsError> {
        self.claim_state_dir(path).map(|(real, _)| real)
    }

    /// [`ensure_state_dir`](Self::ensure_state_dir), saying what it found
    /// at the state directory's name (for a caller that reports it).
    pub fn claim_state_dir(&self, path: &Path) -> Result<(PathBuf, Claim), FsError> {
        let mut walk = Walk::new(self, path)?;
        let Some(name) = walk.locate(Some(Perms::Private), Links::Refuse)? else {
            return Err(FsError::new(self.shown(path), Reason::StateDirIsRoot));
        };
        let shown = walk.shown_entry(&name);
        let (claim, _dir) = claim::claim(walk.dir(), &name, &shown)?;
        let real = walk.here().join(&name);
        if let Claim::Replaced { aside } = &claim {
            warn_moved_aside(&shown, &walk.here().join(aside));
        }
        let ignore = real.join(GITIGNORE_FILE);
        if self
            .read_existing(&ignore, GITIGNORE_TEXT.len() + 1, Links::Refuse)
            .ok()
            .flatten()
            != Some(GITIGNORE_TEXT.to_string())
        {
            self.write(&ignore, GITIGNORE_TEXT.as_bytes(), WriteOptions::PRIVATE)?;
        }
        self.sweep_temp(&real)?;
        Ok((real, claim))
    }

    /// For a reader that creates nothing (the CLI beside a daemon): `Ok`
    /// when `path` is a state directory npc made here. Anything else at
    /// that name is moved aside unread, as
    /// [`ensure_state_dir`](Self::ensure_state_dir) would, and reported as
    /// not found, like a missing one.
    pub fn existing_state_dir(&self, path: &Path) -> Result<(), FsError> {
        let mut walk = Walk::new(self, path)?;
        let Some(name) = walk.locate(None, Links::Refuse)? else {
            return Err(FsError::new(self.shown(path), Reason::StateDirIsRoot));
        };
        let shown = walk.shown_entry(&name);
        if let Some(aside) = claim::proven_existing(walk.dir(), &name, &shown)? {
            warn_moved_aside(&shown, &walk.here().join(aside));
            return Err(FsError::new(shown, Reason::NotFound));
        }
        Ok(())
    }

    /// Replace the file at `path` with `bytes`: a temporary file beside
    /// the target, renamed over it. Creates missing parent directories (with
    /// `options.perms`). Returns the real path written.
    pub fn write(
        &self,
        path: &Path,
        bytes: &[u8],
        options: WriteOptions,
    ) -> Result<PathBuf, FsError> {
        self.write_file(path, bytes, options, Replace::Yes)
            .map(|written| written.unwrap_or_default())
    }

    /// Create one of npc's own files at `path` holding `bytes`, whole or not
    /// at all: a temporary file renamed into place only if nothing is there
    /// (`renameat2` with `RENAME_NOREPLACE`), so a concurrent reader sees no
    /// file or the whole of it, and of two concurrent creators one wins.
    /// `Ok(false)` when something was there already (left untouched).
    pub fn write_new(&self, path: &Path, bytes: &[u8]) -> Result<bool, FsError> {
        self.write_file(path, bytes, WriteOptions::PRIVATE, Replace::No)
            .map(|written| written.is_some())
    }

    fn write_file(
        &self,
        path: &Path,
        bytes: &[u8],
        options: WriteOptions,
        replace: Replace,
    ) -> Result<Option<PathBuf>, FsError> {
        let mut walk = Walk::new(self, path)?;
        let name = walk
            .locate(Some(options.perms), options.links)?
            .ok_or_else(|| {
                FsError::new(
                    self.shown(path),
                    Reason::NotRegular {
                        what: "a directory",
                    },
                )
            })?;
        let shown = walk.shown_entry(&name);
        let existing = match walk.stat(&name) {
            Ok(st) if kind(&st) == SFlag::S_IFLNK => {
                return Err(FsError::new(
                    &shown,
                    Reason::Link {
                        target: walk.link_target(&name),
                    },
                ));
            }
            Ok(_) if replace == Replace::No => return Ok(None),
            Ok(st) => {
                regular(&shown, &st)?;
                Some(st)
            }
            Err(e) if e.is_not_found() => None,
            Err(e) => return Err(e),
        };
        let dir = walk.dir();
        sweep_dir(dir, &walk.here())?;
        let tmp = temp_name(&name);
        let create_mode = match options.perms {
            Perms::Private => PRIVATE_FILE_MODE,
            Perms::Shared => SHARED_FILE_MODE,
        };
        let fd = openat(
            dir,
            tmp.as_os_str(),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(create_mode),
        )
        .map_err(|e| FsError::io(&shown, "written", e))?;
        let result = (|| {
            let keep = match (options.perms, &existing) {
                (Perms::Private, _) => Some(PRIVATE_FILE_MODE),
                (Perms::Shared, Some(st)) => Some(st.st_mode & 0o7777),
                (Perms::Shared, None) => None,
            };
            if let Some(mode) = keep {
                fchmod(&fd, Mode::from_bits_truncate(mode))?;
            }
            let mut file = File::from(fd);
            file.write_all(bytes).map_err(errno_of)?;
            file.sync_all().map_err(errno_of)?;
            match replace {
                Replace::Yes => renameat(dir, tmp.as_os_str(), dir, name.as_os_str()),
                Replace::No => renameat2(
                    dir,
                    tmp.as_os_str(),
                    dir,
                    name.as_os_str(),
                    RenameFlags::RENAME_NOREPLACE,
                ),
            }
        })();
        match result {
            Ok(()) => Ok(Some(walk.here().join(&name))),
            Err(Errno::EEXIST) if replace == Replace::No => {
                let _ = unlinkat(dir, tmp.as_os_str(), UnlinkatFlags::NoRemoveDir);
                Ok(None)
            }
            Err(e) => {
                let _ = unlinkat(dir, tmp.as_os_str(), UnlinkatFlags::NoRemoveDir);
                Err(FsError::io(&shown, "written", e))
            }
        }
    }

    /// Create `path` with `bytes` only if nothing is there (`O_EXCL`; a
    /// link there counts as something). Parents are created `perms`.
    pub fn create_new(&self, path: &Path, bytes: &[u8], perms: Perms) -> Result<(), FsError> {
        let file = self.open_new(path, perms)?;
        let mut file = file;
        file.write_all(bytes)
            .map_err(|e| FsError::io(self.shown(path), "written", errno_of(e)))
    }

    fn open_new(&self, path: &Path, perms: Perms) -> Result<File, FsError> {
        let mut walk = Walk::new(self, path)?;
        let name = walk.locate(Some(perms), Links::Refuse)?.ok_or_else(|| {
            FsError::new(
                self.shown(path),
                Reason::NotRegular {
                    what: "a directory",
                },
            )
        })?;
        let shown = walk.shown_entry(&name);
        let mode = match perms {
            Perms::Private => PRIVATE_FILE_MODE,
            Perms::Shared => SHARED_FILE_MODE,
        };
        let fd = openat(
            walk.dir(),
            name.as_os_str(),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(mode),
        )
        .map_err(|e| FsError::io(&shown, "created", e))?;
        Ok(File::from(fd))
    }

    /// Open (creating) one of npc's own files for reading and writing in
    /// place, without truncating: never a link, a regular file with one
    /// link, owner-only (tightened). For the repository lock.
    pub fn open_private(&self, path: &Path) -> Result<File, FsError> {
        self.open_in_place(path, OFlag::O_RDWR, None)
    }

    /// Open one of npc's own files that exists, read-only: never through a
    /// link, only a regular file, without blocking.
    pub fn open_existing(&self, path: &Path) -> Result<File, FsError> {
        let (fd, shown, _) = self.open_regular(path, Links::Refuse)?;
        let after = fstat(&fd).map_err(|e| FsError::io(&shown, "opened", e))?;
        regular(&shown, &after)?;
        Ok(File::from(fd))
    }

    /// Open (creating) one of npc's own files for appending, like
    /// [`open_private`](Self::open_private); first renamed to `NAME.1`
    /// (replacing an older one) when larger than `rotate_at` bytes. For logs.
    pub fn open_append(&self, path: &Path, rotate_at: u64) -> Result<File, FsError> {
        self.open_in_place(path, OFlag::O_WRONLY | OFlag::O_APPEND, Some(rotate_at))
    }

    fn open_in_place(
        &self,
        path: &Path,
        access: OFlag,
        rotate_at: Option<u64>,
    ) -> Result<File, FsError> {
        let mut walk = Walk::new(self, path)?;
        let name = walk
            .locate(Some(Perms::Private), Links::Refuse)?
            .ok_or_else(|| {
                FsError::new(
                    self.shown(path),
                    Reason::NotRegular {
                        what: "a directory",
                    },
                )
            })?;
        let shown = walk.shown_entry(&name);
        match walk.stat(&name) {
            Ok(st) if kind(&st) == SFlag::S_IFLNK => {
                return Err(FsError::new(
                    &shown,
                    Reason::Link {
                        target: walk.link_target(&name),
                    },
                ));
            }
            Ok(st) => {
                regular(&shown, &st)?;
                if let Some(limit) = rotate_at
                    && st.st_size > 0
                    && st.st_size as u64 > limit
                {
                    let mut rotated = name.clone();
                    rotated.push(".1");
                    renameat(
                        walk.dir(),
                        name.as_os_str(),
                        walk.dir(),
                        rotated.as_os_str(),
                    )
                    .map_err(|e| FsError::io(&shown, "rotated", e))?;
                }
            }
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
        let fd = openat(
            walk.dir(),
            name.as_os_str(),
            access | OFlag::O_CREAT | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(PRIVATE_FILE_MODE),
        )
        .map_err(|e| match e {
            Errno::ELOOP => FsError::new(
                &shown,
                Reason::Link {
                    target: walk.link_target(&name),
                },
            ),
            e => FsError::io(&shown, "opened", e),
        })?;
        let st = fstat(&fd).map_err(|e| FsError::io(&shown, "opened", e))?;
        regular(&shown, &st)?;
        if st.st_nlink > 1 {
            return Err(FsError::new(
                &shown,
                Reason::HardLinked {
                    links: st.st_nlink as u64,
                },
            ));
        }
        if st.st_mode & 0o077 != 0 {
            fchmod(&fd, Mode::from_bits_truncate(PRIVATE_FILE_MODE))
                .map_err(|e| FsError::io(&shown, "made private", e))?;
        }
        // Regular files ignore O_NONBLOCK; clear it all the same.
        nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_SETFL(access))
            .map_err(|e| FsError::io(&shown, "opened", e))?;
        Ok(File::from(fd))
    }

    /// Make a Unix socket path ready to bind: parents created owner-only,
    /// a socket a dead daemon left removed, anything else there (a link, a
    /// file) refused. Returns the real path to bind. The caller holds the
    /// repository lock, which proves no live daemon serves an old socket.
    pub fn prepare_socket(&self, path: &Path) -> Result<PathBuf, FsError> {
        let mut walk = Walk::new(self, path)?;
        let name = walk
            .locate(Some(Perms::Private), Links::Refuse)?
            .ok_or_else(|| FsError::new(self.shown(path), Reason::NotSocket))?;
        let shown = walk.shown_entry(&name);
        match walk.stat(&name) {
            Ok(st) if kind(&st) == SFlag::S_IFSOCK => {
                unlinkat(walk.dir(), name.as_os_str(), UnlinkatFlags::NoRemoveDir)
                    .map_err(|e| FsError::io(&shown, "removed", e))?;
            }
            Ok(st) if kind(&st) == SFlag::S_IFLNK => {
                return Err(FsError::new(
                    &shown,
                    Reason::Link {
                        target: walk.link_target(&name),
                    },
                ));
            }
            Ok(_) => return Err(FsError::new(&shown, Reason::NotSocket)),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
        Ok(walk.here().join(name))
    }

    /// `Ok` when `path` is a socket itself (not a link to one), inside the
    /// root: what a client checks before it connects.
    pub fn socket_check(&self, path: &Path) -> Result<(), FsError> {
        self.locate_socket(path).map(drop)
    }

    fn locate_socket(&self, path: &Path) -> Result<(Walk<'_>, OsString), FsError> {
        let mut walk = Walk::new(self, path)?;
        let name = walk
            .locate(None, Links::Refuse)?
            .ok_or_else(|| FsError::new(self.shown(path), Reason::NotSocket))?;
        let st = walk.stat(&name)?;
        if kind(&st) != SFlag::S_IFSOCK {
            return Err(FsError::new(walk.shown_entry(&name), Reason::NotSocket));
        }
        Ok((walk, name))
    }

    /// After binding: make the socket at `path` owner-only, checking that
    /// it is a socket (not something swapped in).
    pub fn socket_private(&self, path: &Path) -> Result<(), FsError> {
        let (walk, name) = self.locate_socket(path)?;
        let shown = walk.shown_entry(&name);
        nix::sys::stat::fchmodat(
            walk.dir(),
            name.as_os_str(),
            Mode::from_bits_truncate(PRIVATE_FILE_MODE),
            nix::sys::stat::FchmodatFlags::FollowSymlink,
        )
        .map_err(|e| FsError::io(&shown, "made private", e))
    }

    /// Remove the socket at `path` if it is one; anything else is left alone.
    pub fn remove_socket(&self, path: &Path) -> Result<(), FsError> {
        self.remove_if(path, SFlag::S_IFSOCK)
    }

    /// Remove the regular file at `path` if it is one (never through a
    /// link; a link, directory or anything else is left alone). A missing
    /// file is not an error.
    pub fn remove_file(&self, path: &Path) -> Result<(), FsError> {
        self.remove_if(path, SFlag::S_IFREG)
    }

    /// Remove what sits at `path` when it is of kind `want`.
    fn remove_if(&self, path: &Path, want: SFlag) -> Result<(), FsError> {
        let mut walk = match Walk::new(self, path) {
            Ok(walk) => walk,
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => return Err(e),
        };
        let name = match walk.locate(None, Links::Refuse) {
            Ok(Some(name)) => name,
            Ok(None) => return Ok(()),
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => return Err(e),
        };
        match walk.stat(&name) {
            Ok(st) if kind(&st) == want => {
                unlinkat(walk.dir(), name.as_os_str(), UnlinkatFlags::NoRemoveDir)
                    .map_err(|e| FsError::io(walk.shown_entry(&name), "removed", e))
            }
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The names of the regular files directly in the directory `dir`
    /// whose names end in `suffix`, sorted, at most `max` of them (the rest
    /// are not looked at). The directory is reached like any path here
    /// (links only inside the root) and listed through its descriptor, so
    /// a link swapped in after the check is never followed; a missing
    /// directory lists nothing.
    pub fn list_files(&self, dir: &Path, suffix: &str, max: usize) -> Result<Vec<String>, FsError> {
        let mut walk = Walk::new(self, dir)?;
        walk.push_end_marker();
        match walk.locate(None, Links::Follow) {
            Ok(_) => list_dir(walk.dir(), &walk.here(), suffix, max),
            Err(e) if e.is_not_found() => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    /// Remove npc's temporary files (`.NAME.npc-PID-N.tmp`) whose process
    /// is gone from the directory `dir`. Returns how many were removed.
    pub fn sweep_temp(&self, dir: &Path) -> Result<usize, FsError> {
        let mut walk = Walk::new(self, dir)?;
        walk.push_end_marker();
        match walk.locate(None, Links::Follow) {
            Ok(_) => sweep_dir(walk.dir(), &walk.here()),
            Err(e) if e.is_not_found() => Ok(0),
            Err(e) => Err(e),
        }
    }
}

/// Read a file the user named (a command-line argument, a user-level
/// config under `$HOME`, git's `HEAD`): links are followed, since the user
/// chose the path, but only a regular file is read (checked before it is
/// opened, so a FIFO never blocks), at most `limit` bytes.
pub fn read_file(path: &Path, limit: usize) -> Result<Vec<u8>, FsError> {
    let st = nix::sys::stat::stat(path).map_err(|e| FsError::io(path, "read", e))?;
    regular(path, &st)?;
    let fd = openat(
        nix::fcntl::AT_FDCWD,
        path,
        OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| FsError::io(path, "opened", e))?;
    read_open(fd, path, &st, limit)
}

/// [`read_file`] as UTF-8 text, `None` when the file does not exist.
pub fn read_file_existing(path: &Path, limit: usize) -> Result<Option<String>, FsError> {
    match read_file(path, limit) {
        Ok(bytes) => String::from_utf8(bytes)
            .map(Some)
            .map_err(|_| FsError::new(path, Reason::NotUtf8)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

fn kind(st: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits())
}

fn describe(kind: SFlag) -> &'static str {
    match kind {
        SFlag::S_IFDIR => "a directory",
        SFlag::S_IFIFO => "a FIFO",
        SFlag::S_IFCHR => "a character device",
        SFlag::S_IFBLK => "a block device",
        SFlag::S_IFSOCK => "a socket",
        SFlag::S_IFLNK => "a symbolic link",
        _ => "not a file",
    }
}

/// Open the entry `name` of the directory `walk` stands in, read-only:
/// never through a link, never blocking (a FIFO swapped in opens and is
/// then refused by the caller's `fstat` check), never as a terminal.
fn open_entry_read_only(
    walk: &Walk<'_>,
    name: &std::ffi::OsStr,
    shown: &Path,
) -> Result<OwnedFd, FsError> {
    openat(
        walk.dir(),
        name,
        OFlag::O_RDONLY
            | OFlag::O_NOFOLLOW
            | OFlag::O_NONBLOCK
            | OFlag::O_NOCTTY
            | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| FsError::io(shown, "opened", e))
}

fn regular(shown: &Path, st: &FileStat) -> Result<(), FsError> {
    let k = kind(st);
    if k == SFlag::S_IFREG {
        Ok(())
    } else {
        Err(FsError::new(
            shown,
            Reason::NotRegular { what: describe(k) },
        ))
    }
}

/// Say that the state directory `shown` was not npc's and is now `aside`.
fn warn_moved_aside(shown: &Path, aside: &Path) {
    tracing::warn!(
        state_dir = %shown.display(),
        moved_to = %aside.display(),
        "npc did not make this state directory here (it may have come with the repository): moved aside unread, a new one made when needed"
    );
}

/// `Ok` when `st` is a file as npc makes its own: this user's, owner-only,
/// one link.
fn own(shown: &Path, st: &FileStat) -> Result<(), FsError> {
    let why = if st.st_uid != nix::unistd::geteuid().as_raw() {
        "another user owns it"
    } else if st.st_mode & 0o077 != 0 {
        "others may read or write it"
    } else if st.st_nlink != 1 {
        "it has more than one link"
    } else {
        return Ok(());
    };
    Err(FsError::new(shown, Reason::NotOwn { why }))
}

/// Read an opened file checked as `before`: still the same regular file,
/// at most `limit` bytes.
fn read_open(
    fd: OwnedFd,
    shown: &Path,
    before: &FileStat,
    limit: usize,
) -> Result<Vec<u8>, FsError> {
    let st = fstat(&fd).map_err(|e| FsError::io(shown, "read", e))?;
    regular(shown, &st)?;
    if st.st_dev != before.st_dev || st.st_ino != before.st_ino {
        return Err(FsError::io(shown, "read", Errno::EAGAIN));
    }
    // Sized from `fstat`, so a file is read in one call (and one more that
    // finds its end), not in doubling chunks; a size that lies only costs
    // the growth it saved.
    let size = usize::try_from(st.st_size).unwrap_or(0).min(limit);
    let mut bytes = Vec::with_capacity(size + 1);
    File::from(fd)
        .take(limit as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| FsError::io(shown, "read", errno_of(e)))?;
    if bytes.len() > limit {
        return Err(FsError::new(shown, Reason::TooLarge { limit }));
    }
    Ok(bytes)
}

/// Remove group and other bits from the directory `fd` when set.
fn tighten(fd: BorrowedFd<'_>, shown: &Path, mode: u32) -> Result<(), FsError> {
    let st = fstat(fd).map_err(|e| FsError::io(shown, "read", e))?;
    if st.st_mode & 0o777 & !mode != 0 {
        fchmod(fd, Mode::from_bits_truncate(st.st_mode & mode))
            .map_err(|e| FsError::io(shown, "made private", e))?;
    }
    Ok(())
}

fn errno_of(e: std::io::Error) -> Errno {
    e.raw_os_error().map(Errno::from_raw).unwrap_or(Errno::EIO)
}

/// Distinguishes temporary files of concurrent writes in one process.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

fn temp_name(name: &OsStr) -> OsString {
    let unique = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut tmp = OsString::from(".");
    tmp.push(name);
    tmp.push(format!(
        "{TEMP_MARKER}{}-{unique}{TEMP_SUFFIX}",
        std::process::id()
    ));
    tmp
}

/// The pid in one of npc's temporary file names.
fn temp_pid(name: &[u8]) -> Option<i32> {
    let name = std::str::from_utf8(name).ok()?;
    let rest = name.strip_prefix('.')?.strip_suffix(TEMP_SUFFIX)?;
    let (rest, counter) = rest.rsplit_once('-')?;
    let (_, pid) = rest.rsplit_once(TEMP_MARKER)?;
    if counter.is_empty() || !counter.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    pid.parse().ok().filter(|p| *p > 0)
}

fn pid_gone(pid: i32) -> bool {
    pid != std::process::id() as i32
        && nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) == Err(Errno::ESRCH)
}

fn list_dir(
    dir: BorrowedFd<'_>,
    shown: &Path,
    suffix: &str,
    max: usize,
) -> Result<Vec<String>, FsError> {
    let listing = nix::dir::Dir::openat(
        dir,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| FsError::io(shown, "listed", e))?;
    let mut out: Vec<String> = listing
        .into_iter()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str().ok().map(str::to_string))
        .filter(|name| name.ends_with(suffix))
        .take(max)
        .filter(|name| {
            fstatat(dir, name.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
                .is_ok_and(|st| kind(&st) == SFlag::S_IFREG)
        })
        .collect();
    out.sort();
    Ok(out)
}

fn sweep_dir(dir: BorrowedFd<'_>, shown: &Path) -> Result<usize, FsError> {
    let listing = nix::dir::Dir::openat(
        dir,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| FsError::io(shown, "listed", e))?;
    let stale: Vec<OsString> = listing
        .into_iter()
        .flatten()
        .filter(|entry| temp_pid(entry.file_name().to_bytes()).is_some_and(pid_gone))
        .map(|entry| OsStr::from_bytes(entry.file_name().to_bytes()).to_os_string())
        .collect();
    let mut removed = 0;
    for name in stale {
        let is_file = fstatat(dir, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
            .is_ok_and(|st| kind(&st) == SFlag::S_IFREG || kind(&st) == SFlag::S_IFLNK);
        if is_file && unlinkat(dir, name.as_os_str(), UnlinkatFlags::NoRemoveDir).is_ok() {
            removed += 1;
        }
    }
    Ok(removed)
}

/// `readlinkat` for messages; empty when it cannot be read.
fn link_target(dir: BorrowedFd<'_>, name: &OsStr) -> PathBuf {
    readlinkat(dir, name).map(PathBuf::from).unwrap_or_default()
}

fn stat_at(dir: BorrowedFd<'_>, name: &OsStr, shown: &Path) -> Result<FileStat, FsError> {
    fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW).map_err(|e| FsError::io(shown, "read", e))
}
