//! Unit tests of `mcp`: namespacing, tool filtering, what a recorded call
//! keeps of its arguments, and the call path's stages around a real server
//! (`fixtures/mcp/misbehave.py`).

use std::sync::Arc;

use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::json;

use super::call::{MAX_RECORDED_ARGUMENT_BYTES, REDACTED, recorded_arguments};
use super::{
    Before, CallPath, CallStage, Pool, ToolCall, UpstreamState, expands, exposes, namespaced,
    resource_uri, split_resource_uri,
};
use crate::model::{McpServer, McpTransport, RestartPolicy};
use futures_util::future::BoxFuture;

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

/// The seam the hooks runner plugs into: a stage that denies one tool,
/// rewrites another's arguments, and replaces every result it sees.
#[derive(Debug, Default)]
struct Policy {
    seen: std::sync::Mutex<Vec<serde_json::Value>>,
}

impl CallStage for Policy {
    fn before<'a>(&'a self, call: &'a mut ToolCall) -> BoxFuture<'a, Before> {
        Box::pin(async move {
            if call.tool == "crash" {
                return Before::Deny {
                    reason: "crashing is not allowed here".into(),
                };
            }
            call.arguments = Some(json!({"rewritten": true}).as_object().unwrap().clone());
            Before::Continue
        })
    }

    fn after<'a>(
        &'a self,
        call: &'a ToolCall,
        result: &'a mut CallToolResult,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            self.seen.lock().unwrap().push(json!({
                "tool": call.tool,
                "arguments": call.arguments,
                "is_error": result.is_error,
            }));
            if result.is_error != Some(true) {
                *result = CallToolResult::success(vec![ContentBlock::text("replaced")]);
            }
        })
    }
}

struct NoFiles;
impl crate::model::Files for NoFiles {
    fn read_to_string(&self, _: &std::path::Path) -> std::io::Result<String> {
        Err(std::io::ErrorKind::NotFound.into())
    }
    fn is_dir(&self, _: &std::path::Path) -> bool {
        false
    }
}

fn text_of(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|c| match c {
            ContentBlock::Text(t) => Some(t.text.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn stages_deny_rewrite_and_replace_around_the_dispatch() {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/mcp/misbehave.py");
    let text = format!(
        "version = 1\n[mcp.servers.bad]\ncommand = \"python3\"\nargs = [{:?}]\n",
        script.display().to_string()
    );
    let env = std::collections::BTreeMap::<String, String>::new();
    let loaded = crate::model::load_bytes(
        "t.toml",
        text.as_bytes(),
        crate::model::Syntax::Toml,
        &env,
        &NoFiles,
    );
    let manifest = loaded.manifest.expect("valid manifest");
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join(".npc");
    crate::repofs::Root::new(dir.path())
        .unwrap()
        .ensure_state_dir(&state)
        .unwrap();
    let (events, _rx) = tokio::sync::mpsc::unbounded_channel();
    let supervisor = crate::supervisor::Supervisor::new(events, Default::default());
    let pool = Arc::new(Pool::new(
        &manifest,
        dir.path().to_path_buf(),
        state,
        supervisor.clone(),
    ));
    assert!(pool.connect_all().await.is_empty());
    let policy = Arc::new(Policy::default());
    let path = CallPath::new(pool.clone(), None).with_stage(policy.clone());

    let denied = path.call("bad__crash", None).await.unwrap();
    assert_eq!(denied.is_error, Some(true));
    assert!(
        text_of(&denied).contains("denied: crashing is not allowed here"),
        "{}",
        text_of(&denied)
    );
    let replaced = path
        .call("bad__ok", Some(serde_json::Map::new()))
        .await
        .unwrap();
    assert_eq!(text_of(&replaced), "replaced");
    let seen = policy.seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        [
            json!({"tool": "crash", "arguments": null, "is_error": true}),
            json!({"tool": "ok", "arguments": {"rewritten": true}, "is_error": null}),
        ]
    );
    assert_eq!(
        pool.states()["bad"],
        UpstreamState::Connected,
        "the denied crash never reached it"
    );
    pool.shutdown().await;
    supervisor.shutdown().await;
}

#[tokio::test]
async fn members_come_and_go_and_each_change_is_announced() {
    let dir = tempfile::tempdir().unwrap();
    let (events, _rx) = tokio::sync::mpsc::unbounded_channel();
    let supervisor = crate::supervisor::Supervisor::new(events, Default::default());
    let cx = crate::driver::DriverContext {
        repo: dir.path().to_path_buf(),
        state_dir: dir.path().join(".npc"),
        supervisor: supervisor.clone(),
    };
    let pool = Arc::new(Pool::empty(cx, super::client::pool::Launch::Owned, None));
    let mut changes = pool.subscribe_changes();
    let mut unreachable = server(None, &[]);
    unreachable.startup_timeout_ms = 2000;
    unreachable.transport = McpTransport::Http {
        url: crate::model::Text::plain("http://127.0.0.1:9/mcp"),
        headers: Default::default(),
        bearer_token_env: None,
    };
    pool.upsert("gone", &unreachable);
    changes.recv().await.unwrap();
    assert_eq!(pool.servers(), ["gone"]);
    // It fails alone, in the background.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    while !matches!(pool.states()["gone"], UpstreamState::Failed { .. }) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?}",
            pool.states()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let status = pool.status();
    assert_eq!(status[0].transport, "http");
    assert_eq!(status[0].tools, 0);
    // An edit of filters keeps the member (in place) and is announced.
    let mut edited = unreachable.clone();
    edited.disabled_tools = vec!["x".into()];
    while changes.try_recv().is_ok() {}
    pool.upsert("gone", &edited);
    changes.recv().await.unwrap();
    assert!(matches!(
        pool.states()["gone"],
        UpstreamState::Failed { .. }
    ));
    assert!(pool.remove("gone").await);
    changes.recv().await.unwrap();
    assert!(pool.servers().is_empty());
    assert!(!pool.remove("gone").await);
    supervisor.shutdown().await;
}

#[test]
fn always_prefixes_every_name() {
    let items = [("a", "echo"), ("b", "echo"), ("b", "add")];
    let names: Vec<String> = super::expose(super::Prefix::Always, items, |_| false)
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, ["a__echo", "b__echo", "b__add"]);
}

#[test]
fn on_conflict_prefixes_only_the_clashing_names() {
    let items = [
        ("a", "echo"),
        ("a", "fetch_url"),
        ("a", "read.file"),
        ("b", "echo"),
        ("b", "add"),
        ("c", "a__echo"),
    ];
    let exposed = super::expose(super::Prefix::OnConflict, items, |n| n == "fetch_url");
    let names: Vec<(&str, &str, &str)> = exposed
        .iter()
        .map(|e| (e.server.as_str(), e.own.as_str(), e.name.as_str()))
        .collect();
    assert_eq!(
        names,
        [
            // Two servers have `echo`: both prefixed.
            ("a", "echo", "a__echo"),
            // A built-in's name: prefixed.
            ("a", "fetch_url", "a__fetch_url"),
            // `read.file` is not portable either way: left out.
            ("b", "echo", "b__echo"),
            ("b", "add", "add"),
            // `a__echo` as its own name collides with an earlier one: left out.
        ]
    );
    // The same items give the same names every time.
    assert_eq!(
        super::expose(super::Prefix::OnConflict, items, |n| n == "fetch_url"),
        exposed
    );
}

#[test]
fn resource_uris_round_trip_verbatim() {
    let uri = resource_uri("fs", "file:///tmp/a b.txt");
    assert_eq!(uri, "npc://fs/file:///tmp/a b.txt");
    assert_eq!(
        split_resource_uri(&uri),
        Some(("fs", "file:///tmp/a b.txt"))
    );
    let template = resource_uri("every", "demo://resource/{id}");
    assert_eq!(
        split_resource_uri(&template.replace("{id}", "7")),
        Some(("every", "demo://resource/7"))
    );
    assert_eq!(split_resource_uri("npc://fs"), None);
    assert_eq!(split_resource_uri("npc:///x"), None);
    assert_eq!(split_resource_uri("file:///x"), None);
}

#[test]
fn template_expansions_are_recognised() {
    let t = "test://template/{id}/data";
    assert!(expands(t, "test://template/123/data"));
    assert!(expands(t, "test://template/a/b/data"));
    assert!(
        !expands(t, "test://template//data"),
        "an expression is not empty"
    );
    assert!(!expands(t, "test://template/123/date"));
    assert!(!expands(t, "test://other/123/data"));
    assert!(expands("file:///{+path}", "file:///tmp/x"));
    assert!(!expands("file:///{+path}", "file:///"));
    assert!(expands("a://{x}{y}-z", "a://12-z"));
    assert!(expands("a://plain", "a://plain"));
    assert!(!expands("a://plain", "a://plainer"));
    assert!(!expands("a://{broken", "a://broken"));
}

#[test]
fn a_passed_error_keeps_its_code_and_bounds_its_message_and_data() {
    use crate::mcp::call::{
        MAX_PASSED_ERROR_DATA_BYTES, MAX_PASSED_ERROR_MESSAGE_BYTES, passed_error,
    };
    let data = serde_json::json!({"elicitations": [{"mode": "url", "url": "https://example.com"}]});
    let small = rmcp::ErrorData::new(
        rmcp::model::ErrorCode(-32042),
        "open it",
        Some(data.clone()),
    );
    assert_eq!(passed_error(small.clone()), small);
    let huge = rmcp::ErrorData::new(
        rmcp::model::ErrorCode(-32042),
        "é".repeat(MAX_PASSED_ERROR_MESSAGE_BYTES),
        Some(serde_json::json!({"blob": "x".repeat(MAX_PASSED_ERROR_DATA_BYTES)})),
    );
    let passed = passed_error(huge);
    assert_eq!(passed.code.0, -32042);
    assert!(passed.message.len() <= MAX_PASSED_ERROR_MESSAGE_BYTES);
    assert!(passed.message.starts_with('é'));
    assert_eq!(passed.data, None);
}
