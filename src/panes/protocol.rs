//! The pane-plugin protocol, version 3 (nightcrow's): NDJSON over a plugin
//! child's stdin (host → plugin, tagged by `event`) and stdout (plugin →
//! host, tagged by `cmd`). These serde types are the one definition of the
//! wire; `schemas/pane-protocol.schema.json` is generated from them.
//!
//! [`decode_command`] checks only shape and size: the version, the JSON,
//! known kinds and fields, string lengths, no line breaks or NUL bytes where
//! a line break could smuggle a second command. Whether a command may run
//! is decided by the guard alone (`panes::guard::Guard::judge`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The protocol version every message carries in `v`.
pub const PROTOCOL_VERSION: u32 = 3;
/// Longest line either side sends, without its newline.
pub const MAX_LINE_BYTES: usize = 64 * 1024;
/// Longest `send_input` data.
pub const MAX_SEND_INPUT_BYTES: usize = 8 * 1024;
/// Longest text of one `pane_output` message: the JSON of the message
/// (escapes included, up to 6 bytes a character) stays under [`MAX_LINE_BYTES`].
pub const MAX_OUTPUT_TEXT_BYTES: usize = 8 * 1024;
/// Longest pane token a command may name.
pub const MAX_TOKEN_BYTES: usize = 64;
/// Most arguments a `relaunch` may add.
pub const MAX_RESUME_ARGS: usize = 16;
/// Longest single resume argument.
pub const MAX_RESUME_ARG_BYTES: usize = 256;
/// Longest `status` state label.
pub const MAX_STATE_BYTES: usize = 64;
/// Longest `status` detail or `log` message.
pub const MAX_TEXT_BYTES: usize = 1024;

/// Host → plugin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "event", rename_all = "snake_case", deny_unknown_fields)]
pub enum HostEvent {
    /// A pane this plugin watches was opened (or relaunched, with a new generation).
    PaneOpened {
        v: u32,
        token: String,
        generation: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        title: Option<String>,
        /// The launch command line (secret values redacted).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        command: Option<String>,
        cwd: String,
    },
    /// Output of the pane, escape sequences stripped.
    PaneOutput {
        v: u32,
        token: String,
        generation: u64,
        text: String,
    },
    /// The pane printed nothing for `idle_ms`.
    PaneIdle {
        v: u32,
        token: String,
        generation: u64,
        idle_ms: u64,
    },
    /// The pane's process exited.
    PaneExited {
        v: u32,
        token: String,
        generation: u64,
    },
    /// The pane is gone (closed, or its relaunch hold ended).
    PaneClosed {
        v: u32,
        token: String,
        generation: u64,
    },
    /// A user typed into the pane.
    UserInput {
        v: u32,
        token: String,
        generation: u64,
    },
    /// The host is stopping this plugin.
    Shutdown { v: u32 },
}

pub use crate::event::LogLevel;

/// Plugin → host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "cmd", rename_all = "snake_case", deny_unknown_fields)]
pub enum PluginCommand {
    /// Type `data` into an idle pane.
    SendInput {
        v: u32,
        token: String,
        generation: u64,
        #[schemars(length(max = 8192))]
        data: String,
    },
    /// Run an exited pane's launch command again with `resume_args` added.
    Relaunch {
        v: u32,
        token: String,
        generation: u64,
        resume_args: Vec<String>,
    },
    /// Report the pane's state (broadcast to every client).
    Status {
        v: u32,
        token: String,
        generation: u64,
        state: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        detail: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        deadline_epoch: Option<i64>,
        #[serde(default)]
        attempt: u32,
    },
    /// Ask to watch the pane holding `token`.
    WatchPane { v: u32, token: String },
    /// The pane needs a person.
    Attention {
        v: u32,
        token: String,
        generation: u64,
    },
    /// A line for npc's log.
    Log {
        v: u32,
        level: LogLevel,
        #[schemars(length(max = 1024))]
        message: String,
    },
}

impl PluginCommand {
    /// The command's wire name.
    pub fn name(&self) -> &'static str {
        match self {
            Self::SendInput { .. } => "send_input",
            Self::Relaunch { .. } => "relaunch",
            Self::Status { .. } => "status",
            Self::WatchPane { .. } => "watch_pane",
            Self::Attention { .. } => "attention",
            Self::Log { .. } => "log",
        }
    }
}

/// Why a plugin's line was not a command.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("line longer than {MAX_LINE_BYTES} bytes")]
    Oversize,
    #[error("line is not UTF-8")]
    NotUtf8,
    #[error("malformed JSON: {0}")]
    Malformed(String),
    #[error("protocol version `{0}` is not {PROTOCOL_VERSION}")]
    Version(String),
    #[error("unknown command `{0}`")]
    UnknownKind(String),
    #[error("field `{field}` is over {max} bytes")]
    FieldTooLong { field: &'static str, max: usize },
    #[error("field `{0}` holds a line break or NUL byte")]
    Newline(&'static str),
    #[error("`relaunch` has more than {MAX_RESUME_ARGS} resume arguments")]
    TooManyArgs,
}

/// The commands a plugin may send, by wire name.
const COMMAND_NAMES: [&str; 6] = [
    "send_input",
    "relaunch",
    "status",
    "watch_pane",
    "attention",
    "log",
];

/// Decode one line (without its newline; `truncated` when the reader cut it
/// at [`MAX_LINE_BYTES`]). `Ok(None)` for a blank line.
pub fn decode_command(line: &[u8], truncated: bool) -> Result<Option<PluginCommand>, DecodeError> {
    if truncated || line.len() > MAX_LINE_BYTES {
        return Err(DecodeError::Oversize);
    }
    let text = std::str::from_utf8(line).map_err(|_| DecodeError::NotUtf8)?;
    if text.trim().is_empty() {
        return Ok(None);
    }
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| DecodeError::Malformed(e.to_string()))?;
    let Some(object) = value.as_object() else {
        return Err(DecodeError::Malformed("not a JSON object".into()));
    };
    match object.get("v") {
        Some(v) if v.as_u64() == Some(u64::from(PROTOCOL_VERSION)) => {}
        Some(v) => return Err(DecodeError::Version(clip(&v.to_string()))),
        None => return Err(DecodeError::Version("missing".into())),
    }
    match object.get("cmd").and_then(|c| c.as_str()) {
        Some(name) if COMMAND_NAMES.contains(&name) => {}
        Some(name) => return Err(DecodeError::UnknownKind(clip(name))),
        None => return Err(DecodeError::Malformed("no `cmd`".into())),
    }
    let command: PluginCommand =
        serde_json::from_value(value).map_err(|e| DecodeError::Malformed(e.to_string()))?;
    check_sizes(&command)?;
    Ok(Some(command))
}

fn clip(s: &str) -> String {
    s.chars().take(40).collect()
}

/// A single-line field: bounded, no line break, no NUL.
fn one_line(field: &'static str, value: &str, max: usize) -> Result<(), DecodeError> {
    if value.len() > max {
        return Err(DecodeError::FieldTooLong { field, max });
    }
    if value.contains(['\n', '\r', '\0']) {
        return Err(DecodeError::Newline(field));
    }
    Ok(())
}

fn check_sizes(command: &PluginCommand) -> Result<(), DecodeError> {
    let token = |t: &str| one_line("token", t, MAX_TOKEN_BYTES);
    match command {
        PluginCommand::SendInput { token: t, data, .. } => {
            token(t)?;
            if data.len() > MAX_SEND_INPUT_BYTES {
                return Err(DecodeError::FieldTooLong {
                    field: "data",
                    max: MAX_SEND_INPUT_BYTES,
                });
            }
            if data.contains('\0') {
                return Err(DecodeError::Newline("data"));
            }
        }
        PluginCommand::Relaunch {
            token: t,
            resume_args,
            ..
        } => {
            token(t)?;
            if resume_args.len() > MAX_RESUME_ARGS {
                return Err(DecodeError::TooManyArgs);
            }
            for a in resume_args {
                one_line("resume_args", a, MAX_RESUME_ARG_BYTES)?;
            }
        }
        PluginCommand::Status {
            token: t,
            state,
            detail,
            ..
        } => {
            token(t)?;
            one_line("state", state, MAX_STATE_BYTES)?;
            if let Some(d) = detail {
                one_line("detail", d, MAX_TEXT_BYTES)?;
            }
        }
        PluginCommand::WatchPane { token: t, .. } | PluginCommand::Attention { token: t, .. } => {
            token(t)?
        }
        PluginCommand::Log { message, .. } => one_line("message", message, MAX_TEXT_BYTES)?,
    }
    Ok(())
}

/// One host message as a line (with its newline).
pub fn encode_event(event: &HostEvent) -> Vec<u8> {
    let mut bytes = serde_json::to_vec(event).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

/// The JSON Schema of both directions of the wire.
pub fn json_schema() -> serde_json::Value {
    #[derive(JsonSchema)]
    #[allow(dead_code)]
    /// A line of the pane-plugin protocol v3: a host event or a plugin command.
    enum PaneProtocolLine {
        Host(HostEvent),
        Plugin(PluginCommand),
    }
    let schema = schemars::schema_for!(PaneProtocolLine);
    serde_json::to_value(schema).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(s: &str) -> Result<Option<PluginCommand>, DecodeError> {
        decode_command(s.as_bytes(), false)
    }

    #[test]
    fn commands_round_trip() {
        let cmd = PluginCommand::Relaunch {
            v: 3,
            token: "t".into(),
            generation: 2,
            resume_args: vec!["resume".into(), "abc".into()],
        };
        let line = serde_json::to_string(&cmd).unwrap();
        assert_eq!(decode(&line).unwrap(), Some(cmd));
        assert_eq!(decode("   ").unwrap(), None);
    }

    #[test]
    fn shape_errors_are_named() {
        assert!(matches!(decode("{"), Err(DecodeError::Malformed(_))));
        assert!(matches!(
            decode(r#"{"v":2,"cmd":"log","level":"info","message":"x"}"#),
            Err(DecodeError::Version(_))
        ));
        assert!(matches!(
            decode(r#"{"v":3,"cmd":"rm_rf"}"#),
            Err(DecodeError::UnknownKind(_))
        ));
        assert!(matches!(
            decode(r#"{"v":3,"cmd":"log","level":"info","message":"x","extra":1}"#),
            Err(DecodeError::Malformed(_))
        ));
        assert!(matches!(
            decode(
                r#"{"v":3,"cmd":"relaunch","token":"t","generation":1,"resume_args":["a\nrm -rf /"]}"#
            ),
            Err(DecodeError::Newline("resume_args"))
        ));
        let big = "x".repeat(MAX_SEND_INPUT_BYTES + 1);
        let line =
            format!(r#"{{"v":3,"cmd":"send_input","token":"t","generation":1,"data":"{big}"}}"#);
        assert!(matches!(
            decode(&line),
            Err(DecodeError::FieldTooLong { field: "data", .. })
        ));
        assert_eq!(decode_command(b"{}", true), Err(DecodeError::Oversize));
        assert_eq!(decode_command(b"\xff", false), Err(DecodeError::NotUtf8));
    }

    #[test]
    fn the_schema_file_is_current() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("schemas/pane-protocol.schema.json");
        let text = serde_json::to_string_pretty(&json_schema()).unwrap() + "\n";
        if std::env::var_os("NPC_UPDATE_SCHEMAS").is_some() {
            std::fs::write(&path, &text).unwrap();
        }
        let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
        assert_eq!(
            on_disk, text,
            "schemas/pane-protocol.schema.json is stale; run the test with NPC_UPDATE_SCHEMAS=1"
        );
    }

    proptest::proptest! {
        #[test]
        fn the_decoder_never_panics_and_bounds_what_it_accepts(line in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512), truncated in proptest::prelude::any::<bool>()) {
            if let Ok(Some(cmd)) = decode_command(&line, truncated) {
                proptest::prop_assert!(!truncated);
                proptest::prop_assert!(check_sizes(&cmd).is_ok());
            }
        }

        #[test]
        fn json_shaped_lines_decode_or_fail_cleanly(
            cmd in proptest::sample::select(vec!["send_input", "relaunch", "status", "watch_pane", "attention", "log", "other"]),
            v in 0u32..5,
            token in "[a-z0-9\n]{0,80}",
            data in ".{0,40}",
            args in proptest::collection::vec("[-a-z;|&$\n ]{0,10}", 0..20),
        ) {
            let line = serde_json::json!({"v": v, "cmd": cmd, "token": token, "generation": 1, "data": data, "resume_args": args, "state": data, "level": "info", "message": data});
            let decoded = decode_command(line.to_string().as_bytes(), false);
            if let Ok(Some(c)) = decoded {
                proptest::prop_assert_eq!(v, PROTOCOL_VERSION);
                proptest::prop_assert!(check_sizes(&c).is_ok());
                proptest::prop_assert!(!token.contains('\n'));
            }
        }
    }
}
