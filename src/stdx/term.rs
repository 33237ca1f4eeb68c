//! What npc lets through to a terminal. Text npc did not write itself (a
//! pane plugin's status, an agent's messages, an event's payload, a hook's
//! or a server's error) is shown only through [`printable`], which turns
//! every control character but newline and tab into a visible escape, so
//! such text cannot set the clipboard (OSC 52), the title (OSC 0), clear the
//! screen (`ESC [ 2 J`) or overwrite a line (a bare CR). A pane's own byte
//! stream (`npc pane attach`) is a terminal session and passes as it is,
//! except for OSC 52 clipboard writes, which [`OscFilter`] drops unless the
//! user asked for them (tmux's `set-clipboard` convention).
//!
//! Architecture invariant: untrusted text reaches a terminal only through
//! [`printable`] (human output; JSON output is exact, its encoder escapes
//! C0 controls itself), and a pane's raw output only through [`OscFilter`]
//! unless the user opted in to clipboard writes.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Whether [`printable`] escapes `c`: every C0 control but `\n` and `\t`
/// (ESC, BEL, CR, backspace, …), DEL, and every C1 control
/// (U+0080–U+009F, among them CSI U+009B and OSC U+009D) — exactly the
/// characters of Unicode's general category `Cc` minus newline and tab.
pub fn escapes(c: char) -> bool {
    c.is_control() && c != '\n' && c != '\t'
}

/// `text` with every character [`escapes`] names written as `\xNN`, NN its
/// code point in two lowercase hex digits (ESC is `\x1b`, CR `\x0d`, DEL
/// `\x7f`, the C1 CSI `\x9b`); everything else, backslashes included, is
/// left as it is. Text without such a character comes back borrowed, with
/// no allocation. One line in is one line out: the escapes add no newline.
pub fn printable(text: &str) -> Cow<'_, str> {
    let Some(first) = text.find(escapes) else {
        return Cow::Borrowed(text);
    };
    let mut out = String::with_capacity(text.len() + ESCAPE_GROWTH);
    out.push_str(&text[..first]);
    for c in text[first..].chars() {
        if escapes(c) {
            let _ = write!(out, "\\x{:02x}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Room reserved for escapes when [`printable`] allocates (each adds three
/// bytes to a one- or two-byte character); more grows the string as usual.
const ESCAPE_GROWTH: usize = 16;

/// The escape character.
const ESC: u8 = 0x1b;
/// BEL: ends an OSC (xterm's form).
const BEL: u8 = 0x07;
/// CAN and SUB: abort an escape sequence in every VT parser.
const CAN: u8 = 0x18;
const SUB: u8 = 0x1a;
/// The 8-bit C1 OSC introducer (`ESC ]`'s single-byte form; the character
/// U+009D is `C2 9D` in UTF-8, so it holds this byte too).
const C1_OSC: u8 = 0x9d;
/// The 8-bit C1 string terminator (`ESC \`'s single-byte form).
const C1_ST: u8 = 0x9c;
/// What ends a dropped sequence: ST, right after its introducer (which has
/// passed), so the terminal sees an empty OSC, which does nothing, and the
/// bytes around a dropped sequence never join into a new one.
const STAND_IN: &[u8] = b"\x1b\\";
/// The OSC number of a clipboard write (or read).
const OSC_CLIPBOARD: u32 = 52;

/// Longest OSC number [`OscFilter`] holds back while it decides whether a
/// sequence is OSC 52, in digits (real numbers have at most four). A longer
/// number could be 52 to a terminal that skips leading zeros or wraps, so
/// such a sequence is dropped like OSC 52: the filter never holds more
/// than this many bytes.
pub const MAX_OSC_NUMBER_DIGITS: usize = 8;

/// Where [`OscFilter`] is in the byte stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Ordinary output.
    Ground,
    /// After an ESC.
    Escape,
    /// After an OSC introducer, reading its number (held, not yet passed).
    Number { value: u32, digits: usize },
    /// Inside an OSC 52 sequence: every byte is dropped until its end.
    Drop,
    /// Inside an OSC 52 sequence, after an ESC (`ESC \` ends it, and any
    /// other ESC begins the next sequence).
    DropEscape,
}

/// Drops OSC 52 clipboard sequences from a terminal byte stream and passes
/// every other byte in order: colours, cursor movement, titles (OSC 0/2),
/// hyperlinks (OSC 8). A sequence may be split across [`feed`] calls
/// anywhere. Both introducers are recognised: `ESC ]` and the 8-bit C1
/// byte `0x9D`, wherever it is (the character U+009D is `C2 9D`, and a
/// terminal in 8-bit mode reads the byte even inside a UTF-8 character);
/// the number may have leading zeros (`052`, as xterm reads it).
///
/// The introducer passes at once; only the digits after it are held back
/// (at most [`MAX_OSC_NUMBER_DIGITS`]) until a byte that is not a digit
/// says what the number is, so nothing a terminal would show waits for
/// the next chunk (but for digits right after a `0x9D` inside a UTF-8
/// character, such as `Ý`). Once the number is 52 (or too long to tell),
/// the filter writes ST in place of the digits, so the terminal has an
/// empty OSC, and drops every byte of the sequence up to its end: BEL, ST
/// (`ESC \` or `0x9C`), CAN or SUB, or an ESC that begins another sequence
/// (which passes). A dropped sequence that never ends costs no memory: its
/// bytes are discarded as they come.
///
/// [`feed`]: OscFilter::feed
#[derive(Debug, Clone)]
pub struct OscFilter {
    state: State,
    /// The digits held back while deciding: never more than
    /// `MAX_OSC_NUMBER_DIGITS`.
    held: Vec<u8>,
}

impl Default for OscFilter {
    fn default() -> Self {
        Self::new()
    }
}

impl OscFilter {
    pub fn new() -> Self {
        Self {
            state: State::Ground,
            held: Vec::with_capacity(MAX_OSC_NUMBER_DIGITS),
        }
    }

    /// Append to `out` what of `input` may reach the terminal now.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) {
        out.reserve(input.len());
        for &b in input {
            self.byte(b, out);
        }
    }

    /// How many bytes are held back waiting for the next chunk.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    fn byte(&mut self, b: u8, out: &mut Vec<u8>) {
        match self.state {
            State::Ground => self.pass(b, out),
            State::Escape if b == b']' => {
                out.push(b);
                self.state = NUMBER;
            }
            State::Escape => self.pass(b, out),
            State::Number { value, digits } if b.is_ascii_digit() => {
                if digits == MAX_OSC_NUMBER_DIGITS {
                    self.start_drop(out);
                } else {
                    self.held.push(b);
                    self.state = State::Number {
                        value: value * 10 + u32::from(b - b'0'),
                        digits: digits + 1,
                    };
                }
            }
            State::Number { value, digits } if digits > 0 && value == OSC_CLIPBOARD => {
                self.start_drop(out);
                self.dropped(b);
            }
            State::Number { .. } => {
                out.extend_from_slice(&self.held);
                self.held.clear();
                self.pass(b, out);
            }
            State::Drop => self.dropped(b),
            State::DropEscape if b == b'\\' => self.state = State::Ground,
            State::DropEscape => {
                // The ESC ended the OSC and begins the next sequence.
                out.push(ESC);
                self.state = State::Escape;
                self.byte(b, out);
            }
        }
    }

    /// Pass `b`, noting whether it begins a sequence.
    fn pass(&mut self, b: u8, out: &mut Vec<u8>) {
        out.push(b);
        self.state = match b {
            ESC => State::Escape,
            C1_OSC => NUMBER,
            _ => State::Ground,
        };
    }

    /// The sequence is OSC 52 (or its number too long to tell).
    fn start_drop(&mut self, out: &mut Vec<u8>) {
        self.held.clear();
        out.extend_from_slice(STAND_IN);
        self.state = State::Drop;
    }

    /// A byte inside a dropped OSC 52 sequence.
    fn dropped(&mut self, b: u8) {
        match b {
            BEL | C1_ST | CAN | SUB => self.state = State::Ground,
            ESC => self.state = State::DropEscape,
            _ => {}
        }
    }
}

/// The state right after an OSC introducer.
const NUMBER: State = State::Number {
    value: 0,
    digits: 0,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_text_is_borrowed_and_newlines_and_tabs_stay() {
        let text = "pane one\tneeds attention: limit resets at 14:00\nretry ✓ é";
        assert!(matches!(printable(text), Cow::Borrowed(t) if t == text));
        assert!(matches!(printable(""), Cow::Borrowed("")));
    }

    #[test]
    fn hostile_sequences_become_visible_escapes() {
        let cases = [
            ("\x1b]52;c;ZXZpbA==\x07", "\\x1b]52;c;ZXZpbA==\\x07"),
            ("\x1b]0;owned\x1b\\", "\\x1b]0;owned\\x1b\\"),
            ("\x1b[2Jgone", "\\x1b[2Jgone"),
            (
                "\u{9b}2J and \u{9d}52;c;x\u{9c}",
                "\\x9b2J and \\x9d52;c;x\\x9c",
            ),
            ("done: ok\rdone: FAILED", "done: ok\\x0ddone: FAILED"),
            ("a\x00b\x08c\x7fd\u{85}e", "a\\x00b\\x08c\\x7fd\\x85e"),
        ];
        for (hostile, shown) in cases {
            let out = printable(hostile);
            assert!(matches!(out, Cow::Owned(_)), "{hostile:?}");
            assert_eq!(out, shown, "{hostile:?}");
            assert!(!out.chars().any(escapes), "{out:?}");
        }
    }

    #[test]
    fn very_long_input_is_escaped_whole() {
        let chunk = "x".repeat(999) + "\x1b";
        let hostile = chunk.repeat(1000);
        let out = printable(&hostile);
        assert_eq!(out.len(), hostile.len() + 3 * 1000);
        assert_eq!(out.matches("\\x1b").count(), 1000);
        assert!(!out.chars().any(escapes));
        let clean = "y".repeat(1 << 20);
        assert!(matches!(printable(&clean), Cow::Borrowed(_)));
    }

    /// `input` through a fresh filter in chunks of `size` bytes.
    fn filtered(input: &[u8], size: usize) -> Vec<u8> {
        let mut f = OscFilter::new();
        let mut out = Vec::new();
        for chunk in input.chunks(size) {
            f.feed(chunk, &mut out);
        }
        out
    }

    /// `input` filtered whole and in every chunk size up to its length.
    fn every_split(input: &[u8]) -> Vec<u8> {
        let whole = filtered(input, input.len().max(1));
        for size in 1..input.len() {
            assert_eq!(filtered(input, size), whole, "chunks of {size}");
        }
        whole
    }

    /// The numbers of the OSC sequences a terminal begins for `bytes`: a
    /// small VT parser written apart from the filter, as strict as a
    /// terminal in 8-bit mode (both introducers, anywhere; a number is
    /// every digit after the introducer, leading zeros and all, complete
    /// at the first byte that is not a digit; an ESC, BEL, ST, CAN or SUB
    /// ends the string).
    fn osc_numbers(bytes: &[u8]) -> Vec<u64> {
        #[derive(Clone, Copy)]
        enum T {
            Ground,
            Esc,
            Number(Option<u64>),
            Text,
        }
        let mut t = T::Ground;
        let mut found = Vec::new();
        for &b in bytes {
            t = match (t, b) {
                (_, 0x9d) | (T::Esc, b']') => T::Number(None),
                (T::Number(n), b'0'..=b'9') => {
                    let d = u64::from(b - b'0');
                    T::Number(Some(n.unwrap_or(0).saturating_mul(10).saturating_add(d)))
                }
                (T::Number(n), _) => {
                    found.extend(n);
                    match b {
                        ESC => T::Esc,
                        BEL | C1_ST | CAN | SUB => T::Ground,
                        _ => T::Text,
                    }
                }
                (_, ESC) => T::Esc,
                (T::Text, BEL | C1_ST | CAN | SUB) => T::Ground,
                (T::Text, _) => T::Text,
                (T::Esc | T::Ground, _) => T::Ground,
            };
        }
        found
    }

    #[test]
    fn the_reference_parser_sees_what_a_terminal_sees() {
        assert_eq!(
            osc_numbers(b"\x1b]52;c;x\x07\x9d0052;\x9c\x1b]0;t\x1b\\\x1b]8"),
            [52, 52, 0]
        );
        assert_eq!(osc_numbers(b"\x1b]5\x1b]52;x\x072;y\x07"), [5, 52]);
        assert_eq!(osc_numbers(b"\x1b[52;x\x07]52;"), Vec::<u64>::new());
    }

    #[test]
    fn osc_52_is_dropped_with_either_terminator_however_it_is_split() {
        let input = b"before\x1b]52;c;ZXZpbA==\x07 middle \x1b]52;p;ZXZpbA==\x1b\\after";
        assert_eq!(
            every_split(input),
            b"before\x1b]\x1b\\ middle \x1b]\x1b\\after"
        );
    }

    #[test]
    fn eight_bit_and_utf8_c1_introducers_are_dropped_too() {
        assert_eq!(every_split(b"a\x9d52;c;ZXZpbA==\x9cb"), b"a\x9d\x1b\\b");
        assert_eq!(
            every_split("a\u{9d}52;c;ZXZpbA==\u{9c}b".as_bytes()),
            b"a\xc2\x9d\x1b\\b"
        );
        assert_eq!(every_split(b"a\x9d52;c;ZXZpbA==\x07b"), b"a\x9d\x1b\\b");
        // Leading zeros name OSC 52 to xterm as well.
        assert_eq!(every_split(b"a\x1b]0052;c;ZXZpbA==\x07b"), b"a\x1b]\x1b\\b");
    }

    #[test]
    fn a_0x9d_starts_an_osc_wherever_it_is() {
        // U+275D ❝ is E2 9D 9D: harmless unless an OSC number 52 follows,
        // which a terminal in 8-bit mode would read as a clipboard write.
        let quoted = "❝quoted❞ Ý".as_bytes();
        assert_eq!(every_split(quoted), quoted);
        assert_eq!(every_split("❝52;c;x\x07".as_bytes()), "❝\x1b\\".as_bytes());
    }

    #[test]
    fn other_sequences_pass_unchanged() {
        let text: &[u8] = b"\x1b]0;title\x07\x1b]2;npc: one\x1b\\\x1b]8;;https://example.com\x1b\\link\x1b]8;;\x1b\\\x1b[1;31mred\x1b[0m\x1b[2J\x1b]5;x\x07\x1b]520;x\x07\x1b]1337;x\x07\x1b\x1b[H \xc2\xa9 \xc2\x9b \x9d5;x\x9c";
        assert_eq!(every_split(text), text);
    }

    #[test]
    fn an_esc_ends_a_dropped_sequence_and_begins_the_next() {
        assert_eq!(
            every_split(b"\x1b]52;c;ZXZp\x1b[31mred\x18\x1b]52;c;x\x18ok"),
            b"\x1b]\x1b\\\x1b[31mred\x18\x1b]\x1b\\ok"
        );
    }

    #[test]
    fn what_surrounds_a_dropped_sequence_never_joins_into_a_new_one() {
        // An OSC 5 cut short by the OSC 52 that follows, then "2;…": without
        // the stand-in, `ESC ] 5` and `2;` would meet as a new OSC 52.
        let spliced = b"\x1b]5\x1b]52;c;x\x072;ZXZpbA==\x07";
        let out = every_split(spliced);
        assert_eq!(out, b"\x1b]5\x1b]\x1b\\2;ZXZpbA==\x07");
        assert_eq!(osc_numbers(&out), [5]);
        let out = every_split(b"\x1b\x1b]52;c;x\x07]52;y\x07");
        assert!(!osc_numbers(&out).contains(&52), "{out:?}");
    }

    #[test]
    fn an_unterminated_osc_holds_nothing_and_an_overlong_number_is_dropped() {
        let mut f = OscFilter::new();
        let mut out = Vec::new();
        f.feed(b"shown\x1b]52;c;", &mut out);
        for _ in 0..1024 {
            f.feed(&[b'A'; 1024], &mut out);
            assert_eq!(f.held(), 0);
        }
        assert_eq!(out, b"shown\x1b]\x1b\\");
        f.feed(b"\x07after", &mut out);
        assert_eq!(out, b"shown\x1b]\x1b\\after");
        // A number longer than the bound is never held past it.
        let mut f = OscFilter::new();
        let mut out = Vec::new();
        f.feed(b"\x1b]", &mut out);
        for _ in 0..100 {
            f.feed(b"0", &mut out);
            assert!(f.held() <= MAX_OSC_NUMBER_DIGITS);
        }
        f.feed(b"52;c;ZXZpbA==\x07after", &mut out);
        assert_eq!(out, b"\x1b]\x1b\\after");
        let at_bound = format!("\x1b]{}2;t\x07", "0".repeat(MAX_OSC_NUMBER_DIGITS - 1));
        assert_eq!(every_split(at_bound.as_bytes()), at_bound.as_bytes());
    }

    #[test]
    fn ordinary_output_is_not_held() {
        let mut f = OscFilter::new();
        let mut out = Vec::new();
        f.feed(b"prompt$ ", &mut out);
        assert_eq!(out, b"prompt$ ");
        f.feed(b"\x1b", &mut out);
        assert_eq!((out.as_slice(), f.held()), (&b"prompt$ \x1b"[..], 0));
        f.feed(b"[K\x1b]", &mut out);
        assert_eq!((out.as_slice(), f.held()), (&b"prompt$ \x1b[K\x1b]"[..], 0));
        // Only the digits of an OSC number wait for the next chunk.
        f.feed(b"0", &mut out);
        assert_eq!(f.held(), 1);
        f.feed(b";t\x07", &mut out);
        assert_eq!(
            (out.as_slice(), f.held()),
            (&b"prompt$ \x1b[K\x1b]0;t\x07"[..], 0)
        );
    }

    /// Bytes that matter to OSC parsing, and some that do not.
    const ALPHABET: &[u8] = b"\x1b]520;\x07\\\x9d\x9c\x18x[\xc2\xe2";

    proptest::proptest! {
        #[test]
        fn no_stream_gets_an_osc_52_through(
            picks in proptest::collection::vec(0..ALPHABET.len(), 0..80),
            cuts in proptest::collection::vec(1usize..8, 0..20),
        ) {
            let input: Vec<u8> = picks.iter().map(|&i| ALPHABET[i]).collect();
            let mut f = OscFilter::new();
            let mut out = Vec::new();
            let mut rest = input.as_slice();
            for cut in cuts {
                let (chunk, tail) = rest.split_at(cut.min(rest.len()));
                f.feed(chunk, &mut out);
                rest = tail;
            }
            f.feed(rest, &mut out);
            proptest::prop_assert!(!osc_numbers(&out).contains(&52), "{:?} became {:?}", input, out);
            proptest::prop_assert_eq!(&out, &filtered(&input, input.len().max(1)));
            proptest::prop_assert!(f.held() <= MAX_OSC_NUMBER_DIGITS);
        }

        #[test]
        fn a_stream_without_introducers_passes_byte_for_byte(
            input in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256),
        ) {
            let input: Vec<u8> = input.into_iter().filter(|&b| b != ESC && b != C1_OSC).collect();
            proptest::prop_assert_eq!(filtered(&input, 7), input);
        }
    }
}
