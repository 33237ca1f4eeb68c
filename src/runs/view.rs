//! The compact, readable terminal view of a run's agent events (what
//! `npc run` prints without `--format json`): one short line per event,
//! with long text cut at [`MAX_VIEW_CHARS`]. Every line quotes the agent's
//! own output, so it comes out through [`crate::stdx::term::printable`]:
//! an agent (or a tool result it echoes) cannot drive the terminal.

use crate::providers::AgentEvent;
use crate::stdx::term::printable;

/// Longest tool input or output shown on one line, in characters.
pub const MAX_VIEW_CHARS: usize = 160;

/// Which terminal stream a line belongs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// The line for `event`, and where to print it; `None` for events not
/// shown. Controls in it are escaped (newlines and tabs stay).
pub fn line(event: &AgentEvent) -> Option<(Stream, String)> {
    let (stream, text) = unescaped(event)?;
    Some((stream, printable(&text).into_owned()))
}

fn unescaped(event: &AgentEvent) -> Option<(Stream, String)> {
    let out = |s: String| Some((Stream::Stdout, s));
    match event {
        AgentEvent::Started { session_id, model } => out(format!(
            "· session {}{}",
            session_id.as_deref().unwrap_or("?"),
            model
                .as_deref()
                .map(|m| format!(" ({m})"))
                .unwrap_or_default()
        )),
        AgentEvent::Message { text, .. } => out(text.trim_end().to_string()),
        AgentEvent::ToolCall { name, input, .. } => {
            out(format!("→ {name} {}", cut(&input.to_string())))
        }
        AgentEvent::ToolResult {
            name,
            output,
            is_error,
            ..
        } => out(format!(
            "← {}{} {}",
            name.as_deref().unwrap_or("tool"),
            if *is_error { " failed:" } else { "" },
            cut(&one_line(output))
        )),
        AgentEvent::Usage {
            input_tokens,
            output_tokens,
            cost_usd,
            ..
        } => {
            let mut parts = Vec::new();
            if let Some(n) = input_tokens {
                parts.push(format!("{n} in"));
            }
            if let Some(n) = output_tokens {
                parts.push(format!("{n} out"));
            }
            if let Some(c) = cost_usd {
                parts.push(format!("${c:.4}"));
            }
            if parts.is_empty() {
                None
            } else {
                out(format!("· tokens {}", parts.join(", ")))
            }
        }
        AgentEvent::Denied { tool, rule, .. } => Some((
            Stream::Stderr,
            format!("✗ {tool} refused by the agent CLI ({rule})"),
        )),
        AgentEvent::Idle {
            status, is_error, ..
        } => out(if *is_error {
            format!("✗ turn failed ({status})")
        } else {
            format!("✓ done ({status})")
        }),
        AgentEvent::Error { kind, message } => Some((
            Stream::Stderr,
            format!(
                "! {}: {}",
                serde_json::to_value(kind)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default(),
                cut(&one_line(message))
            ),
        )),
        AgentEvent::Notice { text } => {
            Some((Stream::Stderr, format!("· {}", cut(&one_line(text)))))
        }
        // Reasoning fragments and tool progress are recorded, not printed.
        AgentEvent::Thought(_) | AgentEvent::ToolUpdate(_) => None,
        AgentEvent::Plan(plan) => out(format!(
            "· plan: {}",
            cut(&plan
                .entries
                .iter()
                .map(|e| format!("[{}] {}", e.status, one_line(&e.content)))
                .collect::<Vec<_>>()
                .join("; "))
        )),
        AgentEvent::Mode(mode) => out(format!("· mode {}", mode.mode)),
        AgentEvent::DriftDetected {
            provider,
            ratio,
            from,
            to,
            ..
        } => Some((
            Stream::Stderr,
            format!(
                "! {} output drifted from its recorded fixtures (similarity {ratio:.2}); reading it with `{}` instead of `{}`",
                provider.as_str(),
                to.as_str(),
                from.as_str()
            ),
        )),
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn cut(text: &str) -> String {
    match text.char_indices().nth(MAX_VIEW_CHARS) {
        None => text.to_string(),
        Some((at, _)) => format!("{}…", &text[..at]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::ErrorKind;

    #[test]
    fn tool_calls_and_results_are_one_short_line() {
        let call = AgentEvent::ToolCall {
            id: None,
            name: "Bash".into(),
            input: serde_json::json!({"command": "x".repeat(1000)}),
        };
        let (stream, text) = line(&call).unwrap();
        assert_eq!(stream, Stream::Stdout);
        assert!(text.starts_with("→ Bash {\"command\""));
        assert!(text.ends_with('…'));
        assert!(text.chars().count() <= MAX_VIEW_CHARS + 10);
        let result = AgentEvent::ToolResult {
            id: None,
            name: Some("Bash".into()),
            output: "a\nb\n".into(),
            is_error: true,
        };
        assert_eq!(line(&result).unwrap().1, "← Bash failed: a b");
    }

    #[test]
    fn errors_go_to_stderr_and_empty_usage_is_hidden() {
        let err = AgentEvent::Error {
            kind: ErrorKind::NotJson,
            message: "bad".into(),
        };
        assert_eq!(line(&err), Some((Stream::Stderr, "! not_json: bad".into())));
        let usage = AgentEvent::Usage {
            input_tokens: None,
            output_tokens: None,
            cached_input_tokens: None,
            cost_usd: None,
        };
        assert_eq!(line(&usage), None);
    }

    #[test]
    fn agent_text_cannot_drive_the_terminal() {
        let message = AgentEvent::Message {
            text: "hi\x1b]52;c;ZXZpbA==\x07\u{9b}2J\rdone\nnext".into(),
            delta: false,
        };
        assert_eq!(
            line(&message).unwrap().1,
            "hi\\x1b]52;c;ZXZpbA==\\x07\\x9b2J\\x0ddone\nnext"
        );
        let call = AgentEvent::ToolCall {
            id: None,
            name: "Bash\x1b[2J".into(),
            input: serde_json::json!({"c": "\u{9b}"}),
        };
        let (_, text) = line(&call).unwrap();
        assert!(!text.chars().any(crate::stdx::term::escapes), "{text:?}");
    }

    #[test]
    fn cut_respects_char_boundaries() {
        let text = "é".repeat(MAX_VIEW_CHARS + 1);
        let c = cut(&text);
        assert_eq!(c.chars().count(), MAX_VIEW_CHARS + 1);
        assert!(c.ends_with('…'));
    }
}
