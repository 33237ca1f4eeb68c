//! `npc plugin test`: bounded probes of a package's executable parts. Each
//! stdio MCP server is started once (cleared environment plus essentials,
//! its declared `env`, `PLUGIN_ROOT` and `PLUGIN_DATA`; placeholders
//! expanded in args, env and cwd), sent `initialize` and `tools/list`, and
//! stopped with its whole process group; each hook runs once with a
//! representative payload of its event and its decision is shown. Every
//! read is capped and every step has a deadline. This is a one-shot check,
//! not the hook runner the agents' calls go through.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt as _;

use super::expand::Placeholders;
use super::hooks::HookEntry;
use super::mcp::{Server, Transport};
use crate::model::HookEvent;
use crate::supervisor::{
    ChildSpec, Line, MAX_LINE_BYTES, OutputLimits, StreamingChild, Supervisor,
};

/// Time one MCP server has to answer `initialize` and `tools/list`.
pub const MCP_PROBE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the stderr of a failed server is read for the report.
pub const STDERR_WAIT: Duration = Duration::from_millis(200);
/// Most non-response lines (notifications, logs) skipped while waiting.
pub const MAX_SKIPPED_LINES: usize = 1000;
/// Largest hook stdin payload.
pub const MAX_HOOK_INPUT_BYTES: usize = 2 * 1024 * 1024;
/// Largest hook stdout accepted.
pub const MAX_HOOK_OUTPUT_BYTES: usize = 1024 * 1024;
/// Most stderr kept from a probed process, for the report.
pub const MAX_STDERR_BYTES: usize = 4096;
/// The MCP protocol version npc asks for.
const PROTOCOL_VERSION: &str = "2025-06-18";

/// What probing one server found.
#[derive(Debug, Clone, Serialize)]
pub struct ServerProbe {
    pub server: String,
    pub ok: bool,
    /// Tool names, on success.
    pub tools: Vec<String>,
    /// Why it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Why it was not probed (a remote transport).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
}

/// What running one hook found.
#[derive(Debug, Clone, Serialize)]
pub struct HookProbe {
    pub event: HookEvent,
    pub index: usize,
    pub command: String,
    pub ok: bool,
    /// `continue`, `deny: REASON`, `rewrite`, `observed`, `replace output`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decision: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The spec of a probe's child: the supervisor's cleared environment plus
/// essentials, the declared `env` expanded, `PLUGIN_ROOT` and `PLUGIN_DATA`.
fn spec(
    program: &str,
    args: &[String],
    env: &BTreeMap<String, String>,
    cwd: PathBuf,
    places: &Placeholders<'_>,
) -> ChildSpec {
    let program = match program.strip_prefix("./") {
        Some(rel) => places.root.join(rel).to_string_lossy().into_owned(),
        None => program.to_string(),
    };
    let mut spec = ChildSpec::new(program, cwd).args(places.expand_all(args));
    spec.env = super::data::plugin_env(env, places);
    spec
}

/// Probe one stdio server: `initialize`, then `tools/list`.
pub async fn probe_server(
    supervisor: &Supervisor,
    server: &Server,
    places: &Placeholders<'_>,
) -> ServerProbe {
    let fail = |error: String| ServerProbe {
        server: server.name.clone(),
        ok: false,
        tools: Vec::new(),
        error: Some(error),
        skipped: None,
    };
    let Transport::Stdio {
        command: program,
        args,
        env,
        cwd,
    } = &server.transport
    else {
        return ServerProbe {
            server: server.name.clone(),
            ok: true,
            tools: Vec::new(),
            error: None,
            skipped: Some(format!(
                "a `{}` server is not started by a probe; only stdio servers are",
                server.transport.kind()
            )),
        };
    };
    let spec = spec(program, args, env, places.cwd(cwd.as_deref()), places);
    let mut child = match supervisor.spawn_streaming(&spec) {
        Ok(c) => c,
        Err(e) => return fail(format!("cannot start `{program}`: {e}")),
    };
    let result = tokio::time::timeout(MCP_PROBE_TIMEOUT, handshake(&mut child)).await;
    let outcome = match result {
        Ok(Ok(tools)) => ServerProbe {
            server: server.name.clone(),
            ok: true,
            tools,
            error: None,
            skipped: None,
        },
        Ok(Err(e)) => {
            let mut tail = String::new();
            while let Ok(Some(line)) = tokio::time::timeout(STDERR_WAIT, child.stderr.recv()).await
            {
                if !line.bytes.is_empty() && tail.len() < MAX_STDERR_BYTES {
                    tail = crate::model::diagnostics::clip(&line.text()).into_owned();
                }
            }
            fail(if tail.is_empty() {
                e
            } else {
                format!("{e} (stderr: {tail})")
            })
        }
        Err(_) => fail(format!(
            "no answer within {} s",
            MCP_PROBE_TIMEOUT.as_secs()
        )),
    };
    let _ = child.kill_group();
    let _ = child.wait().await;
    outcome
}

async fn handshake(child: &mut StreamingChild) -> Result<Vec<String>, String> {
    let mut stdin = child.stdin.take().ok_or("no stdin")?;
    let send = |v: Value| format!("{v}\n");
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": PROTOCOL_VERSION,
        "capabilities": {},
        "clientInfo": {"name": "npc", "version": env!("CARGO_PKG_VERSION")}
    }});
    stdin
        .write_all(send(init).as_bytes())
        .await
        .map_err(write_error)?;
    response(&mut child.stdout, 1).await?;
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}});
    stdin
        .write_all((send(initialized) + &send(list)).as_bytes())
        .await
        .map_err(write_error)?;
    let result = response(&mut child.stdout, 2).await?;
    Ok(result["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .filter_map(|t| t["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default())
}

/// A failed write to the server: a closed pipe means it is gone.
fn write_error(e: std::io::Error) -> String {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        "the server exited before answering".into()
    } else {
        format!("cannot write to the server: {e}")
    }
}

/// Read lines until the response with `id`; its `result`.
async fn response(out: &mut tokio::sync::mpsc::Receiver<Line>, id: i64) -> Result<Value, String> {
    for _ in 0..MAX_SKIPPED_LINES {
        let Some(line) = out.recv().await else {
            return Err("the server exited before answering".into());
        };
        if line.truncated {
            return Err(format!("a line longer than {MAX_LINE_BYTES} bytes"));
        }
        let Ok(msg) = serde_json::from_slice::<Value>(&line.bytes) else {
            return Err("wrote something that is not JSON-RPC to stdout".into());
        };
        if msg["id"] != json!(id) {
            continue;
        }
        if let Some(err) = msg.get("error") {
            return Err(format!(
                "answered with an error: {}",
                crate::model::diagnostics::clip(&err.to_string())
            ));
        }
        return Ok(msg["result"].clone());
    }
    Err(format!("no answer among {MAX_SKIPPED_LINES} lines"))
}

/// The representative payload of `event` that `npc plugin test` sends.
pub fn sample_payload(event: HookEvent) -> Value {
    let call = json!({"id": "call-1", "name": "echo", "arguments": {"text": "hello"}});
    match event {
        HookEvent::BeforeTool => json!({"tool_call": call}),
        HookEvent::AfterTool => json!({"tool_call": call, "result": {
            "call_id": "call-1", "tool_name": "echo", "output": "hello", "is_error": false
        }}),
        HookEvent::OnError => json!({"error": "a sample error from npc plugin test"}),
        _ => json!({"messages": [{"role": "user", "content": "hello"}]}),
    }
}

/// Run hook `entry` of `event` once with the sample payload.
pub async fn run_hook(
    supervisor: &Supervisor,
    plugin: &str,
    event: HookEvent,
    index: usize,
    entry: &HookEntry,
    places: &Placeholders<'_>,
) -> HookProbe {
    let mut probe = HookProbe {
        event,
        index,
        command: entry.command.clone(),
        ok: false,
        decision: None,
        error: None,
    };
    let input = json!({"version": 1, "event": event.as_str(), "plugin": plugin, "payload": sample_payload(event)});
    let input = input.to_string().into_bytes();
    debug_assert!(input.len() <= MAX_HOOK_INPUT_BYTES);
    let spec = spec(
        &entry.command,
        &entry.args,
        &entry.env,
        places.cwd(entry.cwd.as_deref()),
        places,
    );
    let limits = OutputLimits {
        stdout: MAX_HOOK_OUTPUT_BYTES,
        stderr: MAX_STDERR_BYTES,
    };
    let timeout = Duration::from_millis(entry.timeout_ms);
    match supervisor
        .run_once(&spec, Some(input), timeout, limits)
        .await
    {
        Err(e) => probe.error = Some(format!("cannot start `{}`: {e}", entry.command)),
        Ok(out) if out.timed_out => {
            probe.error = Some(format!("did not finish within {} ms", entry.timeout_ms))
        }
        Ok(out) if out.stdout_truncated => {
            probe.error = Some(format!(
                "wrote more than {MAX_HOOK_OUTPUT_BYTES} bytes to stdout"
            ))
        }
        Ok(out) if !out.status.success() => {
            probe.error = Some(format!("exited with {}", out.status))
        }
        Ok(out) => match decision(event, &out.stdout) {
            Ok(d) => {
                probe.ok = true;
                probe.decision = Some(d);
            }
            Err(e) => probe.error = Some(e),
        },
    }
    probe
}

/// The decision a hook's stdout states, in words; an error when invalid.
fn decision(event: HookEvent, out: &[u8]) -> Result<String, String> {
    let text = String::from_utf8_lossy(out);
    if text.trim().is_empty() {
        return Ok(if event == HookEvent::BeforeTool {
            "continue"
        } else {
            "observed"
        }
        .into());
    }
    let v: Value = serde_json::from_str(text.trim())
        .map_err(|_| "its output is not one JSON object".to_string())?;
    let obj = v.as_object().ok_or("its output is not a JSON object")?;
    match event {
        HookEvent::BeforeTool => match obj.get("decision").and_then(Value::as_str) {
            None | Some("continue") => Ok("continue".into()),
            Some("deny") => match obj.get("reason").and_then(Value::as_str) {
                Some(r) if !r.trim().is_empty() => {
                    Ok(format!("deny: {}", crate::model::diagnostics::clip(r)))
                }
                _ => Err("`deny` without a non-empty `reason`".into()),
            },
            Some("rewrite") if obj.get("arguments").is_some_and(Value::is_object) => {
                Ok("rewrite".into())
            }
            Some("rewrite") => Err("`rewrite` without an `arguments` object".into()),
            Some(other) => Err(format!(
                "unknown decision `{}`",
                crate::model::diagnostics::clip(other)
            )),
        },
        HookEvent::AfterTool if obj.contains_key("output") || obj.contains_key("is_error") => {
            Ok("replace output".into())
        }
        _ => Ok("observed".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions_are_read_and_checked() {
        let b = HookEvent::BeforeTool;
        assert_eq!(decision(b, b"").unwrap(), "continue");
        assert_eq!(
            decision(b, br#"{"decision":"deny","reason":"no"}"#).unwrap(),
            "deny: no"
        );
        assert!(decision(b, br#"{"decision":"deny","reason":" "}"#).is_err());
        assert!(decision(b, br#"{"decision":"rewrite"}"#).is_err());
        assert_eq!(
            decision(b, br#"{"decision":"rewrite","arguments":{}}"#).unwrap(),
            "rewrite"
        );
        assert!(decision(b, b"garbage").is_err());
        assert_eq!(
            decision(HookEvent::AfterTool, br#"{"output":"x"}"#).unwrap(),
            "replace output"
        );
        assert_eq!(decision(HookEvent::OnAgentEnd, b"{}").unwrap(), "observed");
    }
}
