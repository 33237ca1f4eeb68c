//! `npc run PROFILE`: run an agent profile headless with a rendered prompt,
//! stream its events to the terminal (compact, or NDJSON with
//! `--format json`), record them in the event log, and exit with the
//! agent's outcome (0 success, 1 agent failure, 2 usage, 124 timeout,
//! 130 Ctrl-C, 143 SIGTERM).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use tokio::signal::unix::{SignalKind, signal};

use super::output::OutputError;
use super::{Exit, Format};

use crate::providers::AgentEvent;
use crate::runs::{self, Outcome, PromptChoice, RunRequest, view};

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
    #[arg(long, value_enum, default_value_t)]
    format: Format,
    /// Manifest file (default: npcagent.toml, else npcagent.json, in the current directory)
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
    let request = RunRequest {
        profile: args.profile,
        prompt,
        timeout: args
            .timeout
            .map_or(runs::DEFAULT_RUN_TIMEOUT, Duration::from_secs),
        cwd: args.cwd,
        probe_after: args
            .probe_after
            .map_or(crate::providers::STALE_AFTER, Duration::from_secs),
        trigger: None,
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
        let prepared = match prepared {
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
        let result = runs::execute(&prepared, &supervisor, &bus, &hooks, sink, cancel).await;
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
        if let Some(error) = &report.hook_error {
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
        Ok(match report.outcome {
            Outcome::Succeeded => Exit::Ok,
            Outcome::Failed { .. } | Outcome::HookFailed => Exit::Failed,
            Outcome::TimedOut => Exit::TimedOut,
            Outcome::Cancelled { signal } => cancelled_exit(signal),
        })
    });
    // A render still running on a blocking thread (cancelled above) is not
    // waited for.
    rt.shutdown_background();
    result
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
