//! A small YAML emitter for profile frontmatter: block mappings and
//! sequences of `serde_json::Value`s, keys in the order given, strings
//! double-quoted with JSON-compatible escapes unless they are unmistakably
//! plain words. Deterministic: the same value always gives the same bytes.

use std::fmt::Write as _;

use serde_json::{Map, Value};

/// Spaces per nesting level.
const INDENT: usize = 2;

/// Words YAML 1.1 or 1.2 would read as something other than a string.
const RESERVED_WORDS: [&str; 11] = [
    "true", "false", "yes", "no", "on", "off", "y", "n", "null", "nan", "inf",
];

/// Emit `map` as a block mapping (one `key: value` per line, each line
/// ending in `\n`). An empty map gives `{}\n`.
pub fn mapping(map: &Map<String, Value>) -> String {
    let mut out = String::new();
    if map.is_empty() {
        out.push_str("{}\n");
    } else {
        write_map(&mut out, map, 0);
    }
    out
}

/// A string as a YAML scalar: plain when that is unambiguous, else
/// double-quoted.
pub fn scalar_str(s: &str) -> String {
    if is_plain_safe(s) {
        s.to_string()
    } else {
        quoted(s)
    }
}

/// A double-quoted YAML string. Escapes `"`, `\`, every control character,
/// C1 controls, line/paragraph separators, the byte-order mark and
/// non-characters; everything else is written as UTF-8.
pub fn quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\u{0}'..='\u{1f}'
            | '\u{7f}'..='\u{9f}'
            | '\u{2028}'
            | '\u{2029}'
            | '\u{feff}'
            | '\u{fffe}'
            | '\u{ffff}' => {
                let _ = write!(out, "\\u{:04X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A word made of ASCII letters, digits and `_ - . /`, starting with a
/// letter, that YAML does not read as a boolean, null or number.
fn is_plain_safe(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'))
        && !RESERVED_WORDS.iter().any(|w| w.eq_ignore_ascii_case(s))
}

fn scalar(v: &Value) -> Option<String> {
    Some(match v {
        Value::Null => "null".to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => scalar_str(s),
        Value::Array(a) if a.is_empty() => "[]".to_string(),
        Value::Object(o) if o.is_empty() => "{}".to_string(),
        Value::Array(_) | Value::Object(_) => return None,
    })
}

fn pad(out: &mut String, indent: usize) {
    out.extend(std::iter::repeat_n(' ', indent));
}

fn write_map(out: &mut String, map: &Map<String, Value>, indent: usize) {
    for (i, (key, value)) in map.iter().enumerate() {
        // The first key of a sequence item shares the `- ` line.
        if i > 0 || indent == 0 || !out.ends_with("- ") {
            pad(out, indent);
        }
        out.push_str(&scalar_str(key));
        out.push(':');
        write_value_after_key(out, value, indent);
    }
}

fn write_value_after_key(out: &mut String, value: &Value, indent: usize) {
    match scalar(value) {
        Some(s) => {
            out.push(' ');
            out.push_str(&s);
            out.push('\n');
        }
        None => {
            out.push('\n');
            write_block(out, value, indent + INDENT);
        }
    }
}

/// A non-empty array or object as a block at `indent`.
fn write_block(out: &mut String, value: &Value, indent: usize) {
    match value {
        Value::Object(map) => write_map(out, map, indent),
        Value::Array(items) => {
            for item in items {
                pad(out, indent);
                out.push('-');
                match (scalar(item), item) {
                    (Some(s), _) => {
                        out.push(' ');
                        out.push_str(&s);
                        out.push('\n');
                    }
                    (None, Value::Object(map)) => {
                        out.push(' ');
                        // Compact form: `- key: value`, further keys aligned.
                        write_map(out, map, indent + INDENT);
                    }
                    (None, _) => {
                        out.push('\n');
                        write_block(out, item, indent + INDENT);
                    }
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn parse(yaml: &str) -> Value {
        serde_norway::from_str(yaml).unwrap_or_else(|e| panic!("{e}\n---\n{yaml}"))
    }

    #[test]
    fn escapes_what_yaml_would_misread() {
        let hostile = [
            "say \"hi\"",
            "two\nlines\r\n",
            "key: value",
            "# not a comment",
            "- not a list",
            "ünïcødé ✓ 日本",
            "yes",
            "No",
            "null",
            "~",
            "",
            " leading space",
            "trailing space ",
            "123",
            "1e3",
            "0x1F",
            "@at",
            "`tick`",
            "{braces}",
            "[brackets]",
            "a, b",
            "*star",
            "&anchor",
            "!tag",
            "|pipe",
            ">fold",
            "%percent",
            "back\\slash",
            "tab\there",
            "\u{7}bell\u{1b}esc\u{85}nel\u{2028}ls\u{feff}bom",
            "mcp__fs__*",
            "Bash(git diff:*)",
        ];
        let mut map = Map::new();
        for (i, s) in hostile.iter().enumerate() {
            map.insert(format!("k{i}"), json!(s));
            map.insert((*s).to_string(), json!(i));
        }
        let yaml = mapping(&map);
        assert_eq!(parse(&yaml), Value::Object(map));
    }

    #[test]
    fn plain_words_stay_plain() {
        assert_eq!(scalar_str("reviewer"), "reviewer");
        assert_eq!(scalar_str("claude-sonnet-4.5"), "claude-sonnet-4.5");
        assert_eq!(scalar_str("yes"), "\"yes\"");
        assert_eq!(scalar_str("a: b"), "\"a: b\"");
        assert_eq!(scalar_str("# x"), "\"# x\"");
        assert_eq!(scalar_str("-x"), "\"-x\"");
        assert_eq!(quoted("é\n\""), "\"é\\n\\\"\"");
    }

    #[test]
    fn nested_maps_and_lists() {
        let v = json!({
            "name": "reviewer",
            "mcpServers": {
                "fs": {"type": "stdio", "command": "npx", "args": ["-y", "x"], "env": {"TOKEN": "${TOKEN}"}, "timeout": 60000}
            },
            "list_of_maps": [{"a": 1, "b": [1, 2]}, {"c": {"d": null}}, {}],
            "list_of_lists": [[1, [2, 3]], [], ["x"]],
            "empty": {},
            "none": [],
            "flags": [true, false, null, 1.5, -3]
        });
        let yaml = mapping(v.as_object().unwrap());
        assert_eq!(parse(&yaml), v);
        insta::assert_snapshot!(yaml);
    }

    #[test]
    fn deterministic() {
        let v = json!({"b": [1, {"x": "y"}], "a": "z"});
        assert_eq!(
            mapping(v.as_object().unwrap()),
            mapping(v.as_object().unwrap())
        );
        assert_eq!(mapping(&Map::new()), "{}\n");
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<String>().prop_map(Value::String),
            "[-#:a-z \"'\n{}\\[\\]]{0,8}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                proptest::collection::btree_map(any::<String>(), inner, 0..5)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn round_trips_through_a_yaml_parser(
            map in proptest::collection::btree_map("[a-zA-Z0-9 :#\\-\"]{0,6}", arb_json(), 0..6)
        ) {
            let map: Map<String, Value> = map.into_iter().collect();
            let yaml = mapping(&map);
            let back: Value = serde_norway::from_str(&yaml)
                .map_err(|e| TestCaseError::fail(format!("{e}\n{yaml}")))?;
            prop_assert_eq!(back, Value::Object(map));
        }
    }
}
