//! Path resolution inside a [`Root`]: one component at a time from an open
//! directory descriptor, `O_NOFOLLOW` everywhere, symbolic links read with
//! `readlinkat` and followed here only while they stay inside the root.
//! `..` never climbs above the root: climbing out through a link is an
//! [`Reason::Escapes`] naming that link, climbing out in the path itself is
//! [`Reason::Outside`].

use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::rc::Rc;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat, readlinkat};
use nix::sys::stat::{FileStat, Mode, SFlag, fstatat, mkdirat};

use super::{
    FsError, Links, MAX_LINK_HOPS, PRIVATE_DIR_MODE, Perms, Reason, Root, SHARED_MODE, kind,
};

/// The link a component came from, for error messages.
#[derive(Debug)]
struct Via {
    link: PathBuf,
    target: PathBuf,
}

#[derive(Debug)]
struct Part {
    name: OsString,
    via: Option<Rc<Via>>,
}

/// One resolution in progress: the directories entered so far (each an
/// open descriptor) and the components still to walk.
#[derive(Debug)]
pub(super) struct Walk<'a> {
    root: &'a Root,
    root_fd: OwnedFd,
    /// The path as asked for, relative to the root where possible.
    input: PathBuf,
    stack: Vec<(OwnedFd, OsString)>,
    pending: VecDeque<Part>,
    hops: usize,
    /// What `lstat` said of the last component while [`Walk::locate`]
    /// looked for a link there, so [`Walk::stat`] need not ask again.
    last: Option<(OsString, FileStat)>,
}

fn parts(path: &Path, via: Option<&Rc<Via>>) -> Vec<Part> {
    path.components()
        .filter_map(|c| {
            let name = match c {
                Component::Normal(n) => n.to_os_string(),
                Component::ParentDir => OsString::from(".."),
                Component::CurDir => OsString::from("."),
                Component::RootDir | Component::Prefix(_) => return None,
            };
            Some(Part {
                name,
                via: via.cloned(),
            })
        })
        .collect()
}

impl<'a> Walk<'a> {
    pub(super) fn new(root: &'a Root, path: &Path) -> Result<Self, FsError> {
        let rel = if path.is_absolute() {
            path.strip_prefix(&root.dir)
                .or_else(|_| path.strip_prefix(&root.given))
                .map_err(|_| {
                    FsError::new(
                        path,
                        Reason::Outside {
                            root: root.dir.clone(),
                        },
                    )
                })?
        } else {
            path
        };
        Ok(Self {
            root,
            root_fd: root.open_root()?,
            input: rel.to_path_buf(),
            stack: Vec::new(),
            pending: parts(rel, None).into(),
            hops: 0,
            last: None,
        })
    }

    /// Make every component a directory (the last one included).
    pub(super) fn push_end_marker(&mut self) {
        self.pending.push_back(Part {
            name: OsString::from("."),
            via: None,
        });
    }

    /// The directory reached so far.
    pub(super) fn dir(&self) -> BorrowedFd<'_> {
        self.stack
            .last()
            .map_or(self.root_fd.as_fd(), |(fd, _)| fd.as_fd())
    }

    fn here_rel(&self) -> PathBuf {
        self.stack.iter().map(|(_, n)| n.as_os_str()).collect()
    }

    /// Real absolute path of the directory reached so far.
    pub(super) fn here(&self) -> PathBuf {
        self.root.dir.join(self.here_rel())
    }

    /// `name` in the current directory, relative to the root, for messages.
    pub(super) fn shown_entry(&self, name: &OsStr) -> PathBuf {
        self.here_rel().join(name)
    }

    /// `lstat` of `name` in the directory reached (the answer
    /// [`locate`](Self::locate) already had, when it looked there).
    pub(super) fn stat(&self, name: &OsStr) -> Result<FileStat, FsError> {
        match &self.last {
            Some((seen, st)) if seen == name => Ok(*st),
            _ => super::stat_at(self.dir(), name, &self.shown_entry(name)),
        }
    }

    pub(super) fn link_target(&self, name: &OsStr) -> PathBuf {
        super::link_target(self.dir(), name)
    }

    /// Walk every component but the last; return the last (`None` when the
    /// path ends at a directory: the root, `..`, or after
    /// [`push_end_marker`](Self::push_end_marker)). With `create`, missing
    /// directories are made. With [`Links::Follow`] a link at the last
    /// component is followed too (inside the root only).
    pub(super) fn locate(
        &mut self,
        create: Option<Perms>,
        links: Links,
    ) -> Result<Option<OsString>, FsError> {
        while let Some(part) = self.pending.pop_front() {
            if part.name == "." {
                continue;
            }
            if part.name == ".." {
                if self.stack.pop().is_none() {
                    return Err(self.climbed_out(part.via.as_deref()));
                }
                continue;
            }
            if self.pending.is_empty() {
                if links == Links::Follow
                    && let Ok(st) = fstatat(
                        self.dir(),
                        part.name.as_os_str(),
                        AtFlags::AT_SYMLINK_NOFOLLOW,
                    )
                {
                    if kind(&st) == SFlag::S_IFLNK {
                        self.follow(&part.name)?;
                        continue;
                    }
                    self.last = Some((part.name.clone(), st));
                }
                return Ok(Some(part.name));
            }
            let opened = openat(
                self.dir(),
                part.name.as_os_str(),
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            );
            match opened {
                Ok(fd) => self.stack.push((fd, part.name)),
                Err(open_error) => {
                    match fstatat(
                        self.dir(),
                        part.name.as_os_str(),
                        AtFlags::AT_SYMLINK_NOFOLLOW,
                    ) {
                        Ok(st) if kind(&st) == SFlag::S_IFLNK => self.follow(&part.name)?,
                        Ok(st) if kind(&st) != SFlag::S_IFDIR => {
                            return Err(FsError::new(self.shown_entry(&part.name), Reason::NotDir));
                        }
                        Ok(_) => {
                            return Err(FsError::io(
                                self.shown_entry(&part.name),
                                "opened",
                                open_error,
                            ));
                        }
                        Err(Errno::ENOENT) => {
                            let Some(perms) = create else {
                                return Err(FsError::new(self.input.clone(), Reason::NotFound));
                            };
                            let mode = match perms {
                                Perms::Private => PRIVATE_DIR_MODE,
                                Perms::Shared => SHARED_MODE,
                            };
                            match mkdirat(
                                self.dir(),
                                part.name.as_os_str(),
                                Mode::from_bits_truncate(mode),
                            ) {
                                Ok(()) | Err(Errno::EEXIST) => {}
                                Err(e) => {
                                    return Err(FsError::io(
                                        self.shown_entry(&part.name),
                                        "created",
                                        e,
                                    ));
                                }
                            }
                            // Open what is there now (it may be a link a
                            // racing process made: the next round checks it).
                            self.pending.push_front(part);
                        }
                        Err(e) => {
                            return Err(FsError::io(self.shown_entry(&part.name), "opened", e));
                        }
                    }
                }
            }
        }
        Ok(None)
    }

    /// Replace the link `name` (in the current directory) by its target's
    /// components, or refuse it when the target leaves the root.
    fn follow(&mut self, name: &OsStr) -> Result<(), FsError> {
        self.hops += 1;
        if self.hops > MAX_LINK_HOPS {
            return Err(FsError::new(self.input.clone(), Reason::TooManyLinks));
        }
        let link = self.shown_entry(name);
        let target = readlinkat(self.dir(), name)
            .map(PathBuf::from)
            .map_err(|e| FsError::io(&link, "read", e))?;
        let via = Rc::new(Via {
            link,
            target: target.clone(),
        });
        let rest = if target.is_absolute() {
            let inside = target
                .strip_prefix(&self.root.dir)
                .or_else(|_| target.strip_prefix(&self.root.given))
                .map_err(|_| self.escapes(&via))?;
            self.stack.clear();
            parts(inside, Some(&via))
        } else {
            parts(&target, Some(&via))
        };
        for part in rest.into_iter().rev() {
            self.pending.push_front(part);
        }
        Ok(())
    }

    fn escapes(&self, via: &Via) -> FsError {
        FsError::new(
            self.input.clone(),
            Reason::Escapes {
                root: self.root.dir.clone(),
                link: via.link.clone(),
                target: via.target.clone(),
            },
        )
    }

    /// `..` at the root: through a link, or in the path itself.
    fn climbed_out(&self, via: Option<&Via>) -> FsError {
        match via {
            Some(via) => self.escapes(via),
            None => FsError::new(
                self.input.clone(),
                Reason::Outside {
                    root: self.root.dir.clone(),
                },
            ),
        }
    }
}
