//! The hooks as a stage of the gateway's one call path
//! ([`crate::mcp::CallStage`]): `before_tool` hooks run before every
//! `tools/call` (matched on the namespaced tool name the client called) and
//! may deny it or rewrite its arguments; `after_tool` hooks run after it
//! (not after a denial) and may replace its output or `isError`. A failing
//! hook stops the call (fail closed): before the dispatch it is denied,
//! after it the result is replaced by the failure.

use std::sync::Arc;

use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::Value;

use super::{BeforeTool, HookRunner, ToolCallInfo, ToolResultInfo};
use futures_util::future::BoxFuture;

use crate::mcp::call::{Before, CallStage, ToolCall, error_result};
use crate::model::HookEvent;

/// The [`HookRunner`] wrapped around `tools/call`.
#[derive(Debug, Clone)]
pub struct HookStage {
    runner: Arc<HookRunner>,
}

impl HookStage {
    pub fn new(runner: Arc<HookRunner>) -> Self {
        Self { runner }
    }
}

fn info(call: &ToolCall) -> ToolCallInfo {
    ToolCallInfo {
        id: call.id.clone(),
        name: call.name.clone(),
        arguments: call.arguments.clone().map_or(Value::Null, Value::Object),
    }
}

/// The text of a result's text blocks, joined by newlines (other blocks as JSON).
pub fn result_text(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .map(|c| match c.as_text() {
            Some(t) => t.text.clone(),
            None => serde_json::to_string(c).unwrap_or_default(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

impl CallStage for HookStage {
    fn permits(&self, call: &ToolCall) -> bool {
        self.runner.permits(&call.name)
    }

    fn before<'a>(&'a self, call: &'a mut ToolCall) -> BoxFuture<'a, Before> {
        Box::pin(async move {
            if !self.runner.guards_tool(&call.name) {
                return Before::Continue;
            }
            match self.runner.before_tool(&info(call)).await {
                Ok(BeforeTool::Continue { arguments: None }) => Before::Continue,
                Ok(BeforeTool::Continue {
                    arguments: Some(Value::Object(arguments)),
                }) => {
                    call.arguments = Some(arguments);
                    Before::Continue
                }
                Ok(BeforeTool::Continue { arguments: Some(_) }) => Before::Continue,
                Ok(BeforeTool::Deny { hook, reason }) => Before::Deny {
                    reason: format!("{reason} (hook {hook})"),
                },
                Err(failure) => Before::Deny {
                    reason: failure.to_string(),
                },
            }
        })
    }

    fn after<'a>(
        &'a self,
        call: &'a ToolCall,
        result: &'a mut CallToolResult,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if call.denied || !self.runner.set().has(HookEvent::AfterTool) {
                return;
            }
            let seen = ToolResultInfo {
                call_id: call.id.clone(),
                tool_name: call.name.clone(),
                output: result_text(result),
                is_error: result.is_error == Some(true),
            };
            match self.runner.after_tool(&info(call), &seen).await {
                Ok(changed) => {
                    if let Some(output) = changed.output {
                        result.content = vec![ContentBlock::text(output)];
                        result.structured_content = None;
                    }
                    if let Some(is_error) = changed.is_error {
                        result.is_error = Some(is_error);
                    }
                }
                Err(failure) => *result = error_result(failure.to_string()),
            }
        })
    }
}
