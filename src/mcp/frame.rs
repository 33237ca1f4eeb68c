//! Newline-delimited JSON-RPC frames, as both sides of npc's stdio MCP
//! sessions read them: the gateway's session from its client
//! ([`super::session`]) and the lean wire to a stdio upstream
//! ([`super::wire`]). A line longer than the reader's bound is never
//! buffered past the bound: it is reported as [`Frame::TooLong`], either
//! once it ends (and dropped whole, [`Overlong::Skip`]) or as soon as it
//! passes the bound ([`Overlong::Stop`], for a peer whose session ends
//! there). Reading is cancel-safe, so a reader can sit in a `select!`.

use tokio::io::{AsyncBufReadExt as _, AsyncRead, BufReader};

/// `message` as one frame: its JSON on one line (serde_json escapes every
/// newline inside strings), then `\n`.
pub(crate) fn encode<T: serde::Serialize + ?Sized>(message: &T) -> serde_json::Result<Vec<u8>> {
    let mut frame = serde_json::to_vec(message)?;
    frame.push(b'\n');
    Ok(frame)
}

/// Read buffer of a [`FrameReader`].
const READ_BUFFER_BYTES: usize = 64 * 1024;

/// A frame read from the peer.
#[derive(Debug, PartialEq)]
pub(crate) enum Frame {
    Line(Vec<u8>),
    /// A line longer than the reader's bound, dropped.
    TooLong,
    Eof,
}

/// What a [`FrameReader`] does with a line that grows past its bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Overlong {
    /// Read on to its end, keeping nothing, then report it: the session
    /// goes on with the next line.
    Skip,
    /// Report it at once: the caller ends the session.
    Stop,
}

/// Reads lines of at most `max` bytes; cancel-safe (all state is here).
pub(crate) struct FrameReader<R> {
    inner: BufReader<R>,
    line: Vec<u8>,
    max: usize,
    overlong: Overlong,
    /// Skipping the rest of a line that grew past `max`.
    skipping: bool,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub(crate) fn new(read: R, max: usize, overlong: Overlong) -> Self {
        Self {
            inner: BufReader::with_capacity(READ_BUFFER_BYTES, read),
            line: Vec::new(),
            max,
            overlong,
            skipping: false,
        }
    }

    /// The next frame: a line without its newline (blank lines are
    /// skipped), a line over the bound (dropped whole), or the end.
    pub(crate) async fn next(&mut self) -> std::io::Result<Frame> {
        loop {
            let available = self.inner.fill_buf().await?;
            if available.is_empty() {
                // A last line without its newline is still a frame.
                let rest = std::mem::take(&mut self.line);
                return Ok(match (self.skipping, rest.is_empty()) {
                    (true, _) => {
                        self.skipping = false;
                        Frame::TooLong
                    }
                    (false, true) => Frame::Eof,
                    (false, false) => Frame::Line(rest),
                });
            }
            let (taken, ended) = match memchr(available) {
                Some(at) => (at + 1, true),
                None => (available.len(), false),
            };
            if !self.skipping {
                let keep = if ended { taken - 1 } else { taken };
                if self.line.len() + keep > self.max {
                    self.line = Vec::new();
                    if self.overlong == Overlong::Stop {
                        self.inner.consume(taken);
                        return Ok(Frame::TooLong);
                    }
                    self.skipping = true;
                } else {
                    self.line.extend_from_slice(&available[..keep]);
                }
            }
            self.inner.consume(taken);
            if ended {
                if std::mem::take(&mut self.skipping) {
                    return Ok(Frame::TooLong);
                }
                let line = std::mem::take(&mut self.line);
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return Ok(Frame::Line(line));
            }
        }
    }
}

fn memchr(bytes: &[u8]) -> Option<usize> {
    bytes.iter().position(|&b| b == b'\n')
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn frames(input: &[u8], max: usize) -> Vec<Frame> {
        let mut reader = FrameReader::new(input, max, Overlong::Skip);
        let mut out = Vec::new();
        loop {
            let frame = reader.next().await.unwrap();
            let eof = frame == Frame::Eof;
            out.push(frame);
            if eof {
                return out;
            }
        }
    }

    #[tokio::test]
    async fn frames_are_lines_and_overlong_ones_are_dropped_whole() {
        let long = "x".repeat(40);
        let input = format!("a\n\n  \n{long}\nb\r\n{long}{long}\nc");
        assert_eq!(
            frames(input.as_bytes(), 32).await,
            vec![
                Frame::Line(b"a".to_vec()),
                Frame::TooLong,
                Frame::Line(b"b\r".to_vec()),
                Frame::TooLong,
                Frame::Line(b"c".to_vec()),
                Frame::Eof,
            ]
        );
        // Exactly the bound is accepted; an unterminated overlong tail is dropped.
        let exact = "y".repeat(32);
        assert_eq!(
            frames(format!("{exact}\n{long}").as_bytes(), 32).await,
            vec![Frame::Line(exact.into_bytes()), Frame::TooLong, Frame::Eof]
        );
    }

    #[tokio::test]
    async fn a_stopping_reader_reports_an_overlong_line_before_it_ends() {
        let (mut peer, read) = tokio::io::duplex(1024);
        let mut reader = FrameReader::new(read, 32, Overlong::Stop);
        tokio::io::AsyncWriteExt::write_all(&mut peer, b"ok\n")
            .await
            .unwrap();
        assert_eq!(reader.next().await.unwrap(), Frame::Line(b"ok".to_vec()));
        // The line never ends and the peer stays: reported at the bound.
        for _ in 0..2 {
            tokio::io::AsyncWriteExt::write_all(&mut peer, &[b'x'; 20])
                .await
                .unwrap();
        }
        assert_eq!(reader.next().await.unwrap(), Frame::TooLong);
    }
}
