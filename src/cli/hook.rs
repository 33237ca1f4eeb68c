//! `npc hook run EVENT [--agent npc|claude|gemini|codex]`: run the repository's
//! hooks of one event once, for an agent CLI's own hook mechanism (the
//! entries `npc apply` writes call it) or as a composite Agent Plugins hook.
//! It reads the event's input on stdin (bounded), loads the manifest, runs
//! the matching hooks through the runner (each call recorded as a
//! `hook.call` event) and answers in the caller's protocol (see
//! `hooks::bridge`). A `before_tool` also applies the `ask_tools` of the
//! profile the agent runs for (`NPC_PROFILE`, see `hooks::policy`). It fails
//! closed: an unreadable input or manifest, or a failing hook, is a denial
//! of a tool event. With no matching hook (and nothing the policy asks
//! about) it answers at once, without opening the event store or starting
//! a runtime. In a sandboxed run (npc gave it `NPC_RUN_CHANNEL` and
//! `NPC_RUN_PASS`) the store is read-only: its records are kept
//! (`HookRunner::collecting`) and go, like its asks, over the run's channel
//! to the process that owns the run (`surfaces::channel`); a channel it
//! cannot name is a denial of a tool event, an ask it cannot send a
//! recorded denial (fail closed).

use std::io::Read as _;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use serde_json::json;

use super::Exit;
use crate::hooks::bridge::{self, Answer, BridgeError, MAX_NATIVE_INPUT_BYTES, Protocol};
use crate::hooks::policy::ToolPolicy;
use crate::hooks::{BeforeTool, HookRunner, HookSet};
use crate::model::{self, HookEvent};

#[derive(Debug, Subcommand)]
pub enum HookCommand {
    /// Run the hooks of EVENT once: stdin is the event's input, the answer follows the `--agent` protocol (the entries `npc apply` writes into agent CLI settings call this)
    Run(RunArgs),
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// on_agent_start, before_model, after_model, before_tool, after_tool, on_error or on_agent_end
    #[arg(value_parser = parse_event)]
    event: HookEvent,
    /// Whose hook protocol stdin and the answer use
    #[arg(long, value_enum, default_value_t = Protocol::Npc)]
    agent: Protocol,
    /// Manifest file (default: npcagent.toml, else npcagent.json, in the current directory or the nearest one above it in the repository; or `NPC_MANIFEST`)
    #[arg(long, short = 'm')]
    manifest: Option<PathBuf>,
}

fn parse_event(s: &str) -> Result<HookEvent, String> {
    HookEvent::parse(s).ok_or_else(|| {
        format!(
            "unknown hook event `{s}`; use one of {}",
            HookEvent::NAMES.join(", ")
        )
    })
}

pub fn run(command: HookCommand) -> anyhow::Result<Exit> {
    match command {
        HookCommand::Run(args) => hook_run(args),
    }
}

/// Why the hooks could not run at all (answered as a failure, fail closed).
fn refuse(args: &RunArgs, reason: String) -> Answer {
    match args.event {
        HookEvent::BeforeTool => bridge::before_tool_refused(args.agent, &reason),
        HookEvent::AfterTool
        | HookEvent::OnAgentStart
        | HookEvent::BeforeModel
        | HookEvent::AfterModel => match args.agent {
            Protocol::Npc => Answer {
                exit: bridge::EXIT_DENIED,
                stdout: String::new(),
                stderr: format!("error: {reason}"),
            },
            Protocol::Claude | Protocol::Codex => Answer {
                exit: bridge::CLAUDE_BLOCK_EXIT,
                stdout: String::new(),
                stderr: reason,
            },
            Protocol::Gemini => Answer {
                exit: 0,
                stdout: json!({"decision": "deny", "reason": reason}).to_string(),
                stderr: String::new(),
            },
        },
        // Best-effort observers never stop anything.
        HookEvent::OnError | HookEvent::OnAgentEnd => Answer {
            stderr: format!("warning: {reason}"),
            ..Answer::default()
        },
    }
}

fn hook_run(args: RunArgs) -> anyhow::Result<Exit> {
    let answer = answer(&args);
    if !answer.stderr.is_empty() {
        errln!("{}", answer.stderr);
    }
    if !answer.stdout.is_empty() {
        outln!("{}", answer.stdout)?;
    }
    Ok(match answer.exit {
        0 => Exit::Ok,
        1 => Exit::Failed,
        _ => Exit::Usage,
    })
}

fn answer(args: &RunArgs) -> Answer {
    let mut input = Vec::new();
    let read = std::io::stdin()
        .lock()
        .take(MAX_NATIVE_INPUT_BYTES as u64 + 1)
        .read_to_end(&mut input);
    if let Err(e) = read {
        return refuse(args, format!("cannot read the hook input on stdin: {e}"));
    }
    if input.len() > MAX_NATIVE_INPUT_BYTES {
        return refuse(
            args,
            format!("the hook input is larger than {MAX_NATIVE_INPUT_BYTES} bytes; npc refuses it"),
        );
    }
    let input = match bridge::parse_input(&input) {
        Ok(v) => v,
        Err(e) => return refuse(args, e.to_string()),
    };
    let tool = match args.event {
        HookEvent::BeforeTool | HookEvent::AfterTool => {
            match bridge::tool_input(args.agent, args.event, &input) {
                Ok(t) => Some(t),
                Err(e) => return refuse(args, e.to_string()),
            }
        }
        _ if args.agent != Protocol::Npc => {
            return refuse(
                args,
                BridgeError::NotBridged {
                    event: args.event.as_str(),
                }
                .to_string(),
            );
        }
        _ => None,
    };
    let path = match super::manifest_path(args.manifest.clone()) {
        Ok(p) => p,
        Err(e) => return refuse(args, format!("{e:#}")),
    };
    // The root and the manifest's place do not depend on the state
    // directory, which the loaded manifest names below (a second, lenient
    // parse for it would cost this call, made on every tool call, a fifth
    // of its time).
    let paths = match crate::runtime::RepoPaths::resolve(&path, model::DEFAULT_STATE_DIR) {
        Ok(p) => p,
        Err(e) => return refuse(args, e.to_string()),
    };
    let loaded = match crate::runtime::load_from_disk(&paths.manifest) {
        Ok(l) => l,
        Err(e) => return refuse(args, format!("cannot read `{}`: {e}", path.display())),
    };
    let Some(manifest) = &loaded.manifest else {
        let first = loaded
            .diagnostics
            .iter()
            .find(|d| d.severity == model::Severity::Error)
            .map(|d| format!(" (first error: {})", d.summary))
            .unwrap_or_default();
        return refuse(
            args,
            format!(
                "`{}` is invalid, so its hooks cannot run{first}; fix it (see `npc validate`)",
                loaded.source.name()
            ),
        );
    };
    let paths = paths.with_state_dir(&manifest.project.state_dir);
    let set = HookSet::for_repository(&paths.root, manifest);
    let tool_name = tool.as_ref().map(|t| t.call.name.as_str());
    // The profile the agent runs for may ask about the call (`ask_tools`).
    let policy = (args.event == HookEvent::BeforeTool)
        .then(|| ToolPolicy::from_env(manifest))
        .flatten();
    // ... or deny it (`denied_tools`, on the CLI's own tools too).
    let policy_applies = policy
        .as_ref()
        .zip(tool.as_ref())
        .is_some_and(|(p, t)| p.asks(&t.call).is_some() || p.denial(&t.call).is_some());
    if set.matching(args.event, tool_name).next().is_none() && !policy_applies {
        return match (args.event, args.agent) {
            (HookEvent::BeforeTool, _) => {
                bridge::before_tool_answer(args.agent, Ok(BeforeTool::Continue { arguments: None }))
            }
            _ => Answer::default(),
        };
    }
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return refuse(args, format!("cannot start the runtime: {e}")),
    };
    // In a sandboxed run npc's state is read-only: what the hooks record
    // gathers in a spool in the run's own temporary directory and goes,
    // like an ask, over the run's channel to the process that owns it.
    let channel = match channel() {
        Ok(c) => c,
        Err(e) => return refuse(args, e.to_string()),
    };
    let collected: crate::hooks::Collected = std::sync::Arc::default();
    rt.block_on(async {
        // Brief: each record is synced when it commits, and closing does
        // not checkpoint (see `Store::open_brief`). A sandboxed run's
        // records are kept and sent to its owner instead.
        let opened = match &channel {
            Some(_) => None,
            None => Some(crate::runtime::open_store_brief(&paths)),
        };
        let (store, bus) = match opened {
            None => (None, None),
            Some(Ok(store)) => {
                let store = std::sync::Arc::new(store);
                let bus = crate::bus::EventBus::new(store.clone());
                bus.set_secrets(manifest.secret_values());
                (Some(store), Some(bus))
            }
            Some(Err(e)) => {
                errln!("warning: hook calls are not recorded: cannot open the event store: {e}");
                (None, None)
            }
        };
        let (events, _receiver) = tokio::sync::mpsc::unbounded_channel();
        let supervisor =
            crate::supervisor::Supervisor::new(events, crate::supervisor::BackoffPolicy::default());
        // Its denials are the hook bridge's, for the run in its environment.
        let run = std::env::var(crate::runs::agent::RUN_ID_ENV)
            .ok()
            .filter(|r| crate::runs::workspace::is_run_id(r));
        let mut runner = HookRunner::new(set, supervisor, bus.clone())
            .for_site(crate::event::DeniedBy::Hook, run);
        if let Some(policy) = policy {
            runner = runner.with_policy(policy);
        }
        if channel.is_some() {
            runner = runner.collecting(collected.clone());
        }
        // Inside an agent `npc acp` started, an `ask` goes to the editor;
        // in a run, it parks the run until a person answers.
        runner = runner.with_approver(match &channel {
            Some((client, run_id)) => std::sync::Arc::new(crate::hooks::park::ChannelApprover {
                client: client.clone(),
                collected: collected.clone(),
                run_id: run_id.clone(),
                profile: std::env::var(crate::hooks::policy::PROFILE_ENV).ok(),
            }),
            None => asker(&paths, manifest, store.clone(), bus.clone()),
        });
        let answer = match (args.event, tool) {
            (HookEvent::BeforeTool, Some(t)) => {
                bridge::before_tool_answer(args.agent, runner.before_tool(&t.call).await)
            }
            (HookEvent::AfterTool, Some(t)) => {
                let result = t.result.unwrap_or_else(|| crate::hooks::ToolResultInfo {
                    call_id: t.call.id.clone(),
                    tool_name: t.call.name.clone(),
                    output: String::new(),
                    is_error: false,
                });
                bridge::after_tool_answer(args.agent, runner.after_tool(&t.call, &result).await)
            }
            (event, _) => bridge::observe_answer(runner.observe(event, input).await),
        };
        if let Some(bus) = bus {
            bus.shutdown().await;
        }
        if let Some((client, _)) = &channel {
            let events = std::mem::take(&mut *crate::stdx::lock(&collected));
            for batch in events.chunks(crate::surfaces::channel::MAX_RECORDED_EVENTS) {
                if let Err(e) = client.record(batch.to_vec()).await {
                    errln!("warning: hook calls are not recorded: {e}");
                    break;
                }
            }
        }
        answer
    })
}

/// The channel of the sandboxed run this hook runs in, with the run's id;
/// `None` outside one (the store is written directly).
fn channel() -> Result<
    Option<(crate::surfaces::channel::ChannelClient, String)>,
    crate::surfaces::channel::ChannelError,
> {
    use crate::surfaces::channel::{ChannelClient, ChannelError};
    if !ChannelClient::given() {
        return Ok(None);
    }
    let run = std::env::var(crate::runs::agent::RUN_ID_ENV)
        .ok()
        .filter(|r| crate::runs::workspace::is_run_id(r))
        .ok_or(ChannelError::Unset)?;
    Ok(Some((ChannelClient::from_env(&run)?, run)))
}

/// Who answers an `ask` of this agent: the editor of the `npc acp` that
/// started it; else, in a run (`NPC_RUN_ID`), a person through the daemon
/// (the run parks: `hooks::park`); else nobody (a recorded denial).
fn asker(
    paths: &crate::runtime::RepoPaths,
    manifest: &crate::model::Manifest,
    store: Option<std::sync::Arc<crate::store::Store>>,
    bus: Option<crate::bus::EventBus>,
) -> std::sync::Arc<dyn crate::hooks::Approve> {
    use crate::hooks::park::{NoOneToAsk, ParkApprover};
    if let Some(approver) = crate::hooks::approve::SocketApprover::from_env() {
        return std::sync::Arc::new(approver);
    }
    let run_id = std::env::var(crate::runs::agent::RUN_ID_ENV)
        .ok()
        .filter(|id| crate::runs::workspace::is_run_id(id));
    let profile = std::env::var(crate::hooks::policy::PROFILE_ENV).ok();
    // A worktree run's hooks find the worktree's manifest; its run, and
    // the daemon that answers, live in the repository npc named
    // (`NPC_REPO_ROOT`, set by npc for the run, never by the repository).
    // A fleet worker's runs live in its own store under the state
    // directory (`NPC_RUN_STATE`, `workers/NAME`).
    let target = worker_state(run_repository(paths, manifest).unwrap_or_else(|| paths.clone()));
    let (paths, store, bus) = if target.root == paths.root && target.state_dir == paths.state_dir {
        (paths.clone(), store, bus)
    } else {
        match crate::runtime::open_store(&target) {
            Ok(run_store) => {
                let run_store = std::sync::Arc::new(run_store);
                let run_bus = crate::bus::EventBus::new(run_store.clone());
                run_bus.set_secrets(manifest.secret_values());
                (target, Some(run_store), Some(run_bus))
            }
            Err(_) => (target, None, bus),
        }
    };
    match (run_id, store) {
        (Some(run_id), Some(store)) => {
            let daemon = paths;
            // In a fleet (`[store] url`), any node's API answers.
            let fleet = manifest.store.url.is_some();
            let reach: crate::hooks::park::Reach = std::sync::Arc::new(move || {
                let here = daemon.running_daemon().map(drop);
                here.or(fleet.then_some(())).ok_or_else(|| {
                    "no daemon runs for this repository, so nobody can be asked; start `npc daemon` (then `npc runs approve ID` answers), run the agent through `npc acp`, or change the rule that asks".to_string()
                })
            });
            std::sync::Arc::new(ParkApprover::new(
                store,
                bus,
                run_id,
                profile,
                std::sync::Arc::new(manifest.clone()),
                reach,
            ))
        }
        (run_id, _) => std::sync::Arc::new(NoOneToAsk {
            bus,
            run_id,
            profile,
            why: "this agent runs outside any npc run or editor, so nobody can be asked; run it through `npc run` with a daemon up, or `npc acp`, or change the rule that asks".to_string(),
        }),
    }
}

/// The repository of the run this agent works for, when npc named one
/// (`NPC_REPO_ROOT`, a worktree run's) and it resolves.
fn run_repository(
    paths: &crate::runtime::RepoPaths,
    manifest: &crate::model::Manifest,
) -> Option<crate::runtime::RepoPaths> {
    let root = std::path::PathBuf::from(std::env::var_os(crate::runs::agent::REPO_ROOT_ENV)?);
    let name = paths.manifest.file_name()?;
    crate::runtime::RepoPaths::resolve(&root.join(name), &manifest.project.state_dir).ok()
}

/// `paths` with the state directory of the fleet worker whose run this
/// agent works for (`NPC_RUN_STATE`: exactly `workers/NAME`, NAME of
/// letters, digits, `-`, `_` and `.` not starting with `.`); else as given.
fn worker_state(paths: crate::runtime::RepoPaths) -> crate::runtime::RepoPaths {
    worker_state_of(paths, std::env::var(crate::runs::agent::RUN_STATE_ENV).ok())
}

fn worker_state_of(
    paths: crate::runtime::RepoPaths,
    rel: Option<String>,
) -> crate::runtime::RepoPaths {
    let Some(rel) = rel else {
        return paths;
    };
    let valid = rel.split_once('/').is_some_and(|(dir, name)| {
        dir == super::worker::WORKERS_DIR
            && !name.is_empty()
            && !name.starts_with('.')
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    });
    if !valid {
        return paths;
    }
    crate::runtime::RepoPaths {
        state_dir: paths.state_dir.join(rel),
        ..paths
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_workers_own_directory_names_a_runs_store() {
        let dir = tempfile::tempdir().unwrap();
        let paths = crate::runtime::RepoPaths::resolve(
            &dir.path().join("npcagent.toml"),
            crate::model::DEFAULT_STATE_DIR,
        )
        .unwrap();
        let state = paths.state_dir.clone();
        let of = |rel: &str| worker_state_of(paths.clone(), Some(rel.to_string())).state_dir;
        assert_eq!(of("workers/vm-1_2.3"), state.join("workers/vm-1_2.3"));
        for hostile in [
            "../x",
            "workers/../x",
            "workers/..",
            "workers/.hidden",
            "/etc",
            "workers//x",
            "workers/a/b",
            "other/x",
            "workers/",
            "workers/a\nb",
        ] {
            assert_eq!(of(hostile), state, "{hostile}");
        }
        assert_eq!(worker_state_of(paths.clone(), None).state_dir, state);
    }
}
