//! Unit tests of the pure parts of `mcp`: namespacing, tool filtering and
//! what a recorded call keeps of its arguments.

use serde_json::json;

use super::call::{MAX_RECORDED_ARGUMENT_BYTES, REDACTED, recorded_arguments};
use super::{exposes, namespaced};
use crate::model::{McpServer, McpTransport, RestartPolicy};

fn server(enabled: Option<&[&str]>, disabled: &[&str]) -> McpServer {
    McpServer {
        transport: McpTransport::Http {
            url: crate::model::Text::plain("https://example.invalid/mcp"),
            headers: Default::default(),
            bearer_token_env: None,
        },
        enabled: true,
        startup_timeout_ms: 1,
        tool_timeout_ms: 1,
        idle_timeout_s: 0,
        enabled_tools: enabled.map(|e| e.iter().map(|s| s.to_string()).collect()),
        disabled_tools: disabled.iter().map(|s| s.to_string()).collect(),
        restart: RestartPolicy::Never,
    }
}

#[test]
fn namespaced_names_are_portable() {
    assert_eq!(
        namespaced("fs", "read_file").as_deref(),
        Some("fs__read_file")
    );
    assert_eq!(
        namespaced("every-thing", "get-sum").as_deref(),
        Some("every-thing__get-sum")
    );
    assert_eq!(
        namespaced("fs", "read.file"),
        None,
        "dots are rejected by some CLIs"
    );
    assert_eq!(namespaced("fs", ""), None);
    assert_eq!(
        namespaced("fs", &"x".repeat(64)),
        None,
        "over the length limit"
    );
}

#[test]
fn enabled_and_disabled_tools_filter() {
    assert!(exposes(&server(None, &[]), "echo"));
    assert!(!exposes(&server(None, &["echo"]), "echo"));
    assert!(exposes(&server(Some(&["echo"]), &[]), "echo"));
    assert!(!exposes(&server(Some(&["add"]), &[]), "echo"));
    assert!(
        !exposes(&server(Some(&["echo"]), &["echo"]), "echo"),
        "disabled wins"
    );
}

#[test]
fn sensitive_arguments_are_redacted_and_large_ones_omitted() {
    let args = json!({"url": "https://x.test/?k=1", "q": "hi", "API_KEY": "abc"});
    let got = recorded_arguments("fetch_url", &args.as_object().cloned());
    assert_eq!(
        got,
        json!({"url": REDACTED, "q": "hi", "API_KEY": REDACTED})
    );
    let got = recorded_arguments("other", &args.as_object().cloned());
    assert_eq!(
        got["url"], "https://x.test/?k=1",
        "only `fetch_url`'s url is sensitive"
    );
    let big = json!({"text": "x".repeat(MAX_RECORDED_ARGUMENT_BYTES)});
    let got = recorded_arguments("echo", &big.as_object().cloned());
    assert!(got.get("omitted_bytes").is_some(), "{got}");
    assert_eq!(recorded_arguments("echo", &None), serde_json::Value::Null);
}
