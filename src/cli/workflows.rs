//! `npc workflows` and `npc workflow run|show|cancel`: the declared
//! workflows and their recent runs; a start and a cancel through the
//! daemon (only the daemon carries runs out); one workflow run as a tree of
//! its steps, each with its state, branch and run. Listings read the store.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::Subcommand;
use serde_json::json;

use super::reconcile::{daemon_socket, tokio};
use super::{Exit, Format};
use crate::runtime::{self, RepoPaths};
use crate::stdx::term::printable;
use crate::surfaces::control::{Client, ControlError, Reply, Request};
use crate::workflows::{StepView, WorkflowView};

/// Workflow runs `npc workflows` lists.
pub const LISTED_RUNS: usize = 20;
/// Most `--input` values one start takes.
pub const MAX_INPUTS_GIVEN: usize = 64;

#[derive(Debug, Subcommand)]
pub enum WorkflowCommand {
    /// Start a workflow through the daemon; prints the workflow run's id
    Run {
        /// Workflow name (a `[workflows.NAME]` entry)
        name: String,
        /// An input of the workflow (repeat for each)
        #[arg(long = "input", value_name = "KEY=VALUE")]
        inputs: Vec<String>,
        /// Manifest file (default: npcagent.toml, else npcagent.json, in the current directory or the nearest one above it in the repository; or `NPC_MANIFEST`)
        #[arg(long, short = 'm')]
        manifest: Option<PathBuf>,
        /// Output: `human` (sentences and columns) or `json` (the exact data, for scripts)
        #[arg(long, value_enum, default_value_t)]
        format: Format,
    },
    /// What a workflow would run, stage by stage, before anything runs
    Plan {
        /// Workflow name (a `[workflows.NAME]` entry)
        name: String,
        /// Manifest file (default: npcagent.toml, else npcagent.json, in the current directory or the nearest one above it in the repository; or `NPC_MANIFEST`)
        #[arg(long, short = 'm')]
        manifest: Option<PathBuf>,
        /// Output: `human` (sentences and columns) or `json` (the exact data, for scripts)
        #[arg(long, value_enum, default_value_t)]
        format: Format,
    },
    /// One workflow run: each step's state, branch and run
    Show {
        /// The workflow run id (`wf-…`)
        id: String,
        /// Manifest file (default: npcagent.toml, else npcagent.json, in the current directory or the nearest one above it in the repository; or `NPC_MANIFEST`)
        #[arg(long, short = 'm')]
        manifest: Option<PathBuf>,
        /// Output: `human` (sentences and columns) or `json` (the exact data, for scripts)
        #[arg(long, value_enum, default_value_t)]
        format: Format,
    },
    /// Cancel a workflow run: its running steps' runs are cancelled, its
    /// gates denied
    Cancel {
        /// The workflow run id (`wf-…`)
        id: String,
        /// Manifest file (default: npcagent.toml, else npcagent.json, in the current directory or the nearest one above it in the repository; or `NPC_MANIFEST`)
        #[arg(long, short = 'm')]
        manifest: Option<PathBuf>,
        /// Output: `human` (sentences and columns) or `json` (the exact data, for scripts)
        #[arg(long, value_enum, default_value_t)]
        format: Format,
    },
}

/// The manifest at `manifest` (an invalid one is reported, see
/// [`super::valid_manifest`]) and its paths.
fn load(manifest: Option<PathBuf>) -> anyhow::Result<Option<(crate::model::Manifest, RepoPaths)>> {
    let path = super::manifest_path(manifest)?;
    let Some(model) = super::valid_manifest(&path, "")? else {
        return Ok(None);
    };
    let paths = RepoPaths::resolve(&path, &model.project.state_dir)?;
    Ok(Some((model, paths)))
}

/// `npc workflows`: the declared workflows and the latest runs.
pub fn list(manifest: Option<PathBuf>, format: Format) -> anyhow::Result<Exit> {
    let Some((model, paths)) = load(manifest)? else {
        return Ok(Exit::Failed);
    };
    let runs = match runtime::open_existing_store(&paths)? {
        Some(store) => store.workflows(false, LISTED_RUNS)?,
        None => Vec::new(),
    };
    match format {
        Format::Json => {
            let declared: Vec<_> = model
                .workflows
                .iter()
                .map(|(name, w)| {
                    json!({
                        "name": name,
                        "description": w.description,
                        "inputs": w.inputs.keys().collect::<Vec<_>>(),
                        "steps": w.order,
                    })
                })
                .collect();
            let recent: Vec<_> = runs
                .iter()
                .map(|r| {
                    json!({
                        "id": r.id,
                        "workflow": r.name,
                        "state": r.state,
                        "created_at_ms": r.created_at_ms,
                        "finished_at_ms": r.finished_at_ms,
                    })
                })
                .collect();
            outln!(
                "{}",
                serde_json::to_string_pretty(&json!({ "workflows": declared, "runs": recent }))?
            )?;
        }
        Format::Human => {
            if model.workflows.is_empty() {
                outln!("no workflows; declare them under `[workflows.NAME]`")?;
            }
            for (name, w) in &model.workflows {
                let about = w.description.as_deref().unwrap_or("");
                outln!(
                    "{}",
                    printable(&format!("{name}  {}  ({about})", w.order.join(" → ")))
                )?;
            }
            if !runs.is_empty() {
                outln!()?;
                outln!("recent runs:")?;
            }
            for r in &runs {
                outln!(
                    "{}",
                    printable(&format!(
                        "  {}  {}  {}  {}",
                        r.id,
                        r.name,
                        r.state,
                        super::human::when(Some(r.created_at_ms))
                    ))
                )?;
            }
        }
    }
    Ok(Exit::Ok)
}

/// `npc workflow run|show|cancel`.
pub fn workflow(command: WorkflowCommand) -> anyhow::Result<Exit> {
    match command {
        WorkflowCommand::Run {
            name,
            inputs,
            manifest,
            format,
        } => {
            let mut given = BTreeMap::new();
            if inputs.len() > MAX_INPUTS_GIVEN {
                errln!("error: more than {MAX_INPUTS_GIVEN} `--input` values");
                return Ok(Exit::Usage);
            }
            for pair in inputs {
                let Some((k, v)) = pair.split_once('=') else {
                    errln!(
                        "error: `--input {pair}` is not KEY=VALUE; write `--input goal=\"a parser\"`"
                    );
                    return Ok(Exit::Usage);
                };
                given.insert(k.to_string(), v.to_string());
            }
            let reply = ask(
                manifest,
                Request::WorkflowRun {
                    name,
                    inputs: given,
                },
            )?;
            match reply {
                Ok(Reply::WorkflowStarted { workflow_run }) => {
                    match format {
                        Format::Json => outln!("{}", json!({ "id": workflow_run }))?,
                        Format::Human => outln!(
                            "started workflow run {workflow_run}; follow it with `npc workflow show {workflow_run}`"
                        )?,
                    }
                    Ok(Exit::Ok)
                }
                Ok(other) => Err(ControlError::unexpected(&other).into()),
                Err(exit) => Ok(exit),
            }
        }
        WorkflowCommand::Cancel {
            id,
            manifest,
            format,
        } => match ask(manifest, Request::WorkflowCancel { id })? {
            Ok(Reply::WorkflowCancelled {
                workflow_run,
                state,
            }) => {
                match format {
                    Format::Json => outln!("{}", json!({ "id": workflow_run, "state": state }))?,
                    Format::Human => outln!("workflow run {workflow_run}: {state}")?,
                }
                Ok(Exit::Ok)
            }
            Ok(other) => Err(ControlError::unexpected(&other).into()),
            Err(exit) => Ok(exit),
        },
        WorkflowCommand::Show {
            id,
            manifest,
            format,
        } => show(manifest, &id, format),
        WorkflowCommand::Plan {
            name,
            manifest,
            format,
        } => plan(manifest, &name, format),
    }
}

/// `npc workflow plan NAME`: the stages and what each step would run,
/// from the manifest alone (a matrix given by an expression is read when
/// its step is reached).
fn plan(manifest: Option<PathBuf>, name: &str, format: Format) -> anyhow::Result<Exit> {
    let Some((model, _)) = load(manifest)? else {
        return Ok(Exit::Failed);
    };
    let Some(w) = model.workflows.get(name) else {
        let known: Vec<&str> = model.workflows.keys().map(String::as_str).collect();
        errln!(
            "error: no workflow `{}`; the manifest declares {}",
            printable(name),
            if known.is_empty() {
                "no workflows".to_string()
            } else {
                known
                    .iter()
                    .map(|k| format!("`{k}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        );
        return Ok(Exit::Failed);
    };
    let stages = w.stages();
    let described: Vec<Vec<serde_json::Value>> = stages
        .iter()
        .map(|stage| {
            stage
                .iter()
                .filter_map(|id| w.steps.get(id).map(|s| step_plan(id, s)))
                .collect()
        })
        .collect();
    match format {
        Format::Json => outln!(
            "{}",
            serde_json::to_string_pretty(&json!({ "workflow": name, "stages": described }))?
        )?,
        Format::Human => {
            outln!(
                "{}",
                printable(&format!(
                    "workflow `{name}`: {} steps in {} stages",
                    w.steps.len(),
                    stages.len()
                ))
            )?;
            for (i, stage) in described.iter().enumerate() {
                for (j, step) in stage.iter().enumerate() {
                    let n = if j == 0 {
                        format!("{}.", i + 1)
                    } else {
                        String::new()
                    };
                    outln!(
                        "{}",
                        printable(&format!(
                            "  {n:<4}{:<16} {}",
                            step["id"].as_str().unwrap_or(""),
                            step["summary"].as_str().unwrap_or("")
                        ))
                    )?;
                }
            }
        }
    }
    Ok(Exit::Ok)
}

/// One step of `npc workflow plan`: what it runs and under which terms.
fn step_plan(id: &str, s: &crate::model::Step) -> serde_json::Value {
    use crate::model::{Action, MatrixValues};
    let runs = match &s.action {
        Some(Action::RunProfile { profile, .. }) => format!("agent `{profile}`"),
        Some(Action::RunCommand(c)) => format!("command `{}`", c.command),
        Some(Action::StartWorkflow { workflow, .. }) => format!("workflow `{workflow}`"),
        None => "a person's approval".to_string(),
    };
    let mut terms = vec![runs];
    if s.gate.is_some() && s.action.is_some() {
        terms.push("after a person's approval".into());
    }
    let mut instances: Option<usize> = Some(1);
    let matrix: serde_json::Map<String, serde_json::Value> = s
        .matrix
        .iter()
        .map(|(k, v)| match v {
            MatrixValues::Values(list) => {
                instances = instances.map(|n| n * list.len());
                let values: Vec<serde_json::Value> = list
                    .iter()
                    .map(|t| serde_json::from_str(t).unwrap_or(json!(t)))
                    .collect();
                terms.push(format!(
                    "{k} in {}",
                    serde_json::Value::Array(values.clone())
                ));
                (k.clone(), serde_json::Value::Array(values))
            }
            MatrixValues::Expression(e) => {
                instances = None;
                terms.push(format!("{k} from `{e}` when reached"));
                (k.clone(), json!({ "expression": e }))
            }
        })
        .collect();
    if let Some(when) = &s.when {
        terms.push(format!("when `{when}`"));
    }
    if let Some(base) = &s.workspace.base_ref {
        terms.push(format!("on `{base}`"));
    }
    if !s.merge.is_empty() {
        terms.push(format!("merging {}", s.merge.join(", ")));
    }
    json!({
        "id": id,
        "runs": s.action.as_ref().map(|_| "run").unwrap_or("gate"),
        "needs": s.needs,
        "matrix": matrix,
        "instances": instances,
        "when": s.when,
        "gate": s.gate.is_some(),
        "base": s.workspace.base_ref,
        "merge": s.merge,
        "summary": terms.join("; "),
    })
}

/// Send `request` to the daemon: its reply, or the exit after saying why
/// there was none.
fn ask(manifest: Option<PathBuf>, request: Request) -> anyhow::Result<Result<Reply, Exit>> {
    let path = super::manifest_path(manifest)?;
    let paths = RepoPaths::resolve(&path, &runtime::state_dir_hint(&path))?;
    let Some((socket, pid)) = daemon_socket(&paths) else {
        errln!(
            "error: no daemon runs for this repository, and only the daemon carries workflows out; start `npc daemon`"
        );
        return Ok(Err(Exit::Failed));
    };
    match tokio()?.block_on(Client::call(&socket, &request)) {
        Ok(reply) => Ok(Ok(reply)),
        Err(ControlError::Refused(error)) => {
            errln!("error: {error}");
            Ok(Err(Exit::Failed))
        }
        Err(e) => {
            Err(anyhow::Error::from(e).context(format!("the daemon (pid {pid}) did not answer")))
        }
    }
}

fn show(manifest: Option<PathBuf>, id: &str, format: Format) -> anyhow::Result<Exit> {
    let Some((model, paths)) = load(manifest)? else {
        return Ok(Exit::Failed);
    };
    let Some(store) = runtime::open_existing_store(&paths)? else {
        errln!(
            "error: no workflow run `{}`; nothing was recorded in this repository yet",
            printable(id)
        );
        return Ok(Exit::Failed);
    };
    let Some(wf) = store.workflow(id)? else {
        errln!(
            "error: no workflow run `{}`; list them with `npc workflows`",
            printable(id)
        );
        return Ok(Exit::Failed);
    };
    let rows = store.workflow_steps(id)?;
    let decl = model.workflows.get(&wf.name);
    let view = WorkflowView::of(wf, rows, decl);
    match format {
        Format::Json => outln!("{}", serde_json::to_string_pretty(&view)?)?,
        Format::Human => {
            let mut head = format!(
                "workflow run {} of `{}`: {} (started {})",
                view.id,
                view.workflow,
                view.state,
                super::human::when(Some(view.created_at_ms))
            );
            if let Some(d) = &view.detail {
                head.push_str(&format!(" — {d}"));
            }
            outln!("{}", printable(&head))?;
            let width = view
                .steps
                .keys()
                .map(|k| k.chars().count())
                .max()
                .unwrap_or(0);
            for (step, s) in &view.steps {
                outln!("{}", printable(&format!("  {step:<width$}  {}", line(s))))?;
                for (i, instance) in s.instances.iter().enumerate() {
                    let matrix = instance
                        .matrix
                        .as_ref()
                        .map(|m| m.to_string())
                        .unwrap_or_default();
                    outln!(
                        "{}",
                        printable(&format!(
                            "  {:width$}    [{i}] {matrix}  {}",
                            "",
                            line(instance)
                        ))
                    )?;
                }
            }
        }
    }
    Ok(Exit::Ok)
}

/// A step's state and what it ran, as one line.
fn line(s: &StepView) -> String {
    let mut out = s.state.clone();
    if s.state == crate::store::workflows::state::WAITING
        && let Some(gate) = &s.gate_run
    {
        out.push_str(&format!("  gate run {gate}: `npc runs approve {gate}`"));
    }
    if let Some(run) = &s.run {
        out.push_str(&format!("  run {run}"));
    }
    if let Some(branch) = &s.branch {
        out.push_str(&format!("  branch {branch}"));
    }
    if s.state == crate::store::workflows::state::PENDING && !s.needs.is_empty() {
        out.push_str(&format!("  needs {}", s.needs.join(", ")));
    }
    if let Some(d) = &s.detail
        && s.state != crate::store::workflows::state::WAITING
    {
        out.push_str(&format!(" — {d}"));
    }
    out
}
