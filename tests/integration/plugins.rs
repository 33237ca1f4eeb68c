//! Agent Plugins 1.0 packages through the real binary: `npc plugin
//! validate` on the fixture packages in `fixtures/plugins/` and on packages
//! built at run time (symbolic links leaving the package). Every item of
//! the specification's conformance checklist (Appendix A) has a test named
//! after its section (`s5_3_…` is §5.3).

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::support::{npc, repo_root};

const FIXTURES: &str = "fixtures/plugins";
const PLUGIN_SCHEMA: &str = "https://agent-plugins.org/schemas/1.0.0/plugin.schema.json";
const MCP_SCHEMA: &str = "https://agent-plugins.org/schemas/1.0.0/mcp.schema.json";

fn fixture(name: &str) -> PathBuf {
    repo_root().join(FIXTURES).join(name)
}

/// `npc plugin validate PATH --format json`: exit code and report.
fn validate_json(path: &Path) -> (i32, Value) {
    let out = npc()
        .env_clear()
        .args(["plugin", "validate"])
        .arg(path)
        .args(["--format", "json"])
        .output()
        .expect("npc runs");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "json report: {e}\nstdout: {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().expect("exited"), report)
}

/// The diagnostics of a report as `(severity, file, pointer)`.
fn places(report: &Value) -> Vec<(String, String, String)> {
    report["diagnostics"]
        .as_array()
        .expect("diagnostics")
        .iter()
        .map(|d| {
            (
                d["severity"].as_str().unwrap().to_string(),
                d["file"].as_str().unwrap().to_string(),
                d["pointer"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn has(report: &Value, severity: &str, file: &str, pointer: &str) -> bool {
    places(report)
        .iter()
        .any(|(s, f, p)| s == severity && f == file && p == pointer)
}

fn summary_at(report: &Value, file: &str, pointer: &str) -> String {
    report["diagnostics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["file"] == file && d["pointer"] == pointer)
        .map(|d| d["summary"].as_str().unwrap().to_string())
        .unwrap_or_else(|| panic!("no diagnostic at {file}#{pointer}: {report:#}"))
}

/// A package in a temporary directory: `plugin.json` named `name`, plus files.
fn package(name: &str, files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let manifest = serde_json::json!({"$schema": PLUGIN_SCHEMA, "name": name});
    std::fs::write(dir.path().join("plugin.json"), manifest.to_string()).unwrap();
    for (path, text) in files {
        let p = dir.path().join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    dir
}

// ---- Plugin loader -------------------------------------------------------

#[test]
fn s5_1_plugin_json_is_parsed_and_validated_against_the_official_schema() {
    let (code, report) = validate_json(&fixture("full"));
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["valid"], true);
    assert_eq!(report["plugin"], "full-kit");
    let dir = package("x", &[]);
    std::fs::write(dir.path().join("plugin.json"), "{ not json").unwrap();
    let (code, report) = validate_json(dir.path());
    assert_eq!(code, 1);
    assert!(has(&report, "error", "plugin.json", ""), "{report:#}");
    std::fs::write(
        dir.path().join("plugin.json"),
        serde_json::json!({"$schema": PLUGIN_SCHEMA, "name": "x", "keywords": "one", "author": {"nick": "y"}}).to_string(),
    )
    .unwrap();
    let (code, report) = validate_json(dir.path());
    assert_eq!(code, 1);
    assert!(
        has(&report, "error", "plugin.json", "/keywords"),
        "{report:#}"
    );
    assert!(
        has(&report, "error", "plugin.json", "/author"),
        "{report:#}"
    );
}

#[test]
fn s5_3_schema_and_name_are_required_and_schema_is_canonical() {
    let (code, report) = validate_json(&fixture("no-schema"));
    assert_eq!(code, 1);
    assert!(summary_at(&report, "plugin.json", "").contains("`$schema` is required"));
    let (code, report) = validate_json(&fixture("bad-schema"));
    assert_eq!(code, 1);
    assert!(
        has(&report, "error", "plugin.json", "/$schema"),
        "{report:#}"
    );
    assert_eq!(
        report["error_count"], 1,
        "only the `$schema` is wrong: {report:#}"
    );
    let dir = package("x", &[]);
    std::fs::write(
        dir.path().join("plugin.json"),
        serde_json::json!({"$schema": PLUGIN_SCHEMA}).to_string(),
    )
    .unwrap();
    let (code, report) = validate_json(dir.path());
    assert_eq!(code, 1);
    assert!(summary_at(&report, "plugin.json", "").contains("`name` is required"));
}

#[test]
fn s5_3_the_shipped_example_uses_the_canonical_schema() {
    let (code, report) = validate_json(&repo_root().join("examples/plugins/review-kit"));
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["warning_count"], 0, "{report:#}");
}

#[test]
fn s5_5_names_follow_the_naming_constraints() {
    let (code, report) = validate_json(&fixture("bad-name"));
    assert_eq!(code, 1);
    assert!(has(&report, "error", "plugin.json", "/name"));
    for bad in ["-a", "a-", "a..b", "A", "a_b", "", &"a".repeat(65)] {
        let dir = package(bad, &[]);
        let (code, report) = validate_json(dir.path());
        assert_eq!(code, 1, "{bad}");
        assert!(
            has(&report, "error", "plugin.json", "/name"),
            "{bad}: {report:#}"
        );
    }
    for good in ["a", "a.b-c", "x9", &"a".repeat(64)] {
        let dir = package(good, &[]);
        assert_eq!(validate_json(dir.path()).0, 0, "{good}");
    }
}

#[test]
fn s5_2_unknown_fields_are_reported_and_ignored() {
    let (code, report) = validate_json(&fixture("unknown-field"));
    assert_eq!(code, 0, "{report:#}");
    assert!(
        has(&report, "warning", "plugin.json", "/setup"),
        "{report:#}"
    );
    assert_eq!(report["error_count"], 0);
}

#[test]
fn s8_1_unimplemented_extension_namespaces_are_not_validated() {
    // `full` has `"com.example.other": 42`, which the schema alone rejects.
    let (code, report) = validate_json(&fixture("full"));
    assert_eq!(code, 0, "{report:#}");
    assert!(
        !places(&report)
            .iter()
            .any(|(_, f, p)| f == "plugin.json" && p.starts_with("/extensions")),
        "{report:#}"
    );
}

#[test]
fn s4_1_a_path_resolving_outside_the_plugin_root_is_rejected() {
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("server"), "#!/bin/sh\n").unwrap();
    std::fs::create_dir(outside.path().join("work")).unwrap();
    std::fs::write(
        outside.path().join("SKILL.md"),
        "---\nname: leak\ndescription: outside\n---\n",
    )
    .unwrap();
    let mcp = serde_json::json!({"$schema": MCP_SCHEMA, "mcpServers": {
        "cmd": {"type": "stdio", "command": "./bin/server"},
        "cwd": {"type": "stdio", "command": "node", "cwd": "./work"},
        "ok": {"type": "stdio", "command": "node"}
    }});
    let dir = package("links", &[("mcp.json", &mcp.to_string())]);
    std::fs::create_dir(dir.path().join("bin")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("server"), dir.path().join("bin/server"))
        .unwrap();
    std::os::unix::fs::symlink(outside.path().join("work"), dir.path().join("work")).unwrap();
    std::fs::create_dir_all(dir.path().join("skills/leak")).unwrap();
    std::os::unix::fs::symlink(
        outside.path().join("SKILL.md"),
        dir.path().join("skills/leak/SKILL.md"),
    )
    .unwrap();
    let (code, report) = validate_json(dir.path());
    assert_eq!(code, 1, "{report:#}");
    assert!(
        summary_at(&report, "mcp.json", "/mcpServers/cmd/command").contains("outside the package")
    );
    assert!(summary_at(&report, "mcp.json", "/mcpServers/cwd/cwd").contains("outside the package"));
    assert!(
        has(&report, "error", "skills/leak/SKILL.md", ""),
        "{report:#}"
    );
    // `plugin.json` itself as a link out: the package does not load.
    let dir = package("x", &[]);
    std::fs::remove_file(dir.path().join("plugin.json")).unwrap();
    let target = outside.path().join("plugin.json");
    std::fs::write(
        &target,
        serde_json::json!({"$schema": PLUGIN_SCHEMA, "name": "x"}).to_string(),
    )
    .unwrap();
    std::os::unix::fs::symlink(&target, dir.path().join("plugin.json")).unwrap();
    let (code, report) = validate_json(dir.path());
    assert_eq!(code, 1);
    assert!(
        summary_at(&report, "plugin.json", "").contains("symbolic link"),
        "{report:#}"
    );
}

#[test]
fn s4_1_plugin_relative_paths_start_with_dot_slash() {
    let (code, report) = validate_json(&fixture("mcp-entries"));
    assert_eq!(code, 1);
    assert!(summary_at(&report, "mcp.json", "/mcpServers/cwd-prefix/cwd").contains("`./`"));
    assert!(has(
        &report,
        "error",
        "mcp.json",
        "/mcpServers/absolute/command"
    ));
}

#[test]
fn s8_2_hooks_are_found_in_their_reverse_domain_directories() {
    let (code, report) = validate_json(&fixture("orcacode"));
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["diagnostics"].as_array().unwrap().len(), 0);
    let human = npc()
        .args(["plugin", "validate"])
        .arg(fixture("orcacode"))
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&human.stdout).contains("1 hook"));
    // Both present: npc's own wins, Orcacode's is reported and ignored.
    let (code, report) = validate_json(&fixture("both-hooks"));
    assert_eq!(code, 0, "{report:#}");
    assert!(has(
        &report,
        "warning",
        "io.github.okikorg.orcacode/hooks.json",
        ""
    ));
    let human = npc()
        .args(["plugin", "validate"])
        .arg(fixture("both-hooks"))
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&human.stdout).contains("(plugin `both-hooks`: 1 hook)"),
        "{}",
        String::from_utf8_lossy(&human.stdout)
    );
}

#[test]
fn s8_2_a_hooks_file_is_closed_with_seven_events_and_bounded_timeouts() {
    let (code, report) = validate_json(&fixture("hooks-bad"));
    assert_eq!(code, 1);
    let f = "dev.npcagent/hooks.json";
    assert!(
        has(&report, "error", f, "/hooks/before_tool/0/timeout_ms"),
        "{report:#}"
    );
    assert!(has(&report, "error", f, "/hooks/before_tool/1/timeout_ms"));
    assert!(summary_at(&report, f, "/hooks/before_tool/2").contains("`matcher`"));
    assert!(summary_at(&report, f, "/hooks").contains("`on_start`"));
    assert!(summary_at(&report, f, "").contains("`extra`"));
    assert!(has(&report, "error", f, "/hooks/after_tool/0/command"));
    assert!(has(
        &report,
        "error",
        f,
        "/hooks/after_tool/0/env/PLUGIN_ROOT"
    ));
    for (version, ok) in [("1", true), ("2", false), ("\"1\"", false)] {
        let text = format!(
            r#"{{"version":{version},"hooks":{{"on_error":[{{"command":"true","timeout_ms":30000}}]}}}}"#
        );
        let dir = package("v", &[(f, &text)]);
        assert_eq!(validate_json(dir.path()).0 == 0, ok, "{version}");
    }
}

// ---- Component discovery -------------------------------------------------

#[test]
fn s6_1_skills_and_mcp_json_are_found_at_their_fixed_locations() {
    let out = npc()
        .args(["plugin", "validate"])
        .arg(fixture("full"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("4 MCP servers, 2 skills, 2 hooks"), "{text}");
    // One level deep only: a nested SKILL.md is reported and ignored.
    let (_, report) = validate_json(&fixture("full"));
    assert!(
        has(&report, "warning", "skills/greet/inner/deeper/SKILL.md", ""),
        "{report:#}"
    );
}

#[test]
fn s6_1_skill_frontmatter_is_checked() {
    let (code, report) = validate_json(&fixture("skills-bad"));
    assert_eq!(code, 1);
    assert!(has(&report, "error", "skills/mismatch/SKILL.md", "/name"));
    assert!(has(&report, "error", "skills/no-front/SKILL.md", ""));
    assert!(has(&report, "warning", "skills/no-skill-file", ""));
    assert!(
        !places(&report)
            .iter()
            .any(|(_, f, _)| f.starts_with("skills/ok"))
    );
    let long = "x".repeat(1025);
    let text = format!("---\nname: d\ndescription: {long}\n---\n");
    let dir = package("d", &[("skills/d/SKILL.md", &text)]);
    let (code, report) = validate_json(dir.path());
    assert_eq!(code, 1);
    assert!(has(&report, "error", "skills/d/SKILL.md", "/description"));
}

#[test]
fn s6_2_a_missing_location_is_not_an_error() {
    let (code, report) = validate_json(&fixture("minimal"));
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["diagnostics"].as_array().unwrap().len(), 0);
}

// ---- MCP configuration ----------------------------------------------------

#[test]
fn s7_2_1_rules_are_picked_by_a_recognised_schema() {
    let (code, report) = validate_json(&fixture("mcp-no-schema"));
    assert_eq!(code, 1);
    assert!(summary_at(&report, "mcp.json", "").contains("`$schema`"));
    let mcp = serde_json::json!({"$schema": "https://example.com/mcp.json", "mcpServers": {}});
    let dir = package("x", &[("mcp.json", &mcp.to_string())]);
    let (code, report) = validate_json(dir.path());
    assert_eq!(code, 1);
    assert!(has(&report, "error", "mcp.json", "/$schema"));
    let mcp = serde_json::json!({"$schema": MCP_SCHEMA, "mcpServers": {}, "other": 1});
    let dir = package("x", &[("mcp.json", &mcp.to_string())]);
    let (_, report) = validate_json(dir.path());
    assert!(
        summary_at(&report, "mcp.json", "").contains("`other`"),
        "closed document"
    );
}

#[test]
fn s7_2_2_one_bad_entry_skips_only_that_entry() {
    let (code, report) = validate_json(&fixture("mcp-entries"));
    assert_eq!(code, 1);
    let bad: Vec<&str> = vec![
        "placeholder-command",
        "two-tokens",
        "absolute",
        "reserved-env",
        "cwd-escape",
        "cwd-prefix",
        "mixed-variant",
        "unknown-type",
        "plain-http",
        "userinfo",
        "fragment",
        "dup-headers",
    ];
    for name in &bad {
        assert!(
            places(&report).iter().any(|(s, f, p)| s == "error"
                && f == "mcp.json"
                && p.starts_with(&format!("/mcpServers/{name}"))),
            "{name}: {report:#}"
        );
    }
    for good in ["good", "localhost"] {
        assert!(
            !places(&report)
                .iter()
                .any(|(_, _, p)| p.starts_with(&format!("/mcpServers/{good}"))),
            "{good}"
        );
    }
    // Every problem of the file in one run.
    assert_eq!(report["error_count"], bad.len(), "{report:#}");
}

#[test]
fn s7_2_variants_are_closed() {
    let (_, report) = validate_json(&fixture("mcp-entries"));
    assert!(summary_at(&report, "mcp.json", "/mcpServers/mixed-variant").contains("`url`"));
    assert!(
        summary_at(&report, "mcp.json", "/mcpServers/unknown-type/type").contains("`websocket`")
    );
}

#[test]
fn s7_2_command_is_one_token_without_placeholders() {
    let (_, report) = validate_json(&fixture("mcp-entries"));
    assert!(
        summary_at(
            &report,
            "mcp.json",
            "/mcpServers/placeholder-command/command"
        )
        .contains("placeholder")
    );
    assert!(
        summary_at(&report, "mcp.json", "/mcpServers/two-tokens/command").contains("one token")
    );
    let (_, report) = validate_json(&fixture("full"));
    assert!(
        !has(&report, "error", "mcp.json", "/mcpServers/bundled/command"),
        "`./bin/server` inside"
    );
}

#[test]
fn s7_2_cwd_is_plugin_relative_and_stays_inside() {
    let (_, report) = validate_json(&fixture("mcp-entries"));
    assert!(
        summary_at(&report, "mcp.json", "/mcpServers/cwd-escape/cwd")
            .contains("leaves the package")
    );
    let mcp = serde_json::json!({"$schema": MCP_SCHEMA, "mcpServers": {
        "data-up": {"type": "stdio", "command": "node", "cwd": "${PLUGIN_DATA}/../x"},
        "root-up": {"type": "stdio", "command": "node", "cwd": "${PLUGIN_ROOT}/a/../../x"},
        "data": {"type": "stdio", "command": "node", "cwd": "${PLUGIN_DATA}/cache"},
        "root": {"type": "stdio", "command": "node", "cwd": "${PLUGIN_ROOT}"}
    }});
    let dir = package("cwd", &[("mcp.json", &mcp.to_string())]);
    let (_, report) = validate_json(dir.path());
    assert!(
        has(&report, "error", "mcp.json", "/mcpServers/data-up/cwd"),
        "{report:#}"
    );
    assert!(has(&report, "error", "mcp.json", "/mcpServers/root-up/cwd"));
    assert_eq!(report["error_count"], 2, "{report:#}");
}

#[test]
fn s7_2_remote_urls_are_https_unless_loopback_without_userinfo_or_fragment() {
    let (_, report) = validate_json(&fixture("mcp-entries"));
    assert!(summary_at(&report, "mcp.json", "/mcpServers/plain-http/url").contains("not loopback"));
    assert!(summary_at(&report, "mcp.json", "/mcpServers/userinfo/url").contains("userinfo"));
    assert!(summary_at(&report, "mcp.json", "/mcpServers/fragment/url").contains("fragment"));
    assert!(
        !places(&report)
            .iter()
            .any(|(_, _, p)| p.starts_with("/mcpServers/localhost"))
    );
    let (_, report) = validate_json(&fixture("full"));
    assert!(
        !places(&report)
            .iter()
            .any(|(_, _, p)| p.starts_with("/mcpServers/loopback")),
        "127.0.0.1 over http"
    );
}

#[test]
fn s7_2_header_names_are_case_insensitively_unique() {
    let (_, report) = validate_json(&fixture("mcp-entries"));
    assert!(
        has(
            &report,
            "error",
            "mcp.json",
            "/mcpServers/dup-headers/headers/authorization"
        ),
        "{report:#}"
    );
}

// ---- Environment and expansion -------------------------------------------

#[test]
fn s9_an_env_entry_named_plugin_root_or_plugin_data_invalidates_the_server() {
    let (_, report) = validate_json(&fixture("mcp-entries"));
    assert!(
        summary_at(
            &report,
            "mcp.json",
            "/mcpServers/reserved-env/env/PLUGIN_DATA"
        )
        .contains("`PLUGIN_DATA`")
    );
}

// ---- Resilience ------------------------------------------------------------

#[test]
fn s11_3_unsupported_component_types_are_ignored() {
    let (code, report) = validate_json(&fixture("unsupported"));
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["diagnostics"].as_array().unwrap().len(), 0);
}

// ---- The command itself ----------------------------------------------------

#[test]
fn validate_runs_nothing_and_creates_nothing() {
    let marker = tempfile::tempdir().unwrap();
    let flag = marker.path().join("ran");
    let hooks = format!(
        r#"{{"version":1,"hooks":{{"on_agent_start":[{{"command":"touch","args":["{}"]}}]}}}}"#,
        flag.display()
    );
    let dir = package("inert", &[("dev.npcagent/hooks.json", &hooks)]);
    let before = list_tree(dir.path());
    let (code, _) = validate_json(dir.path());
    assert_eq!(code, 0);
    assert!(!flag.exists());
    assert_eq!(list_tree(dir.path()), before);
}

fn list_tree(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p.clone());
            }
            out.push(p);
        }
    }
    out.sort();
    out
}

#[test]
fn validate_human_output_places_every_problem_by_file_and_pointer() {
    let out = npc()
        .args(["plugin", "validate"])
        .arg(fixture("mcp-entries"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("mcp.json#/mcpServers/two-tokens/command: error: "),
        "{text}"
    );
    assert!(text.contains(": invalid: 12 errors"), "{text}");
}

#[test]
fn validate_defaults_to_the_current_directory_and_a_missing_dir_is_a_usage_error() {
    let out = npc()
        .current_dir(fixture("minimal"))
        .args(["plugin", "validate"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = npc()
        .args(["plugin", "validate", "/nonexistent/npc-plugin"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("plugin directory"));
}

#[test]
fn a_manifest_declaring_an_invalid_package_is_invalid() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("npcagent.toml"),
        "version = 1\n[plugins.kit]\npath = \"kit\"\n",
    )
    .unwrap();
    std::fs::create_dir(dir.path().join("kit")).unwrap();
    std::fs::write(dir.path().join("kit/plugin.json"), "not json").unwrap();
    let out = npc()
        .current_dir(dir.path())
        .args(["validate"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("plugin `kit`: `plugin.json`: not valid JSON"),
        "{text}"
    );
    std::fs::write(
        dir.path().join("kit/plugin.json"),
        serde_json::json!({"$schema": PLUGIN_SCHEMA, "name": "kit"}).to_string(),
    )
    .unwrap();
    let out = npc()
        .current_dir(dir.path())
        .args(["validate"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

// ---- npc plugin test / init ----------------------------------------------

/// `npc plugin test PATH --format json` with its own user data directory.
fn test_json(path: &Path, data: &Path) -> (i32, Value) {
    let out = npc()
        .env("XDG_DATA_HOME", data)
        .env("NPC_TEST_SECRET", "must-not-reach-plugins")
        .args(["plugin", "test"])
        .arg(path)
        .args(["--format", "json"])
        .output()
        .expect("npc runs");
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap(), report)
}

#[test]
fn test_probes_servers_runs_hooks_and_lists_skills() {
    let data = tempfile::tempdir().unwrap();
    let (code, report) = test_json(&fixture("probe"), data.path());
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["skills"], serde_json::json!(["hello"]));
    assert_eq!(
        report["servers"][0]["tools"],
        serde_json::json!(["echo", "shout"])
    );
    assert_eq!(report["hooks"][0]["event"], "before_tool");
    assert_eq!(report["hooks"][0]["decision"], "deny: probe says no");
    assert_eq!(report["hooks"][1]["decision"], "observed");
    let plugin_data = data.path().join("npc/plugin-data/probe-kit");
    let input: Value = serde_json::from_str(
        &std::fs::read_to_string(plugin_data.join("hook-input.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(input["version"], 1);
    assert_eq!(input["event"], "before_tool");
    assert_eq!(input["plugin"], "probe-kit");
    assert_eq!(input["payload"]["tool_call"]["name"], "echo");
}

#[test]
fn s9_every_plugin_subprocess_gets_plugin_root_and_a_private_plugin_data() {
    use std::os::unix::fs::PermissionsExt as _;
    let data = tempfile::tempdir().unwrap();
    let plugin_data = data.path().join("npc/plugin-data/probe-kit");
    // An existing, too-open data directory is tightened before the start.
    std::fs::create_dir_all(&plugin_data).unwrap();
    std::fs::set_permissions(&plugin_data, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (code, report) = test_json(&fixture("probe"), data.path());
    assert_eq!(code, 0, "{report:#}");
    let mode = std::fs::metadata(&plugin_data)
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o700);
    let seen: Value =
        serde_json::from_str(&std::fs::read_to_string(plugin_data.join("seen.json")).unwrap())
            .unwrap();
    let root = fixture("probe").canonicalize().unwrap();
    let real_data = plugin_data.canonicalize().unwrap();
    assert_eq!(seen["env"]["PLUGIN_ROOT"], root.to_str().unwrap());
    assert_eq!(seen["env"]["PLUGIN_DATA"], real_data.to_str().unwrap());
    assert_eq!(seen["cwd"], real_data.to_str().unwrap());
    assert!(
        seen["env"].get("NPC_TEST_SECRET").is_none(),
        "the ambient environment is cleared"
    );
}

#[test]
fn s9_expansion_is_one_pass_of_the_two_names_in_args_env_and_cwd() {
    let data = tempfile::tempdir().unwrap();
    let (code, _) = test_json(&fixture("probe"), data.path());
    assert_eq!(code, 0);
    let plugin_data = data
        .path()
        .join("npc/plugin-data/probe-kit")
        .canonicalize()
        .unwrap();
    let seen: Value =
        serde_json::from_str(&std::fs::read_to_string(plugin_data.join("seen.json")).unwrap())
            .unwrap();
    let root = fixture("probe").canonicalize().unwrap();
    assert_eq!(
        seen["argv"],
        serde_json::json!([
            "${HOME}",
            format!("{}/arg", plugin_data.display()),
            format!("${}", root.display()),
        ])
    );
    assert_eq!(seen["env"]["WHERE"], format!("{}/x", plugin_data.display()));
    assert_eq!(
        seen["env"]["LIT"], "${OTHER}",
        "any other `${{…}}` stays literal"
    );
}

#[test]
fn test_reports_a_failing_server_and_hook_and_exits_1() {
    let mcp = serde_json::json!({"$schema": MCP_SCHEMA, "mcpServers": {
        "gone": {"type": "stdio", "command": "npc-no-such-program-xyz"},
        "quits": {"type": "stdio", "command": "true"}
    }});
    let hooks = r#"{"version":1,"hooks":{"before_tool":[{"command":"sh","args":["-c","echo garbage"]},{"command":"sh","args":["-c","sleep 5"],"timeout_ms":100},{"command":"false"}]}}"#;
    let dir = package(
        "failing",
        &[
            ("mcp.json", &mcp.to_string()),
            ("dev.npcagent/hooks.json", hooks),
        ],
    );
    let data = tempfile::tempdir().unwrap();
    let (code, report) = test_json(dir.path(), data.path());
    assert_eq!(code, 1, "{report:#}");
    assert!(
        report["servers"][0]["error"]
            .as_str()
            .unwrap()
            .contains("cannot start")
    );
    assert!(
        report["servers"][1]["error"]
            .as_str()
            .unwrap()
            .contains("exited before answering")
    );
    assert!(
        report["hooks"][0]["error"]
            .as_str()
            .unwrap()
            .contains("not one JSON object")
    );
    assert!(
        report["hooks"][1]["error"]
            .as_str()
            .unwrap()
            .contains("100 ms")
    );
    assert!(
        report["hooks"][2]["error"]
            .as_str()
            .unwrap()
            .contains("exited")
    );
}

#[test]
fn init_writes_packages_that_validate_and_a_python_one_that_tests() {
    let dir = tempfile::tempdir().unwrap();
    for (name, flag) in [("py-kit", "--python"), ("ts-kit", "--typescript")] {
        npc()
            .current_dir(dir.path())
            .args(["plugin", "init", name, flag])
            .assert()
            .success();
        let pkg = dir.path().join(name);
        let (code, report) = validate_json(&pkg);
        assert_eq!(code, 0, "{name}: {report:#}");
        assert_eq!(
            report["diagnostics"].as_array().unwrap().len(),
            0,
            "{report:#}"
        );
        assert!(pkg.join("skills/.gitkeep").is_file());
        let hooks: Value = serde_json::from_str(
            &std::fs::read_to_string(pkg.join("dev.npcagent/hooks.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(hooks, serde_json::json!({"version": 1, "hooks": {}}));
    }
    assert!(dir.path().join("py-kit/src/py_kit/server.py").is_file());
    assert!(dir.path().join("ts-kit/src/index.ts").is_file());
    // Python with the MCP SDK is installed where the suite runs (`.ci/run`).
    if !crate::mcp::python_sdk() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let (code, report) = test_json(&dir.path().join("py-kit"), data.path());
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["servers"][0]["tools"], serde_json::json!(["echo"]));
}

#[test]
fn init_refuses_a_non_empty_target_and_a_bad_name() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("kit")).unwrap();
    std::fs::write(dir.path().join("kit/keep.txt"), "mine").unwrap();
    let out = npc()
        .current_dir(dir.path())
        .args(["plugin", "init", "kit"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not empty"));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("kit/keep.txt")).unwrap(),
        "mine"
    );
    assert!(!dir.path().join("kit/plugin.json").exists());
    let out = npc()
        .current_dir(dir.path())
        .args(["plugin", "init", "Bad--Name"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(!dir.path().join("Bad--Name").exists());
}

// ---- The user registry -----------------------------------------------------

/// `npc plugin ARGS…` with its own user data directory, from `cwd`.
fn plugin_cmd(data: &Path, cwd: &Path, args: &[&str]) -> (i32, String, String) {
    let out = npc()
        .env("XDG_DATA_HOME", data)
        .current_dir(cwd)
        .arg("plugin")
        .args(args)
        .output()
        .expect("npc runs");
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn install_enable_disable_uninstall_keep_source_and_data() {
    let data = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let pkg = fixture("probe");
    let pkg_s = pkg.to_str().unwrap();
    let (code, out, _) = plugin_cmd(data.path(), work.path(), &["install", pkg_s]);
    assert_eq!(code, 0);
    assert!(out.contains("(disabled)"), "{out}");
    let registry = data.path().join("npc/plugins.json");
    let saved = std::fs::read_to_string(&registry).unwrap();
    // Idempotent for the same name and canonical path (spelled differently).
    let (code, out, _) = plugin_cmd(data.path(), &pkg, &["install", "."]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("already installed"));
    assert_eq!(std::fs::read_to_string(&registry).unwrap(), saved);
    // The same name from another path is rejected.
    let copy = work.path().join("copy");
    copy_tree(&pkg, &copy);
    let (code, _, err) = plugin_cmd(
        data.path(),
        work.path(),
        &["install", copy.to_str().unwrap()],
    );
    assert_eq!(code, 1);
    assert!(err.contains("already installed from"), "{err}");
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(
        std::fs::metadata(&registry).unwrap().permissions().mode() & 0o777,
        0o600
    );

    let (code, out, _) = plugin_cmd(data.path(), work.path(), &["list", "--format", "json"]);
    assert_eq!(code, 0);
    let rows: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(rows[0]["id"], "probe-kit");
    assert_eq!(rows[0]["source"], "user");
    assert_eq!(rows[0]["saved"], "disabled");
    assert_eq!(
        plugin_cmd(data.path(), work.path(), &["enable", "probe-kit"]).0,
        0
    );
    let (_, out, _) = plugin_cmd(data.path(), work.path(), &["list", "--tools"]);
    assert!(out.contains("KIND") && out.contains("TOOLS"), "{out}");
    assert!(
        out.contains("enabled") && out.contains("mcp: echo; skills: hello; hooks: 2"),
        "{out}"
    );
    let (_, out, _) = plugin_cmd(data.path(), work.path(), &["inspect", "probe-kit"]);
    assert!(out.contains("state    enabled, package valid"), "{out}");
    assert_eq!(
        plugin_cmd(data.path(), work.path(), &["disable", "probe-kit"]).0,
        0
    );
    let (_, out, _) = plugin_cmd(data.path(), work.path(), &["list", "--format", "json"]);
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap()[0]["saved"],
        "disabled"
    );

    std::fs::create_dir_all(data.path().join("npc/plugin-data/probe-kit")).unwrap();
    let (code, out, _) = plugin_cmd(data.path(), work.path(), &["uninstall", "probe-kit"]);
    assert_eq!(code, 0, "{out}");
    assert!(pkg.join("plugin.json").is_file());
    assert!(data.path().join("npc/plugin-data/probe-kit").is_dir());
    let (_, out, _) = plugin_cmd(data.path(), work.path(), &["list"]);
    assert!(out.starts_with("no plugins"), "{out}");
    assert_eq!(
        plugin_cmd(data.path(), work.path(), &["uninstall", "probe-kit"]).0,
        1
    );
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

#[test]
fn enable_revalidates_and_keeps_a_broken_plugin_disabled() {
    let data = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let pkg = work.path().join("kit");
    copy_tree(&fixture("minimal"), &pkg);
    assert_eq!(
        plugin_cmd(data.path(), work.path(), &["install", "kit"]).0,
        0
    );
    std::fs::write(pkg.join("mcp.json"), "{ broken").unwrap();
    let (code, _, err) = plugin_cmd(data.path(), work.path(), &["enable", "minimal"]);
    assert_eq!(code, 1);
    assert!(err.contains("stays disabled"), "{err}");
    let (_, out, _) = plugin_cmd(data.path(), work.path(), &["list", "--format", "json"]);
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap()[0]["saved"],
        "disabled"
    );
}

#[test]
fn discovery_is_manifest_then_user_registry_and_the_first_registration_wins() {
    let data = tempfile::tempdir().unwrap();
    let repo = tempfile::tempdir().unwrap();
    copy_tree(&fixture("probe"), &repo.path().join("kit"));
    std::fs::write(
        repo.path().join("npcagent.toml"),
        "version = 1\n[plugins.probe-kit]\npath = \"kit\"\n",
    )
    .unwrap();
    assert_eq!(
        plugin_cmd(
            data.path(),
            repo.path(),
            &["install", fixture("probe").to_str().unwrap()]
        )
        .0,
        0
    );
    let (code, out, err) = plugin_cmd(data.path(), repo.path(), &["list", "--format", "json"]);
    assert_eq!(code, 0);
    let rows: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(rows.as_array().unwrap().len(), 1);
    assert_eq!(rows[0]["source"], "manifest");
    assert!(err.contains("keep_first"), "{err}");
}

// ---- The daemon ------------------------------------------------------------

#[test]
fn the_daemon_runs_an_enabled_plugins_servers_and_disabling_it_stops_only_them() {
    use crate::support::{Daemon, DaemonSetup, wait_for};
    let data = tempfile::tempdir().unwrap();
    let data_s = data.path().to_str().unwrap().to_string();
    let home = std::env::var("HOME").unwrap_or_default();
    let manifest = |enabled: bool| {
        format!(
            "version = 1\n\n[mcp.servers.other]\ncommand = \"sleep\"\nargs = [\"1000\"]\n\n[plugins.kit]\npath = \"kit\"\nenabled = {enabled}\n"
        )
    };
    let mut files: Vec<(String, String)> = Vec::new();
    for name in [
        "plugin.json",
        "mcp.json",
        "server.py",
        "hook.py",
        "dev.npcagent/hooks.json",
        "skills/hello/SKILL.md",
    ] {
        files.push((
            format!("kit/{name}"),
            std::fs::read_to_string(fixture("probe").join(name)).unwrap(),
        ));
    }
    let files_ref: Vec<(&str, &str)> = files
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    let env = [("XDG_DATA_HOME", data_s.as_str()), ("HOME", home.as_str())];
    let d = Daemon::start_with(
        &manifest(true),
        DaemonSetup {
            files: &files_ref,
            only_env: Some(&env),
            ..DaemonSetup::default()
        },
    );
    let plugin_data = data.path().join("npc/plugin-data/probe-kit");
    let seen = plugin_data.join("seen.json");
    wait_for("the plugin's server to start", || {
        seen.is_file().then_some(())
    });
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(
        std::fs::metadata(&plugin_data)
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o700
    );
    let pid = wait_for("the plugin's server in status", || {
        d.pid_of("mcp_server.kit__echo")
    });
    let other = d
        .pid_of("mcp_server.other")
        .expect("the manifest's own server runs");
    let seen: Value = serde_json::from_str(&std::fs::read_to_string(&seen).unwrap()).unwrap();
    assert_eq!(
        seen["env"]["PLUGIN_DATA"],
        plugin_data.canonicalize().unwrap().to_str().unwrap()
    );
    assert!(
        seen["env"]["PLUGIN_ROOT"]
            .as_str()
            .unwrap()
            .ends_with("/kit")
    );

    d.write_manifest(&manifest(false));
    wait_for("the plugin's server to stop", || {
        d.status()
            .iter()
            .all(|c| c["id"] != "mcp_server.kit__echo")
            .then_some(())
    });
    assert!(!crate::support::alive(pid));
    assert_eq!(
        d.pid_of("mcp_server.other"),
        Some(other),
        "the rest keeps running"
    );
}

#[test]
fn in_the_manifest_plugin_root_and_data_are_placeholders_not_environment_variables() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("npcagent.toml"),
        "version = 1\n[mcp.servers.x]\ncommand = \"node\"\nargs = [\"${PLUGIN_ROOT}/a\"]\n",
    )
    .unwrap();
    // Set or not, the environment's value is never used.
    let out = npc()
        .current_dir(dir.path())
        .env("PLUGIN_ROOT", "/from/env")
        .args(["validate"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("uses `${PLUGIN_ROOT}`, which only a plugin's own servers and hooks have"),
        "{text}"
    );
    assert!(!text.contains("is not set"), "{text}");
}

// ---- Hostile packages ------------------------------------------------------

#[test]
fn hostile_package_files_are_refused_without_hanging_or_reading_without_bound() {
    let dir = package("hostile", &[]);
    let fifo = dir.path().join("mcp.json");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    // A hooks file far over the size cap, sparse so the test stays cheap.
    let big = dir.path().join("dev.npcagent/hooks.json");
    std::fs::create_dir_all(big.parent().unwrap()).unwrap();
    std::fs::File::create(&big)
        .unwrap()
        .set_len(64 * 1024 * 1024)
        .unwrap();
    // Many skill folders: only a bounded number are looked at.
    for i in 0..1100 {
        std::fs::create_dir_all(dir.path().join(format!("skills/s{i:04}"))).unwrap();
    }
    let (code, report) = validate_json(dir.path());
    assert_eq!(code, 1, "{report:#}");
    assert!(
        summary_at(&report, "mcp.json", "").contains("FIFO"),
        "{report:#}"
    );
    assert!(
        summary_at(&report, "dev.npcagent/hooks.json", "").contains("larger than"),
        "{report:#}"
    );
    assert!(
        summary_at(&report, "skills", "").contains("more than 1024 entries"),
        "{report:#}"
    );
    assert!(report["diagnostics"].as_array().unwrap().len() <= 500);
}

// ---- Plugins at work: hooks, the user registry in the daemon, skills -------

/// A repository holding a copy of the `probe` package at `kit/` and `manifest`.
fn repo_with_kit(manifest: &str) -> tempfile::TempDir {
    let repo = tempfile::tempdir().unwrap();
    copy_tree(&fixture("probe"), &repo.path().join("kit"));
    std::fs::write(repo.path().join("npcagent.toml"), manifest).unwrap();
    repo
}

/// The MCP client's `steps` against `npc mcp serve` in `root`, with its own
/// user data directory `data`.
fn gateway_session(root: &Path, data: &Path, steps: Value) -> Vec<Value> {
    let out = assert_cmd::Command::new("python3")
        .arg(repo_root().join("fixtures/mcp/client.py"))
        .arg(steps.to_string())
        .args([
            "--",
            &crate::support::npc_path().display().to_string(),
            "mcp",
            "serve",
        ])
        .env("XDG_DATA_HOME", data)
        .current_dir(root)
        .timeout(std::time::Duration::from_secs(90))
        .output()
        .unwrap();
    crate::mcp::client_answers(&out)
}

#[test]
fn a_plugins_before_tool_hook_denies_gateway_calls_and_answers_npc_hook_run() {
    if !crate::mcp::python_sdk() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let repo = repo_with_kit("version = 1\n[plugins.kit]\npath = \"kit\"\n");
    let got = gateway_session(
        repo.path(),
        data.path(),
        serde_json::json!([["call", "kit__echo__echo", {"x": 1}]]),
    );
    assert_eq!(got[0]["is_error"], true, "{got:?}");
    let text = got[0]["text"].as_str().unwrap();
    assert!(
        text.contains("probe says no") && text.contains("plugin `kit` before_tool[0]"),
        "{text}"
    );
    // The hook ran with its own PLUGIN_DATA (created 0700) and saw the call.
    let plugin_data = data.path().join("npc/plugin-data/probe-kit");
    let input: Value = serde_json::from_str(
        &std::fs::read_to_string(plugin_data.join("hook-input.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(input["plugin"], "kit");
    assert_eq!(input["event"], "before_tool");
    assert_eq!(input["payload"]["tool_call"]["name"], "kit__echo__echo");
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(
        std::fs::metadata(&plugin_data)
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o700
    );

    // `npc hook run` (what agent CLIs call) runs the plugin's hook too.
    std::fs::remove_file(plugin_data.join("hook-input.json")).unwrap();
    let out = npc()
        .env("XDG_DATA_HOME", data.path())
        .current_dir(repo.path())
        .args(["hook", "run", "before_tool", "--agent", "claude"])
        .write_stdin(
            serde_json::json!({"hook_event_name": "PreToolUse", "tool_name": "Bash",
                "tool_input": {"command": "git push"}, "tool_use_id": "t1"})
            .to_string(),
        )
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("probe says no"));
    assert!(plugin_data.join("hook-input.json").is_file());

    // Disabled, the plugin's hook is gone.
    std::fs::write(
        repo.path().join("npcagent.toml"),
        "version = 1\n[plugins.kit]\npath = \"kit\"\nenabled = false\n",
    )
    .unwrap();
    let out = npc()
        .env("XDG_DATA_HOME", data.path())
        .current_dir(repo.path())
        .args(["hook", "run", "before_tool"])
        .write_stdin(
            serde_json::json!({"tool_call": {"id": "c", "name": "x", "arguments": {}}}).to_string(),
        )
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

#[test]
fn the_daemon_runs_user_registry_plugins_live_and_reports_collisions_and_drops() {
    use crate::support::{Daemon, DaemonSetup, wait_for};
    let data = tempfile::tempdir().unwrap();
    let data_s = data.path().to_str().unwrap().to_string();
    let home = std::env::var("HOME").unwrap_or_default();
    let pkgs = tempfile::tempdir().unwrap();
    let kit = pkgs.path().join("probe");
    copy_tree(&fixture("probe"), &kit);
    let broken = pkgs.path().join("minimal");
    copy_tree(&fixture("minimal"), &broken);
    let plugin = |args: &[&str]| plugin_cmd(data.path(), pkgs.path(), args);
    assert_eq!(plugin(&["install", "probe"]).0, 0);
    assert_eq!(plugin(&["install", "minimal"]).0, 0);
    assert_eq!(plugin(&["enable", "minimal"]).0, 0);
    let env = [("XDG_DATA_HOME", data_s.as_str()), ("HOME", home.as_str())];
    let d = Daemon::start_with(
        "version = 1\n\n[mcp.servers.other]\ncommand = \"sleep\"\nargs = [\"1000\"]\n",
        DaemonSetup {
            only_env: Some(&env),
            ..DaemonSetup::default()
        },
    );
    let other = d
        .pid_of("mcp_server.other")
        .expect("the manifest's server runs");

    // Enabling a user plugin starts its server in the daemon's pool.
    assert_eq!(plugin(&["enable", "probe-kit"]).0, 0);
    let pid = wait_for("the user plugin's server to start", || {
        d.pid_of("mcp_server.probe-kit__echo")
    });
    assert!(
        d.status().iter().any(|c| c["id"] == "plugin.probe-kit"),
        "{:?}",
        d.status()
    );
    // Its before_tool hook now guards the daemon's gateway.
    let python = crate::mcp::python_sdk();
    let call = || {
        gateway_session(
            d.root(),
            data.path(),
            serde_json::json!([["call", "probe-kit__echo__echo", {}]]),
        )
    };
    if python {
        let got = wait_for("the plugin's hook in the daemon's gateway", || {
            let got = call();
            got[0]["text"]
                .as_str()
                .is_some_and(|t| t.contains("probe says no"))
                .then_some(got)
        });
        assert_eq!(got[0]["is_error"], true, "{got:?}");
    }

    // A plugin that stops loading is dropped with an event; the rest stays.
    let after = d.last_event_id();
    std::fs::write(broken.join("mcp.json"), "{ broken").unwrap();
    let dropped = d.wait_event(after, "registry.plugin_dropped");
    assert_eq!(dropped["payload"]["id"], "minimal", "{dropped}");
    assert_eq!(d.pid_of("mcp_server.probe-kit__echo"), Some(pid));

    // The same id in the manifest: the manifest's registration is kept.
    let after = d.last_event_id();
    std::fs::create_dir(d.root().join("shadow")).unwrap();
    std::fs::write(
        d.root().join("shadow/plugin.json"),
        serde_json::json!({"$schema": PLUGIN_SCHEMA, "name": "probe-kit"}).to_string(),
    )
    .unwrap();
    d.write_manifest(
        "version = 1\n\n[mcp.servers.other]\ncommand = \"sleep\"\nargs = [\"1000\"]\n\n[plugins.probe-kit]\npath = \"shadow\"\nenabled = false\n",
    );
    let collision = d.wait_event(after, "registry.plugin_collision");
    assert_eq!(collision["payload"]["policy"], "keep_first", "{collision}");
    assert_eq!(collision["payload"]["kept"], "manifest", "{collision}");
    assert_eq!(collision["payload"]["dropped"], "user", "{collision}");
    wait_for("the shadowed plugin's server to stop", || {
        d.status()
            .iter()
            .all(|c| c["id"] != "mcp_server.probe-kit__echo")
            .then_some(())
    });

    // Back to the plain manifest, then disabling: only the plugin's parts go.
    d.write_manifest(
        "version = 1\n\n[mcp.servers.other]\ncommand = \"sleep\"\nargs = [\"1000\"]\n",
    );
    let pid = wait_for("the user plugin's server to be back", || {
        d.pid_of("mcp_server.probe-kit__echo")
    });
    assert_eq!(plugin(&["disable", "probe-kit"]).0, 0);
    wait_for("the user plugin's server to stop", || {
        d.status()
            .iter()
            .all(|c| c["id"] != "mcp_server.probe-kit__echo" && c["id"] != "plugin.probe-kit")
            .then_some(())
    });
    assert!(!crate::support::alive(pid));
    assert_eq!(
        d.pid_of("mcp_server.other"),
        Some(other),
        "the rest keeps running"
    );
}

/// The project skills folder of each agent CLI npc configures.
const SKILL_FOLDERS: [&str; 4] = [
    ".claude/skills",
    ".agents/skills",
    ".gemini/skills",
    ".opencode/skills",
];

const FOUR_AGENTS: &str = "version = 1\n[providers.c]\nkind = \"claude_code\"\n[providers.x]\nkind = \"codex\"\n[providers.g]\nkind = \"gemini_cli\"\n[providers.o]\nkind = \"opencode\"\n";

fn apply(repo: &Path, data: &Path) -> (i32, String) {
    let out = npc()
        .env("XDG_DATA_HOME", data)
        .current_dir(repo)
        .args(["apply", "--auto-approve"])
        .output()
        .unwrap();
    (
        out.status.code().unwrap(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn apply_copies_plugin_skills_for_every_agent_and_removes_only_its_own() {
    let data = tempfile::tempdir().unwrap();
    let repo = repo_with_kit(&format!("{FOUR_AGENTS}[plugins.kit]\npath = \"kit\"\n"));
    // The user's own skills, one with the plugin skill's name.
    let mine = repo.path().join(".claude/skills/mine/SKILL.md");
    std::fs::create_dir_all(mine.parent().unwrap()).unwrap();
    std::fs::write(&mine, "mine").unwrap();
    let theirs = repo.path().join(".gemini/skills/hello/SKILL.md");
    std::fs::create_dir_all(theirs.parent().unwrap()).unwrap();
    std::fs::write(&theirs, "the user's hello").unwrap();

    let (code, out) = apply(repo.path(), data.path());
    assert_eq!(code, 0, "{out}");
    let source = std::fs::read_to_string(repo.path().join("kit/skills/hello/SKILL.md")).unwrap();
    for folder in SKILL_FOLDERS {
        let copy = repo.path().join(folder).join("hello/SKILL.md");
        if folder == ".gemini/skills" {
            assert_eq!(std::fs::read_to_string(&copy).unwrap(), "the user's hello");
            continue;
        }
        assert_eq!(std::fs::read_to_string(&copy).unwrap(), source, "{folder}");
        assert!(!copy.is_symlink());
    }
    assert!(out.contains("is not npc's"), "{out}");
    // Applying again changes nothing.
    let (code, out) = apply(repo.path(), data.path());
    assert_eq!(code, 0, "{out}");
    assert!(!out.contains("hello: written"), "{out}");
    // An edited skill is copied again.
    std::fs::write(
        repo.path().join("kit/skills/hello/SKILL.md"),
        format!("{source}More.\n"),
    )
    .unwrap();
    apply(repo.path(), data.path());
    assert!(
        std::fs::read_to_string(repo.path().join(".claude/skills/hello/SKILL.md"))
            .unwrap()
            .ends_with("More.\n")
    );

    // A CLI no longer declared loses npc's copies; the others keep them.
    std::fs::write(
        repo.path().join("npcagent.toml"),
        format!(
            "{}[plugins.kit]\npath = \"kit\"\n",
            FOUR_AGENTS.replace("[providers.o]\nkind = \"opencode\"\n", "")
        ),
    )
    .unwrap();
    let (code, out) = apply(repo.path(), data.path());
    assert_eq!(code, 0, "{out}");
    assert!(
        !repo.path().join(".opencode/skills/hello").exists(),
        "{out}"
    );
    assert!(repo.path().join(".claude/skills/hello/SKILL.md").is_file());

    // Disabled: npc's copies go, the user's skills stay.
    std::fs::write(
        repo.path().join("npcagent.toml"),
        format!("{FOUR_AGENTS}[plugins.kit]\npath = \"kit\"\nenabled = false\n"),
    )
    .unwrap();
    let (code, out) = apply(repo.path(), data.path());
    assert_eq!(code, 0, "{out}");
    for folder in [".claude/skills", ".agents/skills", ".opencode/skills"] {
        assert!(!repo.path().join(folder).join("hello").exists(), "{folder}");
    }
    assert_eq!(std::fs::read_to_string(&mine).unwrap(), "mine");
    assert_eq!(
        std::fs::read_to_string(&theirs).unwrap(),
        "the user's hello"
    );
}

#[test]
fn skills_of_a_user_registry_plugin_are_copied_and_never_written_outside_the_repository() {
    let data = tempfile::tempdir().unwrap();
    let pkgs = tempfile::tempdir().unwrap();
    copy_tree(&fixture("probe"), &pkgs.path().join("probe"));
    assert_eq!(
        plugin_cmd(data.path(), pkgs.path(), &["install", "probe"]).0,
        0
    );
    assert_eq!(
        plugin_cmd(data.path(), pkgs.path(), &["enable", "probe-kit"]).0,
        0
    );
    let repo = tempfile::tempdir().unwrap();
    std::fs::write(repo.path().join("npcagent.toml"), FOUR_AGENTS).unwrap();
    // Hostile: a skills folder that is a link out of the repository.
    let outside = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(repo.path().join(".gemini")).unwrap();
    std::os::unix::fs::symlink(outside.path(), repo.path().join(".gemini/skills")).unwrap();
    let (code, out) = apply(repo.path(), data.path());
    assert_eq!(code, 0, "{out}");
    assert!(repo.path().join(".claude/skills/hello/SKILL.md").is_file());
    assert!(!repo.path().join(".claude/skills/hello").is_symlink());
    assert_eq!(
        std::fs::read_dir(outside.path()).unwrap().count(),
        0,
        "{out}"
    );
    assert!(out.contains(".gemini/skills"), "{out}");

    // Disabling the plugin removes the copies on the next apply.
    assert_eq!(
        plugin_cmd(data.path(), pkgs.path(), &["disable", "probe-kit"]).0,
        0
    );
    let (code, out) = apply(repo.path(), data.path());
    assert_eq!(code, 0, "{out}");
    assert!(!repo.path().join(".claude/skills/hello").exists(), "{out}");
}

#[test]
fn hostile_skills_are_never_copied() {
    let data = tempfile::tempdir().unwrap();
    let repo = repo_with_kit(&format!("{FOUR_AGENTS}[plugins.kit]\npath = \"kit\"\n"));
    // A skill folder that is a link out of the package, and a skill whose
    // name climbs: the package is invalid, nothing is copied anywhere.
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(
        outside.path().join("SKILL.md"),
        "---\nname: evil\ndescription: reads outside\n---\n",
    )
    .unwrap();
    std::os::unix::fs::symlink(outside.path(), repo.path().join("kit/skills/evil")).unwrap();
    std::fs::create_dir_all(repo.path().join("kit/skills/up")).unwrap();
    std::fs::write(
        repo.path().join("kit/skills/up/SKILL.md"),
        "---\nname: ../../up\ndescription: climbs\n---\n",
    )
    .unwrap();
    let (code, out) = apply(repo.path(), data.path());
    assert_eq!(code, 1, "{out}");
    for folder in SKILL_FOLDERS {
        assert!(!repo.path().join(folder).exists(), "{folder}: {out}");
    }
    assert!(!repo.path().join("up").exists());
    // A file inside a skill that links out of the package is not copied.
    std::fs::remove_file(repo.path().join("kit/skills/evil")).unwrap();
    std::fs::remove_dir_all(repo.path().join("kit/skills/up")).unwrap();
    std::os::unix::fs::symlink(
        outside.path().join("SKILL.md"),
        repo.path().join("kit/skills/hello/secret.md"),
    )
    .unwrap();
    let (code, out) = apply(repo.path(), data.path());
    assert_eq!(code, 0, "{out}");
    assert!(repo.path().join(".claude/skills/hello/SKILL.md").is_file());
    assert!(!repo.path().join(".claude/skills/hello/secret.md").exists());
}
