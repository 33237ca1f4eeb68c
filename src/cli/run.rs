//! `npc run PROFILE`: run an agent profile headless with a rendered prompt,
//! stream its events to the terminal (compact, or NDJSON with
//! `--format json`), record them in the event log, and exit with the
//! agent's outcome (0 success, 1 agent failure, 2 usage, 124 timeout,
//! 130 Ctrl-C, 143 SIGTERM). The run is a row of the run queue (origin
//! `cli`) like every run: when a daemon holds the repository, the daemon
//! carries it out and this command follows it from the store (Ctrl-C asks
//! the daemon to cancel it); otherwise it runs in this process
//! (`runs::here`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use tokio::signal::unix::{SignalKind, signal};

use super::output::OutputError;
use super::{Exit, Format};

use crate::providers::AgentEvent;
use crate::runs::follow::{Ended, Follower, Step};
use crate::runs::{self, Origin, Outcome, PromptChoice, RunRequest, view};
use crate::surfaces::control::{Client, ControlError, Reply, Request};
use crate::surfaces::runs::{LocalRun, MAX_DAEMON_PROMPT_BYTES};

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Profile name (a `[profiles.NAME]` entry)
    profile: String,
    /// The task prompt, used as written
    #[arg(long, conflicts_with = "prompt_template")]
    prompt: Option<String>,
    /// Render this prompt (a `[prompts.NAME]` entry) as the task
    #[arg(long, value_name = "NAME")]
    prompt_template: Option<String>,
    /// Set a variable of `--prompt-template` (repeatable)
    #[arg(long = "var", value_name = "NAME=VALUE", value_parser = parse_var)]
    vars: Vec<(String, String)>,
    /// Stop the run after this many seconds (default 1800)
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=u64::from(u32::MAX)))]
    timeout: Option<u64>,
    /// Gemini CLI: after this many seconds without output, send the advisory
    /// idle probe (a newline on its stdin) and record whether it answers
    /// (default 30)
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=u64::from(u32::MAX)))]
    probe_after: Option<u64>,
    /// Where the agent runs (e.g. a worktree); tools keep the repository root
    #[arg(long, value_name = "DIR")]
    cwd: Option<PathBuf>,
    /// `worktree`: the running daemon makes the run a git worktree of its
    /// own and hands the result back as a branch (`npc runs diff ID`);
    /// `in_place` (the default): the repository's checkout
    #[arg(long, value_name = "WHERE", value_parser = ["worktree", "in_place"], conflicts_with = "cwd")]
    workspace: Option<String>,
    /// Output: `human` (sentences and columns) or `json` (the exact data, for scripts)
    #[arg(long, value_enum, default_value_t)]
    format: Format,
    /// Run the profile with another provider (a `[providers.NAME]`) than its own
    #[arg(long, value_name = "NAME")]
    provider: Option<String>,
    /// Continue the agent's conversation of an earlier run (its id, `npc
    /// runs`): over ACP with `session/resume` or `session/load`; headless
    /// with the CLI's own resume flag (Claude Code, OpenCode)
    #[arg(long, value_name = "RUN")]
    resume: Option<String>,
    /// Manifest file (default: npcagent.toml, else npcagent.json, in the current directory or the nearest one above it in the repository; or `NPC_MANIFEST`)
    #[arg(long, short = 'm')]
    manifest: Option<PathBuf>,
}

fn parse_var(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("expected NAME=VALUE, got `{s}`")),
    }
}

pub fn run(args: RunArgs) -> anyhow::Result<Exit> {
    let path = super::manifest_path(args.manifest.clone())?;
    let paths = crate::runtime::RepoPaths::resolve(&path, &crate::runtime::state_dir_hint(&path))?;
    let Some(manifest) = super::valid_manifest(&paths.manifest, "before running")? else {
        return Ok(Exit::Failed);
    };
    let manifest = &manifest;
    let prompt = match (args.prompt, args.prompt_template) {
        (_, None) if !args.vars.is_empty() => {
            errln!("error: {}", runs::RunError::VarsWithoutTemplate);
            return Ok(Exit::Usage);
        }
        (Some(text), _) => PromptChoice::Literal { text },
        (None, Some(name)) => {
            let mut vars = BTreeMap::new();
            for (k, v) in args.vars {
                if vars.insert(k.clone(), v).is_some() {
                    errln!("error: `--var {k}` is given twice; give each variable once");
                    return Ok(Exit::Usage);
                }
            }
            PromptChoice::Template { name, vars }
        }
        (None, None) => PromptChoice::Profile,
    };
    // The working directory is resolved here, so the daemon (another
    // process, another current directory) gets the one meant.
    let cwd = match args.cwd.map(|dir| runs::agent::resolve_cwd(&dir)) {
        None => None,
        Some(Ok(dir)) => Some(dir),
        Some(Err(e)) => {
            errln!("error: {e}");
            return Ok(Exit::Usage);
        }
    };
    let workspace = args
        .workspace
        .as_deref()
        .and_then(crate::model::WorkspaceMode::parse);
    let mut run = prompt.manual_run(&args.profile);
    run.workspace = workspace;
    run.provider = args.provider.clone();
    let resume = match &args.resume {
        None => None,
        Some(id) => match resume_of(&paths, id) {
            Ok(session) => Some(crate::surfaces::runs::Resume {
                session,
                fork: false,
            }),
            Err(e) => {
                errln!("error: {e}");
                return Ok(Exit::Usage);
            }
        },
    };
    let asked = LocalRun {
        run,
        cwd: cwd.clone(),
        timeout_secs: args.timeout,
        probe_after_secs: args.probe_after,
        resume,
        approval: None,
    };
    let request = RunRequest {
        profile: args.profile,
        prompt,
        timeout: args
            .timeout
            .map_or(runs::DEFAULT_RUN_TIMEOUT, Duration::from_secs),
        cwd,
        probe_after: args
            .probe_after
            .map_or(crate::providers::STALE_AFTER, Duration::from_secs),
        trigger: None,
        provider: args.provider,
    };
    let format = args.format;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let result = rt.block_on(async move {
        // Handlers are installed before the prompt renders and the agent
        // starts, so a Ctrl-C at any moment cancels the run instead of
        // killing npc alone.
        let mut interrupt = signal(SignalKind::interrupt())?;
        let mut terminate = signal(SignalKind::terminate())?;
        let cancel = async move {
            tokio::select! {
                _ = interrupt.recv() => nix::sys::signal::Signal::SIGINT as i32,
                _ = terminate.recv() => nix::sys::signal::Signal::SIGTERM as i32,
            }
        };
        tokio::pin!(cancel);
        // A daemon holds the repository: it carries the run out (a prompt
        // too long for its control channel runs here, as without one).
        let fits = asked
            .run
            .prompt
            .as_ref()
            .is_none_or(|p| p.len() <= MAX_DAEMON_PROMPT_BYTES);
        if fits && let Some((socket, _pid)) = paths.running_daemon() {
            match in_daemon(&paths, &socket, asked.clone(), format, &mut cancel).await? {
                InDaemon::Done(exit) => return Ok(exit),
                InDaemon::Gone => {} // gone before it took the run: run here
            }
        }
        if workspace == Some(crate::model::WorkspaceMode::Worktree) {
            errln!("error: `--workspace worktree` needs the daemon, which makes and cleans worktrees; start `npc daemon` in this repository, or run in place");
            return Ok(Exit::Usage);
        }
        // The prompt renders off the executor (see `runs::prepare_blocking`).
        let preparing = runs::prepare_blocking(
            manifest.clone(),
            paths.root.clone(),
            request,
            runs::new_run_id(),
        );
        let prepared = tokio::select! {
            prepared = preparing => prepared,
            signal = &mut cancel => return Ok(cancelled_exit(signal)),
        };
        let mut prepared = match prepared {
            Ok(p) => p,
            Err(e) => {
                errln!("error: {e}");
                return Ok(match e {
                    runs::RunError::Render(_)
                    | runs::RunError::PrepareTimeout { .. }
                    | runs::RunError::PrepareFailed { .. } => Exit::Failed,
                    _ => Exit::Usage,
                });
            }
        };
        prepared.apply_local(asked.resume.as_ref(), None);
        // An ACP run's `ask` parks it when a daemon can answer (`npc runs
        // approve`); else it is denied and recorded.
        if let Some(acp) = &mut prepared.acp {
            let daemon = paths.clone();
            acp.reach = Some(std::sync::Arc::new(move || {
                daemon.running_daemon().map(drop).ok_or_else(|| {
                    "no daemon runs for this repository, so nobody can be asked; start `npc daemon` (then `npc runs approve ID` answers), or change the rule that asks".to_string()
                })
            }));
        }
        for w in &prepared.warnings {
            errln!("warning: {w}");
        }
        if format == Format::Human {
            errln!(
                "run {} · profile `{}` · provider `{}` · in {}",
                prepared.id,
                prepared.profile,
                prepared.provider,
                prepared.spec.cwd.display()
            );
        }
        let (bus, supervisor, _supervisor_events) = super::standalone_recording(&paths, manifest)?;
        // A sandbox the manifest asks for is applied here as in the daemon.
        let at = runs::sandbox::Where {
            repo: &paths.root,
            state_dir: &paths.state_dir,
            supervisor: &supervisor,
        };
        let sandboxed = match runs::sandbox::apply(&mut prepared, manifest, &at, None, false) {
            Ok(sandboxed) => sandboxed,
            Err(e) => {
                errln!("error: {e}");
                return Ok(Exit::Failed);
            }
        };
        // Its hooks' asks park it here; a daemon (or in a fleet, any
        // node's API) answers them.
        let daemon = paths.clone();
        let fleet = manifest.store.url.is_some();
        let reach: crate::hooks::park::Reach = std::sync::Arc::new(move || {
            let here = daemon.running_daemon().map(drop);
            here.or(fleet.then_some(())).ok_or_else(|| {
                "no daemon runs for this repository, so nobody can be asked; start `npc daemon` (then `npc runs approve ID` answers), or change the rule that asks".to_string()
            })
        });
        let _sandbox = sandboxed.map(|p| {
            runs::sandbox::serve(
                p,
                &bus,
                (&prepared.id, &prepared.profile),
                std::sync::Arc::new(manifest.clone()),
                reach,
            )
        });
        let here = runs::here::Here {
            store: bus.store().clone(),
            bus: bus.clone(),
            supervisor: supervisor.clone(),
        };
        // A closed or failing stdout stops the printing, not the run: the
        // agent's work goes on and every event is still recorded. A closed
        // reader is not an error; another write failure fails the command
        // once the run has ended.
        let mut printing: Result<(), OutputError> = Ok(());
        let sink = |e: &AgentEvent| {
            if printing.is_ok() {
                printing = print_event(&prepared.id, e, format);
            }
        };
        let hooks = crate::hooks::HookRunner::new(
            crate::hooks::HookSet::for_repository(&paths.root, manifest),
            supervisor.clone(),
            Some(bus.clone()),
        );
        let result = here
            .run(Origin::Cli, &asked, &prepared, &hooks, sink, cancel)
            .await;
        bus.shutdown().await;
        let report = match result {
            Err(e @ runs::RunError::Hook(_)) => {
                errln!("error: {e}");
                return Ok(Exit::Failed);
            }
            other => other?,
        };
        if let Err(e @ OutputError::Failed { .. }) = printing {
            return Err(e.into());
        }
        if let Some(error) = report.hook_error.as_ref().or(report.acp_error.as_ref()) {
            errln!("error: {error}");
        }
        if format == Format::Human {
            errln!(
                "run {} {} ({}) in {:.1}s",
                prepared.id,
                report.outcome.as_str().replace('_', " "),
                report.exit,
                report.duration.as_secs_f64()
            );
        }
        if let Outcome::Blocked { denials } = &report.outcome {
            errln!(
                "error: a denial stopped what the agent tried: {}",
                crate::runs::agent::denials_in_words(denials)
            );
        }
        if report.outcome == Outcome::NoChanges {
            errln!("error: the run changed no file, and `expect_changes = true` asks for changes");
        }
        Ok(match report.outcome {
            Outcome::Succeeded => Exit::Ok,
            Outcome::Blocked { .. } => Exit::Blocked,
            Outcome::Failed { .. } | Outcome::HookFailed | Outcome::NoChanges => Exit::Failed,
            Outcome::TimedOut => Exit::TimedOut,
            Outcome::Cancelled { signal } => cancelled_exit(signal),
        })
    });
    // A render still running on a blocking thread (cancelled above) is not
    // waited for.
    rt.shutdown_background();
    result
}

/// What became of a run asked of the daemon.
enum InDaemon {
    /// It ran (or was refused); the command exits with this.
    Done(Exit),
    /// The daemon went away before it took the run.
    Gone,
}

/// Ask the daemon at `socket` to carry out `asked` and follow the run from
/// the store until it ended, printing its agent events; a signal asks the
/// daemon to cancel it (the run's end then ends the command).
async fn in_daemon(
    paths: &crate::runtime::RepoPaths,
    socket: &std::path::Path,
    asked: LocalRun,
    format: Format,
    cancel: &mut std::pin::Pin<&mut impl std::future::Future<Output = i32>>,
) -> anyhow::Result<InDaemon> {
    let run_id = match Client::call(socket, &Request::Run { run: asked }).await {
        Ok(Reply::RunQueued { run_id }) => run_id,
        Ok(other) => return Err(ControlError::unexpected(&other).into()),
        Err(ControlError::Connect { .. }) => return Ok(InDaemon::Gone),
        Err(ControlError::Refused(e)) => {
            errln!("error: {e}");
            return Ok(InDaemon::Done(Exit::Usage));
        }
        Err(e) => return Err(e.into()),
    };
    let store = std::sync::Arc::new(crate::runtime::open_store_read_only(paths)?);
    let mut follower = Follower::new(store, &run_id);
    let daemon_up = || paths.running_daemon().is_some();
    let mut signalled: Option<i32> = None;
    let mut printing: Result<(), OutputError> = Ok(());
    let ended: Ended = loop {
        let step = tokio::select! {
            step = follower.next(&daemon_up) => step?,
            signal = cancel.as_mut(), if signalled.is_none() => {
                signalled = Some(signal);
                let (socket, id) = (socket.to_path_buf(), run_id.clone());
                tokio::spawn(async move {
                    let _ = Client::call(&socket, &Request::CancelRun { id }).await;
                });
                continue;
            }
        };
        let page = match step {
            Step::Events(page) => page,
            Step::Ended(ended) => break ended,
        };
        for e in &page {
            if e.kind == "run.started" && format == Format::Human {
                for w in e.payload["warnings"].as_array().into_iter().flatten() {
                    errln!("warning: {}", w.as_str().unwrap_or_default());
                }
                errln!(
                    "run {run_id} · profile `{}` · provider `{}` · in {} (daemon)",
                    e.payload["profile"].as_str().unwrap_or("?"),
                    e.payload["provider"].as_str().unwrap_or("?"),
                    e.payload["cwd"].as_str().unwrap_or("?"),
                );
            }
            let agent = e.kind.starts_with("agent.") || e.kind.starts_with("cli_detection.");
            if agent && printing.is_ok() {
                printing = match format {
                    Format::Json => outln!("{}", e.payload),
                    Format::Human => {
                        match serde_json::from_value::<AgentEvent>(e.payload.clone()) {
                            Ok(event) => print_event(&run_id, &event, format),
                            Err(_) => Ok(()),
                        }
                    }
                };
            }
        }
    };
    if let Err(e @ OutputError::Failed { .. }) = printing {
        return Err(e.into());
    }
    let finished = ended.finished.as_ref();
    if let Some(error) = finished.and_then(|f| f["error"].as_str()) {
        errln!("error: {error}");
    } else if finished.is_none()
        && let Some(why) = &ended.why
    {
        errln!("error: run {run_id} {}: {why}", ended.outcome);
    }
    if format == Format::Human
        && let Some(f) = finished
    {
        let exit = serde_json::from_value::<crate::supervisor::ExitInfo>(f["exit"].clone())
            .map(|e| e.to_string())
            .unwrap_or_else(|_| "no exit".to_string());
        errln!(
            "run {run_id} {} ({exit}) in {:.1}s",
            ended.outcome.replace('_', " "),
            f["duration_ms"].as_f64().unwrap_or(0.0) / 1000.0
        );
    }
    Ok(InDaemon::Done(match ended.outcome.as_str() {
        "succeeded" => Exit::Ok,
        "blocked" => Exit::Blocked,
        "timed_out" => Exit::TimedOut,
        "cancelled" => match signalled {
            Some(signal) => cancelled_exit(signal),
            None => match finished.and_then(|f| f["exit_code"].as_u64()) {
                Some(code) if code == Exit::Terminated as u64 => Exit::Terminated,
                _ => Exit::Interrupted,
            },
        },
        _ => Exit::Failed,
    }))
}

/// The exit of a run cancelled by `signal`.
fn cancelled_exit(signal: i32) -> Exit {
    if signal == nix::sys::signal::Signal::SIGTERM as i32 {
        Exit::Terminated
    } else {
        Exit::Interrupted
    }
}

fn print_event(run_id: &str, event: &AgentEvent, format: Format) -> Result<(), OutputError> {
    match format {
        Format::Json => outln!("{}", runs::event_payload(run_id, event))?,
        Format::Human => match view::line(event) {
            Some((view::Stream::Stdout, text)) => outln!("{text}")?,
            Some((view::Stream::Stderr, text)) => errln!("{text}"),
            None => {}
        },
    }
    Ok(())
}

/// The agent's session of run `id` (`--resume`), from the store.
fn resume_of(paths: &crate::runtime::RepoPaths, id: &str) -> anyhow::Result<String> {
    if !runs::workspace::is_run_id(id) {
        anyhow::bail!(
            "`{}` is not a run id; `npc runs` lists them",
            crate::stdx::term::printable(id)
        );
    }
    let store = crate::runtime::open_store_read_only(paths)?;
    store.agent_session_of_run(id)?.ok_or_else(|| {
        anyhow::anyhow!(
            "run `{id}` recorded no agent session to continue (it never started, or its agent announced none); start a new run instead"
        )
    })
}
