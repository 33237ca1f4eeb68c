//! Parsing a manifest's text into its [`Node`] tree: JSON through the
//! span-keeping parser (`json`), TOML through the streaming builder
//! (`toml_tree`) or, for a document with errors that fits the memory budget,
//! the toml crate's own tree (whose diagnostics npc reports). The tree and
//! its bounds are `node`'s; this file only chooses and converts, so the tree
//! never depends on its parsers.

use super::diagnostics::{Diagnostic, MAX_DIAGNOSTICS, clip, has_room};
use super::json;
use super::node::{
    Exceeded, Key, MAX_ARRAY_LEN, MAX_NESTING_DEPTH, MAX_STRING_BYTES, MAX_TABLE_ENTRIES, Node,
    NodeKind, Syntax, float_kind, int_kind, toml_path_fits,
};
use super::source::{SourceFile, Span};
use super::toml_tree;

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
    // A document is built straight from the parser's events, in little
    // more memory than the tree itself, and refused at its first item past
    // the bound.
    let failure = match toml_tree::build(text) {
        Ok(node) => return Some(node),
        Err(failure) => failure,
    };
    if let Some((Exceeded::Items, span)) = failure.exceeded {
        diags.push(Exceeded::Items.diagnostic(file, span));
        return None;
    }
    // One with errors is parsed again by the toml crate, whose diagnostics
    // npc has always reported, when that fits the memory budget; a larger
    // one reports the builder's own (the same errors, in toml's words).
    if failure.is_empty() || toml_path_fits(text.len(), failure.tokens) {
        return parse_toml_reference(file, diags);
    }
    for error in failure.errors {
        if has_room(diags) {
            diags.push(toml_error_diagnostic(file, &error.message, error.span));
        }
    }
    if let Some((what, span)) = failure.exceeded
        && has_room(diags)
    {
        diags.push(what.diagnostic(file, span));
    }
    None
}

/// The diagnostic for one error of the toml crate (or of the streaming
/// builder, in its words).
fn toml_error_diagnostic(file: &SourceFile, message: &str, span: Span) -> Diagnostic {
    let text = file.text();
    let mut message = message.trim().replace('\n', "; ");
    // toml says only "duplicate key"; name the key the caret points at.
    if message == "duplicate key"
        && let Some(key) = text.get(span.clone()).filter(|k| !k.contains('\n'))
    {
        message = format!("duplicate key `{}`", clip(key));
    }
    let hint = match duplicate_table(text, &span) {
        Some(dup) => format!(
            "`{}` is first defined on line {}; merge the two tables, or rename one",
            clip(dup.header),
            dup.first_line
        ),
        None => "fix the syntax at the caret; see https://toml.io/en/v1.0.0".to_string(),
    };
    Diagnostic::error(format!("invalid TOML: {message}"))
        .at(file, span)
        .with_hint(hint)
}

/// A table header defined twice (`[providers.a]` again): the header, the
/// line of its first definition, and the byte range of the second one's
/// body (whose keys toml reports as duplicates too).
struct DuplicateTable<'t> {
    header: &'t str,
    first_line: usize,
    body: std::ops::Range<usize>,
}

/// The duplicate table whose header holds `span`, when the error is one.
fn duplicate_table<'t>(text: &'t str, span: &Span) -> Option<DuplicateTable<'t>> {
    let start = text.get(..span.start)?.rfind('\n').map_or(0, |i| i + 1);
    let end = text
        .get(span.start..)?
        .find('\n')
        .map_or(text.len(), |i| span.start + i);
    let header = text.get(start..end)?.trim();
    if !header.starts_with('[') || header.starts_with("[[") {
        return None;
    }
    let first_line = text
        .get(..start)?
        .lines()
        .position(|l| l.trim() == header)?
        + 1;
    let rest = text.get(end..)?;
    let mut offset = end;
    let mut body_end = text.len();
    for line in rest.split_inclusive('\n').skip(1) {
        offset += line.len();
        if line.trim_start().starts_with('[') {
            body_end = offset - line.len();
            break;
        }
    }
    // `offset` began at the header's newline: the first piece is its end.
    Some(DuplicateTable {
        header,
        first_line,
        body: end..body_end,
    })
}

/// Parse a TOML document through the toml crate's own tree, converted into
/// ours: the path for documents with errors or past a bound (its
/// diagnostics are the ones npc reports), and the oracle the streaming
/// builder is tested against. Costs the toml crate's tokens, events and
/// table on top of our tree; the item limit bounds that.
pub(super) fn parse_toml_reference(file: &SourceFile, diags: &mut Vec<Diagnostic>) -> Option<Node> {
    let text = file.text();
    let (table, errors) = toml::de::DeTable::parse_recoverable(text);
    let failed = !errors.is_empty();
    // The keys of a table defined twice are reported as duplicates too:
    // one error (at the second header, naming the first) says it all.
    let mut cascade: Vec<std::ops::Range<usize>> = Vec::new();
    let mut shown = 0;
    for err in errors {
        let span = err.span().unwrap_or(0..0);
        if cascade.iter().any(|body| body.contains(&span.start)) {
            continue;
        }
        if let Some(dup) = duplicate_table(text, &span) {
            cascade.push(dup.body);
        }
        // One past the cap, so the report says problems were dropped.
        if shown > MAX_DIAGNOSTICS {
            break;
        }
        shown += 1;
        diags.push(toml_error_diagnostic(file, err.message(), span));
    }
    if failed {
        return None;
    }
    let span = table.span();
    let root = toml::de::DeValue::Table(table.into_inner());
    let mut exceeded = Vec::new();
    // By value: each of toml's tables is freed as soon as it is converted,
    // so the two trees are never both whole in memory.
    let node = from_toml(root, span, 0, &mut exceeded);
    if exceeded.is_empty() {
        return Some(node);
    }
    for (what, span) in exceeded {
        if has_room(diags) {
            diags.push(what.diagnostic(file, span));
        }
    }
    None
}

/// Convert toml's tree into a [`Node`], consuming it, and recording every
/// bound it exceeds (the offending value becomes `Null`, so nothing past a
/// bound is copied).
fn from_toml(
    value: toml::de::DeValue<'_>,
    span: Span,
    depth: usize,
    exceeded: &mut Vec<(Exceeded, Span)>,
) -> Node {
    use toml::de::DeValue;
    let null = |span| Node {
        kind: NodeKind::Null,
        span,
    };
    if depth > MAX_NESTING_DEPTH {
        // Report the outermost place only.
        if !exceeded.iter().any(|(e, _)| *e == Exceeded::Depth) {
            exceeded.push((Exceeded::Depth, span.clone()));
        }
        return null(span);
    }
    let kind = match value {
        DeValue::String(s) if s.len() > MAX_STRING_BYTES => {
            exceeded.push((Exceeded::StringBytes, span.clone()));
            return null(span);
        }
        DeValue::String(s) => NodeKind::Str(s.into_owned()),
        DeValue::Integer(i) => int_kind(i.as_str(), i.radix()),
        DeValue::Float(f) => float_kind(f.as_str()),
        DeValue::Boolean(b) => NodeKind::Bool(b),
        DeValue::Datetime(d) => NodeKind::Datetime(d.to_string()),
        DeValue::Array(items) if items.len() > MAX_ARRAY_LEN => {
            exceeded.push((Exceeded::ArrayLen, span.clone()));
            return null(span);
        }
        DeValue::Array(items) => NodeKind::Array(
            items
                .into_iter()
                .map(|item| {
                    let span = item.span();
                    from_toml(item.into_inner(), span, depth + 1, exceeded)
                })
                .collect(),
        ),
        DeValue::Table(table) if table.len() > MAX_TABLE_ENTRIES => {
            exceeded.push((Exceeded::TableEntries, span.clone()));
            return null(span);
        }
        DeValue::Table(table) => NodeKind::Table(
            table
                .into_iter()
                .map(|(k, v)| {
                    let key_span = k.span();
                    let name = k.into_inner();
                    let name = if name.len() > MAX_STRING_BYTES {
                        exceeded.push((Exceeded::StringBytes, key_span.clone()));
                        String::new()
                    } else {
                        name.into_owned()
                    };
                    let span = v.span();
                    (
                        Key {
                            name,
                            span: key_span,
                        },
                        from_toml(v.into_inner(), span, depth + 1, exceeded),
                    )
                })
                .collect(),
        ),
    };
    Node { kind, span }
}
