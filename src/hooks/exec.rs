//! One hook call: resolve the entry to a [`ChildSpec`] (program, expanded
//! args / env / cwd, `PLUGIN_*` variables), run it once through the
//! supervisor with the envelope on stdin, and turn what it did into either
//! its parsed answer or a [`HookError`]; then read that answer as the
//! event's decision.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Map, Value};

use super::{
    HookEntry, HookSource, MAX_INPUT_BYTES, MAX_OUTPUT_BYTES, MAX_STDERR_BYTES, PLUGIN_DATA_VAR,
    PLUGIN_ROOT_VAR, STDERR_QUOTE_CHARS,
};
use crate::supervisor::{ChildSpec, OutputLimits, Supervisor};

/// Why one hook call failed. Every variant stops what the hook guards
/// (except for best-effort observers).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HookError {
    #[error("`{program}` could not be started: {reason}")]
    Launch { program: String, reason: String },
    #[error("its working directory `{}` is outside the plugin's package and data directory", cwd.display())]
    CwdOutside { cwd: PathBuf },
    #[error("its input is {bytes} bytes, more than the {MAX_INPUT_BYTES} allowed")]
    InputTooLarge { bytes: usize },
    #[error("it ran past its timeout of {timeout_ms} ms and was killed")]
    Timeout { timeout_ms: u64 },
    #[error("it ended with {status}{}", quote_stderr(stderr))]
    Exit { status: String, stderr: String },
    #[error("it wrote more than {MAX_OUTPUT_BYTES} bytes to stdout")]
    OutputTooLarge,
    #[error("its output is invalid: {reason}{}", quote_stderr(stderr))]
    InvalidOutput { reason: String, stderr: String },
}

fn quote_stderr(stderr: &str) -> String {
    if stderr.is_empty() {
        String::new()
    } else {
        format!(" (stderr: `{stderr}`)")
    }
}

/// The last [`STDERR_QUOTE_CHARS`] characters of `stderr`, on one line.
fn stderr_tail(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let text = text.trim();
    let skip = text.chars().count().saturating_sub(STDERR_QUOTE_CHARS);
    let tail: String = text.chars().skip(skip).collect();
    let tail = tail.split_whitespace().collect::<Vec<_>>().join(" ");
    if skip > 0 { format!("…{tail}") } else { tail }
}

/// A relative program path with a slash (`./hooks/x`) is relative to `base`.
fn resolve_program(base: &Path, program: &str) -> String {
    if program.contains('/') && !Path::new(program).is_absolute() {
        base.join(program).display().to_string()
    } else {
        program.to_string()
    }
}

/// What the supervisor runs for `entry` (secrets exposed here, for the child only).
pub(super) fn child_spec(root: &Path, entry: &HookEntry) -> Result<ChildSpec, HookError> {
    let run = &entry.hook.run;
    let (base, plugin_dirs) = match &entry.source {
        HookSource::Manifest => (root, None),
        HookSource::Plugin {
            root: plugin_root,
            data,
            ..
        } => (plugin_root.as_path(), Some((plugin_root, data))),
    };
    // A plugin's hooks expand its placeholders like its servers do (§9).
    let placeholders =
        plugin_dirs.map(|(root, data)| crate::plugins::expand::Placeholders { root, data });
    let expand = |s: &str| match &placeholders {
        None => s.to_string(),
        Some(p) => p.expand(s),
    };
    let mut env: BTreeMap<String, String> = run
        .env
        .iter()
        .map(|(k, v)| (k.clone(), expand(v.expose())))
        .collect();
    let cwd = run
        .cwd
        .as_ref()
        .map_or_else(|| base.to_path_buf(), |c| base.join(expand(c.expose())));
    if let HookSource::Plugin {
        root: plugin_root,
        data,
        ..
    } = &entry.source
    {
        env.insert(PLUGIN_ROOT_VAR.into(), plugin_root.display().to_string());
        env.insert(PLUGIN_DATA_VAR.into(), data.display().to_string());
        let real = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        let at = real(&cwd);
        if !at.starts_with(real(plugin_root)) && !at.starts_with(real(data)) {
            return Err(HookError::CwdOutside { cwd });
        }
    }
    let mut spec = ChildSpec::new(resolve_program(base, &run.command), cwd)
        .args(run.args.iter().map(|a| expand(a.expose())));
    spec.env = env;
    Ok(spec)
}

/// Run `entry` once with `envelope` on stdin; its stdout parsed as one JSON
/// object (`None` when it wrote nothing but whitespace).
pub(super) async fn run(
    supervisor: &Supervisor,
    root: &Path,
    entry: &HookEntry,
    envelope: &Value,
) -> Result<Option<Map<String, Value>>, HookError> {
    let input = serde_json::to_vec(envelope).unwrap_or_default();
    if input.len() > MAX_INPUT_BYTES {
        return Err(HookError::InputTooLarge { bytes: input.len() });
    }
    if let HookSource::Plugin { data, .. } = &entry.source {
        // `PLUGIN_DATA` is created 0700 (or re-enforced) before every start;
        // a failure shows as the launch failing below.
        crate::plugins::data::ensure_at(data);
    }
    let spec = child_spec(root, entry)?;
    let limits = OutputLimits {
        stdout: MAX_OUTPUT_BYTES,
        stderr: MAX_STDERR_BYTES,
    };
    let timeout = Duration::from_millis(entry.hook.timeout_ms);
    let output = supervisor
        .run_once(&spec, Some(input), timeout, limits)
        .await
        .map_err(|e| HookError::Launch {
            program: spec.program.clone(),
            reason: match e {
                crate::supervisor::SupervisorError::Spawn { source, .. } => source.to_string(),
                other => other.to_string(),
            },
        })?;
    let stderr = stderr_tail(&output.stderr);
    if output.timed_out {
        return Err(HookError::Timeout {
            timeout_ms: entry.hook.timeout_ms,
        });
    }
    if !output.status.success() {
        return Err(HookError::Exit {
            status: output.status.to_string(),
            stderr,
        });
    }
    if output.stdout_truncated {
        return Err(HookError::OutputTooLarge);
    }
    parse_stdout(&output.stdout).map_err(|reason| HookError::InvalidOutput { reason, stderr })
}

/// Nothing (whitespace only) or exactly one JSON object.
pub(super) fn parse_stdout(stdout: &[u8]) -> Result<Option<Map<String, Value>>, String> {
    if stdout.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    match serde_json::from_slice::<Value>(stdout) {
        Ok(Value::Object(map)) => Ok(Some(map)),
        Ok(_) => Err("stdout is JSON but not one object; write nothing or one JSON object".into()),
        Err(e) => Err(format!(
            "stdout is not one JSON object ({e}); write nothing or one JSON object, and diagnostics to stderr"
        )),
    }
}

fn invalid(reason: impl Into<String>) -> HookError {
    HookError::InvalidOutput {
        reason: reason.into(),
        stderr: String::new(),
    }
}

fn closed<T: for<'de> Deserialize<'de>>(
    answer: Map<String, Value>,
    expected: &str,
) -> Result<T, HookError> {
    serde_json::from_value(Value::Object(answer))
        .map_err(|e| invalid(format!("{e}; expected {expected}")))
}

/// One `before_tool` hook's answer.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum BeforeAnswer {
    Continue,
    Deny {
        reason: String,
    },
    Rewrite {
        arguments: Map<String, Value>,
    },
    /// The user decides (through an attached editor, `npc acp`); `reason`
    /// is shown to them.
    Ask {
        reason: Option<String>,
    },
}

const BEFORE_SHAPE: &str = "`{\"decision\":\"continue\"}`, `{\"decision\":\"deny\",\"reason\":\"…\"}`, `{\"decision\":\"rewrite\",\"arguments\":{…}}` or `{\"decision\":\"ask\",\"reason\":\"…\"}`";

pub(super) fn before_tool_answer(
    answer: Option<Map<String, Value>>,
) -> Result<BeforeAnswer, HookError> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Raw {
        decision: Option<String>,
        reason: Option<String>,
        arguments: Option<Value>,
    }
    let Some(answer) = answer else {
        return Ok(BeforeAnswer::Continue);
    };
    let raw: Raw = closed(answer, BEFORE_SHAPE)?;
    match (raw.decision.as_deref(), raw.reason, raw.arguments) {
        (None | Some("continue"), _, None) => Ok(BeforeAnswer::Continue),
        (Some("deny"), Some(reason), None) if !reason.trim().is_empty() => {
            Ok(BeforeAnswer::Deny { reason })
        }
        (Some("deny"), _, None) => Err(invalid(
            "a `deny` needs a non-empty `reason`; say why the call is refused",
        )),
        (Some("rewrite"), None, Some(Value::Object(arguments))) => {
            Ok(BeforeAnswer::Rewrite { arguments })
        }
        (Some("rewrite"), _, _) => Err(invalid(
            "a `rewrite` needs `arguments`, a JSON object (and no `reason`)",
        )),
        (Some("ask"), reason, None) => Ok(BeforeAnswer::Ask {
            reason: reason.filter(|r| !r.trim().is_empty()),
        }),
        (Some(other), _, _) if !["continue", "deny", "ask"].contains(&other) => {
            Err(invalid(format!(
                "unknown `decision` `{}`; expected {BEFORE_SHAPE}",
                crate::model::diagnostics::clip(other)
            )))
        }
        _ => Err(invalid(format!(
            "`arguments` belongs to a `rewrite` only; expected {BEFORE_SHAPE}"
        ))),
    }
}

/// One `after_tool` hook's answer.
#[derive(Debug, Clone, PartialEq, Default)]
pub(super) struct AfterAnswer {
    pub output: Option<String>,
    pub is_error: Option<bool>,
}

pub(super) fn after_tool_answer(
    answer: Option<Map<String, Value>>,
) -> Result<AfterAnswer, HookError> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Raw {
        output: Option<Value>,
        is_error: Option<bool>,
    }
    let Some(answer) = answer else {
        return Ok(AfterAnswer::default());
    };
    let raw: Raw = closed(
        answer,
        "nothing, or `{\"output\":…,\"is_error\":true|false}` (both optional)",
    )?;
    // `"output": null` deserializes as absent: the result is kept.
    let output = match raw.output {
        None => None,
        Some(Value::String(s)) => Some(s),
        Some(other) => Some(other.to_string()),
    };
    Ok(AfterAnswer {
        output,
        is_error: raw.is_error,
    })
}

/// An observer answers nothing or `{}`.
pub(super) fn observer_answer(answer: Option<Map<String, Value>>) -> Result<(), HookError> {
    match answer {
        Some(map) if !map.is_empty() => Err(invalid(
            "this event only observes; write nothing or `{}` to stdout",
        )),
        _ => Ok(()),
    }
}
