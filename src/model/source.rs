//! Source files and positions: the text a manifest was read from, and the
//! mapping from byte offsets to 1-based line and column numbers that every
//! diagnostic uses. Pure data; no I/O happens here.

use std::ops::Range;
use std::sync::Arc;

/// A byte range into one [`SourceFile`].
pub type Span = Range<usize>;

/// Bytes between two entries of the column index: finding a column counts
/// at most this many bytes of characters, however long the line is.
pub const COLUMN_INDEX_STRIDE: usize = 4096;

/// One loaded text file (the manifest itself, a prompt template, …). Its
/// line and column index is built the first time a position is asked for:
/// a file that loads without a diagnostic never needs it.
#[derive(Debug, Clone)]
pub struct SourceFile {
    name: Arc<str>,
    text: Arc<str>,
    index: Arc<std::sync::OnceLock<LineIndex>>,
}

/// Where lines start and how many characters precede each column mark.
#[derive(Debug)]
struct LineIndex {
    line_starts: Vec<usize>,
    /// `char_marks[i]`: characters before the char boundary at or below
    /// `i * COLUMN_INDEX_STRIDE`. Keeps column lookups cheap on very long
    /// lines (minified or hostile input).
    char_marks: Vec<usize>,
}

impl LineIndex {
    fn new(text: &str) -> Self {
        let line_starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        let mut char_marks = Vec::with_capacity(text.len() / COLUMN_INDEX_STRIDE + 1);
        let (mut chars, mut prev) = (0, 0);
        for i in 0..=text.len() / COLUMN_INDEX_STRIDE {
            let at = floor_char_boundary(text, i * COLUMN_INDEX_STRIDE);
            chars += text[prev..at].chars().count();
            char_marks.push(chars);
            prev = at;
        }
        Self {
            line_starts,
            char_marks,
        }
    }
}

/// A 1-based line and column (columns count characters, not bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct Position {
    pub line: usize,
    pub column: usize,
}

impl SourceFile {
    pub fn new(name: impl Into<Arc<str>>, text: impl Into<Arc<str>>) -> Self {
        Self {
            name: name.into(),
            text: text.into(),
            index: Arc::default(),
        }
    }

    fn index(&self) -> &LineIndex {
        self.index.get_or_init(|| LineIndex::new(&self.text))
    }

    /// Characters in `text[..offset]`; `offset` must be a char boundary.
    fn chars_before(&self, offset: usize) -> usize {
        let i = offset / COLUMN_INDEX_STRIDE;
        let mark = floor_char_boundary(&self.text, i * COLUMN_INDEX_STRIDE);
        self.index().char_marks[i] + self.text[mark..offset].chars().count()
    }

    /// Byte offset where 1-based `line` starts (the end of the text past the last line).
    pub fn line_start(&self, line: usize) -> usize {
        self.index()
            .line_starts
            .get(line.saturating_sub(1))
            .copied()
            .unwrap_or(self.text.len())
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn text(&self) -> &str {
        &self.text
    }

    /// The position of byte `offset`, clamped to the file and to a char boundary.
    pub fn position(&self, offset: usize) -> Position {
        let offset = floor_char_boundary(&self.text, offset);
        let line = match self.index().line_starts.binary_search(&offset) {
            Ok(i) => i,
            Err(i) => i - 1,
        };
        let start = self.index().line_starts[line];
        let column = self.chars_before(offset) - self.chars_before(start) + 1;
        Position {
            line: line + 1,
            column,
        }
    }

    /// The text of 1-based `line`, without its line terminator.
    pub fn line_text(&self, line: usize) -> &str {
        let Some(&start) = self.index().line_starts.get(line.saturating_sub(1)) else {
            return "";
        };
        let end = self
            .index()
            .line_starts
            .get(line)
            .map_or(self.text.len(), |next| next - 1);
        self.text[start..end.max(start)].trim_end_matches('\r')
    }
}

/// The largest char boundary of `text` at or below `offset` (clamped to the text).
pub fn floor_char_boundary(text: &str, offset: usize) -> usize {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    offset
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_are_one_based_and_count_chars() {
        let file = SourceFile::new("x", "ab\nçd\n");
        assert_eq!(file.position(0), Position { line: 1, column: 1 });
        assert_eq!(file.position(3), Position { line: 2, column: 1 });
        // `ç` is two bytes: byte 5 is `d`, the second character.
        assert_eq!(file.position(5), Position { line: 2, column: 2 });
        assert_eq!(file.position(4), Position { line: 2, column: 1 });
        assert_eq!(file.position(999), Position { line: 3, column: 1 });
        assert_eq!(file.line_text(2), "çd");
        assert_eq!(file.line_text(9), "");
    }

    #[test]
    fn columns_on_long_lines_match_a_plain_count() {
        // Multi-byte characters straddle index marks; every column must
        // still equal the naive count.
        let line: String = "aé😀".repeat(3 * COLUMN_INDEX_STRIDE);
        let text = format!("x\n{line}\n");
        let file = SourceFile::new("x", text.as_str());
        for (offset, _) in text.char_indices().step_by(997) {
            let expected = if offset < 2 {
                Position {
                    line: 1,
                    column: offset + 1,
                }
            } else {
                Position {
                    line: 2,
                    column: text[2..offset].chars().count() + 1,
                }
            };
            assert_eq!(file.position(offset), expected, "offset {offset}");
        }
        assert_eq!(file.position(text.len()).line, 3);
    }
}
