//! Builds the [`Node`] tree of a TOML document straight from
//! `toml_parser`'s events, in little more memory than the tree itself: the
//! text is lexed lazily and parsed in chunks of whole top-level lines, and
//! each event is applied to the tree as it arrives, so no vector of the
//! document's tokens or events and no toml-crate table of it ever exists.
//! The table rules (dotted keys, `[table]` and `[[array]]` headers,
//! implicit tables, immutable inline tables, key order, the span of every key
//! and value) are the toml crate's document builder's, step for step, and so
//! are its errors: [`build`] returns every syntax error the parser reports
//! and every semantic error (duplicate key, table redefinition, extending an
//! inline table, an array or a scalar) with the toml crate's wording and
//! span, syntax errors first as toml orders them, at most one past
//! [`MAX_DIAGNOSTICS`]. `model::node` reports these for documents too large
//! for the toml crate's path to fit the memory budget, and otherwise parses
//! a failed document again with the toml crate so that ordinary documents
//! keep its diagnostics exactly.
//!
//! Known differences from the toml crate's diagnostics, all on documents
//! with errors: after the first syntax error only further syntax errors are
//! reported (the tree is no longer trusted, so semantic errors after it are
//! not looked for); after the first bound ([`super::node::Exceeded`]) no
//! semantic error is looked for either, and only the first bound is
//! reported, while toml's path reports every bound; a syntax error's
//! recovery can differ when an unclosed bracket spans a chunk boundary;
//! of a run of commas inside brackets only the first extra comma is
//! reported (see [`TriviaRun`]), where toml reports each.
//! The wording of each message is toml's (`description, expected …`).

use std::borrow::Cow;
use std::cell::Cell;
use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::rc::Rc;

use toml_parser::decoder::{Encoding, ScalarKind};
use toml_parser::lexer::TokenKind;
use toml_parser::parser::{EventReceiver, RecursionGuard, ValidateWhitespace};
use toml_parser::{ErrorSink, ParseError, Raw, Source};

use super::diagnostics::MAX_DIAGNOSTICS;
use super::node::{
    Exceeded, Key, MAX_ARRAY_LEN, MAX_NESTING_DEPTH, MAX_STRING_BYTES, MAX_TABLE_ENTRIES, Node,
    NodeKind, float_kind, int_kind,
};
use super::source::Span;

/// Tokens lexed before they are parsed, at the next newline outside any
/// bracket: all the token memory the builder holds (24 bytes a token).
const CHUNK_TOKENS: usize = 4096;
/// Nesting of arrays and inline tables the parser allows: the toml crate's
/// own limit, so both paths refuse the same documents.
const PARSER_RECURSION_LIMIT: u32 = 80;
/// Tables with at least this many entries (removed ones included) find keys
/// through the shared hash index; smaller ones are scanned.
const INDEXED_FROM: usize = 8;

/// An error as the toml crate reports it: its message and the span it
/// points at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct TomlError {
    pub message: String,
    pub span: Span,
}

impl TomlError {
    /// The toml crate's rendering of a parser error (`toml::de::Error::new`).
    fn from_parse(error: &ParseError) -> Self {
        let mut message = error.description().to_string();
        if let Some(expected) = error.expected() {
            message.push_str(", expected ");
            if expected.is_empty() {
                message.push_str("nothing");
            }
            for (i, expected) in expected.iter().enumerate() {
                if i != 0 {
                    message.push_str(", ");
                }
                match expected {
                    toml_parser::Expected::Literal(literal) => {
                        message.push_str(&render_literal(literal))
                    }
                    toml_parser::Expected::Description(desc) => message.push_str(desc),
                    _ => message.push_str("etc"),
                }
            }
        }
        let span = error.unexpected().map_or(0..0, |s| s.start()..s.end());
        TomlError { message, span }
    }

    fn new(message: impl Into<String>, span: Span) -> Self {
        TomlError {
            message: message.into(),
            span,
        }
    }
}

/// How the toml crate quotes an expected literal.
fn render_literal(literal: &str) -> String {
    match literal {
        "\n" => "newline".to_owned(),
        "`" => "'`'".to_owned(),
        s if s.chars().all(|c| c.is_ascii_control()) => format!("`{}`", s.escape_debug()),
        s => format!("`{s}`"),
    }
}

/// Why a document has no tree.
#[derive(Debug, Default)]
pub(super) struct Failure {
    /// Syntax errors, then semantic errors, in the toml crate's order; at
    /// most one past [`MAX_DIAGNOSTICS`].
    pub errors: Vec<TomlError>,
    /// The first bound exceeded (reported only when there are no errors;
    /// [`Exceeded::Items`] alone, since lexing stops there).
    pub exceeded: Option<(Exceeded, Span)>,
    /// Tokens the document holds ([`super::node::TomlCounts::tokens`]),
    /// whitespace and commas included; those lexed when items ran out.
    pub tokens: usize,
}

impl Failure {
    /// Nothing to report: the builder lost track of a document it could not
    /// fault (never expected; the caller falls back to the toml crate).
    pub(super) fn is_empty(&self) -> bool {
        self.errors.is_empty() && self.exceeded.is_none()
    }
}

/// Push `error` unless `errors` already holds one past [`MAX_DIAGNOSTICS`].
fn record(errors: &mut Vec<TomlError>, error: TomlError) {
    if errors.len() <= MAX_DIAGNOSTICS {
        errors.push(error);
    }
}

/// The parser's error sink: syntax errors, and the flag that tells the
/// builder to stop trusting its tree.
struct SyntaxSink {
    errors: Vec<TomlError>,
    broken: Rc<Cell<bool>>,
}

impl ErrorSink for SyntaxSink {
    fn report_error(&mut self, error: ParseError) {
        self.broken.set(true);
        record(&mut self.errors, TomlError::from_parse(&error));
    }
}

/// Build the tree of `text`, or report every error found in it.
pub(super) fn build(text: &str) -> Result<Node, Failure> {
    let source = Source::new(text);
    let broken = Rc::new(Cell::new(false));
    let mut sink = SyntaxSink {
        errors: Vec::new(),
        broken: broken.clone(),
    };
    let mut builder = Builder::new(text, broken);
    let mut tokens = Vec::with_capacity(CHUNK_TOKENS);
    let mut depth = 0usize;
    let mut run = TriviaRun::default();
    // Errors of trivia left out of the current chunk, to merge into the
    // parser's in document order.
    let mut dropped = Vec::new();
    // The item bound is checked as the text is lexed, before the tree
    // holds more than that many items.
    let limit = super::node::item_limit(text.len());
    let (mut items, mut count) = (0usize, 0usize);
    for token in source.lex() {
        count += 1;
        if super::node::is_toml_item(token.kind()) {
            items += 1;
            if items > limit {
                let span = token.span();
                return Err(Failure {
                    errors: Vec::new(),
                    exceeded: Some((Exceeded::Items, span.start()..span.end())),
                    tokens: count,
                });
            }
        }
        // Inside brackets no newline ends the chunk, so trivia is thinned
        // out there (see [`TriviaRun`]); what is left out is still checked.
        if depth > 0 && TriviaRun::is_trivia(token.kind()) {
            let after_comment = tokens
                .last()
                .is_some_and(|t: &toml_parser::lexer::Token| t.kind() == TokenKind::Comment);
            if !run.keep(token.kind(), after_comment) {
                let start = token.span().start();
                let mut check = |e: ParseError| {
                    if dropped.len() <= MAX_DIAGNOSTICS {
                        dropped.push((start, TomlError::from_parse(&e)));
                    }
                };
                let mut nothing = ();
                let mut validate = ValidateWhitespace::new(&mut nothing, source);
                match token.kind() {
                    TokenKind::Comment => validate.comment(token.span(), &mut check),
                    TokenKind::Newline => validate.newline(token.span(), &mut check),
                    _ => {}
                }
                continue;
            }
        } else {
            run = TriviaRun::default();
        }
        match token.kind() {
            TokenKind::LeftSquareBracket | TokenKind::LeftCurlyBracket => depth += 1,
            TokenKind::RightSquareBracket | TokenKind::RightCurlyBracket => {
                depth = depth.saturating_sub(1)
            }
            _ => {}
        }
        // A newline outside brackets ends every expression, so the parser
        // starts the next chunk in the state it would have been in anyway.
        let boundary = depth == 0 && token.kind() == TokenKind::Newline;
        tokens.push(token);
        if boundary && tokens.len() >= CHUNK_TOKENS {
            parse_chunk(source, &tokens, &mut builder, &mut sink, &mut dropped);
            tokens.clear();
        }
    }
    parse_chunk(source, &tokens, &mut builder, &mut sink, &mut dropped);
    drop(tokens);
    builder.finish(sink.errors).map_err(|failure| Failure {
        tokens: count,
        ..failure
    })
}

/// Parse one chunk of tokens into `builder`, syntax errors into `sink`.
fn parse_chunk(
    source: Source<'_>,
    tokens: &[toml_parser::lexer::Token],
    builder: &mut Builder<'_>,
    sink: &mut SyntaxSink,
    dropped: &mut Vec<(usize, TomlError)>,
) {
    let first = sink.errors.len();
    let mut whitespace = ValidateWhitespace::new(builder, source);
    let mut guard = RecursionGuard::new(&mut whitespace, PARSER_RECURSION_LIMIT);
    toml_parser::parser::parse_document(tokens, &mut guard, sink);
    // Where the parser would have met each left-out token.
    for (start, error) in dropped.drain(..) {
        sink.broken.set(true);
        let at = sink.errors[first..]
            .iter()
            .position(|e| e.span.start > start)
            .map_or(sink.errors.len(), |i| first + i);
        sink.errors.insert(at, error);
    }
    sink.errors.truncate(MAX_DIAGNOSTICS + 1);
}

/// The trivia (whitespace, newlines, comments, commas) between two other
/// tokens inside brackets, where a chunk cannot end: only the first of each
/// kind is kept (the newline after a kept comment too, and a second comma,
/// which is an error), so no run of blank lines, comments or commas inside
/// an array can make the chunk's tokens (24 bytes each) outgrow the text.
/// The parser sees the same structure: whether a gap holds whitespace, a
/// newline, a comment, no comma, one or more than one. Comments and
/// newlines left out are still checked for invalid characters.
#[derive(Default)]
struct TriviaRun {
    whitespace: bool,
    newline: bool,
    comment: bool,
    commas: u8,
}

impl TriviaRun {
    fn is_trivia(kind: TokenKind) -> bool {
        matches!(
            kind,
            TokenKind::Whitespace | TokenKind::Newline | TokenKind::Comment | TokenKind::Comma
        )
    }

    /// Whether to keep this token of the run; `after_comment` when the last
    /// token kept is a comment, which must be followed by its newline.
    fn keep(&mut self, kind: TokenKind, after_comment: bool) -> bool {
        let seen = match kind {
            TokenKind::Whitespace => std::mem::replace(&mut self.whitespace, true),
            TokenKind::Newline => std::mem::replace(&mut self.newline, true) && !after_comment,
            TokenKind::Comment => std::mem::replace(&mut self.comment, true),
            _ => {
                self.commas = self.commas.saturating_add(1);
                self.commas > 2
            }
        };
        !seen
    }
}

/// Why a step of the builder stopped.
#[derive(Debug)]
enum Stop {
    /// A semantic error: recorded, and the statement is dropped as the toml
    /// crate drops it.
    Error(TomlError),
    /// A bound exceeded: recorded, and building stops.
    Bound(Exceeded, Span),
    /// A state the builder cannot follow (only after a syntax error, which
    /// is reported instead); building stops.
    Lost,
}
use Stop::Lost;
type Built<T> = Result<T, Stop>;

/// toml's "duplicate key" error at `span`.
fn duplicate(span: &Span) -> Stop {
    Stop::Error(TomlError::new("duplicate key", span.clone()))
}

/// toml's error for a dotted key or header path through `existing`.
fn cannot_extend(existing: &str, span: &Span) -> Stop {
    Stop::Error(TomlError::new(
        format!("cannot extend value of type {existing} with a dotted key"),
        span.clone(),
    ))
}

/// The toml crate's flags of a table (top bits) and the table's id in the
/// [`Index`] (the rest), in one word so a [`BNode`] is as large as a
/// [`Node`].
#[derive(Debug, Clone, Copy)]
struct Meta(u32);

impl Meta {
    /// Made for a dotted key or a header's path, not declared.
    const IMPLICIT: u32 = 1 << 31;
    /// Made or extended by a dotted key.
    const DOTTED: u32 = 1 << 30;
    /// Part of an inline table, closed to later additions.
    const INLINE: u32 = 1 << 29;
    /// Table ids stay below the flags.
    const MAX_ID: u32 = Self::INLINE - 1;

    fn new(id: u32, flags: u32) -> Self {
        Meta(id | flags)
    }

    fn id(self) -> u32 {
        self.0 & Self::MAX_ID
    }

    fn has(self, flag: u32) -> bool {
        self.0 & flag != 0
    }
}

/// Whether an array was written as `[…]` or as `[[…]]` headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ArrayKind {
    Values,
    Tables,
}

/// A value of the tree being built. As large as a [`Node`], so converting
/// one into the other can reuse each vector in place.
#[derive(Debug)]
struct BNode {
    kind: BKind,
    span: Span,
}

#[derive(Debug)]
enum BKind {
    /// An entry taken over by a `[table]` header (the toml crate removes it
    /// and inserts the table again at the end); left out of the result.
    Removed,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Datetime(String),
    Array {
        items: Vec<BNode>,
        kind: ArrayKind,
    },
    Table {
        entries: Vec<(Key, BNode)>,
        meta: Meta,
    },
}

impl BKind {
    /// How the toml crate names the type in messages.
    fn type_str(&self) -> &'static str {
        match self {
            BKind::Removed => "removed",
            BKind::Bool(_) => "boolean",
            BKind::Int(_) => "integer",
            BKind::Float(_) => "float",
            BKind::Str(_) => "string",
            BKind::Datetime(_) => "datetime",
            BKind::Array { .. } => "array",
            BKind::Table { .. } => "table",
        }
    }
}

/// The key → entry index of every table with [`INDEXED_FROM`] or more
/// entries, one map for all of them (keyed by table id and the key's hash;
/// a hash collision gives up rather than guess).
struct Index {
    hasher: RandomState,
    map: HashMap<(u32, u64), u32>,
}

impl Index {
    fn hash(&self, name: &str) -> u64 {
        self.hasher.hash_one(name)
    }

    /// The live entry named `name` in table `id`.
    fn find(&self, entries: &[(Key, BNode)], id: u32, name: &str) -> Built<Option<usize>> {
        if entries.len() < INDEXED_FROM {
            return Ok(entries
                .iter()
                .position(|(k, v)| !matches!(v.kind, BKind::Removed) && k.name == name));
        }
        match self.map.get(&(id, self.hash(name))) {
            None => Ok(None),
            Some(&i) if entries[i as usize].0.name == name => Ok(Some(i as usize)),
            Some(_) => Err(Lost),
        }
    }

    fn insert(&mut self, id: u32, name: &str, i: usize) -> Built<()> {
        let i = u32::try_from(i).map_err(|_| Lost)?;
        match self.map.insert((id, self.hash(name)), i) {
            None => Ok(()),
            Some(_) => Err(Lost),
        }
    }

    /// Append an entry (its key known to be absent); its index.
    fn push(
        &mut self,
        entries: &mut Vec<(Key, BNode)>,
        id: u32,
        key: Key,
        value: BNode,
    ) -> Built<usize> {
        entries.push((key, value));
        let last = entries.len() - 1;
        if entries.len() == INDEXED_FROM {
            for (i, (k, v)) in entries.iter().enumerate() {
                if !matches!(v.kind, BKind::Removed) {
                    self.insert(id, &k.name, i)?;
                }
            }
        } else if entries.len() > INDEXED_FROM {
            self.insert(id, &entries[last].0.name, last)?;
        }
        Ok(last)
    }

    /// Take the value of entry `i` out, leaving [`BKind::Removed`].
    fn remove(&mut self, entries: &mut [(Key, BNode)], id: u32, i: usize) -> BNode {
        if entries.len() >= INDEXED_FROM {
            let hash = self.hash(&entries[i].0.name);
            self.map.remove(&(id, hash));
        }
        let span = entries[i].1.span.clone();
        let kind = std::mem::replace(&mut entries[i].1.kind, BKind::Removed);
        BNode { kind, span }
    }
}

/// A value still open while its events arrive.
enum Frame {
    Array {
        items: Vec<BNode>,
        start: usize,
    },
    /// An inline table and the key its next value goes to.
    Inline {
        table: BNode,
        key: Vec<Key>,
    },
}

struct Builder<'s> {
    text: &'s str,
    /// Set by the parser's sink at the first syntax error: from then on
    /// nothing is built (only syntax errors are still collected).
    broken: Rc<Cell<bool>>,
    /// A bound was exceeded or the state lost: nothing more is built.
    stopped: bool,
    /// Semantic errors, in the toml crate's order.
    semantic: Vec<TomlError>,
    /// Errors the toml crate reports only when the table of the last header
    /// is finished (at the next header or the end of the document).
    pending: Vec<TomlError>,
    /// The first bound exceeded.
    exceeded: Option<(Exceeded, Span)>,
    root: BNode,
    /// Entry indices from the root to the table of the last header (into an
    /// array of tables: its last element); `None` after a header with an
    /// error, whose table the toml crate drops: its entries go to `scratch`.
    current: Option<Vec<usize>>,
    scratch: BNode,
    index: Index,
    next_id: u32,
    /// Parts of the key being read (a header's or a key/value's).
    keys: Vec<Key>,
    /// The key of the document-level value being read.
    doc_key: Vec<Key>,
    /// Where the open header started.
    header: Option<(ArrayKind, usize)>,
    stack: Vec<Frame>,
}

impl<'s> Builder<'s> {
    fn new(text: &'s str, broken: Rc<Cell<bool>>) -> Self {
        Builder {
            text,
            broken,
            stopped: false,
            semantic: Vec::new(),
            pending: Vec::new(),
            exceeded: None,
            root: BNode {
                kind: BKind::Table {
                    entries: Vec::new(),
                    meta: Meta::new(0, 0),
                },
                span: 0..0,
            },
            current: Some(Vec::new()),
            scratch: BNode {
                kind: BKind::Table {
                    entries: Vec::new(),
                    meta: Meta::new(0, 0),
                },
                span: 0..0,
            },
            index: Index {
                hasher: RandomState::new(),
                map: HashMap::new(),
            },
            next_id: 1,
            keys: Vec::new(),
            doc_key: Vec::new(),
            header: None,
            stack: Vec::new(),
        }
    }

    /// Run one event's step unless building has stopped: a semantic error
    /// is recorded and the builder goes on, as the toml crate does.
    fn step(&mut self, f: impl FnOnce(&mut Self) -> Built<()>) {
        if self.stopped || self.broken.get() {
            return;
        }
        match f(self) {
            Ok(()) => {}
            Err(Stop::Error(error)) => record(&mut self.semantic, error),
            Err(Stop::Bound(what, span)) => {
                self.exceeded.get_or_insert((what, span));
                self.stopped = true;
            }
            Err(Lost) => self.stopped = true,
        }
    }

    /// The toml crate finishes the last header's table.
    fn flush_pending(&mut self) {
        for error in std::mem::take(&mut self.pending) {
            record(&mut self.semantic, error);
        }
    }

    fn finish(mut self, syntax: Vec<TomlError>) -> Result<Node, Failure> {
        self.flush_pending();
        let mut errors = syntax;
        for error in std::mem::take(&mut self.semantic) {
            record(&mut errors, error);
        }
        if !errors.is_empty() || self.exceeded.is_some() {
            return Err(Failure {
                errors,
                exceeded: self.exceeded,
                ..Failure::default()
            });
        }
        let open = !self.stack.is_empty() || self.header.is_some() || !self.keys.is_empty();
        if self.stopped || open || !self.doc_key.is_empty() {
            return Err(Failure::default());
        }
        convert(self.root, 0).map_err(|stop| match stop {
            Stop::Error(error) => Failure {
                errors: vec![error],
                ..Failure::default()
            },
            Stop::Bound(what, span) => Failure {
                exceeded: Some((what, span)),
                ..Failure::default()
            },
            Lost => Failure::default(),
        })
    }

    fn raw(&self, span: toml_parser::Span, encoding: Option<Encoding>) -> Built<Raw<'s>> {
        let text = self.text.get(span.start()..span.end()).ok_or(Lost)?;
        Ok(Raw::new_unchecked(text, encoding, span))
    }

    fn key(&mut self, span: toml_parser::Span, encoding: Option<Encoding>) -> Built<()> {
        let raw = self.raw(span, encoding)?;
        let mut name: Cow<'s, str> = Cow::Borrowed("");
        let semantic = &mut self.semantic;
        raw.decode_key(&mut name, &mut |e: ParseError| {
            record(semantic, TomlError::from_parse(&e))
        });
        let at = span.start()..span.end();
        if name.len() > MAX_STRING_BYTES {
            return Err(Stop::Bound(Exceeded::StringBytes, at));
        }
        if self.keys.len() >= MAX_NESTING_DEPTH {
            return Err(Stop::Bound(Exceeded::Depth, at));
        }
        self.keys.push(Key {
            name: name.into_owned(),
            span: span.start()..span.end(),
        });
        Ok(())
    }

    fn scalar(&mut self, span: toml_parser::Span, encoding: Option<Encoding>) -> Built<()> {
        let raw = self.raw(span, encoding)?;
        let mut text: Cow<'s, str> = Cow::Borrowed("");
        let semantic = &mut self.semantic;
        let scalar = raw.decode_scalar(&mut text, &mut |e: ParseError| {
            record(semantic, TomlError::from_parse(&e))
        });
        let at = span.start()..span.end();
        let kind = match scalar {
            ScalarKind::String if text.len() > MAX_STRING_BYTES => {
                return Err(Stop::Bound(Exceeded::StringBytes, at));
            }
            ScalarKind::String => BKind::Str(text.into_owned()),
            ScalarKind::Boolean(b) => BKind::Bool(b),
            // The toml crate reports a bad date and keeps its text.
            ScalarKind::DateTime => match text.parse::<toml::value::Datetime>() {
                Ok(datetime) => BKind::Datetime(datetime.to_string()),
                Err(e) => {
                    record(
                        &mut self.semantic,
                        TomlError::new(e.to_string(), at.clone()),
                    );
                    BKind::Str(text.into_owned())
                }
            },
            ScalarKind::Float => match float_kind(&text) {
                NodeKind::Float(f) => BKind::Float(f),
                _ => return Err(Lost),
            },
            ScalarKind::Integer(radix) => match int_kind(&text, radix.value()) {
                NodeKind::Int(i) => BKind::Int(i),
                NodeKind::Float(f) => BKind::Float(f),
                _ => return Err(Lost),
            },
        };
        self.deliver(BNode { kind, span: at })
    }

    /// A complete value: into the open array or inline table, or under the
    /// document-level key.
    fn deliver(&mut self, value: BNode) -> Built<()> {
        match self.stack.last_mut() {
            Some(Frame::Array { items, start }) => {
                if items.len() >= MAX_ARRAY_LEN {
                    return Err(Stop::Bound(Exceeded::ArrayLen, *start..value.span.end));
                }
                items.push(value);
                Ok(())
            }
            Some(Frame::Inline { table, key }) => {
                let keys = std::mem::take(key);
                inline_insert(&mut self.index, &mut self.next_id, table, keys, value)
            }
            None => {
                let keys = std::mem::take(&mut self.doc_key);
                self.keyval(keys, value)
            }
        }
    }

    /// `a.b.c = value` in the table of the last header (the toml crate's
    /// `capture_key_value`).
    fn keyval(&mut self, mut keys: Vec<Key>, value: BNode) -> Built<()> {
        let key = keys.pop().ok_or(Lost)?;
        let dotted = !keys.is_empty();
        let current = match &self.current {
            Some(path) => current_table(&mut self.root, path)?,
            None => &mut self.scratch,
        };
        let parent = descend(
            &mut self.index,
            &mut self.next_id,
            current,
            &keys,
            dotted,
            None,
        )?;
        let BKind::Table { entries, meta } = &mut parent.kind else {
            return Err(Lost);
        };
        if dotted && !meta.has(Meta::IMPLICIT) {
            return Err(duplicate(&key.span));
        }
        let id = meta.id();
        if self.index.find(entries, id, &key.name)?.is_some() {
            return Err(duplicate(&key.span));
        }
        self.index.push(entries, id, key, value)?;
        Ok(())
    }

    /// `[a.b.c]` (the toml crate's `start_table` and `finish_table`; the
    /// table goes into its parent at once, as nothing else can change the
    /// parent before the next header).
    fn std_header(&mut self, mut keys: Vec<Key>, span: Span) -> Built<()> {
        let key = keys.pop().ok_or(Lost)?;
        let mut trail = Vec::with_capacity(keys.len() + 1);
        let parent = match descend(
            &mut self.index,
            &mut self.next_id,
            &mut self.root,
            &keys,
            false,
            Some(&mut trail),
        ) {
            Ok(parent) => parent,
            Err(Stop::Error(error)) => {
                // The toml crate walks the path again when it finishes the
                // table, and reports the error twice.
                self.pending.push(error.clone());
                self.detach_with(&span)?;
                return Err(Stop::Error(error));
            }
            Err(stop) => return Err(stop),
        };
        let BKind::Table { entries, meta } = &mut parent.kind else {
            return Err(Lost);
        };
        let id = meta.id();
        let mut error = None;
        let value = match self.index.find(entries, id, &key.name)? {
            Some(i) => {
                // Only a table implied by an earlier header's path may be
                // declared; it moves to the end, children kept. Anything
                // else is a duplicate key; a table's entries are kept all
                // the same, anything else is replaced (as toml does).
                match &entries[i].1.kind {
                    BKind::Table { meta, .. }
                        if meta.has(Meta::IMPLICIT) && !meta.has(Meta::DOTTED) => {}
                    _ => error = Some(duplicate(&key.span)),
                }
                let old = self.index.remove(entries, id, i);
                match old.kind {
                    BKind::Table { entries, meta } => {
                        let meta = Meta(meta.0 & !(Meta::IMPLICIT | Meta::DOTTED));
                        BNode {
                            kind: BKind::Table { entries, meta },
                            span,
                        }
                    }
                    _ => new_table(&mut self.next_id, 0, span)?,
                }
            }
            None => new_table(&mut self.next_id, 0, span)?,
        };
        let BKind::Table { entries, .. } = &mut parent.kind else {
            return Err(Lost);
        };
        let i = self.index.push(entries, id, key, value)?;
        trail.push(i);
        self.current = Some(trail);
        error.map_or(Ok(()), Err)
    }

    /// `[[a.b.c]]`: a new table at the end of the array of tables. The toml
    /// crate finds this header's errors only when the table is finished.
    fn array_header(&mut self, mut keys: Vec<Key>, span: Span) -> Built<()> {
        let key = keys.pop().ok_or(Lost)?;
        let element = new_table(&mut self.next_id, 0, span.clone())?;
        let mut trail = Vec::with_capacity(keys.len() + 1);
        let parent = match descend(
            &mut self.index,
            &mut self.next_id,
            &mut self.root,
            &keys,
            false,
            Some(&mut trail),
        ) {
            Ok(parent) => parent,
            Err(Stop::Error(error)) => {
                self.pending.push(error);
                return self.detach_with(&span);
            }
            Err(stop) => return Err(stop),
        };
        let BKind::Table { entries, meta } = &mut parent.kind else {
            return Err(Lost);
        };
        let id = meta.id();
        let i = match self.index.find(entries, id, &key.name)? {
            Some(i) => {
                let BKind::Array {
                    items,
                    kind: ArrayKind::Tables,
                } = &mut entries[i].1.kind
                else {
                    self.pending.push(TomlError::new("duplicate key", key.span));
                    return self.detach_with(&span);
                };
                if items.len() >= MAX_ARRAY_LEN {
                    return Err(Stop::Bound(Exceeded::ArrayLen, entries[i].1.span.clone()));
                }
                items.push(element);
                i
            }
            None => {
                let array = BNode {
                    kind: BKind::Array {
                        items: vec![element],
                        kind: ArrayKind::Tables,
                    },
                    span,
                };
                self.index.push(entries, id, key, array)?
            }
        };
        trail.push(i);
        self.current = Some(trail);
        Ok(())
    }

    /// After a header with an error: the toml crate checks its table's
    /// entries but drops them, so they go to a fresh scratch table.
    fn detach_with(&mut self, span: &Span) -> Built<()> {
        self.scratch = new_table(&mut self.next_id, 0, span.clone())?;
        self.current = None;
        Ok(())
    }

    fn close_header(&mut self, kind: ArrayKind, close: toml_parser::Span) -> Built<()> {
        let (open_kind, start) = self.header.take().ok_or(Lost)?;
        if open_kind != kind {
            return Err(Lost);
        }
        let keys = std::mem::take(&mut self.keys);
        let span = start..close.end();
        match kind {
            ArrayKind::Values => self.std_header(keys, span),
            ArrayKind::Tables => self.array_header(keys, span),
        }
    }
}

/// The table of the last header: `path` from the root, into the last
/// element of each array of tables on the way.
fn current_table<'t>(root: &'t mut BNode, path: &[usize]) -> Built<&'t mut BNode> {
    let mut table = root;
    for &i in path {
        let BKind::Table { entries, .. } = &mut table.kind else {
            return Err(Lost);
        };
        let child = &mut entries.get_mut(i).ok_or(Lost)?.1;
        table = into_table(child)?;
    }
    Ok(table)
}

/// A table itself, or the last table of an array of tables.
fn into_table(node: &mut BNode) -> Built<&mut BNode> {
    match node.kind {
        BKind::Table { .. } => Ok(node),
        BKind::Array {
            kind: ArrayKind::Tables,
            ..
        } => {
            let BKind::Array { items, .. } = &mut node.kind else {
                return Err(Lost);
            };
            let last = items.last_mut().ok_or(Lost)?;
            match last.kind {
                BKind::Table { .. } => Ok(last),
                _ => Err(Lost),
            }
        }
        _ => Err(Lost),
    }
}

/// Walk `path` down from `table`, making implicit tables where keys are
/// missing (the toml crate's document-level `descend_path`). `dotted` for a
/// dotted key, false for a header's path; `trail` collects the entry
/// indices walked.
fn descend<'t>(
    index: &mut Index,
    next_id: &mut u32,
    mut table: &'t mut BNode,
    path: &[Key],
    dotted: bool,
    mut trail: Option<&mut Vec<usize>>,
) -> Built<&'t mut BNode> {
    for key in path {
        let BKind::Table { entries, meta } = &mut table.kind else {
            return Err(Lost);
        };
        let id = meta.id();
        let i = match index.find(entries, id, &key.name)? {
            Some(i) => i,
            None => {
                let flags = Meta::IMPLICIT | if dotted { Meta::DOTTED } else { 0 };
                let child = new_table(next_id, flags, key.span.clone())?;
                index.push(entries, id, key.clone(), child)?
            }
        };
        let child = &mut entries[i].1;
        match &mut child.kind {
            BKind::Array {
                kind: ArrayKind::Tables,
                ..
            } => {}
            BKind::Table { meta, .. } => {
                if meta.has(Meta::INLINE) {
                    return Err(cannot_extend("inline table", &key.span));
                }
                if dotted && meta.has(Meta::IMPLICIT) {
                    meta.0 |= Meta::DOTTED;
                }
                if dotted && !meta.has(Meta::IMPLICIT) {
                    return Err(duplicate(&key.span));
                }
            }
            other => return Err(cannot_extend(other.type_str(), &key.span)),
        }
        table = into_table(child)?;
        if let Some(trail) = trail.as_deref_mut() {
            trail.push(i);
        }
    }
    Ok(table)
}

fn new_table(next_id: &mut u32, flags: u32, span: Span) -> Built<BNode> {
    let id = *next_id;
    if id > Meta::MAX_ID {
        return Err(Lost);
    }
    *next_id += 1;
    Ok(BNode {
        kind: BKind::Table {
            entries: Vec::new(),
            meta: Meta::new(id, flags),
        },
        span,
    })
}

/// `a.b = value` inside an inline table (the toml crate's inline
/// `finish_value` and `descend_path`).
fn inline_insert(
    index: &mut Index,
    next_id: &mut u32,
    table: &mut BNode,
    mut keys: Vec<Key>,
    value: BNode,
) -> Built<()> {
    let key = keys.pop().ok_or(Lost)?;
    let mut table = table;
    for part in &keys {
        let BKind::Table { entries, meta } = &mut table.kind else {
            return Err(Lost);
        };
        let id = meta.id();
        let i = match index.find(entries, id, &part.name)? {
            Some(i) => i,
            None => {
                let flags = Meta::IMPLICIT | Meta::DOTTED | Meta::INLINE;
                let child = new_table(next_id, flags, part.span.clone())?;
                index.push(entries, id, part.clone(), child)?
            }
        };
        let child = &mut entries[i].1;
        match &child.kind {
            BKind::Table { meta, .. } if meta.has(Meta::IMPLICIT) => {}
            BKind::Table { .. } => return Err(duplicate(&part.span)),
            other => return Err(cannot_extend(other.type_str(), &part.span)),
        }
        table = child;
    }
    let BKind::Table { entries, meta } = &mut table.kind else {
        return Err(Lost);
    };
    if meta.has(Meta::DOTTED) == keys.is_empty() {
        return Err(duplicate(&key.span));
    }
    let id = meta.id();
    if index.find(entries, id, &key.name)?.is_some() {
        return Err(duplicate(&key.span));
    }
    index.push(entries, id, key, value)?;
    Ok(())
}

/// The finished tree as [`Node`]s, checking the bounds the toml path
/// checks (any bound exceeded gives up, and that path reports it).
fn convert(node: BNode, depth: usize) -> Built<Node> {
    if depth > MAX_NESTING_DEPTH {
        return Err(Stop::Bound(Exceeded::Depth, node.span));
    }
    let kind = match node.kind {
        BKind::Removed => return Err(Lost),
        BKind::Bool(b) => NodeKind::Bool(b),
        BKind::Int(i) => NodeKind::Int(i),
        BKind::Float(f) => NodeKind::Float(f),
        BKind::Str(s) => NodeKind::Str(s),
        BKind::Datetime(d) => NodeKind::Datetime(d),
        BKind::Array { items, .. } => {
            if items.len() > MAX_ARRAY_LEN {
                return Err(Stop::Bound(Exceeded::ArrayLen, node.span));
            }
            NodeKind::Array(
                items
                    .into_iter()
                    .map(|item| convert(item, depth + 1))
                    .collect::<Built<Vec<_>>>()?,
            )
        }
        BKind::Table { entries, .. } => {
            let live = entries
                .iter()
                .filter(|(_, v)| !matches!(v.kind, BKind::Removed))
                .count();
            if live > MAX_TABLE_ENTRIES {
                return Err(Stop::Bound(Exceeded::TableEntries, node.span));
            }
            NodeKind::Table(
                entries
                    .into_iter()
                    .filter(|(_, v)| !matches!(v.kind, BKind::Removed))
                    .map(|(k, v)| Ok((k, convert(v, depth + 1)?)))
                    .collect::<Built<Vec<_>>>()?,
            )
        }
    };
    Ok(Node {
        kind,
        span: node.span,
    })
}

impl EventReceiver for Builder<'_> {
    fn std_table_open(&mut self, span: toml_parser::Span, _error: &mut dyn ErrorSink) {
        self.step(|b| {
            if b.header.is_some() || !b.stack.is_empty() {
                return Err(Lost);
            }
            b.flush_pending();
            b.header = Some((ArrayKind::Values, span.start()));
            Ok(())
        });
    }
    fn std_table_close(&mut self, span: toml_parser::Span, _error: &mut dyn ErrorSink) {
        self.step(|b| b.close_header(ArrayKind::Values, span));
    }
    fn array_table_open(&mut self, span: toml_parser::Span, _error: &mut dyn ErrorSink) {
        self.step(|b| {
            if b.header.is_some() || !b.stack.is_empty() {
                return Err(Lost);
            }
            b.flush_pending();
            b.header = Some((ArrayKind::Tables, span.start()));
            Ok(())
        });
    }
    fn array_table_close(&mut self, span: toml_parser::Span, _error: &mut dyn ErrorSink) {
        self.step(|b| b.close_header(ArrayKind::Tables, span));
    }
    fn inline_table_open(&mut self, span: toml_parser::Span, _error: &mut dyn ErrorSink) -> bool {
        self.step(|b| {
            let table = new_table(&mut b.next_id, Meta::INLINE, span.start()..span.start())?;
            b.stack.push(Frame::Inline {
                table,
                key: Vec::new(),
            });
            Ok(())
        });
        true
    }
    fn inline_table_close(&mut self, span: toml_parser::Span, _error: &mut dyn ErrorSink) {
        self.step(|b| {
            let Some(Frame::Inline { mut table, key }) = b.stack.pop() else {
                return Err(Lost);
            };
            if !key.is_empty() {
                return Err(Lost);
            }
            table.span = table.span.start..span.end();
            b.deliver(table)
        });
    }
    fn array_open(&mut self, span: toml_parser::Span, _error: &mut dyn ErrorSink) -> bool {
        self.step(|b| {
            b.stack.push(Frame::Array {
                items: Vec::new(),
                start: span.start(),
            });
            Ok(())
        });
        true
    }
    fn array_close(&mut self, span: toml_parser::Span, _error: &mut dyn ErrorSink) {
        self.step(|b| {
            let Some(Frame::Array { items, start }) = b.stack.pop() else {
                return Err(Lost);
            };
            b.deliver(BNode {
                kind: BKind::Array {
                    items,
                    kind: ArrayKind::Values,
                },
                span: start..span.end(),
            })
        });
    }
    fn simple_key(
        &mut self,
        span: toml_parser::Span,
        encoding: Option<Encoding>,
        _error: &mut dyn ErrorSink,
    ) {
        self.step(|b| b.key(span, encoding));
    }
    fn key_val_sep(&mut self, _span: toml_parser::Span, _error: &mut dyn ErrorSink) {
        self.step(|b| {
            if b.header.is_some() || b.keys.is_empty() {
                return Err(Lost);
            }
            let keys = std::mem::take(&mut b.keys);
            let slot = match b.stack.last_mut() {
                Some(Frame::Inline { key, .. }) => key,
                Some(Frame::Array { .. }) => return Err(Lost),
                None => &mut b.doc_key,
            };
            if !slot.is_empty() {
                return Err(Lost);
            }
            *slot = keys;
            Ok(())
        });
    }
    fn scalar(
        &mut self,
        span: toml_parser::Span,
        encoding: Option<Encoding>,
        _error: &mut dyn ErrorSink,
    ) {
        self.step(|b| b.scalar(span, encoding));
    }
    fn error(&mut self, _span: toml_parser::Span, _error: &mut dyn ErrorSink) {
        self.stopped = true;
    }
}

#[cfg(test)]
mod tests;
