//! Whole-loader tests of [`load_bytes`]: regressions found while building
//! the fixture corpus, hostile input (empty, binary, NUL bytes, huge, deeply
//! nested, duplicate keys, very long lines), and property tests feeding the
//! loader arbitrary bytes and mutated valid manifests in both syntaxes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use proptest::prelude::*;

use super::diagnostics::{JsonReport, MAX_DIAGNOSTICS, Severity};
use super::*;

/// The valid fixtures, compiled in so the property tests need no disk.
const FULL_TOML: &str = include_str!("../../fixtures/valid/full.toml");
const MINIMAL_JSON: &str = include_str!("../../fixtures/valid/minimal.json");
const TRIAGE_TEMPLATE: &str = include_str!("../../fixtures/valid/prompts/triage.md.j2");
const LINT_PLUGIN: &str = include_str!("../../fixtures/valid/plugins/lint/plugin.json");

/// Nesting depth of the hostile documents.
const HOSTILE_DEPTH: usize = 10_000;

/// Referenced files held in memory.
#[derive(Debug, Default)]
struct MapFiles {
    files: BTreeMap<PathBuf, String>,
    dirs: BTreeSet<PathBuf>,
}

impl MapFiles {
    fn with(mut self, path: &str, text: &str) -> Self {
        let path = PathBuf::from(path);
        let mut dir = path.parent();
        while let Some(d) = dir.filter(|d| !d.as_os_str().is_empty()) {
            self.dirs.insert(d.to_path_buf());
            dir = d.parent();
        }
        self.files.insert(path, text.to_string());
        self
    }
}

impl Files for MapFiles {
    fn read_to_string(&self, path: &Path) -> std::io::Result<String> {
        self.files
            .get(path)
            .cloned()
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound))
    }
    fn is_dir(&self, path: &Path) -> bool {
        self.dirs.contains(path)
    }
}

/// The files `fixtures/valid/full.toml` references.
fn fixture_files() -> MapFiles {
    MapFiles::default()
        .with("prompts/triage.md.j2", TRIAGE_TEMPLATE)
        .with("plugins/lint/plugin.json", LINT_PLUGIN)
}

/// Load with an empty environment.
fn load(name: &str, bytes: &[u8], files: &dyn Files) -> Loaded {
    let env: BTreeMap<String, String> = BTreeMap::new();
    load_bytes(name, bytes, Syntax::from_path(name), &env, files)
}

/// What every load must satisfy, whatever the input.
fn check_invariants(loaded: &Loaded) -> Result<(), String> {
    match &loaded.manifest {
        None if loaded.error_count() == 0 => {
            return Err(format!(
                "no manifest but no error: {:#?}",
                loaded.diagnostics
            ));
        }
        Some(_) if loaded.error_count() > 0 => {
            return Err("a manifest despite errors".into());
        }
        _ => {}
    }
    if loaded.diagnostics.len() > MAX_DIAGNOSTICS + 1 {
        return Err(format!("{} diagnostics", loaded.diagnostics.len()));
    }
    for d in &loaded.diagnostics {
        if let Some(loc) = &d.location {
            let len = loc.file.text().len();
            if !(loc.span.start <= loc.span.end && loc.span.end <= len) {
                return Err(format!(
                    "span {:?} outside `{}` ({len} bytes): {}",
                    loc.span,
                    loc.file.name(),
                    d.summary
                ));
            }
        }
        if d.summary.is_empty() {
            return Err("empty summary".into());
        }
        // Rendering must not panic either.
        let _ = d.to_string();
    }
    let _ = serde_json::to_string(&JsonReport::new(&loaded.diagnostics));
    Ok(())
}

fn summaries(loaded: &Loaded) -> Vec<&str> {
    loaded
        .diagnostics
        .iter()
        .map(|d| d.summary.as_str())
        .collect()
}

/// Load hostile bytes, check the invariants, and require a refusal.
fn refused(name: &str, bytes: &[u8]) -> Loaded {
    let loaded = load(name, bytes, &MapFiles::default());
    check_invariants(&loaded).unwrap();
    assert!(loaded.manifest.is_none(), "{name} accepted");
    loaded
}

#[test]
fn valid_fixtures_load() {
    let full = load("full.toml", FULL_TOML.as_bytes(), &fixture_files());
    assert!(full.diagnostics.is_empty(), "{:#?}", full.diagnostics);
    let m = full.manifest.unwrap();
    assert_eq!(m.triggers.len(), 4);
    assert_eq!(m.prompts.len(), 2);
    let minimal = load(
        "minimal.json",
        MINIMAL_JSON.as_bytes(),
        &MapFiles::default(),
    );
    assert!(minimal.manifest.is_some(), "{:#?}", minimal.diagnostics);
}

// Regressions found with the corpus ------------------------------------------

#[test]
fn a_wrong_typed_version_is_reported_once() {
    for (name, text) in [
        ("m.json", "{\"version\": \"1\"}"),
        ("m.toml", "version = 1.5\n"),
        ("m.toml", "version = [1]\n"),
    ] {
        let loaded = refused(name, text.as_bytes());
        assert_eq!(loaded.diagnostics.len(), 1, "{:#?}", loaded.diagnostics);
        assert!(summaries(&loaded)[0].starts_with("wrong type for `version`"));
    }
    // A well-typed but unsupported version is still reported.
    let loaded = refused("m.toml", b"version = 0\n");
    assert_eq!(summaries(&loaded), ["unsupported manifest version `0`"]);
}

#[test]
fn template_file_errors_name_the_file_next_to_the_manifest() {
    let files = MapFiles::default().with("prompts/p.j2", "ok\n{% if %}\n");
    let text = "version = 1\n[prompts.p]\nfile = \"prompts/p.j2\"\n";
    let loaded = load("repo/sub/npcagent.toml", text.as_bytes(), &files);
    check_invariants(&loaded).unwrap();
    let d = &loaded.diagnostics[0];
    assert!(d.summary.starts_with("template syntax error in prompt `p`"));
    let loc = d.location.as_ref().unwrap();
    assert_eq!(loc.file.name(), "repo/sub/prompts/p.j2");
    assert_eq!(d.range().unwrap().0.line, 2);
}

#[test]
fn regex_errors_are_not_prefixed_twice() {
    let text = "version = 1\n[[hooks.before_tool]]\ncommand = \"x\"\nmatcher = \"(\"\n";
    let loaded = refused("m.toml", text.as_bytes());
    assert_eq!(
        summaries(&loaded),
        ["`matcher` is not a valid regular expression: unclosed group"]
    );
}

#[test]
fn a_matcher_too_big_to_compile_is_refused_like_bad_syntax() {
    let text =
        "version = 1\n[[hooks.before_tool]]\ncommand = \"x\"\nmatcher = \"\\\\w{1000}{1000}\"\n";
    let loaded = refused("m.toml", text.as_bytes());
    let found = summaries(&loaded);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("`matcher` is not a valid regular expression: "),
        "{found:?}"
    );
}

#[test]
fn toml_duplicate_keys_name_the_key() {
    let loaded = refused(
        "m.toml",
        b"version = 1\n[project]\nname = \"a\"\nname = \"b\"\n",
    );
    assert_eq!(summaries(&loaded), ["invalid TOML: duplicate key `name`"]);
}

// Hostile input ---------------------------------------------------------------

#[test]
fn empty_and_blank_files_are_refused() {
    for (name, text) in [
        ("m.toml", ""),
        ("m.toml", "\n\n   \n"),
        ("m.json", ""),
        ("m.json", "  \n"),
    ] {
        let loaded = refused(name, text.as_bytes());
        assert_eq!(loaded.diagnostics.len(), 1, "{name} {text:?}");
    }
}

#[test]
fn binary_garbage_is_refused() {
    let garbage: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
    for name in ["m.toml", "m.json"] {
        let loaded = refused(name, &garbage);
        assert_eq!(summaries(&loaded), ["manifest is not valid UTF-8"]);
        // Points at the first bad byte (0x80, after 0x00..=0x7f).
        assert_eq!(
            loaded.diagnostics[0].location.as_ref().unwrap().span,
            128..129
        );
    }
    // Valid UTF-8 that is neither TOML nor JSON.
    let noise: String = "\u{1}\u{7f}é\u{feff}😀\u{0}".repeat(10_000);
    refused("m.toml", noise.as_bytes());
    refused("m.json", noise.as_bytes());
}

#[test]
fn nul_bytes_are_refused() {
    for (name, text) in [
        ("m.toml", &b"version = 1\x00\n"[..]),
        ("m.toml", b"version = 1\n[project]\nname = \"a\x00b\"\n"),
        ("m.json", b"{\"version\": 1,\x00 \"a\": 1}"),
        (
            "m.json",
            b"{\"version\": 1, \"project\": {\"name\": \"a\x00b\"}}",
        ),
        ("m.toml", b"\x00\x00\x00\x00"),
    ] {
        let loaded = refused(name, text);
        let shown = loaded.diagnostics[0].to_string();
        assert!(!shown.contains('\0'), "NUL reached the terminal: {shown:?}");
    }
}

#[test]
fn oversized_input_is_refused_before_parsing() {
    let big = vec![b'#'; node::MAX_MANIFEST_BYTES + 1];
    let loaded = refused("m.toml", &big);
    assert_eq!(loaded.diagnostics.len(), 1);
    assert!(summaries(&loaded)[0].starts_with("manifest is larger than the limit"));
    // Exactly at the limit it is parsed (and here, a comment-only file,
    // rejected for what it says rather than its size).
    let at_limit = vec![b'#'; node::MAX_MANIFEST_BYTES];
    let loaded = refused("m.toml", &at_limit);
    assert_eq!(summaries(&loaded), ["missing field `version`"]);
}

#[test]
fn deep_nesting_is_refused_without_overflowing_the_stack() {
    let d = HOSTILE_DEPTH;
    let cases = [
        (
            "m.toml",
            format!("version = 1\nx = {}{}\n", "[".repeat(d), "]".repeat(d)),
        ),
        (
            "m.toml",
            format!("version = 1\nx = {}1{}\n", "{a = ".repeat(d), "}".repeat(d)),
        ),
        (
            "m.toml",
            format!("version = 1\nx = {}\n", "[{a = ".repeat(d)),
        ),
        (
            "m.toml",
            format!("version = 1\n{} = 1\n", vec!["a"; d].join(".")),
        ),
        (
            "m.toml",
            format!("version = 1\n[{}]\n", vec!["a"; d].join(".")),
        ),
        (
            "m.toml",
            format!("version = 1\n[[{}]]\n", vec!["a"; d].join(".")),
        ),
        ("m.json", format!("{}{}", "[".repeat(d), "]".repeat(d))),
        (
            "m.json",
            format!("{}1{}", "{\"a\": ".repeat(d), "}".repeat(d)),
        ),
        (
            "m.json",
            format!("{{\"version\": 1, \"x\": {}", "[{\"a\": ".repeat(d)),
        ),
    ];
    for (name, text) in cases {
        // The test thread's stack is small (2 MiB), so an unbounded recursion
        // would abort the whole test binary here.
        let loaded = refused(name, text.as_bytes());
        assert!(!loaded.diagnostics.is_empty(), "{name}: {:.40}", text);
    }
}

#[test]
fn duplicate_keys_are_reported_and_bounded() {
    let toml = format!("version = 1\n{}", "k = 1\n".repeat(5_000));
    let loaded = refused("m.toml", toml.as_bytes());
    assert!(summaries(&loaded)[0].starts_with("invalid TOML: duplicate key `k`"));

    let json = format!("{{\"version\": 1, {}\"z\": 1}}", "\"k\": 1, ".repeat(5_000));
    let loaded = refused("m.json", json.as_bytes());
    assert_eq!(loaded.diagnostics.len(), MAX_DIAGNOSTICS + 1);
    // The first `k` is also an unknown field; every later one a duplicate.
    assert_eq!(loaded.diagnostics[0].summary, "unknown top-level field `k`");
    assert_eq!(loaded.diagnostics[1].summary, "duplicate key `k`");
    assert!(
        loaded.diagnostics[MAX_DIAGNOSTICS]
            .summary
            .starts_with("too many problems")
    );
}

#[test]
fn very_long_lines_are_handled() {
    // A string value just under the string bound followed by a mistake on the same line.
    let long = "x".repeat(crate::model::node::MAX_STRING_BYTES - 1024);
    let text = format!("version = 1\nproject = {{ name = \"{long}\", nmae = 1 }}\n");
    let loaded = refused("m.toml", text.as_bytes());
    assert_eq!(summaries(&loaded), ["unknown field `nmae` in `project`"]);
    let (start, _) = loaded.diagnostics[0].range().unwrap();
    assert_eq!(start.line, 2);
    // 1-based: the columns of `project = { name = "`, the value, `", `, then `nmae`.
    assert_eq!(
        start.column,
        "project = { name = \"".len() + long.len() + 3 + 1
    );
    let shown = loaded.diagnostics[0].to_string();
    assert!(shown.len() < 2_000, "snippet is {} bytes", shown.len());
    assert!(shown.contains("nmae = 1"), "{shown}");

    // A long line without any newline in JSON, unterminated.
    let json = format!("{{\"version\": 1, \"project\": {{\"name\": \"{long}");
    let loaded = refused("m.json", json.as_bytes());
    assert_eq!(summaries(&loaded), ["invalid JSON: unterminated string"]);
}

// Property tests ----------------------------------------------------------------

/// One edit of a valid manifest.
#[derive(Debug, Clone)]
enum Mutation {
    /// Replace the byte at `at` (modulo the length) with `byte`.
    Flip { at: usize, byte: u8 },
    /// Keep only the first `len` bytes (modulo the length + 1).
    Truncate { len: usize },
    /// Delete line `line` (modulo the line count).
    DeleteLine { line: usize },
    /// Insert `text` at `at` (modulo the length + 1).
    Insert { at: usize, text: Vec<u8> },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let interesting = prop::sample::select(vec![
        &b"["[..],
        b"]",
        b"{",
        b"}",
        b"\"",
        b"=",
        b"\n",
        b"${",
        b"{{",
        b"{%",
        b"\\u",
        b"\x00",
        b"\xff",
        b"[[x]]\n",
        b"version = 1\n",
        b",",
    ])
    .prop_map(<[u8]>::to_vec);
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| Mutation::Flip { at, byte }),
        any::<usize>().prop_map(|len| Mutation::Truncate { len }),
        any::<usize>().prop_map(|line| Mutation::DeleteLine { line }),
        (any::<usize>(), interesting).prop_map(|(at, text)| Mutation::Insert { at, text }),
    ]
}

fn apply(mut bytes: Vec<u8>, m: &Mutation) -> Vec<u8> {
    match m {
        Mutation::Flip { at, byte } if !bytes.is_empty() => {
            let i = at % bytes.len();
            bytes[i] = *byte;
        }
        Mutation::Flip { .. } => {}
        Mutation::Truncate { len } => bytes.truncate(len % (bytes.len() + 1)),
        Mutation::DeleteLine { line } => {
            let mut lines: Vec<&[u8]> = bytes.split_inclusive(|b| *b == b'\n').collect();
            if !lines.is_empty() {
                let i = line % lines.len();
                lines.remove(i);
            }
            bytes = lines.concat();
        }
        Mutation::Insert { at, text } => {
            let i = at % (bytes.len() + 1);
            bytes.splice(i..i, text.iter().copied());
        }
    }
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn arbitrary_bytes_never_break_the_loader(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        for name in ["m.toml", "m.json"] {
            let loaded = load(name, &bytes, &MapFiles::default());
            prop_assert!(check_invariants(&loaded).is_ok(), "{}", check_invariants(&loaded).unwrap_err());
        }
    }

    #[test]
    fn manifest_like_text_never_breaks_the_loader(
        text in "(version = 1\n|\\[[a-z_.]{0,12}\\]\n|[a-z_]{1,10} = |\"[a-z${}:-]{0,10}\"|[0-9]{1,4}|\\{|\\}|\\[|\\]|,|\n|\\{\\{ [a-z.]{0,8} \\}\\}){0,60}"
    ) {
        for name in ["m.toml", "m.json"] {
            let loaded = load(name, text.as_bytes(), &fixture_files());
            prop_assert!(check_invariants(&loaded).is_ok(), "{}", check_invariants(&loaded).unwrap_err());
        }
    }

    #[test]
    fn mutated_valid_manifests_never_break_the_loader(
        mutations in prop::collection::vec(mutation(), 1..5),
        json in any::<bool>(),
    ) {
        let (name, source) = if json {
            ("minimal.json", MINIMAL_JSON)
        } else {
            ("full.toml", FULL_TOML)
        };
        let bytes = mutations.iter().fold(source.as_bytes().to_vec(), apply);
        let loaded = load(name, &bytes, &fixture_files());
        prop_assert!(check_invariants(&loaded).is_ok(), "{}", check_invariants(&loaded).unwrap_err());
    }
}

#[test]
fn state_dir_must_be_below_the_manifest_directory() {
    for dir in [".", "a/..", "./"] {
        let text = format!("version = 1\n[project]\nstate_dir = \"{dir}\"\n");
        let loaded = load("m.toml", text.as_bytes(), &MapFiles::default());
        assert_eq!(
            summaries(&loaded),
            ["`project.state_dir` is the manifest's directory itself"],
            "{dir}"
        );
    }
    let loaded = load(
        "m.toml",
        b"version = 1\n[project]\nstate_dir = \"state/npc\"\n",
        &MapFiles::default(),
    );
    assert!(loaded.manifest.is_some(), "{:?}", summaries(&loaded));
}

#[test]
fn every_document_bound_is_a_diagnostic_at_its_place_in_both_syntaxes() {
    use super::node::{MAX_ARRAY_LEN, MAX_DOCUMENT_ITEMS, MAX_STRING_BYTES, MAX_TABLE_ENTRIES};
    let ones = |n: usize| vec!["1"; n].join(",");
    // Past the item bound in arrays that are each within the array bound.
    let inner = format!("[{}]", vec!["[]"; MAX_ARRAY_LEN - 1].join(","));
    let many = format!(
        "[{}]",
        vec![inner; MAX_DOCUMENT_ITEMS / MAX_ARRAY_LEN + 1].join(",")
    );
    let cases: Vec<(&str, String, String, &str)> = vec![
        (
            "items",
            format!("version = 1\nx = {many}\n"),
            format!("{{\"version\": 1, \"x\": {many}}}"),
            "items (keys, values, brackets)",
        ),
        (
            "array",
            format!("version = 1\nx = [{}]\n", ones(MAX_ARRAY_LEN + 1)),
            format!("{{\"version\": 1, \"x\": [{}]}}", ones(MAX_ARRAY_LEN + 1)),
            "array has more than",
        ),
        (
            "table",
            format!(
                "version = 1\n[x]\n{}",
                (0..=MAX_TABLE_ENTRIES)
                    .map(|i| format!("k{i} = 1\n"))
                    .collect::<String>()
            ),
            format!(
                "{{\"version\": 1, \"x\": {{{}}}}}",
                (0..=MAX_TABLE_ENTRIES)
                    .map(|i| format!("\"k{i}\": 1"))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            "table has more than",
        ),
        (
            "string",
            format!(
                "version = 1\nx = \"{}\"\n",
                "s".repeat(MAX_STRING_BYTES + 1)
            ),
            format!(
                "{{\"version\": 1, \"x\": \"{}\"}}",
                "s".repeat(MAX_STRING_BYTES + 1)
            ),
            "string is longer than",
        ),
    ];
    for (what, toml, json, summary) in cases {
        for (name, text) in [("m.toml", &toml), ("m.json", &json)] {
            let loaded = refused(name, text.as_bytes());
            assert_eq!(
                loaded.error_count(),
                1,
                "{what} {name}: {:?}",
                summaries(&loaded)
            );
            let diag = &loaded.diagnostics[0];
            assert!(
                diag.summary.contains(summary),
                "{what} {name}: {}",
                diag.summary
            );
            assert!(diag.hint.is_some(), "{what} {name}");
            let (start, _) = diag.range().expect("located");
            assert!(start.line >= 1 && start.column >= 1, "{what} {name}");
        }
    }
}

#[test]
fn a_manifest_at_the_bounds_is_still_read() {
    use super::node::MAX_ARRAY_LEN;
    let args = vec!["\"a\""; MAX_ARRAY_LEN].join(",");
    let text = format!("version = 1\n[mcp.servers.fs]\ncommand = \"x\"\nargs = [{args}]\n");
    let loaded = load("m.toml", text.as_bytes(), &MapFiles::default());
    assert_eq!(loaded.error_count(), 0, "{:?}", summaries(&loaded));
}

#[test]
fn messages_quote_a_bounded_prefix_of_values() {
    let key = "k".repeat(100_000);
    let text = format!(
        "version = 1\n{key} = 1\n[profiles.p]\nprovider = \"{key}\"\ndescription = \"d\"\n"
    );
    let loaded = refused("m.toml", text.as_bytes());
    assert!(loaded.error_count() >= 2);
    for d in &loaded.diagnostics {
        let all = format!("{} {}", d.summary, d.hint.as_deref().unwrap_or(""));
        assert!(all.len() < 600, "{all}");
        assert!(all.contains('…'), "{all}");
    }
}

fn load_with_env(text: &str, env: &[(&str, &str)]) -> Loaded {
    let env: BTreeMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    load_bytes(
        "m.toml",
        text.as_bytes(),
        Syntax::Toml,
        &env,
        &MapFiles::default(),
    )
}

#[test]
fn an_unset_variable_does_not_hide_the_entrys_other_errors() {
    let loaded = load_with_env(
        "version = 1\n[[hooks.before_tool]]\ncommand = \"x\"\nargs = [\"${UNSET_VAR}\"]\ncwd = \"/abs\"\n",
        &[],
    );
    assert_eq!(
        summaries(&loaded),
        [
            "environment variable `UNSET_VAR` is not set",
            "`cwd` is an absolute path"
        ]
    );
}

#[test]
fn an_mcp_servers_unset_start_time_values_are_warnings_and_refuse_its_start() {
    let text = "version = 1\n[mcp.servers.gh]\ncommand = \"gh-mcp\"\nargs = [\"--org=${ORG}\"]\nenv = { GITHUB_TOKEN = \"${GITHUB_TOKEN}\", PLAIN = \"${PLAIN:-x}\" }\ncwd = \"${WHERE}\"\n[mcp.servers.web]\nurl = \"${WEB_URL}\"\nheaders = { X-Team = \"${TEAM}\" }\n";
    let loaded = load_with_env(text, &[("ORG", "acme")]);
    // `cwd` is no start-time value: still an error.
    let errors: Vec<&str> = loaded
        .diagnostics
        .iter()
        .filter(|d| d.severity == Severity::Error)
        .map(|d| d.summary.as_str())
        .collect();
    assert_eq!(errors, ["environment variable `WHERE` is not set"]);
    let loaded = load_with_env(
        &text.replace("cwd = \"${WHERE}\"\n", ""),
        &[("ORG", "acme")],
    );
    let manifest = loaded.manifest.as_ref().expect("valid with warnings");
    assert_eq!(
        summaries(&loaded),
        [
            "environment variable `GITHUB_TOKEN` is not set: MCP server `gh` cannot start without it",
            "environment variable `WEB_URL` is not set: MCP server `web` cannot start without it",
            "environment variable `TEAM` is not set: MCP server `web` cannot start without it",
        ]
    );
    let gh = &manifest.mcp_servers["gh"];
    assert_eq!(gh.unset_variables(), ["GITHUB_TOKEN"]);
    let McpTransport::Stdio(spec) = &gh.transport else {
        panic!("stdio")
    };
    // Unset, it is still a reference: agent files get its source.
    assert!(spec.env["GITHUB_TOKEN"].is_secret());
    assert_eq!(spec.env["GITHUB_TOKEN"].source(), Some("${GITHUB_TOKEN}"));
    assert_eq!(spec.args[0].expose(), "--org=acme");
    let refused = manifest.mcp_servers["web"].check_start().unwrap_err();
    assert_eq!(refused.names, ["WEB_URL", "TEAM"]);
    assert!(
        refused.to_string().contains("`WEB_URL`, `TEAM`"),
        "{refused}"
    );
    // Set, nothing is missing.
    let set = load_with_env(
        text.replace("cwd = \"${WHERE}\"\n", "").as_str(),
        &[
            ("ORG", "a"),
            ("GITHUB_TOKEN", "t"),
            ("WEB_URL", "https://x.example/mcp"),
            ("TEAM", "b"),
        ],
    );
    assert!(set.diagnostics.is_empty(), "{:?}", summaries(&set));
    assert!(
        set.manifest
            .unwrap()
            .mcp_servers
            .values()
            .all(|s| s.check_start().is_ok())
    );
}

#[test]
fn url_rules_hold_for_urls_from_the_environment_without_quoting_them() {
    for (value, problem) in [
        (
            "ftp://secret-host.example/x",
            "unsupported scheme `<redacted>`",
        ),
        (
            "http://10.0.0.7/mcp",
            "plain `http` to `<redacted>`, which is not loopback",
        ),
        (
            "https://user:pw@secret-host.example",
            "credentials in the URL",
        ),
    ] {
        let loaded = load_with_env(
            "version = 1\n[mcp.servers.s1]\nurl = \"${MCP_URL}\"\n",
            &[("MCP_URL", value)],
        );
        let all = summaries(&loaded);
        assert_eq!(all.len(), 1, "{all:?}");
        assert!(
            all[0].starts_with("invalid MCP server URL from `${MCP_URL}`: ")
                && all[0].contains(problem),
            "{all:?}"
        );
        for d in &loaded.diagnostics {
            assert!(
                !d.to_string().contains("secret-host") && !d.to_string().contains("10.0.0.7"),
                "{d}"
            );
        }
    }
    let fine = load_with_env(
        "version = 1\n[mcp.servers.s1]\nurl = \"${MCP_URL}\"\n",
        &[("MCP_URL", "https://ok.example/mcp")],
    );
    assert_eq!(fine.error_count(), 0);
}

#[test]
fn what_the_os_cannot_pass_to_a_program_is_refused() {
    use super::lower::{MAX_ARG_LIST_BYTES, MAX_ARG_STRLEN};
    let nul = [
        (
            "command",
            "version = 1\n[mcp.servers.s1]\ncommand = \"a\\u0000b\"\n",
        ),
        (
            "argument",
            "version = 1\n[mcp.servers.s1]\ncommand = \"x\"\nargs = [\"a\\u0000b\"]\n",
        ),
        (
            "env value",
            "version = 1\n[hooks]\nbefore_tool = [{ command = \"x\", env = { K = \"a\\u0000b\" } }]\n",
        ),
        (
            "cwd",
            "version = 1\n[panes.p]\ncommand = \"x\"\ncwd = \"a\\u0000b\"\n",
        ),
        (
            "provider arg",
            "version = 1\n[providers.p]\nkind = \"codex\"\nargs = [\"${NUL_VAR}\"]\n",
        ),
        (
            "state_dir",
            "version = 1\n[project]\nstate_dir = \"a\\u0000b\"\n",
        ),
        (
            "prompt file",
            "version = 1\n[prompts.p]\nfile = \"a\\u0000b\"\n",
        ),
    ];
    for (what, text) in nul {
        let loaded = load_with_env(text, &[("NUL_VAR", "a\0b")]);
        let all = summaries(&loaded);
        assert_eq!(all.len(), 1, "{what}: {all:?}");
        assert!(all[0].contains("NUL byte"), "{what}: {all:?}");
    }
    let long = "a".repeat(MAX_ARG_STRLEN);
    let loaded = load_with_env(
        &format!("version = 1\n[mcp.servers.s1]\ncommand = \"x\"\nargs = [\"ok\", \"{long}\"]\n"),
        &[],
    );
    assert_eq!(
        summaries(&loaded),
        [format!(
            "argument 2 is {} bytes, more than the {} the OS passes in one argument",
            MAX_ARG_STRLEN,
            MAX_ARG_STRLEN - 1
        )]
    );
    let chunk = "a".repeat(MAX_ARG_STRLEN / 2);
    let many = vec![format!("\"{chunk}\""); MAX_ARG_LIST_BYTES / chunk.len() + 1].join(",");
    let loaded = load_with_env(
        &format!(
            "version = 1\n[triggers.t]\nkind = \"cron\"\nschedule = \"1h\"\naction = {{ command = \"x\", args = [{many}] }}\n"
        ),
        &[],
    );
    let all = summaries(&loaded);
    assert_eq!(all.len(), 1, "{all:?}");
    assert!(
        all[0].starts_with("the arguments and environment of `x` take "),
        "{all:?}"
    );
    // Just under the single-argument limit is fine.
    let fits = "a".repeat(MAX_ARG_STRLEN - 1);
    let loaded = load_with_env(
        &format!("version = 1\n[mcp.servers.s1]\ncommand = \"x\"\nargs = [\"{fits}\"]\n"),
        &[],
    );
    assert_eq!(loaded.error_count(), 0, "{:?}", summaries(&loaded));
}

#[test]
fn the_item_limit_grows_with_the_file_and_fits_large_real_manifests() {
    use super::node::{BASE_DOCUMENT_ITEMS, MAX_DOCUMENT_ITEMS, item_limit};
    assert_eq!(item_limit(0), BASE_DOCUMENT_ITEMS);
    assert_eq!(item_limit(8 * 1024 * 1024), MAX_DOCUMENT_ITEMS);
    // Dense punctuation past the limit of its small size is refused…
    let rows: String = (0..24)
        .map(|r| format!("a{r} = [{}]\n", vec!["1"; 4000].join(",")))
        .collect();
    let loaded = refused("m.toml", format!("version = 1\n{rows}").as_bytes());
    assert_eq!(loaded.error_count(), 1, "{:?}", summaries(&loaded));
    assert!(
        loaded.diagnostics[0]
            .summary
            .contains("items (keys, values, brackets)")
    );
    // …while 10,000 components (the planner benchmark's shape) load.
    let mut text = String::from("version = 1\n");
    for i in 0..5_000 {
        text += &format!(
            "[mcp.servers.s{i}]\ncommand = \"srv\"\nargs = [\"--n\", \"0\"]\nenv = {{ A = \"b\" }}\n[triggers.t{i}]\nkind = \"cron\"\nschedule = \"1 * * * *\"\naction = {{ command = \"make\" }}\n"
        );
    }
    let loaded = load("m.toml", text.as_bytes(), &MapFiles::default());
    assert_eq!(loaded.error_count(), 0, "{:?}", &summaries(&loaded)[..1]);
}

#[test]
fn mcp_builtins_lower_with_defaults_and_refuse_malformed_networks() {
    let defaults = load_with_env("version = 1\n", &[]).manifest.unwrap();
    assert_eq!(defaults.mcp_builtins, McpBuiltins::default());
    assert!(!defaults.mcp_builtins.fetch_allow_private);
    let m = load_with_env(
        "version = 1\n[mcp.builtins]\nfetch_allow_private = true\nfetch_allow_networks = [\"10.1.2.7/24\", \"::1\", \" 127.0.0.1/32 \"]\nfetch_timeout_ms = 500\n",
        &[],
    )
    .manifest
    .unwrap();
    let nets: Vec<String> = m
        .mcp_builtins
        .fetch_allow_networks
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(nets, ["10.1.2.0/24", "::1/128", "127.0.0.1/32"]);
    assert_eq!(m.mcp_builtins.fetch_timeout_ms, 500);
    let net = IpNet::parse("10.1.2.0/24").unwrap();
    assert!(net.contains("10.1.2.255".parse().unwrap()));
    assert!(!net.contains("10.1.3.0".parse().unwrap()));
    assert!(!net.contains("::ffff:10.1.2.1".parse().unwrap()));
    assert_eq!(IpNet::parse("0.0.0.0/0").unwrap().prefix, 0);
    for bad in [
        "10.0.0.0/33",
        "::/129",
        "10.0.0.0/",
        "host/8",
        "10.0.0.0/8/8",
        "10.0.0.0/+8",
        "",
    ] {
        assert!(IpNet::parse(bad).is_none(), "{bad}");
    }
    let bad = load_with_env(
        "version = 1\n[mcp.builtins]\nfetch_allow_networks = [\"10.0.0.0/99\"]\nfetch_timeout_ms = 0\nfetch_allow_everything = true\n",
        &[],
    );
    assert!(bad.manifest.is_none());
    let text = summaries(&bad).join("\n");
    assert!(text.contains("fetch_allow_everything"), "{text}");
    let bad = load_with_env(
        "version = 1\n[mcp.builtins]\nfetch_allow_networks = [\"10.0.0.0/99\"]\nfetch_timeout_ms = 0\n",
        &[],
    );
    let text = summaries(&bad).join("\n");
    assert!(text.contains("`10.0.0.0/99` is not a network"), "{text}");
    assert!(
        text.contains("`fetch_timeout_ms` `0` is out of range"),
        "{text}"
    );
}

#[test]
fn the_store_url_is_secret_wherever_it_came_from_and_never_quoted() {
    const PASSWORD: &str = "s3cr3t-pw";
    let url = format!("postgres://npc:{PASSWORD}@db.internal:5432/npc");
    for text in [
        "version = 1\n[store]\nurl = \"${NPC_STORE_URL}\"\n".to_string(),
        format!("version = 1\n[store]\nurl = \"{url}\"\n"),
    ] {
        let loaded = load_with_env(&text, &[("NPC_STORE_URL", &url)]);
        let model = loaded.manifest.expect("valid");
        let stored = model.store.url.as_ref().expect("a store url");
        assert!(stored.is_secret());
        assert_eq!(stored.expose(), url);
        let shown = format!("{:?} {}", model, serde_json::to_string(&model).unwrap());
        assert!(!shown.contains(PASSWORD), "{shown}");
    }
    let loaded = load_with_env(
        "version = 1\n[store]\nurl = \"${NPC_STORE_URL}\"\n",
        &[("NPC_STORE_URL", "mysql://root:hunter2@h/db")],
    );
    assert_eq!(
        summaries(&loaded),
        ["`[store] url` from `${NPC_STORE_URL}` is not a PostgreSQL URL"]
    );
    let all = format!("{:?}", loaded.diagnostics);
    assert!(!all.contains("hunter2"), "{all}");
}

#[test]
fn the_store_role_is_all_ingress_or_scheduler_set_per_machine_from_the_environment() {
    use crate::model::FleetRole;
    let url = "postgres://npc:pw@127.0.0.1:5432/npc";
    let base = "version = 1\n[store]\nurl = \"${NPC_STORE_URL}\"\n";
    let model = load_with_env(base, &[("NPC_STORE_URL", url)])
        .manifest
        .expect("valid");
    assert_eq!(model.store.role, FleetRole::All);
    let per_machine = format!("{base}role = \"${{NPC_ROLE:-all}}\"\n");
    for (set, role) in [
        (None, FleetRole::All),
        (Some("ingress"), FleetRole::Ingress),
        (Some("scheduler"), FleetRole::Scheduler),
    ] {
        let mut env = vec![("NPC_STORE_URL", url)];
        env.extend(set.map(|r| ("NPC_ROLE", r)));
        let model = load_with_env(&per_machine, &env).manifest.expect("valid");
        assert_eq!(model.store.role, role, "{set:?}");
        assert!(role.takes_webhooks() || role.schedules());
    }
    let env = [("NPC_STORE_URL", url)];
    let loaded = load_with_env(&format!("{base}role = \"ingres\"\n"), &env);
    let all = format!("{:?}", loaded.diagnostics);
    assert!(all.contains("unknown `[store] role` `ingres`"), "{all}");
    assert!(all.contains("`ingress`"), "{all}");
    // A value from the environment is named by its reference, not quoted.
    let loaded = load_with_env(
        &per_machine,
        &[("NPC_STORE_URL", url), ("NPC_ROLE", "worker-7f3a")],
    );
    assert_eq!(
        summaries(&loaded),
        ["`[store] role` from `${NPC_ROLE:-all}` is not a role"]
    );
    assert!(!format!("{:?}", loaded.diagnostics).contains("worker-7f3a"));
}

#[test]
fn a_store_urls_tls_parameters_are_checked_and_a_certificate_file_comes_only_from_the_environment()
{
    let from_env = "version = 1\n[store]\nurl = \"${NPC_STORE_URL}\"\n";
    let url =
        "postgres://npc:pw-77@db.internal/npc?sslmode=verify-full&sslrootcert=/etc/npc/ca.pem";
    let model = load_with_env(from_env, &[("NPC_STORE_URL", url)])
        .manifest
        .expect("valid");
    assert_eq!(model.store.url.unwrap().expose(), url);
    let bad = load_with_env(
        from_env,
        &[("NPC_STORE_URL", "postgres://npc:pw-77@h/npc?sslmode=verify")],
    );
    let all = summaries(&bad).join("\n");
    assert!(all.contains("its `sslmode` is not one of"), "{all}");
    assert!(!format!("{:?}", bad.diagnostics).contains("pw-77"));
    // Written in the manifest, wholly or in part, a file is refused;
    // `system` reads no file of the user's.
    for written in [
        format!("url = \"{url}\""),
        "url = \"postgres://npc:${PW}@db.internal/npc?sslrootcert=/etc/npc/ca.pem\"".to_string(),
        "url = \"${NPC_URL:-postgres://h/npc?sslrootcert=/etc/npc/ca.pem}\"".to_string(),
    ] {
        let loaded = load_with_env(
            &format!("version = 1\n[store]\n{written}\n"),
            &[("PW", "pw-77")],
        );
        let all = summaries(&loaded).join("\n");
        assert!(
            all.contains("names an `sslrootcert` file in the manifest itself"),
            "{written}: {all}"
        );
    }
    let system = "version = 1\n[store]\nurl = \"postgres://npc:${PW}@h/npc?sslrootcert=system\"\n";
    assert!(load_with_env(system, &[("PW", "pw-77")]).manifest.is_some());
}

#[test]
fn the_store_lease_timeout_is_a_bounded_duration_with_a_default() {
    let url = "postgres://npc:pw@127.0.0.1:5432/npc";
    let env = [("NPC_STORE_URL", url)];
    let base = "version = 1\n[store]\nurl = \"${NPC_STORE_URL}\"\n";
    let model = load_with_env(base, &env).manifest.expect("valid");
    assert_eq!(
        model.store.lease_timeout_secs,
        crate::model::DEFAULT_LEASE_TIMEOUT_SECS
    );
    let model = load_with_env(&format!("{base}lease_timeout = \"1m30s\"\n"), &env)
        .manifest
        .expect("valid");
    assert_eq!(model.store.lease_timeout_secs, 90);
    for (value, said) in [
        ("2h", "`lease_timeout` `2h` is out of range"),
        ("0s", "`lease_timeout` `0s` is out of range"),
        ("soon", "invalid `lease_timeout` `soon`"),
    ] {
        let loaded = load_with_env(&format!("{base}lease_timeout = \"{value}\"\n"), &env);
        let all = summaries(&loaded).join("\n");
        assert!(all.contains(said), "{value}: {all}");
    }
}

#[test]
fn a_branch_or_ref_that_every_run_would_get_wrong_is_refused_by_validate() {
    let manifest = |branch: &str, base_ref: &str| {
        format!(
            "version = 1\n[triggers.t]\nkind = \"cron\"\nschedule = \"@yearly\"\nworkspace = \"worktree\"\nbranch = \"{branch}\"\nref = \"{base_ref}\"\naction = {{ command = \"true\" }}\n"
        )
    };
    for (branch, base_ref, says) in [
        (
            "refs/heads/main",
            "HEAD",
            "`branch` `refs/heads/main` is not a valid name",
        ),
        ("@", "HEAD", "`branch` `@` is not a valid name"),
        (
            "refs/tags/{{ run.id }}",
            "HEAD",
            "`branch` `refs/tags/{{ run.id }}`",
        ),
        (
            "npc/{{ run.id }}",
            "--upload-pack=x",
            "`ref` `--upload-pack=x`",
        ),
    ] {
        let loaded = refused("t.toml", manifest(branch, base_ref).as_bytes());
        let all = summaries(&loaded).join("\n");
        assert!(all.contains(says), "{branch}: {all}");
    }
    for (branch, base_ref) in [
        ("npc/{{ run.id }}", "refs/heads/main"),
        ("{{ payload.b }}", "{{ payload.sha }}"),
        ("review/fix", "v1"),
    ] {
        let loaded = load(
            "t.toml",
            manifest(branch, base_ref).as_bytes(),
            &MapFiles::default(),
        );
        assert!(
            loaded.manifest.is_some(),
            "{branch}: {:#?}",
            loaded.diagnostics
        );
    }
}

/// A prompt is probed in every place it renders: as its command (no
/// profile), for each profile (no trigger) and each trigger, and
/// `[instructions]` (nothing but the project): an undefined value there is
/// an error naming the place and the whole expression, at its line.
#[test]
fn a_prompt_is_checked_in_every_place_it_renders() {
    let head = "version = 1\n[providers.c]\nkind = \"claude_code\"\n";
    let guarded = "{% if profile is defined and profile.model %}as {{ profile.model }}{% endif %}{% if trigger %}{{ trigger.x.y }}{% endif %}";
    let cases: [(String, Option<&str>); 7] = [
        // As a command: no profile.
        (
            format!(
                "{head}[prompts.p]\ncommand = true\ntemplate = \"a\\n{{% if profile.model %}}x{{% endif %}}\"\n"
            ),
            Some(
                "prompt `p` cannot be rendered for its command `/p`: `profile.model` is undefined there",
            ),
        ),
        // For a profile: `trigger` is none.
        (
            format!(
                "{head}[prompts.p]\ntemplate = \"#{{{{ trigger.payload.number }}}}\"\n[profiles.d]\nprovider = \"c\"\ndescription = \"d\"\nprompt = \"p\"\n"
            ),
            Some(
                "prompt `p` cannot be rendered for profile `d`: `trigger.payload.number` is undefined there",
            ),
        ),
        // For a profile: a variable without a default.
        (
            format!(
                "{head}[prompts.p]\ntemplate = \"{{{{ vars.x }}}}\"\nvariables.x = {{ description = \"x\" }}\n[profiles.d]\nprovider = \"c\"\ndescription = \"d\"\nprompt = \"p\"\n"
            ),
            Some("prompt `p` cannot be rendered for profile `d`: `vars.x` is undefined there"),
        ),
        // `[instructions]`: no profile.
        (
            format!("{head}[instructions]\ntemplate = \"{{{{ profile.name }}}}\"\n"),
            Some(
                "prompt `instructions` cannot be rendered for `[instructions]`: `profile.name` is undefined there",
            ),
        ),
        // Guarded: valid everywhere.
        (
            format!(
                "{head}[prompts.p]\ncommand = true\ntemplate = '{guarded}'\n[profiles.d]\nprovider = \"c\"\ndescription = \"d\"\nprompt = \"p\"\n"
            ),
            None,
        ),
        // A trigger's run has the payload and the run; its vars count.
        (
            format!(
                "{head}[prompts.p]\ntemplate = \"{{{{ trigger.a.b }}}} {{{{ run.id }}}} {{{{ vars.x }}}}\"\nvariables.x = {{ description = \"x\" }}\n[profiles.d]\nprovider = \"c\"\ndescription = \"d\"\n[triggers.t]\nkind = \"cron\"\nschedule = \"@hourly\"\naction = {{ profile = \"d\", prompt = \"p\", vars = {{ x = \"1\" }} }}\n"
            ),
            None,
        ),
        // A prompt nothing renders is not probed.
        (
            format!("{head}[prompts.p]\ntemplate = \"{{{{ profile.model }}}}\"\n"),
            None,
        ),
    ];
    for (text, expected) in cases {
        let loaded = load("npcagent.toml", text.as_bytes(), &MapFiles::default());
        check_invariants(&loaded).unwrap();
        match expected {
            Some(summary) => {
                assert!(loaded.manifest.is_none(), "{text}");
                assert_eq!(summaries(&loaded), vec![summary], "{text}");
            }
            None => assert!(
                loaded.manifest.is_some(),
                "{text}: {:?}",
                summaries(&loaded)
            ),
        }
    }
}

#[test]
fn a_duplicate_key_points_at_its_first_definition_and_a_flood_of_them_stays_bounded() {
    let loaded = load(
        "m.toml",
        b"version = 1\n[mcp]\nservers.fs.command = \"a\"\n\n[mcp.servers.fs]\ncommand = \"b\"\n",
        &MapFiles::default(),
    );
    let hints: Vec<&str> = loaded
        .diagnostics
        .iter()
        .filter_map(|d| d.hint.as_deref())
        .collect();
    // One error: the repeated table's keys are not reported again.
    assert_eq!(
        hints,
        ["`mcp.servers.fs` is first defined (as a table) on line 3; merge the two, or rename one"]
    );
    // Each lookup reads back to its table's header: past the bound, the
    // generic hint.
    let many = format!("version = 1\n[t]\n{}", "a = 1\n".repeat(200));
    let loaded = load("m.toml", many.as_bytes(), &MapFiles::default());
    let pointed = loaded
        .diagnostics
        .iter()
        .filter(|d| d.hint.as_deref() == Some("`a` is first defined on line 3; keep one of them"))
        .count();
    assert_eq!(pointed, super::parse::MAX_FIRST_DEFINITION_LOOKUPS);
    assert_eq!(loaded.diagnostics.len(), 199);
}
