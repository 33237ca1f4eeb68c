//! The plain-text strategies: the Codex marker fallback (`[ASSISTANT]`,
//! `[TOOL_CALL: name]`, `[TOOL_RESULT: name]`, `[IDLE]`) and the Gemini
//! interactive-screen reader (idle by marker strings such as `Ready.` and
//! `[End]`). Terminal escape sequences are stripped first.

use std::sync::LazyLock;

use regex::Regex;
use serde_json::Value;

use super::AgentEvent;

/// Lines (after trimming) that mean an interactive agent is idle.
pub const IDLE_MARKERS: [&str; 2] = ["Ready.", "[End]"];

static MARKER: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^\[(ASSISTANT|IDLE|TOOL_CALL:\s*([^\]]*)|TOOL_RESULT:\s*([^\]]*))\]\s?(.*)$")
        .expect("marker pattern is valid")
});

static ANSI: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|[@-Z\\-_])")
        .expect("escape pattern is valid")
});

/// The visible text of a terminal line.
pub fn strip_escapes(line: &str) -> std::borrow::Cow<'_, str> {
    ANSI.replace_all(line, "")
}

/// One line in the marker format.
pub fn regex_line(line: &str, out: &mut Vec<AgentEvent>) {
    let line = strip_escapes(line);
    let line = line.trim_end();
    if line.trim().is_empty() {
        return;
    }
    let Some(c) = MARKER.captures(line) else {
        out.push(AgentEvent::Message {
            text: line.to_string(),
            delta: false,
        });
        return;
    };
    let rest = c.get(4).map_or("", |m| m.as_str()).to_string();
    if let Some(name) = c.get(2) {
        let input = serde_json::from_str::<Value>(&rest).unwrap_or(Value::String(rest));
        out.push(AgentEvent::ToolCall {
            id: None,
            name: name.as_str().trim().to_string(),
            input,
        });
    } else if let Some(name) = c.get(3) {
        out.push(AgentEvent::ToolResult {
            id: None,
            name: Some(name.as_str().trim().to_string()),
            output: rest,
            is_error: false,
        });
    } else if &c[1] == "IDLE" {
        out.push(AgentEvent::Idle {
            status: "marker".to_string(),
            is_error: false,
            result: None,
        });
    } else {
        out.push(AgentEvent::Message {
            text: rest,
            delta: false,
        });
    }
}

/// One line of an interactive screen: idle markers or text.
pub fn screen_line(line: &str, out: &mut Vec<AgentEvent>) {
    let line = strip_escapes(line);
    let text = line.trim();
    if text.is_empty() {
        return;
    }
    if IDLE_MARKERS.contains(&text) {
        out.push(AgentEvent::Idle {
            status: "marker".to_string(),
            is_error: false,
            result: None,
        });
    } else {
        out.push(AgentEvent::Message {
            text: text.to_string(),
            delta: false,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn regex_all(lines: &[&str]) -> Vec<AgentEvent> {
        let mut out = Vec::new();
        for l in lines {
            regex_line(l, &mut out);
        }
        out
    }

    #[test]
    fn markers_map_to_events() {
        let got = regex_all(&[
            "[ASSISTANT] looking",
            "[TOOL_CALL: shell] {\"command\":\"ls\"}",
            "[TOOL_RESULT: shell] a.txt",
            "plain",
            "",
            "\x1b[1m[IDLE]\x1b[0m",
        ]);
        let types: Vec<_> = got.iter().map(AgentEvent::type_name).collect();
        assert_eq!(
            types,
            [
                "agent.message",
                "agent.tool_call",
                "agent.tool_result",
                "agent.message",
                "agent.idle"
            ]
        );
        assert_eq!(
            got[1],
            AgentEvent::ToolCall {
                id: None,
                name: "shell".into(),
                input: serde_json::json!({"command": "ls"})
            }
        );
        assert_eq!(
            got[0],
            AgentEvent::Message {
                text: "looking".into(),
                delta: false
            }
        );
    }

    #[test]
    fn screen_markers_are_idle_only_as_whole_lines() {
        let mut out = Vec::new();
        for l in [
            "Working…",
            "  Ready.  ",
            "Not Ready. yet",
            "\x1b[32m[End]\x1b[0m",
        ] {
            screen_line(l, &mut out);
        }
        let types: Vec<_> = out.iter().map(AgentEvent::type_name).collect();
        assert_eq!(
            types,
            ["agent.message", "agent.idle", "agent.message", "agent.idle"]
        );
    }
}
