//! A serde deserializer over [`Node`] trees that keeps going after errors.
//!
//! serde stops at the first error; a manifest checker must not. This
//! deserializer records every problem as a [`Diagnostic`] at the innermost
//! span it can find and recovers where it can: unknown fields are reported
//! (with a "did you mean") and skipped, and [`Entry`] catches an error inside
//! one named entry so its siblings are still checked. It also gives
//! [`Spanned`] values their byte spans and expands `${VAR}` inside [`Text`].

use std::cell::RefCell;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, DeserializeSeed, IntoDeserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};

use super::diagnostics::{Diagnostic, clip, did_you_mean, has_room, quoted_list};
use super::interp::{Env, InterpError, interpolate};
use super::node::{Key, Node, NodeKind};
use super::source::{SourceFile, Span};

/// Shared state of one deserialization run.
pub struct DeCtx<'a> {
    pub file: &'a SourceFile,
    pub env: &'a dyn Env,
    pub diags: RefCell<Vec<Diagnostic>>,
    /// Errors recorded inside each [`Entry`] being deserialized, innermost last.
    entry_errors: RefCell<Vec<usize>>,
    /// Top-level sections spelled wrong (`[provider.x]` for `providers`):
    /// a reference into one is no second error.
    pub misspelled: RefCell<std::collections::BTreeSet<String>>,
}

impl fmt::Debug for DeCtx<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeCtx")
            .field("file", &self.file.name())
            .finish_non_exhaustive()
    }
}

impl<'a> DeCtx<'a> {
    pub fn new(file: &'a SourceFile, env: &'a dyn Env) -> Self {
        Self {
            file,
            env,
            diags: RefCell::new(Vec::new()),
            entry_errors: RefCell::new(Vec::new()),
            misspelled: RefCell::default(),
        }
    }

    /// Deserialize `T` from `node`, recording every problem. Returns `None`
    /// when the value could not be built at all.
    pub fn deserialize<T: de::DeserializeOwned>(&self, node: &Node) -> Option<T> {
        let path = Path::Root;
        T::deserialize(NodeDe {
            node,
            ctx: self,
            path: &path,
        })
        .map_err(|e| self.record(e, node.span.clone()))
        .ok()
    }

    fn push(&self, diag: Diagnostic) {
        self.push_value_error(diag);
        // Past the cap the entry still fails, but the diagnostic is dropped.
        if let Some(count) = self.entry_errors.borrow_mut().last_mut() {
            *count += 1;
        }
    }

    /// Record a problem with a value that does not fail its [`Entry`]: the
    /// value becomes a placeholder that later checks skip, and the entry's
    /// other fields are still lowered and checked. The document is invalid
    /// either way (this is an error diagnostic).
    fn push_value_error(&self, diag: Diagnostic) {
        let mut diags = self.diags.borrow_mut();
        if has_room(&diags) {
            diags.push(diag);
        }
    }

    /// Turn an error into a diagnostic at `span` unless that already happened.
    fn record(&self, mut e: DeError, span: Span) -> DeError {
        if !e.recorded {
            let mut diag = Diagnostic::error(e.message.clone()).at(self.file, span);
            // A TOML document never starts with `{`: a JSON one does.
            if e.message == "missing field `version`"
                && self.file.text().trim_start().starts_with('{')
            {
                diag = diag
                    .with_hint("add `\"version\": 1` as the first member of the top-level object");
            } else if e.message == "missing field `version`" {
                diag = diag.with_hint("add `version = 1` as the first line of the manifest");
            } else if let Some(field) = e.message.strip_prefix("missing field ") {
                diag = diag.with_hint(format!("add {field} to this table"));
            } else if e.message.starts_with("invalid type") {
                diag = diag.with_hint("change the value to the expected type");
            }
            self.push(diag);
            e.recorded = true;
        }
        e
    }

    fn type_error(&self, node: &Node, path: &Path<'_>, expected: &str) -> DeError {
        self.push(
            Diagnostic::error(format!(
                "wrong type for `{path}`: expected {expected}, found {}",
                node.kind.describe()
            ))
            .at(self.file, node.span.clone())
            .with_hint(type_hint(node, path, expected)),
        );
        DeError {
            message: String::new(),
            recorded: true,
        }
    }
}

/// The hint for a value of the wrong type: a single table `[x.y]` where a
/// list of tables is wanted is `[[x.y]]` (TOML's array of tables).
fn type_hint(node: &Node, path: &Path<'_>, expected: &str) -> String {
    if expected == "an array" && matches!(node.kind, NodeKind::Table(_)) {
        return format!(
            "write `[[{path}]]` (two brackets: a list of tables) instead of `[{path}]`"
        );
    }
    format!("write {expected} here")
}

/// A deserialization error; `recorded` once it became a diagnostic.
#[derive(Debug)]
pub struct DeError {
    message: String,
    recorded: bool,
}

impl fmt::Display for DeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for DeError {}

impl de::Error for DeError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        DeError {
            message: msg.to_string(),
            recorded: false,
        }
    }
}

/// The dotted path of a value, for messages: `mcp.servers.fs.args[2]`.
#[derive(Debug, Clone, Copy)]
pub enum Path<'p> {
    Root,
    Key(&'p Path<'p>, &'p str),
    Index(&'p Path<'p>, usize),
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Path::Root => f.write_str("(top level)"),
            Path::Key(Path::Root, k) => write_key(f, k),
            Path::Key(parent, k) => {
                write!(f, "{parent}.")?;
                write_key(f, k)
            }
            Path::Index(parent, i) => write!(f, "{parent}[{i}]"),
        }
    }
}

fn write_key(f: &mut fmt::Formatter<'_>, key: &str) -> fmt::Result {
    let bare = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if bare {
        f.write_str(&clip(key))
    } else {
        write!(f, "\"{}\"", clip(key).escape_debug())
    }
}

// ---------------------------------------------------------------------------
// Spanned, Entry

const SPANNED_NAME: &str = "$__npc_private_Spanned";
const SPANNED_FIELDS: [&str; 3] = ["$__npc_start", "$__npc_end", "$__npc_value"];
pub(super) const TEXT_NAME: &str = "$__npc_private_Text";
pub(super) const TEXT_FIELDS: [&str; 4] = [
    "$__npc_text",
    "$__npc_secret",
    "$__npc_source",
    "$__npc_unresolved",
];

/// A value with the byte span it was read from. Equality, ordering and
/// hashing look at the value only.
#[derive(Clone)]
pub struct Spanned<T> {
    pub span: Span,
    pub value: T,
}

impl<T: fmt::Debug> fmt::Debug for Spanned<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.value.fmt(f)
    }
}

impl<T: PartialEq> PartialEq for Spanned<T> {
    fn eq(&self, other: &Self) -> bool {
        self.value == other.value
    }
}
impl<T: Eq> Eq for Spanned<T> {}
impl<T: std::hash::Hash> std::hash::Hash for Spanned<T> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.value.hash(state);
    }
}

impl<T> std::ops::Deref for Spanned<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Spanned<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Spanned<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a spanned value")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut start = 0usize;
                let mut end = 0usize;
                let mut value = None;
                while let Some(key) = map.next_key::<&str>()? {
                    match key {
                        k if k == SPANNED_FIELDS[0] => start = map.next_value()?,
                        k if k == SPANNED_FIELDS[1] => end = map.next_value()?,
                        _ => value = Some(map.next_value()?),
                    }
                }
                let value =
                    value.ok_or_else(|| de::Error::custom("spanned value without a value"))?;
                Ok(Spanned {
                    span: start..end,
                    value,
                })
            }
        }
        d.deserialize_struct(SPANNED_NAME, &SPANNED_FIELDS, V(PhantomData))
    }
}

impl<T: schemars::JsonSchema> schemars::JsonSchema for Spanned<T> {
    fn inline_schema() -> bool {
        T::inline_schema()
    }
    fn schema_name() -> std::borrow::Cow<'static, str> {
        T::schema_name()
    }
    fn schema_id() -> std::borrow::Cow<'static, str> {
        T::schema_id()
    }
    fn json_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
        T::json_schema(g)
    }
}

/// One named entry of a section. An error inside it is recorded and the
/// entry becomes `None`, so the entries beside it are still checked.
#[derive(Debug, Clone)]
pub struct Entry<T>(pub Option<T>);

const ENTRY_NAME: &str = "$__npc_private_Entry";

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Entry<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Entry<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an entry")
            }
            fn visit_newtype_struct<D: Deserializer<'de>>(
                self,
                d: D,
            ) -> Result<Self::Value, D::Error> {
                T::deserialize(d).map(|v| Entry(Some(v)))
            }
        }
        // The deserializer fails the entry when anything inside it was
        // recorded, even errors it recovered from; the entry is then `None`
        // and later checks never see placeholder values.
        Ok(d.deserialize_newtype_struct(ENTRY_NAME, V(PhantomData))
            .unwrap_or(Entry(None)))
    }
}

impl<T: schemars::JsonSchema> schemars::JsonSchema for Entry<T> {
    fn inline_schema() -> bool {
        T::inline_schema()
    }
    fn schema_name() -> std::borrow::Cow<'static, str> {
        T::schema_name()
    }
    fn schema_id() -> std::borrow::Cow<'static, str> {
        T::schema_id()
    }
    fn json_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
        T::json_schema(g)
    }
}

// ---------------------------------------------------------------------------
// The deserializer

struct NodeDe<'a, 'n, 'p> {
    node: &'n Node,
    ctx: &'a DeCtx<'a>,
    path: &'p Path<'p>,
}

impl<'a, 'n, 'p> NodeDe<'a, 'n, 'p> {
    fn fail(&self, expected: &str) -> DeError {
        self.ctx.type_error(self.node, self.path, expected)
    }

    fn span(&self) -> Span {
        self.node.span.clone()
    }

    fn wrap<T>(&self, r: Result<T, DeError>) -> Result<T, DeError> {
        r.map_err(|e| self.ctx.record(e, self.span()))
    }

    /// The expanded text, whether it is secret, and whether expansion
    /// failed (then the text is an empty placeholder).
    fn expand_text(&self) -> Result<(String, bool, bool), DeError> {
        let NodeKind::Str(raw) = &self.node.kind else {
            // Record and go on with a placeholder, so siblings are checked too.
            self.fail("a string");
            return Ok((String::new(), false, false));
        };
        match interpolate(raw, self.ctx.env) {
            Ok(done) => Ok((done.value, done.secret, false)),
            Err(errors) => {
                // A server's value npc needs only when it starts the server
                // (and an agent CLI reads from its own environment): unset
                // is a warning, and the server refuses to start without it.
                let server = start_time_server(self.path);
                let mut secret = false;
                for err in errors {
                    let unset = matches!(err, InterpError::Unset { .. });
                    secret |= unset;
                    let (summary, hint, range) = match err {
                        InterpError::Unset { name, range } if let Some(server) = server => (
                            format!(
                                "environment variable `{}` is not set: MCP server `{}` cannot start without it",
                                clip(&name),
                                clip(server)
                            ),
                            format!(
                                "set `{name}` before npc starts the server (`npc daemon`, `npc run`, `npc mcp serve`); agent CLIs read it from their own environment"
                            ),
                            range,
                        ),
                        InterpError::Unset { name, range } => (
                            format!("environment variable `{}` is not set", clip(&name)),
                            format!("set `{name}`, or give a default with `${{{name}:-default}}`"),
                            range,
                        ),
                        InterpError::Malformed { range } => (
                            "malformed `${…}` interpolation".to_string(),
                            "write `${NAME}` or `${NAME:-default}`; use `$$` for a literal `$`"
                                .to_string(),
                            range,
                        ),
                    };
                    let span = inner_span(self.ctx.file, &self.node.span, raw, range);
                    let diag = if unset && (server.is_some() || self.ctx.env.unset_is_warning()) {
                        Diagnostic::warning(summary)
                    } else {
                        Diagnostic::error(summary)
                    };
                    self.ctx
                        .push_value_error(diag.at(self.ctx.file, span).with_hint(hint));
                }
                // Keep checking the rest of the entry with a placeholder;
                // a reference to the environment is secret even unset (its
                // source, never a value, is what agent files get).
                Ok((String::new(), secret, true))
            }
        }
    }
}

/// The keys of `[mcp.servers.NAME]` whose values npc needs only when it
/// starts the server, and which agent CLIs expand from their own
/// environment: an unset `${VAR}` there leaves the manifest valid.
pub const START_TIME_KEYS: [&str; 4] = ["env", "headers", "args", "url"];

/// The server NAME when `path` is a value under one of the
/// [`START_TIME_KEYS`] of `[mcp.servers.NAME]`.
fn start_time_server<'p>(path: &Path<'p>) -> Option<&'p str> {
    fn segments<'p>(path: &Path<'p>, into: &mut Vec<Option<&'p str>>) {
        match path {
            Path::Root => {}
            Path::Key(parent, key) => {
                segments(parent, into);
                into.push(Some(key));
            }
            Path::Index(parent, _) => {
                segments(parent, into);
                into.push(None);
            }
        }
    }
    let mut all = Vec::new();
    segments(path, &mut all);
    match all.as_slice() {
        [Some("mcp"), Some("servers"), Some(name), Some(key), ..]
            if START_TIME_KEYS.contains(key) =>
        {
            Some(name)
        }
        _ => None,
    }
}

/// The span of `range` (a byte range of the decoded string `raw`) in the
/// source, when the source spells the string without escapes; otherwise the
/// whole string.
fn inner_span(file: &SourceFile, span: &Span, raw: &str, range: std::ops::Range<usize>) -> Span {
    let Some(source) = file.text().get(span.clone()) else {
        return span.clone();
    };
    let quote = source
        .chars()
        .next()
        .map_or(0, |c| if c == '"' || c == '\'' { 1 } else { 0 });
    match source.get(quote..quote + raw.len()) {
        Some(inner) if inner == raw => {
            span.start + quote + range.start..span.start + quote + range.end
        }
        _ => span.clone(),
    }
}

macro_rules! forward_number {
    ($($method:ident => $visit:ident($expected:literal, $default:expr, $float_ok:literal)),* $(,)?) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
            let r = match &self.node.kind {
                NodeKind::Int(i) => visitor.visit_i64(*i),
                NodeKind::Float(x) if $float_ok => visitor.visit_f64(*x),
                _ => {
                    self.fail($expected);
                    visitor.$visit($default)
                }
            };
            self.wrap(r)
        }
    )*};
}

impl<'de> Deserializer<'de> for NodeDe<'_, '_, '_> {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let r = match &self.node.kind {
            NodeKind::Null => visitor.visit_unit(),
            NodeKind::Bool(b) => visitor.visit_bool(*b),
            NodeKind::Int(i) => visitor.visit_i64(*i),
            NodeKind::Float(x) => visitor.visit_f64(*x),
            NodeKind::Str(s) | NodeKind::Datetime(s) => visitor.visit_str(s),
            NodeKind::Array(items) => visitor.visit_seq(Seq {
                items: items.iter(),
                index: 0,
                ctx: self.ctx,
                path: self.path,
            }),
            NodeKind::Table(entries) => visitor.visit_map(Map::new(
                entries.iter().map(|(k, v)| (k, v)).collect(),
                self.ctx,
                self.path,
            )),
        };
        self.wrap(r)
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let r = match &self.node.kind {
            NodeKind::Bool(b) => visitor.visit_bool(*b),
            _ => {
                self.fail("a boolean (`true` or `false`)");
                visitor.visit_bool(false)
            }
        };
        self.wrap(r)
    }

    forward_number! {
        deserialize_i8 => visit_i64("an integer", 0, false),
        deserialize_i16 => visit_i64("an integer", 0, false),
        deserialize_i32 => visit_i64("an integer", 0, false),
        deserialize_i64 => visit_i64("an integer", 0, false),
        deserialize_u8 => visit_u64("a non-negative integer", 0, false),
        deserialize_u16 => visit_u64("a non-negative integer", 0, false),
        deserialize_u32 => visit_u64("a non-negative integer", 0, false),
        deserialize_u64 => visit_u64("a non-negative integer", 0, false),
        deserialize_f32 => visit_f64("a number", 0.0, true),
        deserialize_f64 => visit_f64("a number", 0.0, true),
    }

    fn deserialize_char<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let r = match &self.node.kind {
            NodeKind::Str(s) => visitor.visit_str(s),
            _ => {
                self.fail("a string");
                visitor.visit_str("")
            }
        };
        self.wrap(r)
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_bytes<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_byte_buf<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let r = match &self.node.kind {
            NodeKind::Null => visitor.visit_none(),
            _ => visitor.visit_some(NodeDe {
                node: self.node,
                ctx: self.ctx,
                path: self.path,
            }),
        };
        self.wrap(r)
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.wrap(visitor.visit_unit())
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        self.wrap(visitor.visit_unit())
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        let span = self.span();
        let ctx = self.ctx;
        if name != ENTRY_NAME {
            return visitor
                .visit_newtype_struct(self)
                .map_err(|e| ctx.record(e, span));
        }
        ctx.entry_errors.borrow_mut().push(0);
        let r = visitor
            .visit_newtype_struct(self)
            .map_err(|e| ctx.record(e, span));
        let inside = ctx.entry_errors.borrow_mut().pop().unwrap_or(0);
        if inside > 0 {
            return Err(DeError {
                message: String::new(),
                recorded: true,
            });
        }
        r
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let NodeKind::Array(items) = &self.node.kind else {
            return Err(self.fail("an array"));
        };
        let r = visitor.visit_seq(Seq {
            items: items.iter(),
            index: 0,
            ctx: self.ctx,
            path: self.path,
        });
        self.wrap(r)
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let NodeKind::Table(entries) = &self.node.kind else {
            return Err(self.fail("a table"));
        };
        let r = visitor.visit_map(Map::new(
            entries.iter().map(|(k, v)| (k, v)).collect(),
            self.ctx,
            self.path,
        ));
        self.wrap(r)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        if name == SPANNED_NAME {
            let span = self.span();
            let r = visitor.visit_map(SpannedAccess {
                span,
                value: Some(self),
                step: 0,
            });
            return r;
        }
        if name == TEXT_NAME {
            let (text, secret, unresolved) = self.expand_text()?;
            let source = match &self.node.kind {
                NodeKind::Str(raw) if raw.contains('$') => Some(raw.clone()),
                _ => None,
            };
            let r = visitor.visit_map(TextAccess {
                text: Some(text),
                secret: Some(secret),
                source,
                unresolved: unresolved.then_some(true),
            });
            return self.wrap(r);
        }
        let NodeKind::Table(entries) = &self.node.kind else {
            return Err(self.fail("a table"));
        };
        let mut known = Vec::with_capacity(entries.len());
        for (key, value) in entries {
            if fields.contains(&key.name.as_str()) {
                known.push((key, value));
            } else {
                self.unknown_field(key, fields);
            }
        }
        let r = visitor.visit_map(Map::new(known, self.ctx, self.path));
        self.wrap(r)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        let NodeKind::Str(s) = &self.node.kind else {
            return Err(self.fail(&format!("one of {}", quoted_list(variants))));
        };
        if !variants.contains(&s.as_str()) {
            let mut diag =
                Diagnostic::error(format!("unknown value `{}` for `{}`", clip(s), self.path))
                    .at(self.ctx.file, self.span());
            diag = match did_you_mean(s, variants.iter().copied()) {
                Some(best) => diag.with_hint(format!(
                    "did you mean `{best}`? expected one of {}",
                    quoted_list(variants)
                )),
                None => diag.with_hint(format!("expected one of {}", quoted_list(variants))),
            };
            self.ctx.push(diag);
            return Err(DeError {
                message: String::new(),
                recorded: true,
            });
        }
        let r = visitor.visit_enum(s.as_str().into_deserializer());
        self.wrap(r)
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        visitor.visit_unit()
    }
}

impl NodeDe<'_, '_, '_> {
    fn unknown_field(&self, key: &Key, fields: &[&str]) {
        if !has_room(&self.ctx.diags.borrow()) {
            // Past the cap: fail the entry without the cost of a suggestion.
            self.ctx.push(Diagnostic::error(String::new()));
            return;
        }
        let visible: Vec<&str> = fields
            .iter()
            .copied()
            .filter(|f| !f.starts_with('$') || *f == "$schema")
            .collect();
        let summary = match self.path {
            Path::Root => format!("unknown top-level field `{}`", clip(&key.name)),
            path => format!("unknown field `{}` in `{path}`", clip(&key.name)),
        };
        let hint = match did_you_mean(&key.name, visible.iter().copied()) {
            Some(best) => {
                if matches!(self.path, Path::Root) {
                    self.ctx.misspelled.borrow_mut().insert(best.to_string());
                }
                format!("did you mean `{best}`?")
            }
            None if visible.is_empty() => "remove it".to_string(),
            None => format!("remove it; the fields here are {}", quoted_list(&visible)),
        };
        self.ctx.push(
            Diagnostic::error(summary)
                .at(self.ctx.file, key.span.clone())
                .with_hint(hint),
        );
    }
}

struct Seq<'a, 'n, 'p> {
    items: std::slice::Iter<'n, Node>,
    index: usize,
    ctx: &'a DeCtx<'a>,
    path: &'p Path<'p>,
}

impl<'de> SeqAccess<'de> for Seq<'_, '_, '_> {
    type Error = DeError;
    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, DeError> {
        let Some(node) = self.items.next() else {
            return Ok(None);
        };
        let path = Path::Index(self.path, self.index);
        self.index += 1;
        seed.deserialize(NodeDe {
            node,
            ctx: self.ctx,
            path: &path,
        })
        .map(Some)
    }
    fn size_hint(&self) -> Option<usize> {
        Some(self.items.len())
    }
}

struct Map<'a, 'n, 'p> {
    entries: std::vec::IntoIter<(&'n Key, &'n Node)>,
    value: Option<(&'n Key, &'n Node)>,
    ctx: &'a DeCtx<'a>,
    path: &'p Path<'p>,
}

impl<'a, 'n, 'p> Map<'a, 'n, 'p> {
    fn new(entries: Vec<(&'n Key, &'n Node)>, ctx: &'a DeCtx<'a>, path: &'p Path<'p>) -> Self {
        Self {
            entries: entries.into_iter(),
            value: None,
            ctx,
            path,
        }
    }
}

impl<'de> MapAccess<'de> for Map<'_, '_, '_> {
    type Error = DeError;
    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, DeError> {
        let Some(entry) = self.entries.next() else {
            return Ok(None);
        };
        self.value = Some(entry);
        seed.deserialize(KeyDe { key: entry.0 }).map(Some)
    }
    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, DeError> {
        let (key, node) = self
            .value
            .take()
            .ok_or_else(|| de::Error::custom("value requested before key"))?;
        let path = Path::Key(self.path, &key.name);
        seed.deserialize(NodeDe {
            node,
            ctx: self.ctx,
            path: &path,
        })
    }
    fn size_hint(&self) -> Option<usize> {
        Some(self.entries.len())
    }
}

/// Deserializes a table key: a string, or a [`Spanned`] string.
struct KeyDe<'n> {
    key: &'n Key,
}

impl<'de> Deserializer<'de> for KeyDe<'_> {
    type Error = DeError;
    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        visitor.visit_str(&self.key.name)
    }
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        if name == SPANNED_NAME {
            let key = KeyDe { key: self.key };
            visitor.visit_map(SpannedAccess {
                span: self.key.span.clone(),
                value: Some(key),
                step: 0,
            })
        } else {
            self.deserialize_any(visitor)
        }
    }
    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map enum identifier ignored_any
    }
}

/// Feeds `start`, `end` and the value to [`Spanned`]'s visitor.
struct SpannedAccess<D> {
    span: Span,
    value: Option<D>,
    step: usize,
}

impl<'de, D: Deserializer<'de, Error = DeError>> MapAccess<'de> for SpannedAccess<D> {
    type Error = DeError;
    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, DeError> {
        let Some(name) = SPANNED_FIELDS.get(self.step) else {
            return Ok(None);
        };
        seed.deserialize(BorrowedStr(name)).map(Some)
    }
    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, DeError> {
        self.step += 1;
        match self.step {
            1 => seed.deserialize((self.span.start as u64).into_deserializer()),
            2 => seed.deserialize((self.span.end as u64).into_deserializer()),
            _ => match self.value.take() {
                Some(d) => seed.deserialize(d),
                None => Err(de::Error::custom("spanned value read twice")),
            },
        }
    }
}

/// Feeds the expanded text and its secret flag to [`Text`]'s visitor.
struct TextAccess {
    text: Option<String>,
    secret: Option<bool>,
    /// The string as written, when it had `$` interpolation.
    source: Option<String>,
    /// `Some(true)` when expansion failed.
    unresolved: Option<bool>,
}

impl<'de> MapAccess<'de> for TextAccess {
    type Error = DeError;
    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, DeError> {
        let name = if self.text.is_some() {
            TEXT_FIELDS[0]
        } else if self.secret.is_some() {
            TEXT_FIELDS[1]
        } else if self.source.is_some() {
            TEXT_FIELDS[2]
        } else if self.unresolved.is_some() {
            TEXT_FIELDS[3]
        } else {
            return Ok(None);
        };
        seed.deserialize(BorrowedStr(name)).map(Some)
    }
    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, DeError> {
        if let Some(text) = self.text.take() {
            seed.deserialize(text.into_deserializer())
        } else if let Some(secret) = self.secret.take() {
            seed.deserialize(secret.into_deserializer())
        } else if let Some(source) = self.source.take() {
            seed.deserialize(source.into_deserializer())
        } else {
            seed.deserialize(
                self.unresolved
                    .take()
                    .unwrap_or_default()
                    .into_deserializer(),
            )
        }
    }
}

/// A `&'static str` that deserializes as a borrowed string (so visitors
/// asking for `&str` keys accept it).
struct BorrowedStr(&'static str);

impl<'de> Deserializer<'de> for BorrowedStr {
    type Error = DeError;
    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        visitor.visit_borrowed_str(self.0)
    }
    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map struct enum identifier ignored_any
    }
}
