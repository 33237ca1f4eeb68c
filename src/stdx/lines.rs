//! Bounded newline-delimited reading, the one piece of code every reader of
//! lines from a peer, a child or a file uses: a [`Splitter`] (feed it
//! chunks, get lines back) and a [`LineReader`] over any `AsyncRead` built
//! on it. No line is ever held past its bound; what happens to a longer
//! one is the caller's [`Overlong`] policy: dropped whole and reported once
//! it ends ([`Overlong::Skip`]), reported as soon as it passes the bound so
//! the caller can end the stream ([`Overlong::Stop`]: an error for it), or
//! cut to the bound and flagged ([`Overlong::Truncate`]). Reading is
//! cancel-safe: all state lives in the reader, so it can sit in a
//! `select!`. [`encode`] writes the frames such readers read.

use tokio::io::{AsyncBufReadExt as _, AsyncRead, BufReader};

/// Read buffer of a [`LineReader`] unless the caller picks one.
pub const READ_BUFFER_BYTES: usize = 64 * 1024;

/// What happens to a line longer than the bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overlong {
    /// Read on to its end, keeping nothing, then report
    /// [`Piece::TooLong`]: the stream goes on with the next line.
    Skip,
    /// Report [`Piece::TooLong`] as soon as the line passes the bound; the
    /// caller ends the stream (it is an error for it).
    Stop,
    /// Keep the first `max` bytes, drop the rest, and report the line as
    /// [`Piece::Truncated`] once it ends.
    Truncate,
}

/// A line the splitter hands back.
#[derive(Debug, PartialEq, Eq)]
pub enum Piece<'a> {
    /// A complete line without its newline.
    Line(&'a [u8]),
    /// The first `max` bytes of a longer line ([`Overlong::Truncate`]).
    Truncated(&'a [u8]),
    /// A line longer than the bound; `bytes` of it were seen (all of it,
    /// except under [`Overlong::Stop`]).
    TooLong { bytes: usize },
}

/// An owned [`Piece`], as [`LineReader::next`] returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    Line(Vec<u8>),
    Truncated(Vec<u8>),
    TooLong { bytes: usize },
}

impl Piece<'_> {
    pub fn to_owned(&self) -> Line {
        match self {
            Piece::Line(l) => Line::Line(l.to_vec()),
            Piece::Truncated(l) => Line::Truncated(l.to_vec()),
            Piece::TooLong { bytes } => Line::TooLong { bytes: *bytes },
        }
    }
}

/// Splits a byte stream into lines of at most `max` bytes.
#[derive(Debug, Clone)]
pub struct Splitter {
    max: usize,
    overlong: Overlong,
    trim_cr: bool,
    skip_blank: bool,
    /// The current line's bytes kept so far (a line that ended inside one
    /// chunk is handed back from the chunk, never copied here).
    line: Vec<u8>,
    /// Bytes of the current line seen so far.
    seen: usize,
    /// The current line passed the bound (skipped or truncated from here).
    over: bool,
    /// `line` was handed back; clear it before the next byte.
    handed: bool,
}

impl Splitter {
    pub fn new(max: usize, overlong: Overlong) -> Self {
        Self {
            max,
            overlong,
            trim_cr: false,
            skip_blank: false,
            line: Vec::new(),
            seen: 0,
            over: false,
            handed: false,
        }
    }

    /// Hand lines back without a trailing `\r` (CRLF input).
    pub fn trim_cr(mut self) -> Self {
        self.trim_cr = true;
        self
    }

    /// Hand back no line that is empty or only whitespace.
    pub fn skip_blank(mut self) -> Self {
        self.skip_blank = true;
        self
    }

    /// Whether part of a line waits for its end.
    pub fn has_partial(&self) -> bool {
        self.seen > 0
    }

    /// Take bytes of `chunk` up to and including its first newline (all of
    /// it when it has none); returns how many, and the line that ended (or,
    /// under [`Overlong::Stop`], passed the bound) with them.
    pub fn push<'a>(&'a mut self, chunk: &'a [u8]) -> (usize, Option<Piece<'a>>) {
        if std::mem::take(&mut self.handed) {
            self.line.clear();
        }
        let (part, used, ends) = match chunk.iter().position(|&b| b == b'\n') {
            Some(at) => (&chunk[..at], at + 1, true),
            None => (chunk, chunk.len(), false),
        };
        let buffered = self.seen;
        self.seen = self.seen.saturating_add(part.len());
        if !self.over && self.seen > self.max {
            self.over = true;
            match self.overlong {
                Overlong::Stop => {
                    let bytes = self.seen;
                    self.reset();
                    return (used, Some(Piece::TooLong { bytes }));
                }
                Overlong::Skip => self.line = Vec::new(),
                Overlong::Truncate => {
                    let room = self.max.saturating_sub(self.line.len());
                    self.line.extend_from_slice(&part[..room.min(part.len())]);
                }
            }
        } else if !self.over && (!ends || buffered > 0) {
            self.line.extend_from_slice(part);
        }
        if !ends {
            return (used, None);
        }
        let (bytes, over) = (self.seen, self.over);
        self.seen = 0;
        self.over = false;
        if over {
            return match self.overlong {
                Overlong::Truncate => {
                    self.handed = true;
                    (used, Some(Piece::Truncated(&self.line)))
                }
                _ => {
                    self.line = Vec::new();
                    (used, Some(Piece::TooLong { bytes }))
                }
            };
        }
        self.handed = true;
        // A line within one chunk is handed back from the chunk itself.
        let line: &[u8] = if buffered == 0 { part } else { &self.line };
        (used, self.whole(line))
    }

    /// The end of the stream: the unterminated rest, if any.
    pub fn finish(&mut self) -> Option<Piece<'_>> {
        if std::mem::take(&mut self.handed) {
            self.line.clear();
        }
        let (bytes, over) = (self.seen, self.over);
        self.reset_counts();
        if bytes == 0 {
            return None;
        }
        self.handed = true;
        match (over, self.overlong) {
            (true, Overlong::Truncate) => Some(Piece::Truncated(&self.line)),
            (true, _) => Some(Piece::TooLong { bytes }),
            (false, _) => self.whole(&self.line),
        }
    }

    fn whole<'a>(&self, line: &'a [u8]) -> Option<Piece<'a>> {
        let line = if self.trim_cr {
            line.strip_suffix(b"\r").unwrap_or(line)
        } else {
            line
        };
        if self.skip_blank && line.iter().all(u8::is_ascii_whitespace) {
            return None;
        }
        Some(Piece::Line(line))
    }

    fn reset_counts(&mut self) {
        self.seen = 0;
        self.over = false;
    }

    fn reset(&mut self) {
        self.reset_counts();
        self.line = Vec::new();
    }

    /// One step of a reader over a buffer: `available` is what the buffer
    /// holds (empty at the end of the input). Returns how much to consume
    /// and, when a line is done, `Some` of it (`Some(None)`: the input ended).
    fn step(&mut self, available: &[u8]) -> (usize, Option<Option<Line>>) {
        if available.is_empty() {
            return (0, Some(self.finish().map(|p| p.to_owned())));
        }
        let (used, piece) = self.push(available);
        (used, piece.map(|p| Some(p.to_owned())))
    }

    /// Feed a whole chunk; `f` is called once per finished line, in order.
    pub fn feed(&mut self, mut chunk: &[u8], mut f: impl FnMut(Piece<'_>)) {
        while !chunk.is_empty() {
            let (used, piece) = self.push(chunk);
            if let Some(piece) = piece {
                f(piece);
            }
            chunk = &chunk[used..];
        }
    }
}

/// Reads bounded lines from `R` (see [`Splitter`]); cancel-safe.
#[derive(Debug)]
pub struct LineReader<R> {
    inner: BufReader<R>,
    splitter: Splitter,
}

impl<R: AsyncRead + Unpin> LineReader<R> {
    /// Lines of `read` as `splitter` cuts them, read [`READ_BUFFER_BYTES`] at a time.
    pub fn new(read: R, splitter: Splitter) -> Self {
        Self::with_capacity(READ_BUFFER_BYTES, read, splitter)
    }

    pub fn with_capacity(capacity: usize, read: R, splitter: Splitter) -> Self {
        Self {
            inner: BufReader::with_capacity(capacity, read),
            splitter,
        }
    }

    /// The next line; `None` at the end of the input (a last line without
    /// its newline still counts).
    pub async fn next(&mut self) -> std::io::Result<Option<Line>> {
        loop {
            let available = self.inner.fill_buf().await?;
            let (used, step) = self.splitter.step(available);
            self.inner.consume(used);
            if let Some(line) = step {
                return Ok(line);
            }
        }
    }

    /// The reader underneath, with the bytes it buffered after the last
    /// line handed back (a connection that switches protocols after a
    /// line keeps them).
    pub fn into_inner(self) -> BufReader<R> {
        self.inner
    }
}

/// [`LineReader`] over a blocking `std::io::Read` (a file, a pipe read on
/// its own thread).
#[derive(Debug)]
pub struct BlockingLineReader<R> {
    inner: std::io::BufReader<R>,
    splitter: Splitter,
}

impl<R: std::io::Read> BlockingLineReader<R> {
    pub fn new(read: R, splitter: Splitter) -> Self {
        Self {
            inner: std::io::BufReader::with_capacity(READ_BUFFER_BYTES, read),
            splitter,
        }
    }

    /// The next line; `None` at the end of the input.
    pub fn next_line(&mut self) -> std::io::Result<Option<Line>> {
        use std::io::BufRead as _;
        loop {
            let available = self.inner.fill_buf()?;
            let (used, step) = self.splitter.step(available);
            self.inner.consume(used);
            if let Some(line) = step {
                return Ok(line);
            }
        }
    }
}

/// `message` as one frame: its JSON on one line (serde_json escapes every
/// newline inside strings), then `\n`.
pub fn encode<T: serde::Serialize + ?Sized>(message: &T) -> serde_json::Result<Vec<u8>> {
    let mut frame = serde_json::to_vec(message)?;
    frame.push(b'\n');
    Ok(frame)
}

#[cfg(test)]
mod tests;
