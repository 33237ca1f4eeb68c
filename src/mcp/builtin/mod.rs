//! npc's built-in MCP tools, served by the gateway next to every upstream
//! tool. They are registered in a fixed order, by group: [`memory`]
//! (`memory_*` and `board_*`, a per-project SQLite store in the user's data
//! directory), [`fetch`] (`fetch_url`, guarded against non-global
//! destinations), [`search`] (`web_search`, Brave then Exa) and the `npc`
//! group (`npc_status`, `npc_plan`, `npc_events`, read-only), which the
//! runtime implements (`runtime::npc_tools`) and hands to [`Builtins::standard`]. A group whose
//! dependency is missing (no data directory, no store) still lists its
//! tools; calling one returns an `isError` result saying what is missing.
//!
//! Built-in names are plain `snake_case` words without
//! [`super::NAMESPACE_SEPARATOR`], so they never collide with an upstream
//! tool listed as `server__tool`; with `mcp.prefix = "on_conflict"` an
//! upstream tool of a built-in's name is the one prefixed ([`super::expose`]). A built-in call travels
//! the same [`super::CallPath`] as an upstream one (stages, then an
//! `mcp.tool_call` event whose `server` is [`BUILTIN_SERVER`]).

pub mod fetch;
pub mod memory;
pub mod search;

use std::collections::HashMap;
use std::sync::Arc;

use rmcp::model::{CallToolResult, ContentBlock, JsonObject, Tool, ToolAnnotations};
use serde::de::DeserializeOwned;
use serde_json::Value;

use futures_util::future::BoxFuture;

/// The `server` recorded for a built-in tool's call (no manifest server can
/// shadow a built-in: its name is reserved before any upstream tool's).
pub const BUILTIN_SERVER: &str = "npc";

/// Why a built-in call did not produce a result.
#[derive(Debug, thiserror::Error)]
pub enum BuiltinError {
    /// The group's dependency is missing.
    #[error("the `{group}` tools are unavailable: {reason}")]
    Unavailable { group: &'static str, reason: String },
    #[error("invalid arguments for `{tool}`: {reason}")]
    InvalidArguments { tool: String, reason: String },
    #[error(transparent)]
    Memory(#[from] crate::store::memory::MemoryError),
    #[error(transparent)]
    Fetch(#[from] fetch::FetchError),
    #[error(transparent)]
    Search(#[from] search::SearchError),
    /// A group's own failure (the `npc` tools'), in its own words.
    #[error(transparent)]
    Group(Box<dyn std::error::Error + Send + Sync>),
}

impl BuiltinError {
    /// Whether the call failed because the group cannot work at all (as
    /// opposed to this call's arguments or target).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Self::Unavailable { .. })
            || matches!(self, Self::Search(search::SearchError::NotConfigured))
    }
}

/// One group of built-in tools.
pub trait Group: Send + Sync + std::fmt::Debug {
    /// The group's name (for messages).
    fn name(&self) -> &'static str;
    /// The group's tools, in registration order.
    fn tools(&self) -> Vec<Tool>;
    /// Run `tool` (one of [`Group::tools`]) with `arguments`; the value is
    /// returned to the client as JSON text.
    fn call<'a>(
        &'a self,
        tool: &'a str,
        arguments: JsonObject,
    ) -> BoxFuture<'a, Result<Value, BuiltinError>>;
}

/// The registry of built-in tools the gateway serves.
#[derive(Debug, Default)]
pub struct Builtins {
    groups: Vec<Arc<dyn Group>>,
    tools: Vec<Tool>,
    /// Tool name → index into `groups`.
    index: HashMap<String, usize>,
}

impl Builtins {
    /// A registry of `groups`, in that order. A tool named twice keeps its
    /// first registration.
    pub fn new(groups: Vec<Arc<dyn Group>>) -> Self {
        let mut tools = Vec::new();
        let mut index = HashMap::new();
        for (i, group) in groups.iter().enumerate() {
            for tool in group.tools() {
                debug_assert!(!tool.name.contains(super::NAMESPACE_SEPARATOR));
                if index.insert(tool.name.to_string(), i).is_none() {
                    tools.push(tool);
                } else {
                    tracing::warn!(tool = %tool.name, "mcp: built-in tool registered twice; the first kept");
                }
            }
        }
        Self {
            groups,
            tools,
            index,
        }
    }

    /// The standard groups for the repository at `root`, in their fixed
    /// order: memory, fetch, search, then `npc` (npc's own tools, which the
    /// runtime implements).
    pub fn standard(
        root: &std::path::Path,
        settings: &crate::model::McpBuiltins,
        npc: Arc<dyn Group>,
    ) -> Self {
        Self::new(vec![
            Arc::new(memory::MemoryGroup::for_repo(root)),
            Arc::new(fetch::FetchGroup::new(
                fetch::AddressPolicy::from(settings),
                std::time::Duration::from_millis(settings.fetch_timeout_ms),
            )),
            Arc::new(search::SearchGroup::from_env()),
            npc,
        ])
    }

    /// Every built-in tool, in registration order.
    pub fn tools(&self) -> &[Tool] {
        &self.tools
    }

    /// Whether `name` is a built-in tool.
    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// Run the built-in `name`; its value as a JSON text result.
    pub async fn call(
        &self,
        name: &str,
        arguments: Option<JsonObject>,
    ) -> Result<CallToolResult, BuiltinError> {
        let Some(&group) = self.index.get(name) else {
            return Err(BuiltinError::InvalidArguments {
                tool: name.to_string(),
                reason: "no such built-in tool".into(),
            });
        };
        let value = self.groups[group]
            .call(name, arguments.unwrap_or_default())
            .await?;
        let text = match value {
            Value::String(s) => s,
            other => serde_json::to_string_pretty(&other).unwrap_or_default(),
        };
        Ok(CallToolResult::success(vec![ContentBlock::text(text)]))
    }
}

/// A tool definition whose input schema is `A`'s JSON Schema.
pub(crate) fn tool<A: schemars::JsonSchema>(
    name: &'static str,
    description: &'static str,
    annotations: ToolAnnotations,
) -> Tool {
    let mut schema = match serde_json::to_value(schemars::schema_for!(A)) {
        Ok(Value::Object(o)) => o,
        _ => JsonObject::new(),
    };
    schema.remove("$schema");
    schema.remove("title");
    schema
        .entry("type")
        .or_insert_with(|| Value::String("object".into()));
    Tool::new(name, description, schema).with_annotations(annotations)
}

/// `arguments` as `A`, or an [`BuiltinError::InvalidArguments`] naming the tool.
pub(crate) fn parse<A: DeserializeOwned>(
    tool: &str,
    arguments: JsonObject,
) -> Result<A, BuiltinError> {
    serde_json::from_value(Value::Object(arguments)).map_err(|e| BuiltinError::InvalidArguments {
        tool: tool.to_string(),
        reason: format!("{e}; see the tool's input schema in `tools/list`"),
    })
}

/// `value` if it is at most `max`, else an [`BuiltinError::InvalidArguments`].
pub(crate) fn at_most(
    tool: &str,
    field: &str,
    value: usize,
    max: usize,
) -> Result<usize, BuiltinError> {
    if value > max {
        return Err(BuiltinError::InvalidArguments {
            tool: tool.to_string(),
            reason: format!("`{field}` is {value}; the most allowed is {max}"),
        });
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in for the runtime's `npc` group: its tools' names.
    #[derive(Debug)]
    struct NpcNames;

    impl Group for NpcNames {
        fn name(&self) -> &'static str {
            "npc"
        }
        fn tools(&self) -> Vec<Tool> {
            ["npc_status", "npc_plan", "npc_events"]
                .into_iter()
                .map(|n| tool::<serde_json::Map<String, Value>>(n, "d", ToolAnnotations::new()))
                .collect()
        }
        fn call<'a>(
            &'a self,
            _: &'a str,
            _: JsonObject,
        ) -> BoxFuture<'a, Result<Value, BuiltinError>> {
            Box::pin(async { Ok(Value::Null) })
        }
    }

    fn registry() -> Builtins {
        let dir = tempfile::tempdir().unwrap();
        Builtins::standard(
            dir.path(),
            &crate::model::McpBuiltins::default(),
            Arc::new(NpcNames),
        )
    }

    #[test]
    fn builtins_are_listed_in_a_stable_grouped_order_and_never_namespaced() {
        let names: Vec<String> = registry()
            .tools()
            .iter()
            .map(|t| t.name.to_string())
            .collect();
        assert_eq!(
            names,
            [
                "memory_write",
                "memory_search",
                "memory_recent",
                "memory_delete",
                "board_post",
                "board_read",
                "fetch_url",
                "web_search",
                "npc_status",
                "npc_plan",
                "npc_events",
            ]
        );
        for name in &names {
            assert!(!name.contains(crate::mcp::NAMESPACE_SEPARATOR), "{name}");
            assert!(
                crate::mcp::namespaced("x", name).is_some(),
                "{name} is portable"
            );
        }
    }

    #[test]
    fn every_input_schema_is_an_object_schema() {
        for tool in registry().tools() {
            assert_eq!(tool.input_schema["type"], "object", "{}", tool.name);
        }
    }
}
