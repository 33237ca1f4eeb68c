//! npc's claim on a state directory. Everything under `.npc/` can arrive
//! with a clone, like the manifest: a token, a database with queued runs, a
//! git mirror with hooks. So a state directory is npc's only while it holds
//! the owner file ([`OWNER_FILE`]) whose digest binds it to this directory's
//! identity on this machine: its owner, its inode and its birth time (the
//! device instead where the file system keeps no birth time), values no
//! repository can know before it is cloned. One npc made is kept; anything
//! else at that name (a directory without the file or with another digest,
//! a link, a file, a directory of another user) is moved aside whole and
//! unread, as `NAME.untrusted-SECS-PID-N` beside it, and a fresh directory
//! takes its place, made complete (owner file inside) before it is renamed
//! into place, so no process ever sees a new state directory without its
//! owner file. The slow path runs under an `flock` on the parent directory,
//! so two processes starting at once move aside or create once.

use std::ffi::{OsStr, OsString};
use std::io::{Read as _, Write as _};
use std::os::fd::{AsFd as _, BorrowedFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, Flock, FlockArg, OFlag, RenameFlags, openat, renameat2};
use nix::sys::stat::{Mode, SFlag, fstat, fstatat, mkdirat};
use nix::unistd::{UnlinkatFlags, unlinkat};
use sha2::{Digest as _, Sha256};

use super::{FsError, PRIVATE_DIR_MODE, PRIVATE_FILE_MODE, kind, tighten};

/// The file in each state directory that proves npc made it here.
pub const OWNER_FILE: &str = "npc.owner";
/// What the owner file says before its digest (a new format gets a new tag).
const OWNER_TAG: &str = "npc state v1";
/// Longest owner file read; anything longer is not npc's.
const MAX_OWNER_FILE_BYTES: usize = 128;
/// Between a state directory's name and the time in the name of one that
/// was moved aside because npc did not make it.
pub const UNTRUSTED_MARK: &str = ".untrusted-";
/// Names tried for one move aside (in the same second, by the same process).
const MAX_ASIDE_NAMES: u32 = 64;
/// Prefix of the directory a new state directory is made in before it is
/// renamed into place.
const NEW_DIR_MARK: &str = ".npc-new-";

/// What [`claim`] found at the state directory's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// npc's own, made here before.
    Proven,
    /// Nothing was there; a new one was made.
    Created,
    /// Something npc did not make was there: moved aside (the name it has
    /// now, beside the state directory) and a new one made.
    Replaced { aside: OsString },
}

/// Make sure `name` in `parent` is a state directory npc made here (see
/// the module's text); `shown` names it in errors. Returns what it found
/// and the opened directory.
pub(super) fn claim(
    parent: BorrowedFd<'_>,
    name: &OsStr,
    shown: &Path,
) -> Result<(Claim, OwnedFd), FsError> {
    // Held until the new directory is in place.
    let (found, _lock) = settle(parent, name, shown)?;
    let claim = match found {
        Found::Proven(dir) => {
            tighten(dir.as_fd(), shown, PRIVATE_DIR_MODE)?;
            return Ok((Claim::Proven, dir));
        }
        Found::Absent => Claim::Created,
        Found::MovedAside(aside) => Claim::Replaced { aside },
    };
    let dir = create(parent, name, shown)?;
    Ok((claim, dir))
}

/// For a reader that makes nothing: whether `name` in `parent` is a state
/// directory npc made here. Anything else there is moved aside as
/// [`claim`] would (so no later reader adopts it) and reported absent.
pub(super) fn proven_existing(
    parent: BorrowedFd<'_>,
    name: &OsStr,
    shown: &Path,
) -> Result<Option<OsString>, FsError> {
    match settle(parent, name, shown)?.0 {
        Found::Proven(_) => Ok(None),
        Found::Absent => Err(FsError::new(shown, super::Reason::NotFound)),
        Found::MovedAside(aside) => Ok(Some(aside)),
    }
}

/// What [`settle`] left at a state directory's name.
enum Found {
    /// npc's own, opened.
    Proven(OwnedFd),
    /// Nothing.
    Absent,
    /// Nothing now: what was there (not npc's) has this name beside it.
    MovedAside(OsString),
}

/// Look at `name` in `parent`: npc's own (the fast path, no lock), else,
/// under an `flock` on `parent` (returned, for a caller that goes on to
/// make one), looked at again and anything there moved aside.
fn settle(
    parent: BorrowedFd<'_>,
    name: &OsStr,
    shown: &Path,
) -> Result<(Found, Option<Flock<OwnedFd>>), FsError> {
    if let Some(dir) = proven(parent, name) {
        return Ok((Found::Proven(dir), None));
    }
    let lock_fd = openat(
        parent,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| FsError::io(shown, "opened", e))?;
    let lock = Flock::lock(lock_fd, FlockArg::LockExclusive)
        .map_err(|(_, e)| FsError::io(shown, "locked", e))?;
    if let Some(dir) = proven(parent, name) {
        return Ok((Found::Proven(dir), Some(lock)));
    }
    let found = match fstatat(parent, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Err(Errno::ENOENT) => Found::Absent,
        Err(e) => return Err(FsError::io(shown, "read", e)),
        Ok(_) => Found::MovedAside(move_aside(parent, name, shown)?),
    };
    Ok((found, Some(lock)))
}

/// The directory `name` in `parent`, opened, when it is provably npc's.
fn proven(parent: BorrowedFd<'_>, name: &OsStr) -> Option<OwnedFd> {
    let dir = openat(
        parent,
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let expected = owner_text(dir.as_fd()).ok()?;
    let file = openat(
        dir.as_fd(),
        OWNER_FILE,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let st = fstat(&file).ok()?;
    if kind(&st) != SFlag::S_IFREG || st.st_uid != nix::unistd::geteuid().as_raw() {
        return None;
    }
    let mut text = Vec::with_capacity(MAX_OWNER_FILE_BYTES);
    std::fs::File::from(file)
        .take(MAX_OWNER_FILE_BYTES as u64 + 1)
        .read_to_end(&mut text)
        .ok()?;
    (text == expected.as_bytes()).then_some(dir)
}

/// Make a new state directory at `name`: made and given its owner file
/// under another name, then renamed into place (never over anything).
fn create(parent: BorrowedFd<'_>, name: &OsStr, shown: &Path) -> Result<OwnedFd, FsError> {
    let mut new = OsString::from(NEW_DIR_MARK);
    new.push(format!("{}-", std::process::id()));
    new.push(name);
    match mkdirat(
        parent,
        new.as_os_str(),
        Mode::from_bits_truncate(PRIVATE_DIR_MODE),
    ) {
        Ok(()) => {}
        // One a killed process of this pid left: it is ours to reuse.
        Err(Errno::EEXIST) => remove_new(parent, &new),
        Err(e) => return Err(FsError::io(shown, "created", e)),
    }
    let made = (|| {
        let dir = openat(
            parent,
            new.as_os_str(),
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        tighten(dir.as_fd(), shown, PRIVATE_DIR_MODE).map_err(|_| Errno::EPERM)?;
        let text = owner_text(dir.as_fd())?;
        let file = openat(
            dir.as_fd(),
            OWNER_FILE,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(PRIVATE_FILE_MODE),
        )?;
        let mut file = std::fs::File::from(file);
        file.write_all(text.as_bytes())
            .and_then(|()| file.sync_all())
            .map_err(super::errno_of)?;
        renameat2(
            parent,
            new.as_os_str(),
            parent,
            name,
            RenameFlags::RENAME_NOREPLACE,
        )?;
        Ok(dir)
    })();
    made.map_err(|e| {
        remove_new(parent, &new);
        FsError::io(shown, "created", e)
    })
}

/// Remove a half-made new state directory (only the owner file can be in it).
fn remove_new(parent: BorrowedFd<'_>, new: &OsStr) {
    if let Ok(dir) = openat(
        parent,
        new,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        let _ = unlinkat(dir.as_fd(), OWNER_FILE, UnlinkatFlags::NoRemoveDir);
    }
    let _ = unlinkat(parent, new, UnlinkatFlags::RemoveDir);
}

/// Move what is at `name` aside, never over anything: to
/// `NAME.untrusted-SECS-PID-N`, the first such name that is free. Returns
/// the name it has now.
fn move_aside(parent: BorrowedFd<'_>, name: &OsStr, shown: &Path) -> Result<OsString, FsError> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let mut last = Errno::EEXIST;
    for n in 0..MAX_ASIDE_NAMES {
        let mut aside = name.to_os_string();
        aside.push(format!("{UNTRUSTED_MARK}{secs}-{}-{n}", std::process::id()));
        match renameat2(
            parent,
            name,
            parent,
            aside.as_os_str(),
            RenameFlags::RENAME_NOREPLACE,
        ) {
            Ok(()) => return Ok(aside),
            Err(Errno::EEXIST) => last = Errno::EEXIST,
            Err(e) => {
                last = e;
                break;
            }
        }
    }
    Err(FsError::io(shown, "moved aside", last))
}

/// What the owner file of the directory `dir` says: the tag and a digest
/// of the directory's identity on this machine.
fn owner_text(dir: BorrowedFd<'_>) -> Result<String, Errno> {
    use rustix::fs::{AtFlags as StatxAt, StatxFlags};
    let st = rustix::fs::statx(
        dir,
        "",
        StatxAt::EMPTY_PATH,
        StatxFlags::BASIC_STATS | StatxFlags::BTIME,
    )
    .map_err(|e| Errno::from_raw(e.raw_os_error()))?;
    let mut digest = Sha256::new();
    digest.update(OWNER_TAG.as_bytes());
    digest.update(st.stx_uid.to_le_bytes());
    digest.update(st.stx_ino.to_le_bytes());
    if st.stx_mask & StatxFlags::BTIME.bits() != 0 {
        digest.update(b"btime");
        digest.update(st.stx_btime.tv_sec.to_le_bytes());
        digest.update(st.stx_btime.tv_nsec.to_le_bytes());
    } else {
        digest.update(b"dev");
        digest.update(st.stx_dev_major.to_le_bytes());
        digest.update(st.stx_dev_minor.to_le_bytes());
    }
    Ok(format!("{OWNER_TAG} {}\n", hex::encode(digest.finalize())))
}
