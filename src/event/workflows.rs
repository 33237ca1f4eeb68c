//! Events of workflow runs (`workflows`), recorded under the component
//! `workflow.<id>`: a start, each step's moves, the end.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A workflow run started.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct WorkflowStarted {
    /// The workflow run (`wf-…`).
    pub workflow_run: String,
    pub workflow: String,
    /// Its inputs, defaults filled in.
    pub inputs: serde_json::Value,
    /// What started it (`cli`, `api`, a trigger's origin).
    pub origin: String,
}

/// A step (one instance of it) of a workflow run moved: `waiting` on its
/// gate, `running` (its run queued), `succeeded`, `failed`, `skipped`,
/// `cancelled`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct WorkflowStep {
    pub workflow_run: String,
    pub workflow: String,
    pub step: String,
    pub instance: u32,
    pub state: String,
    /// The run carrying it out (or its gate's run, while it waits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// A workflow run ended: `succeeded`, `failed` or `cancelled`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct WorkflowFinished {
    pub workflow_run: String,
    pub workflow: String,
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}
