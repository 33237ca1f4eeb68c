//! Escape-sequence stripping for what plugins see of a pane: CSI, OSC, DCS,
//! SOS/PM/APC strings and two-byte escapes are removed, C0 controls other
//! than newline and tab are dropped (`\r\n` becomes `\n`), and text is
//! decoded as UTF-8 (invalid bytes become U+FFFD). The state carries across
//! chunks, so a sequence or a character split between two reads is handled
//! like one that arrived whole.

/// Longest incomplete UTF-8 sequence kept between chunks.
const MAX_UTF8_CARRY: usize = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum State {
    #[default]
    Ground,
    /// After ESC.
    Escape,
    /// After ESC and intermediate bytes (0x20..=0x2f).
    EscapeIntermediate,
    /// Inside `ESC [` … final byte.
    Csi,
    /// Inside a string (OSC, DCS, SOS, PM, APC) until BEL or `ESC \`.
    String,
    /// ESC seen inside a string: `\` ends it.
    StringEscape,
}

/// A stateful stripper; feed it chunks in order.
#[derive(Debug, Default, Clone)]
pub struct Stripper {
    state: State,
    /// Bytes of an incomplete UTF-8 character at the end of the last chunk.
    carry: Vec<u8>,
}

impl Stripper {
    pub fn new() -> Self {
        Self::default()
    }

    /// The plain text of `chunk`, appended to `out`.
    pub fn feed(&mut self, chunk: &[u8], out: &mut String) {
        let mut plain = std::mem::take(&mut self.carry);
        for &b in chunk {
            self.state = match (self.state, b) {
                (State::Ground, 0x1b) => State::Escape,
                (State::Ground, b'\n' | b'\t') => {
                    plain.push(b);
                    State::Ground
                }
                (State::Ground, 0x00..=0x1f | 0x7f) => State::Ground,
                (State::Ground, b) => {
                    plain.push(b);
                    State::Ground
                }
                (State::Escape, b'[') => State::Csi,
                (State::Escape, b']' | b'P' | b'X' | b'^' | b'_') => State::String,
                (State::Escape, 0x20..=0x2f) => State::EscapeIntermediate,
                (State::Escape, 0x1b) => State::Escape,
                (State::Escape, _) => State::Ground,
                (State::EscapeIntermediate, 0x20..=0x2f) => State::EscapeIntermediate,
                (State::EscapeIntermediate, _) => State::Ground,
                (State::Csi, 0x40..=0x7e) => State::Ground,
                (State::Csi, 0x1b) => State::Escape,
                (State::Csi, _) => State::Csi,
                (State::String, 0x07) => State::Ground,
                (State::String, 0x1b) => State::StringEscape,
                (State::String, _) => State::String,
                (State::StringEscape, b'\\') => State::Ground,
                (State::StringEscape, _) => State::String,
            };
        }
        // Keep an incomplete character at the end for the next chunk.
        let cut = incomplete_tail(&plain);
        self.carry = plain.split_off(plain.len() - cut);
        // C1 controls arrive as UTF-8 characters (U+0080..U+009F).
        out.extend(
            String::from_utf8_lossy(&plain)
                .chars()
                .filter(|c| !c.is_control() || matches!(c, '\n' | '\t')),
        );
    }
}

/// How many bytes at the end of `bytes` start a UTF-8 character that is not
/// complete yet (0 when the text ends on a boundary).
fn incomplete_tail(bytes: &[u8]) -> usize {
    for back in 1..=MAX_UTF8_CARRY.min(bytes.len()) {
        let b = bytes[bytes.len() - back];
        if b & 0xc0 == 0x80 {
            continue; // a continuation byte: look further back
        }
        let needed = match b {
            0xc0..=0xdf => 2,
            0xe0..=0xef => 3,
            0xf0..=0xf7 => 4,
            _ => return 0,
        };
        return if needed > back { back } else { 0 };
    }
    0
}

/// Strip one complete buffer (for tests and one-off uses).
pub fn strip(bytes: &[u8]) -> String {
    let mut out = String::new();
    Stripper::new().feed(bytes, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removes_colours_cursor_moves_titles_and_carriage_returns() {
        let raw =
            b"\x1b[1;31mred\x1b[0m ok\r\n\x1b]0;title\x07next\x1b[2K\x1b(B\tend\x1bP1$r\x1b\\!";
        assert_eq!(strip(raw), "red ok\nnext\tend!");
    }

    #[test]
    fn sequences_and_characters_split_across_chunks_are_whole() {
        let mut s = Stripper::new();
        let mut out = String::new();
        for chunk in [
            &b"a\x1b"[..],
            b"[3",
            b"1mb\xc3",
            b"\xa9c\x1b]2;t",
            b"itle\x1b",
            b"\\d",
        ] {
            s.feed(chunk, &mut out);
        }
        assert_eq!(out, "ab\u{e9}cd");
    }

    proptest::proptest! {
        #[test]
        fn output_never_holds_escapes_or_control_bytes(chunks in proptest::collection::vec(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64), 0..16)) {
            let mut s = Stripper::new();
            let mut out = String::new();
            for c in &chunks {
                s.feed(c, &mut out);
            }
            proptest::prop_assert!(!out.chars().any(|c| c.is_control() && c != '\n' && c != '\t'));
        }
    }
}
