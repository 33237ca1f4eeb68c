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
            diags.push(toml_error_diagnostic(
                file,
                &error.message,
                error.span,
                None,
            ));
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
/// builder, in its words). `first` is where the key of a duplicate-key
/// error was first defined, when known ([`first_definition`]).
fn toml_error_diagnostic(
    file: &SourceFile,
    message: &str,
    span: Span,
    first: Option<FirstDefinition>,
) -> Diagnostic {
    let text = file.text();
    let mut message = message.trim().replace('\n', "; ");
    // toml says only "duplicate key"; name the key the caret points at.
    let duplicate = message == "duplicate key";
    if duplicate && let Some(key) = text.get(span.clone()).filter(|k| !k.contains('\n')) {
        message = format!("duplicate key `{}`", clip(key));
    }
    let table = duplicate_table(text, &span);
    let hint = match (table, first.filter(|_| duplicate)) {
        (Some(dup), _) => format!(
            "`{}` is first defined on line {}; merge the two tables, or rename one",
            clip(dup.header),
            dup.first_line
        ),
        (None, Some(first)) if first.table => format!(
            "`{}` is first defined (as a table) on line {}; merge the two, or rename one",
            clip(&first.key),
            first.line
        ),
        (None, Some(first)) => format!(
            "`{}` is first defined on line {}; keep one of them",
            clip(&first.key),
            first.line
        ),
        (None, None) => "fix the syntax at the caret; see https://toml.io/en/v1.0.0".to_string(),
    };
    Diagnostic::error(format!("invalid TOML: {message}"))
        .at(file, span)
        .with_hint(hint)
}

/// Most duplicate keys whose first definition is looked up in one document
/// (each lookup reads back to the table's header): later ones get the
/// generic hint, so a document of duplicates costs no more than this.
pub(super) const MAX_FIRST_DEFINITION_LOOKUPS: usize = 32;

/// Where a key that a duplicate-key error repeats was first defined.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FirstDefinition {
    /// The key as the repeated line spells its full path (`mcp.servers.fs`).
    key: String,
    /// 1-based line of its first definition.
    line: usize,
    /// Whether it was first defined as a table (a header, or implied by a
    /// dotted key or a longer header).
    table: bool,
}

/// The first definition of the key at `span` of `text` (a duplicate-key
/// error), found in `root`, the document as the toml crate read it (which
/// keeps the first definition): the key's full path is the header above
/// it plus its own dotted key, or the header it is in.
fn first_definition(
    text: &str,
    span: &Span,
    root: &toml::de::DeTable<'_>,
) -> Option<FirstDefinition> {
    let line_start = text.get(..span.start)?.rfind('\n').map_or(0, |i| i + 1);
    let line = text.get(line_start..span.end)?;
    let trimmed = line.trim_start();
    let (base, dotted) = if let Some(header) = trimmed.strip_prefix('[') {
        (Vec::new(), header.trim_start_matches('['))
    } else {
        // A key line: its table is the nearest header above it.
        let above = text.get(..line_start)?;
        let header = above
            .lines()
            .rev()
            .map(str::trim)
            .find(|l| l.starts_with('['))
            .unwrap_or("");
        let inner = header.trim_start_matches('[');
        let inner = inner
            .get(..inner.rfind(']').unwrap_or(0))?
            .trim_end_matches(']');
        let base = if inner.trim().is_empty() {
            Vec::new()
        } else {
            toml_edit::Key::parse(inner).ok()?
        };
        (base, trimmed)
    };
    let own = toml_edit::Key::parse(dotted.trim()).ok()?;
    let path: Vec<String> = base
        .iter()
        .chain(own.iter())
        .map(|k| k.get().to_string())
        .collect();
    let mut table = root;
    let mut found: Option<(usize, bool)> = None;
    for (i, key) in path.iter().enumerate() {
        let (k, v) = table
            .iter()
            .find(|(k, _)| k.get_ref().as_ref() == key.as_str())?;
        let value = match v.get_ref() {
            // An array of tables: its last one is the table keys go to.
            toml::de::DeValue::Array(items) if i + 1 < path.len() => items.last()?.get_ref(),
            other => other,
        };
        found = Some((earliest(k.span().start, value), value.as_table().is_some()));
        match value.as_table() {
            Some(inner) => table = inner,
            None if i + 1 < path.len() => return None,
            None => {}
        }
    }
    let (at, is_table) = found?;
    let line = text.get(..at)?.matches('\n').count() + 1;
    let here = text.get(..span.start)?.matches('\n').count() + 1;
    (line < here).then(|| FirstDefinition {
        key: own
            .iter()
            .map(|k| k.display_repr().to_string())
            .collect::<Vec<_>>()
            .join("."),
        line,
        table: is_table,
    })
}

/// The earliest byte where a key whose value is `value` was defined: the
/// key's own span (which the toml crate moves to a later header repeating
/// the table), or any key inside it, which keeps its first place.
fn earliest(key: usize, value: &toml::de::DeValue<'_>) -> usize {
    let mut first = key;
    let mut stack = vec![value];
    while let Some(value) = stack.pop() {
        match value {
            toml::de::DeValue::Table(table) => {
                for (k, v) in table.iter() {
                    first = first.min(k.span().start);
                    stack.push(v.get_ref());
                }
            }
            toml::de::DeValue::Array(items) => stack.extend(items.iter().map(|i| i.get_ref())),
            _ => {}
        }
    }
    first
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
    let (header, start, body) = header_at(text, span)?;
    let first_line = text
        .get(..start)?
        .lines()
        .position(|l| l.trim() == header)?
        + 1;
    Some(DuplicateTable {
        header,
        first_line,
        body,
    })
}

/// The `[table]` header on the line that holds `span`, where that line
/// starts, and the byte range of its body (up to the next header).
fn header_at<'t>(text: &'t str, span: &Span) -> Option<(&'t str, usize, std::ops::Range<usize>)> {
    let start = text.get(..span.start)?.rfind('\n').map_or(0, |i| i + 1);
    let end = text
        .get(span.start..)?
        .find('\n')
        .map_or(text.len(), |i| span.start + i);
    let header = text.get(start..end)?.trim();
    if !header.starts_with('[') || header.starts_with("[[") {
        return None;
    }
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
    Some((header, start, end..body_end))
}

/// The body of the `[table]` header on the line that holds `span`.
fn header_body(text: &str, span: &Span) -> Option<std::ops::Range<usize>> {
    header_at(text, span).map(|(_, _, body)| body)
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
    let mut lookups = 0;
    for err in errors {
        let span = err.span().unwrap_or(0..0);
        if cascade.iter().any(|body| body.contains(&span.start)) {
            continue;
        }
        let first = (err.message().trim() == "duplicate key"
            && lookups < MAX_FIRST_DEFINITION_LOOKUPS)
            .then(|| {
                lookups += 1;
                first_definition(text, &span, table.get_ref())
            })
            .flatten();
        if let Some(dup) = duplicate_table(text, &span) {
            cascade.push(dup.body);
        } else if let Some(body) = first
            .as_ref()
            .filter(|f| f.table)
            .and_then(|_| header_body(text, &span))
        {
            // A header repeating a table a dotted key or a longer header
            // defined: its keys are reported again too.
            cascade.push(body);
        }
        // One past the cap, so the report says problems were dropped.
        if shown > MAX_DIAGNOSTICS {
            break;
        }
        shown += 1;
        diags.push(toml_error_diagnostic(file, err.message(), span, first));
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
