//! The pure facts of workflows (`[workflows.NAME]`, whose validated types
//! are `model::types`' `Workflow` and `Step`): their bounds, the order a
//! graph of steps can run in ([`order`]), which steps one comes after
//! ([`ancestors`]), the queue a step's runs go to ([`step_queue`]) and what
//! such a run carries ([`StepRunPayload`]). Nothing here runs anything: the
//! `workflows` engine turns a declaration and a journal into runs.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

/// Most steps one workflow declares.
pub const MAX_STEPS: usize = 256;
/// Most instances one step's matrix expands to.
pub const MAX_MATRIX_INSTANCES: usize = 64;
/// Most inputs one workflow declares.
pub const MAX_INPUTS: usize = 64;
/// Longest output file a step hands on, in bytes.
pub const MAX_OUTPUT_FILE_BYTES: usize = 1024 * 1024;
/// Largest output schema file read, in bytes.
pub const MAX_OUTPUT_SCHEMA_BYTES: usize = 256 * 1024;

/// The names a step's templates (`prompt`, `base`, `when`, a matrix
/// expression) may read.
pub const STEP_ROOTS: [&str; 5] = ["inputs", "steps", "matrix", "payload", "workflow"];

/// The queue of a step's runs starts with this (`@workflow/NAME/STEP`):
/// not a valid trigger name, so no trigger shares it.
pub const STEP_QUEUE_PREFIX: &str = "@workflow/";

/// The queue of step `step` of workflow `workflow`'s runs.
pub fn step_queue(workflow: &str, step: &str) -> String {
    format!("{STEP_QUEUE_PREFIX}{workflow}/{step}")
}

/// The workflow and step a run queue is of, if it is a step's.
pub fn parse_step_queue(queue: &str) -> Option<(&str, &str)> {
    queue.strip_prefix(STEP_QUEUE_PREFIX)?.split_once('/')
}

/// What a step's run carries as its payload (the row's JSON): where it
/// belongs, what npc rendered for it, and the values its templates read,
/// which a command step reads from `NPC_TRIGGER_PAYLOAD`. The step's
/// action, workspace and limits are the applied manifest's, never the
/// row's: a row names a step, it does not define one.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct StepRunPayload {
    /// The workflow run (`wf-…`).
    pub workflow_run: String,
    pub workflow: String,
    pub step: String,
    /// Which instance of a fan-out (0 without a matrix).
    pub instance: u32,
    /// The step's `prompt`, rendered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// The step's `base`, rendered (with `merge`: the commit the merged
    /// branches made).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    /// `inputs`, `steps`, `matrix`, `payload` and `workflow`.
    pub context: serde_json::Value,
}

/// Every step `id` needs in `graph` (step → the steps it needs), directly
/// or not.
pub fn ancestors(graph: &BTreeMap<String, Vec<String>>, id: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut stack: Vec<&str> = graph
        .get(id)
        .map(|n| n.iter().map(String::as_str).collect())
        .unwrap_or_default();
    while let Some(next) = stack.pop() {
        if seen.insert(next.to_string())
            && let Some(needs) = graph.get(next)
        {
            stack.extend(needs.iter().map(String::as_str));
        }
    }
    seen
}

/// The steps of a graph in an order that runs each after what it needs
/// (ties by name), or one cycle (its steps in order, the first repeated at
/// the end) when there is one. `needs` naming no step are ignored here.
pub fn order<'a>(needs: &BTreeMap<&'a str, Vec<&'a str>>) -> Result<Vec<String>, Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Open,
        Done,
    }
    let mut mark: BTreeMap<&str, Mark> = needs.keys().map(|k| (*k, Mark::New)).collect();
    let mut out = Vec::with_capacity(needs.len());
    for &start in needs.keys() {
        if mark[start] != Mark::New {
            continue;
        }
        // Depth first, without recursion: (step, index of its next need).
        let mut path: Vec<(&str, usize)> = vec![(start, 0)];
        mark.insert(start, Mark::Open);
        while let Some((step, i)) = path.last_mut() {
            let step = *step;
            let deps = &needs[step];
            if *i >= deps.len() {
                mark.insert(step, Mark::Done);
                out.push(step.to_string());
                path.pop();
                continue;
            }
            let next = deps[*i];
            *i += 1;
            match mark.get(next) {
                None | Some(Mark::Done) => {}
                Some(Mark::New) => {
                    mark.insert(next, Mark::Open);
                    path.push((next, 0));
                }
                Some(Mark::Open) => {
                    let from = path.iter().position(|(s, _)| *s == next).unwrap_or(0);
                    let mut cycle: Vec<String> =
                        path[from..].iter().map(|(s, _)| s.to_string()).collect();
                    cycle.push(next.to_string());
                    return Err(cycle);
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph<'a>(edges: &[(&'a str, &[&'a str])]) -> BTreeMap<&'a str, Vec<&'a str>> {
        edges.iter().map(|(k, v)| (*k, v.to_vec())).collect()
    }

    #[test]
    fn a_step_queue_names_its_workflow_and_step() {
        let q = step_queue("ship", "impl");
        assert_eq!(q, "@workflow/ship/impl");
        assert_eq!(parse_step_queue(&q), Some(("ship", "impl")));
        assert_eq!(parse_step_queue("ship"), None);
        assert_eq!(parse_step_queue("@manual"), None);
    }

    #[test]
    fn order_puts_each_step_after_what_it_needs() {
        let g = graph(&[
            ("merge", &["impl", "review"]),
            ("impl", &["plan"]),
            ("review", &["impl"]),
            ("plan", &[]),
        ]);
        assert_eq!(order(&g).unwrap(), ["plan", "impl", "review", "merge"]);
    }

    #[test]
    fn order_names_a_cycle() {
        let g = graph(&[("a", &["b"]), ("b", &["c"]), ("c", &["a"]), ("d", &[])]);
        assert_eq!(order(&g).unwrap_err(), ["a", "b", "c", "a"]);
        let g = graph(&[("a", &["a"])]);
        assert_eq!(order(&g).unwrap_err(), ["a", "a"]);
    }
}
