//! `npc import`: reading a native MCP file (any of the four kinds) into
//! manifest entries, printing them as `[mcp.servers.NAME]` tables, and
//! merging them into an existing `npcagent.toml` with its comments intact.
//! Environment references in the file (`${VAR}`, `$VAR`, `{env:VAR}`,
//! `env_vars`, `env_http_headers`, `bearer_token_env_var`) become manifest
//! `${VAR}` references or `bearer_token_env`; nothing is ever resolved.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
use toml_edit::{Array, DocumentMut, InlineTable, Item, Table};

use super::edit::{parse_json_object, parse_native_json, parse_toml};
use super::refs::{self, Segment, Syntax};
use super::{NativeError, ProviderKind, read_existing};
use crate::model::{DEFAULT_STARTUP_TIMEOUT_MS, DEFAULT_TOOL_TIMEOUT_MS, MAX_MCP_TIMEOUT_MS};

/// Most servers one imported file may declare.
pub const MAX_IMPORT_SERVERS: usize = 1024;
const MS_PER_SEC: f64 = 1000.0;

/// One server read from a native file, in manifest terms: strings are in
/// the manifest's spelling (`${VAR}` references, `$$` for a literal `$`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportedServer {
    pub transport: ImportedTransport,
    pub enabled: bool,
    /// `None` when the file leaves it at the default.
    pub startup_timeout_ms: Option<u64>,
    /// `None` when the file leaves it at the default.
    pub tool_timeout_ms: Option<u64>,
    pub enabled_tools: Option<Vec<String>>,
    pub disabled_tools: Vec<String>,
    /// What the manifest cannot express (e.g. an SSE transport).
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImportedTransport {
    Stdio {
        /// A program name or path, as written (the manifest does not expand it).
        command: String,
        args: Vec<String>,
        env: BTreeMap<String, String>,
        cwd: Option<String>,
    },
    Http {
        url: String,
        headers: BTreeMap<String, String>,
        bearer_token_env: Option<String>,
    },
}

impl ImportedServer {
    fn new(transport: ImportedTransport) -> Self {
        Self {
            transport,
            enabled: true,
            startup_timeout_ms: None,
            tool_timeout_ms: None,
            enabled_tools: None,
            disabled_tools: Vec::new(),
            notes: Vec::new(),
        }
    }
}

/// Servers read from one native file, and which agent CLI's file it is.
pub type Imported = (ProviderKind, Vec<(String, ImportedServer)>);

/// Read the native MCP file at `path`; its kind comes from its name, or
/// failing that from its shape.
pub fn import(path: &Path) -> Result<Imported, NativeError> {
    let text = read_existing(path)?.ok_or_else(|| NativeError::Read {
        path: path.into(),
        source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
    })?;
    import_with_kind(path, &text)
}

/// [`import`] on text already read; `path` names the file and decides its kind.
pub fn import_str(path: &Path, text: &str) -> Result<Vec<(String, ImportedServer)>, NativeError> {
    import_with_kind(path, text).map(|(_, entries)| entries)
}

/// [`import_str`], with the kind it decided.
pub fn import_with_kind(path: &Path, text: &str) -> Result<Imported, NativeError> {
    let kind = match kind_from_name(path) {
        Some(kind) => kind,
        None => kind_from_shape(path, text)?,
    };
    let entries = if kind == ProviderKind::Codex {
        import_codex(path, text)?
    } else {
        import_json(path, kind, text)?
    };
    Ok((kind, entries))
}

fn import_json(
    path: &Path,
    kind: ProviderKind,
    text: &str,
) -> Result<Vec<(String, ImportedServer)>, NativeError> {
    let (root, _) = parse_native_json(path, kind, text)?;
    let key = if kind == ProviderKind::Opencode {
        "mcp"
    } else {
        "mcpServers"
    };
    let servers = match root.get(key) {
        None => return Ok(Vec::new()),
        Some(Value::Object(m)) => m,
        Some(_) => return Err(shape(path, format!("`{key}` is not a JSON object"))),
    };
    check_count(path, servers.len())?;
    let mut out = Vec::with_capacity(servers.len());
    for (name, entry) in servers {
        let Value::Object(entry) = entry else {
            return Err(shape(path, format!("`{key}.{name}` is not a JSON object")));
        };
        let f = Fields {
            path,
            at: format!("{key}.{name}"),
            entry,
        };
        out.push((name.clone(), named(name, json_server(kind, &f)?)));
    }
    Ok(out)
}

fn json_server(kind: ProviderKind, f: &Fields<'_>) -> Result<ImportedServer, NativeError> {
    match kind {
        ProviderKind::ClaudeCode => claude(f),
        ProviderKind::GeminiCli => gemini(f),
        _ => opencode(f),
    }
}

/// Whether `imported` (read from a `kind` file) is what npc writes there
/// for the manifest's `server`: the entry npc keeps in step. Both sides go
/// through the same export and import, so what the file cannot express
/// does not count as a difference.
pub fn same_as_manifest(
    kind: ProviderKind,
    name: &str,
    server: &crate::model::McpServer,
    imported: &ImportedServer,
) -> bool {
    use super::export::{self, JsonKind, Rendered};
    let path = Path::new("");
    let at = String::new();
    let ours = match kind {
        ProviderKind::Codex => {
            let Rendered::Write(kv) = export::codex_entry(name, server).rendered else {
                return false;
            };
            let mut table = Table::new();
            for (k, v) in kv {
                table.insert(k, Item::Value(v));
            }
            codex(&TomlFields {
                path,
                at,
                entry: &table,
            })
        }
        _ => {
            let json = match kind {
                ProviderKind::ClaudeCode => JsonKind::Claude,
                ProviderKind::GeminiCli => JsonKind::Gemini,
                _ => JsonKind::Opencode,
            };
            let Rendered::Write(entry) = export::json_entry(json, name, server).rendered else {
                return false;
            };
            json_server(
                kind,
                &Fields {
                    path,
                    at,
                    entry: &entry,
                },
            )
        }
    };
    ours.is_ok_and(|ours| {
        ImportedServer {
            notes: Vec::new(),
            ..ours
        } == ImportedServer {
            notes: Vec::new(),
            ..imported.clone()
        }
    })
}

/// Whether the manifest accepts `name` as an entry name.
pub(crate) fn is_manifest_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some('a'..='z' | '0'..='9'))
        && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_' | '-'))
}

/// Note a name the manifest would reject, with a suggestion.
fn named(name: &str, mut server: ImportedServer) -> ImportedServer {
    if !is_manifest_name(name) {
        let suggestion = name.to_ascii_lowercase().replace(
            |c: char| !c.is_ascii_alphanumeric() && c != '_' && c != '-',
            "-",
        );
        server.notes.push(format!(
            "`{name}` is not a valid manifest name; rename it, for example to `{}`",
            suggestion.trim_start_matches(['-', '_'])
        ));
    }
    server
}

fn kind_from_name(path: &Path) -> Option<ProviderKind> {
    let name = path.file_name()?.to_str()?;
    let parent = path
        .parent()
        .and_then(Path::file_name)
        .and_then(|p| p.to_str())
        .unwrap_or("");
    Some(match name {
        ".mcp.json" | ".claude.json" => ProviderKind::ClaudeCode,
        "settings.json" if parent == ".claude" => ProviderKind::ClaudeCode,
        "settings.json" => ProviderKind::GeminiCli,
        "opencode.json" => ProviderKind::Opencode,
        _ if name.ends_with(".toml") => ProviderKind::Codex,
        _ => return None,
    })
}

/// Keys only a Gemini CLI entry has.
const GEMINI_ONLY: [&str; 5] = ["httpUrl", "trust", "includeTools", "excludeTools", "cwd"];

fn kind_from_shape(path: &Path, text: &str) -> Result<ProviderKind, NativeError> {
    let lenient = super::jsonc::strip(
        text,
        super::jsonc::Dialect {
            trailing_commas: true,
        },
    );
    // Both parsers are bounded; a file past the bound is an error, not
    // another kind.
    match parse_json_object(path, lenient.as_deref().unwrap_or(text)) {
        Ok(root) => {
            if root.get("mcp").is_some_and(Value::is_object) {
                return Ok(ProviderKind::Opencode);
            }
            if let Some(Value::Object(servers)) = root.get("mcpServers") {
                let gemini = servers.values().any(|e| {
                    e.as_object()
                        .is_some_and(|e| GEMINI_ONLY.iter().any(|k| e.contains_key(*k)))
                });
                return Ok(if gemini {
                    ProviderKind::GeminiCli
                } else {
                    ProviderKind::ClaudeCode
                });
            }
        }
        Err(e @ NativeError::TooManyItems { .. }) => return Err(e),
        Err(_) => match parse_toml(path, text) {
            Ok(doc) if doc.contains_key("mcp_servers") => return Ok(ProviderKind::Codex),
            Err(e @ NativeError::TooManyItems { .. }) => return Err(e),
            _ => {}
        },
    }
    Err(NativeError::UnknownKind { path: path.into() })
}

fn shape(path: &Path, message: String) -> NativeError {
    NativeError::Shape {
        path: path.into(),
        message,
    }
}

fn check_count(path: &Path, n: usize) -> Result<(), NativeError> {
    if n > MAX_IMPORT_SERVERS {
        return Err(shape(
            path,
            format!("declares {n} MCP servers, more than the limit of {MAX_IMPORT_SERVERS}"),
        ));
    }
    Ok(())
}

/// Typed access to one JSON entry, with errors naming the field.
struct Fields<'a> {
    path: &'a Path,
    at: String,
    entry: &'a Map<String, Value>,
}

impl Fields<'_> {
    fn err(&self, key: &str, what: &str) -> NativeError {
        shape(self.path, format!("`{}.{key}` must be {what}", self.at))
    }

    fn str(&self, key: &str) -> Result<Option<&str>, NativeError> {
        match self.entry.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(self.err(key, "a string")),
        }
    }

    fn strings(&self, key: &str) -> Result<Option<Vec<String>>, NativeError> {
        match self.entry.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .map(Some)
                .ok_or_else(|| self.err(key, "an array of strings")),
            Some(_) => Err(self.err(key, "an array of strings")),
        }
    }

    fn map(&self, key: &str) -> Result<BTreeMap<String, String>, NativeError> {
        match self.entry.get(key) {
            None | Some(Value::Null) => Ok(BTreeMap::new()),
            Some(Value::Object(m)) => m
                .iter()
                .map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                .collect::<Option<BTreeMap<_, _>>>()
                .ok_or_else(|| self.err(key, "an object of strings")),
            Some(_) => Err(self.err(key, "an object of strings")),
        }
    }

    fn bool(&self, key: &str) -> Result<Option<bool>, NativeError> {
        match self.entry.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(self.err(key, "true or false")),
        }
    }

    fn millis(&self, key: &str) -> Result<Option<u64>, NativeError> {
        match self.entry.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .filter(|ms| *ms <= MAX_MCP_TIMEOUT_MS)
                .map(Some)
                .ok_or_else(|| {
                    self.err(
                        key,
                        &format!("whole milliseconds up to {MAX_MCP_TIMEOUT_MS}"),
                    )
                }),
        }
    }
}

/// A string from a target file in manifest spelling.
fn m(s: &str, syntax: Syntax) -> String {
    refs::to_manifest(&refs::parse_target(s, syntax))
}

/// A literal string (no references) in manifest spelling.
pub(crate) fn lit(s: &str) -> String {
    refs::to_manifest(&[Segment::Literal(s.to_string())])
}

fn m_map(map: BTreeMap<String, String>, syntax: Syntax) -> BTreeMap<String, String> {
    map.into_iter().map(|(k, v)| (k, m(&v, syntax))).collect()
}

fn stdio(
    command: &str,
    args: Vec<String>,
    env: BTreeMap<String, String>,
    cwd: Option<String>,
    syntax: Syntax,
    notes: &mut Vec<String>,
) -> ImportedTransport {
    if refs::parse_target(command, syntax)
        .iter()
        .any(|s| matches!(s, Segment::Var { .. }))
    {
        notes.push(format!(
            "command `{command}` holds an environment reference, which npc does not expand in `command`"
        ));
    }
    ImportedTransport::Stdio {
        command: command.to_string(),
        args: args.iter().map(|a| m(a, syntax)).collect(),
        env: m_map(env, syntax),
        cwd: cwd.map(|c| m(&c, syntax)),
    }
}

/// Headers in manifest spelling; an `Authorization: Bearer ${VAR}` header
/// becomes `bearer_token_env`.
fn http(url: &str, headers: BTreeMap<String, String>, syntax: Syntax) -> ImportedTransport {
    let mut bearer = None;
    let mut out = BTreeMap::new();
    for (k, v) in headers {
        let segs = refs::parse_target(&v, syntax);
        if bearer.is_none()
            && k.eq_ignore_ascii_case("authorization")
            && let [
                Segment::Literal(p),
                Segment::Var {
                    name,
                    default: None,
                },
            ] = segs.as_slice()
            && p == "Bearer "
        {
            bearer = Some(name.clone());
            continue;
        }
        out.insert(k, refs::to_manifest(&segs));
    }
    ImportedTransport::Http {
        url: m(url, syntax),
        headers: out,
        bearer_token_env: bearer,
    }
}

fn no_transport(f: &Fields<'_>, keys: &str) -> NativeError {
    shape(f.path, format!("`{}` has none of {keys}", f.at))
}

fn claude(f: &Fields<'_>) -> Result<ImportedServer, NativeError> {
    let syntax = Syntax::Claude;
    let mut notes = Vec::new();
    let kind = f.str("type")?;
    let transport = if let Some(command) = f.str("command")? {
        let args = f.strings("args")?.unwrap_or_default();
        stdio(command, args, f.map("env")?, None, syntax, &mut notes)
    } else if let Some(url) = f.str("url")? {
        if kind == Some("sse") {
            notes.push(
                "SSE transport imported as streamable HTTP; check the server supports it".into(),
            );
        }
        http(url, f.map("headers")?, syntax)
    } else {
        return Err(no_transport(f, "`command` or `url`"));
    };
    Ok(ImportedServer {
        tool_timeout_ms: non_default(f.millis("timeout")?, DEFAULT_TOOL_TIMEOUT_MS),
        notes,
        ..ImportedServer::new(transport)
    })
}

/// Normalise a timeout: the manifest default is written as absent.
fn non_default(ms: Option<u64>, default: u64) -> Option<u64> {
    ms.filter(|ms| *ms != default)
}

fn gemini(f: &Fields<'_>) -> Result<ImportedServer, NativeError> {
    let syntax = Syntax::Gemini;
    let mut notes = Vec::new();
    let transport = if let Some(command) = f.str("command")? {
        let args = f.strings("args")?.unwrap_or_default();
        let cwd = f.str("cwd")?.map(str::to_string);
        stdio(command, args, f.map("env")?, cwd, syntax, &mut notes)
    } else if let Some(url) = f.str("httpUrl")? {
        http(url, f.map("headers")?, syntax)
    } else if let Some(url) = f.str("url")? {
        // `type` picks the transport; without one the CLI tries streamable
        // HTTP first.
        match f.str("type")? {
            None | Some("http") => {}
            Some("sse") => notes.push(
                "SSE transport imported as streamable HTTP; check the server supports it".into(),
            ),
            Some(_) => return Err(f.err("type", "`http` or `sse`")),
        }
        http(url, f.map("headers")?, syntax)
    } else {
        return Err(no_transport(f, "`command`, `httpUrl` or `url`"));
    };
    if f.bool("trust")? == Some(true) {
        notes.push(
            "`trust` (skip tool confirmations) has no manifest equivalent and was left out".into(),
        );
    }
    Ok(ImportedServer {
        tool_timeout_ms: non_default(f.millis("timeout")?, DEFAULT_TOOL_TIMEOUT_MS),
        enabled_tools: f.strings("includeTools")?,
        disabled_tools: f.strings("excludeTools")?.unwrap_or_default(),
        notes,
        ..ImportedServer::new(transport)
    })
}

fn opencode(f: &Fields<'_>) -> Result<ImportedServer, NativeError> {
    let syntax = Syntax::Opencode;
    let mut notes = Vec::new();
    let transport = match f.str("type")? {
        Some("local") | None if f.entry.contains_key("command") => {
            let mut command = f.strings("command")?.unwrap_or_default().into_iter();
            let Some(program) = command.next() else {
                return Err(f.err("command", "a non-empty array of strings"));
            };
            let cwd = f.str("cwd")?.map(str::to_string);
            stdio(
                &program,
                command.collect(),
                f.map("environment")?,
                cwd,
                syntax,
                &mut notes,
            )
        }
        Some("remote") | None if f.entry.contains_key("url") => {
            let Some(url) = f.str("url")? else {
                return Err(f.err("url", "a string"));
            };
            http(url, f.map("headers")?, syntax)
        }
        _ => {
            return Err(no_transport(
                f,
                "`type = \"local\"` with `command` or `type = \"remote\"` with `url`",
            ));
        }
    };
    Ok(ImportedServer {
        enabled: f.bool("enabled")?.unwrap_or(true),
        tool_timeout_ms: non_default(f.millis("timeout")?, DEFAULT_TOOL_TIMEOUT_MS),
        notes,
        ..ImportedServer::new(transport)
    })
}

/// Typed access to one Codex table.
struct TomlFields<'a> {
    path: &'a Path,
    at: String,
    entry: &'a dyn toml_edit::TableLike,
}

impl TomlFields<'_> {
    fn err(&self, key: &str, what: &str) -> NativeError {
        shape(self.path, format!("`{}.{key}` must be {what}", self.at))
    }

    fn value(&self, key: &str) -> Option<&toml_edit::Value> {
        self.entry.get(key).and_then(Item::as_value)
    }

    fn present(&self, key: &str) -> bool {
        self.entry.get(key).is_some_and(|i| !i.is_none())
    }

    fn str(&self, key: &str) -> Result<Option<&str>, NativeError> {
        match self.value(key) {
            None if !self.present(key) => Ok(None),
            Some(v) if v.is_str() => Ok(v.as_str()),
            _ => Err(self.err(key, "a string")),
        }
    }

    fn strings(&self, key: &str) -> Result<Option<Vec<String>>, NativeError> {
        match self.value(key) {
            None if !self.present(key) => Ok(None),
            Some(toml_edit::Value::Array(a)) => a
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .map(Some)
                .ok_or_else(|| self.err(key, "an array of strings")),
            _ => Err(self.err(key, "an array of strings")),
        }
    }

    fn map(&self, key: &str) -> Result<BTreeMap<String, String>, NativeError> {
        let Some(item) = self.entry.get(key) else {
            return Ok(BTreeMap::new());
        };
        let table = item
            .as_table_like()
            .ok_or_else(|| self.err(key, "a table of strings"))?;
        table
            .iter()
            .map(|(k, v)| v.as_str().map(|v| (k.to_string(), v.to_string())))
            .collect::<Option<BTreeMap<_, _>>>()
            .ok_or_else(|| self.err(key, "a table of strings"))
    }

    fn seconds(&self, key: &str) -> Result<Option<u64>, NativeError> {
        let secs = match self.value(key) {
            None if !self.present(key) => return Ok(None),
            Some(toml_edit::Value::Integer(i)) => *i.value() as f64,
            Some(toml_edit::Value::Float(f)) => *f.value(),
            _ => return Err(self.err(key, "a number of seconds")),
        };
        let ms = (secs * MS_PER_SEC).round();
        if !(0.0..=MAX_MCP_TIMEOUT_MS as f64).contains(&ms) {
            return Err(self.err(
                key,
                &format!("between 0 and {} seconds", MAX_MCP_TIMEOUT_MS / 1000),
            ));
        }
        Ok(Some(ms as u64))
    }
}

fn import_codex(path: &Path, text: &str) -> Result<Vec<(String, ImportedServer)>, NativeError> {
    let doc = parse_toml(path, text)?;
    let Some(item) = doc.get("mcp_servers") else {
        return Ok(Vec::new());
    };
    let servers = item
        .as_table_like()
        .ok_or_else(|| shape(path, "`mcp_servers` is not a table".into()))?;
    check_count(path, servers.len())?;
    let mut out = Vec::new();
    for (name, item) in servers.iter() {
        let entry = item
            .as_table_like()
            .ok_or_else(|| shape(path, format!("`mcp_servers.{name}` is not a table")))?;
        let f = TomlFields {
            path,
            at: format!("mcp_servers.{name}"),
            entry,
        };
        out.push((name.to_string(), named(name, codex(&f)?)));
    }
    Ok(out)
}

fn codex(f: &TomlFields<'_>) -> Result<ImportedServer, NativeError> {
    let mut notes = Vec::new();
    let transport = if let Some(command) = f.str("command")? {
        let mut env: BTreeMap<String, String> = f
            .map("env")?
            .into_iter()
            .map(|(k, v)| (k, lit(&v)))
            .collect();
        for var in f.strings("env_vars")?.unwrap_or_default() {
            if !refs::is_env_name(&var) {
                return Err(f.err("env_vars", "a list of environment variable names"));
            }
            env.entry(var.clone())
                .or_insert_with(|| format!("${{{var}}}"));
        }
        ImportedTransport::Stdio {
            command: command.to_string(),
            args: f
                .strings("args")?
                .unwrap_or_default()
                .iter()
                .map(|a| lit(a))
                .collect(),
            env,
            cwd: f.str("cwd")?.map(lit),
        }
    } else if let Some(url) = f.str("url")? {
        let mut headers: BTreeMap<String, String> = f
            .map("http_headers")?
            .into_iter()
            .map(|(k, v)| (k, lit(&v)))
            .collect();
        for (k, var) in f.map("env_http_headers")? {
            if !refs::is_env_name(&var) {
                return Err(f.err("env_http_headers", "a table of environment variable names"));
            }
            headers.insert(k, format!("${{{var}}}"));
        }
        let bearer = f.str("bearer_token_env_var")?.map(str::to_string);
        if let Some(var) = &bearer
            && !refs::is_env_name(var)
        {
            return Err(f.err("bearer_token_env_var", "an environment variable name"));
        }
        if f.present("bearer_token") {
            notes.push("inline `bearer_token` left out: put the token in an environment variable and set `bearer_token_env`".into());
        }
        ImportedTransport::Http {
            url: lit(url),
            headers,
            bearer_token_env: bearer,
        }
    } else {
        return Err(shape(
            f.path,
            format!("`{}` has neither `command` nor `url`", f.at),
        ));
    };
    let startup = match f.seconds("startup_timeout_sec")? {
        Some(ms) => Some(ms),
        None => match f
            .value("startup_timeout_ms")
            .and_then(toml_edit::Value::as_integer)
        {
            Some(ms) if (0..=MAX_MCP_TIMEOUT_MS as i64).contains(&ms) => Some(ms as u64),
            Some(_) => return Err(f.err("startup_timeout_ms", "a number of milliseconds")),
            None => None,
        },
    };
    let enabled = match f.value("enabled") {
        None => true,
        Some(v) => v
            .as_bool()
            .ok_or_else(|| f.err("enabled", "true or false"))?,
    };
    Ok(ImportedServer {
        enabled,
        startup_timeout_ms: non_default(startup, DEFAULT_STARTUP_TIMEOUT_MS),
        tool_timeout_ms: non_default(f.seconds("tool_timeout_sec")?, DEFAULT_TOOL_TIMEOUT_MS),
        enabled_tools: f.strings("enabled_tools")?,
        disabled_tools: f.strings("disabled_tools")?.unwrap_or_default(),
        notes,
        ..ImportedServer::new(transport)
    })
}

fn inline(map: &BTreeMap<String, String>) -> toml_edit::Value {
    toml_edit::Value::InlineTable(
        map.iter()
            .map(|(k, v)| (k.as_str(), toml_edit::Value::from(v.as_str())))
            .collect::<InlineTable>(),
    )
}

fn array<'a>(items: impl IntoIterator<Item = &'a String>) -> toml_edit::Value {
    toml_edit::Value::Array(items.into_iter().map(String::as_str).collect::<Array>())
}

/// One server as a `[mcp.servers.NAME]` table body.
fn server_table(s: &ImportedServer) -> Table {
    let mut t = Table::new();
    let mut set = |k: &str, v: toml_edit::Value| {
        t.insert(k, Item::Value(v));
    };
    match &s.transport {
        ImportedTransport::Stdio {
            command,
            args,
            env,
            cwd,
        } => {
            set("command", command.as_str().into());
            if !args.is_empty() {
                set("args", array(args));
            }
            if !env.is_empty() {
                set("env", inline(env));
            }
            if let Some(cwd) = cwd {
                set("cwd", cwd.as_str().into());
            }
        }
        ImportedTransport::Http {
            url,
            headers,
            bearer_token_env,
        } => {
            set("url", url.as_str().into());
            if !headers.is_empty() {
                set("headers", inline(headers));
            }
            if let Some(var) = bearer_token_env {
                set("bearer_token_env", var.as_str().into());
            }
        }
    }
    if !s.enabled {
        set("enabled", false.into());
    }
    if let Some(ms) = s.startup_timeout_ms {
        set("startup_timeout_ms", (ms as i64).into());
    }
    if let Some(ms) = s.tool_timeout_ms {
        set("tool_timeout_ms", (ms as i64).into());
    }
    if let Some(tools) = &s.enabled_tools {
        set("enabled_tools", array(tools));
    }
    if !s.disabled_tools.is_empty() {
        set("disabled_tools", array(&s.disabled_tools));
    }
    t
}

/// The entries as manifest TOML: one `[mcp.servers.NAME]` table each, with
/// import notes as comments above it.
pub fn to_manifest_toml(entries: &[(String, ImportedServer)]) -> String {
    let mut doc = DocumentMut::new();
    insert_servers(doc.as_table_mut(), entries);
    doc.to_string()
}

/// `text` as the body of one TOML comment line: every control character
/// (a newline above all, which would end the comment and turn the rest of
/// the text into live TOML) is written as its escape, so whatever a file
/// contains, a comment stays a comment.
pub fn comment_line(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() && c != '\t' {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

pub(crate) fn implicit_table() -> Item {
    let mut t = Table::new();
    t.set_implicit(true);
    Item::Table(t)
}

fn insert_servers(root: &mut Table, entries: &[(String, ImportedServer)]) -> Option<()> {
    let mcp = root
        .entry("mcp")
        .or_insert_with(implicit_table)
        .as_table_mut()?;
    let servers = mcp
        .entry("servers")
        .or_insert_with(implicit_table)
        .as_table_mut()?;
    for (name, server) in entries {
        let mut table = server_table(server);
        if !server.notes.is_empty() {
            let comments: String = server
                .notes
                .iter()
                .map(|n| format!("# {}\n", comment_line(n)))
                .collect();
            table.decor_mut().set_prefix(format!("\n{comments}"));
        }
        servers.insert(name, Item::Table(table));
    }
    Some(())
}

/// How [`merge_into_manifest`] treats a name the manifest already declares
/// with a different entry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MergeOptions {
    /// Replace the manifest's entry with the imported one (`--replace`).
    pub replace: bool,
}

/// The merged manifest text and what happened to each imported name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Merged {
    pub text: String,
    /// New to the manifest.
    pub added: Vec<String>,
    /// Already declared with the same entry: left as it is.
    pub unchanged: Vec<String>,
    /// Declared with a different entry and replaced (only with `replace`).
    pub replaced: Vec<String>,
}

/// One `[mcp.servers.NAME]` table as manifest text, for a diff.
fn table_text(name: &str, table: &Table) -> String {
    let mut doc = DocumentMut::new();
    let mut bare = table.clone();
    bare.decor_mut().clear();
    insert_servers_raw(doc.as_table_mut(), name, bare);
    doc.to_string()
}

fn insert_servers_raw(root: &mut Table, name: &str, table: Table) -> Option<()> {
    let mcp = root
        .entry("mcp")
        .or_insert_with(implicit_table)
        .as_table_mut()?;
    let servers = mcp
        .entry("servers")
        .or_insert_with(implicit_table)
        .as_table_mut()?;
    servers.insert(name, Item::Table(table));
    Some(())
}

/// Whether two TOML tables mean the same, whatever their layout.
pub(crate) fn same_table(a: &Table, b: &Table) -> bool {
    let text = |t: &Table| {
        let mut doc = DocumentMut::new();
        for (k, v) in t.iter() {
            doc.insert(k, v.clone());
        }
        doc.to_string().parse::<toml::Table>().ok()
    };
    matches!((text(a), text(b)), (Some(a), Some(b)) if a == b)
}

/// Merge the entries into an existing `npcagent.toml`, keeping its
/// comments and layout. A name the manifest already declares is left
/// alone when its entry is the same — by the manifest's own text, or by
/// `same(name, server)` (see [`same_as_manifest`]) — and replaced with
/// `opts.replace`; otherwise the merge fails with a diff of each.
pub fn merge_into_manifest(
    manifest_text: &str,
    entries: &[(String, ImportedServer)],
    same: impl Fn(&str, &ImportedServer) -> bool,
    opts: MergeOptions,
) -> Result<Merged, NativeError> {
    let path = PathBuf::from(crate::model::MANIFEST_NAMES[0]);
    let mut doc = parse_toml(&path, manifest_text)?;
    let not_table = || shape(&path, "`mcp` and `mcp.servers` must be tables".into());
    let existing: Vec<(String, Table)> = match doc.get("mcp") {
        None => Vec::new(),
        Some(mcp) => match mcp.as_table().ok_or_else(not_table)?.get("servers") {
            None => Vec::new(),
            Some(s) => s
                .as_table()
                .ok_or_else(not_table)?
                .iter()
                .map(|(k, v)| {
                    v.as_table()
                        .map(|t| (k.to_string(), t.clone()))
                        .ok_or_else(not_table)
                })
                .collect::<Result<_, _>>()?,
        },
    };
    let mut merged = Merged {
        text: String::new(),
        added: Vec::new(),
        unchanged: Vec::new(),
        replaced: Vec::new(),
    };
    let mut fresh = Vec::new();
    let mut differing = Vec::new();
    for (name, server) in entries {
        let ours = existing.iter().find(|(n, _)| n == name).map(|(_, t)| t);
        let theirs = server_table(server);
        match ours {
            None => {
                merged.added.push(name.clone());
                fresh.push((name.clone(), server.clone()));
            }
            Some(ours) if same_table(ours, &theirs) || same(name, server) => {
                merged.unchanged.push(name.clone());
            }
            Some(ours) => differing.push((name.clone(), server.clone(), ours.clone())),
        }
    }
    if !differing.is_empty() && !opts.replace {
        let names = differing
            .iter()
            .map(|(n, _, _)| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", ");
        let diff = differing
            .iter()
            .map(|(n, s, ours)| {
                similar::TextDiff::from_lines(
                    &table_text(n, ours),
                    &table_text(n, &server_table(s)),
                )
                .unified_diff()
                .context_radius(super::DIFF_CONTEXT_LINES)
                .header("manifest", "imported")
                .to_string()
            })
            .collect::<String>();
        return Err(NativeError::ImportConflict { names, diff });
    }
    insert_servers(doc.as_table_mut(), &fresh).ok_or_else(not_table)?;
    for (name, server, _) in differing {
        insert_servers(doc.as_table_mut(), &[(name.clone(), server)]).ok_or_else(not_table)?;
        merged.replaced.push(name);
    }
    merged.text = doc.to_string();
    Ok(merged)
}
