//! What a workflow's steps read and hand on, without any IO: the values a
//! step's templates see (`inputs`, `steps`, `matrix`, `payload`,
//! `workflow`), a step's `when`, `prompt` and `base` rendered against them,
//! its matrix expanded into instances, and the outputs a finished run hands
//! on. Everything rendered is bounded like every template npc renders.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use crate::model::template;
use crate::model::workflow::MAX_MATRIX_INSTANCES;
use crate::model::{MatrixValues, Step, Workflow};
use crate::store::workflows::{StepRow, WorkflowRow, state};

/// The values every step of workflow run `wf` reads: its inputs, what
/// started it, the run itself and the outputs of the steps recorded in
/// `rows`. A step with one instance reads as that instance's outputs
/// (`steps.plan.branch`); a fan-out as `instances` (each one's outputs and
/// `matrix`) and `branches`.
pub fn context(wf: &WorkflowRow, rows: &BTreeMap<String, Vec<StepRow>>) -> Value {
    let mut steps = Map::new();
    for (id, instances) in rows {
        steps.insert(id.clone(), step_value(instances));
    }
    json!({
        "inputs": wf.inputs,
        "payload": wf.payload,
        "workflow": { "id": wf.id, "name": wf.name },
        "steps": steps,
    })
}

/// What `steps.ID` reads of a step's instances.
fn step_value(instances: &[StepRow]) -> Value {
    let one = |row: &StepRow| {
        let mut v = match &row.outputs {
            Some(Value::Object(o)) => o.clone(),
            _ => Map::new(),
        };
        v.insert("state".into(), json!(row.state));
        v.insert("run".into(), json!(row.run_id));
        if let Some(m) = &row.matrix {
            v.insert("matrix".into(), m.clone());
        }
        Value::Object(v)
    };
    if let [only] = instances
        && only.matrix.is_none()
    {
        return one(only);
    }
    let all: Vec<Value> = instances.iter().map(one).collect();
    let branches: Vec<Value> = all
        .iter()
        .filter_map(|i| i.get("branch").cloned())
        .collect();
    json!({
        "state": aggregate(instances.iter().map(|r| r.state.as_str())),
        "instances": all,
        "branches": branches,
    })
}

/// The state of a step as a whole from its instances': `failed` or
/// `cancelled` when one is, `succeeded` when all are, `skipped` when all
/// were, else `running` (or `pending`/`waiting` when all are).
pub fn aggregate<'a>(states: impl Iterator<Item = &'a str> + Clone) -> &'static str {
    let all = |s: &str| states.clone().all(|x| x == s);
    let any = |s: &str| states.clone().any(|x| x == s);
    if states.clone().next().is_none() {
        state::PENDING
    } else if any(state::FAILED) {
        state::FAILED
    } else if any(state::CANCELLED) {
        state::CANCELLED
    } else if all(state::SKIPPED) {
        state::SKIPPED
    } else if states
        .clone()
        .all(|x| x == state::SUCCEEDED || x == state::SKIPPED)
    {
        state::SUCCEEDED
    } else if all(state::PENDING) {
        state::PENDING
    } else if all(state::WAITING) {
        state::WAITING
    } else {
        state::RUNNING
    }
}

/// `ctx` with the instance's matrix values as `matrix`.
pub fn with_matrix(ctx: &Value, matrix: Option<&Value>) -> Value {
    let mut ctx = ctx.clone();
    if let Value::Object(o) = &mut ctx {
        o.insert("matrix".into(), matrix.cloned().unwrap_or(json!({})));
    }
    ctx
}

fn minijinja_ctx(ctx: &Value) -> minijinja::Value {
    crate::render::lenient::lenient(ctx.clone())
}

/// Whether step `step` runs: its `when` (true without one), or why it
/// could not be read.
pub fn when(step: &Step, ctx: &Value) -> Result<bool, String> {
    let Some(source) = &step.when else {
        return Ok(true);
    };
    template::Filter::compile(source)
        .map_err(|e| e.to_string())?
        .matches(minijinja_ctx(ctx))
        .map_err(|e| format!("`when` could not be read: {e}"))
}

/// A step's `prompt` rendered (the profile's own prompt when it has none).
pub fn prompt(step: &Step, ctx: &Value) -> Result<Option<String>, String> {
    let Some(source) = &step.prompt else {
        return Ok(None);
    };
    let env = template::environment();
    let compiled = template::compile(&env, "prompt", source).map_err(|e| e.to_string())?;
    template::render_bounded(&compiled, minijinja_ctx(ctx))
        .map(|r| Some(r.text))
        .map_err(|f| match f.exhausted {
            Some(bound) => bound.describe(),
            None => format!("the `prompt` could not be rendered: {}", f.error),
        })
}

/// A step's `base` rendered: the ref its worktree starts from.
pub fn base(step: &Step, ctx: &Value) -> Result<Option<String>, String> {
    let Some(source) = &step.workspace.base_ref else {
        return Ok(None);
    };
    let base = template::render_line(source, minijinja_ctx(ctx))
        .map_err(|e| format!("the `base` could not be rendered: {e}"))?;
    if base.is_empty() {
        return Err("the `base` rendered empty (does the step it reads have a branch?)".into());
    }
    Ok(Some(base))
}

/// The instances of step `step`: one per combination of its matrix values
/// (an expression evaluated against `ctx` must give a list), each the
/// object of its values; `[None]` without a matrix.
pub fn instances(step: &Step, ctx: &Value) -> Result<Vec<Option<Value>>, String> {
    if step.matrix.is_empty() {
        return Ok(vec![None]);
    }
    let mut combos: Vec<Map<String, Value>> = vec![Map::new()];
    for (key, values) in &step.matrix {
        let list: Vec<Value> = match values {
            MatrixValues::Values(texts) => texts
                .iter()
                .map(|t| serde_json::from_str(t).unwrap_or(Value::String(t.clone())))
                .collect(),
            MatrixValues::Expression(source) => evaluate_list(source, ctx)
                .map_err(|e| format!("matrix `{key}` could not be read: {e}"))?,
        };
        if list.is_empty() {
            return Err(format!("matrix `{key}` gave no values"));
        }
        if combos.len().saturating_mul(list.len()) > MAX_MATRIX_INSTANCES {
            return Err(format!(
                "the matrix gives more than {MAX_MATRIX_INSTANCES} instances"
            ));
        }
        combos = combos
            .into_iter()
            .flat_map(|c| {
                list.iter().map(move |v| {
                    let mut c = c.clone();
                    c.insert(key.clone(), v.clone());
                    c
                })
            })
            .collect();
    }
    Ok(combos.into_iter().map(|c| Some(Value::Object(c))).collect())
}

/// Evaluate expression `source` against `ctx`; it must give a list.
fn evaluate_list(source: &str, ctx: &Value) -> Result<Vec<Value>, String> {
    let env = template::environment();
    let expr = template::compile_filter(&env, source).map_err(|e| e.to_string())?;
    let value = expr.eval(minijinja_ctx(ctx)).map_err(|e| e.to_string())?;
    match serde_json::to_value(&value).map_err(|e| e.to_string())? {
        Value::Array(list) => Ok(list),
        other => Err(format!("it gave {} instead of a list", kind(&other))),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// Whether a workflow's every step has ended, and how the workflow ended
/// then: `failed` when a step failed or was cancelled, else `succeeded`.
pub fn ended(decl: &Workflow, rows: &BTreeMap<String, Vec<StepRow>>) -> Option<&'static str> {
    let mut failed = false;
    for id in decl.steps.keys() {
        let instances = rows.get(id)?;
        if instances.is_empty() || instances.iter().any(|r| !state::is_final(&r.state)) {
            return None;
        }
        failed |= instances
            .iter()
            .any(|r| r.state == state::FAILED || r.state == state::CANCELLED);
    }
    Some(if failed {
        state::FAILED
    } else {
        state::SUCCEEDED
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::WorkspaceSpec;

    fn step() -> Step {
        Step {
            action: None,
            prompt: None,
            needs: vec![],
            matrix: BTreeMap::new(),
            when: None,
            workspace: WorkspaceSpec::default(),
            merge: vec![],
            gate: None,
            retries: 0,
            timeout_secs: None,
            approval_timeout_secs: None,
            sandbox: None,
            outputs: None,
        }
    }

    fn wf() -> WorkflowRow {
        WorkflowRow {
            id: "wf-1".into(),
            name: "ship".into(),
            origin: "cli".into(),
            inputs: json!({"goal": "a parser", "size": "big"}),
            payload: json!({}),
            state: state::RUNNING.into(),
            detail: None,
            created_at_ms: 0,
            updated_at_ms: 0,
            finished_at_ms: None,
        }
    }

    fn done(step: &str, instance: u32, outputs: Value, matrix: Option<Value>) -> StepRow {
        StepRow {
            outputs: Some(outputs),
            matrix,
            ..StepRow::new("wf-1", step, instance, state::SUCCEEDED)
        }
    }

    #[test]
    fn a_step_reads_inputs_and_earlier_outputs() {
        let mut rows = BTreeMap::new();
        rows.insert(
            "plan".to_string(),
            vec![done(
                "plan",
                0,
                json!({"branch": "npc/run-1", "output": {"tasks": ["a", "b"]}}),
                None,
            )],
        );
        let ctx = context(&wf(), &rows);
        let s = Step {
            prompt: Some("Build {{ inputs.goal }} on {{ steps.plan.branch }}".into()),
            workspace: WorkspaceSpec {
                base_ref: Some("{{ steps.plan.branch }}".into()),
                ..WorkspaceSpec::default()
            },
            when: Some("inputs.size == 'big'".into()),
            ..step()
        };
        assert_eq!(
            prompt(&s, &ctx).unwrap().as_deref(),
            Some("Build a parser on npc/run-1")
        );
        assert_eq!(base(&s, &ctx).unwrap().as_deref(), Some("npc/run-1"));
        assert!(when(&s, &ctx).unwrap());
        let never = Step {
            when: Some("inputs.size == 'small'".into()),
            ..step()
        };
        assert!(!when(&never, &ctx).unwrap());
        // A base that reads nothing is refused, not an empty ref.
        let empty = Step {
            workspace: WorkspaceSpec {
                base_ref: Some("{{ steps.nope.branch }}".into()),
                ..WorkspaceSpec::default()
            },
            ..step()
        };
        assert!(base(&empty, &ctx).unwrap_err().contains("rendered empty"));
    }

    #[test]
    fn a_matrix_expands_into_each_combination() {
        let mut rows = BTreeMap::new();
        rows.insert(
            "plan".to_string(),
            vec![done(
                "plan",
                0,
                json!({"output": {"tasks": ["a", "b", "c"], "many": (0..100).collect::<Vec<_>>()}}),
                None,
            )],
        );
        let ctx = context(&wf(), &rows);
        let mut matrix = BTreeMap::new();
        matrix.insert(
            "task".to_string(),
            MatrixValues::Expression("steps.plan.output.tasks".into()),
        );
        matrix.insert(
            "os".to_string(),
            MatrixValues::Values(vec!["\"linux\"".into(), "\"mac\"".into()]),
        );
        let s = Step { matrix, ..step() };
        let got = instances(&s, &ctx).unwrap();
        assert_eq!(got.len(), 6);
        assert_eq!(got[0], Some(json!({"os": "linux", "task": "a"})));
        assert_eq!(got[5], Some(json!({"os": "mac", "task": "c"})));
        // An expression that gives no list fails the step with the reason.
        let mut matrix = BTreeMap::new();
        matrix.insert(
            "task".to_string(),
            MatrixValues::Expression("inputs.goal".into()),
        );
        let bad = Step { matrix, ..step() };
        assert!(
            instances(&bad, &ctx)
                .unwrap_err()
                .contains("a string instead of a list")
        );
        // Too many instances are refused.
        let mut matrix = BTreeMap::new();
        matrix.insert(
            "n".to_string(),
            MatrixValues::Expression("steps.plan.output.many".into()),
        );
        let big = Step { matrix, ..step() };
        let refused = instances(&big, &ctx).unwrap_err();
        assert!(refused.contains("more than"), "{refused}");
    }

    #[test]
    fn a_fan_out_reads_as_its_instances_and_branches() {
        let mut rows = BTreeMap::new();
        rows.insert(
            "impl".to_string(),
            vec![
                done("impl", 0, json!({"branch": "b0"}), Some(json!({"p": 1}))),
                done("impl", 1, json!({"branch": "b1"}), Some(json!({"p": 2}))),
            ],
        );
        let ctx = context(&wf(), &rows);
        assert_eq!(ctx["steps"]["impl"]["branches"], json!(["b0", "b1"]));
        assert_eq!(ctx["steps"]["impl"]["state"], "succeeded");
        assert_eq!(ctx["steps"]["impl"]["instances"][1]["matrix"]["p"], 2);
    }

    #[test]
    fn a_step_as_a_whole_fails_when_one_instance_fails() {
        let s = |v: &[&'static str]| aggregate(v.iter().copied());
        assert_eq!(s(&["succeeded", "failed"]), "failed");
        assert_eq!(s(&["succeeded", "running"]), "running");
        assert_eq!(s(&["succeeded", "skipped"]), "succeeded");
        assert_eq!(s(&["skipped", "skipped"]), "skipped");
        assert_eq!(s(&["waiting"]), "waiting");
        assert_eq!(s(&[]), "pending");
    }
}
