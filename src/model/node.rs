//! The generic document tree every manifest is read into before serde sees
//! it: TOML and JSON both become a [`Node`] tree that keeps the byte span of
//! every value and key. Parsing is bounded (size, nesting depth) and reports
//! every syntax error it can find, never panicking on hostile input.

use super::diagnostics::{Diagnostic, MAX_DIAGNOSTICS};
use super::json;
use super::source::{SourceFile, Span};

/// Largest manifest npc reads; bigger files are refused before parsing.
pub const MAX_MANIFEST_BYTES: usize = 8 * 1024 * 1024;
/// Deepest nesting of arrays and tables accepted in a manifest.
pub const MAX_NESTING_DEPTH: usize = 64;

/// A value in a parsed document, with its span in the source.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub kind: NodeKind,
    pub span: Span,
}

/// A key of a table, with its span.
#[derive(Debug, Clone, PartialEq)]
pub struct Key {
    pub name: String,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub enum NodeKind {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    /// A TOML date or time, kept as its text.
    Datetime(String),
    Array(Vec<Node>),
    Table(Vec<(Key, Node)>),
}

impl NodeKind {
    /// How the kind is named in messages ("a string", "a table", …).
    pub fn describe(&self) -> &'static str {
        match self {
            NodeKind::Null => "null",
            NodeKind::Bool(_) => "a boolean",
            NodeKind::Int(_) => "an integer",
            NodeKind::Float(_) => "a float",
            NodeKind::Str(_) => "a string",
            NodeKind::Datetime(_) => "a datetime",
            NodeKind::Array(_) => "an array",
            NodeKind::Table(_) => "a table",
        }
    }
}

impl Node {
    /// The value at `key` when this node is a table.
    pub fn get(&self, key: &str) -> Option<&Node> {
        match &self.kind {
            NodeKind::Table(entries) => entries.iter().find(|(k, _)| k.name == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The key and value at `key` when this node is a table.
    pub fn entry(&self, key: &str) -> Option<(&Key, &Node)> {
        match &self.kind {
            NodeKind::Table(entries) => entries
                .iter()
                .find(|(k, _)| k.name == key)
                .map(|(k, v)| (k, v)),
            _ => None,
        }
    }
}

/// The syntax a manifest is written in, chosen by file extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Syntax {
    Toml,
    Json,
}

impl Syntax {
    /// `json` for `*.json`, TOML for everything else.
    pub fn from_path(path: &str) -> Self {
        if path.to_ascii_lowercase().ends_with(".json") {
            Syntax::Json
        } else {
            Syntax::Toml
        }
    }
}

/// Parse `file` into a tree. Returns `None` when nothing usable could be read;
/// syntax errors are pushed to `diags` either way.
pub fn parse(file: &SourceFile, syntax: Syntax, diags: &mut Vec<Diagnostic>) -> Option<Node> {
    match syntax {
        Syntax::Json => json::parse(file, diags),
        Syntax::Toml => parse_toml(file, diags),
    }
}

fn parse_toml(file: &SourceFile, diags: &mut Vec<Diagnostic>) -> Option<Node> {
    let text = file.text();
    let (table, errors) = toml::de::DeTable::parse_recoverable(text);
    let failed = !errors.is_empty();
    // One past the cap, so the report says problems were dropped.
    for err in errors.into_iter().take(MAX_DIAGNOSTICS + 1) {
        let span = err.span().unwrap_or(0..0);
        let mut message = err.message().trim().replace('\n', "; ");
        // toml says only "duplicate key"; name the key the caret points at.
        if message == "duplicate key"
            && let Some(key) = text.get(span.clone()).filter(|k| !k.contains('\n'))
        {
            message = format!("duplicate key `{key}`");
        }
        diags.push(
            Diagnostic::error(format!("invalid TOML: {message}"))
                .at(file, span)
                .with_hint("fix the syntax at the caret; see https://toml.io/en/v1.0.0"),
        );
    }
    if failed {
        return None;
    }
    let span = table.span();
    let root = toml::de::DeValue::Table(table.into_inner());
    let mut depth_error = false;
    let node = from_toml(&root, span, 0, &mut depth_error);
    if depth_error {
        diags.push(
            Diagnostic::error(format!("nesting is deeper than {MAX_NESTING_DEPTH} levels"))
                .at(file, 0..0)
                .with_hint("flatten the document; no manifest field nests this deep"),
        );
        return None;
    }
    Some(node)
}

fn from_toml(value: &toml::de::DeValue<'_>, span: Span, depth: usize, too_deep: &mut bool) -> Node {
    use toml::de::DeValue;
    if depth > MAX_NESTING_DEPTH {
        *too_deep = true;
        return Node {
            kind: NodeKind::Null,
            span,
        };
    }
    let kind = match value {
        DeValue::String(s) => NodeKind::Str(s.to_string()),
        DeValue::Integer(i) => {
            let digits: String = i.as_str().chars().filter(|c| *c != '_').collect();
            let (neg, digits) = match digits.strip_prefix('-') {
                Some(rest) => (true, rest.to_string()),
                None => (false, digits.trim_start_matches('+').to_string()),
            };
            let digits = ["0x", "0o", "0b"]
                .iter()
                .find_map(|p| digits.strip_prefix(p))
                .unwrap_or(&digits)
                .to_string();
            match i64::from_str_radix(&digits, i.radix()) {
                Ok(n) => NodeKind::Int(if neg { -n } else { n }),
                Err(_) => NodeKind::Float(f64::NAN),
            }
        }
        DeValue::Float(f) => {
            let text: String = f.as_str().chars().filter(|c| *c != '_').collect();
            let v = match text.as_str() {
                "inf" | "+inf" => f64::INFINITY,
                "-inf" => f64::NEG_INFINITY,
                "nan" | "+nan" | "-nan" => f64::NAN,
                t => t.parse().unwrap_or(f64::NAN),
            };
            NodeKind::Float(v)
        }
        DeValue::Boolean(b) => NodeKind::Bool(*b),
        DeValue::Datetime(d) => NodeKind::Datetime(d.to_string()),
        DeValue::Array(items) => NodeKind::Array(
            items
                .iter()
                .map(|item| from_toml(item.get_ref(), item.span(), depth + 1, too_deep))
                .collect(),
        ),
        DeValue::Table(table) => NodeKind::Table(
            table
                .iter()
                .map(|(k, v)| {
                    (
                        Key {
                            name: k.get_ref().to_string(),
                            span: k.span(),
                        },
                        from_toml(v.get_ref(), v.span(), depth + 1, too_deep),
                    )
                })
                .collect(),
        ),
    };
    Node { kind, span }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toml(text: &str) -> (Option<Node>, Vec<Diagnostic>) {
        let file = SourceFile::new("t.toml", text);
        let mut diags = Vec::new();
        (parse(&file, Syntax::Toml, &mut diags), diags)
    }

    #[test]
    fn toml_values_keep_spans() {
        let (node, diags) = toml("a = 0x1F\n[b]\nc = \"x\"\nd = -1_000\n");
        assert!(diags.is_empty(), "{diags:?}");
        let node = node.unwrap();
        assert_eq!(node.get("a").unwrap().kind, NodeKind::Int(31));
        let c = node.get("b").unwrap().get("c").unwrap();
        assert_eq!(c.kind, NodeKind::Str("x".into()));
        assert_eq!(c.span, 17..20);
        assert_eq!(
            node.get("b").unwrap().get("d").unwrap().kind,
            NodeKind::Int(-1000)
        );
    }

    #[test]
    fn toml_reports_every_syntax_error() {
        let (node, diags) = toml("a = \nb = = 2\nc = [\n");
        assert!(node.is_none());
        assert!(diags.len() >= 2, "{diags:#?}");
    }

    #[test]
    fn toml_duplicate_keys_are_errors() {
        let (node, diags) = toml("a = 1\na = 2\n");
        assert!(node.is_none());
        assert!(
            diags[0].summary.contains("duplicate"),
            "{}",
            diags[0].summary
        );
    }

    #[test]
    fn deep_toml_is_refused_not_overflowed() {
        let deep = format!("a = {}{}\n", "[".repeat(10_000), "]".repeat(10_000));
        let (node, diags) = toml(&deep);
        assert!(node.is_none());
        assert!(!diags.is_empty());
    }
}
