//! Unit tests of package checking on packages built in temporary
//! directories: the parsed types the rest of npc consumes.

use std::path::Path;

use super::*;

fn write(dir: &Path, path: &str, text: &str) {
    let p = dir.join(path);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

fn manifest(dir: &Path, name: &str) {
    write(
        dir,
        MANIFEST_FILE,
        &serde_json::json!({"$schema": PLUGIN_SCHEMA_URL, "name": name, "version": "2.0.0"})
            .to_string(),
    );
}

#[test]
fn a_valid_package_parses_into_its_components() {
    let dir = tempfile::tempdir().unwrap();
    manifest(dir.path(), "kit");
    write(
        dir.path(),
        MCP_FILE,
        &serde_json::json!({"$schema": MCP_SCHEMA_URL, "mcpServers": {
            "s": {"type": "stdio", "command": "node", "args": ["${PLUGIN_ROOT}/a"], "env": {"K": "v"}},
            "h": {"type": "streamable-http", "url": "https://x.example.com/mcp"}
        }})
        .to_string(),
    );
    write(
        dir.path(),
        "skills/a/SKILL.md",
        "---\nname: a\ndescription: d\n---\n",
    );
    write(
        dir.path(),
        "dev.npcagent/hooks.json",
        r#"{"version":1,"hooks":{"before_tool":[{"command":"sh","timeout_ms":7},{"command":"true"}]}}"#,
    );
    let report = validate(dir.path()).unwrap();
    assert!(report.is_valid(), "{:?}", report.problems);
    let pkg = report.package.unwrap();
    assert_eq!(pkg.manifest.name, "kit");
    assert_eq!(pkg.manifest.version.as_deref(), Some("2.0.0"));
    assert_eq!(pkg.root, dir.path().canonicalize().unwrap());
    assert_eq!(pkg.servers.len(), 2);
    assert!(
        matches!(&pkg.servers[0].transport, mcp::Transport::Stdio { command, .. } if command == "node")
    );
    assert_eq!(pkg.skills[0].dir, "skills/a");
    let hooks = pkg.hooks.unwrap();
    assert_eq!(hooks.source, hooks::HooksSource::Npc);
    let before = hooks.entries(crate::model::HookEvent::BeforeTool);
    assert_eq!(before.len(), 2);
    assert_eq!(before[0].timeout_ms, 7);
    assert_eq!(before[1].timeout_ms, hooks::DEFAULT_TIMEOUT_MS);
    assert!(hooks.entries(crate::model::HookEvent::OnError).is_empty());
}

#[test]
fn a_bad_component_is_left_out_and_the_rest_loads() {
    let dir = tempfile::tempdir().unwrap();
    manifest(dir.path(), "kit");
    write(
        dir.path(),
        MCP_FILE,
        &serde_json::json!({"$schema": MCP_SCHEMA_URL, "mcpServers": {
            "bad": {"type": "stdio", "command": "a b"},
            "good": {"type": "stdio", "command": "node"}
        }})
        .to_string(),
    );
    write(
        dir.path(),
        "io.github.okikorg.orcacode/hooks.json",
        r#"{"version":1}"#,
    );
    let report = validate(dir.path()).unwrap();
    assert!(!report.is_valid());
    let pkg = report.package.unwrap();
    assert_eq!(pkg.servers.len(), 1);
    assert_eq!(pkg.servers[0].name, "good");
    assert!(
        pkg.hooks.is_none(),
        "an invalid hooks file contributes no hooks"
    );
}

#[test]
fn problems_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    manifest(dir.path(), "kit");
    let servers: serde_json::Map<String, serde_json::Value> = (0..mcp::MAX_SERVERS)
        .map(|i| {
            (
                format!("s{i}"),
                serde_json::json!({"type": "stdio", "command": "a b", "cwd": "/x"}),
            )
        })
        .collect();
    write(
        dir.path(),
        MCP_FILE,
        &serde_json::json!({"$schema": MCP_SCHEMA_URL, "mcpServers": servers}).to_string(),
    );
    let report = validate(dir.path()).unwrap();
    assert_eq!(report.problems.len(), MAX_PROBLEMS);
    assert!(report.omitted > 0);
    assert!(!report.is_valid());
}

#[test]
fn pointers_escape_their_parts() {
    assert_eq!(pointer(&["mcpServers", "a/b~c"]), "/mcpServers/a~1b~0c");
}

#[test]
fn the_declared_files_are_the_ones_npc_reads() {
    for namespace in [NPC_NAMESPACE, ORCACODE_NAMESPACE] {
        let hooks = format!("{namespace}/{HOOKS_FILE}");
        assert!(DECLARED_FILES.contains(&hooks.as_str()), "{hooks}");
    }
    assert!(DECLARED_FILES.contains(&MANIFEST_FILE) && DECLARED_FILES.contains(&MCP_FILE));
    assert_eq!(DECLARED_DIRS, [SKILLS_DIR]);
}
