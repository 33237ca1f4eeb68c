//! A package's `mcp.json` (§7.2): the document is checked against the
//! official schema with its entries left open, then each entry on its own
//! against the variant its `type` names (`#/$defs/stdioServer`, …), then
//! the rules a schema cannot say: `command` one bare or `./` token without
//! placeholders, `cwd` inside its root after resolving links, `env` not
//! setting the reserved names, URLs https unless loopback with no userinfo
//! or fragment, header names unique regardless of case. One bad entry is
//! reported and skipped; the others load (§7.2.2).

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use super::{
    MCP_FILE, MCP_SCHEMA_URL, PLUGIN_DATA, PLUGIN_ROOT, Problem, Problems, pointer, schema,
};
use crate::model::diagnostics::clip;
use crate::model::lower::{UrlProblem, UrlShown, check_url};
use crate::repofs::Root;

/// Most server entries read from one `mcp.json`.
pub const MAX_SERVERS: usize = 256;

/// One server entry that passed its checks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Server {
    pub name: String,
    pub transport: Transport,
}

/// The three variants of §7.2; placeholders are not yet expanded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum Transport {
    Stdio {
        command: String,
        args: Vec<String>,
        env: BTreeMap<String, String>,
        cwd: Option<String>,
    },
    StreamableHttp {
        url: String,
        headers: BTreeMap<String, String>,
    },
    Sse {
        url: String,
        headers: BTreeMap<String, String>,
    },
}

impl Transport {
    pub fn kind(&self) -> &'static str {
        match self {
            Transport::Stdio { .. } => "stdio",
            Transport::StreamableHttp { .. } => "streamable-http",
            Transport::Sse { .. } => "sse",
        }
    }
}

/// The valid entries of the package's `mcp.json` (none when it is absent,
/// §6.2), reporting every problem.
pub(crate) fn read(root: &Root, problems: &mut Problems) -> Vec<Server> {
    let Some(doc) = super::read_json(root, MCP_FILE, false, problems) else {
        return Vec::new();
    };
    // §7.2.1: the rules are picked by a recognised `$schema`.
    match doc.get("$schema") {
        Some(Value::String(s)) if s == MCP_SCHEMA_URL => {}
        Some(_) => {
            problems.push(
                Problem::error(
                    MCP_FILE,
                    "/$schema",
                    "is not the Agent Plugins 1.0.0 MCP schema; the file is skipped",
                )
                .hint(format!("set `\"$schema\": \"{MCP_SCHEMA_URL}\"`")),
            );
            return Vec::new();
        }
        None => {}
    }
    let errors = schema::check(schema::Schema::McpDocument, &doc, MCP_FILE, "");
    if !errors.is_empty() {
        problems.extend(errors.into_iter().map(|p| {
            if p.message.contains("`$schema`") {
                p.hint(format!("add `\"$schema\": \"{MCP_SCHEMA_URL}\"`"))
            } else {
                p
            }
        }));
        return Vec::new();
    }
    let Some(entries) = doc.get("mcpServers").and_then(Value::as_object) else {
        return Vec::new();
    };
    if entries.len() > MAX_SERVERS {
        problems.push(Problem::error(
            MCP_FILE,
            "/mcpServers",
            format!(
                "declares {} servers, more than the {MAX_SERVERS} npc reads; the rest are skipped",
                entries.len()
            ),
        ));
    }
    entries
        .iter()
        .take(MAX_SERVERS)
        .filter_map(|(name, entry)| server(root, name, entry, problems))
        .collect()
}

fn server(root: &Root, name: &str, entry: &Value, problems: &mut Problems) -> Option<Server> {
    let base = pointer(&["mcpServers", name]);
    let validator = match entry.get("type").and_then(Value::as_str) {
        Some("stdio") => schema::Schema::McpStdio,
        Some("streamable-http") => schema::Schema::McpStreamableHttp,
        Some("sse") => schema::Schema::McpSse,
        Some(other) => {
            problems.push(
                Problem::error(
                    MCP_FILE,
                    format!("{base}/type"),
                    format!("unknown transport `{}`; the server is skipped", clip(other)),
                )
                .hint("use `stdio`, `streamable-http` or `sse`"),
            );
            return None;
        }
        None => {
            problems.push(
                Problem::error(MCP_FILE, base, "has no `type`; the server is skipped")
                    .hint("every entry declares `\"type\": \"stdio\"`, `\"streamable-http\"` or `\"sse\"`"),
            );
            return None;
        }
    };
    let mut errors = schema::check(validator, entry, MCP_FILE, &base);
    let strings = |k: &str| -> Vec<String> {
        entry
            .get(k)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let map = |k: &str| -> BTreeMap<String, String> {
        entry
            .get(k)
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                    .collect()
            })
            .unwrap_or_default()
    };
    let text = |k: &str| entry.get(k).and_then(Value::as_str).map(str::to_string);
    let transport = match entry["type"].as_str() {
        Some("stdio") => {
            let command = text("command").unwrap_or_default();
            if !command.is_empty()
                && let Err((msg, hint)) = super::check_command(root, &command)
            {
                errors.push(Problem::error(MCP_FILE, format!("{base}/command"), msg).hint(hint));
            }
            let env = map("env");
            for reserved in [PLUGIN_ROOT, PLUGIN_DATA] {
                if env.contains_key(reserved) {
                    errors.retain(|p| p.pointer != format!("{base}/env/{reserved}"));
                    errors.push(
                        Problem::error(MCP_FILE, format!("{base}/env/{reserved}"), format!("`env` may not set `{reserved}`; npc sets it"))
                            .hint("remove the entry; the server gets `PLUGIN_ROOT` and `PLUGIN_DATA` from npc"),
                    );
                }
            }
            let cwd = text("cwd");
            if let Some(c) = &cwd
                && errors.iter().all(|p| p.pointer != format!("{base}/cwd"))
                && let Err(msg) = super::check_cwd(root, c)
            {
                errors.push(
                    Problem::error(MCP_FILE, format!("{base}/cwd"), msg)
                        .hint("keep `cwd` inside the package or its data directory"),
                );
            }
            Transport::Stdio {
                command,
                args: strings("args"),
                env,
                cwd,
            }
        }
        kind => {
            let url = text("url").unwrap_or_default();
            if !url.is_empty()
                && let Err(problem) = check_url(&url)
            {
                let msg = match problem {
                    UrlProblem::Credentials => "credentials (userinfo) in the URL".to_string(),
                    other => other.describe(UrlShown::Value),
                };
                errors.push(
                    Problem::error(MCP_FILE, format!("{base}/url"), msg)
                        .hint("use `https://host/path`, or `http://` on `localhost` or a loopback address only"),
                );
            }
            let headers = map("headers");
            let mut seen: BTreeMap<String, &str> = BTreeMap::new();
            for name in headers.keys() {
                if let Some(first) = seen.insert(name.to_ascii_lowercase(), name) {
                    errors.push(
                        Problem::error(
                            MCP_FILE,
                            format!("{base}{}", pointer(&["headers", name])),
                            format!(
                                "header `{}` repeats `{}`; header names are case-insensitive",
                                clip(name),
                                clip(first)
                            ),
                        )
                        .hint("keep one of them"),
                    );
                }
            }
            if kind == Some("sse") {
                Transport::Sse { url, headers }
            } else {
                Transport::StreamableHttp { url, headers }
            }
        }
    };
    if errors.is_empty() {
        Some(Server {
            name: name.to_string(),
            transport,
        })
    } else {
        problems.extend(errors);
        None
    }
}
