//! Scrubbing of memory-style tags (`<memory>…</memory>`) from rendered text
//! before it is stored or shown: the tags and everything between them go,
//! nested tags are matched by name, a stray closing tag is dropped, and an
//! unterminated opening tag drops the rest of the text (what follows it may
//! be private, so it never leaks by accident).

/// Tag names whose elements are removed with their content (ASCII,
/// matched case-insensitively).
pub const SCRUBBED_TAGS: [&str; 3] = ["memory", "memories", "private"];

/// Remove every [`SCRUBBED_TAGS`] element from `text`.
///
/// Removing an element can join the text around it into a new opening tag
/// (`<mem<memory>x</memory>ory>`), so scrubbing repeats until a pass removes
/// nothing; every repeated pass removes at least one tag, so it ends.
pub fn scrub(text: &str) -> String {
    let mut current = scrub_once(text);
    loop {
        // Fast path: nothing tag-like remains.
        if !might_contain_tag(&current) {
            return current;
        }
        let next = scrub_once(&current);
        if next.len() == current.len() {
            return next;
        }
        current = next;
    }
}

/// Whether `text` contains an opening scrubbed tag (the property [`scrub`]
/// guarantees its output does not have).
pub fn contains_opening_tag(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes
        .iter()
        .enumerate()
        .any(|(i, &b)| b == b'<' && matches!(tag_at(bytes, i), Some(Tag { closing: false, .. })))
}

fn might_contain_tag(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes
        .iter()
        .enumerate()
        .any(|(i, &b)| b == b'<' && tag_at(bytes, i).is_some())
}

/// A scrubbed tag found at some offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tag {
    /// Index into [`SCRUBBED_TAGS`].
    name: usize,
    closing: bool,
    self_closing: bool,
    /// Offset just past the tag (past `>`, or the end of the text when the
    /// tag is not closed).
    end: usize,
}

/// Recognise a scrubbed tag starting at `bytes[at] == b'<'`: `<NAME` followed
/// by whitespace, `/`, `>` or the end of the text, or `</NAME` followed by
/// optional whitespace and `>`.
fn tag_at(bytes: &[u8], at: usize) -> Option<Tag> {
    let mut i = at + 1;
    let closing = bytes.get(i) == Some(&b'/');
    if closing {
        i += 1;
    }
    let rest = &bytes[i.min(bytes.len())..];
    // Longest name first, so `memories` is not read as `memory` + junk.
    let (name, len) = SCRUBBED_TAGS
        .iter()
        .enumerate()
        .filter(|(_, n)| {
            rest.len() >= n.len() && rest[..n.len()].eq_ignore_ascii_case(n.as_bytes())
        })
        .map(|(k, n)| (k, n.len()))
        .max_by_key(|&(_, len)| len)?;
    i += len;
    match bytes.get(i) {
        None => {}
        Some(b'>' | b'/') => {}
        Some(c) if c.is_ascii_whitespace() => {}
        Some(_) => return None,
    }
    if closing
        && !bytes[i..]
            .iter()
            .take_while(|c| **c != b'>')
            .all(u8::is_ascii_whitespace)
    {
        return None;
    }
    let close = bytes[i..].iter().position(|&c| c == b'>').map(|p| i + p);
    let end = close.map_or(bytes.len(), |p| p + 1);
    let self_closing = !closing && close.is_some_and(|p| p > 0 && bytes[p - 1] == b'/');
    Some(Tag {
        name,
        closing,
        self_closing,
        end,
    })
}

fn scrub_once(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    // Names of the open scrubbed elements, innermost last.
    let mut open: Vec<usize> = Vec::new();
    // Start of the text not yet copied (only meaningful when nothing is open).
    let mut copied = 0;
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'<' {
            i += 1;
            continue;
        }
        let Some(tag) = tag_at(bytes, i) else {
            i += 1;
            continue;
        };
        if open.is_empty() {
            out.push_str(&text[copied..i]);
        }
        if tag.closing {
            // Close up to the matching element; a stray closing tag is dropped.
            if let Some(pos) = open.iter().rposition(|&n| n == tag.name) {
                open.truncate(pos);
            }
        } else if !tag.self_closing {
            open.push(tag.name);
        }
        i = tag.end;
        copied = i;
    }
    // An element still open runs to the end of the text and is dropped.
    if open.is_empty() {
        out.push_str(&text[copied..]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn removes_tags_and_content() {
        assert_eq!(scrub("a<memory>secret</memory>b"), "ab");
        assert_eq!(scrub("a<MEMORY kind=\"x\">s</Memory >b"), "ab");
        assert_eq!(scrub("a<memories>s</memories>b"), "ab");
        assert_eq!(scrub("a<memory/>b<memory />c"), "abc");
        assert_eq!(
            scrub("keep <memo> and <memoryx> and <b>"),
            "keep <memo> and <memoryx> and <b>"
        );
    }

    #[test]
    fn handles_nesting() {
        assert_eq!(scrub("a<memory>x<memory>y</memory>z</memory>b"), "ab");
        assert_eq!(scrub("a<memory>x<private>y</private>z</memory>b"), "ab");
        // A closing tag of an outer element closes the inner ones too.
        assert_eq!(scrub("a<memory>x<private>y</memory>b"), "ab");
    }

    #[test]
    fn unterminated_drops_the_rest() {
        assert_eq!(scrub("a<memory>secret"), "a");
        assert_eq!(scrub("a<memory"), "a");
        assert_eq!(scrub("a<memory id='1' secret"), "a");
    }

    #[test]
    fn stray_closing_tags_are_dropped() {
        assert_eq!(scrub("a</memory>b</private >c"), "abc");
    }

    #[test]
    fn joined_text_does_not_form_a_new_tag() {
        // The first pass leaves `<memory>leakok`, an unterminated element.
        let out = scrub("<mem<memory>x</memory>ory>leak</memory>ok");
        assert!(!contains_opening_tag(&out), "{out}");
        assert_eq!(out, "");
    }

    #[test]
    fn unicode_survives() {
        assert_eq!(scrub("héllo <memory>ü</memory>wörld ✓"), "héllo wörld ✓");
    }

    proptest! {
        #[test]
        fn output_never_contains_an_opening_tag(
            parts in proptest::collection::vec(
                prop_oneof![
                    Just("<memory>".to_string()),
                    Just("</memory>".to_string()),
                    Just("<MeMoRy x=1>".to_string()),
                    Just("<memories/>".to_string()),
                    Just("<private".to_string()),
                    Just("</private>".to_string()),
                    Just("<mem".to_string()),
                    Just("ory>".to_string()),
                    Just("<".to_string()),
                    Just(">".to_string()),
                    "[a-z<>/ é]{0,6}",
                ],
                0..24,
            )
        ) {
            let text: String = parts.concat();
            let out = scrub(&text);
            prop_assert!(!contains_opening_tag(&out), "{text:?} -> {out:?}");
            // Checked again with an independent spelling of "opening tag".
            let opening = regex::Regex::new(r"(?i)<(memory|memories|private)([ \t\n\r\x0C/>]|$)").unwrap();
            prop_assert!(!opening.is_match(&out), "{text:?} -> {out:?}");
            // Scrubbing is idempotent.
            prop_assert_eq!(scrub(&out), out.clone());
        }

        #[test]
        fn text_without_tags_is_unchanged(text in "[^<]{0,64}") {
            prop_assert_eq!(scrub(&text), text);
        }
    }
}
