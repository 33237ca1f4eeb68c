//! Source files and positions: the text a manifest was read from, and the
//! mapping from byte offsets to 1-based line and column numbers that every
//! diagnostic uses. Pure data; no I/O happens here.

use std::ops::Range;
use std::sync::Arc;

/// A byte range into one [`SourceFile`].
pub type Span = Range<usize>;

/// One loaded text file (the manifest itself, a prompt template, …).
#[derive(Debug, Clone)]
pub struct SourceFile {
    name: Arc<str>,
    text: Arc<str>,
    line_starts: Arc<[usize]>,
}

/// A 1-based line and column (columns count characters, not bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct Position {
    pub line: usize,
    pub column: usize,
}

impl SourceFile {
    pub fn new(name: impl Into<Arc<str>>, text: impl Into<Arc<str>>) -> Self {
        let text: Arc<str> = text.into();
        let line_starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        Self {
            name: name.into(),
            text,
            line_starts,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn text(&self) -> &str {
        &self.text
    }

    /// The position of byte `offset`, clamped to the file and to a char boundary.
    pub fn position(&self, offset: usize) -> Position {
        let mut offset = offset.min(self.text.len());
        while !self.text.is_char_boundary(offset) {
            offset -= 1;
        }
        let line = match self.line_starts.binary_search(&offset) {
            Ok(i) => i,
            Err(i) => i - 1,
        };
        let start = self.line_starts[line];
        let column = self.text[start..offset].chars().count() + 1;
        Position {
            line: line + 1,
            column,
        }
    }

    /// The text of 1-based `line`, without its line terminator.
    pub fn line_text(&self, line: usize) -> &str {
        let Some(&start) = self.line_starts.get(line.saturating_sub(1)) else {
            return "";
        };
        let end = self
            .line_starts
            .get(line)
            .map_or(self.text.len(), |next| next - 1);
        self.text[start..end.max(start)].trim_end_matches('\r')
    }
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
}
