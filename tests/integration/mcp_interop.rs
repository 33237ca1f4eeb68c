//! The gateway (`npc mcp serve`) against real peers and hostile ones:
//! upstream servers that crash, hang, flood stdout or answer with invalid
//! JSON (`fixtures/mcp/hostile.py`) each cost one `isError` result and a
//! reconnect, never the gateway.

use serde_json::{Value, json};
use tempfile::TempDir;

use crate::mcp::{call, error_text, ok_text, python_sdk, repo, stdio_session, tool_call_events};
use crate::support::repo_root;

fn hostile() -> String {
    repo_root()
        .join("fixtures/mcp/hostile.py")
        .display()
        .to_string()
}

/// A repository with the hostile server `h` (calls bounded by 1.5 s).
fn hostile_repo() -> TempDir {
    repo(&format!(
        "version = 1\n[mcp.servers.h]\ncommand = \"python3\"\nargs = [{:?}]\ntool_timeout_ms = 1500\n",
        hostile()
    ))
}

/// Calls `h__pid`, then the breaking `tool`, then `h__pid` again: the
/// breaking call is one `isError` result naming the server, the gateway
/// keeps serving and the next call runs in a new server process. Returns
/// the error message and the recorded outcome of the breaking call.
fn breaks_once_then_reconnects(tool: &str) -> (String, Value) {
    let dir = hostile_repo();
    let got = stdio_session(
        &dir,
        json!([
            call("h__pid", json!({})),
            call(&format!("h__{tool}"), json!({})),
            call("h__pid", json!({}))
        ]),
    );
    let before = ok_text(&got[0]).to_string();
    let message = error_text(&got[1]).to_string();
    assert!(
        message.contains("`h`"),
        "the error names the server: {message}"
    );
    let after = ok_text(&got[2]);
    assert_ne!(after, before, "`{tool}` cost a reconnect (a new process)");
    let outcomes: Vec<Value> = tool_call_events(&dir)
        .iter()
        .map(|e| e["payload"]["outcome"].clone())
        .collect();
    assert_eq!(outcomes.len(), 3, "{outcomes:?}");
    assert_eq!((&outcomes[0], &outcomes[2]), (&json!("ok"), &json!("ok")));
    (message, outcomes[1].clone())
}

#[test]
fn upstream_crashing_mid_call_costs_one_error_and_a_reconnect() {
    if !python_sdk() {
        return;
    }
    let (message, outcome) = breaks_once_then_reconnects("crash");
    assert_eq!(outcome, "lost");
    assert!(message.contains("reconnected"), "{message}");
}

#[test]
fn upstream_hanging_costs_one_timeout_and_a_reconnect() {
    if !python_sdk() {
        return;
    }
    let (message, outcome) = breaks_once_then_reconnects("hang");
    assert_eq!(outcome, "timeout");
    assert!(
        message.contains("`tool_timeout_ms` of 1500 ms"),
        "{message}"
    );
}

#[test]
fn upstream_flooding_stdout_with_an_endless_line_costs_one_error_and_a_reconnect() {
    if !python_sdk() {
        return;
    }
    let (_, outcome) = breaks_once_then_reconnects("stream");
    assert_eq!(outcome, "timeout");
}

#[test]
fn upstream_flooding_stdout_with_junk_lines_costs_one_error_and_a_reconnect() {
    if !python_sdk() {
        return;
    }
    let (_, outcome) = breaks_once_then_reconnects("spam");
    assert_eq!(outcome, "timeout");
}

#[test]
fn upstream_answering_with_truncated_json_costs_one_error_and_a_reconnect() {
    if !python_sdk() {
        return;
    }
    let (_, outcome) = breaks_once_then_reconnects("badjson");
    assert_eq!(outcome, "timeout");
}

#[test]
fn upstream_answering_with_a_wrong_result_shape_costs_one_error_and_a_reconnect() {
    if !python_sdk() {
        return;
    }
    let (message, _) = breaks_once_then_reconnects("wrongshape");
    assert!(message.contains("`h`"), "{message}");
}

#[test]
fn upstream_closing_its_stdout_costs_one_error_and_a_reconnect() {
    if !python_sdk() {
        return;
    }
    let (_, outcome) = breaks_once_then_reconnects("closeout");
    assert_eq!(outcome, "lost");
}
