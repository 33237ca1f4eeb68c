//! JSON with comments, as Gemini CLI (`strip-json-comments`, then
//! `JSON.parse`) and OpenCode (`jsonc-parser` with trailing commas) read
//! their settings. [`strip`] blanks comments (and, where the target allows
//! them, trailing commas) to spaces of the same byte length, so the result
//! parses as plain JSON and every offset still points into the original
//! text. [`rewrite`] produces the edited file from the original text: a
//! value that did not change keeps its exact text, comments and layout; an
//! object that changed is rebuilt member by member, keeping each surviving
//! member's leading comments; only a changed non-object value is printed
//! afresh.

use serde_json::{Map, Value};

/// What a target's reader accepts beyond plain JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dialect {
    /// A comma after the last member of an object or array (OpenCode).
    pub trailing_commas: bool,
}

/// `text` with `//` and `/* */` comments (and trailing commas when the
/// dialect allows them) replaced by spaces, newlines kept; `None` when
/// there is nothing to blank. An unterminated comment is left as it is, so
/// the JSON parser reports it.
pub fn strip(text: &str, dialect: Dialect) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = bytes.to_vec();
    let mut changed = false;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => i = string_end(bytes, i),
            b'/' if bytes.get(i + 1) == Some(&b'/') => {
                let end = bytes[i..]
                    .iter()
                    .position(|b| *b == b'\n')
                    .map_or(bytes.len(), |p| i + p);
                blank(&mut out, i, end);
                changed = true;
                i = end;
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                let Some(p) = text[i + 2..].find("*/") else {
                    break;
                };
                let end = i + 2 + p + 2;
                blank(&mut out, i, end);
                changed = true;
                i = end;
            }
            _ => i += 1,
        }
    }
    if dialect.trailing_commas {
        // A comma whose next significant byte closes the container.
        let mut i = 0;
        while i < out.len() {
            match out[i] {
                b'"' => i = string_end(&out, i),
                b',' => {
                    let next = out[i + 1..]
                        .iter()
                        .find(|b| !b.is_ascii_whitespace())
                        .copied();
                    if matches!(next, Some(b'}' | b']')) {
                        out[i] = b' ';
                        changed = true;
                    }
                    i += 1;
                }
                _ => i += 1,
            }
        }
    }
    // Only ASCII bytes of comments and commas were replaced by ASCII spaces,
    // so the text stays valid UTF-8.
    changed.then(|| String::from_utf8(out).unwrap_or_else(|_| text.to_string()))
}

/// The byte offset of the first item of a (comment-free) JSON text past
/// [`crate::model::node::item_limit`], if it has that many: the JSON
/// counterpart of [`crate::model::node::toml_items_exceeded`], one pass in
/// constant memory before serde_json builds a tree. Every string, bare word
/// (number, `true`, `false`, `null`) and bracket counts once.
pub fn items_exceeded(text: &str) -> Option<usize> {
    let bytes = text.as_bytes();
    let limit = crate::model::node::item_limit(text.len());
    let mut items = 0usize;
    let mut i = 0;
    while i < bytes.len() {
        let start = i;
        match bytes[i] {
            b'"' => i = string_end(bytes, i),
            b'[' | b']' | b'{' | b'}' => i += 1,
            b if b.is_ascii_alphanumeric() || b == b'-' => {
                while i < bytes.len()
                    && (bytes[i].is_ascii_alphanumeric() || b"+-.".contains(&bytes[i]))
                {
                    i += 1;
                }
            }
            _ => {
                i += 1;
                continue;
            }
        }
        items += 1;
        if items > limit {
            return Some(start);
        }
    }
    None
}

fn blank(out: &mut [u8], start: usize, end: usize) {
    for b in &mut out[start..end] {
        if *b != b'\n' && *b != b'\r' {
            *b = b' ';
        }
    }
}

/// Index just past the string starting at `start` (a `"`).
fn string_end(bytes: &[u8], start: usize) -> usize {
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => return i + 1,
            _ => i += 1,
        }
    }
    bytes.len()
}

fn skip_ws(bytes: &[u8], mut i: usize) -> usize {
    while i < bytes.len() && bytes[i].is_ascii_whitespace() {
        i += 1;
    }
    i
}

/// Index just past the value starting at `start` (no leading whitespace).
fn value_end(bytes: &[u8], start: usize) -> usize {
    match bytes.get(start) {
        Some(b'"') => string_end(bytes, start),
        Some(b'{' | b'[') => {
            let mut depth = 0usize;
            let mut i = start;
            while i < bytes.len() {
                match bytes[i] {
                    b'"' => {
                        i = string_end(bytes, i);
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return i + 1;
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
            bytes.len()
        }
        _ => {
            let mut i = start;
            while i < bytes.len() && !matches!(bytes[i], b',' | b'}' | b']') {
                if bytes[i].is_ascii_whitespace() {
                    break;
                }
                i += 1;
            }
            i
        }
    }
}

/// One member of an object, by byte offsets into the text.
#[derive(Debug)]
struct Member {
    key: String,
    key_start: usize,
    value_start: usize,
    value_end: usize,
    /// The comma after the value, if any.
    comma: Option<usize>,
}

/// The members of the object whose `{` is at `open`, and its `}`.
fn members(stripped: &str, open: usize) -> Option<(Vec<Member>, usize)> {
    let bytes = stripped.as_bytes();
    let mut out = Vec::new();
    let mut i = skip_ws(bytes, open + 1);
    loop {
        match bytes.get(i)? {
            b'}' => return Some((out, i)),
            b'"' => {}
            _ => return None,
        }
        let key_start = i;
        let key_end = string_end(bytes, i);
        let key: String = serde_json::from_str(&stripped[key_start..key_end]).ok()?;
        i = skip_ws(bytes, key_end);
        if bytes.get(i) != Some(&b':') {
            return None;
        }
        let value_start = skip_ws(bytes, i + 1);
        let value_end = value_end(bytes, value_start);
        i = skip_ws(bytes, value_end);
        let comma = (bytes.get(i) == Some(&b',')).then_some(i);
        if comma.is_some() {
            i = skip_ws(bytes, i + 1);
        }
        out.push(Member {
            key,
            key_start,
            value_start,
            value_end,
            comma,
        });
    }
}

/// The whitespace before `pos` on its line.
fn indent_at(text: &str, pos: usize) -> &str {
    let line_start = text[..pos].rfind('\n').map_or(0, |p| p + 1);
    let lead = &text[line_start..pos];
    let len = lead.len() - lead.trim_start().len();
    &lead[..len]
}

/// `value` pretty-printed, its continuation lines indented by `indent`.
fn pretty(value: &Value, indent: &str) -> String {
    let text = serde_json::to_string_pretty(value).unwrap_or_default();
    text.replace('\n', &format!("\n{indent}"))
}

/// The text of the edited document: `original` (whose comment-free form is
/// `stripped`) parsed to `old`, edited to `new`. Unchanged values keep
/// their text. `None` when the text has a shape the scanner does not
/// follow; the caller then prints `new` afresh.
pub fn rewrite(original: &str, stripped: &str, old: &Value, new: &Value) -> Option<String> {
    let start = skip_ws(stripped.as_bytes(), 0);
    let end = value_end(stripped.as_bytes(), start);
    let body = rewrite_value(original, stripped, start, end, old, new, "")?;
    Some(format!("{}{body}{}", &original[..start], &original[end..]))
}

fn rewrite_value(
    original: &str,
    stripped: &str,
    start: usize,
    end: usize,
    old: &Value,
    new: &Value,
    indent: &str,
) -> Option<String> {
    if old == new {
        return Some(original[start..end].to_string());
    }
    match (old, new) {
        (Value::Object(old), Value::Object(new)) => {
            rewrite_object(original, stripped, start, old, new, indent)
        }
        _ => Some(pretty(new, indent)),
    }
}

fn rewrite_object(
    original: &str,
    stripped: &str,
    open: usize,
    old: &Map<String, Value>,
    new: &Map<String, Value>,
    indent: &str,
) -> Option<String> {
    let (members, close) = members(stripped, open)?;
    let inner_indent = members
        .first()
        .map(|m| indent_at(original, m.key_start).to_string())
        .unwrap_or_else(|| format!("{indent}  "));
    let mut items: Vec<String> = Vec::with_capacity(new.len());
    // Where the text after the previous kept separator begins.
    let mut lead_from = open + 1;
    let mut leads = std::collections::HashMap::new();
    for m in &members {
        leads.insert(m.key.as_str(), (lead_from, m));
        lead_from = m.comma.map_or(m.value_end, |c| c + 1);
    }
    for (key, value) in new {
        match (leads.get(key.as_str()), old.get(key)) {
            (Some((lead_start, m)), Some(old_value)) => {
                let lead = &original[*lead_start..m.key_start];
                let head = &original[m.key_start..m.value_start];
                let value = rewrite_value(
                    original,
                    stripped,
                    m.value_start,
                    m.value_end,
                    old_value,
                    value,
                    &inner_indent,
                )?;
                // Comments between the value and its comma stay with it.
                let post = match m.comma {
                    Some(c) => &original[m.value_end..c],
                    None => "",
                };
                items.push(format!("{lead}{head}{value}{post}"));
            }
            _ => {
                let key = serde_json::to_string(key).ok()?;
                items.push(format!(
                    "\n{inner_indent}{key}: {}",
                    pretty(value, &inner_indent)
                ));
            }
        }
    }
    let tail = match members.last() {
        // After the last member: its trailing comments, a trailing comma
        // (where allowed) and the closing line.
        Some(last) => {
            let from = last.comma.map_or(last.value_end, |c| c + 1);
            let kept_last = new.contains_key(&last.key);
            let trailing_comma = last.comma.is_some();
            let rest = &original[from..close];
            match (kept_last, trailing_comma) {
                (true, true) => format!(",{rest}"),
                _ => rest.to_string(),
            }
        }
        None if new.is_empty() => original[open + 1..close].to_string(),
        None => format!("\n{indent}"),
    };
    // The last kept member may have been followed by its comma in the
    // original; the join adds the separators now.
    let tail = if items.is_empty() {
        tail.trim_start_matches(',').to_string()
    } else {
        tail
    };
    Some(format!("{{{}{tail}}}", items.join(",")))
}
