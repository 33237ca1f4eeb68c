//! `fetch_url` (stub while the guarded fetch lands).

use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use serde_json::Value;

use super::{BuiltinError, Group};
use crate::mcp::call::BoxFuture;

#[derive(Debug, thiserror::Error)]
pub enum FetchError {}

#[derive(Debug, Clone, Default)]
pub struct AddressPolicy {}

impl From<&crate::model::McpBuiltins> for AddressPolicy {
    fn from(_: &crate::model::McpBuiltins) -> Self {
        Self {}
    }
}

#[derive(Debug)]
pub struct FetchGroup {}

impl FetchGroup {
    pub fn new(_: AddressPolicy) -> Self {
        Self {}
    }
}

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
#[allow(dead_code)]
struct FetchArgs {
    /// The http or https URL.
    url: String,
}

impl Group for FetchGroup {
    fn name(&self) -> &'static str {
        "fetch"
    }
    fn tools(&self) -> Vec<Tool> {
        vec![super::tool::<FetchArgs>(
            "fetch_url",
            "Fetch a URL",
            ToolAnnotations::new().read_only(true),
        )]
    }
    fn call<'a>(&'a self, _: &'a str, _: JsonObject) -> BoxFuture<'a, Result<Value, BuiltinError>> {
        Box::pin(async {
            Err(BuiltinError::Unavailable {
                group: "fetch",
                reason: "not built yet".into(),
            })
        })
    }
}
