//! A small JSON parser that keeps the byte span of every value and key, so
//! `npcagent.json` gets the same file:line:column diagnostics as TOML.
//! serde_json drops positions and silently keeps the last of duplicate keys;
//! this parser reports duplicates, never recurses past [`MAX_NESTING_DEPTH`],
//! and stops at the bounds of [`super::node`] (items in the
//! document, items per array, entries per object, bytes per string) before
//! it allocates past them.

use std::collections::HashMap;

use super::diagnostics::{Diagnostic, has_room};
use super::node::{
    Exceeded, Key, MAX_ARRAY_LEN, MAX_NESTING_DEPTH, MAX_STRING_BYTES, MAX_TABLE_ENTRIES, Node,
    NodeKind, item_limit,
};
use super::source::{SourceFile, Span};

/// Parse a JSON document. Stops at the first syntax error (JSON has no
/// reliable resynchronisation point) but reports every duplicate key.
pub fn parse(file: &SourceFile, diags: &mut Vec<Diagnostic>) -> Option<Node> {
    let mut p = Parser {
        file,
        bytes: file.text().as_bytes(),
        pos: 0,
        items: 0,
        item_limit: item_limit(file.text().len()),
        diags,
    };
    p.skip_ws();
    let node = match p.value(0) {
        Ok(node) => node,
        Err(e) => {
            p.report(e);
            return None;
        }
    };
    p.skip_ws();
    if p.pos < p.bytes.len() {
        let at = p.pos;
        p.report(SyntaxError {
            at: at..at + 1,
            message: "trailing characters after the JSON document".into(),
            bound: None,
        });
        return None;
    }
    Some(node)
}

struct SyntaxError {
    at: Span,
    message: String,
    /// Set when the input is well-formed so far but exceeds a bound.
    bound: Option<Exceeded>,
}

struct Parser<'a, 'd> {
    file: &'a SourceFile,
    bytes: &'a [u8],
    pos: usize,
    /// Keys and values read so far, against `item_limit`.
    items: usize,
    /// [`item_limit`] of this document.
    item_limit: usize,
    diags: &'d mut Vec<Diagnostic>,
}

type PResult<T> = Result<T, SyntaxError>;

impl Parser<'_, '_> {
    fn report(&mut self, e: SyntaxError) {
        if let Some(bound) = e.bound {
            self.diags.push(bound.diagnostic(self.file, e.at));
            return;
        }
        self.diags.push(
            Diagnostic::error(format!("invalid JSON: {}", e.message))
                .at(self.file, e.at)
                .with_hint("fix the syntax at the caret"),
        );
    }

    fn err<T>(&self, message: impl Into<String>) -> PResult<T> {
        let end = (self.pos + 1).min(self.bytes.len()).max(self.pos);
        Err(SyntaxError {
            at: self.pos..end,
            message: message.into(),
            bound: None,
        })
    }

    fn exceeded<T>(at: Span, bound: Exceeded) -> PResult<T> {
        Err(SyntaxError {
            at,
            message: String::new(),
            bound: Some(bound),
        })
    }

    /// Count one item (key, value or closing bracket) against [`item_limit`].
    fn count_item(&mut self) -> PResult<()> {
        self.items += 1;
        if self.items > self.item_limit {
            let end = (self.pos + 1).min(self.bytes.len());
            return Self::exceeded(self.pos..end, Exceeded::Items);
        }
        Ok(())
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.bytes.get(self.pos) {
            self.pos += 1;
        }
    }

    fn value(&mut self, depth: usize) -> PResult<Node> {
        if depth > MAX_NESTING_DEPTH {
            return self.err(format!("nesting is deeper than {MAX_NESTING_DEPTH} levels"));
        }
        let start = self.pos;
        if self.pos < self.bytes.len() {
            self.count_item()?;
        }
        let kind = match self.bytes.get(self.pos) {
            None => return self.err("unexpected end of input, expected a value"),
            Some(b'{') => self.object(depth)?,
            Some(b'[') => self.array(depth)?,
            Some(b'"') => NodeKind::Str(self.string()?),
            Some(b't') => self.literal("true", NodeKind::Bool(true))?,
            Some(b'f') => self.literal("false", NodeKind::Bool(false))?,
            Some(b'n') => self.literal("null", NodeKind::Null)?,
            Some(b'-' | b'0'..=b'9') => self.number()?,
            Some(_) => return self.err("expected a value"),
        };
        Ok(Node {
            kind,
            span: start..self.pos,
        })
    }

    fn literal(&mut self, word: &str, kind: NodeKind) -> PResult<NodeKind> {
        if self.bytes[self.pos..].starts_with(word.as_bytes()) {
            self.pos += word.len();
            Ok(kind)
        } else {
            self.err(format!("expected `{word}`"))
        }
    }

    fn number(&mut self) -> PResult<NodeKind> {
        let start = self.pos;
        if self.bytes.get(self.pos) == Some(&b'-') {
            self.pos += 1;
        }
        let digits = |p: &mut Self| {
            let s = p.pos;
            while let Some(b'0'..=b'9') = p.bytes.get(p.pos) {
                p.pos += 1;
            }
            p.pos - s
        };
        if digits(self) == 0 {
            return self.err("expected digits");
        }
        let mut float = false;
        if self.bytes.get(self.pos) == Some(&b'.') {
            self.pos += 1;
            float = true;
            if digits(self) == 0 {
                return self.err("expected digits after `.`");
            }
        }
        if let Some(b'e' | b'E') = self.bytes.get(self.pos) {
            self.pos += 1;
            float = true;
            if let Some(b'+' | b'-') = self.bytes.get(self.pos) {
                self.pos += 1;
            }
            if digits(self) == 0 {
                return self.err("expected digits in the exponent");
            }
        }
        let text = std::str::from_utf8(&self.bytes[start..self.pos]).unwrap_or("0");
        if !float && let Ok(n) = text.parse::<i64>() {
            return Ok(NodeKind::Int(n));
        }
        Ok(NodeKind::Float(text.parse().unwrap_or(f64::NAN)))
    }

    fn hex4(&mut self) -> PResult<u32> {
        let Some(chunk) = self.bytes.get(self.pos..self.pos + 4) else {
            return self.err("truncated `\\u` escape");
        };
        let text = std::str::from_utf8(chunk).unwrap_or("");
        match u32::from_str_radix(text, 16) {
            Ok(v) if text.len() == 4 => {
                self.pos += 4;
                Ok(v)
            }
            _ => self.err("invalid `\\u` escape"),
        }
    }

    fn string(&mut self) -> PResult<String> {
        let start = self.pos;
        self.pos += 1; // opening quote
        let mut out = String::new();
        loop {
            let run_start = self.pos;
            while let Some(&b) = self.bytes.get(self.pos) {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.pos += 1;
            }
            // The input is a &str, and we only stop on ASCII, so this is valid UTF-8.
            out.push_str(std::str::from_utf8(&self.bytes[run_start..self.pos]).unwrap_or(""));
            if out.len() > MAX_STRING_BYTES {
                return Self::exceeded(start..self.pos, Exceeded::StringBytes);
            }
            match self.bytes.get(self.pos) {
                None => return self.err("unterminated string"),
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.pos += 1;
                    let Some(&esc) = self.bytes.get(self.pos) else {
                        return self.err("unterminated string");
                    };
                    self.pos += 1;
                    match esc {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let hi = self.hex4()?;
                            let code = if (0xD800..0xDC00).contains(&hi) {
                                if !self.bytes[self.pos..].starts_with(b"\\u") {
                                    return self.err("unpaired surrogate in `\\u` escape");
                                }
                                self.pos += 2;
                                let lo = self.hex4()?;
                                if !(0xDC00..0xE000).contains(&lo) {
                                    return self.err("invalid low surrogate in `\\u` escape");
                                }
                                0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                            } else {
                                hi
                            };
                            match char::from_u32(code) {
                                Some(c) => out.push(c),
                                None => return self.err("invalid `\\u` escape"),
                            }
                        }
                        _ => {
                            self.pos -= 1;
                            return self.err("invalid escape");
                        }
                    }
                }
                Some(_) => return self.err("control character in string; escape it"),
            }
        }
    }

    fn array(&mut self, depth: usize) -> PResult<NodeKind> {
        let start = self.pos;
        self.pos += 1;
        let mut items = Vec::new();
        self.skip_ws();
        if self.bytes.get(self.pos) == Some(&b']') {
            self.count_item()?;
            self.pos += 1;
            return Ok(NodeKind::Array(items));
        }
        loop {
            self.skip_ws();
            if items.len() == MAX_ARRAY_LEN {
                return Self::exceeded(start..start + 1, Exceeded::ArrayLen);
            }
            items.push(self.value(depth + 1)?);
            self.skip_ws();
            match self.bytes.get(self.pos) {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.count_item()?;
                    self.pos += 1;
                    return Ok(NodeKind::Array(items));
                }
                _ => return self.err("expected `,` or `]`"),
            }
        }
    }

    fn object(&mut self, depth: usize) -> PResult<NodeKind> {
        let start = self.pos;
        self.pos += 1;
        let mut entries: Vec<(Key, Node)> = Vec::new();
        // Where each key was first defined; a map, so wide objects stay linear.
        let mut seen: HashMap<String, usize> = HashMap::new();
        self.skip_ws();
        if self.bytes.get(self.pos) == Some(&b'}') {
            self.count_item()?;
            self.pos += 1;
            return Ok(NodeKind::Table(entries));
        }
        loop {
            self.skip_ws();
            if self.bytes.get(self.pos) != Some(&b'"') {
                return self.err("expected a string key");
            }
            if entries.len() == MAX_TABLE_ENTRIES {
                return Self::exceeded(start..start + 1, Exceeded::TableEntries);
            }
            self.count_item()?;
            let key_start = self.pos;
            let name = self.string()?;
            let key = Key {
                name,
                span: key_start..self.pos,
            };
            self.skip_ws();
            if self.bytes.get(self.pos) != Some(&b':') {
                return self.err("expected `:` after the key");
            }
            self.pos += 1;
            self.skip_ws();
            let value = self.value(depth + 1)?;
            if let Some(&first) = seen.get(&key.name) {
                // Past the cap keep parsing (syntax errors still count) but stop collecting.
                if has_room(self.diags) {
                    let line = self.file.position(first).line;
                    self.diags.push(
                        Diagnostic::error(format!("duplicate key `{}`", key.name))
                            .at(self.file, key.span.clone())
                            .with_hint(format!(
                                "the key is first defined on line {line}; keep one of them"
                            )),
                    );
                }
            } else {
                seen.insert(key.name.clone(), key.span.start);
                entries.push((key, value));
            }
            self.skip_ws();
            match self.bytes.get(self.pos) {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.count_item()?;
                    self.pos += 1;
                    return Ok(NodeKind::Table(entries));
                }
                _ => return self.err("expected `,` or `}`"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(text: &str) -> (Option<Node>, Vec<Diagnostic>) {
        let file = SourceFile::new("t.json", text);
        let mut diags = Vec::new();
        (parse(&file, &mut diags), diags)
    }

    #[test]
    fn parses_values_with_spans() {
        let (node, diags) =
            parse_str(r#"{"a": [1, 2.5, "x\u00e9\ud83d\ude00"], "b": {"c": null, "d": true}}"#);
        assert!(diags.is_empty());
        let node = node.unwrap();
        let NodeKind::Array(items) = &node.get("a").unwrap().kind else {
            panic!()
        };
        assert_eq!(items[0].kind, NodeKind::Int(1));
        assert_eq!(items[1].kind, NodeKind::Float(2.5));
        assert_eq!(items[2].kind, NodeKind::Str("xé😀".into()));
        assert_eq!(items[0].span, 7..8);
        assert_eq!(
            node.get("b").unwrap().get("d").unwrap().kind,
            NodeKind::Bool(true)
        );
    }

    #[test]
    fn duplicate_keys_are_reported_with_both_places() {
        let (node, diags) = parse_str("{\"a\": 1,\n \"a\": 2}");
        assert!(node.is_some());
        assert_eq!(diags.len(), 1);
        assert_eq!(diags[0].summary, "duplicate key `a`");
        assert!(diags[0].hint.as_deref().unwrap().contains("line 1"));
    }

    #[test]
    fn malformed_input_is_an_error_not_a_panic() {
        for bad in [
            "",
            "{",
            "[1,",
            "{\"a\" 1}",
            "\"\\u12\"",
            "\"\\ud800\"",
            "01x",
            "{} {}",
            "[-]",
            "\"a\nb\"",
            "tru",
        ] {
            let (node, diags) = parse_str(bad);
            assert!(node.is_none(), "{bad:?} parsed");
            assert_eq!(diags.len(), 1, "{bad:?}: {diags:?}");
        }
    }

    #[test]
    fn deep_nesting_is_refused() {
        let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        let (node, diags) = parse_str(&deep);
        assert!(node.is_none());
        assert!(diags[0].summary.contains("nesting"));
    }
}
