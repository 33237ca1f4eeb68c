//! Worktree runs in the executor: which workspace a run gets, making it
//! (worktree, copied files, `setup`), and after the action the result
//! (committed on the run's branch before `run.finished`, which carries it),
//! the `after` commands and the cleanup (a succeeded run's worktree is
//! removed, another's kept for `[runs] keep_failed`). The git side is
//! [`crate::runs::workspace`]. A fleet's run (its row names its code) gets
//! its worktree from the worker's mirror at the commit its ingress
//! recorded ([`crate::runs::mirror`]); with `push = true` a succeeded run's
//! branch goes to `origin` before `after`. An ingress asks
//! [`Executor::start_ref`] which ref a run it queues starts from.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use super::{Executor, MANUAL_QUEUE, Origin};
use crate::event::{Event, RunCommand, RunPush, RunWorkspace, RunWorktreeKept};
use crate::model::{Action, Manifest, WorkspaceMode, WorkspaceSpec};
use crate::runs::workspace::{self, CommandOutcome, Conclusion, Pushed, Start, Worktree};
use crate::store::queue::{RunRow, state};

/// Most output of one `setup` or `after` command an event carries (its tail).
pub const MAX_EVENT_OUTPUT_CHARS: usize = 4096;
/// How long `after` commands may take together.
pub const AFTER_TIMEOUT: Duration = Duration::from_secs(10 * 60);
/// Why a run's branch was not pushed from a repository without `origin`.
pub const NO_ORIGIN: &str =
    "the repository has no `origin` remote; add one with `git remote add origin URL`";

/// The `ref` template of a workflow step's run whose payload names its
/// rendered base (`model::workflow::StepRunPayload::base`).
const STEP_BASE_TEMPLATE: &str = "{{ trigger.base }}";

/// A worktree run's workspace while it runs.
#[derive(Debug, Clone)]
pub(crate) struct Opened {
    pub worktree: Worktree,
    pub spec: WorkspaceSpec,
    /// The environment its processes get (`NPC_WORKTREE`, `NPC_PORT`, …).
    pub env: BTreeMap<String, String>,
    /// The sandbox of its `setup` and `after` commands.
    pub sandbox: Option<crate::supervisor::SandboxSpec>,
}

impl Executor {
    /// Where run `row` works, and its workspace settings: the trigger's
    /// over its profile's. Explicit settings first (a run by hand's
    /// `workspace`, the trigger's, the profile's); then a profile run the
    /// daemon starts unattended gets `[runs] workspace`, else a worktree
    /// in a git repository; everything else works in place.
    pub(super) fn workspace_of(
        &self,
        queue: &str,
        origin: Option<Origin>,
        payload: &Value,
        action: &Action,
        manifest: &Manifest,
    ) -> (WorkspaceMode, WorkspaceSpec) {
        let trigger = self.inner().triggers.get(queue).cloned();
        let step = manifest.workflow_step(queue).map(|(_, step)| step);
        let spec = match (&trigger, step) {
            (Some(t), _) => manifest.trigger_workspace(t),
            (None, Some(step)) => {
                // A step's base is rendered when the step is reached (it
                // reads earlier steps' results) and travels in its payload.
                let below = match action {
                    Action::RunProfile { profile, .. } => manifest
                        .profiles
                        .get(profile)
                        .map(|p| p.workspace.clone())
                        .unwrap_or_default(),
                    Action::RunCommand(_) | Action::StartWorkflow { .. } => {
                        WorkspaceSpec::default()
                    }
                };
                let base = payload
                    .get("base")
                    .and_then(Value::as_str)
                    .map(|_| STEP_BASE_TEMPLATE.to_string());
                WorkspaceSpec {
                    base_ref: base,
                    ..step.workspace.clone()
                }
                .over(&below)
            }
            (None, None) => match action {
                Action::RunProfile { profile, .. } => manifest
                    .profiles
                    .get(profile)
                    .map(|p| p.workspace.clone())
                    .unwrap_or_default(),
                Action::RunCommand(_) | Action::StartWorkflow { .. } => WorkspaceSpec::default(),
            },
        };
        if matches!(action, Action::StartWorkflow { .. }) {
            // Starting a workflow changes no file: its steps have their own.
            return (WorkspaceMode::InPlace, spec);
        }
        let asked = super::manual_request_of(origin, payload).and_then(|(run, _)| run.workspace);
        let unattended = origin.is_some_and(|o| !o.is_local());
        let git = workspace::is_git_repository(&self.cx.repo);
        let mode = asked
            .or(spec.mode)
            .unwrap_or_else(|| manifest.default_workspace(action, unattended, git));
        (mode, spec)
    }

    /// The ref run `id` (of `queue` and `origin`, with `payload`) would
    /// start its worktree from, rendered as the run will render it; `None`
    /// when it would work in place, or its queue or manifest is not
    /// applied here. What a fleet's ingress resolves to the commit it
    /// records on the run's row.
    pub fn start_ref(
        &self,
        id: &str,
        queue: &str,
        origin: Option<Origin>,
        payload: &Value,
    ) -> Option<Result<String, String>> {
        let manifest = self.manifest()?;
        let action = if queue == MANUAL_QUEUE {
            super::manual_action(super::manual_request_of(origin, payload)?.0)
        } else if let Some((_, step)) = manifest.workflow_step(queue) {
            step.action.clone()?
        } else {
            self.inner().triggers.get(queue)?.action.clone()
        };
        match self.workspace_of(queue, origin, payload, &action, &manifest) {
            (WorkspaceMode::Worktree, spec) => Some(base_ref_of(&spec, payload, id)),
            (WorkspaceMode::InPlace, _) => None,
        }
    }

    /// The commit `base_ref` names in the repository (see
    /// [`workspace::resolve_commit`]), resolved off this executor.
    pub fn resolve_start(
        &self,
        base_ref: String,
    ) -> impl std::future::Future<Output = Result<String, String>> + Send + 'static {
        let (supervisor, repo) = (self.cx.supervisor.clone(), self.cx.repo.clone());
        async move {
            workspace::resolve_commit(&supervisor, &repo, &base_ref)
                .await
                .map_err(|e| e.to_string())
        }
    }

    /// Where the worktrees of runs are made.
    fn worktrees_root(&self, manifest: &Manifest) -> PathBuf {
        workspace::worktrees_root(&self.cx.repo, &self.cx.state_dir, &manifest.runs)
    }

    /// Make run `row`'s worktree, copy its files in and run its `setup`
    /// (each command a `run.setup` event), within `timeout`. On a failure
    /// the reason; a worktree made before it stays (kept like a failed run's).
    pub(super) async fn open_worktree(
        &self,
        row: &RunRow,
        spec: WorkspaceSpec,
        manifest: &Manifest,
        port: Option<u16>,
        timeout: Duration,
        profile: Option<&str>,
    ) -> Result<Opened, String> {
        let base_ref = base_ref_of(&spec, &row.payload, &row.id)?;
        let branch = render_line(
            spec.branch.as_ref(),
            workspace::DEFAULT_BRANCH_TEMPLATE,
            "branch",
            &row.payload,
            &row.id,
        )?;
        let root = self.worktrees_root(manifest);
        let create = |start| {
            Worktree::create(
                &self.cx.supervisor,
                &self.cx.repo,
                &root,
                &row.id,
                &base_ref,
                &branch,
                start,
            )
        };
        // A run that pushes makes a branch `origin` does not have either.
        let fresh = |git: PathBuf| {
            let (supervisor, branch, pushes) = (&self.cx.supervisor, &branch, spec.push);
            async move {
                match pushes {
                    Some(true) => workspace::check_new_on_origin(supervisor, &git, branch)
                        .await
                        .map_err(|e| e.to_string()),
                    _ => Ok(()),
                }
            }
        };
        let worktree = match &row.code {
            // A run queued here, or by an older ingress: the checkout's ref.
            None => {
                fresh(self.cx.repo.clone()).await?;
                create(Start::Checkout).await
            }
            Some(code) => {
                let mirror = self
                    .mirror
                    .get()
                    .ok_or_else(|| crate::runs::mirror::no_mirror(&code.remote).to_string())?;
                let commit = mirror
                    .commit_of(code, &base_ref)
                    .map_err(|e| e.to_string())?;
                let _turn = mirror.hold(commit).await.map_err(|e| e.to_string())?;
                fresh(mirror.dir().to_path_buf()).await?;
                create(Start::Mirror {
                    git: mirror.dir(),
                    commit,
                })
                .await
            }
        }
        .map_err(|e| e.to_string())?;
        let shown = worktree.dir.display().to_string();
        if let Err(e) = self
            .store
            .set_run_worktree(&row.id, Some(shown.clone()))
            .await
        {
            tracing::warn!("cannot record the worktree of run `{}`: {e}", row.id);
        }
        self.record(
            &row.id,
            Event::RunWorkspace(RunWorkspace {
                run_id: row.id.clone(),
                workspace: "worktree".to_string(),
                worktree: shown,
                branch: worktree.branch.clone(),
                base: worktree.base.clone(),
                base_ref: worktree.base_ref.clone(),
                port,
            }),
        )
        .await;
        worktree.copy_in(&spec.copy).map_err(|e| e.to_string())?;
        let mut env = worktree.env();
        env.insert(crate::runs::agent::RUN_ID_ENV.into(), row.id.clone());
        if let Some(port) = port {
            env.insert("NPC_PORT".into(), port.to_string());
        }
        let trigger = manifest
            .triggers
            .contains_key(&row.trigger)
            .then_some(row.trigger.as_str());
        let at = crate::runs::sandbox::Where {
            repo: &self.cx.repo,
            state_dir: &self.cx.state_dir,
            supervisor: &self.cx.supervisor,
        };
        let unattended = !row.origin.known().is_some_and(Origin::is_local);
        let sandbox = match profile {
            Some(profile) => crate::runs::sandbox::for_commands(
                manifest,
                &at,
                (&row.id, Some(profile), trigger),
                unattended,
                &worktree.dir,
            )
            .map_err(|e| e.to_string())?,
            None => None,
        };
        let outcomes = workspace::run_commands(
            &self.cx.supervisor,
            &worktree.dir,
            &spec.setup,
            &env,
            timeout,
            sandbox.as_ref(),
        )
        .await;
        self.record_commands(&row.id, Event::RunSetup, &outcomes)
            .await;
        if let Some(failed) = outcomes.iter().find(|o| !o.ok) {
            return Err(format!(
                "setup command `{}` failed ({}): {}",
                failed.command,
                failed.status,
                tail(&failed.output, MAX_EVENT_OUTPUT_CHARS)
            ));
        }
        Ok(Opened {
            worktree,
            spec,
            env,
            sandbox,
        })
    }

    /// The conclusion of `opened`'s run (see [`Conclusion`]).
    pub(super) fn conclusion(
        &self,
        row: &RunRow,
        opened: &Opened,
        manifest: &Manifest,
    ) -> Conclusion {
        let message = if row.trigger == super::MANUAL_QUEUE {
            format!(
                "npc run {}\n\nNpc-Run: {}\nNpc-Origin: {}",
                row.id, row.id, row.origin
            )
        } else {
            format!(
                "npc run {} of trigger {}\n\nNpc-Run: {}\nNpc-Trigger: {}",
                row.id, row.trigger, row.id, row.trigger
            )
        };
        let author = manifest
            .runs
            .author
            .clone()
            .unwrap_or_else(|| workspace::DEFAULT_AUTHOR.to_string());
        Conclusion::new(
            opened.worktree.clone(),
            message,
            author,
            self.cx.supervisor.clone(),
        )
    }

    /// After the action: the result stored with the run, the `after`
    /// commands (a `run.after` event each), then the worktree removed when
    /// the run succeeded, else kept (`run.worktree_kept`).
    pub(super) async fn close_worktree(
        &self,
        row: &RunRow,
        opened: &Opened,
        conclusion: Option<&Conclusion>,
        end: &'static str,
    ) {
        // None when the commit failed (`run.finished` says why) or the
        // action never started.
        let mut result = conclusion.and_then(Conclusion::taken).and_then(Result::ok);
        if opened.spec.push == Some(true)
            && end == state::SUCCEEDED
            && let Some(result) = result.as_mut().filter(|r| r.head != r.base)
        {
            result.push = Some(self.push(row, opened).await);
        }
        if let Some(result) = &result {
            let value = serde_json::to_value(result).unwrap_or_default();
            if let Err(e) = self.store.set_run_result(&row.id, value).await {
                tracing::warn!("cannot record the result of run `{}`: {e}", row.id);
            }
        }
        if !opened.spec.after.is_empty() {
            let mut env = opened.env.clone();
            env.insert("NPC_RUN_BRANCH".into(), opened.worktree.branch.clone());
            env.insert("NPC_RUN_STATUS".into(), end.to_string());
            if let Some(r) = &result {
                env.insert("NPC_RUN_HEAD".into(), r.head.clone());
            }
            if opened.spec.push == Some(true) {
                let pushed = result.as_ref().and_then(|r| r.push.as_ref());
                let pushed = pushed.is_some_and(|p| p.ok);
                env.insert("NPC_RUN_PUSHED".into(), pushed.to_string());
            }
            let outcomes = workspace::run_commands(
                &self.cx.supervisor,
                &opened.worktree.dir,
                &opened.spec.after,
                &env,
                AFTER_TIMEOUT,
                opened.sandbox.as_ref(),
            )
            .await;
            self.record_commands(&row.id, Event::RunAfter, &outcomes)
                .await;
        }
        if end == state::SUCCEEDED {
            match opened.worktree.remove(&self.cx.supervisor).await {
                Ok(()) => {
                    if let Err(e) = self.store.set_run_worktree(&row.id, None).await {
                        tracing::warn!("cannot record the removed worktree of `{}`: {e}", row.id);
                    }
                }
                Err(e) => tracing::warn!("cannot remove the worktree of run `{}`: {e}", row.id),
            }
        } else {
            self.record(
                &row.id,
                Event::RunWorktreeKept(RunWorktreeKept {
                    run_id: row.id.clone(),
                    worktree: opened.worktree.dir.clone(),
                    branch: opened.worktree.branch.clone(),
                    state: end.to_string(),
                }),
            )
            .await;
        }
    }

    /// Push `opened`'s branch to `origin` (a `run.pushed` or
    /// `run.push_failed` event); the run's outcome stays what it was.
    async fn push(&self, row: &RunRow, opened: &Opened) -> Pushed {
        let supervisor = &self.cx.supervisor;
        let remote = match self.mirror.get() {
            Some(mirror) if opened.worktree.git == mirror.dir() => Some(mirror.origin().clone()),
            _ => crate::runs::remote::origin_of(supervisor, &opened.worktree.git).await,
        };
        let pushed = match remote {
            None => Pushed {
                remote: workspace::ORIGIN.to_string(),
                ok: false,
                error: Some(NO_ORIGIN.to_string()),
            },
            Some(remote) => {
                let error = opened.worktree.push(supervisor).await.err();
                Pushed {
                    ok: error.is_none(),
                    error: error.map(|e| remote.scrub(&e.to_string())),
                    remote: remote.shown,
                }
            }
        };
        let payload = RunPush {
            run_id: row.id.clone(),
            branch: opened.worktree.branch.clone(),
            remote: pushed.remote.clone(),
            error: pushed.error.clone(),
        };
        let event = if pushed.ok {
            Event::RunPushed(payload)
        } else {
            Event::RunPushFailed(payload)
        };
        self.record(&row.id, event).await;
        pushed
    }

    async fn record_commands(
        &self,
        id: &str,
        kind: fn(RunCommand) -> Event,
        outcomes: &[CommandOutcome],
    ) {
        for o in outcomes {
            self.record(
                id,
                kind(RunCommand {
                    run_id: id.to_string(),
                    command: o.command.clone(),
                    ok: o.ok,
                    status: o.status.clone(),
                    output: tail(&o.output, MAX_EVENT_OUTPUT_CHARS),
                }),
            )
            .await;
        }
    }

    /// Remove the kept worktrees past their time or the cap (all of them
    /// with `all`); see [`workspace::clean`].
    pub(super) async fn clean_worktrees(&self, manifest: &Manifest) {
        let policy = workspace::KeepPolicy::of(&manifest.runs, false);
        let root = self.worktrees_root(manifest);
        match workspace::clean(
            &self.store,
            &self.cx.supervisor,
            &self.cx.repo,
            &root,
            policy,
        )
        .await
        {
            Ok(removed) if !removed.is_empty() => {
                tracing::info!("removed {} kept worktrees", removed.len());
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("cannot clean kept worktrees: {e}"),
        }
    }
}

/// The ref a worktree run starts from: its `ref` rendered for run `id`
/// with `payload`, else `HEAD`.
fn base_ref_of(spec: &WorkspaceSpec, payload: &Value, id: &str) -> Result<String, String> {
    render_line(
        spec.base_ref.as_ref(),
        workspace::DEFAULT_REF,
        "ref",
        payload,
        id,
    )
}

/// One of a run's one-line templates (`template`, else `default`) rendered
/// for run `id` with `payload`.
fn render_line(
    template: Option<&String>,
    default: &str,
    what: &str,
    payload: &Value,
    id: &str,
) -> Result<String, String> {
    let source = template.map_or(default, String::as_str);
    crate::model::template::render_line(source, workspace::line_context(payload, Some(id)))
        .map_err(|e| format!("cannot render the run's `{what}`: {e}"))
}

/// The last `max` characters of `text`.
fn tail(text: &str, max: usize) -> String {
    let count = text.chars().count();
    text.chars().skip(count.saturating_sub(max)).collect()
}
