//! The gateway (`npc mcp serve`) against real peers and hostile ones:
//! upstream servers that crash, hang, flood stdout or answer with invalid
//! JSON (`fixtures/mcp/hostile.py`) each cost one `isError` result and a
//! reconnect, never the gateway; resources and prompts pass through
//! (`fixtures/mcp/catalog.py`, server-everything); the reference
//! `server-filesystem` behind the pool; the TypeScript SDK
//! (`fixtures/mcp/client.mjs`) in front over stdio and HTTP; the MCP
//! conformance suite's server scenarios (`fixtures/mcp/conformance.py`).
//! Peers come from npm/PyPI (`.ci/run`); tests skip with a message only
//! where one is missing.

use serde_json::{Value, json};
use tempfile::TempDir;

use crate::mcp::{call, error_text, ok_text, python_sdk, repo, stdio_session, tool_call_events};
use crate::support::{Peer, repo_root, require};

fn hostile() -> String {
    repo_root()
        .join("fixtures/mcp/hostile.py")
        .display()
        .to_string()
}

/// A repository with the hostile server `h` (calls bounded by 1.5 s).
fn hostile_repo() -> TempDir {
    repo(&format!("version = 1\n{}", bad_server_section()))
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
    // Lost at the frame bound, not after the call's timeout: the line is
    // never buffered whole.
    let (message, outcome) = breaks_once_then_reconnects("stream");
    assert_eq!(outcome, "lost");
    assert!(message.contains("longer than"), "{message}");
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

fn catalog_server() -> String {
    repo_root()
        .join("fixtures/mcp/catalog.py")
        .display()
        .to_string()
}

#[test]
fn resources_and_prompts_pass_through_namespaced_with_manifest_prompts() {
    if !python_sdk() {
        return;
    }
    let dir = repo(&format!(
        "version = 1\n[mcp.servers.cat]\ncommand = \"python3\"\nargs = [{:?}]\n\
         [prompts.review]\ntemplate = \"Review {{{{ vars.branch }}}} for {{{{ vars.who }}}}\"\n\
         variables.branch = {{ default = \"main\" }}\nvariables.who = {{ description = \"reviewer\" }}\n",
        catalog_server()
    ));
    let got = stdio_session(
        &dir,
        json!([
            ["resources"],
            ["templates"],
            ["read", "npc://cat/mem://one"],
            ["read", "npc://cat/mem://item/7"],
            ["read", "mem://one"],
            ["read", "npc://nope/mem://one"],
            ["prompts"],
            ["prompt", "cat__greet", {"who": "ann"}],
            ["prompt", "review", {"who": "bob"}],
            ["prompt", "review", {}],
            call("cat__grow", json!({})),
            ["wait_resources_changed"],
            ["wait_prompts_changed"],
            ["resources"],
            ["prompts"]
        ]),
    );
    assert_eq!(got[0]["resources"], json!(["npc://cat/mem://one"]));
    assert_eq!(got[1]["templates"], json!(["npc://cat/mem://item/{id}"]));
    assert_eq!(
        got[2]["contents"],
        json!([{"uri": "npc://cat/mem://one", "text": "first"}])
    );
    assert_eq!(got[3]["contents"][0]["text"], "item 7", "{}", got[3]);
    assert_eq!(
        got[4]["contents"][0]["text"], "first",
        "a bare upstream URI one server lists is read too"
    );
    assert!(
        got[5]["error"].as_str().unwrap().contains("no resource"),
        "{}",
        got[5]
    );
    assert_eq!(
        got[6]["prompts"],
        json!([
            {"name": "review", "arguments": [["branch", false], ["who", true]]},
            {"name": "cat__greet", "arguments": [["who", true]]}
        ])
    );
    assert_eq!(got[7]["messages"], json!(["hello ann"]));
    assert_eq!(got[8]["messages"], json!(["Review main for bob"]));
    assert!(
        got[9]["error"].as_str().unwrap().contains("who"),
        "a required variable left out is an error naming it: {}",
        got[9]
    );
    assert_eq!(ok_text(&got[10]), "grown");
    assert_eq!(got[11]["resources_changed"], true);
    assert_eq!(got[12]["prompts_changed"], true);
    assert_eq!(
        got[13]["resources"],
        json!(["npc://cat/mem://one", "npc://cat/mem://two"])
    );
    let prompts: Vec<&str> = got[14]["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(prompts, ["review", "cat__greet", "cat__second"]);
    // Every read and get is recorded, failures with their reason.
    let reads = crate::mcp::events_of_kind(&dir, "mcp.resource_read");
    let uris: Vec<_> = reads.iter().map(|e| &e["payload"]["uri"]).collect();
    assert_eq!(
        uris,
        [
            "npc://cat/mem://one",
            "npc://cat/mem://item/7",
            "mem://one",
            "npc://nope/mem://one"
        ]
    );
    assert_eq!(reads[3]["payload"]["outcome"], "error");
    assert!(
        reads[3]["payload"]["error"]
            .as_str()
            .unwrap()
            .contains("no resource")
    );
    let gets = crate::mcp::events_of_kind(&dir, "mcp.prompt_get");
    let outcomes: Vec<_> = gets
        .iter()
        .map(|e| (&e["payload"]["name"], &e["payload"]["outcome"]))
        .collect();
    assert_eq!(
        outcomes,
        [
            (&json!("cat__greet"), &json!("ok")),
            (&json!("review"), &json!("ok")),
            (&json!("review"), &json!("error"))
        ]
    );
}

#[test]
fn server_everything_resources_and_prompts_pass_through() {
    if !python_sdk() || !crate::mcp::server_everything() {
        return;
    }
    let dir = repo("version = 1\n[mcp.servers.everything]\ncommand = \"mcp-server-everything\"\n");
    let doc = "npc://everything/demo://resource/static/document/architecture.md";
    let got = stdio_session(
        &dir,
        json!([
            ["resources"],
            ["read", doc],
            ["prompts"],
            ["prompt", "everything__args-prompt", {"city": "Lyon"}]
        ]),
    );
    let uris = got[0]["resources"].as_array().unwrap();
    assert!(uris.contains(&json!(doc)), "{uris:?}");
    assert_eq!(got[1]["contents"][0]["uri"], doc, "{}", got[1]);
    assert!(
        got[1]["contents"][0]["text"]
            .as_str()
            .unwrap()
            .contains("Everything Server"),
        "{}",
        got[1]
    );
    let prompts: Vec<&str> = got[2]["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert!(
        prompts.contains(&"everything__simple-prompt"),
        "{prompts:?}"
    );
    assert!(
        got[3]["messages"][0].as_str().unwrap().contains("Lyon"),
        "{}",
        got[3]
    );
}

/// Conformance scenarios the gateway passes with the suite's fixtures
/// (`fixtures/mcp/conformance_server.py`) behind it: all of them, the
/// suite's pending ones too; a scenario not listed here must be listed in
/// `docs/mcp-conformance.md` with why it fails.
const CONFORMANCE_PASSING: [&str; 32] = [
    "completion-complete",
    "dns-rebinding-protection",
    "elicitation-sep1034-defaults",
    "elicitation-sep1330-enums",
    "json-schema-2020-12",
    "logging-set-level",
    "ping",
    "prompts-get-embedded-resource",
    "prompts-get-simple",
    "prompts-get-with-args",
    "prompts-get-with-image",
    "prompts-list",
    "resources-list",
    "resources-read-binary",
    "resources-read-text",
    "resources-subscribe",
    "resources-templates-read",
    "resources-unsubscribe",
    "server-initialize",
    "server-sse-multiple-streams",
    "server-sse-polling",
    "tools-call-audio",
    "tools-call-elicitation",
    "tools-call-embedded-resource",
    "tools-call-error",
    "tools-call-image",
    "tools-call-mixed-content",
    "tools-call-sampling",
    "tools-call-simple-text",
    "tools-call-with-logging",
    "tools-call-with-progress",
    "tools-list",
];

#[test]
fn conformance_server_scenarios_against_the_http_gateway() {
    let out = assert_cmd::Command::new("python3")
        .arg(repo_root().join("fixtures/mcp/conformance.py"))
        .arg(crate::support::npc_path())
        .arg("--json")
        .timeout(std::time::Duration::from_secs(120))
        .output()
        .unwrap();
    // The script exits 3 when a peer it drives is missing, and says which.
    if !require(Peer::condition(
        String::from_utf8_lossy(&out.stderr).trim(),
        out.status.code() != Some(3),
        "npm install -g @modelcontextprotocol/conformance@0.1.13; pip install mcp",
    )) {
        return;
    }
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let results: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let doc = std::fs::read_to_string(repo_root().join("docs/mcp-conformance.md")).unwrap();
    for r in &results {
        let name = r["scenario"].as_str().unwrap();
        if CONFORMANCE_PASSING.contains(&name) {
            assert_eq!(r["failed"], 0, "{r}");
        } else {
            assert!(
                doc.contains(&format!("| `{name}` | fail |")),
                "scenario `{name}` is neither passing nor explained in docs/mcp-conformance.md: {r}"
            );
        }
    }
    let ran: Vec<&str> = results
        .iter()
        .map(|r| r["scenario"].as_str().unwrap())
        .collect();
    for name in CONFORMANCE_PASSING {
        assert!(
            ran.contains(&name),
            "scenario `{name}` did not run: {ran:?}"
        );
    }
}

#[test]
fn server_filesystem_reads_a_file_of_the_repository_through_the_gateway() {
    if !python_sdk()
        || !require(Peer::program(
            "mcp-server-filesystem",
            "npm install -g @modelcontextprotocol/server-filesystem zod",
        ))
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    std::fs::write(root.join("notes.txt"), "hello from a file\n").unwrap();
    std::fs::write(
        root.join("npcagent.toml"),
        format!(
            "version = 1\n[mcp.servers.fs]\ncommand = \"mcp-server-filesystem\"\nargs = [{:?}]\n",
            root.display().to_string()
        ),
    )
    .unwrap();
    let notes = root.join("notes.txt").display().to_string();
    let got = stdio_session(
        &dir,
        json!([
            ["list"],
            call("fs__read_text_file", json!({"path": notes})),
            call("fs__read_text_file", json!({"path": "/etc/hostname"}))
        ]),
    );
    let tools = got[0]["tools"].as_array().unwrap();
    assert!(tools.contains(&json!("fs__read_text_file")), "{tools:?}");
    assert_eq!(ok_text(&got[1]), "hello from a file\n");
    assert!(
        error_text(&got[2]).contains("outside allowed directories"),
        "the server's own refusal passes through as an isError result"
    );
}

/// Runs `fixtures/mcp/client.mjs` (the TypeScript SDK) with `steps`; `None`
/// when node or the SDK is missing.
fn typescript_session(dir: &TempDir, steps: &Value, endpoint: &[&str]) -> Option<Vec<Value>> {
    let root = std::process::Command::new("npm")
        .args(["root", "-g"])
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let out = assert_cmd::Command::new("node")
        .arg(repo_root().join("fixtures/mcp/client.mjs"))
        .arg(steps.to_string())
        .args(endpoint)
        .env("NODE_PATH", String::from_utf8_lossy(&root.stdout).trim())
        .env(
            "MCP_BEARER",
            std::fs::read_to_string(dir.path().join(".npc/api.token")).unwrap_or_default(),
        )
        .current_dir(dir.path())
        .timeout(std::time::Duration::from_secs(90))
        .output()
        .unwrap();
    // client.mjs exits 3 when the TypeScript SDK is missing, and says so.
    if !require(Peer::condition(
        String::from_utf8_lossy(&out.stderr).trim(),
        out.status.code() != Some(3),
        "npm install -g @modelcontextprotocol/sdk",
    )) {
        return None;
    }
    assert!(
        out.status.success(),
        "client.mjs failed: {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Some(
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect(),
    )
}

#[test]
fn typescript_sdk_client_uses_the_gateway_over_stdio_and_http() {
    if !require(Peer::program("node", "apt-get install nodejs"))
        || !crate::mcp::server_everything()
        || !crate::mcp::python_sdk()
    {
        return;
    }
    let dir = repo(&format!(
        "version = 1\n[mcp.servers.everything]\ncommand = \"mcp-server-everything\"\n\
         [mcp.servers.cat]\ncommand = \"python3\"\nargs = [{:?}]\n",
        catalog_server()
    ));
    let steps = json!([
        ["list"],
        call("everything__echo", json!({"message": "from typescript"})),
        call("nope__x", json!({})),
        ["resources"],
        ["read", "npc://cat/mem://item/3"],
        ["prompts"],
        ["prompt", "cat__greet", {"who": "ts"}]
    ]);
    let npc = crate::support::npc_path().display().to_string();
    let Some(stdio) = typescript_session(&dir, &steps, &["--", &npc, "mcp", "serve"]) else {
        return;
    };
    let (gateway, url) = crate::mcp::spawn_http_gateway(&dir);
    let http = typescript_session(&dir, &steps, &["--http", &url]).unwrap();
    crate::mcp::sigterm_exits_0(gateway);
    for got in [&stdio, &http] {
        assert!(
            got[0]["tools"]
                .as_array()
                .unwrap()
                .contains(&json!("everything__echo")),
            "{}",
            got[0]
        );
        assert_eq!(ok_text(&got[1]), "Echo: from typescript");
        assert!(error_text(&got[2]).contains("no tool `nope__x`"));
        assert!(
            got[3]["resources"]
                .as_array()
                .unwrap()
                .contains(&json!("npc://cat/mem://one")),
            "{}",
            got[3]
        );
        assert_eq!(got[4]["contents"][0]["text"], "item 3", "{}", got[4]);
        assert!(
            got[5]["prompts"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == "everything__simple-prompt"),
            "{}",
            got[5]
        );
        assert_eq!(got[6]["messages"], json!(["hello ts"]));
    }
}

#[test]
fn deprecated_sse_server_is_a_clear_error_and_costs_only_itself() {
    if !python_sdk() || !crate::mcp::server_everything() {
        return;
    }
    // server-everything's HTTP+SSE transport (protocol 2024-11-05), bound
    // to 127.0.0.1 by the loopback preload.
    let (_old, port) = crate::mcp::everything_listening("sse");
    let dir = repo(&format!(
        "version = 1\n[mcp.servers.old]\nurl = \"http://127.0.0.1:{port}/sse\"\n{}",
        bad_server_section()
    ));
    let got = stdio_session(&dir, json!([["list"], call("h__pid", json!({}))]));
    let upstream = crate::mcp::upstream_tools(&got[0]);
    assert!(!upstream.is_empty(), "{}", got[0]);
    assert!(
        upstream
            .iter()
            .all(|t| t.as_str().unwrap().starts_with("h__")),
        "{}",
        got[0]
    );
    ok_text(&got[1]);
    let failures = crate::mcp::events_of_kind(&dir, "mcp.server_failed");
    assert_eq!(failures.len(), 1, "{failures:?}");
    let reason = failures[0]["payload"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("`old`") && reason.contains("deprecated HTTP+SSE transport"),
        "{reason}"
    );
}

/// The hostile server `h` as a manifest section.
fn bad_server_section() -> String {
    format!(
        "[mcp.servers.h]\ncommand = \"python3\"\nargs = [{:?}]\ntool_timeout_ms = 1500\n",
        hostile()
    )
}
