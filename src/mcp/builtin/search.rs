//! `web_search` (stub while the guarded fetch lands).

use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use serde_json::Value;

use super::{BuiltinError, Group};
use crate::mcp::call::BoxFuture;

#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    #[error("not configured")]
    NotConfigured,
}

#[derive(Debug, Clone, Default)]
pub struct AddressPolicy {}

impl From<&crate::model::McpBuiltins> for AddressPolicy {
    fn from(_: &crate::model::McpBuiltins) -> Self {
        Self {}
    }
}

#[derive(Debug)]
pub struct SearchGroup {}

impl SearchGroup {
    pub fn from_env() -> Self {
        Self {}
    }
}

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
#[allow(dead_code)]
struct SearchArgs {
    /// The http or https URL.
    url: String,
}

impl Group for SearchGroup {
    fn name(&self) -> &'static str {
        "search"
    }
    fn tools(&self) -> Vec<Tool> {
        vec![super::tool::<SearchArgs>(
            "web_search",
            "Fetch a URL",
            ToolAnnotations::new().read_only(true),
        )]
    }
    fn call<'a>(&'a self, _: &'a str, _: JsonObject) -> BoxFuture<'a, Result<Value, BuiltinError>> {
        Box::pin(async {
            Err(BuiltinError::Unavailable {
                group: "search",
                reason: "not built yet".into(),
            })
        })
    }
}
