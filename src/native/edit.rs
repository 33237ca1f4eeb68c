//! Editing an existing native file in place: JSON through an
//! order-preserving `serde_json::Value`, TOML through a comment-keeping
//! `toml_edit::DocumentMut`. Only entries npc manages change; in a managed
//! entry only the keys npc writes change, so keys a user added survive.

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::{Map, Value};
use toml_edit::{DocumentMut, Item, Table};

use super::export::{self, Entry, JsonKind, Rendered};
use super::jsonc::{self, Dialect};
use super::{NativeError, PlanOptions, ProviderKind, line_col};
use crate::model::Manifest;

/// The edited text and what the edit decided.
#[derive(Debug)]
pub struct Edited {
    pub after: String,
    pub notes: Vec<String>,
    pub managed: BTreeSet<String>,
    pub conflicts: Vec<String>,
}

/// The top-level key holding the servers in each JSON target.
fn container_key(kind: JsonKind) -> &'static str {
    match kind {
        JsonKind::Claude | JsonKind::Gemini => "mcpServers",
        JsonKind::Opencode => "mcp",
    }
}

fn owned_keys(kind: ProviderKind) -> &'static [&'static str] {
    match kind {
        ProviderKind::ClaudeCode => export::CLAUDE_KEYS,
        ProviderKind::Codex => export::CODEX_KEYS,
        ProviderKind::GeminiCli => export::GEMINI_KEYS,
        ProviderKind::Opencode => export::OPENCODE_KEYS,
    }
}

/// One more edit of a JSON settings file beside its MCP servers (the hook
/// bridge, npc's permission entries): it changes the parsed document and
/// adds its notes and the entries it manages.
pub type Pass<'p> = &'p dyn Fn(
    &mut JsonDoc<'_>,
    &mut Vec<String>,
    &mut BTreeSet<String>,
) -> Result<(), NativeError>;

/// `kind`'s file (`before`, `None` when absent) with the manifest's MCP
/// servers brought in line, then each of `passes` (JSON files only; a
/// TOML file takes none), the file parsed once and written once.
pub fn edit(
    path: &Path,
    kind: ProviderKind,
    before: Option<&str>,
    manifest: &Manifest,
    previously: &BTreeSet<String>,
    opts: PlanOptions,
    passes: &[Pass<'_>],
) -> Result<Edited, NativeError> {
    let json = match kind {
        ProviderKind::ClaudeCode => JsonKind::Claude,
        ProviderKind::GeminiCli => JsonKind::Gemini,
        ProviderKind::Opencode => JsonKind::Opencode,
        ProviderKind::Codex => return edit_toml(path, before, manifest, previously, opts),
    };
    let mut doc = JsonDoc::parse(path, kind, before)?;
    let mut edited = edit_servers(&mut doc, json, manifest, previously, opts)?;
    for pass in passes {
        pass(&mut doc, &mut edited.notes, &mut edited.managed)?;
    }
    edited.after = doc.finish(&mut edited.notes)?;
    Ok(edited)
}

/// A JSON (or JSONC) agent file parsed once for a plan: each pass that
/// brings a part of it in line (the MCP servers, the hook bridge, npc's
/// permission entries) edits [`JsonDoc::root`], and [`JsonDoc::finish`]
/// makes the text once, the original's comments kept where they can be.
#[derive(Debug)]
pub struct JsonDoc<'a> {
    pub path: &'a Path,
    pub kind: ProviderKind,
    before: Option<&'a str>,
    /// The comment-free form of `before`, when it held comments.
    stripped: Option<String>,
    original: Map<String, Value>,
    /// The top-level object as edited so far.
    pub root: Map<String, Value>,
}

impl<'a> JsonDoc<'a> {
    /// Parse `before` (`None`: the file does not exist, an empty object)
    /// in `kind`'s dialect.
    pub fn parse(
        path: &'a Path,
        kind: ProviderKind,
        before: Option<&'a str>,
    ) -> Result<Self, NativeError> {
        let (root, stripped) = match before {
            Some(text) => parse_native_json(path, kind, text)?,
            None => (Map::new(), None),
        };
        Ok(Self {
            path,
            kind,
            before,
            stripped,
            original: root.clone(),
            root,
        })
    }

    /// The top-level object as the file holds it.
    pub fn original(&self) -> &Map<String, Value> {
        &self.original
    }

    /// The error for a value of the wrong shape in this file.
    pub fn shape(&self, message: impl Into<String>) -> NativeError {
        NativeError::Shape {
            path: self.path.into(),
            message: message.into(),
        }
    }

    /// The text of the edited document: `before` itself when nothing
    /// changed, the original's comments kept in place where they can be (a
    /// note in `notes` when they cannot), and no text at all for an empty
    /// object that was never a file.
    pub fn finish(self, notes: &mut Vec<String>) -> Result<String, NativeError> {
        let Self {
            path,
            kind,
            before,
            stripped,
            original,
            root,
        } = self;
        if root == original {
            return Ok(before.unwrap_or_default().to_string());
        }
        if let (Some(text), Some(stripped)) = (before, stripped.as_deref())
            && let Some(text) = keep_comments(text, stripped, original, root.clone(), kind)
        {
            return Ok(text);
        }
        if stripped.is_some() {
            notes.push(format!(
                "`{}` holds comments npc could not keep in place; they are dropped",
                path.display()
            ));
        }
        if root.is_empty() && before.is_none() {
            return Ok(String::new());
        }
        let mut text =
            serde_json::to_string_pretty(&Value::Object(root)).map_err(|e| NativeError::Shape {
                path: path.into(),
                message: format!("cannot serialize: {e}"),
            })?;
        text.push('\n');
        Ok(text)
    }
}

/// What happens to one name, decided the same way for every format.
enum Decision<T> {
    /// Write a fresh entry (replacing any existing one).
    Insert(T),
    /// Update the owned keys of the existing managed entry.
    Update(T),
    Remove,
    Keep,
    Nothing,
}

/// The shared rules: conflicts, removal of entries no longer declared,
/// and which names stay managed.
struct Rules<'a> {
    previously: &'a BTreeSet<String>,
    opts: PlanOptions,
    notes: Vec<String>,
    managed: BTreeSet<String>,
    conflicts: Vec<String>,
}

impl Rules<'_> {
    fn decide<T>(&mut self, name: &str, entry: Entry<T>, exists: bool, path: &Path) -> Decision<T> {
        self.notes.extend(entry.notes);
        let was_managed = self.previously.contains(name);
        match entry.rendered {
            Rendered::Write(e) => {
                if exists && !was_managed {
                    if !self.opts.force {
                        self.conflicts.push(name.to_string());
                        self.notes.push(format!(
                            "`{name}`: `{}` already has an entry of this name that npc did not write; left alone (`--force-agent-files` replaces it)",
                            path.display()
                        ));
                        return Decision::Nothing;
                    }
                    self.managed.insert(name.to_string());
                    return Decision::Insert(e);
                }
                self.managed.insert(name.to_string());
                if exists {
                    Decision::Update(e)
                } else {
                    Decision::Insert(e)
                }
            }
            Rendered::Omit if exists && was_managed => Decision::Remove,
            Rendered::Skip(_) if exists && was_managed => {
                self.managed.insert(name.to_string());
                Decision::Keep
            }
            Rendered::Omit | Rendered::Skip(_) => Decision::Nothing,
        }
    }

    /// Previously managed names the manifest no longer declares.
    fn stale<'m>(&self, manifest: &'m Manifest) -> impl Iterator<Item = &String> + use<'_, 'm> {
        self.previously
            .iter()
            .filter(|n| !manifest.mcp_servers.contains_key(*n))
    }
}

fn json_parse_error(path: &Path, e: &serde_json::Error) -> NativeError {
    NativeError::Parse {
        path: path.into(),
        line: e.line(),
        column: e.column(),
        format: "JSON",
        message: e.to_string(),
    }
}

/// Parse a JSON file whose top level must be an object (bounded by
/// [`super::check_items`]).
pub fn parse_json_object(path: &Path, text: &str) -> Result<Map<String, Value>, NativeError> {
    super::check_items(path, text, super::Syntax::Json)?;
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(NativeError::Shape {
            path: path.into(),
            message: "the top level is not a JSON object".into(),
        }),
        Err(e) => Err(json_parse_error(path, &e)),
    }
}

/// What a JSON target's reader accepts beyond plain JSON; `None` for
/// strict JSON (Claude Code).
pub fn dialect(kind: ProviderKind) -> Option<Dialect> {
    match kind {
        ProviderKind::GeminiCli => Some(Dialect {
            trailing_commas: false,
        }),
        ProviderKind::Opencode => Some(Dialect {
            trailing_commas: true,
        }),
        ProviderKind::ClaudeCode | ProviderKind::Codex => None,
    }
}

#[cfg(test)]
thread_local! {
    /// The files this thread parsed, in order (a plan parses each once).
    pub(crate) static PARSED: std::cell::RefCell<Vec<std::path::PathBuf>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Parse a JSON target's text in its own dialect: the top-level object and,
/// when the text held comments, its comment-free form (same offsets).
pub fn parse_native_json(
    path: &Path,
    kind: ProviderKind,
    text: &str,
) -> Result<(Map<String, Value>, Option<String>), NativeError> {
    #[cfg(test)]
    PARSED.with(|p| p.borrow_mut().push(path.to_path_buf()));
    let stripped = dialect(kind).and_then(|d| jsonc::strip(text, d));
    let root = parse_json_object(path, stripped.as_deref().unwrap_or(text))?;
    Ok((root, stripped))
}

/// The MCP servers of `doc` brought in line with the manifest's.
fn edit_servers(
    doc: &mut JsonDoc<'_>,
    json: JsonKind,
    manifest: &Manifest,
    previously: &BTreeSet<String>,
    opts: PlanOptions,
) -> Result<Edited, NativeError> {
    let key = container_key(json);
    let had_container = doc.root.contains_key(key);
    let mut servers = match doc.root.get(key) {
        None => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(_) => return Err(doc.shape(format!("`{key}` is not a JSON object"))),
    };
    let owned = owned_keys(doc.kind);
    let mut rules = Rules {
        previously,
        opts,
        notes: Vec::new(),
        managed: BTreeSet::new(),
        conflicts: Vec::new(),
    };
    for (name, server) in &manifest.mcp_servers {
        let entry = export::json_entry(json, name, server);
        match rules.decide(name, entry, servers.contains_key(name), doc.path) {
            Decision::Insert(e) => {
                servers.insert(name.clone(), Value::Object(e));
            }
            Decision::Update(e) => match servers.get_mut(name) {
                Some(Value::Object(existing)) => {
                    existing.retain(|k, _| !owned.contains(&k.as_str()) || e.contains_key(k));
                    existing.extend(e);
                }
                _ => {
                    servers.insert(name.clone(), Value::Object(e));
                }
            },
            Decision::Remove => {
                servers.shift_remove(name);
            }
            Decision::Keep | Decision::Nothing => {}
        }
    }
    let stale: Vec<String> = rules.stale(manifest).cloned().collect();
    for name in stale {
        servers.shift_remove(&name);
    }
    if had_container || !servers.is_empty() {
        doc.root.insert(key.to_string(), Value::Object(servers));
    }
    Ok(Edited {
        after: String::new(),
        notes: rules.notes,
        managed: rules.managed,
        conflicts: rules.conflicts,
    })
}

/// The edited text with the original's comments in place, checked by
/// parsing it back; `None` when the check fails.
fn keep_comments(
    text: &str,
    stripped: &str,
    original: Map<String, Value>,
    edited: Map<String, Value>,
    kind: ProviderKind,
) -> Option<String> {
    let (old, new) = (Value::Object(original), Value::Object(edited));
    let after = jsonc::rewrite(text, stripped, &old, &new)?;
    let dialect = dialect(kind)?;
    let check = jsonc::strip(&after, dialect);
    let parsed: Value = serde_json::from_str(check.as_deref().unwrap_or(&after)).ok()?;
    (parsed == new).then_some(after)
}

/// Parse a TOML file (bounded by [`super::check_items`]), reporting line
/// and column on failure.
pub fn parse_toml(path: &Path, text: &str) -> Result<DocumentMut, NativeError> {
    super::check_items(path, text, super::Syntax::Toml)?;
    text.parse::<DocumentMut>().map_err(|e| {
        let (line, column) = line_col(text, e.span().map(|s| s.start).unwrap_or(0));
        NativeError::Parse {
            path: path.into(),
            line,
            column,
            format: "TOML",
            message: e.message().to_string(),
        }
    })
}

fn edit_toml(
    path: &Path,
    before: Option<&str>,
    manifest: &Manifest,
    previously: &BTreeSet<String>,
    opts: PlanOptions,
) -> Result<Edited, NativeError> {
    const KEY: &str = "mcp_servers";
    let mut doc = match before {
        Some(text) => parse_toml(path, text)?,
        None => DocumentMut::new(),
    };
    let had_container = doc.contains_key(KEY);
    // Take the table out of its slot (leaving the slot in place, so the
    // document keeps its key order) and put it back when done.
    let taken = doc
        .get_mut(KEY)
        .map(|slot| std::mem::replace(slot, Item::None));
    let mut servers = match taken {
        None => {
            let mut t = Table::new();
            t.set_implicit(true);
            t
        }
        Some(Item::Table(t)) => t,
        Some(_) => {
            return Err(NativeError::Shape {
                path: path.into(),
                message: format!("`{KEY}` is not a table of `[{KEY}.NAME]` tables"),
            });
        }
    };
    let owned = owned_keys(ProviderKind::Codex);
    let mut rules = Rules {
        previously,
        opts,
        notes: Vec::new(),
        managed: BTreeSet::new(),
        conflicts: Vec::new(),
    };
    let fresh = |kv: Vec<(&'static str, toml_edit::Value)>| {
        let mut t = Table::new();
        for (k, v) in kv {
            t.insert(k, Item::Value(v));
        }
        Item::Table(t)
    };
    for (name, server) in &manifest.mcp_servers {
        let entry = export::codex_entry(name, server);
        match rules.decide(name, entry, servers.contains_key(name), path) {
            Decision::Insert(kv) => {
                servers.insert(name, fresh(kv));
            }
            Decision::Update(kv) => match servers.get_mut(name).and_then(Item::as_table_like_mut) {
                Some(existing) => {
                    let keep: Vec<&str> = kv.iter().map(|(k, _)| *k).collect();
                    for k in owned.iter().filter(|k| !keep.contains(k)) {
                        existing.remove(k);
                    }
                    for (k, v) in kv {
                        match existing.get_mut(k) {
                            Some(Item::Value(old)) if same_value(old, &v) => {}
                            _ => {
                                existing.insert(k, Item::Value(v));
                            }
                        }
                    }
                }
                None => {
                    servers.insert(name, fresh(kv));
                }
            },
            Decision::Remove => {
                servers.remove(name);
            }
            Decision::Keep | Decision::Nothing => {}
        }
    }
    let stale: Vec<String> = rules.stale(manifest).cloned().collect();
    for name in stale {
        servers.remove(&name);
    }
    // Inserting over the emptied slot keeps its position.
    if had_container || !servers.is_empty() {
        doc.insert(KEY, Item::Table(servers));
    }
    let after = match before {
        None if doc.is_empty() => String::new(),
        _ => doc.to_string(),
    };
    let after = match before {
        // Parsing and printing an untouched document gives back the same
        // text, but compare semantically too so formatting never churns.
        Some(text) if after != text && same_toml(text, &after) => text.to_string(),
        _ => after,
    };
    Ok(Edited {
        after,
        notes: rules.notes,
        managed: rules.managed,
        conflicts: rules.conflicts,
    })
}

fn same_toml(a: &str, b: &str) -> bool {
    match (a.parse::<toml::Table>(), b.parse::<toml::Table>()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// Whether two TOML values mean the same, whatever their formatting.
fn same_value(a: &toml_edit::Value, b: &toml_edit::Value) -> bool {
    same_toml(&format!("v = {a}\n"), &format!("v = {b}\n"))
}
