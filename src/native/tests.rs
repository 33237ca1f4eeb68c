//! Tests of export, edit-in-place, write and import for the four native
//! MCP file kinds, including round trips, secrets and hostile input.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use proptest::prelude::*;

use super::*;
use crate::disk::DiskFiles;
use crate::model::{Syntax, load_bytes};

const TOKEN_VALUE: &str = "tok-SECRET-4711";
const KEY_VALUE: &str = "key-SECRET-0815";

fn env() -> BTreeMap<String, String> {
    [
        ("TOKEN".to_string(), TOKEN_VALUE.to_string()),
        ("API_KEY".to_string(), KEY_VALUE.to_string()),
    ]
    .into()
}

fn manifest(text: &str) -> Manifest {
    let files = DiskFiles::new(PathBuf::from("/nonexistent"));
    let loaded = load_bytes(
        "npcagent.toml",
        text.as_bytes(),
        Syntax::Toml,
        &env(),
        &files,
    );
    let errors: Vec<String> = loaded
        .diagnostics
        .iter()
        .map(|d| format!("{d:?}"))
        .collect();
    loaded
        .manifest
        .unwrap_or_else(|| panic!("manifest does not load: {errors:#?}"))
}

const SAMPLE: &str = r#"
version = 1

[mcp.servers.fs]
command = "npx"
args = ["-y", "@modelcontextprotocol/server-filesystem", "."]
env = { API_KEY = "${API_KEY}", MODE = "ro", LABEL = "k=${API_KEY}" }
cwd = "tools"
enabled_tools = ["read_file"]
disabled_tools = ["write_file"]
tool_timeout_ms = 30000

[mcp.servers.web]
url = "https://mcp.example.com/mcp"
headers = { "X-Team" = "core", "X-Key" = "${API_KEY}" }
bearer_token_env = "TOKEN"
startup_timeout_ms = 2500

[mcp.servers.off]
command = "off-server"
enabled = false
"#;

fn none() -> BTreeSet<String> {
    BTreeSet::new()
}

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn plan(
    kind: ProviderKind,
    before: Option<&str>,
    m: &Manifest,
    prev: &BTreeSet<String>,
) -> FileChange {
    plan_opts(kind, before, m, prev, PlanOptions::default())
}

fn plan_opts(
    kind: ProviderKind,
    before: Option<&str>,
    m: &Manifest,
    prev: &BTreeSet<String>,
    opts: PlanOptions,
) -> FileChange {
    let path = target_path(Path::new("/repo"), &Target::project(kind));
    plan_text(
        path,
        kind,
        before.map(str::to_string),
        m,
        prev,
        opts,
        Extra {
            secrets: &m.secret_values(),
            ..Extra::default()
        },
    )
    .expect("plan succeeds")
}

fn assert_no_secret(what: &str, text: &str) {
    for secret in [TOKEN_VALUE, KEY_VALUE] {
        assert!(!text.contains(secret), "{what} leaks a secret:\n{text}");
    }
}

fn assert_change_has_no_secret(c: &FileChange) {
    assert_no_secret("after", &c.after);
    assert_no_secret("diff", &c.diff);
    assert_no_secret("notes", &c.notes.join("\n"));
    assert_no_secret("debug", &format!("{c:?}"));
}

#[test]
fn golden_claude() {
    let c = plan(ProviderKind::ClaudeCode, None, &manifest(SAMPLE), &none());
    insta::assert_snapshot!("claude_mcp_json", c.after);
    insta::assert_snapshot!("claude_notes", c.notes.join("\n"));
    assert_eq!(c.managed, names(&["fs", "web"]));
}

#[test]
fn golden_codex() {
    let c = plan(ProviderKind::Codex, None, &manifest(SAMPLE), &none());
    insta::assert_snapshot!("codex_config_toml", c.after);
    insta::assert_snapshot!("codex_notes", c.notes.join("\n"));
    assert_eq!(c.managed, names(&["fs", "off", "web"]));
}

#[test]
fn golden_gemini() {
    let c = plan(ProviderKind::GeminiCli, None, &manifest(SAMPLE), &none());
    insta::assert_snapshot!("gemini_settings_json", c.after);
    insta::assert_snapshot!("gemini_notes", c.notes.join("\n"));
}

#[test]
fn golden_opencode() {
    let c = plan(ProviderKind::Opencode, None, &manifest(SAMPLE), &none());
    insta::assert_snapshot!("opencode_json", c.after);
    insta::assert_snapshot!("opencode_notes", c.notes.join("\n"));
}

#[test]
fn secret_values_never_appear_in_any_output() {
    let m = manifest(SAMPLE);
    let existing_json = r#"{"mcpServers": {"fs": {"command": "old"}}, "mcp": {"fs": {"type": "local", "command": ["old"]}}}"#;
    let existing_toml = "[mcp_servers.fs]\ncommand = \"old\"\n";
    for kind in ProviderKind::ALL {
        let existing = if kind == ProviderKind::Codex {
            existing_toml
        } else {
            existing_json
        };
        for before in [None, Some(existing)] {
            for prev in [none(), names(&["fs", "web", "off"])] {
                let c = plan(kind, before, &m, &prev);
                assert_change_has_no_secret(&c);
            }
        }
    }
}

#[test]
fn codex_passes_secret_env_through_by_name_and_skips_renamed_ones() {
    let m = manifest(
        r#"
version = 1
[mcp.servers.a]
command = "srv"
env = { API_KEY = "${API_KEY}", OTHER = "${TOKEN}", PLAIN = "x" }
"#,
    );
    let c = plan(ProviderKind::Codex, None, &m, &none());
    assert!(c.after.contains(r#"env_vars = ["API_KEY"]"#), "{}", c.after);
    assert!(c.after.contains(r#"env = { PLAIN = "x" }"#), "{}", c.after);
    assert!(!c.after.contains("OTHER"), "{}", c.after);
    assert!(
        c.notes.iter().any(|n| n.contains("`OTHER`")),
        "{:?}",
        c.notes
    );
    assert_change_has_no_secret(&c);
}

#[test]
fn codex_skips_a_server_with_a_secret_argument_and_keeps_its_old_entry() {
    let m = manifest(
        r#"
version = 1
[mcp.servers.a]
command = "srv"
args = ["--key", "${API_KEY}"]
"#,
    );
    let before = "# mine\n[mcp_servers.a]\ncommand = \"old\"\n";
    let c = plan(ProviderKind::Codex, Some(before), &m, &names(&["a"]));
    assert_eq!(c.after, before);
    assert_eq!(c.managed, names(&["a"]));
    assert!(
        c.notes.iter().any(|n| n.contains("argument 2")),
        "{:?}",
        c.notes
    );
    // The JSON targets write the reference instead.
    let c = plan(ProviderKind::ClaudeCode, None, &m, &none());
    assert!(c.after.contains("\"${API_KEY}\""), "{}", c.after);
    assert_change_has_no_secret(&c);
}

#[test]
fn json_user_keys_entries_and_order_survive() {
    let before = r#"{
  "theme": "dark",
  "mcpServers": {
    "mine": {
      "command": "my-server"
    },
    "fs": {
      "command": "stale",
      "trust": true,
      "args": ["old"]
    },
    "gone": {
      "command": "x"
    }
  },
  "zzz": [1, 2]
}
"#;
    let m = manifest(SAMPLE);
    let c = plan(
        ProviderKind::GeminiCli,
        Some(before),
        &m,
        &names(&["fs", "gone"]),
    );
    let after: serde_json::Value = serde_json::from_str(&c.after).unwrap();
    let keys: Vec<&String> = after.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["theme", "mcpServers", "zzz"]);
    let servers = after["mcpServers"].as_object().unwrap();
    let server_keys: Vec<&String> = servers.keys().collect();
    assert_eq!(server_keys, ["mine", "fs", "web"]);
    assert_eq!(servers["mine"]["command"], "my-server");
    assert_eq!(
        servers["fs"]["trust"], true,
        "a user key in a managed entry survives"
    );
    assert_eq!(servers["fs"]["command"], "npx");
    assert!(
        c.after.starts_with("{\n  \"theme\": \"dark\",\n"),
        "{}",
        c.after
    );
    assert!(c.diff.contains("-    \"gone\": {"), "{}", c.diff);
    assert_eq!(c.managed, names(&["fs", "web"]));
}

#[test]
fn toml_comments_keys_and_other_tables_survive() {
    let before = r#"# my codex config
model = "o3" # the model

[mcp_servers.mine]
# hand-written
command = "mine"

[mcp_servers.fs]
command = "stale"
required = true # keep me

[profiles.x]
model = "o4"
"#;
    let m = manifest(SAMPLE);
    let c = plan(ProviderKind::Codex, Some(before), &m, &names(&["fs"]));
    for kept in [
        "# my codex config",
        "model = \"o3\" # the model",
        "# hand-written\ncommand = \"mine\"",
        "required = true # keep me",
        "[profiles.x]\nmodel = \"o4\"",
    ] {
        assert!(c.after.contains(kept), "lost {kept:?}:\n{}", c.after);
    }
    assert!(c.after.contains("command = \"npx\""), "{}", c.after);
    let doc: toml::Table = c.after.parse().unwrap();
    let servers = doc["mcp_servers"].as_table().unwrap();
    assert_eq!(
        servers.keys().collect::<Vec<_>>(),
        ["mine", "fs", "off", "web"]
    );
}

#[test]
fn unchanged_plan_is_byte_identical_and_idempotent() {
    let m = manifest(SAMPLE);
    for kind in ProviderKind::ALL {
        let first = plan(kind, None, &m, &none());
        let again = plan(kind, None, &m, &none());
        assert_eq!(first, again, "deterministic for {kind:?}");
        let second = plan(kind, Some(&first.after), &m, &first.managed);
        assert!(!second.is_change(), "{kind:?} churns:\n{}", second.diff);
        assert_eq!(second.diff, "");
        assert_eq!(second.managed, first.managed);
    }
}

#[test]
fn compact_json_is_not_rewritten_when_nothing_changes() {
    let m = manifest("version = 1\n[mcp.servers.a]\ncommand = \"srv\"\n");
    let before = r#"{"mcpServers":{"a":{"type":"stdio","command":"srv"}}}"#;
    let c = plan(ProviderKind::ClaudeCode, Some(before), &m, &names(&["a"]));
    assert!(!c.is_change());
}

#[test]
fn conflicts_are_reported_and_left_alone_unless_forced() {
    let m = manifest("version = 1\n[mcp.servers.a]\ncommand = \"srv\"\n");
    let before = "{\n  \"mcpServers\": {\n    \"a\": {\n      \"command\": \"theirs\",\n      \"trust\": true\n    }\n  }\n}\n";
    let c = plan(ProviderKind::GeminiCli, Some(before), &m, &none());
    assert_eq!(c.after, before);
    assert_eq!(c.conflicts, ["a"]);
    assert!(c.managed.is_empty());
    assert!(
        c.notes.iter().any(|n| n.contains("did not write")),
        "{:?}",
        c.notes
    );

    let forced = plan_opts(
        ProviderKind::GeminiCli,
        Some(before),
        &m,
        &none(),
        PlanOptions { force: true },
    );
    assert!(forced.conflicts.is_empty());
    assert_eq!(forced.managed, names(&["a"]));
    let v: serde_json::Value = serde_json::from_str(&forced.after).unwrap();
    assert_eq!(v["mcpServers"]["a"]["command"], "srv");
    assert!(
        v["mcpServers"]["a"].get("trust").is_none(),
        "a forced entry is replaced whole"
    );

    let toml_before = "[mcp_servers.a]\ncommand = \"theirs\"\n";
    let c = plan(ProviderKind::Codex, Some(toml_before), &m, &none());
    assert_eq!(c.after, toml_before);
    assert_eq!(c.conflicts, ["a"]);
}

#[test]
fn disabled_servers_are_omitted_and_removed_where_there_is_no_switch() {
    let m = manifest("version = 1\n[mcp.servers.a]\ncommand = \"srv\"\nenabled = false\n");
    let before = r#"{"mcpServers": {"a": {"command": "srv"}}}"#;
    let c = plan(ProviderKind::ClaudeCode, Some(before), &m, &names(&["a"]));
    let v: serde_json::Value = serde_json::from_str(&c.after).unwrap();
    assert_eq!(v["mcpServers"], serde_json::json!({}));
    assert!(c.managed.is_empty());
    let c = plan(ProviderKind::Codex, None, &m, &none());
    assert!(c.after.contains("enabled = false"), "{}", c.after);
}

#[test]
fn empty_manifest_creates_no_file() {
    let m = manifest("version = 1\n");
    for kind in ProviderKind::ALL {
        let c = plan(kind, None, &m, &none());
        assert!(!c.is_change(), "{kind:?}: {:?}", c.after);
    }
}

#[test]
fn invalid_existing_files_are_refused_with_position_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let m = manifest(SAMPLE);
    let cases = [
        (ProviderKind::ClaudeCode, "{\n  \"mcpServers\": {,\n}\n", 2),
        (ProviderKind::GeminiCli, "[1, 2]", 0),
        (ProviderKind::Opencode, "{\"mcp\": []}", 0),
        (ProviderKind::Codex, "a = 1\n[mcp_servers.x\n", 2),
        (ProviderKind::Codex, "mcp_servers = 3\n", 0),
    ];
    for (kind, text, line) in cases {
        let target = Target::project(kind);
        let path = target_path(dir.path(), &target);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        let err = plan_file(
            dir.path(),
            &target,
            &m,
            &none(),
            PlanOptions::default(),
            Default::default(),
        )
        .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains(&path.display().to_string()), "{msg}");
        match err {
            NativeError::Parse { line: l, .. } => assert_eq!(l, line, "{msg}"),
            NativeError::Shape { .. } => assert_eq!(line, 0, "{msg}"),
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
    }
}

#[test]
fn write_creates_directories_is_atomic_and_refuses_stale_plans() {
    let dir = tempfile::tempdir().unwrap();
    let m = manifest(SAMPLE);
    let target = Target::project(ProviderKind::Codex);
    let c = plan_file(
        dir.path(),
        &target,
        &m,
        &none(),
        PlanOptions::default(),
        Default::default(),
    )
    .unwrap();
    assert!(c.diff.starts_with("--- /dev/null\n"), "{}", c.diff);
    assert!(write(dir.path(), &c, crate::repofs::WriteOptions::SHARED).unwrap());
    let path = dir.path().join(".codex/config.toml");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), c.after);
    let leftovers: Vec<_> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers, ["config.toml"]);

    let again = plan_file(
        dir.path(),
        &target,
        &m,
        &c.managed,
        PlanOptions::default(),
        Default::default(),
    )
    .unwrap();
    assert!(
        !write(dir.path(), &again, crate::repofs::WriteOptions::SHARED).unwrap(),
        "an unchanged file is not rewritten"
    );

    let stale = plan_file(
        dir.path(),
        &target,
        &manifest("version = 1\n"),
        &c.managed,
        PlanOptions::default(),
        Default::default(),
    )
    .unwrap();
    std::fs::write(&path, "# edited meanwhile\n").unwrap();
    assert!(matches!(
        write(dir.path(), &stale, crate::repofs::WriteOptions::SHARED),
        Err(NativeError::Stale { .. })
    ));
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "# edited meanwhile\n"
    );
}

#[test]
fn user_scope_paths_are_under_home() {
    let home = PathBuf::from("/home/u");
    let user = |kind| Target {
        kind,
        scope: Scope::User { home: home.clone() },
    };
    assert_eq!(
        target_path(Path::new("/r"), &user(ProviderKind::Codex)),
        home.join(".codex/config.toml")
    );
    assert_eq!(
        target_path(Path::new("/r"), &user(ProviderKind::ClaudeCode)),
        home.join(".claude.json")
    );
    assert_eq!(
        target_path(Path::new("/r"), &Target::project(ProviderKind::Codex)),
        Path::new("/r/.codex/config.toml")
    );
}

// ---- import ----

const CLAUDE_FIXTURE: &str = r#"{
  "mcpServers": {
    "fs": {"type": "stdio", "command": "npx", "args": ["-y", "server-fs", "$HOME/x"],
           "env": {"API_KEY": "${API_KEY}", "MODE": "ro", "D": "${MISSING:-fallback}"}},
    "web": {"type": "http", "url": "https://mcp.example.com/mcp",
            "headers": {"Authorization": "Bearer ${TOKEN}", "X-Team": "core"}}
  }
}"#;

const GEMINI_FIXTURE: &str = r#"{
  "theme": "dark",
  "mcpServers": {
    "fs": {"command": "npx", "args": ["-y", "s"], "env": {"API_KEY": "$API_KEY", "B": "${TOKEN}"},
           "cwd": "tools", "timeout": 30000, "includeTools": ["read"], "excludeTools": ["write"]},
    "web": {"httpUrl": "https://mcp.example.com/mcp", "headers": {"Authorization": "Bearer $TOKEN"}}
  }
}"#;

const OPENCODE_FIXTURE: &str = r#"{
  "$schema": "https://opencode.ai/config.json",
  "mcp": {
    "fs": {"type": "local", "command": ["npx", "-y", "s"], "environment": {"API_KEY": "{env:API_KEY}"}},
    "web": {"type": "remote", "url": "https://mcp.example.com/mcp",
            "headers": {"Authorization": "Bearer {env:TOKEN}", "X-Key": "{env:API_KEY}"}}
  }
}"#;

const CODEX_FIXTURE: &str = r#"model = "o3"

[mcp_servers.fs]
command = "npx"
args = ["-y", "s", "cost $5", "${NOT_A_REF}"]
env = { MODE = "ro" }
env_vars = ["API_KEY"]
cwd = "tools"
startup_timeout_sec = 2.5
tool_timeout_sec = 30
enabled = false
enabled_tools = ["read"]
disabled_tools = ["write"]

[mcp_servers.web]
url = "https://mcp.example.com/mcp"
bearer_token_env_var = "TOKEN"
http_headers = { "X-Team" = "core" }
env_http_headers = { "X-Key" = "API_KEY" }
"#;

fn fixture(kind: ProviderKind) -> &'static str {
    match kind {
        ProviderKind::ClaudeCode => CLAUDE_FIXTURE,
        ProviderKind::Codex => CODEX_FIXTURE,
        ProviderKind::GeminiCli => GEMINI_FIXTURE,
        ProviderKind::Opencode => OPENCODE_FIXTURE,
    }
}

fn entries_manifest(entries: &[(String, ImportedServer)]) -> Manifest {
    manifest(&format!("version = 1\n{}", to_manifest_toml(entries)))
}

#[test]
fn import_export_import_round_trips_for_every_format() {
    for kind in ProviderKind::ALL {
        let path = target_path(Path::new("/repo"), &Target::project(kind));
        let first = import_str(&path, fixture(kind)).unwrap();
        assert_eq!(first.len(), 2, "{kind:?}");
        assert!(
            first.iter().all(|(_, s)| s.notes.is_empty()),
            "{kind:?}: {first:?}"
        );
        let m = entries_manifest(&first);
        let c = plan(kind, None, &m, &none());
        assert_change_has_no_secret(&c);
        let second = import_str(&path, &c.after).unwrap();
        assert_eq!(first, second, "{kind:?} round trip through:\n{}", c.after);
    }
}

#[test]
fn imported_references_stay_references() {
    let get = |kind| {
        let path = target_path(Path::new("/repo"), &Target::project(kind));
        let entries = import_str(&path, fixture(kind)).unwrap();
        entries.into_iter().collect::<BTreeMap<_, _>>()
    };
    let claude = get(ProviderKind::ClaudeCode);
    let ImportedTransport::Stdio { env, args, .. } = &claude["fs"].transport else {
        panic!()
    };
    assert_eq!(env["API_KEY"], "${API_KEY}");
    assert_eq!(env["D"], "${MISSING:-fallback}");
    assert_eq!(args[2], "$HOME/x");
    let ImportedTransport::Http {
        bearer_token_env,
        headers,
        ..
    } = &claude["web"].transport
    else {
        panic!()
    };
    assert_eq!(bearer_token_env.as_deref(), Some("TOKEN"));
    assert!(!headers.contains_key("Authorization"));

    let codex = get(ProviderKind::Codex);
    let ImportedTransport::Stdio { env, args, .. } = &codex["fs"].transport else {
        panic!()
    };
    assert_eq!(env["API_KEY"], "${API_KEY}");
    assert_eq!(args[3], "$${NOT_A_REF}", "a literal `${{` is escaped");
    assert_eq!(codex["fs"].startup_timeout_ms, Some(2500));
    assert_eq!(codex["fs"].tool_timeout_ms, Some(30_000));
    assert!(!codex["fs"].enabled);
    let ImportedTransport::Http { headers, .. } = &codex["web"].transport else {
        panic!()
    };
    assert_eq!(headers["X-Key"], "${API_KEY}");

    let opencode = get(ProviderKind::Opencode);
    let ImportedTransport::Http {
        headers,
        bearer_token_env,
        ..
    } = &opencode["web"].transport
    else {
        panic!()
    };
    assert_eq!(headers["X-Key"], "${API_KEY}");
    assert_eq!(bearer_token_env.as_deref(), Some("TOKEN"));
}

#[test]
fn import_detects_kind_by_shape_when_the_name_says_nothing() {
    let claude = import_str(Path::new("servers.json"), CLAUDE_FIXTURE).unwrap();
    assert_eq!(claude.len(), 2);
    let gemini = import_str(Path::new("x.json"), GEMINI_FIXTURE).unwrap();
    assert_eq!(
        gemini[0].1.enabled_tools.as_deref(),
        Some(&["read".to_string()][..])
    );
    let opencode = import_str(Path::new("x.json"), OPENCODE_FIXTURE).unwrap();
    assert_eq!(opencode.len(), 2);
    let codex = import_str(Path::new("codex.conf"), CODEX_FIXTURE).unwrap();
    assert_eq!(codex.len(), 2);
    assert!(matches!(
        import_str(Path::new("x.txt"), "hello"),
        Err(NativeError::UnknownKind { .. })
    ));
}

#[test]
fn sse_and_trust_are_imported_with_notes() {
    let text =
        r#"{"mcpServers": {"s": {"type": "sse", "url": "https://x.example/sse", "trust": true}}}"#;
    let e = import_str(Path::new(".gemini/settings.json"), text).unwrap();
    assert_eq!(e[0].1.notes.len(), 2, "{:?}", e[0].1.notes);
    let toml = to_manifest_toml(&e);
    assert!(toml.contains("# SSE transport"), "{toml}");
    assert!(
        toml.contains("[mcp.servers.s]\nurl = \"https://x.example/sse\""),
        "{toml}"
    );
}

/// A `same` judgement that never matches: only the manifest text decides.
fn never(_: &str, _: &ImportedServer) -> bool {
    false
}

#[test]
fn manifest_toml_is_loadable_and_merge_keeps_comments() {
    let path = Path::new(".mcp.json");
    let entries = import_str(path, CLAUDE_FIXTURE).unwrap();
    let printed = to_manifest_toml(&entries);
    insta::assert_snapshot!("imported_manifest_toml", printed);

    let existing = "# my manifest\nversion = 1\n\n[mcp.servers.old] # keep\ncommand = \"old\"\n\n[providers.claude]\nkind = \"claude_code\"\n";
    let merged = merge_into_manifest(existing, &entries, never, MergeOptions::default())
        .unwrap()
        .text;
    assert!(
        merged.starts_with(existing.split("[providers").next().unwrap()),
        "{merged}"
    );
    assert!(
        merged.contains("[providers.claude]\nkind = \"claude_code\""),
        "{merged}"
    );
    let m = manifest(&merged);
    assert_eq!(
        m.mcp_servers.keys().collect::<Vec<_>>(),
        ["fs", "old", "web"]
    );

    // The same entries again: already declared identically, nothing changes.
    let again = merge_into_manifest(&merged, &entries, never, MergeOptions::default()).unwrap();
    assert_eq!(again.text, merged);
    assert_eq!(again.unchanged, ["fs", "web"]);
    assert!(again.added.is_empty() && again.replaced.is_empty());

    // A differing entry is a conflict with a diff, resolved by `replace`.
    let mut changed = entries.clone();
    if let ImportedTransport::Stdio { args, .. } = &mut changed[0].1.transport {
        args.push("--extra".into());
    }
    let err = merge_into_manifest(&merged, &changed, never, MergeOptions::default()).unwrap_err();
    assert!(matches!(err, NativeError::ImportConflict { .. }), "{err}");
    let shown = err.to_string();
    assert!(
        shown.contains("`fs`")
            && !shown.contains("`web`")
            && shown.contains("+")
            && shown.contains("--extra")
            && shown.contains("--replace"),
        "{shown}"
    );
    let replaced =
        merge_into_manifest(&merged, &changed, never, MergeOptions { replace: true }).unwrap();
    assert_eq!(replaced.replaced, ["fs"]);
    assert_eq!(replaced.unchanged, ["web"]);
    assert!(replaced.text.contains("--extra"), "{}", replaced.text);
    assert_eq!(
        manifest(&replaced.text)
            .mcp_servers
            .keys()
            .collect::<Vec<_>>(),
        ["fs", "old", "web"]
    );

    let bad =
        merge_into_manifest("version = \n", &entries, never, MergeOptions::default()).unwrap_err();
    assert!(matches!(bad, NativeError::Parse { line: 1, .. }), "{bad}");
}

#[test]
fn import_rejects_wrong_shapes_with_the_field_named() {
    let cases = [
        (".mcp.json", r#"{"mcpServers": []}"#, "`mcpServers`"),
        (".mcp.json", r#"{"mcpServers": {"a": 1}}"#, "`mcpServers.a`"),
        (
            ".mcp.json",
            r#"{"mcpServers": {"a": {"command": 1}}}"#,
            "`mcpServers.a.command`",
        ),
        (
            ".mcp.json",
            r#"{"mcpServers": {"a": {"command": "x", "args": [1]}}}"#,
            "`mcpServers.a.args`",
        ),
        (
            ".mcp.json",
            r#"{"mcpServers": {"a": {}}}"#,
            "`mcpServers.a`",
        ),
        (
            "opencode.json",
            r#"{"mcp": {"a": {"type": "local", "command": []}}}"#,
            "`mcp.a.command`",
        ),
        (
            ".gemini/settings.json",
            r#"{"mcpServers": {"a": {"command": "x", "timeout": -1}}}"#,
            "`mcpServers.a.timeout`",
        ),
        (
            "config.toml",
            "[mcp_servers.a]\ncommand = 1\n",
            "`mcp_servers.a.command`",
        ),
        (
            "config.toml",
            "[mcp_servers.a]\nurl = \"u\"\ntool_timeout_sec = -3\n",
            "`mcp_servers.a.tool_timeout_sec`",
        ),
        (
            "config.toml",
            "[mcp_servers.a]\ncommand = \"x\"\nenv_vars = [\"not a name\"]\n",
            "`mcp_servers.a.env_vars`",
        ),
        ("config.toml", "mcp_servers = 1\n", "`mcp_servers`"),
    ];
    for (name, text, field) in cases {
        let err = import_str(Path::new(name), text).unwrap_err();
        assert!(
            matches!(err, NativeError::Shape { .. }),
            "{name} {text}: {err}"
        );
        assert!(err.to_string().contains(field), "{err}");
    }
}

#[test]
fn hostile_input_gives_clear_errors() {
    let deep_json = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    // Past the item bound: refused before a parser sees it.
    let err = import_str(Path::new(".mcp.json"), &deep_json).unwrap_err();
    assert!(
        matches!(err, NativeError::TooManyItems { line: 1, .. }),
        "{err}"
    );
    let deep_toml = format!("a = {}{}", "[".repeat(100_000), "]".repeat(100_000));
    let err = import_str(Path::new("config.toml"), &deep_toml).unwrap_err();
    assert!(matches!(err, NativeError::TooManyItems { .. }), "{err}");
    // Within it: the parsers' own depth limits.
    let deep_json = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    let err = import_str(Path::new(".mcp.json"), &deep_json).unwrap_err();
    assert!(matches!(err, NativeError::Parse { line: 1, .. }), "{err}");
    let deep_toml = format!("a = {}{}", "[".repeat(10_000), "]".repeat(10_000));
    let err = import_str(Path::new("config.toml"), &deep_toml).unwrap_err();
    assert!(matches!(err, NativeError::Parse { .. }), "{err}");
    let err = import_str(Path::new(".mcp.json"), "\u{0}\u{1}garbage").unwrap_err();
    assert!(matches!(err, NativeError::Parse { .. }), "{err}");

    let many: String = (0..=MAX_IMPORT_SERVERS)
        .map(|i| format!("\"s{i}\": {{\"command\": \"x\"}}"))
        .collect::<Vec<_>>()
        .join(",");
    let err = import_str(
        Path::new(".mcp.json"),
        &format!("{{\"mcpServers\": {{{many}}}}}"),
    )
    .unwrap_err();
    assert!(err.to_string().contains("limit"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let huge = dir.path().join(".mcp.json");
    let file = std::fs::File::create(&huge).unwrap();
    file.set_len(MAX_NATIVE_FILE_BYTES as u64 + 1).unwrap();
    assert!(matches!(import(&huge), Err(NativeError::TooLarge { .. })));
    let bad_utf8 = dir.path().join("opencode.json");
    std::fs::write(&bad_utf8, b"{\"mcp\": \"\xff\"}").unwrap();
    assert!(matches!(
        import(&bad_utf8),
        Err(NativeError::NotUtf8 { .. })
    ));
    assert!(matches!(
        import(&dir.path().join("missing.json")),
        Err(NativeError::Read { .. })
    ));
}

use super::import::MAX_IMPORT_SERVERS;

proptest! {
    #[test]
    fn import_never_panics(text in "\\PC{0,200}", which in 0usize..4) {
        let name = [".mcp.json", "config.toml", ".gemini/settings.json", "opencode.json"][which];
        let _ = import_str(Path::new(name), &text);
    }

    #[test]
    fn import_never_panics_on_json_shaped_input(
        key in prop::sample::select(vec!["mcpServers", "mcp"]),
        body in "[\\[\\]{}\":,a-z0-9 ${}]{0,120}",
    ) {
        let text = format!("{{\"{key}\": {{\"a\": {body}}}}}");
        let _ = import_str(Path::new("x.json"), &text);
    }
}

#[test]
fn codex_reads_secret_headers_from_the_environment_where_it_can() {
    let m = manifest(
        r#"
version = 1
[mcp.servers.h]
url = "https://mcp.example.com/mcp"
headers = { Authorization = "Bearer ${TOKEN}", "X-Key" = "${API_KEY}", "X-Mixed" = "k=${API_KEY}" }
"#,
    );
    let c = plan(ProviderKind::Codex, None, &m, &none());
    assert!(
        c.after.contains("bearer_token_env_var = \"TOKEN\""),
        "{}",
        c.after
    );
    assert!(
        c.after
            .contains("env_http_headers = { X-Key = \"API_KEY\" }"),
        "{}",
        c.after
    );
    assert!(!c.after.contains("X-Mixed"), "{}", c.after);
    assert!(
        c.notes.iter().any(|n| n.contains("`X-Mixed`")),
        "{:?}",
        c.notes
    );
    assert_change_has_no_secret(&c);
}

#[test]
fn imported_names_the_manifest_would_reject_get_a_note() {
    let text = r#"{"mcpServers": {"GitHub": {"command": "gh-mcp"}, "ok-name": {"command": "x"}}}"#;
    let e = import_str(Path::new(".mcp.json"), text).unwrap();
    assert_eq!(e[0].1.notes.len(), 1, "{:?}", e[0].1.notes);
    assert!(e[0].1.notes[0].contains("`github`"), "{:?}", e[0].1.notes);
    assert!(e[1].1.notes.is_empty());
}

// --- import never turns data into configuration (hostile issue §3) ---

/// Arbitrary text, control characters and TOML/JSON punctuation included.
fn hostile_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "\\PC{0,24}",
        "[a-z\\n\\r\\t\"'#=\\[\\]{}.$\\\\ \u{7f}\u{85}\u{2028}]{0,24}",
        Just("x\n[daemon]\nlisten = \"0.0.0.0:80\"\n#".to_string()),
        Just("y\r\n[hooks.h]\nbefore_tool = \"sh -c evil\"".to_string()),
    ]
}

/// One native file of `kind` declaring `servers` (name, command, arg,
/// env value), built with each format's own serializer.
fn native_file(kind: ProviderKind, servers: &[(String, String, String, String)]) -> String {
    match kind {
        ProviderKind::Codex => {
            let mut doc = toml_edit::DocumentMut::new();
            let mut all = toml_edit::Table::new();
            for (name, command, arg, value) in servers {
                let mut t = toml_edit::Table::new();
                t["command"] = toml_edit::value(command.as_str());
                let mut args = toml_edit::Array::new();
                args.push(arg.as_str());
                t["args"] = toml_edit::value(args);
                let mut env = toml_edit::InlineTable::new();
                env.insert("K", value.as_str().into());
                t["env"] = toml_edit::value(env);
                all.insert(name, toml_edit::Item::Table(t));
            }
            doc.insert("mcp_servers", toml_edit::Item::Table(all));
            doc.to_string()
        }
        _ => {
            let mut all = serde_json::Map::new();
            for (name, command, arg, value) in servers {
                let entry = if kind == ProviderKind::Opencode {
                    serde_json::json!({"type": "local", "command": [command, arg], "environment": {"K": value}})
                } else {
                    serde_json::json!({"command": command, "args": [arg], "env": {"K": value}})
                };
                all.insert(name.clone(), entry);
            }
            let key = if kind == ProviderKind::Opencode {
                "mcp"
            } else {
                "mcpServers"
            };
            serde_json::json!({ key: all }).to_string()
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever names and values a file holds, the printed and the merged
    /// manifest parse, and declare exactly the imported servers and nothing
    /// else: no text escapes a comment or a string into live TOML.
    #[test]
    fn import_output_declares_only_what_was_imported(
        servers in prop::collection::btree_map(
            hostile_text(),
            (hostile_text(), hostile_text(), hostile_text()),
            1..4,
        ),
        which in 0usize..4,
    ) {
        let kind = ProviderKind::ALL[which];
        let servers: Vec<(String, String, String, String)> = servers
            .into_iter()
            .filter(|(_, (command, _, _))| !command.is_empty())
            .map(|(n, (c, a, v))| (n, c, a, v))
            .collect();
        prop_assume!(!servers.is_empty());
        let path = target_path(Path::new("/repo"), &Target::project(kind));
        let text = native_file(kind, &servers);
        let entries = import_str(&path, &text).unwrap();
        let want: BTreeSet<&str> = servers.iter().map(|(n, ..)| n.as_str()).collect();
        let check = |out: &str, extra: &[&str]| {
            let doc: toml::Table = out.parse().unwrap_or_else(|e| panic!("{e}\n{out}"));
            let mut top: Vec<&str> = doc.keys().map(String::as_str).collect();
            top.sort_unstable();
            let mut expected_top = vec!["mcp"];
            expected_top.extend(extra);
            expected_top.sort_unstable();
            prop_assert_eq!(top, expected_top, "{}", out);
            let mcp = doc["mcp"].as_table().unwrap();
            prop_assert_eq!(mcp.keys().collect::<Vec<_>>(), vec!["servers"], "{}", out);
            let declared = mcp["servers"].as_table().unwrap();
            let got: BTreeSet<&str> = declared.keys().map(String::as_str).filter(|n| *n != "base").collect();
            prop_assert_eq!(&got, &want, "{}", out);
            for (name, command, ..) in &servers {
                let s = declared[name.as_str()].as_table().unwrap();
                prop_assert_eq!(s["command"].as_str(), Some(command.as_str()));
                let keys: BTreeSet<&str> = s.keys().map(String::as_str).collect();
                prop_assert!(keys.is_subset(&["command", "args", "env"].into()), "{:?}", keys);
                // Values come back in manifest spelling: `$` doubled unless
                // it was a reference; the text itself is never dropped.
                let args = s.get("args").and_then(|a| a.as_array()).map(|a| a.len()).unwrap_or(0);
                prop_assert_eq!(args, 1, "{}", out);
                prop_assert!(s.get("env").and_then(|e| e.get("K")).is_some_and(toml::Value::is_str), "{}", out);
            }
            Ok(())
        };
        check(&to_manifest_toml(&entries), &[])?;
        let base = "version = 1\n# keep\n[mcp.servers.base]\ncommand = \"b\"\n";
        let merged = merge_into_manifest(base, &entries, never, MergeOptions::default());
        // A name equal to `base` is a conflict (with a diff), never a merge.
        if let Ok(merged) = merged {
            check(&merged.text, &["version"])?;
        }
    }
}

#[test]
fn a_newline_in_a_name_stays_inside_its_comment() {
    let text = r#"{"mcpServers": {"x\n[daemon]\nlisten = \"0.0.0.0:9\"\n": {"command": "c"}}}"#;
    let entries = import_str(Path::new(".mcp.json"), text).unwrap();
    let out = to_manifest_toml(&entries);
    let doc: toml::Table = out.parse().unwrap();
    assert_eq!(doc.keys().collect::<Vec<_>>(), ["mcp"], "{out}");
    assert!(out.contains("# `x\\n[daemon]\\nlisten"), "{out}");
    assert_eq!(
        import::comment_line("a\nb\r\u{7f}\tc"),
        "a\\nb\\r\\u{7f}\tc"
    );
}

#[test]
fn same_as_manifest_holds_for_what_npc_writes_in_every_format() {
    let m = manifest(SAMPLE);
    for kind in ProviderKind::ALL {
        let c = plan(kind, None, &m, &none());
        let path = target_path(Path::new("/repo"), &Target::project(kind));
        let imported = import_str(&path, &c.after).unwrap();
        assert!(!imported.is_empty(), "{kind:?}");
        for (name, server) in &imported {
            assert!(
                same_as_manifest(kind, name, &m.mcp_servers[name], server),
                "{kind:?} `{name}`: {server:?}\n{}",
                c.after
            );
        }
        // A changed file entry is no longer the manifest's.
        let (name, server) = &imported[0];
        let mut other = server.clone();
        other.enabled_tools = Some(vec!["zzz".into()]);
        other.transport = ImportedTransport::Stdio {
            command: "other".into(),
            args: Vec::new(),
            env: BTreeMap::new(),
            cwd: None,
        };
        assert!(!same_as_manifest(kind, name, &m.mcp_servers[name], &other));
    }
}

// --- plan diffs redact known secrets on both sides (hostile issue §7) ---

#[test]
fn diffs_redact_secret_values_a_cli_resolved_into_the_file() {
    let m = manifest(SAMPLE);
    // Gemini's `mcp add` wrote the value, not the reference.
    let before = format!(
        "{{\"mcpServers\": {{\"fs\": {{\"command\": \"npx\", \"env\": {{\"API_KEY\": \"{KEY_VALUE}\"}}}}}}}}"
    );
    let c = plan(ProviderKind::GeminiCli, Some(&before), &m, &names(&["fs"]));
    assert!(c.is_change());
    assert_no_secret("diff", &c.diff);
    assert_no_secret("notes", &c.notes.join("\n"));
    assert!(
        c.diff.contains("-") && c.diff.contains("<redacted>"),
        "{}",
        c.diff
    );
    assert_no_secret(
        "diff",
        &redacted_diff(
            Path::new("f"),
            Some(KEY_VALUE),
            TOKEN_VALUE,
            &[KEY_VALUE, TOKEN_VALUE],
        ),
    );
}

// --- what the agent CLIs accept (hostile issue §10) ---

const GEMINI_WITH_COMMENTS: &str = r#"// Gemini settings, kept by hand
{
  /* the theme */
  "theme": "dark", // trailing note
  "mcpServers": {
    // a server the user keeps
    "mine": { "command": "my-server" /* inline */ },
    "fs": { "command": "old" } // managed by npc
  }
}
"#;

#[test]
fn gemini_settings_with_comments_are_read_and_their_comments_kept() {
    let m = manifest(SAMPLE);
    let c = plan(
        ProviderKind::GeminiCli,
        Some(GEMINI_WITH_COMMENTS),
        &m,
        &names(&["fs"]),
    );
    for comment in [
        "// Gemini settings, kept by hand",
        "/* the theme */",
        "// trailing note",
        "// a server the user keeps",
        "/* inline */",
    ] {
        assert!(c.after.contains(comment), "lost {comment}:\n{}", c.after);
    }
    assert!(
        c.notes.iter().all(|n| !n.contains("comments")),
        "{:?}",
        c.notes
    );
    let stripped = jsonc::strip(&c.after, edit::dialect(ProviderKind::GeminiCli).unwrap()).unwrap();
    let v: serde_json::Value = serde_json::from_str(&stripped).unwrap();
    assert_eq!(v["theme"], "dark");
    assert_eq!(v["mcpServers"]["mine"]["command"], "my-server");
    assert_eq!(v["mcpServers"]["fs"]["command"], "npx");
    assert_eq!(v["mcpServers"]["web"]["type"], "http");
    // Applied once, the next plan changes nothing.
    let again = plan(ProviderKind::GeminiCli, Some(&c.after), &m, &c.managed);
    assert!(!again.is_change(), "{}", again.diff);
    // Import reads the commented file too.
    let imported = import_str(Path::new(".gemini/settings.json"), GEMINI_WITH_COMMENTS).unwrap();
    assert_eq!(imported.len(), 2);
}

#[test]
fn removing_a_managed_entry_keeps_the_comments_of_the_others() {
    let m = manifest("version = 1\n");
    let c = plan(
        ProviderKind::GeminiCli,
        Some(GEMINI_WITH_COMMENTS),
        &m,
        &names(&["fs"]),
    );
    let stripped = jsonc::strip(&c.after, edit::dialect(ProviderKind::GeminiCli).unwrap()).unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&stripped).unwrap_or_else(|e| panic!("{e}\n{}", c.after));
    assert_eq!(v["mcpServers"].as_object().unwrap().len(), 1, "{}", c.after);
    assert!(
        c.after.contains("// a server the user keeps"),
        "{}",
        c.after
    );
}

#[test]
fn opencode_jsonc_with_trailing_commas_is_accepted() {
    let m = manifest(SAMPLE);
    let before = "{\n  // mine\n  \"mcp\": {\n    \"x\": {\"type\": \"local\", \"command\": [\"x\"],},\n  },\n}\n";
    let c = plan(ProviderKind::Opencode, Some(before), &m, &none());
    assert!(c.after.contains("// mine"), "{}", c.after);
    let again = plan(ProviderKind::Opencode, Some(&c.after), &m, &c.managed);
    assert!(!again.is_change(), "{}", again.diff);
    // Strict JSON for Claude: a comment is a parse error with its position.
    let err = plan_text(
        PathBuf::from(".mcp.json"),
        ProviderKind::ClaudeCode,
        Some("// no\n{}".into()),
        &m,
        &none(),
        PlanOptions::default(),
        Default::default(),
    )
    .unwrap_err();
    assert!(matches!(err, NativeError::Parse { line: 1, .. }), "{err}");
}

#[test]
fn gemini_url_entries_are_labelled_by_their_type() {
    let text = r#"{"mcpServers": {
        "h": {"type": "http", "url": "https://h.example/mcp"},
        "plain": {"url": "https://p.example/mcp"},
        "s": {"type": "sse", "url": "https://s.example/sse"}
    }}"#;
    let e = import_str(Path::new(".gemini/settings.json"), text).unwrap();
    let notes: BTreeMap<&str, usize> = e.iter().map(|(n, s)| (n.as_str(), s.notes.len())).collect();
    assert_eq!(notes, [("h", 0), ("plain", 0), ("s", 1)].into());
    let bad = import_str(
        Path::new(".gemini/settings.json"),
        r#"{"mcpServers": {"b": {"type": "ws", "url": "https://b"}}}"#,
    )
    .unwrap_err();
    assert!(bad.to_string().contains("mcpServers.b.type"), "{bad}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Comments anywhere between tokens: stripping gives the same value as
    /// the comment-free text, and a plan either keeps every comment of the
    /// entries it did not touch or says it dropped them — never a file
    /// that Gemini would read differently.
    #[test]
    fn jsonc_comments_anywhere_are_read_and_edits_stay_valid(
        // `u…` names never collide with the manifest's `fs`, `web` and `off`.
        names in prop::collection::btree_set("u[a-z]{0,5}", 0..4),
        comment in prop_oneof![Just("// c\n"), Just("/* c */"), Just("/* a\n b */")],
        slots in prop::collection::vec(any::<bool>(), 64),
        managed in any::<bool>(),
    ) {
        let mut servers = serde_json::Map::new();
        for n in &names {
            servers.insert(n.clone(), serde_json::json!({"command": n, "args": ["a"]}));
        }
        let plain = serde_json::to_string_pretty(&serde_json::json!({"theme": "x", "mcpServers": servers})).unwrap();
        // Put the comment after some of the structural tokens.
        let mut text = String::new();
        let mut k = 0;
        for ch in plain.chars() {
            text.push(ch);
            if matches!(ch, '{' | ',' | '[' | ':') {
                if slots[k % slots.len()] {
                    text.push_str(comment);
                }
                k += 1;
            }
        }
        let dialect = edit::dialect(ProviderKind::GeminiCli).unwrap();
        let stripped = jsonc::strip(&text, dialect).unwrap_or_else(|| text.clone());
        let a: serde_json::Value = serde_json::from_str(&stripped).unwrap();
        let b: serde_json::Value = serde_json::from_str(&plain).unwrap();
        prop_assert_eq!(&a, &b);
        let m = manifest(SAMPLE);
        let prev: BTreeSet<String> = if managed { names.clone() } else { none() };
        let c = plan(ProviderKind::GeminiCli, Some(&text), &m, &prev);
        let after = jsonc::strip(&c.after, dialect).unwrap_or_else(|| c.after.clone());
        let v: serde_json::Value = serde_json::from_str(&after).unwrap_or_else(|e| panic!("{e}\n{}", c.after));
        prop_assert_eq!(&v["theme"], "x");
        prop_assert_eq!(&v["mcpServers"]["fs"]["command"], "npx");
        prop_assert!(!c.notes.iter().any(|n| n.contains("comments")), "{:?}\n{}", c.notes, c.after);
        for n in &names {
            let kept = v["mcpServers"].get(n.as_str()).is_some();
            prop_assert_eq!(kept, !managed || m.mcp_servers.contains_key(n.as_str()), "{}", c.after);
        }
        let again = plan(ProviderKind::GeminiCli, Some(&c.after), &m, &c.managed);
        prop_assert!(!again.is_change(), "{}", again.diff);
    }
}
