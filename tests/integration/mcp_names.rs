//! The gateway's names and tool search through the real binary, the Python
//! `mcp` SDK as the client and `server-everything` upstream:
//! `[mcp] prefix = "on_conflict"` (an upstream's own names, the clashing
//! ones prefixed, calls, hooks' matchers and events by the tool's
//! `SERVER__TOOL` whatever it is listed as; resource URIs kept the same
//! way, `npc://SERVER/URI` where two servers list one), and
//! `[mcp] tools = "search"`
//! (`search_tools` then `call_tool`, a profile's `denied_tools` refused
//! through `call_tool` and never found, hooks still around the call).

use serde_json::{Value, json};

use crate::mcp::{
    call, error_text, ok_text, python_sdk, repo, server_everything, stdio_session, tool_call_events,
};
use crate::support::{npc_path, repo_root};

/// Two server-everything upstreams sharing `echo` only.
const TWO_UPSTREAMS: &str = "[mcp.servers.a]\ncommand = \"mcp-server-everything\"\nenabled_tools = [\"echo\", \"get-sum\"]\n\
[mcp.servers.b]\ncommand = \"mcp-server-everything\"\nenabled_tools = [\"echo\", \"get-tiny-image\"]\n";

/// A `before_tool` hook denying the calls its matcher meets.
fn denying_hook(matcher: &str) -> String {
    format!(
        "[[hooks.before_tool]]\ncommand = \"sh\"\nargs = [\"-c\", \"echo '{{\\\"decision\\\":\\\"deny\\\",\\\"reason\\\":\\\"hook says no\\\"}}'\"]\nmatcher = {matcher:?}\n"
    )
}

fn listed(step: &Value) -> Vec<String> {
    step["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn on_conflict_keeps_upstream_names_and_prefixes_the_clashing_ones() {
    if !python_sdk() || !server_everything() {
        return;
    }
    let dir = repo(&format!(
        "version = 1\n[mcp]\nprefix = \"on_conflict\"\n{TWO_UPSTREAMS}{}",
        denying_hook("^b__get-tiny-image$")
    ));
    let got = stdio_session(
        &dir,
        json!([
            ["list"],
            call("get-sum", json!({"a": 2, "b": 3})),
            call("b__echo", json!({"message": "from b"})),
            call("a__get-sum", json!({"a": 1, "b": 1})),
            call("get-tiny-image", json!({}))
        ]),
    );
    let tools = listed(&got[0]);
    let upstream: Vec<&str> = tools
        .iter()
        .map(String::as_str)
        .filter(|t| {
            ["echo", "get-sum", "get-tiny-image"]
                .iter()
                .any(|s| t.ends_with(s))
        })
        .collect();
    assert_eq!(
        upstream,
        ["a__echo", "get-sum", "b__echo", "get-tiny-image"],
        "{tools:?}"
    );
    assert!(ok_text(&got[1]).contains('5'), "{}", got[1]);
    assert_eq!(ok_text(&got[2]), "Echo: from b");
    assert!(
        error_text(&got[3]).contains("no tool `a__get-sum`"),
        "only listed names are called: {}",
        got[3]
    );
    // The hook's matcher names the tool `SERVER__TOOL`; it meets the call of
    // its unprefixed name.
    assert!(error_text(&got[4]).contains("hook says no"), "{}", got[4]);
    let events: Vec<(Value, Value, Value, Value)> = tool_call_events(&dir)
        .iter()
        .map(|e| {
            let p = &e["payload"];
            (
                p["name"].clone(),
                p["server"].clone(),
                p["tool"].clone(),
                p["outcome"].clone(),
            )
        })
        .collect();
    assert_eq!(
        events,
        [
            (json!("get-sum"), json!("a"), json!("get-sum"), json!("ok")),
            (json!("b__echo"), json!("b"), json!("echo"), json!("ok")),
            (
                json!("a__get-sum"),
                json!(null),
                json!(null),
                json!("unknown_tool")
            ),
            (
                json!("get-tiny-image"),
                json!("b"),
                json!("get-tiny-image"),
                json!("denied")
            ),
        ]
    );
}

#[test]
fn the_prefix_flag_overrides_the_manifest_for_one_gateway() {
    if !python_sdk() || !server_everything() {
        return;
    }
    let dir = repo(&format!("version = 1\n{TWO_UPSTREAMS}"));
    let out = assert_cmd::Command::new("python3")
        .arg(repo_root().join("fixtures/mcp/client.py"))
        .arg(json!([["list"]]).to_string())
        .args([
            "--",
            &npc_path().display().to_string(),
            "mcp",
            "serve",
            "--prefix",
            "on_conflict",
        ])
        .current_dir(dir.path())
        .timeout(std::time::Duration::from_secs(90))
        .output()
        .unwrap();
    let got = crate::mcp::client_answers(&out);
    let tools = listed(&got[0]);
    assert!(tools.contains(&"get-sum".to_string()), "{tools:?}");
    assert!(tools.contains(&"a__echo".to_string()), "{tools:?}");
    // Without the flag: every name prefixed.
    let got = stdio_session(&dir, json!([["list"]]));
    let tools = listed(&got[0]);
    assert!(tools.contains(&"a__get-sum".to_string()), "{tools:?}");
    assert!(!tools.contains(&"get-sum".to_string()), "{tools:?}");
}

/// A search mode repository: server-everything, a profile denying
/// `get-env`, a hook denying `echo` calls whose message says `forbidden`.
fn search_repo() -> tempfile::TempDir {
    repo(&format!(
        "version = 1\n[mcp]\ntools = \"search\"\n\
         [mcp.servers.everything]\ncommand = \"mcp-server-everything\"\n\
         [providers.c]\nkind = \"claude_code\"\n\
         [profiles.dev]\nprovider = \"c\"\ndescription = \"d\"\ndenied_tools = [\"mcp__everything__get-env\"]\n{}",
        "[[hooks.before_tool]]\ncommand = \"sh\"\nargs = [\"-c\", \"grep -q forbidden && echo '{\\\"decision\\\":\\\"deny\\\",\\\"reason\\\":\\\"hook says no\\\"}' || echo '{\\\"decision\\\":\\\"continue\\\"}'\"]\nmatcher = \"^everything__echo$\"\n"
    ))
}

fn found(step: &Value) -> Vec<Value> {
    let answer: Value = serde_json::from_str(ok_text(step)).unwrap();
    answer["tools"].as_array().unwrap().clone()
}

#[test]
fn search_mode_lists_two_tools_finds_then_calls_through_the_one_call_path() {
    if !python_sdk() || !server_everything() {
        return;
    }
    let dir = search_repo();
    let out = assert_cmd::Command::new("python3")
        .arg(repo_root().join("fixtures/mcp/client.py"))
        .arg(
            json!([
                ["list"],
                call(
                    "search_tools",
                    json!({"query": "echo message back", "limit": 3})
                ),
                call(
                    "search_tools",
                    json!({"query": "environment variables env", "limit": 50})
                ),
                call(
                    "call_tool",
                    json!({"name": "everything__echo", "arguments": {"message": "hi"}})
                ),
                call(
                    "call_tool",
                    json!({"name": "everything__get-env", "arguments": {}})
                ),
                call(
                    "call_tool",
                    json!({"name": "everything__echo", "arguments": {"message": "forbidden"}})
                ),
                call("call_tool", json!({"name": "nope__nothing"})),
                call("call_tool", json!({"arguments": {}}))
            ])
            .to_string(),
        )
        .args(["--", &npc_path().display().to_string(), "mcp", "serve"])
        .env("NPC_PROFILE", "dev")
        .current_dir(dir.path())
        .timeout(std::time::Duration::from_secs(90))
        .output()
        .unwrap();
    let got = crate::mcp::client_answers(&out);
    assert_eq!(listed(&got[0]), ["search_tools", "call_tool"]);
    let hits = found(&got[1]);
    assert_eq!(hits[0]["name"], "everything__echo", "{hits:?}");
    assert_eq!(
        hits[0]["inputSchema"]["properties"]["message"]["type"], "string",
        "full input schemas: {hits:?}"
    );
    assert!(hits.len() <= 3);
    let names: Vec<String> = found(&got[2])
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect();
    assert!(
        !names.contains(&"everything__get-env".to_string()),
        "a tool the profile may not call is never found: {names:?}"
    );
    assert_eq!(ok_text(&got[3]), "Echo: hi");
    let refused = error_text(&got[4]);
    assert!(refused.contains("denied_tools"), "{refused}");
    assert!(error_text(&got[5]).contains("hook says no"), "{}", got[5]);
    assert!(
        error_text(&got[6]).contains("search_tools"),
        "an unknown name points at the search: {}",
        got[6]
    );
    assert!(error_text(&got[7]).contains("`name`"), "{}", got[7]);
    let events: Vec<(Value, Value)> = tool_call_events(&dir)
        .iter()
        .map(|e| {
            (
                e["payload"]["name"].clone(),
                e["payload"]["outcome"].clone(),
            )
        })
        .collect();
    assert_eq!(
        events,
        [
            (json!("search_tools"), json!("ok")),
            (json!("search_tools"), json!("ok")),
            (json!("everything__echo"), json!("ok")),
            (json!("everything__get-env"), json!("denied")),
            (json!("everything__echo"), json!("denied")),
            (json!("nope__nothing"), json!("unknown_tool")),
            (json!("call_tool"), json!("unknown_tool")),
        ]
    );
}

#[test]
fn plan_reports_the_clashes_the_manifest_decides() {
    let dir = repo(
        "version = 1\n[mcp]\nprefix = \"on_conflict\"\n\
         [mcp.servers.a]\ncommand = \"mcp-server-everything\"\nenabled_tools = [\"echo\", \"get-sum\", \"fetch_url\"]\n\
         [mcp.servers.b]\ncommand = \"mcp-server-everything\"\nenabled_tools = [\"echo\", \"get-tiny-image\"]\n\
         [mcp.servers.c]\ncommand = \"mcp-server-everything\"\n",
    );
    let out = crate::support::npc()
        .args(["plan"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plan = String::from_utf8(out.stdout).unwrap();
    let names = &plan[plan.find("Gateway tool names").expect("a names section")..];
    insta::assert_snapshot!("on_conflict_plan_names", names);
    let out = crate::support::npc()
        .args(["plan", "--format", "json"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["mcp_names"]["known_at_run_time"], json!(["c"]));
    assert_eq!(doc["mcp_names"]["prefixed"][1]["name"], "a__fetch_url");
    assert_eq!(
        doc["mcp_names"]["prefixed"][1]["clashes_with"],
        json!(["npc"])
    );
}

#[test]
fn on_conflict_keeps_resource_uris_unless_two_servers_list_them() {
    if !python_sdk() {
        return;
    }
    let fixture = |name: &str| repo_root().join("fixtures/mcp").join(name);
    let server = |name: &str, file: &str| {
        format!(
            "[mcp.servers.{name}]\ncommand = \"python3\"\nargs = [{:?}]\n",
            fixture(file).display().to_string()
        )
    };
    let dir = repo(&format!(
        "version = 1\n[mcp]\nprefix = \"on_conflict\"\n{}{}{}",
        server("a", "catalog.py"),
        server("b", "catalog.py"),
        server("c", "conformance_server.py")
    ));
    let got = stdio_session(
        &dir,
        json!([
            ["resources"],
            ["templates"],
            ["read", "test://template/7/data"],
            ["read", "test://static-text"],
            ["read", "npc://b/mem://item/3"],
            ["read", "mem://one"]
        ]),
    );
    assert_eq!(
        got[0]["resources"],
        json!([
            "npc://a/mem://one",
            "npc://b/mem://one",
            "test://static-text",
            "test://static-binary",
            "test://watched-resource"
        ])
    );
    assert_eq!(
        got[1]["templates"],
        json!([
            "npc://a/mem://item/{id}",
            "npc://b/mem://item/{id}",
            "test://template/{id}/data"
        ])
    );
    let expansion = &got[2]["contents"][0];
    assert_eq!(expansion["uri"], "test://template/7/data", "{}", got[2]);
    assert!(expansion["text"].as_str().unwrap().contains("\"7\""));
    assert_eq!(got[3]["contents"][0]["uri"], "test://static-text");
    assert_eq!(got[4]["contents"][0]["uri"], "npc://b/mem://item/3");
    assert_eq!(got[4]["contents"][0]["text"], "item 3");
    assert!(
        got[5]["error"]
            .as_str()
            .unwrap()
            .contains("no resource `mem://one`"),
        "a URI two servers list is read by its gateway name only: {}",
        got[5]
    );
}
