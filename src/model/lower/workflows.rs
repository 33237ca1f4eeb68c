//! Lowering of workflows (`[workflows.*]`): each step's action, templates
//! and settings, and the graph they form — every `needs` and `merge` names
//! a step, there is no cycle, and a template reads only the outputs of the
//! steps that come before it (so a mistake is an error of `npc validate`,
//! never of a half-run workflow).

use super::*;
use crate::model::workflow::{
    MAX_INPUTS, MAX_MATRIX_INSTANCES, MAX_OUTPUT_SCHEMA_BYTES, MAX_STEPS, STEP_ROOTS,
};

/// What a step's template may read of the workflow: the inputs declared,
/// the steps before it, the step's matrix keys.
struct Scope<'a> {
    inputs: &'a BTreeSet<String>,
    before: &'a BTreeSet<String>,
    matrix: &'a BTreeSet<String>,
    steps: &'a BTreeSet<String>,
}

impl Lower<'_> {
    pub(super) fn workflow(
        &mut self,
        name: &Spanned<String>,
        Spanned { value: w, span }: Spanned<RawWorkflow>,
    ) -> Option<Workflow> {
        if w.inputs.len() > MAX_INPUTS {
            self.error(
                &span,
                format!(
                    "workflow `{}` declares more than {MAX_INPUTS} inputs",
                    clip(name)
                ),
                "pass structured values in fewer inputs",
            );
        }
        if w.steps.len() > MAX_STEPS {
            self.error(
                &span,
                format!(
                    "workflow `{}` declares more than {MAX_STEPS} steps",
                    clip(name)
                ),
                "split it into several workflows",
            );
            return None;
        }
        if w.steps.is_empty() {
            self.error(
                &span,
                format!("workflow `{}` has no steps", clip(name)),
                "add `[workflows.NAME.steps.ID]` with a `profile` or a `command`",
            );
            return None;
        }
        let mut inputs = BTreeMap::new();
        for (input, i) in self.entries("workflow inputs", w.inputs) {
            inputs.insert(
                input.value,
                WorkflowInput {
                    description: i.value.description.map(|d| d.value),
                    default: i.value.default.map(|d| d.value),
                },
            );
        }
        let raw_steps = self.entries("workflow steps", w.steps);
        let ids: BTreeSet<String> = raw_steps.iter().map(|(id, _)| id.value.clone()).collect();
        // The graph first: every later check asks what comes before a step.
        let mut needs: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (id, s) in &raw_steps {
            let mut listed = Vec::new();
            for need in s.value.needs.iter().chain(&s.value.merge) {
                if need.value == id.value {
                    self.error(
                        &need.span,
                        format!("step `{}` needs itself", clip(id)),
                        "remove it from `needs`",
                    );
                } else if !ids.contains(&need.value) {
                    let hint = match did_you_mean(need, ids.iter().map(String::as_str)) {
                        Some(best) => format!("did you mean `{best}`?"),
                        None => format!(
                            "the steps of workflow `{}` are {}",
                            clip(name),
                            quoted_list(&ids.iter().map(String::as_str).collect::<Vec<_>>())
                        ),
                    };
                    self.error(
                        &need.span,
                        format!("step `{}` needs unknown step `{}`", clip(id), clip(need)),
                        hint,
                    );
                } else {
                    listed.push(need.value.as_str());
                }
            }
            needs.insert(id.value.as_str(), listed);
        }
        let order = match crate::model::workflow::order(&needs) {
            Ok(order) => order,
            Err(cycle) => {
                let at = raw_steps
                    .iter()
                    .find(|(id, _)| id.value == cycle[0])
                    .map_or(span.clone(), |(id, _)| id.span.clone());
                self.error(
                    &at,
                    format!(
                        "the steps of workflow `{}` form a cycle: {}",
                        clip(name),
                        cycle.join(" → ")
                    ),
                    "remove one of these `needs` so each step comes after the ones it reads",
                );
                return None;
            }
        };
        let mut workflow = Workflow {
            description: w.description.map(|d| d.value),
            inputs,
            steps: BTreeMap::new(),
            order,
        };
        let input_names: BTreeSet<String> = workflow.inputs.keys().cloned().collect();
        let graph: BTreeMap<String, Vec<String>> = needs
            .iter()
            .map(|(k, v)| (k.to_string(), v.iter().map(|n| n.to_string()).collect()))
            .collect();
        let count = raw_steps.len();
        for (id, s) in raw_steps {
            let before = crate::model::workflow::ancestors(&graph, &id);
            let listed = graph[id.as_str()].clone();
            if let Some(step) = self.step(&id, s, &input_names, &before, &ids) {
                workflow.steps.insert(
                    id.value,
                    Step {
                        needs: listed,
                        ..step
                    },
                );
            }
        }
        (workflow.steps.len() == count).then_some(workflow)
    }

    fn step(
        &mut self,
        id: &Spanned<String>,
        Spanned { value: s, span }: Spanned<RawStep>,
        inputs: &BTreeSet<String>,
        before: &BTreeSet<String>,
        steps: &BTreeSet<String>,
    ) -> Option<Step> {
        let gate = s.gate.as_ref().and_then(|g| match g.value.as_str() {
            "approval" => Some(Gate::Approval),
            other => {
                let hint = suggest(other, &["approval"]);
                self.error(&g.span, format!("unknown gate `{}`", clip(other)), hint);
                None
            }
        });
        let action = match (s.profile, s.command) {
            (Some(_), Some(command)) => {
                self.error(
                    &command.span,
                    format!(
                        "step `{}` runs a `profile` or a `command`, not both",
                        clip(id)
                    ),
                    "split it into two steps, or remove one",
                );
                return None;
            }
            (None, None) if s.gate.is_some() => None,
            (None, None) => {
                self.error(
                    &span,
                    format!("step `{}` has neither `profile` nor `command`", clip(id)),
                    "add `profile = \"NAME\"` to run an agent, `command = \"…\"` to run a program, or `gate = \"approval\"` to wait for a person",
                );
                return None;
            }
            (Some(profile), None) => {
                for (what, present) in [("args", !s.args.is_empty()), ("env", !s.env.is_empty())] {
                    if present {
                        self.error(
                            &profile.span,
                            format!("`{what}` applies to `command` steps, not `profile` steps"),
                            format!("remove `{what}`, or pass values through the `prompt`"),
                        );
                    }
                }
                self.reference(&profile, "profile", "profiles");
                Some(Action::RunProfile {
                    profile: profile.value,
                    prompt: None,
                    vars: BTreeMap::new(),
                })
            }
            (None, Some(command)) => {
                if let Some(prompt) = &s.prompt {
                    self.error(
                        &prompt.span,
                        "`prompt` applies to `profile` steps, not `command` steps",
                        "remove `prompt`; a command reads the step's values from `NPC_TRIGGER_PAYLOAD`",
                    );
                }
                Some(Action::RunCommand(
                    self.command_spec(command, s.args, s.env, None),
                ))
            }
        };
        // A matrix expression reads no matrix value (it makes them).
        let no_matrix = BTreeSet::new();
        let outer = Scope {
            inputs,
            before,
            matrix: &no_matrix,
            steps,
        };
        let mut matrix = BTreeMap::new();
        let mut instances: usize = 1;
        for (key, values) in s.matrix {
            if !is_name(&key) {
                self.error(
                    &key.span,
                    format!("invalid matrix key `{}`", clip(&key.value)),
                    "matrix keys are lowercase letters, digits, `_` and `-`",
                );
            }
            let lowered = match values.value {
                RawMatrix::Values(list) => {
                    if list.is_empty() {
                        self.error(
                            &values.span,
                            format!("matrix key `{}` has no values", clip(&key.value)),
                            "give at least one value, or remove the key",
                        );
                    }
                    instances = instances.saturating_mul(list.len().max(1));
                    MatrixValues::Values(list.iter().map(|v| v.to_string()).collect())
                }
                RawMatrix::Expression(source) => {
                    let spanned = Spanned {
                        value: source,
                        span: values.span.clone(),
                    };
                    self.step_template(id, &spanned, "matrix", &outer, Kind::Expression);
                    MatrixValues::Expression(spanned.value)
                }
            };
            matrix.insert(key.value, lowered);
        }
        if instances > MAX_MATRIX_INSTANCES {
            self.error(
                &span,
                format!(
                    "step `{}` fans out to {instances} instances, more than {MAX_MATRIX_INSTANCES}",
                    clip(id)
                ),
                "give the matrix fewer values",
            );
        }
        let scope = Scope {
            inputs,
            before,
            matrix: &matrix.keys().cloned().collect(),
            steps,
        };
        if let Some(prompt) = &s.prompt {
            self.step_template(id, prompt, "prompt", &scope, Kind::Template);
        }
        if let Some(base) = &s.base {
            self.step_template(id, base, "base", &scope, Kind::Template);
        }
        if let Some(when) = &s.when {
            self.step_template(id, when, "when", &scope, Kind::Expression);
        }
        let workspace = self.workspace(super::runs::RawWorkspace {
            mode: s.workspace.as_ref(),
            base_ref: None,
            branch: None,
            setup: &[],
            copy: &[],
            after: &[],
            push: None,
            expect_changes: None,
        });
        if workspace.mode == Some(WorkspaceMode::InPlace) {
            for (field, present) in [("base", s.base.is_some()), ("merge", !s.merge.is_empty())] {
                if present && let Some(w) = &s.workspace {
                    self.error(
                        &w.span,
                        format!("`{field}` needs `workspace = \"worktree\"`"),
                        format!("a step in place has no worktree for `{field}`; remove it, or set `workspace = \"worktree\"`"),
                    );
                }
            }
        }
        let workspace = WorkspaceSpec {
            base_ref: s.base.map(|b| b.value),
            ..workspace
        };
        let retries = self.bounded(
            s.retries.as_ref(),
            "retries",
            0..=u64::from(MAX_RETRIES),
            0,
            "retries",
        ) as u32;
        let timeout_secs = s
            .timeout
            .as_ref()
            .and_then(|d| self.duration(d, "timeout", MAX_RUN_TIMEOUT_SECS));
        let approval_timeout_secs = s
            .approval_timeout
            .as_ref()
            .and_then(|d| self.duration(d, "approval_timeout", MAX_APPROVAL_TIMEOUT_SECS));
        let sandbox = s
            .sandbox
            .as_ref()
            .and_then(|mode| self.sandbox_mode(&mode.span, mode));
        if let (Some(raw), Some(Action::RunCommand(_)) | None) = (&s.sandbox, &action) {
            self.error(
                &raw.span,
                "`sandbox` applies to profile steps",
                "remove `sandbox`, or run the command from a profile's agent",
            );
        }
        let outputs = s.outputs.and_then(|o| self.step_outputs(o.value));
        Some(Step {
            action,
            prompt: s.prompt.map(|p| p.value),
            needs: s.needs.into_iter().map(|n| n.value).collect(),
            matrix,
            when: s.when.map(|w| w.value),
            workspace,
            merge: s.merge.into_iter().map(|n| n.value).collect(),
            gate,
            retries,
            timeout_secs,
            approval_timeout_secs,
            sandbox,
            outputs,
        })
    }

    fn step_outputs(&mut self, o: RawStepOutputs) -> Option<StepOutputs> {
        if !self.relative_path(&o.file.span, &o.file.value, "the output `file`") {
            return None;
        }
        let schema = match o.schema {
            None => None,
            Some(path) => {
                if !self.relative_path(&path.span, &path.value, "the output `schema`") {
                    return None;
                }
                match self.files.read_to_string(Path::new(&path.value)) {
                    Ok(text) if text.len() > MAX_OUTPUT_SCHEMA_BYTES => {
                        self.error(
                            &path.span,
                            format!(
                                "schema file `{}` is larger than {MAX_OUTPUT_SCHEMA_BYTES} bytes",
                                clip(&path.value)
                            ),
                            "keep the schema of a step's output small",
                        );
                        return None;
                    }
                    Ok(text) => {
                        let checked = serde_json::from_str::<serde_json::Value>(&text)
                            .map_err(|e| e.to_string())
                            .and_then(|v| {
                                jsonschema::validator_for(&v)
                                    .map(|_| ())
                                    .map_err(|e| e.to_string())
                            });
                        if let Err(e) = checked {
                            self.error(
                                &path.span,
                                format!(
                                    "schema file `{}` is not a JSON Schema: {}",
                                    clip(&path.value),
                                    clip(&e)
                                ),
                                "fix the schema (JSON, draft 2020-12)",
                            );
                            return None;
                        }
                        Some(text)
                    }
                    Err(e) => {
                        let why = io_reason(&e);
                        self.error(
                            &path.span,
                            format!("schema file `{}` {why}", clip(&path.value)),
                            "create the file, or fix the path (relative to the manifest's directory)",
                        );
                        return None;
                    }
                }
            }
        };
        Some(StepOutputs {
            file: o.file.value,
            schema,
        })
    }

    /// Check one of step `id`'s templates (or expressions): it compiles,
    /// and reads only what the step has when it is reached.
    fn step_template(
        &mut self,
        id: &Spanned<String>,
        t: &Spanned<String>,
        field: &str,
        scope: &Scope<'_>,
        kind: Kind,
    ) {
        let env = self.templates.get_or_insert_with(template::environment);
        let read: Result<BTreeSet<String>, String> = match kind {
            Kind::Template => template::compile(env, "step", t)
                .map(|c| c.undeclared_variables(true).into_iter().collect())
                .map_err(|e| e.to_string()),
            Kind::Expression => template::compile_filter(env, t)
                .map(|c| c.undeclared_variables(true).into_iter().collect())
                .map_err(|e| e.to_string()),
        };
        let read = match read {
            Ok(read) => read,
            Err(e) => {
                let what = match kind {
                    Kind::Template => "template",
                    Kind::Expression => "expression",
                };
                self.error(
                    &t.span,
                    format!("`{field}` of step `{}` is not a valid {what}: {}", clip(id), clip(&e)),
                    "fix it, such as `{{ inputs.goal }}` in a template or `inputs.size == \"big\"` in an expression",
                );
                return;
            }
        };
        for path in read {
            let mut parts = path.split('.');
            let root = parts.next().unwrap_or_default();
            let second = parts.next();
            if !STEP_ROOTS.contains(&root) {
                self.error(
                    &t.span,
                    format!(
                        "`{field}` of step `{}` reads `{}`, which a step does not have",
                        clip(id),
                        clip(&path)
                    ),
                    format!("use {}", quoted_list(&STEP_ROOTS)),
                );
                continue;
            }
            let Some(second) = second else { continue };
            match root {
                "inputs" if !scope.inputs.contains(second) => {
                    let hint = match did_you_mean(second, scope.inputs.iter().map(String::as_str)) {
                        Some(best) => format!("did you mean `{best}`?"),
                        None => "declare it under `inputs` of the workflow".to_string(),
                    };
                    self.error(
                        &t.span,
                        format!("`{field}` of step `{}` reads input `{}`, which the workflow does not declare", clip(id), clip(second)),
                        hint,
                    );
                }
                "steps" if !scope.before.contains(second) => {
                    let (summary, hint) = if scope.steps.contains(second) {
                        (
                            format!(
                                "`{field}` of step `{}` reads the outputs of step `{}` before they exist",
                                clip(id),
                                clip(second)
                            ),
                            format!("add `needs = [\"{second}\"]` to step `{}`", clip(id)),
                        )
                    } else {
                        (
                            format!(
                                "`{field}` of step `{}` reads unknown step `{}`",
                                clip(id),
                                clip(second)
                            ),
                            match did_you_mean(second, scope.steps.iter().map(String::as_str)) {
                                Some(best) => format!("did you mean `{best}`?"),
                                None => "name a step of this workflow".to_string(),
                            },
                        )
                    };
                    self.error(&t.span, summary, hint);
                }
                "matrix" if !scope.matrix.contains(second) => {
                    self.error(
                        &t.span,
                        format!("`{field}` of step `{}` reads `matrix.{}`, which its matrix does not have", clip(id), clip(second)),
                        "add the key to the step's `matrix`, or remove the reference",
                    );
                }
                _ => {}
            }
        }
    }
}

/// What a step's field holds.
#[derive(Clone, Copy)]
enum Kind {
    Template,
    Expression,
}
