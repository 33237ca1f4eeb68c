//! The generic document tree every manifest is read into before serde sees
//! it: TOML and JSON both become a [`Node`] tree that keeps the byte span of
//! every value and key. Parsing is bounded (size, nesting depth, keys and
//! values in the document, items per array, entries per table, bytes per
//! string) and reports every syntax error it can find, never panicking on
//! hostile input. The item count of a TOML document is checked by a
//! streaming pass over its tokens before any tree is built, so a document of
//! millions of tiny values is refused in constant memory. The parsers
//! that build the tree (`model::parse` chooses one) depend on it, never it
//! on them.

use super::diagnostics::Diagnostic;
use super::source::{SourceFile, Span};

/// Largest manifest npc reads; bigger files are refused before parsing.
pub const MAX_MANIFEST_BYTES: usize = 8 * 1024 * 1024;
/// Deepest nesting of arrays and tables accepted in a manifest.
pub const MAX_NESTING_DEPTH: usize = 64;
/// Items any manifest may hold, however small the file. Items are what
/// parsing spends memory on: every key (each part of a dotted key), every
/// scalar, and every bracket (an array or table counts twice, once per
/// bracket, as it costs about twice a scalar).
pub const BASE_DOCUMENT_ITEMS: usize = 60_000;
/// One more item is allowed per this many bytes of the file.
pub const BYTES_PER_EXTRA_ITEM: usize = 8;
/// Most items in any manifest (reached at about 1.1 MB of text).
pub const MAX_DOCUMENT_ITEMS: usize = 200_000;

/// How many items a manifest of `len` bytes may hold. Built by
/// `model::toml_tree`, an item costs about 100 bytes at the peak of
/// parsing (our tree and its key index), so memory stays within 20 times the
/// file size plus 20 MB even for a file of nothing but `1,`, `[],` or
/// `kN = 1` (the densest shapes); a document with errors is parsed again
/// by the toml crate only when its cost fits ([`toml_path_fits`]). Real
/// manifests spend 5 or more bytes
/// an item and never come near the limit (10,000 components take 150,000
/// items in 800 KB).
pub fn item_limit(len: usize) -> usize {
    (BASE_DOCUMENT_ITEMS + len / BYTES_PER_EXTRA_ITEM).min(MAX_DOCUMENT_ITEMS)
}
/// Peak memory parsing may cost: this many times the file size…
pub const PARSE_BUDGET_FACTOR: usize = 20;
/// …plus this (issue 7 §6's budget for `npc validate`, whole process).
pub const PARSE_BUDGET_BASE_BYTES: usize = 20 * 1024 * 1024;
/// What the toml crate's path costs a document with errors, per token
/// ([`TomlCounts::tokens`], whitespace and commas included): its token and
/// event vectors, its `DeTable`, up to one error a token (a run of commas
/// makes one each), and the heap the streaming builder's freed tree leaves
/// behind. Measured with `/usr/bin/time -f %M` on `npc validate` (release):
/// 54.4 MiB for the 560,000 tokens of `kN = 1` lines with a redefinition at
/// the end (83 bytes a token over the baseline), 1.5 GB for 8 MB of commas
/// in one array (an error a token, about 190 bytes a token); rounded up
/// with room.
pub const TOML_PATH_BYTES_PER_TOKEN: usize = 400;
/// The process's own peak before any parsing (`npc validate` of a minimal
/// manifest peaks at 8.7 MiB), rounded up.
pub const TOML_PATH_BASE_BYTES: usize = 9 * 1024 * 1024;

/// Whether a TOML document of `len` bytes and `tokens` tokens may be parsed
/// again by the toml crate (for its exact diagnostics) within the parse
/// budget. Every ordinary manifest may (a 50 KB one of 25,000 tokens takes
/// 19 MB); a large or dense one reports the streaming builder's own
/// diagnostics instead.
pub fn toml_path_fits(len: usize, tokens: usize) -> bool {
    let cost = tokens
        .saturating_mul(TOML_PATH_BYTES_PER_TOKEN)
        .saturating_add(TOML_PATH_BASE_BYTES);
    cost <= len
        .saturating_mul(PARSE_BUDGET_FACTOR)
        .saturating_add(PARSE_BUDGET_BASE_BYTES)
}
/// Most items in one array (`args`, `paths`, `[[hooks.…]]`, …).
pub const MAX_ARRAY_LEN: usize = 4096;
/// Most entries in one table (a section's named entries, an `env` map, …).
pub const MAX_TABLE_ENTRIES: usize = 20_000;
/// Longest string value or key, in bytes after unescaping (the same as the
/// largest prompt template file).
pub const MAX_STRING_BYTES: usize = 1024 * 1024;

/// A bound of the document tree that an input exceeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exceeded {
    /// More items than [`item_limit`] allows.
    Items,
    /// An array longer than [`MAX_ARRAY_LEN`].
    ArrayLen,
    /// A table with more than [`MAX_TABLE_ENTRIES`] entries.
    TableEntries,
    /// A string or key longer than [`MAX_STRING_BYTES`].
    StringBytes,
    /// Nesting deeper than [`MAX_NESTING_DEPTH`].
    Depth,
}

impl Exceeded {
    /// The diagnostic for this bound, at `span` (the item that went past it,
    /// or the array, table or string that is too large).
    pub fn diagnostic(self, file: &SourceFile, span: Span) -> Diagnostic {
        let (summary, hint) = match self {
            Exceeded::Items => (
                format!(
                    "the manifest has more items (keys, values, brackets) than {BASE_DOCUMENT_ITEMS} plus one per {BYTES_PER_EXTRA_ITEM} bytes of text (at most {MAX_DOCUMENT_ITEMS})"
                ),
                "a manifest declares components, not data: split it, or move bulk data into files the commands read",
            ),
            Exceeded::ArrayLen => (
                format!("this array has more than {MAX_ARRAY_LEN} items"),
                "no manifest field takes this many; shorten the list, or move the data into a file",
            ),
            Exceeded::TableEntries => (
                format!("this table has more than {MAX_TABLE_ENTRIES} entries"),
                "split the manifest, or move the data into a file",
            ),
            Exceeded::StringBytes => (
                format!("this string is longer than {MAX_STRING_BYTES} bytes"),
                "move long text into a file, such as a prompt `file`",
            ),
            Exceeded::Depth => (
                format!("nesting is deeper than {MAX_NESTING_DEPTH} levels"),
                "flatten the document; no manifest field nests this deep",
            ),
        };
        Diagnostic::error(summary).at(file, span).with_hint(hint)
    }
}

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

/// The span of the first item of a TOML document past [`item_limit`], if it
/// has that many. One streaming pass over the tokens in constant memory:
/// every string, bare word (key part, number, boolean, date) and bracket
/// counts once. Importers reading agent configs may call
/// it before parsing a file they did not write.
pub fn toml_items_exceeded(text: &str) -> Option<Span> {
    toml_item_count(text).err()
}

/// What a TOML document holds, counted in one pass over its tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TomlCounts {
    /// Items, as [`toml_items_exceeded`] counts them.
    pub items: usize,
    /// Every token, whitespace, newlines and commas included.
    pub tokens: usize,
}

/// Whether a token of this kind counts as an item: every string, bare word
/// (key part, number, boolean, date) and bracket.
pub(super) fn is_toml_item(kind: toml_parser::lexer::TokenKind) -> bool {
    use toml_parser::lexer::TokenKind;
    matches!(
        kind,
        TokenKind::Atom
            | TokenKind::BasicString
            | TokenKind::LiteralString
            | TokenKind::MlBasicString
            | TokenKind::MlLiteralString
            | TokenKind::LeftSquareBracket
            | TokenKind::RightSquareBracket
            | TokenKind::LeftCurlyBracket
            | TokenKind::RightCurlyBracket
    )
}

/// The items and tokens of a TOML document, or the span of the first item
/// past [`item_limit`].
pub fn toml_item_count(text: &str) -> Result<TomlCounts, Span> {
    let limit = item_limit(text.len());
    let mut items = 0usize;
    let mut tokens = 0usize;
    for token in toml_parser::Source::new(text).lex() {
        tokens += 1;
        if is_toml_item(token.kind()) {
            items += 1;
            if items > limit {
                let span = token.span();
                return Err(span.start()..span.end());
            }
        }
    }
    Ok(TomlCounts { items, tokens })
}

/// The value of a TOML integer as decoded by `toml_parser` (sign, radix
/// prefix and underscores still in the text). One out of `i64` range
/// becomes a NaN float, which no field accepts.
pub(super) fn int_kind(text: &str, radix: u32) -> NodeKind {
    let digits: String = text.chars().filter(|c| *c != '_').collect();
    let (neg, digits) = match digits.strip_prefix('-') {
        Some(rest) => (true, rest.to_string()),
        None => (false, digits.trim_start_matches('+').to_string()),
    };
    let digits = ["0x", "0o", "0b"]
        .iter()
        .find_map(|p| digits.strip_prefix(p))
        .unwrap_or(&digits)
        .to_string();
    match i64::from_str_radix(&digits, radix) {
        Ok(n) => NodeKind::Int(if neg { -n } else { n }),
        Err(_) => NodeKind::Float(f64::NAN),
    }
}

/// The value of a TOML float as decoded by `toml_parser`.
pub(super) fn float_kind(text: &str) -> NodeKind {
    let text: String = text.chars().filter(|c| *c != '_').collect();
    let v = match text.as_str() {
        "inf" | "+inf" => f64::INFINITY,
        "-inf" => f64::NEG_INFINITY,
        "nan" | "+nan" | "-nan" => f64::NAN,
        t => t.parse().unwrap_or(f64::NAN),
    };
    NodeKind::Float(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::parse::{parse, parse_toml_reference};

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
    fn the_toml_path_is_taken_only_where_it_fits_the_budget() {
        // Every ordinary manifest with errors keeps toml's diagnostics.
        let small = "version = 1\n".repeat(1000);
        assert!(toml_path_fits(
            small.len(),
            toml_item_count(&small).unwrap().tokens
        ));
        assert!(toml_path_fits(50_000, 25_000));
        // Dense documents near the item limit do not, nor runs of commas.
        let len = 1_000_000;
        assert!(!toml_path_fits(len, 3 * item_limit(len)));
        assert!(!toml_path_fits(len, len));
        // Fitting is monotonic in the tokens.
        let edge = (0..len).find(|&t| !toml_path_fits(len, t)).unwrap();
        assert!((edge..len).step_by(97).all(|t| !toml_path_fits(len, t)));
        assert!(
            (edge - 1) * TOML_PATH_BYTES_PER_TOKEN + TOML_PATH_BASE_BYTES
                <= PARSE_BUDGET_FACTOR * len + PARSE_BUDGET_BASE_BYTES
        );
    }

    #[test]
    fn a_document_past_the_threshold_reports_the_builders_errors() {
        // `kN = 1` lines up to the item limit of their size, then a
        // duplicate key: too many items for the toml crate's path.
        let mut text = String::new();
        let mut items = 0;
        for i in 0.. {
            if items + 4 > item_limit(text.len()) {
                break;
            }
            text.push_str(&format!("k{i} = 1\n"));
            items += 2;
        }
        let tokens = toml_item_count(&text).unwrap().tokens;
        assert!(!toml_path_fits(text.len(), tokens));
        text.push_str("k7 = 2\n");
        let (node, diags) = toml(&text);
        assert!(node.is_none());
        assert_eq!(diags.len(), 1, "{diags:?}");
        assert_eq!(diags[0].summary, "invalid TOML: duplicate key `k7`");
        // The same error, at the same place, as the toml crate's path
        // reports; only that path names the key's first definition in the
        // hint (it needs the crate's table, which a document past the
        // threshold never gets: that is the point of the threshold).
        let file = SourceFile::new("t.toml", text.as_str());
        let mut reference = Vec::new();
        assert!(parse_toml_reference(&file, &mut reference).is_none());
        let shown = |d: &[Diagnostic]| {
            d.iter()
                .map(|d| {
                    (
                        d.summary.clone(),
                        d.location.as_ref().map(|l| l.span.clone()),
                    )
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(shown(&diags), shown(&reference));
        assert_eq!(
            reference[0].hint.as_deref(),
            Some("`k7` is first defined on line 8; keep one of them")
        );
        assert_eq!(
            diags[0].hint.as_deref(),
            Some("fix the syntax at the caret; see https://toml.io/en/v1.0.0")
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
