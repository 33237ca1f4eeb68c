//! The standard streams `npc mcp serve` speaks MCP on, driven by the IO
//! reactor instead of tokio's blocking pool. `tokio::io::stdin()` and
//! `stdout()` run every read and write on a pool thread, which costs a
//! cross-thread hand-off (two context switches) per frame; the gateway is
//! on the path of every tool call, so [`std_streams`] avoids that where the
//! stream allows it:
//!
//! - a pipe or FIFO (how Rust, Python and Go clients start stdio servers) is
//!   reopened through `/proc/self/fd` with `O_NONBLOCK`: a new open file
//!   description, so the flag never leaks into the process's own standard
//!   streams or anything that shares them;
//! - a Unix socket (libuv, hence Node clients such as Claude Code and Gemini
//!   CLI, hands stdio over socketpairs) is duplicated and read and written
//!   with `MSG_DONTWAIT`, so its file status flags are never changed;
//! - anything else (a terminal, a file) keeps tokio's blocking handles.
//!
//! Architecture invariant: nothing here changes the flags of the process's
//! file descriptors 0 and 1.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use nix::sys::socket::{MsgFlags, recv, send};
use nix::sys::stat::{SFlag, fstat};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::unix::pipe;

/// What a standard stream is, as far as the transport cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StreamKind {
    Fifo,
    Socket,
    Other,
}

fn kind_of(fd: impl AsFd) -> StreamKind {
    match fstat(fd) {
        Ok(stat) => {
            let format = SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT;
            if format == SFlag::S_IFIFO {
                StreamKind::Fifo
            } else if format == SFlag::S_IFSOCK {
                StreamKind::Socket
            } else {
                StreamKind::Other
            }
        }
        Err(_) => StreamKind::Other,
    }
}

/// `fd` reopened on its own open file description, non-blocking.
fn reopen_nonblocking(fd: i32, write: bool) -> Option<OwnedFd> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(!write)
        .write(write)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(format!("/proc/self/fd/{fd}"))
        .ok()
        .map(OwnedFd::from)
}

/// A duplicate of a socket standard stream, registered with the reactor.
#[allow(unsafe_code)]
fn socket_half(fd: impl AsFd) -> Option<AsyncFd<OwnedFd>> {
    let owned = fd.as_fd().try_clone_to_owned().ok()?;
    // SAFETY: `owned` is a valid descriptor the `AsyncFd` owns: it stays
    // open, on the same description, until the `AsyncFd` is dropped, and
    // `OwnedFd::as_raw_fd` always returns it.
    unsafe { AsyncFd::register(owned) }.ok()
}

/// Standard input, readable without the blocking pool where possible.
#[derive(Debug)]
pub enum StdinReader {
    Fifo(pipe::Receiver),
    Socket(AsyncFd<OwnedFd>),
    Blocking(tokio::io::Stdin),
}

/// Standard output, writable without the blocking pool where possible.
#[derive(Debug)]
pub enum StdoutWriter {
    Fifo(pipe::Sender),
    Socket(AsyncFd<OwnedFd>),
    Blocking(tokio::io::Stdout),
}

/// This process's stdin and stdout for a protocol. Call inside a tokio
/// runtime with IO enabled.
pub fn std_streams() -> (StdinReader, StdoutWriter) {
    (stdin_reader(), stdout_writer())
}

fn stdin_reader() -> StdinReader {
    let stdin = io::stdin();
    let fifo = || {
        let fd = reopen_nonblocking(stdin.as_raw_fd(), false)?;
        pipe::Receiver::from_owned_fd(fd).ok()
    };
    let reader = match kind_of(&stdin) {
        StreamKind::Fifo => fifo().map(StdinReader::Fifo),
        StreamKind::Socket => socket_half(&stdin).map(StdinReader::Socket),
        StreamKind::Other => None,
    };
    reader.unwrap_or_else(|| StdinReader::Blocking(tokio::io::stdin()))
}

fn stdout_writer() -> StdoutWriter {
    let stdout = io::stdout();
    let fifo = || {
        let fd = reopen_nonblocking(stdout.as_raw_fd(), true)?;
        pipe::Sender::from_owned_fd(fd).ok()
    };
    let writer = match kind_of(&stdout) {
        StreamKind::Fifo => fifo().map(StdoutWriter::Fifo),
        StreamKind::Socket => socket_half(&stdout).map(StdoutWriter::Socket),
        StreamKind::Other => None,
    };
    writer.unwrap_or_else(|| StdoutWriter::Blocking(tokio::io::stdout()))
}

impl AsyncRead for StdinReader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Fifo(r) => Pin::new(r).poll_read(cx, buf),
            Self::Blocking(r) => Pin::new(r).poll_read(cx, buf),
            Self::Socket(fd) => loop {
                let mut guard = ready!(fd.poll_read_ready(cx))?;
                let unfilled = buf.initialize_unfilled();
                match guard.try_io(|fd| {
                    recv(fd.as_raw_fd(), unfilled, MsgFlags::MSG_DONTWAIT).map_err(io::Error::from)
                }) {
                    Ok(Ok(n)) => {
                        buf.advance(n);
                        return Poll::Ready(Ok(()));
                    }
                    Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                    Ok(Err(e)) => return Poll::Ready(Err(e)),
                    Err(_would_block) => {}
                }
            },
        }
    }
}

impl AsyncWrite for StdoutWriter {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Fifo(w) => Pin::new(w).poll_write(cx, data),
            Self::Blocking(w) => Pin::new(w).poll_write(cx, data),
            Self::Socket(fd) => loop {
                let mut guard = ready!(fd.poll_write_ready(cx))?;
                // MSG_NOSIGNAL: a client that went away is an error here,
                // never a SIGPIPE.
                let flags = MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL;
                match guard.try_io(|fd| send(fd.as_raw_fd(), data, flags).map_err(io::Error::from))
                {
                    Ok(Ok(n)) => return Poll::Ready(Ok(n)),
                    Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                    Ok(Err(e)) => return Poll::Ready(Err(e)),
                    Err(_would_block) => {}
                }
            },
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Fifo(w) => Pin::new(w).poll_flush(cx),
            Self::Blocking(w) => Pin::new(w).poll_flush(cx),
            // Every byte `send` accepted is in the socket already.
            Self::Socket(_) => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Fifo(w) => Pin::new(w).poll_shutdown(cx),
            Self::Blocking(w) => Pin::new(w).poll_shutdown(cx),
            // The peer sees the end when the process's descriptors close.
            Self::Socket(_) => Poll::Ready(Ok(())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_kinds_are_recognised() {
        let (r, _w) = nix::unistd::pipe().unwrap();
        assert_eq!(kind_of(&r), StreamKind::Fifo);
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert_eq!(kind_of(&a), StreamKind::Socket);
        let file = tempfile::tempfile().unwrap();
        assert_eq!(kind_of(&file), StreamKind::Other);
    }

    #[tokio::test]
    async fn a_socket_half_reads_and_writes_without_touching_the_flags() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let flags_before = nix::fcntl::fcntl(&ours, nix::fcntl::FcntlArg::F_GETFL).unwrap();
        let mut reader = StdinReader::Socket(socket_half(&ours).unwrap());
        let mut writer = StdoutWriter::Socket(socket_half(&ours).unwrap());
        let mut peer = tokio::net::UnixStream::from_std({
            theirs.set_nonblocking(true).unwrap();
            theirs
        })
        .unwrap();
        writer.write_all(b"{\"jsonrpc\":\"2.0\"}\n").await.unwrap();
        let mut got = [0u8; 18];
        peer.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"{\"jsonrpc\":\"2.0\"}\n");
        peer.write_all(b"pong\n").await.unwrap();
        let mut back = [0u8; 5];
        reader.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"pong\n");
        drop(peer);
        let mut rest = Vec::new();
        reader.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty(), "a closed peer reads as end of stream");
        let flags_after = nix::fcntl::fcntl(&ours, nix::fcntl::FcntlArg::F_GETFL).unwrap();
        assert_eq!(
            flags_before, flags_after,
            "the stream's flags are untouched"
        );
    }
}
