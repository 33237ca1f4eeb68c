//! A command action: run through the supervisor with the run id, trigger,
//! origin and payload in its environment (a payload past
//! [`MAX_PAYLOAD_ENV_BYTES`] goes to a private file instead), its output
//! recorded as `run.output` events (bounded), stopped on timeout or cancel
//! by killing its process group.

use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::Executor;
use super::worktree::Opened;
use crate::driver::{DriverContext, child_spec};
use crate::event::{
    CommandRunFinished, CommandRunStarted, Event, RunFinished, RunOutput, RunStarted,
};
use crate::model::{CommandSpec, RestartPolicy};
use crate::plan::{ComponentId, Kind};
use crate::runs::Ending;
use crate::runs::workspace::Conclusion;
use crate::store::queue::{RunRow, state};

/// Output lines of a command recorded per run (`run.output`); the rest are
/// counted in `run.finished`.
pub const MAX_OUTPUT_EVENTS: usize = 200;
/// Longest output line recorded, in characters.
pub const MAX_OUTPUT_LINE_CHARS: usize = 4096;
/// Largest JSON passed inline in a command's environment ([`PAYLOAD_ENV`],
/// [`FIRING_ENV`]); a larger one is written to a private file of the run
/// named by the variable with `_FILE` appended instead.
pub const MAX_PAYLOAD_ENV_BYTES: usize = 64 * 1024;
/// A command's payload: what `payload` is in a filter, a key or a prompt
/// (a webhook's body, a manual firing's `--payload`; `null` for a cron or
/// file-watch firing).
pub const PAYLOAD_ENV: &str = "NPC_PAYLOAD";
/// A command's whole firing: what `trigger` is in a prompt (a webhook's
/// event, delivery and body; a cron firing's `scheduled_at`; …).
pub const FIRING_ENV: &str = "NPC_TRIGGER_PAYLOAD";
/// Why a worktree run of `expect_changes = true` that changed no file failed.
pub const NO_CHANGES: &str = "no changes: the run changed no file (`expect_changes = true`)";
/// After a command exits, how long its output pipes may take to close.
pub const POST_EXIT_DRAIN: Duration = Duration::from_secs(2);

impl Executor {
    pub(super) async fn run_command(
        &self,
        row: &RunRow,
        command: &CommandSpec,
        cancel: &CancellationToken,
        timeout: Duration,
        opened: Option<&Opened>,
        conclusion: Option<&Conclusion>,
    ) -> Ending {
        let started = Instant::now();
        let id = ComponentId::new(Kind::Trigger, &row.trigger);
        // In a worktree, the command (its `cwd`, a relative program) is
        // the worktree's.
        let cx = match opened {
            Some(o) => DriverContext {
                repo: o.worktree.dir.clone(),
                ..self.cx.clone()
            },
            None => self.cx.clone(),
        };
        let mut spec = child_spec(&cx, &id, command, RestartPolicy::Never);
        if let Some(o) = opened {
            spec.env.extend(o.env.clone());
        }
        spec.env
            .insert(crate::runs::agent::RUN_ID_ENV.into(), row.id.clone());
        spec.env.insert("NPC_TRIGGER".into(), row.trigger.clone());
        spec.env
            .insert("NPC_TRIGGER_ORIGIN".into(), row.origin.to_string());
        // The payload under the one name users write everywhere (`payload`
        // in filters, keys and prompts), and the whole firing (`trigger`).
        let request = crate::model::template::request_payload(&row.payload);
        for (var, file, text) in [
            (PAYLOAD_ENV, "payload.json", request.to_string()),
            (FIRING_ENV, "firing.json", row.payload.to_string()),
        ] {
            if let Err(error) = self.pass_json(&mut spec.env, &row.id, var, file, text) {
                self.record(&row.id, Event::run_failed(&row.id, None, error.clone()))
                    .await;
                return (state::FAILED, Some(error));
            }
        }
        self.record(
            &row.id,
            Event::RunStarted(RunStarted::Command(CommandRunStarted {
                run_id: row.id.clone(),
                trigger: row.trigger.clone(),
                origin: row.origin.to_string(),
                action: "command".to_string(),
                program: command.command.to_string(),
                cwd: spec.cwd.clone(),
            })),
        )
        .await;
        let finished = |outcome: &str| CommandRunFinished {
            run_id: row.id.clone(),
            trigger: row.trigger.clone(),
            outcome: outcome.to_string(),
            duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            ..CommandRunFinished::default()
        };
        let mut child = match self.cx.supervisor.spawn_streaming(&spec) {
            Ok(child) => child,
            Err(e) => {
                let error = e.to_string();
                let event = CommandRunFinished {
                    error: Some(error.clone()),
                    ..finished("failed")
                };
                self.record(&row.id, Event::RunFinished(RunFinished::Command(event)))
                    .await;
                return (state::FAILED, Some(error));
            }
        };
        drop(child.stdin.take());
        let killer = child.killer();
        let (_, empty_out) = tokio::sync::mpsc::channel(1);
        let (_, empty_err) = tokio::sync::mpsc::channel(1);
        let mut stdout = std::mem::replace(&mut child.stdout, empty_out);
        let mut stderr = std::mem::replace(&mut child.stderr, empty_err);
        let (mut out_open, mut err_open) = (true, true);
        let (mut recorded, mut dropped) = (0usize, 0usize);
        let mut exit = None;
        let mut stopped: Option<&'static str> = None;
        let drain = tokio::time::sleep(timeout + POST_EXIT_DRAIN);
        let timeout = tokio::time::sleep(timeout);
        tokio::pin!(timeout);
        tokio::pin!(drain);
        let wait = child.wait();
        tokio::pin!(wait);
        while out_open || err_open || exit.is_none() {
            let line = tokio::select! {
                l = stdout.recv(), if out_open => match l {
                    Some(l) => Some(("stdout", l)),
                    None => { out_open = false; None }
                },
                l = stderr.recv(), if err_open => match l {
                    Some(l) => Some(("stderr", l)),
                    None => { err_open = false; None }
                },
                status = &mut wait, if exit.is_none() => {
                    exit = Some(status.unwrap_or_default());
                    drain.as_mut().reset(tokio::time::Instant::now() + POST_EXIT_DRAIN);
                    None
                }
                () = &mut drain, if exit.is_some() => break,
                () = &mut timeout, if stopped.is_none() && exit.is_none() => {
                    stopped = Some(state::TIMED_OUT);
                    let _ = killer.kill();
                    None
                }
                () = cancel.cancelled(), if stopped.is_none() && exit.is_none() => {
                    stopped = Some(state::CANCELLED);
                    let _ = killer.kill();
                    None
                }
            };
            if let Some((stream, line)) = line {
                if recorded < MAX_OUTPUT_EVENTS {
                    recorded += 1;
                    let text: String = line.text().chars().take(MAX_OUTPUT_LINE_CHARS).collect();
                    self.record(
                        &row.id,
                        Event::RunOutput(RunOutput {
                            run_id: row.id.clone(),
                            stream: stream.to_string(),
                            line: text,
                        }),
                    )
                    .await;
                } else {
                    dropped += 1;
                }
            }
        }
        let exit = exit.unwrap_or_default();
        let mut end = stopped.unwrap_or(if exit.success() {
            state::SUCCEEDED
        } else {
            state::FAILED
        });
        let mut payload = CommandRunFinished {
            exit: Some(exit),
            output_lines_dropped: Some(dropped),
            ..finished(end)
        };
        let mut detail = (end == state::FAILED).then(|| exit.to_string());
        if let Some(conclusion) = conclusion {
            payload.concluded = conclusion.conclude().await;
            let unchanged = payload
                .concluded
                .result
                .as_ref()
                .is_some_and(|r| r.unchanged);
            let expected = opened.is_some_and(|o| o.spec.expect_changes == Some(true));
            if unchanged && expected && end == state::SUCCEEDED {
                end = state::FAILED;
                payload.outcome = end.to_string();
                payload.error = Some(NO_CHANGES.to_string());
                detail = Some(NO_CHANGES.to_string());
            }
        }
        self.record(&row.id, Event::RunFinished(RunFinished::Command(payload)))
            .await;
        (end, detail)
    }
}

impl Executor {
    /// Put `text` (JSON) in `env` as `var`, or, past
    /// [`MAX_PAYLOAD_ENV_BYTES`], in the run's private file `file` named by
    /// `var` with `_FILE` appended; the error says why the file failed.
    fn pass_json(
        &self,
        env: &mut std::collections::BTreeMap<String, String>,
        run_id: &str,
        var: &str,
        file: &str,
        text: String,
    ) -> Result<(), String> {
        if text.len() <= MAX_PAYLOAD_ENV_BYTES {
            env.insert(var.into(), text);
            return Ok(());
        }
        let path = super::super::run_dir(&self.cx.state_dir, run_id).join(file);
        crate::repofs::Root::new(&self.cx.repo)
            .and_then(|root| {
                root.write(&path, text.as_bytes(), crate::repofs::WriteOptions::PRIVATE)
            })
            .map_err(|e| format!("cannot write the payload file `{file}`: {e}"))?;
        env.insert(format!("{var}_FILE"), path.display().to_string());
        Ok(())
    }
}
