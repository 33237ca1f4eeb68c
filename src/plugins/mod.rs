//! Agent Plugins 1.0 packages: reading and statically checking a package
//! directory (`plugin.json`, `mcp.json`, `skills/<name>/SKILL.md`, hooks
//! files), with every problem named by file and JSON Pointer, in one run.
//! Nothing here executes plugin code or creates data: [`validate`] only
//! reads, through the guarded file layer ([`crate::repofs::Root`] at the
//! package root), so no path of a package may resolve outside it (§4.1).
//! The official schemas are compiled into the binary ([`schema`]).
//!
//! Hooks files are client extensions in reverse-domain folders (§8.2):
//! npc's own is [`NPC_NAMESPACE`]`/hooks.json`; Orcacode's
//! [`ORCACODE_NAMESPACE`]`/hooks.json` is read too, so a package written for
//! Orcacode runs its hooks under npc unchanged. When both exist npc's own
//! wins and the other is reported as ignored. The parsed [`hooks::HooksFile`]
//! is what the hook runner consumes for a plugin's hooks.

pub mod data;
pub mod expand;
pub mod files;
pub mod hooks;
pub mod mcp;
pub mod probe;
pub mod registry;
pub mod resolve;
pub mod scaffold;
pub mod schema;
pub mod skills;

#[cfg(test)]
mod tests;

use std::path::{Component, Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

use crate::model::diagnostics::{Severity, clip};
use crate::repofs::{FsError, Root};

/// Canonical `$schema` of `plugin.json` in Agent Plugins 1.0.0.
pub const PLUGIN_SCHEMA_URL: &str = "https://agent-plugins.org/schemas/1.0.0/plugin.schema.json";
/// Canonical `$schema` of `mcp.json` in Agent Plugins 1.0.0.
pub const MCP_SCHEMA_URL: &str = "https://agent-plugins.org/schemas/1.0.0/mcp.schema.json";
/// The package manifest, at the package root.
pub const MANIFEST_FILE: &str = "plugin.json";
/// The optional MCP configuration, at the package root.
pub const MCP_FILE: &str = "mcp.json";
/// The fixed location of Agent Skills (§6.1).
pub const SKILLS_DIR: &str = "skills";
/// npc's reverse-domain client-extension namespace: its folder in a package
/// (`dev.npcagent/hooks.json`) and its key under `extensions` in `plugin.json`.
pub const NPC_NAMESPACE: &str = "dev.npcagent";
/// Orcacode's namespace, whose `hooks.json` npc also reads.
pub const ORCACODE_NAMESPACE: &str = "io.github.okikorg.orcacode";
/// The hooks file inside a namespace folder.
pub const HOOKS_FILE: &str = "hooks.json";
/// The files a package declares, relative to its root: what npc reads of it
/// (its digest covers these and [`DECLARED_DIRS`], never other files of its
/// folder).
pub const DECLARED_FILES: [&str; 4] = [
    MANIFEST_FILE,
    MCP_FILE,
    "dev.npcagent/hooks.json",
    "io.github.okikorg.orcacode/hooks.json",
];
/// The directories a package declares, with everything under them.
pub const DECLARED_DIRS: [&str; 1] = [SKILLS_DIR];

/// Largest `plugin.json`, `mcp.json` or hooks file read.
pub const MAX_JSON_BYTES: usize = 1024 * 1024;
/// Most problems reported for one package; the rest are counted.
pub const MAX_PROBLEMS: usize = 500;
/// The two placeholders a package may use (in `args`, `env` values, `cwd`).
pub const PLUGIN_ROOT: &str = "PLUGIN_ROOT";
pub const PLUGIN_DATA: &str = "PLUGIN_DATA";

/// One problem in a package: which file, where in it (a JSON Pointer, or
/// the frontmatter key of a `SKILL.md`; empty for the whole file), what is
/// wrong and what to do next.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    pub severity: Severity,
    /// Relative to the package root.
    pub file: String,
    /// RFC 6901 pointer into the file's JSON (or frontmatter); "" for the file.
    pub pointer: String,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

impl Problem {
    pub fn error(file: &str, pointer: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            severity: Severity::Error,
            file: file.to_string(),
            pointer: pointer.into(),
            message: message.into(),
            hint: None,
        }
    }

    pub fn warning(file: &str, pointer: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            severity: Severity::Warning,
            ..Self::error(file, pointer, message)
        }
    }

    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }

    /// `file#pointer`, the place as one token.
    pub fn place(&self) -> String {
        if self.pointer.is_empty() {
            self.file.clone()
        } else {
            format!("{}#{}", self.file, self.pointer)
        }
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let level = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        write!(f, "{}: {level}: {}", self.place(), self.message)?;
        if let Some(hint) = &self.hint {
            write!(f, "\n  help: {hint}")?;
        }
        Ok(())
    }
}

/// `plugin.json`, the fields npc uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PluginManifest {
    pub name: String,
    pub version: Option<String>,
    pub description: Option<String>,
}

/// A package that loaded: its manifest and the components that passed
/// their checks (a bad server entry, skill or hooks file is left out and
/// reported; the others stay, §11.3).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Package {
    /// Canonical absolute path of the package root (`PLUGIN_ROOT`).
    pub root: PathBuf,
    pub manifest: PluginManifest,
    pub servers: Vec<mcp::Server>,
    pub skills: Vec<skills::Skill>,
    pub hooks: Option<hooks::HooksFile>,
}

/// What [`validate`] found: the package when `plugin.json` is valid, and
/// every problem.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub package: Option<Package>,
    pub problems: Vec<Problem>,
    /// Problems found beyond [`MAX_PROBLEMS`], not listed.
    pub omitted: usize,
    /// How many of those were errors.
    pub omitted_errors: usize,
}

impl Report {
    pub fn error_count(&self) -> usize {
        self.problems.iter().filter(|p| p.is_error()).count()
    }

    pub fn warning_count(&self) -> usize {
        self.problems.len() - self.error_count()
    }

    /// Valid: it loaded, and nothing in it is an error.
    pub fn is_valid(&self) -> bool {
        self.package.is_some() && self.error_count() == 0 && self.omitted_errors == 0
    }
}

/// Why a package could not be looked at at all.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("plugin directory {0}")]
    Root(#[source] FsError),
}

/// Problems collected while checking one package, bounded.
#[derive(Debug, Default)]
pub(crate) struct Problems {
    list: Vec<Problem>,
    omitted: usize,
    omitted_errors: usize,
}

impl Problems {
    /// Keep `p`; past [`MAX_PROBLEMS`] an error takes the place of the
    /// last warning (errors are never crowded out by warnings), and what
    /// is left out is counted.
    pub(crate) fn push(&mut self, p: Problem) {
        if self.list.len() < MAX_PROBLEMS {
            self.list.push(p);
            return;
        }
        self.omitted += 1;
        if !p.is_error() {
            return;
        }
        match self.list.iter().rposition(|q| !q.is_error()) {
            Some(i) => {
                self.list.remove(i);
                self.list.push(p);
            }
            None => self.omitted_errors += 1,
        }
    }

    pub(crate) fn extend(&mut self, ps: impl IntoIterator<Item = Problem>) {
        for p in ps {
            self.push(p);
        }
    }
}

/// Check the package at `dir` statically: nothing is executed and nothing
/// is created.
pub fn validate(dir: &Path) -> Result<Report, PluginError> {
    let root = Root::new(dir).map_err(PluginError::Root)?;
    if let Err(e) = root.dir_check(Path::new("")) {
        return Err(PluginError::Root(e));
    }
    Ok(validate_root(&root))
}

/// [`validate`] for a package root already opened.
pub fn validate_root(root: &Root) -> Report {
    let mut problems = Problems::default();
    let manifest = read_manifest(root, &mut problems);
    let servers = mcp::read(root, &mut problems);
    let skills = skills::read(root, &mut problems);
    let hooks = hooks::read(root, &mut problems);
    let package = manifest.map(|manifest| Package {
        root: root.path().to_path_buf(),
        manifest,
        servers,
        skills,
        hooks,
    });
    Report {
        package,
        problems: problems.list,
        omitted: problems.omitted,
        omitted_errors: problems.omitted_errors,
    }
}

/// Read a JSON file of the package: `None` when it does not exist (and
/// `required` is false) or cannot be used, with the problem reported.
pub(crate) fn read_json(
    root: &Root,
    file: &str,
    required: bool,
    problems: &mut Problems,
) -> Option<Value> {
    match root.read_existing(
        Path::new(file),
        MAX_JSON_BYTES,
        crate::repofs::Links::Follow,
    ) {
        Ok(None) if required => {
            problems.push(
                Problem::error(file, "", format!("`{file}` does not exist"))
                    .hint("an Agent Plugins package has a `plugin.json` at its root; `npc plugin init NAME` writes a new package"),
            );
            None
        }
        Ok(None) => None,
        Ok(Some(text)) => match serde_json::from_str::<Value>(&text) {
            Ok(v) => Some(v),
            Err(e) => {
                problems.push(
                    Problem::error(file, "", format!("not valid JSON: {e}"))
                        .hint("fix the syntax at that line and column"),
                );
                None
            }
        },
        Err(e) => {
            problems.push(Problem::error(
                file,
                "",
                format!("cannot be read: {}", e.reason),
            ));
            None
        }
    }
}

/// The fields of `plugin.json` the 1.0.0 schema defines.
const MANIFEST_FIELDS: [&str; 10] = [
    "$schema",
    "name",
    "version",
    "description",
    "author",
    "homepage",
    "repository",
    "license",
    "keywords",
    "extensions",
];

fn read_manifest(root: &Root, problems: &mut Problems) -> Option<PluginManifest> {
    let mut doc = read_json(root, MANIFEST_FILE, true, problems)?;
    let Some(obj) = doc.as_object_mut() else {
        problems.push(Problem::error(MANIFEST_FILE, "", "must be a JSON object"));
        return None;
    };
    // §5.2: unknown fields are reported and ignored.
    let unknown: Vec<String> = obj
        .keys()
        .filter(|k| !MANIFEST_FIELDS.contains(&k.as_str()))
        .cloned()
        .collect();
    for key in unknown {
        problems.push(
            Problem::warning(
                MANIFEST_FILE,
                pointer(&[&key]),
                format!("unknown field `{}` is ignored", clip(&key)),
            )
            .hint("Agent Plugins 1.0 defines no such field; client data goes under `extensions`"),
        );
        obj.remove(&key);
    }
    // §8.1: other clients' namespaces are ignored without validating them.
    if let Some(Value::Object(ext)) = obj.get_mut("extensions") {
        ext.retain(|k, _| k == NPC_NAMESPACE);
    }
    if obj
        .get("$schema")
        .and_then(Value::as_str)
        .is_some_and(|s| s != PLUGIN_SCHEMA_URL)
    {
        problems.push(
            Problem::error(
                MANIFEST_FILE,
                "/$schema",
                "is not the Agent Plugins 1.0.0 plugin schema",
            )
            .hint(format!("set `\"$schema\": \"{PLUGIN_SCHEMA_URL}\"`")),
        );
        // The other fields are still checked, against the right `$schema`.
        obj.insert("$schema".into(), PLUGIN_SCHEMA_URL.into());
        problems.extend(schema::check(
            schema::Schema::Plugin,
            &doc,
            MANIFEST_FILE,
            "",
        ));
        return None;
    }
    let errors = schema::check(schema::Schema::Plugin, &doc, MANIFEST_FILE, "");
    if !errors.is_empty() {
        problems.extend(errors.into_iter().map(|p| match p.pointer.as_str() {
            "/name" => p.hint(
                "a name is 1–64 characters `a-z`, `0-9`, with inner `.` or `-` and no `--` or `..`",
            ),
            "" if p.message.contains("`$schema`") => {
                p.hint(format!("add `\"$schema\": \"{PLUGIN_SCHEMA_URL}\"`"))
            }
            _ => p,
        }));
        return None;
    }
    let text = |k: &str| doc.get(k).and_then(Value::as_str).map(str::to_string);
    Some(PluginManifest {
        name: text("name")?,
        version: text("version"),
        description: text("description"),
    })
}

/// Whether a file exists at `path` in the package: anything but "not
/// found" counts, so a link leaving the package or a FIFO is reported by
/// the read that follows, not silently skipped. Reads nothing.
pub(crate) fn exists(root: &Root, path: &Path) -> bool {
    match root.read_with(path, 0, crate::repofs::Links::Follow) {
        Err(e) => !e.is_not_found(),
        Ok(_) => true,
    }
}

/// An RFC 6901 pointer from its unescaped parts.
pub fn pointer(parts: &[&str]) -> String {
    let mut out = String::new();
    for p in parts {
        out.push('/');
        out.push_str(&p.replace('~', "~0").replace('/', "~1"));
    }
    out
}

/// What is wrong with a `command` token (servers and hooks): one token, a
/// bare name or `./`-relative inside the package, no placeholders.
pub(crate) fn check_command(root: &Root, command: &str) -> Result<(), (String, &'static str)> {
    if command.contains("${") {
        return Err((
            format!(
                "`{}` contains a placeholder; `command` is never expanded",
                clip(command)
            ),
            "put `${PLUGIN_ROOT}` or `${PLUGIN_DATA}` in `args`, `env` or `cwd`, and keep `command` a bare name such as `python`",
        ));
    }
    if command.contains('\0') || command.chars().any(char::is_whitespace) {
        return Err((
            format!("`{}` is not one token", clip(command)),
            "`command` is one executable; put its arguments in `args`",
        ));
    }
    if let Some(rel) = command.strip_prefix("./") {
        return check_inside(root, rel)
            .map_err(|m| (m, "point `command` at a file inside the package"));
    }
    if command.contains('/') {
        return Err((
            format!(
                "`{}` is neither a bare name nor `./`-relative",
                clip(command)
            ),
            "use a bare executable name (`node`, `python`) or a path inside the package starting with `./`",
        ));
    }
    Ok(())
}

/// What is wrong with a `cwd` (servers and hooks): `./…`, `${PLUGIN_ROOT}…`
/// or `${PLUGIN_DATA}…` (the schema checks the prefix), staying inside
/// that root after resolving symbolic links.
pub(crate) fn check_cwd(root: &Root, cwd: &str) -> Result<(), String> {
    let data_placeholder = format!("${{{PLUGIN_DATA}}}");
    let root_placeholder = format!("${{{PLUGIN_ROOT}}}");
    if let Some(rel) = cwd.strip_prefix(&data_placeholder) {
        // The data directory does not exist at validation time: lexically.
        return if climbs(Path::new(rel.trim_start_matches('/'))) {
            Err(format!(
                "`{}` leaves the plugin's data directory",
                clip(cwd)
            ))
        } else {
            Ok(())
        };
    }
    let rel = cwd
        .strip_prefix(&root_placeholder)
        .or_else(|| cwd.strip_prefix("./"))
        .unwrap_or(cwd)
        .trim_start_matches('/');
    check_inside(root, rel)
}

/// `rel` (relative to the package root) stays inside the package: lexically,
/// and after resolving links when it exists.
fn check_inside(root: &Root, rel: &str) -> Result<(), String> {
    let path = Path::new(rel);
    if climbs(path) {
        return Err(format!("`./{}` leaves the package", clip(rel)));
    }
    match root.real_path(path) {
        Ok(_) => Ok(()),
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) if matches!(e.reason, crate::repofs::Reason::Escapes { .. }) => Err(format!(
            "`./{}` resolves outside the package: {}",
            clip(rel),
            e
        )),
        Err(_) => Ok(()),
    }
}

/// Whether a relative path climbs above its start at any point (or is absolute).
fn climbs(path: &Path) -> bool {
    let mut depth: i64 = 0;
    for c in path.components() {
        match c {
            Component::ParentDir => depth -= 1,
            Component::Normal(_) => depth += 1,
            Component::RootDir | Component::Prefix(_) => return true,
            Component::CurDir => {}
        }
        if depth < 0 {
            return true;
        }
    }
    false
}
