//! Rendering one manifest MCP server as one entry of each agent CLI's
//! native configuration: a JSON object for Claude Code, Gemini CLI and
//! OpenCode, a TOML table for Codex. Secrets are written as environment
//! references in the target's spelling (see [`super::refs`]); what a target
//! cannot express is left out and explained in a note.

use serde_json::{Map, Value, json};
use toml_edit::{Array, InlineTable};

use super::refs::{self, Syntax};
use crate::model::{
    DEFAULT_STARTUP_TIMEOUT_MS, DEFAULT_TOOL_TIMEOUT_MS, McpServer, McpTransport, Text,
};

// What each CLI accepts, checked in the schemas inside the installed npm
// packages (claude 2.1.197, gemini 0.61.0, opencode 1.18.33, codex 0.171.0):
// - Claude Code: stdio `{type, command, args, env, timeout}`, http `{type,
//   url, headers, timeout}`; `timeout` is a per-tool-call limit in ms whose
//   default is longer than any the manifest allows. No `cwd`, no switch.
// - Gemini CLI: `{command, args, env, cwd}` or `{type: "http" | "sse", url,
//   headers}` (`httpUrl` is deprecated); `timeout` in ms defaults to 600 s;
//   `includeTools`/`excludeTools`; no per-server switch. The file may hold
//   `//` and `/* */` comments (read with `strip-json-comments`).
// - OpenCode: local `{type: "local", command: [..], cwd, environment,
//   enabled, timeout}`, remote `{type: "remote", url, headers, enabled,
//   timeout}`; `timeout` in ms per request defaults to 5 s.

/// Keys of a Claude Code `.mcp.json` entry that npc writes.
pub const CLAUDE_KEYS: &[&str] = &[
    "type", "command", "args", "env", "url", "headers", "timeout",
];
/// Keys of a Gemini CLI `mcpServers` entry that npc writes.
pub const GEMINI_KEYS: &[&str] = &[
    "type",
    "command",
    "args",
    "env",
    "cwd",
    "url",
    // No longer written, still owned: an entry an older npc wrote loses it.
    "httpUrl",
    "headers",
    "timeout",
    "includeTools",
    "excludeTools",
];
/// Keys of an OpenCode `mcp` entry that npc writes.
pub const OPENCODE_KEYS: &[&str] = &[
    "type",
    "command",
    "cwd",
    "environment",
    "url",
    "headers",
    "enabled",
    "timeout",
];
/// Keys of a Codex `[mcp_servers.NAME]` table that npc writes.
pub const CODEX_KEYS: &[&str] = &[
    "command",
    "args",
    "env",
    "env_vars",
    "cwd",
    "url",
    "bearer_token_env_var",
    "http_headers",
    "env_http_headers",
    "startup_timeout_sec",
    "startup_timeout_ms",
    "tool_timeout_sec",
    "enabled",
    "enabled_tools",
    "disabled_tools",
];

/// The HTTP header a bearer token travels in.
const AUTHORIZATION: &str = "Authorization";
const MS_PER_SEC: u64 = 1000;

/// What to do with one server in one target file.
#[derive(Debug)]
pub enum Rendered<T> {
    /// Write this entry.
    Write(T),
    /// Do not write the server (it is disabled and the target has no
    /// `enabled` switch); a previously written entry is removed.
    Omit,
    /// The server cannot be written without leaking a secret or changing
    /// its meaning; an existing entry is left as it is.
    Skip(String),
}

/// One rendered entry and the notes about it.
#[derive(Debug)]
pub struct Entry<T> {
    pub rendered: Rendered<T>,
    pub notes: Vec<String>,
}

/// A JSON target's flavour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsonKind {
    Claude,
    Gemini,
    Opencode,
}

impl JsonKind {
    fn syntax(self) -> Syntax {
        match self {
            Self::Claude => Syntax::Claude,
            Self::Gemini => Syntax::Gemini,
            Self::Opencode => Syntax::Opencode,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Self::Claude => "claude code",
            Self::Gemini => "gemini cli",
            Self::Opencode => "opencode",
        }
    }
}

/// Collects notes and renders strings for one server in one JSON target.
struct Ctx<'a> {
    name: &'a str,
    kind: JsonKind,
    notes: Vec<String>,
}

impl Ctx<'_> {
    fn note(&mut self, msg: impl std::fmt::Display) {
        self.notes.push(format!("`{}`: {msg}", self.name));
    }

    /// `None` when the text is a secret without a source.
    fn text(&mut self, what: &str, text: &Text) -> Option<String> {
        let r = refs::render(text, self.kind.syntax())?;
        for problem in r.lossy {
            self.note(format!("{what}: {problem} by {}", self.kind.label()));
        }
        Some(r.text)
    }

    fn map(
        &mut self,
        what: &str,
        map: &std::collections::BTreeMap<String, Text>,
    ) -> Map<String, Value> {
        let mut out = Map::new();
        for (k, v) in map {
            match self.text(&format!("{what} `{k}`"), v) {
                Some(s) => {
                    out.insert(k.clone(), Value::String(s));
                }
                None => self.note(format!(
                    "{what} `{k}` is a secret with no `${{VAR}}` spelling and was left out"
                )),
            }
        }
        out
    }
}

/// Render `server` for a JSON target.
pub fn json_entry(kind: JsonKind, name: &str, server: &McpServer) -> Entry<Map<String, Value>> {
    let mut cx = Ctx {
        name,
        kind,
        notes: Vec::new(),
    };
    if !server.enabled && kind != JsonKind::Opencode {
        cx.note(format!(
            "disabled, and {} has no per-server switch: not written",
            kind.label()
        ));
        return Entry {
            rendered: Rendered::Omit,
            notes: cx.notes,
        };
    }
    let mut e = Map::new();
    match &server.transport {
        McpTransport::Stdio(spec) => {
            let mut args = Vec::with_capacity(spec.args.len());
            for (i, a) in spec.args.iter().enumerate() {
                match cx.text(&format!("argument {}", i + 1), a) {
                    Some(s) => args.push(Value::String(s)),
                    None => {
                        return skip(
                            cx,
                            format!("argument {} is a secret with no `${{VAR}}` spelling", i + 1),
                        );
                    }
                }
            }
            let env = cx.map("environment variable", &spec.env);
            let cwd = match &spec.cwd {
                Some(cwd) => match cx.text("`cwd`", cwd) {
                    Some(s) => Some(s),
                    None => return skip(cx, "`cwd` is a secret with no `${VAR}` spelling".into()),
                },
                None => None,
            };
            match kind {
                JsonKind::Claude | JsonKind::Gemini => {
                    if kind == JsonKind::Claude {
                        e.insert("type".into(), json!("stdio"));
                    }
                    e.insert("command".into(), json!(spec.command));
                    if !args.is_empty() {
                        e.insert("args".into(), Value::Array(args));
                    }
                    if !env.is_empty() {
                        e.insert("env".into(), Value::Object(env));
                    }
                    if let Some(cwd) = cwd {
                        if kind == JsonKind::Gemini {
                            e.insert("cwd".into(), json!(cwd));
                        } else {
                            cx.note("`cwd` is not supported by claude code `.mcp.json` and was left out");
                        }
                    }
                }
                JsonKind::Opencode => {
                    e.insert("type".into(), json!("local"));
                    let mut command = vec![json!(spec.command)];
                    command.extend(args);
                    e.insert("command".into(), Value::Array(command));
                    if !env.is_empty() {
                        e.insert("environment".into(), Value::Object(env));
                    }
                    if let Some(cwd) = cwd {
                        e.insert("cwd".into(), json!(cwd));
                    }
                }
            }
        }
        McpTransport::Http {
            url,
            headers,
            bearer_token_env,
        } => {
            let Some(url) = cx.text("`url`", url) else {
                return skip(cx, "`url` is a secret with no `${VAR}` spelling".into());
            };
            let mut headers = cx.map("header", headers);
            if let Some(var) = bearer_token_env {
                let existing: Vec<String> = headers
                    .keys()
                    .filter(|k| k.eq_ignore_ascii_case(AUTHORIZATION))
                    .cloned()
                    .collect();
                if !existing.is_empty() {
                    cx.note("`bearer_token_env` replaces the `Authorization` header");
                }
                for k in existing {
                    headers.shift_remove(&k);
                }
                let reference = match kind {
                    JsonKind::Opencode => format!("Bearer {{env:{var}}}"),
                    JsonKind::Claude | JsonKind::Gemini => format!("Bearer ${{{var}}}"),
                };
                headers.insert(AUTHORIZATION.into(), Value::String(reference));
            }
            match kind {
                JsonKind::Claude => {
                    e.insert("type".into(), json!("http"));
                    e.insert("url".into(), json!(url));
                }
                JsonKind::Gemini => {
                    // `httpUrl` is deprecated in Gemini CLI 0.61: `type`
                    // picks the transport and `url` holds the address.
                    e.insert("type".into(), json!("http"));
                    e.insert("url".into(), json!(url));
                }
                JsonKind::Opencode => {
                    e.insert("type".into(), json!("remote"));
                    e.insert("url".into(), json!(url));
                }
            }
            if !headers.is_empty() {
                e.insert("headers".into(), Value::Object(headers));
            }
        }
    }
    if kind == JsonKind::Gemini {
        // Only when the manifest sets one: the CLI's own default (600 s)
        // is longer than the manifest's.
        if server.tool_timeout_ms != DEFAULT_TOOL_TIMEOUT_MS {
            e.insert("timeout".into(), json!(server.tool_timeout_ms));
        }
        if let Some(tools) = &server.enabled_tools {
            e.insert("includeTools".into(), json!(tools));
        }
        if !server.disabled_tools.is_empty() {
            e.insert("excludeTools".into(), json!(server.disabled_tools));
        }
    } else {
        if server.enabled_tools.is_some() || !server.disabled_tools.is_empty() {
            cx.note(format!(
                "tool filters (`enabled_tools`, `disabled_tools`) cannot be expressed for {} and were left out",
                kind.label()
            ));
        }
        match kind {
            // Claude's own default is longer than any manifest value: only
            // a timeout the manifest sets is written.
            JsonKind::Claude if server.tool_timeout_ms != DEFAULT_TOOL_TIMEOUT_MS => {
                e.insert("timeout".into(), json!(server.tool_timeout_ms));
            }
            // OpenCode's own default (5 s) is shorter than the manifest's:
            // always written, so the manifest's value holds.
            JsonKind::Opencode => {
                if !server.enabled {
                    e.insert("enabled".into(), json!(false));
                }
                e.insert("timeout".into(), json!(server.tool_timeout_ms));
            }
            _ => {}
        }
        if server.startup_timeout_ms != DEFAULT_STARTUP_TIMEOUT_MS {
            cx.note(format!(
                "a startup timeout cannot be expressed for {} and was left out",
                kind.label()
            ));
        }
    }
    Entry {
        rendered: Rendered::Write(e),
        notes: cx.notes,
    }
}

fn skip<T>(mut cx: Ctx<'_>, why: String) -> Entry<T> {
    cx.note(format!(
        "{why}; not written, an existing entry is left as it is"
    ));
    Entry {
        rendered: Rendered::Skip(why),
        notes: cx.notes,
    }
}

/// Seconds for Codex: an integer when whole, else a float.
fn codex_seconds(ms: u64) -> toml_edit::Value {
    if ms.is_multiple_of(MS_PER_SEC) {
        toml_edit::Value::from((ms / MS_PER_SEC) as i64)
    } else {
        toml_edit::Value::from(ms as f64 / MS_PER_SEC as f64)
    }
}

fn string_array<'a>(items: impl IntoIterator<Item = &'a String>) -> toml_edit::Value {
    toml_edit::Value::Array(items.into_iter().map(String::as_str).collect::<Array>())
}

/// Render `server` as a Codex `[mcp_servers.NAME]` table. Codex expands no
/// references: non-secret text is written as its value, and a secret only
/// where Codex reads it from the environment itself (`env_vars`,
/// `env_http_headers`, `bearer_token_env_var`).
pub fn codex_entry(name: &str, server: &McpServer) -> Entry<Vec<(&'static str, toml_edit::Value)>> {
    let mut notes: Vec<String> = Vec::new();
    let note = |notes: &mut Vec<String>, msg: String| notes.push(format!("`{name}`: {msg}"));
    let mut t: Vec<(&'static str, toml_edit::Value)> = Vec::new();
    let skip_server = |mut notes: Vec<String>, why: String| {
        notes.push(format!(
            "`{name}`: {why}; not written, an existing entry is left as it is"
        ));
        Entry {
            rendered: Rendered::Skip(why),
            notes,
        }
    };
    match &server.transport {
        McpTransport::Stdio(spec) => {
            t.push(("command", spec.command.as_str().into()));
            if let Some(i) = spec.args.iter().position(Text::is_secret) {
                return skip_server(
                    notes,
                    format!(
                        "argument {} is a secret and codex cannot read it from the environment",
                        i + 1
                    ),
                );
            }
            if !spec.args.is_empty() {
                t.push(("args", string_array_text(&spec.args)));
            }
            let mut env = InlineTable::new();
            let mut env_vars = Vec::new();
            for (k, v) in &spec.env {
                if !v.is_secret() {
                    env.insert(k, v.expose().into());
                } else if refs::sole_var(v).as_deref() == Some(k.as_str()) {
                    env_vars.push(k.clone());
                } else {
                    note(
                        &mut notes,
                        format!(
                            "environment variable `{k}` is a secret, and codex only passes a variable through under its own name (write it as `\"${{{k}}}\"`); left out"
                        ),
                    );
                }
            }
            if !env.is_empty() {
                t.push(("env", toml_edit::Value::InlineTable(env)));
            }
            if !env_vars.is_empty() {
                t.push(("env_vars", string_array(&env_vars)));
            }
            if let Some(cwd) = &spec.cwd {
                if cwd.is_secret() {
                    return skip_server(
                        notes,
                        "`cwd` is a secret and codex cannot read it from the environment".into(),
                    );
                }
                t.push(("cwd", cwd.expose().into()));
            }
        }
        McpTransport::Http {
            url,
            headers,
            bearer_token_env,
        } => {
            if url.is_secret() {
                return skip_server(
                    notes,
                    "`url` is a secret and codex cannot read it from the environment".into(),
                );
            }
            t.push(("url", url.expose().into()));
            let mut bearer = bearer_token_env.clone();
            let mut literal = InlineTable::new();
            let mut from_env = InlineTable::new();
            for (k, v) in headers {
                if k.eq_ignore_ascii_case(AUTHORIZATION) && bearer_token_env.is_some() {
                    note(
                        &mut notes,
                        "`bearer_token_env` replaces the `Authorization` header".into(),
                    );
                } else if !v.is_secret() {
                    literal.insert(k, v.expose().into());
                } else if let Some(var) = refs::sole_var(v) {
                    from_env.insert(k, var.into());
                } else if let Some(var) = refs::bearer_var(v)
                    && k.eq_ignore_ascii_case(AUTHORIZATION)
                {
                    bearer = Some(var);
                } else {
                    note(
                        &mut notes,
                        format!(
                            "header `{k}` is a secret that codex can only read as a whole variable (`\"${{VAR}}\"` or `\"Bearer ${{VAR}}\"`); left out"
                        ),
                    );
                }
            }
            if let Some(var) = bearer {
                t.push(("bearer_token_env_var", var.into()));
            }
            if !literal.is_empty() {
                t.push(("http_headers", toml_edit::Value::InlineTable(literal)));
            }
            if !from_env.is_empty() {
                t.push(("env_http_headers", toml_edit::Value::InlineTable(from_env)));
            }
        }
    }
    if server.startup_timeout_ms != DEFAULT_STARTUP_TIMEOUT_MS {
        t.push((
            "startup_timeout_sec",
            codex_seconds(server.startup_timeout_ms),
        ));
    }
    if server.tool_timeout_ms != DEFAULT_TOOL_TIMEOUT_MS {
        t.push(("tool_timeout_sec", codex_seconds(server.tool_timeout_ms)));
    }
    if !server.enabled {
        t.push(("enabled", false.into()));
    }
    if let Some(tools) = &server.enabled_tools {
        t.push(("enabled_tools", string_array(tools)));
    }
    if !server.disabled_tools.is_empty() {
        t.push(("disabled_tools", string_array(&server.disabled_tools)));
    }
    Entry {
        rendered: Rendered::Write(t),
        notes,
    }
}

fn string_array_text(items: &[Text]) -> toml_edit::Value {
    toml_edit::Value::Array(items.iter().map(Text::expose).collect::<Array>())
}
