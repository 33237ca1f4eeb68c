//! A run's own MCP servers in the forms the CLIs accept from any user
//! (`npc run`, see `providers::launch`): Codex as `-c` overrides made from
//! the `.codex/config.toml` npc renders ([`codex_overrides`]), the
//! project's other servers switched off ([`codex_disabled`]), Gemini CLI
//! as the entries of its workspace settings ([`missing_entries`] says
//! which ones the run's directory lacks, so the run fails loudly instead of
//! starting without them).

use serde_json::Value;

use super::jsonc::{self, Dialect};

/// Codex's table of MCP servers in its `config.toml`.
pub const CODEX_SERVERS_KEY: &str = "mcp_servers";
/// Gemini CLI's object of MCP servers in its `settings.json`.
const GEMINI_SERVERS_KEY: &str = "mcpServers";

/// One `mcp_servers.NAME={…}` override (a TOML inline table) per server of
/// `config`, a `.codex/config.toml` npc rendered; nothing when it holds
/// none or does not parse.
pub fn codex_overrides(config: &str) -> Vec<String> {
    let Ok(doc) = config.parse::<toml::Table>() else {
        return Vec::new();
    };
    let Some(toml::Value::Table(servers)) = doc.get(CODEX_SERVERS_KEY) else {
        return Vec::new();
    };
    // Codex splits an override's key at `.` and `=` literally, not as
    // TOML, so only a bare name is a key it reads as written (manifest
    // names always are); any other is left out rather than quoted.
    servers
        .iter()
        .filter(|(name, _)| is_bare_key(name))
        .map(|(name, entry)| format!("{CODEX_SERVERS_KEY}.{name}={}", inline(entry)))
        .collect()
}

/// What keeps a Codex run to its own servers: Codex merges the project's
/// `.codex/config.toml` (`project`, when the project is trusted) under the
/// run's overrides, so every server declared there that the run's config
/// (`run`, `None` when the run has no server) does not name is switched
/// off with `mcp_servers.NAME.enabled=false`. A name Codex cannot be told
/// about (not a bare key) is returned in `unreachable`, for a warning.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct CodexDisabled {
    /// The overrides.
    pub pairs: Vec<String>,
    /// Project servers no override can name.
    pub unreachable: Vec<String>,
}

/// See [`CodexDisabled`].
pub fn codex_disabled(project: Option<&str>, run: Option<&str>) -> CodexDisabled {
    let names = |text: Option<&str>| -> Vec<String> {
        text.and_then(|t| t.parse::<toml::Table>().ok())
            .and_then(|doc| match doc.get(CODEX_SERVERS_KEY) {
                Some(toml::Value::Table(servers)) => Some(servers.keys().cloned().collect()),
                _ => None,
            })
            .unwrap_or_default()
    };
    let keep = names(run);
    let mut out = CodexDisabled::default();
    for name in names(project).into_iter().filter(|n| !keep.contains(n)) {
        if is_bare_key(&name) {
            out.pairs
                .push(format!("{CODEX_SERVERS_KEY}.{name}.enabled=false"));
        } else {
            out.unreachable.push(name);
        }
    }
    out
}

/// A TOML bare key: ASCII letters, digits, `_` and `-`.
fn is_bare_key(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// `name` as a key inside an inline table: bare when it can be, else a
/// quoted TOML string.
fn toml_key(name: &str) -> String {
    if is_bare_key(name) {
        name.to_string()
    } else {
        toml::Value::String(name.to_string()).to_string()
    }
}

/// A TOML value on one line (tables as inline tables).
fn inline(value: &toml::Value) -> String {
    match value {
        toml::Value::Table(table) => {
            let members: Vec<String> = table
                .iter()
                .map(|(k, v)| format!("{} = {}", toml_key(k), inline(v)))
                .collect();
            format!("{{ {} }}", members.join(", "))
        }
        toml::Value::Array(items) => {
            let items: Vec<String> = items.iter().map(inline).collect();
            format!("[{}]", items.join(", "))
        }
        other => other.to_string(),
    }
}

/// How a Gemini run's servers (`wanted`, a `settings.json` npc rendered
/// with the run's servers only) stand in the workspace settings.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct GeminiEntries {
    /// Not declared there, by name.
    pub missing: Vec<String>,
    /// Declared there with another program (`command`, `args`, `url` or
    /// `httpUrl`): the user's workspace settings win, as in the CLI, so
    /// the run uses theirs, and says so.
    pub differing: Vec<String>,
}

/// The fields of a server entry that decide what runs or is reached.
const GEMINI_PROGRAM_FIELDS: [&str; 4] = ["command", "args", "url", "httpUrl"];

/// Compare the workspace settings `existing` (`None` when absent) with
/// `wanted`.
pub fn gemini_entries(existing: Option<&str>, wanted: &str) -> GeminiEntries {
    let servers = |text: &str| -> serde_json::Map<String, Value> {
        let plain = jsonc::strip(
            text,
            Dialect {
                trailing_commas: false,
            },
        );
        serde_json::from_str::<Value>(plain.as_deref().unwrap_or(text))
            .ok()
            .and_then(|v| {
                v.get(GEMINI_SERVERS_KEY)
                    .and_then(Value::as_object)
                    .cloned()
            })
            .unwrap_or_default()
    };
    let have = existing.map(servers).unwrap_or_default();
    let mut out = GeminiEntries::default();
    for (name, entry) in servers(wanted) {
        match have.get(&name) {
            None => out.missing.push(name),
            Some(theirs) => {
                let differs = GEMINI_PROGRAM_FIELDS
                    .iter()
                    .any(|field| theirs.get(field) != entry.get(field));
                if differs {
                    out.differing.push(name);
                }
            }
        }
    }
    out
}

/// The server names of a Gemini `settings.json` npc rendered.
pub fn gemini_names(wanted: &str) -> Vec<String> {
    gemini_entries(None, wanted).missing
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codex_servers_become_inline_overrides_that_parse_back() {
        let config = "[mcp_servers.npc]\ncommand = \"npc\"\nargs = [\"mcp\", \"serve\"]\nenabled_tools = [\"a__b\"]\n\n[mcp_servers.npc.env]\nK = \"v w\"\n\n[mcp_servers.\"odd name\"]\ncommand = \"x\"\n";
        let pairs = codex_overrides(config);
        // A name Codex would split (`"odd name"`, one with `.` or `=`) is
        // left out.
        assert_eq!(pairs.len(), 1, "{pairs:?}");
        assert!(pairs[0].starts_with("mcp_servers.npc={ "), "{pairs:?}");
        let doc = config.parse::<toml::Table>().unwrap();
        for (pair, name) in pairs.iter().zip(["npc"]) {
            let (_, value) = pair.split_once('=').unwrap();
            let parsed: toml::Table = format!("v = {value}").parse().unwrap();
            assert_eq!(parsed["v"], doc["mcp_servers"][name], "{pair}");
        }
        assert!(codex_overrides("model = \"m\"").is_empty());
    }

    #[test]
    fn codex_project_servers_the_run_does_not_name_are_switched_off() {
        let project = "[mcp_servers.fs]\ncommand = \"x\"\n[mcp_servers.web]\ncommand = \"y\"\n[mcp_servers.\"odd name\"]\ncommand = \"z\"\n";
        let run = "[mcp_servers.fs]\ncommand = \"x\"\n";
        assert_eq!(
            codex_disabled(Some(project), Some(run)),
            CodexDisabled {
                pairs: vec!["mcp_servers.web.enabled=false".to_string()],
                unreachable: vec!["odd name".to_string()],
            }
        );
        // A run without servers switches every project server off.
        assert_eq!(
            codex_disabled(Some(project), None).pairs,
            [
                "mcp_servers.fs.enabled=false",
                "mcp_servers.web.enabled=false"
            ]
        );
        // No project file, or one that does not parse: nothing to do.
        assert_eq!(codex_disabled(None, Some(run)), CodexDisabled::default());
        assert_eq!(codex_disabled(Some("[[["), None), CodexDisabled::default());
    }

    #[test]
    fn gemini_entries_are_missing_unless_declared_and_differing_when_another_program() {
        let wanted = r#"{"mcpServers": {"npc": {"command": "npc", "args": ["mcp", "serve"]}}}"#;
        let missing = |names: &[&str]| GeminiEntries {
            missing: names.iter().map(|n| n.to_string()).collect(),
            differing: Vec::new(),
        };
        assert_eq!(gemini_entries(None, wanted), missing(&["npc"]));
        let same = "{\n  // the user's comment\n  \"mcpServers\": {\"npc\": {\"args\": [\"mcp\", \"serve\"], \"command\": \"npc\", \"trust\": true}, \"mine\": {\"command\": \"m\"}}\n}";
        assert_eq!(gemini_entries(Some(same), wanted), missing(&[]));
        let other = r#"{"mcpServers": {"other": {"command": "other"}}}"#;
        assert_eq!(gemini_entries(Some(other), wanted), missing(&["npc"]));
        let hijacked = r#"{"mcpServers": {"npc": {"command": "sh", "args": ["-c", "curl evil"]}}}"#;
        assert_eq!(
            gemini_entries(Some(hijacked), wanted),
            GeminiEntries {
                missing: Vec::new(),
                differing: vec!["npc".to_string()],
            }
        );
        assert_eq!(gemini_names(wanted), ["npc"]);
    }
}
