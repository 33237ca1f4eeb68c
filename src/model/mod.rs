//! The manifest model. PURE: parsing, interpolation, validation and the JSON
//! Schema, with no async runtime, no processes and no database.
//!
//! Loading is two-phase. [`node`] parses TOML or JSON into a span-keeping
//! tree; [`de`] deserializes that tree into the [`raw`] serde structs,
//! recording every shape error; [`lower`] turns the raw structs into the
//! validated [`Manifest`], recording every semantic error. All diagnostics
//! come back together.

pub mod de;
pub mod diagnostics;
pub mod interp;
mod json;
pub mod keyword;
pub mod lower;
pub mod node;
pub mod package;
mod parse;
pub mod pattern;
pub mod raw;
pub mod refname;
pub mod schedule;
pub mod source;
pub mod store_url;
pub mod template;
pub mod text;
mod toml_tree;
pub mod types;
pub mod workflow;

#[cfg(test)]
mod tests;

pub use diagnostics::{Diagnostic, Severity};
pub use interp::Env;
pub use lower::Files;
pub use node::Syntax;
pub use source::SourceFile;
pub use text::Text;
pub use types::*;

/// Manifest file names looked for in a directory, in order.
pub const MANIFEST_NAMES: [&str; 2] = ["npcagent.toml", "npcagent.json"];

/// The outcome of loading a manifest: the model when it is valid, and every
/// diagnostic either way.
#[derive(Debug)]
pub struct Loaded {
    pub manifest: Option<Manifest>,
    pub diagnostics: Vec<Diagnostic>,
    pub source: SourceFile,
    /// The parsed tree of a manifest under [`KEEP_TREE_BYTES`], released
    /// with the rest rather than node by node before lowering, so a one-shot
    /// command can leave all of it to its exit ([`Loaded::leave`]); a larger
    /// tree is freed before lowering, which bounds the load's peak memory.
    _tree: Option<node::Node>,
}

/// Manifests up to this size keep their parsed tree until the [`Loaded`]
/// goes (a few hundred KiB of tree at most); larger ones free it before
/// lowering.
pub const KEEP_TREE_BYTES: usize = 64 * 1024;

impl Loaded {
    pub fn error_count(&self) -> usize {
        self.diagnostics.iter().filter(|d| d.is_error()).count()
    }

    /// End a one-shot process's use of the load without freeing it: the
    /// process exits next and the system takes the memory back at once,
    /// where dropping the tree, the model and the diagnostics allocation by
    /// allocation is a tenth of `npc validate`'s work. Never for a
    /// long-lived process (the daemon), whose loads must be freed.
    pub fn leave(self) {
        std::mem::forget(self);
    }
}

/// Load a manifest from bytes. `name` is what diagnostics call the file.
pub fn load_bytes(
    name: &str,
    bytes: &[u8],
    syntax: Syntax,
    env: &dyn Env,
    files: &dyn Files,
) -> Loaded {
    if bytes.len() > node::MAX_MANIFEST_BYTES {
        return too_large(name);
    }
    match std::str::from_utf8(bytes) {
        Ok(text) => load_text(name, text, syntax, env, files),
        Err(e) => not_utf8(name, bytes, e),
    }
}

/// [`load_bytes`] taking the bytes by value, so they are freed before
/// parsing starts (the text is kept once, in the [`SourceFile`]).
pub fn load_owned(
    name: &str,
    bytes: Vec<u8>,
    syntax: Syntax,
    env: &dyn Env,
    files: &dyn Files,
) -> Loaded {
    if bytes.len() > node::MAX_MANIFEST_BYTES {
        return too_large(name);
    }
    match String::from_utf8(bytes) {
        Ok(text) => load_text(name, text, syntax, env, files),
        Err(e) => not_utf8(name, e.as_bytes(), e.utf8_error()),
    }
}

/// The outcome for a manifest that is not UTF-8.
fn not_utf8(name: &str, bytes: &[u8], e: std::str::Utf8Error) -> Loaded {
    let lossy = String::from_utf8_lossy(bytes).into_owned();
    let source = SourceFile::new(name, lossy);
    // Offsets in the lossy text match the input up to the first bad byte.
    let at = e.valid_up_to();
    let diagnostics = vec![
        Diagnostic::error("manifest is not valid UTF-8")
            .at(&source, at..at + 1)
            .with_hint("save the file as UTF-8"),
    ];
    Loaded {
        manifest: None,
        diagnostics,
        source,
        _tree: None,
    }
}

/// Load a manifest from its text (already checked against the size limit).
fn load_text(
    name: &str,
    text: impl Into<std::sync::Arc<str>>,
    syntax: Syntax,
    env: &dyn Env,
    files: &dyn Files,
) -> Loaded {
    let mut diagnostics = Vec::new();
    let source = SourceFile::new(name, text);
    let Some(root) = parse::parse(&source, syntax, &mut diagnostics) else {
        return Loaded {
            manifest: None,
            diagnostics,
            source,
            _tree: None,
        };
    };
    let ctx = de::DeCtx::new(&source, env);
    let raw: Option<raw::RawManifest> = ctx.deserialize(&root);
    // The tree is not needed past this point: a large one is freed before
    // lowering (peak memory), a small one goes with the load.
    let tree = if source.text().len() <= KEEP_TREE_BYTES {
        Some(root)
    } else {
        drop(root);
        None
    };
    diagnostics.append(&mut ctx.diags.borrow_mut());
    let misspelled = ctx.misspelled.take();
    let manifest =
        raw.and_then(|raw| lower::lower(raw, &source, files, &misspelled, &mut diagnostics));
    diagnostics::finish(&mut diagnostics);
    let manifest = if diagnostics.iter().any(Diagnostic::is_error) {
        None
    } else {
        manifest
    };
    Loaded {
        manifest,
        diagnostics,
        source,
        _tree: tree,
    }
}

/// The outcome for a manifest over [`node::MAX_MANIFEST_BYTES`].
/// What loading a manifest over [`node::MAX_MANIFEST_BYTES`] gives: no
/// manifest, one diagnostic.
pub fn too_large(name: &str) -> Loaded {
    let source = SourceFile::new(name, "");
    let diagnostics = vec![
        Diagnostic::error(format!(
            "manifest is larger than the limit of {} bytes",
            node::MAX_MANIFEST_BYTES
        ))
        .at(&source, 0..0)
        .with_hint("a manifest this large is almost certainly not one; check the path"),
    ];
    Loaded {
        manifest: None,
        diagnostics,
        source,
        _tree: None,
    }
}

/// The JSON Schema of the manifest, generated from the raw structs: what
/// `schemas/npcagent.schema.json` holds (`committed_schema_is_the_generated_one`).
/// The binary prints and writes the committed text ([`SCHEMA_TEXT`]), so
/// the generating code stays out of it.
pub fn json_schema() -> serde_json::Value {
    let schema = schemars::schema_for!(raw::RawManifest);
    let mut value = serde_json::to_value(schema).unwrap_or_default();
    drop_null(&mut value);
    if let Some(obj) = value.as_object_mut() {
        obj.insert("$id".into(), SCHEMA_ID.into());
    }
    value
}

/// The `$id` of the published schema.
pub const SCHEMA_ID: &str = "https://npcagent.dev/schemas/npcagent.schema.json";

/// `schemas/npcagent.schema.json` as committed: what `npc schema` prints,
/// `npc init` writes and `npcagent.toml(5)` is made from (equal to
/// [`json_schema`]'s output, or a test fails).
pub const SCHEMA_TEXT: &str = include_str!("../../schemas/npcagent.schema.json");

/// [`SCHEMA_TEXT`], parsed.
pub fn schema() -> serde_json::Value {
    serde_json::from_str(SCHEMA_TEXT).unwrap_or_default()
}

/// Remove the `null` alternatives schemars adds for `Option` fields: TOML
/// has no null, and an absent key already means "not set".
fn drop_null(value: &mut serde_json::Value) {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            if let Some(Value::Array(types)) = map.get_mut("type") {
                types.retain(|t| t != "null");
                if types.len() == 1 {
                    let only = types.remove(0);
                    map.insert("type".into(), only);
                }
            }
            if let Some(Value::Array(alts)) = map.get("anyOf") {
                let rest: Vec<Value> = alts
                    .iter()
                    .filter(|a| a.get("type") != Some(&Value::from("null")))
                    .cloned()
                    .collect();
                if rest.len() == 1 {
                    map.remove("anyOf");
                    if let Value::Object(inner) = &rest[0] {
                        for (k, v) in inner {
                            map.entry(k.clone()).or_insert_with(|| v.clone());
                        }
                    }
                }
            }
            map.values_mut().for_each(drop_null);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_null),
        _ => {}
    }
}
