//! Incremental, bounded line splitting for a child's stdout or stderr:
//! feed arbitrary chunks, get whole lines back. A line longer than the bound
//! is dropped (only its length is reported) so a hostile or broken child
//! cannot make npc buffer without limit.

/// What the splitter hands back for each line.
#[derive(Debug, PartialEq, Eq)]
pub enum Piece<'a> {
    /// A complete line without its `\n` (and without a trailing `\r`).
    Line(&'a [u8]),
    /// A line longer than the bound; its bytes were discarded.
    TooLong { bytes: usize },
}

/// Splits a byte stream into lines of at most `max` bytes.
#[derive(Debug)]
pub struct LineSplitter {
    max: usize,
    buf: Vec<u8>,
    /// Bytes of the current line thrown away since it passed the bound.
    discarding: Option<usize>,
}

fn trim_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

impl LineSplitter {
    pub fn new(max: usize) -> Self {
        Self {
            max,
            buf: Vec::new(),
            discarding: None,
        }
    }

    /// Feed a chunk; `f` is called once per finished line, in order.
    pub fn feed(&mut self, mut chunk: &[u8], mut f: impl FnMut(Piece<'_>)) {
        while !chunk.is_empty() {
            let newline = chunk.iter().position(|&b| b == b'\n');
            let (part, rest, ends) = match newline {
                Some(i) => (&chunk[..i], &chunk[i + 1..], true),
                None => (chunk, &[][..], false),
            };
            chunk = rest;
            if let Some(dropped) = self.discarding.as_mut() {
                *dropped += part.len();
                if ends {
                    f(Piece::TooLong { bytes: *dropped });
                    self.discarding = None;
                }
                continue;
            }
            if self.buf.len() + part.len() > self.max {
                self.discarding = Some(self.buf.len() + part.len());
                self.buf.clear();
                if ends {
                    f(Piece::TooLong {
                        bytes: self.discarding.take().unwrap_or(0),
                    });
                }
                continue;
            }
            if !ends {
                self.buf.extend_from_slice(part);
            } else if self.buf.is_empty() {
                f(Piece::Line(trim_cr(part)));
            } else {
                self.buf.extend_from_slice(part);
                f(Piece::Line(trim_cr(&self.buf)));
                self.buf.clear();
            }
        }
    }

    /// The end of the stream: the unterminated rest, if any. A line that was
    /// being discarded is reported as too long.
    pub fn finish(&mut self, mut f: impl FnMut(Piece<'_>)) {
        if let Some(dropped) = self.discarding.take() {
            f(Piece::TooLong { bytes: dropped });
        } else if !self.buf.is_empty() {
            f(Piece::Line(trim_cr(&self.buf)));
        }
        self.buf.clear();
    }

    /// True when a partial line is waiting for its end.
    pub fn has_partial(&self) -> bool {
        !self.buf.is_empty() || self.discarding.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn collect(max: usize, chunks: &[&[u8]]) -> Vec<Result<Vec<u8>, usize>> {
        let mut s = LineSplitter::new(max);
        let mut out = Vec::new();
        let mut push = |p: Piece<'_>| match p {
            Piece::Line(l) => out.push(Ok(l.to_vec())),
            Piece::TooLong { bytes } => out.push(Err(bytes)),
        };
        for c in chunks {
            s.feed(c, &mut push);
        }
        s.finish(&mut push);
        out
    }

    #[test]
    fn splits_across_chunks_and_strips_crlf() {
        let got = collect(100, &[b"ab", b"c\r\nde\n", b"f"]);
        assert_eq!(
            got,
            vec![Ok(b"abc".to_vec()), Ok(b"de".to_vec()), Ok(b"f".to_vec())]
        );
    }

    #[test]
    fn oversized_line_is_reported_and_the_next_line_survives() {
        let got = collect(4, &[b"12", b"345", b"678\nok\n"]);
        assert_eq!(got, vec![Err(8), Ok(b"ok".to_vec())]);
        let got = collect(4, &[b"123456789"]);
        assert_eq!(got, vec![Err(9)]);
        // exactly at the bound is fine
        assert_eq!(collect(4, &[b"1234\n"]), vec![Ok(b"1234".to_vec())]);
    }

    proptest! {
        #[test]
        fn chunking_does_not_change_lines(data in proptest::collection::vec(any::<u8>(), 0..400), cut in 0usize..400) {
            let cut = cut.min(data.len());
            let whole = collect(64, &[&data]);
            let split = collect(64, &[&data[..cut], &data[cut..]]);
            prop_assert_eq!(whole, split);
        }
    }
}
