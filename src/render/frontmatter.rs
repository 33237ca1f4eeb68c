//! The YAML frontmatter of a rendered agent profile, in the
//! cli-agent-orchestrator format: `name`, `description`, `provider`,
//! `model`, `mcpServers`, `allowedTools`, `deniedTools`, `skills`, then the
//! profile's own extra `frontmatter` keys (sorted). Empty lists and absent
//! values are left out. Secret text (MCP env values, headers, args, URLs,
//! the model) is written as its `${VAR}` reference, never its value.
//! Memory-style tags are scrubbed from every string before it is encoded.

use serde_json::{Map, Value};

use super::{RenderError, scrub, text_out, yaml};
use crate::model::{Manifest, McpTransport, Profile, Text};

/// Header carrying an HTTP server's bearer token.
const AUTHORIZATION_HEADER: &str = "Authorization";

/// The frontmatter lines (without the `---` fences) of profile `name`.
pub fn frontmatter(manifest: &Manifest, name: &str, p: &Profile) -> Result<String, RenderError> {
    Ok(yaml::mapping(&frontmatter_map(manifest, name, p)?))
}

/// The frontmatter as a JSON map, keys in output order.
pub fn frontmatter_map(
    manifest: &Manifest,
    name: &str,
    p: &Profile,
) -> Result<Map<String, Value>, RenderError> {
    let provider =
        manifest
            .providers
            .get(&p.provider)
            .ok_or_else(|| RenderError::DanglingReference {
                profile: name.to_string(),
                what: "provider",
                name: p.provider.clone(),
            })?;
    let mut m = Map::new();
    m.insert("name".into(), name.into());
    m.insert("description".into(), p.description.clone().into());
    m.insert("provider".into(), provider.kind.as_str().into());
    if let Some(model) = &p.model {
        m.insert(
            "model".into(),
            text_out(model, || format!("`model` of profile `{name}`"))?.into(),
        );
    }
    let mut servers = Map::new();
    for server in &p.mcp_servers {
        let s = manifest
            .mcp_servers
            .get(server)
            .ok_or_else(|| RenderError::DanglingReference {
                profile: name.to_string(),
                what: "MCP server",
                name: server.clone(),
            })?;
        if s.enabled {
            servers.insert(
                server.clone(),
                mcp_server(server, &s.transport, s.tool_timeout_ms)?,
            );
        }
    }
    if !servers.is_empty() {
        m.insert("mcpServers".into(), Value::Object(servers));
    }
    for (key, list) in [
        ("allowedTools", &p.allowed_tools),
        ("deniedTools", &p.denied_tools),
        ("skills", &p.skills),
    ] {
        if !list.is_empty() {
            m.insert(key.into(), list.clone().into());
        }
    }
    for (key, value) in &p.frontmatter.0 {
        m.insert(key.clone(), value.clone());
    }
    Ok(m.into_iter()
        .map(|(k, v)| (scrub(&k), scrub_value(v)))
        .collect())
}

fn mcp_server(name: &str, transport: &McpTransport, timeout_ms: u64) -> Result<Value, RenderError> {
    let what = |field: &str| format!("`{field}` of MCP server `{name}`");
    let mut m = Map::new();
    match transport {
        McpTransport::Stdio(spec) => {
            m.insert("type".into(), "stdio".into());
            m.insert("command".into(), spec.command.clone().into());
            if !spec.args.is_empty() {
                let args = spec
                    .args
                    .iter()
                    .map(|a| text_out(a, || what("args")).map(Value::from))
                    .collect::<Result<Vec<_>, _>>()?;
                m.insert("args".into(), Value::Array(args));
            }
            if !spec.env.is_empty() {
                m.insert(
                    "env".into(),
                    text_map(&spec.env, |k| what(&format!("env.{k}")))?,
                );
            }
        }
        McpTransport::Http {
            url,
            headers,
            bearer_token_env,
        } => {
            m.insert("type".into(), "http".into());
            m.insert("url".into(), text_out(url, || what("url"))?.into());
            let mut headers = match text_map(headers, |k| what(&format!("headers.{k}")))? {
                Value::Object(h) => h,
                _ => Map::new(),
            };
            if let Some(var) = bearer_token_env {
                headers.insert(
                    AUTHORIZATION_HEADER.into(),
                    format!("Bearer ${{{var}}}").into(),
                );
            }
            if !headers.is_empty() {
                m.insert("headers".into(), Value::Object(headers));
            }
        }
    }
    m.insert("timeout".into(), timeout_ms.into());
    Ok(Value::Object(m))
}

fn text_map(
    map: &std::collections::BTreeMap<String, Text>,
    what: impl Fn(&str) -> String,
) -> Result<Value, RenderError> {
    let mut out = Map::new();
    for (k, v) in map {
        out.insert(k.clone(), text_out(v, || what(k))?.into());
    }
    Ok(Value::Object(out))
}

fn scrub_value(v: Value) -> Value {
    match v {
        Value::String(s) => Value::String(scrub(&s)),
        Value::Array(items) => Value::Array(items.into_iter().map(scrub_value).collect()),
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (scrub(&k), scrub_value(v)))
                .collect(),
        ),
        other => other,
    }
}
